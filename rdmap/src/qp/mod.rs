//! The queue pair: RDMAP stream send and receive state machines, the read responder
//! (IRD), the outstanding-read queue (ORD) and the QP state machine, DDP segments in and
//! DDP segments out.
//!
//! Sender (RFC 5040 §5, RFC 5041 §5; docs/ddp-rdmap.md §2.4, §2.5, docs/siw.md §4.4): one message is
//! segmented at a time (so two messages of one class are never interleaved), MSN per
//! queue from 1, MO and TO contiguous, Read Responses in Read Request order, at most ORD
//! Read Requests outstanding (later work waits), fences, at most 4 Read Responses in a
//! row while send work is waiting (like siw, docs/siw.md §4.4).
//!
//! Receiver (RFC 5041 §7.2, RFC 5040 §7; docs/ddp-rdmap.md §2.6, docs/siw.md §4.5): every segment is
//! validated at its header before any payload byte is placed; payload goes straight into
//! the target region. Any violation queues an RFC-layout Terminate carrying the offending
//! segment's length and DDP header (M+D, plus R with the Read Request when the error is
//! found in one), moves the QP to TERMINATE and, once the Terminate is handed out, to
//! ERROR with every outstanding work request flushed.
//!
//! The parts live apart, as siw keeps `siw_qp_tx.c`, `siw_qp_rx.c` and `siw_qp.c` apart:
//! `tx` (the send side), `rx` (the receive side), `read_responder` (the IRD queue and the
//! Read Responses), `state` ([`QpState`] and its transition rules) and `types` (the
//! private types they share). This file holds the [`QueuePair`], its public face, and the
//! entry into TERMINATE and ERROR with the flushing of outstanding work.

mod payload;
mod read_responder;
mod rx;
mod state;
mod tx;
mod types;

use std::collections::VecDeque;

use xwarp_ddp::segment::UNTAGGED_HEADER_LEN;

use crate::counters::QpCounters;
use crate::mem::PdId;
use crate::verbs::{
    Completion, CompletionStatus, PostError, RecvQueue, RecvWr, SendOp, SendWr, SrqId, WcOpcode,
    MAX_SGE, MAX_SGE_RD,
};
use crate::wire::{ParsedTerminate, Terminate, TerminateCause, MAX_TERMINATE_LEN};

pub use payload::{Payload, PayloadReader};
use state::PostRule;
pub use state::QpState;
use types::{
    error_cqe, InboundRead, OutstandingRead, RxKind, RxSeg, RxSend, RxTagged, SqSlot, TxCur,
};

/// Smallest max-ULPDU `poll_segment` accepts: room for the longest Terminate.
pub const MIN_MULPDU: usize = UNTAGGED_HEADER_LEN + MAX_TERMINATE_LEN;

/// Largest DDP segment over MPA (16-bit ULPDU_Length); larger `max_ulpdu` values are clamped.
pub const MAX_ULPDU: usize = u16::MAX as usize;

/// Where a QP takes its receive buffers from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RqConfig {
    /// Its own receive queue with this depth.
    Own(usize),
    /// A shared receive queue in [`Resources`](crate::verbs::Resources).
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

/// A queue pair: one RDMAP stream's send side, receive side, read responder, state and
/// completion queue.
pub struct QueuePair {
    cfg: QpConfig,
    state: QpState,
    // --- send side
    sq: VecDeque<SendWr>,
    /// Parallel to `sq`: whether each queued WR is internal (the connection's RTR).
    sq_internal: VecDeque<bool>,
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
    /// Completions of internal work (the connection's RTR), kept apart from `cq` so that
    /// no `wr_id` has to be reserved for them: an application WR may use any id.
    internal_cq: VecDeque<Completion>,
    events: VecDeque<QpEvent>,
    // --- statistics
    ctr: QpCounters,
    /// The next WR posted with this `wr_id` is internal work (the connection's RTR), not
    /// counted as a ULP WR; consumed by that post.
    internal_next: Option<u64>,
}

impl QueuePair {
    /// A new QP in state IDLE.
    pub fn new(cfg: QpConfig) -> Self {
        QueuePair {
            sq_internal: VecDeque::with_capacity(cfg.sq_depth.min(4096)),
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
            internal_cq: VecDeque::new(),
            events: VecDeque::new(),
            ctr: QpCounters::default(),
            internal_next: None,
        }
    }

    /// This QP's counters (see [`QpCounters`]; `mpa` is `None` here, the
    /// [`Connection`](crate::Connection) fills it in). A copy: no cost beyond it.
    pub fn counters(&self) -> QpCounters {
        self.ctr
    }

    /// Mark the next send WR posted with this `wr_id` as internal (the connection's RTR):
    /// it and its completion are not counted as work requests. The mark belongs to that
    /// one WR, so an application WR with the same `wr_id` is counted as any other.
    pub(crate) fn set_internal_wr(&mut self, wr_id: u64) {
        self.internal_next = Some(wr_id);
    }

