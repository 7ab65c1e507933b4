//! `rdma_cm_id` objects and what the calls do to them. An id is a boxed [`CmId`] (the C
//! struct first, so the program's pointer is the object) plus an [`IdCore`] shared with the
//! events that name it and the [`pump`](super::pump) that watches its listener or QP. Every
//! pointer a program passes in is looked up in a registry of live objects before it is
//! used, so a stale or wild pointer is `EINVAL`, never a dereference.

use core::ffi::{c_int, c_void};
use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use xwarp_ddp::mpa::frame::IRD_ORD_MAX;
use xwarp_verbs::{ConnRequest, ConnectParams, ConnectTuning, Listener, QpModify};

use super::addr::{self, EngineAddr};
use super::channel::{Channel, EventRec};
use super::link;
use super::pump;
use super::state::{step, IdState, Op, Verdict};
use crate::abi::*;

/// How long an xwarp Initiator waits for the TCP handshake and the MPA Reply: siw's
/// `MPAREQ_TIMEOUT` (docs/siw.md §4.1); after it the id gets UNREACHABLE.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A millisecond setting from the environment variable `name` (`0..=max_ms`, read once per
/// variable by the caller's `OnceLock`); unset: zero; a bad value: one warning line and
/// zero (`crate::config::millis_from` parses it).
fn env_millis(name: &str, max_ms: u64) -> Duration {
    let get = |k: &str| std::env::var(k).ok();
    match crate::config::millis_from(get, name, max_ms) {
        Ok(d) => d.unwrap_or(Duration::ZERO),
        Err(why) => {
            crate::ffi::warn_line(&format!("{why}; using 0"));
            Duration::ZERO
        }
    }
}

/// How long an active id holds its first FPDU (the P2P RTR) back after the MPA Reply,
/// from `XWARP_FIRST_FPDU_DELAY_MS` (0..=10000, default 0). Toward a siw server set it
/// (100 ms, what xwarp's own rping uses): siw sends its Reply before its QP takes over the
/// socket, and an FPDU arriving in between stays unread (docs/siw.md §4.3, "Reply before
/// upcall"): a preloaded rping client stalled after connecting to siw in 4 of 4 runs
/// without it, and passed with 100 ms. It is not the default: it costs every connection
/// that delay. (The held RTR takes no send-queue slot of the program's: `xwarp_rdmap`
/// test `rfc6581_held_rtr_takes_no_application_send_queue_slot`.)
fn first_fpdu_delay() -> Duration {
    static D: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *D.get_or_init(|| env_millis("XWARP_FIRST_FPDU_DELAY_MS", 10_000))
}

/// How long `rdma_disconnect` waits before it closes, from `XWARP_DISCONNECT_DELAY_MS`
/// (0..=10000, default 0). Toward siw: siw completes a Send only after its TX path
/// returned, and a FIN that arrives right behind the Send's last byte makes that Send
/// complete with `IBV_WC_LOC_QP_OP_ERR` on siw's side (interop/README.md; a perftest
/// server on xwarp that disconnects at once after its final control exchange failed siw's
/// `ib_write_bw` client with `Bad wc status 2`). 500 ms is what xwarp's perftest peer
/// lingers.
fn disconnect_delay() -> Duration {
    static D: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *D.get_or_init(|| env_millis("XWARP_DISCONNECT_DELAY_MS", 10_000))
}

/// How long `rdma_connect` keeps trying a connection the peer refused (RST to the SYN:
/// nothing listens there yet), from `XWARP_CONNECT_RETRY_MS` (0..=600000, default 0: the
/// refusal is REJECTED at once, as on librdmacm). perftest starts its client right after
/// its server and expects it to listen already; toward a slow peer (siw in a VM) the
/// first SYN can come too early. The engine tries again every
/// `xwarp_verbs::CONNECT_RETRY_INTERVAL` (`ConnectTuning::retry_refused`); the program
/// sees one event, ESTABLISHED or the final REJECTED.
fn connect_retry() -> Duration {
    static D: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *D.get_or_init(|| env_millis("XWARP_CONNECT_RETRY_MS", 600_000))
}

/// The MPA CRC `rdma_connect` asks for, from `XWARP_MPA_CRC` (`1`: the Request's C bit set,
/// CRC32c on every FPDU when the peer agrees, as siw's Responder does; `0`: not asked;
/// `auto`/unset: the QP's own setting, C=0). Read once; a bad value: one warning line and
/// the default (`crate::config::mpa_crc_from` parses it). The passive side echoes what
/// the peer's Request asks, whatever this says.
fn mpa_crc() -> Option<bool> {
    static C: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *C.get_or_init(|| {
        crate::config::mpa_crc_from(|k| std::env::var(k).ok()).unwrap_or_else(|why| {
            crate::ffi::warn_line(&format!("{why}; using auto"));
            None
        })
    })
}

/// Default listen backlog for `rdma_listen(id, 0)` (the kernel iw_cm's `default_backlog`).
pub(crate) const DEFAULT_BACKLOG: usize = 256;

/// Mutable state of an id.
pub(crate) struct IdInner {
    /// The C struct (valid until `destroyed`).
    pub(crate) c: *mut rdma_cm_id,
    pub(crate) destroyed: bool,
    pub(crate) state: IdState,
    /// Where this id's events go (a private channel for synchronous ids).
    pub(crate) channel: *const Channel,
    /// Created without a channel (`rdma_create_ep`, or `rdma_create_id(NULL, ...)`): calls
    /// wait for their event and keep it in `id->event`.
    pub(crate) sync: bool,
    /// Events queued or handed out and not yet acknowledged.
    pub(crate) outstanding: usize,
    pub(crate) listener: Option<Listener>,
    pub(crate) request: Option<ConnRequest>,
    /// From the CONNECT_REQUEST: (our IRD, our ORD) an `rdma_accept(id, NULL)` uses.
    pub(crate) req_ird_ord: (u8, u8),
    /// The QP being watched for CM events, and the pump registration.
    pub(crate) watched_qp: *mut ibv_qp,
    pub(crate) token: Option<u64>,
    /// `rdma_create_ep(RAI_PASSIVE)` with QP attributes: `rdma_get_request` creates the
    /// new id's QP from them.
    pub(crate) ep_qp: Option<(ibv_qp_init_attr, *mut ibv_pd)>,
    /// `rdma_create_qp` made the CQs and completion channels (destroyed with the QP).
    pub(crate) owns_cqs: bool,
    /// The port reserved in [`PORTS`] by bind/resolve.
    pub(crate) port: Option<u16>,
    pub(crate) reuseaddr: bool,
}

// SAFETY: the raw pointers are the program's objects, reached only under the mutex.
unsafe impl Send for IdInner {}

/// The shared part of an id.
pub(crate) struct IdCore {
    inner: Mutex<IdInner>,
    acked: Condvar,
}

impl IdCore {
    fn new(inner: IdInner) -> Arc<IdCore> {
        Arc::new(IdCore {
            inner: Mutex::new(inner),
            acked: Condvar::new(),
        })
    }

    /// Lock the state (a poisoned lock is still usable: nothing panics while holding it
    /// half-way through a change).
    pub(crate) fn lock(&self) -> MutexGuard<'_, IdInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One event of this id acknowledged (or dropped unseen).
    pub(crate) fn acked(&self, n: usize) {
        let mut g = self.lock();
        g.outstanding = g.outstanding.saturating_sub(n);
        drop(g);
        self.acked.notify_all();
    }

