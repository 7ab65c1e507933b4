//! The queue pair: RDMAP stream send and receive state machines, the read responder
//! (IRD), the outstanding-read queue (ORD) and the QP state machine, DDP segments in and
//! DDP segments out.
//!
//! Sender (RFC 5040 §5, RFC 5041 §5; iwarp-wire.md §2.4, §2.5, §4.4): one message is
//! segmented at a time (so two messages of one class are never interleaved), MSN per
//! queue from 1, MO and TO contiguous, Read Responses in Read Request order, at most ORD
//! Read Requests outstanding (later work waits), fences, at most 4 Read Responses in a
//! row while send work is waiting (like siw, §4.4).
//!
//! Receiver (RFC 5041 §7.2, RFC 5040 §7; iwarp-wire.md §2.6, §4.5): every segment is
//! validated at its header before any payload byte is placed; payload goes straight into
//! the target region. Any violation queues an RFC-layout Terminate carrying the offending
//! segment's length and DDP header (M+D, plus R with the Read Request when the error is
//! found in one), moves the QP to TERMINATE and, once the Terminate is handed out, to
//! ERROR with every outstanding work request flushed.

use std::collections::VecDeque;

use xwarp_ddp::segment::{
    DdpError, SegmentError, SegmentHeader, TaggedErrorCode, TaggedHeader, UntaggedErrorCode,
    UntaggedHeader, MAX_HEADER_LEN, TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN,
};

use crate::mem::{Access, MemError, PdId, Stag};
use crate::verbs::{
    Completion, CompletionStatus, PostError, RecvQueue, RecvWr, Resources, SendOp, SendWr, Sge,
    SrqId, WcOpcode, MAX_SGE,
};
use crate::wire::{
    parse_ctrl, qn, CtrlError, Opcode, ParsedTerminate, RdmapErrorCode, RdmapEtype, ReadRequest,
    Terminate, TerminateCause, TerminatedDdpHeader, MAX_TERMINATE_LEN, READ_REQUEST_LEN,
};

/// Smallest max-ULPDU `poll_segment` accepts: room for the longest Terminate.
pub const MIN_MULPDU: usize = UNTAGGED_HEADER_LEN + MAX_TERMINATE_LEN;

/// Largest DDP segment over MPA (16-bit ULPDU_Length); larger `max_ulpdu` values are clamped.
pub const MAX_ULPDU: usize = u16::MAX as usize;

/// Most Read Responses sent back to back while send work waits (siw, iwarp-wire.md §4.4).
const IRQ_BURST: u32 = 4;

/// QP states (RFC 5040 §6 / verbs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Not connected; work can be posted but nothing moves.
    Idle,
    /// Ready to send and receive.
    Rts,
    /// Graceful close requested: no new send work, queued work still drains.
    Closing,
    /// A Terminate is queued; nothing else starts. Becomes ERROR once it is handed out.
    Terminate,
    /// Stream dead; all work flushed.
    Error,
}

/// Where a QP takes its receive buffers from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RqConfig {
    /// Its own receive queue with this depth.
    Own(usize),
    /// A shared receive queue in [`Resources`].
    Shared(SrqId),
}

/// QP configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpConfig {
    /// Protection domain: STags of other PDs are "not associated with this stream".
    pub pd: PdId,
    /// Inbound Read Request queue depth (Read Requests we serve concurrently).
    pub ird: u32,
    /// Outbound Read depth (Read Requests we may have outstanding).
    pub ord: u32,
    /// Send queue depth (posted, unfinished send work requests).
    pub sq_depth: usize,
    /// Receive queue.
    pub rq: RqConfig,
}

/// Asynchronous QP events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpEvent {
    /// A Terminate arrived (both readings of its control field, see [`Terminate::parse`]).
    TerminateReceived(ParsedTerminate),
    /// A local error was detected; this Terminate is queued for sending.
    TerminateQueued(Terminate),
    /// The queued Terminate was handed out by `poll_segment`.
    TerminateSent,
    /// The Terminate could not be sent without breaking message framing (an untagged
    /// message was cut short), so the stream went to ERROR without one.
    TerminateDropped(Terminate),
}

/// Caller errors (never protocol errors from the peer: those become Terminates).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpError {
    /// `max_ulpdu` is smaller than [`MIN_MULPDU`].
    MulpduTooSmall,
    /// Receive calls out of order: header while a segment is open, payload or end
    /// without a header, more or fewer payload bytes than announced, or a header
    /// shorter than its kind needs.
    Framing,
    /// The operation is not allowed in the current state.
    InvalidState,
}

