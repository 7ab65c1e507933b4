//! The readiness-descriptor invariants over two engines joined by the virtual wire
//! (no root needed).
use super::*;
use crate::wait::{block_hinted, spawn_with_signals_blocked};
use std::net::Ipv4Addr;
use xwarp_poll_driver::engine::{EngineConfig, EngineHandle};
use xwarp_poll_driver::vwire::{VirtualNic, VirtualWire, WireConfig};
use xwarp_stack::builder::{EngineBuilder, RunningEngine};
use xwarp_stack::{StackConfig, StackHandle, TcpService};

/// One engine over the virtual wire.
pub(crate) struct End {
    stack: StackHandle,
    _engine: EngineHandle<VirtualNic, TcpService>,
}

pub(crate) fn pair() -> (End, End) {
    let (a, b) = VirtualWire::pair(WireConfig::default()).unwrap();
    let start = |nic: VirtualNic, last: u8| {
        let cfg = StackConfig {
            mac: [0x02, 0x78, 0x70, 0, 0, last],
            ipv4: Some((Ipv4Addr::new(10, 79, 0, last), 24)),
            ..StackConfig::default()
        };
        let RunningEngine { stack, engine } = EngineBuilder::new(nic, cfg, EngineConfig::default())
            .spawn()
            .unwrap();
        End {
            stack,
            _engine: engine,
        }
    };
    (start(a, 1), start(b, 2))
}

/// `true` if `fd` polls readable within `ms`.
fn fd_readable(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}

