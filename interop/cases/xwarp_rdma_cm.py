#!/usr/bin/env python3
"""Case (issue 5 case 4): librdmacm's `rdma_server` / `rdma_client` examples (rdmacm-utils,
librdmacm/examples/rdma_{server,client}.c) against `xwarp-rdma-cm-echo`
(tools/src/bin/rdma_cm_echo.rs), both directions.

The exchange (port 7471): the client posts a 16-byte receive, connects, Sends 16 bytes and
waits for the server's 16-byte Send; the server posts its receive, accepts, waits for the
client's Send and answers. rdma-core's programs send their never-written static buffers
(16 zero bytes, inline when the device allows 16 inline bytes); ours send
"xwarp-server-msg" / "xwarp-client-msg".

One guest (siw default): `rdma_client -s 10.77.0.3` (the engine; 10.77.0.1 with XWARP_INTEROP_NET=kernel) (against our server, started before the
guest boots), then `rdma_server` (our client connects, retrying until it listens).
Checks: both rdma-core programs print `end 0` and exit 0; our programs exit 0 and received
exactly 16 zero bytes; tshark: per connection exactly one Send each way (opcode 3, MSN 1,
16-byte payload) with the expected payload bytes — the zero bytes from siw and our message
from us — every frame after the Reply dissects as iWARP, nothing malformed, no error-level
expert item.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from common import (HERE, TSHARK_BASE, check_stream_clean, run_host,
                    tshark_streams, vm)
from common import build_tool, case_start, case_verdict

NAME = "xwarp_rdma_cm"
PORT = 7471
SERVER_MSG = b"xwarp-server-msg"
CLIENT_MSG = b"xwarp-client-msg"


def sends(pcap: Path, stream: int) -> list[tuple[int, int, bytes]]:
    """(srcport, MSN, payload) of every Send in the stream (tshark shows the DDP payload as
    `data`)."""
    argv = TSHARK_BASE + ["-r", str(pcap), "-Y", f"tcp.stream=={stream} && iwarp_rdma.opcode==3",
                          "-T", "fields", "-E", "separator=|", "-E", "occurrence=a",
                          "-e", "tcp.srcport", "-e", "iwarp_ddp.msn", "-e", "data.data"]
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    out = []
    for line in p.stdout.splitlines():
        port, msns, datas = (line.split("|") + ["", "", ""])[:3]
        msn_list = [int(x, 0) for x in msns.split(",") if x]
        data_list = [bytes.fromhex(x.replace(":", "")) for x in datas.split(",")] if datas else []
        for i, msn in enumerate(msn_list):
            out.append((int(port), msn, data_list[i] if i < len(data_list) else b""))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE.parent / "build" / "results"))
    ap.add_argument("--timeout", type=float, default=80.0)
    a = ap.parse_args()
    out, t0, c = case_start(a)
    binary = build_tool(c, "xwarp-rdma-cm-echo")
    if binary is None:
        return case_verdict(c, NAME, t0, "build")
    pcap = out / f"{NAME}.pcap"
    guest_cmd = (f"rdma_client -s {vm.XWARP_IP} -p {PORT}; echo \"XW-CLIENT rc=$?\"; "
                 f"rdma_server -p {PORT}; echo \"XW-SERVER rc=$?\"")
    with vm.Guest(guest_cmd, siw="default", timeout=a.timeout, pcap=pcap,
                  console_log=out / f"{NAME}.console", xwarp=True) as g:
        srv = g.netns_popen([str(binary)] + g.engine_args()
                            + ["-s", "-a", vm.XWARP_IP, "-p", str(PORT)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        g.start()
        deadline = time.monotonic() + a.timeout - 10
        try:
            s_out, s_err = srv.communicate(timeout=max(deadline - time.monotonic(), 1))
            s_rc = srv.returncode
        except subprocess.TimeoutExpired:
            srv.kill()
            s_out, s_err = srv.communicate()
            s_rc = None
        print(f"  [host] our server: rc={s_rc}\n{s_out.strip()}\n{s_err.strip()[-800:]}", flush=True)
        cl = run_host(g, [str(binary)] + g.engine_args()
                      + ["-c", "-a", vm.GUEST_IP, "-p", str(PORT)], deadline)
        print(f"  [host] our client: rc={cl[0]} in {cl[3]:.1f} s\n{cl[1].strip()}\n"
              f"{cl[2].strip()[-800:]}", flush=True)
        res = g.wait()
    c.check("guest booted", res.boot_s is not None, f"{res.boot_s or 0:.1f} s")
    c.check("guest finished in time", res.rc is not None and not res.timed_out, f"rc={res.rc}")
    inline = [ln for ln in res.console.splitlines() if "IBV_SEND_INLINE" in ln]
    print(f"  [case] guest inline notes: {inline or 'none (16-byte inline sends used)'}", flush=True)
    c.check("guest rdma_client: end 0, exit 0",
            "rdma_client: end 0" in res.console and "XW-CLIENT rc=0" in res.console)
    c.check("guest rdma_server: end 0, exit 0",
            "rdma_server: end 0" in res.console and "XW-SERVER rc=0" in res.console)
    zeros = "XWARP-RECV len=16 data=" + "00" * 16
    c.eq("our server exit code", s_rc, 0)
    c.check("our server received rdma_client's 16 zero bytes", zeros in s_out)
    c.eq("our client exit code", cl[0], 0)
    c.check("our client received rdma_server's 16 zero bytes", zeros in cl[1])
    streams = tshark_streams(pcap)
    mpa = sorted(s for s, st in streams.items() if st["req"] is not None)
    c.eq("tshark: two MPA connections", len(mpa), 2)
    for label, sid, our_is_server in (("siw client -> xwarp server", mpa[0] if mpa else -1, True),
                                      ("xwarp client -> siw server",
                                       mpa[1] if len(mpa) > 1 else -1, False)):
        if sid < 0:
            continue
        st = streams[sid]
        ours_port = PORT if our_is_server else next(p for p in st["ports"] if p != PORT)
        got = sends(pcap, sid)
        ours = [(m, d) for p, m, d in got if p == ours_port]
        theirs = [(m, d) for p, m, d in got if p != ours_port]
        msg = SERVER_MSG if our_is_server else CLIENT_MSG
        c.eq(f"{label}: our one Send (MSN 1, our 16 bytes)", ours, [(1, msg)])
        c.eq(f"{label}: siw's one Send (MSN 1, 16 zero bytes)", theirs, [(1, bytes(16))])
        check_stream_clean(c, label, st)
    return case_verdict(c, NAME, t0)


if __name__ == "__main__":
    sys.exit(main())
