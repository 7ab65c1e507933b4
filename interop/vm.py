#!/usr/bin/env python3
"""Boot the kernel-siw guest under qemu (TCG) on a tap device inside a private netns.

Library use (the interop cases import this module):

    with vm.Guest(guest_cmd="rping -c -a 10.77.0.1 -C 1", siw="default",
                  pcap="/tmp/x.pcap", timeout=120) as g:
        peer = g.netns_popen(["python3", "peer.py"])   # runs on the host side of the tap
        g.start()                                       # boots qemu
        res = g.wait()                                  # GuestResult
    # leaving the block ALWAYS kills qemu (via its -pidfile), tcpdump and the peers,
    # and deletes the tap and the namespace

Command line:

    interop/vm.py [--siw default|crc] [--timeout S] [--pcap FILE] [--host-cmd CMD] -- GUEST_CMD
    interop/vm.py --cleanup        # remove namespaces left behind by killed runs

Topology (fixed inside each run's own namespace, so parallel runs do not collide):
    netns xwi-<pid>-<n>:  tap0 10.77.0.1/24  <-- virtio-net -->  guest eth0 10.77.0.2/24, siw0
The host side of the tap is where a userspace engine (xwarp) binds AF_XDP later.

Python 3.11 stdlib only. Must run as root (netns, tap). See interop/README.md.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD = HERE / "build"
VMLINUX = BUILD / "vmlinux"
INITRD = BUILD / "initramfs.cpio.gz"

HOST_IP = "10.77.0.1"
GUEST_IP = "10.77.0.2"
#: The xwarp engine's own address on tap0 (not configured on the kernel's tap0).
ENGINE_IP = "10.77.0.3"
PREFIX = 24
TAP = "tap0"
#: xwarp peers run on an xwarp engine bound to tap0 with AF_XDP, owning ENGINE_IP. The old
#: variant on kernel TCP sockets at HOST_IP (XWARP_INTEROP_NET=kernel) is gone: since issue
#: 12 every xwarp tool runs on `xwarp::verbs`, which needs an engine.
if os.environ.get("XWARP_INTEROP_NET", "engine") != "engine":
    raise SystemExit("XWARP_INTEROP_NET: only 'engine' is left (the kernel-TCP variant is "
                     "gone: every xwarp tool runs on xwarp::verbs)")
#: Where the guest reaches xwarp peers.
XWARP_IP = ENGINE_IP
#: The engine flags of the xwarp tools (tools/src/support/transport.rs, `NetArgs`):
#: an engine on tap0 owning ENGINE_IP. `--rx-checksum verify`: the engine verifies every
#: received checksum (the guest runs without offload, so they are complete).
ENGINE_ARGS = ["--iface", TAP, "--addr", f"{ENGINE_IP}/{PREFIX}", "--rx-checksum", "verify"]
NS_PREFIX = "xwi-"
#: TCP port a guest command may `nc -l -p` on to wait for the host side ("host done").
DONE_PORT = 7999

EXIT_RE = re.compile(r"XWARP-GUEST-EXIT rc=(\d+)")
SETUP_FAIL_RE = re.compile(r"XWARP-GUEST-SETUP-FAILED (.*)")
READY_MARK = "XWARP-GUEST-READY"

_counter = itertools.count()


class HarnessError(RuntimeError):
    """The harness itself could not set up or run the VM (not a test verdict)."""


@dataclass
class GuestResult:
    """Outcome of one guest run."""

    rc: int | None  # exit code of the guest command; None if no exit marker was seen
    timed_out: bool
    setup_failed: str | None  # reason from /init, if it could not prepare the guest
    console: str  # full serial console text
    boot_s: float | None  # qemu start -> XWARP-GUEST-READY
    total_s: float  # qemu start -> qemu gone
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """The guest command ran to completion and exited 0."""
        return self.rc == 0 and not self.timed_out and self.setup_failed is None


def _run(argv: list[str], check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and p.returncode != 0:
        raise HarnessError(f"{shlex.join(argv)} failed ({p.returncode}): {p.stderr.strip()}")
    if not quiet and p.returncode != 0:
        print(f"[vm] warning: {shlex.join(argv)}: {p.stderr.strip()}", file=sys.stderr)
    return p


def capability_problem() -> str | None:
    """Why this machine cannot run the guest at all (None if it can)."""
    if os.geteuid() != 0:
        return "not root (network namespaces and tap devices need CAP_NET_ADMIN)"
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is absent (no tap devices)"
    return None


def _pid_alive(pid: int) -> bool:
    """True if pid exists and is not a zombie (a SIGKILLed creator may linger as one)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # state is the field after the parenthesised command name
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X", "")


