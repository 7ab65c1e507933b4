#!/usr/bin/env python3
"""Case (issue 5 case 6): error paths between xwarp and siw.

One guest (siw default), two runs:
  A. invalid STag: guest `rping -s -S 64 -C 1`; host `xwarp-rping -c --bad-stag --report`
     (tools/src/bin/rping.rs on `xwarp::verbs`; until issue 12 `xwarp-rping-interop`, the
     sans-IO connection on the tool's own thread)
     connects and RDMA-Writes 64 bytes to an STag siw never registered (0xbad0005a). siw must
     send a Terminate and close (docs/siw.md §4.5/§4.6). Checks: the Terminate's bytes in
     the capture — QN 2, MSN 1, MO 0, control `11 00 03 00` = DDP layer / tagged-buffer
     EType / Invalid STag under siw's swapped layout, Hdrct M+D in the low bits, DDP
     Segment Length = our payload length (64), the terminated DDP header = our Write's
     (ctrl c1 40, STag 0xbad0005a); our QP reports the Terminate as a CM event (layer 1 /
     etype 1 / code 0: DDP, tagged buffer, Invalid STag — the same under siw's swapped
     layout, which the stack recognizes by the Hdrct bits), closes, and flushes the
     receive it had posted.
  B. peer dies mid-stream: guest `rping -s -S 4096 -C 0` killed with SIGKILL after a few
     seconds while our client (`xwarp-rping -c -C 0 -v -V --report`) runs. Checks: our client reports the disconnect
     (non-zero exit, "disconnected"), at least one iteration completed, every completed
     iteration was verified (-V semantics: a mismatch would be reported) and printed in
     sequence, no completion failed with anything but a flush.
Both: every frame after the Reply dissects as iWARP, nothing malformed; the Terminate run
allows the error-level expert item tshark attaches to a Terminate.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from common import (HERE, RPING_PORT, TSHARK_BASE, check_stream_clean,
                    run_host, tshark_streams, vm)
from common import build_tool, case_start, case_verdict

NAME = "xwarp_errors"
BAD_STAG = 0xBAD0005A
KILL_AFTER_S = 8


def terminate_fpdus(pcap: Path, stream: int) -> list[bytes]:
    """The raw FPDUs (from ULPDU_Length) of every Terminate (opcode 7) in the stream."""
    argv = TSHARK_BASE + ["-r", str(pcap), "-Y", f"tcp.stream=={stream} && iwarp_rdma.opcode==7",
                          "-T", "fields", "-e", "tcp.payload"]
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    out = []
    for line in p.stdout.split():
        data = bytes.fromhex(line.replace(":", ""))
        # untagged+last, RDMAP v1 Terminate, QN 2 (docs/ddp-rdmap.md §3.4)
        i = data.find(bytes.fromhex("4147"))
        while i >= 2:
            if data[i + 6:i + 10] == (2).to_bytes(4, "big"):
                ulpdu = int.from_bytes(data[i - 2:i], "big")
                out.append(data[i - 2:i + ulpdu + 4 + (-(ulpdu + 2)) % 4])
                break
            i = data.find(bytes.fromhex("4147"), i + 1)
    return out


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
    guest_cmd = (
        f"rping -s -a {vm.GUEST_IP} -p {RPING_PORT} -S 64 -C 1; echo \"XW-SERVER A rc=$?\"; "
        f"rping -s -a {vm.GUEST_IP} -p {RPING_PORT} -S 4096 -C 0 & P=$!; "
        f"sleep {KILL_AFTER_S}; kill -9 $P; wait $P; echo \"XW-SERVER B rc=$?\"; sleep 2")
    with vm.Guest(guest_cmd, siw="default", timeout=a.timeout, pcap=pcap,
                  console_log=out / f"{NAME}.console", xwarp=True) as g:
        g.start()
        # As in xwarp_p2p: siw up before our first SYN, a refused connect retried.
        g.wait_ready()
        deadline = time.monotonic() + a.timeout - 10
        base = ["env", "XWARP_CONNECT_RETRY_MS=20000", str(binary)] + g.engine_args() + ["-c", "-a", vm.GUEST_IP, "-p", str(RPING_PORT),
                                                  "--report"]
        ra = run_host(g, base + ["-S", "64", "--bad-stag"], deadline)
        print(f"  [host] A: rc={ra[0]} in {ra[3]:.1f} s\n{ra[1].strip()}\n{ra[2].strip()[-800:]}",
              flush=True)
        time.sleep(1)
        rb = run_host(g, base + ["-S", "4096", "-C", "0", "-v", "-V"], deadline)
        pings = re.findall(r"ping data: rdma-ping-(\d+): ", rb[1])
        stats = [ln for ln in rb[1].splitlines() if ln.startswith("XWARP-")]
        print(f"  [host] B: rc={rb[0]} in {rb[3]:.1f} s, {len(pings)} iterations printed\n"
              + "\n".join(stats) + f"\n{rb[2].strip()[-800:]}", flush=True)
        res = g.wait()
    c.check("guest booted", res.boot_s is not None, f"{res.boot_s or 0:.1f} s")
    c.check("guest finished in time", res.rc is not None and not res.timed_out, f"rc={res.rc}")
    servers = re.findall(r"XW-SERVER (A|B) rc=(\d+)", res.console)
    print(f"  [case] guest servers: {servers}", flush=True)
    streams = tshark_streams(pcap)
    mpa = sorted(s for s, st in streams.items() if st["req"] is not None)
    c.eq("tshark: two MPA connections", len(mpa), 2)
    if len(mpa) < 2:
        return case_verdict(c, NAME, t0, "connections")

    # ---- A: invalid STag
    rc, so, se, _ = ra
    c.eq("A: our client exit code", rc, 0)
    c.check("A: our QP reports siw's Terminate: DDP / tagged buffer / Invalid STag",
            "XWARP-TERMINATE layer=1 etype=1 code=0x00" in so)
    c.check("A: the receive we had posted is flushed", "status: WrFlushError" in so
            and "opcode: Recv" in so)
    c.check("A: the Write completed locally, nothing failed besides the flush",
            "success=1 flushed=1 failed=0" in so)
    terms = terminate_fpdus(pcap, mpa[0])
    c.eq("A tshark: siw sent one Terminate", len(terms), 1)
    if terms:
        t = terms[0]
        print(f"  [case] A: siw Terminate FPDU {t.hex(' ')}", flush=True)
        c.eq("A: Terminate untagged header (41 47, QN 2, MSN 1, MO 0)", t[2:20],
             bytes.fromhex("4147 00000000 00000002 00000001 00000000"))
        c.eq("A: Terminate control (swapped layer/etype, Hdrct M|D low bits)", t[20:24],
             bytes.fromhex("11000300"))
        c.eq("A: DDP Segment Length = the Write's payload length", t[24:26], (64).to_bytes(2, "big"))
        c.eq("A: terminated DDP header = our Write's (c1 40, STag)", t[26:32],
             bytes.fromhex("c140") + BAD_STAG.to_bytes(4, "big"))
        c.eq("A: CRC field zero (CRC off)", t[-4:], bytes(4))
    st = streams[mpa[0]]
    ours = [o for p, o in st["opcodes"].items() if p != RPING_PORT]
    c.eq("A tshark: our FPDUs (Write)", ours, [[0]])
    c.eq("A tshark: siw's FPDUs (Terminate)", st["opcodes"].get(RPING_PORT), [7])
    check_stream_clean(c, "A", st, allow_errors=True)

    # ---- B: peer killed mid-stream
    rc, so, se, _ = rb
    n = re.search(r"XWARP-STATS iterations=(\d+) success=(\d+) flushed=(\d+) failed=(\d+)", so)
    c.check("B: our client reports the disconnect", rc == 1 and "disconnected" in se, se.strip()[-200:])
    c.check("B: at least 3 iterations before the kill", len(pings) >= 3, f"{len(pings)}")
    c.check("B: completed iterations printed in order", pings == [str(i) for i in range(len(pings))],
            f"0..{len(pings) - 1}")
    c.check("B: no data mismatch", "mismatch" not in se)
    c.check("B: stats line", n is not None)
    if n:
        iters, succ, _, failed = (int(x) for x in n.groups())
        c.eq("B: iterations = iterations printed", iters, len(pings))
        c.check("B: every completion of a finished iteration succeeded (4 per iteration)",
                succ >= 4 * iters, f"success={succ}")
        c.eq("B: no completion failed except by flush", failed, 0)
    check_stream_clean(c, "B", streams[mpa[1]])
    return case_verdict(c, NAME, t0)


if __name__ == "__main__":
    sys.exit(main())