    /// An id core for the channel's unit tests.
    #[cfg(test)]
    pub(crate) fn new_for_test() -> Arc<IdCore> {
        IdCore::new(IdInner::blank(
            core::ptr::null_mut(),
            core::ptr::null(),
            false,
        ))
    }
}

impl IdInner {
    fn blank(c: *mut rdma_cm_id, channel: *const Channel, sync: bool) -> IdInner {
        IdInner {
            c,
            destroyed: false,
            state: IdState::Idle,
            channel,
            sync,
            outstanding: 0,
            listener: None,
            request: None,
            req_ird_ord: (0, 0),
            watched_qp: core::ptr::null_mut(),
            token: None,
            ep_qp: None,
            owns_cqs: false,
            port: None,
            reuseaddr: false,
        }
    }

    /// Queue an event about this id on its channel (counted until acknowledged).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn emit(
        &mut self,
        me: &Arc<IdCore>,
        listen_id: *mut rdma_cm_id,
        event: rdma_cm_event_type,
        status: c_int,
        private_data: &[u8],
        rr: u8,
        id: u8,
    ) {
        self.outstanding += 1;
        let rec = EventRec::new(
            me.clone(),
            self.c,
            listen_id,
            event,
            status,
            private_data,
            rr,
            id,
        );
        // SAFETY: the channel outlives every id on it (destroying it is refused while ids
        // use it).
        unsafe { &*self.channel }.push(rec);
    }

    /// The C struct.
    pub(crate) fn cid(&mut self) -> &mut rdma_cm_id {
        // SAFETY: valid until destroyed; callers check `destroyed` first.
        unsafe { &mut *self.c }
    }
}

/// The C object: `struct rdma_cm_id` first.
#[repr(C)]
pub(crate) struct CmId {
    pub(crate) c: rdma_cm_id,
    core: Arc<IdCore>,
}

/// The live objects, by address.
struct Registry {
    ids: HashMap<usize, Arc<IdCore>>,
    channels: HashSet<usize>,
    /// Destroyed channels (see [`destroy_channel`]), with whether their fd was
    /// non-blocking; forgotten when the address becomes a channel again, all at once
    /// past [`TOMBSTONES_MAX`].
    destroyed: HashMap<usize, bool>,
    events: HashSet<usize>,
    ports: HashSet<u16>,
}

static REG: Mutex<Option<Registry>> = Mutex::new(None);

fn reg() -> MutexGuard<'static, Option<Registry>> {
    let mut g = REG.lock().unwrap_or_else(|p| p.into_inner());
    if g.is_none() {
        *g = Some(Registry {
            ids: HashMap::new(),
            channels: HashSet::new(),
            destroyed: HashMap::new(),
            events: HashSet::new(),
            ports: HashSet::new(),
        });
    }
    g
}

fn with_reg<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    f(reg().as_mut().expect("initialised by reg()"))
}

/// The core of a live id; `EINVAL` for anything else.
pub(crate) fn core_of(id: *mut rdma_cm_id) -> Result<Arc<IdCore>, c_int> {
    with_reg(|r| r.ids.get(&(id as usize)).cloned()).ok_or(libc::EINVAL)
}

/// The live channel at `ch`; `EINVAL` for anything else.
pub(crate) fn channel_of(ch: *mut rdma_event_channel) -> Result<&'static Channel, c_int> {
    if with_reg(|r| r.channels.contains(&(ch as usize))) {
        // SAFETY: registered channels are live boxes until destroyed (removed first).
        Ok(unsafe { &*ch.cast::<Channel>() })
    } else {
        Err(libc::EINVAL)
    }
}

/// Most destroyed channels remembered (a program creating and destroying channels at
/// ever new addresses does not grow the registry for good).
const TOMBSTONES_MAX: usize = 4096;

/// `Some(nonblocking)` if `ch` is a channel this process destroyed (and no channel since).
fn tombstone(ch: *mut rdma_event_channel) -> Option<bool> {
    with_reg(|r| r.destroyed.get(&(ch as usize)).copied())
}

/// `rdma_create_event_channel`.
pub(crate) fn create_channel() -> Result<*mut rdma_event_channel, c_int> {
    let ch = Channel::new().map_err(|e| e.raw_os_error().unwrap_or(libc::ENOMEM))?;
    let p = Box::into_raw(ch);
    with_reg(|r| {
        r.destroyed.remove(&(p as usize));
        r.channels.insert(p as usize)
    });
    Ok(p.cast())
}

/// `rdma_destroy_event_channel`: refused (the channel is kept, with a warning) while ids
/// still use it, since freeing it would leave them pointing at freed memory.
///
/// The address stays known as destroyed: `rdma_get_cm_event` on it then waits for good
/// (`EAGAIN` if the fd was non-blocking) instead of failing. In librdmacm that call reads
/// freed memory and a closed fd (`EBADF`), which rping up to rdma-core v57 runs into on
/// every clean exit its CM thread loses the race for: the main thread destroys the
/// channel after the last event (DISCONNECTED) while the CM thread, having handled it,
/// loops back into `rdma_get_cm_event`, fails, and calls `exit(-1)` (rdma-core fixed
/// rping itself, commit f3ae6534a "rping: terminate CM event thread before exiting").
/// Waiting is what such a thread would do had it entered the call a moment earlier
/// (blocked in read(2) when the fd was closed), and the process exits normally from
/// its main thread.
pub(crate) fn destroy_channel(ch: *mut rdma_event_channel) -> Result<(), c_int> {
    let c = channel_of(ch)?;
    let users = *c.users.lock().unwrap_or_else(|p| p.into_inner());
    if users > 0 {
        crate::ffi::warn_line(&format!(
            "rdma_destroy_event_channel: {users} rdma_cm_id(s) still use the \
             channel; destroy them first (the channel is kept)"
        ));
        return Err(libc::EBUSY);
    }
    // SAFETY: F_GETFL on the channel's own descriptor, still open.
    let fl = unsafe { libc::fcntl(c.c.fd, libc::F_GETFL) };
    let nonblocking = fl >= 0 && fl & libc::O_NONBLOCK != 0;
    with_reg(|r| {
        r.channels.remove(&(ch as usize));
        if r.destroyed.len() >= TOMBSTONES_MAX {
            r.destroyed.clear();
        }
        r.destroyed.insert(ch as usize, nonblocking);
    });
    if c.waiters.load(std::sync::atomic::Ordering::SeqCst) > 0 {
        // A thread is blocked in rdma_get_cm_event on this fd (rping's CM thread when main
        // tears down): as with librdmacm, whose read() then blocks for good, it keeps
        // waiting, so the fd stays open and the channel is kept (never signalled again).
        return Ok(());
    }
    // SAFETY: a registered channel box, now unreachable for new lookups.
    drop(unsafe { Box::from_raw(ch.cast::<Channel>()) });
    Ok(())
}

fn add_user(ch: *const Channel, n: isize) {
    // SAFETY: a live channel (ids hold their channel).
    let c = unsafe { &*ch };
    let mut u = c.users.lock().unwrap_or_else(|p| p.into_inner());
    *u = (*u as isize + n).max(0) as usize;
}

static WARNED_PS: std::sync::Once = std::sync::Once::new();

