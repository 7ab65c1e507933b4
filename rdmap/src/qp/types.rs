//! The private types the QP's send, receive and read-responder parts share, and the
//! mapping helpers from region errors to Terminate causes.

use xwarp_ddp::segment::{
    DdpError, SegmentHeader, TaggedErrorCode, UntaggedErrorCode, MAX_HEADER_LEN,
    UNTAGGED_HEADER_LEN,
};

use crate::mem::{MemError, RegionPin};
use crate::verbs::{Completion, CompletionStatus, RecvWr, SendOp, SendWr, Sge, WcOpcode, MAX_SGE};
use crate::wire::{Opcode, RdmapErrorCode, RdmapEtype, ReadRequest, TerminateCause};

/// The message the send side is segmenting: a send work request or a Read Response.
#[derive(Debug)]
pub(super) enum TxCur {
    Sq {
        seq: u64,
        wr: SendWr,
        opcode: Opcode,
        msn: u32,
        total: u32,
        sent: u32,
        sge: usize,
        sge_off: u32,
    },
    ReadResp {
        req: InboundRead,
        sent: u32,
    },
}

/// An accepted inbound Read Request, with its DDP header for a later Terminate.
#[derive(Debug, Clone, Copy)]
pub(super) struct InboundRead {
    pub(super) req: ReadRequest,
    pub(super) hdr: [u8; UNTAGGED_HEADER_LEN],
    /// The source registration the request was accepted against (`None`: zero length).
    pub(super) pin: Option<RegionPin>,
}

/// One of our Read Requests awaiting its Read Response (ORD).
#[derive(Debug, Clone, Copy)]
pub(super) struct OutstandingRead {
    pub(super) seq: u64,
    pub(super) wr_id: u64,
    pub(super) signaled: bool,
    pub(super) sink: Sge,
    /// The sink registration checked when the Read Request went out.
    pub(super) sink_pin: Option<RegionPin>,
    pub(super) received: u32,
}

/// What happens to the payload of the open inbound segment.
#[derive(Debug, Clone, Copy)]
pub(super) enum RxKind {
    Discard,
    /// Tagged placement at `to` (the segment's TO) of the pinned registration; every
    /// chunk re-checks it. `resp`: a Read Response into our sink (needs Local Write),
    /// else an RDMA Write (needs Remote Write).
    Place {
        pin: RegionPin,
        to: u64,
        resp: bool,
    },
    Send,
    Body,
}

/// The inbound segment being received: its header and how far its payload got.
#[derive(Debug, Clone, Copy)]
pub(super) struct RxSeg {
    pub(super) hdr: Option<SegmentHeader>,
    pub(super) raw: [u8; MAX_HEADER_LEN],
    pub(super) ulpdu_len: usize,
    pub(super) payload_len: usize,
    pub(super) got: usize,
    pub(super) kind: RxKind,
}

/// The inbound Send message being placed into a receive work request.
#[derive(Debug)]
pub(super) struct RxSend {
    pub(super) opcode: Opcode,
    pub(super) msn: u32,
    pub(super) inval: u32,
    pub(super) rqe: RecvWr,
    /// The registration of each SGE of `rqe`, checked when the Send was accepted.
    pub(super) pins: [Option<RegionPin>; MAX_SGE],
    /// Total SGE length; at most `u32::MAX` (receives are refused at post otherwise).
    pub(super) capacity: u64,
    /// Bytes placed so far (never above `capacity`).
    pub(super) received: u64,
    pub(super) sge: usize,
    pub(super) sge_off: u32,
}

/// The tagged message being received, so its next segment can be checked.
#[derive(Debug, Clone, Copy)]
pub(super) struct RxTagged {
    pub(super) opcode: Opcode,
    pub(super) stag: u32,
    pub(super) next_to: u64,
    /// The registration the message's first segment was admitted to (Writes with data).
    pub(super) pin: Option<RegionPin>,
}

/// A started send work request whose completion is released in posting order.
#[derive(Debug)]
pub(super) struct SqSlot {
    /// Internal work (the connection's RTR): not counted as a work request.
    pub(super) internal: bool,
    pub(super) wr_id: u64,
    pub(super) opcode: WcOpcode,
    /// `None` while running; `Some(cqe)` once finished (`Some(None)`: unsignaled success).
    pub(super) done: Option<Option<Completion>>,
}

/// What starting the next outbound message did.
pub(super) enum Start {
    Started,
    Retry,
    Blocked,
}

pub(super) fn ddp_tagged(e: MemError) -> TerminateCause {
    TerminateCause::Ddp(DdpError::Tagged(match e {
        MemError::NotAssociated => TaggedErrorCode::StagNotAssociated,
        MemError::Bounds => TaggedErrorCode::BaseOrBounds,
        MemError::ToWrap => TaggedErrorCode::ToWrap,
        // RFC 5041 has no access-rights code for tagged placement; like siw we report a
        // region without Remote Write as an invalid STag (docs/siw.md §4.5, §4.8.9).
        MemError::Access | MemError::InvalidStag | MemError::Exhausted => {
            TaggedErrorCode::InvalidStag
        }
    }))
}

pub(super) fn rdmap_protection(e: MemError) -> TerminateCause {
    TerminateCause::Rdmap(
        RdmapEtype::RemoteProtection,
        match e {
            MemError::Bounds => RdmapErrorCode::BaseOrBounds,
            MemError::Access => RdmapErrorCode::AccessRights,
            MemError::NotAssociated => RdmapErrorCode::StagNotAssociated,
            MemError::ToWrap => RdmapErrorCode::ToWrap,
            MemError::InvalidStag | MemError::Exhausted => RdmapErrorCode::InvalidStag,
        },
    )
}

pub(super) fn untagged(c: UntaggedErrorCode) -> TerminateCause {
    TerminateCause::Ddp(DdpError::Untagged(c))
}

pub(super) fn tagged(c: TaggedErrorCode) -> TerminateCause {
    TerminateCause::Ddp(DdpError::Tagged(c))
}

pub(super) fn error_cqe(wr: &SendWr, status: CompletionStatus) -> Completion {
    Completion {
        wr_id: wr.wr_id,
        status,
        opcode: wc_opcode(&wr.op),
        byte_len: 0,
        solicited: false,
        invalidated_stag: None,
    }
}

pub(super) fn wc_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send { .. } => WcOpcode::Send,
        SendOp::Write { .. } => WcOpcode::Write,
        SendOp::Read { .. } => WcOpcode::Read,
    }
}
