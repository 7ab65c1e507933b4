//! Hostile callers of the shim (no root needed): signal handlers calling into it from a
//! thread that holds its locks, `fork` while other threads hold them, `dup2` onto a live
//! connection, aliased iovecs.
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libc::c_int;

use crate::sock::tests::{client_read_to_end, client_write, connected, wait_for};
use crate::sock::{self, Bound, Sock};

/// Descriptor numbers no real descriptor of the test process reaches (below
/// [`super::FD_BITS`], so they have ownership bits).
const FAKE_FD: RawFd = 900_000;

static PIPE_W: AtomicI32 = AtomicI32::new(-1);
static ENGINE_FD: AtomicI32 = AtomicI32::new(-1);
static HANDLED: AtomicU64 = AtomicU64::new(0);
static DEADLK: AtomicU64 = AtomicU64::new(0);

/// A program's signal handler: a byte to its self-pipe through the shim's `write`, and
/// one to an engine connection when there is one.
extern "C" fn handler(_sig: c_int) {
    let b = [1u8];
    // SAFETY: a byte from a local buffer; the descriptors are the test's.
    unsafe {
        let p = PIPE_W.load(Ordering::SeqCst);
        if p >= 0 {
            crate::io::write(p, b.as_ptr().cast(), 1);
        }
        let e = ENGINE_FD.load(Ordering::SeqCst);
        if e >= 0
            && crate::io::write(e, b.as_ptr().cast(), 1) < 0
            && crate::errno::last_errno() == libc::EDEADLK
        {
            DEADLK.fetch_add(1, Ordering::SeqCst);
        }
    }
    HANDLED.fetch_add(1, Ordering::SeqCst);
}

fn install(sig: c_int) {
    // SAFETY: installing a plain extern "C" handler.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as extern "C" fn(c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

/// Run `work` on a thread while another thread sends it `sig` as fast as it can; `true`
/// if `work` finished within `limit` (a deadlocked thread is left behind).
fn under_signals(sig: c_int, limit: Duration, work: impl FnOnce() + Send + 'static) -> bool {
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // SAFETY: our own thread id.
        tx.send(unsafe { libc::pthread_self() }).unwrap();
        work();
        d2.store(true, Ordering::SeqCst);
    });
    let target = rx.recv().unwrap();
    let deadline = Instant::now() + limit;
    while !done.load(Ordering::SeqCst) {
        if Instant::now() >= deadline {
            return false;
        }
        // SAFETY: the worker thread is alive until `done` (it never exits otherwise).
        unsafe { libc::pthread_kill(target, sig) };
        std::thread::sleep(Duration::from_micros(50));
    }
    true
}

fn bound() -> Arc<Sock> {
    Arc::new(Sock::Bound(Mutex::new(Bound {
        addr: "10.79.0.1:9".parse().unwrap(),
        domain: libc::AF_INET,
        listening: None,
        kernel_listening: false,
        epoll: Vec::new(),
    })))
}

#[test]
fn hostile_signal_handler_writing_its_self_pipe_while_its_thread_mutates_the_fd_table_does_not_deadlock(
) {
    let mut p = [-1 as c_int; 2];
    // SAFETY: out array of two descriptors.
    assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_NONBLOCK) }, 0);
    PIPE_W.store(p[1], Ordering::SeqCst);
    install(libc::SIGUSR1);
    let before = HANDLED.load(Ordering::SeqCst);
    let reader = p[0];
    // The program's thread creates and closes sockets (the table locked for writing)
    // and reads its self-pipe, in a loop.
    let finished = under_signals(libc::SIGUSR1, Duration::from_secs(60), move || {
        let mut b = [0u8; 256];
        for i in 0..20_000 {
            let fd = FAKE_FD + (i % 8);
            sock::insert(fd, bound());
            sock::remove(fd);
            // SAFETY: our pipe, a local buffer.
            unsafe { crate::io::read(reader, b.as_mut_ptr().cast(), b.len()) };
        }
    });
    assert!(
        finished,
        "a handler's write to its self-pipe deadlocked the thread"
    );
    assert!(
        HANDLED.load(Ordering::SeqCst) > before,
        "no signal was handled"
    );
    PIPE_W.store(-1, Ordering::SeqCst);
}

#[test]
fn hostile_signal_handler_writing_an_engine_socket_its_thread_is_reading_does_not_deadlock() {
    let (_a, _b, st, mut client) = connected();
    wait_for("established", Duration::from_secs(5), || {
        client.poll_connect().unwrap_or(false)
    });
    // SAFETY: a new descriptor for the connection, as the shim places it.
    let fd = unsafe { libc::dup(st.common.evfd) };
    let s = Arc::new(Sock::Stream(st));
    sock::insert(fd, s.clone());
    ENGINE_FD.store(fd, Ordering::SeqCst);
    install(libc::SIGUSR2);
    let s2 = s.clone();
    // The program's thread polls and reads the connection (its lock held) in a loop.
    let finished = under_signals(libc::SIGUSR2, Duration::from_secs(60), move || {
        let Sock::Stream(st) = &*s2 else {
            unreachable!()
        };
        let mut b = [0u8; 64];
        for _ in 0..20_000 {
            st.readiness(libc::POLLIN | libc::POLLOUT);
            let _ = st.read_once(&mut [&mut b[..]], false);
        }
    });
    ENGINE_FD.store(-1, Ordering::SeqCst);
    assert!(
        finished,
        "a handler's write to an engine socket deadlocked the thread"
    );
    sock::remove(fd);
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    // The handler's bytes that went through arrived (the connection still works).
    let _ = client.try_read(&mut [0u8; 64]);
}