/// Allocate an id on `ch` (a private channel when `ch` is NULL: a synchronous id).
pub(crate) fn create_id(
    ch: *mut rdma_event_channel,
    context: *mut c_void,
    ps: rdma_port_space,
) -> Result<*mut rdma_cm_id, c_int> {
    if ps != RDMA_PS_TCP {
        if ps == RDMA_PS_UDP || ps == RDMA_PS_IB || ps == RDMA_PS_IPOIB {
            WARNED_PS.call_once(|| {
                crate::ffi::warn_line(&format!(
                    "rdma_create_id: port space {ps:#x} (UD) is not supported; \
                     xwarp does RDMA_PS_TCP (RC over iWARP) only"
                ))
            });
            return Err(libc::EOPNOTSUPP);
        }
        return Err(libc::EINVAL);
    }
    let (channel, sync) = if ch.is_null() {
        (create_channel()?, true)
    } else {
        (
            channel_of(ch)? as *const Channel as *mut rdma_event_channel,
            false,
        )
    };
    Ok(new_id(channel.cast(), sync, context))
}

fn new_id(channel: *const Channel, sync: bool, context: *mut c_void) -> *mut rdma_cm_id {
    // SAFETY: rdma_cm_id is plain data; all-zero is its initial state (NULL pointers).
    let mut c: rdma_cm_id = unsafe { core::mem::zeroed() };
    c.channel = channel.cast_mut().cast();
    c.context = context;
    c.ps = RDMA_PS_TCP;
    c.qp_type = IBV_QPT_RC;
    let core = IdCore::new(IdInner::blank(core::ptr::null_mut(), channel, sync));
    let b = Box::into_raw(Box::new(CmId {
        c,
        core: core.clone(),
    }));
    let p = b.cast::<rdma_cm_id>();
    core.lock().c = p;
    add_user(channel, 1);
    with_reg(|r| r.ids.insert(p as usize, core));
    p
}

/// Reserve `port` (0: an ephemeral one) for an id; `EADDRINUSE` if another id holds it
/// (unless this one set `RDMA_OPTION_ID_REUSEADDR`).
fn reserve_port(port: u16, reuse: bool) -> Result<u16, c_int> {
    with_reg(|r| {
        if port != 0 {
            if r.ports.contains(&port) && !reuse {
                return Err(libc::EADDRINUSE);
            }
            r.ports.insert(port);
            return Ok(port);
        }
        // The kernel's default ip_local_port_range; start somewhere the pid picks.
        let (lo, hi) = (32768u32, 60999u32);
        let span = hi - lo + 1;
        let start = (std::process::id().wrapping_mul(2654435761)) % span;
        for i in 0..span {
            let p = (lo + (start + i) % span) as u16;
            if r.ports.insert(p) {
                return Ok(p);
            }
        }
        Err(libc::EADDRNOTAVAIL)
    })
}

fn release_port(port: Option<u16>) {
    if let Some(p) = port {
        with_reg(|r| r.ports.remove(&p));
    }
}

fn live(g: &IdInner) -> Result<(), c_int> {
    if g.destroyed {
        Err(libc::EINVAL)
    } else {
        Ok(())
    }
}

/// Bind `g` to `src` (engine-owned or wildcard; port 0 = ephemeral), filling the route's
/// source address, `verbs` and `port_num` (a wildcard bind leaves `verbs` NULL, as
/// librdmacm does until an address picks the device).
fn bind_inner(g: &mut IdInner, src: SocketAddrV4, eng: &EngineAddr) -> Result<(), c_int> {
    if !eng.owns(*src.ip()) {
        return Err(libc::EADDRNOTAVAIL);
    }
    let port = reserve_port(src.port(), g.reuseaddr)?;
    release_port(g.port.replace(port));
    let ctx = if src.ip().is_unspecified() {
        core::ptr::null_mut()
    } else {
        link::context()?
    };
    let c = g.cid();
    addr::write_sockaddr(&mut c.route.addr.src, SocketAddrV4::new(*src.ip(), port));
    if !ctx.is_null() {
        c.verbs = ctx;
        c.port_num = 1;
    }
    Ok(())
}

fn go(state: IdState, op: Op) -> Result<Option<IdState>, c_int> {
    match step(state, op) {
        Verdict::Go(n) => Ok(Some(n)),
        Verdict::Noop => Ok(None),
        Verdict::Refuse(e) => Err(e),
    }
}

/// `rdma_bind_addr`.
///
/// # Safety
/// `sa` NULL or a readable socket address.
pub(crate) unsafe fn bind(id: *mut rdma_cm_id, sa: *const libc::sockaddr) -> Result<(), c_int> {
    let core = core_of(id)?;
    // SAFETY: per the contract.
    let src = unsafe { addr::read_sockaddr(sa) }?.ok_or(libc::EINVAL)?;
    let eng = link::engine_addr()?;
    let mut g = core.lock();
    live(&g)?;
    let next = go(g.state, Op::Bind)?.ok_or(libc::EINVAL)?;
    bind_inner(&mut g, src, &eng)?;
    g.state = next;
    Ok(())
}

/// `rdma_resolve_addr`: local (the engine owns its address): ADDR_RESOLVED for a
/// destination the engine reaches, else ADDR_ERROR with `-ENETUNREACH` (the kernel's
/// status when no route leads to the destination); the id stays bound after an error.
///
/// # Safety
/// `src`, `dst` NULL or readable socket addresses.
pub(crate) unsafe fn resolve_addr(
    id: *mut rdma_cm_id,
    src: *const libc::sockaddr,
    dst: *const libc::sockaddr,
) -> Result<(), c_int> {
    let core = core_of(id)?;
    // SAFETY: per the contract.
    let dst = unsafe { addr::read_sockaddr(dst) }?.ok_or(libc::EINVAL)?;
    // SAFETY: per the contract.
    let src = unsafe { addr::read_sockaddr(src) }?;
    let eng = link::engine_addr()?;
    let ctx = link::context()?;
    let sync;
    {
        let mut g = core.lock();
        live(&g)?;
        let next = go(g.state, Op::ResolveAddr)?.ok_or(libc::EINVAL)?;
        if g.state == IdState::Idle || src.is_some() {
            let s = src.unwrap_or(SocketAddrV4::new(eng.ip, 0));
            if g.state != IdState::Idle {
                // Already bound: the kernel takes a source only for an unbound id.
                return Err(libc::EINVAL);
            }
            bind_inner(&mut g, s, &eng)?;
        }
        let port = g.port.unwrap_or(0);
        let c = g.cid();
        // The engine's own address is the source even after a wildcard bind.
        addr::write_sockaddr(&mut c.route.addr.src, SocketAddrV4::new(eng.ip, port));
        addr::write_sockaddr(&mut c.route.addr.dst, dst);
        c.verbs = ctx;
        c.port_num = 1;
        if eng.reaches(*dst.ip()) {
            g.state = next;
            g.emit(
                &core,
                core::ptr::null_mut(),
                RDMA_CM_EVENT_ADDR_RESOLVED,
                0,
                &[],
                0,
                0,
            );
        } else {
            g.state = IdState::AddrBound;
            g.emit(
                &core,
                core::ptr::null_mut(),
                RDMA_CM_EVENT_ADDR_ERROR,
                -libc::ENETUNREACH,
                &[],
                0,
                0,
            );
        }
        sync = g.sync;
    }
    if sync {
        complete(&core)
    } else {
        Ok(())
    }
}

