//! The engine side of `xwarp::verbs`: a [`ProtocolHost`] running one sans-IO iWARP
//! [`Connection`] per QP on the engine thread, with the STag table and SRQs of the
//! device ([`Resources`]).
//!
//! Responder flow: TCP accepted → a probe Responder parses the MPA Request → the
//! request goes to the listener → on accept a Responder with the accepting QP's
//! settings is created, replays the Request bytes and accepts; on reject the probe
//! sends the Reply with R=1 and closes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use xwarp_ddp::mpa::{AcceptParams, ConnectRequest, RtrSet};
use xwarp_rdmap::conn::{ConnConfig, ConnError, ConnEvent, Connection};
use xwarp_rdmap::verbs::{
    Completion, CompletionStatus, PostError, RecvWr, Resources, SendOp, SendWr, Sge, SrqId,
    WcOpcode as RWcOpcode,
};
use xwarp_rdmap::wire::{RdmapErrorCode, RdmapEtype, TerminateCause};
use xwarp_rdmap::{Access, MemError, PdId, QpConfig, Stag};
use xwarp_stack::proto::{CloseRequest, ProtoConnId, ProtoCtl, ProtocolHost};
use xwarp_stack::{Readiness, SocketError};

use super::mem::{EngineRegion, RawBuf};
use super::{
    CmEvent, ConnPhase, ConnectParams, CqShared, MpaAttr, QpAttr, QpModify, QpState, SendOpcode,
    SendRequest, WcOpcode, WorkCompletion,
};

/// Most raw bytes kept while a Request is pending (MPA header + 512 private data).
const MAX_PENDING_RAW: usize = 4096;
/// Bytes encoded per `poll_transmit_into` call.
const TX_BURST: usize = 64 * 1024;

/// A connection request handed to a listener.
pub(crate) struct RequestMsg {
    pub(crate) conn: ProtoConnId,
    pub(crate) peer: SocketAddr,
    pub(crate) req: ConnectRequest,
}

/// Application → engine commands.
pub(crate) enum Cmd {
    RegMr {
        pd: PdId,
        access: Access,
        base: u64,
        buf: Arc<RawBuf>,
        reply: Sender<Result<Stag, MemError>>,
    },
    DeregMr {
        stag: Stag,
    },
    Revalidate {
        stag: Stag,
        reply: Sender<Result<(), MemError>>,
    },
    CreateSrq {
        depth: usize,
        reply: Sender<SrqId>,
    },
    PostSrqRecv {
        srq: SrqId,
        wr: RecvWr,
    },
    CreateQp {
        qpn: u32,
        qp: QpConfig,
        max_inline: usize,
        mpa: MpaAttr,
        send_cq: Arc<CqShared>,
        recv_cq: Arc<CqShared>,
        events: Sender<CmEvent>,
        ready: Arc<Readiness>,
    },
    DestroyQp {
        qpn: u32,
    },
    PostSend {
        qpn: u32,
        wr: SendRequest,
    },
    PostRecv {
        qpn: u32,
        wr: RecvWr,
    },
    Connect {
        qpn: u32,
        remote: SocketAddr,
        params: ConnectParams,
    },
    Disconnect {
        qpn: u32,
    },
    QueryQp {
        qpn: u32,
        reply: Sender<Option<QpAttr>>,
    },
    ModifyQp {
        qpn: u32,
        m: QpModify,
        /// `Ok(true)`: the change included a reset (see `VerbsHost::reset_qp`).
        reply: Sender<Result<bool, String>>,
    },
    Listen {
        token: u64,
        addr: SocketAddr,
        backlog: usize,
        requests: Sender<RequestMsg>,
        ready: Arc<Readiness>,
        reply: Sender<Result<(), SocketError>>,
    },
    Unlisten {
        token: u64,
    },
    Accept {
        conn: ProtoConnId,
        qpn: u32,
        private_data: Vec<u8>,
        reply: Sender<std::io::Result<()>>,
    },
    Reject {
        conn: ProtoConnId,
        private_data: Vec<u8>,
    },
}

/// Work waiting for the QP's connection object.
enum Early {
    Send(SendWr),
    Recv(RecvWr),
    LocalInv {
        wr_id: u64,
        stag: Stag,
        signaled: bool,
    },
}

