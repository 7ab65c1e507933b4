#!/usr/bin/env python3
"""Case (c): siw rping CLIENT built with mpa_crc_required = true -> hand-written MPA responder.

Guest: siw-crc.ko (docs/siw.md §4.1 `mpa_crc_required` flipped at build time),
`rping -c -a 10.77.0.1 -C 1 -S 64 -v`.
Host (netns, kernel TCP socket on 10.77.0.1:7174):
  1. the Request must carry C=1: `"MPA ID Req Frame" 50 02 00 04 00 01 00 01` (docs/siw.md §4.2);
  2. answers the Reply with C=1 (a CRC-requiring initiator fails a C=0 Reply, docs/siw.md §4.2);
  3. the first FPDU (rping's 40-byte Send) must end with CRC32c over bytes 0..35 stored
     little-endian (docs/mpa.md §1.6) — the wire byte order the xwarp engine must produce and check;
  4. sends siw a Send FPDU with a corrupted CRC: siw must answer with a Terminate
     (QN 2, MSN 1, MO 0, opcode 7) carrying LLP/MPA/CRC error (0x02) and close (docs/siw.md §4.5, §4.6).
     The Terminate Control bytes are checked against the documented siw bitfield layout
     (`02 02 00 00`, docs/siw.md §4.6) and reported either way.
Then the tap capture is checked with tshark: C in both frames, siw's CRCs good (docs/testing.md §6.3).

Usage: rping_client_crc.py [--out DIR]       (the --peer role is internal)
"""

from __future__ import annotations

import argparse
import socket
import struct
import subprocess
import sys
from pathlib import Path

from common import (FLAG_C, FLAG_ENHANCED, HERE, KEY_REP, KEY_REQ, MPA_REV2, RPING_PORT, Checks,
                    check_no_malformed, flag, mpa_crc_trailer, mpa_frame, recv_exact,
                    tshark_fpdu_crcs, tshark_rows, vm)
from common import case_start, case_verdict

NAME = "rping_client_crc"
RPING_SIZE = 64
SEND_FPDU_LEN = 40
#: siw's Terminate Control for LLP/MPA/CRC error as its bitfield lays it out on x86
#: (docs/siw.md §4.6: layer/etype nibbles swapped vs RFC 5040's `20 02 00 00`).
SIW_TERM_CTRL_LLP_CRC = bytes([0x02, 0x02, 0x00, 0x00])
RFC_TERM_CTRL_LLP_CRC = bytes([0x20, 0x02, 0x00, 0x00])
#: Peer exit code: every check passed up to the corrupted Send, then siw closed the
#: connection before a whole Terminate arrived. Seen twice in about ten runs (a siw race between
#: sending the Terminate and rping's disconnect after the error, interop/README.md): the
#: case then runs once more, loudly, and that run must pass every check.
CLOSED_WITHOUT_TERMINATE = 3


def read_fpdu(sock: socket.socket) -> bytes:
    """Read one whole FPDU (length, ULPDU, pad, CRC) from the stream."""
    head = recv_exact(sock, 2)
    (ulpdu_len,) = struct.unpack(">H", head)
    pad = (4 - ((ulpdu_len + 2) % 4)) % 4
    return head + recv_exact(sock, ulpdu_len + pad + 4)


