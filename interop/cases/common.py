"""Shared helpers for the interop cases: MPA bytes, a check recorder, tshark checks.

Byte layouts follow /work/shared/design/iwarp-wire.md (§1.2 Request/Reply frame, §1.4 v2
block, §1.6 FPDU, §2.3 untagged DDP header, §5.2 rping_rdma_info, §5.3 exact rping bytes,
§6.3 tshark). Python 3.11 stdlib only.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import vm  # noqa: E402  (interop/vm.py)

RPING_PORT = 7174  # rping default port (iwarp-wire.md §5.2)

KEY_REQ = b"MPA ID Req Frame"
KEY_REP = b"MPA ID Rep Frame"
FLAG_M = 0x80
FLAG_C = 0x40
FLAG_R = 0x20
FLAG_ENHANCED = 0x10  # RFC 6581 enhanced connection setup (iwarp-wire.md §1.2)
MPA_REV2 = 2
MAX_PD = 512  # RFC 5044 private data limit

#: siw rping client's Request, byte for byte (iwarp-wire.md §5.3): enhanced, Rev 2,
#: PD_Length 4, IRD 1, ORD 1.
RPING_CLIENT_REQUEST = KEY_REQ + bytes([0x10, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01])
#: The valid Reply a compliant responder sends to it (iwarp-wire.md §5.3).
RPING_VALID_REPLY = KEY_REP + bytes([0x10, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01])


def mpa_frame(key: bytes, flags: int, rev: int, ird: int, ord_: int) -> bytes:
    """An MPA v2 Request/Reply with the 4-byte enhanced IRD/ORD block and no ULP data."""
    return key + struct.pack(">BBHHH", flags, rev, 4, ird & 0x3FFF, ord_ & 0x3FFF)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly n bytes (socket timeout applies); raises EOFError on early close."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def recv_mpa_frame(sock: socket.socket) -> tuple[bytes, bytes]:
    """Read one MPA Request/Reply frame: (20-byte header, private data)."""
    hdr = recv_exact(sock, 20)
    (pd_len,) = struct.unpack(">H", hdr[18:20])
    if pd_len > MAX_PD:
        raise ValueError(f"PD_Length {pd_len} > {MAX_PD}")
    return hdr, recv_exact(sock, pd_len)


class Checks:
    """Records named checks; prints one line per check; ok() tells if all passed."""

    def __init__(self, who: str):
        self.who = who
        self.failed: list[str] = []
        self.count = 0

    def check(self, name: str, cond: bool, detail: str = "") -> bool:
        """Record one check."""
        self.count += 1
        status = "ok  " if cond else "FAIL"
        print(f"  [{self.who}] {status} {name}" + (f" ({detail})" if detail else ""), flush=True)
        if not cond:
            self.failed.append(name)
        return cond

    def eq(self, name: str, got, want, hexint: bool = False) -> bool:
        """Record a check that got == want, showing both (bytes as hex; ints too if hexint)."""
        if isinstance(want, (bytes, bytearray)):
            fmt = lambda v: v.hex(" ") if isinstance(v, (bytes, bytearray)) else repr(v)  # noqa: E731
        elif hexint:
            fmt = lambda v: f"0x{v:02x}" if isinstance(v, int) else repr(v)  # noqa: E731
        else:
            fmt = repr
        detail = f"got {fmt(got)}" if got == want else f"got {fmt(got)}, want {fmt(want)}"
        return self.check(name, got == want, detail)

    def ok(self) -> bool:
        """True if at least one check ran and none failed."""
        return self.count > 0 and not self.failed


def connect_retry(addr: tuple[str, int], deadline: float) -> socket.socket:
    """Connect, retrying refused/unreachable attempts until the monotonic deadline."""
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            return socket.create_connection(addr, timeout=3)
        except OSError as e:  # refused until the guest listens, unreachable while it boots
            last = e
            time.sleep(0.3)
    raise TimeoutError(f"could not connect to {addr}: {last}")


# --------------------------------------------------------------------------- tshark
TSHARK_BASE = ["tshark", "-n", "-o", "tcp.try_heuristic_first:TRUE",
               "--enable-heuristic", "iwarp_mpa_tcp"]


def tshark_rows(pcap: Path, display_filter: str, fields: list[str]) -> list[list[str]]:
    """Rows (one per matching frame) of the given fields; multi-values joined by ','."""
    argv = TSHARK_BASE + ["-r", str(pcap), "-Y", display_filter, "-T", "fields"]
    for f in fields:
        argv += ["-e", f]
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"tshark failed: {p.stderr.strip()}")
    return [line.split("\t") for line in p.stdout.splitlines() if line.strip()]


def flag(v: str) -> int:
    """tshark boolean field text -> 0/1 (4.0 prints 1/0; other versions True/False)."""
    v = v.split(",")[0].strip()
    return 1 if v in ("1", "True", "true") else 0


def first_int(v: str) -> int | None:
    """First value of a (possibly multi-valued) numeric field; None if empty."""
    v = v.split(",")[0].strip()
    if not v:
        return None
    return int(v, 0)


def check_no_malformed(c: Checks, pcap: Path) -> None:
    """No frame in the capture dissects as malformed."""
    rows = tshark_rows(pcap, "_ws.malformed || _ws.expert.severity == error", ["frame.number"])
    c.check("tshark: no malformed/error frames", not rows,
            f"frames {[r[0] for r in rows]}" if rows else "0 frames")
