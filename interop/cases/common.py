"""Shared helpers for the interop cases: MPA bytes, a check recorder, tshark checks.

Byte layouts follow docs/ (docs/mpa.md §1.2 Request/Reply frame, §1.4 v2
block, docs/mpa.md §1.6 FPDU, docs/ddp-rdmap.md §2.3 untagged DDP header, docs/protocols.md §5.2 rping_rdma_info, §5.3 exact rping bytes,
docs/testing.md §6.3 tshark). Python 3.11 stdlib only.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import vm  # noqa: E402  (interop/vm.py)

RPING_PORT = 7174  # rping default port (docs/protocols.md §5.2)

KEY_REQ = b"MPA ID Req Frame"
KEY_REP = b"MPA ID Rep Frame"
FLAG_M = 0x80
FLAG_C = 0x40
FLAG_R = 0x20
FLAG_ENHANCED = 0x10  # RFC 6581 enhanced connection setup (docs/mpa.md §1.2)
MPA_REV2 = 2
MAX_PD = 512  # RFC 5044 private data limit

#: siw rping client's Request, byte for byte (docs/protocols.md §5.3): enhanced, Rev 2,
#: PD_Length 4, IRD 1, ORD 1.
RPING_CLIENT_REQUEST = KEY_REQ + bytes([0x10, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01])
#: The valid Reply a compliant responder sends to it (docs/protocols.md §5.3).
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


def tshark_fpdu_crcs(pcap: Path) -> list[dict]:
    """Every FPDU with a CRC tshark checked: {frame, srcport, opcode, crc, good}.

    tshark has no field for the verdict; it is in the showname of iwarp_mpa.crc_check
    ("(Good CRC32)" / "(Bad CRC32, should be ...)"), so this reads PDML.
    """
    import xml.etree.ElementTree as ET

    argv = TSHARK_BASE + ["-r", str(pcap), "-Y", "iwarp_mpa.crc_check", "-T", "pdml"]
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"tshark failed: {p.stderr.strip()}")
    out = []
    for pkt in ET.fromstring(p.stdout).iter("packet"):
        fields = {}
        crcs = []
        for f in pkt.iter("field"):
            name = f.get("name", "")
            if name == "iwarp_mpa.crc_check":
                crcs.append(f)
            elif name in ("frame.number", "tcp.srcport", "iwarp_rdma.opcode") and name not in fields:
                fields[name] = f.get("show", "")
        opcodes = [f.get("show", "") for f in pkt.iter("field") if f.get("name") == "iwarp_rdma.opcode"]
        for i, f in enumerate(crcs):
            show = f.get("showname", "")
            out.append({
                "frame": int(fields.get("frame.number", "0")),
                "srcport": int(fields.get("tcp.srcport", "0")),
                "opcode": int(opcodes[i], 0) if i < len(opcodes) else None,
                "crc": f.get("show", ""),
                "good": "Good CRC" in show,
            })
    return out


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


def check_no_malformed(c: Checks, pcap: Path, allow_errors: str | None = None) -> None:
    """No frame dissects as malformed or carries an error-level expert item.

    allow_errors: a display filter for frames whose error-level items are expected (e.g. a
    deliberately corrupted CRC); they are still checked for being malformed.
    """
    rows = tshark_rows(pcap, "_ws.malformed", ["frame.number"])
    c.check("tshark: no malformed frames", not rows,
            f"frames {[r[0] for r in rows]}" if rows else "0 frames")
    flt = "_ws.expert.severity == error"
    if allow_errors:
        flt = f"({flt}) && !({allow_errors})"
    rows = tshark_rows(pcap, flt, ["frame.number"])
    c.check("tshark: no error-level expert items" + (" (besides the expected)" if allow_errors else ""),
            not rows, f"frames {[r[0] for r in rows]}" if rows else "0 frames")


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        v = i
        for _ in range(8):
            v = (v >> 1) ^ 0x82F63B78 if v & 1 else v >> 1
        table.append(v)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC32c (Castagnoli, reflected 0x82F63B78, init/xorout 0xFFFFFFFF) (docs/mpa.md §1.6)."""
    v = 0xFFFFFFFF
    for b in data:
        v = _CRC32C[(v ^ b) & 0xFF] ^ (v >> 8)
    return v ^ 0xFFFFFFFF


def mpa_crc_trailer(fpdu_without_crc: bytes) -> bytes:
    """The 4 CRC bytes as they go on the wire: CRC32c value little-endian (docs/mpa.md §1.6)."""
    return crc32c(fpdu_without_crc).to_bytes(4, "little")