/// Two engines, a server-side `StreamSock` and the client `Stream` connected to it.
/// `n` connections from `a` to a listener of `b` at `addr`: (server sockets, clients).
pub(crate) fn accept_n(
    a: &End,
    b: &End,
    addr: SocketAddr,
    n: usize,
) -> (Vec<StreamSock>, Vec<Stream>) {
    let ls = b.stack.listen(addr, n, Duration::from_secs(5)).unwrap();
    let l = ListenerSock::new(ls, libc::AF_INET, true, Opts::default());
    let clients: Vec<Stream> = (0..n)
        .map(|_| a.stack.connect(addr, None, None).unwrap())
        .collect();
    let ring = b.stack.config().ring_size;
    let mut servers = Vec::with_capacity(n);
    let deadline = Instant::now() + Duration::from_secs(10);
    while servers.len() < n {
        match l.accept_once() {
            Ok(s) => servers.push(StreamSock::new(
                s,
                libc::AF_INET,
                true,
                Opts::default(),
                ring,
            )),
            Err(libc::EAGAIN) => {
                assert!(Instant::now() < deadline, "only {} accepted", servers.len());
                fd_readable(l.common.evfd, 50);
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
    (servers, clients)
}

pub(crate) fn connected() -> (End, End, StreamSock, Stream) {
    let (a, b) = pair();
    let addr = "10.79.0.2:7000".parse().unwrap();
    let ls = b.stack.listen(addr, 8, Duration::from_secs(5)).unwrap();
    let l = ListenerSock::new(ls, libc::AF_INET, true, Opts::default());
    assert_eq!(l.readiness(), 0, "no connection yet");
    let client = a.stack.connect(addr, None, None).unwrap();
    // The listener's descriptor fires once the connection is queued.
    assert!(fd_readable(l.common.evfd, 5000), "listener fd never fired");
    assert_eq!(l.readiness(), libc::POLLIN);
    let server = l.accept_once().unwrap();
    assert_eq!(l.accept_once().err(), Some(libc::EAGAIN));
    let ring = b.stack.config().ring_size;
    let st = StreamSock::new(server, libc::AF_INET, true, Opts::default(), ring);
    (a, b, st, client)
}

#[test]
fn options_turn_into_engine_keepalive_linger_and_doubled_buffers() {
    let mut o = Opts::default();
    assert_eq!(o.keepalive_engine(), None);
    assert_eq!((o.keepidle(), o.keepintvl(), o.keepcnt()), (7200, 75, 9));
    o.keepalive = 1;
    o.keepidle = 10;
    o.keepcnt = 3;
    let k = o.keepalive_engine().unwrap();
    assert_eq!(k.idle, Duration::from_secs(10));
    assert_eq!(k.interval, Duration::from_secs(75));
    assert_eq!(k.dead_after(), Duration::from_secs(10 + 225));
    assert_eq!(o.linger_policy(), None);
    o.linger = (1, 0);
    assert_eq!(o.linger_policy(), Some(Duration::ZERO));
    o.linger = (1, 7);
    assert_eq!(o.linger_policy(), Some(Duration::from_secs(7)));
    // Buffer sizes set on a kernel socket are remembered doubled, once.
    remember_buffer(90_001, true, 8192);
    remember_buffer(90_001, false, 1);
    assert_eq!(take_buffers(90_001), (Some(16384), Some(4608)));
    assert_eq!(take_buffers(90_001), (None, None));
    o.rcvbuf = Some(16384);
    assert_eq!(o.engine().recv_buffer, Some(16384));
    assert_eq!(o.engine().keepalive, Some(k));
}

#[test]
fn spinning_blocking_read_gets_bytes_through_the_hint_and_sleeps_after_the_budget() {
    let (_a, _b, st, mut client) = connected();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !client.poll_connect().unwrap() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!st.read_hint(), "hint with nothing to read");
    // A reader spinning for 2 s (on the hint, not on the eventfd) gets bytes written
    // while it spins.
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut buf = [0u8; 64];
            let n = block_hinted(
                st.common.evfd,
                Duration::from_secs(2),
                Some(Duration::from_secs(5)),
                || st.read_hint(),
                || st.read_once(&mut [&mut buf[..]], false),
            )
            .unwrap();
            buf[..n].to_vec()
        });
        std::thread::sleep(Duration::from_millis(20));
        client.try_write(b"ping").unwrap();
        assert_eq!(reader.join().unwrap(), b"ping");
    });
    assert!(!st.read_hint(), "hint after the bytes were consumed");
    // Past a zero spin budget the read sleeps on the descriptor and still wakes for
    // new bytes; with nothing coming the timeout ends it with EAGAIN.
    let t = Instant::now();
    let mut buf = [0u8; 8];
    let r = block_hinted(
        st.common.evfd,
        Duration::ZERO,
        Some(Duration::from_millis(30)),
        || st.read_hint(),
        || st.read_once(&mut [&mut buf[..]], false),
    );
    assert_eq!(r, Err(libc::EAGAIN));
    assert!(t.elapsed() >= Duration::from_millis(30));
    client.try_write(b"pong").unwrap();
    let n = block_hinted(
        st.common.evfd,
        Duration::ZERO,
        Some(Duration::from_secs(5)),
        || st.read_hint(),
        || st.read_once(&mut [&mut buf[..]], false),
    )
    .unwrap();
    assert_eq!(&buf[..n], b"pong");
    // End of stream shows in the hint.
    client.shutdown_write().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !st.read_hint() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(st.read_hint(), "no hint for end of stream");
    assert_eq!(st.read_once(&mut [&mut buf[..]], false), Ok(0));
}

