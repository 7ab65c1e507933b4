#!/usr/bin/env python3
"""Case: Debian's unmodified perftest on xwarp (libxwarp_ibverbs.so preloaded) as SERVER,
perftest on siw as client.

Host (netns): `/usr/bin/ib_*` themselves under the launcher, `xwarp run --iface tap0 --addr
10.77.0.3/24 -- ib_X ...` (the socket shim and libxwarp_ibverbs.so preloaded; the product
path `xwarp::verbs`, device `xwarp_tap0`); guest: the same programs on siw0, `ib_X -R -d siw0 10.77.0.3`. All five
tests, ib_write_bw, ib_read_bw, ib_send_bw, ib_write_lat, ib_send_lat, each `-R` (rdma_cm
connection setup, needed on iWARP) `-s 4096 -n 100 -F`, first against siw-crc (its
Initiator asks for CRC; as client, ours does with `XWARP_MPA_CRC=1`), then against plain
siw (CRC off). The xwarp client role is
`xwarp_lib_perftest_client.py` (the same code, `run_role`).

What makes them pass toward siw (ibverbs/README.md, "perftest toward siw"): the library's
QPs send right after their MPA Reply when no RTR was negotiated, as siw's Responder does
(siw's Initiator asks for no P2P, and the latency servers post first; docs/siw.md
§4.8.14); `XWARP_DISCONNECT_DELAY_MS=500` (siw fails a Send whose completion our FIN
overtakes); for the client role `XWARP_CONNECT_RETRY_MS` (the guest's next server may not
listen yet) and `XWARP_FIRST_FPDU_DELAY_MS=100` (siw's Reply-before-upcall race).

Checks: every program on both sides exits 0 and prints its result row (size 4096, 100
iterations; a guest row of `inf` is accepted only when perftest said its cycle clock could
not be calibrated, "Correlation coefficient r^2 < 0.9": TCG/KVM timing, not RDMA); the
engine's own capture (`XWARP_PCAP`, merged by vm.Guest): two MPA connections per test,
tshark sees each one's Request/Reply, every later payload frame dissects as iWARP, nothing
malformed, no error-level expert item; each direction's reassembled byte stream walks as
whole FPDUs (`common.walk_fpdus`, the CRC field always counted; the engine's TCP may pack
FPDUs across segments, interop/README.md) — a last FPDU cut off is accepted only when the
other side reset the connection (siw's write_bw server closes its test connection when the
control exchange says done, while our last Writes are still in flight, then answers them
with RST); with CRC negotiated every FPDU's CRC32c is right.

Usage: xwarp_lib_perftest.py [--out DIR] [--siw crc|default|both] [--tests write_bw,...]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from common import (HERE, NO_RPCRDMA, Checks, check_stream_clean, run_host, stream_bytes,
                    tcp_resets, tshark_streams, vm, walk_fpdus)
from common import case_verdict, lib_case_start, print_host_run, xwarp_run_argv

NAME = "xwarp_lib_perftest"
PORT = 18515
SIZE = 4096
ITERS = 100
TESTS = ("write_bw", "read_bw", "send_bw", "write_lat", "send_lat")
#: Seconds the guest's client waits for our server to listen (engine start included).
GUEST_CLIENT_SLEEP = 3
#: Seconds our client waits before each test (a refused connect is retried anyway).
HOST_CLIENT_SLEEP = 1
#: XWARP_CONNECT_RETRY_MS of our client.
CONNECT_RETRY_MS = 30000


def host_cmd(run: list[str], role: str, delay_ms: int, siw: str = "default") -> list[str]:
    """`env XWARP_...=... xwarp run ... --` (`run`: `common.xwarp_run_argv`) with the
    settings toward siw (ibverbs/README.md, "Toward siw"); siw: the guest's variant."""
    client = role == "client"
    settings = {
        # siw fails a Send whose completion a FIN overtakes.
        "XWARP_DISCONNECT_DELAY_MS": 500,
        # siw's Reply-before-upcall race (docs/siw.md §4.3).
        "XWARP_FIRST_FPDU_DELAY_MS": delay_ms if client and delay_ms else None,
        # The guest's next server may not listen yet.
        "XWARP_CONNECT_RETRY_MS": CONNECT_RETRY_MS if client else None,
        # Our Initiator asks for CRC toward siw-crc (the Request's C bit; siw's Responder
        # echoes it), so CRCs are checked with xwarp as client too.
        "XWARP_MPA_CRC": 1 if client and siw == "crc" else None,
    }
    return ["env"] + [f"{k}={v}" for k, v in settings.items() if v is not None] + run


