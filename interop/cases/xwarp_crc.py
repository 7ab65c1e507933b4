#!/usr/bin/env python3
"""Case (issue 5 case 2): MPA CRC negotiation with xwarp as the INITIATOR against the
default siw (mpa_crc_required off).

Guest (siw default): `rping -s -a 10.77.0.2 -S 4096 -C 20`, twice in a row.
Host: tools/src/bin/rping.rs (`xwarp-rping`, on `xwarp::verbs`: a verbs engine bound to
  tap0 with AF_XDP owning 10.77.0.3, placement on the engine thread) as the rping client,
  `-V -v -d`, run 1 with `XWARP_MPA_CRC=1` (Request C=1), run 2 with `XWARP_MPA_CRC=0`.
  (Until issue 12 the host side was `xwarp-rping-interop --crc`, the sans-IO connection
  driven on the tool's own thread.)
Checks: run 1: siw echoes C=1 in its Reply (docs/siw.md §4.3), we report CRC true, and
every FPDU in both directions carries a Good CRC32 (tshark) — none bad; run 2: C=0 both
ways and tshark checks no CRC. Both: 20 verified iterations (-V: our client compares the
server's RDMA Write with the buffer the server RDMA-Read, and -v prints each iteration's
data, which must be rping's pattern), both guest servers exit 0,
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
from xwarp_lib_rping import rping_data

NAME = "xwarp_crc"
SIZE = 4096
COUNT = 20
RUNS = [("crc-requested", "1", True), ("crc-not-requested", "0", False)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE.parent / "build" / "results"))
    ap.add_argument("--timeout", type=float, default=90.0)
    a = ap.parse_args()
    out, t0, c = case_start(a)
    binary = build_tool(c, "xwarp-rping")
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
        # siw up before our first SYN: a connect that times out on an unanswered ARP (the
        # guest still booting, 10 s under load) is not retried, a refused one is.
        g.wait_ready()
        deadline = time.monotonic() + a.timeout - 10
        for label, crc_var, _ in RUNS:
            # XWARP_CONNECT_RETRY_MS: the guest's next server may not listen yet.
            argv = ["env", f"XWARP_MPA_CRC={crc_var}", "XWARP_CONNECT_RETRY_MS=20000",
                    str(binary)] + g.engine_args() + [
                "-c", "-a", vm.GUEST_IP, "-p", str(RPING_PORT), "-S", str(SIZE),
                "-C", str(COUNT), "-V", "-v", "-d"]
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
    for (label, _, crc), (rc, so, se), sid in zip(RUNS, results, mpa_streams):
        c.eq(f"{label}: our client exit code (-V verified every iteration)", rc, 0)
        pings = [ln[len("ping data: "):] for ln in so.splitlines() if ln.startswith("ping data: ")]
        c.eq(f"{label}: {COUNT} iterations printed, each rping's pattern",
             [i for i, d in enumerate(pings) if d != rping_data(i, SIZE)] + [len(pings)], [COUNT])
        c.check(f"{label}: negotiated CRC {crc}", f", CRC {str(crc).lower()}" in se)
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