#[test]
fn descriptor_is_readable_exactly_while_bytes_wait_and_wakes_on_new_bytes() {
    let (_a, _b, st, mut client) = connected();
    let evfd = st.common.evfd;
    // Nothing to read: the probe drains the descriptor and registers interest.
    assert_eq!(st.readiness(libc::POLLIN) & libc::POLLIN, 0);
    assert!(
        !fd_readable(evfd, 0),
        "descriptor readable with nothing to read"
    );
    // Bytes arrive: the descriptor fires by itself (no probe needed).
    let deadline = Instant::now() + Duration::from_secs(5);
    while !client.poll_connect().unwrap() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    client.try_write(b"hello world").unwrap();
    assert!(fd_readable(evfd, 5000), "no wakeup for new bytes");
    assert!(st.readiness(libc::POLLIN) & libc::POLLIN != 0);
    // A partial read leaves the rest readable and the descriptor still readable
    // (level-triggered pollers must see it).
    let mut five = [0u8; 5];
    assert_eq!(st.read_once(&mut [&mut five[..]], false), Ok(5));
    assert_eq!(&five, b"hello");
    assert!(fd_readable(evfd, 0));
    // MSG_PEEK leaves the bytes in place.
    let mut peek = [0u8; 64];
    assert_eq!(st.read_once(&mut [&mut peek[..]], true), Ok(6));
    let mut rest = [0u8; 64];
    assert_eq!(st.read_once(&mut [&mut rest[..]], false), Ok(6));
    assert_eq!(&rest[..6], b" world");
    assert_eq!(st.read_once(&mut [&mut rest[..]], false), Err(libc::EAGAIN));
    assert!(!fd_readable(evfd, 0), "descriptor readable after EAGAIN");
    // A short read registered interest: the next bytes signal again (edge for nginx).
    client.try_write(b"again").unwrap();
    assert!(fd_readable(evfd, 5000), "no wakeup after a short read");
    let mut v = [0u8; 3];
    let mut w = [0u8; 8];
    assert_eq!(st.read_once(&mut [&mut v[..], &mut w[..]], false), Ok(5));
    assert_eq!((&v[..], &w[..2]), (&b"aga"[..], &b"in"[..]));
    // End of stream: readable with RDHUP, reads return 0.
    client.shutdown_write().unwrap();
    // As a poller does: sleep on the descriptor, re-check (wakeups may be spurious,
    // never lost).
    let deadline = Instant::now() + Duration::from_secs(5);
    let ev = loop {
        assert!(fd_readable(evfd, 5000), "no wakeup for the FIN");
        let ev = st.readiness(libc::POLLIN | libc::POLLOUT);
        if ev & libc::POLLIN != 0 || Instant::now() > deadline {
            break ev;
        }
    };
    assert!(
        ev & libc::POLLIN != 0 && ev & libc::POLLRDHUP != 0,
        "{ev:#x}"
    );
    assert!(
        ev & libc::POLLOUT != 0,
        "still writable after the peer's FIN"
    );
    assert_eq!(st.read_once(&mut [&mut rest[..]], false), Ok(0));
}

#[test]
fn writes_report_eagain_when_the_ring_is_full_and_writability_returns() {
    let (_a, _b, st, mut client) = connected();
    assert!(st.readiness(libc::POLLOUT) & libc::POLLOUT != 0);
    // The client does not read: fill the server's ring and the TCP windows.
    let chunk = vec![0x5au8; 64 << 10];
    let mut sent = 0usize;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match st.write_once(&[&chunk]) {
            Ok(n) => sent += n,
            Err(libc::EAGAIN) => break,
            Err(e) => panic!("write: {e}"),
        }
        assert!(Instant::now() < deadline, "ring never filled");
    }
    assert!(sent >= st.ring_size, "only {sent} bytes queued");
    // Drain on the client; POLLOUT comes back.
    let mut buf = vec![0u8; 1 << 16];
    let mut got = 0usize;
    while got < sent {
        match client.try_read(&mut buf) {
            Ok(n) => {
                assert!(buf[..n].iter().all(|&b| b == 0x5a));
                got += n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                client
                    .wait(Some(Instant::now() + Duration::from_secs(5)))
                    .unwrap();
            }
            Err(e) => panic!("read: {e}"),
        }
        assert!(
            Instant::now() < deadline + Duration::from_secs(10),
            "drain stalled"
        );
    }
    assert_eq!(got, sent);
    assert!(st.readiness(libc::POLLOUT) & libc::POLLOUT != 0);
}

/// This thread's signal mask.
fn sigmask() -> libc::sigset_t {
    // SAFETY: all-zero is a valid sigset to be overwritten; query only.
    unsafe {
        let mut m: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut m);
        m
    }
}

#[test]
fn shim_threads_block_every_signal_and_leave_the_callers_mask_alone() {
    let before = sigmask();
    // SAFETY: reading a sigset.
    let blocked = |m: &libc::sigset_t, sig| unsafe { libc::sigismember(m, sig) == 1 };
    let h = spawn_with_signals_blocked("xwarp-test", move || {
        let m = sigmask();
        assert!(
            [
                libc::SIGINT,
                libc::SIGTERM,
                libc::SIGCHLD,
                libc::SIGUSR1,
                libc::SIGALRM
            ]
            .iter()
            .all(|&s| blocked(&m, s)),
            "a signal is not blocked on the shim's thread"
        );
        assert_eq!(std::thread::current().name(), Some("xwarp-test"));
    })
    .unwrap();
    h.join().expect("the spawned thread's checks failed");
    let after = sigmask();
    for sig in 1..libc::SIGRTMIN() {
        assert_eq!(
            blocked(&before, sig),
            blocked(&after, sig),
            "the caller's mask changed for signal {sig}"
        );
    }
}