def perftest_args(t: str, dev: str) -> list[str]:
    return [f"ib_{t}", "-R", "-d", dev, "-p", str(PORT), "-s", str(SIZE), "-n", str(ITERS), "-F"]


def result_line(text: str, allow_uncalibrated: bool = False) -> bool:
    """perftest's result row: size, iterations, then numbers (or `inf` when perftest said
    it could not calibrate its cycle clock and `allow_uncalibrated`)."""
    if re.search(rf"^\s*{SIZE}\s+{ITERS}\s+[\d.]+", text, re.M):
        return True
    return (allow_uncalibrated and "Correlation coefficient r^2" in text
            and re.search(rf"^\s*{SIZE}\s+{ITERS}\s+inf\b", text, re.M) is not None)


def run_role(c: Checks, out: Path, run: list[str], role: str, tests: list[str], siw: str,
             timeout: float, delay_ms: int, name: str) -> None:
    """role: what xwarp (the host) is; siw: the guest's siw variant (crc or default); run:
    the `xwarp run ... --` prefix."""
    label = f"xwarp {role} siw-{siw}"
    if role == "server":
        guest = "; ".join(
            f"sleep {GUEST_CLIENT_SLEEP}; " + " ".join(perftest_args(t, "siw0"))
            + f" {vm.ENGINE_IP}; echo \"XW-GUEST {t} rc=$?\"" for t in tests)
    else:
        guest = "; ".join(" ".join(perftest_args(t, "siw0")) + f"; echo \"XW-GUEST {t} rc=$?\""
                          for t in tests)
    stem = f"{name}_{siw}"
    pcap = out / f"{stem}.pcap"
    results = {}
    with vm.Guest(guest, siw=siw, timeout=timeout, pcap=pcap,
                  console_log=out / f"{stem}.console", xwarp=True) as g:
        g.start()
        if not g.wait_ready():
            c.check(f"{label}: guest booted", False, "no READY marker")
            return
        deadline = time.monotonic() + timeout - 15
        for t in tests:
            argv = host_cmd(run, role, delay_ms, siw) + perftest_args(t, f"xwarp_{vm.TAP}")
            if role == "client":
                time.sleep(HOST_CLIENT_SLEEP)
                argv.append(vm.GUEST_IP)
            r = run_host(g, argv, min(deadline, time.monotonic() + 45))
            print_host_run(f"{label} {t}", r)
            results[t] = r
        res = g.wait()
    print(f"  [case] {label}: guest {res.total_s:.1f} s (boot {res.boot_s or 0:.1f} s)", flush=True)
    (out / f"{stem}.host.log").write_text(
        "".join(f"== {t} rc={r[0]}\n{r[1]}\n{r[2]}\n" for t, r in results.items()))
    runs = re.split(r"XW-GUEST \w+ rc=\d+", res.console)
    for i, t in enumerate(tests):
        rc, so, se, _ = results.get(t, (None, "", "", 0))
        c.eq(f"{label} {t}: host (xwarp) exit code", rc, 0)
        c.check(f"{label} {t}: host result line ({SIZE} B, {ITERS} iterations)", result_line(so),
                (so + se)[-300:].replace("\n", " | "))
        c.check(f"{label} {t}: guest (siw) exit 0", f"XW-GUEST {t} rc=0" in res.console)
        gtext = runs[i] if len(runs) > i else ""
        c.check(f"{label} {t}: guest result line", result_line(gtext, allow_uncalibrated=True))
        if "Correlation coefficient r^2" in gtext:
            print(f"  [case] {label} {t}: guest perftest could not calibrate its clock "
                  "(numbers not meaningful)", flush=True)
    check_capture(c, label, pcap, len(tests), crc_required=siw == "crc")


