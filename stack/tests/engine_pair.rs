//! The stack on two engines joined by the virtual wire, through the non-blocking API.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use xwarp_poll_driver::engine::{Engine, EngineConfig, EngineHandle};
use xwarp_poll_driver::vwire::{VirtualNic, VirtualWire, WireConfig};
use xwarp_stack::{new_stack, StackConfig, StackHandle, Stream, TcpService};

type Handle = EngineHandle<VirtualNic, TcpService>;

fn config(last: u8) -> StackConfig {
    StackConfig {
        mac: [0x02, 0, 0, 0, 0, last],
        ipv4: Some((Ipv4Addr::new(10, 9, 0, last), 24)),
        rx_buffer: 256 << 10,
        tx_buffer: 256 << 10,
        ring_size: 128 << 10,
        ..StackConfig::default()
    }
}

fn start(nic: VirtualNic, cfg: StackConfig) -> (Handle, StackHandle) {
    let (svc, h) = new_stack(cfg).unwrap();
    let eng = Engine::spawn(EngineConfig::default(), nic, svc).unwrap();
    let bell = eng.doorbell();
    h.set_kick(std::sync::Arc::new(move || bell.ring()));
    (eng, h)
}

fn pair(wire: WireConfig) -> ((Handle, StackHandle), (Handle, StackHandle)) {
    let (a, b) = VirtualWire::pair(wire).unwrap();
    (start(a, config(1)), start(b, config(2)))
}

fn addr(last: u8, port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::new(10, 9, 0, last), port))
}

fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn write_all(s: &mut Stream, mut data: &[u8]) {
    while !data.is_empty() {
        match s.try_write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                s.wait(Some(Instant::now() + Duration::from_millis(50)))
                    .unwrap();
            }
            Err(e) => panic!("write: {e}"),
        }
    }
}

fn read_to_end(s: &mut Stream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match s.try_read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                s.wait(Some(Instant::now() + Duration::from_millis(50)))
                    .unwrap();
            }
            Err(e) => panic!("read: {e}"),
        }
    }
}

#[test]
fn connect_send_fin_and_recycle() {
    let ((_ea, a), (_eb, b)) = pair(WireConfig::default());
    let l = b.listen(addr(2, 7000), 8, Duration::from_secs(5)).unwrap();
    let mut c = a.connect(addr(2, 7000), None, None).unwrap();
    wait_until("connect", || c.poll_connect().unwrap().then_some(()));
    let mut s = wait_until("accept", || l.try_accept().ok());
    assert_eq!(s.peer_addr(), c.local_addr());
    assert_eq!(c.peer_addr(), Some(addr(2, 7000)));

    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let t = std::thread::spawn(move || {
        let got = read_to_end(&mut s);
        (s, got)
    });
    write_all(&mut c, &data);
    c.shutdown_write().unwrap();
    let (_s, got) = t.join().unwrap();
    assert_eq!(got.len(), data.len());
    assert!(got == data);
    drop(c);
    drop(_s);
    // Both ends close; the active closer sits in TIME-WAIT, the other is recycled.
    wait_until("recycle", || (b.stats().recycled >= 1).then_some(()));
}

#[test]
fn connect_to_closed_port_is_refused() {
    let ((_ea, a), (_eb, _b)) = pair(WireConfig::default());
    let c = a.connect(addr(2, 7001), None, None).unwrap();
    let e = wait_until("refusal", || c.poll_connect().err());
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
}

#[test]
fn readiness_fds_work_with_epoll() {
    use rustix::event::epoll;
    use std::os::fd::AsFd;

    let ((_ea, a), (_eb, b)) = pair(WireConfig::default());
    let l = b.listen(addr(2, 7002), 8, Duration::from_secs(5)).unwrap();
    let c1 = a.connect(addr(2, 7002), None, None).unwrap();
    wait_until("connect 1", || c1.poll_connect().unwrap().then_some(()));
    let mut s1 = wait_until("accept 1", || l.try_accept().ok());
    let mut c2 = a.connect(addr(2, 7002), None, None).unwrap();
    wait_until("connect 2", || c2.poll_connect().unwrap().then_some(()));
    let mut s2 = wait_until("accept 2", || l.try_accept().ok());

    let ep = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
    for (s, id) in [(&s1, 1u64), (&s2, 2u64)] {
        epoll::add(
            &ep,
            s.as_fd(),
            epoll::EventData::new_u64(id),
            epoll::EventFlags::IN,
        )
        .unwrap();
    }
    let mut buf = [0u8; 16];
    // Register read interest on both (and consume old "established" edges).
    for s in [&mut s1, &mut s2] {
        s.wait(Some(Instant::now() + Duration::from_millis(1)))
            .unwrap();
        assert_eq!(
            s.try_read(&mut buf).unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock
        );
    }
    let mut events = Vec::with_capacity(4);
    let ten_ms = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 10_000_000,
    };
    epoll::wait(
        &ep,
        rustix::buffer::spare_capacity(&mut events),
        Some(&ten_ms),
    )
    .unwrap();
    assert!(events.is_empty(), "no data yet, no readiness");

    write_all(&mut c2, b"second");
    let five_s = rustix::event::Timespec {
        tv_sec: 5,
        tv_nsec: 0,
    };
    epoll::wait(
        &ep,
        rustix::buffer::spare_capacity(&mut events),
        Some(&five_s),
    )
    .unwrap();
    let ids: Vec<u64> = events.iter().map(|e| e.data.u64()).collect();
    assert_eq!(ids, vec![2]);
    assert_eq!(s2.try_read(&mut buf).unwrap(), 6);
    assert_eq!(&buf[..6], b"second");
    assert_eq!(
        s1.try_read(&mut buf).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
    drop(c1);
}

