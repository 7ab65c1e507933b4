//! Test networks: network namespaces joined by veth pairs, removed on drop (root).
//!
//! [`VethPair::new`] creates two namespaces `A` and `B` joined by `veth-a` (in A) and
//! `veth-b` (in B), with kernel addresses `10.88.<net>.1/24` in A and `.2/24` in B. Names carry
//! the process id and a counter so parallel tests never collide. Everything is removed on
//! drop, also when a test panics (namespace deletion takes the veth pair with it).
//!
//! Code runs inside a namespace with [`NetNs::run`] (a dedicated thread calls `setns`, so the
//! caller's thread never changes namespace) or as a process with [`NetNs::command`].
//!
//! Checksums: a veth peer hands its frames over with a partial L4 checksum; use
//! [`set_tx_checksum_offload`] (the `ethtool -K <dev> tx off` ioctl) inside the peer's
//! namespace if the receiver needs complete TCP/UDP checksums.

use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Held while [`NetNs::new`] creates a namespace (see [`hold_creation`]).
static CREATING: Mutex<()> = Mutex::new(());

/// The prefix of the names of every namespace process `pid` creates (`xw<pid>-`).
pub fn name_prefix(pid: u32) -> String {
    format!("xw{pid}-")
}

/// Wait until no namespace of this process is being created, and keep any other from
/// being created while the guard lives ([`NetNs::new`] blocks): a teardown that then lists
/// the namespaces named [`name_prefix`] sees every one this process made.
pub fn hold_creation() -> MutexGuard<'static, ()> {
    CREATING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Run `ip` with `args`; an error carries its stderr.
pub fn ip(args: &[&str]) -> io::Result<String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("running ip {}: {e}", args.join(" "))))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A named network namespace (`/run/netns/<name>`), deleted on drop.
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Create a namespace named `xw<pid>-<counter><tag>` with its loopback up.
    pub fn new(tag: &str) -> io::Result<Self> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}{}{}", name_prefix(std::process::id()), n, tag);
        let creating = hold_creation();
        ip(&["netns", "add", &name])?;
        drop(creating);
        let ns = NetNs { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Run `ip -n <name> args...`.
    pub fn ip(&self, args: &[&str]) -> io::Result<String> {
        let mut v = vec!["-n", self.name.as_str()];
        v.extend_from_slice(args);
        ip(&v)
    }

    fn open(&self) -> io::Result<File> {
        File::open(format!("/run/netns/{}", self.name))
    }

    /// Run `f` on a dedicated thread that has entered this namespace, and return its result.
    /// A panic in `f` is propagated to the caller.
    pub fn run<R: Send, F: FnOnce() -> R + Send>(&self, f: F) -> io::Result<R> {
        let file = self.open()?;
        std::thread::scope(|s| {
            let h = s.spawn(move || {
                // SAFETY: `file` is an open namespace file; setns only changes this thread.
                let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                if r < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(f())
            });
            match h.join() {
                Ok(r) => r,
                Err(p) => std::panic::resume_unwind(p),
            }
        })
    }

    /// A command that runs inside this namespace.
    pub fn command(&self, program: &str) -> io::Result<Command> {
        let file = self.open()?;
        let mut cmd = Command::new(program);
        // SAFETY: the hook only calls setns(2) (async-signal-safe) on an fd that stays open
        // because the closure owns `file`.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(cmd)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Two namespaces joined by a veth pair with IPv4 addresses.
#[derive(Debug)]
pub struct VethPair {
    /// Side A (where an engine usually binds AF_XDP to `veth-a`).
    pub a: NetNs,
    /// Side B (kernel peers).
    pub b: NetNs,
    /// Interface name in A.
    pub if_a: String,
    /// Interface name in B.
    pub if_b: String,
    /// Kernel address of A (`10.88.<net>.1`).
    pub addr_a: Ipv4Addr,
    /// Kernel address of B (`10.88.<net>.2`).
    pub addr_b: Ipv4Addr,
    /// Prefix length of both addresses (24).
    pub prefix: u8,
}

impl VethPair {
    /// Create namespaces A and B, a veth pair between them with one queue each, addresses
    /// `10.88.<net>.1/24` (A) and `.2/24` (B), both up. `net` picks the /24, so a test can
    /// tell its addresses apart in captures; namespaces isolate them anyway.
    pub fn new(net: u8) -> io::Result<Self> {
        Self::with_queues(net, 1)
    }

    /// [`VethPair::new`] with `queues` TX and RX queues on each end (multi-queue tests).
    pub fn with_queues(net: u8, queues: u32) -> io::Result<Self> {
        let q = queues.max(1).to_string();
        let a = NetNs::new("a")?;
        let b = NetNs::new("b")?;
        let if_a = "veth-a".to_string();
        let if_b = "veth-b".to_string();
        a.ip(&[
            "link",
            "add",
            &if_a,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "type",
            "veth",
            "peer",
            "name",
            &if_b,
            "netns",
            b.name(),
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
        ])?;
        let addr_a = Ipv4Addr::new(10, 88, net, 1);
        let addr_b = Ipv4Addr::new(10, 88, net, 2);
        a.ip(&["addr", "add", &format!("{addr_a}/24"), "dev", &if_a])?;
        b.ip(&["addr", "add", &format!("{addr_b}/24"), "dev", &if_b])?;
        a.ip(&["link", "set", &if_a, "up"])?;
        b.ip(&["link", "set", &if_b, "up"])?;
        Ok(VethPair {
            a,
            b,
            if_a,
            if_b,
            addr_a,
            addr_b,
            prefix: 24,
        })
    }
}

#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// `SIOCETHTOOL` with an `ethtool_value` request on `ifname`; returns the value's data.
fn ethtool_value(ifname: &str, cmd: u32, data: u32) -> io::Result<u32> {
    let mut value = EthtoolValue { cmd, data };
    // SAFETY: all-zero is a valid ifreq.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if ifname.len() >= req.ifr_name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name too long: {ifname}"),
        ));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(ifname.bytes()) {
        *d = s as libc::c_char;
    }
    req.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
    // SAFETY: plain socket(2), closed below.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: valid fd; `req` points to `value`, which lives across the call.
    let r = unsafe { libc::ioctl(s, libc::SIOCETHTOOL as _, &mut req) };
    let err = io::Error::last_os_error();
    // SAFETY: our fd.
    unsafe { libc::close(s) };
    if r < 0 {
        return Err(io::Error::new(
            err.kind(),
            format!("SIOCETHTOOL command {cmd:#x} on {ifname}: {err}"),
        ));
    }
    Ok(value.data)
}

/// Whether TX checksum offload of `ifname` is on (`ethtool -k <ifname>`, `tx-checksumming`),
/// in the calling thread's namespace.
pub fn tx_checksum_offload(ifname: &str) -> io::Result<bool> {
    const ETHTOOL_GTXCSUM: u32 = 0x16;
    ethtool_value(ifname, ETHTOOL_GTXCSUM, 0).map(|v| v != 0)
}

/// Turn TX checksum offload of `ifname` on or off (what `ethtool -K <ifname> tx on|off`
/// does), in the calling thread's namespace. Off makes the kernel fill complete L4
/// checksums in frames it sends over a veth.
pub fn set_tx_checksum_offload(ifname: &str, on: bool) -> io::Result<()> {
    const ETHTOOL_STXCSUM: u32 = 0x17;
    ethtool_value(ifname, ETHTOOL_STXCSUM, u32::from(on)).map(|_| ())
}
