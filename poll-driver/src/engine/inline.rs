//! [`EngineMode::Inline`]: the engine's state behind a lock that application threads take
//! to run iterations themselves ([`InlineDriver`]), and the keeper, the engine thread of an
//! inline engine, which runs the loop only while no application thread drives.
//!
//! Who runs an iteration:
//! * an application thread, from its blocking and polling calls (`xwarp::net`, the verbs
//!   CQ, the shim) and from [`Doorbell::ring`] (so a queued command is served in the call
//!   that queued it); `try_lock` only: when another thread drives, the caller goes on;
//! * the keeper, once no application thread has driven for
//!   [`InlineConfig::keeper_after`] or a driver parked ([`InlineDriver::park`]: it is about
//!   to block). It then behaves as the thread-mode loop (iterate while there is work, then
//!   sleep on the doorbell, the backend's wait fd and the next deadline; it spins only on
//!   a `Yield` or `Forever` budget), taking the lock per iteration and backing off as soon
//!   as an application thread drives again.

use std::fmt;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use super::{
    soft, DoorbellInner, EngineExit, EngineMode, EngineStats, InlineConfig, LoopCtx, PollOutcome,
    Service, SpinBudget,
};
use crate::backend::Backend;
use crate::sys;

/// What the lock protects: everything the thread-mode loop owns.
struct Core<B, S> {
    ctx: LoopCtx,
    backend: B,
    service: S,
    st: EngineStats,
    /// A backend error ended the engine (drivers stop, the keeper exits).
    error: Option<io::Error>,
}

/// The state an inline engine's drivers and keeper share.
pub(crate) struct Shared<B, S> {
    cfg: InlineConfig,
    core: Mutex<Option<Core<B, S>>>,
    /// Origin of the nanosecond timestamps below.
    base: Instant,
    /// When an application thread last drove (ns since `base`, at least 1); 0: none is
    /// polling (never drove, or parked).
    last_drive: AtomicU64,
    /// The service's next deadline after the last iteration (ns since `base`; `u64::MAX`:
    /// none).
    deadline: AtomicU64,
    /// Set by the keeper while it stays out of an active driver's way; [`Shared::park`]
    /// wakes it then.
    backing_off: AtomicBool,
    stop: Arc<AtomicBool>,
    bell: Arc<DoorbellInner>,
    spin: SpinBudget,
    max_sleep: Option<Duration>,
}

impl<B: Backend, S: Service<B>> Shared<B, S> {
    pub(super) fn new(cfg: InlineConfig, ctx: LoopCtx, backend: B, service: S) -> Arc<Self> {
        let base = Instant::now();
        let stop = ctx.stop.clone();
        let bell = ctx.doorbell.inner.clone();
        let spin = ctx.config.spin;
        let max_sleep = ctx.config.max_sleep;
        let mut ctx = ctx;
        ctx.clock = super::LoopClock::new(base);
        Arc::new(Shared {
            cfg,
            core: Mutex::new(Some(Core {
                ctx,
                backend,
                service,
                st: EngineStats::default(),
                error: None,
            })),
            base,
            last_drive: AtomicU64::new(0),
            deadline: AtomicU64::new(u64::MAX),
            backing_off: AtomicBool::new(false),
            stop,
            bell,
            spin,
            max_sleep,
        })
    }
}

impl<B, S> Shared<B, S> {
    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos() as u64
    }

    fn lock(&self) -> MutexGuard<'_, Option<Core<B, S>>> {
        // A driver that panicked mid-iteration poisons the lock; the state is still the
        // only one there is, and the keeper must be able to hand it back.
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How much longer an application thread counts as driving (`None`: it does not).
    fn app_active_for(&self, now: Instant) -> Option<Duration> {
        let last = self.last_drive.load(Ordering::SeqCst);
        if last == 0 {
            return None;
        }
        let since = self.ns(now).saturating_sub(last);
        let after = self.cfg.keeper_after.as_nanos() as u64;
        (since < after).then(|| Duration::from_nanos(after - since))
    }

    fn note_deadline(&self, d: Option<Instant>) {
        let v = d.map_or(u64::MAX, |d| self.ns(d).max(1));
        self.deadline.store(v, Ordering::Relaxed);
    }
}

