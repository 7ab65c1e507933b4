//! QP attributes: the MPA settings ([`MpaAttr`]), what a query reports ([`QpAttr`]),
//! a modify ([`QpModify`]) and the inline-data bounds.

use std::net::SocketAddr;

use xwarp_ddp::mpa::RtrType;

use xwarp_rdmap::QpState;

/// Largest `max_inline_data` a QP accepts ([`QpInitAttr::max_inline_data`](crate::QpInitAttr::max_inline_data),
/// [`QpModify::max_inline_data`]); more is `InvalidInput`. Inline payloads are copied
/// at post time into a per-QP buffer of `max_inline_data × max_send_wr` bytes.
pub const MAX_INLINE_DATA: usize = 64 * 1024;

/// Largest per-QP inline buffer (`max_inline_data × max_send_wr`); more is
/// `InvalidInput`, so a deep send queue with large inline data cannot make the engine
/// allocate without bound.
pub const MAX_INLINE_BUFFER: usize = 64 * 1024 * 1024;

/// Whether `max_inline_data` is acceptable for a send queue of `sq_depth` entries
/// (`Err` carries the reason).
pub(crate) fn check_inline(max_inline_data: usize, sq_depth: usize) -> Result<(), String> {
    if max_inline_data > MAX_INLINE_DATA {
        return Err(format!(
            "max_inline_data {max_inline_data} is more than {MAX_INLINE_DATA}"
        ));
    }
    match max_inline_data.checked_mul(sq_depth) {
        Some(n) if n <= MAX_INLINE_BUFFER => Ok(()),
        _ => Err(format!(
            "max_inline_data {max_inline_data} x max_send_wr {sq_depth} is more than \
             {MAX_INLINE_BUFFER} bytes of inline buffer"
        )),
    }
}

/// MPA and RTR settings of a QP's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpaAttr {
    /// MPA revision to request / highest accepted (1 or 2). Default 2.
    pub revision: u8,
    /// Require CRC32c on FPDUs. Default false (siw's default).
    pub crc: bool,
    /// Require markers in the FPDUs we receive. Default false.
    pub markers: bool,
    /// Peer-to-peer mode (RFC 6581): the RTR type the Initiator offers. Default a
    /// zero-length Write. `None`: no P2P (the Responder then sends nothing before the
    /// Initiator's first message).
    pub p2p_rtr: Option<RtrType>,
    /// As Responder without P2P (the Initiator offered no RTR), send right after the MPA
    /// Reply instead of waiting for the Initiator's first FPDU, as siw's Responder does
    /// (`ConnConfig::responder_sends_after_reply`; siw quirk, docs/siw.md §4.8.14).
    /// Default false (RFC 5044 §7.1.2).
    pub responder_sends_after_reply: bool,
}

impl Default for MpaAttr {
    fn default() -> Self {
        MpaAttr {
            revision: 2,
            crc: false,
            markers: false,
            p2p_rtr: Some(RtrType::Write),
            responder_sends_after_reply: false,
        }
    }
}

impl MpaAttr {
    /// Whether the settings can make a connection: the revision is 1 or 2 (RFC 5044 /
    /// RFC 6581), and P2P (an RTR type) only with revision 2, since the RTR type is
    /// negotiated in the MPA v2 block (RFC 6581 §3). [`ProtectionDomain::create_qp`](crate::ProtectionDomain::create_qp) and
    /// [`QueuePair::modify`](crate::QueuePair::modify) refuse anything else with `InvalidInput` and this reason.
    pub fn validate(&self) -> Result<(), String> {
        if self.revision != 1 && self.revision != 2 {
            return Err(format!(
                "MPA revision must be 1 or 2 (got {})",
                self.revision
            ));
        }
        if self.revision == 1 {
            if let Some(rtr) = self.p2p_rtr {
                return Err(format!(
                    "P2P RTR type {rtr:?} needs MPA revision 2 (RFC 6581 negotiates it in the \
                     v2 block); set p2p_rtr to None for revision 1"
                ));
            }
        }
        Ok(())
    }
}

