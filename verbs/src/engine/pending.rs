//! Connection requests waiting for the application, and their limits (the listener's
//! [`ListenConfig`](crate::cm::ListenConfig)): at most `backlog` held per listener (one
//! beyond is refused with an MPA Reply with R=1, docs/mpa.md §1.5), at most
//! `max_negotiating` still reading their Request (one beyond is reset), a Request that
//! is not complete within `request_timeout` is reset, a request not answered within
//! `accept_timeout` is rejected.

use std::time::Instant;

use xwarp_ddp::mpa::ConnectRequest;
use xwarp_stack::proto::ProtoConnId;

use crate::cm_limits::CmStats;
use crate::engine::cmd::RequestMsg;
use crate::engine::host::{Owner, VerbsHost};

impl VerbsHost {
    /// Connections of listener `token` still reading their Request (`reported` false)
    /// or held for the application (`reported` true), not counting aborted ones.
    fn count_pending(&self, token: u64, reported_: bool) -> usize {
        self.owners
            .values()
            .filter(|o| {
                matches!(o, Owner::Pending { token: t, reported, abort: false, .. }
                    if *t == token && *reported == reported_)
            })
            .count()
    }

    /// Whether listener `token` may take one more connection that is still reading its
    /// Request (`VerbsHost::on_accepted`); counts a refusal if not.
    pub(crate) fn may_negotiate(&mut self, token: u64) -> bool {
        let Some(l) = self.listeners.get(&token) else {
            return false;
        };
        let max = l.config.max_negotiating;
        if self.count_pending(token, false) >= max {
            self.cm.refused_negotiating += 1;
            return false;
        }
        true
    }

    /// A complete Request arrived on `conn` (already marked reported): hand it to the
    /// listener if it holds fewer than `backlog` requests, else refuse it.
    pub(crate) fn offer_request(&mut self, conn: ProtoConnId, req: ConnectRequest, now: Instant) {
        let Some(Owner::Pending { token, peer, .. }) = self.owners.get(&conn) else {
            return;
        };
        let (token, peer) = (*token, *peer);
        let Some(l) = self.listeners.get(&token) else {
            self.abort_pending(conn);
            return;
        };
        let (backlog, accept_timeout) = (l.config.backlog, l.config.accept_timeout);
        // This request is counted among the reported ones already.
        if self.count_pending(token, true) > backlog {
            self.cm.refused_backlog += 1;
            self.reject_pending(conn, &[]);
            return;
        }
        let mut msg = RequestMsg { conn, peer, req };
        for attempt in 0..2 {
            let Some(l) = self.listeners.get(&token) else {
                break;
            };
            match l.requests.try_send(msg) {
                Ok(()) => {
                    l.ready.signal();
                    if let Some(Owner::Pending { deadline, .. }) = self.owners.get_mut(&conn) {
                        *deadline = Some(now + accept_timeout);
                    }
                    return;
                }
                Err(e) => {
                    msg = e.into_inner();
                    if attempt == 0 {
                        self.purge_requests(token);
                    }
                }
            }
        }
        // Only reachable if the channel is full of live requests (never, given the
        // count above) or the listener went away.
        self.cm.refused_backlog += 1;
        self.reject_pending(conn, &[]);
    }

    /// Take out of listener `token`'s channel every request whose connection is no
    /// longer pending (timed out, refused, closed by the peer); the live ones go back in
    /// their order. The application may take requests meanwhile, which is harmless.
    fn purge_requests(&mut self, token: u64) {
        let Some(l) = self.listeners.get(&token) else {
            return;
        };
        let queued: Vec<RequestMsg> = l.requests_rx.try_iter().collect();
        for m in queued {
            let live = matches!(
                self.owners.get(&m.conn),
                Some(Owner::Pending { abort: false, .. })
            );
            if live {
                let _ = l.requests.try_send(m);
            }
        }
    }

    /// Answer a pending request with an MPA Reply with R=1 and close (the application's
    /// reject, a refusal beyond the backlog, an overdue answer). A connection whose
    /// Request was never complete cannot be answered and is reset instead.
    pub(crate) fn reject_pending(&mut self, conn: ProtoConnId, private_data: &[u8]) {
        let Some(Owner::Pending {
            token,
            local,
            peer,
            mut probe,
            raw,
            reported,
            deadline,
            ..
        }) = self.owners.remove(&conn)
        else {
            return;
        };
        let owner = match probe.reject(private_data) {
            Ok(()) => Owner::Detached { conn: probe },
            Err(_) => Owner::Pending {
                token,
                local,
                peer,
                probe,
                raw,
                reported,
                abort: true,
                deadline,
            },
        };
        self.owners.insert(conn, owner);
    }

    /// Reset a pending connection (`close_request` aborts it).
    fn abort_pending(&mut self, conn: ProtoConnId) {
        if let Some(Owner::Pending { abort, .. }) = self.owners.get_mut(&conn) {
            *abort = true;
        }
    }

    /// Run the pending connections' clocks: a Request not complete in time resets its
    /// connection, an answer overdue rejects the request. Returns the next deadline.
    pub(crate) fn poll_pending(&mut self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut overdue = Vec::new();
        for (id, owner) in self.owners.iter_mut() {
            let Owner::Pending {
                probe,
                abort,
                reported,
                deadline,
                ..
            } = owner
            else {
                continue;
            };
            if probe.poll_timeout().is_some_and(|t| now >= t) {
                probe.handle_timeout(now);
            }
            if probe.is_closed() && !*abort {
                *abort = true;
                if !*reported {
                    self.cm.request_timeouts += 1;
                }
            }
            if let Some(t) = probe.poll_timeout() {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
            if let (true, false, Some(d)) = (*reported, *abort, *deadline) {
                if now >= d {
                    overdue.push(*id);
                } else {
                    next = Some(next.map_or(d, |n| n.min(d)));
                }
            }
        }
        for id in overdue {
            self.cm.accept_timeouts += 1;
            self.reject_pending(id, &[]);
        }
        next
    }

    /// The counters of `Device::cm_stats`.
    pub(crate) fn cm_stats(&self) -> CmStats {
        let mut s = self.cm;
        s.connections = self.owners.len();
        for o in self.owners.values() {
            if let Owner::Pending {
                reported,
                abort: false,
                ..
            } = o
            {
                if *reported {
                    s.pending += 1;
                } else {
                    s.negotiating += 1;
                }
            }
        }
        s
    }
}
