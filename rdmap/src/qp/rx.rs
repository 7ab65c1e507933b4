//! The receive side (RFC 5041 §7.2, RFC 5040 §7): DDP
//! segments in, each checked at its header before any payload byte is placed; Sends
//! consume receive work requests, Writes and Read Responses are placed in their regions,
//! Read Requests go to the read responder and Terminates move the QP to ERROR.

use xwarp_ddp::segment::{
    DdpError, SegmentError, SegmentHeader, TaggedErrorCode, UntaggedErrorCode, MAX_HEADER_LEN,
};

use super::types::{ddp_tagged, tagged, untagged, RxKind, RxSeg, RxSend, RxTagged};
use super::{QpError, QpEvent, QueuePair, RqConfig};
use crate::counters::TerminateCode;
use crate::mem::{Access, MemError, Stag};
use crate::verbs::{Completion, CompletionStatus, Resources, WcOpcode, MAX_SGE};
use crate::wire::{
    parse_ctrl, qn, CtrlError, Opcode, RdmapErrorCode, RdmapEtype, ReadRequest, Terminate,
    TerminateCause, TerminatedDdpHeader, MAX_TERMINATE_LEN, READ_REQUEST_LEN,
};

impl QueuePair {
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

    pub(super) fn rx_live(&self) -> bool {
        self.state.receives()
    }

