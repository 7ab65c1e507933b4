#!/usr/bin/env python3
"""Case: Debian's unmodified rping on xwarp <-> rping on siw, in both directions, against
plain siw and siw-crc.

Host (netns): `/usr/bin/rping` itself under the launcher,
`xwarp run --iface tap0 --addr 10.77.0.3/24 -- rping ...` (`common.xwarp_run_argv`: the
socket shim and libxwarp_ibverbs.so preloaded, the product path `xwarp::verbs`, placement
on the engine thread). One guest boot per direction and siw variant (four in all):
* xwarp server: host `rping -s -a 10.77.0.3 -v -V`, guest `rping -c -a 10.77.0.3 -v -V`;
* xwarp client: guest `rping -s -a 10.77.0.2 -v -V`, host `rping -c -a 10.77.0.2 -v -V`;
each with -S 64, 4096 and 65535, -C 10; the guest's siw is `default` then `crc`.
rdma_server / rdma_client under the launcher, both ways, are `xwarp_rdma_cm.py`.
The host sets XWARP_FIRST_FPDU_DELAY_MS=100 (siw's Reply-before-upcall race: without it the
xwarp client's first FPDU stayed unread by siw in 4 of 4 runs) and XWARP_CONNECT_RETRY_MS
(the guest's next server may not listen yet: a refused connect is retried inside
rdma_connect).

Checks: every rping on both sides exits 0; every `ping data:` line on both sides (10 per
run) equals rping's pattern (docs/protocols.md §5.2) and no "data mismatch" (-V). The
engine's own capture (`XWARP_PCAP`, merged by
vm.Guest) must hold one MPA connection per rping run, each clean in tshark (Request and
Reply, every frame after the Reply dissected as iWARP, nothing malformed, no error-level
expert item), each direction's reassembled byte stream whole FPDUs
(`xwarp_lib_perftest.check_capture`); with siw-crc every connection negotiates C=1, every
FPDU's CRC32c is right and every CRC tshark checked is "Good CRC32": as server siw's
Initiator asks C=1 and our Responder echoes it; as client ours asks C=1
(`XWARP_MPA_CRC=1`) and siw's Responder echoes it. Toward plain siw our client asks C=0.

Usage: xwarp_lib_rping.py [--out DIR] [--siw crc|default|both] [--roles server,client]
(the --peer role is internal)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from common import HERE, RPING_PORT, Checks, crc_verdicts, vm
from common import case_verdict, lib_case_start, xwarp_run_argv
from xwarp_lib_perftest import check_capture

NAME = "xwarp_lib_rping"
SIZES = (64, 4096, 65535)
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


def kernel_lines_out(console: str) -> str:
    """The guest's console text without the kernel's messages (`[ seconds.micro] ...` up
    to and with their newline), each line stripped."""
    text = re.sub(r"\[\s*\d+\.\d+\] [^\n]*(\n|$)", "", console.replace("\r", ""))
    return "\n".join(l.strip() for l in text.splitlines())


def check_pings(c: Checks, label: str, text: str, prefix: str, size: int) -> None:
    got = [l[len(prefix):] for l in text.splitlines() if l.startswith(prefix)]
    c.eq(f"{label}: {prefix!r} lines", len(got), COUNT)
    bad = [i for i, g in enumerate(got) if g != rping_data(i, size)]
    c.eq(f"{label}: ping data equals rping's pattern", bad, [])


def host_settings(crc: bool) -> list[str]:
    # XWARP_FIRST_FPDU_DELAY_MS: the siw Reply-before-upcall race (docs/siw.md §4.3): our
    # client's first FPDU must not arrive right behind siw's MPA Reply.
    # XWARP_CONNECT_RETRY_MS: the guest's server may not listen yet when our client starts.
    # XWARP_MPA_CRC=1 (crc): our Initiator asks for CRC (toward siw-crc).
    return (["env", "XWARP_FIRST_FPDU_DELAY_MS=100", "XWARP_CONNECT_RETRY_MS=20000"]
            + (["XWARP_MPA_CRC=1"] if crc else []))


def run_bounded(argv: list[str], deadline: float) -> tuple[int | None, str, str]:
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=max(deadline - time.monotonic(), 1))
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        def txt(b):
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        return None, txt(e.stdout), txt(e.stderr)


def peer(run: list[str], role: str, deadline_s: float, crc: bool) -> int:
    """Host side (inside the namespace): our rping once per size; each run's stdout is
    printed between markers, stderr after them; crc: XWARP_MPA_CRC=1."""
    ok = True
    deadline = time.monotonic() + deadline_s
    prefix = host_settings(crc) + run + ["stdbuf", "-oL"]
    for size in SIZES:
        if role == "server":
            args = ["-s", "-a", vm.ENGINE_IP]
        else:
            # The guest's server of this size starts after the previous one ended; a
            # refused connect is retried (XWARP_CONNECT_RETRY_MS).
            time.sleep(1)
            args = ["-c", "-a", vm.GUEST_IP]
        argv = prefix + ["rping"] + args + ["-p", str(RPING_PORT), "-S", str(size),
                                            "-C", str(COUNT), "-v", "-V"]
        # stdout alone between the markers: rping's cm thread prints its events on stderr,
        # which would split a ping line.
        t0 = time.monotonic()
        rc, out, err = run_bounded(argv, deadline)
        print(f"XW-HOST-BEGIN S={size}\n{out}XW-HOST-END S={size} rc={rc}", flush=True)
        print(f"XW-HOST-TIME S={size} {time.monotonic() - t0:.1f} s", flush=True)
        print(f"XW-HOST-STDERR S={size}\n{err}", flush=True)
        ok = ok and rc == 0
    return 0 if ok else 1


def guest_cmd(role: str) -> str:
    """The guest's programs; role: what xwarp (the host) is."""
    if role == "server":
        # Our server of the next size starts when the previous one ended (engine start
        # included).
        steps = [f"sleep 3; rping -c -a {vm.ENGINE_IP} -p {RPING_PORT} -S {s} -C {COUNT} -v -V; "
                 f"echo \"XW-GUEST S={s} rc=$?\"" for s in SIZES]
    else:
        steps = [f"rping -s -a {vm.GUEST_IP} -p {RPING_PORT} -S {s} -C {COUNT} -v -V; "
                 f"echo \"XW-GUEST S={s} rc=$?\"" for s in SIZES]
    return "; ".join(steps)


