#!/usr/bin/env python3
"""Case (issue 5 case 5): perftest with `-R` — siw runs the perftest SERVER
(`ib_write_bw -R`, `ib_read_bw -R`, `ib_send_bw -R`; Debian perftest 4.5+0.17 = perftest
6.06), xwarp runs
the client (tools/src/bin/perftest_peer.rs (`xwarp-perftest-peer`), on `xwarp::verbs` since
issue 12: placement on the engine thread), speaking perftest's control protocol over a
"comm" rdma_cm connection and running the test on a second connection (docs/protocols.md
§5.4; the exact 6.06 sequence is in the tool's module docs). Debian's own perftest clients
under `xwarp run` (`xwarp_lib_perftest_client`) cover the same tests but cannot check the
data: this case's Read test verifies every Read's bytes.

Guest (siw-crc: CRC on both connections, so every test byte is CRC-checked by siw and by
us): `ib_write_bw -R -d siw0 -s 4096 -n 200 -F`, then `ib_read_bw -R ...` and
`ib_send_bw -R ... -r 30` with the same size/iterations.
Checks: our client exits 0; the server prints its report line with OUR size and iteration
count (it received our bandwidth report through the control protocol, so every control
message was understood); the server exits 0; write: 200 Writes completed; read: the pattern
we RDMA-Wrote into the server's buffer came back in all 200 Reads (verified=200); send:
200 Sends completed and siw's receive-credit RDMA Writes (4-byte count, every 10 receives)
reached 200; tshark:
on each test connection our Writes/Read Requests and siw's Read Responses with Good CRC32,
siw's credit Writes, both connections per test dissect as iWARP, nothing malformed, no
error-level expert item
(with Wireshark's RPC-over-RDMA heuristic off: it misreads perftest's raw 4-byte control
Sends as malformed RPCoRDMA).
"""

from __future__ import annotations

import argparse
import re
import sys
import time

from common import (HERE, NO_RPCRDMA, check_stream_clean, crc_verdicts, run_host,
                    stream_bytes, tcp_resets, tshark_streams, vm, walk_fpdus)
from common import build_tool, case_start, case_verdict, print_host_run

