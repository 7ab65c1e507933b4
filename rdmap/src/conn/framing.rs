//! Helpers of the [`Connection`](super::Connection): its configuration check, the RTR
//! work request, FPDU encoding straight from region memory, and the completions the
//! connection makes itself.

use xwarp_ddp::mpa::{mulpdu, FpduEncoder, MpaError, RtrType};

use super::{ConnConfig, ConnError, RTR_WRITE_STAG};
use crate::mem::Access;
use crate::qp::{Payload, QpConfig, MIN_MULPDU};
use crate::verbs::{Completion, CompletionStatus, Resources, SendOp, SendWr, Sge, WcOpcode};

/// Whether `cfg` can work.
pub(super) fn check_config(cfg: &ConnConfig) -> Result<(), ConnError> {
    // Markers may be negotiated on either direction, so size for the worst case.
    if mulpdu(cfg.emss, true) < MIN_MULPDU {
        return Err(ConnError::InvalidConfig(
            "emss too small for the longest Terminate",
        ));
    }
    if cfg.qp.ird > u32::from(u16::MAX) || cfg.qp.ord > u32::from(u16::MAX) {
        return Err(ConnError::InvalidConfig("ird/ord above 65535"));
    }
    Ok(())
}

/// The `wr_id` of the RTR work request (not a ULP work request: its completion is
/// dropped and it is not counted in [`QpCounters`](crate::QpCounters)). The QP knows the
/// RTR by a mark set when it is posted (`set_internal_wr`), not by this id, so a ULP WR
/// with the same `wr_id` is still counted.
pub(super) const RTR_WR_ID: u64 = u64::MAX;

/// The work request of the negotiated RTR (RFC 6581): a zero-length Write to STag 1,
/// TO 0, a zero-length Send, or a zero-length Read into an empty region registered in
/// `res` (`None` if that is not possible).
pub(super) fn rtr_wr(rtr: RtrType, qcfg: QpConfig, res: Option<&mut Resources>) -> Option<SendWr> {
    match rtr {
        RtrType::Write => Some(SendWr {
            wr_id: RTR_WR_ID,
            op: SendOp::Write {
                remote_stag: RTR_WRITE_STAG,
                remote_to: 0,
            },
            sgl: Vec::new(),
            signaled: false,
            fence: false,
        }),
        RtrType::Send => Some(SendWr {
            wr_id: RTR_WR_ID,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sgl: Vec::new(),
            signaled: false,
            fence: false,
        }),
        RtrType::Read => {
            // A zero-length Read still needs a valid local sink: an empty region.
            let mr = res.and_then(|r| {
                r.stags
                    .register(qcfg.pd, Access::LOCAL_WRITE, 0, Box::new(Vec::<u8>::new()))
                    .ok()
            });
            mr.map(|lkey| SendWr {
                wr_id: RTR_WR_ID,
                op: SendOp::Read {
                    remote_stag: RTR_WRITE_STAG,
                    remote_to: 0,
                },
                sgl: vec![Sge {
                    lkey,
                    addr: 0,
                    len: 0,
                }],
                // Signaled so that the Connection learns when the sink may go
                // (`settle_rtr_sink` drops this completion).
                signaled: true,
                fence: false,
            })
        }
    }
}

pub(super) fn encode_segment(
    enc: &mut FpduEncoder,
    hdr: &[u8],
    payload: &Payload<'_>,
    out: &mut Vec<u8>,
) -> Result<usize, MpaError> {
    let ulpdu_len = hdr.len() + payload.len();
    let start = out.len();
    out.resize(start + enc.max_encoded_len(ulpdu_len), 0);
    match encode_ulpdu(enc, hdr, payload, &mut out[start..]) {
        Ok(k) => {
            out.truncate(start + k);
            Ok(k)
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// Frames header + payload into the start of `out`: the payload is copied once, from
/// region memory straight into the FPDU (the CRC covers the copied bytes).
pub(super) fn encode_ulpdu(
    enc: &mut FpduEncoder,
    hdr: &[u8],
    payload: &Payload<'_>,
    out: &mut [u8],
) -> Result<usize, MpaError> {
    let mut hdr_left = hdr;
    let mut rd = payload.reader();
    enc.encode_with(
        hdr.len() + payload.len(),
        |dst| {
            let h = hdr_left.len().min(dst.len());
            dst[..h].copy_from_slice(&hdr_left[..h]);
            hdr_left = &hdr_left[h..];
            rd.fill(&mut dst[h..]);
        },
        out,
    )
}

/// Frames one ULPDU into the start of `out` when the largest FPDU it can become fits;
/// otherwise into `spill` (empty on entry), copying what fits into `out` and leaving the
/// rest at the start of `spill`. Returns the bytes written into `out`.
pub(super) fn encode_segment_into(
    enc: &mut FpduEncoder,
    hdr: &[u8],
    payload: &Payload<'_>,
    out: &mut [u8],
    spill: &mut Vec<u8>,
) -> Result<usize, MpaError> {
    let ulpdu_len = hdr.len() + payload.len();
    if enc.max_encoded_len(ulpdu_len) <= out.len() {
        return encode_ulpdu(enc, hdr, payload, out);
    }
    let k = encode_segment(enc, hdr, payload, spill)?;
    let fit = k.min(out.len());
    out[..fit].copy_from_slice(&spill[..fit]);
    spill.drain(..fit);
    Ok(fit)
}

pub(super) fn wc_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send { .. } => WcOpcode::Send,
        SendOp::Write { .. } => WcOpcode::Write,
        SendOp::Read { .. } => WcOpcode::Read,
    }
}

pub(super) fn flush_cqe(wr_id: u64, opcode: WcOpcode) -> Completion {
    Completion {
        wr_id,
        status: CompletionStatus::WrFlushError,
        opcode,
        byte_len: 0,
        solicited: false,
        invalidated_stag: None,
    }
}

pub(super) fn error_cqe(wr_id: u64, opcode: WcOpcode) -> Completion {
    Completion {
        status: CompletionStatus::LocalQpOperationError,
        ..flush_cqe(wr_id, opcode)
    }
}