/// MPA parameters negotiated for a QP's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NegotiatedMpa {
    /// MPA revision in use (the Reply's).
    pub revision: u8,
    /// CRC32c on FPDUs, both directions.
    pub crc: bool,
    /// We insert markers in the FPDUs we send.
    pub markers_tx: bool,
    /// The peer inserts markers in the FPDUs we receive.
    pub markers_rx: bool,
    /// P2P: the RTR message type the Initiator sends first (`None`: no P2P).
    pub p2p_rtr: Option<RtrType>,
    /// The peer's IRD from its MPA v2 block.
    pub peer_ird: Option<u16>,
    /// The peer's ORD from its MPA v2 block.
    pub peer_ord: Option<u16>,
}

/// What [`QueuePair::query`](crate::QueuePair::query) reports (after `ibv_query_qp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpAttr {
    /// QP number.
    pub qp_num: u32,
    /// Current state.
    pub state: QpState,
    /// Inbound RDMA Read depth: the negotiated one once MPA finished, else requested.
    pub ird: u32,
    /// Outbound RDMA Read depth: the negotiated one once MPA finished, else requested.
    pub ord: u32,
    /// Largest inline payload.
    pub max_inline_data: usize,
    /// Send queue depth.
    pub max_send_wr: usize,
    /// Receive queue depth (`None`: the QP takes receives from a shared receive queue).
    pub max_recv_wr: Option<usize>,
    /// MPA settings the QP asks for (or accepts with) when it connects.
    pub mpa: MpaAttr,
    /// What MPA negotiated (`None` before negotiation finished).
    pub negotiated: Option<NegotiatedMpa>,
    /// Our TCP address, once the connection exists.
    pub local_addr: Option<SocketAddr>,
    /// The peer's TCP address, once the connection exists.
    pub peer_addr: Option<SocketAddr>,
}

impl QpAttr {
    /// Engine side: assemble the attributes of one QP.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn build(
        qp_num: u32,
        state: QpState,
        qp: &xwarp_rdmap::QpConfig,
        mpa: &MpaAttr,
        neg: Option<&xwarp_ddp::mpa::Negotiated>,
        max_inline_data: usize,
        addrs: Option<(SocketAddr, SocketAddr)>,
    ) -> QpAttr {
        QpAttr {
            qp_num,
            state,
            ird: neg.map_or(qp.ird, |n| u32::from(n.ird)),
            ord: neg.map_or(qp.ord, |n| u32::from(n.ord)),
            max_inline_data,
            max_send_wr: qp.sq_depth,
            max_recv_wr: match qp.rq {
                xwarp_rdmap::RqConfig::Own(d) => Some(d),
                xwarp_rdmap::RqConfig::Shared(_) => None,
            },
            mpa: mpa.clone(),
            negotiated: neg.map(|n| NegotiatedMpa {
                revision: n.revision,
                crc: n.crc,
                markers_tx: n.markers_tx,
                markers_rx: n.markers_rx,
                p2p_rtr: n.rtr,
                peer_ird: n.peer_ird,
                peer_ord: n.peer_ord,
            }),
            local_addr: addrs.map(|a| a.0),
            peer_addr: addrs.map(|a| a.1),
        }
    }
}

