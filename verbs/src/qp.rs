//! Queue pairs: [`QpInitAttr`] and [`QueuePair`] (posting work, connecting, CM events,
//! query and modify; the state rules are in the crate's `qp_state` module).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use xwarp_rdmap::verbs::{PostError, Sge, MAX_SGE};
use xwarp_stack::Readiness;

use crate::cm_event::{CmEvent, ConnectParams, ConnectTuning};
use crate::context::Device;
use crate::cq::CompletionQueue;
use crate::engine::cmd::Cmd;
use crate::qp_attr::{MpaAttr, QpAttr, QpModify};
use crate::qp_state::QpState;
use crate::qp_stats::QpStatsSnapshot;
use crate::srq::SharedReceiveQueue;
use crate::wr::{SendOpcode, SendRequest};

/// QP creation attributes.
#[derive(Debug, Clone)]
pub struct QpInitAttr<'a> {
    /// CQ of send work (and Local Invalidate).
    pub send_cq: &'a CompletionQueue,
    /// CQ of receives.
    pub recv_cq: &'a CompletionQueue,
    /// Shared receive queue instead of the QP's own.
    pub srq: Option<&'a SharedReceiveQueue>,
    /// Send queue depth.
    pub max_send_wr: usize,
    /// Receive queue depth (without SRQ).
    pub max_recv_wr: usize,
    /// Largest inline payload (copied at post time; 0 disables inline); at most
    /// [`MAX_INLINE_DATA`](crate::MAX_INLINE_DATA), and `max_inline_data × max_send_wr` at most
    /// [`MAX_INLINE_BUFFER`](crate::MAX_INLINE_BUFFER).
    pub max_inline_data: usize,
    /// Inbound RDMA Read depth requested (IRD).
    pub ird: u32,
    /// Outbound RDMA Read depth requested (ORD).
    pub ord: u32,
    /// MPA settings.
    pub mpa: MpaAttr,
}

impl<'a> QpInitAttr<'a> {
    /// Defaults: depth 128 each way, 256 bytes inline, IRD/ORD 16, MPA defaults.
    pub fn new(send_cq: &'a CompletionQueue, recv_cq: &'a CompletionQueue) -> Self {
        QpInitAttr {
            send_cq,
            recv_cq,
            srq: None,
            max_send_wr: 128,
            max_recv_wr: 128,
            max_inline_data: 256,
            ird: 16,
            ord: 16,
            mpa: MpaAttr::default(),
        }
    }
}

/// An RC queue pair.
pub struct QueuePair {
    pub(crate) dev: Device,
    pub(crate) qpn: u32,
    /// Changed by [`QueuePair::modify`] (before connect only).
    pub(crate) max_inline: AtomicUsize,
    pub(crate) max_send_wr: usize,
    pub(crate) events: Receiver<CmEvent>,
    pub(crate) ready: Arc<Readiness>,
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair").field("qpn", &self.qpn).finish()
    }
}

impl QueuePair {
    /// QP number (local).
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// Send queue depth.
    pub fn max_send_wr(&self) -> usize {
        self.max_send_wr
    }

    /// Post send work. Errors found here (SGL shape, inline size) are returned; a full
    /// send queue is found by the engine and completes the request with
    /// `LocalQpOperationError`. In inline mode the doorbell ring of the post runs an
    /// engine iteration on the calling thread (unless another thread is driving), so the
    /// work request leaves before the call returns.
    pub fn post_send(&self, wr: SendRequest) -> Result<(), PostError> {
        if let Some(data) = &wr.inline {
            if data.len() > self.max_inline.load(Ordering::Relaxed)
                || matches!(
                    wr.opcode,
                    SendOpcode::Read { .. } | SendOpcode::LocalInvalidate(_)
                )
            {
                return Err(PostError::InvalidSgl);
            }
        } else if wr.sgl.len() > MAX_SGE
            || (matches!(wr.opcode, SendOpcode::Read { .. }) && wr.sgl.len() != 1)
        {
            return Err(PostError::InvalidSgl);
        }
        self.dev
            .inner
            .send(Cmd::PostSend { qpn: self.qpn, wr })
            .map_err(|_| PostError::InvalidState)
    }