    pub(super) fn begin(
        &mut self,
        res: &mut Resources,
        hdr: Option<SegmentHeader>,
        raw: [u8; MAX_HEADER_LEN],
        ulpdu_len: usize,
    ) -> Result<(), QpError> {
        let hlen = xwarp_ddp::segment::header_len(raw[0]);
        self.ctr.segments_received += 1;
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

    pub(super) fn fail_segment(
        &mut self,
        cause: TerminateCause,
        rr: Option<[u8; READ_REQUEST_LEN]>,
    ) {
        let (raw, len) = match &self.rx_seg {
            Some(s) => (s.raw, s.ulpdu_len),
            None => ([0; MAX_HEADER_LEN], 0),
        };
        self.fail_with(cause, &raw, len, rr);
    }

    pub(super) fn fail_with(
        &mut self,
        cause: TerminateCause,
        raw: &[u8],
        ulpdu_len: usize,
        rr: Option<[u8; READ_REQUEST_LEN]>,
    ) {
        let mut t = Terminate::new(cause);
        t.m = true;
        // RFC 5040 §4.8: length of the terminated DDP segment (siw sends the payload
        // length instead, docs/siw.md §4.6).
        t.ddp_segment_length = ulpdu_len.min(u16::MAX as usize) as u16;
        t.ddp_header = TerminatedDdpHeader::from_bytes(raw);
        t.rdmap_header = rr;
        self.fatal(t);
    }

    pub(super) fn validate(
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
                    // Same-class interleaving (docs/siw.md §4.5): a Write and a Read
                    // Response may not interleave with each other.
                    if m.opcode != op {
                        return Err(TerminateCause::remote_op(RdmapErrorCode::UnexpectedOpcode));
                    }
                }
                let next =
                    t.to.checked_add(len)
                        .ok_or(tagged(TaggedErrorCode::ToWrap))?;
                let mut pin = None;
                let kind = if op == Opcode::Write {
                    if let Some(m) = self.rx_tagged {
                        if m.stag != t.stag {
                            return Err(tagged(TaggedErrorCode::InvalidStag));
                        }
                        if m.next_to != t.to {
                            return Err(tagged(TaggedErrorCode::BaseOrBounds));
                        }
                        pin = m.pin;
                    }
                    if payload_len == 0 {
                        // Zero-length Writes are accepted without an STag check (RFC 5040
                        // §5.1; RTR uses them, docs/mpa.md §1.5, docs/siw.md §4.5).
                        RxKind::Discard
                    } else {
                        // Later segments of one message must reach the very registration
                        // the first one did (an invalidated, re-registered or revalidated
                        // STag is an invalid STag, RFC 5041 §7.2 tagged 0x00).
                        let p = match pin {
                            Some(p) => res
                                .stags
                                .check_pinned(p, pd, t.to, len, Access::REMOTE_WRITE)
                                .map(|_| p),
                            None => res
                                .stags
                                .check_pin(Stag(t.stag), pd, t.to, len, Access::REMOTE_WRITE)
                                .map(|(p, _)| p),
                        }
                        .map_err(ddp_tagged)?;
                        pin = Some(p);
                        RxKind::Place {
                            pin: p,
                            to: t.to,
                            resp: false,
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
                    // The sink registration checked when the Read Request went out.
                    let p = o
                        .sink_pin
                        .ok_or(MemError::InvalidStag)
                        .and_then(|p| {
                            res.stags
                                .check_pinned(p, pd, t.to, len, Access::LOCAL_WRITE)
                                .map(|_| p)
                        })
                        .map_err(|_| TerminateCause::Ddp(DdpError::Catastrophic))?;
                    o.received = total as u32;
                    RxKind::Place {
                        pin: p,
                        to: t.to,
                        resp: true,
                    }
                };
                self.rx_tagged = (!t.last).then_some(RxTagged {
                    opcode: op,
                    stag: t.stag,
                    next_to: next,
                    pin,
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
                    // class before its last segment is interleaving (docs/siw.md §4.5).
                    if q != qn::SEND || u.msn != s.msn {
                        return Err(untagged(UntaggedErrorCode::MsnRange));
                    }
                    if op != s.opcode {
                        return Err(TerminateCause::remote_op(RdmapErrorCode::UnexpectedOpcode));
                    }
                    if u64::from(u.mo) != s.received {
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
                        // rejects anything else, docs/ddp-rdmap.md §3.2, docs/siw.md §4.5).
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
                            // Pin every SGE's registration: the Send is placed only there.
                            let mut pins = [None; MAX_SGE];
                            let bad = rqe.sgl.len() > MAX_SGE
                                || rqe.sgl.iter().zip(pins.iter_mut()).any(|(s, p)| {
                                    res.stags
                                        .check_pin(
                                            s.lkey,
                                            pd,
                                            s.addr,
                                            u64::from(s.len),
                                            Access::LOCAL_WRITE,
                                        )
                                        .map(|(pin, _)| *p = Some(pin))
                                        .is_err()
                                });
                            if bad {
                                self.push_cqe(Completion {
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
                                pins,
                                received: 0,
                                sge: 0,
                                sge_off: 0,
                            });
                        }
                        let Some(s) = self.rx_send.as_mut() else {
                            return Err(TerminateCause::Ddp(DdpError::Catastrophic));
                        };
                        if s.received + len > s.capacity {
                            let id = s.rqe.wr_id;
                            self.rx_send = None;
                            self.push_cqe(Completion {
                                wr_id: id,
                                status: CompletionStatus::LocalLengthError,
                                opcode: WcOpcode::Recv,
                                byte_len: 0,
                                solicited: false,
                                invalidated_stag: None,
                            });
                            // RFC 5041 §7.2 untagged 0x05 (siw sends 0x02 here, docs/siw.md §4.8.9).
                            return Err(untagged(UntaggedErrorCode::MessageTooLong));
                        }
                        // Cannot wrap: `received + len <= capacity <= u32::MAX` (receives
                        // longer than a completion can report are refused at post).
                        s.received += len;
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
            RxKind::Place { pin, to, resp } => {
                // Every chunk re-validates the registration the segment was admitted to:
                // invalidated, deregistered or re-registered since → nothing more lands.
                let pd = self.cfg.pd;
                let access = if resp {
                    Access::LOCAL_WRITE
                } else {
                    Access::REMOTE_WRITE
                };
                let at_to = to.checked_add(at as u64).ok_or(MemError::ToWrap);
                let w = at_to.and_then(|t| res.stags.write_pinned(pin, pd, access, t, chunk));
                if w.is_ok() {
                    self.ctr.bytes_placed += chunk.len() as u64;
                }
                if let Err(e) = w {
                    // The same Terminate the header check would have given: a tagged
                    // buffer error for a Write (RFC 5041 §7.2), catastrophic for our own
                    // Read sink.
                    let cause = if resp {
                        TerminateCause::Ddp(DdpError::Catastrophic)
                    } else {
                        ddp_tagged(e)
                    };
                    self.rx_tagged = None;
                    self.fail_segment(cause, None);
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
                    let w = s
                        .pins
                        .get(s.sge)
                        .copied()
                        .flatten()
                        .ok_or(MemError::InvalidStag)
                        .and_then(|p| {
                            res.stags
                                .write_pinned(p, pd, Access::LOCAL_WRITE, to, &rest[..take])
                        });
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
                self.ctr.bytes_placed += (chunk.len() - rest.len()) as u64;
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
                if seg.payload_len > 0 {
                    self.ctr.tagged_placements += 1;
                }
                if let SegmentHeader::Tagged(t) = hdr {
                    if t.last && parse_ctrl(t.rsvd_ulp) == Ok(Opcode::ReadResponse) {
                        if let Some(o) = self.orq.pop_front() {
                            self.ctr.read_responses_placed += 1;
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
                if seg.payload_len > 0 {
                    self.ctr.untagged_placements += 1;
                }
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
                    self.ctr.terminates_received += 1;
                    let p = Terminate::parse(body).ok();
                    self.ctr.last_terminate_received =
                        p.as_ref().and_then(|p| p.best()).map(TerminateCode::from);
                    if let Some(p) = p {
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

    pub(super) fn finish_send(&mut self, res: &mut Resources, s: RxSend, seg: &RxSeg) {
        let mut invalidated = None;
        if s.opcode.is_invalidate() {
            // Only what a peer may revoke (RFC 5040 §5.3, §6.10): a valid STag of this
            // stream's PD with a remote right, never a local-only key or an internal one
            // (inline buffer, Read-RTR sink). A refusal is a remote operation error.
            if let Err(e) = res.stags.invalidate_remote(Stag(s.inval), self.cfg.pd) {
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
        self.push_cqe(Completion {
            wr_id: s.rqe.wr_id,
            status: CompletionStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: u32::try_from(s.received).unwrap_or(u32::MAX),
            solicited: s.opcode.is_solicited(),
            invalidated_stag: invalidated,
        });
    }
}