#[derive(Debug)]
enum TxCur {
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

#[derive(Debug, Clone, Copy)]
struct InboundRead {
    req: ReadRequest,
    hdr: [u8; UNTAGGED_HEADER_LEN],
}

#[derive(Debug, Clone, Copy)]
struct OutstandingRead {
    seq: u64,
    wr_id: u64,
    signaled: bool,
    sink: Sge,
    received: u32,
}

#[derive(Debug, Clone, Copy)]
enum RxKind {
    Discard,
    Place { stag: Stag, offset: usize },
    Send,
    Body,
}

#[derive(Debug, Clone, Copy)]
struct RxSeg {
    hdr: Option<SegmentHeader>,
    raw: [u8; MAX_HEADER_LEN],
    ulpdu_len: usize,
    payload_len: usize,
    got: usize,
    kind: RxKind,
}

#[derive(Debug)]
struct RxSend {
    opcode: Opcode,
    msn: u32,
    inval: u32,
    rqe: RecvWr,
    capacity: u64,
    received: u32,
    sge: usize,
    sge_off: u32,
}

#[derive(Debug, Clone, Copy)]
struct RxTagged {
    opcode: Opcode,
    stag: u32,
    next_to: u64,
}

/// A queue pair: one RDMAP stream's send side, receive side, read responder, state and
/// completion queue.
pub struct QueuePair {
    cfg: QpConfig,
    state: QpState,
    // --- send side
    sq: VecDeque<SendWr>,
    /// Started send WRs not yet retired, in posting order: completions are released in
    /// this order (verbs), so a Send posted after a Read completes after the Read.
    sq_slots: VecDeque<SqSlot>,
    sq_seq_base: u64,
    tx_cur: Option<TxCur>,
    tx_msn: [u32; 3],
    orq: VecDeque<OutstandingRead>,
    irq: VecDeque<InboundRead>,
    irq_burst: u32,
    term_pending: Option<Terminate>,
    // --- receive side
    rq: Option<RecvQueue>,
    rx_msn: [u32; 3],
    rx_seg: Option<RxSeg>,
    rx_send: Option<RxSend>,
    rx_tagged: Option<RxTagged>,
    rx_body: [u8; MAX_TERMINATE_LEN],
    // --- outputs
    cq: VecDeque<Completion>,
    events: VecDeque<QpEvent>,
}

#[derive(Debug)]
struct SqSlot {
    wr_id: u64,
    opcode: WcOpcode,
    /// `None` while running; `Some(cqe)` once finished (`Some(None)`: unsignaled success).
    done: Option<Option<Completion>>,
}

enum Start {
    Started,
    Retry,
    Blocked,
}

fn ddp_tagged(e: MemError) -> TerminateCause {
    TerminateCause::Ddp(DdpError::Tagged(match e {
        MemError::NotAssociated => TaggedErrorCode::StagNotAssociated,
        MemError::Bounds => TaggedErrorCode::BaseOrBounds,
        MemError::ToWrap => TaggedErrorCode::ToWrap,
        // RFC 5041 has no access-rights code for tagged placement; like siw we report a
        // region without Remote Write as an invalid STag (iwarp-wire.md §4.5, §4.8 item 9).
        MemError::Access | MemError::InvalidStag | MemError::Exhausted => {
            TaggedErrorCode::InvalidStag
        }
    }))
}

fn rdmap_protection(e: MemError) -> TerminateCause {
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

fn untagged(c: UntaggedErrorCode) -> TerminateCause {
    TerminateCause::Ddp(DdpError::Untagged(c))
}

fn tagged(c: TaggedErrorCode) -> TerminateCause {
    TerminateCause::Ddp(DdpError::Tagged(c))
}

fn error_cqe(wr: &SendWr, status: CompletionStatus) -> Completion {
    Completion {
        wr_id: wr.wr_id,
        status,
        opcode: wc_opcode(&wr.op),
        byte_len: 0,
        solicited: false,
        invalidated_stag: None,
    }
}

fn wc_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send { .. } => WcOpcode::Send,
        SendOp::Write { .. } => WcOpcode::Write,
        SendOp::Read { .. } => WcOpcode::Read,
    }
}

impl QueuePair {
    /// A new QP in state IDLE.
    pub fn new(cfg: QpConfig) -> Self {
        QueuePair {
            cfg,
            state: QpState::Idle,
            sq: VecDeque::with_capacity(cfg.sq_depth.min(4096)),
            sq_slots: VecDeque::new(),
            sq_seq_base: 0,
            tx_cur: None,
            tx_msn: [1; 3],
            orq: VecDeque::new(),
            irq: VecDeque::new(),
            irq_burst: 0,
            term_pending: None,
            rq: match cfg.rq {
                RqConfig::Own(depth) => Some(RecvQueue::new(depth)),
                RqConfig::Shared(_) => None,
            },
            rx_msn: [1; 3],
            rx_seg: None,
            rx_send: None,
            rx_tagged: None,
            rx_body: [0; MAX_TERMINATE_LEN],
            cq: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// The configuration.
    pub fn config(&self) -> &QpConfig {
        &self.cfg
    }

    /// IDLE → RTS (the LLP connection is established and MPA negotiated).
    pub fn set_rts(&mut self) -> Result<(), QpError> {
        if self.state != QpState::Idle {
            return Err(QpError::InvalidState);
        }
        self.state = QpState::Rts;
        Ok(())
    }

    /// RTS → CLOSING: no new send work; queued work still drains.
    pub fn close(&mut self) -> Result<(), QpError> {
        if self.state != QpState::Rts {
            return Err(QpError::InvalidState);
        }
        self.state = QpState::Closing;
        Ok(())
    }

    /// Whether a CLOSING QP has nothing left to send or wait for (the LLP may close).
    pub fn is_drained(&self) -> bool {
        self.sq.is_empty()
            && self.tx_cur.is_none()
            && self.orq.is_empty()
            && self.irq.is_empty()
            && self.term_pending.is_none()
    }

    /// The LLP connection closed or was lost: move to ERROR and flush.
    pub fn on_llp_closed(&mut self) {
        self.enter_error();
    }

    /// Move to ERROR without a Terminate (verbs "modify QP to error") and flush.
    pub fn modify_to_error(&mut self) {
        self.enter_error();
    }

    /// Queue a Terminate for a cause found outside this layer (e.g. an MPA CRC error:
    /// `TerminateCause::Llp(LlpErrorCode::CrcError)`), moving to TERMINATE.
    pub fn terminate(&mut self, cause: TerminateCause) {
        self.fatal(Terminate::new(cause));
    }

    /// Next completion.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.cq.pop_front()
    }

    /// Next event.
    pub fn poll_event(&mut self) -> Option<QpEvent> {
        self.events.pop_front()
    }

    /// Post a send work request. In ERROR it completes at once with a flush status.
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        match self.state {
            QpState::Idle | QpState::Rts => {}
            QpState::Error => {
                self.flush_send_wr(&wr);
                return Ok(());
            }
            QpState::Closing | QpState::Terminate => return Err(PostError::InvalidState),
        }
        if wr.sgl.len() > MAX_SGE || (matches!(wr.op, SendOp::Read { .. }) && wr.sgl.len() != 1) {
            return Err(PostError::InvalidSgl);
        }
        if self.sq.len() + self.sq_slots.len() >= self.cfg.sq_depth {
            return Err(PostError::QueueFull);
        }
        self.sq.push_back(wr);
        Ok(())
    }