/// One iteration on `core` (either kind of caller).
fn iterate<B: Backend, S: Service<B>>(core: &mut Core<B, S>) -> io::Result<(PollOutcome, Instant)> {
    core.ctx
        .iterate(&mut core.backend, &mut core.service, &mut core.st)
}

/// The type-erased side application threads see.
trait Drive: Send + Sync {
    fn drive(&self, wait: bool) -> Option<bool>;
    fn park(&self);
    fn next_deadline(&self) -> Option<Instant>;
    fn spin(&self) -> Duration;
}

impl<B: Backend + Send, S: Service<B>> Drive for Shared<B, S> {
    fn drive(&self, wait: bool) -> Option<bool> {
        let mut g = if wait {
            self.lock()
        } else {
            match self.core.try_lock() {
                Ok(g) => g,
                Err(TryLockError::WouldBlock) => return None,
                Err(TryLockError::Poisoned(_)) => return None,
            }
        };
        let core = g.as_mut()?;
        if core.error.is_some() {
            return None;
        }
        match iterate(core) {
            Ok((out, now)) => {
                core.st.inline_iterations += 1;
                self.last_drive.store(self.ns(now).max(1), Ordering::SeqCst);
                self.note_deadline(out.next_deadline);
                drop(g);
                // The keeper sleeps as an engine (on a deadline this thread may since
                // have moved, with nobody to wake it if this thread stops driving): wake
                // it once, so it watches this thread instead (one eventfd write per
                // keeper sleep, not per iteration).
                if self.bell.sleeping.load(Ordering::Relaxed)
                    && self.bell.sleeping.swap(false, Ordering::SeqCst)
                {
                    self.bell.efd_force();
                }
                Some(out.busy)
            }
            Err(e) => {
                // The engine ends as a thread-mode loop would: the keeper hands the
                // error back through `EngineHandle::stop`.
                core.error = Some(e);
                drop(g);
                self.stop.store(true, Ordering::SeqCst);
                self.bell.efd_force();
                None
            }
        }
    }

    fn park(&self) {
        self.last_drive.store(0, Ordering::SeqCst);
        if self.backing_off.swap(false, Ordering::SeqCst) {
            self.bell.efd_force();
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        match self.deadline.load(Ordering::Relaxed) {
            u64::MAX => None,
            ns => Some(self.base + Duration::from_nanos(ns)),
        }
    }

    fn spin(&self) -> Duration {
        self.cfg.spin
    }
}

/// Runs iterations of an inline-mode engine from application threads. Cloneable; every
/// clone drives the same engine. Get it from [`super::EngineHandle::inline_driver`] or
/// [`super::Doorbell::inline_driver`].
///
/// Any thread may drive at any time: one runs an iteration at a time, the others'
/// [`InlineDriver::try_drive`] returns `None` at once. Do not call [`InlineDriver::drive`]
/// from inside the engine's own service (it waits for the lock the caller holds).
#[derive(Clone)]
pub struct InlineDriver {
    inner: Arc<dyn Drive>,
}

impl fmt::Debug for InlineDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InlineDriver")
            .field("spin", &self.inner.spin())
            .finish_non_exhaustive()
    }
}

thread_local! {
    /// Set while [`InlineDriver::deferring`] runs on this thread.
    static DEFER_RING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `true` inside [`InlineDriver::deferring`] on the calling thread.
pub(super) fn ring_deferred() -> bool {
    DEFER_RING.with(|d| d.get())
}

impl InlineDriver {
    /// Run `f` with this thread's doorbell rings not driving the engine: the work they
    /// announce waits for the thread's next drive (or the keeper, after
    /// [`InlineConfig::keeper_after`]). For event loops that queue many small writes and
    /// then poll: one iteration then sends them all (one NIC kick) instead of one
    /// iteration per write.
    pub fn deferring<R>(f: impl FnOnce() -> R) -> R {
        let was = DEFER_RING.with(|d| d.replace(true));
        let r = f();
        DEFER_RING.with(|d| d.set(was));
        r
    }

    /// Run one engine iteration unless another thread is running one: `Some(busy)` (the
    /// iteration found work), `None` when another thread drives or the engine stopped.
    pub fn try_drive(&self) -> Option<bool> {
        self.inner.drive(false)
    }

    /// Run one engine iteration, waiting for a thread that runs one to finish first.
    /// `false` when nothing was to be done or the engine stopped.
    pub fn drive(&self) -> bool {
        self.inner.drive(true).unwrap_or(false)
    }

    /// Say that the calling thread stops polling (it is about to block on a readiness
    /// descriptor): the keeper takes over at once instead of after
    /// [`InlineConfig::keeper_after`]. Costs an eventfd write when the keeper was waiting.
    pub fn park(&self) {
        self.inner.park()
    }

    /// The engine's earliest timer deadline as of the last iteration (`None`: none).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.inner.next_deadline()
    }

    /// How long blocking calls should keep driving before they park and sleep
    /// ([`InlineConfig::spin`]).
    pub fn spin(&self) -> Duration {
        self.inner.spin()
    }
}

