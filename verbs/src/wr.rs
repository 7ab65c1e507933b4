//! Send work requests ([`SendRequest`], [`SendOpcode`]); receives are plain SGLs
//! ([`QueuePair::post_recv`](crate::QueuePair::post_recv)).

use xwarp_rdmap::verbs::Sge;
use xwarp_rdmap::Stag;

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
