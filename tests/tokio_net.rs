//! `xwarp::net::tokio` over two engines joined by the virtual wire: an echo server with
//! many concurrent connections on both runtime flavours (every byte verified), and the
//! wakeups that end a wait: peer FIN, reset, engine stop, write space. One root test
//! runs the tokio echo server on an AF_XDP engine with kernel clients over a veth pair.

#[macro_use]
#[path = "support/afxdp_skip.rs"]
mod afxdp_skip;
mod net_common;

use std::future::Future;
use std::io::ErrorKind;
use std::time::{Duration, Instant};

use net_common::{addr, fill, pair_config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use xwarp::net::tokio::{TcpListener, TcpStream};
use xwarp::net::{vwire_pair, vwire_pair_with, NetEngine, SocketOptions};
use xwarp::poll_driver::vwire::{VirtualNic, WireConfig};

/// Connections the echo tests open at once.
const CONNS: usize = 128;
/// Bytes each connection sends (and gets back).
const PER_CONN: usize = 96 << 10;
/// Bound on a whole test on a loaded 2-core machine.
const LIMIT: Duration = Duration::from_secs(120);

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(LIMIT, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: not done within {LIMIT:?}"),
    }
}

/// Small rings and buffers: every connection fills them many times over, so writers
/// wait for space and readers for data over and over.
fn small_engines() -> (NetEngine<VirtualNic>, NetEngine<VirtualNic>) {
    let cfg = pair_config(|c| {
        c.rx_buffer = 16 << 10;
        c.tx_buffer = 16 << 10;
        c.ring_size = 8 << 10;
        c.syn_backlog = CONNS;
    });
    vwire_pair_with(cfg).unwrap()
}

/// Echo one connection until the peer's FIN, then FIN back; returns the bytes echoed.
async fn echo(mut s: TcpStream) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 16 << 10];
    let mut total = 0u64;
    loop {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        s.write_all(&buf[..n]).await?;
        total += n as u64;
    }
    s.shutdown().await?;
    Ok(total)
}

/// One client: send `PER_CONN` bytes of stream `seed` in uneven writes from one task
/// while another reads the echo and checks every byte.
async fn client(stack: xwarp::net::StackHandle, seed: u64) -> u64 {
    let s = TcpStream::connect(&stack, addr(2, 7)).await.unwrap();
    assert_eq!(s.peer_addr().unwrap(), addr(2, 7));
    let (mut r, mut w) = s.into_split();
    let writer = tokio::spawn(async move {
        let mut buf = vec![0u8; 8192];
        let mut off = 0usize;
        let mut k = seed;
        while off < PER_CONN {
            k = k
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let n = (1 + (k >> 33) as usize % 8192).min(PER_CONN - off);
            fill(seed, off as u64, &mut buf[..n]);
            w.write_all(&buf[..n]).await.unwrap();
            off += n;
        }
        // Dropping the write half sends FIN.
    });
    let mut got = 0usize;
    let mut buf = vec![0u8; 12 << 10];
    let mut expect = vec![0u8; 12 << 10];
    loop {
        let n = r.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        fill(seed, got as u64, &mut expect[..n]);
        assert!(
            buf[..n] == expect[..n],
            "connection {seed}: echoed bytes {got}..{} differ",
            got + n
        );
        got += n;
    }
    writer.await.unwrap();
    assert_eq!(got, PER_CONN, "connection {seed}: echoed length");
    got as u64
}

fn echo_many(rt: tokio::runtime::Runtime) {
    let (a, b) = small_engines();
    let t = Instant::now();
    let total = rt.block_on(async {
        let listener =
            TcpListener::bind_with(b.stack(), addr(2, 7), CONNS, &SocketOptions::default())
                .unwrap();
        let server = tokio::spawn(async move {
            let mut echoers = Vec::new();
            for _ in 0..CONNS {
                let (s, peer) = listener.accept().await.unwrap();
                assert_eq!(peer.ip(), addr(1, 0).ip());
                echoers.push(tokio::spawn(echo(s)));
            }
            let mut echoed = 0;
            for e in echoers {
                echoed += e.await.unwrap().unwrap();
            }
            echoed
        });
        let clients: Vec<_> = (0..CONNS as u64)
            .map(|seed| tokio::spawn(client(a.stack().clone(), seed)))
            .collect();
        bounded("echo", async {
            let mut total = 0;
            for c in clients {
                total += c.await.unwrap();
            }
            assert_eq!(server.await.unwrap(), total, "server echoed");
            total
        })
        .await
    });
    assert_eq!(total, (CONNS * PER_CONN) as u64);
    eprintln!(
        "{CONNS} connections, {} KiB each way, verified in {:?}",
        total >> 10,
        t.elapsed()
    );
}

#[test]
fn echo_many_connections_multi_thread() {
    echo_many(multi_thread());
}

#[test]
fn echo_many_connections_current_thread() {
    echo_many(current_thread());
}