    /// Post a receive to the QP's own receive queue. In ERROR it completes at once with a
    /// flush status. QPs on an SRQ post through [`Resources::post_srq_recv`].
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.state == QpState::Error {
            self.flush_recv(wr.wr_id);
            return Ok(());
        }
        match &mut self.rq {
            Some(rq) => rq.post(wr),
            None => Err(PostError::InvalidState),
        }
    }

    // ------------------------------------------------------------------ send side

    /// Produce the next DDP segment, if any, of at most `max_ulpdu` bytes (the MPA MULPDU).
    /// `emit(header, payload)` receives the DDP header plus any fixed RDMAP part (Read
    /// Request body, Terminate body) and the payload as slices of region memory, so the
    /// caller copies straight into its TX buffer. Returns `Ok(None)` when there is nothing
    /// to send now.
    pub fn poll_segment<R>(
        &mut self,
        res: &Resources,
        max_ulpdu: usize,
        emit: impl FnOnce(&[u8], &[&[u8]]) -> R,
    ) -> Result<Option<R>, QpError> {
        let mut emit = emit;
        if max_ulpdu < MIN_MULPDU {
            return Err(QpError::MulpduTooSmall);
        }
        // MPA's ULPDU_Length is 16 bits (RFC 5044 §4), so no DDP segment can be longer.
        let max_ulpdu = max_ulpdu.min(MAX_ULPDU);
        loop {
            match self.state {
                QpState::Idle | QpState::Error => return Ok(None),
                QpState::Terminate => {
                    let untagged_in_flight = matches!(
                        &self.tx_cur,
                        Some(TxCur::Sq { opcode, sent, .. }) if !opcode.is_tagged() && *sent > 0
                    );
                    if !untagged_in_flight {
                        // A tagged message may be abandoned (different class); its still
                        // open completion slot is flushed when the QP reaches ERROR.
                        self.tx_cur = None;
                        let Some(t) = self.term_pending.take() else {
                            self.enter_error();
                            return Ok(None);
                        };
                        let r = self.emit_terminate(&t, emit);
                        self.events.push_back(QpEvent::TerminateSent);
                        self.enter_error();
                        return Ok(Some(r));
                    }
                }
                QpState::Rts | QpState::Closing => {}
            }
            if self.tx_cur.is_none() {
                match self.start_next(res) {
                    Start::Started => {}
                    Start::Retry => continue,
                    Start::Blocked => return Ok(None),
                }
            }
            match self.emit_cur(res, max_ulpdu, emit) {
                Ok(r) => return Ok(Some(r)),
                // A local error stopped the current message before anything was emitted;
                // loop to send the Terminate (or stop in ERROR).
                Err(back) => emit = back,
            }
        }
    }

    fn emit_terminate<R>(&mut self, t: &Terminate, emit: impl FnOnce(&[u8], &[&[u8]]) -> R) -> R {
        let mut buf = [0u8; MIN_MULPDU];
        let msn = self.tx_msn[qn::TERMINATE as usize];
        self.tx_msn[qn::TERMINATE as usize] = msn.wrapping_add(1);
        let h = UntaggedHeader {
            last: true,
            rsvd_ulp: Opcode::Terminate.ctrl_byte(),
            rsvd_ulp_ext: 0,
            qn: qn::TERMINATE,
            msn,
            mo: 0,
        };
        let n = h.emit(&mut buf).unwrap_or(0);
        let m = t.emit(&mut buf[n..]).unwrap_or(0);
        emit(&buf[..n + m], &[])
    }

    fn irq_in_use(&self) -> usize {
        self.irq.len() + usize::from(matches!(self.tx_cur, Some(TxCur::ReadResp { .. })))
    }

    fn sq_head_ready(&self) -> bool {
        match self.sq.front() {
            None => false,
            Some(wr) => {
                if wr.fence && !self.orq.is_empty() {
                    return false;
                }
                if matches!(wr.op, SendOp::Read { .. }) && self.orq.len() >= self.cfg.ord as usize {
                    return false;
                }
                true
            }
        }
    }

    fn start_next(&mut self, res: &Resources) -> Start {
        let sq_ready = self.sq_head_ready();
        if !self.irq.is_empty() && (!sq_ready || self.irq_burst < IRQ_BURST) {
            self.irq_burst += 1;
            if let Some(req) = self.irq.pop_front() {
                self.tx_cur = Some(TxCur::ReadResp { req, sent: 0 });
            }
            return Start::Started;
        }
        if !sq_ready {
            return Start::Blocked;
        }
        self.irq_burst = 0;
        let Some(wr) = self.sq.pop_front() else {
            return Start::Blocked;
        };
        let seq = self.sq_seq_base + self.sq_slots.len() as u64;
        self.sq_slots.push_back(SqSlot {
            wr_id: wr.wr_id,
            opcode: wc_opcode(&wr.op),
            done: None,
        });
        let total: u64 = wr.sgl.iter().map(|s| u64::from(s.len)).sum();
        if total > u64::from(u32::MAX) {
            self.finish_slot(
                seq,
                Some(error_cqe(&wr, CompletionStatus::LocalLengthError)),
            );
            self.local_tx_error();
            return Start::Retry;
        }
        let need = if matches!(wr.op, SendOp::Read { .. }) {
            Access::LOCAL_WRITE
        } else {
            Access::NONE
        };
        let bad = wr.sgl.iter().any(|s| {
            res.stags
                .check(s.lkey, self.cfg.pd, s.addr, u64::from(s.len), need)
                .is_err()
        });
        if bad {
            self.finish_slot(
                seq,
                Some(error_cqe(&wr, CompletionStatus::LocalProtectionError)),
            );
            self.local_tx_error();
            return Start::Retry;
        }
        let (opcode, q) = match wr.op {
            SendOp::Send {
                solicited,
                invalidate,
            } => (
                match (solicited, invalidate.is_some()) {
                    (false, false) => Opcode::Send,
                    (false, true) => Opcode::SendInvalidate,
                    (true, false) => Opcode::SendSe,
                    (true, true) => Opcode::SendSeInvalidate,
                },
                Some(qn::SEND),
            ),
            SendOp::Write { .. } => (Opcode::Write, None),
            SendOp::Read { .. } => (Opcode::ReadRequest, Some(qn::READ_REQUEST)),
        };
        let msn = match q {
            Some(q) => {
                let m = self.tx_msn[q as usize];
                self.tx_msn[q as usize] = m.wrapping_add(1);
                m
            }
            None => 0,
        };
        self.tx_cur = Some(TxCur::Sq {
            seq,
            wr,
            opcode,
            msn,
            total: total as u32,
            sent: 0,
            sge: 0,
            sge_off: 0,
        });
        Start::Started
    }

    /// Emit one segment of the current message; hands `emit` back unused if a local error
    /// stopped the message.
    fn emit_cur<R, F: FnOnce(&[u8], &[&[u8]]) -> R>(
        &mut self,
        res: &Resources,
        max_ulpdu: usize,
        emit: F,
    ) -> Result<R, F> {
        let pd = self.cfg.pd;
        let mut hbuf = [0u8; UNTAGGED_HEADER_LEN + READ_REQUEST_LEN];
        let mut slices: [&[u8]; MAX_SGE] = [&[]; MAX_SGE];
        let Some(cur) = self.tx_cur.as_mut() else {
            return Err(emit);
        };
        match cur {
            TxCur::Sq {
                seq,
                wr,
                opcode,
                msn,
                total,
                sent,
                sge,
                sge_off,
            } => {
                if *opcode == Opcode::ReadRequest {
                    let sink = wr.sgl[0];
                    let (remote_stag, remote_to) = match wr.op {
                        SendOp::Read {
                            remote_stag,
                            remote_to,
                        } => (remote_stag, remote_to),
                        _ => (Stag(0), 0),
                    };
                    let h = UntaggedHeader {
                        last: true,
                        rsvd_ulp: opcode.ctrl_byte(),
                        rsvd_ulp_ext: 0,
                        qn: qn::READ_REQUEST,
                        msn: *msn,
                        mo: 0,
                    };
                    h.emit(&mut hbuf);
                    let rr = ReadRequest {
                        sink_stag: sink.lkey.0,
                        sink_to: sink.addr,
                        size: sink.len,
                        src_stag: remote_stag.0,
                        src_to: remote_to,
                    };
                    rr.emit(&mut hbuf[UNTAGGED_HEADER_LEN..]);
                    let r = emit(&hbuf, &[]);
                    self.orq.push_back(OutstandingRead {
                        seq: *seq,
                        wr_id: wr.wr_id,
                        signaled: wr.signaled,
                        sink,
                        received: 0,
                    });
                    self.tx_cur = None;
                    return Ok(r);
                }
                let hlen = if opcode.is_tagged() {
                    TAGGED_HEADER_LEN
                } else {
                    UNTAGGED_HEADER_LEN
                };
                let chunk = (*total - *sent).min((max_ulpdu - hlen) as u32);
                let last = *sent + chunk == *total;
                // Gather the payload slices straight from region memory.
                let (mut i, mut off, mut need, mut n) = (*sge, *sge_off, chunk, 0usize);
                while need > 0 {
                    let Some(s) = wr.sgl.get(i).copied() else {
                        break;
                    };
                    let avail = s.len - off;
                    if avail == 0 {
                        i += 1;
                        off = 0;
                        continue;
                    }
                    let take = avail.min(need);
                    let addr = s.addr + u64::from(off);
                    let data = res
                        .stags
                        .check(s.lkey, pd, addr, u64::from(take), Access::NONE)
                        .and_then(|o| res.stags.read(s.lkey, o, take as usize));
                    let Ok(data) = data else {
                        break;
                    };
                    slices[n] = data;
                    n += 1;
                    need -= take;
                    off += take;
                    if off == s.len {
                        i += 1;
                        off = 0;
                    }
                }
                if need > 0 {
                    // A region vanished or changed under a message in flight.
                    let cut_untagged = !opcode.is_tagged() && *sent > 0;
                    let (seq, cqe) = (*seq, error_cqe(wr, CompletionStatus::LocalProtectionError));
                    self.tx_cur = None;
                    self.finish_slot(seq, Some(cqe));
                    if cut_untagged {
                        let t = Terminate::new(TerminateCause::Rdmap(
                            RdmapEtype::LocalCatastrophic,
                            RdmapErrorCode::Unspecified,
                        ));
                        self.events.push_back(QpEvent::TerminateDropped(t));
                        self.enter_error();
                    } else {
                        self.local_tx_error();
                    }
                    return Err(emit);
                }
                let hlen = if opcode.is_tagged() {
                    let (stag, to) = match wr.op {
                        SendOp::Write {
                            remote_stag,
                            remote_to,
                        } => (remote_stag.0, remote_to),
                        _ => (0, 0),
                    };
                    TaggedHeader {
                        last,
                        rsvd_ulp: opcode.ctrl_byte(),
                        stag,
                        to: to.wrapping_add(u64::from(*sent)),
                    }
                    .emit(&mut hbuf)
                } else {
                    let inval = match wr.op {
                        SendOp::Send {
                            invalidate: Some(s),
                            ..
                        } => s.0,
                        _ => 0,
                    };
                    UntaggedHeader {
                        last,
                        rsvd_ulp: opcode.ctrl_byte(),
                        rsvd_ulp_ext: inval,
                        qn: qn::SEND,
                        msn: *msn,
                        mo: *sent,
                    }
                    .emit(&mut hbuf)
                }
                .unwrap_or(0);
                let r = emit(&hbuf[..hlen], &slices[..n]);
                *sent += chunk;
                *sge = i;
                *sge_off = off;
                if last {
                    let done = if wr.signaled {
                        Some(Completion {
                            wr_id: wr.wr_id,
                            status: CompletionStatus::Success,
                            opcode: wc_opcode(&wr.op),
                            byte_len: *total,
                            solicited: false,
                            invalidated_stag: None,
                        })
                    } else {
                        None
                    };
                    let seq = *seq;
                    self.tx_cur = None;
                    self.finish_slot(seq, done);
                }
                Ok(r)
            }
            TxCur::ReadResp { req, sent } => {
                let rr = req.req;
                let chunk = (rr.size - *sent).min((max_ulpdu - TAGGED_HEADER_LEN) as u32);
                let last = *sent + chunk == rr.size;
                let src = rr.src_to.wrapping_add(u64::from(*sent));
                let data = if chunk == 0 {
                    Ok(&[][..])
                } else {
                    res.stags
                        .check(
                            Stag(rr.src_stag),
                            pd,
                            src,
                            u64::from(chunk),
                            Access::REMOTE_READ,
                        )
                        .and_then(|o| res.stags.read(Stag(rr.src_stag), o, chunk as usize))
                };
                let data = match data {
                    Ok(d) => d,
                    Err(e) => {
                        // Source region changed after the request was accepted.
                        let req = *req;
                        self.tx_cur = None;
                        let mut t = Terminate::new(rdmap_protection(e));
                        t.m = true;
                        t.ddp_segment_length = (UNTAGGED_HEADER_LEN + READ_REQUEST_LEN) as u16;
                        t.ddp_header = TerminatedDdpHeader::from_bytes(&req.hdr);
                        t.rdmap_header = Some(req.req.to_bytes());
                        self.fatal(t);
                        return Err(emit);
                    }
                };
                TaggedHeader {
                    last,
                    rsvd_ulp: Opcode::ReadResponse.ctrl_byte(),
                    stag: rr.sink_stag,
                    to: rr.sink_to.wrapping_add(u64::from(*sent)),
                }
                .emit(&mut hbuf);
                slices[0] = data;
                let n = usize::from(chunk > 0);
                let r = emit(&hbuf[..TAGGED_HEADER_LEN], &slices[..n]);
                *sent += chunk;
                if last {
                    self.tx_cur = None;
                }
                Ok(r)
            }
        }
    }

    fn local_tx_error(&mut self) {
        // siw: TX failure → RDMAP / local catastrophic / unspecified (iwarp-wire.md §4.6).
        self.fatal(Terminate::new(TerminateCause::Rdmap(
            RdmapEtype::LocalCatastrophic,
            RdmapErrorCode::Unspecified,
        )));
    }

    /// Record the outcome of started WR `seq` and release every completion that is now
    /// in order.
    fn finish_slot(&mut self, seq: u64, cqe: Option<Completion>) {
        if let Some(slot) = seq
            .checked_sub(self.sq_seq_base)
            .and_then(|i| self.sq_slots.get_mut(i as usize))
        {
            slot.done = Some(cqe);
        }
        while self.sq_slots.front().is_some_and(|s| s.done.is_some()) {
            if let Some(Some(c)) = self.sq_slots.pop_front().and_then(|s| s.done) {
                self.cq.push_back(c);
            }
            self.sq_seq_base += 1;
        }
    }

    fn flush_send_wr(&mut self, wr: &SendWr) {
        self.cq
            .push_back(error_cqe(wr, CompletionStatus::WrFlushError));
    }

    fn flush_recv(&mut self, wr_id: u64) {
        self.cq.push_back(Completion {
            wr_id,
            status: CompletionStatus::WrFlushError,
            opcode: WcOpcode::Recv,
            byte_len: 0,
            solicited: false,
            invalidated_stag: None,
        });
    }

    fn fatal(&mut self, t: Terminate) {
        match self.state {
            QpState::Idle | QpState::Rts | QpState::Closing => {
                self.state = QpState::Terminate;
                self.term_pending = Some(t);
                self.events.push_back(QpEvent::TerminateQueued(t));
                if let Some(seg) = self.rx_seg.as_mut() {
                    seg.kind = RxKind::Discard;
                }
            }
            QpState::Terminate | QpState::Error => {}
        }
    }

    /// Enter ERROR and flush: every outstanding send WR and posted receive (own RQ; an
    /// SRQ keeps its receives, as in verbs) completes with [`CompletionStatus::WrFlushError`].
    fn enter_error(&mut self) {
        if self.state == QpState::Error {
            return;
        }
        self.state = QpState::Error;
        self.term_pending = None;
        // Started WRs (in flight, or Reads awaiting their Response) are flushed through
        // their completion slots, in posting order, then the ones never started.
        self.tx_cur = None;
        self.orq.clear();
        for slot in self.sq_slots.iter_mut() {
            if slot.done.is_none() {
                slot.done = Some(Some(Completion {
                    wr_id: slot.wr_id,
                    status: CompletionStatus::WrFlushError,
                    opcode: slot.opcode,
                    byte_len: 0,
                    solicited: false,
                    invalidated_stag: None,
                }));
            }
        }
        self.finish_slot(u64::MAX, None);
        while let Some(wr) = self.sq.pop_front() {
            self.flush_send_wr(&wr);
        }
        self.irq.clear();
        if let Some(s) = self.rx_send.take() {
            self.flush_recv(s.rqe.wr_id);
        }
        let ids: Vec<u64> = match &mut self.rq {
            Some(rq) => rq.drain().map(|w| w.wr_id).collect(),
            None => Vec::new(),
        };
        for id in ids {
            self.flush_recv(id);
        }
        self.rx_tagged = None;
        if let Some(seg) = self.rx_seg.as_mut() {
            seg.kind = RxKind::Discard;
        }
    }

    // --------------------------------------------------------------- receive side

    /// Convenience: a whole DDP segment (header + payload) at once.
    pub fn on_segment(&mut self, res: &mut Resources, segment: &[u8]) -> Result<(), QpError> {
        let first = *segment.first().ok_or(QpError::Framing)?;
        let hlen = xwarp_ddp::segment::header_len(first);
        if segment.len() < hlen {
            return Err(QpError::Framing);
        }
        self.on_header_bytes(res, &segment[..hlen], segment.len())?;
        self.on_payload(res, &segment[hlen..])?;
        self.on_end(res)
    }

    /// A segment begins: `raw` holds at least its DDP header (14 or 18 bytes, by the T
    /// bit); `ulpdu_len` is the whole segment length. A bad DDP version is answered with a
    /// Terminate (DDP tagged 0x04 / untagged 0x06).
    pub fn on_header_bytes(
        &mut self,
        res: &mut Resources,
        raw: &[u8],
        ulpdu_len: usize,
    ) -> Result<(), QpError> {
        if self.rx_seg.is_some() {
            return Err(QpError::Framing);
        }
        let first = *raw.first().ok_or(QpError::Framing)?;
        let hlen = xwarp_ddp::segment::header_len(first);
        if raw.len() < hlen || ulpdu_len < hlen {
            return Err(QpError::Framing);
        }
        let mut buf = [0u8; MAX_HEADER_LEN];
        buf[..hlen].copy_from_slice(&raw[..hlen]);
        match SegmentHeader::parse(raw) {
            Ok(h) => self.begin(res, Some(h), buf, ulpdu_len),
            Err(SegmentError::Truncated) => Err(QpError::Framing),
            Err(e @ SegmentError::InvalidVersion { .. }) => {
                self.begin(res, None, buf, ulpdu_len)?;
                if self.rx_live() {
                    let cause = e.ddp_error().map_or(
                        TerminateCause::Ddp(DdpError::Catastrophic),
                        TerminateCause::Ddp,
                    );
                    self.fail_segment(cause, None);
                }
                Ok(())
            }
        }
    }

    /// A segment begins with the already parsed `hdr`; `ulpdu_len` is the whole segment
    /// length (header + payload).
    pub fn on_header(
        &mut self,
        res: &mut Resources,
        hdr: &SegmentHeader,
        ulpdu_len: usize,
    ) -> Result<(), QpError> {
        if self.rx_seg.is_some() {
            return Err(QpError::Framing);
        }
        if ulpdu_len < hdr.len() {
            return Err(QpError::Framing);
        }
        let mut buf = [0u8; MAX_HEADER_LEN];
        hdr.emit(&mut buf);
        self.begin(res, Some(*hdr), buf, ulpdu_len)
    }

    fn rx_live(&self) -> bool {
        matches!(self.state, QpState::Rts | QpState::Closing)
    }

    fn begin(
        &mut self,
        res: &mut Resources,
        hdr: Option<SegmentHeader>,
        raw: [u8; MAX_HEADER_LEN],
        ulpdu_len: usize,
    ) -> Result<(), QpError> {
        let hlen = xwarp_ddp::segment::header_len(raw[0]);
        self.rx_seg = Some(RxSeg {
            hdr,
            raw,
            ulpdu_len,
            payload_len: ulpdu_len - hlen,
            got: 0,
            kind: RxKind::Discard,
        });
        let Some(hdr) = hdr else {
            return Ok(());
        };
        if !self.rx_live() {
            return Ok(());
        }
        match self.validate(res, &hdr, ulpdu_len - hlen) {
            Ok(kind) => {
                if let Some(seg) = self.rx_seg.as_mut() {
                    seg.kind = kind;
                }
            }
            Err(cause) => self.fail_segment(cause, None),
        }
        Ok(())
    }

    fn fail_segment(&mut self, cause: TerminateCause, rr: Option<[u8; READ_REQUEST_LEN]>) {
        let (raw, len) = match &self.rx_seg {
            Some(s) => (s.raw, s.ulpdu_len),
            None => ([0; MAX_HEADER_LEN], 0),
        };
        self.fail_with(cause, &raw, len, rr);
    }

    fn fail_with(
        &mut self,
        cause: TerminateCause,
        raw: &[u8],
        ulpdu_len: usize,
        rr: Option<[u8; READ_REQUEST_LEN]>,
    ) {
        let mut t = Terminate::new(cause);
        t.m = true;
        // RFC 5040 §4.8: length of the terminated DDP segment (siw sends the payload
        // length instead, iwarp-wire.md §4.6).
        t.ddp_segment_length = ulpdu_len.min(u16::MAX as usize) as u16;
        t.ddp_header = TerminatedDdpHeader::from_bytes(raw);
        t.rdmap_header = rr;
        self.fatal(t);
    }

    fn validate(
        &mut self,
        res: &mut Resources,
        hdr: &SegmentHeader,
        payload_len: usize,
    ) -> Result<RxKind, TerminateCause> {
        let op = parse_ctrl(hdr.rsvd_ulp()).map_err(|e| match e {
            CtrlError::InvalidVersion(_) => {
                TerminateCause::remote_op(RdmapErrorCode::InvalidVersion)
            }
            CtrlError::UnexpectedOpcode(_) => {
                TerminateCause::remote_op(RdmapErrorCode::UnexpectedOpcode)
            }
        })?;
        if op.is_tagged() != hdr.is_tagged() {
            return Err(TerminateCause::remote_op(RdmapErrorCode::UnexpectedOpcode));
        }
        let pd = self.cfg.pd;
        let len = payload_len as u64;
        match hdr {
            SegmentHeader::Tagged(t) => {
                if let Some(m) = self.rx_tagged {
                    // Same-class interleaving (iwarp-wire.md §4.5): a Write and a Read
                    // Response may not interleave with each other.
                    if m.opcode != op {
                        return Err(TerminateCause::remote_op(RdmapErrorCode::UnexpectedOpcode));
                    }
                }
                let next =
                    t.to.checked_add(len)
                        .ok_or(tagged(TaggedErrorCode::ToWrap))?;
                let kind = if op == Opcode::Write {
                    if let Some(m) = self.rx_tagged {
                        if m.stag != t.stag {
                            return Err(tagged(TaggedErrorCode::InvalidStag));
                        }
                        if m.next_to != t.to {
                            return Err(tagged(TaggedErrorCode::BaseOrBounds));
                        }
                    }
                    if payload_len == 0 {
                        // Zero-length Writes are accepted without an STag check (RFC 5040
                        // §5.1; RTR uses them, iwarp-wire.md §1.5, §4.5).
                        RxKind::Discard
                    } else {
                        let offset = res
                            .stags
                            .check(Stag(t.stag), pd, t.to, len, Access::REMOTE_WRITE)
                            .map_err(ddp_tagged)?;
                        RxKind::Place {
                            stag: Stag(t.stag),
                            offset,
                        }
                    }
                } else {
                    let Some(o) = self.orq.front_mut() else {
                        return Err(TerminateCause::remote_op(RdmapErrorCode::UnexpectedOpcode));
                    };
                    if t.stag != o.sink.lkey.0 {
                        return Err(tagged(TaggedErrorCode::InvalidStag));
                    }
                    let total = u64::from(o.received) + len;
                    if t.to != o.sink.addr + u64::from(o.received)
                        || total > u64::from(o.sink.len)
                        || (t.last && total != u64::from(o.sink.len))
                    {
                        return Err(tagged(TaggedErrorCode::BaseOrBounds));
                    }
                    let offset = res
                        .stags
                        .check(o.sink.lkey, pd, t.to, len, Access::LOCAL_WRITE)
                        .map_err(|_| TerminateCause::Ddp(DdpError::Catastrophic))?;
                    o.received = total as u32;
                    RxKind::Place {
                        stag: o.sink.lkey,
                        offset,
                    }
                };
                self.rx_tagged = (!t.last).then_some(RxTagged {
                    opcode: op,
                    stag: t.stag,
                    next_to: next,
                });
                Ok(kind)
            }
            SegmentHeader::Untagged(u) => {
                let q = op.queue().unwrap_or(qn::SEND);
                if u.qn != q {
                    return Err(untagged(UntaggedErrorCode::InvalidQn));
                }
                if let Some(s) = &self.rx_send {
                    // Only a Send can be multi-segment; anything else on the untagged
                    // class before its last segment is interleaving (iwarp-wire.md §4.5).
                    if q != qn::SEND || u.msn != s.msn {
                        return Err(untagged(UntaggedErrorCode::MsnRange));
                    }
                    if op != s.opcode {
                        return Err(TerminateCause::remote_op(RdmapErrorCode::UnexpectedOpcode));
                    }
                    if u.mo != s.received {
                        return Err(untagged(UntaggedErrorCode::InvalidMo));
                    }
                } else {
                    if u.msn != self.rx_msn[q as usize] {
                        return Err(untagged(UntaggedErrorCode::MsnRange));
                    }
                    if u.mo != 0 {
                        return Err(untagged(UntaggedErrorCode::InvalidMo));
                    }
                }
                match op {
                    Opcode::ReadRequest | Opcode::Terminate => {
                        // Both are single-segment messages with a fixed RDMAP body (siw
                        // rejects anything else, iwarp-wire.md §3.2, §4.5).
                        let ok = u.last
                            && if op == Opcode::ReadRequest {
                                payload_len == READ_REQUEST_LEN
                            } else {
                                (4..=MAX_TERMINATE_LEN).contains(&payload_len)
                            };
                        if !ok {
                            return Err(TerminateCause::remote_op(RdmapErrorCode::Unspecified));
                        }
                        self.rx_msn[q as usize] = u.msn.wrapping_add(1);
                        Ok(RxKind::Body)
                    }
                    _ => {
                        if self.rx_send.is_none() {
                            let rqe = match self.cfg.rq {
                                RqConfig::Own(_) => self.rq.as_mut().and_then(|r| r.pop()),
                                RqConfig::Shared(id) => res.srq_mut(id).and_then(|r| r.pop()),
                            };
                            let Some(rqe) = rqe else {
                                return Err(untagged(UntaggedErrorCode::NoBufferAvailable));
                            };
                            let bad = rqe.sgl.iter().any(|s| {
                                res.stags
                                    .check(
                                        s.lkey,
                                        pd,
                                        s.addr,
                                        u64::from(s.len),
                                        Access::LOCAL_WRITE,
                                    )
                                    .is_err()
                            });
                            if bad {
                                self.cq.push_back(Completion {
                                    wr_id: rqe.wr_id,
                                    status: CompletionStatus::LocalProtectionError,
                                    opcode: WcOpcode::Recv,
                                    byte_len: 0,
                                    solicited: false,
                                    invalidated_stag: None,
                                });
                                return Err(TerminateCause::Ddp(DdpError::Catastrophic));
                            }
                            self.rx_msn[qn::SEND as usize] = u.msn.wrapping_add(1);
                            self.rx_send = Some(RxSend {
                                opcode: op,
                                msn: u.msn,
                                inval: u.rsvd_ulp_ext,
                                capacity: rqe.sgl.iter().map(|s| u64::from(s.len)).sum(),
                                rqe,
                                received: 0,
                                sge: 0,
                                sge_off: 0,
                            });
                        }
                        let Some(s) = self.rx_send.as_mut() else {
                            return Err(TerminateCause::Ddp(DdpError::Catastrophic));
                        };
                        if u64::from(s.received) + len > s.capacity {
                            let id = s.rqe.wr_id;
                            self.rx_send = None;
                            self.cq.push_back(Completion {
                                wr_id: id,
                                status: CompletionStatus::LocalLengthError,
                                opcode: WcOpcode::Recv,
                                byte_len: 0,
                                solicited: false,
                                invalidated_stag: None,
                            });
                            // RFC 5041 §7.2 untagged 0x05 (siw sends 0x02 here, iwarp-wire.md §4.8 item 9).
                            return Err(untagged(UntaggedErrorCode::MessageTooLong));
                        }
                        s.received += payload_len as u32;
                        Ok(RxKind::Send)
                    }
                }
            }
        }
    }

    /// Payload bytes of the open segment (any number of chunks, in order).
    pub fn on_payload(&mut self, res: &mut Resources, chunk: &[u8]) -> Result<(), QpError> {
        let seg = self.rx_seg.as_mut().ok_or(QpError::Framing)?;
        if seg.got + chunk.len() > seg.payload_len {
            return Err(QpError::Framing);
        }
        let at = seg.got;
        seg.got += chunk.len();
        let kind = seg.kind;
        match kind {
            RxKind::Discard => Ok(()),
            RxKind::Place { stag, offset } => {
                if res.stags.write(stag, offset + at, chunk).is_err() {
                    self.fail_segment(TerminateCause::Ddp(DdpError::Catastrophic), None);
                }
                Ok(())
            }
            RxKind::Body => {
                self.rx_body[at..at + chunk.len()].copy_from_slice(chunk);
                Ok(())
            }
            RxKind::Send => {
                let pd = self.cfg.pd;
                let Some(s) = self.rx_send.as_mut() else {
                    return Ok(());
                };
                let mut rest = chunk;
                let mut ok = true;
                while !rest.is_empty() {
                    let Some(sge) = s.rqe.sgl.get(s.sge).copied() else {
                        ok = false;
                        break;
                    };
                    let avail = (sge.len - s.sge_off) as usize;
                    if avail == 0 {
                        s.sge += 1;
                        s.sge_off = 0;
                        continue;
                    }
                    let take = avail.min(rest.len());
                    let to = sge.addr + u64::from(s.sge_off);
                    let w = res
                        .stags
                        .check(sge.lkey, pd, to, take as u64, Access::LOCAL_WRITE)
                        .and_then(|o| res.stags.write(sge.lkey, o, &rest[..take]));
                    if w.is_err() {
                        ok = false;
                        break;
                    }
                    rest = &rest[take..];
                    s.sge_off += take as u32;
                    if s.sge_off == sge.len {
                        s.sge += 1;
                        s.sge_off = 0;
                    }
                }
                if !ok {
                    self.fail_segment(TerminateCause::Ddp(DdpError::Catastrophic), None);
                }
                Ok(())
            }
        }
    }

    /// The open segment ends (all announced payload bytes were delivered).
    pub fn on_end(&mut self, res: &mut Resources) -> Result<(), QpError> {
        let seg = self.rx_seg.ok_or(QpError::Framing)?;
        if seg.got != seg.payload_len {
            return Err(QpError::Framing);
        }
        self.rx_seg = None;
        let Some(hdr) = seg.hdr else {
            return Ok(());
        };
        match seg.kind {
            RxKind::Discard => {}
            RxKind::Place { .. } => {
                if let SegmentHeader::Tagged(t) = hdr {
                    if t.last && parse_ctrl(t.rsvd_ulp) == Ok(Opcode::ReadResponse) {
                        if let Some(o) = self.orq.pop_front() {
                            let cqe = o.signaled.then_some(Completion {
                                wr_id: o.wr_id,
                                status: CompletionStatus::Success,
                                opcode: WcOpcode::Read,
                                byte_len: o.sink.len,
                                solicited: false,
                                invalidated_stag: None,
                            });
                            self.finish_slot(o.seq, cqe);
                        }
                    }
                }
            }
            RxKind::Send => {
                if hdr.last() {
                    if let Some(s) = self.rx_send.take() {
                        self.finish_send(res, s, &seg);
                    }
                }
            }
            RxKind::Body => {
                let op = parse_ctrl(hdr.rsvd_ulp());
                let body = &self.rx_body[..seg.payload_len];
                if op == Ok(Opcode::Terminate) {
                    if let Ok(p) = Terminate::parse(body) {
                        self.events.push_back(QpEvent::TerminateReceived(p));
                    }
                    self.enter_error();
                } else if let Some(req) = ReadRequest::parse(body) {
                    self.accept_read(res, req, &seg);
                }
            }
        }
        Ok(())
    }

    fn finish_send(&mut self, res: &mut Resources, s: RxSend, seg: &RxSeg) {
        let mut invalidated = None;
        if s.opcode.is_invalidate() {
            if let Err(e) = res.stags.invalidate(Stag(s.inval), self.cfg.pd) {
                let etype = if e == MemError::NotAssociated || e == MemError::InvalidStag {
                    RdmapEtype::RemoteProtection
                } else {
                    RdmapEtype::RemoteOperation
                };
                self.rx_send = Some(s);
                self.fail_with(
                    TerminateCause::Rdmap(etype, RdmapErrorCode::CannotInvalidate),
                    &seg.raw,
                    seg.ulpdu_len,
                    None,
                );
                return;
            }
            invalidated = Some(Stag(s.inval));
        }
        self.cq.push_back(Completion {
            wr_id: s.rqe.wr_id,
            status: CompletionStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: s.received,
            solicited: s.opcode.is_solicited(),
            invalidated_stag: invalidated,
        });
    }

    fn accept_read(&mut self, res: &Resources, req: ReadRequest, seg: &RxSeg) {
        let rr = Some(req.to_bytes());
        if self.irq_in_use() >= self.cfg.ird as usize {
            // RFC 5040 §6.4 / siw: beyond IRD → remote operation, 0x07 (iwarp-wire.md §3.6).
            self.fail_with(
                TerminateCause::remote_op(RdmapErrorCode::CatastrophicStream),
                &seg.raw,
                seg.ulpdu_len,
                rr,
            );
            return;
        }
        // A zero-length Read moves no data, so its source is not validated (it is one of
        // the MPA v2 RTR forms, iwarp-wire.md §1.5).
        if let Err(e) = (req.size > 0)
            .then(|| {
                res.stags.check(
                    Stag(req.src_stag),
                    self.cfg.pd,
                    req.src_to,
                    u64::from(req.size),
                    Access::REMOTE_READ,
                )
            })
            .transpose()
        {
            self.fail_with(rdmap_protection(e), &seg.raw, seg.ulpdu_len, rr);
            return;
        }
        let mut hdr = [0u8; UNTAGGED_HEADER_LEN];
        hdr.copy_from_slice(&seg.raw[..UNTAGGED_HEADER_LEN]);
        self.irq.push_back(InboundRead { req, hdr });
    }
}