struct QpSlot {
    qpn: u32,
    qp: QpConfig,
    mpa: MpaAttr,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    events: Sender<CmEvent>,
    ready: Arc<Readiness>,
    conn_id: Option<ProtoConnId>,
    conn: Option<Connection>,
    early: Vec<Early>,
    /// Inline buffer: STag, slot size, next slot.
    inline: Option<(Stag, usize, usize)>,
    abort: bool,
    /// Connect in progress: private data and MPA deadline.
    connecting: Option<(Vec<u8>, Instant)>,
    destroyed: bool,
    finished: bool,
    disconnect_requested: bool,
    /// The connection failed (error, Terminate, modify to ERROR): it ends in ERROR, not IDLE.
    errored: bool,
    /// Send work behind a Local Invalidate that waits for the send queue (see
    /// [`VerbsHost::pump_held`]).
    held: std::collections::VecDeque<Early>,
    /// Local and peer TCP addresses once connected.
    addrs: Option<(SocketAddr, SocketAddr)>,
}

impl QpSlot {
    /// The verbs state, derived from the connection and its QP.
    fn state(&self) -> QpState {
        use xwarp_rdmap::QpState as Q;
        match &self.conn {
            Some(c) if c.is_closed() => {
                match (self.disconnect_requested && !self.errored, self.finished) {
                    (true, true) => QpState::Idle,
                    (true, false) => QpState::Closing,
                    (false, _) => QpState::Error,
                }
            }
            Some(c) => match c.qp().map(|q| q.state()) {
                // modify(ERROR) before the MPA exchange finished.
                None | Some(Q::Idle) if self.errored => QpState::Error,
                None | Some(Q::Idle) => QpState::Idle,
                // A disconnect waiting behind a Local Invalidate is already CLOSING.
                Some(Q::Rts) if self.disconnect_requested => QpState::Closing,
                Some(Q::Rts) => QpState::Rts,
                Some(Q::Closing) => QpState::Closing,
                Some(Q::Terminate) => QpState::Terminate,
                Some(Q::Error) => QpState::Error,
            },
            None if self.finished || self.errored => QpState::Error,
            None => QpState::Idle,
        }
    }

    /// Where the connection is, for `super::check_modify`.
    fn phase(&self) -> ConnPhase {
        if self.finished {
            ConnPhase::Done
        } else if self.conn_id.is_none() && !self.errored {
            ConnPhase::Unused
        } else {
            ConnPhase::Active
        }
    }

    fn event(&self, e: CmEvent) {
        let _ = self.events.send(e);
        self.ready.signal();
    }

