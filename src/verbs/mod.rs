//! # `xwarp::verbs` — RDMA verbs and a connection manager on an xwarp engine
//!
//! The whole iWARP data path runs on the engine thread (see
//! [`xwarp_stack::proto`]): TCP receive buffer → MPA/FPDU parser → placement into
//! registered memory → completions; Read Requests are answered from registered memory
//! without the application; FPDUs are encoded on the engine thread into the TCP send
//! buffer. Application threads only post work requests (a lock-free command queue plus
//! the engine doorbell) and take completions (one lock-free queue per CQ plus an
//! eventfd for blocking waits).
//!
//! Objects (after ibverbs / rdma_cm):
//! * [`Context`] — an engine (TCP stack + verbs host) over a backend: the virtual wire
//!   ([`vwire_pair`]) or any [`Backend`] (AF_XDP through `xwarp::toe`).
//! * [`Device`] — cloneable handle: [`Device::alloc_pd`], [`Device::create_cq`],
//!   [`Device::listen`].
//! * [`ProtectionDomain`] — memory registration ([`ProtectionDomain::alloc_mr`],
//!   [`ProtectionDomain::register`]), [`ProtectionDomain::create_qp`],
//!   [`ProtectionDomain::create_srq`].
//! * [`MemoryRegion`] — lkey/rkey (STags), address, copy in/out (see [`mem`] for the
//!   aliasing contract).
//! * [`CompletionQueue`] — poll, `req_notify` (all or solicited-only), blocking wait on
//!   an fd usable from epoll.
//! * [`QueuePair`] — RC QP: post_send (Send, Send with SE / Invalidate, Write, Read,
//!   Local Invalidate; SGLs, signaled/unsignaled, inline, fence), post_recv, connect,
//!   disconnect, CM events ([`CmEvent`]); the QP state machine through
//!   [`QueuePair::state`], [`QueuePair::query`] ([`QpAttr`]) and [`QueuePair::modify`]
//!   ([`QpModify`]), after `ibv_query_qp` / `ibv_modify_qp` and siw's `siw_qp_modify`;
//!   a reset (modify to IDLE from ERROR, or after a graceful close) makes a QP
//!   connect/accept again.
//! * [`Listener`] / [`ConnRequest`] — incoming connection requests with private data and
//!   the peer's IRD/ORD; accept or reject with private data.
//!
//! `wr_id` `u64::MAX` is reserved (the engine's internal RTR message).

mod engine;
pub mod mem;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use xwarp_poll_driver::backend::Backend;
use xwarp_poll_driver::engine::{Doorbell, Engine, EngineConfig, EngineHandle, EngineStats};
use xwarp_poll_driver::vwire::{VirtualNic, VirtualWire, WireConfig};
use xwarp_stack::{new_stack, Readiness, StackConfig, StackHandle, StackStats, TcpService};

pub use xwarp_ddp::mpa::RtrType;
pub use xwarp_rdmap::verbs::{CompletionStatus, PostError, Sge, MAX_SGE};
pub use xwarp_rdmap::{Access, MemError, Stag};

use engine::{Cmd, VerbsHost};

/// Largest `max_inline_data` a QP accepts ([`QpInitAttr::max_inline_data`],
/// [`QpModify::max_inline_data`]); more is `InvalidInput`. Inline payloads are copied
/// at post time into a per-QP buffer of `max_inline_data × max_send_wr` bytes.
pub const MAX_INLINE_DATA: usize = 64 * 1024;

/// Largest per-QP inline buffer (`max_inline_data × max_send_wr`); more is
/// `InvalidInput`, so a deep send queue with large inline data cannot make the engine
/// allocate without bound.
pub const MAX_INLINE_BUFFER: usize = 64 * 1024 * 1024;

/// Whether `max_inline_data` is acceptable for a send queue of `sq_depth` entries.
pub(crate) fn check_inline(max_inline_data: usize, sq_depth: usize) -> Result<(), String> {
    if max_inline_data > MAX_INLINE_DATA {
        return Err(format!(
            "max_inline_data {max_inline_data} is more than {MAX_INLINE_DATA}"
        ));
    }
    match max_inline_data.checked_mul(sq_depth) {
        Some(n) if n <= MAX_INLINE_BUFFER => Ok(()),
        _ => Err(format!(
            "max_inline_data {max_inline_data} x max_send_wr {sq_depth} is more than \
             {MAX_INLINE_BUFFER} bytes of inline buffer"
        )),
    }
}
use mem::RawBuf;

/// Shared application-side state of one device (engine).
struct DevInner {
    cmds: Sender<Cmd>,
    bell: Doorbell,
    next_qpn: AtomicU32,
    next_pd: AtomicU32,
    next_token: AtomicU32,
    /// The engine's IPv4 address (for [`Device::local_ipv4`]).
    ipv4: Option<Ipv4Addr>,
}

impl DevInner {
    fn send(&self, cmd: Cmd) -> io::Result<()> {
        self.cmds
            .send(cmd)
            .map_err(|_| io::Error::new(io::ErrorKind::ConnectionAborted, "engine stopped"))?;
        self.bell.ring();
        Ok(())
    }

    fn call<T>(&self, make: impl FnOnce(Sender<T>) -> Cmd) -> io::Result<T> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.send(make(tx))?;
        rx.recv_timeout(Duration::from_secs(10))
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "engine did not answer"))
    }
}

/// A running engine with the verbs host: the TCP stack (also usable through
/// `xwarp::net` via [`Context::stack`]) and the iWARP data path on one engine thread.
/// Dropping it stops the engine.
pub struct Context<B: Backend + Send + 'static> {
    dev: Device,
    stack: StackHandle,
    engine: Option<EngineHandle<B, TcpService>>,
}

impl<B: Backend + Send + 'static> std::fmt::Debug for Context<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl<B: Backend + Send + 'static> Context<B> {
    /// Start an engine thread over `backend`.
    pub fn start(
        backend: B,
        stack_config: StackConfig,
        engine_config: EngineConfig,
    ) -> io::Result<Self> {
        let ipv4 = stack_config.ipv4.map(|a| a.0);
        // EMSS: MTU minus IPv4 and TCP headers, minus the timestamp option.
        let emss =
            stack_config.mtu.saturating_sub(40) - if stack_config.timestamps { 12 } else { 0 };
        let (mut service, stack) =
            new_stack(stack_config).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let (tx, rx) = crossbeam_channel::unbounded();
        service.set_protocol_host(Box::new(VerbsHost::new(rx, emss)));
        let bell = Doorbell::new()?;
        let engine = Engine::spawn_with_doorbell(engine_config, bell.clone(), backend, service)?;
        let b2 = bell.clone();
        stack.set_kick(Arc::new(move || b2.ring()));
        Ok(Context {
            dev: Device {
                inner: Arc::new(DevInner {
                    cmds: tx,
                    bell,
                    next_qpn: AtomicU32::new(1),
                    next_pd: AtomicU32::new(1000),
                    next_token: AtomicU32::new(1),
                    ipv4,
                }),
            },
            stack,
            engine: Some(engine),
        })
    }

    /// The device handle (cloneable; objects created from it keep working while the
    /// context lives).
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The TCP stack of this engine (for `xwarp::net` sockets next to RDMA).
    pub fn stack(&self) -> &StackHandle {
        &self.stack
    }

    /// TCP counters.
    pub fn stack_stats(&self) -> StackStats {
        self.stack.stats()
    }

