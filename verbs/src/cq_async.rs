//! A completion queue as an async stream of completions (feature `tokio`):
//! [`AsyncCq`] implements [`futures_core::Stream`]`<Item = `[`WorkCompletion`]`>` and has
//! an `async fn next`.
//!
//! ```no_run
//! # async fn run(cq: xwarp_verbs::CompletionQueue) -> std::io::Result<()> {
//! let cq = cq.into_stream()?;
//! let wc = cq.next().await?; // every completion, in the order the engine posted them
//! # let _ = wc; Ok(()) }
//! ```
//!
//! It waits on the CQ's completion-channel eventfd registered with the runtime's reactor
//! (tokio's `AsyncFd`): no thread of its own, no polling loop. When the queue is empty it
//! arms the notification ([`CompletionQueue::req_notify`], for any completion or, with
//! [`AsyncCq::solicited_only`], for the next solicited one or an error), polls once more
//! (a completion that came before the arm is taken then, not missed) and only then
//! sleeps; a wakeup clears the reactor's readiness and polls again. Completions are never
//! lost or reordered: the stream takes them from the queue itself, the eventfd only says
//! when to look. In solicited-only mode the stream still yields every completion, but
//! an empty queue sleeps until a solicited or error completion arrives, then yields all
//! that queued up (the `ibv_req_notify_cq(cq, 1)` pattern).
//!
//! Other handles on the same CQ may poll it too (each completion goes to one taker).
//! Must be created inside a tokio runtime with I/O enabled.

use std::future::poll_fn;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::cq::{CompletionQueue, WorkCompletion};

/// A [`CompletionQueue`] read as an async stream (see the [module docs](self)).
pub struct AsyncCq {
    /// A duplicate of the CQ's eventfd, registered with the reactor.
    ready: AsyncFd<OwnedFd>,
    cq: CompletionQueue,
    solicited_only: bool,
}

impl std::fmt::Debug for AsyncCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncCq")
            .field("cq", &self.cq)
            .field("solicited_only", &self.solicited_only)
            .finish_non_exhaustive()
    }
}

impl AsyncCq {
    /// Read `cq` asynchronously, woken by any completion.
    pub fn new(cq: CompletionQueue) -> io::Result<AsyncCq> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(io::Error::other(
                "AsyncCq needs a tokio runtime (create it from within one)",
            ));
        }
        let dup = cq.as_fd().try_clone_to_owned()?;
        // SAFETY: `dup` is an open descriptor the `AsyncFd` owns: it stays open, names
        // the same file description and `as_raw_fd` returns the same number until the
        // `AsyncFd` drops it (nothing else can close it).
        let ready = unsafe { AsyncFd::register_with_interest(dup, Interest::READABLE) }?;
        Ok(AsyncCq {
            ready,
            cq,
            solicited_only: false,
        })
    }

    /// Sleep on an empty queue until a solicited completion (a Send with Solicited
    /// Event) or an error completion arrives (`true`), or until any completion (`false`,
    /// the default). Completions are yielded all the same either way.
    pub fn solicited_only(mut self, solicited_only: bool) -> AsyncCq {
        self.solicited_only = solicited_only;
        self
    }

    /// The queue this stream reads.
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// The queue back (its notification may still be armed: a later completion then
    /// makes its descriptor readable once).
    pub fn into_inner(self) -> CompletionQueue {
        self.cq
    }

    /// The next completion; `Err` only if the runtime's reactor is gone.
    pub async fn next(&self) -> io::Result<WorkCompletion> {
        poll_fn(|cx| self.poll_completion(cx)).await
    }

    /// Poll for the next completion (only the last task that polled is woken).
    pub fn poll_completion(&self, cx: &mut Context<'_>) -> Poll<io::Result<WorkCompletion>> {
        loop {
            if let Some(wc) = self.cq.poll_one() {
                return Poll::Ready(Ok(wc));
            }
            // Arm, then look again: a completion queued before the arm took effect is
            // found now; one queued after it signals the descriptor.
            self.cq.req_notify(self.solicited_only);
            if let Some(wc) = self.cq.poll_one() {
                return Poll::Ready(Ok(wc));
            }
            let mut guard = ready!(self.ready.poll_read_ready(cx))?;
            // Reset the counter (non-blocking; the edge-triggered registration sees
            // every later signal whatever it holds), then clear the reactor's readiness
            // and poll again.
            let mut buf = [0u8; 8];
            let _ = rustix::io::read(guard.get_inner(), &mut buf);
            guard.clear_ready();
        }
    }
}

impl futures_core::Stream for AsyncCq {
    type Item = WorkCompletion;

    /// The next completion; the stream ends (`None`) only if the runtime's reactor is
    /// gone (a CQ itself never ends).
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<WorkCompletion>> {
        Poll::Ready(ready!(self.poll_completion(cx)).ok())
    }
}

impl CompletionQueue {
    /// This queue as an async stream of completions, woken by any completion (see
    /// [`AsyncCq`]; [`AsyncCq::solicited_only`] changes that). Call inside a tokio
    /// runtime.
    pub fn into_stream(self) -> io::Result<AsyncCq> {
        AsyncCq::new(self)
    }
}
