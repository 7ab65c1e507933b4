//! One QP's engine state: [`QpSlot`] and the work waiting for its connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;
use xwarp_rdmap::conn::{ConnError, ConnEvent, Connection};
use xwarp_rdmap::verbs::{
    Completion, CompletionStatus, RecvWr, SendOp, SendWr, WcOpcode as RWcOpcode,
};
use xwarp_rdmap::{QpConfig, QpCounters, Stag};
use xwarp_stack::proto::ProtoConnId;
use xwarp_stack::Readiness;

use crate::cm_event::CmEvent;
use crate::cq::{CqShared, WcOpcode, WorkCompletion};
use crate::qp_attr::MpaAttr;
use crate::qp_state::{derive_state, ConnPhase, Flags, Link, QpState};
use crate::qp_stats::QpStatsSnapshot;

/// Work waiting for the QP's connection object.
pub(crate) enum Early {
    Send(SendWr),
    Recv(RecvWr),
    LocalInv {
        wr_id: u64,
        stag: Stag,
        signaled: bool,
    },
}

/// A connect in progress: what each attempt needs, and the refused-connect retry.
pub(crate) struct Connecting {
    /// The listener's address.
    pub(crate) remote: SocketAddr,
    /// Private data for the MPA Request.
    pub(crate) private_data: Vec<u8>,
    /// The current attempt gives up at this instant (TCP handshake plus MPA).
    pub(crate) deadline: Instant,
    /// Each attempt's bound (`ConnectParams::timeout`).
    pub(crate) timeout: std::time::Duration,
    /// `ConnConfig::first_fpdu_delay` of the connection.
    pub(crate) first_fpdu_delay: std::time::Duration,
    /// `ConnectTuning::p2p_rtr_offer`: the RTR types the Request offers, if not the QP's.
    pub(crate) p2p_rtr_offer: Option<xwarp_ddp::mpa::RtrSet>,
    /// A refused attempt is tried again while the next try starts before this instant.
    pub(crate) retry_until: Option<Instant>,
    /// The last attempt was refused: the next starts at this instant (`VerbsHost::poll`).
    pub(crate) retry_at: Option<Instant>,
    /// Attempts refused so far.
    pub(crate) refused: u32,
}

pub(crate) struct QpSlot {
    pub(crate) qpn: u32,
    pub(crate) qp: QpConfig,
    pub(crate) mpa: MpaAttr,
    pub(crate) send_cq: Arc<CqShared>,
    pub(crate) recv_cq: Arc<CqShared>,
    pub(crate) events: Sender<CmEvent>,
    pub(crate) ready: Arc<Readiness>,
    pub(crate) conn_id: Option<ProtoConnId>,
    pub(crate) conn: Option<Connection>,
    pub(crate) early: Vec<Early>,
    /// Inline buffer: STag, slot size, next slot.
    pub(crate) inline: Option<(Stag, usize, usize)>,
    pub(crate) abort: bool,
    /// Connect in progress (until Established or the failure is reported).
    pub(crate) connecting: Option<Connecting>,
    pub(crate) destroyed: bool,
    pub(crate) finished: bool,
    pub(crate) disconnect_requested: bool,
    /// The connection failed (error, Terminate, modify to ERROR): it ends in ERROR, not IDLE.
    pub(crate) errored: bool,
    /// Send work behind a Local Invalidate that waits for the send queue (see
    /// `VerbsHost::pump_held`).
    pub(crate) held: std::collections::VecDeque<Early>,
    /// Local and peer TCP addresses once connected.
    pub(crate) addrs: Option<(SocketAddr, SocketAddr)>,
    /// Counts the connection does not keep: work the engine finished without it (flushed
    /// before it existed or after it was gone, refused, Local Invalidate), and the
    /// counts of connections a reset dropped. [`QpSlot::stats`] adds the live one's.
    pub(crate) counts: QpCounters,
}

impl QpSlot {
    /// The engine's facts about the QP, for [`crate::qp_state`].
    pub(crate) fn flags(&self) -> Flags {
        Flags {
            started: self.conn_id.is_some(),
            disconnect_requested: self.disconnect_requested,
            errored: self.errored,
            finished: self.finished,
        }
    }

    /// The verbs state, derived from the connection and its QP ([`derive_state`]).
    pub(crate) fn state(&self) -> QpState {
        let link = match &self.conn {
            Some(c) if c.is_closed() => Link::Closed,
            Some(c) => Link::Open(c.qp().map(|q| q.state())),
            None => Link::None,
        };
        derive_state(link, self.flags())
    }

    /// The QP's statistics now: the engine's own counts plus the connection's
    /// ([`Connection::counters`]), with the current connection's MPA result.
    pub(crate) fn stats(&self) -> QpStatsSnapshot {
        let mut counters = self.counts;
        let live = self.conn.as_ref().map(|c| c.counters());
        if let Some(c) = &live {
            counters.accumulate(c);
        }
        counters.mpa = live.and_then(|c| c.mpa);
        QpStatsSnapshot {
            qp_num: self.qpn,
            state: self.state(),
            local_addr: self.addrs.map(|a| a.0),
            peer_addr: self.addrs.map(|a| a.1),
            counters,
        }
    }