    /// Engine loop counters.
    pub fn engine_stats(&self) -> EngineStats {
        self.engine.as_ref().map(|e| e.stats()).unwrap_or_default()
    }

    /// Stop the engine and return its backend.
    pub fn stop(mut self) -> io::Result<B> {
        match self.engine.take() {
            Some(e) => e.stop().map(|x| x.backend),
            None => Err(io::Error::other("engine already stopped")),
        }
    }
}

impl<B: Backend + Send + 'static> Drop for Context<B> {
    fn drop(&mut self) {
        if let Some(e) = self.engine.take() {
            let _ = e.stop();
        }
    }
}

/// Two verbs engines (10.77.0.1 and 10.77.0.2 by default) joined by a virtual wire.
pub fn vwire_pair(
    cfg: crate::net::PairConfig,
) -> io::Result<(Context<VirtualNic>, Context<VirtualNic>)> {
    let (nic_a, nic_b) = VirtualWire::pair(cfg.wire)?;
    let mut ea = cfg.engine.clone();
    ea.name = format!("{}-a", cfg.engine.name);
    let mut eb = cfg.engine;
    eb.name = format!("{}-b", eb.name);
    let a = Context::start(nic_a, cfg.a, ea)?;
    let b = Context::start(nic_b, cfg.b, eb)?;
    Ok((a, b))
}

/// A verbs engine on a real interface through AF_XDP (see [`crate::toe`]).
pub type XdpContext = Context<xwarp_poll_driver::afxdp::AfXdpNic>;

impl Context<xwarp_poll_driver::afxdp::AfXdpNic> {
    /// Open an AF_XDP NIC on `cfg.ifname` in namespace `ns` (the caller's own when `None`)
    /// and start a verbs engine on it: [`crate::toe::open_xdp_nic`] followed by
    /// [`Context::start`], so the verbs host is installed before the engine spawns.
    /// Root is needed.
    pub fn start_xdp(
        ns: Option<&xwarp_poll_driver::netns::NetNs>,
        cfg: crate::toe::XdpEngineConfig,
    ) -> io::Result<Self> {
        let (nic, stack, engine) = crate::toe::open_xdp_nic(ns, cfg)?;
        Context::start(nic, stack, engine)
    }
}

/// [`vwire_pair`] with default addresses and engines over `wire`.
pub fn vwire_pair_simple(
    wire: WireConfig,
) -> io::Result<(Context<VirtualNic>, Context<VirtualNic>)> {
    vwire_pair(crate::net::PairConfig {
        wire,
        ..Default::default()
    })
}

/// A cloneable handle on one verbs engine.
#[derive(Clone)]
pub struct Device {
    inner: Arc<DevInner>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("ipv4", &self.inner.ipv4)
            .finish_non_exhaustive()
    }
}

impl Device {
    /// The engine's IPv4 address.
    pub fn local_ipv4(&self) -> Option<Ipv4Addr> {
        self.inner.ipv4
    }

    /// Allocate a protection domain.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        ProtectionDomain {
            dev: self.clone(),
            pd: xwarp_rdmap::PdId(self.inner.next_pd.fetch_add(1, Ordering::Relaxed)),
        }
    }

    /// Create a completion queue. `depth` is advisory (the queue grows as needed).
    pub fn create_cq(&self, depth: usize) -> io::Result<CompletionQueue> {
        let (tx, rx) = crossbeam_channel::unbounded();
        Ok(CompletionQueue {
            shared: Arc::new(CqShared {
                tx,
                rx,
                arm: AtomicU8::new(ARM_NONE),
                ready: Readiness::new()?,
                depth,
            }),
        })
    }

    /// Listen for connection requests on `addr` (the port must be non-zero).
    pub fn listen(&self, addr: SocketAddr, backlog: usize) -> io::Result<Listener> {
        let token = u64::from(self.inner.next_token.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = crossbeam_channel::unbounded();
        let ready = Arc::new(Readiness::new()?);
        let r = self.inner.call(|reply| Cmd::Listen {
            token,
            addr,
            backlog,
            requests: tx,
            ready: ready.clone(),
            reply,
        })?;
        r.map_err(|e| e.to_io())?;
        Ok(Listener {
            dev: self.clone(),
            token,
            rx,
            ready,
            addr,
        })
    }
}

/// A protection domain: memory regions and QPs of one PD may be used together.
#[derive(Debug, Clone)]
pub struct ProtectionDomain {
    dev: Device,
    pd: xwarp_rdmap::PdId,
}

impl ProtectionDomain {
    fn register_raw(&self, buf: RawBuf, access: Access) -> io::Result<MemoryRegion> {
        let buf = Arc::new(buf);
        let base = buf.addr();
        let stag = self
            .dev
            .inner
            .call(|reply| Cmd::RegMr {
                pd: self.pd,
                access,
                base,
                buf: buf.clone(),
                reply,
            })?
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{e:?}")))?;
        Ok(MemoryRegion {
            dev: self.dev.clone(),
            buf,
            stag,
            access,
        })
    }

    /// Allocate and register a zeroed, page-aligned buffer of `len` bytes; with `huge`,
    /// 2 MiB huge pages are tried first (`MAP_HUGETLB`), normal pages otherwise.
    pub fn alloc_mr(&self, len: usize, access: Access, huge: bool) -> io::Result<MemoryRegion> {
        self.register_raw(RawBuf::alloc(len, huge)?, access)
    }

    /// Register an application buffer; the region owns it from now on (read it back
    /// through [`MemoryRegion::read`]).
    pub fn register(&self, buf: impl Into<Box<[u8]>>, access: Access) -> io::Result<MemoryRegion> {
        self.register_raw(RawBuf::from_box(buf.into()), access)
    }

    /// Create a shared receive queue of `depth` entries.
    pub fn create_srq(&self, depth: usize) -> io::Result<SharedReceiveQueue> {
        let id = self
            .dev
            .inner
            .call(|reply| Cmd::CreateSrq { depth, reply })?;
        Ok(SharedReceiveQueue {
            dev: self.dev.clone(),
            id,
        })
    }

    /// Create an RC queue pair (not connected yet: use [`QueuePair::connect`] or
    /// [`ConnRequest::accept`]).
    pub fn create_qp(&self, attr: &QpInitAttr<'_>) -> io::Result<QueuePair> {
        if attr.max_send_wr == 0 || (attr.srq.is_none() && attr.max_recv_wr == 0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "queue depths must be at least 1",
            ));
        }
        attr.mpa
            .validate()
            .map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
        check_inline(attr.max_inline_data, attr.max_send_wr)
            .map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
        let qpn = self.dev.inner.next_qpn.fetch_add(1, Ordering::Relaxed);
        let (ev_tx, ev_rx) = crossbeam_channel::unbounded();
        let ready = Arc::new(Readiness::new()?);
        let rq = match attr.srq {
            Some(s) => xwarp_rdmap::RqConfig::Shared(s.id),
            None => xwarp_rdmap::RqConfig::Own(attr.max_recv_wr),
        };
        let qp = xwarp_rdmap::QpConfig {
            pd: self.pd,
            ird: attr.ird,
            ord: attr.ord,
            sq_depth: attr.max_send_wr,
            rq,
        };
        self.dev.inner.send(Cmd::CreateQp {
            qpn,
            qp,
            max_inline: attr.max_inline_data,
            mpa: attr.mpa.clone(),
            send_cq: attr.send_cq.shared.clone(),
            recv_cq: attr.recv_cq.shared.clone(),
            events: ev_tx,
            ready: ready.clone(),
        })?;
        Ok(QueuePair {
            dev: self.dev.clone(),
            qpn,
            max_inline: AtomicUsize::new(attr.max_inline_data),
            max_send_wr: attr.max_send_wr,
            events: ev_rx,
            ready,
        })
    }
}

