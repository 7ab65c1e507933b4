//! Completion queues: [`CompletionQueue`] (the application side) and the engine side
//! that pushes [`WorkCompletion`]s into it. With the `tokio` feature, [`AsyncCq`] reads
//! one as an async stream of completions ([`cq_async`]).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{fence, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
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
#[derive(Clone)]
pub struct CompletionQueue {
    pub(crate) shared: Arc<CqShared>,
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

    /// How many completions are waiting to be polled.
    pub fn queued(&self) -> usize {
        self.shared.rx.len()
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
