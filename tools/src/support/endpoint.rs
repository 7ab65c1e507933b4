//! Shared driver for the interop tools `xwarp-rping-interop` and `xwarp-perftest-peer`: a
//! sans-IO [`Connection`] plus its memory, run over a [`Transport`] on the tool's own
//! thread (the other programs run on `xwarp::verbs`, placement on the engine thread).
//!
//! The protocol logic of each tool only talks to [`Endpoint`] (register, post, wait
//! for completions); the bytes move through a [`Transport`] (`support/transport.rs`): a
//! kernel TCP socket or a stream of an xwarp engine on AF_XDP, chosen by the engine flags
//! (or `XWARP_ENGINE`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use xwarp::ddp::mpa::ConnectRequest;
use xwarp::rdmap::conn::{ConnEvent, Connection};
use xwarp::rdmap::wire::ParsedTerminate;
use xwarp::rdmap::{
    Access, Completion, CompletionStatus, PdId, RecvWr, Resources, SendOp, SendWr, Sge, Stag,
    WcOpcode,
};

/// Give up when nothing at all happens for this long.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Local, remote-read and remote-write access.
pub const RW: Access =
    Access(Access::LOCAL_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0);

pub use super::transport::Transport;

/// Why waiting for a completion ended without one.
#[derive(Debug)]
pub enum WaitError {
    /// The stream was closed (by the peer or after an error), or a WR was flushed.
    Disconnected(String),
    /// A work request failed or nothing happened for too long.
    Failed(String),
}

impl std::fmt::Display for WaitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitError::Disconnected(s) => write!(f, "disconnected: {s}"),
            WaitError::Failed(s) => f.write_str(s),
        }
    }
}

/// Counts of completions by outcome (for "nothing reported complete was lost" checks).
#[derive(Debug, Default, Clone, Copy)]
pub struct CqeStats {
    /// Successful completions.
    pub success: u64,
    /// Flushed completions (QP in ERROR).
    pub flushed: u64,
    /// Other failed completions.
    pub failed: u64,
}

/// A [`Connection`], its memory, and the transport it runs over.
pub struct Endpoint<T: Transport> {
    /// The sans-IO connection.
    pub conn: Connection,
    /// STag table and SRQs.
    pub res: Resources,
    /// Our protection domain.
    pub pd: PdId,
    t: T,
    rx: Vec<u8>,
    tx: Vec<u8>,
    /// Completions not yet consumed by a `wait_cqe`.
    pub cqes: VecDeque<Completion>,
    /// Responder: the Initiator's Request, once it arrived.
    pub request: Option<ConnectRequest>,
    /// Established was reported.
    pub established: bool,
    /// Closed was reported.
    pub closed: bool,
    tcp_closed: bool,
    /// The peer closed TCP (or it failed).
    pub eof: bool,
    /// First problem reported by the connection (Terminate, error, rejection).
    pub problem: Option<String>,
    /// The Terminate the peer sent, if any.
    pub terminate_received: Option<ParsedTerminate>,
    /// Completion counts.
    pub stats: CqeStats,
    /// Print every event.
    pub debug: bool,
}

impl<T: Transport> Endpoint<T> {
    /// Wraps `conn` (whose memory lives in `res`, PD `pd`) running over `t`.
    pub fn new(conn: Connection, res: Resources, pd: PdId, t: T, debug: bool) -> Self {
        Endpoint {
            conn,
            res,
            pd,
            t,
            rx: vec![0; 256 * 1024],
            tx: Vec::new(),
            cqes: VecDeque::new(),
            request: None,
            established: false,
            closed: false,
            tcp_closed: false,
            eof: false,
            problem: None,
            terminate_received: None,
            stats: CqeStats::default(),
            debug,
        }
    }