def peer(accept_timeout: float) -> int:
    """Host-side MPA responder with CRC. Exit 0 iff every check passed."""
    c = Checks("host")
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((vm.HOST_IP, RPING_PORT))
    srv.listen(1)
    srv.settimeout(accept_timeout)
    try:
        conn, addr = srv.accept()
    except socket.timeout:
        c.check("guest connected", False, f"no connection in {accept_timeout:.0f} s")
        return 1
    c.check("guest connected", True, f"from {addr[0]}:{addr[1]}")
    conn.settimeout(15)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        want_req = mpa_frame(KEY_REQ, FLAG_C | FLAG_ENHANCED, MPA_REV2, 1, 1)
        req = recv_exact(conn, len(want_req))
        c.eq("MPA Request bytes (C=1 from mpa_crc_required)", req, want_req)
        if not c.ok():
            return 1
        conn.sendall(mpa_frame(KEY_REP, FLAG_C | FLAG_ENHANCED, MPA_REV2, 1, 1))

        fpdu = recv_exact(conn, SEND_FPDU_LEN)
        print(f"  [host] first FPDU: {fpdu.hex(' ')}", flush=True)
        c.eq("Send header: ULPDU_Length, ctrl, QN, MSN, MO",
             struct.unpack(">HBB", fpdu[0:4]) + struct.unpack(">III", fpdu[8:20]),
             (0x22, 0x41, 0x43, 0, 1, 0))
        c.eq("rping_rdma_info.size", struct.unpack(">I", fpdu[32:36])[0], RPING_SIZE)
        c.eq("CRC trailer = CRC32c(bytes 0..35) little-endian (docs/mpa.md §1.6)", fpdu[36:40],
             mpa_crc_trailer(fpdu[:36]))

        # A Send with a corrupted CRC (payload 16 bytes: rping would accept a good one).
        body = struct.pack(">HBBIIII", 0x22, 0x41, 0x43, 0, 0, 1, 0) + bytes(16)
        good = mpa_crc_trailer(body)
        bad = bytes(b ^ 0xFF for b in good)
        conn.sendall(body + bad)
        print(f"  [host] sent Send with bad CRC {bad.hex(' ')} (good would be {good.hex(' ')})",
              flush=True)
        conn.settimeout(10)
        try:
            term = read_fpdu(conn)
        except (EOFError, socket.timeout, ConnectionResetError) as e:
            c.check("siw answers a CRC error with a Terminate", False, f"{type(e).__name__}: {e}")
            return CLOSED_WITHOUT_TERMINATE if isinstance(e, EOFError) and c.failed == [
                "siw answers a CRC error with a Terminate"] else 1
        print(f"  [host] siw's answer: {term.hex(' ')}", flush=True)
        ulpdu_len, ddp_ctrl, rdmap_ctrl = struct.unpack(">HBB", term[0:4])
        qn, msn, mo = struct.unpack(">III", term[8:20])
        c.eq("Terminate: DDP ctrl 0x41, RDMAP ctrl 0x47 (opcode 7)", (ddp_ctrl, rdmap_ctrl),
             (0x41, 0x47))
        c.eq("Terminate: QN 2, MSN 1, MO 0", (qn, msn, mo), (2, 1, 0))
        c.eq("Terminate: ULPDU_Length 22 (no attached headers)", ulpdu_len, 22)
        ctrl = term[20:24]
        c.check("Terminate Control is LLP/MPA/CRC error in siw's bitfield layout (docs/siw.md §4.6)",
                ctrl == SIW_TERM_CTRL_LLP_CRC,
                f"got {ctrl.hex(' ')}; siw layout {SIW_TERM_CTRL_LLP_CRC.hex(' ')}, "
                f"RFC 5040 layout {RFC_TERM_CTRL_LLP_CRC.hex(' ')}")
        body_len = 2 + ulpdu_len + (4 - ((ulpdu_len + 2) % 4)) % 4
        c.eq("Terminate CRC valid", term[body_len:body_len + 4], mpa_crc_trailer(term[:body_len]))
        conn.settimeout(5)
        try:
            rest = conn.recv(64)
            closed, desc = rest == b"", ("EOF" if rest == b"" else rest.hex(" "))
        except socket.timeout:
            closed, desc = False, "still open after 5 s"
        except ConnectionResetError:
            closed, desc = True, "RST"
        c.check("siw closes the connection after its Terminate", closed, desc)
    except (EOFError, socket.timeout, OSError, ValueError) as e:
        c.check("protocol exchange completed", False, f"{type(e).__name__}: {e}")
    finally:
        conn.close()
        srv.close()
    return 0 if c.ok() else 1


