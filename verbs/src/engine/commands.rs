//! Applying the application's commands, and the graceful disconnect.

use std::time::Instant;

use xwarp_rdmap::Access;
use xwarp_stack::proto::ProtoCtl;

use xwarp_ddp::mpa::RtrSet;

use crate::cm_event::CmEvent;
use crate::engine::cmd::Cmd;
use crate::engine::host::{ListenSlot, Owner, VerbsHost};
use crate::engine::slot::{Connecting, Early, QpSlot};
use crate::qp_attr::{check_inline, QpAttr};

impl VerbsHost {
    /// Apply one application command; connect, listen and unlisten need the engine.
    pub(crate) fn handle(&mut self, cmd: Cmd, now: Instant, ctl: &mut ProtoCtl) {
        match cmd {
            Cmd::Connect {
                qpn,
                remote,
                params,
                tuning,
            } => {
                let Some(slot) = self.qps.get_mut(&qpn) else {
                    return;
                };
                // RTS is entered by connect or accept on an unused QP only (qp_state).
                if !slot.phase().can_start() {
                    slot.event(CmEvent::ConnectError(
                        "QP already used (reset it with modify to Idle first)".into(),
                    ));
                    return;
                }
                if let Some(offer) = tuning.p2p_rtr_offer {
                    if offer == RtrSet::NONE || slot.mpa.revision != 2 {
                        slot.event(CmEvent::ConnectError(format!(
                            "P2P RTR offer {offer:?} needs at least one type and MPA revision \
                             2 (the QP has revision {}; RFC 6581 §3.2)",
                            slot.mpa.revision
                        )));
                        return;
                    }
                }
                let deadline = now + params.timeout;
                let id = ctl.connect(remote, None, deadline);
                slot.conn_id = Some(id);
                slot.connecting = Some(Connecting {
                    remote,
                    private_data: params.private_data,
                    deadline,
                    timeout: params.timeout,
                    first_fpdu_delay: tuning.first_fpdu_delay,
                    p2p_rtr_offer: tuning.p2p_rtr_offer,
                    retry_until: tuning.retry_refused.map(|d| now + d),
                    retry_at: None,
                    refused: 0,
                });
                self.owners.insert(id, Owner::Qp(qpn));
            }
            Cmd::Listen {
                token,
                addr,
                config,
                requests,
                requests_rx,
                ready,
                reply,
            } => {
                self.listeners.insert(
                    token,
                    ListenSlot {
                        config,
                        requests,
                        requests_rx,
                        ready,
                        reply: Some(reply),
                    },
                );
                ctl.listen(token, addr, config.backlog);
            }
            Cmd::Unlisten { token } => {
                self.listeners.remove(&token);
                ctl.unlisten(token);
            }
            other => self.handle_local(other, now),
        }
    }

