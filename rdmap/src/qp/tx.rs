//! The send side (RFC 5040 §5, RFC 5041 §5): the send
//! queue is segmented one message at a time into DDP segments of at most the MULPDU, with
//! MSN, MO and TO, ORD and fences; Read Responses from the read responder are interleaved
//! (at most [`IRQ_BURST`] in a row while send work waits), and a queued Terminate goes
//! out before the QP enters ERROR.

use xwarp_ddp::segment::{TaggedHeader, UntaggedHeader, TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};

use super::payload::Payload;
use super::read_responder::IRQ_BURST;
use super::types::{error_cqe, wc_opcode, OutstandingRead, SqSlot, Start, TxCur};
use super::{QpError, QpEvent, QpState, QueuePair, MAX_ULPDU, MIN_MULPDU};
use crate::counters::TerminateCode;
use crate::mem::{Access, Stag};
use crate::verbs::{Completion, CompletionStatus, Resources, SendOp};
use crate::wire::{
    qn, Opcode, RdmapErrorCode, RdmapEtype, ReadRequest, Terminate, TerminateCause,
    READ_REQUEST_LEN,
};

impl QueuePair {
    /// Produce the next DDP segment, if any, of at most `max_ulpdu` bytes (the MPA MULPDU).
    /// `emit(header, payload)` receives the DDP header plus any fixed RDMAP part (Read
    /// Request body, Terminate body) and the payload as checked ranges of region memory
    /// ([`Payload`]), which the caller copies once, straight into its TX buffer. Returns `Ok(None)` when there is nothing
    /// to send now.
    pub fn poll_segment<R>(
        &mut self,
        res: &Resources,
        max_ulpdu: usize,
        emit: impl FnOnce(&[u8], &Payload<'_>) -> R,
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
                        self.ctr.segments_sent += 1;
                        self.ctr.terminates_sent += 1;
                        self.ctr.last_terminate_sent = Some(TerminateCode::from(&t));
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

    pub(super) fn emit_terminate<R>(
        &mut self,
        t: &Terminate,
        emit: impl FnOnce(&[u8], &Payload<'_>) -> R,
    ) -> R {
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
        emit(&buf[..n + m], &Payload::empty())
    }

    pub(super) fn sq_head_ready(&self) -> bool {
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

    pub(super) fn start_next(&mut self, res: &Resources) -> Start {
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
        let internal = self.sq_internal.pop_front().unwrap_or(false);
        let seq = self.sq_seq_base + self.sq_slots.len() as u64;
        self.sq_slots.push_back(SqSlot {
            internal,
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
    pub(super) fn emit_cur<R, F: FnOnce(&[u8], &Payload<'_>) -> R>(
        &mut self,
        res: &Resources,
        max_ulpdu: usize,
        emit: F,
    ) -> Result<R, F> {
        let pd = self.cfg.pd;
        let mut hbuf = [0u8; UNTAGGED_HEADER_LEN + READ_REQUEST_LEN];
        let mut payload = Payload::empty();
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
                    let r = emit(&hbuf, &Payload::empty());
                    self.ctr.segments_sent += 1;
                    self.ctr.read_requests_sent += 1;
                    // Pin the sink: the Response lands only in this registration.
                    let sink_pin = res
                        .stags
                        .check_pin(
                            sink.lkey,
                            pd,
                            sink.addr,
                            u64::from(sink.len),
                            Access::LOCAL_WRITE,
                        )
                        .ok()
                        .map(|(p, _)| p);
                    self.orq.push_back(OutstandingRead {
                        seq: *seq,
                        wr_id: wr.wr_id,
                        signaled: wr.signaled,
                        sink,
                        sink_pin,
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
                // Gather the payload as checked region ranges (copied by the caller, never borrowed).
                let (mut i, mut off, mut need) = (*sge, *sge_off, chunk);
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
                        .and_then(|o| res.stags.bytes(s.lkey, o, take as usize));
                    let Ok(data) = data else {
                        break;
                    };
                    if !payload.push(data) {
                        break;
                    }
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
                        self.ctr.errors.local_catastrophic += 1;
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
                let r = emit(&hbuf[..hlen], &payload);
                self.ctr.segments_sent += 1;
                self.ctr.bytes_sent += u64::from(chunk);
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
            TxCur::ReadResp { .. } => self.emit_read_response(res, max_ulpdu, emit),
        }
    }

    pub(super) fn local_tx_error(&mut self) {
        // siw: TX failure → RDMAP / local catastrophic / unspecified (docs/siw.md §4.6).
        self.fatal(Terminate::new(TerminateCause::Rdmap(
            RdmapEtype::LocalCatastrophic,
            RdmapErrorCode::Unspecified,
        )));
    }
}
