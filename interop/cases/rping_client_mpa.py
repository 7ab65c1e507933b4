#!/usr/bin/env python3
"""Case (a): siw rping CLIENT in the guest -> hand-written MPA responder on the host side.

Guest: `rping -c -a 10.77.0.1 -C 1 -S 64 -v` (siw, MPA Initiator).
Host (netns, kernel TCP socket on 10.77.0.1:7174):
  1. reads the 24-byte MPA Request and checks it byte for byte (docs/protocols.md §5.3, docs/siw.md §4.2);
  2. answers the valid Reply "MPA ID Rep Frame" 10 02 00 04 00 01 00 01 (docs/protocols.md §5.3);
  3. reads the first FPDU: a 40-byte Send (ULPDU_Length 0x22, DDP/RDMAP ctrl 41 43, QN 0,
     MSN 1, MO 0, CRC field 0 since CRC is off, docs/mpa.md §1.6, docs/ddp-rdmap.md §2.3, §3.1) carrying a 16-byte
     rping_rdma_info {buf, rkey, size=64} (docs/protocols.md §5.2);
  4. closes the connection (no xwarp engine yet: this proves the harness and the wire facts).
Then the tap capture is checked with tshark (docs/testing.md §6.3).

Usage: rping_client_mpa.py [--out DIR]       (the --peer role is internal)
"""

from __future__ import annotations

import argparse
import socket
import struct
import subprocess
import sys
from pathlib import Path

from common import (HERE, RPING_CLIENT_REQUEST, RPING_PORT, RPING_VALID_REPLY, Checks,
                    check_no_malformed, first_int, flag, recv_exact, tshark_rows, vm)
from common import case_start, case_verdict, check_guest_ran

NAME = "rping_client_mpa"
RPING_SIZE = 64
SEND_FPDU_LEN = 40  # 2 + 18 + 16 + pad 0 + CRC 4 (docs/protocols.md §5.2 "SEND 40 B (ULPDU 34)")


def peer(accept_timeout: float) -> int:
    """Host-side MPA responder. Exit 0 iff every check passed."""
    c = Checks("host")
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((vm.HOST_IP, RPING_PORT))
    srv.listen(1)
    srv.settimeout(accept_timeout)
    print(f"  [host] listening on {vm.HOST_IP}:{RPING_PORT}", flush=True)
    try:
        conn, addr = srv.accept()
    except socket.timeout:
        c.check("guest connected", False, f"no connection in {accept_timeout:.0f} s")
        return 1
    c.check("guest connected", True, f"from {addr[0]}:{addr[1]}")
    conn.settimeout(15)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        # 1. MPA Request, byte for byte (docs/protocols.md §5.3)
        req = recv_exact(conn, len(RPING_CLIENT_REQUEST))
        c.eq("MPA Request bytes (docs/protocols.md §5.3)", req, RPING_CLIENT_REQUEST)
        c.eq("Request key", req[:16], b"MPA ID Req Frame")
        c.eq("Request flags: enhanced only (M=0 C=0)", req[16], 0x10, hexint=True)
        c.eq("Request Rev", req[17], 2)
        c.eq("Request PD_Length", struct.unpack(">H", req[18:20])[0], 4)
        c.eq("Request v2 IRD/ORD", struct.unpack(">HH", req[20:24]), (1, 1))
        # docs/siw.md §4.5/§4.8.3: never pipeline bytes behind a Request/Reply. Nothing else
        # may have arrived yet either: the Initiator waits for the Reply (docs/mpa.md §1.5).
        conn.settimeout(0.5)
        try:
            extra = conn.recv(64)
        except socket.timeout:
            extra = b""
        c.eq("Initiator sends nothing before the Reply (docs/mpa.md §1.5)", extra, b"")
        conn.settimeout(15)
        if not c.ok():
            return 1
        # 2. valid Reply
        conn.sendall(RPING_VALID_REPLY)
        # 3. first FPDU: rping's Send of rping_rdma_info
        fpdu = recv_exact(conn, SEND_FPDU_LEN)
        print(f"  [host] first FPDU: {fpdu.hex(' ')}", flush=True)
        ulpdu_len, ddp_ctrl, rdmap_ctrl = struct.unpack(">HBB", fpdu[0:4])
        rsvd, qn, msn, mo = struct.unpack(">IIII", fpdu[4:20])
        buf, rkey, size = struct.unpack(">QII", fpdu[20:36])
        c.eq("ULPDU_Length 0x22", ulpdu_len, 0x22, hexint=True)
        c.eq("DDP ctrl 0x41 (untagged, L, DV 1)", ddp_ctrl, 0x41, hexint=True)
        c.eq("RDMAP ctrl 0x43 (RV 1, Send)", rdmap_ctrl, 0x43, hexint=True)
        c.eq("RsvdULP bytes 4-7 zero", rsvd, 0)
        c.eq("QN 0", qn, 0)
        c.eq("MSN 1 (rfc5041 untagged MSN starts at one)", msn, 1)
        c.eq("MO 0", mo, 0)
        c.eq("rping_rdma_info.size", size, RPING_SIZE)
        c.check("rping_rdma_info.buf non-zero (client start_buf VA)", buf != 0, f"0x{buf:x}")
        c.check("rping_rdma_info.rkey non-zero", rkey != 0, f"0x{rkey:08x}")
        # CRC not negotiated: siw writes zeros in the CRC field (docs/mpa.md §1.6)
        c.eq("CRC field zero (CRC off)", fpdu[36:40], b"\x00\x00\x00\x00")
    except (EOFError, socket.timeout, OSError, ValueError) as e:
        c.check("protocol exchange completed", False, f"{type(e).__name__}: {e}")
    finally:
        conn.close()
        srv.close()
    return 0 if c.ok() else 1


