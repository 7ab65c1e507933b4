//! The engine loop: one thread per engine, optionally pinned to a core, that drives a
//! [`Backend`] and a [`Service`] (the TCP stack and the protocol layers above it) with a
//! spin-then-sleep policy.
//!
//! Contract (implementations fill in the rest of this module):
//! * [`Service::poll`] is called in a loop on the engine thread. It receives frames from
//!   the backend, runs TCP and upper layers, serves application requests and transmits.
//! * When `poll` reports no work for `spin_budget`, the engine calls
//!   [`Backend::prepare_sleep`] and sleeps in `poll(2)` on the backend's
//!   [`Backend::wait_fd`] and the engine's [`Doorbell`] until a frame arrives, an
//!   application rings the doorbell, or the service's next deadline passes.
//! * Applications never touch engine state: they push requests into lock-free queues owned
//!   by the service and ring the [`Doorbell`].
//!
//! ## Two modes ([`EngineMode`], `XWARP_MODE=thread|inline`)
//! * **Thread** (the default): the engine thread owns the backend and the service and runs
//!   the loop above; applications hand work over through queues and the doorbell.
//! * **Inline** (run to completion, as OpenOnload and libtpa do): the backend, the service
//!   and the loop's state sit behind a lock, and application threads run engine iterations
//!   themselves from their blocking and polling calls through an [`InlineDriver`]
//!   ([`EngineHandle::inline_driver`], also reachable from the [`Doorbell`]): the thread
//!   that queued a write pushes its segment out in the same call, and a spinning reader
//!   pulls the answer off the NIC itself, so no thread hand-off sits on the path. The
//!   engine thread becomes a *keeper* (`engine/inline.rs`): while an application thread
//!   drives, it stays out of the way; once none has driven for
//!   [`InlineConfig::keeper_after`], or a driver announced it is about to block
//!   ([`InlineDriver::park`]), it runs the loop itself (spin, then sleep on the doorbell,
//!   the NIC's wait fd and the next timer deadline), so timers fire and frames are taken
//!   in while the application is busy elsewhere or asleep. Any number of threads may
//!   drive: the lock admits one at a time, [`InlineDriver::try_drive`] just returns when
//!   another thread is driving. Inline iterations are counted in
//!   [`EngineStats::inline_iterations`] (and in `iterations`).

use crate::backend::Backend;
use std::time::Instant;

mod inline;
pub use inline::InlineDriver;

/// What one [`Service::poll`] iteration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PollOutcome {
    /// `true` if any frame, request or timer was processed (the engine keeps spinning).
    pub busy: bool,
    /// The earliest time the service needs to be polled again even if nothing arrives
    /// (TCP retransmission, delayed ACK, MPA timeouts). `None` means no timer is pending.
    pub next_deadline: Option<Instant>,
}

/// The work an engine runs on each iteration (implemented by `xwarp-stack`).
pub trait Service<B: Backend>: Send {
    /// Run one iteration at time `now`.
    fn poll(&mut self, backend: &mut B, now: Instant) -> PollOutcome;
}

use crate::sys::{self, EventFd};
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use xwarp_telemetry::{EngineCounters, Segment};

/// How long an idle engine keeps spinning before it sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpinBudget {
    /// Sleep after this many consecutive idle iterations (`0`: sleep as soon as idle).
    Iterations(u64),
    /// Sleep after being idle for this long.
    Duration(Duration),
    /// Never sleep (dedicated cores only).
    Forever,
    /// Stay awake for this long, but give the core away (`sched_yield`) on every idle
    /// iteration instead of busy-spinning: for an engine that shares its core with the
    /// application threads it serves, when those threads also yield while they wait.
    /// Handing work over between them then costs a context switch instead of a sleep
    /// and a cross-core wakeup. With a thread on the same core that busy-spins without
    /// yielding, each yield can cost a whole scheduler slice: use a short `Duration`
    /// there instead.
    Yield(Duration),
}

impl Default for SpinBudget {
    fn default() -> Self {
        SpinBudget::Duration(Duration::from_micros(50))
    }
}

