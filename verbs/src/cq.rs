//! Completion queues: [`CompletionQueue`] (the application side) and the engine side
//! that pushes [`WorkCompletion`]s into it. With the `tokio` feature, [`AsyncCq`] reads
//! one as an async stream of completions ([`cq_async`]).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{fence, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use xwarp_poll_driver::engine::InlineDriver;
use xwarp_rdmap::verbs::CompletionStatus;
use xwarp_rdmap::Stag;
use xwarp_stack::Readiness;

#[cfg(feature = "tokio")]
#[path = "cq_async.rs"]
pub mod cq_async;
#[cfg(feature = "tokio")]
pub use cq_async::AsyncCq;

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
    /// An empty queue; `depth` is advisory (the queue grows as needed).
    pub(crate) fn new(depth: usize) -> io::Result<CqShared> {
        let (tx, rx) = crossbeam_channel::unbounded();
        Ok(CqShared {
            tx,
            rx,
            arm: AtomicU8::new(ARM_NONE),
            ready: Readiness::new()?,
            depth,
        })
    }

    /// Engine side: queue a completion and fire the notification if armed for it.
    pub(crate) fn push(&self, wc: WorkCompletion) {
        let solicited = wc.solicited || wc.status != CompletionStatus::Success;
        let _ = self.tx.send(wc);
        // Pairs with the fence in `req_notify`: either the application's poll after
        // arming sees this completion, or this load sees the arm (no lost wakeup).
        fence(Ordering::SeqCst);
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
///
/// When the engine runs in inline mode (`EngineMode::Inline`, `XWARP_MODE=inline`), the
/// polls drive it: [`CompletionQueue::poll_one`] and [`CompletionQueue::poll`] run one
/// engine iteration on the calling thread when the queue is empty and look again, and
/// [`CompletionQueue::next_polling`] drives while it polls, then parks (the engine's
/// keeper takes over) before it sleeps on the fd.
#[derive(Clone)]
pub struct CompletionQueue {
    pub(crate) shared: Arc<CqShared>,
    /// The engine's inline driver (inline mode).
    pub(crate) driver: Option<InlineDriver>,
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("queued", &self.shared.rx.len())
            .finish()
    }
}

impl CompletionQueue {
    /// Take one completion (in inline mode, an empty queue runs one engine iteration
    /// first and is looked at again).
    pub fn poll_one(&self) -> Option<WorkCompletion> {
        if let Ok(wc) = self.shared.rx.try_recv() {
            return Some(wc);
        }
        let d = self.driver.as_ref()?;
        d.try_drive();
        self.shared.rx.try_recv().ok()
    }

    /// The engine's inline driver when it runs in inline mode (`None` in thread mode).
    pub fn inline_driver(&self) -> Option<&InlineDriver> {
        self.driver.as_ref()
    }

    /// How many completions are waiting to be polled.
    pub fn queued(&self) -> usize {
        self.shared.rx.len()
    }

    /// Append up to `max` completions to `out`; returns how many (in inline mode, an
    /// empty queue runs one engine iteration first and is looked at again).
    pub fn poll(&self, out: &mut Vec<WorkCompletion>, max: usize) -> usize {
        if max > 0 && self.shared.rx.is_empty() {
            if let Some(d) = &self.driver {
                d.try_drive();
            }
        }
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
    /// (`solicited_only`: the next Send with SE, or any error completion). One-shot: a
    /// fired notification must be armed again. Poll once more after arming: a
    /// completion queued just before it fires nothing.
    pub fn req_notify(&self, solicited_only: bool) {
        self.shared.arm.store(
            if solicited_only {
                ARM_SOLICITED
            } else {
                ARM_ANY
            },
            Ordering::SeqCst,
        );
        // Pairs with the fence in `CqShared::push` (see there): poll after this.
        fence(Ordering::SeqCst);
    }

    /// Sleep until the armed notification fired or `timeout` passed (`Ok(false)`).
    /// Typical use: `req_notify`, poll again, then `wait`.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        // Inline mode: the keeper runs the engine while this thread sleeps.
        if let Some(d) = &self.driver {
            d.park();
        }
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
        let poll = self.driver.as_ref().map_or(poll, |d| poll.max(d.spin()));
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
                if self.driver.is_some() {
                    // `poll_one` drove the engine: this thread is the engine.
                    continue;
                }
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
            if let Some(d) = &self.driver {
                d.park();
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