    /// Registers a zeroed buffer of `len` bytes; returns its STag and TO (the heap address
    /// of the buffer, a VA-like value as `ibv_reg_mr` users advertise).
    pub fn reg(&mut self, len: usize, access: Access) -> Result<(Stag, u64), String> {
        let v = vec![0u8; len];
        let va = v.as_ptr() as u64;
        let stag = self
            .res
            .stags
            .register(self.pd, access, va, Box::new(v))
            .map_err(|e| format!("register: {e:?}"))?;
        Ok((stag, va))
    }

    /// Writes `data` at offset 0 of the region `stag`.
    pub fn write_mem(&mut self, stag: Stag, data: &[u8]) -> Result<(), String> {
        self.res
            .stags
            .write(stag, 0, data)
            .map_err(|e| format!("buffer write: {e:?}"))
    }

    /// The first `len` bytes of the region `stag` (empty if out of range).
    pub fn mem(&self, stag: Stag, len: usize) -> Vec<u8> {
        self.res.stags.read(stag, 0, len).unwrap_or_default()
    }

    /// Posts a signaled single-SGE send work request.
    pub fn post_send(&mut self, wr_id: u64, op: SendOp, sge: Sge) -> Result<(), String> {
        self.conn
            .post_send(SendWr {
                wr_id,
                op,
                sgl: vec![sge],
                signaled: true,
                fence: false,
            })
            .map_err(|e| format!("post_send: {e:?}"))
    }

    /// Posts a single-SGE receive.
    pub fn post_recv(&mut self, wr_id: u64, sge: Sge) -> Result<(), String> {
        self.conn
            .post_recv(RecvWr {
                wr_id,
                sgl: vec![sge],
            })
            .map_err(|e| format!("post_recv: {e:?}"))
    }

    /// Sends everything the connection has queued (e.g. a Terminate it queued while
    /// failing) and FINs once it wants TCP closed. Returns whether bytes were sent.
    pub fn flush(&mut self) -> bool {
        let mut progress = false;
        loop {
            self.tx.clear();
            if self.conn.poll_transmit(&self.res, &mut self.tx) == 0 {
                break;
            }
            progress = true;
            if self.t.send_all(&self.tx).is_err() {
                self.conn.handle_peer_closed();
                self.eof = true;
                break;
            }
        }
        if self.conn.wants_close() && !self.tcp_closed {
            self.tcp_closed = true;
            self.t.shutdown();
        }
        progress
    }

    /// One round: send what is pending, wait up to `wait` for input, process it, time and
    /// events. Returns whether anything happened.
    pub fn step(&mut self, wait: Duration) -> bool {
        let mut progress = self.flush();
        if !self.eof {
            let now = Instant::now();
            let wait = match self.conn.poll_timeout() {
                Some(t) => wait.min(t.saturating_duration_since(now)),
                None => wait,
            };
            match self.t.recv(&mut self.rx, wait) {
                Ok(None) => {}
                Ok(Some(0)) | Err(_) => {
                    self.eof = true;
                    progress = true;
                    if self.debug {
                        eprintln!("xwarp: TCP closed by peer");
                    }
                    self.conn.handle_peer_closed();
                }
                Ok(Some(n)) => {
                    progress = true;
                    if let Err(e) =
                        self.conn
                            .handle_input(Instant::now(), &self.rx[..n], &mut self.res)
                    {
                        if self.debug {
                            eprintln!("xwarp: input error: {e}");
                        }
                    }
                }
            }
        } else if !wait.is_zero() {
            std::thread::sleep(wait.min(Duration::from_millis(10)));
        }
        self.conn.handle_timeout(Instant::now());
        while let Some(ev) = self.conn.poll_event() {
            progress = true;
            if self.debug {
                eprintln!("xwarp: event {ev:?}");
            }
            match ev {
                ConnEvent::ConnectRequest(r) => self.request = Some(r),
                ConnEvent::Established(_) => self.established = true,
                ConnEvent::Rejected { .. } => {
                    self.problem.get_or_insert("connection rejected".into());
                }
                ConnEvent::TerminateReceived(t) => {
                    self.terminate_received = Some(t);
                    self.problem
                        .get_or_insert(format!("peer sent a Terminate: {:?}", t.best()));
                }
                ConnEvent::TerminateSent(t) => {
                    self.problem.get_or_insert(format!(
                        "we sent a Terminate: layer {} etype {} code {:#04x}",
                        t.layer, t.etype, t.code
                    ));
                }
                ConnEvent::Error(e) => {
                    self.problem.get_or_insert(e.to_string());
                }
                ConnEvent::Closed => self.closed = true,
            }
        }
        while let Some(c) = self.conn.poll_completion() {
            progress = true;
            match c.status {
                CompletionStatus::Success => self.stats.success += 1,
                CompletionStatus::WrFlushError => self.stats.flushed += 1,
                _ => self.stats.failed += 1,
            }
            if self.debug {
                eprintln!("xwarp: completion {c:?}");
            }
            self.cqes.push_back(c);
        }
        progress
    }