impl SpinBudget {
    /// For engines that share their cores with the application threads they serve, when
    /// those threads yield while they wait: stay awake 50 µs, yielding the core on every
    /// idle round (measured with `xwarp bench rdma` on 2 cores: a 50 µs busy spin gave
    /// 135 µs half round trips, this 16 µs).
    pub const SHARED_CORES: SpinBudget = SpinBudget::Yield(Duration::from_micros(50));
}

/// Who runs the engine's iterations (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineMode {
    /// The engine thread runs every iteration; applications hand work over (default).
    #[default]
    Thread,
    /// Application threads drive the engine from their calls; the engine thread is a
    /// keeper that only steps in when none does.
    Inline(InlineConfig),
}

/// Settings of [`EngineMode::Inline`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InlineConfig {
    /// The keeper runs the loop once no application thread has driven for this long
    /// (default 1 ms), or at once after [`InlineDriver::park`].
    pub keeper_after: Duration,
    /// How long a blocking application call keeps driving and spinning before it parks
    /// and sleeps on its readiness descriptor ([`InlineDriver::spin`]; default 200 µs).
    pub spin: Duration,
}

impl Default for InlineConfig {
    fn default() -> Self {
        InlineConfig {
            keeper_after: Duration::from_millis(1),
            spin: Duration::from_micros(200),
        }
    }
}

impl EngineMode {
    /// The mode `XWARP_MODE` names: `thread` (or unset/empty) or `inline`. Anything else
    /// is an `InvalidInput` error naming the value.
    pub fn from_env() -> io::Result<EngineMode> {
        match std::env::var("XWARP_MODE") {
            Err(_) => Ok(EngineMode::Thread),
            Ok(v) => EngineMode::parse(&v),
        }
    }

    /// Parse a mode name (`thread`, `inline`; empty is `thread`).
    pub fn parse(v: &str) -> io::Result<EngineMode> {
        match v.trim() {
            "" | "thread" => Ok(EngineMode::Thread),
            "inline" => Ok(EngineMode::Inline(InlineConfig::default())),
            other => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("XWARP_MODE={other:?}: expected thread or inline"),
            )),
        }
    }

    /// [`EngineMode::from_env`], with an invalid value reported once on stderr and
    /// replaced by [`EngineMode::Thread`] (what [`EngineConfig::default`] uses).
    pub fn configured() -> EngineMode {
        EngineMode::from_env().unwrap_or_else(|e| {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| eprintln!("xwarp: {e}; running the engine in thread mode"));
            EngineMode::Thread
        })
    }

    /// `true` for [`EngineMode::Inline`].
    pub fn is_inline(&self) -> bool {
        matches!(self, EngineMode::Inline(_))
    }
}

/// Configuration of one engine thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Thread name (shows in `top -H`, debuggers and panics).
    pub name: String,
    /// Pin the engine thread to this core id (see `core_affinity::get_core_ids`).
    pub core: Option<usize>,
    /// Idle spinning before sleeping.
    pub spin: SpinBudget,
    /// Upper bound of one sleep even without deadlines (`None`: sleep until woken).
    pub max_sleep: Option<Duration>,
    /// Who runs the iterations; the default is what `XWARP_MODE` says
    /// ([`EngineMode::configured`]: thread mode when unset).
    pub mode: EngineMode,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            name: "xwarp-engine".into(),
            core: None,
            spin: SpinBudget::default(),
            max_sleep: None,
            mode: EngineMode::configured(),
        }
    }
}

#[derive(Debug)]
struct DoorbellInner {
    efd: EventFd,
    /// Set by the engine just before it sleeps; `ring` writes the eventfd only then.
    sleeping: AtomicBool,
    rings: AtomicU64,
    syscalls: AtomicU64,
    /// The inline driver of an inline-mode engine (set when it starts).
    driver: std::sync::OnceLock<InlineDriver>,
}

impl DoorbellInner {
    /// Write the eventfd (counted as a doorbell syscall).
    fn efd_force(&self) {
        self.syscalls.fetch_add(1, Ordering::Relaxed);
        // An eventfd write can only fail on a saturated counter or a bad fd; in both
        // cases there is nothing better to do than leave the engine to its next timeout.
        let _ = self.efd.notify();
    }
}