    fn send_completion(&self, c: &Completion, opcode: WcOpcode) {
        if c.wr_id == u64::MAX {
            return; // the internal RTR
        }
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
    fn drain(&mut self) {
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

    /// Flush work that never reached a connection.
    fn flush_early(&mut self) {
        for e in std::mem::take(&mut self.early) {
            self.flush_one(e);
        }
    }

    /// Complete one work request with `WrFlushError` without executing it.
    fn flush_one(&self, e: Early) {
        let (wr_id, op) = match e {
            Early::Send(w) => (w.wr_id, opcode_of(&w.op)),
            Early::Recv(w) => (w.wr_id, WcOpcode::Recv),
            Early::LocalInv { wr_id, .. } => (wr_id, WcOpcode::LocalInvalidate),
        };
        self.send_completion(&flush(wr_id), op);
    }
}

fn opcode_of(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send { .. } => WcOpcode::Send,
        SendOp::Write { .. } => WcOpcode::Write,
        SendOp::Read { .. } => WcOpcode::Read,
    }
}

fn flush(wr_id: u64) -> Completion {
    Completion {
        wr_id,
        status: CompletionStatus::WrFlushError,
        opcode: RWcOpcode::Send,
        byte_len: 0,
        solicited: false,
        invalidated_stag: None,
    }
}

/// Who owns a hosted TCP connection.
enum Owner {
    /// Bound to a QP.
    Qp(u32),
    /// Accepted; the MPA Request is being read or waits for the ULP's answer.
    Pending {
        token: u64,
        local: SocketAddr,
        peer: SocketAddr,
        probe: Connection,
        raw: Vec<u8>,
        reported: bool,
        abort: bool,
    },
    /// A connection no QP owns, finishing its close: a rejecting probe sending its
    /// Reply, or the old connection of a reset QP (`VerbsHost::reset_qp`).
    Detached { conn: Connection },
}

struct ListenSlot {
    requests: Sender<RequestMsg>,
    ready: Arc<Readiness>,
    reply: Option<Sender<Result<(), SocketError>>>,
}

/// The verbs protocol host.
pub(crate) struct VerbsHost {
    cmds: Receiver<Cmd>,
    res: Resources,
    qps: HashMap<u32, QpSlot>,
    owners: HashMap<ProtoConnId, Owner>,
    listeners: HashMap<u64, ListenSlot>,
    /// Keeps registered buffers alive while the engine may use them.
    bufs: HashMap<Stag, Arc<RawBuf>>,
    emss: usize,
    /// Commands taken off the queue by [`VerbsHost::apply_queued`] that need the engine's
    /// `ProtoCtl` (connect, listen, unlisten); `poll` runs them first, so command order holds.
    stashed: std::collections::VecDeque<Cmd>,
}

// SAFETY: `Resources` holds `Box<dyn RegionMemory>` (no `Send` bound in its type). Every
// region ever inserted into this host's table is either an `EngineRegion` (an
// `Arc<RawBuf>`, which is Send + Sync) or a `Vec<u8>` (the empty Read-RTR sink the
// Connection registers, and inline buffers registered here); both are `Send`. The host
// is built empty on the application thread and moved to the engine thread once; it is
// never shared.
unsafe impl Send for VerbsHost {}

/// Encode FPDUs straight into `out` (the free space of the TCP send buffer): no staging
/// copy. An FPDU that does not fit stays in the connection and goes out first next time.
fn fpdu_direct(conn: &mut Connection, res: &Resources, out: &mut [u8]) -> usize {
    let mut written = 0;
    while written < out.len() {
        let n = conn.poll_transmit_into(res, &mut out[written..]);
        if n == 0 {
            break;
        }
        written += n;
    }
    written
}

impl VerbsHost {
    pub(crate) fn new(cmds: Receiver<Cmd>, emss: usize) -> VerbsHost {
        VerbsHost {
            cmds,
            res: Resources::new(),
            qps: HashMap::new(),
            owners: HashMap::new(),
            listeners: HashMap::new(),
            bufs: HashMap::new(),
            emss,
            stashed: std::collections::VecDeque::new(),
        }
    }

    fn conn_config(&self, slot: &QpSlot) -> ConnConfig {
        let mut c = ConnConfig::new(slot.qp);
        c.emss = self.emss.max(128);
        c.tx_burst = TX_BURST;
        c.initiator.revision = slot.mpa.revision;
        c.initiator.enhanced = slot.mpa.revision == 2;
        c.initiator.crc = slot.mpa.crc;
        c.initiator.markers = slot.mpa.markers;
        c.initiator.p2p = if slot.mpa.revision == 2 {
            slot.mpa.p2p_rtr.map(RtrSet::only)
        } else {
            None
        };
        c.responder.max_revision = slot.mpa.revision;
        c.responder.crc = slot.mpa.crc;
        c.responder.markers = slot.mpa.markers;
        c
    }