/// A registered memory region (owns its buffer; deregistered on drop).
pub struct MemoryRegion {
    dev: Device,
    buf: Arc<RawBuf>,
    stag: Stag,
    access: Access,
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("stag", &self.stag)
            .field("len", &self.buf.len())
            .finish()
    }
}

impl MemoryRegion {
    /// Local key (the region's STag).
    pub fn lkey(&self) -> Stag {
        self.stag
    }

    /// Remote key (the same STag; give it to the peer with [`Self::addr`]).
    pub fn rkey(&self) -> Stag {
        self.stag
    }

    /// Tagged offset of byte 0 (the buffer's virtual address, as in verbs).
    pub fn addr(&self) -> u64 {
        self.buf.addr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.buf.len() == 0
    }

    /// Access rights.
    pub fn access(&self) -> Access {
        self.access
    }

    /// Whether the buffer got huge pages.
    pub fn is_huge(&self) -> bool {
        self.buf.is_huge()
    }

    /// A scatter/gather entry for `[offset, offset+len)`; `None` if out of bounds.
    pub fn sge(&self, offset: usize, len: usize) -> Option<Sge> {
        if offset.checked_add(len)? > self.len() {
            return None;
        }
        Some(Sge {
            lkey: self.stag,
            addr: self.addr() + offset as u64,
            len: u32::try_from(len).ok()?,
        })
    }

    /// The whole region as one SGE (`None` above 4 GiB).
    pub fn sge_all(&self) -> Option<Sge> {
        self.sge(0, self.len())
    }

    /// Copy `data` into the region at `offset` (see the aliasing contract in [`mem`]).
    pub fn write(&self, offset: usize, data: &[u8]) -> io::Result<()> {
        if self.buf.copy_in(offset, data) {
            Ok(())
        } else {
            Err(io::Error::new(io::ErrorKind::InvalidInput, "out of bounds"))
        }
    }

    /// Copy region bytes at `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> io::Result<()> {
        if self.buf.copy_out(offset, out) {
            Ok(())
        } else {
            Err(io::Error::new(io::ErrorKind::InvalidInput, "out of bounds"))
        }
    }

    /// The byte at `offset`, read afresh on every call (to poll for a remote Write, as
    /// perftest's latency tests do); `None` out of bounds.
    pub fn poll_byte(&self, offset: usize) -> Option<u8> {
        self.buf.load_volatile(offset)
    }

    /// A copy of `len` region bytes at `offset`.
    pub fn to_vec(&self, offset: usize, len: usize) -> io::Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }

    /// Fill `[offset, offset+len)` with `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> io::Result<()> {
        if self.buf.fill(offset, len, byte) {
            Ok(())
        } else {
            Err(io::Error::new(io::ErrorKind::InvalidInput, "out of bounds"))
        }
    }

    /// Make an invalidated STag usable again (the verbs fast-register step, simplified).
    pub fn revalidate(&self) -> io::Result<()> {
        let stag = self.stag;
        self.dev
            .inner
            .call(|reply| Cmd::Revalidate { stag, reply })?
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{e:?}")))
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // The engine drops its own reference to the buffer when it deregisters.
        let _ = self.dev.inner.send(Cmd::DeregMr { stag: self.stag });
    }
}

/// A shared receive queue.
#[derive(Debug)]
pub struct SharedReceiveQueue {
    dev: Device,
    id: xwarp_rdmap::verbs::SrqId,
}

impl SharedReceiveQueue {
    /// Post a receive to the SRQ. A full SRQ completes the request on no CQ (the error
    /// is counted in the engine); keep within the depth.
    pub fn post_recv(&self, wr_id: u64, sgl: &[Sge]) -> Result<(), PostError> {
        if sgl.len() > MAX_SGE {
            return Err(PostError::InvalidSgl);
        }
        self.dev
            .inner
            .send(Cmd::PostSrqRecv {
                srq: self.id,
                wr: xwarp_rdmap::verbs::RecvWr {
                    wr_id,
                    sgl: sgl.to_vec(),
                },
            })
            .map_err(|_| PostError::InvalidState)
    }
}

const ARM_NONE: u8 = 0;
const ARM_ANY: u8 = 1;
const ARM_SOLICITED: u8 = 2;

pub(crate) struct CqShared {
    tx: Sender<WorkCompletion>,
    rx: Receiver<WorkCompletion>,
    arm: AtomicU8,
    ready: Readiness,
    #[allow(dead_code)]
    depth: usize,
}

impl CqShared {
    /// Engine side: queue a completion and fire the notification if armed for it.
    pub(crate) fn push(&self, wc: WorkCompletion) {
        let solicited = wc.solicited || wc.status != CompletionStatus::Success;
        let _ = self.tx.send(wc);
        let arm = self.arm.load(Ordering::SeqCst);
        if (arm == ARM_ANY || (arm == ARM_SOLICITED && solicited))
            && self
                .arm
                .compare_exchange(arm, ARM_NONE, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            self.ready.signal();
        }
    }
}

/// A completion queue.
#[derive(Clone)]
pub struct CompletionQueue {
    shared: Arc<CqShared>,
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("queued", &self.shared.rx.len())
            .finish()
    }
}

impl CompletionQueue {
    /// Take one completion.
    pub fn poll_one(&self) -> Option<WorkCompletion> {
        self.shared.rx.try_recv().ok()
    }

    /// Append up to `max` completions to `out`; returns how many.
    pub fn poll(&self, out: &mut Vec<WorkCompletion>, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            match self.shared.rx.try_recv() {
                Ok(wc) => {
                    out.push(wc);
                    n += 1;
                }
                Err(_) => break,
            }
        }
        n
    }

    /// Arm the notification: the fd becomes readable at the next completion
    /// (`solicited_only`: the next Send with SE, or any error completion).
    pub fn req_notify(&self, solicited_only: bool) {
        self.shared.arm.store(
            if solicited_only {
                ARM_SOLICITED
            } else {
                ARM_ANY
            },
            Ordering::SeqCst,
        );
    }

    /// Sleep until the armed notification fired or `timeout` passed (`Ok(false)`).
    /// Typical use: `req_notify`, poll again, then `wait`.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        self.shared.ready.wait(timeout.map(|t| Instant::now() + t))
    }

    /// Block until a completion arrives (spin briefly, then sleep on the fd) or
    /// `timeout` passes: [`CompletionQueue::next_polling`] with 50 µs of polling.
    pub fn next(&self, timeout: Duration) -> io::Result<WorkCompletion> {
        self.next_polling(timeout, Duration::from_micros(50))
    }

    /// Block until a completion arrives or `timeout` passes: poll for `poll` first,
    /// yielding the core on every empty poll, then arm the notification and sleep on the
    /// fd. A zero `poll` sleeps at once (the thread shares its core with the engine that
    /// produces the completions); a long one keeps the engine from having to wake this
    /// thread (an eventfd write, an IPI when it runs on another core).
    pub fn next_polling(&self, timeout: Duration, poll: Duration) -> io::Result<WorkCompletion> {
        let deadline = Instant::now() + timeout;
        let spin_until = Instant::now() + poll;
        loop {
            if let Some(wc) = self.poll_one() {
                return Ok(wc);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no completion"));
            }
            if now < spin_until {
                // Yield rather than busy-spin: the engine that produces the completion
                // may share this core (2 engines and 2 applications on 2 cores in the
                // benchmarks); a busy spin would keep it off the core for the whole
                // spin budget. With the core to itself, yielding costs one syscall.
                std::thread::yield_now();
                continue;
            }
            self.req_notify(false);
            if let Some(wc) = self.poll_one() {
                return Ok(wc);
            }
            self.shared.ready.wait(Some(deadline))?;
        }
    }
}