def capture_checks(c: Checks, pcap: Path) -> None:
    """tshark: C=1 negotiated, siw's FPDUs have good CRCs, ours is the only bad one (docs/testing.md §6.3)."""
    reqs = tshark_rows(pcap, "iwarp_mpa.key.req", ["iwarp_mpa.crc_flag"])
    reps = tshark_rows(pcap, "iwarp_mpa.key.rep", ["iwarp_mpa.crc_flag", "iwarp_mpa.rej_flag"])
    c.eq("tshark: Request C=1", [flag(r[0]) for r in reqs], [1])
    c.eq("tshark: Reply C=1, R=0", [(flag(r[0]), flag(r[1])) for r in reps], [(1, 0)])
    fpdus = tshark_fpdu_crcs(pcap)
    print(f"  [case] tshark FPDUs: {fpdus}", flush=True)
    from_siw = [f for f in fpdus if f["srcport"] != RPING_PORT]
    from_host = [f for f in fpdus if f["srcport"] == RPING_PORT]
    c.eq("tshark: siw sent Send + Terminate (opcodes)", [f["opcode"] for f in from_siw], [3, 7])
    c.eq("tshark: Good CRC32 on siw's FPDUs", [f["good"] for f in from_siw], [True, True])
    c.eq("tshark: Bad CRC32 on our corrupted Send", [(f["opcode"], f["good"]) for f in from_host],
         [(3, False)])
    check_no_malformed(c, pcap, allow_errors=f"tcp.srcport == {RPING_PORT}")


def run_once(a, out: Path) -> tuple[Checks, int | None]:
    """Boot the guest, run its rping client against the host responder, check the capture."""
    c = Checks("case")
    pcap = out / f"{NAME}.pcap"
    guest_cmd = (f"rping -c -a {vm.HOST_IP} -C 1 -S {RPING_SIZE} -v; "
                 "echo \"rping client exit $?\"")
    with vm.Guest(guest_cmd, siw="crc", timeout=a.timeout, pcap=pcap,
                  console_log=out / f"{NAME}.console") as g:
        p = g.netns_popen([sys.executable, str(Path(__file__).resolve()), "--peer",
                           "--accept-timeout", str(a.timeout - 10)])
        g.start()
        res = g.wait()
        try:
            peer_rc = p.wait(15)
        except subprocess.TimeoutExpired:
            peer_rc = None
    c.check("guest booted with siw-crc.ko", res.boot_s is not None and
            "siw variant: crc" in res.console,
            f"{res.boot_s:.1f} s" if res.boot_s else (res.setup_failed or "no READY marker"))
    c.check("guest command finished in time", res.rc is not None and not res.timed_out,
            f"rc={res.rc} total {res.total_s:.1f} s")
    c.eq("host responder checks", peer_rc, 0)
    capture_checks(c, pcap)
    return c, peer_rc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--accept-timeout", type=float, default=120.0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(HERE.parent / "build" / "results"),
                    help="directory for the pcap and the console log")
    ap.add_argument("--timeout", type=float, default=150.0, help="bound for the whole case (s)")
    a = ap.parse_args()
    if a.peer:
        return peer(a.accept_timeout)

    out, t0, _ = case_start(a)
    # At most two reruns, and only on exactly this siw race (about one run in five, so two
    # reruns leave about one suite in a hundred failing on it instead of one in twenty-five).
    attempts = 3
    for attempt in range(1, attempts + 1):
        c, peer_rc = run_once(a, out)
        if peer_rc != CLOSED_WITHOUT_TERMINATE or attempt == attempts:
            break
        print(f"RETRY {NAME}: siw closed the connection without its CRC Terminate (a siw race, "
              f"interop/README.md); running the case again ({attempt + 1} of {attempts})",
              flush=True)
    return case_verdict(c, NAME, t0)


if __name__ == "__main__":
    sys.exit(main())