def check_capture(c: Checks, label: str, pcap: Path, n_tests: int, crc_required: bool,
                  per_test: int = 2) -> None:
    """The engine capture of one guest run: `per_test` MPA connections per test (perftest
    has two, rping one), each clean in tshark, each direction whole FPDUs, CRCs right when
    negotiated (module docstring)."""
    if not pcap.exists():
        c.check(f"{label}: capture merged", False, str(pcap))
        return
    streams = tshark_streams(pcap, extra=NO_RPCRDMA)
    mpa = sorted(s for s, st in streams.items() if st["req"] is not None)
    c.eq(f"{label} tshark: {per_test} MPA connection(s) per test", len(mpa), per_test * n_tests)
    if len(streams) > len(mpa):
        print(f"  [case] {label}: {len(streams) - len(mpa)} TCP connection(s) without MPA "
              "(connects refused before the guest listened, retried)", flush=True)
    for sid in mpa:
        st = streams[sid]
        check_stream_clean(c, f"{label} conn {sid}", st)
        # CRC as the Reply negotiated it (siw-crc's Initiator asks C=1 and our Responder
        # echoes it; our Initiator asks what XWARP_MPA_CRC says, C=0 by default, and siw's
        # Responder echoes that, docs/siw.md §4.3).
        neg = bool(st["rep"] and st["rep"]["c"])
        if crc_required:
            c.check(f"{label} conn {sid}: CRC negotiated (C=1 in the Reply)", neg)
        resets = None
        for port, (data, hole) in sorted(stream_bytes(pcap, sid).items()):
            w = walk_fpdus(data, neg)
            whole = not hole and w["rest"] == 0
            if not hole and w["rest"] and w["cut"]:
                resets = tcp_resets(pcap, sid) if resets is None else resets
                if resets - {port}:
                    print(f"  [case] {label} conn {sid} port {port}: last FPDU cut off "
                          f"({w['rest']} of {w['cut']} bytes) by the peer's RST", flush=True)
                    whole = True
            c.check(f"{label} conn {sid} port {port}: byte stream complete, whole FPDUs "
                    f"(C={int(neg)})", whole,
                    f"{w['fpdus']} FPDUs, hole={hole}, {w['rest']} bytes left")
            if neg:
                c.eq(f"{label} conn {sid} port {port}: every FPDU's CRC32c right "
                     f"({w['fpdus']} FPDUs)", w["bad_crc"], 0)


def main(name: str = NAME, role: str = "server", default_timeout: float = 75.0) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE.parent / "build" / "results"))
    ap.add_argument("--timeout", type=float, default=default_timeout,
                    help="bound per guest run (s)")
    ap.add_argument("--siw", default="both", choices=["crc", "default", "both"])
    ap.add_argument("--tests", default=",".join(TESTS))
    ap.add_argument("--first-fpdu-delay-ms", type=int, default=100,
                    help="XWARP_FIRST_FPDU_DELAY_MS for the xwarp client (0: unset)")
    a = ap.parse_args()
    out, t0, c, lib = lib_case_start(a, name, ["/usr/bin/ib_write_bw"])
    if lib is None:
        return case_verdict(c, name, t0)
    try:
        run = xwarp_run_argv(lib)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        c.check("build xwarp run (xwarp, libxwarp_preload.so)", False, str(e))
        return case_verdict(c, name, t0)
    print(f"  [case] host programs run as: {' '.join(run)} ib_X ...", flush=True)
    tests = [t for t in a.tests.split(",") if t]
    for siw in (("crc", "default") if a.siw == "both" else (a.siw,)):
        run_role(c, out, run, role, tests, siw, a.timeout, a.first_fpdu_delay_ms, name)
    return case_verdict(c, name, t0)


if __name__ == "__main__":
    sys.exit(main())
