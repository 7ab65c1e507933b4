#!/usr/bin/env python3
"""Case: Debian's unmodified perftest on xwarp (libxwarp_ibverbs.so preloaded) as CLIENT,
perftest on siw as server.

Guest: `ib_X -R -d siw0 -s 4096 -n 100 -F` (the server) for each of ib_write_bw,
ib_read_bw, ib_send_bw, ib_write_lat, ib_send_lat; host (netns), each started 1 s after
the previous one ended: `xwarp run --iface tap0 --addr 10.77.0.3/24 -- ib_X -R -d
xwarp_tap0 ... 10.77.0.2` (the launcher preloads the socket shim and libxwarp_ibverbs.so), with
`XWARP_CONNECT_RETRY_MS=30000` (the guest's next server may not listen yet: the refused
connect is retried inside rdma_connect, the program never sees it) and
`XWARP_FIRST_FPDU_DELAY_MS=100` (siw's Reply-before-upcall race, docs/siw.md §4.3).
siw-crc first, with `XWARP_MPA_CRC=1` (our Initiator asks C=1, siw's Responder echoes it:
every connection must negotiate CRC and every FPDU's CRC32c both ways be right), then
plain siw (C=0 asked and echoed, CRC off). The checks are xwarp_lib_perftest.py's
(`run_role`, role client).

Usage: xwarp_lib_perftest_client.py [--out DIR] [--siw crc|default|both] [--tests ...]
"""

from __future__ import annotations

import sys

import xwarp_lib_perftest

NAME = "xwarp_lib_perftest_client"

if __name__ == "__main__":
    sys.exit(xwarp_lib_perftest.main(NAME, "client"))
