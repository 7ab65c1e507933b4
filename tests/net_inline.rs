//! `xwarp::net` over engines in inline mode (`EngineMode::Inline`): application threads
//! drive the engine from their calls, the keeper covers the time they do not. Data is
//! verified everywhere (pattern and hash).

mod net_common;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::{Duration, Instant};

use net_common::{addr, fill, pair_config, recv_stream, send_stream, StreamHash, STEP};
use xwarp::net::{vwire_pair_with, NetEngine, PairConfig, TcpListener, TcpStream};
use xwarp::poll_driver::engine::{EngineConfig, EngineMode, InlineConfig};
use xwarp::poll_driver::vwire::{LinkConfig, VirtualNic, WireConfig};

fn inline(mut cfg: PairConfig) -> (NetEngine<VirtualNic>, NetEngine<VirtualNic>) {
    cfg.engine = EngineConfig {
        mode: EngineMode::Inline(InlineConfig::default()),
        ..EngineConfig::default()
    };
    vwire_pair_with(cfg).unwrap()
}

#[test]
fn inline_echo_data_verified_by_hash() {
    let (a, b) = inline(PairConfig::default());
    assert!(a.engine().inline_driver().is_some());
    let listener = TcpListener::bind(b.stack(), addr(2, 7)).unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        assert!(s.inline_driver().is_some());
        let mut buf = vec![0u8; 64 << 10];
        let mut echoed = 0u64;
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            s.write_all(&buf[..n]).unwrap();
            echoed += n as u64;
        }
        s.shutdown(Shutdown::Write).unwrap();
        echoed
    });
    let mut c = TcpStream::connect(a.stack(), addr(2, 7)).unwrap();
    c.set_nodelay(true).unwrap();
    let (mut sent, mut got) = (StreamHash::default(), StreamHash::default());
    let mut off = 0u64;
    let mut block = vec![0u8; 150_000];
    let mut back = vec![0u8; 150_000];
    for i in 0..60u64 {
        let n = 1 + ((i * 7919) % 150_000) as usize;
        fill(42, off, &mut block[..n]);
        c.write_all(&block[..n]).unwrap();
        sent.update(&block[..n]);
        c.read_exact(&mut back[..n]).unwrap();
        assert_eq!(&back[..n], &block[..n], "echo of block {i} differs");
        got.update(&back[..n]);
        off += n as u64;
    }
    c.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    assert_eq!(sent.finish(), got.finish());
    assert_eq!(server.join().unwrap(), off);
    let (sa, sb) = (a.engine_stats(), b.engine_stats());
    assert!(
        sa.inline_iterations > 0 && sb.inline_iterations > 0,
        "{sa:?} {sb:?}"
    );
}

#[test]
fn inline_ping_pong_64_bytes_verified() {
    let (a, b) = inline(PairConfig::default());
    let listener = TcpListener::bind(b.stack(), addr(2, 8)).unwrap();
    let rounds = 2000u64;
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut buf = [0u8; 64];
        for _ in 0..rounds {
            s.read_exact(&mut buf).unwrap();
            for x in &mut buf {
                *x = x.wrapping_add(1);
            }
            s.write_all(&buf).unwrap();
        }
    });
    let mut c = TcpStream::connect(a.stack(), addr(2, 8)).unwrap();
    c.set_nodelay(true).unwrap();
    let (mut msg, mut back) = ([0u8; 64], [0u8; 64]);
    let t = Instant::now();
    for i in 0..rounds {
        fill(i, i * 64, &mut msg);
        c.write_all(&msg).unwrap();
        c.read_exact(&mut back).unwrap();
        for (m, r) in msg.iter().zip(&back) {
            assert_eq!(m.wrapping_add(1), *r, "round {i}");
        }
    }
    let rtt = t.elapsed() / rounds as u32;
    server.join().unwrap();
    eprintln!("inline ping-pong: {rtt:?} per round trip");
    assert!(a.engine_stats().inline_iterations >= rounds);
}

/// Several threads drive one engine at once (four connections per engine, each in its
/// own thread on both sides): every byte arrives, in order.
#[test]
fn inline_driving_from_several_threads_loses_nothing() {
    let (a, b) = inline(PairConfig::default());
    let listener = TcpListener::bind(b.stack(), addr(2, 9)).unwrap();
    let conns = 4u64;
    let total = 4u64 << 20;
    let server = std::thread::spawn(move || {
        let mut ths = Vec::new();
        for _ in 0..conns {
            let (mut s, _) = listener.accept().unwrap();
            ths.push(std::thread::spawn(move || {
                // The client's first 8 bytes name its stream.
                let mut id = [0u8; 8];
                s.read_exact(&mut id).unwrap();
                let seed = u64::from_le_bytes(id);
                let got = recv_stream(&mut s, seed, true).unwrap();
                (seed, got)
            }));
        }
        ths.into_iter()
            .map(|t| t.join().unwrap())
            .collect::<Vec<_>>()
    });
    let clients: Vec<_> = (0..conns)
        .map(|k| {
            let stack = a.stack().clone();
            std::thread::spawn(move || {
                let seed = 100 + k;
                let mut c = TcpStream::connect(&stack, addr(2, 9)).unwrap();
                c.write_all(&seed.to_le_bytes()).unwrap();
                let sent = send_stream(&mut c, seed, total, 3000 + 5000 * k as usize).unwrap();
                c.shutdown(Shutdown::Write).unwrap();
                (seed, sent)
            })
        })
        .collect();
    let mut sent: Vec<_> = clients.into_iter().map(|t| t.join().unwrap()).collect();
    let mut got = server.join().unwrap();
    sent.sort();
    got.sort();
    assert_eq!(sent, got);
}

