//! The [`ProtocolHost`] callbacks: CM handling (listen, accept, connect, close) and
//! placement (received bytes into the connection, FPDUs into the send buffer).

use std::net::SocketAddr;
use std::time::Instant;

use xwarp_ddp::mpa::RecordSplitter;
use xwarp_rdmap::conn::{ConnConfig, ConnEvent, Connection};
use xwarp_rdmap::{PdId, QpConfig};
use xwarp_stack::proto::{CloseRequest, ProtoConnId, ProtoCtl, ProtocolHost};
use xwarp_stack::SocketError;
use xwarp_telemetry::{QpRecord, QpState as RecordState, TermCode};

use crate::cm_event::CmEvent;
use crate::engine::cmd::Cmd;
use crate::engine::host::{fpdu_direct, Framing, Owner, VerbsHost, MAX_PENDING_RAW};
use crate::qp_stats::QpStatsSnapshot;

impl VerbsHost {
    /// Start the connect attempts that wait for their retry instant
    /// (`ConnectTuning::retry_refused`); a QP aborted, reset or destroyed while waiting
    /// gets its `ConnectError` now. Returns the earliest retry instant still ahead.
    fn poll_retries(&mut self, now: Instant, ctl: &mut ProtoCtl) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let waiting: Vec<u32> = self
            .qps
            .values()
            .filter(|s| s.connecting.as_ref().is_some_and(|c| c.retry_at.is_some()))
            .map(|s| s.qpn)
            .collect();
        for qpn in waiting {
            let Some(slot) = self.qps.get_mut(&qpn) else {
                continue;
            };
            if slot.abort || slot.destroyed || slot.errored || slot.disconnect_requested {
                let refused = slot.connecting.take().map_or(0, |c| c.refused);
                slot.conn_id = None;
                slot.finished = true;
                slot.event(CmEvent::ConnectError(format!(
                    "connect ended while waiting to retry ({refused} attempts refused)"
                )));
                slot.flush_early();
                continue;
            }
            let Some(c) = slot.connecting.as_mut() else {
                continue;
            };
            let Some(at) = c.retry_at else {
                continue;
            };
            if at > now {
                next = Some(next.map_or(at, |n| n.min(at)));
                continue;
            }
            c.retry_at = None;
            c.deadline = now + c.timeout;
            let id = ctl.connect(c.remote, None, c.deadline);
            slot.conn_id = Some(id);
            self.owners.insert(id, Owner::Qp(qpn));
        }
        next
    }

    /// Apply queued application commands in order, up to the first one that needs the
    /// engine's `ProtoCtl`; that one and everything after it wait for `poll`.
    fn apply_queued(&mut self, now: Instant) {
        if !self.stashed.is_empty() {
            return;
        }
        while let Ok(cmd) = self.cmds.try_recv() {
            if matches!(
                cmd,
                Cmd::Connect { .. } | Cmd::Listen { .. } | Cmd::Unlisten { .. }
            ) {
                self.stashed.push_back(cmd);
                return;
            }
            self.handle_local(cmd, now);
        }
    }
}