impl AsRawFd for CompletionQueue {
    /// Readable once an armed notification fired (see [`CompletionQueue::req_notify`]).
    fn as_raw_fd(&self) -> RawFd {
        self.shared.ready.as_raw_fd()
    }
}

impl AsFd for CompletionQueue {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.shared.ready.as_fd()
    }
}

/// What a work completion was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// Send (any variant).
    Send,
    /// RDMA Write.
    Write,
    /// RDMA Read.
    Read,
    /// Local Invalidate.
    LocalInvalidate,
    /// Receive (an inbound Send).
    Recv,
}

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: CompletionStatus,
    /// Kind.
    pub opcode: WcOpcode,
    /// Bytes transferred.
    pub byte_len: u32,
    /// QP number.
    pub qp_num: u32,
    /// The inbound Send carried Solicited Event.
    pub solicited: bool,
    /// STag invalidated by an inbound Send with Invalidate.
    pub invalidated_rkey: Option<Stag>,
}

/// MPA and RTR settings of a QP's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpaAttr {
    /// MPA revision to request / highest accepted (1 or 2). Default 2.
    pub revision: u8,
    /// Require CRC32c on FPDUs. Default false (siw's default).
    pub crc: bool,
    /// Require markers in the FPDUs we receive. Default false.
    pub markers: bool,
    /// Peer-to-peer mode (RFC 6581): the RTR type the Initiator offers. Default a
    /// zero-length Write. `None`: no P2P (the Responder then sends nothing before the
    /// Initiator's first message).
    pub p2p_rtr: Option<RtrType>,
}

impl Default for MpaAttr {
    fn default() -> Self {
        MpaAttr {
            revision: 2,
            crc: false,
            markers: false,
            p2p_rtr: Some(RtrType::Write),
        }
    }
}

impl MpaAttr {
    /// Whether the settings can make a connection: the revision is 1 or 2 (RFC 5044 /
    /// RFC 6581), and P2P (an RTR type) only with revision 2, since the RTR type is
    /// negotiated in the MPA v2 block (RFC 6581 §3). [`ProtectionDomain::create_qp`] and
    /// [`QueuePair::modify`] refuse anything else with `InvalidInput` and this reason.
    pub fn validate(&self) -> Result<(), String> {
        if self.revision != 1 && self.revision != 2 {
            return Err(format!(
                "MPA revision must be 1 or 2 (got {})",
                self.revision
            ));
        }
        if self.revision == 1 {
            if let Some(rtr) = self.p2p_rtr {
                return Err(format!(
                    "P2P RTR type {rtr:?} needs MPA revision 2 (RFC 6581 negotiates it in the \
                     v2 block); set p2p_rtr to None for revision 1"
                ));
            }
        }
        Ok(())
    }
}

/// QP creation attributes.
#[derive(Debug, Clone)]
pub struct QpInitAttr<'a> {
    /// CQ of send work (and Local Invalidate).
    pub send_cq: &'a CompletionQueue,
    /// CQ of receives.
    pub recv_cq: &'a CompletionQueue,
    /// Shared receive queue instead of the QP's own.
    pub srq: Option<&'a SharedReceiveQueue>,
    /// Send queue depth.
    pub max_send_wr: usize,
    /// Receive queue depth (without SRQ).
    pub max_recv_wr: usize,
    /// Largest inline payload (copied at post time; 0 disables inline); at most
    /// [`MAX_INLINE_DATA`], and `max_inline_data × max_send_wr` at most
    /// [`MAX_INLINE_BUFFER`].
    pub max_inline_data: usize,
    /// Inbound RDMA Read depth requested (IRD).
    pub ird: u32,
    /// Outbound RDMA Read depth requested (ORD).
    pub ord: u32,
    /// MPA settings.
    pub mpa: MpaAttr,
}

impl<'a> QpInitAttr<'a> {
    /// Defaults: depth 128 each way, 256 bytes inline, IRD/ORD 16, MPA defaults.
    pub fn new(send_cq: &'a CompletionQueue, recv_cq: &'a CompletionQueue) -> Self {
        QpInitAttr {
            send_cq,
            recv_cq,
            srq: None,
            max_send_wr: 128,
            max_recv_wr: 128,
            max_inline_data: 256,
            ird: 16,
            ord: 16,
            mpa: MpaAttr::default(),
        }
    }
}

/// The operation of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOpcode {
    /// Send.
    Send,
    /// Send with Solicited Event.
    SendWithSolicitedEvent,
    /// Send with Invalidate of the peer's STag.
    SendWithInvalidate(Stag),
    /// Send with Solicited Event and Invalidate.
    SendWithSolicitedEventInvalidate(Stag),
    /// RDMA Write to the peer's `rkey`/`remote_addr`.
    Write {
        /// Peer STag.
        rkey: Stag,
        /// Peer tagged offset.
        remote_addr: u64,
    },
    /// RDMA Read from the peer's `rkey`/`remote_addr` into the single local SGE.
    Read {
        /// Peer STag.
        rkey: Stag,
        /// Peer tagged offset.
        remote_addr: u64,
    },
    /// Local Invalidate of one of our STags, completed on the send CQ. Ordering: it is a
    /// barrier on the send queue. It takes effect only after every earlier send work
    /// request of this QP has completed (Sends and Writes fully handed to TCP, so their
    /// source bytes were read; Reads answered and placed, so their sink was written),
    /// and no later send work request starts before it took effect (a later one using
    /// the STag fails with `LocalProtectionError`). That is what verbs give a Local
    /// Invalidate with the fence flag; here the fence is implied. Posted before the
    /// connection is up, it waits for it. In ERROR (or after a disconnect) it completes
    /// with `WrFlushError` and invalidates nothing.
    LocalInvalidate(Stag),
}

/// A send work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendRequest {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub opcode: SendOpcode,
    /// Local buffers (ignored when `inline` is set).
    pub sgl: Vec<Sge>,
    /// Inline payload for Send/Write (copied now; at most `max_inline_data`).
    pub inline: Option<Vec<u8>>,
    /// Complete with a CQE on success.
    pub signaled: bool,
    /// Start only after earlier RDMA Reads completed.
    pub fence: bool,
}

impl SendRequest {
    /// A signaled request.
    pub fn new(wr_id: u64, opcode: SendOpcode, sgl: Vec<Sge>) -> SendRequest {
        SendRequest {
            wr_id,
            opcode,
            sgl,
            inline: None,
            signaled: true,
            fence: false,
        }
    }

    /// Signaled Send of `sgl`.
    pub fn send(wr_id: u64, sgl: Vec<Sge>) -> SendRequest {
        Self::new(wr_id, SendOpcode::Send, sgl)
    }

