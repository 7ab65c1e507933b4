//! The xwarp device objects: one [`XwDevice`] per interface, created by the first
//! `ibv_get_device_list` that finds the interface and kept for the life of the process
//! (as libibverbs keeps its devices while contexts may point at them), and the
//! [`XwContext`] `ibv_open_device` hands out. Opening is cheap: no engine is started for
//! discovery.

use core::ffi::{c_char, c_int, c_void};
use core::mem::offset_of;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::abi::*;
use crate::config::DeviceConfig;
use crate::netdev::{self, IfaceFacts};

/// The name of the device for interface `iface`: `xwarp_<iface>` (e.g. `xwarp_veth0`).
pub fn device_name(iface: &str) -> String {
    format!("xwarp_{iface}")
}

/// The `ibdev_path` of a device named `name`. Nothing exists there: `ibv_read_sysfs_file`
/// answers for it itself.
pub fn ibdev_path(name: &str) -> String {
    format!("/sys/class/infiniband/{name}")
}

const DEVICE_MAGIC: u64 = u64::from_be_bytes(*b"xwarpdev");
const CONTEXT_MAGIC: u64 = u64::from_be_bytes(*b"xwarpctx");

/// The addresses of the open contexts' `ibv_context`s, so a pointer is checked before it
/// is dereferenced.
static OPEN: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// A device: the `ibv_device` programs read, followed by the NULL driver-ops pointer of
/// rdma-core's `verbs_device` (see `README.md`, Allocation), then xwarp's own fields.
#[repr(C)]
pub struct XwDevice {
    /// What the program sees.
    pub dev: ibv_device,
    /// `verbs_device.ops` (NULL: no provider library takes the device for its own).
    pub _verbs_device_ops: *const c_void,
    magic: u64,
    /// The interface name.
    pub iface: String,
    /// The MAC the GUID and GID were made of (fixed when the device was created).
    pub mac: [u8; 6],
}

// SAFETY: after creation a device is only read; the raw pointer is always NULL.
unsafe impl Sync for XwDevice {}
// SAFETY: as above.
unsafe impl Send for XwDevice {}

fn copy_cstr(dst: &mut [c_char], s: &str) {
    let room = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().take(room).zip(s.bytes()) {
        *d = b as c_char;
    }
}

impl XwDevice {
    fn new(iface: &str, facts: &IfaceFacts) -> XwDevice {
        let name = device_name(iface);
        // SAFETY: ibv_device is integers, char arrays and nullable fn pointers: zero is valid.
        let mut dev: ibv_device = unsafe { core::mem::zeroed() };
        dev.node_type = IBV_NODE_RNIC;
        dev.transport_type = IBV_TRANSPORT_IWARP;
        copy_cstr(&mut dev.name, &name);
        copy_cstr(&mut dev.dev_name, &format!("uverbs_{name}"));
        copy_cstr(
            &mut dev.dev_path,
            &format!("/sys/class/infiniband_verbs/uverbs_{name}"),
        );
        copy_cstr(&mut dev.ibdev_path, &ibdev_path(&name));
        XwDevice {
            dev,
            _verbs_device_ops: core::ptr::null(),
            magic: DEVICE_MAGIC,
            iface: iface.to_string(),
            mac: mac_or_random(facts.mac),
        }
    }

    /// The device behind a pointer a program passed, if it is one of ours.
    ///
    /// # Safety
    /// `p` is NULL or points to at least an `ibv_device` (what a program may pass).
    pub unsafe fn from_ptr<'a>(p: *const ibv_device) -> Option<&'a XwDevice> {
        let reg = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
        reg.iter()
            .find(|d| core::ptr::eq(&d.dev, p))
            .filter(|d| d.magic == DEVICE_MAGIC)
            .map(|d| &**d)
    }

    /// The device's name.
    pub fn name(&self) -> String {
        device_name(&self.iface)
    }

    /// The interface's current facts (link state and MTU are read afresh).
    pub fn facts(&self) -> std::io::Result<IfaceFacts> {
        netdev::query(&self.iface)
    }
}

/// siw's rule for an interface without a hardware address: a random locally administered
/// unicast MAC.
fn mac_or_random(mac: [u8; 6]) -> [u8; 6] {
    if mac != [0; 6] {
        return mac;
    }
    let mut m = [0u8; 6];
    // SAFETY: `m` is writable for its length.
    let n = unsafe { libc::getrandom(m.as_mut_ptr().cast(), m.len(), 0) };
    if n != m.len() as isize {
        m = [0, 0, 0, 0, 0, 1];
    }
    m[0] = (m[0] & !0x01) | 0x02;
    m
}

