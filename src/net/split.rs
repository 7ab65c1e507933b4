//! A [`TcpStream`] split into a [`ReadHalf`] and a [`WriteHalf`] that two threads use at
//! once (one blocked reading while the other writes), std's `try_clone` use case.
//!
//! Why a split and not `try_clone`: a connection's bytes move through two
//! single-producer/single-consumer rings, one per direction, with no descriptor to
//! duplicate. A clone that could read (or write) on two threads would have to serialize
//! every ring access, and two readers of one byte stream get unpredictable pieces of it
//! anyway; a read half and a write half give each thread the ring end it needs, which is
//! what `try_clone` is used for in practice.
//!
//! The halves share the stream behind a mutex that is held only for the non-blocking
//! copy into or out of a ring, never while waiting. Each half waits on its own
//! edge-triggered epoll registration of the stream's readiness eventfd: the descriptor
//! is one for both directions, and a thread that drained it (what a plain `poll` wait
//! does) could swallow the wakeup meant for the other thread. An edge-triggered
//! registration reports every signal of the eventfd to every registration, whoever reads
//! the counter, so neither half can lose the other's wakeup; the counter itself is never
//! drained by the halves (each signal adds one, far from its 2^64 limit).

use std::io::{self, Read, Write};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::event::epoll;
use xwarp_poll_driver::engine::InlineDriver;

use super::{Shutdown, TcpStream};

/// The stream both halves share.
#[derive(Debug)]
struct Core {
    stream: Mutex<TcpStream>,
    /// The engine's inline driver (inline mode): both halves' blocking calls drive.
    driver: Option<InlineDriver>,
}

impl Core {
    fn lock(&self) -> MutexGuard<'_, TcpStream> {
        // A panic while the lock was held left the stream itself consistent (every
        // operation under the lock is one non-blocking ring access).
        self.stream.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An edge-triggered epoll registration of a readiness descriptor.
#[derive(Debug)]
struct EdgeWait {
    epoll: OwnedFd,
}

impl EdgeWait {
    fn new(source: impl AsFd) -> io::Result<EdgeWait> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(
            &epoll,
            source,
            epoll::EventData::new_u64(0),
            epoll::EventFlags::IN | epoll::EventFlags::ET,
        )?;
        Ok(EdgeWait { epoll })
    }

    /// Sleep until the descriptor was signalled since the last wakeup (`true`) or
    /// `deadline` passes (`false`).
    fn wait(&self, deadline: Option<Instant>) -> io::Result<bool> {
        loop {
            let timeout = match deadline {
                None => None,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(false);
                    }
                    Some(rustix::event::Timespec {
                        tv_sec: left.as_secs() as i64,
                        tv_nsec: i64::from(left.subsec_nanos()),
                    })
                }
            };
            let mut events = [MaybeUninit::<epoll::Event>::uninit(); 1];
            match epoll::wait(&self.epoll, &mut events, timeout.as_ref()) {
                Ok((ready, _)) if !ready.is_empty() => return Ok(true),
                Ok(_) => continue,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Retry `op` until it stops returning `WouldBlock`: spin for `spin`, then sleep on
/// `wait` until `deadline` (then `TimedOut`).
fn blocking<T>(
    driver: Option<&InlineDriver>,
    spin: Duration,
    deadline: Option<Instant>,
    wait: &EdgeWait,
    mut op: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    let spin_until = Instant::now() + super::spin_budget(driver, spin);
    loop {
        match op() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return r,
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "operation timed out",
            ));
        }
        if now < spin_until {
            super::spin_round(driver);
            continue;
        }
        super::before_sleep(driver);
        wait.wait(deadline)?;
    }
}

fn check_timeout(t: Option<Duration>) -> io::Result<()> {
    if t == Some(Duration::ZERO) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "zero timeout"));
    }
    Ok(())
}

/// The reading half of a split [`TcpStream`] (see the [module docs](self)).
#[derive(Debug)]
pub struct ReadHalf {
    core: Arc<Core>,
    wait: EdgeWait,
    timeout: Option<Duration>,
    spin: Duration,
}