NAME = "xwarp_perftest"
PORT = 18515
SIZE = 4096
ITERS = 200
TESTS = ["write", "read", "send"]
#: ib_send_bw -r (receive depth) on both sides: credits every RX_DEPTH / 3 receives.
RX_DEPTH = 30


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE.parent / "build" / "results"))
    ap.add_argument("--timeout", type=float, default=110.0)
    ap.add_argument("--siw", default="crc", choices=["crc", "default"])
    a = ap.parse_args()
    out, t0, c = case_start(a)
    binary = build_tool(c, "xwarp-perftest-peer")
    if binary is None:
        return case_verdict(c, NAME, t0, "build")
    crc = a.siw == "crc"
    pcap = out / f"{NAME}.pcap"
    guest_cmd = "; ".join(
        f"ib_{t}_bw -R -d siw0 -p {PORT} -s {SIZE} -n {ITERS} -F"
        + (f" -r {RX_DEPTH}" if t == "send" else "") + f"; echo \"XW-SERVER {t} rc=$?\""
        for t in TESTS)
    results = []
    with vm.Guest(guest_cmd, siw=a.siw, timeout=a.timeout, pcap=pcap,
                  console_log=out / f"{NAME}.console", xwarp=True) as g:
        g.start()
        # siw up before our first SYN (a connect timing out on an unanswered ARP is not
        # retried; a refused one is, inside the tool's connect).
        g.wait_ready()
        deadline = time.monotonic() + a.timeout - 10
        for t in TESTS:
            argv = [str(binary)] + g.engine_args() + [
                "-a", vm.GUEST_IP, "-p", str(PORT), "--test", t,
                "-s", str(SIZE), "-n", str(ITERS), "--rx-depth", str(RX_DEPTH)] + (
                    ["--crc"] if crc else [])
            r = run_host(g, argv, deadline)
            print_host_run(t, r)
            rc, so, se, dt = r
            results.append((rc, so, se))
            time.sleep(2)
        res = g.wait()
    c.check("guest booted", res.boot_s is not None, f"{res.boot_s or 0:.1f} s")
    c.check("guest finished in time", res.rc is not None and not res.timed_out, f"rc={res.rc}")
    # The server's report line: " #bytes #iterations BW peak BW average MsgRate".
    reports = re.findall(rf"^\s*{SIZE}\s+{ITERS}\s+[\d.]+\s+[\d.]+\s+[\d.]+", res.console, re.M)
    print(f"  [case] server report lines: {reports}", flush=True)
    streams = tshark_streams(pcap, extra=NO_RPCRDMA)
    crcs = crc_verdicts(pcap)
    mpa = sorted(s for s, st in streams.items() if st["req"] is not None)
    c.eq("tshark: two MPA connections per test (comm + test)", len(mpa), 2 * len(TESTS))
    for i, (t, (rc, so, _)) in enumerate(zip(TESTS, results)):
        c.eq(f"{t}: our client exit code", rc, 0)
        c.check(f"{t}: guest server exit 0", f"XW-SERVER {t} rc=0" in res.console)
        c.check(f"{t}: remote version 6.06", "remote version=\"6.06\"" in so)
        c.check(f"{t}: server printed a report with our size and iterations", len(reports) > i)
        if t == "write":
            c.check(f"{t}: {ITERS} Writes completed", f"iters={ITERS} verified=0" in so)
        elif t == "send":
            c.check(f"{t}: {ITERS} Sends completed, siw's credit Writes counted all {ITERS}",
                    f"iters={ITERS} verified=0 credits={ITERS} " in so)
        else:
            c.check(f"{t}: {ITERS} Reads verified", f"iters={ITERS} verified={ITERS}" in so)
        c.check(f"{t}: negotiated crc={crc} on the test connection",
                f"test connection crc={str(crc).lower()}" in so)
        for role, sid in (("comm", mpa[2 * i] if len(mpa) > 2 * i else None),
                          ("test", mpa[2 * i + 1] if len(mpa) > 2 * i + 1 else None)):
            if sid is None:
                continue
            st = streams[sid]
            check_stream_clean(c, f"{t} {role}", st)
            # FPDUs walked over the reassembled byte stream, not per frame: the engine's TCP
            # is not MPA-aware (RFC 5044 §8.1 alignment is a SHOULD), so when it is window-
            # limited it packs FPDUs across segment boundaries, and tshark (no markers) then
            # misreads the frames that do not start with an FPDU.
            walks = {port: (walk_fpdus(data, crc), hole)
                     for port, (data, hole) in stream_bytes(pcap, sid).items()}
            resets = None
            for port, (w, hole) in sorted(walks.items()):
                side = "siw" if port == PORT else "ours"
                # The engine's own capture drops nothing, so a hole is a failure. A last
                # FPDU cut off counts as whole only after the other side's RST: siw's
                # ib_write_bw server closes its test connection once the control exchange
                # says done, while our last Writes are still in flight, and resets on
                # them (interop/README.md, as in xwarp_lib_perftest).
                whole = not hole and w["rest"] == 0
                if not hole and w["rest"] and w["cut"]:
                    resets = tcp_resets(pcap, sid) if resets is None else resets
                    if resets - {port}:
                        print(f"  [case] {t} {role} {side}: last FPDU cut off ({w['rest']} of "
                              f"{w['cut']} bytes) by the peer's RST", flush=True)
                        whole = True
                c.check(f"{t} {role} {side}: byte stream complete, whole FPDUs",
                        whole,
                        f"{w['fpdus']} FPDUs, hole={hole}, {w['rest']} bytes left")
                if crc:
                    c.eq(f"{t} {role} {side}: every FPDU's CRC32c right ({w['fpdus']} FPDUs)",
                         w["bad_crc"], 0)
            tshark_bad = [v for vs in crcs.get(sid, {}).values() for v in vs].count(False)
            print(f"  [case] {t} {role}: tshark per-frame CRC verdicts: {tshark_bad} bad "
                  f"(informational: frames that do not start with an FPDU are misread)", flush=True)
            if role == "test":
                ours = sorted({o for p, (w, _) in walks.items() if p != PORT
                               for o in w["opcodes"]})
                theirs = sorted({o for p, (w, _) in walks.items() if p == PORT
                                 for o in w["opcodes"]})
                # write: our Writes, then the zero-length fence Read (opcode 1) that
                # siw answers with a zero-length Read Response (2) once it took them all.
                want_ours, want_theirs = {"write": ([0, 1], [2]), "read": ([0, 1], [2]),
                                          "send": ([3], [0])}[t]
                c.eq(f"{t} test: our opcodes", ours, want_ours)
                if t == "write":
                    n_ours = sum(w["fpdus"] for p, (w, _) in walks.items() if p != PORT)
                    c.check(f"{t} test: every Write reached the wire before the report "
                            f"(>= 3 FPDUs per {SIZE} B Write at MSS 1460)",
                            n_ours >= 3 * ITERS, f"{n_ours} FPDUs")
                c.eq(f"{t} test: siw's opcodes", theirs, want_theirs)
    return case_verdict(c, NAME, t0)


if __name__ == "__main__":
    sys.exit(main())