/// Every device created so far (leaked: they live as long as the process).
static DEVICES: Mutex<Vec<&'static XwDevice>> = Mutex::new(Vec::new());

/// The devices `cfg` describes (one, for `cfg.iface`), or why there are none.
pub fn discover(cfg: &DeviceConfig) -> Result<Vec<&'static XwDevice>, String> {
    let facts = netdev::query(&cfg.iface).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            format!(
                "XWARP_IFACE={:?}: no such interface in this network namespace",
                cfg.iface
            )
        } else {
            format!("XWARP_IFACE={:?}: {e}", cfg.iface)
        }
    })?;
    let mut reg = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = reg.iter().find(|d| d.iface == cfg.iface) {
        return Ok(vec![*d]);
    }
    let d: &'static XwDevice = Box::leak(Box::new(XwDevice::new(&cfg.iface, &facts)));
    reg.push(d);
    Ok(vec![d])
}

/// The device whose `ibdev_path` (or `dev_path`) is `dir`, if any.
pub fn by_sysfs_dir(dir: &[u8]) -> Option<&'static XwDevice> {
    let reg = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    let path = |p: &[c_char]| -> Vec<u8> {
        p.iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect()
    };
    let dir = dir.strip_suffix(b"/").unwrap_or(dir);
    reg.iter()
        .find(|d| path(&d.dev.ibdev_path) == dir || path(&d.dev.dev_path) == dir)
        .copied()
}

/// An open device: a whole `verbs_context` (the program gets `&vctx.context`), then
/// xwarp's fields.
///
/// Its `ibv_context_ops` table points at the library's `poll_cq`, `req_notify_cq`,
/// `post_send`, `post_recv` and `post_srq_recv` (what the header-inline calls jump
/// through); the memory-window slots stay NULL (the inline `ibv_alloc_mw` then fails with
/// `EOPNOTSUPP`). For ibv-cm: [`XwContext::from_raw`] turns the program's `ibv_context`
/// pointer into this object, [`XwContext::verbs`] gives the engine's device (starting the
/// engine on first use), [`XwContext::post_async_event`] queues an async event
/// (`ibv_get_async_event`).
#[repr(C)]
pub struct XwContext {
    /// `verbs_context`, whose last field is the `ibv_context` handed out.
    pub vctx: verbs_context,
    magic: u64,
    /// The device it was opened from.
    pub device: &'static XwDevice,
    /// The engine MTU the port reports as its active MTU's bound.
    pub engine_mtu: usize,
    /// The engine's device, fixed on first need ([`XwContext::verbs`]).
    verbs: OnceLock<xwarp_verbs::Device>,
    /// Async events not yet taken by `ibv_get_async_event` (`async_fd`, a semaphore
    /// eventfd, counts them); shared with the port watcher.
    async_q: Arc<AsyncQueue>,
    /// Events handed out and not yet acknowledged.
    pub(crate) async_unacked: AtomicUsize,
    /// Live objects (PDs, CQs, channels, ...) made on this context.
    pub(crate) objects: AtomicUsize,
}

// SAFETY: the raw pointers inside the C structs are only addresses handed to the program;
// every Rust-side mutable field is behind a Mutex, an atomic or a OnceLock.
unsafe impl Sync for XwContext {}
// SAFETY: as above.
unsafe impl Send for XwContext {}

impl XwContext {
    /// Allocate a context for `device`; `query_port` fills the `verbs_context` slot the
    /// inline `ibv_query_port` calls. Returns the `ibv_context` to hand out.
    pub fn open(
        device: &'static XwDevice,
        engine_mtu: usize,
        query_port: query_port_fn,
    ) -> std::io::Result<*mut ibv_context> {
        // A semaphore eventfd, blocking as libibverbs' async fd is (a program may set
        // O_NONBLOCK on it): one count per queued async event.
        // SAFETY: eventfd(2) with valid flags.
        let async_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if async_fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: verbs_context is nullable fn pointers, raw pointers, integers and
        // pthread objects (initialised below): all-zero is a valid starting value.
        let mut vctx: verbs_context = unsafe { core::mem::zeroed() };
        vctx.query_port = Some(query_port);
        vctx.context.ops = crate::ops::table();
        vctx.sz = core::mem::size_of::<verbs_context>();
        vctx.context.device = (&device.dev as *const ibv_device).cast_mut();
        vctx.context.cmd_fd = -1;
        vctx.context.async_fd = async_fd;
        vctx.context.num_comp_vectors = 1;
        vctx.context.abi_compat = VERBS_ABI_IS_EXTENDED;
        let ctx = Box::into_raw(Box::new(XwContext {
            vctx,
            magic: CONTEXT_MAGIC,
            device,
            engine_mtu,
            verbs: OnceLock::new(),
            async_q: Arc::new(AsyncQueue {
                events: Mutex::new(VecDeque::new()),
                fd: async_fd,
            }),
            async_unacked: AtomicUsize::new(0),
            objects: AtomicUsize::new(0),
        }));
        // SAFETY: `ctx` is a live allocation; the mutex is initialised in place, once.
        let handed_out = unsafe {
            libc::pthread_mutex_init(&mut (*ctx).vctx.context.mutex, core::ptr::null());
            &mut (*ctx).vctx.context as *mut ibv_context
        };
        OPEN.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(handed_out as usize);
        // SAFETY: `ctx` is live (just made, registered above).
        let c = unsafe { &*ctx };
        port_watch_register(c);
        Ok(handed_out)
    }

