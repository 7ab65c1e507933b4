//! The read responder (RFC 5040 §5.2, §6.4): inbound RDMA Read Requests are checked
//! against IRD and the source region, queued, and answered with tagged Read Response
//! segments in request order.

use xwarp_ddp::segment::{TaggedHeader, TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};

use super::payload::Payload;
use super::types::{rdmap_protection, InboundRead, RxSeg, TxCur};
use super::QueuePair;
use crate::mem::{Access, MemError, RegionBytes, Stag};
use crate::verbs::Resources;
use crate::wire::{
    Opcode, RdmapErrorCode, ReadRequest, Terminate, TerminateCause, TerminatedDdpHeader,
    READ_REQUEST_LEN,
};

/// Most Read Responses sent back to back while send work waits (siw, docs/siw.md §4.4).
pub(super) const IRQ_BURST: u32 = 4;

impl QueuePair {
    pub(super) fn irq_in_use(&self) -> usize {
        self.irq.len() + usize::from(matches!(self.tx_cur, Some(TxCur::ReadResp { .. })))
    }

    pub(super) fn accept_read(&mut self, res: &Resources, req: ReadRequest, seg: &RxSeg) {
        let rr = Some(req.to_bytes());
        if self.irq_in_use() >= self.cfg.ird as usize {
            // RFC 5040 §6.4 / siw: beyond IRD → remote operation, 0x07 (docs/ddp-rdmap.md §3.6).
            self.fail_with(
                TerminateCause::remote_op(RdmapErrorCode::CatastrophicStream),
                &seg.raw,
                seg.ulpdu_len,
                rr,
            );
            return;
        }
        // A zero-length Read moves no data, so its source is not validated (it is one of
        // the MPA v2 RTR forms, docs/mpa.md §1.5).
        let pin = match (req.size > 0)
            .then(|| {
                res.stags.check_pin(
                    Stag(req.src_stag),
                    self.cfg.pd,
                    req.src_to,
                    u64::from(req.size),
                    Access::REMOTE_READ,
                )
            })
            .transpose()
        {
            Ok(p) => p.map(|(p, _)| p),
            Err(e) => {
                self.fail_with(rdmap_protection(e), &seg.raw, seg.ulpdu_len, rr);
                return;
            }
        };
        let mut hdr = [0u8; UNTAGGED_HEADER_LEN];
        hdr.copy_from_slice(&seg.raw[..UNTAGGED_HEADER_LEN]);
        self.irq.push_back(InboundRead { req, hdr, pin });
    }

    /// Emit the next Read Response segment of the Read Request being answered; hands
    /// `emit` back unused if its source region went away.
    pub(super) fn emit_read_response<R, F: FnOnce(&[u8], &Payload<'_>) -> R>(
        &mut self,
        res: &Resources,
        max_ulpdu: usize,
        emit: F,
    ) -> Result<R, F> {
        let pd = self.cfg.pd;
        let mut hbuf = [0u8; TAGGED_HEADER_LEN];
        let Some(TxCur::ReadResp { req, sent }) = self.tx_cur.as_mut() else {
            return Err(emit);
        };
        let rr = req.req;
        let chunk = (rr.size - *sent).min((max_ulpdu - TAGGED_HEADER_LEN) as u32);
        let last = *sent + chunk == rr.size;
        let src = rr.src_to.wrapping_add(u64::from(*sent));
        let data = if chunk == 0 {
            Ok(RegionBytes::EMPTY)
        } else {
            // Only from the registration the request was accepted against.
            req.pin.ok_or(MemError::InvalidStag).and_then(|p| {
                res.stags
                    .bytes_pinned(p, pd, Access::REMOTE_READ, src, chunk as usize)
            })
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
        let mut payload = Payload::empty();
        if chunk > 0 {
            payload.push(data);
        }
        let r = emit(&hbuf[..TAGGED_HEADER_LEN], &payload);
        *sent += chunk;
        self.ctr.segments_sent += 1;
        self.ctr.bytes_sent += u64::from(chunk);
        if last {
            self.ctr.read_requests_served += 1;
            self.tx_cur = None;
        }
        Ok(r)
    }
}
