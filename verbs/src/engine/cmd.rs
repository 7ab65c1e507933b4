//! Application → engine commands.

use std::net::SocketAddr;
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use xwarp_ddp::mpa::ConnectRequest;
use xwarp_rdmap::verbs::{RecvWr, SrqId};
use xwarp_rdmap::{Access, MemError, PdId, QpConfig, Stag};
use xwarp_stack::proto::ProtoConnId;
use xwarp_stack::{Readiness, SocketError};

use crate::cm_event::{CmEvent, ConnectParams};
use crate::cm_limits::{CmStats, ListenConfig};
use crate::cq::CqShared;
use crate::mem::EngineRegion;
use crate::qp_attr::{MpaAttr, QpAttr, QpModify};
use crate::qp_stats::QpStatsSnapshot;
use crate::wr::SendRequest;

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
        /// Built by the application: dropping the command unprocessed releases it too.
        region: EngineRegion,
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
        /// First-FPDU delay and refused-connect retry.
        tuning: crate::cm_event::ConnectTuning,
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
        config: ListenConfig,
        requests: Sender<RequestMsg>,
        /// The engine's own end of the request channel, to drop requests that died.
        requests_rx: Receiver<RequestMsg>,
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
    CmStats {
        reply: Sender<CmStats>,
    },
    /// `Device::disconnect_all`: how many QPs began to close.
    DisconnectAll {
        reply: Sender<usize>,
    },
    /// `QueuePair::stats`: one QP's snapshot (`None`: no such QP).
    QpStats {
        qpn: u32,
        reply: Sender<Option<QpStatsSnapshot>>,
    },
    /// `Context::qp_stats`: every QP's snapshot, by QP number.
    AllQpStats {
        reply: Sender<Vec<QpStatsSnapshot>>,
    },
}