    /// Count a work request the engine finished itself, without the connection (which
    /// therefore never counted it): one post and its completion.
    pub(crate) fn count_local(&mut self, opcode: WcOpcode, status: CompletionStatus) {
        let op = if opcode == WcOpcode::Recv {
            RWcOpcode::Recv
        } else {
            RWcOpcode::Send
        };
        self.counts.count_posted_and_done(op, status);
    }

    /// Where the connection is, for [`crate::qp_state::plan_modify`].
    pub(crate) fn phase(&self) -> ConnPhase {
        self.flags().phase()
    }

    pub(crate) fn event(&self, e: CmEvent) {
        let _ = self.events.send(e);
        self.ready.signal();
    }

    pub(crate) fn send_completion(&self, c: &Completion, opcode: WcOpcode) {
        let cq = if opcode == WcOpcode::Recv {
            &self.recv_cq
        } else {
            &self.send_cq
        };
        cq.push(WorkCompletion {
            wr_id: c.wr_id,
            status: c.status,
            opcode,
            byte_len: c.byte_len,
            qp_num: self.qpn,
            solicited: c.solicited,
            invalidated_rkey: c.invalidated_stag,
        });
    }

    /// Move completions and events out of the connection.
    pub(crate) fn drain(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let mut comps = Vec::new();
        while let Some(c) = conn.poll_completion() {
            comps.push(c);
        }
        let mut evs = Vec::new();
        while let Some(e) = conn.poll_event() {
            evs.push(e);
        }
        for c in comps {
            let op = match c.opcode {
                RWcOpcode::Send => WcOpcode::Send,
                RWcOpcode::Write => WcOpcode::Write,
                RWcOpcode::Read => WcOpcode::Read,
                RWcOpcode::Recv => WcOpcode::Recv,
            };
            self.send_completion(&c, op);
        }
        for e in evs {
            if matches!(
                e,
                ConnEvent::Error(_)
                    | ConnEvent::Rejected { .. }
                    | ConnEvent::TerminateReceived(_)
                    | ConnEvent::TerminateSent(_)
            ) {
                self.errored = true;
            }
            let out = match e {
                ConnEvent::ConnectRequest(_) => None,
                ConnEvent::Established(n) => {
                    self.connecting = None;
                    Some(CmEvent::Established {
                        private_data: n.peer_private_data,
                        ird: n.ird,
                        ord: n.ord,
                        crc: n.crc,
                        revision: n.revision,
                    })
                }
                ConnEvent::Rejected { private_data } => {
                    self.connecting = None;
                    Some(CmEvent::Rejected { private_data })
                }
                ConnEvent::TerminateReceived(p) => {
                    let (layer, etype, code) = p
                        .best()
                        .map(|t| (t.layer, t.etype, t.code))
                        .unwrap_or((0xf, 0xf, 0xff));
                    Some(CmEvent::TerminateReceived { layer, etype, code })
                }
                ConnEvent::TerminateSent(t) => Some(CmEvent::TerminateSent {
                    layer: t.layer,
                    etype: t.etype,
                    code: t.code,
                }),
                // The peer closing is reported as Disconnected (as rdma_cm does).
                ConnEvent::Error(ConnError::ConnectionLost) => None,
                ConnEvent::Error(e) => {
                    if self.connecting.take().is_some() {
                        Some(CmEvent::ConnectError(e.to_string()))
                    } else {
                        Some(CmEvent::Error(e.to_string()))
                    }
                }
                ConnEvent::Closed => {
                    self.finished = true;
                    Some(CmEvent::Disconnected)
                }
            };
            if let Some(e) = out {
                self.event(e);
            }
        }
    }

    /// The connect attempt was refused: schedule the next one if
    /// `ConnectTuning::retry_refused` allows it (it would start before its deadline and
    /// the QP is neither aborted nor destroyed); false when the refusal is final.
    pub(crate) fn schedule_retry(&mut self, now: Instant) -> bool {
        if self.abort || self.destroyed || self.errored || self.disconnect_requested {
            return false;
        }
        let Some(c) = self.connecting.as_mut() else {
            return false;
        };
        let at = now + crate::cm_event::CONNECT_RETRY_INTERVAL;
        match c.retry_until {
            Some(until) if at < until => {
                c.retry_at = Some(at);
                c.refused += 1;
                true
            }
            _ => false,
        }
    }

    /// Flush work that never reached a connection.
    pub(crate) fn flush_early(&mut self) {
        for e in std::mem::take(&mut self.early) {
            self.flush_one(e);
        }
    }

    /// Complete one work request with `WrFlushError` without executing it.
    pub(crate) fn flush_one(&mut self, e: Early) {
        let (wr_id, op) = match e {
            Early::Send(w) => (w.wr_id, opcode_of(&w.op)),
            Early::Recv(w) => (w.wr_id, WcOpcode::Recv),
            Early::LocalInv { wr_id, .. } => (wr_id, WcOpcode::LocalInvalidate),
        };
        self.count_local(op, CompletionStatus::WrFlushError);
        self.send_completion(&flush(wr_id), op);
    }
}

pub(crate) fn opcode_of(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send { .. } => WcOpcode::Send,
        SendOp::Write { .. } => WcOpcode::Write,
        SendOp::Read { .. } => WcOpcode::Read,
    }
}

pub(crate) fn flush(wr_id: u64) -> Completion {
    Completion {
        wr_id,
        status: CompletionStatus::WrFlushError,
        opcode: RWcOpcode::Send,
        byte_len: 0,
        solicited: false,
        invalidated_stag: None,
    }
}
