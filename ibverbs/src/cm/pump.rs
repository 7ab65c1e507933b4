//! The pump: one library thread that turns what the engine reports into rdma_cm events.
//! It waits (epoll) on the readiness descriptors of every listening id's [`Listener`] and
//! every connecting or connected id's QP, and on readiness takes the connection requests
//! (a new id and CONNECT_REQUEST each, [`id::on_request`]) or the QP's
//! [`CmEvent`]s (ESTABLISHED / REJECTED / UNREACHABLE / CONNECT_ERROR / DISCONNECTED
//! through the [state machine](super::state)), and queues them on the id's channel.
//! Each handling runs with the id locked, so a destroy either happens before (the id is
//! marked destroyed and skipped) or after it.

use core::ffi::c_int;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use xwarp_verbs::{CmEvent, Listener, QueuePair};

use super::addr;
use super::id::{self, IdCore};
use super::link;
use super::state::{on_event, EngineEvent, IdState};
use crate::abi::*;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Listener,
    Qp,
}

struct Watch {
    kind: Kind,
    fd: RawFd,
    core: Arc<IdCore>,
}

struct Pump {
    epfd: OwnedFd,
    watches: Mutex<HashMap<u64, Watch>>,
    next: AtomicU64,
}

static PUMP: OnceLock<Result<Pump, c_int>> = OnceLock::new();

fn pump() -> Result<&'static Pump, c_int> {
    let r = PUMP.get_or_init(|| {
        // SAFETY: epoll_create1 with a valid flag; checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::ENOMEM));
        }
        Ok(Pump {
            // SAFETY: a fresh descriptor we own.
            epfd: unsafe { OwnedFd::from_raw_fd(fd) },
            watches: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        })
    });
    let p = r.as_ref().map_err(|e| *e)?;
    static STARTED: OnceLock<Result<(), c_int>> = OnceLock::new();
    (*STARTED.get_or_init(|| {
        std::thread::Builder::new()
            .name("xwarp-rdma-cm".into())
            .spawn(run)
            .map(|_| ())
            .map_err(|_| libc::EAGAIN)
    }))?;
    Ok(p)
}

fn add(kind: Kind, fd: RawFd, core: Arc<IdCore>) -> Result<u64, c_int> {
    let p = pump()?;
    let token = p.next.fetch_add(1, Ordering::Relaxed);
    p.watches
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(token, Watch { kind, fd, core });
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: token,
    };
    // SAFETY: our epoll descriptor and a live descriptor of the engine's.
    let r = unsafe { libc::epoll_ctl(p.epfd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
    if r < 0 {
        let e = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        p.watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&token);
        return Err(e);
    }
    Ok(token)
}

/// Watch a listening id's listener.
pub(crate) fn watch_listener(l: &Listener, core: Arc<IdCore>) -> Result<u64, c_int> {
    add(Kind::Listener, l.as_raw_fd(), core)
}

/// Watch the QP of a connecting/accepting id.
pub(crate) fn watch_qp(qp: &QueuePair, core: Arc<IdCore>) -> Result<u64, c_int> {
    add(Kind::Qp, qp.as_raw_fd(), core)
}

/// Stop watching (before the listener or QP goes away).
pub(crate) fn unwatch(token: u64) {
    let Ok(p) = pump() else { return };
    let w = {
        let mut m = p.watches.lock().unwrap_or_else(|e| e.into_inner());
        let w = m.remove(&token);
        // The descriptor of a QP the program destroyed with ibv_destroy_qp left the epoll
        // set when it closed, and its number may now be another watch's: then leave it.
        w.filter(|w| !m.values().any(|o| o.fd == w.fd))
    };
    if let Some(w) = w {
        // SAFETY: our epoll descriptor; the watched descriptor is still open (its owner
        // calls this before dropping it).
        unsafe {
            libc::epoll_ctl(
                p.epfd.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                w.fd,
                core::ptr::null_mut(),
            )
        };
    }
}

