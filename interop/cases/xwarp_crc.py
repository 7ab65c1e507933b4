#!/usr/bin/env python3
"""Case (issue 5 case 2): MPA CRC negotiation with xwarp as the INITIATOR against the
default siw (mpa_crc_required off).

Guest (siw default): `rping -s -a 10.77.0.2 -S 4096 -C 20`, twice in a row.
Host: tools/src/bin/rping_interop.rs (`xwarp-rping-interop`) (sans-IO Connection over kernel TCP) as the rping client,
  run 1 with `--crc` (Request C=1), run 2 without.
Checks: run 1: siw echoes C=1 in its Reply (docs/siw.md §4.3), we report crc=true, and
every FPDU in both directions carries a Good CRC32 (tshark) — none bad; run 2: C=0 both
ways and tshark checks no CRC. Both: 20 verified iterations (our client compares the
server's RDMA Write with the buffer the server RDMA-Read), both guest servers exit 0,
every frame after the Reply dissects as iWARP, nothing malformed, no error-level expert.
The other CRC combinations are covered elsewhere: xwarp responder vs a siw-crc initiator
and xwarp initiator without CRC vs siw-crc (`xwarp_rping_server` / `xwarp_rping_client`,
siw-crc variants); xwarp initiator without CRC vs default siw (`xwarp_rping_client`).
"""

from __future__ import annotations

import argparse
import re
import sys
import time

from common import (HERE, RPING_PORT, check_stream_clean,
                    crc_verdicts, run_host, tshark_streams, vm)
from common import build_tool, case_start, case_verdict, print_host_run

NAME = "xwarp_crc"
SIZE = 4096
COUNT = 20
RUNS = [("crc-requested", ["--crc"], True), ("crc-not-requested", [], False)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE.parent / "build" / "results"))
    ap.add_argument("--timeout", type=float, default=90.0)
    a = ap.parse_args()
    out, t0, c = case_start(a)
    binary = build_tool(c, "xwarp-rping-interop")
    if binary is None:
        return case_verdict(c, NAME, t0, "build")
    pcap = out / f"{NAME}.pcap"
    guest_cmd = "; ".join(
        f"rping -s -a {vm.GUEST_IP} -p {RPING_PORT} -S {SIZE} -C {COUNT}; "
        f"echo \"XW-SERVER {i} rc=$?\"" for i in range(len(RUNS)))
    results = []
    with vm.Guest(guest_cmd, siw="default", timeout=a.timeout, pcap=pcap,
                  console_log=out / f"{NAME}.console", xwarp=True) as g:
        g.start()
        deadline = time.monotonic() + a.timeout - 10
        for label, flags, _ in RUNS:
            argv = [str(binary)] + g.engine_args() + [
                "-a", vm.GUEST_IP, "-p", str(RPING_PORT), "-S", str(SIZE),
                "-C", str(COUNT)] + flags
            r = run_host(g, argv, deadline)
            print_host_run(label, r)
            rc, so, se, dt = r
            results.append((rc, so, se))
            time.sleep(2)  # let the guest's next rping server listen
        res = g.wait()
    c.check("guest booted", res.boot_s is not None, f"{res.boot_s or 0:.1f} s")
    c.check("guest finished in time", res.rc is not None and not res.timed_out, f"rc={res.rc}")
    c.eq("guest rping servers exit codes", re.findall(r"XW-SERVER (\d+) rc=(\d+)", res.console),
         [(str(i), "0") for i in range(len(RUNS))])
    streams = tshark_streams(pcap)
    crcs = crc_verdicts(pcap)
    mpa_streams = sorted(s for s, st in streams.items() if st["req"] is not None)
    c.eq("tshark: one MPA connection per run", len(mpa_streams), len(RUNS))
    for (label, _, crc), (rc, so, _), sid in zip(RUNS, results, mpa_streams):
        c.eq(f"{label}: our client exit code", rc, 0)
        c.check(f"{label}: {COUNT} verified iterations", f"iterations={COUNT} " in so)
        c.check(f"{label}: negotiated crc={crc}", f"XWARP-NEGOTIATED crc={str(crc).lower()}" in so)
        st = streams[sid]
        c.eq(f"{label} tshark: Request C", st["req"]["c"], int(crc))
        c.eq(f"{label} tshark: Reply C (siw echoes the Request)", st["rep"]["c"], int(crc))
        check_stream_clean(c, label, st)
        by_port = crcs.get(sid, {})
        ours = [v for p, v in by_port.items() if p != RPING_PORT]
        siws = by_port.get(RPING_PORT, [])
        if crc:
            c.check(f"{label} tshark: Good CRC32 on every FPDU we sent",
                    bool(ours) and all(all(v) for v in ours),
                    f"{sum(len(v) for v in ours)} checked, {sum(v.count(False) for v in ours)} bad")
            c.check(f"{label} tshark: Good CRC32 on every FPDU siw sent", bool(siws) and all(siws),
                    f"{len(siws)} checked, {siws.count(False)} bad")
            c.eq(f"{label} tshark: FPDUs CRC-checked = FPDUs", sum(len(v) for v in by_port.values()),
                 st["fpdus"])
        else:
            c.eq(f"{label} tshark: no CRC checked", sum(len(v) for v in by_port.values()), 0)
    return case_verdict(c, NAME, t0)


if __name__ == "__main__":
    sys.exit(main())