/// `rdma_resolve_route`: ROUTE_RESOLVED at once (iWARP has no path records: `num_paths`
/// stays 0, as the kernel's iWARP route resolution leaves it).
pub(crate) fn resolve_route(id: *mut rdma_cm_id) -> Result<(), c_int> {
    let core = core_of(id)?;
    let sync = {
        let mut g = core.lock();
        live(&g)?;
        let next = go(g.state, Op::ResolveRoute)?.ok_or(libc::EINVAL)?;
        g.state = next;
        g.emit(
            &core,
            core::ptr::null_mut(),
            RDMA_CM_EVENT_ROUTE_RESOLVED,
            0,
            &[],
            0,
            0,
        );
        g.sync
    };
    if sync {
        complete(&core)
    } else {
        Ok(())
    }
}

fn io_errno(e: &std::io::Error) -> c_int {
    if let Some(n) = e.raw_os_error() {
        return n;
    }
    use std::io::ErrorKind::*;
    match e.kind() {
        AddrInUse => libc::EADDRINUSE,
        AddrNotAvailable => libc::EADDRNOTAVAIL,
        InvalidInput => libc::EINVAL,
        ConnectionAborted => libc::ECONNABORTED,
        ConnectionRefused => libc::ECONNREFUSED,
        TimedOut => libc::ETIMEDOUT,
        NotFound => libc::ENOENT,
        _ => libc::EIO,
    }
}

/// `rdma_listen`: a listener on the engine at the bound port (an unbound id binds to the
/// wildcard address and an ephemeral port first); `backlog` ≤ 0 is the default.
pub(crate) fn listen(id: *mut rdma_cm_id, backlog: c_int) -> Result<(), c_int> {
    let core = core_of(id)?;
    let eng = link::engine_addr()?;
    let ctx = link::context()?;
    let dev = link::device(ctx)?;
    let mut g = core.lock();
    live(&g)?;
    let next = go(g.state, Op::Listen)?.ok_or(libc::EINVAL)?;
    if g.state == IdState::Idle {
        bind_inner(
            &mut g,
            SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0),
            &eng,
        )?;
    }
    let port = g.port.ok_or(libc::EINVAL)?;
    let backlog = if backlog <= 0 {
        DEFAULT_BACKLOG
    } else {
        backlog as usize
    };
    let l = dev
        .listen(SocketAddr::V4(SocketAddrV4::new(eng.ip, port)), backlog)
        .map_err(|e| io_errno(&e))?;
    let token = pump::watch_listener(&l, core.clone())?;
    g.listener = Some(l);
    g.token = Some(token);
    g.state = next;
    Ok(())
}

/// What the pump does with a connection request of a listening id: a new id on the
/// listener's channel (a private one for a synchronous listener), its route filled in,
/// holding the request, and a CONNECT_REQUEST with the Initiator's private data,
/// `responder_resources` = its ORD and `initiator_depth` = its IRD (docs/protocols.md
/// §5.1). An MPA v1 Request carries no IRD/ORD: 1 each, what rping asks for.
pub(crate) fn on_request(listen: &Arc<IdCore>, req: ConnRequest) {
    let g = listen.lock();
    if g.destroyed {
        return; // dropping the request rejects it
    }
    // SAFETY: not destroyed, so the C struct is live.
    let lc = unsafe { &*g.c };
    let (verbs, context, local) = (lc.verbs, lc.context, addr::stored(&lc.route.addr.src));
    let listen_ptr = g.c;
    let (channel, sync) = if g.sync {
        match create_channel() {
            Ok(ch) => (ch.cast::<Channel>().cast_const(), true),
            Err(_) => return,
        }
    } else {
        (g.channel, false)
    };
    let listen_channel = g.channel;
    drop(g);
    let child = new_id(channel, sync, context);
    let Ok(ccore) = core_of(child) else { return };
    let ird = req.peer_ord.map(|v| v.min(255) as u8).unwrap_or(1);
    let ord = req.peer_ird.map(|v| v.min(255) as u8).unwrap_or(1);
    if req.private_data.len() > 255 {
        crate::ffi::warn_line(&format!(
            "a connection request carried {} bytes of private data; \
             rdma_cm_event reports at most 255",
            req.private_data.len()
        ));
    }
    let pd = req.private_data.clone();
    let peer = match req.peer {
        SocketAddr::V4(a) => Some(a),
        SocketAddr::V6(_) => None,
    };
    let eng = link::engine_addr().ok();
    let mut g = ccore.lock();
    {
        let c = g.cid();
        c.verbs = if verbs.is_null() {
            link::context().unwrap_or(core::ptr::null_mut())
        } else {
            verbs
        };
        c.port_num = 1;
        if let (Some(l), Some(e)) = (local, eng) {
            addr::write_sockaddr(&mut c.route.addr.src, SocketAddrV4::new(e.ip, l.port()));
        }
        if let Some(p) = peer {
            addr::write_sockaddr(&mut c.route.addr.dst, p);
        }
    }
    g.state = IdState::ConnectRequest;
    g.request = Some(req);
    g.req_ird_ord = (ird, ord);
    // The event goes on the listener's channel even when the new id has its own.
    g.outstanding += 1;
    let rec = EventRec::new(
        ccore.clone(),
        child,
        listen_ptr,
        RDMA_CM_EVENT_CONNECT_REQUEST,
        0,
        &pd,
        ird,
        ord,
    );
    drop(g);
    // SAFETY: the listener's channel lives while the listener does (it is ours).
    unsafe { &*listen_channel }.push(rec);
}

/// The `rdma_conn_param` fields the CM uses.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnParam {
    pub(crate) private_data: Vec<u8>,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
}

impl ConnParam {
    /// Read the program's struct (NULL: `None`).
    ///
    /// # Safety
    /// `p` NULL or a readable `rdma_conn_param` whose `private_data` (if not NULL) has
    /// `private_data_len` readable bytes.
    pub(crate) unsafe fn read(p: *const rdma_conn_param) -> Option<ConnParam> {
        if p.is_null() {
            return None;
        }
        // SAFETY: per the contract.
        let c = unsafe { p.read_unaligned() };
        let private_data = if c.private_data.is_null() || c.private_data_len == 0 {
            Vec::new()
        } else {
            // SAFETY: per the contract.
            unsafe {
                core::slice::from_raw_parts(c.private_data.cast::<u8>(), c.private_data_len.into())
            }
            .to_vec()
        };
        Some(ConnParam {
            private_data,
            responder_resources: c.responder_resources,
            initiator_depth: c.initiator_depth,
        })
    }
}

/// `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH` (rdma_cma.h): "as much as the device
/// allows" in `rdma_conn_param.responder_resources` / `initiator_depth`.
const RDMA_MAX_RD_ATOM: u8 = 0xff;

/// librdmacm's `cma_dev->max_responder_resources` / `max_initiator_depth`: the device's
/// `max_qp_rd_atom` / `max_qp_init_rd_atom` cast to `uint8_t` (cma.c, `ucma_init_device`).
/// Ours are [`IRD_ORD_MAX`] (16383, attr.rs), so librdmacm would use their low byte, 255.
const CMA_DEV_MAX_RD_ATOM: u8 = (IRD_ORD_MAX & 0xff) as u8;

/// The (IRD, ORD) = (`responder_resources`, `initiator_depth`) `rdma_connect` puts on the
/// QP and in the MPA Request, as librdmacm's `rdma_connect` picks them: each field of
/// `p`, or the device maximum ([`CMA_DEV_MAX_RD_ATOM`]) for a NULL `conn_param` or a
/// field of [`RDMA_MAX_RD_ATOM`]. (Up to issue 12 the library kept the QP's own IRD/ORD
/// for NULL; siw's librdmacm asks its device maxima, 128/128, interop/README.md.)
fn connect_ird_ord(p: Option<&ConnParam>) -> (u8, u8) {
    let pick = |v: Option<u8>| match v {
        Some(v) if v != RDMA_MAX_RD_ATOM => v,
        _ => CMA_DEV_MAX_RD_ATOM,
    };
    (
        pick(p.map(|p| p.responder_resources)),
        pick(p.map(|p| p.initiator_depth)),
    )
}