    /// The context behind an `ibv_context` pointer, shared (the form the object modules
    /// and ibv-cm use; every mutable part is synchronised). `None` for NULL, a closed
    /// context or a pointer that is not ours.
    pub fn from_raw(p: *mut ibv_context) -> Option<&'static XwContext> {
        if p.is_null()
            || !OPEN
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&(p as usize))
        {
            return None;
        }
        let base = p
            .cast::<u8>()
            .wrapping_sub(offset_of!(XwContext, vctx) + offset_of!(verbs_context, context))
            .cast::<XwContext>();
        // SAFETY: `p` is in OPEN, so it is the `context` field of a live XwContext, which
        // lives until `close` (and is never freed while objects of it exist).
        let ctx = unsafe { &*base };
        (ctx.magic == CONTEXT_MAGIC).then_some(ctx)
    }

    /// The `ibv_context` pointer the program holds.
    pub fn raw(&self) -> *mut ibv_context {
        (&self.vctx.context as *const ibv_context).cast_mut()
    }

    /// The engine's verbs device, starting the process's engine on first need
    /// ([`crate::engine::engine`]); the errno when it cannot start.
    pub fn verbs(&self) -> Result<&xwarp_verbs::Device, c_int> {
        if let Some(d) = self.verbs.get() {
            return Ok(d);
        }
        let e = crate::engine::engine()?;
        Ok(self.verbs.get_or_init(|| e.device().clone()))
    }

    /// Use `device` for this context's objects instead of the process's engine (tests:
    /// two contexts on two engines of a virtual wire). `false` if it already had one.
    pub fn set_verbs(&self, device: xwarp_verbs::Device) -> bool {
        self.verbs.set(device).is_ok()
    }

    /// Queue an async event for `ibv_get_async_event` (the context's `async_fd` becomes
    /// readable).
    pub fn post_async_event(&self, ev: ibv_async_event) {
        self.async_q.post(ev);
    }

    /// Take the oldest queued async event and its count on `async_fd` without blocking;
    /// `seen` runs on it while the queue is locked (so an object's destroy, which drops
    /// the queued events naming it under the same lock, sees it either still queued or
    /// already counted as handed out).
    pub(crate) fn take_async_event(
        &self,
        seen: impl FnOnce(&ibv_async_event),
    ) -> Option<ibv_async_event> {
        let mut q = self
            .async_q
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let ev = q.pop_front()?;
        self.async_q.consume_one();
        seen(&ev);
        Some(ev)
    }

    /// Drop the queued (not yet handed out) async events for which `f` is true, as the
    /// kernel drops the unread events of an object being destroyed; how many.
    pub(crate) fn drop_async_events(&self, mut f: impl FnMut(&ibv_async_event) -> bool) -> usize {
        let mut q = self
            .async_q
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let before = q.len();
        q.retain(|ev| !f(ev));
        let n = before - q.len();
        for _ in 0..n {
            self.async_q.consume_one();
        }
        n
    }

    /// Close the context behind `p` (`ibv_close_device`): `false` if `p` is not an open
    /// context of ours. While objects made on it are still alive (a program that closes
    /// the device first), the memory stays allocated (they hold `&'static` references to
    /// it) and only the context's registration ends. Never makes a `&mut XwContext`:
    /// objects and other threads may hold shared references, so the allocation is only
    /// ever freed through the raw pointer.
    ///
    /// # Safety
    /// The program gives `p` up with this call (it is not used afterwards).
    pub unsafe fn close(p: *mut ibv_context) -> bool {
        {
            let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
            let before = open.len();
            open.retain(|&q| q != p as usize);
            if open.len() == before {
                return false;
            }
        }
        let base = p
            .cast::<u8>()
            .wrapping_sub(offset_of!(XwContext, vctx) + offset_of!(verbs_context, context))
            .cast::<XwContext>();
        // SAFETY: `p` was in OPEN, so `base` is a live XwContext; shared access only.
        let ctx = unsafe { &*base };
        if ctx.magic != CONTEXT_MAGIC {
            return false;
        }
        port_watch_release(ctx);
        if ctx.objects.load(Ordering::SeqCst) > 0 {
            return true;
        }
        // SAFETY: the fd and mutex were made by `open`; the Box is the one `open` leaked,
        // out of OPEN (no new reference can be made) and with no object left on it.
        unsafe {
            libc::close((*base).vctx.context.async_fd);
            libc::pthread_mutex_destroy(core::ptr::addr_of_mut!((*base).vctx.context.mutex));
            drop(Box::from_raw(base));
        }
        true
    }
}