/// Wait (bounded) for child `pid`: `true` if it exited with status 0 in time (else it is
/// killed).
fn child_finished(pid: libc::pid_t, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut status: c_int = 0;
    loop {
        // SAFETY: our own child; status is a local.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        }
        if Instant::now() >= deadline {
            // SAFETY: our own child, stuck.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn hostile_fork_while_threads_hammer_epoll_ctl_socket_buffers_and_the_engine_lock_leaves_children_that_finish(
) {
    // SAFETY: plain descriptor creation.
    let (epfd, efd) = unsafe {
        (
            libc::epoll_create1(libc::EPOLL_CLOEXEC),
            libc::eventfd(0, libc::EFD_CLOEXEC),
        )
    };
    assert!(epfd >= 0 && efd >= 0);
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    let mut hammers = Vec::new();
    {
        // epoll_ctl on a shim descriptor, in and out of the registrations.
        let (stop, rounds) = (stop.clone(), rounds.clone());
        hammers.push(std::thread::spawn(move || {
            let s = bound();
            while !stop.load(Ordering::SeqCst) {
                let ev = libc::epoll_event {
                    events: libc::EPOLLIN as u32,
                    u64: 1,
                };
                crate::epoll::ctl(epfd, libc::EPOLL_CTL_ADD, efd, s.clone(), Some(ev));
                crate::epoll::ctl(epfd, libc::EPOLL_CTL_DEL, efd, s.clone(), None);
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    {
        // Socket creation: buffer sizes remembered on kernel sockets, then taken.
        let (stop, rounds) = (stop.clone(), rounds.clone());
        hammers.push(std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                sock::remember_buffer(FAKE_FD + 100, true, 8192);
                sock::take_buffers(FAKE_FD + 100);
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    {
        // The engine's state (held by a thread starting the engine).
        let stop = stop.clone();
        hammers.push(std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let g = crate::engine::lock_engine();
                std::thread::sleep(Duration::from_micros(20));
                drop(g);
            }
        }));
    }
    // One registration stays, so that the child's epoll calls take the registry.
    // SAFETY: plain descriptor creation.
    let (epfd2, efd2) = unsafe { (libc::epoll_create1(0), libc::eventfd(0, 0)) };
    let ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 2,
    };
    assert_eq!(
        crate::epoll::ctl(epfd2, libc::EPOLL_CTL_ADD, efd2, bound(), Some(ev)),
        0
    );
    wait_for("hammers", Duration::from_secs(5), || {
        rounds.load(Ordering::Relaxed) > 1000
    });
    let mut stuck = 0;
    for _ in 0..150 {
        crate::fork::prepare();
        // SAFETY: fork; the child only uses the shim and `_exit`s.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            crate::fork::child();
            // The child uses the shim: an epoll set made and closed, socket buffers, the
            // engine's state.
            // SAFETY: the child's own descriptors; `_exit` without unwinding.
            unsafe {
                let ep = libc::epoll_create1(0);
                let ev = libc::epoll_event {
                    events: libc::EPOLLIN as u32,
                    u64: 3,
                };
                crate::epoll::ctl(ep, libc::EPOLL_CTL_ADD, efd2, bound(), Some(ev));
                crate::lifecycle::close(ep);
                crate::lifecycle::close(epfd2);
                sock::remember_buffer(FAKE_FD + 200, false, 4096);
                sock::take_buffers(FAKE_FD + 200);
                drop(crate::engine::lock_engine());
                libc::_exit(0);
            }
        }
        crate::fork::parent();
        assert!(pid > 0, "fork failed");
        if !child_finished(pid, Duration::from_secs(10)) {
            stuck += 1;
        }
    }
    stop.store(true, Ordering::SeqCst);
    for h in hammers {
        h.join().unwrap();
    }
    crate::epoll::forget_epfd(epfd2);
    // SAFETY: our descriptors.
    unsafe {
        libc::close(epfd);
        libc::close(efd);
        libc::close(epfd2);
        libc::close(efd2);
    }
    assert_eq!(stuck, 0, "children hung on a lock held at fork");
}

#[test]
fn hostile_dup2_onto_a_connection_with_unread_input_resets_it_like_close() {
    let (_a, _b, st, mut client) = connected();
    wait_for("established", Duration::from_secs(5), || {
        client.poll_connect().unwrap_or(false)
    });
    client_write(&mut client, &[7u8; 1000]);
    wait_for("the request", Duration::from_secs(5), || st.available() > 0);
    // SAFETY: a new descriptor for the connection, as the shim places it.
    let fd = unsafe { libc::dup(st.common.evfd) };
    sock::insert(fd, Arc::new(Sock::Stream(st)));
    let mut p = [-1 as c_int; 2];
    // SAFETY: out array of two descriptors; then dup2 onto the connection's descriptor.
    unsafe {
        assert_eq!(libc::pipe(p.as_mut_ptr()), 0);
        assert_eq!(crate::fdops::dup2(p[0], fd), fd);
    }
    assert!(sock::lookup(fd).is_none(), "fd is the pipe now");
    // Like close with unread input (RFC 2525 §2.17): the peer is reset.
    let (_, end) = client_read_to_end(&mut client);
    let e = end.expect_err("dup2 over a connection with unread input must reset it");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    // SAFETY: our descriptors.
    unsafe {
        libc::close(fd);
        libc::close(p[0]);
        libc::close(p[1]);
    }
}

#[test]
fn hostile_readv_with_aliased_iovecs_leaves_the_later_iovecs_bytes_like_linux() {
    let (_a, _b, st, mut client) = connected();
    wait_for("established", Duration::from_secs(5), || {
        client.poll_connect().unwrap_or(false)
    });
    let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    client_write(&mut client, &data);
    // Let every byte reach the receive ring (not the shim's buffer).
    wait_for("bytes", Duration::from_secs(5), || st.read_hint());
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: a new descriptor for the connection, as the shim places it.
    let fd = unsafe { libc::dup(st.common.evfd) };
    sock::insert(fd, Arc::new(Sock::Stream(st)));
    let mut buf = vec![0u8; 4096];
    let iov = [
        libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: 4096,
        },
        libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: 4096,
        },
    ];
    // SAFETY: two iovecs over the same live buffer.
    let n = unsafe { crate::io::readv(fd, iov.as_ptr(), 2) };
    assert_eq!(n, 8192, "both iovecs filled");
    assert!(buf[..] == data[4096..], "the second iovec's bytes stay");
    sock::remove(fd);
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
}

static LOOKUP_FD: AtomicI32 = AtomicI32::new(-1);

/// A handler calling the data path on an engine descriptor, and asking whether a call
/// changing the table may start, interrupting its thread's own lookups.
extern "C" fn lookup_handler(_sig: c_int) {
    let mut b = [0u8; 1];
    // SAFETY: a local buffer; the descriptor is the test's (the calls fail or do nothing).
    unsafe {
        let e = LOOKUP_FD.load(Ordering::SeqCst);
        if e >= 0 {
            crate::io::read(e, b.as_mut_ptr().cast(), 1);
            crate::io::write(e, b.as_ptr().cast(), 0);
            if sock::refuse_change(&[e], false).is_err() {
                DEADLK.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
    HANDLED.fetch_add(1, Ordering::SeqCst);
}

#[test]
fn hostile_signal_handler_reading_an_engine_socket_while_its_thread_looks_it_up_and_another_changes_the_table_does_not_deadlock(
) {
    let (_a, _b, st, client) = connected();
    wait_for("established", Duration::from_secs(5), || {
        client.poll_connect().unwrap_or(false)
    });
    // SAFETY: a new descriptor for the connection, as the shim places it.
    let fd = unsafe { libc::dup(st.common.evfd) };
    sock::insert(fd, Arc::new(Sock::Stream(st)));
    LOOKUP_FD.store(fd, Ordering::SeqCst);
    // SAFETY: installing a plain extern "C" handler.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = lookup_handler as extern "C" fn(c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGURG, &sa, std::ptr::null_mut());
    }
    // Writers keep wanting the table, so that a lookup's edges find it taken.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                sock::insert(FAKE_FD + 300 + (i % 4), bound());
                sock::remove(FAKE_FD + 300 + (i % 4));
                i += 1;
            }
        })
    };
    let before = HANDLED.load(Ordering::SeqCst);
    // The program's thread looks the connection up (data and control calls) in a loop.
    let finished = under_signals(libc::SIGURG, Duration::from_secs(60), move || {
        let mut b = [0u8; 64];
        for _ in 0..50_000 {
            // SAFETY: a local buffer, the test's descriptor.
            unsafe { crate::io::read(fd, b.as_mut_ptr().cast(), b.len()) };
            assert!(sock::lookup(fd).is_some());
        }
    });
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    LOOKUP_FD.store(-1, Ordering::SeqCst);
    assert!(
        finished,
        "a handler's read of an engine socket deadlocked the thread"
    );
    assert!(
        HANDLED.load(Ordering::SeqCst) > before,
        "no signal was handled"
    );
    assert!(sock::lookup(fd).is_some(), "the connection is still there");
    sock::remove(fd);
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
}
