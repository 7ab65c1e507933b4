#!/usr/bin/env python3
"""Case (issue 5 case 3): MPA v2 peer-to-peer (RFC 6581) with xwarp as the INITIATOR and a
siw rping server as the responder.

Guest (siw default): `rping -s -a 10.77.0.2 -S 4096 -C 10` per run (the last one under
`timeout`, it may never see a usable connection).
Host: `xwarp-rping -c -V --report --p2p TYPES` (tools/src/bin/rping.rs, on `xwarp::verbs`:
placement on the engine thread; the Request's RTR offer is `ConnectTuning::p2p_rtr_offer`;
until issue 12 `xwarp-rping-interop`, the sans-IO connection on the tool's own thread):
  1. `write,read`: siw must answer A=1 with exactly the Write RTR (docs/siw.md §4.3:
     Write if offered); our first FPDU is the zero-length RDMA Write (opcode 0); then 10
     verified rping iterations.
  2. `read`: siw must pick the Read RTR; our first FPDU is a zero-length Read Request
     (opcode 1) and siw's first FPDU its zero-length Read Response (opcode 2); 10 iterations.
  3. (only with `--send-only`) `send` only: siw never chooses the Send RTR (docs/siw.md §4.3); it
     picks Write, which is not in our offer, so our Initiator refuses the Reply with an LLP
     Terminate "no matching RTR" (0x07, RFC 6581 §5) and reports the failure. Not in the
     default run: on the Debian 6.1 guest kernel that Terminate, arriving while siw still
     withholds ESTABLISHED, hits `kernel BUG at drivers/infiniband/core/iwcm.c:969` (the
     guest dies; see interop/README.md), so the case would only time out.
Checks: Reply flags (A and the chosen RTR in the v2 block), what we report as negotiated,
the RTR opcodes in the capture, verified data, guest servers' exit codes for runs 1–2, and
the usual tshark checks on every connection.
"""

from __future__ import annotations

import argparse
import re
import sys
import time

from common import (HERE, RPING_PORT, check_stream_clean, run_host,
                    tshark_streams, v2_block, vm)
from common import build_tool, case_start, case_verdict, print_host_run

