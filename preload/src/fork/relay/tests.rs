//! The relay pump over two engines joined by the virtual wire and a socketpair standing
//! for the child's end (no root, no fork needed).
use super::*;
use crate::fork::make_pair;
use crate::sock::tests::connected;
use std::sync::atomic::AtomicBool;
use xwarp_stack::Stream;

const MIB: usize = 1 << 20;

fn pattern(seed: u8, i: usize) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 9) as u8)
}

/// The relay serving `sock` on a thread; returns the child's end (blocking), the
/// stop switch and the thread.
struct Running {
    child: RawFd,
    /// Bytes the relay holds for the children (its engine → child buffers), as of its
    /// last turn.
    held: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    wake: RawFd,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    fn start(sock: Arc<Sock>) -> Running {
        let Sock::Stream(st) = &*sock else {
            panic!("not a stream")
        };
        // The test's server socket is non-blocking: the child's end follows that view.
        let (p, c, evfd) = make_pair(st).expect("socketpair");
        // SAFETY: our descriptor.
        let fl = unsafe { libc::fcntl(c, libc::F_GETFL) };
        assert!(fl & libc::O_NONBLOCK != 0, "O_NONBLOCK view not applied");
        // SAFETY: our descriptor; the test reads it blocking.
        unsafe { libc::fcntl(c, libc::F_SETFL, fl & !libc::O_NONBLOCK) };
        let mut relay = Relay::new().expect("relay");
        let wake = relay.wake;
        relay.adopt(NewPair {
            unix: p,
            evfd,
            sock,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let held = Arc::new(AtomicUsize::new(0));
        let h2 = held.clone();
        let thread = std::thread::spawn(move || {
            while !s2.load(Ordering::SeqCst) {
                relay.turn();
                let n = relay.pairs.values().map(|p| p.to_child.data().len()).sum();
                h2.store(n, Ordering::SeqCst);
            }
        });
        Running {
            child: c,
            held,
            stop,
            wake,
            thread: Some(thread),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        signal(self.wake);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if self.child >= 0 {
            // SAFETY: our descriptor.
            unsafe { libc::close(self.child) };
        }
    }
}

fn established(client: &Stream) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !client.poll_connect().expect("connect") {
        assert!(Instant::now() < deadline, "never established");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Write `n` pattern bytes on an engine stream (blocking).
fn engine_write(s: &mut Stream, seed: u8, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let data: Vec<u8> = (0..n).map(|i| pattern(seed, i)).collect();
    let mut off = 0;
    while off < n {
        match s.try_write(&data[off..]) {
            Ok(k) => off += k,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                s.wait(Some(Instant::now() + Duration::from_millis(5)))
                    .unwrap();
            }
            Err(e) => panic!("engine write: {e}"),
        }
        assert!(Instant::now() < deadline, "engine write stalled");
    }
}

/// Read from an engine stream until `n` bytes or end of stream; returns the bytes.
fn engine_read(s: &mut Stream, n: usize, limit: Duration) -> (Vec<u8>, bool) {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    while got.len() < n {
        match s.try_read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    break;
                }
                s.wait(Some(Instant::now() + Duration::from_millis(5)))
                    .unwrap();
            }
            Err(e) => panic!("engine read: {e}"),
        }
    }
    (got, false)
}

fn unix_write_all(fd: RawFd, data: &[u8]) {
    let mut off = 0;
    while off < data.len() {
        // SAFETY: our buffer.
        let n = unsafe {
            libc::send(
                fd,
                data[off..].as_ptr().cast(),
                data.len() - off,
                libc::MSG_NOSIGNAL,
            )
        };
        assert!(n > 0, "unix write: {}", io::Error::last_os_error());
        off += n as usize;
    }
}

/// Blocking read of up to `n` bytes (stops at end of stream).
fn unix_read(fd: RawFd, n: usize) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    while got.len() < n {
        let want = buf.len().min(n - got.len());
        // SAFETY: our buffer.
        let k = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), want) };
        assert!(k >= 0, "unix read: {}", io::Error::last_os_error());
        if k == 0 {
            return (got, true);
        }
        got.extend_from_slice(&buf[..k as usize]);
    }
    (got, false)
}

fn set_timeout(fd: RawFd, secs: i64) {
    let tv = libc::timeval {
        tv_sec: secs,
        tv_usec: 0,
    };
    // SAFETY: a timeval.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn buffer_compacts_and_stays_bounded() {
    let mut b = Buf::new(8);
    assert!(b.is_empty() && b.has_room());
    b.room()[..6].copy_from_slice(b"abcdef");
    b.fill(6);
    b.consume(4);
    assert_eq!(b.data(), b"ef");
    assert_eq!(b.room().len(), 2);
    b.room()[..2].copy_from_slice(b"gh");
    b.fill(2);
    // End reached: the next room() compacts.
    assert_eq!(b.room().len(), 4);
    assert_eq!(b.data(), b"efgh");
    b.fill(100);
    assert!(!b.has_room());
    assert_eq!(b.data().len(), 8);
    b.consume(100);
    assert!(b.is_empty());
}