    /// Signaled RDMA Write of `sgl` to `rkey`/`remote_addr`.
    pub fn write(wr_id: u64, sgl: Vec<Sge>, rkey: Stag, remote_addr: u64) -> SendRequest {
        Self::new(wr_id, SendOpcode::Write { rkey, remote_addr }, sgl)
    }

    /// Signaled RDMA Read into `sink` from `rkey`/`remote_addr`.
    pub fn read(wr_id: u64, sink: Sge, rkey: Stag, remote_addr: u64) -> SendRequest {
        Self::new(wr_id, SendOpcode::Read { rkey, remote_addr }, vec![sink])
    }
}

/// Connection-manager events of a QP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// The connection is up.
    Established {
        /// The peer's private data (Request or Reply).
        private_data: Vec<u8>,
        /// Negotiated IRD.
        ird: u16,
        /// Negotiated ORD.
        ord: u16,
        /// CRC in use.
        crc: bool,
        /// MPA revision in use.
        revision: u8,
    },
    /// The Responder rejected our request.
    Rejected {
        /// Its private data.
        private_data: Vec<u8>,
    },
    /// Connecting failed before MPA (refused, timed out, bad address) or during MPA.
    ConnectError(String),
    /// We detected a protocol error and sent this Terminate (layer, etype, code).
    TerminateSent {
        /// Layer nibble.
        layer: u8,
        /// EType nibble.
        etype: u8,
        /// Error code.
        code: u8,
    },
    /// The peer sent a Terminate.
    TerminateReceived {
        /// Layer nibble.
        layer: u8,
        /// EType nibble.
        etype: u8,
        /// Error code.
        code: u8,
    },
    /// A connection error (the QP is in ERROR; work is flushed).
    Error(String),
    /// The connection is closed (after a disconnect by either side or an error).
    Disconnected,
}

/// QP states visible to the application: the protocol core's states (RFC 5040 §6 / the
/// RDMAC verbs QP states), as [`QueuePair::state`] reports them.
pub use xwarp_rdmap::QpState;

/// MPA parameters negotiated for a QP's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NegotiatedMpa {
    /// MPA revision in use (the Reply's).
    pub revision: u8,
    /// CRC32c on FPDUs, both directions.
    pub crc: bool,
    /// We insert markers in the FPDUs we send.
    pub markers_tx: bool,
    /// The peer inserts markers in the FPDUs we receive.
    pub markers_rx: bool,
    /// P2P: the RTR message type the Initiator sends first (`None`: no P2P).
    pub p2p_rtr: Option<RtrType>,
    /// The peer's IRD from its MPA v2 block.
    pub peer_ird: Option<u16>,
    /// The peer's ORD from its MPA v2 block.
    pub peer_ord: Option<u16>,
}

/// What [`QueuePair::query`] reports (after `ibv_query_qp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpAttr {
    /// QP number.
    pub qp_num: u32,
    /// Current state.
    pub state: QpState,
    /// Inbound RDMA Read depth: the negotiated one once MPA finished, else requested.
    pub ird: u32,
    /// Outbound RDMA Read depth: the negotiated one once MPA finished, else requested.
    pub ord: u32,
    /// Largest inline payload.
    pub max_inline_data: usize,
    /// Send queue depth.
    pub max_send_wr: usize,
    /// Receive queue depth (`None`: the QP takes receives from a shared receive queue).
    pub max_recv_wr: Option<usize>,
    /// MPA settings the QP asks for (or accepts with) when it connects.
    pub mpa: MpaAttr,
    /// What MPA negotiated (`None` before negotiation finished).
    pub negotiated: Option<NegotiatedMpa>,
    /// Our TCP address, once the connection exists.
    pub local_addr: Option<SocketAddr>,
    /// The peer's TCP address, once the connection exists.
    pub peer_addr: Option<SocketAddr>,
}

impl QpAttr {
    /// Engine side: assemble the attributes of one QP.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn build(
        qp_num: u32,
        state: QpState,
        qp: &xwarp_rdmap::QpConfig,
        mpa: &MpaAttr,
        neg: Option<&xwarp_ddp::mpa::Negotiated>,
        max_inline_data: usize,
        addrs: Option<(SocketAddr, SocketAddr)>,
    ) -> QpAttr {
        QpAttr {
            qp_num,
            state,
            ird: neg.map_or(qp.ird, |n| u32::from(n.ird)),
            ord: neg.map_or(qp.ord, |n| u32::from(n.ord)),
            max_inline_data,
            max_send_wr: qp.sq_depth,
            max_recv_wr: match qp.rq {
                xwarp_rdmap::RqConfig::Own(d) => Some(d),
                xwarp_rdmap::RqConfig::Shared(_) => None,
            },
            mpa: mpa.clone(),
            negotiated: neg.map(|n| NegotiatedMpa {
                revision: n.revision,
                crc: n.crc,
                markers_tx: n.markers_tx,
                markers_rx: n.markers_rx,
                p2p_rtr: n.rtr,
                peer_ird: n.peer_ird,
                peer_ord: n.peer_ord,
            }),
            local_addr: addrs.map(|a| a.0),
            peer_addr: addrs.map(|a| a.1),
        }
    }
}

/// A change for [`QueuePair::modify`] (after `ibv_modify_qp`): a new state and/or new
/// attributes; `None` fields stay as they are.
///
/// Transitions (siw's `siw_qp_modify`, plus the verbs RESET; anything else is
/// `InvalidInput` with the reason):
/// * IDLE → ERROR (queued work is flushed; a connect in progress is aborted);
/// * RTS → CLOSING (graceful disconnect, like [`QueuePair::disconnect`]), RTS →
///   TERMINATE (a Terminate, RDMAP layer, local catastrophic error, code 0xff, then the
///   connection closes), RTS → ERROR (abortive: work is flushed, TCP is reset);
/// * CLOSING → ERROR, TERMINATE → ERROR (abortive);
/// * teardown on the wire as siw does it (iwarp-wire.md §4.7): CLOSING ends with a TCP
///   FIN and no RDMAP message, ERROR releases the connection at once (a TCP reset);
/// * ERROR → IDLE, and IDLE → IDLE once a graceful close finished: a **reset** (verbs
///   `IBV_QPS_RESET`, which siw maps to its IDLE); see [`QueuePair::modify`];
/// * to the current state otherwise: nothing happens (IDLE → IDLE on a QP that never
///   connected only carries attributes).
///
/// Refused on purpose: RTS → IDLE (siw's `siw_qp_nextstate_from_rts` has no IDLE: the
/// connection must end first, by CLOSING or ERROR); CLOSING → IDLE (siw moves a CLOSING
/// QP to IDLE itself when the LLP close finished, `siw_qp_llp_close`; here too: once the
/// graceful close finished the QP is IDLE and may be reset, before that the close is
/// still draining work); TERMINATE → IDLE (ERROR follows once the Terminate is sent).
/// RTS is entered by [`QueuePair::connect`] / [`ConnRequest::accept`] only (siw needs the
/// LLP handle for it).
///
/// Attributes change only in IDLE before the connection was started (connect or accept),
/// or together with / after a reset: once a connection started they are negotiated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QpModify {
    /// Move to this state.
    pub state: Option<QpState>,
    /// Requested inbound RDMA Read depth (at most 0x3FFF, the MPA v2 field).
    pub ird: Option<u32>,
    /// Requested outbound RDMA Read depth (at most 0x3FFF).
    pub ord: Option<u32>,
    /// Require CRC32c on FPDUs.
    pub crc: Option<bool>,
    /// Require markers in the FPDUs we receive.
    pub markers: Option<bool>,
    /// Largest inline payload (0 disables inline; bounded as
    /// [`QpInitAttr::max_inline_data`]). Refused while work is queued.
    pub max_inline_data: Option<usize>,
    /// MPA revision to request / highest accepted ([`MpaAttr::revision`], 1 or 2).
    pub revision: Option<u8>,
    /// The P2P RTR type the Initiator offers ([`MpaAttr::p2p_rtr`]): `Some(None)` turns
    /// P2P off, `Some(Some(t))` asks for type `t`. The result must pass
    /// [`MpaAttr::validate`] (P2P needs revision 2), else the whole modify is refused.
    pub p2p_rtr: Option<Option<RtrType>>,
}

