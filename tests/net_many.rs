//! 1000 concurrent connections opened, used (a few verified bytes each) and closed.

mod net_common;

use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};

use net_common::{addr, pair_config};
use xwarp::net::{vwire_pair_with, TcpListener, TcpStream};

const N: usize = 1000;

#[test]
fn thousand_concurrent_connections() {
    let cfg = pair_config(|c| {
        c.rx_buffer = 8 << 10;
        c.tx_buffer = 8 << 10;
        c.ring_size = 4 << 10;
        c.syn_backlog = N;
    });
    let (a, b) = vwire_pair_with(cfg).unwrap();
    let listener = TcpListener::bind_with_backlog(b.stack(), addr(2, 6000), N).unwrap();
    let t = Instant::now();
    let server = std::thread::spawn(move || {
        let mut conns = Vec::with_capacity(N);
        for _ in 0..N {
            let (mut s, _) = listener.accept().unwrap();
            s.set_nonblocking(true).unwrap();
            conns.push((s, [0u8; 8], 0usize));
        }
        // Echo each 8-byte hello back with its bytes inverted, then close.
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut done = 0;
        while done < N {
            assert!(Instant::now() < deadline, "server stalled at {done}");
            let mut progress = false;
            for (s, buf, got) in conns.iter_mut() {
                if *got == 8 {
                    continue;
                }
                match s.read(&mut buf[*got..]) {
                    Ok(0) => panic!("early EOF"),
                    Ok(n) => {
                        *got += n;
                        progress = true;
                        if *got == 8 {
                            let reply: Vec<u8> = buf.iter().map(|b| !b).collect();
                            s.set_nonblocking(false).unwrap();
                            s.write_all(&reply).unwrap();
                            done += 1;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => panic!("server read: {e}"),
                }
            }
            if !progress {
                std::thread::sleep(Duration::from_micros(500));
            }
        }
        drop(conns);
        done
    });

    let mut clients = Vec::with_capacity(N);
    for _ in 0..N {
        clients.push(TcpStream::connect_nonblocking(a.stack(), addr(2, 6000)).unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut connected = vec![false; N];
    while connected.iter().any(|c| !c) {
        assert!(Instant::now() < deadline, "connects stalled");
        for (i, c) in clients.iter().enumerate() {
            if !connected[i] {
                connected[i] = c.poll_connect().unwrap();
            }
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    let opened = t.elapsed();
    let mut ports = std::collections::HashSet::new();
    for (i, c) in clients.iter_mut().enumerate() {
        assert!(
            ports.insert(c.local_addr().unwrap().port()),
            "ephemeral port reused"
        );
        let hello = ((i as u64).wrapping_mul(0x0101_0101_0101_0101) ^ 0xA5A5).to_le_bytes();
        c.set_nonblocking(false).unwrap();
        c.write_all(&hello).unwrap();
    }
    for (i, c) in clients.iter_mut().enumerate() {
        let hello = ((i as u64).wrapping_mul(0x0101_0101_0101_0101) ^ 0xA5A5).to_le_bytes();
        let mut reply = [0u8; 8];
        c.read_exact(&mut reply).unwrap();
        let want: Vec<u8> = hello.iter().map(|b| !b).collect();
        assert_eq!(reply.to_vec(), want, "connection {i}");
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }
    assert_eq!(server.join().unwrap(), N);
    drop(clients);
    eprintln!(
        "{N} connections: opened in {opened:?}, used and closed in {:?}",
        t.elapsed()
    );
    // Every client socket goes away (the server closed first and holds TIME-WAIT).
    let deadline = Instant::now() + Duration::from_secs(30);
    while a.stack().stats().recycled < N as u64 {
        assert!(
            Instant::now() < deadline,
            "not recycled: {:?}",
            a.stack().stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(b.stack().stats().accepted, N as u64);
}