/// The writing half of a split [`TcpStream`] (see the [module docs](self)). Dropping it
/// does not close anything: the connection closes (gracefully, honouring the stream's
/// linger time) once both halves are dropped; [`WriteHalf::shutdown`] sends FIN earlier.
#[derive(Debug)]
pub struct WriteHalf {
    core: Arc<Core>,
    wait: EdgeWait,
    timeout: Option<Duration>,
    spin: Duration,
}

pub(super) fn split(stream: TcpStream) -> io::Result<(ReadHalf, WriteHalf)> {
    let r = EdgeWait::new(stream.as_fd())?;
    let w = EdgeWait::new(stream.as_fd())?;
    let (read_timeout, write_timeout, spin) = stream.wait_settings();
    let driver = stream.inline_driver();
    let core = Arc::new(Core {
        driver,
        stream: Mutex::new(stream),
    });
    Ok((
        ReadHalf {
            core: core.clone(),
            wait: r,
            timeout: read_timeout,
            spin,
        },
        WriteHalf {
            core,
            wait: w,
            timeout: write_timeout,
            spin,
        },
    ))
}

/// Put two halves of one stream back together; the halves come back in the error if
/// they belong to different streams.
pub fn reunite(r: ReadHalf, w: WriteHalf) -> Result<TcpStream, (ReadHalf, WriteHalf)> {
    if !Arc::ptr_eq(&r.core, &w.core) {
        return Err((r, w));
    }
    let core = r.core;
    drop(w.core);
    match Arc::try_unwrap(core) {
        Ok(c) => Ok(c.stream.into_inner().unwrap_or_else(|p| p.into_inner())),
        // Only the two halves ever hold the core.
        Err(_) => unreachable!("a split stream's core has exactly two owners"),
    }
}

impl ReadHalf {
    /// Read timeout for blocking reads (`None`: wait forever; zero is rejected).
    pub fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        check_timeout(t)?;
        self.timeout = t;
        Ok(())
    }

    /// Close the read direction: further reads return `Ok(0)` (as
    /// [`TcpStream::shutdown`] with `Read`).
    pub fn shutdown(&self) -> io::Result<()> {
        self.core.lock().shutdown(Shutdown::Read)
    }

    /// Peer address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.core.lock().peer_addr()
    }

    /// Local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.core.lock().local_addr()
    }

    /// `true` if `w` is the other half of this stream.
    pub fn is_pair_of(&self, w: &WriteHalf) -> bool {
        Arc::ptr_eq(&self.core, &w.core)
    }
}

impl Read for ReadHalf {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let deadline = self.timeout.map(|t| Instant::now() + t);
        let core = &self.core;
        blocking(
            self.core.driver.as_ref(),
            self.spin,
            deadline,
            &self.wait,
            || core.lock().try_read_now(buf),
        )
    }
}

impl WriteHalf {
    /// Write timeout for blocking writes (`None`: wait forever; zero is rejected).
    pub fn set_write_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        check_timeout(t)?;
        self.timeout = t;
        Ok(())
    }

    /// Send FIN after the queued data; the read half keeps reading (as
    /// [`TcpStream::shutdown`] with `Write`).
    pub fn shutdown(&self) -> io::Result<()> {
        self.core.lock().shutdown(Shutdown::Write)
    }

    /// Peer address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.core.lock().peer_addr()
    }

    /// Local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.core.lock().local_addr()
    }

    /// `TCP_NODELAY` on the connection.
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.core.lock().set_nodelay(nodelay)
    }
}