impl QpModify {
    /// A state change only.
    pub fn to_state(state: QpState) -> QpModify {
        QpModify {
            state: Some(state),
            ..QpModify::default()
        }
    }

    /// Whether any attribute (not the state) is changed.
    pub fn has_attrs(&self) -> bool {
        self.ird.is_some()
            || self.ord.is_some()
            || self.crc.is_some()
            || self.markers.is_some()
            || self.max_inline_data.is_some()
            || self.revision.is_some()
            || self.p2p_rtr.is_some()
    }

    /// `mpa` with this change's MPA fields applied.
    pub(crate) fn apply_mpa(&self, mpa: &MpaAttr) -> MpaAttr {
        MpaAttr {
            revision: self.revision.unwrap_or(mpa.revision),
            crc: self.crc.unwrap_or(mpa.crc),
            markers: self.markers.unwrap_or(mpa.markers),
            p2p_rtr: self.p2p_rtr.unwrap_or(mpa.p2p_rtr),
        }
    }
}

/// Where a QP's connection is, as [`check_modify`] needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnPhase {
    /// No connect or accept was applied (a new QP, or one just reset).
    Unused,
    /// A connection was started and has not ended (connecting, MPA, RTS, closing).
    Active,
    /// The connection ended (closed, failed, or the QP was moved to ERROR).
    Done,
}

/// Whether `m` is legal for a QP in `cur` whose connection is in `phase`. `Ok(true)`:
/// the change includes a reset (ERROR → IDLE, or IDLE → IDLE after the connection
/// ended); `Err` carries the reason.
pub(crate) fn check_modify(cur: QpState, phase: ConnPhase, m: &QpModify) -> Result<bool, String> {
    use QpState::*;
    let reset =
        m.state == Some(Idle) && (cur == Error || (cur == Idle && phase == ConnPhase::Done));
    if m.has_attrs() {
        if !reset && (cur != Idle || phase != ConnPhase::Unused) {
            return Err(format!(
                "QP attributes can change only before connect/accept or with a reset to \
                 Idle (the QP is {cur:?}{})",
                if cur == Idle {
                    ", connection started"
                } else {
                    ""
                }
            ));
        }
        let max = u32::from(xwarp_ddp::mpa::frame::IRD_ORD_MAX);
        if m.ird.is_some_and(|v| v > max) || m.ord.is_some_and(|v| v > max) {
            return Err(format!("IRD/ORD must be at most {max} (MPA v2)"));
        }
    }
    let Some(to) = m.state else {
        return Ok(false);
    };
    match (cur, to) {
        (Error, Idle) => Ok(true),
        (a, b) if a == b => Ok(reset),
        (Idle | Rts | Closing | Terminate, Error) => Ok(false),
        (Rts, Closing | Terminate) => Ok(false),
        (_, Rts) => Err(format!(
            "{cur:?} -> Rts: RTS is entered by connect or accept"
        )),
        (Rts, Idle) => Err(
            "Rts -> Idle: the QP is connected; end the connection first (disconnect / \
             Closing, or Error), then reset it to Idle"
                .into(),
        ),
        (Closing, Idle) => Err(
            "Closing -> Idle: the graceful close is still draining work; the QP enters \
             Idle by itself when it finished (then modify to Idle resets it), or move it \
             to Error"
                .into(),
        ),
        (Terminate, Idle) => Err(
            "Terminate -> Idle: the Terminate is being sent; the QP enters Error next, \
             then reset it to Idle"
                .into(),
        ),
        (Error, _) => Err(format!(
            "Error -> {to:?}: from ERROR only a reset to Idle is possible"
        )),
        (Idle, Closing | Terminate) => Err(format!("Idle -> {to:?}: the QP is not connected")),
        _ => Err(format!("{cur:?} -> {to:?} is not a QP state transition")),
    }
}

/// An RC queue pair.
pub struct QueuePair {
    dev: Device,
    qpn: u32,
    /// Changed by [`QueuePair::modify`] (before connect only).
    max_inline: AtomicUsize,
    max_send_wr: usize,
    events: Receiver<CmEvent>,
    ready: Arc<Readiness>,
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair").field("qpn", &self.qpn).finish()
    }
}

/// Connect parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    /// Private data for the MPA Request (at most 251 bytes toward siw).
    pub private_data: Vec<u8>,
    /// Give up after this long (TCP handshake plus MPA negotiation).
    pub timeout: Duration,
}

impl Default for ConnectParams {
    fn default() -> Self {
        ConnectParams {
            private_data: Vec::new(),
            timeout: Duration::from_secs(10),
        }
    }
}

impl QueuePair {
    /// QP number (local).
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// Send queue depth.
    pub fn max_send_wr(&self) -> usize {
        self.max_send_wr
    }

    /// Post send work. Errors found here (SGL shape, inline size) are returned; a full
    /// send queue is found by the engine and completes the request with
    /// `LocalQpOperationError`.
    pub fn post_send(&self, wr: SendRequest) -> Result<(), PostError> {
        if let Some(data) = &wr.inline {
            if data.len() > self.max_inline.load(Ordering::Relaxed)
                || matches!(
                    wr.opcode,
                    SendOpcode::Read { .. } | SendOpcode::LocalInvalidate(_)
                )
            {
                return Err(PostError::InvalidSgl);
            }
        } else if wr.sgl.len() > MAX_SGE
            || (matches!(wr.opcode, SendOpcode::Read { .. }) && wr.sgl.len() != 1)
        {
            return Err(PostError::InvalidSgl);
        }
        self.dev
            .inner
            .send(Cmd::PostSend { qpn: self.qpn, wr })
            .map_err(|_| PostError::InvalidState)
    }

    /// Post a receive (QPs without SRQ).
    pub fn post_recv(&self, wr_id: u64, sgl: &[Sge]) -> Result<(), PostError> {
        if sgl.len() > MAX_SGE {
            return Err(PostError::InvalidSgl);
        }
        self.dev
            .inner
            .send(Cmd::PostRecv {
                qpn: self.qpn,
                wr: xwarp_rdmap::verbs::RecvWr {
                    wr_id,
                    sgl: sgl.to_vec(),
                },
            })
            .map_err(|_| PostError::InvalidState)
    }

    /// Connect to a listener at `remote`; the outcome comes as a [`CmEvent`]
    /// (`Established`, `Rejected`, `ConnectError`).
    pub fn connect(&self, remote: SocketAddr, params: ConnectParams) -> io::Result<()> {
        self.dev.inner.send(Cmd::Connect {
            qpn: self.qpn,
            remote,
            params,
        })
    }

