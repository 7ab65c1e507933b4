#!/usr/bin/env python3
"""Case (b): hand-written MPA initiator on the host side -> siw rping SERVER in the guest.

Guest: `rping -s -a 10.77.0.2 -C 1 -S 64 -P -v` (siw, MPA Responder, persistent), then
`nc -l -p 7999` so the host can tell it when to stop.
Host (netns, kernel TCP sockets to 10.77.0.2:7174):
  1. connection 1: Request with C=1 (`50 02 00 04 00 01 00 01`): the Reply must echo the
     request's flag word, so C=1 (siw quirk, docs/siw.md §4.3, §4.8.4), Rev 2, PD_Length 4,
     IRD/ORD 1/1 (rping server mirrors the client's values, docs/protocols.md §5.1); siw must then send nothing
     before the Initiator's first FPDU (docs/mpa.md §1.5); close.
  2. connection 2: Request with M=1: siw does not support markers and answers R=1
     (docs/mpa.md §1.7, docs/siw.md §4.3), then closes the TCP connection.
Then the tap capture is checked with tshark (docs/testing.md §6.3).

Usage: rping_server_mpa.py [--out DIR]       (the --peer role is internal)
"""

from __future__ import annotations

import argparse
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from common import (FLAG_C, FLAG_ENHANCED, FLAG_M, FLAG_R, HERE, KEY_REP, KEY_REQ, MPA_REV2,
                    RPING_PORT, Checks, check_no_malformed, connect_retry, first_int, flag,
                    mpa_frame, recv_mpa_frame, tshark_rows, vm)
from common import case_start, case_verdict, check_guest_ran

NAME = "rping_server_mpa"
RPING_SIZE = 64


def crc_request_connection(c: Checks, deadline: float) -> None:
    """Connection 1: C=1 Request; the Reply must echo C=1 (docs/siw.md §4.3)."""
    s = connect_retry((vm.GUEST_IP, RPING_PORT), deadline)
    c.check("conn 1: connected to siw rping server", True)
    s.settimeout(15)
    try:
        req = mpa_frame(KEY_REQ, FLAG_C | FLAG_ENHANCED, MPA_REV2, 1, 1)
        c.eq("conn 1: Request sent (C=1, enhanced, Rev 2, IRD/ORD 1/1)", req[16:],
             bytes([0x50, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01]))
        s.sendall(req)
        hdr, pd = recv_mpa_frame(s)
        print(f"  [host] conn 1 Reply: {(hdr + pd).hex(' ')}", flush=True)
        c.eq("conn 1: Reply key", hdr[:16], KEY_REP)
        # siw quirk, docs/siw.md §4.3: the Reply reuses the Request's flag/rev word
        c.eq("conn 1: Reply flags echo the Request (C=1, enhanced)", hdr[16],
             FLAG_C | FLAG_ENHANCED, hexint=True)
        c.check("conn 1: Reply C=1 (rfc5044 responder must answer C=1)", bool(hdr[16] & FLAG_C))
        c.check("conn 1: Reply R=0", not hdr[16] & FLAG_R)
        c.eq("conn 1: Reply Rev", hdr[17], MPA_REV2)
        c.eq("conn 1: Reply PD_Length", struct.unpack(">H", hdr[18:20])[0], 4)
        c.eq("conn 1: Reply v2 IRD/ORD", struct.unpack(">HH", pd[:4]) if len(pd) >= 4 else None,
             (1, 1))
        # The Responder must not send FPDUs before the Initiator's first FPDU (docs/mpa.md §1.5).
        s.settimeout(1.0)
        try:
            extra = s.recv(64)
            extra_desc = extra.hex(" ") if extra else "EOF"
        except socket.timeout:
            extra, extra_desc = b"", "nothing in 1 s"
        c.check("conn 1: Responder sends nothing before our first FPDU (docs/mpa.md §1.5)",
                extra_desc == "nothing in 1 s", extra_desc)
    except (EOFError, socket.timeout, OSError, ValueError) as e:
        c.check("conn 1: exchange completed", False, f"{type(e).__name__}: {e}")
    finally:
        s.close()