    /// Post a receive (QPs without SRQ).
    pub fn post_recv(&self, wr_id: u64, sgl: &[Sge]) -> Result<(), PostError> {
        if sgl.len() > MAX_SGE {
            return Err(PostError::InvalidSgl);
        }
        self.dev
            .inner
            .send(Cmd::PostRecv {
                qpn: self.qpn,
                wr: xwarp_rdmap::verbs::RecvWr {
                    wr_id,
                    sgl: sgl.to_vec(),
                },
            })
            .map_err(|_| PostError::InvalidState)
    }

    /// Connect to a listener at `remote`; the outcome comes as a [`CmEvent`]
    /// (`Established`, `Rejected`, `ConnectError`).
    pub fn connect(&self, remote: SocketAddr, params: ConnectParams) -> io::Result<()> {
        self.connect_with_first_fpdu_delay(remote, params, Duration::ZERO)
    }

    /// [`Self::connect`], holding the first FPDU (the RTR or the first posted work) back
    /// for `delay` after the MPA Reply arrived: a siw Responder may not read an FPDU that
    /// comes right behind its Reply (interop/README.md, "Reply-before-upcall race").
    pub fn connect_with_first_fpdu_delay(
        &self,
        remote: SocketAddr,
        params: ConnectParams,
        delay: Duration,
    ) -> io::Result<()> {
        self.connect_tuned(
            remote,
            params,
            ConnectTuning {
                first_fpdu_delay: delay,
                ..ConnectTuning::default()
            },
        )
    }

    /// [`Self::connect`] with the [`ConnectTuning`] settings: a first-FPDU delay, and
    /// retrying a connect the peer refused until a deadline (`retry_refused`). The
    /// outcome comes as one [`CmEvent`], as for `connect`: a refusal that the retries
    /// did not overcome is a `ConnectError`.
    pub fn connect_tuned(
        &self,
        remote: SocketAddr,
        params: ConnectParams,
        tuning: ConnectTuning,
    ) -> io::Result<()> {
        self.dev.inner.send(Cmd::Connect {
            qpn: self.qpn,
            remote,
            params,
            tuning,
        })
    }