#[test]
fn relay_moves_a_mib_each_way_and_propagates_half_close_both_ways() {
    let (_a, _b, st, mut client) = connected();
    established(&client);
    let sock = Arc::new(Sock::Stream(st));
    let r = Running::start(sock.clone());
    set_timeout(r.child, 10);
    // The parent's copy is closed right away (accept-then-fork): the relay's reference
    // keeps the connection open.
    sock::retire(sock.clone());
    let weak = Arc::downgrade(&sock);
    drop(sock);
    // engine → child, 1 MiB verified.
    let writer = std::thread::spawn(move || {
        engine_write(&mut client, 7, MIB);
        client
    });
    let (got, eof) = unix_read(r.child, MIB);
    assert!(!eof, "early end of stream after {} bytes", got.len());
    assert!(got.iter().enumerate().all(|(i, &b)| b == pattern(7, i)));
    let mut client = writer.join().unwrap();
    // child → engine, 1 MiB verified (written on another thread: the relay's buffers
    // are bounded, so the child's writes wait for the engine side to read).
    let child = r.child;
    let w = std::thread::spawn(move || {
        let data: Vec<u8> = (0..MIB).map(|i| pattern(9, i)).collect();
        unix_write_all(child, &data);
    });
    let (got, eof) = engine_read(&mut client, MIB, Duration::from_secs(20));
    w.join().unwrap();
    assert!(!eof);
    assert_eq!(got.len(), MIB);
    assert!(got.iter().enumerate().all(|(i, &b)| b == pattern(9, i)));
    // Peer half-closes: the child sees end of stream and can still reply.
    client.shutdown_write().unwrap();
    let (rest, eof) = unix_read(r.child, 1);
    assert!(rest.is_empty() && eof, "child did not see end of stream");
    unix_write_all(r.child, b"reply after eof");
    let (got, _) = engine_read(&mut client, 15, Duration::from_secs(10));
    assert_eq!(got, b"reply after eof");
    // The child shuts down writing: the peer sees end of stream.
    // SAFETY: our descriptor.
    unsafe { libc::shutdown(r.child, libc::SHUT_WR) };
    let (got, eof) = engine_read(&mut client, 1, Duration::from_secs(10));
    assert!(got.is_empty() && eof, "peer did not see the FIN");
    // Both directions done: the relay let go of the connection.
    wait_until("the relay to release the connection", || {
        weak.strong_count() == 0
    });
}

#[test]
fn child_closing_its_copy_leaves_the_connection_to_the_parent_until_it_closes_too() {
    let (_a, _b, st, mut client) = connected();
    established(&client);
    let sock = Arc::new(Sock::Stream(st));
    let mut r = Running::start(sock.clone());
    unix_write_all(r.child, b"from child");
    // SAFETY: our descriptor (the child exits, or execs with FD_CLOEXEC).
    unsafe { libc::close(r.child) };
    r.child = -1;
    let (got, eof) = engine_read(&mut client, 10, Duration::from_secs(10));
    assert_eq!(got, b"from child");
    assert!(!eof);
    // Only the parent's reference remains; no FIN was sent for the child's close.
    wait_until("the relay to let go", || Arc::strong_count(&sock) == 1);
    let (got, eof) = engine_read(&mut client, 1, Duration::from_millis(300));
    assert!(
        got.is_empty() && !eof,
        "connection closed by the child's close"
    );
    // The parent still uses it.
    let Sock::Stream(st) = &*sock else {
        unreachable!()
    };
    assert_eq!(st.write_once(&[b"from parent"]), Ok(11));
    let (got, _) = engine_read(&mut client, 11, Duration::from_secs(10));
    assert_eq!(got, b"from parent");
    // The parent's close is the last: FIN.
    sock::retire(sock);
    let (got, eof) = engine_read(&mut client, 1, Duration::from_secs(10));
    assert!(got.is_empty() && eof, "no FIN after the last close");
}

