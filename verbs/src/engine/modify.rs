//! QP modify on the engine (after the table in [`crate::qp_state`]) and the reset.

use xwarp_rdmap::wire::{RdmapErrorCode, RdmapEtype, TerminateCause};
use xwarp_rdmap::Access;

use crate::engine::host::{Owner, VerbsHost};
use crate::qp_attr::{check_inline, QpModify};
use crate::qp_state::{plan_modify, Transition};

impl VerbsHost {
    /// `QueuePair::modify`: check ([`plan_modify`]), then apply. `Ok(true)`: the QP
    /// was reset.
    pub(crate) fn modify_qp(&mut self, qpn: u32, m: &QpModify) -> Result<bool, String> {
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return Err("QP not found".into());
        };
        let cur = slot.state();
        let plan = plan_modify(cur, slot.phase(), m)?;
        let reset = plan == Some(Transition::Reset);
        // Judge every attribute before changing anything: a refused modify changes nothing.
        let mpa = m.apply_mpa(&slot.mpa);
        mpa.validate()?;
        if let Some(n) = m.max_inline_data {
            check_inline(n, slot.qp.sq_depth)?;
            // A reset leaves nothing queued (ERROR flushed it).
            if !reset && !slot.early.is_empty() {
                return Err("max_inline_data cannot change while work is queued".into());
            }
        }
        if reset {
            self.reset_qp(qpn);
        }
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return Err("QP not found".into());
        };
        if let Some(n) = m.max_inline_data {
            // `check_inline` passed above: the product fits.
            let len = n.saturating_mul(slot.qp.sq_depth);
            let new = if n > 0 {
                let r = self.res.stags.register(
                    slot.qp.pd,
                    Access::LOCAL_WRITE,
                    0,
                    Box::new(vec![0u8; len]),
                );
                Some((r.map_err(|e| format!("inline buffer: {e:?}"))?, n, 0))
            } else {
                None
            };
            if let Some((old, _, _)) = std::mem::replace(&mut slot.inline, new) {
                let _ = self.res.stags.deregister(old);
            }
        }
        slot.qp.ird = m.ird.unwrap_or(slot.qp.ird);
        slot.qp.ord = m.ord.unwrap_or(slot.qp.ord);
        slot.mpa = mpa;
        match plan {
            None | Some(Transition::Stay | Transition::Reset) => {}
            Some(Transition::Close) => self.disconnect(qpn),
            Some(Transition::Terminate) => {
                slot.errored = true;
                if let Some(q) = slot.conn.as_mut().and_then(|c| c.qp_mut()) {
                    q.terminate(TerminateCause::Rdmap(
                        RdmapEtype::LocalCatastrophic,
                        RdmapErrorCode::Unspecified,
                    ));
                }
            }
            Some(Transition::Abort) => {
                // Abortive, as siw (flush SQ and RQ, release the socket at once,
                // docs/siw.md §4.7): flush here, reset TCP; `on_closed` reports
                // Disconnected.
                slot.errored = true;
                if let Some(c) = slot.conn.as_mut() {
                    match c.qp_mut() {
                        Some(q) => q.modify_to_error(),
                        None => c.close(),
                    }
                }
                slot.drain();
                slot.flush_early();
                // Reset the TCP connection if there is one; otherwise nothing can connect.
                match slot.conn_id {
                    Some(_) => slot.abort = true,
                    None => slot.finished = true,
                }
                self.pump_held(qpn);
            }
        }
        Ok(reset)
    }

    /// The reset of `QueuePair::modify` (ERROR → IDLE, or IDLE after a graceful close):
    /// the QP becomes as created. The old connection (with its protocol state: MSNs,
    /// ORD/IRD queues, Terminate state, negotiated MPA) is dropped after every work
    /// request it still held was flushed and drained to the CQs (entering ERROR or the
    /// close already did that; this makes sure, so nothing is lost and nothing of it
    /// completes later). Its TCP connection is released: a stream that already finished
    /// its iWARP side (a graceful close under way, or TIME-WAIT) goes on as a detached
    /// owner (`Owner::Detached`) and closes gracefully; one still open has no owner any
    /// more, so `close_request` aborts it (RST) and its `on_closed` finds nothing. Either
    /// way no event or completion of it reaches the QP again and it is never reused.
    pub(crate) fn reset_qp(&mut self, qpn: u32) {
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return;
        };
        if let Some(c) = slot.conn.as_mut() {
            if let Some(q) = c.qp_mut() {
                // No-op when already in ERROR (the usual case).
                q.modify_to_error();
            } else if !c.is_closed() {
                // Still in the MPA handshake: closing it flushes the work it holds.
                c.close();
            }
        }
        slot.drain();
        for e in std::mem::take(&mut slot.held) {
            slot.flush_one(e);
        }
        slot.flush_early();
        let conn = slot.conn.take();
        // The QP's counters live on: the dropped connection's counts stay in them.
        if let Some(c) = &conn {
            slot.counts.accumulate(&c.counters());
        }
        if let Some(id) = slot.conn_id.take() {
            if matches!(self.owners.get(&id), Some(Owner::Qp(q)) if *q == qpn) {
                match conn {
                    Some(c) if c.is_closed() && c.wants_close() => {
                        self.owners.insert(id, Owner::Detached { conn: c });
                    }
                    c => {
                        if let Some(mut c) = c {
                            c.release(&mut self.res);
                        }
                        self.owners.remove(&id);
                    }
                }
            } else if let Some(mut c) = conn {
                c.release(&mut self.res);
            }
        } else if let Some(mut c) = conn {
            c.release(&mut self.res);
        }
        slot.connecting = None;
        slot.abort = false;
        slot.finished = false;
        slot.disconnect_requested = false;
        slot.errored = false;
        slot.addrs = None;
        if let Some(inline) = slot.inline.as_mut() {
            inline.2 = 0;
        }
    }
}