def capture_checks(c: Checks, pcap: Path) -> None:
    """tshark dissects the exchange as iwarp_mpa / iwarp_ddp_rdmap (docs/testing.md §6.3)."""
    reqs = tshark_rows(pcap, "iwarp_mpa.key.req", ["iwarp_mpa.marker_flag", "iwarp_mpa.crc_flag",
                                                   "iwarp_mpa.rev", "iwarp_mpa.pdlength"])
    c.eq("tshark: one MPA Request", len(reqs), 1)
    if reqs:
        r = reqs[0]
        c.eq("tshark: Request M,C,Rev,PD_Length", (flag(r[0]), flag(r[1]), first_int(r[2]),
                                                   first_int(r[3])), (0, 0, 2, 4))
    reps = tshark_rows(pcap, "iwarp_mpa.key.rep", ["iwarp_mpa.rej_flag", "iwarp_mpa.crc_flag"])
    c.eq("tshark: one MPA Reply", len(reps), 1)
    if reps:
        c.eq("tshark: Reply R,C", (flag(reps[0][0]), flag(reps[0][1])), (0, 0))
    sends = tshark_rows(pcap, "iwarp_rdma.opcode == 3",
                        ["iwarp_mpa.ulpdulength", "iwarp_ddp.qn", "iwarp_ddp.msn", "iwarp_ddp.mo"])
    c.check("tshark: Send FPDU dissected", len(sends) >= 1, f"{len(sends)} frame(s)")
    if sends:
        s = sends[0]
        c.eq("tshark: Send ULPDU_Length,QN,MSN,MO",
             tuple(first_int(v) for v in s), (0x22, 0, 1, 0))
    check_no_malformed(c, pcap)


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

    out, t0, c = case_start(a)
    pcap = out / f"{NAME}.pcap"
    guest_cmd = (f"rping -c -a {vm.HOST_IP} -C 1 -S {RPING_SIZE} -v; "
                 "echo \"rping client exit $?\"")
    with vm.Guest(guest_cmd, siw="default", timeout=a.timeout, pcap=pcap,
                  console_log=out / f"{NAME}.console") as g:
        p = g.netns_popen([sys.executable, str(Path(__file__).resolve()), "--peer",
                           "--accept-timeout", str(a.timeout - 10)])
        g.start()
        res = g.wait()
        try:
            peer_rc = p.wait(15)
        except subprocess.TimeoutExpired:
            peer_rc = None
    check_guest_ran(c, res, "guest booted (siw0 up)")
    c.check("rping client reached the host (guest console)", "rping client exit" in res.console)
    c.eq("host responder checks", peer_rc, 0)
    capture_checks(c, pcap)
    return case_verdict(c, NAME, t0)


if __name__ == "__main__":
    sys.exit(main())
