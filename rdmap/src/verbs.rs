//! Verbs-level objects: work requests, completions, receive queues and shared receive
//! queues, and [`Resources`] (the STag table plus SRQs shared by the QPs of one engine).

use std::collections::VecDeque;

use crate::mem::{Stag, StagTable};

/// Most scatter/gather entries a work request may carry (bounds the per-segment slice
/// array so that producing a segment never allocates).
pub const MAX_SGE: usize = 16;

/// Scatter/gather entries of an RDMA Read work request: exactly one sink SGE
/// ([`QueuePair::post_send`](crate::QueuePair::post_send) refuses any other count).
pub const MAX_SGE_RD: usize = 1;

/// Longest message a work request may move: what a completion's `u32` byte count can
/// report (a longer receive is refused by [`RecvQueue::post`]).
pub const MAX_MSG_SIZE: u64 = u32::MAX as u64;

/// One scatter/gather entry: `len` bytes at tagged offset `addr` of region `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Local key (the region's STag).
    pub lkey: Stag,
    /// Tagged offset (virtual address) of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
}

/// The operation of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// Send, optionally with Solicited Event and/or Invalidate (of a peer STag).
    Send {
        /// Set the SE variant.
        solicited: bool,
        /// Peer STag to invalidate (Send with Invalidate variants).
        invalidate: Option<Stag>,
    },
    /// RDMA Write of the SGL to `remote_stag`/`remote_to`.
    Write {
        /// Peer STag.
        remote_stag: Stag,
        /// Peer tagged offset.
        remote_to: u64,
    },
    /// RDMA Read from `remote_stag`/`remote_to` into the single local SGE.
    Read {
        /// Peer (data source) STag.
        remote_stag: Stag,
        /// Peer (data source) tagged offset.
        remote_to: u64,
    },
}

/// A send work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Local buffers (source for Send/Write; exactly one sink SGE for Read).
    pub sgl: Vec<Sge>,
    /// Generate a completion on success (errors and flushes always complete).
    pub signaled: bool,
    /// Wait until all earlier RDMA Reads have completed before starting.
    pub fence: bool,
}

/// A receive work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// Buffers the next Send is scattered into.
    pub sgl: Vec<Sge>,
}

/// Completion status (after the verbs `ibv_wc_status` values that apply to iWARP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompletionStatus {
    /// Success.
    Success,
    /// Inbound Send longer than the receive buffer.
    LocalLengthError,
    /// A local SGE failed its lkey/PD/access/bounds check.
    LocalProtectionError,
    /// A local QP operation error (e.g. malformed work request).
    LocalQpOperationError,
    /// The peer reported a protection error (Terminate, remote protection).
    RemoteAccessError,
    /// The peer reported an operation error (Terminate).
    RemoteOperationError,
    /// Flushed because the QP entered the error state.
    WrFlushError,
}

/// What completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A Send (any variant).
    Send,
    /// An RDMA Write.
    Write,
    /// An RDMA Read.
    Read,
    /// A receive (inbound Send).
    Recv,
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: CompletionStatus,
    /// Kind of work request.
    pub opcode: WcOpcode,
    /// Bytes transferred (receives, reads; sends and writes report their length).
    pub byte_len: u32,
    /// The inbound Send was a Send with Solicited Event.
    pub solicited: bool,
    /// The STag invalidated by an inbound Send with Invalidate.
    pub invalidated_stag: Option<Stag>,
}

/// A receive queue (a QP's own, or a shared receive queue).
#[derive(Debug, Clone)]
pub struct RecvQueue {
    q: VecDeque<RecvWr>,
    depth: usize,
}

/// Why a work request was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// The queue is full.
    QueueFull,
    /// More than [`MAX_SGE`] entries, a Read without exactly one SGE, or a receive
    /// whose SGEs total more than `u32::MAX` bytes.
    InvalidSgl,
    /// The QP state does not accept this work request.
    InvalidState,
    /// No such SRQ.
    NoSuchSrq,
}

/// Total SGE length of a receive.
fn recv_len(wr: &RecvWr) -> u64 {
    wr.sgl.iter().map(|s| u64::from(s.len)).sum()
}

impl RecvQueue {
    /// A queue holding at most `depth` receives.
    pub fn new(depth: usize) -> Self {
        RecvQueue {
            q: VecDeque::with_capacity(depth.min(4096)),
            depth,
        }
    }

    /// Post a receive. A receive longer in total than a completion can report
    /// (`u32::MAX` bytes, [`Completion::byte_len`]) is refused with
    /// [`PostError::InvalidSgl`].
    pub fn post(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if wr.sgl.len() > MAX_SGE || recv_len(&wr) > MAX_MSG_SIZE {
            return Err(PostError::InvalidSgl);
        }
        if self.q.len() >= self.depth {
            return Err(PostError::QueueFull);
        }
        self.q.push_back(wr);
        Ok(())
    }

    /// Take the oldest receive.
    pub fn pop(&mut self) -> Option<RecvWr> {
        self.q.pop_front()
    }

    /// Posted receives.
    pub fn len(&self) -> usize {
        self.q.len()
    }

    /// Whether none are posted.
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    pub(crate) fn drain(&mut self) -> impl Iterator<Item = RecvWr> + '_ {
        self.q.drain(..)
    }
}

/// Handle of a shared receive queue in [`Resources`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SrqId(pub u32);

/// State shared by the QPs of one engine: the STag table and the SRQs. Every QP call that
/// touches memory takes it as an argument (the QP does not own memory).
#[derive(Default)]
pub struct Resources {
    /// Regions and STags.
    pub stags: StagTable,
    srqs: Vec<RecvQueue>,
}

impl Resources {
    /// Empty resources (STags drawn from an OS-seeded generator, [`StagTable::new`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Empty resources around `stags` (e.g. [`StagTable::with_seed`] for a reproducible
    /// run).
    pub fn with_stags(stags: StagTable) -> Self {
        Resources {
            stags,
            srqs: Vec::new(),
        }
    }

    /// Create a shared receive queue of `depth` entries.
    pub fn create_srq(&mut self, depth: usize) -> SrqId {
        self.srqs.push(RecvQueue::new(depth));
        SrqId(self.srqs.len() as u32 - 1)
    }

    /// Post a receive to an SRQ.
    pub fn post_srq_recv(&mut self, srq: SrqId, wr: RecvWr) -> Result<(), PostError> {
        self.srq_mut(srq).ok_or(PostError::NoSuchSrq)?.post(wr)
    }

    /// The SRQ, if it exists.
    pub fn srq_mut(&mut self, srq: SrqId) -> Option<&mut RecvQueue> {
        self.srqs.get_mut(srq.0 as usize)
    }
}