def cleanup_stale() -> list[str]:
    """Delete xwi-<pid>-<n> namespaces whose creating process is gone. Returns their names."""
    removed = []
    p = _run(["ip", "netns", "list"], check=False, quiet=True)
    for line in p.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(re.escape(NS_PREFIX) + r"(\d+)-\d+", name)
        if not m:
            continue
        if _pid_alive(int(m.group(1))):
            continue  # creator alive: not ours to touch
        # kill what still runs inside (qemu, tcpdump, peers), then delete
        pids = _run(["ip", "netns", "pids", name], check=False, quiet=True).stdout.split()
        for q in pids:
            try:
                os.kill(int(q), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        _run(["ip", "netns", "del", name], check=False, quiet=True)
        removed.append(name)
    return removed


def _terminate(proc: subprocess.Popen, grace: float = 3.0) -> None:
    if proc.poll() is not None:
        return
    try:
        proc.terminate()  # SIGTERM: background jobs ignore SIGINT (docs/testing.md §6.4.3)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    except ProcessLookupError:
        pass


class Guest:
    """One VM run: namespace + tap + optional tcpdump + qemu, torn down on exit."""

    def __init__(
        self,
        guest_cmd: str,
        siw: str = "default",
        timeout: float = 150.0,
        pcap: str | os.PathLike | None = None,
        console_log: str | os.PathLike | None = None,
        echo: bool = False,
        mem_mb: int = 512,
        offload: bool = True,
        xwarp: bool = False,
    ):
        if siw not in ("default", "crc"):
            raise ValueError(f"siw variant must be 'default' or 'crc', not {siw!r}")
        self.guest_cmd = guest_cmd
        self.siw = siw
        self.timeout = timeout
        self.pcap = Path(pcap) if pcap else None
        self.console_log = Path(console_log) if console_log else None
        self.echo = echo
        self.mem_mb = mem_mb
        # offload=False: the guest's virtio-net offers no checksum/TSO offload, so frames on
        # the tap carry full checksums and are <= MTU (what an AF_XDP engine on tap0 wants;
        # with offload the guest leaves partial checksums, docs/afxdp.md §7.3).
        self.offload = offload
        # xwarp=True: the case runs xwarp peers. They get the engine flags
        # (engine_args(): an engine on tap0 owning ENGINE_IP) and XWARP_PCAP (the engine's own capture: tcpdump
        # on tap0 does not see AF_XDP-redirected RX nor copy-mode TX, docs/afxdp.md §7.4), the
        # guest runs without offload (full checksums, frames <= MTU), and on close the
        # engine captures are merged into `pcap` (tcpdump's view stays in <stem>.tap.pcap).
        self.engine = xwarp
        if self.engine:
            self.offload = False
        self.ns = f"{NS_PREFIX}{os.getpid()}-{next(_counter)}"
        self._tmp = tempfile.TemporaryDirectory(prefix="xwi-vm-")
        self.pidfile = Path(self._tmp.name) / "qemu.pid"
        self._qemu: subprocess.Popen | None = None
        self._tcpdump: subprocess.Popen | None = None
        self._peers: list[subprocess.Popen] = []
        self._lines: list[str] = []
        self._reader: threading.Thread | None = None
        self._ready = threading.Event()
        self._t_start: float | None = None
        self._t_ready: float | None = None
        self._ns_created = False

    # ------------------------------------------------------------------ setup
    def __enter__(self) -> "Guest":
        problem = capability_problem()
        if problem:
            raise HarnessError(problem)
        for f in (VMLINUX, INITRD):
            if not f.exists():
                raise HarnessError(f"{f} missing: run interop/build-guest.sh first")
        try:
            self._setup_net()
            if self.pcap:
                stale = self._engine_pcaps() + ([self.pcap] if self.engine else [])
                for old in stale:
                    old.unlink(missing_ok=True)
                self._start_tcpdump()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _setup_net(self) -> None:
        _run(["ip", "netns", "add", self.ns])
        self._ns_created = True
        n = ["ip", "-n", self.ns]
        _run(n + ["link", "set", "lo", "up"])
        # no IPv6 chatter from the host side of the tap (the guest boots with ipv6.disable=1)
        _run(["ip", "netns", "exec", self.ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
              "net.ipv6.conf.default.disable_ipv6=1"], check=False)
        _run(n + ["tuntap", "add", "dev", TAP, "mode", "tap"])
        _run(n + ["addr", "add", f"{HOST_IP}/{PREFIX}", "dev", TAP])
        _run(n + ["link", "set", TAP, "up"])

    def _tap_pcap(self) -> Path:
        """Where tcpdump on tap0 writes: `pcap`, or <stem>.tap.pcap in engine mode."""
        assert self.pcap is not None
        return self.pcap.with_suffix(".tap.pcap") if self.engine else self.pcap

    def _engine_pcaps(self) -> list[Path]:
        """Engine captures of this Guest's pcap (one per xwarp process), oldest first."""
        if not self.pcap:
            return []
        found = self.pcap.parent.glob(f"{self.pcap.stem}.xwarp-*.pcap")
        return sorted(found, key=lambda f: f.stat().st_mtime)

    def engine_args(self) -> list[str]:
        """Flags that put an xwarp tool on the engine (empty without xwarp=True); they go right
        after the tool's path."""
        return list(ENGINE_ARGS) if self.engine else []

    def engine_env(self) -> dict[str, str]:
        """Environment of the programs in the namespace: the engine's capture file
        (XWARP_PCAP; empty without xwarp=True)."""
        if not self.engine or not self.pcap:
            return {}
        # %p: the process id (tools/src/support/transport.rs), one file per process.
        return {"XWARP_PCAP": str(self.pcap.parent / f"{self.pcap.stem}.xwarp-%p.pcap")}

    def _merge_engine_pcaps(self) -> None:
        """mergecap the engine captures into `pcap` (chronologically)."""
        assert self.pcap is not None
        parts = [p for p in self._engine_pcaps() if p.stat().st_size > 0]
        if not parts:
            print(f"  [vm] no engine capture for {self.pcap.name}", flush=True)
            return
        _run(["mergecap", "-F", "pcap", "-w", str(self.pcap)] + [str(p) for p in parts],
             check=False)

    def _start_tcpdump(self) -> None:
        assert self.pcap is not None
        self.pcap.parent.mkdir(parents=True, exist_ok=True)
        argv = ["ip", "netns", "exec", self.ns, "tcpdump", "-i", TAP, "-n", "-s", "0",
                "--immediate-mode", "-U", "-Z", "root", "-w", str(self._tap_pcap())]
        self._tcpdump = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         text=True)
        # wait for "listening on tap0" so no early frame is missed
        assert self._tcpdump.stderr is not None
        deadline = time.monotonic() + 15
        line = ""
        while time.monotonic() < deadline:
            line = self._tcpdump.stderr.readline()
            if "listening on" in line or not line:
                break
        if "listening on" not in line:
            raise HarnessError(f"tcpdump did not start: {line.strip()}")

    def netns_popen(self, argv: list[str], **kw) -> subprocess.Popen:
        """Start a process on the host side of the tap (inside the run's namespace).

        It is killed (SIGTERM, then SIGKILL) when the Guest closes, if still running.
        """
        p = subprocess.Popen(self.netns_argv(argv), **kw)
        self._peers.append(p)
        return p

    def netns_argv(self, argv: list[str]) -> list[str]:
        """argv prefixed so it runs inside the run's namespace (for subprocess.run), with
        engine_env() set."""
        env = [f"{k}={v}" for k, v in self.engine_env().items()]
        return ["ip", "netns", "exec", self.ns] + (["env"] + env if env else []) + list(argv)

    # ------------------------------------------------------------------ qemu
    def qemu_argv(self) -> list[str]:
        cmd_b64 = base64.b64encode(self.guest_cmd.encode()).decode()
        append = " ".join([
            "console=ttyS0", "ipv6.disable=1", "panic=-1", "loglevel=5",
            f"xw.siw={self.siw}", f"xw.ip={GUEST_IP}/{PREFIX}", f"xw.cmd={cmd_b64}",
        ])
        if len(append) > 2000:
            raise HarnessError("guest command too long for the kernel command line")
        return [
            "nice", "-n", "10",
            "qemu-system-x86_64",
            "-accel", "tcg", "-cpu", "max", "-m", str(self.mem_mb), "-smp", "2",
            "-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none",
            "-serial", "stdio", "-no-reboot",
            "-kernel", str(VMLINUX), "-initrd", str(INITRD), "-append", append,
            "-netdev", f"tap,id=n0,ifname={TAP},script=no,downscript=no",
            "-device", "virtio-net-pci,netdev=n0,romfile=,speed=10000,duplex=full"
            + ("" if self.offload else ",csum=off,guest_csum=off,gso=off"),
            "-pidfile", str(self.pidfile),
        ]

    def start(self) -> None:
        """Boot the guest (returns immediately; see wait_ready / wait)."""
        if self._qemu is not None:
            raise HarnessError("guest already started")
        self._t_start = time.monotonic()
        self._qemu = subprocess.Popen(
            ["ip", "netns", "exec", self.ns] + self.qemu_argv(),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        self._reader = threading.Thread(target=self._read_console, daemon=True)
        self._reader.start()

    def _read_console(self) -> None:
        assert self._qemu is not None and self._qemu.stdout is not None
        logf = open(self.console_log, "w", errors="replace") if self.console_log else None
        try:
            for raw in self._qemu.stdout:
                line = raw.decode("utf-8", "replace").replace("\r", "")
                self._lines.append(line)
                if logf:
                    logf.write(line)
                    logf.flush()
                if self.echo:
                    sys.stdout.write("[guest] " + line)
                    sys.stdout.flush()
                if READY_MARK in line and not self._ready.is_set():
                    self._t_ready = time.monotonic()
                    self._ready.set()
        finally:
            if logf:
                logf.close()

    def console(self) -> str:
        """Console text collected so far."""
        return "".join(self._lines)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until /init has loaded siw and addressed eth0 (marker XWARP-GUEST-READY)."""
        return self._ready.wait(self.timeout if timeout is None else timeout)

    def wait(self) -> GuestResult:
        """Wait (bounded by `timeout` from start) for the guest to power off; always returns."""
        if self._qemu is None or self._t_start is None:
            raise HarnessError("guest not started")
        remaining = self.timeout - (time.monotonic() - self._t_start)
        timed_out = False
        try:
            self._qemu.wait(max(remaining, 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
            self._kill_qemu()
        if self._reader:
            self._reader.join(5)
        total = time.monotonic() - self._t_start
        text = self.console()
        m = EXIT_RE.search(text)
        sf = SETUP_FAIL_RE.search(text)
        return GuestResult(
            rc=int(m.group(1)) if m else None,
            timed_out=timed_out,
            setup_failed=sf.group(1).strip() if sf else None,
            console=text,
            boot_s=(self._t_ready - self._t_start) if self._t_ready else None,
            total_s=total,
        )

    def signal_done(self, timeout: float = 10.0) -> bool:
        """Connect to GUEST_IP:DONE_PORT from the namespace (a guest `nc -l -p 7999` returns)."""
        code = ("import socket,sys,time\n"
                f"d=time.monotonic()+{timeout}\n"
                "while time.monotonic()<d:\n"
                "  try:\n"
                f"    s=socket.create_connection(('{GUEST_IP}',{DONE_PORT}),timeout=2);s.close();sys.exit(0)\n"
                "  except OSError: time.sleep(0.3)\n"
                "sys.exit(1)\n")
        p = subprocess.run(self.netns_argv([sys.executable, "-c", code]),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return p.returncode == 0

    # ------------------------------------------------------------------ teardown
    def _kill_qemu(self) -> None:
        pid = None
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            pass
        if pid:
            for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
                t = time.monotonic() + wait_s
                while time.monotonic() < t:
                    try:
                        os.kill(pid, 0)
                    except ProcessLookupError:
                        break
                    if self._qemu is not None:
                        self._qemu.poll()  # reap if it is our child
                    time.sleep(0.05)
        if self._qemu is not None:
            _terminate(self._qemu)

    def close(self) -> None:
        """Kill qemu, peers and tcpdump; delete tap and namespace. Idempotent."""
        try:
            if self._qemu is not None:
                self._kill_qemu()
            for p in self._peers:
                _terminate(p)
            if self._tcpdump is not None:
                _terminate(self._tcpdump, grace=5.0)  # SIGTERM flushes the pcap
                self._tcpdump = None
            if self.engine and self.pcap:
                self._merge_engine_pcaps()
        finally:
            if self._ns_created:
                # anything still inside the namespace is ours: kill it before deleting
                pids = _run(["ip", "netns", "pids", self.ns], check=False, quiet=True).stdout.split()
                for q in pids:
                    try:
                        os.kill(int(q), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                _run(["ip", "-n", self.ns, "link", "del", TAP], check=False, quiet=True)
                _run(["ip", "netns", "del", self.ns], check=False)
                self._ns_created = False
            self._tmp.cleanup()


def _install_signal_handlers() -> None:
    """Turn SIGTERM/SIGHUP into SystemExit so `with Guest(...)` cleanup always runs."""

    def handler(signum, _frame):
        raise SystemExit(128 + signum)

    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--siw", choices=["default", "crc"], default="default",
                    help="siw.ko variant: upstream defaults, or mpa_crc_required=true")
    ap.add_argument("--timeout", type=float, default=150.0, help="bound for the whole run (s)")
    ap.add_argument("--pcap", help="capture tap0 into this pcap")
    ap.add_argument("--console-log", help="write the guest console to this file")
    ap.add_argument("--host-cmd", help="shell command run in the namespace before the guest boots")
    ap.add_argument("--quiet", action="store_true", help="do not echo the guest console")
    ap.add_argument("--no-offload", action="store_true",
                    help="virtio-net without checksum/TSO offload (full checksums on the tap)")
    ap.add_argument("--cleanup", action="store_true", help="remove stale namespaces and exit")
    ap.add_argument("guest_cmd", nargs=argparse.REMAINDER, help="command for the guest (after --)")
    a = ap.parse_args()
    _install_signal_handlers()
    if a.cleanup:
        for n in cleanup_stale():
            print(f"[vm] removed stale namespace {n}")
        return 0
    cmd = a.guest_cmd[1:] if a.guest_cmd[:1] == ["--"] else a.guest_cmd
    if not cmd:
        ap.error("no guest command")
    problem = capability_problem()
    if problem:
        print(f"[vm] SKIPPED: {problem}")
        return 0
    with Guest(" ".join(cmd), siw=a.siw, timeout=a.timeout, pcap=a.pcap,
               console_log=a.console_log, echo=not a.quiet, offload=not a.no_offload) as g:
        host = None
        if a.host_cmd:
            host = g.netns_popen(["sh", "-c", a.host_cmd])
        g.start()
        res = g.wait()
        if host is not None:
            try:
                host.wait(10)
            except subprocess.TimeoutExpired:
                pass
    boot = f"{res.boot_s:.1f}" if res.boot_s is not None else "-"
    print(f"[vm] guest rc={res.rc} timed_out={res.timed_out} setup_failed={res.setup_failed} "
          f"boot={boot}s total={res.total_s:.1f}s")
    if host is not None:
        print(f"[vm] host-cmd rc={host.returncode}")
    if res.rc is None:
        return 124 if res.timed_out else 125
    return res.rc


if __name__ == "__main__":
    sys.exit(main())