fn run() {
    let Ok(p) = pump() else { return };
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
    loop {
        // SAFETY: a valid buffer of 64 events.
        let n = unsafe { libc::epoll_wait(p.epfd.as_raw_fd(), evs.as_mut_ptr(), 64, 1000) };
        if n < 0 {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        for e in &evs[..n as usize] {
            let token = e.u64;
            let w = {
                let m = p.watches.lock().unwrap_or_else(|e| e.into_inner());
                m.get(&token).map(|w| (w.kind, w.fd, w.core.clone()))
            };
            let Some((kind, fd, core)) = w else { continue };
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                handle(token, kind, fd, &core)
            }));
            if r.is_err() {
                crate::ffi::warn_line("internal error handling a CM event (ignored)");
            }
        }
    }
}

fn drain(fd: RawFd) {
    let mut v = 0u64;
    // SAFETY: an 8-byte read from the engine's non-blocking eventfd.
    let _ = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

fn still_watched(token: u64) -> bool {
    pump().is_ok_and(|p| {
        p.watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&token)
    })
}

fn handle(token: u64, kind: Kind, fd: RawFd, core: &Arc<IdCore>) {
    match kind {
        Kind::Listener => {
            let mut reqs = Vec::new();
            {
                let g = core.lock();
                if g.destroyed || !still_watched(token) {
                    return;
                }
                // Drain first: a request queued after the loop below signals again.
                drain(fd);
                let Some(l) = g.listener.as_ref() else { return };
                while let Ok(r) = l.get_request(Duration::ZERO) {
                    reqs.push(r);
                }
            }
            for r in reqs {
                id::on_request(core, r);
            }
        }
        Kind::Qp => {
            let mut g = core.lock();
            if g.destroyed || !still_watched(token) {
                return;
            }
            drain(fd);
            // SAFETY: the watched QP is live while watched (destroy_qp unwatches it
            // under this lock before destroying it).
            let Some(qp) = (unsafe { link::qp_of(g.watched_qp) }) else {
                return;
            };
            while let Some(ev) = qp.poll_event() {
                let Some((ee, ty, status, data, ird, ord)) = map(&ev, g.state) else {
                    continue;
                };
                let (next, report) = on_event(g.state, ee);
                g.state = next;
                if report {
                    let st = match ee {
                        EngineEvent::Established => IBV_QPS_RTS,
                        _ => IBV_QPS_ERR,
                    };
                    link::set_qp_state(g.watched_qp, st);
                }
                if ee == EngineEvent::Established {
                    if let Ok(a) = qp.query() {
                        if let Some(std::net::SocketAddr::V4(l)) = a.local_addr {
                            addr::write_sockaddr(&mut g.cid().route.addr.src, l);
                        }
                    }
                }
                if report {
                    g.emit(core, core::ptr::null_mut(), ty, status, &data, ird, ord);
                }
                if g.state == IdState::Closed {
                    // Nothing more is reported for this connection, and programs destroy
                    // the QP right after DISCONNECTED/REJECTED, often with ibv_destroy_qp
                    // (rping), which does not tell the CM: stop looking at it now.
                    if let Some(t) = g.token.take() {
                        unwatch(t);
                    }
                    g.watched_qp = core::ptr::null_mut();
                    break;
                }
            }
        }
    }
}

type Mapped = (EngineEvent, rdma_cm_event_type, c_int, Vec<u8>, u8, u8);

