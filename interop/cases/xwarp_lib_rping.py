#!/usr/bin/env python3
"""Case: Debian's unmodified rping on xwarp (libxwarp_ibverbs.so preloaded) <-> rping on siw.

Host (netns): /usr/bin/rping itself, with `LD_PRELOAD=libxwarp_ibverbs.so XWARP_IFACE=tap0
XWARP_ADDR=10.77.0.3/24`: its libibverbs/librdmacm calls run on an xwarp engine bound to
tap0 with AF_XDP (ibverbs/README.md, "librdmacm"), the product path `xwarp::verbs`.
Two directions, each with -S 64 and 4096, -C 10, default siw (CRC off):
* xwarp server: host `rping -s -a 10.77.0.3 -v -V`, guest `rping -c -a 10.77.0.3 -v -V`;
* xwarp client: guest `rping -s -a 10.77.0.2 -v -V`, host `rping -c -a 10.77.0.2 -v -V`.
The host sets XWARP_FIRST_FPDU_DELAY_MS=100 (siw's Reply-before-upcall race: without it the
xwarp client's first FPDU stayed unread by siw in 4 of 4 runs).
Then rdmacm-utils' synchronous examples both ways: host `rdma_server -s 10.77.0.3` (xwarp),
guest `rdma_client -s 10.77.0.3`; then guest `rdma_server -s 10.77.0.2`, host `rdma_client -s
10.77.0.2` (xwarp): both print `end 0` and exit 0. The host's client connects with
XWARP_CONNECT_RETRY_MS (a refused connect, the guest not listening yet, is retried).
Checks: every rping on both sides exits 0, every `ping data:` line on both sides (10 per
run) equals rping's pattern (docs/protocols.md §5.2), no "data mismatch" (-V).
No tshark checks here yet (the library's engine does write XWARP_PCAP captures, which
xwarp_lib_perftest.py checks; tcpdump on tap0 does not see AF_XDP traffic).

Usage: xwarp_lib_rping.py [--out DIR]     (the --peer role is internal)
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from common import HERE, RPING_PORT, Checks, vm
from common import case_verdict, lib_case_start, lib_env

NAME = "xwarp_lib_rping"
SIZES = (64, 4096)
COUNT = 10


def rping_data(i: int, size: int) -> str:
    """rping's ping data of iteration i: `rdma-ping-<i>: ` then letters from 65 + i % 58,
    wrapping from 122 to 65, size - 1 bytes in all."""
    s = f"rdma-ping-{i}: "
    c = 65 + i % 58
    out = [s]
    n = len(s)
    while n < size - 1:
        out.append(chr(c))
        n += 1
        c = 65 if c >= 122 else c + 1
    return "".join(out)


def check_pings(c: Checks, label: str, text: str, prefix: str, size: int) -> None:
    got = [l[len(prefix):] for l in text.splitlines() if l.startswith(prefix)]
    c.eq(f"{label}: {prefix!r} lines", len(got), COUNT)
    bad = [i for i, g in enumerate(got) if g != rping_data(i, size)]
    c.eq(f"{label}: ping data equals rping's pattern", bad, [])


def host_env(lib: Path) -> list[str]:
    # XWARP_FIRST_FPDU_DELAY_MS: the siw Reply-before-upcall race (docs/siw.md §4.3): our
    # client's RTR must not arrive right behind siw's MPA Reply. XWARP_CONNECT_RETRY_MS:
    # the guest's server may not listen yet when our client starts.
    return lib_env(lib, first_fpdu_delay_ms=100, connect_retry_ms=20000)


def peer(lib: str, role: str, deadline_s: float) -> int:
    """Host side: our rping once per size; prints its output between markers."""
    ok = True
    deadline = time.monotonic() + deadline_s
    for size in SIZES:
        if role == "server":
            args = ["-s", "-a", vm.ENGINE_IP]
        else:
            # The guest's server of this size starts after the previous one; a refused
            # connect is retried (XWARP_CONNECT_RETRY_MS).
            time.sleep(1)
            args = ["-c", "-a", vm.GUEST_IP]
        argv = host_env(Path(lib)) + ["stdbuf", "-oL", "rping"] + args + [
            "-p", str(RPING_PORT), "-S", str(size), "-C", str(COUNT), "-v", "-V"]
        # stdout alone between the markers: rping's cm thread prints its events on stderr,
        # which would split a ping line.
        try:
            p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=max(deadline - time.monotonic(), 1))
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            def txt(b):
                return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
            rc, out, err = None, txt(e.stdout), txt(e.stderr)
        print(f"XW-HOST-BEGIN S={size}\n{out}XW-HOST-END S={size} rc={rc}", flush=True)
        print(f"XW-HOST-STDERR S={size}\n{err}", flush=True)
        ok = ok and rc == 0
    return 0 if ok else 1


def run_direction(c: Checks, out: Path, lib: Path, role: str, timeout: float) -> None:
    """role: what xwarp (the host) is."""
    label = f"xwarp {role}"
    if role == "server":
        guest = "; ".join(
            f"sleep 3; rping -c -a {vm.ENGINE_IP} -p {RPING_PORT} -S {s} -C {COUNT} -v -V; "
            f"echo \"XW-GUEST S={s} rc=$?\"" for s in SIZES)
    else:
        guest = "; ".join(
            f"rping -s -a {vm.GUEST_IP} -p {RPING_PORT} -S {s} -C {COUNT} -v -V; "
            f"echo \"XW-GUEST S={s} rc=$?\"" for s in SIZES)
    with vm.Guest(guest, siw="default", timeout=timeout,
                  console_log=out / f"{NAME}_{role}.console", xwarp=True) as g:
        g.start()
        if not g.wait_ready():
            c.check(f"{label}: guest booted", False, "no READY marker")
            return
        p = g.netns_popen([sys.executable, str(Path(__file__).resolve()), "--peer", role,
                           "--lib", str(lib), "--deadline", str(timeout - 20)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        res = g.wait()
        try:
            host_out, _ = p.communicate(timeout=30)
            peer_rc = p.returncode
        except subprocess.TimeoutExpired:
            p.kill()
            host_out, peer_rc = "", None
    print(f"  [case] {label}: guest {res.total_s:.1f} s (boot {res.boot_s or 0:.1f} s)", flush=True)
    (out / f"{NAME}_{role}.host.log").write_text(host_out or "")
    c.eq(f"{label}: guest rping exit codes", re.findall(r"XW-GUEST S=(\d+) rc=(\d+)", res.console),
         [(str(s), "0") for s in SIZES])
    c.eq(f"{label}: host rping (xwarp) exit codes",
         re.findall(r"XW-HOST-END S=(\d+) rc=(\S+)", host_out or ""),
         [(str(s), "0") for s in SIZES])
    c.eq(f"{label}: host peer", peer_rc, 0)
    c.check(f"{label}: no data mismatch", "data mismatch" not in res.console + (host_out or ""))
    for size in SIZES:
        m = re.search(rf"XW-HOST-BEGIN S={size}\n(.*?)XW-HOST-END S={size}", host_out or "", re.S)
        host = m.group(1) if m else ""
        # The guest console interleaves kernel lines; each rping run's lines are in order.
        runs = re.split(r"XW-GUEST S=\d+ rc=\d+", res.console)
        gtext = runs[SIZES.index(size)] if len(runs) > SIZES.index(size) else ""
        gtext = "\n".join(l.strip() for l in gtext.splitlines())
        if role == "server":
            check_pings(c, f"{label} S={size} (xwarp)", host, "server ping data: ", size)
            check_pings(c, f"{label} S={size} (siw)", gtext, "ping data: ", size)
        else:
            check_pings(c, f"{label} S={size} (xwarp)", host, "ping data: ", size)
            check_pings(c, f"{label} S={size} (siw)", gtext, "server ping data: ", size)


def run_rdma_cm(c: Checks, out: Path, lib: Path, role: str, timeout: float) -> None:
    """rdmacm-utils' synchronous examples; role: what xwarp (the host) runs.
    server: rdma_server on xwarp <- rdma_client on siw; client: rdma_client on xwarp ->
    rdma_server on siw."""
    label = f"xwarp rdma_{role}"
    other = "client" if role == "server" else "server"
    if role == "server":
        guest = f"sleep 3; rdma_client -s {vm.ENGINE_IP} -p 7471; echo \"XW-GUEST rc=$?\""
        host = ["rdma_server", "-s", vm.ENGINE_IP, "-p", "7471"]
    else:
        guest = f"rdma_server -s {vm.GUEST_IP} -p 7471; echo \"XW-GUEST rc=$?\""
        host = ["rdma_client", "-s", vm.GUEST_IP, "-p", "7471"]
    with vm.Guest(guest, siw="default", timeout=timeout,
                  console_log=out / f"{NAME}_rdma_{role}.console", xwarp=True) as g:
        g.start()
        if not g.wait_ready():
            c.check(f"{label}: guest booted", False, "no READY marker")
            return
        argv = host_env(lib) + ["timeout", str(int(timeout - 20)), "stdbuf", "-oL"] + host
        p = subprocess.run(g.netns_argv(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
        res = g.wait()
    print(f"  [case] {label}: guest {res.total_s:.1f} s (boot {res.boot_s or 0:.1f} s)", flush=True)
    (out / f"{NAME}_rdma_{role}.host.log").write_text(p.stdout + p.stderr)
    c.eq(f"{label}: host rdma_{role} (xwarp) exit code", p.returncode, 0)
    c.check(f"{label}: host rdma_{role} printed end 0", f"rdma_{role}: end 0" in p.stdout,
            (p.stdout + p.stderr)[-200:])
    c.eq(f"{label}: guest rdma_{other} exit code", re.findall(r"XW-GUEST rc=(\d+)", res.console),
         ["0"])
    c.check(f"{label}: guest rdma_{other} printed end 0", f"rdma_{other}: end 0" in res.console)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", choices=("server", "client"), help=argparse.SUPPRESS)
    ap.add_argument("--lib", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=60.0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(HERE.parent / "build" / "results"),
                    help="directory for the console logs")
    ap.add_argument("--timeout", type=float, default=90.0, help="bound per guest run (s)")
    a = ap.parse_args()
    if a.peer:
        return peer(a.lib, a.peer, a.deadline)
    out, t0, c, lib = lib_case_start(a, NAME, ["/usr/bin/rping", "/usr/bin/rdma_server",
                                                "/usr/bin/rdma_client"])
    if lib is None:
        return case_verdict(c, NAME, t0)
    for role in ("server", "client"):
        run_direction(c, out, lib, role, a.timeout)
    for role in ("server", "client"):
        run_rdma_cm(c, out, lib, role, a.timeout)
    return case_verdict(c, NAME, t0)


if __name__ == "__main__":
    sys.exit(main())
