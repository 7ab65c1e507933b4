//! The verbs protocol host: its tables of QPs, connections and listeners.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use xwarp_ddp::mpa::{RecordSplitter, RtrSet};
use xwarp_rdmap::conn::{ConnConfig, Connection};
use xwarp_rdmap::verbs::Resources;
use xwarp_stack::proto::ProtoConnId;
use xwarp_stack::{Readiness, SocketError};

use crate::cm_limits::{CmStats, ListenConfig};
use crate::qp_stats::QpStatsSnapshot;

use crate::engine::cmd::{Cmd, RequestMsg};
use crate::engine::slot::QpSlot;

/// Most raw bytes kept while a Request is pending (MPA header + 512 private data).
pub(crate) const MAX_PENDING_RAW: usize = 4096;
/// Bytes encoded per `poll_transmit_into` call.
pub(crate) const TX_BURST: usize = 64 * 1024;

/// Who owns a hosted TCP connection.
pub(crate) enum Owner {
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
        /// Once reported: when the application's answer is overdue (the listener's
        /// `accept_timeout`); the request is then rejected.
        deadline: Option<Instant>,
    },
    /// A connection no QP owns, finishing its close: a rejecting probe sending its
    /// Reply, or the old connection of a reset QP (`VerbsHost::reset_qp`).
    Detached { conn: Connection },
}

pub(crate) struct ListenSlot {
    pub(crate) config: ListenConfig,
    pub(crate) requests: Sender<RequestMsg>,
    /// The engine's end of the bounded request channel: when it is full of requests that
    /// died meanwhile, `VerbsHost::purge_requests` takes them out.
    pub(crate) requests_rx: Receiver<RequestMsg>,
    pub(crate) ready: Arc<Readiness>,
    pub(crate) reply: Option<Sender<Result<(), SocketError>>>,
}

/// The verbs protocol host.
pub(crate) struct VerbsHost {
    /// Refusal and timeout counters of the connection manager (`Device::cm_stats`).
    pub(crate) cm: CmStats,
    pub(crate) cmds: Receiver<Cmd>,
    pub(crate) res: Resources,
    pub(crate) qps: HashMap<u32, QpSlot>,
    pub(crate) owners: HashMap<ProtoConnId, Owner>,
    pub(crate) listeners: HashMap<u64, ListenSlot>,
    pub(crate) emss: usize,
    /// Commands taken off the queue by `VerbsHost::apply_queued` that need the engine's
    /// `ProtoCtl` (connect, listen, unlisten); `poll` runs them first, so command order holds.
    pub(crate) stashed: std::collections::VecDeque<Cmd>,
    /// Per connection: where its FPDUs end, for FPDU-aligned segments (`record_ends`).
    pub(crate) framing: HashMap<ProtoConnId, Framing>,
    /// Report FPDU ends to the engine ([`fpdu_align_from_env`]).
    pub(crate) align: bool,
    /// Per connection: the payload of one TCP segment, when the engine tells it
    /// (`on_path_mss`); FPDUs are sized to the smaller of it and `emss`.
    pub(crate) path_mss: HashMap<ProtoConnId, usize>,
}

/// `XWARP_FPDU_ALIGN`: `0`/`off` stops reporting FPDU ends (the own TCP core then segments
/// FPDUs as a byte stream, as before issue 15; for measurements), `1`/`on` or unset
/// reports them; anything else is warned about and reports them.
pub(crate) fn fpdu_align_from_env() -> bool {
    match std::env::var("XWARP_FPDU_ALIGN").as_deref() {
        Err(_) | Ok("1" | "on" | "") => true,
        Ok("0" | "off") => false,
        Ok(v) => {
            log::warn!("XWARP_FPDU_ALIGN={v:?}: expected 0, off, 1 or on; FPDUs stay aligned");
            true
        }
    }
}

/// The record ends of one connection's outgoing stream (docs/mpa.md §1.10).
pub(crate) struct Framing {
    /// Fed every byte `on_send` wrote, from the first (the MPA frame).
    pub(crate) splitter: RecordSplitter,
    /// Decided once the MPA parameters are known: report the ends (no markers in what we
    /// send), or never (markers: the FPDU lengths then include them, and a receiver of
    /// marked FPDUs does not need alignment). Before that nothing is reported, so the
    /// Request goes out as a plain byte stream.
    pub(crate) report: Option<bool>,
}

impl Framing {
    /// Feed `data` (what `on_send` wrote for `conn`) and report its record ends.
    pub(crate) fn feed(&mut self, conn: &Connection, data: &[u8], end: &mut dyn FnMut(usize)) {
        if self.report.is_none() {
            self.report = conn.negotiated().map(|n| !n.markers_tx);
        }
        if self.report == Some(true) {
            self.splitter.feed(data, end);
        } else {
            self.splitter.feed(data, |_| {});
        }
    }
}

/// Encode FPDUs straight into `out` (the free space of the TCP send buffer): no staging
/// copy. An FPDU that does not fit stays in the connection and goes out first next time.
pub(crate) fn fpdu_direct(conn: &mut Connection, res: &Resources, out: &mut [u8]) -> usize {
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
            cm: CmStats::default(),
            cmds,
            res: Resources::new(),
            qps: HashMap::new(),
            owners: HashMap::new(),
            listeners: HashMap::new(),
            emss,
            stashed: std::collections::VecDeque::new(),
            framing: HashMap::new(),
            align: fpdu_align_from_env(),
            path_mss: HashMap::new(),
        }
    }

    /// Calls `f` with a statistics snapshot of every QP the application still holds, in
    /// no particular order; on the engine thread (e.g. from
    /// [`ProtocolHost`](xwarp_stack::proto::ProtocolHost) callbacks). Costs one
    /// [`QpStatsSnapshot`] copy per QP and no allocation.
    pub(crate) fn for_each_qp_stats(&self, mut f: impl FnMut(&QpStatsSnapshot)) {
        for s in self.qps.values().filter(|s| !s.destroyed) {
            f(&s.stats());
        }
    }

    /// The connection settings of `slot` on the TCP connection `conn`: FPDUs sized to the
    /// local EMSS or the connection's segment payload, whichever is smaller.
    pub(crate) fn conn_config(&self, slot: &QpSlot, conn: ProtoConnId) -> ConnConfig {
        let mut c = ConnConfig::new(slot.qp);
        let emss = self
            .path_mss
            .get(&conn)
            .map_or(self.emss, |&m| m.min(self.emss));
        c.emss = emss.max(128);
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
        // siw quirk, docs/siw.md §4.8.14 (only when no RTR is negotiated).
        c.responder_sends_after_reply = slot.mpa.responder_sends_after_reply;
        c
    }
}