    /// [`Self::connect`] and wait for the outcome: the peer's private data on success.
    pub fn connect_blocking(
        &self,
        remote: SocketAddr,
        params: ConnectParams,
    ) -> io::Result<Vec<u8>> {
        let timeout = params.timeout + Duration::from_secs(1);
        self.connect(remote, params)?;
        match self.next_event(timeout)? {
            CmEvent::Established { private_data, .. } => Ok(private_data),
            CmEvent::Rejected { private_data } => Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("rejected (private data {private_data:?})"),
            )),
            e => Err(io::Error::other(format!("connect failed: {e:?}"))),
        }
    }

    /// Graceful disconnect: queued work drains, then TCP closes; `Disconnected` follows.
    pub fn disconnect(&self) -> io::Result<()> {
        self.dev.inner.send(Cmd::Disconnect { qpn: self.qpn })
    }

    /// The current state (an engine round trip).
    ///
    /// siw names the states IDLE, RTR, RTS, CLOSING, TERMINATE, ERROR. siw's RTR (a
    /// connection being set up) is reported as [`QpState::Idle`]: attributes may still
    /// change and posted work waits for the connection; the QP enters `Rts` when the
    /// connection manager finished MPA (and, for a P2P Responder, the RTR arrived).
    /// `Closing` is a graceful close in progress (queued work drains, then TCP closes);
    /// after a clean graceful close the QP is `Idle` again (as in siw). `Terminate`: a
    /// Terminate is queued, `Error` follows once it is sent. `Error`: every outstanding
    /// and later work request completes with `WrFlushError`. From `Error`, and from
    /// `Idle` after a graceful close, a reset ([`QueuePair::modify`] to `Idle`) makes the
    /// QP usable for a new connect/accept.
    pub fn state(&self) -> io::Result<QpState> {
        Ok(self.query()?.state)
    }

    /// The QP's attributes as the engine knows them now (after `ibv_query_qp`).
    pub fn query(&self) -> io::Result<QpAttr> {
        let qpn = self.qpn;
        self.dev
            .inner
            .call(|reply| Cmd::QueryQp { qpn, reply })?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "QP not found"))
    }

    /// Change the state and/or attributes (after `ibv_modify_qp`; the rules are on
    /// [`QpModify`]). An illegal transition or an attribute change after the connection
    /// was started fails with `InvalidInput` and changes nothing. To ERROR is abortive:
    /// every outstanding and later work request completes with `WrFlushError` (exactly
    /// once); a connection (or a connect in progress) is reset and
    /// [`CmEvent::Disconnected`] (or `ConnectError`) follows; a QP that never connected
    /// reports no CM event. The call returns once the engine applied the change.
    ///
    /// **Reset** (to `Idle` from `Error`, or from `Idle` once a graceful close finished;
    /// verbs `IBV_QPS_RESET`): the QP becomes as freshly created, with the same
    /// [`Self::qp_num`], CQs, PD and attributes, and [`Self::connect`] /
    /// [`ConnRequest::accept`] work on it again. Everything outstanding already completed
    /// when the QP entered ERROR (or closed), exactly once; the reset adds no completion
    /// and no completion or CM event of the old connection follows it. The old
    /// connection's protocol state (MSNs, ORD/IRD queues, Terminate state, the negotiated
    /// MPA results, [`QpAttr::negotiated`], the addresses) is dropped, and CM events of it
    /// that were not read yet are discarded. Its TCP connection is released from the QP
    /// and never reused: reset (RST) if it is still open, or left to finish a graceful
    /// close it already began. The reset never waits for that: siw refuses to leave a
    /// state while a work request is still active (`-EAGAIN`), which cannot happen here,
    /// since the old connection's work was flushed when it ended. Attributes given in the
    /// same call apply after the reset. Work posted after the reset waits for the new
    /// connection, as on a new QP. Do not accept on the QP from another thread while it
    /// is being reset.
    ///
    /// siw itself treats ERROR as final (its `siw_qp_modify` ignores a move out of ERROR,
    /// and RESET maps to its IDLE); allowing the reset follows the verbs state machine.
    pub fn modify(&self, m: &QpModify) -> io::Result<()> {
        let qpn = self.qpn;
        let m2 = m.clone();
        let reset = self
            .dev
            .inner
            .call(|reply| Cmd::ModifyQp { qpn, m: m2, reply })?
            .map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
        if let Some(n) = m.max_inline_data {
            self.max_inline.store(n, Ordering::Relaxed);
        }
        if reset {
            // The engine answered after the reset, and it sends no event of the old
            // connection after it: everything queued now belongs to the old one.
            while self.events.try_recv().is_ok() {}
            self.ready.drain();
        }
        Ok(())
    }

    /// The next CM event, if any.
    pub fn poll_event(&self) -> Option<CmEvent> {
        self.events.try_recv().ok()
    }

    /// Wait up to `timeout` for the next CM event.
    pub fn next_event(&self, timeout: Duration) -> io::Result<CmEvent> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(e) = self.events.try_recv() {
                return Ok(e);
            }
            if !self.ready.wait(Some(deadline))? {
                return self
                    .events
                    .try_recv()
                    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no connection event"));
            }
        }
    }
}

impl AsRawFd for QueuePair {
    /// Readable when a CM event is queued.
    fn as_raw_fd(&self) -> RawFd {
        self.ready.as_raw_fd()
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let _ = self.dev.inner.send(Cmd::DestroyQp { qpn: self.qpn });
    }
}

/// A listening endpoint of the connection manager.
pub struct Listener {
    dev: Device,
    token: u64,
    rx: Receiver<engine::RequestMsg>,
    ready: Arc<Readiness>,
    addr: SocketAddr,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Listener {
    /// The listening address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Wait up to `timeout` for the next connection request.
    pub fn get_request(&self, timeout: Duration) -> io::Result<ConnRequest> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(m) = self.rx.try_recv() {
                return Ok(ConnRequest {
                    dev: self.dev.clone(),
                    conn: m.conn,
                    peer: m.peer,
                    private_data: m.req.private_data,
                    peer_ird: m.req.peer_ird,
                    peer_ord: m.req.peer_ord,
                    crc: m.req.crc,
                    markers: m.req.markers,
                    revision: m.req.revision,
                    p2p: m.req.rtr,
                    answered: false,
                });
            }
            if !self.ready.wait(Some(deadline))? && self.rx.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no connection request",
                ));
            }
        }
    }
}

impl AsRawFd for Listener {
    /// Readable when a request is queued.
    fn as_raw_fd(&self) -> RawFd {
        self.ready.as_raw_fd()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.dev.inner.send(Cmd::Unlisten { token: self.token });
    }
}

/// An incoming connection request (MPA Request received). Answer with
/// [`ConnRequest::accept`] or [`ConnRequest::reject`]; dropping it rejects.
pub struct ConnRequest {
    dev: Device,
    conn: u64,
    /// The Initiator's address.
    pub peer: SocketAddr,
    /// The Initiator's private data.
    pub private_data: Vec<u8>,
    /// The Initiator's IRD (MPA v2).
    pub peer_ird: Option<u16>,
    /// The Initiator's ORD (MPA v2).
    pub peer_ord: Option<u16>,
    /// CRC requested.
    pub crc: bool,
    /// Markers requested.
    pub markers: bool,
    /// MPA revision of the Request.
    pub revision: u8,
    /// P2P: the RTR type that will be used.
    pub p2p: Option<RtrType>,
    answered: bool,
}