# Known answers (docs/testing.md §6.1), checked at import so a broken CRC cannot pass silently.
assert crc32c(b"123456789") == 0xE3069283
assert crc32c(bytes(32)) == 0x8A9136AA
assert mpa_crc_trailer(bytes.fromhex("0022414300000000000000000000000100000000"
                                     "0000559d4c2a10000000020300000040")) == bytes.fromhex("af5d202b")


# ------------------------------------------------- per-connection tshark summary (additive)
#: Turns off Wireshark's RPC-over-RDMA heuristic on DDP payloads: it claims raw control
#: structs (e.g. perftest's 4-byte Sends) and reports them as malformed RPCoRDMA although
#: MPA/DDP/RDMAP dissect fine.
NO_RPCRDMA = ["--disable-heuristic", "rpcrdma_iwarp"]


def tshark_streams(pcap: Path, max_frames: int | None = None,
                   extra: list[str] | None = None) -> dict[int, dict]:
    """Per TCP stream: the MPA Request/Reply (flags word, private data hex), RDMAP opcodes by
    source port, FPDU count, and the frames that break the iWARP view after the Reply.

    A payload-carrying frame after the Reply "dissects as iWARP" when tshark shows an FPDU
    in it (iwarp_mpa.ulpdulength) or it is a segment of a PDU reassembled in a later frame
    (tcp.reassembled_in / tcp.segment_data) or a TCP retransmission of bytes already seen
    (tshark's "Retransmission", "Spurious Retransmission", or "Out-Of-Order" for a resend
    soon after the original);
    anything else is counted in "not_iwarp".
    """
    argv = TSHARK_BASE + (extra or []) + ["-r", str(pcap)] + (
        ["-c", str(max_frames)] if max_frames else []) + [
        "-T", "fields", "-E", "separator=|", "-E", "occurrence=a",
        "-e", "frame.number", "-e", "tcp.stream", "-e", "tcp.srcport", "-e", "tcp.len",
        "-e", "iwarp_mpa.key.req", "-e", "iwarp_mpa.key.rep", "-e", "iwarp_mpa.crc_flag",
        "-e", "iwarp_mpa.rej_flag", "-e", "iwarp_mpa.privatedata", "-e", "iwarp_rdma.opcode",
        "-e", "iwarp_mpa.ulpdulength", "-e", "tcp.reassembled_in", "-e", "_ws.malformed",
        "-e", "_ws.expert.severity", "-e", "tcp.segment_data", "-e", "tcp.dstport",
        "-e", "tcp.analysis.retransmission", "-e", "tcp.analysis.spurious_retransmission",
        "-e", "tcp.analysis.lost_segment", "-e", "tcp.analysis.out_of_order"]
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"tshark failed: {p.stderr.strip()}")
    streams: dict[int, dict] = {}
    for line in p.stdout.splitlines():
        f = line.split("|")
        if len(f) < 16 or not f[1]:
            continue
        st = streams.setdefault(int(f[1]), {
            "req": None, "rep": None, "opcodes": {}, "fpdus": 0, "not_iwarp": [],
            "malformed": [], "errors": [], "ports": set(), "capture_gaps": []})
        frame, port, tlen = int(f[0]), int(f[2]), int(f[3] or 0)
        st["ports"].add(port)
        if f[4]:
            st["req"] = {"c": flag(f[6]), "pd": f[8].replace(":", ""), "port": port}
        if f[5]:
            st["rep"] = {"c": flag(f[6]), "r": flag(f[7]), "pd": f[8].replace(":", ""),
                         "port": port}
        ops = [int(x, 0) for x in f[9].split(",") if x]
        st["opcodes"].setdefault(port, []).extend(ops)
        nfpdu = len([x for x in f[10].split(",") if x])
        st["fpdus"] += nfpdu
        if f[12]:
            st["malformed"].append(frame)
        if any(int(x) >= 0x800000 for x in f[13].split(",") if x):  # PI_ERROR
            st["errors"].append(frame)
        after_rep = st["rep"] is not None and not f[5]
        # A TCP retransmission repeats bytes already dissected (tshark does not re-dissect).
        # tshark calls a resend "Out-Of-Order" instead when it follows the original within
        # its RTT estimate (seen: the engine resending a Write's first segment 9 ms later
        # to a TCG guest that ACKed after 100 ms). The captures are the engines' own, of
        # one tap link that does not reorder, where an earlier sequence number is a resend.
        retrans = (len(f) > 17 and (f[16] or f[17])) or (len(f) > 19 and f[19])
        # "Previous segment not captured": the capture (not the wire) lost frames under
        # load; the frame right after the gap cannot be framed by tshark. Counted apart.
        if len(f) > 18 and f[18]:
            st["capture_gaps"].append(frame)
        elif after_rep and tlen > 0 and nfpdu == 0 and not f[11] and not f[14] and not retrans:
            st["not_iwarp"].append(frame)
    return streams