/// The own TCP core (`TcpCore::Own`, whatever `XWARP_TCP_CORE` says) over IPv4 and IPv6:
/// the first SYN to a peer goes out through the `Interface` (ARP / neighbour discovery
/// first), the rest straight into TX frames; 2 MB each way at once on one connection,
/// byte-exact, clean close; a connect to a closed port is refused by the RFC 9293
/// §3.10.7.1 RST; `TCP_INFO` carries the own core's counters.
#[test]
fn own_core_moves_data_both_ways_over_ipv4_and_ipv6_and_refuses_closed_ports() {
    use std::net::Ipv6Addr;
    let v6 = |last: u8| Ipv6Addr::new(0xfd00, 9, 0, 0, 0, 0, 0, u16::from(last));
    let own = |last: u8| StackConfig {
        ipv6: Some((v6(last), 64)),
        tcp_core: xwarp_stack::TcpCore::Own,
        ..config(last)
    };
    let (na, nb) = VirtualWire::pair(WireConfig::default()).unwrap();
    let ((_ea, a), (_eb, b)) = (start(na, own(1)), start(nb, own(2)));
    for (i, server) in [addr(2, 7100), SocketAddr::from((v6(2), 7101))]
        .into_iter()
        .enumerate()
    {
        let l = b.listen(server, 8, Duration::from_secs(5)).unwrap();
        let mut c = a.connect(server, None, None).unwrap();
        wait_until("connect", || c.poll_connect().unwrap().then_some(()));
        let mut s = wait_until("accept", || l.try_accept().ok());
        assert_eq!(s.peer_addr(), c.local_addr());
        let up: Vec<u8> = (0..2_000_000u32)
            .map(|k| (k * 13 + k / 509) as u8)
            .collect();
        let down: Vec<u8> = (0..2_000_000u32)
            .map(|k| (k * 5 + k / 241 + 1) as u8)
            .collect();
        // The server reads while the client writes; then the other way round on the same
        // connection (half-closed by the client).
        let t = std::thread::spawn(move || {
            let got = read_to_end(&mut s);
            (s, got)
        });
        write_all(&mut c, &up);
        c.shutdown_write().unwrap();
        let (mut s, got) = t.join().unwrap();
        assert!(got == up, "a->b stream ({i})");
        let down2 = down.clone();
        let t = std::thread::spawn(move || {
            write_all(&mut s, &down2);
            s.shutdown_write().unwrap();
            s
        });
        let back = read_to_end(&mut c);
        let _s = t.join().unwrap();
        assert!(back == down, "b->a stream ({i})");
        let info = c.tcp_info(Duration::from_secs(5)).unwrap();
        assert_eq!(info.bytes_acked, up.len() as u64, "{info:?}");
        assert_eq!(info.bytes_received, down.len() as u64, "{info:?}");
        assert!(info.cwnd > 0, "{info:?}");
        // Once the engine has let go of the closed connection, TCP_INFO still answers
        // (Linux does on a closed socket) with the connection's last counters.
        std::thread::sleep(Duration::from_millis(300));
        let last = c.tcp_info(Duration::from_secs(5)).unwrap();
        assert_eq!(last.bytes_acked, up.len() as u64, "{last:?}");
        assert_eq!(last.bytes_received, down.len() as u64, "{last:?}");
    }
    for closed in [addr(2, 7102), SocketAddr::from((v6(2), 7103))] {
        let c = a.connect(closed, None, None).unwrap();
        let e = wait_until("refusal", || c.poll_connect().err());
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
    }
}
