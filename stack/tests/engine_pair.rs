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