    /// Whether `wr` is the WR [`QueuePair::set_internal_wr`] marked (consuming the mark).
    fn take_internal(&mut self, wr: &SendWr) -> bool {
        if self.internal_next == Some(wr.wr_id) {
            self.internal_next = None;
            return true;
        }
        false
    }

    /// Queue a completion of application work, counting it.
    fn push_cqe(&mut self, c: Completion) {
        self.push_cqe_of(c, false);
    }

    /// Queue a completion: of application work in the CQ, counted; of internal work
    /// apart, for [`QueuePair::poll_internal_completion`].
    fn push_cqe_of(&mut self, c: Completion, internal: bool) {
        if internal {
            self.internal_cq.push_back(c);
            return;
        }
        self.ctr.count_completion(c.opcode, c.status);
        self.cq.push_back(c);
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
        self.state = self.state.on_set_rts().ok_or(QpError::InvalidState)?;
        Ok(())
    }

    /// RTS → CLOSING: no new send work; queued work still drains.
    pub fn close(&mut self) -> Result<(), QpError> {
        self.state = self.state.on_close().ok_or(QpError::InvalidState)?;
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

    /// Next completion of application work.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.cq.pop_front()
    }

    /// Next completion of internal work (the RTR the connection posted through
    /// [`QueuePair::set_internal_wr`]); the application never sees these.
    pub(crate) fn poll_internal_completion(&mut self) -> Option<Completion> {
        self.internal_cq.pop_front()
    }

    /// Next event.
    pub fn poll_event(&mut self) -> Option<QpEvent> {
        self.events.pop_front()
    }

    /// Post a send work request. In ERROR it completes at once with a flush status.
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        match self.state.on_post_send() {
            PostRule::Queue => {}
            PostRule::Flush => {
                let internal = self.take_internal(&wr);
                if !internal {
                    self.ctr.send_wrs_posted += 1;
                }
                self.flush_send_wr(&wr, internal);
                return Ok(());
            }
            PostRule::Refuse => return Err(PostError::InvalidState),
        }
        if wr.sgl.len() > MAX_SGE
            || (matches!(wr.op, SendOp::Read { .. }) && wr.sgl.len() != MAX_SGE_RD)
        {
            return Err(PostError::InvalidSgl);
        }
        // The connection's internal WR (the RTR, posted before any application WR, so at
        // the front while outstanding) takes no application slot: held by a
        // `first_fpdu_delay` it would otherwise refuse the last WR of a full queue.
        let held_internal = match self.sq_slots.front() {
            Some(s) => s.internal,
            None => self.sq_internal.front().copied().unwrap_or(false),
        };
        if self.sq.len() + self.sq_slots.len() >= self.cfg.sq_depth + usize::from(held_internal) {
            return Err(PostError::QueueFull);
        }
        let internal = self.take_internal(&wr);
        if !internal {
            self.ctr.send_wrs_posted += 1;
        }
        self.sq.push_back(wr);
        self.sq_internal.push_back(internal);
        Ok(())
    }

    /// Post a receive to the QP's own receive queue. In ERROR it completes at once with a
    /// flush status. QPs on an SRQ post through [`Resources::post_srq_recv`](crate::verbs::Resources::post_srq_recv).
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.state.flushes_receives() {
            self.ctr.recv_wrs_posted += 1;
            self.flush_recv(wr.wr_id);
            return Ok(());
        }
        let r = match &mut self.rq {
            Some(rq) => rq.post(wr),
            None => Err(PostError::InvalidState),
        };
        if r.is_ok() {
            self.ctr.recv_wrs_posted += 1;
        }
        r
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
            if let Some(s) = self.sq_slots.pop_front() {
                match s.done {
                    Some(Some(c)) => self.push_cqe_of(c, s.internal),
                    // Unsignaled success: no completion, still a finished WR.
                    _ if !s.internal => self.ctr.send_wrs_completed += 1,
                    _ => {}
                }
            }
            self.sq_seq_base += 1;
        }
    }

    fn flush_send_wr(&mut self, wr: &SendWr, internal: bool) {
        self.push_cqe_of(error_cqe(wr, CompletionStatus::WrFlushError), internal);
    }

    fn flush_recv(&mut self, wr_id: u64) {
        self.push_cqe(Completion {
            wr_id,
            status: CompletionStatus::WrFlushError,
            opcode: WcOpcode::Recv,
            byte_len: 0,
            solicited: false,
            invalidated_stag: None,
        });
    }

    fn fatal(&mut self, t: Terminate) {
        let Some(next) = self.state.on_fatal() else {
            return;
        };
        self.state = next;
        self.ctr.errors.count_terminate(&t);
        self.term_pending = Some(t);
        self.events.push_back(QpEvent::TerminateQueued(t));
        if let Some(seg) = self.rx_seg.as_mut() {
            seg.kind = RxKind::Discard;
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
            let internal = self.sq_internal.pop_front().unwrap_or(false);
            self.flush_send_wr(&wr, internal);
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
}