/// Wait (bounded) until `f` holds.
pub(crate) fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Write all of `data` on the client stream.
pub(crate) fn client_write(client: &mut Stream, data: &[u8]) {
    let mut off = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while off < data.len() {
        match client.try_write(&data[off..]) {
            Ok(n) => off += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let _ = client.wait(Some(Instant::now() + Duration::from_millis(5)));
            }
            Err(e) => panic!("client write: {e}"),
        }
        assert!(Instant::now() < deadline, "client write stalled");
    }
}

/// Read on the client until end of stream or failure: the bytes and how it ended.
pub(crate) fn client_read_to_end(client: &mut Stream) -> (Vec<u8>, io::Result<()>) {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match client.try_read(&mut buf) {
            Ok(0) => return (got, Ok(())),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let _ = client.wait(Some(Instant::now() + Duration::from_millis(5)));
            }
            Err(e) => return (got, Err(e)),
        }
        assert!(Instant::now() < deadline, "client read never ended");
    }
}

#[test]
fn rfc2525_close_with_unread_input_in_the_shims_buffer_resets_the_connection() {
    let (_a, _b, st, mut client) = connected();
    client_write(&mut client, b"request nobody reads");
    // A readiness probe moved the bytes into the shim's own buffer.
    wait_for("the request", Duration::from_secs(5), || {
        st.available() == 20
    });
    retire(Arc::new(Sock::Stream(st)));
    let (got, end) = client_read_to_end(&mut client);
    assert!(got.is_empty());
    assert_eq!(
        end.map_err(|e| e.kind()),
        Err(io::ErrorKind::ConnectionReset),
        "the peer must learn that its request was not read"
    );
}

#[test]
fn rfc2525_close_with_unread_input_in_the_ring_resets_even_with_a_linger_timeout() {
    let (_a, _b, st, mut client) = connected();
    // SO_LINGER {1, 5}: Linux still resets at once when input is unread.
    st.common.opts().linger = (1, 5);
    client_write(&mut client, &[7u8; 3000]);
    wait_for("the bytes in the ring", Duration::from_secs(5), || {
        st.lock().stream.rx_ready()
    });
    let t = Instant::now();
    retire(Arc::new(Sock::Stream(st)));
    assert!(t.elapsed() < Duration::from_secs(2), "close lingered");
    let (_, end) = client_read_to_end(&mut client);
    assert_eq!(
        end.map_err(|e| e.kind()),
        Err(io::ErrorKind::ConnectionReset)
    );
}

#[test]
fn rfc2525_close_after_reading_everything_sends_the_data_then_fin() {
    let (_a, _b, st, mut client) = connected();
    client_write(&mut client, b"GET /");
    let mut req = [0u8; 5];
    wait_for("the request", Duration::from_secs(5), || {
        st.read_once(&mut [&mut req[..]], false) == Ok(5)
    });
    assert_eq!(&req, b"GET /");
    let reply: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let mut off = 0;
    while off < reply.len() {
        match st.write_once(&[&reply[off..]]) {
            Ok(n) => off += n,
            Err(libc::EAGAIN) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("server write: {e}"),
        }
    }
    retire(Arc::new(Sock::Stream(st)));
    let (got, end) = client_read_to_end(&mut client);
    assert!(end.is_ok(), "clean close expected: {end:?}");
    assert_eq!(got.len(), reply.len());
    assert!(got == reply, "reply bytes differ");
}

#[test]
fn rfc2525_input_arriving_after_the_close_resets_the_orphaned_connection() {
    let (_a, _b, st, mut client) = connected();
    retire(Arc::new(Sock::Stream(st)));
    // Nothing was unread: FIN.
    let (got, end) = client_read_to_end(&mut client);
    assert!(got.is_empty() && end.is_ok(), "{end:?}");
    assert!(client.error().is_none());
    // The peer sends after our FIN; the program makes no more socket calls: the
    // watcher resets the connection (Linux: data for an orphaned socket → RST).
    client_write(&mut client, b"too late");
    wait_for("the reset", Duration::from_secs(5), || {
        client.error().is_some()
    });
    assert_eq!(
        client.error().map(|e| e.to_io().kind()),
        Some(io::ErrorKind::ConnectionReset)
    );
}