    /// [`Self::connect`] and wait for the outcome: the peer's private data on success.
    pub fn connect_blocking(
        &self,
        remote: SocketAddr,
        params: ConnectParams,
    ) -> io::Result<Vec<u8>> {
        let timeout = params.timeout + Duration::from_secs(1);
        self.connect(remote, params)?;
        match self.next_event(timeout)? {
            CmEvent::Established { private_data, .. } => Ok(private_data),
            CmEvent::Rejected { private_data } => Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("rejected (private data {private_data:?})"),
            )),
            e => Err(io::Error::other(format!("connect failed: {e:?}"))),
        }
    }

    /// Graceful disconnect: queued work drains, then TCP closes; `Disconnected` follows.
    pub fn disconnect(&self) -> io::Result<()> {
        self.dev.inner.send(Cmd::Disconnect { qpn: self.qpn })
    }

    /// The current state (an engine round trip).
    ///
    /// siw names the states IDLE, RTR, RTS, CLOSING, TERMINATE, ERROR. siw's RTR (a
    /// connection being set up) is reported as [`QpState::Idle`]: attributes may still
    /// change and posted work waits for the connection; the QP enters `Rts` when the
    /// connection manager finished MPA (and, for a P2P Responder, the RTR arrived).
    /// `Closing` is a graceful close in progress (queued work drains, then TCP closes);
    /// after a clean graceful close the QP is `Idle` again (as in siw). `Terminate`: a
    /// Terminate is queued, `Error` follows once it is sent. `Error`: every outstanding
    /// and later work request completes with `WrFlushError`. From `Error`, and from
    /// `Idle` after a graceful close, a reset ([`QueuePair::modify`] to `Idle`) makes the
    /// QP usable for a new connect/accept.
    pub fn state(&self) -> io::Result<QpState> {
        Ok(self.query()?.state)
    }

    /// The QP's counters now ([`QpStatsSnapshot`]). Cost: one round trip through the
    /// engine's command queue, like [`Self::query`] (the engine answers on its next loop
    /// iteration, typically within microseconds while it is busy; a copy of the counters
    /// and no work on the data path). For a cheap periodic view of every QP, use
    /// [`Context::qp_stats`](crate::Context::qp_stats) once rather than this per QP.
    pub fn stats(&self) -> io::Result<QpStatsSnapshot> {
        let qpn = self.qpn;
        self.dev
            .inner
            .call(|reply| Cmd::QpStats { qpn, reply })?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "QP not found"))
    }

    /// The QP's attributes as the engine knows them now (after `ibv_query_qp`).
    pub fn query(&self) -> io::Result<QpAttr> {
        let qpn = self.qpn;
        self.dev
            .inner
            .call(|reply| Cmd::QueryQp { qpn, reply })?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "QP not found"))
    }

    /// Change the state and/or attributes (after `ibv_modify_qp`; the rules are on
    /// [`QpModify`]). An illegal transition or an attribute change after the connection
    /// was started fails with `InvalidInput` and changes nothing. To ERROR is abortive:
    /// every outstanding and later work request completes with `WrFlushError` (exactly
    /// once); a connection (or a connect in progress) is reset and
    /// [`CmEvent::Disconnected`] (or `ConnectError`) follows; a QP that never connected
    /// reports no CM event. The call returns once the engine applied the change.
    ///
    /// **Reset** (to `Idle` from `Error`, or from `Idle` once a graceful close finished;
    /// verbs `IBV_QPS_RESET`): the QP becomes as freshly created, with the same
    /// [`Self::qp_num`], CQs, PD and attributes, and [`Self::connect`] /
    /// [`ConnRequest::accept`](crate::ConnRequest::accept) work on it again. Everything outstanding already completed
    /// when the QP entered ERROR (or closed), exactly once; the reset adds no completion
    /// and no completion or CM event of the old connection follows it. The old
    /// connection's protocol state (MSNs, ORD/IRD queues, Terminate state, the negotiated
    /// MPA results, [`QpAttr::negotiated`], the addresses) is dropped, and CM events of it
    /// that were not read yet are discarded. Its TCP connection is released from the QP
    /// and never reused: reset (RST) if it is still open, or left to finish a graceful
    /// close it already began. The reset never waits for that: siw refuses to leave a
    /// state while a work request is still active (`-EAGAIN`), which cannot happen here,
    /// since the old connection's work was flushed when it ended. Attributes given in the
    /// same call apply after the reset. Work posted after the reset waits for the new
    /// connection, as on a new QP. Do not accept on the QP from another thread while it
    /// is being reset.
    ///
    /// siw itself treats ERROR as final (its `siw_qp_modify` ignores a move out of ERROR,
    /// and RESET maps to its IDLE); allowing the reset follows the verbs state machine.
    pub fn modify(&self, m: &QpModify) -> io::Result<()> {
        let qpn = self.qpn;
        let m2 = m.clone();
        let reset = self
            .dev
            .inner
            .call(|reply| Cmd::ModifyQp { qpn, m: m2, reply })?
            .map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
        if let Some(n) = m.max_inline_data {
            self.max_inline.store(n, Ordering::Relaxed);
        }
        if reset {
            // The engine answered after the reset, and it sends no event of the old
            // connection after it: everything queued now belongs to the old one.
            while self.events.try_recv().is_ok() {}
            self.ready.drain();
        }
        Ok(())
    }

    /// The next CM event, if any.
    pub fn poll_event(&self) -> Option<CmEvent> {
        self.events.try_recv().ok()
    }

    /// Wait up to `timeout` for the next CM event.
    pub fn next_event(&self, timeout: Duration) -> io::Result<CmEvent> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(e) = self.events.try_recv() {
                return Ok(e);
            }
            if !self.ready.wait(Some(deadline))? {
                return self
                    .events
                    .try_recv()
                    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no connection event"));
            }
        }
    }
}

impl AsRawFd for QueuePair {
    /// Readable when a CM event is queued.
    fn as_raw_fd(&self) -> RawFd {
        self.ready.as_raw_fd()
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let _ = self.dev.inner.send(Cmd::DestroyQp { qpn: self.qpn });
    }
}