/// The `xwarp stat` record of one QP (`xwarp_telemetry`'s table row) from its snapshot:
/// completions in error (flushed or failed) count as flushed, a Terminate code keeps its
/// three fields.
fn qp_record(s: &QpStatsSnapshot) -> QpRecord {
    use xwarp_rdmap::QpState as S;
    let c = &s.counters;
    let mpa = c.mpa;
    let term = |t: Option<xwarp_rdmap::TerminateCode>| {
        t.map(|t| TermCode {
            layer: t.layer,
            etype: t.etype,
            code: t.code,
        })
    };
    QpRecord {
        qp_num: s.qp_num,
        state: match s.state {
            S::Idle => RecordState::Idle,
            S::Rts => RecordState::Rts,
            S::Closing => RecordState::Closing,
            S::Terminate => RecordState::Terminate,
            S::Error => RecordState::Error,
        },
        local: s.local_addr,
        remote: s.peer_addr,
        mpa_revision: mpa.map_or(0, |m| m.revision),
        crc: mpa.is_some_and(|m| m.crc),
        markers: mpa.is_some_and(|m| m.markers_tx || m.markers_rx),
        ird: mpa.map_or(0, |m| u32::from(m.ird)),
        ord: mpa.map_or(0, |m| u32::from(m.ord)),
        wr_posted_send: c.send_wrs_posted,
        wr_posted_recv: c.recv_wrs_posted,
        wr_completed: c.send_wrs_completed + c.recv_wrs_completed,
        wr_flushed: c.send_wrs_flushed + c.recv_wrs_flushed + c.send_wrs_failed + c.recv_wrs_failed,
        bytes_sent: c.bytes_sent,
        bytes_placed: c.bytes_placed,
        placements_tagged: c.tagged_placements,
        placements_untagged: c.untagged_placements,
        read_requests_served: c.read_requests_served,
        crc_errors: c.crc_errors(),
        terminates_sent: c.terminates_sent,
        terminates_received: c.terminates_received,
        last_terminate_sent: term(c.last_terminate_sent),
        last_terminate_received: term(c.last_terminate_received),
    }
}

impl ProtocolHost for VerbsHost {
    fn qp_records(&self, out: &mut Vec<QpRecord>) {
        self.for_each_qp_stats(|s| out.push(qp_record(s)));
    }