#[test]
fn child_that_closed_its_copy_takes_no_bytes_meant_for_a_sibling() {
    // fork + exec (FD_CLOEXEC closes the first child's copy), then a second fork whose
    // child serves the connection. The request arrives before the relay has looked at
    // the first pair since its child closed; the first pair is stepped first.
    let (_a, _b, st, mut client) = connected();
    established(&client);
    let sock = Arc::new(Sock::Stream(st));
    let Sock::Stream(st) = &*sock else {
        unreachable!()
    };
    let (p1, c1, e1) = make_pair(st).expect("socketpair");
    let (p2, c2, e2) = make_pair(st).expect("socketpair");
    let mut relay = Relay::new().expect("relay");
    for (unix, evfd) in [(p1, e1), (p2, e2)] {
        relay.adopt(NewPair {
            unix,
            evfd,
            sock: sock.clone(),
        });
    }
    // SAFETY: our descriptors (the exec'd child's copy goes; the second child reads
    // blocking, with a timeout).
    unsafe {
        libc::close(c1);
        let fl = libc::fcntl(c2, libc::F_GETFL);
        libc::fcntl(c2, libc::F_SETFL, fl & !libc::O_NONBLOCK);
    }
    set_timeout(c2, 5);
    engine_write(&mut client, 5, 100);
    // Wait until the bytes are at the server socket (a peek leaves them there).
    let mut peek = [0u8; 100];
    wait_until("the request to arrive", || {
        st.read_once(&mut [&mut peek[..]], true) == Ok(100)
    });
    for _ in 0..3 {
        relay.turn();
    }
    let (got, eof) = unix_read(c2, 100);
    assert!(!eof, "second child saw end of stream");
    assert_eq!(got.len(), 100, "request lost to the closed first child");
    assert!(got.iter().enumerate().all(|(i, &b)| b == pattern(5, i)));
    // The first pair is finished (its child is gone), the second still serves.
    assert_eq!(relay.pairs.len(), 1);
    drop(relay);
    // SAFETY: our descriptor.
    unsafe { libc::close(c2) };
}

#[test]
fn connection_reset_closes_the_childs_end() {
    let (_a, _b, st, mut client) = connected();
    established(&client);
    let sock = Arc::new(Sock::Stream(st));
    let r = Running::start(sock.clone());
    set_timeout(r.child, 10);
    engine_write(&mut client, 1, 100);
    let (got, _) = unix_read(r.child, 100);
    assert!(got.iter().enumerate().all(|(i, &b)| b == pattern(1, i)));
    client.abort().unwrap();
    // The child sees its end closed (end of stream or ECONNRESET), not a hang.
    let mut b = [0u8; 16];
    // SAFETY: our buffer.
    let n = unsafe { libc::read(r.child, b.as_mut_ptr().cast(), 16) };
    let e = io::Error::last_os_error().raw_os_error();
    assert!(
        n == 0 || (n < 0 && e == Some(libc::ECONNRESET)),
        "read after reset: {n} {e:?}"
    );
    wait_until("the relay to let go", || Arc::strong_count(&sock) == 1);
}

#[test]
fn child_closing_with_unread_bytes_hands_the_relays_bytes_back_to_the_parent() {
    let (_a, _b, st, mut client) = connected();
    established(&client);
    let sock = Arc::new(Sock::Stream(st));
    let mut r = Running::start(sock.clone());
    // The peer sends 1 MiB and ends; the child reads none of it.
    let writer = std::thread::spawn(move || {
        engine_write(&mut client, 3, MIB);
        client.shutdown_write().unwrap();
        client
    });
    // The child's socket fills up, then the relay's own buffer.
    wait_until("the child's socket to fill", || {
        let mut n: c_int = 0;
        // SAFETY: FIONREAD into an int.
        unsafe { libc::ioctl(r.child, libc::FIONREAD, &mut n) };
        n > 64 << 10
    });
    // Then the relay's own buffer: wait until it is full (the child reads nothing, so
    // it only grows), so the close below always has bytes to hand back.
    wait_until("the relay's buffer to fill", || {
        r.held.load(Ordering::SeqCst) == RELAY_BUF
    });
    // SAFETY: our descriptor (the child exits without reading).
    unsafe { libc::close(r.child) };
    r.child = -1;
    wait_until("the relay to let go", || Arc::strong_count(&sock) == 1);
    let Sock::Stream(st) = &*sock else {
        unreachable!()
    };
    // The hand-back happened: the relay's bytes wait in the shim's own buffer (a
    // probe of the ring alone never puts more than 16 KiB there).
    assert!(
        st.buffered() >= RELAY_BUF,
        "the relay's {RELAY_BUF} bytes were not handed back: {} buffered",
        st.buffered()
    );
    // The parent reads on: what the relay held comes first, then the rest, in order.
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match st.read_once(&mut [&mut buf[..]], false) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(libc::EAGAIN) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("parent read: {e}"),
        }
        assert!(Instant::now() < deadline, "parent read stalled");
    }
    let client = writer.join().unwrap();
    // Only what already sat in the child's socket is gone: the parent got the exact
    // tail of the stream, including the relay's buffered bytes (64 KiB).
    let lost = MIB - got.len();
    assert!(
        got.len() >= RELAY_BUF,
        "relay's bytes lost: got {}",
        got.len()
    );
    assert!(lost > 0, "the child's socket held nothing");
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, &b)| b == pattern(3, lost + i)),
        "the parent's bytes are not the tail of the stream"
    );
    // Bytes were lost unread: the last close resets the connection.
    sock::retire(sock);
    let deadline = Instant::now() + Duration::from_secs(5);
    while client.error().is_none() {
        assert!(Instant::now() < deadline, "no reset after losing input");
        let _ = client.wait(Some(Instant::now() + Duration::from_millis(5)));
    }
    assert_eq!(
        client.error().map(|e| e.to_io().kind()),
        Some(io::ErrorKind::ConnectionReset)
    );
}