/// A context's async event queue and the eventfd counting it (`ibv_context.async_fd`,
/// closed by `XwContext::close` after the port watcher stopped).
struct AsyncQueue {
    events: Mutex<VecDeque<ibv_async_event>>,
    fd: c_int,
}

// SAFETY: the events hold addresses only (handed back to the program); the queue is
// behind a Mutex and the fd is a plain integer.
unsafe impl Send for AsyncQueue {}
// SAFETY: as above.
unsafe impl Sync for AsyncQueue {}

impl AsyncQueue {
    /// Queue `ev` and count it on the eventfd, both under the queue's lock (so the count
    /// never runs behind the queue: a taker that found an event never blocks on the fd).
    fn post(&self, ev: ibv_async_event) {
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(ev);
        let one = 1u64;
        // SAFETY: writing 8 bytes from a live u64 to our eventfd (open while the context
        // is: the watcher is joined before it is closed).
        unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
    }

    /// Take one count off the eventfd for an event leaving the queue (called with the
    /// queue locked). Never blocks: the fd is read only when `poll` says it has a count
    /// (a program that read the fd itself took it already).
    fn consume_one(&self) {
        let mut p = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on the stack, timeout 0.
        if unsafe { libc::poll(&mut p, 1, 0) } == 1 && p.revents & libc::POLLIN != 0 {
            let mut n = 0u64;
            // SAFETY: 8 bytes into a live u64 from our semaphore eventfd, which holds a
            // count (so the read takes one and does not block).
            unsafe { libc::read(self.fd, (&mut n as *mut u64).cast(), 8) };
        }
    }
}

/// How often the port watcher reads the link state when it cannot subscribe to the
/// kernel's link notifications (no rtnetlink socket): a fallback only.
pub const PORT_POLL: Duration = Duration::from_millis(250);