/// Wakes an engine from any thread. Cloneable and cheap: while the engine is awake
/// (spinning or working), [`Doorbell::ring`] is one atomic swap and no syscall.
#[derive(Debug, Clone)]
pub struct Doorbell {
    inner: Arc<DoorbellInner>,
}

impl Doorbell {
    /// A new doorbell (one eventfd).
    pub fn new() -> io::Result<Self> {
        Ok(Self {
            inner: Arc::new(DoorbellInner {
                efd: EventFd::new()?,
                sleeping: AtomicBool::new(false),
                rings: AtomicU64::new(0),
                syscalls: AtomicU64::new(0),
                driver: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Wake the engine if it sleeps. Call after publishing work into the service's
    /// queues: the engine polls its service once more after announcing that it will
    /// sleep, so work published before a ring that skipped the syscall is never missed.
    ///
    /// In [`EngineMode::Inline`] the ringing thread runs an engine iteration itself
    /// ([`InlineDriver::try_drive`]), so the work it queued is served before `ring`
    /// returns; only when another thread is driving does it fall back to waking the
    /// keeper if that sleeps.
    pub fn ring(&self) {
        self.inner.rings.fetch_add(1, Ordering::Relaxed);
        if let Some(d) = self.inner.driver.get() {
            if !inline::ring_deferred() && d.try_drive().is_some() {
                return;
            }
        }
        if self.inner.sleeping.swap(false, Ordering::SeqCst) {
            self.force();
        }
    }

    fn force(&self) {
        self.inner.efd_force();
    }

    /// The engine's [`InlineDriver`] when it runs in [`EngineMode::Inline`] (`None` in
    /// thread mode or before the engine started).
    pub fn inline_driver(&self) -> Option<&InlineDriver> {
        self.inner.driver.get()
    }

    /// Times [`Doorbell::ring`] was called.
    pub fn rings(&self) -> u64 {
        self.inner.rings.load(Ordering::Relaxed)
    }

    /// Times a ring actually wrote the eventfd (the engine was asleep or about to be).
    pub fn syscalls(&self) -> u64 {
        self.inner.syscalls.load(Ordering::Relaxed)
    }
}

/// Counters of one engine.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EngineStats {
    /// Loop iterations.
    pub iterations: u64,
    /// Iterations in which the service reported work.
    pub busy_iterations: u64,
    /// Times the engine went to sleep in `poll(2)`.
    pub sleeps: u64,
    /// Sleeps cancelled because work showed up while preparing to sleep.
    pub sleeps_cancelled: u64,
    /// Wakeups with the doorbell readable.
    pub wakeups_doorbell: u64,
    /// Wakeups with the backend's wait fd readable.
    pub wakeups_backend: u64,
    /// Wakeups because a deadline (service, backend or `max_sleep`) passed.
    pub wakeups_timeout: u64,
    /// Transient backend errors (`WouldBlock`, `Interrupted`) that the loop rode over.
    pub backend_soft_errors: u64,
    /// Iterations run by application threads ([`InlineDriver`]; also in `iterations`).
    pub inline_iterations: u64,
}

#[derive(Debug, Default)]
struct SharedStats {
    iterations: AtomicU64,
    busy_iterations: AtomicU64,
    sleeps: AtomicU64,
    sleeps_cancelled: AtomicU64,
    wakeups_doorbell: AtomicU64,
    wakeups_backend: AtomicU64,
    wakeups_timeout: AtomicU64,
    backend_soft_errors: AtomicU64,
    inline_iterations: AtomicU64,
}

impl SharedStats {
    fn publish(&self, s: &EngineStats) {
        let r = Ordering::Relaxed;
        self.iterations.store(s.iterations, r);
        self.busy_iterations.store(s.busy_iterations, r);
        self.sleeps.store(s.sleeps, r);
        self.sleeps_cancelled.store(s.sleeps_cancelled, r);
        self.wakeups_doorbell.store(s.wakeups_doorbell, r);
        self.wakeups_backend.store(s.wakeups_backend, r);
        self.wakeups_timeout.store(s.wakeups_timeout, r);
        self.backend_soft_errors.store(s.backend_soft_errors, r);
        self.inline_iterations.store(s.inline_iterations, r);
    }

    fn snapshot(&self) -> EngineStats {
        let r = Ordering::Relaxed;
        EngineStats {
            iterations: self.iterations.load(r),
            busy_iterations: self.busy_iterations.load(r),
            sleeps: self.sleeps.load(r),
            sleeps_cancelled: self.sleeps_cancelled.load(r),
            wakeups_doorbell: self.wakeups_doorbell.load(r),
            wakeups_backend: self.wakeups_backend.load(r),
            wakeups_timeout: self.wakeups_timeout.load(r),
            backend_soft_errors: self.backend_soft_errors.load(r),
            inline_iterations: self.inline_iterations.load(r),
        }
    }
}

/// What a stopped engine hands back.
#[derive(Debug)]
pub struct EngineExit<B, S> {
    /// The backend, with its counters and state as the loop left them.
    pub backend: B,
    /// The service.
    pub service: S,
    /// Final engine counters.
    pub stats: EngineStats,
    /// The backend error that ended the loop early, if any (`None`: stopped on request).
    pub error: Option<io::Error>,
}

/// Entry point: [`Engine::spawn`].
#[derive(Debug)]
pub struct Engine;

/// Control of a running engine. Dropping it stops the engine and joins its thread.
#[derive(Debug)]
pub struct EngineHandle<B, S> {
    thread: Option<JoinHandle<EngineExit<B, S>>>,
    stop: Arc<AtomicBool>,
    doorbell: Doorbell,
    stats: Arc<SharedStats>,
    tid: Arc<AtomicI32>,
    /// The inline driver in [`EngineMode::Inline`].
    driver: Option<InlineDriver>,
}

/// How often (in iterations) a busy engine publishes its counters.
const PUBLISH_EVERY: u64 = 1024;

/// At most how often the NIC's counters go to the telemetry segment (they may cost a
/// syscall: AF_XDP's `XDP_STATISTICS`).
const NIC_TELEMETRY_EVERY: Duration = Duration::from_millis(100);

impl Engine {
    /// Start an engine thread driving `backend` and `service`. Returns once the thread
    /// runs (and is pinned, when `config.core` is set).
    pub fn spawn<B, S>(
        config: EngineConfig,
        backend: B,
        service: S,
    ) -> io::Result<EngineHandle<B, S>>
    where
        B: Backend + Send + 'static,
        S: Service<B> + 'static,
    {
        Self::spawn_with_doorbell(config, Doorbell::new()?, backend, service)
    }

    /// Like [`Engine::spawn`], with a doorbell created beforehand, so that application
    /// handles built together with the service can hold it before the engine starts.
    /// One doorbell must serve one engine only.
    pub fn spawn_with_doorbell<B, S>(
        config: EngineConfig,
        doorbell: Doorbell,
        backend: B,
        service: S,
    ) -> io::Result<EngineHandle<B, S>>
    where
        B: Backend + Send + 'static,
        S: Service<B> + 'static,
    {
        Self::spawn_published(config, doorbell, backend, service, None)
    }

    /// Like [`Engine::spawn_with_doorbell`], publishing the loop's counters, where its
    /// time goes and the backend's counters ([`Backend::telemetry`]) to `telemetry` for
    /// `xwarp stat`: engine counters whenever [`EngineHandle::stats`] are published, NIC
    /// counters at most every 100 ms. The segment is removed when the loop ends.
    pub fn spawn_published<B, S>(
        config: EngineConfig,
        doorbell: Doorbell,
        backend: B,
        service: S,
        telemetry: Option<Arc<Segment>>,
    ) -> io::Result<EngineHandle<B, S>>
    where
        B: Backend + Send + 'static,
        S: Service<B> + 'static,
    {
        let core = match config.core {
            Some(id) => {
                // Any configured CPU. Not `core_affinity::get_core_ids`: that is the calling
                // thread's mask, and the caller may have pinned itself elsewhere. Whether
                // the cpuset allows the core is known when the engine thread pins itself.
                // SAFETY: sysconf has no preconditions.
                let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
                if n <= 0 || id >= n as usize {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("engine: core {id} does not exist ({n} CPUs)"),
                    ));
                }
                Some(core_affinity::CoreId { id })
            }
            None => None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(SharedStats::default());
        let tid = Arc::new(AtomicI32::new(0));
        let (ready_tx, ready_rx) = crossbeam_channel::bounded::<io::Result<()>>(1);
        let ctx = LoopCtx {
            config: config.clone(),
            doorbell: doorbell.clone(),
            stop: stop.clone(),
            stats: stats.clone(),
            seg: telemetry,
            clock: LoopClock::new(Instant::now()),
        };
        let tid2 = tid.clone();
        // Inline mode: the state goes behind the lock the drivers share and the thread
        // becomes its keeper.
        let run = match config.mode {
            EngineMode::Thread => Run::Thread(ctx, backend, service),
            EngineMode::Inline(ic) => Run::Keeper(inline::Shared::new(ic, ctx, backend, service)),
        };
        let driver = match &run {
            Run::Keeper(sh) => Some(inline::driver(sh.clone())),
            Run::Thread(..) => None,
        };
        let thread = std::thread::Builder::new()
            .name(config.name.clone())
            .spawn(move || {
                tid2.store(sys::current_tid(), Ordering::SeqCst);
                if let Some(c) = core {
                    if !core_affinity::set_for_current(c) {
                        let _ = ready_tx.send(Err(io::Error::other(format!(
                            "engine: cannot pin to core {}",
                            c.id
                        ))));
                        return run.abandon();
                    }
                }
                let _ = ready_tx.send(Ok(()));
                match run {
                    Run::Thread(ctx, backend, service) => ctx.run(backend, service),
                    Run::Keeper(sh) => inline::keep(&sh),
                }
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(io::Error::other("engine: thread died during start-up"));
            }
        }
        if let Some(d) = &driver {
            let _ = doorbell.inner.driver.set(d.clone());
        }
        Ok(EngineHandle {
            thread: Some(thread),
            stop,
            doorbell,
            stats,
            tid,
            driver,
        })
    }
}

/// What the engine thread runs: the loop itself, or the keeper of an inline engine.
enum Run<B, S> {
    Thread(LoopCtx, B, S),
    Keeper(Arc<inline::Shared<B, S>>),
}

impl<B: Backend, S: Service<B>> Run<B, S> {
    /// The state handed back unrun (the thread could not start as configured).
    fn abandon(self) -> EngineExit<B, S> {
        match self {
            Run::Thread(_, backend, service) => EngineExit {
                backend,
                service,
                stats: EngineStats::default(),
                error: None,
            },
            Run::Keeper(sh) => inline::abandon(&sh),
        }
    }
}

impl<B, S> EngineHandle<B, S> {
    /// The driver application threads run this engine's iterations with, when it runs in
    /// [`EngineMode::Inline`] (`None` in thread mode).
    pub fn inline_driver(&self) -> Option<InlineDriver> {
        self.driver.clone()
    }

    /// A doorbell that wakes this engine.
    pub fn doorbell(&self) -> Doorbell {
        self.doorbell.clone()
    }

    /// Counters as last published: on every sleep, on every wakeup (before the work that
    /// the wakeup brought is done) and every 1024 iterations while busy.
    pub fn stats(&self) -> EngineStats {
        self.stats.snapshot()
    }

    /// Whether the loop has ended (stopped, or ended by a backend error).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Kernel thread id of the engine thread.
    pub fn thread_id(&self) -> i32 {
        self.tid.load(Ordering::SeqCst)
    }

    /// CPU time (user + system) the engine thread has used, at clock-tick resolution.
    pub fn cpu_time(&self) -> io::Result<Duration> {
        sys::thread_cpu_time(self.thread_id())
    }

    /// Stop the loop, join the thread and hand back the backend, the service and the
    /// final counters. Fails only if the engine thread panicked.
    pub fn stop(mut self) -> io::Result<EngineExit<B, S>> {
        self.stop_and_join()
            .ok_or_else(|| io::Error::other("engine: already stopped"))?
    }

    fn stop_and_join(&mut self) -> Option<io::Result<EngineExit<B, S>>> {
        let thread = self.thread.take()?;
        self.stop.store(true, Ordering::SeqCst);
        self.doorbell.force();
        Some(
            thread
                .join()
                .map_err(|_| io::Error::other("engine: thread panicked")),
        )
    }
}

impl<B, S> Drop for EngineHandle<B, S> {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

struct LoopCtx {
    config: EngineConfig,
    doorbell: Doorbell,
    stop: Arc<AtomicBool>,
    stats: Arc<SharedStats>,
    /// Where `xwarp stat` reads the counters, if published.
    seg: Option<Arc<Segment>>,
    clock: LoopClock,
}

/// Where the loop's time goes (for the telemetry segment).
struct LoopClock {
    start: Instant,
    /// Idle but awake (spinning or yielding).
    spin: Duration,
    /// Asleep in `poll(2)`.
    sleep: Duration,
    /// When the NIC's counters are published next.
    next_nic: Instant,
}

impl LoopClock {
    fn new(now: Instant) -> LoopClock {
        LoopClock {
            start: now,
            spin: Duration::ZERO,
            sleep: Duration::ZERO,
            next_nic: now,
        }
    }
}

fn soft(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

impl LoopCtx {
    fn run<B: Backend, S: Service<B>>(
        mut self,
        mut backend: B,
        mut service: S,
    ) -> EngineExit<B, S> {
        let mut st = EngineStats::default();
        self.clock = LoopClock::new(Instant::now());
        let error = self.run_loop(&mut backend, &mut service, &mut st).err();
        self.finish(backend, service, st, error)
    }

    /// The loop ended (with `error`, if a backend failed): publish the last counters,
    /// remove the telemetry segment and hand the state back.
    fn finish<B: Backend, S: Service<B>>(
        mut self,
        backend: B,
        service: S,
        st: EngineStats,
        error: Option<io::Error>,
    ) -> EngineExit<B, S> {
        self.doorbell.inner.sleeping.store(false, Ordering::SeqCst);
        let now = Instant::now();
        self.clock.next_nic = now;
        self.publish(&st, &backend, now);
        if let Some(seg) = self.seg.take() {
            seg.remove();
        }
        EngineExit {
            backend,
            service,
            stats: st,
            error,
        }
    }

    /// One iteration: pull frames, run the service, push frames out. Also returns the
    /// time the service was polled at (the loop's only clock read per iteration).
    fn iterate<B: Backend, S: Service<B>>(
        &mut self,
        backend: &mut B,
        service: &mut S,
        st: &mut EngineStats,
    ) -> io::Result<(PollOutcome, Instant)> {
        let mut rx_ready = false;
        match backend.poll_rx() {
            Ok(r) => rx_ready = r,
            Err(e) if soft(&e) => st.backend_soft_errors += 1,
            Err(e) => return Err(e),
        }
        let now = Instant::now();
        let mut out = service.poll(backend, now);
        match backend.flush() {
            Ok(()) => {}
            Err(e) if soft(&e) => st.backend_soft_errors += 1,
            Err(e) => return Err(e),
        }
        st.iterations += 1;
        // Frames that were ready but not consumed still count as work to do.
        out.busy |= rx_ready;
        if out.busy {
            st.busy_iterations += 1;
        }
        // With a telemetry segment, also at least every 100 ms (a busy iteration can
        // take long).
        if st.iterations.is_multiple_of(PUBLISH_EVERY)
            || (self.seg.is_some() && now >= self.clock.next_nic)
        {
            self.publish(st, backend, now);
        }
        Ok((out, now))
    }

    /// Publish the counters for [`EngineHandle::stats`] and, if there is a segment, for
    /// `xwarp stat` (the NIC's at most every [`NIC_TELEMETRY_EVERY`]).
    fn publish<B: Backend>(&mut self, st: &EngineStats, backend: &B, now: Instant) {
        self.stats.publish(st);
        let Some(seg) = &self.seg else { return };
        let c = &self.clock;
        seg.set_engine(&EngineCounters {
            iterations: st.iterations,
            busy_iterations: st.busy_iterations,
            sleeps: st.sleeps,
            sleeps_cancelled: st.sleeps_cancelled,
            wakeups_doorbell: st.wakeups_doorbell,
            wakeups_backend: st.wakeups_backend,
            wakeups_timeout: st.wakeups_timeout,
            backend_soft_errors: st.backend_soft_errors,
            doorbell_rings: self.doorbell.rings(),
            doorbell_syscalls: self.doorbell.syscalls(),
            run_ns: now.saturating_duration_since(c.start).as_nanos() as u64,
            spin_ns: c.spin.as_nanos() as u64,
            sleep_ns: c.sleep.as_nanos() as u64,
        });
        if now >= c.next_nic {
            self.clock.next_nic = now + NIC_TELEMETRY_EVERY;
            seg.set_nic(&backend.telemetry());
        }
    }

    fn run_loop<B: Backend, S: Service<B>>(
        &mut self,
        backend: &mut B,
        service: &mut S,
        st: &mut EngineStats,
    ) -> io::Result<()> {
        let bell = self.doorbell.inner.clone();
        let mut idle_iters: u64 = 0;
        let mut idle_since: Option<Instant> = None;
        while !self.stop.load(Ordering::Relaxed) {
            let (out, now) = self.iterate(backend, service, st)?;
            if out.busy {
                if let Some(since) = idle_since.take() {
                    self.clock.spin += now.saturating_duration_since(since);
                }
                idle_iters = 0;
                continue;
            }
            idle_iters += 1;
            // The iteration's own timestamp: a second clock read per idle iteration
            // cost ~10% of a spinning engine.
            let since = *idle_since.get_or_insert(now);
            let spun_out = match self.config.spin {
                SpinBudget::Iterations(n) => idle_iters > n,
                SpinBudget::Duration(d) => now.duration_since(since) >= d,
                SpinBudget::Forever => false,
                SpinBudget::Yield(d) => now.duration_since(since) >= d,
            };
            if !spun_out {
                if matches!(self.config.spin, SpinBudget::Yield(_)) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            // Announce the sleep, then look once more: a doorbell rung before the
            // announcement skipped its syscall, so its work must be seen by this poll.
            bell.sleeping.store(true, Ordering::SeqCst);
            let may_sleep = match backend.prepare_sleep() {
                Ok(b) => b,
                Err(e) if soft(&e) => {
                    st.backend_soft_errors += 1;
                    false
                }
                Err(e) => return Err(e),
            };
            let (last, last_at) = self.iterate(backend, service, st)?;
            self.clock.spin += last_at.saturating_duration_since(since);
            if !may_sleep || last.busy || self.stop.load(Ordering::SeqCst) {
                bell.sleeping.store(false, Ordering::SeqCst);
                st.sleeps_cancelled += 1;
                idle_iters = 0;
                idle_since = None;
                continue;
            }
            let now = Instant::now();
            let deadline = [
                last.next_deadline.or(out.next_deadline),
                backend.next_deadline(),
                self.config.max_sleep.and_then(|d| now.checked_add(d)),
            ]
            .into_iter()
            .flatten()
            .min();
            let timeout = deadline.map(|d| d.saturating_duration_since(now));
            st.sleeps += 1;
            self.publish(st, backend, now);
            let bell_fd = bell.efd.as_raw_fd();
            let mut readable = [false; 2];
            match backend.wait_fd() {
                Some(fd) => sys::wait_readable(&[bell_fd, fd], &mut readable, timeout)?,
                None => sys::wait_readable(&[bell_fd], &mut readable[..1], timeout)?,
            }
            bell.sleeping.store(false, Ordering::SeqCst);
            if readable[0] {
                st.wakeups_doorbell += 1;
                bell.efd.drain()?;
            }
            if readable[1] {
                st.wakeups_backend += 1;
            }
            if !readable[0] && !readable[1] {
                st.wakeups_timeout += 1;
            }
            let woke = Instant::now();
            self.clock.sleep += woke.saturating_duration_since(now);
            self.publish(st, backend, woke);
            idle_iters = 0;
            idle_since = None;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vwire::{VirtualWire, WireConfig};
    use crossbeam_channel::{Receiver, Sender};

    /// Counts polls and answers each request from `reqs` on `done`.
    struct Answer {
        reqs: Receiver<u64>,
        done: Sender<u64>,
    }

    impl<B: Backend> Service<B> for Answer {
        fn poll(&mut self, _b: &mut B, _now: Instant) -> PollOutcome {
            let mut busy = false;
            while let Ok(r) = self.reqs.try_recv() {
                busy = true;
                let _ = self.done.send(r + 1);
            }
            PollOutcome {
                busy,
                next_deadline: None,
            }
        }
    }

    #[test]
    fn yield_budget_serves_work_then_sleeps_and_wakes_on_the_doorbell() {
        let (_a, b) = VirtualWire::pair(WireConfig::default()).unwrap();
        let (req_tx, req_rx) = crossbeam_channel::unbounded();
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let cfg = EngineConfig {
            name: "yield-test".into(),
            spin: SpinBudget::Yield(Duration::from_millis(20)),
            ..EngineConfig::default()
        };
        let svc = Answer {
            reqs: req_rx,
            done: done_tx,
        };
        let eng = Engine::spawn(cfg, b, svc).unwrap();
        let bell = eng.doorbell();
        // While it yields (awake), requests are served without a doorbell syscall
        // being needed for every one of them.
        for i in 0..100u64 {
            req_tx.send(i).unwrap();
            bell.ring();
            assert_eq!(done_rx.recv_timeout(Duration::from_secs(5)), Ok(i + 1));
        }
        // Idle beyond the budget: it sleeps and stops iterating.
        let t = Instant::now();
        while eng.stats().sleeps == 0 && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let s0 = eng.stats();
        assert!(s0.sleeps >= 1, "never slept: {s0:?}");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            eng.stats().iterations,
            s0.iterations,
            "iterated while asleep"
        );
        // The doorbell wakes it and the request is served.
        req_tx.send(1000).unwrap();
        bell.ring();
        assert_eq!(done_rx.recv_timeout(Duration::from_secs(5)), Ok(1001));
        let exit = eng.stop().unwrap();
        assert!(exit.stats.wakeups_doorbell >= 1, "{:?}", exit.stats);
        assert!(exit.error.is_none());
    }

    #[test]
    fn a_published_engine_shows_its_counters_and_removes_its_segment() {
        use xwarp_telemetry::reader::read_segment;
        use xwarp_telemetry::{Capacity, SegmentInfo};
        let dir = std::env::temp_dir().join(format!("xwarp-engine-tel-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let info = SegmentInfo {
            interface: "vwire".into(),
            ..SegmentInfo::default()
        };
        let seg = Arc::new(Segment::create_in(&dir, 0, &info, Capacity::default()).unwrap());
        let path = seg.path().to_path_buf();
        let (_a, b) = VirtualWire::pair(WireConfig::default()).unwrap();
        let (req_tx, req_rx) = crossbeam_channel::unbounded();
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let cfg = EngineConfig {
            spin: SpinBudget::Iterations(0),
            ..EngineConfig::default()
        };
        let svc = Answer {
            reqs: req_rx,
            done: done_tx,
        };
        let eng =
            Engine::spawn_published(cfg, Doorbell::new().unwrap(), b, svc, Some(seg)).unwrap();
        for i in 0..20u64 {
            req_tx.send(i).unwrap();
            eng.doorbell().ring();
            assert_eq!(done_rx.recv_timeout(Duration::from_secs(5)), Ok(i + 1));
        }
        std::thread::sleep(Duration::from_millis(30));
        let snap = read_segment(&path).unwrap();
        assert!(
            snap.engine.iterations > 0 && snap.engine.sleeps > 0,
            "{snap:?}"
        );
        assert!(snap.engine.wakeups_doorbell > 0, "{:?}", snap.engine);
        assert!(snap.engine.doorbell_rings >= 20, "{:?}", snap.engine);
        assert!(snap.engine.sleep_ns > 0 && snap.engine.run_ns >= snap.engine.sleep_ns);
        assert_eq!(snap.nic.mode, xwarp_telemetry::layout::MODE_VWIRE);
        assert_eq!(snap.interface, "vwire");
        drop(eng);
        assert!(!path.exists(), "segment left after the engine stopped");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