def v2_block(pd_hex: str) -> dict | None:
    """Decode the MPA v2 IRD/ORD block (docs/mpa.md §1.4) from private data hex."""
    if len(pd_hex) < 8:
        return None
    a, b = int(pd_hex[0:4], 16), int(pd_hex[4:8], 16)
    return {"p2p": bool(a & 0x8000), "send_rtr": bool(a & 0x4000), "ird": a & 0x3FFF,
            "write_rtr": bool(b & 0x8000), "read_rtr": bool(b & 0x4000), "ord": b & 0x3FFF}


def build_tools(names: list[str], repo: Path | None = None) -> dict[str, Path]:
    """cargo build --release these binaries of xwarp-tools (CARGO_TARGET_DIR or
    repo/target); name -> path.

    A failed build with an existing binary is used with a loud warning (the shared tree may
    be mid-edit elsewhere); with no binary it raises RuntimeError.
    """
    import os
    # XWARP_INTEROP_SRC: build from another checkout (e.g. a `git archive` snapshot while the
    # shared tree is mid-edit).
    repo = repo or Path(os.environ.get("XWARP_INTEROP_SRC", str(HERE.parent.parent)))
    target = Path(os.environ.get("CARGO_TARGET_DIR", str(repo / "target")))
    argv = ["cargo", "build", "--release", "-p", "xwarp-tools"]
    for n in names:
        argv += ["--bin", n]
    t0 = time.monotonic()
    p = subprocess.run(argv, cwd=repo, env=dict(os.environ, CARGO_TARGET_DIR=str(target)),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    out = {n: target / "release" / n for n in names}
    if p.returncode != 0:
        print(p.stdout[-3000:], flush=True)
        missing = [n for n, b in out.items() if not b.exists()]
        if missing:
            raise RuntimeError(f"cargo build failed for {missing}")
        print("  [case] WARNING: build failed, using the existing binaries", flush=True)
    print(f"  [case] built {', '.join(names)} ({time.monotonic() - t0:.1f} s)", flush=True)
    return out


def run_host(g, argv: list[str], deadline: float, env: dict | None = None) -> tuple[int | None, str, str, float]:
    """Run argv inside the guest's namespace, bounded by the monotonic deadline:
    (rc or None on timeout, stdout, stderr, seconds)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(g.netns_argv(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=env, timeout=max(deadline - time.monotonic(), 1))
        return p.returncode, p.stdout, p.stderr, time.monotonic() - t0
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return None, out, err, time.monotonic() - t0


def check_stream_clean(c: Checks, label: str, st: dict, allow_errors: bool = False) -> None:
    """One connection of tshark_streams(): Request and Reply seen, every later payload frame
    dissected as iWARP, nothing malformed, no error-level expert item (docs/testing.md §6.3;
    the Rev-2 / Res-bit notes are warnings, not errors)."""
    c.check(f"{label} tshark: MPA Request and Reply", st["req"] is not None and st["rep"] is not None)
    gaps = st.get("capture_gaps", [])
    c.check(f"{label} tshark: every frame after the Reply dissects as iWARP", not st["not_iwarp"],
            f"frames {st['not_iwarp'][:10]}" if st["not_iwarp"] else f"{st['fpdus']} FPDUs"
            + (f"; capture lost frames before {gaps[:5]} (tcpdump drops, not checked)" if gaps
               else ""))
    c.check(f"{label} tshark: no malformed frame", not st["malformed"],
            f"frames {st['malformed'][:10]}" if st["malformed"] else "")
    if not allow_errors:
        c.check(f"{label} tshark: no error-level expert item", not st["errors"],
                f"frames {st['errors'][:10]}" if st["errors"] else "")


def crc_verdicts(pcap: Path) -> dict[int, dict[int, list[bool]]]:
    """tshark_fpdu_crcs grouped: {tcp.stream: {srcport: [good, ...]}} (PDML, one pass)."""
    import xml.etree.ElementTree as ET

    argv = TSHARK_BASE + ["-r", str(pcap), "-Y", "iwarp_mpa.crc_check", "-T", "pdml"]
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"tshark failed: {p.stderr.strip()}")
    out: dict[int, dict[int, list[bool]]] = {}
    for pkt in ET.fromstring(p.stdout).iter("packet"):
        stream = port = None
        goods = []
        for f in pkt.iter("field"):
            n = f.get("name", "")
            if n == "tcp.stream" and stream is None:
                stream = int(f.get("show", "0"))
            elif n == "tcp.srcport" and port is None:
                port = int(f.get("show", "0"))
            elif n == "iwarp_mpa.crc_check":
                goods.append("Good CRC" in f.get("showname", ""))
        out.setdefault(stream, {}).setdefault(port, []).extend(goods)
    return out


# ------------------------------------------- FPDU walk over the reassembled TCP byte stream
def stream_bytes(pcap: Path, stream: int) -> dict[int, tuple[bytes, bool]]:
    """Each direction of TCP stream `stream` reassembled from the capture by sequence number
    (retransmissions and overlaps folded): {srcport: (bytes from the first payload byte,
    whether a hole was found — the bytes stop there)}."""
    argv = TSHARK_BASE + ["-r", str(pcap), "-Y", f"tcp.stream=={stream} && tcp.len>0",
                          "-T", "fields", "-E", "separator=|", "-e", "tcp.srcport",
                          "-e", "tcp.seq_raw", "-e", "tcp.payload"]
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"tshark failed: {p.stderr.strip()}")
    segs: dict[int, list[tuple[int, bytes]]] = {}
    for line in p.stdout.splitlines():
        f = line.split("|")
        if len(f) < 3 or not f[0] or not f[2]:
            continue
        segs.setdefault(int(f[0]), []).append((int(f[1]), bytes.fromhex(f[2].replace(":", ""))))
    out: dict[int, tuple[bytes, bool]] = {}
    for port, ss in segs.items():
        ss.sort(key=lambda s: s[0])
        base = ss[0][0]
        buf = bytearray()
        hole = False
        for seq, data in ss:
            off = (seq - base) % (1 << 32)
            if off > len(buf):
                hole = True
                break
            if off + len(data) > len(buf):
                buf += data[len(buf) - off:]
        out[port] = (bytes(buf), hole)
    return out


def walk_fpdus(data: bytes, check_crc: bool) -> dict:
    """Walk one direction's bytes: the MPA Request/Reply frame (20 bytes + private data),
    then FPDUs by ULPDU_Length (no markers): {"fpdus", "bad_crc", "opcodes", "rest"} where
    `rest` is the number of trailing bytes that do not make a whole FPDU and `cut` the
    length the last, incomplete FPDU claims (0 if none). Every FPDU ends with its 4-byte
    CRC field, also when CRC is off (RFC 5044 §4.1: then it is sent as zero and not
    checked); its value is checked only with `check_crc`."""
    r = {"fpdus": 0, "bad_crc": 0, "opcodes": set(), "rest": len(data), "cut": 0}
    if len(data) < 20:
        return r
    pos = 20 + struct.unpack(">H", data[18:20])[0]
    while pos + 2 <= len(data):
        ulpdu = struct.unpack(">H", data[pos:pos + 2])[0]
        body = 2 + ulpdu
        end = pos + body + (-body % 4) + 4
        if ulpdu < 2:
            break
        if end > len(data):
            r["cut"] = end - pos
            break
        r["fpdus"] += 1
        r["opcodes"].add(data[pos + 3] & 0x0F)
        if check_crc and mpa_crc_trailer(data[pos:end - 4]) != data[end - 4:end]:
            r["bad_crc"] += 1
        pos = end
    r["rest"] = len(data) - pos
    return r


def tcp_resets(pcap: Path, stream: int) -> set[int]:
    """The source ports that sent a TCP RST in `stream` of the capture."""
    rows = tshark_rows(pcap, f"tcp.stream == {stream} && tcp.flags.reset == 1", ["tcp.srcport"])
    return {int(r[0]) for r in rows if r and r[0]}


# ---------------------------------------------------------------- libxwarp_ibverbs cases

def _cargo_release_lib(package: str, file: str) -> tuple[Path, Path]:
    """Build `package` (release) in the tree `XWARP_INTEROP_SRC` or this checkout, into
    `CARGO_TARGET_DIR` or the tree's target/; (the tree, the built `file`). RuntimeError
    if the build failed and no older build exists."""
    repo = Path(os.environ.get("XWARP_INTEROP_SRC", str(HERE.parent.parent)))
    target = Path(os.environ.get("CARGO_TARGET_DIR", str(repo / "target")))
    p = subprocess.run(["cargo", "build", "--release", "-p", package], cwd=repo,
                       env=dict(os.environ, CARGO_TARGET_DIR=str(target)),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    lib = target / "release" / file
    if p.returncode != 0 and not lib.exists():
        print(p.stdout[-3000:], flush=True)
        raise RuntimeError(f"cargo build -p {package} failed")
    return repo, lib


def lib_build() -> Path:
    """Build libxwarp_ibverbs.so (release); its path. RuntimeError if it failed and no
    older build exists."""
    return _cargo_release_lib("xwarp-ibverbs", "libxwarp_ibverbs.so")[1]


def lib_env(lib: Path, **settings) -> list[str]:
    """`env ...` that preloads the library on tap0 owning the engine address, plus
    `XWARP_<NAME>=value` for each keyword (`first_fpdu_delay_ms=100` ->
    `XWARP_FIRST_FPDU_DELAY_MS=100`; None leaves it out). The settings toward siw are
    described in ibverbs/README.md ("Toward siw")."""
    env = ["env", f"LD_PRELOAD={lib}", f"XWARP_IFACE={vm.TAP}",
           f"XWARP_ADDR={vm.ENGINE_IP}/{vm.PREFIX}"]
    env += [f"XWARP_{k.upper()}={v}" for k, v in settings.items() if v is not None]
    return env


def xwarp_run_argv(lib: Path) -> list[str]:
    """`xwarp run --iface tap0 --addr 10.77.0.3/24 --rdma-lib LIB --preload SHIM --`: the
    launcher a user would type (tools/src/launcher.rs), with the shim (`xwarp-preload`)
    and the `xwarp` binary built here (release). RuntimeError if a build failed."""
    repo, shim = _cargo_release_lib("xwarp-preload", "libxwarp_preload.so")
    xwarp = build_tools(["xwarp"], repo)["xwarp"]
    return [str(xwarp), "run", "--iface", vm.TAP, "--addr", f"{vm.ENGINE_IP}/{vm.PREFIX}",
            "--rdma-lib", str(lib), "--preload", str(shim), "--"]


def lib_case_start(a, name: str, programs: list[str]):
    """The start of a libxwarp_ibverbs case: case_start(), the host programs present, the
    library built. (out, t0, checks, lib); lib is None when the case cannot run (a failed
    check says why; return case_verdict(c, name, t0, ...))."""
    out, t0, c = case_start(a)
    missing = [p for p in programs if not Path(p).exists()]
    if missing:
        c.check("host programs installed", False, f"missing {missing} (apt-get install "
                "rdmacm-utils perftest)")
        return out, t0, c, None
    try:
        lib = lib_build()
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        c.check("build libxwarp_ibverbs.so", False, str(e))
        return out, t0, c, None
    return out, t0, c, lib


# ---------------------------------------------------------------- case scaffolding

def case_args(default_timeout: float, extra=None):
    """The options every case takes (--out, --timeout), plus what `extra(ap)` adds."""
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE.parent / "build" / "results"),
                    help="directory for the pcap and the console log")
    ap.add_argument("--timeout", type=float, default=default_timeout,
                    help="bound for the whole case (s)")
    if extra is not None:
        extra(ap)
    return ap.parse_args()


def case_start(a) -> tuple[Path, float, Checks]:
    """Install the VM cleanup handlers, create the output directory: (out, t0, checks)."""
    vm._install_signal_handlers()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    return out, time.monotonic(), Checks("case")


def case_verdict(c: Checks, name: str, t0: float, failed_at: str | None = None) -> int:
    """Print the case's `PASS|FAIL name (seconds)` line; the exit code."""
    dt = time.monotonic() - t0
    if failed_at is not None:
        print(f"FAIL {name} ({dt:.1f} s) failed: {failed_at}")
        return 1
    verdict = "PASS" if c.ok() else "FAIL"
    extra = "" if c.ok() else f" failed: {', '.join(c.failed)}"
    print(f"{verdict} {name} ({dt:.1f} s){extra}")
    return 0 if c.ok() else 1


def build_tool(c: Checks, name: str) -> Path | None:
    """Build the xwarp-tools binary <name> (checked); None if the build failed."""
    try:
        return build_tools([name])[name]
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        c.check(f"build {name}", False, str(e))
        return None


def print_host_run(label: str, r: tuple) -> None:
    """Log one run_host() result: exit code, time, stdout, the tail of stderr."""
    rc, so, se, dt = r
    print(f"  [host] {label}: rc={rc} in {dt:.1f} s\n{so.strip()}\n{se.strip()[-800:]}",
          flush=True)


def check_guest_ran(c: Checks, res, booted: str = "guest booted") -> None:
    """The guest booted and its command finished within the case's bound."""
    c.check(booted, res.boot_s is not None,
            f"{res.boot_s:.1f} s" if res.boot_s else (res.setup_failed or "no READY marker"))
    c.check("guest command finished in time", res.rc is not None and not res.timed_out,
            f"rc={res.rc} total {res.total_s:.1f} s")
