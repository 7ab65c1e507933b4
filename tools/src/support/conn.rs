//! What the interop tools (`xwarp-rping`, `xwarp-perftest-peer`) share on
//! [`xwarp::verbs`]: starting the verbs engine the engine flags name ([`start_engine`]),
//! and one connection's completion queue and QP ([`Conn`]): waiting for the completion of
//! one opcode while keeping the others, telling a closed connection from a failed work
//! request, counting completions by outcome ([`CqeStats`]) and remembering the Terminate
//! the peer sent, for the machine-readable lines the interop cases check.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use xwarp::poll_driver::backend::Backend;
use xwarp::verbs::{
    CmEvent, CompletionQueue, CompletionStatus, Context, ProtectionDomain, QpInitAttr, QueuePair,
    WcOpcode, WorkCompletion, XdpContext,
};

use super::transport::{ephemeral_start, EngineSpec};

/// Longest wait for one completion or CM event before the run counts as stuck.
pub const STALL: Duration = Duration::from_secs(60);
/// How long [`Conn::wait`] waits for the CM event explaining a flushed work request, and
/// [`Conn::close`] for the close to be reported.
pub const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Starts the verbs engine `spec` names (AF_XDP on `spec.ifname`, owning `spec.ipv4`),
/// named `name`, its ephemeral ports spread by process id ([`ephemeral_start`]); prints
/// one line saying so (and where it captures, with `XWARP_PCAP`).
pub fn start_engine(spec: &EngineSpec, name: &str) -> Result<XdpContext, String> {
    let mut cfg = xwarp::toe::XdpEngineConfig::new(&spec.ifname, spec.ipv4, spec.prefix);
    cfg.rx_checksum = spec.rx_checksum;
    cfg.stack.ipv4_gateway = spec.gateway;
    cfg.stack.ephemeral_ports = ephemeral_start(std::process::id())..=65535;
    cfg.engine.name = name.into();
    let ctx = Context::start_xdp(None, cfg).map_err(|e| {
        format!(
            "cannot start an AF_XDP verbs engine on {}: {e}",
            spec.ifname
        )
    })?;
    let pcap = xwarp::poll_driver::pcap::active_captures().pop();
    eprintln!(
        "xwarp: verbs engine on {} owns {}/{} ({:?}){}",
        spec.ifname,
        spec.ipv4,
        spec.prefix,
        spec.rx_checksum,
        pcap.map(|p| format!(", capture {}", p.display()))
            .unwrap_or_default()
    );
    Ok(ctx)
}

/// Why waiting for a completion ended without one.
#[derive(Debug)]
pub enum WaitError {
    /// The connection closed (the peer disconnected, or an error closed it).
    Disconnected(String),
    /// Anything else: a failed completion, a stall, an engine error.
    Failed(String),
}

impl std::fmt::Display for WaitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitError::Disconnected(why) => write!(f, "disconnected: {why}"),
            WaitError::Failed(why) => f.write_str(why),
        }
    }
}

impl From<WaitError> for String {
    fn from(e: WaitError) -> String {
        e.to_string()
    }
}

/// Counts of completions by outcome (for "nothing reported complete was lost" checks).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CqeStats {
    /// Successful completions.
    pub success: u64,
    /// Flushed completions (QP in ERROR).
    pub flushed: u64,
    /// Other failed completions.
    pub failed: u64,
}

/// A Terminate's `(layer, etype, code)` as the verbs layer reports it.
pub type TerminateCode = (u8, u8, u8);

/// The QP of one connection and the completion queue both of its queues use.
pub struct Conn {
    /// The completion queue (send and receive).
    pub cq: CompletionQueue,
    /// The queue pair.
    pub qp: QueuePair,
    /// Completions taken from the CQ while another opcode was awaited.
    pub pending: VecDeque<WorkCompletion>,
    /// Every completion taken from the CQ so far, by outcome.
    pub stats: CqeStats,
    /// The Terminate the peer sent, once a CM event reported it.
    pub terminate_received: Option<TerminateCode>,
    /// The first CM event that meant trouble (Terminate, error, disconnect), as text.
    pub problem: Option<String>,
    /// Print every CM event.
    pub debug: bool,
}