/// The receiving application stops polling for 200 ms mid-transfer (and the sender for
/// 200 ms too): the keepers carry the connection (ACKs, window updates, retransmissions
/// on a lossy wire) and the transfer completes with every byte verified.
#[test]
fn inline_transfer_survives_the_application_not_polling_for_200_ms() {
    let link = LinkConfig {
        drop: 0.01,
        ..LinkConfig::seeded(0x1_11e)
    };
    let mut cfg = pair_config(|c| {
        c.rx_buffer = 256 << 10;
        c.tx_buffer = 256 << 10;
        c.rto_floor = Some(Duration::from_millis(10));
    });
    cfg.wire = WireConfig::symmetric(1500, link);
    let (a, b) = inline(cfg);
    let listener = TcpListener::bind(b.stack(), addr(2, 10)).unwrap();
    let total = 16u64 << 20;
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut h = StreamHash::default();
        let mut buf = vec![0u8; 64 << 10];
        let mut expect = vec![0u8; 64 << 10];
        let mut paused = false;
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            fill(7, h.len, &mut expect[..n]);
            assert_eq!(&buf[..n], &expect[..n], "bytes at {} differ", h.len);
            h.update(&buf[..n]);
            if !paused && h.len >= total / 2 {
                paused = true;
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        h.finish()
    });
    let t = Instant::now();
    let mut c = TcpStream::connect(a.stack(), addr(2, 10)).unwrap();
    // The first quarter, then 200 ms without touching the stream: what was queued still
    // goes out (the keeper drives), then the rest.
    let q = send_stream(&mut c, 7, total / 4, 32 << 10).unwrap();
    let before = a.engine_stats();
    std::thread::sleep(Duration::from_millis(200));
    let during = a.engine_stats();
    assert!(
        during.iterations - during.inline_iterations > before.iterations - before.inline_iterations,
        "the keeper did not run while the application slept: {before:?} {during:?}"
    );
    let mut h = StreamHash::default();
    let mut buf = vec![0u8; 32 << 10];
    let mut off = q.0;
    // Re-hash the first quarter so the hash covers the whole stream.
    let mut first = vec![0u8; (total / 4) as usize];
    fill(7, 0, &mut first);
    h.update(&first);
    while off < total {
        let n = buf.len().min((total - off) as usize);
        fill(7, off, &mut buf[..n]);
        c.write_all(&buf[..n]).unwrap();
        h.update(&buf[..n]);
        off += n as u64;
    }
    c.shutdown(Shutdown::Write).unwrap();
    let got = server.join().unwrap();
    assert_eq!(got, h.finish());
    assert!(t.elapsed() < STEP * 3, "took {:?}", t.elapsed());
}

/// The keeper fires timers while no application thread polls: the client queues 200 KB on
/// a lossy wire and sleeps without touching the stream; the server (its own engine
/// driven only by its reader) gets every byte, which needs retransmissions the client's
/// keeper sends.
#[test]
fn inline_keeper_retransmits_while_the_sender_sleeps() {
    let link = LinkConfig {
        drop: 0.05,
        ..LinkConfig::seeded(0xdead)
    };
    let mut cfg = pair_config(|c| {
        c.rto_floor = Some(Duration::from_millis(10));
    });
    cfg.wire = WireConfig::symmetric(1500, link);
    let (a, b) = inline(cfg);
    let listener = TcpListener::bind(b.stack(), addr(2, 11)).unwrap();
    let total = 200_000usize;
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut got = vec![0u8; total];
        s.read_exact(&mut got).unwrap();
        got
    });
    let mut c = TcpStream::connect(a.stack(), addr(2, 11)).unwrap();
    let mut data = vec![0u8; total];
    fill(9, 0, &mut data);
    let t = Instant::now();
    let mut off = 0;
    while off < total {
        // The ring takes it all (256 KiB): one or two writes, then no more calls.
        off += c.write(&data[off..]).unwrap();
    }
    let got = loop {
        if server.is_finished() {
            break server.join().unwrap();
        }
        assert!(
            t.elapsed() < STEP,
            "the transfer stalled while the sender slept"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(got, data);
    let s = a.engine_stats();
    assert!(s.iterations > s.inline_iterations, "{s:?}");
    drop(c);
}