/// The (IRD, ORD) `rdma_accept` puts on the QP and in the MPA Reply, as librdmacm's
/// `rdma_accept` picks them: each field of `p`, or for a NULL `conn_param` or a field of
/// [`RDMA_MAX_RD_ATOM`] the CONNECT_REQUEST's value (`req`: its `responder_resources` =
/// the Initiator's ORD, `initiator_depth` = its IRD) capped at the device maximum.
// The cap is librdmacm's rule; with our maximum of 255 it changes no `u8`, but it keeps
// the rule right should the device's maximum go down.
#[allow(clippy::unnecessary_min_or_max)]
fn accept_ird_ord(p: Option<&ConnParam>, req: (u8, u8)) -> (u8, u8) {
    let pick = |v: Option<u8>, r: u8| match v {
        Some(v) if v != RDMA_MAX_RD_ATOM => v,
        _ => r.min(CMA_DEV_MAX_RD_ATOM),
    };
    (
        pick(p.map(|p| p.responder_resources), req.0),
        pick(p.map(|p| p.initiator_depth), req.1),
    )
}

/// Set IRD/ORD on the QP before it connects or accepts.
fn set_ird_ord(qp: &xwarp_verbs::QueuePair, ird: u8, ord: u8) -> Result<(), c_int> {
    qp.modify(&QpModify {
        ird: Some(ird.into()),
        ord: Some(ord.into()),
        ..QpModify::default()
    })
    .map_err(|e| io_errno(&e))
}

/// `rdma_connect` (the retry counts and flow control are ignored, as siw ignores them).
/// A NULL `conn_param` (rdma_client) connects without private data and with IRD/ORD as
/// librdmacm picks them ([`connect_ird_ord`]: the device maxima in its `u8` fields).
pub(crate) fn connect(id: *mut rdma_cm_id, p: Option<ConnParam>) -> Result<(), c_int> {
    let core = core_of(id)?;
    let sync = {
        let mut g = core.lock();
        live(&g)?;
        let next = go(g.state, Op::Connect)?.ok_or(libc::EINVAL)?;
        let c = g.cid();
        let (qpp, dst) = (c.qp, addr::stored(&c.route.addr.dst));
        // SAFETY: the QP pointer of the id, looked up among the library's QPs.
        let qp = unsafe { link::qp_of(qpp) }.ok_or(libc::EINVAL)?;
        let dst = dst.ok_or(libc::EINVAL)?;
        let (ird, ord) = connect_ird_ord(p.as_ref());
        set_ird_ord(qp, ird, ord)?;
        if let Some(crc) = mpa_crc() {
            qp.modify(&QpModify {
                crc: Some(crc),
                ..QpModify::default()
            })
            .map_err(|e| io_errno(&e))?;
        }
        watch_qp(&mut g, &core, qpp, qp)?;
        let retry = connect_retry();
        qp.connect_tuned(
            SocketAddr::V4(dst),
            ConnectParams {
                private_data: p.map(|p| p.private_data).unwrap_or_default(),
                timeout: CONNECT_TIMEOUT,
            },
            ConnectTuning {
                first_fpdu_delay: first_fpdu_delay(),
                retry_refused: (!retry.is_zero()).then_some(retry),
                ..ConnectTuning::default()
            },
        )
        .map_err(|e| io_errno(&e))?;
        g.state = next;
        g.sync
    };
    if sync {
        complete(&core)
    } else {
        Ok(())
    }
}

fn watch_qp(
    g: &mut IdInner,
    core: &Arc<IdCore>,
    qpp: *mut ibv_qp,
    qp: &xwarp_verbs::QueuePair,
) -> Result<(), c_int> {
    if g.watched_qp == qpp && g.token.is_some() {
        return Ok(());
    }
    if let Some(t) = g.token.take() {
        pump::unwatch(t);
    }
    g.token = Some(pump::watch_qp(qp, core.clone())?);
    if let Ok(d) = link::context().and_then(link::device) {
        super::linger::note(&d);
    }
    g.watched_qp = qpp;
    Ok(())
}

/// `rdma_accept`: IRD/ORD from `p`, or for NULL (or `RDMA_MAX_*` fields) the
/// CONNECT_REQUEST's (so the server mirrors its client, docs/protocols.md §5.1), as
/// librdmacm does ([`accept_ird_ord`]); ESTABLISHED follows.
pub(crate) fn accept(id: *mut rdma_cm_id, p: Option<ConnParam>) -> Result<(), c_int> {
    let core = core_of(id)?;
    let sync = {
        let mut g = core.lock();
        live(&g)?;
        let next = go(g.state, Op::Accept)?.ok_or(libc::EINVAL)?;
        let qpp = g.cid().qp;
        // SAFETY: as in connect.
        let qp = unsafe { link::qp_of(qpp) }.ok_or(libc::EINVAL)?;
        let (ird, ord) = accept_ird_ord(p.as_ref(), g.req_ird_ord);
        let data = p.map(|p| p.private_data).unwrap_or_default();
        set_ird_ord(qp, ird, ord)?;
        watch_qp(&mut g, &core, qpp, qp)?;
        let req = g.request.take().ok_or(libc::EINVAL)?;
        if let Err(e) = req.accept(qp, &data) {
            g.state = IdState::Closed;
            return Err(io_errno(&e));
        }
        g.state = next;
        g.sync
    };
    if sync {
        complete(&core)
    } else {
        Ok(())
    }
}

/// `rdma_reject`: an MPA Reply with the Reject bit and the private data; the Initiator gets
/// REJECTED with it.
pub(crate) fn reject(id: *mut rdma_cm_id, data: &[u8]) -> Result<(), c_int> {
    let core = core_of(id)?;
    let mut g = core.lock();
    live(&g)?;
    let next = go(g.state, Op::Reject)?.ok_or(libc::EINVAL)?;
    let req = g.request.take().ok_or(libc::EINVAL)?;
    req.reject(data).map_err(|e| io_errno(&e))?;
    g.state = next;
    Ok(())
}

/// `rdma_disconnect`: a graceful close of the QP's connection; DISCONNECTED follows on both
/// sides. After the connection ended it is a no-op returning 0.
pub(crate) fn disconnect(id: *mut rdma_cm_id) -> Result<(), c_int> {
    let core = core_of(id)?;
    let delay = disconnect_delay();
    if !delay.is_zero() && core.lock().state == IdState::Connected {
        std::thread::sleep(delay);
    }
    let sync = {
        let mut g = core.lock();
        live(&g)?;
        let Some(next) = go(g.state, Op::Disconnect)? else {
            return Ok(());
        };
        let qpp = g.watched_qp;
        // SAFETY: the QP the id connected (watched since connect/accept).
        let qp = unsafe { link::qp_of(qpp) }.ok_or(libc::EINVAL)?;
        qp.disconnect().map_err(|e| io_errno(&e))?;
        g.state = next;
        g.sync
    };
    if sync {
        complete(&core)
    } else {
        Ok(())
    }
}