/// An engine event as rdma_cm reports it on iWARP (the kernel's `cma_iw_handler`): a good
/// Reply is ESTABLISHED with the peer's private data and the negotiated IRD/ORD; an MPA
/// reject is REJECTED with `-ECONNREFUSED` and the peer's private data (what siw reports
/// for a Reply with R=1); a refused TCP connection is REJECTED too, a timeout UNREACHABLE
/// with `-ETIMEDOUT`, any other failure before ESTABLISHED CONNECT_ERROR with
/// `-ECONNRESET`. A Terminate is not an event (the connection ends after it); an error
/// on an established connection is DISCONNECTED, as is its close.
fn map(ev: &CmEvent, state: IdState) -> Option<Mapped> {
    let u8c = |v: u16| v.min(255) as u8;
    Some(match ev {
        CmEvent::Established {
            private_data,
            ird,
            ord,
            ..
        } => (
            EngineEvent::Established,
            RDMA_CM_EVENT_ESTABLISHED,
            0,
            private_data.clone(),
            u8c(*ird),
            u8c(*ord),
        ),
        CmEvent::Rejected { private_data } => (
            EngineEvent::ConnectFailed,
            RDMA_CM_EVENT_REJECTED,
            -libc::ECONNREFUSED,
            private_data.clone(),
            0,
            0,
        ),
        CmEvent::ConnectError(why) => {
            let w = why.to_ascii_lowercase();
            let (ty, st) = if w.contains("refused") {
                (RDMA_CM_EVENT_REJECTED, -libc::ECONNREFUSED)
            } else if w.contains("timed out") || w.contains("timeout") {
                (RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT)
            } else {
                (RDMA_CM_EVENT_CONNECT_ERROR, -libc::ECONNRESET)
            };
            (EngineEvent::ConnectFailed, ty, st, Vec::new(), 0, 0)
        }
        CmEvent::Error(_) if matches!(state, IdState::Connecting | IdState::Accepting) => (
            EngineEvent::ConnectFailed,
            RDMA_CM_EVENT_CONNECT_ERROR,
            -libc::ECONNRESET,
            Vec::new(),
            0,
            0,
        ),
        // A connection lost (reset, a fatal error, after a Terminate) is DISCONNECTED for
        // rdma_cm, like a close; the engine's own Disconnected after it is then silent.
        CmEvent::Error(_) if matches!(state, IdState::Connected | IdState::Disconnecting) => (
            EngineEvent::Disconnected,
            RDMA_CM_EVENT_DISCONNECTED,
            0,
            Vec::new(),
            0,
            0,
        ),
        CmEvent::Disconnected => (
            EngineEvent::Disconnected,
            RDMA_CM_EVENT_DISCONNECTED,
            0,
            Vec::new(),
            0,
            0,
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_events_map_as_iwarp_rdma_cm_reports_them() {
        let est = CmEvent::Established {
            private_data: b"hi".to_vec(),
            ird: 300,
            ord: 4,
            crc: false,
            revision: 2,
        };
        let m = map(&est, IdState::Connecting).unwrap();
        assert_eq!(
            (m.1, m.2, m.3.as_slice(), m.4, m.5),
            (RDMA_CM_EVENT_ESTABLISHED, 0, &b"hi"[..], 255, 4)
        );
        let rej = CmEvent::Rejected {
            private_data: b"no".to_vec(),
        };
        let m = map(&rej, IdState::Connecting).unwrap();
        assert_eq!(
            (m.1, m.2, m.3.as_slice()),
            (RDMA_CM_EVENT_REJECTED, -libc::ECONNREFUSED, &b"no"[..])
        );
        let m = map(
            &CmEvent::ConnectError("connection refused".into()),
            IdState::Connecting,
        )
        .unwrap();
        assert_eq!((m.1, m.2), (RDMA_CM_EVENT_REJECTED, -libc::ECONNREFUSED));
        let m = map(
            &CmEvent::ConnectError("connect timed out".into()),
            IdState::Connecting,
        )
        .unwrap();
        assert_eq!((m.1, m.2), (RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT));
        let m = map(
            &CmEvent::ConnectError("bad MPA Reply".into()),
            IdState::Connecting,
        )
        .unwrap();
        assert_eq!((m.1, m.2), (RDMA_CM_EVENT_CONNECT_ERROR, -libc::ECONNRESET));
        let m = map(&CmEvent::Error("reset".into()), IdState::Connected).unwrap();
        assert_eq!(
            (m.0, m.1),
            (EngineEvent::Disconnected, RDMA_CM_EVENT_DISCONNECTED)
        );
        assert!(map(&CmEvent::Error("x".into()), IdState::Listening).is_none());
        assert!(map(&CmEvent::Error("x".into()), IdState::Accepting).is_some());
        let t = CmEvent::TerminateReceived {
            layer: 0,
            etype: 1,
            code: 2,
        };
        assert!(map(&t, IdState::Connected).is_none());
        assert_eq!(
            map(&CmEvent::Disconnected, IdState::Connected).unwrap().1,
            RDMA_CM_EVENT_DISCONNECTED
        );
    }
}