    fn post_to_conn(&mut self, qpn: u32, e: Early) {
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
        // RTS; the teardown itself is iwarp-wire.md §4.7). This matters while the close
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
    fn pump_held(&mut self, qpn: u32) {
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
                // messages within one direction only (~§5.5; iwarp-wire.md §3.6): the
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
    fn post_now(slot: &mut QpSlot, res: &mut Resources, e: Early) {
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

    fn post_send(&mut self, qpn: u32, wr: SendRequest) {
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

    /// Apply one application command; connect, listen and unlisten need the engine.
    fn handle(&mut self, cmd: Cmd, now: Instant, ctl: &mut ProtoCtl) {
        match cmd {
            Cmd::Connect {
                qpn,
                remote,
                params,
            } => {
                let Some(slot) = self.qps.get_mut(&qpn) else {
                    return;
                };
                if slot.conn_id.is_some() || slot.finished {
                    slot.event(CmEvent::ConnectError(
                        "QP already used (reset it with modify to Idle first)".into(),
                    ));
                    return;
                }
                let deadline = now + params.timeout;
                let id = ctl.connect(remote, None, deadline);
                slot.conn_id = Some(id);
                slot.connecting = Some((params.private_data, deadline));
                self.owners.insert(id, Owner::Qp(qpn));
            }
            Cmd::Listen {
                token,
                addr,
                backlog,
                requests,
                ready,
                reply,
            } => {
                self.listeners.insert(
                    token,
                    ListenSlot {
                        requests,
                        ready,
                        reply: Some(reply),
                    },
                );
                ctl.listen(token, addr, backlog);
            }
            Cmd::Unlisten { token } => {
                self.listeners.remove(&token);
                ctl.unlisten(token);
            }
            other => self.handle_local(other, now),
        }
    }

    /// Apply one command that needs nothing from the engine (memory, QPs, work requests).
    fn handle_local(&mut self, cmd: Cmd, now: Instant) {
        match cmd {
            c @ (Cmd::Connect { .. } | Cmd::Listen { .. } | Cmd::Unlisten { .. }) => {
                // Never reached through `apply_queued`; kept in order for `poll` if it were.
                self.stashed.push_back(c);
            }
            Cmd::RegMr {
                pd,
                access,
                base,
                buf,
                reply,
            } => {
                let r =
                    self.res
                        .stags
                        .register(pd, access, base, Box::new(EngineRegion(buf.clone())));
                if let Ok(s) = r {
                    self.bufs.insert(s, buf);
                }
                let _ = reply.send(r);
            }
            Cmd::DeregMr { stag } => {
                let _ = self.res.stags.deregister(stag);
                self.bufs.remove(&stag);
            }
            Cmd::Revalidate { stag, reply } => {
                let _ = reply.send(self.res.stags.revalidate(stag));
            }
            Cmd::CreateSrq { depth, reply } => {
                let _ = reply.send(self.res.create_srq(depth));
            }
            Cmd::PostSrqRecv { srq, wr } => {
                let _ = self.res.post_srq_recv(srq, wr);
            }
            Cmd::CreateQp {
                qpn,
                qp,
                max_inline,
                mpa,
                send_cq,
                recv_cq,
                events,
                ready,
            } => {
                // `create_qp` checked the size (`check_inline`); never allocate an
                // unchecked one here.
                let inline =
                    if max_inline > 0 && super::check_inline(max_inline, qp.sq_depth).is_ok() {
                        let len = max_inline.saturating_mul(qp.sq_depth);
                        self.res
                            .stags
                            .register(qp.pd, Access::LOCAL_WRITE, 0, Box::new(vec![0u8; len]))
                            .ok()
                            .map(|s| (s, max_inline, 0))
                    } else {
                        None
                    };
                self.qps.insert(
                    qpn,
                    QpSlot {
                        qpn,
                        qp,
                        mpa,
                        send_cq,
                        recv_cq,
                        events,
                        ready,
                        conn_id: None,
                        conn: None,
                        early: Vec::new(),
                        inline,
                        abort: false,
                        connecting: None,
                        destroyed: false,
                        finished: false,
                        disconnect_requested: false,
                        errored: false,
                        held: std::collections::VecDeque::new(),
                        addrs: None,
                    },
                );
            }
            Cmd::DestroyQp { qpn } => {
                if let Some(slot) = self.qps.get_mut(&qpn) {
                    slot.destroyed = true;
                    if slot.conn_id.is_some() && !slot.finished {
                        slot.abort = true;
                    } else {
                        self.remove_qp(qpn);
                    }
                }
            }
            Cmd::PostSend { qpn, wr } => self.post_send(qpn, wr),
            Cmd::PostRecv { qpn, wr } => self.post_to_conn(qpn, Early::Recv(wr)),
            Cmd::Disconnect { qpn } => self.disconnect(qpn),
            Cmd::QueryQp { qpn, reply } => {
                let _ = reply.send(self.qps.get(&qpn).map(|s| {
                    let neg = s.conn.as_ref().and_then(|c| c.negotiated());
                    let inline = s.inline.map_or(0, |i| i.1);
                    QpAttr::build(s.qpn, s.state(), &s.qp, &s.mpa, neg, inline, s.addrs)
                }));
            }
            Cmd::ModifyQp { qpn, m, reply } => {
                let _ = reply.send(self.modify_qp(qpn, &m));
            }
            Cmd::Accept {
                conn,
                qpn,
                private_data,
                reply,
            } => {
                let _ = reply.send(self.accept(conn, qpn, private_data, now));
            }
            Cmd::Reject { conn, private_data } => {
                if let Some(Owner::Pending { probe, .. }) = self.owners.remove(&conn) {
                    let mut probe = probe;
                    let _ = probe.reject(&private_data);
                    self.owners.insert(conn, Owner::Detached { conn: probe });
                }
            }
        }
    }

    /// Graceful disconnect (also modify to CLOSING).
    fn disconnect(&mut self, qpn: u32) {
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return;
        };
        slot.disconnect_requested = true;
        if !slot.held.is_empty() {
            return; // `pump_held` closes once the held work reached the QP
        }
        match slot.conn.as_mut() {
            Some(c) => {
                c.close();
                slot.drain();
            }
            None if slot.conn_id.is_some() => slot.abort = true,
            None => {}
        }
    }

    /// `QueuePair::modify`: check (`super::check_modify`), then apply. `Ok(true)`: the QP
    /// was reset.
    fn modify_qp(&mut self, qpn: u32, m: &QpModify) -> Result<bool, String> {
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return Err("QP not found".into());
        };
        let cur = slot.state();
        let reset = super::check_modify(cur, slot.phase(), m)?;
        // Judge every attribute before changing anything: a refused modify changes nothing.
        let mpa = m.apply_mpa(&slot.mpa);
        mpa.validate()?;
        if let Some(n) = m.max_inline_data {
            super::check_inline(n, slot.qp.sq_depth)?;
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
        match m.state {
            _ if reset => {}
            Some(to) if to == cur => {}
            Some(QpState::Closing) => self.disconnect(qpn),
            Some(QpState::Terminate) => {
                slot.errored = true;
                if let Some(q) = slot.conn.as_mut().and_then(|c| c.qp_mut()) {
                    q.terminate(TerminateCause::Rdmap(
                        RdmapEtype::LocalCatastrophic,
                        RdmapErrorCode::Unspecified,
                    ));
                }
            }
            Some(QpState::Error) => {
                // Abortive, as siw (flush SQ and RQ, release the socket at once,
                // iwarp-wire.md §4.7): flush here, reset TCP; `on_closed` reports
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
            _ => {}
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
    fn reset_qp(&mut self, qpn: u32) {
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
        if let Some(id) = slot.conn_id.take() {
            if matches!(self.owners.get(&id), Some(Owner::Qp(q)) if *q == qpn) {
                match conn {
                    Some(c) if c.is_closed() && c.wants_close() => {
                        self.owners.insert(id, Owner::Detached { conn: c });
                    }
                    _ => {
                        self.owners.remove(&id);
                    }
                }
            }
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

    /// `ConnRequest::accept` (rdma_accept): bind the pending connection to QP `qpn`.
    /// Errors go to the caller, never to a QP's events: a QP that is already used (or
    /// gone) is `InvalidInput` (rdma_accept's EINVAL) and the request's connection is
    /// dropped (reset); a request whose connection already died is `ConnectionAborted`.
    fn accept(
        &mut self,
        conn_id: ProtoConnId,
        qpn: u32,
        private_data: Vec<u8>,
        now: Instant,
    ) -> std::io::Result<()> {
        use std::io::{Error, ErrorKind};
        let Some(Owner::Pending {
            raw,
            probe,
            local,
            peer,
            ..
        }) = self.owners.remove(&conn_id)
        else {
            return Err(Error::new(
                ErrorKind::ConnectionAborted,
                "the connection request is no longer pending",
            ));
        };
        // The QP must be unused and its settings must make a Responder; otherwise refuse
        // and drop the request's connection (reset): the QP hears nothing of it.
        let responder = match self.qps.get(&qpn) {
            Some(s) if s.conn_id.is_none() && !s.finished && !s.errored && !s.destroyed => {
                let ird = s.qp.ird.min(u32::from(u16::MAX)) as u16;
                let ord = s.qp.ord.min(u32::from(u16::MAX)) as u16;
                Connection::responder(self.conn_config(s), now)
                    .map(|c| (c, ird, ord))
                    .map_err(|e| e.to_string())
            }
            Some(_) => Err("the QP is already used (connected, connecting or in ERROR)".into()),
            None => Err("QP not found".into()),
        };
        let (mut conn, ird, ord) = match responder {
            Ok(r) => r,
            Err(why) => {
                self.owners.insert(
                    conn_id,
                    Owner::Pending {
                        token: 0,
                        local,
                        peer,
                        probe,
                        raw,
                        reported: true,
                        abort: true,
                    },
                );
                return Err(Error::new(ErrorKind::InvalidInput, why));
            }
        };
        let _ = conn.handle_input(now, &raw, &mut self.res);
        while conn
            .poll_event()
            .is_some_and(|e| matches!(e, ConnEvent::ConnectRequest(_)))
        {}
        let r = conn.accept(AcceptParams {
            ird,
            ord,
            private_data,
        });
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return Err(Error::new(ErrorKind::InvalidInput, "QP not found"));
        };
        if let Err(e) = r {
            slot.event(CmEvent::Error(e.to_string()));
        }
        slot.conn = Some(conn);
        slot.conn_id = Some(conn_id);
        slot.addrs = Some((local, peer));
        self.owners.insert(conn_id, Owner::Qp(qpn));
        self.give_early(qpn);
        Ok(())
    }

    fn give_early(&mut self, qpn: u32) {
        let early = match self.qps.get_mut(&qpn) {
            Some(s) => std::mem::take(&mut s.early),
            None => return,
        };
        for e in early {
            self.post_to_conn(qpn, e);
        }
        if let Some(s) = self.qps.get_mut(&qpn) {
            s.drain();
        }
    }

    fn remove_qp(&mut self, qpn: u32) {
        if let Some(slot) = self.qps.remove(&qpn) {
            if let Some(id) = slot.conn_id {
                self.owners.remove(&id);
            }
            if let Some((stag, _, _)) = slot.inline {
                let _ = self.res.stags.deregister(stag);
            }
        }
    }
}

impl VerbsHost {
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

impl ProtocolHost for VerbsHost {
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
        for owner in self.owners.values_mut() {
            if let Owner::Pending { probe, abort, .. } = owner {
                if probe.poll_timeout().is_some_and(|t| now >= t) {
                    probe.handle_timeout(now);
                }
                if probe.is_closed() {
                    *abort = true;
                }
                if let Some(t) = probe.poll_timeout() {
                    next = Some(next.map_or(t, |n| n.min(t)));
                }
            }
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
        let cfg = ConnConfig::new(QpConfig {
            pd: PdId(0),
            ird: 1,
            ord: 1,
            sq_depth: 1,
            rq: xwarp_rdmap::RqConfig::Own(1),
        });
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
                abort: !self.listeners.contains_key(&token),
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
        let mut cfg = self.conn_config(slot);
        if let Some((pd, deadline)) = &slot.connecting {
            cfg.initiator.private_data = pd.clone();
            cfg.initiator.reply_timeout = deadline
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
                token,
                peer,
                probe,
                raw,
                reported,
                abort,
                ..
            }) => {
                if raw.len() + data.len() > MAX_PENDING_RAW {
                    *abort = true;
                    return data.len();
                }
                raw.extend_from_slice(data);
                let _ = probe.handle_input(now, data, &mut self.res);
                while let Some(e) = probe.poll_event() {
                    match e {
                        ConnEvent::ConnectRequest(req) if !*reported => {
                            *reported = true;
                            match self.listeners.get(token) {
                                Some(l) => {
                                    let _ = l.requests.send(RequestMsg {
                                        conn,
                                        peer: *peer,
                                        req,
                                    });
                                    l.ready.signal();
                                }
                                None => *abort = true,
                            }
                        }
                        ConnEvent::Error(_) | ConnEvent::Closed => *abort = true,
                        _ => {}
                    }
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

    fn on_closed(&mut self, conn: ProtoConnId, _now: Instant, error: Option<SocketError>) {
        let Some(owner) = self.owners.remove(&conn) else {
            return;
        };
        let Owner::Qp(qpn) = owner else {
            return;
        };
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return;
        };
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