impl Write for WriteHalf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let deadline = self.timeout.map(|t| Instant::now() + t);
        let core = &self.core;
        blocking(
            self.core.driver.as_ref(),
            self.spin,
            deadline,
            &self.wait,
            || core.lock().try_write_now(buf),
        )
    }

    /// Data is handed to the engine by `write` already; nothing to flush.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::hash::{DefaultHasher, Hasher};
    use std::net::{Ipv4Addr, SocketAddr};

    use super::*;
    use crate::net::{vwire_pair_with, PairConfig, TcpListener};

    fn byte(seed: u64, i: u64) -> u8 {
        ((i ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8 ^ (i / 4093) as u8
    }

    /// One stream, two threads at once: one writes 8 MiB while the other reads the echo
    /// (the rings are far smaller, so neither could finish alone); every byte checked.
    #[test]
    fn two_threads_read_and_write_one_stream() {
        const TOTAL: u64 = 8 << 20;
        let mut cfg = PairConfig::default();
        for c in [&mut cfg.a, &mut cfg.b] {
            c.ring_size = 16 << 10;
            c.rx_buffer = 32 << 10;
            c.tx_buffer = 32 << 10;
        }
        let (a, b) = vwire_pair_with(cfg).unwrap();
        let at = SocketAddr::from((Ipv4Addr::new(10, 77, 0, 2), 7));
        let listener = TcpListener::bind(b.stack(), at).unwrap();
        // The echo server splits too: its reader thread hands chunks to its writer.
        let server = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let (mut r, mut w) = s.into_split().unwrap();
            let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(4);
            let back = std::thread::spawn(move || {
                for chunk in rx {
                    w.write_all(&chunk).unwrap();
                }
                w.shutdown().unwrap();
            });
            let mut buf = vec![0u8; 24 << 10];
            loop {
                let n = r.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                tx.send(buf[..n].to_vec()).unwrap();
            }
            drop(tx);
            back.join().unwrap();
        });
        let c = TcpStream::connect(a.stack(), at).unwrap();
        let (mut r, mut w) = c.into_split().unwrap();
        assert!(r.is_pair_of(&w));
        assert_eq!(r.peer_addr().unwrap(), at);
        w.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
        r.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let writer = std::thread::spawn(move || {
            let mut h = DefaultHasher::new();
            let mut buf = vec![0u8; 10_007];
            let mut off = 0u64;
            while off < TOTAL {
                let n = (buf.len() as u64).min(TOTAL - off) as usize;
                for (k, b) in buf[..n].iter_mut().enumerate() {
                    *b = byte(5, off + k as u64);
                }
                w.write_all(&buf[..n]).unwrap();
                h.write(&buf[..n]);
                off += n as u64;
            }
            w.shutdown().unwrap();
            (w, h.finish())
        });
        let mut h = DefaultHasher::new();
        let mut got = 0u64;
        let mut buf = vec![0u8; 7919];
        loop {
            let n = r.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            for (k, &b) in buf[..n].iter().enumerate() {
                assert_eq!(b, byte(5, got + k as u64), "byte {}", got + k as u64);
            }
            h.write(&buf[..n]);
            got += n as u64;
        }
        let (w, sent) = writer.join().unwrap();
        server.join().unwrap();
        assert_eq!((got, h.finish()), (TOTAL, sent));
        // The halves go back together into one stream.
        let s = reunite(r, w).unwrap();
        assert_eq!(s.peer_addr().unwrap(), at);
    }

    #[test]
    fn halves_of_different_streams_do_not_reunite_and_timeouts_are_checked() {
        let (a, b) = vwire_pair_with(PairConfig::default()).unwrap();
        let at = SocketAddr::from((Ipv4Addr::new(10, 77, 0, 2), 8));
        let listener = TcpListener::bind(b.stack(), at).unwrap();
        let c1 = TcpStream::connect(a.stack(), at).unwrap();
        let (s1, _) = listener.accept().unwrap();
        let (mut r1, _w1) = c1.into_split().unwrap();
        let (_r2, w2) = s1.into_split().unwrap();
        assert!(!r1.is_pair_of(&w2));
        let e = r1.set_read_timeout(Some(Duration::ZERO)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        // Nothing to read: the read half times out.
        r1.set_read_timeout(Some(Duration::from_millis(30)))
            .unwrap();
        let e = r1.read(&mut [0u8; 4]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let (r1, w2) = reunite(r1, w2).unwrap_err();
        drop((r1, w2));
    }
}
