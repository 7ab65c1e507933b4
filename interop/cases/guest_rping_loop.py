#!/usr/bin/env python3
"""Case: siw <-> siw inside the guest (sanity of the guest itself, no host peer).

Guest: `rping -s` and `rping -c -V -C 3` on the eth0 address (siw on lo misbehaves when siw0
exists, docs/testing.md §6.4.3). Three full rping iterations (Send, RDMA Read, Read Response,
Write, Sends; docs/protocols.md §5.2) with data verification (-V) prove the guest's siw.ko, the
rdma-core tools, their libraries (incl. libgcc_s) and the provider all work. If this case
fails, the host-peer cases' failures are the guest's fault, not the peer's.

Usage: guest_rping_loop.py [--out DIR]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from common import HERE, Checks, vm

NAME = "guest_rping_loop"
COUNT = 3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE.parent / "build" / "results"),
                    help="directory for the console log")
    ap.add_argument("--timeout", type=float, default=150.0, help="bound for the whole case (s)")
    a = ap.parse_args()
    vm._install_signal_handlers()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    c = Checks("case")
    ip = vm.GUEST_IP
    guest_cmd = (f"rping -s -a {ip} -C {COUNT} -S 64 & SRV=$!; sleep 1; "
                 f"timeout 60 rping -c -a {ip} -C {COUNT} -S 64 -V -v; CRC=$?; "
                 "wait $SRV; SRC=$?; "  # bounded by the run's timeout
                 "echo \"client rc=$CRC server rc=$SRC\"; [ $CRC -eq 0 ] && [ $SRC -eq 0 ]")
    with vm.Guest(guest_cmd, siw="default", timeout=a.timeout,
                  console_log=out / f"{NAME}.console") as g:
        g.start()
        res = g.wait()
    c.check("guest booted (siw0 up)", res.boot_s is not None,
            f"{res.boot_s:.1f} s" if res.boot_s else (res.setup_failed or "no READY marker"))
    c.eq("guest command exit code (client and server rc 0)", res.rc, 0)
    pings = re.findall(r"ping data: rdma-ping-(\d+): ", res.console)
    c.eq("client printed every verified iteration", pings, [str(i) for i in range(COUNT)])
    c.check("no data mismatch", "data mismatch" not in res.console)
    dt = time.monotonic() - t0
    verdict = "PASS" if c.ok() else "FAIL"
    extra = "" if c.ok() else f" failed: {', '.join(c.failed)}"
    print(f"{verdict} {NAME} ({dt:.1f} s){extra}")
    return 0 if c.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
