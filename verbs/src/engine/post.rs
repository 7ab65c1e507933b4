//! Work requests on the engine: posting to a QP's connection, and the ordering of
//! Local Invalidate (`pump_held`).

use xwarp_rdmap::verbs::{Completion, CompletionStatus, PostError, Resources, SendOp, SendWr, Sge};

use crate::cq::WcOpcode;
use crate::engine::host::VerbsHost;
use crate::engine::slot::{flush, opcode_of, Early, QpSlot};
use crate::wr::{SendOpcode, SendRequest};

impl VerbsHost {
    pub(crate) fn post_to_conn(&mut self, qpn: u32, e: Early) {
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return;
        };
        if slot.conn.is_none() {
            slot.early.push(e);
            // No connection will take it: the QP is done or in ERROR (a connect being
            // aborted never gets one, see `on_established`).
            if slot.finished || slot.errored {
                slot.flush_early();
            }
            return;
        }
        // After disconnect / modify(CLOSING) the QP is past RTS and takes no new work: it
        // is flushed at once (as siw's post_send/post_recv do for kernel consumers past
        // RTS; the teardown itself is docs/siw.md §4.7). This matters while the close
        // waits for work held behind a Local Invalidate (`disconnect`): the held work
        // still drains, but work posted after the disconnect must not join it and run
        // before the close. Its flush completion may come before the completions of
        // earlier work that is still draining.
        if slot.disconnect_requested {
            slot.flush_one(e);
            return;
        }
        // A Local Invalidate, and send work behind one, wait in order (see `pump_held`).
        let hold = match &e {
            Early::LocalInv { .. } => true,
            Early::Send(_) => !slot.held.is_empty(),
            Early::Recv(_) => false,
        };
        if hold {
            slot.held.push_back(e);
            self.pump_held(qpn);
        } else {
            Self::post_now(slot, &mut self.res, e);
        }
    }

    /// Local Invalidate ordering: a Local Invalidate takes effect only once every earlier
    /// send work request of the QP completed (the QP's send side is drained: nothing
    /// queued or being sent, no Read outstanding), so an earlier Send/Write has read its
    /// source and an earlier Read has placed its data before the STag dies; send work
    /// posted after it waits behind it, so a later WR using the STag sees it invalid. In
    /// ERROR, TERMINATE, CLOSING or after the connection died it is flushed instead.
    pub(crate) fn pump_held(&mut self, qpn: u32) {
        use xwarp_rdmap::QpState as Q;
        let mut moved = false;
        loop {
            let Some(slot) = self.qps.get_mut(&qpn) else {
                return;
            };
            let Some(front) = slot.held.front() else {
                break;
            };
            if matches!(front, Early::LocalInv { .. }) {
                let Some(conn) = slot.conn.as_ref() else {
                    return;
                };
                // `is_drained` is stricter than the ordering needs: besides our send
                // side (SQ, the message being sent, our outstanding Reads = ORQ) it also
                // waits for the IRQ, the Read Responses we owe the peer. RFC 5040 orders
                // messages within one direction only (~§5.5; docs/ddp-rdmap.md §3.6): the
                // peer's Read Requests arrive on the peer's stream and are answered from
                // our IRD queue, not our send queue, so no earlier WR of ours depends on
                // them and a Local Invalidate need not wait for them (a peer reading an
                // STag we invalidate gets a remote access error, the ULP's race). A peer
                // pipelining Reads can therefore delay the barrier as long as it keeps
                // the IRQ non-empty. Waiting only for the send side needs a query that
                // xwarp-rdmap's QueuePair does not expose yet (SQ, current TX message if
                // it is ours, ORQ); until then the stricter check is kept, which is
                // correct, only possibly slow.
                let ready = conn.is_closed()
                    || match conn.qp() {
                        None => false,
                        Some(q) => q.state() != Q::Rts || q.is_drained(),
                    };
                if !ready {
                    return;
                }
                // Earlier completions first.
                slot.drain();
            }
            if let Some(e) = slot.held.pop_front() {
                moved = true;
                Self::post_now(slot, &mut self.res, e);
            }
        }
        // A disconnect waits for the held work to reach the QP (graceful: it drains).
        if let Some(slot) = self.qps.get_mut(&qpn) {
            if moved && slot.disconnect_requested {
                if let Some(c) = slot.conn.as_mut() {
                    c.close();
                    slot.drain();
                }
            }
        }
    }

    /// Hand one work request to the connection (which exists).
    pub(crate) fn post_now(slot: &mut QpSlot, res: &mut Resources, e: Early) {
        let Some(conn) = slot.conn.as_mut() else {
            return;
        };
        match e {
            Early::Send(wr) => {
                let (id, op) = (wr.wr_id, opcode_of(&wr.op));
                if let Err(e) = conn.post_send(wr) {
                    let status = match e {
                        PostError::InvalidState => CompletionStatus::WrFlushError,
                        _ => CompletionStatus::LocalQpOperationError,
                    };
                    slot.count_local(op, status);
                    slot.send_completion(
                        &Completion {
                            status,
                            ..flush(id)
                        },
                        op,
                    );
                }
            }
            Early::Recv(wr) => {
                let id = wr.wr_id;
                if conn.post_recv(wr).is_err() {
                    slot.count_local(WcOpcode::Recv, CompletionStatus::LocalQpOperationError);
                    slot.send_completion(
                        &Completion {
                            status: CompletionStatus::LocalQpOperationError,
                            ..flush(id)
                        },
                        WcOpcode::Recv,
                    );
                }
            }
            Early::LocalInv {
                wr_id,
                stag,
                signaled,
            } => {
                let live = conn
                    .qp()
                    .is_some_and(|q| q.state() == xwarp_rdmap::QpState::Rts);
                let ok = if conn.is_closed() || !live {
                    None
                } else {
                    Some(res.stags.invalidate(stag, slot.qp.pd).is_ok())
                };
                let status = match ok {
                    None => CompletionStatus::WrFlushError,
                    Some(true) => CompletionStatus::Success,
                    Some(false) => CompletionStatus::LocalProtectionError,
                };
                slot.count_local(WcOpcode::LocalInvalidate, status);
                if signaled || status != CompletionStatus::Success {
                    slot.send_completion(
                        &Completion {
                            status,
                            ..flush(wr_id)
                        },
                        WcOpcode::LocalInvalidate,
                    );
                }
            }
        }
        slot.drain();
    }

    pub(crate) fn post_send(&mut self, qpn: u32, wr: SendRequest) {
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return;
        };
        let op = match wr.opcode {
            SendOpcode::Send => SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            SendOpcode::SendWithSolicitedEvent => SendOp::Send {
                solicited: true,
                invalidate: None,
            },
            SendOpcode::SendWithInvalidate(s) => SendOp::Send {
                solicited: false,
                invalidate: Some(s),
            },
            SendOpcode::SendWithSolicitedEventInvalidate(s) => SendOp::Send {
                solicited: true,
                invalidate: Some(s),
            },
            SendOpcode::Write { rkey, remote_addr } => SendOp::Write {
                remote_stag: rkey,
                remote_to: remote_addr,
            },
            SendOpcode::Read { rkey, remote_addr } => SendOp::Read {
                remote_stag: rkey,
                remote_to: remote_addr,
            },
            SendOpcode::LocalInvalidate(stag) => {
                self.post_to_conn(
                    qpn,
                    Early::LocalInv {
                        wr_id: wr.wr_id,
                        stag,
                        signaled: wr.signaled,
                    },
                );
                return;
            }
        };
        let sgl = match (&wr.inline, slot.inline.as_mut()) {
            (Some(data), Some((stag, size, next))) if data.len() <= *size => {
                let idx = *next % slot.qp.sq_depth.max(1);
                *next = next.wrapping_add(1);
                let off = idx * *size;
                if self.res.stags.write(*stag, off, data).is_err() {
                    slot.count_local(opcode_of(&op), CompletionStatus::LocalQpOperationError);
                    slot.send_completion(
                        &Completion {
                            status: CompletionStatus::LocalQpOperationError,
                            ..flush(wr.wr_id)
                        },
                        opcode_of(&op),
                    );
                    return;
                }
                vec![Sge {
                    lkey: *stag,
                    addr: off as u64,
                    len: data.len() as u32,
                }]
            }
            (Some(_), _) => {
                slot.count_local(opcode_of(&op), CompletionStatus::LocalQpOperationError);
                slot.send_completion(
                    &Completion {
                        status: CompletionStatus::LocalQpOperationError,
                        ..flush(wr.wr_id)
                    },
                    opcode_of(&op),
                );
                return;
            }
            (None, _) => wr.sgl,
        };
        let swr = SendWr {
            wr_id: wr.wr_id,
            op,
            sgl,
            signaled: wr.signaled,
            fence: wr.fence,
        };
        self.post_to_conn(qpn, Early::Send(swr));
    }
}