    fn poll(&mut self, now: Instant, ctl: &mut ProtoCtl) -> Option<Instant> {
        while let Some(cmd) = self.stashed.pop_front() {
            self.handle(cmd, now, ctl);
        }
        while let Ok(cmd) = self.cmds.try_recv() {
            self.handle(cmd, now, ctl);
        }
        let mut next: Option<Instant> = None;
        for slot in self.qps.values_mut() {
            if let Some(conn) = slot.conn.as_mut() {
                if conn.poll_timeout().is_some_and(|t| now >= t) {
                    conn.handle_timeout(now);
                    slot.drain();
                }
                if let Some(conn) = slot.conn.as_ref() {
                    if let Some(t) = conn.poll_timeout() {
                        next = Some(next.map_or(t, |n| n.min(t)));
                    }
                }
            }
        }
        if let Some(t) = self.poll_pending(now) {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        if let Some(t) = self.poll_retries(now, ctl) {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        let done: Vec<u32> = self
            .qps
            .values()
            .filter(|s| s.destroyed && (s.finished || s.conn_id.is_none()))
            .map(|s| s.qpn)
            .collect();
        for q in done {
            self.remove_qp(q);
        }
        next
    }

    fn on_listen(&mut self, token: u64, result: Result<SocketAddr, SocketError>) {
        if let Some(l) = self.listeners.get_mut(&token) {
            if let Some(r) = l.reply.take() {
                let _ = r.send(result.map(|_| ()));
            }
            if result.is_err() {
                self.listeners.remove(&token);
            }
        }
    }

    fn on_accepted(
        &mut self,
        token: u64,
        conn: ProtoConnId,
        local: SocketAddr,
        peer: SocketAddr,
        now: Instant,
    ) {
        let mut cfg = ConnConfig::new(QpConfig {
            pd: PdId(0),
            ird: 1,
            ord: 1,
            sq_depth: 1,
            rq: xwarp_rdmap::RqConfig::Own(1),
        });
        let listening = self.listeners.get(&token).map(|l| l.config);
        if let Some(l) = listening {
            cfg.responder.request_timeout = l.request_timeout;
        }
        // Beyond `max_negotiating` connections still reading their Request: reset.
        let admit = listening.is_some() && self.may_negotiate(token);
        let probe = match Connection::responder(cfg, now) {
            Ok(p) => p,
            Err(_) => return,
        };
        self.owners.insert(
            conn,
            Owner::Pending {
                token,
                local,
                peer,
                probe,
                raw: Vec::new(),
                reported: false,
                abort: !admit,
                deadline: None,
            },
        );
    }

    fn on_established(
        &mut self,
        conn: ProtoConnId,
        local: SocketAddr,
        peer: SocketAddr,
        now: Instant,
    ) {
        let Some(Owner::Qp(qpn)) = self.owners.get(&conn) else {
            return;
        };
        let qpn = *qpn;
        {
            let Some(slot) = self.qps.get_mut(&qpn) else {
                return;
            };
            if slot.abort || slot.errored {
                // modify(ERROR), disconnect or destroy came during the TCP handshake: no
                // iWARP connection on this socket (no MPA Request, no early work handed to
                // it). `close_request` resets it and `on_closed` reports ConnectError.
                slot.abort = true;
                slot.flush_early();
                return;
            }
        }
        let Some(slot) = self.qps.get(&qpn) else {
            return;
        };
        let mut cfg = self.conn_config(slot, conn);
        if let Some(c) = &slot.connecting {
            cfg.first_fpdu_delay = c.first_fpdu_delay;
            if let Some(offer) = c.p2p_rtr_offer {
                cfg.initiator.p2p = Some(offer);
            }
            cfg.initiator.private_data = c.private_data.clone();
            cfg.initiator.reply_timeout = c
                .deadline
                .saturating_duration_since(now)
                .max(std::time::Duration::from_millis(1));
        }
        let r = Connection::initiator(cfg, now);
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return;
        };
        slot.addrs = Some((local, peer));
        match r {
            Ok(c) => {
                slot.conn = Some(c);
                self.give_early(qpn);
            }
            Err(e) => {
                slot.event(CmEvent::ConnectError(e.to_string()));
                slot.abort = true;
            }
        }
    }

    fn on_recv(&mut self, conn: ProtoConnId, now: Instant, data: &[u8]) -> usize {
        // The engine may hand over bytes right after an ingress packet, before `poll` has
        // drained the command queue: a receive the application posted before the peer's
        // Send arrived must be in place first (iWARP has no RNR; a missing receive is a
        // Terminate).
        self.apply_queued(now);
        match self.owners.get_mut(&conn) {
            Some(Owner::Qp(qpn)) => {
                let qpn = *qpn;
                if let Some(slot) = self.qps.get_mut(&qpn) {
                    if let Some(c) = slot.conn.as_mut() {
                        let _ = c.handle_input(now, data, &mut self.res);
                        slot.drain();
                        if !slot.held.is_empty() {
                            self.pump_held(qpn);
                        }
                    }
                }
            }
            Some(Owner::Pending {
                probe,
                raw,
                reported,
                abort,
                ..
            }) => {
                if *abort {
                    return data.len();
                }
                if raw.len() + data.len() > MAX_PENDING_RAW {
                    *abort = true;
                    return data.len();
                }
                raw.extend_from_slice(data);
                let _ = probe.handle_input(now, data, &mut self.res);
                let mut request = None;
                while let Some(e) = probe.poll_event() {
                    match e {
                        ConnEvent::ConnectRequest(req) if !*reported => {
                            *reported = true;
                            request = Some(req);
                        }
                        ConnEvent::Error(_) | ConnEvent::Closed => *abort = true,
                        _ => {}
                    }
                }
                if let (Some(req), false) = (request, *abort) {
                    self.offer_request(conn, req, now);
                }
            }
            Some(Owner::Detached { .. }) | None => {}
        }
        data.len()
    }

    fn on_send(&mut self, conn: ProtoConnId, _now: Instant, buf: &mut [u8]) -> usize {
        match self.owners.get_mut(&conn) {
            Some(Owner::Qp(qpn)) => {
                let Some(slot) = self.qps.get_mut(qpn) else {
                    return 0;
                };
                let Some(c) = slot.conn.as_mut() else {
                    return 0;
                };
                let n = fpdu_direct(c, &self.res, buf);
                slot.drain();
                if !slot.held.is_empty() {
                    let qpn = slot.qpn;
                    self.pump_held(qpn);
                }
                n
            }
            Some(Owner::Detached { conn }) => fpdu_direct(conn, &self.res, buf),
            _ => 0,
        }
    }

    fn record_ends(&mut self, conn: ProtoConnId, data: &[u8], end: &mut dyn FnMut(usize)) {
        if !self.align {
            return;
        }
        let c = match self.owners.get(&conn) {
            Some(Owner::Qp(qpn)) => self.qps.get(qpn).and_then(|s| s.conn.as_ref()),
            Some(Owner::Detached { conn }) => Some(conn),
            _ => None,
        };
        let Some(c) = c else {
            return;
        };
        self.framing
            .entry(conn)
            .or_insert_with(|| Framing {
                splitter: RecordSplitter::new(),
                report: None,
            })
            .feed(c, data, end);
    }

    fn on_path_mss(&mut self, conn: ProtoConnId, mss: usize) {
        self.path_mss.insert(conn, mss);
    }

    fn on_peer_fin(&mut self, conn: ProtoConnId, _now: Instant) {
        match self.owners.get_mut(&conn) {
            Some(Owner::Qp(qpn)) => {
                if let Some(slot) = self.qps.get_mut(qpn) {
                    if let Some(c) = slot.conn.as_mut() {
                        c.handle_peer_closed();
                        slot.drain();
                    }
                }
            }
            Some(Owner::Pending { abort, .. }) => *abort = true,
            Some(Owner::Detached { conn, .. }) => conn.handle_peer_closed(),
            None => {}
        }
    }

    fn close_request(&mut self, conn: ProtoConnId) -> CloseRequest {
        match self.owners.get(&conn) {
            Some(Owner::Qp(qpn)) => match self.qps.get(qpn) {
                Some(slot) if slot.abort => CloseRequest::Abort,
                Some(slot) => match slot.conn.as_ref() {
                    // `wants_close` waits for bytes held back by `poll_transmit_into`.
                    Some(c) if c.wants_close() => CloseRequest::Graceful,
                    _ => CloseRequest::None,
                },
                None => CloseRequest::Abort,
            },
            Some(Owner::Pending { abort: true, .. }) => CloseRequest::Abort,
            Some(Owner::Pending { .. }) => CloseRequest::None,
            Some(Owner::Detached { conn }) => {
                if conn.wants_close() {
                    CloseRequest::Graceful
                } else {
                    CloseRequest::None
                }
            }
            None => CloseRequest::Abort,
        }
    }

    fn on_closed(&mut self, conn: ProtoConnId, now: Instant, error: Option<SocketError>) {
        self.framing.remove(&conn);
        self.path_mss.remove(&conn);
        let Some(owner) = self.owners.remove(&conn) else {
            return;
        };
        let qpn = match owner {
            Owner::Qp(qpn) => qpn,
            Owner::Detached { mut conn } => {
                conn.release(&mut self.res);
                return;
            }
            Owner::Pending { .. } => return,
        };
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return;
        };
        if slot.conn.is_none() && error == Some(SocketError::Refused) && slot.schedule_retry(now) {
            // Refused, and `ConnectTuning::retry_refused` allows another attempt: `poll`
            // starts it; nothing is reported yet.
            return;
        }
        match slot.conn.as_mut() {
            Some(c) => {
                if !c.is_closed() {
                    c.handle_peer_closed();
                }
                slot.drain();
            }
            None => {
                let why = match error {
                    Some(e) => e.to_io().to_string(),
                    None => "connection closed".into(),
                };
                slot.connecting = None;
                slot.finished = true;
                slot.event(CmEvent::ConnectError(why));
                slot.flush_early();
            }
        }
        if !slot.held.is_empty() {
            self.pump_held(qpn);
        }
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return;
        };
        if !slot.finished {
            slot.finished = true;
            slot.event(CmEvent::Disconnected);
        }
        if slot.destroyed {
            self.remove_qp(qpn);
        }
    }
}