    /// Apply one command that needs nothing from the engine (memory, QPs, work requests).
    pub(crate) fn handle_local(&mut self, cmd: Cmd, now: Instant) {
        match cmd {
            c @ (Cmd::Connect { .. } | Cmd::Listen { .. } | Cmd::Unlisten { .. }) => {
                // Never reached through `apply_queued`; kept in order for `poll` if it were.
                self.stashed.push_back(c);
            }
            Cmd::RegMr {
                pd,
                access,
                base,
                region,
                reply,
            } => {
                // The table owns the engine's reference from here (dropped, and
                // `Released` signalled, if the registration fails).
                let r = self.res.stags.register(pd, access, base, Box::new(region));
                if let (Err(_), Ok(stag)) = (reply.send(r), r) {
                    // Nobody waits for the STag any more: never keep memory registered
                    // that no application object will deregister.
                    let _ = self.res.stags.deregister(stag);
                }
            }
            Cmd::DeregMr { stag } => {
                // Drops the engine's `EngineRegion`: `Released` fires, the application's
                // `MemoryRegion::dereg` returns.
                let _ = self.res.stags.deregister(stag);
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
                let inline = if max_inline > 0 && check_inline(max_inline, qp.sq_depth).is_ok() {
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
                        counts: Default::default(),
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
            Cmd::Reject { conn, private_data } => self.reject_pending(conn, &private_data),
            Cmd::CmStats { reply } => {
                let _ = reply.send(self.cm_stats());
            }
            Cmd::DisconnectAll { reply } => {
                let open: Vec<u32> = self
                    .qps
                    .values()
                    .filter(|s| {
                        s.conn_id.is_some()
                            && !s.finished
                            && !s.disconnect_requested
                            && !s.conn.as_ref().is_some_and(|c| c.is_closed())
                    })
                    .map(|s| s.qpn)
                    .collect();
                for &q in &open {
                    self.disconnect(q);
                }
                let _ = reply.send(open.len());
            }
            Cmd::QpStats { qpn, reply } => {
                let s = self
                    .qps
                    .get(&qpn)
                    .filter(|s| !s.destroyed)
                    .map(|s| s.stats());
                let _ = reply.send(s);
            }
            Cmd::AllQpStats { reply } => {
                let mut v = Vec::with_capacity(self.qps.len());
                self.for_each_qp_stats(|s| v.push(*s));
                v.sort_by_key(|s| s.qp_num);
                let _ = reply.send(v);
            }
        }
    }

    /// Graceful disconnect (also modify to CLOSING).
    pub(crate) fn disconnect(&mut self, qpn: u32) {
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
}

#[cfg(test)]
mod tests {
    //! Registration and deregistration commands against application memory: the engine's
    //! reference (and `Released`) lives exactly as long as the STag is in its table.
    use std::ptr::NonNull;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use xwarp_rdmap::{Access, MemError, PdId};

    use crate::engine::cmd::Cmd;
    use crate::engine::host::VerbsHost;
    use crate::mem::{EngineRegion, RawBuf, Released};

    fn host() -> VerbsHost {
        VerbsHost::new(crossbeam_channel::unbounded().1, 1460)
    }

    /// A RegMr command over `mem` (foreign), its reply channel and release signal.
    fn reg(
        mem: &mut [u8],
    ) -> (
        Cmd,
        crossbeam_channel::Receiver<Result<xwarp_rdmap::Stag, MemError>>,
        Arc<Released>,
    ) {
        let ptr = NonNull::new(mem.as_mut_ptr()).unwrap();
        // SAFETY: every test keeps `mem` alive until `Released` fired.
        let buf = Arc::new(unsafe { RawBuf::foreign(ptr, mem.len()) });
        let base = buf.addr();
        let (region, released) = EngineRegion::new(buf);
        let (tx, rx) = crossbeam_channel::bounded(1);
        let cmd = Cmd::RegMr {
            pd: PdId(7),
            access: Access::REMOTE_WRITE | Access::LOCAL_WRITE,
            base,
            region,
            reply: tx,
        };
        (cmd, rx, released)
    }

    #[test]
    fn released_exactly_when_the_engine_deregisters() {
        let mut h = host();
        let mut mem = vec![0u8; 256];
        let (cmd, rx, released) = reg(&mut mem);
        h.handle_local(cmd, Instant::now());
        let stag = rx.try_recv().unwrap().unwrap();
        // Registered: the engine places into the application's bytes, in place.
        h.res.stags.write(stag, 10, &[1, 2, 3]).unwrap();
        assert!(
            !released.wait(Duration::from_millis(10)),
            "released while registered"
        );
        h.handle_local(Cmd::DeregMr { stag }, Instant::now());
        assert!(
            released.wait(Duration::ZERO),
            "not released by deregistration"
        );
        assert_eq!(
            h.res.stags.write(stag, 10, &[9]),
            Err(MemError::InvalidStag)
        );
        assert_eq!(&mem[9..14], &[0, 1, 2, 3, 0]);
    }

    #[test]
    fn an_answer_nobody_waits_for_deregisters_and_releases() {
        let mut h = host();
        let mut mem = vec![0u8; 64];
        let (cmd, rx, released) = reg(&mut mem);
        drop(rx);
        h.handle_local(cmd, Instant::now());
        assert!(released.wait(Duration::ZERO));
        assert!(h.res.stags.is_empty(), "an STag stayed registered");
    }

    #[test]
    fn a_refused_or_unprocessed_registration_releases() {
        let mut h = host();
        // `base + len` wraps: the table refuses it and drops the engine's reference.
        let mut mem = vec![0u8; 64];
        let (cmd, rx, released) = reg(&mut mem);
        let Cmd::RegMr {
            pd,
            access,
            region,
            reply,
            ..
        } = cmd
        else {
            unreachable!()
        };
        let wrapping = Cmd::RegMr {
            pd,
            access,
            base: u64::MAX - 8,
            region,
            reply,
        };
        h.handle_local(wrapping, Instant::now());
        assert_eq!(rx.try_recv().unwrap(), Err(MemError::ToWrap));
        assert!(released.wait(Duration::ZERO));
        // A command the engine never processed (it stopped) releases when dropped.
        let (cmd, _rx, released) = reg(&mut mem);
        drop(cmd);
        assert!(released.wait(Duration::ZERO));
        // An engine that stops with regions registered releases them with its table.
        let (cmd, rx, released) = reg(&mut mem);
        h.handle_local(cmd, Instant::now());
        rx.try_recv().unwrap().unwrap();
        assert!(!released.wait(Duration::ZERO));
        drop(h);
        assert!(released.wait(Duration::ZERO));
    }
}
