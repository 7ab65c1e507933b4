#!/usr/bin/env python3
"""Case (issue 5 case 4, issue 12): librdmacm's `rdma_server` / `rdma_client` examples
(rdmacm-utils, librdmacm/examples/rdma_{server,client}.c) on both sides, both directions:
Debian's own binaries on the host under the launcher (`xwarp run --iface tap0 --addr
10.77.0.3/24 -- rdma_server ...`, `common.xwarp_run_argv`: libxwarp_ibverbs.so on the
product path `xwarp::verbs`), the same programs on siw in the guest. (Until issue 12 the
host side was `xwarp-rdma-cm-echo`, a Rust program driving the sans-IO connection on its
own thread; the rdma-core programs do its job now.)

The exchange (port 7471): the client posts a 16-byte receive, connects, Sends 16 bytes and
waits for the server's 16-byte Send; the server posts its receive, accepts, waits for the
client's Send and answers. The programs send their never-written static buffers (16 zero
bytes, inline when the device allows 16 inline bytes).

One guest (siw default): `rdma_client -s 10.77.0.3` (against our server, started before the
guest boots), then `rdma_server` (our client connects; a refused connect, the guest not
listening yet, is retried inside rdma_connect, XWARP_CONNECT_RETRY_MS).
Checks: all four programs print `end 0` and exit 0; the engine's capture (`XWARP_PCAP`):
two MPA connections; the IRD/ORD of the MPA v2 blocks: siw's rdma_client asks 128/128
(siw's device maximum), ours 255/255 (librdmacm's device maximum for ours, the low byte
of 16383, ibverbs/README.md), and each rdma_server's Reply mirrors the Request (IRD = the
Initiator's ORD) capped at its device maximum (siw 128, librdmacm's rdma_accept); per
connection exactly one Send each way (opcode 3, MSN 1, 16 zero bytes); every frame after
the Reply dissects as iWARP, nothing malformed, no error-level expert item.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from common import (HERE, TSHARK_BASE, check_stream_clean, run_host,
                    tshark_streams, v2_block, vm)
from common import case_verdict, lib_case_start, xwarp_run_argv

NAME = "xwarp_rdma_cm"
PORT = 7471
#: XWARP_CONNECT_RETRY_MS of our client (the guest's rdma_server may not listen yet).
CONNECT_RETRY_MS = 20000


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
    out, t0, c, lib = lib_case_start(a, NAME, ["/usr/bin/rdma_server", "/usr/bin/rdma_client"])
    if lib is None:
        return case_verdict(c, NAME, t0)
    try:
        run = xwarp_run_argv(lib)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        c.check("build xwarp run (xwarp, libxwarp_preload.so)", False, str(e))
        return case_verdict(c, NAME, t0)
    print(f"  [case] host programs run as: {' '.join(run)} rdma_server ...", flush=True)
    # siw's Reply-before-upcall race (docs/siw.md §4.3) for our client; the guest's
    # rdma_server starts only after its rdma_client ended.
    settings = ["env", "XWARP_FIRST_FPDU_DELAY_MS=100",
                f"XWARP_CONNECT_RETRY_MS={CONNECT_RETRY_MS}"]
    pcap = out / f"{NAME}.pcap"
    guest_cmd = (f"sleep 3; rdma_client -s {vm.ENGINE_IP} -p {PORT}; echo \"XW-CLIENT rc=$?\"; "
                 f"rdma_server -s {vm.GUEST_IP} -p {PORT}; echo \"XW-SERVER rc=$?\"")
    with vm.Guest(guest_cmd, siw="default", timeout=a.timeout, pcap=pcap,
                  console_log=out / f"{NAME}.console", xwarp=True) as g:
        srv = g.netns_popen(settings + run + ["stdbuf", "-oL", "rdma_server", "-s",
                                              vm.ENGINE_IP, "-p", str(PORT)],
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
        print(f"  [host] our rdma_server: rc={s_rc}\n{s_out.strip()}\n{s_err.strip()[-800:]}",
              flush=True)
        time.sleep(1)
        cl = run_host(g, settings + run + ["stdbuf", "-oL", "rdma_client", "-s", vm.GUEST_IP,
                                           "-p", str(PORT)], deadline)
        print(f"  [host] our rdma_client: rc={cl[0]} in {cl[3]:.1f} s\n{cl[1].strip()}\n"
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
    c.eq("our rdma_server (xwarp) exit code", s_rc, 0)
    c.check("our rdma_server printed end 0", "rdma_server: end 0" in s_out, s_out[-200:])
    c.eq("our rdma_client (xwarp) exit code", cl[0], 0)
    c.check("our rdma_client printed end 0", "rdma_client: end 0" in cl[1], cl[1][-200:])
    if not pcap.exists():
        c.check("capture merged", False, str(pcap))
        return case_verdict(c, NAME, t0)
    streams = tshark_streams(pcap)
    mpa = sorted(s for s, st in streams.items() if st["req"] is not None)
    c.eq("tshark: two MPA connections", len(mpa), 2)
    for label, sid, our_is_server in (("siw client -> xwarp server", mpa[0] if mpa else -1, True),
                                      ("xwarp client -> siw server",
                                       mpa[1] if len(mpa) > 1 else -1, False)):
        if sid < 0:
            continue
        st = streams[sid]
        req = v2_block(st["req"]["pd"]) if st["req"] else None
        rep = v2_block(st["rep"]["pd"]) if st["rep"] else None
        # rdma_connect(id, NULL): librdmacm asks the device maxima, (uint8_t)
        # max_qp_rd_atom: siw's 128/128; ours 255/255 (16383's low byte, ibverbs/README.md).
        want = (255, 255) if our_is_server is False else (128, 128)
        c.eq(f"{label}: Request IRD/ORD (rdma_client's rdma_connect(id, NULL))",
             (req["ird"], req["ord"]) if req else None, want)
        # rdma_accept(id, NULL) mirrors it: IRD = the Initiator's ORD and vice versa,
        # capped at the server's device maximum (siw 128, ours 255).
        cap = 255 if our_is_server else 128
        c.eq(f"{label}: Reply IRD/ORD mirror the Request's, capped at the server device's "
             "maximum (rdma_server's rdma_accept(id, NULL))",
             (rep["ird"], rep["ord"]) if rep else None,
             (min(req["ord"], cap), min(req["ird"], cap)) if req else None)
        ours_port = PORT if our_is_server else next((p for p in st["ports"] if p != PORT), -1)
        got = sends(pcap, sid)
        ours = [(m, d) for p, m, d in got if p == ours_port]
        theirs = [(m, d) for p, m, d in got if p != ours_port]
        c.eq(f"{label}: our one Send (MSN 1, 16 zero bytes)", ours, [(1, bytes(16))])
        c.eq(f"{label}: siw's one Send (MSN 1, 16 zero bytes)", theirs, [(1, bytes(16))])
        check_stream_clean(c, label, st)
    return case_verdict(c, NAME, t0)


if __name__ == "__main__":
    sys.exit(main())