NAME = "xwarp_p2p"
SIZE = 4096
COUNT = 10
# (label, --p2p value, expected RTR chosen by siw, expected Rust Debug of our rtr)
RUNS = [("p2p-write-read", "write,read", "write", "Some(Write)"),
        ("p2p-read", "read", "read", "Some(Read)"),
        ("p2p-send-only", "send", None, None)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE.parent / "build" / "results"))
    ap.add_argument("--timeout", type=float, default=100.0)
    ap.add_argument("--send-only", action="store_true",
                    help="add run 3 (crashes the guest kernel, see the docstring)")
    a = ap.parse_args()
    runs = RUNS if a.send_only else RUNS[:2]
    out, t0, c = case_start(a)
    binary = build_tool(c, "xwarp-rping")
    if binary is None:
        return case_verdict(c, NAME, t0, "build")
    pcap = out / f"{NAME}.pcap"
    cmds = [f"rping -s -a {vm.GUEST_IP} -p {RPING_PORT} -S {SIZE} -C {COUNT}; "
            f"echo \"XW-SERVER {i} rc=$?\"" for i in range(2)]
    if a.send_only:
        cmds.append(f"timeout 15 rping -s -a {vm.GUEST_IP} -p {RPING_PORT} -S {SIZE} -C {COUNT}; "
                    f"echo \"XW-SERVER 2 rc=$?\"")
    results = []
    with vm.Guest("; ".join(cmds), siw="default", timeout=a.timeout, pcap=pcap,
                  console_log=out / f"{NAME}.console", xwarp=True) as g:
        g.start()
        # The guest's siw must be up before our first SYN (a connect that times out on an
        # unanswered ARP is not retried); a refused one (the next rping server does not
        # listen yet) is retried inside the connect (XWARP_CONNECT_RETRY_MS).
        g.wait_ready()
        deadline = time.monotonic() + a.timeout - 10
        for label, types, _, _ in runs:
            argv = ["env", "XWARP_CONNECT_RETRY_MS=20000", str(binary)] + g.engine_args() + [
                "-c", "-a", vm.GUEST_IP, "-p", str(RPING_PORT), "-S", str(SIZE),
                "-C", str(COUNT), "-V", "--report", "--p2p", types]
            r = run_host(g, argv, deadline)
            print_host_run(label, r)
            rc, so, se, dt = r
            results.append((rc, so, se))
            time.sleep(2)
        res = g.wait()
    c.check("guest booted", res.boot_s is not None, f"{res.boot_s or 0:.1f} s")
    if "kernel BUG" in res.console:
        print("  [case] guest kernel BUG: " + res.console[res.console.index("kernel BUG"):][:120],
              flush=True)
    c.check("guest finished in time", res.rc is not None and not res.timed_out, f"rc={res.rc}")
    servers = re.findall(r"XW-SERVER (\d+) rc=(\d+)", res.console)
    print(f"  [case] guest servers: {servers}", flush=True)
    c.eq("guest rping servers 0-1 exit codes", servers[:2], [("0", "0"), ("1", "0")])
    streams = tshark_streams(pcap)
    mpa_streams = sorted(s for s, st in streams.items() if st["req"] is not None)
    c.eq("tshark: one MPA connection per run", len(mpa_streams), len(runs))
    for (label, types, want, rtr_dbg), (rc, so, se), sid in zip(runs, results, mpa_streams):
        st = streams[sid]
        req = v2_block(st["req"]["pd"]) if st["req"] else None
        rep = v2_block(st["rep"]["pd"]) if st["rep"] else None
        print(f"  [case] {label}: Request v2 {req}, Reply v2 {rep}", flush=True)
        offered = set(types.split(","))
        c.check(f"{label} tshark: Request offers P2P with exactly {sorted(offered)}",
                req is not None and req["p2p"] and {t for t in ("write", "read", "send")
                                                    if req[f"{t}_rtr"]} == offered)
        chosen = {t for t in ("write", "read", "send") if rep and rep[f"{t}_rtr"]}
        c.check(f"{label} tshark: Reply A=1 and exactly one RTR type", rep is not None and
                rep["p2p"] and len(chosen) == 1, f"chosen {sorted(chosen)}")
        ours = [o for p, o in st["opcodes"].items() if p != RPING_PORT]
        ours = ours[0] if ours else []
        siws = st["opcodes"].get(RPING_PORT, [])
        if want is not None:
            c.eq(f"{label}: siw picks", sorted(chosen), [want])
            c.eq(f"{label}: our client exit code", rc, 0)
            c.check(f"{label}: negotiated rtr={rtr_dbg}", f"rtr={rtr_dbg}" in so)
            c.check(f"{label}: {COUNT} verified iterations", f"iterations={COUNT} " in so)
            first = {"write": 0, "read": 1}[want]
            c.eq(f"{label} tshark: our first FPDU is the {want} RTR (opcode)",
                 ours[:1], [first])
            if want == "read":
                c.eq(f"{label} tshark: siw's first FPDU is the zero-length Read Response",
                     siws[:1], [2])
            check_stream_clean(c, label, st)
        else:
            c.check(f"{label}: siw picks a type we did not offer (it never picks Send)",
                    bool(chosen) and not (chosen & offered), f"chosen {sorted(chosen)}")
            c.check(f"{label}: our client fails the connection", rc not in (0, None),
                    se.strip()[-200:])
            c.eq(f"{label} tshark: our only FPDU is a Terminate", ours, [7])
            check_stream_clean(c, label, st, allow_errors=True)
    return case_verdict(c, NAME, t0)


if __name__ == "__main__":
    sys.exit(main())