def run_direction(c: Checks, out: Path, run: list[str], role: str, siw: str,
                  timeout: float) -> None:
    """One guest boot: rping per size; role: what xwarp (the host) is; siw: the guest's
    variant."""
    label = f"xwarp {role} siw-{siw}"
    stem = f"{NAME}_{role}_{siw}"
    pcap = out / f"{stem}.pcap"
    with vm.Guest(guest_cmd(role), siw=siw, timeout=timeout, pcap=pcap,
                  console_log=out / f"{stem}.console", xwarp=True) as g:
        g.start()
        if not g.wait_ready():
            c.check(f"{label}: guest booted", False, "no READY marker")
            return
        p = g.netns_popen([sys.executable, str(Path(__file__).resolve()), "--peer", role,
                           "--run", json.dumps(run), "--deadline", str(timeout - 15)]
                          + (["--crc"] if role == "client" and siw == "crc" else []),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        res = g.wait()
        try:
            host_out, _ = p.communicate(timeout=30)
            peer_rc = p.returncode
        except subprocess.TimeoutExpired:
            p.kill()
            host_out, peer_rc = "", None
    host_out = host_out or ""
    print(f"  [case] {label}: guest {res.total_s:.1f} s (boot {res.boot_s or 0:.1f} s)", flush=True)
    (out / f"{stem}.host.log").write_text(host_out)
    print(f"  [case] {label}: host rping times {re.findall(r'XW-HOST-TIME (S=.*)', host_out)}",
          flush=True)
    want = [(str(s), "0") for s in SIZES]
    c.eq(f"{label}: guest rping exit codes", re.findall(r"XW-GUEST S=(\d+) rc=(\d+)", res.console),
         want)
    c.eq(f"{label}: host rping (xwarp) exit codes",
         re.findall(r"XW-HOST-END S=(\d+) rc=(\S+)", host_out), want)
    c.eq(f"{label}: host peer", peer_rc, 0)
    c.check(f"{label}: no data mismatch", "data mismatch" not in res.console + host_out)
    runs = re.split(r"XW-GUEST S=\d+ rc=\d+", res.console)
    for i, size in enumerate(SIZES):
        m = re.search(rf"XW-HOST-BEGIN S={size}\n(.*?)XW-HOST-END S={size}", host_out, re.S)
        host = m.group(1) if m else ""
        # The guest console interleaves kernel lines, even inside a 64 KB ping line (seen:
        # "[   11.823646] hrtimer: interrupt took 8256080 ns" in the middle of one, the line
        # going on after it): drop each kernel message with its newline.
        gtext = kernel_lines_out(runs[i] if len(runs) > i else "")
        if role == "server":
            check_pings(c, f"{label} S={size} (xwarp)", host, "server ping data: ", size)
            check_pings(c, f"{label} S={size} (siw)", gtext, "ping data: ", size)
        else:
            check_pings(c, f"{label} S={size} (xwarp)", host, "ping data: ", size)
            check_pings(c, f"{label} S={size} (siw)", gtext, "server ping data: ", size)
    crc = siw == "crc"
    check_capture(c, label, pcap, len(SIZES), crc_required=crc, per_test=1)
    if crc and pcap.exists():
        # tshark's own verdicts too, per connection and side.
        for sid, ports in sorted(crc_verdicts(pcap).items()):
            for port, goods in sorted(ports.items()):
                c.check(f"{label} conn {sid} port {port}: tshark Good CRC32 on every checked "
                        "FPDU", bool(goods) and all(goods),
                        f"{goods.count(True)} good, {goods.count(False)} bad")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", choices=("server", "client"), help=argparse.SUPPRESS)
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=60.0, help=argparse.SUPPRESS)
    ap.add_argument("--crc", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(HERE.parent / "build" / "results"),
                    help="directory for the captures and console logs")
    ap.add_argument("--timeout", type=float, default=60.0, help="bound per guest run (s)")
    ap.add_argument("--siw", default="both", choices=["crc", "default", "both"])
    ap.add_argument("--roles", default="server,client")
    a = ap.parse_args()
    if a.peer:
        return peer(json.loads(a.run), a.peer, a.deadline, a.crc)
    out, t0, c, lib = lib_case_start(a, NAME, ["/usr/bin/rping"])
    if lib is None:
        return case_verdict(c, NAME, t0)
    try:
        run = xwarp_run_argv(lib)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        c.check("build xwarp run (xwarp, libxwarp_preload.so)", False, str(e))
        return case_verdict(c, NAME, t0)
    print(f"  [case] host programs run as: {' '.join(run)} rping ...", flush=True)
    for siw in (("default", "crc") if a.siw == "both" else (a.siw,)):
        for role in [r for r in a.roles.split(",") if r]:
            run_direction(c, out, run, role, siw, a.timeout)
    return case_verdict(c, NAME, t0)


if __name__ == "__main__":
    sys.exit(main())
