#!/usr/bin/env python3
"""Case: rdma-core `rping -c` on siw -> xwarp's rping SERVER (tools/src/bin/rping.rs,
`xwarp-rping`, on `xwarp::verbs`: a verbs engine bound to tap0 with AF_XDP owning 10.77.0.3,
placement on the engine thread).

Host (netns): `rping -s -a 10.77.0.3 -S <size>` (vm.XWARP_IP) built from tools/src/bin/rping.rs (`xwarp-rping`), one run per
size (64, 4096, 65535; rping's -S maximum is 65535), each serving one connection.
Guest: `rping -c -a 10.77.0.3 -S <size> -C <count> -V` (+ `-v` for 64 bytes), once with
the default siw (CRC off) and once with siw-crc.ko, whose Request carries C=1 so our
Responder answers C=1 (RFC 5044; docs/mpa.md §1.3).
Our server Reads the client's buffer, Sends, Writes it back and Sends (docs/protocols.md §5.2);
siw's rping -V checks the data after every iteration.
Checks: every guest client exits 0 (and prints all 64-byte iterations), every server run
exits 0 when the client disconnects, and tshark on the capture as in xwarp_rping_client.

Usage: xwarp_rping_server.py [--out DIR] [--count N]     (the --peer role is internal)
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from common import HERE, RPING_PORT, Checks, vm
from common import case_start, case_verdict
from xwarp_rping_client import SIZES, build_rping, capture_checks

NAME = "xwarp_rping_server"
COUNT = 100


def peer(binary: str, engine: list[str], deadline_s: float) -> int:
    """Host side: our server, once per size (it exits when the client disconnects)."""
    c = Checks("host")
    deadline = time.monotonic() + deadline_s
    for size in SIZES:
        argv = [binary] + engine + ["-s", "-a", vm.XWARP_IP, "-p", str(RPING_PORT), "-S", str(size)]
        t0 = time.monotonic()
        try:
            p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=max(deadline - time.monotonic(), 1))
            rc, err = p.returncode, p.stderr.strip()
        except subprocess.TimeoutExpired:
            rc, err = None, "timed out"
        print(f"  [host] S={size}: server rc={rc} after {time.monotonic() - t0:.1f} s; "
              f"stderr: {err[-500:] or '-'}", flush=True)
        c.eq(f"S={size}: our rping server exit code", rc, 0)
    return 0 if c.ok() else 1


def run_variant(c: Checks, out: Path, binary: Path, siw: str, count: int, timeout: float) -> None:
    crc = siw == "crc"
    label = f"siw-{siw}"
    pcap = out / f"{NAME}_{siw}.pcap"
    # The sleep lets our next server bind after the previous one exited.
    guest_cmd = "; ".join(
        f"sleep 2; rping -c -a {vm.XWARP_IP} -p {RPING_PORT} -S {s} -C {count} -V"
        f"{' -v' if s == 64 else ''}; echo \"XW-CLIENT S={s} rc=$?\"" for s in SIZES)
    t0 = time.monotonic()
    with vm.Guest(guest_cmd, siw=siw, timeout=timeout, pcap=pcap,
                  console_log=out / f"{NAME}_{siw}.console", xwarp=True) as g:
        p = g.netns_popen([sys.executable, str(Path(__file__).resolve()), "--peer",
                           "--bin", str(binary), "--engine", shlex.join(g.engine_args()),
                           "--deadline", str(timeout - 10)])
        g.start()
        res = g.wait()
        try:
            peer_rc = p.wait(30)
        except subprocess.TimeoutExpired:
            peer_rc = None
    print(f"  [case] {label}: guest {res.total_s:.1f} s (boot {res.boot_s or 0:.1f} s), "
          f"variant run {time.monotonic() - t0:.1f} s", flush=True)
    c.check(f"{label}: guest booted", res.boot_s is not None,
            f"{res.boot_s:.1f} s" if res.boot_s else (res.setup_failed or "no READY marker"))
    c.check(f"{label}: guest finished in time", res.rc is not None and not res.timed_out,
            f"rc={res.rc}")
    c.eq(f"{label}: guest rping clients exit codes (-V verified)",
         re.findall(r"XW-CLIENT S=(\d+) rc=(\d+)", res.console),
         [(str(s), "0") for s in SIZES])
    pings = re.findall(r"ping data: rdma-ping-(\d+): ", res.console)
    c.eq(f"{label}: S=64 client printed every iteration", pings,
         [str(i) for i in range(count)])
    c.check(f"{label}: no data mismatch", "data mismatch" not in res.console)
    c.eq(f"{label}: host server checks", peer_rc, 0)
    capture_checks(c, pcap, label, crc, runs=len(SIZES))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bin", help=argparse.SUPPRESS)
    ap.add_argument("--engine", default="", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=100.0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=COUNT, help="rping -C per size")
    ap.add_argument("--out", default=str(HERE.parent / "build" / "results"),
                    help="directory for the pcaps and the console logs")
    ap.add_argument("--timeout", type=float, default=80.0, help="bound per guest run (s)")
    a = ap.parse_args()
    if a.peer:
        return peer(a.bin, shlex.split(a.engine), a.deadline)

    out, t0, c = case_start(a)
    try:
        binary = build_rping()
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        c.check("build xwarp-rping", False, str(e))
        return case_verdict(c, NAME, t0, "build")
    for siw in ("default", "crc"):
        run_variant(c, out, binary, siw, a.count, a.timeout)
    return case_verdict(c, NAME, t0)


if __name__ == "__main__":
    sys.exit(main())