#[test]
fn peer_fin_is_eof_and_reset_is_connection_reset() {
    let (a, b) = vwire_pair(WireConfig::default()).unwrap();
    multi_thread().block_on(bounded("fin/reset", async {
        let listener = TcpListener::bind(b.stack(), addr(2, 8)).unwrap();

        // FIN: the server writes, shuts down its write side; the client, already
        // waiting in read, gets the bytes, then end of stream, and can still write.
        let mut c = TcpStream::connect(a.stack(), addr(2, 8)).await.unwrap();
        let (mut s, _) = listener.accept().await.unwrap();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            c.read_to_end(&mut got).await.unwrap();
            (c, got)
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        s.write_all(b"bye").await.unwrap();
        s.shutdown().await.unwrap();
        let (mut c, got) = reader.await.unwrap();
        assert_eq!(got, b"bye");
        assert_eq!(c.read(&mut [0u8; 8]).await.unwrap(), 0, "EOF stays EOF");
        c.write_all(b"half-closed").await.unwrap();
        let mut back = [0u8; 11];
        s.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"half-closed");

        // Reset: the server waits in read while the client aborts.
        let c = TcpStream::connect(a.stack(), addr(2, 8)).await.unwrap();
        let (mut s, _) = listener.accept().await.unwrap();
        let reader = tokio::spawn(async move { s.read(&mut [0u8; 64]).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        c.abort().unwrap();
        let e = reader.await.unwrap().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");

        // Refused: nobody listens on port 9.
        let e = TcpStream::connect(a.stack(), addr(2, 9)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
    }));
}

#[test]
fn engine_stop_wakes_waiting_reader_writer_and_acceptor() {
    let cfg = pair_config(|c| {
        c.ring_size = 4 << 10;
        c.rx_buffer = 8 << 10;
        c.tx_buffer = 8 << 10;
    });
    let (a, b) = vwire_pair_with(cfg).unwrap();
    let rt = multi_thread();
    let (reader, writer, acceptor, _c2) = rt.block_on(async {
        let listener = TcpListener::bind(b.stack(), addr(2, 10)).unwrap();
        // Connection 1: the client writes until every buffer is full (the server never
        // reads). Connection 2: the server waits to read (the client never writes).
        let c1 = TcpStream::connect(a.stack(), addr(2, 10)).await.unwrap();
        let (s1, _) = listener.accept().await.unwrap();
        let c2 = TcpStream::connect(a.stack(), addr(2, 10)).await.unwrap();
        let (s2, _) = listener.accept().await.unwrap();
        let (_cr, mut cw) = c1.into_split();
        let writer = tokio::spawn(async move {
            let _s1 = s1;
            let chunk = vec![7u8; 4096];
            loop {
                if let Err(e) = cw.write_all(&chunk).await {
                    return e;
                }
            }
        });
        let mut sr = s2;
        let reader = tokio::spawn(async move { sr.read(&mut [0u8; 64]).await });
        let acceptor = tokio::spawn(async move { listener.accept().await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!reader.is_finished(), "reader: {:?}", reader.await);
        assert!(!acceptor.is_finished(), "acceptor: {:?}", acceptor.await);
        assert!(!writer.is_finished(), "writer: {:?}", writer.await);
        (reader, writer, acceptor, c2)
    });
    // Stop both engines (joins their threads; tasks keep waiting meanwhile).
    drop(b);
    drop(a);
    rt.block_on(bounded("engine stop", async {
        let e = reader.await.unwrap().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionAborted, "reader: {e}");
        let e = acceptor.await.unwrap().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionAborted, "acceptor: {e}");
        let e = writer.await.unwrap();
        assert_eq!(e.kind(), ErrorKind::ConnectionAborted, "writer: {e}");
    }));
}

/// A writer that filled the rings sleeps until the reader makes room, on both runtime
/// flavours; 4 MiB through 4 KiB rings, verified.
#[test]
fn writer_waits_for_space_then_resumes() {
    for rt in [current_thread(), multi_thread()] {
        let cfg = pair_config(|c| {
            c.ring_size = 4 << 10;
            c.rx_buffer = 8 << 10;
            c.tx_buffer = 8 << 10;
        });
        let (a, b) = vwire_pair_with(cfg).unwrap();
        rt.block_on(bounded("slow reader", async {
            const TOTAL: usize = 4 << 20;
            let listener = TcpListener::bind(b.stack(), addr(2, 11)).unwrap();
            let mut c = TcpStream::connect(a.stack(), addr(2, 11)).await.unwrap();
            let (mut s, _) = listener.accept().await.unwrap();
            let writer = tokio::spawn(async move {
                let mut data = vec![0u8; TOTAL];
                fill(99, 0, &mut data);
                c.write_all(&data).await.unwrap();
                c.shutdown().await.unwrap();
            });
            // Let the writer fill everything and go to sleep.
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(!writer.is_finished(), "4 MiB cannot fit in the buffers");
            let mut got = Vec::with_capacity(TOTAL);
            s.read_to_end(&mut got).await.unwrap();
            writer.await.unwrap();
            let mut want = vec![0u8; TOTAL];
            fill(99, 0, &mut want);
            assert!(got == want, "received stream differs ({} bytes)", got.len());
        }));
    }
}

#[test]
fn constructors_outside_a_runtime_fail_cleanly() {
    let (_a, b) = vwire_pair(WireConfig::default()).unwrap();
    let e = TcpListener::bind(b.stack(), addr(2, 12)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Other, "{e}");
    assert!(e.to_string().contains("tokio runtime"), "{e}");
}

/// The tokio echo server on an AF_XDP engine (veth-a in namespace A, owning an address
/// the kernel there does not have), 16 kernel clients in namespace B at once, each sending
/// 1 MiB from one thread while another reads the echo; every byte verified. Root only.
#[test]
fn tokio_echo_on_afxdp_with_kernel_clients() {
    require_root_and_afxdp!();
    use std::io::{Read, Write};
    use xwarp::poll_driver::netns::VethPair;
    use xwarp::toe::{start_xdp_engine, XdpEngineConfig};
    const KERNEL_CONNS: u64 = 16;
    const BYTES: usize = 1 << 20;
    let net = VethPair::new(61).expect("veth pair");
    let ip = std::net::Ipv4Addr::new(10, 88, 61, 10);
    let mut cfg = XdpEngineConfig::new(&net.if_a, ip, 24);
    cfg.engine.name = "xdp-tokio-61".into();
    let engine = start_xdp_engine(Some(&net.a), cfg).expect("engine on veth-a");
    let at = std::net::SocketAddr::from((ip, 7));
    let rt = multi_thread();
    let listener = rt
        .block_on(async { TcpListener::bind(engine.stack(), at) })
        .unwrap();
    let server = rt.spawn(async move {
        let mut echoers = Vec::new();
        for _ in 0..KERNEL_CONNS {
            let (s, _) = listener.accept().await.unwrap();
            echoers.push(tokio::spawn(echo(s)));
        }
        let mut total = 0;
        for e in echoers {
            total += e.await.unwrap().unwrap();
        }
        total
    });
    // Kernel clients: threads inside namespace B (threads spawned there stay in it).
    let checked = net
        .b
        .run(move || {
            let clients: Vec<_> = (0..KERNEL_CONNS)
                .map(|seed| {
                    std::thread::spawn(move || {
                        let mut c =
                            std::net::TcpStream::connect_timeout(&at, Duration::from_secs(10))
                                .expect("kernel connect");
                        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                        c.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
                        let mut w = c.try_clone().unwrap();
                        let writer = std::thread::spawn(move || {
                            let mut buf = vec![0u8; 8192];
                            let mut off = 0;
                            while off < BYTES {
                                let n = buf.len().min(BYTES - off);
                                fill(seed, off as u64, &mut buf[..n]);
                                w.write_all(&buf[..n]).unwrap();
                                off += n;
                            }
                            w.shutdown(std::net::Shutdown::Write).unwrap();
                        });
                        let (mut got, mut buf, mut want) = (0, vec![0u8; 16384], vec![0u8; 16384]);
                        loop {
                            let n = c.read(&mut buf).expect("kernel read");
                            if n == 0 {
                                break;
                            }
                            fill(seed, got as u64, &mut want[..n]);
                            assert!(buf[..n] == want[..n], "client {seed}: bytes {got}.. differ");
                            got += n;
                        }
                        writer.join().unwrap();
                        assert_eq!(got, BYTES, "client {seed}: echoed length");
                        got as u64
                    })
                })
                .collect();
            clients.into_iter().map(|c| c.join().unwrap()).sum::<u64>()
        })
        .expect("enter namespace B");
    let echoed = rt.block_on(bounded("afxdp echo server", server)).unwrap();
    assert_eq!((checked, echoed), (KERNEL_CONNS * BYTES as u64, checked));
    drop(rt);
    drop(engine);
}

/// Ping-pong: every message finds the other side asleep (nothing else moves on the
/// connection), so a single lost wakeup stalls the test. 2000 round trips on each runtime
/// flavour, in both directions, contents checked.
#[test]
fn ping_pong_never_loses_a_wakeup() {
    for rt in [current_thread(), multi_thread()] {
        let (a, b) = vwire_pair(WireConfig::default()).unwrap();
        rt.block_on(bounded("ping-pong", async {
            const ROUNDS: u32 = 2000;
            let listener = TcpListener::bind(b.stack(), addr(2, 13)).unwrap();
            let mut c = TcpStream::connect(a.stack(), addr(2, 13)).await.unwrap();
            let (mut s, _) = listener.accept().await.unwrap();
            c.set_nodelay(true).unwrap();
            s.set_nodelay(true).unwrap();
            let pong = tokio::spawn(async move {
                let mut m = [0u8; 4];
                for i in 0..ROUNDS {
                    s.read_exact(&mut m).await.unwrap();
                    assert_eq!(u32::from_le_bytes(m), i, "ping {i}");
                    s.write_all(&(!i).to_le_bytes()).await.unwrap();
                }
            });
            let mut m = [0u8; 4];
            for i in 0..ROUNDS {
                c.write_all(&i.to_le_bytes()).await.unwrap();
                c.read_exact(&mut m).await.unwrap();
                assert_eq!(u32::from_le_bytes(m), !i, "pong {i}");
            }
            pong.await.unwrap();
        }));
    }
}