    /// Runs until `done` says so, the stream closes, or nothing happens for too long.
    pub fn run_until(&mut self, mut done: impl FnMut(&mut Self) -> bool) -> Result<(), String> {
        let mut idle_since = Instant::now();
        loop {
            if done(self) {
                return Ok(());
            }
            if self.closed {
                self.flush();
                return Err(self
                    .problem
                    .clone()
                    .unwrap_or_else(|| "connection closed".into()));
            }
            if self.step(Duration::from_millis(50)) {
                idle_since = Instant::now();
            } else if idle_since.elapsed() > IDLE_TIMEOUT {
                return Err("timed out: no progress".into());
            }
        }
    }

    /// Waits for the next completion of `opcode`; any failed completion is an error.
    pub fn wait_cqe(&mut self, opcode: WcOpcode) -> Result<Completion, WaitError> {
        let mut idle_since = Instant::now();
        loop {
            let hit = self
                .cqes
                .iter()
                .position(|c| c.opcode == opcode || c.status != CompletionStatus::Success);
            if let Some(c) = hit.and_then(|i| self.cqes.remove(i)) {
                if c.status == CompletionStatus::Success {
                    return Ok(c);
                }
                let msg = format!("{:?} completion failed: {:?}", c.opcode, c.status);
                return Err(if c.status == CompletionStatus::WrFlushError {
                    WaitError::Disconnected(self.problem.clone().unwrap_or(msg))
                } else {
                    WaitError::Failed(msg)
                });
            }
            if self.closed {
                self.flush();
                return Err(WaitError::Disconnected(
                    self.problem
                        .clone()
                        .unwrap_or_else(|| "connection closed".into()),
                ));
            }
            if self.step(Duration::from_millis(50)) {
                idle_since = Instant::now();
            } else if idle_since.elapsed() > IDLE_TIMEOUT {
                return Err(WaitError::Failed(format!(
                    "timed out waiting for {opcode:?}"
                )));
            }
        }
    }

    /// Waits up to `limit` until the stream closed (peer Terminate/FIN or our close).
    pub fn wait_closed(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while !self.closed && Instant::now() < deadline {
            self.step(Duration::from_millis(20));
        }
        self.closed
    }

    /// Graceful disconnect: drain, FIN, then wait a little for the peer's FIN.
    pub fn disconnect(&mut self) {
        self.conn.close();
        let deadline = Instant::now() + Duration::from_secs(3);
        while !(self.tcp_closed && self.eof) && Instant::now() < deadline {
            self.step(Duration::from_millis(20));
        }
    }
}

/// A plain Send (no SE, no Invalidate).
pub fn send_op() -> SendOp {
    SendOp::Send {
        solicited: false,
        invalidate: None,
    }
}

/// The SGE covering `len` bytes of region `lkey` at `addr`.
pub fn sge(lkey: Stag, addr: u64, len: usize) -> Sge {
    Sge {
        lkey,
        addr,
        len: len as u32,
    }
}

/// `WcOpcode` of a receive completion, for readability at call sites.
pub const RECV: WcOpcode = WcOpcode::Recv;
