//! Binding an accepted connection request to a QP, and handing early work over.

use std::time::Instant;

use xwarp_ddp::mpa::AcceptParams;
use xwarp_rdmap::conn::{ConnEvent, Connection};
use xwarp_stack::proto::ProtoConnId;

use crate::cm_event::CmEvent;
use crate::engine::host::{Owner, VerbsHost};

impl VerbsHost {
    /// `ConnRequest::accept` (rdma_accept): bind the pending connection to QP `qpn`.
    /// Errors go to the caller, never to a QP's events: a QP that is already used (or
    /// gone) is `InvalidInput` (rdma_accept's EINVAL) and the request's connection is
    /// dropped (reset); a request whose connection already died is `ConnectionAborted`.
    pub(crate) fn accept(
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
            Some(s) if s.phase().can_start() && !s.destroyed => {
                let ird = s.qp.ird.min(u32::from(u16::MAX)) as u16;
                let ord = s.qp.ord.min(u32::from(u16::MAX)) as u16;
                Connection::responder(self.conn_config(s, conn_id), now)
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
                        deadline: None,
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

    pub(crate) fn give_early(&mut self, qpn: u32) {
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

    pub(crate) fn remove_qp(&mut self, qpn: u32) {
        if let Some(mut slot) = self.qps.remove(&qpn) {
            if let Some(c) = slot.conn.as_mut() {
                c.release(&mut self.res);
            }
            if let Some(id) = slot.conn_id {
                self.owners.remove(&id);
            }
            if let Some((stag, _, _)) = slot.inline {
                let _ = self.res.stags.deregister(stag);
            }
        }
    }
}