/// The wait of a synchronous call: the id's next event becomes `id->event` (the previous
/// one is acknowledged); a failed event is `-1` with `errno = -status`, as librdmacm's
/// `ucma_complete`.
fn complete(core: &Arc<IdCore>) -> Result<(), c_int> {
    let (ch, c) = {
        let g = core.lock();
        live(&g)?;
        (g.channel, g.c)
    };
    // SAFETY: a synchronous id's private channel lives as long as the id.
    let ch = unsafe { &*ch };
    // SAFETY: the id is live (the program is inside a call on it).
    let prev = unsafe { core::mem::replace(&mut (*c).event, core::ptr::null_mut()) };
    if !prev.is_null() {
        let _ = ack_event(prev);
    }
    let e = loop {
        match ch.pop_wait() {
            Ok(e) => break e,
            Err(libc::EINTR) => continue,
            Err(e) => return Err(e),
        }
    };
    let status = e.c.status;
    let p = hand_out(e);
    // SAFETY: as above.
    unsafe { (*c).event = p };
    if status != 0 {
        return Err(-status);
    }
    Ok(())
}

/// Give an event record to the program (registered so its ack can be checked).
pub(crate) fn hand_out(e: Box<EventRec>) -> *mut rdma_cm_event {
    let p = Box::into_raw(e);
    with_reg(|r| r.events.insert(p as usize));
    p.cast()
}

/// One attempt of `rdma_get_cm_event`: the next event, `None` when the program should wait
/// for the channel's fd, `EAGAIN` when nothing is queued and the fd is non-blocking.
///
/// `waited`: the caller blocked on the fd since its previous attempt (which counted it in
/// `waiters`, so that destroying the channel meanwhile keeps the fd open).
pub(crate) fn try_get_event(
    ch: *mut rdma_event_channel,
    waited: bool,
) -> Result<Option<*mut rdma_cm_event>, c_int> {
    use std::sync::atomic::Ordering::SeqCst;
    let c = match channel_of(ch) {
        Ok(c) => c,
        // Destroyed while this thread waited on it (`destroy_channel` then keeps the box
        // and never signals it again): librdmacm's read() blocks for good here, and so does
        // this caller (`Ok(None)`: it waits on no descriptor). Returning EINVAL instead let
        // rping's CM thread, woken by a signal still pending on the fd, exit(-1) while its
        // main thread was finishing cleanly.
        Err(_) if waited => return Ok(None),
        // Destroyed before this call (see `destroy_channel`): wait for good as well, or
        // `EAGAIN` for a non-blocking fd (no event will ever come).
        Err(e) => match tombstone(ch) {
            Some(false) => return Ok(None),
            Some(true) => return Err(libc::EAGAIN),
            None => return Err(e),
        },
    };
    if waited {
        c.waiters.fetch_sub(1, SeqCst);
    }
    if let Some(e) = c.try_pop() {
        return Ok(Some(hand_out(e)));
    }
    // SAFETY: F_GETFL on the channel's own descriptor.
    let fl = unsafe { libc::fcntl(c.c.fd, libc::F_GETFL) };
    if fl >= 0 && fl & libc::O_NONBLOCK != 0 {
        return Err(libc::EAGAIN);
    }
    c.waiters.fetch_add(1, SeqCst);
    Ok(None)
}

/// `rdma_ack_cm_event`: `EINVAL` for anything but an event handed out and not yet acked.
pub(crate) fn ack_event(e: *mut rdma_cm_event) -> Result<(), c_int> {
    if !with_reg(|r| r.events.remove(&(e as usize))) {
        return Err(libc::EINVAL);
    }
    // SAFETY: a registered record from hand_out, removed from the registry once.
    let rec = unsafe { Box::from_raw(e.cast::<EventRec>()) };
    rec.owner.acked(1);
    Ok(())
}

/// `rdma_get_request` on a synchronous listening id: the next CONNECT_REQUEST's new id
/// (holding the event in `id->event`), with its QP created when the listener came from
/// `rdma_create_ep` with QP attributes.
pub(crate) fn get_request(listen: *mut rdma_cm_id) -> Result<*mut rdma_cm_id, c_int> {
    let core = core_of(listen)?;
    let (ch, ep) = {
        let g = core.lock();
        live(&g)?;
        if !g.sync || g.state != IdState::Listening {
            return Err(libc::EINVAL);
        }
        // SAFETY: ibv_qp_init_attr is plain data (pointers and integers): a bitwise copy.
        let ep = g
            .ep_qp
            .as_ref()
            .map(|(a, pd)| (unsafe { core::ptr::read(a) }, *pd));
        (g.channel, ep)
    };
    // SAFETY: the listener's private channel lives with it.
    let ch = unsafe { &*ch };
    let e = loop {
        match ch.pop_wait() {
            Ok(e) => break e,
            Err(libc::EINTR) => continue,
            Err(e) => return Err(e),
        }
    };
    if e.c.status != 0 || e.c.event != RDMA_CM_EVENT_CONNECT_REQUEST {
        let st = e.c.status;
        let _ = ack_event(hand_out(e));
        return Err(if st != 0 { -st } else { libc::EINVAL });
    }
    let child = e.c.id;
    let ev = hand_out(e);
    // SAFETY: the new id is live; it holds its CONNECT_REQUEST until the next call.
    unsafe { (*child).event = ev };
    if let Some((mut attr, pd)) = ep {
        // SAFETY: the attributes copied at rdma_create_ep; the PD is the program's.
        if let Err(err) = unsafe { create_qp(child, pd, &mut attr) } {
            let _ = destroy_id(child);
            return Err(err);
        }
    }
    Ok(child)
}

static DEFAULT_PD: Mutex<usize> = Mutex::new(0);

/// The PD `rdma_create_qp` uses for a NULL `pd` when the id has none: one per device,
/// allocated on first use and kept (librdmacm's per-device PD).
fn default_pd(ctx: *mut ibv_context) -> Result<*mut ibv_pd, c_int> {
    let mut g = DEFAULT_PD.lock().unwrap_or_else(|p| p.into_inner());
    if *g == 0 {
        *g = link::alloc_pd(ctx)? as usize;
    }
    Ok(*g as *mut ibv_pd)
}

/// `rdma_create_qp`: an RC QP on `id->verbs` bound to the id. `pd` NULL: `id->pd`, else the
/// device's default PD. NULL CQs in `attr`: a completion channel and a CQ each for send
/// (`max_send_wr` entries) and receive (`max_recv_wr`), stored in the id and destroyed
/// with the QP (librdmacm's `ucma_create_cqs`). The granted capacities are written back
/// into `attr`.
///
/// # Safety
/// `attr` NULL or a writable `ibv_qp_init_attr`.
pub(crate) unsafe fn create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> Result<(), c_int> {
    let core = core_of(id)?;
    if attr.is_null() {
        return Err(libc::EINVAL);
    }
    let mut g = core.lock();
    live(&g)?;
    let c = g.cid();
    if !c.qp.is_null() || c.verbs.is_null() {
        return Err(libc::EINVAL);
    }
    let ctx = c.verbs;
    let pd = if !pd.is_null() {
        pd
    } else if !c.pd.is_null() {
        c.pd
    } else {
        default_pd(ctx)?
    };
    // SAFETY: a PD of the program's (its context must be the id's).
    if unsafe { (*pd).context } != ctx {
        return Err(libc::EINVAL);
    }
    // SAFETY: writable per the contract.
    let a = unsafe { &mut *attr };
    let mut made = false;
    if a.send_cq.is_null() || a.recv_cq.is_null() {
        // SAFETY: the id's context.
        unsafe { make_cqs(c, ctx, a) }?;
        made = true;
    }
    // SAFETY: the library's PD and the program's attributes.
    let qp = unsafe { link::create_qp(pd, a) };
    let qp = match qp {
        Ok(q) => q,
        Err(e) => {
            if made {
                // SAFETY: the CQs we just made.
                unsafe { destroy_cqs(c) };
            }
            return Err(e);
        }
    };
    if let Err(e) = link::init_qp(qp, c.port_num.max(1)) {
        link::destroy_qp(qp);
        if made {
            // SAFETY: the CQs we made above.
            unsafe { destroy_cqs(c) };
        }
        return Err(e);
    }
    c.qp = qp;
    if c.pd.is_null() {
        c.pd = pd;
    }
    g.owns_cqs = made;
    Ok(())
}

