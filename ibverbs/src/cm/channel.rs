//! Event channels: the queue of CM events a program takes with `rdma_get_cm_event`
//! ([`EventQueue`], sans-IO), the C object around it ([`Channel`], whose `fd` is an eventfd
//! readable exactly while an event is queued, so `poll`/`epoll` work on it), and the event
//! record a program holds until `rdma_ack_cm_event` ([`EventRec`]).

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use core::ffi::c_int;

use super::id::IdCore;
use crate::abi::*;

/// A FIFO of events that knows when its readiness must change: the channel's fd is
/// readable iff the queue is not empty, so the first push signals and the pop that empties
/// it drains.
#[derive(Debug)]
pub struct EventQueue<T> {
    q: VecDeque<T>,
}

impl<T> Default for EventQueue<T> {
    fn default() -> Self {
        EventQueue { q: VecDeque::new() }
    }
}

impl<T> EventQueue<T> {
    /// Queue `e`; `true` if the fd must now become readable.
    pub fn push(&mut self, e: T) -> bool {
        self.q.push_back(e);
        self.q.len() == 1
    }

    /// Take the oldest event; the flag is `true` if the fd must now stop being readable.
    pub fn pop(&mut self) -> (Option<T>, bool) {
        let e = self.q.pop_front();
        let drain = e.is_some() && self.q.is_empty();
        (e, drain)
    }

    /// Remove every event `gone` picks (events of a destroyed id that nobody took); `true`
    /// if the fd must now stop being readable.
    pub fn purge(&mut self, mut gone: impl FnMut(&T) -> bool) -> (Vec<T>, bool) {
        let was = !self.q.is_empty();
        let mut out = Vec::new();
        let mut keep = VecDeque::with_capacity(self.q.len());
        for e in self.q.drain(..) {
            if gone(&e) {
                out.push(e);
            } else {
                keep.push_back(e);
            }
        }
        self.q = keep;
        (out, was && self.q.is_empty())
    }

    /// Events queued.
    pub fn len(&self) -> usize {
        self.q.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
}

/// One event as the program sees it (`struct rdma_cm_event` first, so the pointer handed
/// out is the record) plus what keeps it valid: the private data it points into and the id
/// whose acknowledgement count it holds.
#[repr(C)]
pub(crate) struct EventRec {
    /// The C event.
    pub(crate) c: rdma_cm_event,
    /// The id `rdma_ack_cm_event` credits (the new id for CONNECT_REQUEST).
    pub(crate) owner: Arc<IdCore>,
    /// `c.param.conn.private_data` points here (stable: a boxed slice).
    data: Box<[u8]>,
}

// SAFETY: the raw pointers in `c` are the program's ids; the record is handed between the
// pump thread and the program's threads whole, never shared.
unsafe impl Send for EventRec {}

impl EventRec {
    /// An event of `event` type about `id` (and `listen_id`), with `status` and connection
    /// parameters; `private_data` is copied (at most 255 bytes: the C length is a `u8`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        owner: Arc<IdCore>,
        id: *mut rdma_cm_id,
        listen_id: *mut rdma_cm_id,
        event: rdma_cm_event_type,
        status: c_int,
        private_data: &[u8],
        responder_resources: u8,
        initiator_depth: u8,
    ) -> Box<EventRec> {
        let n = private_data.len().min(255);
        let data: Box<[u8]> = private_data[..n].into();
        let mut rec = Box::new(EventRec {
            c: rdma_cm_event {
                id,
                listen_id,
                event,
                status,
                param: rdma_cm_event_param {
                    conn: rdma_conn_param {
                        private_data: core::ptr::null(),
                        private_data_len: n as u8,
                        responder_resources,
                        initiator_depth,
                        flow_control: 0,
                        retry_count: 0,
                        rnr_retry_count: 0,
                        srq: 0,
                        qp_num: 0,
                    },
                },
            },
            owner,
            data,
        });
        if n > 0 {
            rec.c.param.conn.private_data = rec.data.as_ptr().cast();
        }
        rec
    }
}