/// The process's one port watcher: every open context's async queue and its device, and
/// the thread serving them all.
///
/// The thread sleeps in `poll` on an rtnetlink socket subscribed to `RTMGRP_LINK` (the
/// kernel's link notifications, in the network namespace of the thread that opened the
/// first context) and on a stop eventfd; on any link notification it reads the link
/// state of each context's interface afresh and queues `IBV_EVENT_PORT_ERR` when port 1
/// went down and `IBV_EVENT_PORT_ACTIVE` when it came back, as the kernel does for an
/// RNIC. It is started by the first `ibv_open_device` and stopped (and joined) when the
/// last context closes, so a process with no open context has no thread of ours.
struct PortWatcher {
    /// (context address, its queue, its device, link up as last seen).
    contexts: Vec<(usize, Arc<AsyncQueue>, &'static XwDevice, bool)>,
    thread: Option<WatchThread>,
}

/// The running watcher thread.
struct WatchThread {
    handle: std::thread::JoinHandle<()>,
    /// Written to stop the thread.
    stop_fd: c_int,
    /// The process that started it (a forked child has no such thread).
    pid: libc::pid_t,
}

static WATCHER: Mutex<PortWatcher> = Mutex::new(PortWatcher {
    contexts: Vec::new(),
    thread: None,
});

/// Add a newly opened context to the port watcher, starting its thread if none runs in
/// this process.
fn port_watch_register(c: &XwContext) {
    let up = c.device.facts().map(|f| f.link_up).unwrap_or(false);
    let mut w = WATCHER.lock().unwrap_or_else(|e| e.into_inner());
    w.contexts.push((
        c as *const XwContext as usize,
        c.async_q.clone(),
        c.device,
        up,
    ));
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    if w.thread.as_ref().is_some_and(|t| t.pid != pid) {
        // Inherited through fork: the thread exists only in the parent.
        if let Some(t) = w.thread.take() {
            std::mem::forget(t.handle);
        }
    }
    if w.thread.is_none() {
        w.thread = start_watch_thread(pid);
    }
}

/// Remove a closing context from the port watcher (no event is queued for it after this
/// returns); the last one stops and joins the thread.
fn port_watch_release(c: &XwContext) {
    let t = {
        let mut w = WATCHER.lock().unwrap_or_else(|e| e.into_inner());
        w.contexts.retain(|e| e.0 != c as *const XwContext as usize);
        if w.contexts.is_empty() {
            w.thread.take()
        } else {
            None
        }
    };
    if let Some(t) = t {
        let one = 1u64;
        // SAFETY: 8 bytes from a live u64 to the thread's stop eventfd.
        unsafe { libc::write(t.stop_fd, (&one as *const u64).cast(), 8) };
        // SAFETY: getpid has no preconditions.
        if t.pid == unsafe { libc::getpid() } {
            let _ = t.handle.join();
        } else {
            std::mem::forget(t.handle);
        }
        // SAFETY: the stop fd is ours; the thread that polled it has ended.
        unsafe { libc::close(t.stop_fd) };
    }
}

/// An rtnetlink socket subscribed to link notifications, or -1.
fn link_notifications() -> c_int {
    // SAFETY: socket(2) with valid arguments.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return -1;
    }
    // SAFETY: sockaddr_nl is integers: zero is valid.
    let mut sa: libc::sockaddr_nl = unsafe { core::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as u16;
    sa.nl_groups = libc::RTMGRP_LINK as u32;
    // SAFETY: a live sockaddr_nl of the given size.
    let r = unsafe {
        libc::bind(
            fd,
            (&sa as *const libc::sockaddr_nl).cast(),
            core::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if r != 0 {
        // SAFETY: our socket.
        unsafe { libc::close(fd) };
        return -1;
    }
    fd
}

/// Start the watcher thread (see [`PortWatcher`]); `None` if it cannot start (then
/// there are no port events).
fn start_watch_thread(pid: libc::pid_t) -> Option<WatchThread> {
    // SAFETY: eventfd(2) with valid flags.
    let stop_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if stop_fd < 0 {
        return None;
    }
    // Made here, so it listens in the namespace of the thread opening the device.
    let nl = link_notifications();
    let handle = std::thread::Builder::new()
        .name("xwarp-ibv-port".into())
        .spawn(move || watch_loop(nl, stop_fd));
    match handle {
        Ok(handle) => Some(WatchThread {
            handle,
            stop_fd,
            pid,
        }),
        Err(_) => {
            // SAFETY: our fds, never handed to a thread.
            unsafe {
                libc::close(stop_fd);
                if nl >= 0 {
                    libc::close(nl);
                }
            }
            None
        }
    }
}

/// The watcher thread: wait for a link notification (or, without netlink, [`PORT_POLL`]),
/// then compare every context's link state with the last one seen.
fn watch_loop(nl: c_int, stop_fd: c_int) {
    let timeout = if nl >= 0 {
        -1
    } else {
        PORT_POLL.as_millis() as c_int
    };
    loop {
        let mut p = [
            libc::pollfd {
                fd: stop_fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: nl,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let n = if nl >= 0 { 2 } else { 1 };
        // SAFETY: `n` pollfds on the stack.
        let r = unsafe { libc::poll(p.as_mut_ptr(), n, timeout) };
        if r < 0 && crate::ffi::errno() != libc::EINTR {
            break;
        }
        if p[0].revents != 0 {
            break;
        }
        if nl >= 0 && p[1].revents != 0 {
            // Drain: the content does not matter, every context is re-read below.
            let mut buf = [0u8; 8192];
            // SAFETY: recv into a live buffer of its length, non-blocking socket.
            while unsafe { libc::recv(nl, buf.as_mut_ptr().cast(), buf.len(), 0) } > 0 {}
        }
        let mut w = WATCHER.lock().unwrap_or_else(|e| e.into_inner());
        for (_, q, dev, up) in w.contexts.iter_mut() {
            let now = dev.facts().map(|f| f.link_up).unwrap_or(false);
            if now != *up {
                *up = now;
                q.post(ibv_async_event {
                    element: ibv_async_event_element { port_num: 1 },
                    event_type: if now {
                        IBV_EVENT_PORT_ACTIVE
                    } else {
                        IBV_EVENT_PORT_ERR
                    },
                });
            }
        }
    }
    if nl >= 0 {
        // SAFETY: the thread's own socket.
        unsafe { libc::close(nl) };
    }
}