/// # Safety
/// `ctx` the library's; `c` the live id.
unsafe fn make_cqs(
    c: &mut rdma_cm_id,
    ctx: *mut ibv_context,
    a: &mut ibv_qp_init_attr,
) -> Result<(), c_int> {
    let idp = (c as *mut rdma_cm_id).cast::<c_void>();
    let mk = |n: u32| -> Result<(*mut ibv_comp_channel, *mut ibv_cq), c_int> {
        let ch = link::create_comp_channel(ctx)?;
        match link::create_cq(ctx, n.clamp(1, i32::MAX as u32) as c_int, idp, ch) {
            Ok(cq) => Ok((ch, cq)),
            Err(e) => {
                link::destroy_comp_channel(ch);
                Err(e)
            }
        }
    };
    if a.recv_cq.is_null() {
        let (ch, cq) = mk(a.cap.max_recv_wr)?;
        c.recv_cq_channel = ch;
        c.recv_cq = cq;
        a.recv_cq = cq;
    }
    if a.send_cq.is_null() {
        match mk(a.cap.max_send_wr) {
            Ok((ch, cq)) => {
                c.send_cq_channel = ch;
                c.send_cq = cq;
                a.send_cq = cq;
            }
            Err(e) => {
                // SAFETY: what we made above.
                unsafe { destroy_cqs(c) };
                return Err(e);
            }
        }
    }
    Ok(())
}

/// # Safety
/// `c` the live id; its CQ fields hold what [`make_cqs`] made (or NULL).
unsafe fn destroy_cqs(c: &mut rdma_cm_id) {
    for cq in [&mut c.send_cq, &mut c.recv_cq] {
        if !cq.is_null() {
            link::destroy_cq(*cq);
            *cq = core::ptr::null_mut();
        }
    }
    for ch in [&mut c.send_cq_channel, &mut c.recv_cq_channel] {
        if !ch.is_null() {
            link::destroy_comp_channel(*ch);
            *ch = core::ptr::null_mut();
        }
    }
}

/// `rdma_destroy_qp`: the id's QP (and the CQs `rdma_create_qp` made for it).
pub(crate) fn destroy_qp(id: *mut rdma_cm_id) -> Result<(), c_int> {
    let core = core_of(id)?;
    let mut g = core.lock();
    live(&g)?;
    if let Some(t) = g.token.take() {
        if g.listener.is_none() {
            pump::unwatch(t);
        } else {
            g.token = Some(t);
        }
    }
    g.watched_qp = core::ptr::null_mut();
    let owns = std::mem::replace(&mut g.owns_cqs, false);
    let c = g.cid();
    let qp = std::mem::replace(&mut c.qp, core::ptr::null_mut());
    if !qp.is_null() {
        link::destroy_qp(qp);
    }
    if owns {
        // SAFETY: the CQs rdma_create_qp made.
        unsafe { destroy_cqs(c) };
    }
    Ok(())
}

/// `rdma_destroy_id`: stops the listener (unanswered requests are rejected), rejects an
/// unanswered request of its own, drops its unread events, then waits until every event
/// about it that the program took is acknowledged (as librdmacm does), and frees it.
pub(crate) fn destroy_id(id: *mut rdma_cm_id) -> Result<(), c_int> {
    let core = core_of(id)?;
    let (ch, sync) = {
        let mut g = core.lock();
        live(&g)?;
        g.destroyed = true;
        if let Some(t) = g.token.take() {
            pump::unwatch(t);
        }
        g.listener = None;
        g.request = None;
        (g.channel, g.sync)
    };
    // A synchronous id holds its last event itself.
    // SAFETY: the id is live until freed below.
    let held = unsafe { core::mem::replace(&mut (*id).event, core::ptr::null_mut()) };
    if !held.is_null() {
        let _ = ack_event(held);
    }
    // SAFETY: the id's channel is live while the id is.
    let purged = unsafe { &*ch }.purge(&core);
    core.acked(purged);
    {
        let mut g = core.lock();
        while g.outstanding > 0 {
            g = core.acked.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        release_port(g.port.take());
    }
    with_reg(|r| r.ids.remove(&(id as usize)));
    add_user(ch, -1);
    if sync {
        let _ = destroy_channel(ch.cast_mut().cast());
    }
    // SAFETY: the box new_id made; no registry entry, pump watch or event refers to it now.
    drop(unsafe { Box::from_raw(id.cast::<CmId>()) });
    Ok(())
}

/// `rdma_migrate_id`: move the id (and its unread events) to `ch` (NULL: a new private
/// channel, making the id synchronous), after the events it already handed out on the
/// old channel are acknowledged.
pub(crate) fn migrate(id: *mut rdma_cm_id, ch: *mut rdma_event_channel) -> Result<(), c_int> {
    let core = core_of(id)?;
    let (new, sync) = if ch.is_null() {
        (create_channel()?.cast::<Channel>().cast_const(), true)
    } else {
        (channel_of(ch)? as *const Channel, false)
    };
    let mut g = core.lock();
    live(&g)?;
    let old = g.channel;
    if old == new {
        return Ok(());
    }
    // SAFETY: the id's live channel.
    let oldc = unsafe { &*old };
    // Take the unread events first so no new ones can be taken from the old channel.
    let moved = purge_take(oldc, &core);
    while g.outstanding > moved.len() {
        g = core.acked.wait(g).unwrap_or_else(|p| p.into_inner());
    }
    // SAFETY: the new channel is live.
    let newc = unsafe { &*new };
    for e in moved {
        newc.push(e);
    }
    g.channel = new;
    let was_sync = std::mem::replace(&mut g.sync, sync);
    g.cid().channel = new.cast_mut().cast();
    drop(g);
    add_user(new, 1);
    add_user(old, -1);
    if was_sync {
        let _ = destroy_channel(old.cast_mut().cast());
    }
    Ok(())
}

// Boxed: a record's address is what the program holds once it takes the event.
#[allow(clippy::vec_box)]
fn purge_take(ch: &Channel, core: &Arc<IdCore>) -> Vec<Box<EventRec>> {
    let mut out = Vec::new();
    while let Some(e) = ch.take_of(core) {
        out.push(e);
    }
    out
}

/// `rdma_set_option`. `RDMA_OPTION_ID_REUSEADDR` (an `int`) lets a later bind share the
/// port; `RDMA_OPTION_ID_AFONLY` is accepted (the engine is IPv4 only here). Everything
/// else — `RDMA_OPTION_ID_TOS` (the engine sets no DSCP), `RDMA_OPTION_ID_ACK_TIMEOUT`,
/// `RDMA_OPTION_IB_PATH` — is `ENOSYS` with one warning line.
///
/// # Safety
/// `val` readable for `len` bytes.
pub(crate) unsafe fn set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: usize,
) -> Result<(), c_int> {
    let core = core_of(id)?;
    if val.is_null() {
        return Err(libc::EINVAL);
    }
    match (level, name) {
        (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) | (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) => {
            if len != core::mem::size_of::<c_int>() {
                return Err(libc::EINVAL);
            }
            // SAFETY: per the contract (len checked).
            let v = unsafe { val.cast::<c_int>().read_unaligned() };
            let mut g = core.lock();
            live(&g)?;
            if name == RDMA_OPTION_ID_REUSEADDR {
                g.reuseaddr = v != 0;
            }
            Ok(())
        }
        _ => {
            warn_once(&format!(
                "rdma_set_option(level {level}, option {name}) is not supported on xwarp (ENOSYS)"
            ));
            Err(libc::ENOSYS)
        }
    }
}