/// A change for [`QueuePair::modify`](crate::QueuePair::modify) (after `ibv_modify_qp`): a new state and/or new
/// attributes; `None` fields stay as they are.
///
/// Transitions (siw's `siw_qp_modify`, plus the verbs RESET; anything else is
/// `InvalidInput` with the reason):
/// * IDLE → ERROR (queued work is flushed; a connect in progress is aborted);
/// * RTS → CLOSING (graceful disconnect, like [`QueuePair::disconnect`](crate::QueuePair::disconnect)), RTS →
///   TERMINATE (a Terminate, RDMAP layer, local catastrophic error, code 0xff, then the
///   connection closes), RTS → ERROR (abortive: work is flushed, TCP is reset);
/// * CLOSING → ERROR, TERMINATE → ERROR (abortive);
/// * teardown on the wire as siw does it (docs/siw.md §4.7): CLOSING ends with a TCP
///   FIN and no RDMAP message, ERROR releases the connection at once (a TCP reset);
/// * ERROR → IDLE, and IDLE → IDLE once a graceful close finished: a **reset** (verbs
///   `IBV_QPS_RESET`, which siw maps to its IDLE); see [`QueuePair::modify`](crate::QueuePair::modify);
/// * to the current state otherwise: nothing happens (IDLE → IDLE on a QP that never
///   connected only carries attributes).
///
/// Refused on purpose: RTS → IDLE (siw's `siw_qp_nextstate_from_rts` has no IDLE: the
/// connection must end first, by CLOSING or ERROR); CLOSING → IDLE (siw moves a CLOSING
/// QP to IDLE itself when the LLP close finished, `siw_qp_llp_close`; here too: once the
/// graceful close finished the QP is IDLE and may be reset, before that the close is
/// still draining work); TERMINATE → IDLE (ERROR follows once the Terminate is sent).
/// RTS is entered by [`QueuePair::connect`](crate::QueuePair::connect) / [`ConnRequest::accept`](crate::ConnRequest::accept) only (siw needs the
/// LLP handle for it).
///
/// Attributes change only in IDLE before the connection was started (connect or accept),
/// or together with / after a reset: once a connection started they are negotiated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QpModify {
    /// Move to this state.
    pub state: Option<QpState>,
    /// Requested inbound RDMA Read depth (at most 0x3FFF, the MPA v2 field).
    pub ird: Option<u32>,
    /// Requested outbound RDMA Read depth (at most 0x3FFF).
    pub ord: Option<u32>,
    /// Require CRC32c on FPDUs.
    pub crc: Option<bool>,
    /// Require markers in the FPDUs we receive.
    pub markers: Option<bool>,
    /// Largest inline payload (0 disables inline; bounded as
    /// [`QpInitAttr::max_inline_data`](crate::QpInitAttr::max_inline_data)). Refused while work is queued.
    pub max_inline_data: Option<usize>,
    /// MPA revision to request / highest accepted ([`MpaAttr::revision`], 1 or 2).
    pub revision: Option<u8>,
    /// The P2P RTR type the Initiator offers ([`MpaAttr::p2p_rtr`]): `Some(None)` turns
    /// P2P off, `Some(Some(t))` asks for type `t`. The result must pass
    /// [`MpaAttr::validate`] (P2P needs revision 2), else the whole modify is refused.
    pub p2p_rtr: Option<Option<RtrType>>,
}

impl QpModify {
    /// A state change only.
    pub fn to_state(state: QpState) -> QpModify {
        QpModify {
            state: Some(state),
            ..QpModify::default()
        }
    }

    /// Whether any attribute (not the state) is changed.
    pub fn has_attrs(&self) -> bool {
        self.ird.is_some()
            || self.ord.is_some()
            || self.crc.is_some()
            || self.markers.is_some()
            || self.max_inline_data.is_some()
            || self.revision.is_some()
            || self.p2p_rtr.is_some()
    }

    /// `mpa` with this change's MPA fields applied.
    pub(crate) fn apply_mpa(&self, mpa: &MpaAttr) -> MpaAttr {
        MpaAttr {
            revision: self.revision.unwrap_or(mpa.revision),
            crc: self.crc.unwrap_or(mpa.crc),
            markers: self.markers.unwrap_or(mpa.markers),
            p2p_rtr: self.p2p_rtr.unwrap_or(mpa.p2p_rtr),
            responder_sends_after_reply: mpa.responder_sends_after_reply,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6581 §3: the RTR type is negotiated in the MPA v2 block, so P2P needs
    /// revision 2; revisions other than 1 and 2 do not exist (RFC 5044 §7.1, RFC 6581).
    #[test]
    fn rfc6581_p2p_needs_revision_2() {
        let base = MpaAttr::default();
        assert_eq!(base.validate(), Ok(()));
        let m = |revision, p2p_rtr| QpModify {
            revision,
            p2p_rtr,
            ..QpModify::default()
        };
        let ok = [
            m(Some(1), Some(None)),
            m(Some(2), Some(Some(RtrType::Send))),
            m(None, Some(Some(RtrType::Read))),
            m(None, Some(None)),
        ];
        for x in ok {
            let a = x.apply_mpa(&base);
            assert_eq!(a.validate(), Ok(()), "{x:?}");
        }
        let v1 = m(Some(1), Some(None)).apply_mpa(&base);
        assert_eq!((v1.revision, v1.p2p_rtr), (1, None));
        // Revision 1 keeping the default Write RTR, or P2P asked on a revision-1 QP.
        for (x, on) in [
            (m(Some(1), None), &base),
            (m(None, Some(Some(RtrType::Write))), &v1),
            (m(Some(0), Some(None)), &base),
            (m(Some(3), None), &base),
        ] {
            let why = x.apply_mpa(on).validate().expect_err(&format!("{x:?}"));
            assert!(why.contains("revision"), "{why}");
        }
    }
}