pub(super) fn driver<B, S>(sh: Arc<Shared<B, S>>) -> InlineDriver
where
    B: Backend + Send + 'static,
    S: Service<B> + 'static,
{
    InlineDriver { inner: sh }
}

/// The state handed back without running (the keeper could not start as configured).
pub(super) fn abandon<B: Backend, S: Service<B>>(sh: &Shared<B, S>) -> EngineExit<B, S> {
    let core = sh.lock().take().expect("inline engine state taken twice");
    EngineExit {
        backend: core.backend,
        service: core.service,
        stats: EngineStats::default(),
        error: None,
    }
}

/// The keeper: the engine thread of an inline engine, until the engine stops.
pub(super) fn keep<B: Backend, S: Service<B>>(sh: &Shared<B, S>) -> EngineExit<B, S> {
    let error = keep_loop(sh).err();
    let mut core = sh.lock().take().expect("inline engine state taken twice");
    let error = error.or(core.error.take());
    core.ctx.finish(core.backend, core.service, core.st, error)
}

fn keep_loop<B: Backend, S: Service<B>>(sh: &Shared<B, S>) -> io::Result<()> {
    let bell = sh.bell.clone();
    let bell_fd = bell.efd.as_raw_fd();
    let wait_fd = match sh.lock().as_ref() {
        Some(c) => c.backend.wait_fd(),
        None => return Ok(()),
    };
    let mut idle_since: Option<Instant> = None;
    while !sh.stop.load(Ordering::Relaxed) {
        // An application thread drives: stay out of its way until it has been quiet for
        // `keeper_after` or parks.
        if let Some(left) = sh.app_active_for(Instant::now()) {
            sh.backing_off.store(true, Ordering::SeqCst);
            let mut readable = [false];
            if sh.app_active_for(Instant::now()).is_some() && !sh.stop.load(Ordering::SeqCst) {
                sys::wait_readable(&[bell_fd], &mut readable, Some(left))?;
            }
            sh.backing_off.store(false, Ordering::SeqCst);
            if readable[0] {
                bell.efd.drain()?;
            }
            idle_since = None;
            continue;
        }
        // Nobody drives: run the loop as the engine thread would, one locked iteration
        // at a time.
        let (out, now) = {
            let mut g = sh.lock();
            let Some(core) = g.as_mut() else {
                return Ok(());
            };
            if let Some(e) = core.error.take() {
                return Err(e);
            }
            let r = iterate(core)?;
            sh.note_deadline(r.0.next_deadline);
            r
        };
        if out.busy {
            if let Some(since) = idle_since.take() {
                if let Some(c) = sh.lock().as_mut() {
                    c.ctx.clock.spin += now.saturating_duration_since(since);
                }
            }
            continue;
        }
        let since = *idle_since.get_or_insert(now);
        // The keeper is a fallback: it does not busy-spin (it would sit on the core of
        // the application thread it covers for, which then waits for a scheduler slice
        // to get it back: 1 ms p99 half round trips in `xwarp bench tcp` with the keeper
        // on the engine's spin budget). A yielding budget is kept, `Forever` too (a
        // dedicated core); anything else sleeps as soon as an iteration finds nothing.
        let spun_out = match sh.spin {
            SpinBudget::Yield(d) => now.duration_since(since) >= d,
            SpinBudget::Forever => false,
            SpinBudget::Iterations(_) | SpinBudget::Duration(_) => true,
        };
        if !spun_out {
            if matches!(sh.spin, SpinBudget::Yield(_)) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        // Announce the sleep, then look once more (as the thread-mode loop does).
        bell.sleeping.store(true, Ordering::SeqCst);
        let (may_sleep, last, backend_deadline) = {
            let mut g = sh.lock();
            let Some(core) = g.as_mut() else {
                return Ok(());
            };
            let may_sleep = match core.backend.prepare_sleep() {
                Ok(b) => b,
                Err(e) if soft(&e) => {
                    core.st.backend_soft_errors += 1;
                    false
                }
                Err(e) => return Err(e),
            };
            let (last, last_at) = iterate(core)?;
            sh.note_deadline(last.next_deadline);
            core.ctx.clock.spin += last_at.saturating_duration_since(since);
            let bd = core.backend.next_deadline();
            if may_sleep && !last.busy {
                core.st.sleeps += 1;
                core.ctx.publish(&core.st, &core.backend, last_at);
            } else {
                core.st.sleeps_cancelled += 1;
            }
            (may_sleep, last, bd)
        };
        idle_since = None;
        if !may_sleep
            || last.busy
            || sh.stop.load(Ordering::SeqCst)
            || sh.app_active_for(Instant::now()).is_some()
        {
            bell.sleeping.store(false, Ordering::SeqCst);
            continue;
        }
        let now = Instant::now();
        let deadline = [
            last.next_deadline.or(out.next_deadline),
            backend_deadline,
            sh.max_sleep.and_then(|d| now.checked_add(d)),
        ]
        .into_iter()
        .flatten()
        .min();
        let timeout = deadline.map(|d| d.saturating_duration_since(now));
        let mut readable = [false; 2];
        match wait_fd {
            Some(fd) => sys::wait_readable(&[bell_fd, fd], &mut readable, timeout)?,
            None => sys::wait_readable(&[bell_fd], &mut readable[..1], timeout)?,
        }
        bell.sleeping.store(false, Ordering::SeqCst);
        if readable[0] {
            bell.efd.drain()?;
        }
        let woke = Instant::now();
        if let Some(core) = sh.lock().as_mut() {
            if readable[0] {
                core.st.wakeups_doorbell += 1;
            }
            if readable[1] {
                core.st.wakeups_backend += 1;
            }
            if !readable[0] && !readable[1] {
                core.st.wakeups_timeout += 1;
            }
            core.ctx.clock.sleep += woke.saturating_duration_since(now);
            core.ctx.publish(&core.st, &core.backend, woke);
        }
    }
    Ok(())
}

impl EngineMode {
    /// The inline settings, if this is [`EngineMode::Inline`].
    pub fn inline_config(&self) -> Option<InlineConfig> {
        match self {
            EngineMode::Inline(c) => Some(*c),
            EngineMode::Thread => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Doorbell, Engine, EngineConfig};
    use super::*;
    use crate::vwire::{VirtualWire, WireConfig};
    use crossbeam_channel::{Receiver, Sender};

    /// Answers requests (`r` -> `r + 1`) and fires one timer at `at`.
    struct Svc {
        reqs: Receiver<u64>,
        done: Sender<u64>,
        at: Option<Instant>,
        fired: Sender<Instant>,
    }

    impl<B: Backend> Service<B> for Svc {
        fn poll(&mut self, _b: &mut B, now: Instant) -> PollOutcome {
            let mut busy = false;
            while let Ok(r) = self.reqs.try_recv() {
                busy = true;
                let _ = self.done.send(r + 1);
            }
            if self.at.is_some_and(|t| now >= t) {
                self.at = None;
                busy = true;
                let _ = self.fired.send(now);
            }
            PollOutcome {
                busy,
                next_deadline: self.at,
            }
        }
    }

    fn inline_cfg() -> EngineConfig {
        EngineConfig {
            name: "inline-test".into(),
            mode: EngineMode::Inline(InlineConfig::default()),
            ..EngineConfig::default()
        }
    }

    #[test]
    fn several_threads_driving_at_once_serve_every_request_exactly_once() {
        let (_a, b) = VirtualWire::pair(WireConfig::default()).unwrap();
        let (req_tx, req_rx) = crossbeam_channel::unbounded();
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let (fired_tx, _fired_rx) = crossbeam_channel::unbounded();
        let svc = Svc {
            reqs: req_rx,
            done: done_tx,
            at: None,
            fired: fired_tx,
        };
        let eng =
            Engine::spawn_with_doorbell(inline_cfg(), Doorbell::new().unwrap(), b, svc).unwrap();
        let driver = eng.inline_driver().expect("inline engine has a driver");
        assert!(eng.doorbell().inline_driver().is_some());
        let per = 5000u64;
        let ths: Vec<_> = (0..4u64)
            .map(|t| {
                let (d, tx) = (driver.clone(), req_tx.clone());
                std::thread::spawn(move || {
                    for i in 0..per {
                        tx.send(t * per + i).unwrap();
                        // No doorbell: only driving serves it.
                        if i % 3 == 0 {
                            d.drive();
                        } else {
                            d.try_drive();
                        }
                    }
                })
            })
            .collect();
        for t in ths {
            t.join().unwrap();
        }
        let mut got: Vec<u64> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < (4 * per) as usize {
            assert!(Instant::now() < deadline, "{} answered", got.len());
            driver.drive();
            got.extend(done_rx.try_iter());
        }
        got.sort_unstable();
        let want: Vec<u64> = (1..=4 * per).collect();
        assert_eq!(got, want, "a request was lost or answered twice");
        let exit = eng.stop().unwrap();
        assert!(exit.stats.inline_iterations > 0, "{:?}", exit.stats);
        assert!(exit.error.is_none());
    }

    #[test]
    fn the_keeper_fires_a_timer_when_no_thread_drives() {
        let (_a, b) = VirtualWire::pair(WireConfig::default()).unwrap();
        let (_req_tx, req_rx) = crossbeam_channel::unbounded();
        let (done_tx, _done_rx) = crossbeam_channel::unbounded();
        let (fired_tx, fired_rx) = crossbeam_channel::unbounded();
        let at = Instant::now() + Duration::from_millis(30);
        let svc = Svc {
            reqs: req_rx,
            done: done_tx,
            at: Some(at),
            fired: fired_tx,
        };
        let eng = Engine::spawn(inline_cfg(), b, svc).unwrap();
        let fired = fired_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(fired >= at);
        let s = eng.stats();
        assert_eq!(s.inline_iterations, 0, "{s:?}");
        assert!(s.iterations > 0 && s.sleeps > 0, "{s:?}");
    }

    #[test]
    fn the_keeper_fires_a_timer_after_the_driving_threads_stop_polling() {
        let (_a, b) = VirtualWire::pair(WireConfig::default()).unwrap();
        let (req_tx, req_rx) = crossbeam_channel::unbounded();
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let (fired_tx, fired_rx) = crossbeam_channel::unbounded();
        let at = Instant::now() + Duration::from_millis(40);
        let svc = Svc {
            reqs: req_rx,
            done: done_tx,
            at: Some(at),
            fired: fired_tx,
        };
        let eng = Engine::spawn(inline_cfg(), b, svc).unwrap();
        let d = eng.inline_driver().unwrap();
        // Two threads drive for 10 ms (requests served inline), then nobody polls.
        let ths: Vec<_> = (0..2u64)
            .map(|k| {
                let (d, tx) = (d.clone(), req_tx.clone());
                std::thread::spawn(move || {
                    let t = Instant::now();
                    let mut i = 0;
                    while t.elapsed() < Duration::from_millis(10) {
                        tx.send(k * 1_000_000 + i).unwrap();
                        d.try_drive();
                        i += 1;
                    }
                    i
                })
            })
            .collect();
        let sent: u64 = ths.into_iter().map(|t| t.join().unwrap()).sum();
        let fired = fired_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the timer never fired after the application stopped polling");
        assert!(fired >= at);
        // Everything queued while the threads drove was served (inline or by the keeper).
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut got = 0u64;
        while got < sent {
            match done_rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(_) => got += 1,
                Err(_) => panic!("{got} of {sent} requests answered"),
            }
        }
        let s = eng.stop().unwrap().stats;
        assert!(
            s.inline_iterations > 0 && s.iterations > s.inline_iterations,
            "{s:?}"
        );
    }
}