/// `struct rdma_event_channel` and its queue. The program holds `&c`; `c.fd` is an eventfd
/// (close-on-exec, blocking unless the program sets `O_NONBLOCK`, which
/// `rdma_get_cm_event` honours with `EAGAIN`).
#[repr(C)]
pub(crate) struct Channel {
    /// The C struct (first: the program's pointer is the channel's).
    pub(crate) c: rdma_event_channel,
    q: Mutex<EventQueue<Box<EventRec>>>,
    efd: OwnedFd,
    /// Ids on this channel (destroying a channel that still has ids is refused).
    pub(crate) users: Mutex<usize>,
    /// Threads blocked in `rdma_get_cm_event` on `fd` (they hold only the fd number).
    pub(crate) waiters: std::sync::atomic::AtomicUsize,
}

impl Channel {
    /// A new channel (boxed: its address is what the program holds).
    pub(crate) fn new() -> std::io::Result<Box<Channel>> {
        // SAFETY: eventfd with valid flags; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        let efd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Box::new(Channel {
            c: rdma_event_channel { fd },
            q: Mutex::new(EventQueue::default()),
            efd,
            users: Mutex::new(0),
            waiters: std::sync::atomic::AtomicUsize::new(0),
        }))
    }

    fn signal(&self) {
        let one = 1u64;
        // SAFETY: an 8-byte write to our eventfd (it cannot block: the counter is 0 or 1).
        let _ = unsafe { libc::write(self.efd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    fn drain(&self) {
        let mut v = 0u64;
        // SAFETY: an 8-byte read from our eventfd, done only while it is readable (the
        // counter is 1), so it does not block even without O_NONBLOCK.
        let _ = unsafe { libc::read(self.efd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    /// Queue an event (makes `fd` readable).
    pub(crate) fn push(&self, e: Box<EventRec>) {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        if q.push(e) {
            self.signal();
        }
    }

    /// Take the next event without waiting.
    pub(crate) fn try_pop(&self) -> Option<Box<EventRec>> {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        let (e, drain) = q.pop();
        if drain {
            self.drain();
        }
        e
    }

    /// Take the next event, waiting while the queue is empty unless the program made `fd`
    /// non-blocking (then `EAGAIN`); an interrupted wait is `EINTR`, as a `read` would be.
    pub(crate) fn pop_wait(&self) -> Result<Box<EventRec>, c_int> {
        loop {
            if let Some(e) = self.try_pop() {
                return Ok(e);
            }
            // SAFETY: F_GETFL on our own descriptor.
            let fl = unsafe { libc::fcntl(self.c.fd, libc::F_GETFL) };
            if fl >= 0 && fl & libc::O_NONBLOCK != 0 {
                return Err(libc::EAGAIN);
            }
            let mut p = libc::pollfd {
                fd: self.c.fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut p, 1, -1) };
            if r < 0 {
                let e = std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO);
                if e != libc::EINTR {
                    return Err(e);
                }
                return Err(libc::EINTR);
            }
        }
    }

    /// Take the oldest queued event of `owner` (for `rdma_migrate_id`).
    pub(crate) fn take_of(&self, owner: &Arc<IdCore>) -> Option<Box<EventRec>> {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        let mut first = true;
        let (mut gone, drain) = q.purge(|e| {
            let hit = first && Arc::ptr_eq(&e.owner, owner);
            if hit {
                first = false;
            }
            hit
        });
        if drain {
            self.drain();
        }
        gone.pop()
    }

    /// Remove the queued (not yet taken) events of `owner`; returns how many.
    pub(crate) fn purge(&self, owner: &Arc<IdCore>) -> usize {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        let (gone, drain) = q.purge(|e| Arc::ptr_eq(&e.owner, owner));
        if drain {
            self.drain();
        }
        gone.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_follows_emptiness() {
        let mut q = EventQueue::default();
        assert!(q.push(1), "first event signals");
        assert!(!q.push(2), "second does not signal again");
        assert_eq!(q.pop(), (Some(1), false));
        assert_eq!(q.pop(), (Some(2), true), "the pop that empties drains");
        assert_eq!(q.pop(), (None, false));
        assert!(q.push(3));
    }

    #[test]
    fn purge_keeps_order_of_the_rest() {
        let mut q = EventQueue::default();
        for i in 0..6 {
            q.push(i);
        }
        let (gone, drain) = q.purge(|e| e % 2 == 0);
        assert_eq!(gone, vec![0, 2, 4]);
        assert!(!drain);
        assert_eq!(q.len(), 3);
        assert_eq!(q.pop().0, Some(1));
        let (gone, drain) = q.purge(|_| true);
        assert_eq!(gone, vec![3, 5]);
        assert!(drain, "emptied by the purge");
        assert!(q.is_empty());
        let (gone, drain) = q.purge(|_| true);
        assert!(gone.is_empty() && !drain, "an empty queue needs no drain");
    }

    fn readable(fd: c_int) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    #[test]
    fn channel_fd_is_readable_while_events_wait_and_nonblock_is_eagain() {
        let ch = Channel::new().unwrap();
        let owner = IdCore::new_for_test();
        assert!(!readable(ch.c.fd));
        ch.push(EventRec::new(
            owner.clone(),
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            9,
            0,
            b"hello",
            3,
            4,
        ));
        ch.push(EventRec::new(
            owner.clone(),
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            10,
            0,
            &[],
            0,
            0,
        ));
        assert!(readable(ch.c.fd));
        let e = ch.pop_wait().unwrap();
        assert_eq!(e.c.event, RDMA_CM_EVENT_ESTABLISHED);
        // SAFETY: the conn member is the one EventRec::new wrote.
        let conn = unsafe { e.c.param.conn };
        assert_eq!(conn.private_data_len, 5);
        assert_eq!((conn.responder_resources, conn.initiator_depth), (3, 4));
        // SAFETY: private_data points at the record's 5 bytes.
        let pd = unsafe { core::slice::from_raw_parts(conn.private_data.cast::<u8>(), 5) };
        assert_eq!(pd, b"hello");
        assert!(readable(ch.c.fd), "one more queued");
        let e2 = ch.pop_wait().unwrap();
        // SAFETY: as above.
        assert!(unsafe { e2.c.param.conn.private_data }.is_null());
        assert!(!readable(ch.c.fd));
        // SAFETY: F_SETFL on the channel's own fd.
        unsafe { libc::fcntl(ch.c.fd, libc::F_SETFL, libc::O_NONBLOCK) };
        assert_eq!(ch.pop_wait().err(), Some(libc::EAGAIN));
        ch.push(EventRec::new(
            owner.clone(),
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            1,
            -101,
            &[],
            0,
            0,
        ));
        assert_eq!(ch.purge(&owner), 1);
        assert!(!readable(ch.c.fd));
    }

    #[test]
    fn blocking_pop_wakes_on_push_from_another_thread() {
        let ch: &'static Channel = Box::leak(Channel::new().unwrap());
        let owner = IdCore::new_for_test();
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            ch.push(EventRec::new(
                owner,
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                2,
                0,
                &[],
                0,
                0,
            ));
        });
        let e = ch.pop_wait().unwrap();
        assert_eq!(e.c.event, RDMA_CM_EVENT_ROUTE_RESOLVED);
        t.join().unwrap();
    }

    #[test]
    fn private_data_is_capped_at_the_c_length() {
        let owner = IdCore::new_for_test();
        let big = [7u8; 300];
        let e = EventRec::new(
            owner,
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            8,
            -111,
            &big,
            0,
            0,
        );
        // SAFETY: the conn member is the one EventRec::new wrote.
        assert_eq!(unsafe { e.c.param.conn.private_data_len }, 255);
    }
}