def marker_request_connection(c: Checks, deadline: float) -> None:
    """Connection 2: M=1 Request; siw rejects markers with R=1 (docs/mpa.md §1.7, docs/siw.md §4.3)."""
    s = connect_retry((vm.GUEST_IP, RPING_PORT), deadline)
    c.check("conn 2: connected to siw rping server", True)
    s.settimeout(15)
    try:
        s.sendall(mpa_frame(KEY_REQ, FLAG_M | FLAG_ENHANCED, MPA_REV2, 1, 1))
        hdr, pd = recv_mpa_frame(s)
        print(f"  [host] conn 2 Reply: {(hdr + pd).hex(' ')}", flush=True)
        c.eq("conn 2: Reply key", hdr[:16], KEY_REP)
        c.check("conn 2: Reply R=1 (markers rejected)", bool(hdr[16] & FLAG_R),
                f"flags 0x{hdr[16]:02x}")
        # siw clears M in its reject (siw_cm.c reject path); informative, RFC does not require it
        c.check("conn 2: Reply M=0", not hdr[16] & FLAG_M, f"flags 0x{hdr[16]:02x}")
        # After a reject the Responder closes the TCP connection (docs/mpa.md §1.5).
        s.settimeout(5.0)
        try:
            rest = s.recv(64)
            closed = rest == b""
            desc = "EOF" if closed else f"unexpected bytes {rest.hex(' ')}"
        except socket.timeout:
            closed, desc = False, "still open after 5 s"
        except ConnectionResetError:
            closed, desc = True, "RST"
        c.check("conn 2: Responder closed the connection after the reject", closed, desc)
    except (EOFError, socket.timeout, OSError, ValueError) as e:
        c.check("conn 2: exchange completed", False, f"{type(e).__name__}: {e}")
    finally:
        s.close()


def peer(connect_timeout: float) -> int:
    """Host-side MPA initiator. Exit 0 iff every check passed."""
    c = Checks("host")
    deadline = time.monotonic() + connect_timeout
    try:
        crc_request_connection(c, deadline)
        marker_request_connection(c, deadline)
    except TimeoutError as e:
        c.check("siw rping server reachable", False, str(e))
    return 0 if c.ok() else 1


def capture_checks(c: Checks, pcap: Path) -> None:
    """tshark view of both connections (docs/testing.md §6.3)."""
    reqs = tshark_rows(pcap, "iwarp_mpa.key.req", ["iwarp_mpa.marker_flag", "iwarp_mpa.crc_flag"])
    c.eq("tshark: two MPA Requests (M,C)", [(flag(r[0]), flag(r[1])) for r in reqs],
         [(0, 1), (1, 0)])
    reps = tshark_rows(pcap, "iwarp_mpa.key.rep", ["iwarp_mpa.rej_flag", "iwarp_mpa.crc_flag",
                                                   "iwarp_mpa.rev"])
    c.eq("tshark: two MPA Replies (R,C,Rev)",
         [(flag(r[0]), flag(r[1]), first_int(r[2])) for r in reps], [(0, 1, 2), (1, 0, 2)])
    check_no_malformed(c, pcap)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--connect-timeout", type=float, default=120.0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(HERE.parent / "build" / "results"),
                    help="directory for the pcap and the console log")
    ap.add_argument("--timeout", type=float, default=150.0, help="bound for the whole case (s)")
    a = ap.parse_args()
    if a.peer:
        return peer(a.connect_timeout)

    out, t0, c = case_start(a)
    pcap = out / f"{NAME}.pcap"
    guest_cmd = (f"rping -s -a {vm.GUEST_IP} -C 1 -S {RPING_SIZE} -P -v & RP=$!; "
                 f"nc -l -p {vm.DONE_PORT} </dev/null >/dev/null; "
                 "kill $RP; wait $RP; echo \"rping server stopped\"")
    with vm.Guest(guest_cmd, siw="default", timeout=a.timeout, pcap=pcap,
                  console_log=out / f"{NAME}.console") as g:
        p = g.netns_popen([sys.executable, str(Path(__file__).resolve()), "--peer",
                           "--connect-timeout", str(a.timeout - 15)])
        g.start()
        try:
            peer_rc = p.wait(a.timeout)
        except subprocess.TimeoutExpired:
            peer_rc = None
        c.check("host told the guest to stop", g.signal_done())
        res = g.wait()
    check_guest_ran(c, res, "guest booted (siw0 up)")
    c.eq("host initiator checks", peer_rc, 0)
    capture_checks(c, pcap)
    return case_verdict(c, NAME, t0)


if __name__ == "__main__":
    sys.exit(main())