impl std::fmt::Debug for ConnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnRequest")
            .field("peer", &self.peer)
            .field("private_data", &self.private_data)
            .field("peer_ird", &self.peer_ird)
            .field("peer_ord", &self.peer_ord)
            .finish()
    }
}

impl ConnRequest {
    /// Accept on `qp` (not yet connected) with our private data; `Established` follows
    /// on the QP's events. Returns once the engine bound the request to the QP.
    ///
    /// Errors (as `rdma_accept`), reported here and never as an event of `qp`:
    /// `InvalidInput` if `qp` was already used (connected, connecting, accepted, or in
    /// ERROR; a reset with [`QueuePair::modify`] to `Idle` makes it unused again) — the
    /// request's connection is then dropped (reset); `ConnectionAborted` if
    /// the Initiator's connection went away before the answer.
    pub fn accept(mut self, qp: &QueuePair, private_data: &[u8]) -> io::Result<()> {
        self.answered = true;
        let (conn, qpn) = (self.conn, qp.qpn);
        let private_data = private_data.to_vec();
        self.dev.inner.call(|reply| Cmd::Accept {
            conn,
            qpn,
            private_data,
            reply,
        })?
    }

    /// Reject with private data (MPA Reply with R=1), then close.
    pub fn reject(mut self, private_data: &[u8]) -> io::Result<()> {
        self.answered = true;
        self.dev.inner.send(Cmd::Reject {
            conn: self.conn,
            private_data: private_data.to_vec(),
        })
    }
}

impl Drop for ConnRequest {
    fn drop(&mut self) {
        if !self.answered {
            let _ = self.dev.inner.send(Cmd::Reject {
                conn: self.conn,
                private_data: Vec::new(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{check_modify, ConnPhase, MpaAttr, QpModify, QpState, RtrType};

    const ALL: [QpState; 5] = [
        QpState::Idle,
        QpState::Rts,
        QpState::Closing,
        QpState::Terminate,
        QpState::Error,
    ];
    const PHASES: [ConnPhase; 3] = [ConnPhase::Unused, ConnPhase::Active, ConnPhase::Done];

    /// siw_qp_modify's table (siw_qp_nextstate_from_idle/_rts/_term/_close): from IDLE
    /// only ERROR (RTS needs the LLP handle, so only connect/accept enter it); from RTS
    /// CLOSING, TERMINATE, ERROR; from CLOSING and TERMINATE only ERROR. Plus the verbs
    /// RESET: ERROR → IDLE, and IDLE → IDLE once the connection ended, report a reset.
    /// To the current state is a no-op; every other pair is refused with a reason.
    #[test]
    fn siw_qp_modify_transition_table() {
        use QpState::*;
        let legal = |from: QpState, to: QpState| {
            from == to
                || matches!(
                    (from, to),
                    (Idle | Rts | Closing | Terminate, Error)
                        | (Rts, Closing | Terminate)
                        | (Error, Idle)
                )
        };
        let mut n_legal = 0;
        for from in ALL {
            for to in ALL {
                for phase in PHASES {
                    let r = check_modify(from, phase, &QpModify::to_state(to));
                    if legal(from, to) {
                        let reset = to == Idle
                            && (from == Error || (from == Idle && phase == ConnPhase::Done));
                        assert_eq!(r, Ok(reset), "{from:?} -> {to:?} ({phase:?})");
                        n_legal += 1;
                    } else {
                        let why = r.expect_err(&format!("{from:?} -> {to:?} accepted"));
                        assert!(why.contains(&format!("{to:?}")), "{why}");
                    }
                }
            }
        }
        // 5 no-ops + 4 to ERROR + 2 from RTS + the reset from ERROR, in each phase.
        assert_eq!(n_legal, 3 * (5 + 4 + 2 + 1));
    }

    /// Attributes change only in IDLE before connect/accept, or with a reset; IRD/ORD
    /// fit the 14-bit MPA v2 fields (RFC 6581 §3); a refused attribute fails the whole
    /// modify.
    #[test]
    fn rfc6581_attributes_only_before_connect_and_within_14_bits() {
        let attrs = QpModify {
            ird: Some(0x3FFF),
            ord: Some(1),
            crc: Some(true),
            markers: Some(false),
            max_inline_data: Some(0),
            revision: Some(2),
            p2p_rtr: Some(Some(RtrType::Read)),
            ..QpModify::default()
        };
        assert!(attrs.has_attrs());
        assert_eq!(
            check_modify(QpState::Idle, ConnPhase::Unused, &attrs),
            Ok(false)
        );
        for phase in [ConnPhase::Active, ConnPhase::Done] {
            assert!(check_modify(QpState::Idle, phase, &attrs).is_err());
        }
        for s in ALL.into_iter().filter(|&s| s != QpState::Idle) {
            assert!(check_modify(s, ConnPhase::Done, &attrs).is_err(), "{s:?}");
            let with_state = QpModify {
                state: Some(QpState::Error),
                ..attrs.clone()
            };
            assert!(
                check_modify(s, ConnPhase::Done, &with_state).is_err(),
                "{s:?}"
            );
        }
        // With a reset the attributes are judged as on a new QP.
        let with_reset = QpModify {
            state: Some(QpState::Idle),
            ..attrs.clone()
        };
        assert_eq!(
            check_modify(QpState::Error, ConnPhase::Active, &with_reset),
            Ok(true)
        );
        assert_eq!(
            check_modify(QpState::Idle, ConnPhase::Done, &with_reset),
            Ok(true)
        );
        assert!(check_modify(QpState::Idle, ConnPhase::Active, &with_reset).is_err());
        assert!(check_modify(QpState::Rts, ConnPhase::Active, &with_reset).is_err());
        for bad in [
            QpModify {
                ird: Some(0x4000),
                ..QpModify::default()
            },
            QpModify {
                ord: Some(u32::MAX),
                ..QpModify::default()
            },
        ] {
            assert!(check_modify(QpState::Idle, ConnPhase::Unused, &bad).is_err());
        }
        assert!(!QpModify::to_state(QpState::Error).has_attrs());
    }

    /// RFC 6581 §3: the RTR type is negotiated in the MPA v2 block, so P2P needs
    /// revision 2; revisions other than 1 and 2 do not exist (RFC 5044 §7.1, RFC 6581).
    #[test]
    fn rfc6581_p2p_needs_revision_2() {
        let base = MpaAttr::default();
        assert_eq!(base.validate(), Ok(()));
        let m = |revision, p2p_rtr| QpModify {
            revision,
            p2p_rtr,
            ..QpModify::default()
        };
        let ok = [
            m(Some(1), Some(None)),
            m(Some(2), Some(Some(RtrType::Send))),
            m(None, Some(Some(RtrType::Read))),
            m(None, Some(None)),
        ];
        for x in ok {
            let a = x.apply_mpa(&base);
            assert_eq!(a.validate(), Ok(()), "{x:?}");
        }
        let v1 = m(Some(1), Some(None)).apply_mpa(&base);
        assert_eq!((v1.revision, v1.p2p_rtr), (1, None));
        // Revision 1 keeping the default Write RTR, or P2P asked on a revision-1 QP.
        for (x, on) in [
            (m(Some(1), None), &base),
            (m(None, Some(Some(RtrType::Write))), &v1),
            (m(Some(0), Some(None)), &base),
            (m(Some(3), None), &base),
        ] {
            let why = x.apply_mpa(on).validate().expect_err(&format!("{x:?}"));
            assert!(why.contains("revision"), "{why}");
        }
    }
}