fn e2s(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Conn {
    /// A CQ of `cq_depth` entries and a QP with `attr` applied to the init attributes
    /// (their CQs are the new one).
    pub fn new<B: Backend + Send + 'static>(
        ctx: &Context<B>,
        pd: &ProtectionDomain,
        cq_depth: usize,
        attr: impl FnOnce(&mut QpInitAttr),
        debug: bool,
    ) -> Result<Conn, String> {
        let cq = ctx.device().create_cq(cq_depth).map_err(e2s)?;
        let mut at = QpInitAttr::new(&cq, &cq);
        attr(&mut at);
        let qp = pd.create_qp(&at).map_err(e2s)?;
        Ok(Conn {
            cq,
            qp,
            pending: VecDeque::new(),
            stats: CqeStats::default(),
            terminate_received: None,
            problem: None,
            debug,
        })
    }

    fn count(&mut self, c: &WorkCompletion) {
        match c.status {
            CompletionStatus::Success => self.stats.success += 1,
            CompletionStatus::WrFlushError => self.stats.flushed += 1,
            _ => self.stats.failed += 1,
        }
    }

    /// The next completion from the CQ within `timeout` (counted), or `None`.
    pub fn poll(&mut self, timeout: Duration) -> Result<Option<WorkCompletion>, WaitError> {
        match self.cq.next(timeout) {
            Ok(c) => {
                self.count(&c);
                Ok(Some(c))
            }
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Ok(None),
            Err(e) => Err(WaitError::Failed(format!("completion queue: {e}"))),
        }
    }

    /// The next completion of `op`; other successful completions wait in `pending`. A
    /// failed completion or a CM event that closes the connection ends the wait.
    pub fn wait(&mut self, op: WcOpcode) -> Result<WorkCompletion, WaitError> {
        if let Some(i) = self.pending.iter().position(|c| c.opcode == op) {
            return Ok(self.pending.remove(i).expect("index found"));
        }
        let deadline = Instant::now() + STALL;
        loop {
            match self.poll(Duration::from_millis(100))? {
                Some(c) if c.status != CompletionStatus::Success => {
                    // A flushed work request: the QP went to ERROR, normally because the
                    // connection closed; the CM event saying so may come a moment after
                    // the flush completions.
                    let closed = if c.status == CompletionStatus::WrFlushError {
                        self.closing_event_within(CLOSE_WAIT)
                    } else {
                        self.closed_event()
                    };
                    return Err(match closed {
                        Some(why) => WaitError::Disconnected(format!(
                            "{why}; {:?} completion {:?}",
                            c.opcode, c.status
                        )),
                        None => WaitError::Failed(format!(
                            "{:?} completion failed: {:?}",
                            c.opcode, c.status
                        )),
                    });
                }
                Some(c) if c.opcode == op => return Ok(c),
                Some(c) => self.pending.push_back(c),
                None => {
                    if let Some(why) = self.closed_event() {
                        return Err(WaitError::Disconnected(why));
                    }
                    if Instant::now() >= deadline {
                        return Err(WaitError::Failed(format!(
                            "no {op:?} completion within {} s",
                            STALL.as_secs()
                        )));
                    }
                }
            }
        }
    }

    /// Reads the pending CM events; returns the first that means the connection is gone,
    /// as text (a Terminate from the peer is also kept in `terminate_received`).
    pub fn closed_event(&mut self) -> Option<String> {
        while let Some(e) = self.qp.poll_event() {
            if self.debug {
                eprintln!("xwarp: cm event {e:?}");
            }
            let why = match e {
                CmEvent::Disconnected => "the connection closed".to_string(),
                CmEvent::Error(why) => format!("connection error: {why}"),
                CmEvent::TerminateReceived { layer, etype, code } => {
                    self.terminate_received = Some((layer, etype, code));
                    format!(
                        "the peer sent a Terminate layer {layer} etype {etype} code {code:#04x}"
                    )
                }
                CmEvent::TerminateSent { layer, etype, code } => {
                    format!("we sent a Terminate layer {layer} etype {etype} code {code:#04x}")
                }
                _ => continue,
            };
            self.problem.get_or_insert(why.clone());
            return Some(why);
        }
        None
    }

    /// [`Self::closed_event`], waiting up to `limit` for such an event.
    pub fn closing_event_within(&mut self, limit: Duration) -> Option<String> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(why) = self.closed_event() {
                return Some(why);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            std::thread::sleep(left.min(Duration::from_millis(10)));
        }
    }

    /// Waits up to `limit` for the `Disconnected` event, taking every completion that
    /// comes meanwhile into `pending` (counted). Returns whether it came.
    pub fn wait_disconnected(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            while let Ok(Some(c)) = self.poll(Duration::ZERO) {
                self.pending.push_back(c);
            }
            while let Some(e) = self.qp.poll_event() {
                if self.debug {
                    eprintln!("xwarp: cm event {e:?}");
                }
                match e {
                    CmEvent::Disconnected => {
                        // Flushes come before the event; take the last ones.
                        while let Ok(Some(c)) = self.poll(Duration::from_millis(50)) {
                            self.pending.push_back(c);
                        }
                        return true;
                    }
                    CmEvent::TerminateReceived { layer, etype, code } => {
                        self.terminate_received = Some((layer, etype, code));
                        self.problem.get_or_insert(format!(
                            "the peer sent a Terminate layer {layer} etype {etype} code {code:#04x}"
                        ));
                    }
                    other => {
                        self.problem.get_or_insert(format!("{other:?}"));
                    }
                }
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the connection to come up; returns the negotiated (IRD, ORD, CRC).
    pub fn established(&self, timeout: Duration) -> Result<(u16, u16, bool), String> {
        match self.qp.next_event(timeout) {
            Ok(CmEvent::Established { ird, ord, crc, .. }) => {
                if self.debug {
                    eprintln!("xwarp: established, IRD/ORD {ird}/{ord}, CRC {crc}");
                }
                Ok((ird, ord, crc))
            }
            Ok(CmEvent::Rejected { .. }) => Err("connection rejected".into()),
            Ok(CmEvent::ConnectError(e)) => Err(format!("connect error: {e}")),
            Ok(e) => Err(format!("while connecting: {e:?}")),
            Err(e) => Err(format!("while connecting: {e}")),
        }
    }

    /// Disconnect and give the close a moment to reach the peer.
    pub fn close(&self) {
        let _ = self.qp.disconnect();
        let deadline = Instant::now() + CLOSE_WAIT;
        while let Ok(e) = self
            .qp
            .next_event(deadline.saturating_duration_since(Instant::now()))
        {
            if e == CmEvent::Disconnected {
                break;
            }
        }
    }
}