static WARNED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// One line on stderr per distinct message.
pub(crate) fn warn_once(msg: &str) {
    let mut w = WARNED.lock().unwrap_or_else(|p| p.into_inner());
    if !w.iter().any(|m| m == msg) {
        crate::ffi::warn_line(msg);
        w.push(msg.to_string());
    }
}

/// `rdma_create_ep` on a passive address: keep the QP attributes (and PD) for the ids
/// `rdma_get_request` returns.
pub(crate) fn set_ep_qp(
    id: *mut rdma_cm_id,
    attr: ibv_qp_init_attr,
    pd: *mut ibv_pd,
) -> Result<(), c_int> {
    let core = core_of(id)?;
    let mut g = core.lock();
    live(&g)?;
    g.ep_qp = Some((attr, pd));
    Ok(())
}

/// `rdma_init_qp_attr` as the kernel answers it for an iWARP id: for INIT the remote
/// access flags (`IBV_QP_STATE | IBV_QP_ACCESS_FLAGS`), for RTR/RTS only the state, and
/// the port (`IBV_QP_PORT`) always.
///
/// # Safety
/// `attr` a writable `ibv_qp_attr`, `mask` a writable int.
pub(crate) unsafe fn init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> Result<(), c_int> {
    let core = core_of(id)?;
    if attr.is_null() || mask.is_null() {
        return Err(libc::EINVAL);
    }
    let port = {
        let mut g = core.lock();
        live(&g)?;
        g.cid().port_num
    };
    // SAFETY: per the contract.
    let a = unsafe { &mut *attr };
    let m = match a.qp_state {
        IBV_QPS_INIT => {
            a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
            IBV_QP_STATE | IBV_QP_ACCESS_FLAGS
        }
        IBV_QPS_RTR | IBV_QPS_RTS => IBV_QP_STATE,
        _ => return Err(libc::EINVAL),
    };
    a.port_num = port;
    // SAFETY: per the contract.
    unsafe { *mask = (m | IBV_QP_PORT) as c_int };
    Ok(())
}

/// A valid id (for the calls that only check it: `rdma_establish`, `rdma_notify`).
pub(crate) fn check(id: *mut rdma_cm_id) -> Result<(), c_int> {
    let core = core_of(id)?;
    let g = core.lock();
    live(&g)
}

/// `rdma_get_src_port` / `rdma_get_dst_port`: the port in network byte order (0 for an
/// unknown id or no address).
pub(crate) fn port_of(id: *mut rdma_cm_id, dst: bool) -> u16 {
    let Ok(core) = core_of(id) else { return 0 };
    let mut g = core.lock();
    if g.destroyed {
        return 0;
    }
    let c = g.cid();
    let a = if dst {
        &c.route.addr.dst
    } else {
        &c.route.addr.src
    };
    addr::stored(a).map(|a| a.port().to_be()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rping (rdma-core up to v57) calls `rdma_get_cm_event` again after handling its last
    /// event, racing its main thread's `rdma_destroy_event_channel`: a call that enters
    /// after the destroy waits (the process exits from its main thread) instead of
    /// failing with EINVAL, on which rping calls `exit(-1)`. A pointer that never was a
    /// channel is still EINVAL; a non-blocking destroyed channel is EAGAIN.
    #[test]
    fn get_cm_event_entering_after_the_channel_was_destroyed_waits() {
        let ch = create_channel().unwrap();
        destroy_channel(ch).unwrap();
        assert_eq!(try_get_event(ch, false), Ok(None), "waits, no EINVAL");
        assert_eq!(try_get_event(ch, true), Ok(None), "and keeps waiting");
        // Through the export, on a thread: still blocked after 300 ms.
        let (tx, rx) = std::sync::mpsc::channel();
        let addr = ch as usize;
        std::thread::spawn(move || {
            let mut e = core::ptr::null_mut();
            // SAFETY: `e` is writable; the channel pointer is only looked up.
            let r = unsafe {
                crate::exports_cm::rdma_get_cm_event(addr as *mut rdma_event_channel, &mut e)
            };
            let _ = tx.send(r);
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "rdma_get_cm_event returned on a destroyed channel"
        );
        // Never a channel: EINVAL as before.
        let mut not_a_channel = [0u64; 4];
        let bogus: *mut rdma_event_channel = not_a_channel.as_mut_ptr().cast();
        assert_eq!(try_get_event(bogus, false), Err(libc::EINVAL));
        // Non-blocking at the destroy: EAGAIN.
        let nb = create_channel().unwrap();
        // SAFETY: the live channel's own fd.
        unsafe {
            let fd = (*nb).fd;
            libc::fcntl(
                fd,
                libc::F_SETFL,
                libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
            );
        }
        destroy_channel(nb).unwrap();
        assert_eq!(try_get_event(nb, false), Err(libc::EAGAIN));
    }

    fn param(rr: u8, id: u8) -> ConnParam {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: rr,
            initiator_depth: id,
        }
    }

    #[test]
    fn librdmacm_device_maximum_is_the_low_byte_of_max_qp_rd_atom() {
        // cma.c: cma_dev->max_responder_resources = (uint8_t) attr.max_qp_rd_atom.
        let a = crate::attr::device_attr([2, 0, 0, 0, 0, 1]);
        assert_eq!(CMA_DEV_MAX_RD_ATOM, a.max_qp_rd_atom as u8);
        assert_eq!(CMA_DEV_MAX_RD_ATOM, a.max_qp_init_rd_atom as u8);
    }

    #[test]
    fn librdmacm_connect_null_conn_param_asks_the_device_maxima() {
        assert_eq!(connect_ird_ord(None), (255, 255));
        // RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH: the maximum, per field.
        assert_eq!(connect_ird_ord(Some(&param(0xff, 3))), (255, 3));
        assert_eq!(connect_ird_ord(Some(&param(2, 0xff))), (2, 255));
        // Explicit values are the program's, zero included.
        assert_eq!(connect_ird_ord(Some(&param(1, 1))), (1, 1));
        assert_eq!(connect_ird_ord(Some(&param(0, 0))), (0, 0));
    }

    #[test]
    fn librdmacm_accept_null_conn_param_mirrors_the_request() {
        // req = (responder_resources, initiator_depth) of the CONNECT_REQUEST.
        assert_eq!(accept_ird_ord(None, (16, 4)), (16, 4));
        assert_eq!(accept_ird_ord(None, (255, 128)), (255, 128));
        assert_eq!(accept_ird_ord(Some(&param(0xff, 0xff)), (7, 9)), (7, 9));
        assert_eq!(accept_ird_ord(Some(&param(0xff, 2)), (7, 9)), (7, 2));
        assert_eq!(accept_ird_ord(Some(&param(3, 2)), (7, 9)), (3, 2));
    }
}
