//! `xwarp bench tcp` traffic: bulk transfer and ping-pong over a connected stream of
//! either kind (kernel socket or xwarp engine), and the pinning of the threads that run them.

use std::io::{self, Read, Write};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use xwarp::net::{Shutdown, TcpStream};

use super::super::common::{pattern, thread_cpu, PATTERN_PERIOD};
use super::super::progress;
use super::options::{Options, Pin, PING_SIZE, WARMUP};
/// A connected byte stream of either kind.
pub(super) trait Conn: Read + Write + Send {
    fn shutdown_write(&mut self) -> io::Result<()>;
    fn prepare(&mut self, app_spin: Duration) -> io::Result<()>;
    /// TCP retransmissions of this end so far, where its stack counts them.
    fn retransmits(&self) -> Option<u64>;
    /// Non-blocking reads and writes (`WouldBlock` when nothing can move).
    fn set_nonblocking(&mut self, on: bool) -> io::Result<()>;
    /// DSACKs this end received so far (its spurious retransmissions), where its stack
    /// counts them.
    fn dsacks(&self) -> Option<u64>;
    /// Close at once with a reset where the stack can (a loss row's end).
    fn abort(self: Box<Self>);
    /// Retransmission timeouts of this end so far, where its stack counts them per
    /// connection (the own TCP core; kernel ends are counted per namespace instead).
    fn rtos(&self) -> Option<u64> {
        None
    }
    /// One line of this end's TCP state for `XWARP_LOSS_TRACE` (xwarp ends only).
    fn trace_line(&self) -> Option<String> {
        None
    }
}

impl Conn for std::net::TcpStream {
    fn shutdown_write(&mut self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
    fn prepare(&mut self, _app_spin: Duration) -> io::Result<()> {
        self.set_nodelay(true)
    }
    fn retransmits(&self) -> Option<u64> {
        progress::kernel_retransmits(std::os::fd::AsRawFd::as_raw_fd(self))
    }
    fn set_nonblocking(&mut self, on: bool) -> io::Result<()> {
        std::net::TcpStream::set_nonblocking(self, on)
    }
    fn dsacks(&self) -> Option<u64> {
        progress::kernel_tcp_info(std::os::fd::AsRawFd::as_raw_fd(self))
            .map(|i| u64::from(i.tcpi_dsack_dups))
    }
    fn abort(self: Box<Self>) {
        // SO_LINGER 0: close sends a reset and frees the socket at once.
        let l = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: valid fd; `l` is a live linger struct of the size given.
        unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&*self),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&l as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
        }
    }
}

/// A kernel socket that never sleeps: non-blocking, `SO_BUSY_POLL` set (the kernel polls
/// the device queue in the read when it has one to poll), and every read and write spins
/// until it can move a byte (bounded: [`SPIN_LIMIT`] without progress is an error).
pub(super) struct Spinning(pub(super) std::net::TcpStream);

/// How long a [`Spinning`] call spins without progress before it gives up.
const SPIN_LIMIT: Duration = Duration::from_secs(10);
/// `SO_BUSY_POLL` of the spinning sockets, µs.
pub(super) const BUSY_POLL_US: i32 = 50;

impl Spinning {
    pub(super) fn new(s: std::net::TcpStream) -> io::Result<Spinning> {
        s.set_nonblocking(true)?;
        let v: libc::c_int = BUSY_POLL_US;
        // SAFETY: valid fd; `v` is a live c_int of the size given.
        let r = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&s),
                libc::SOL_SOCKET,
                libc::SO_BUSY_POLL,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::new(
                io::Error::last_os_error().kind(),
                format!("SO_BUSY_POLL: {}", io::Error::last_os_error()),
            ));
        }
        Ok(Spinning(s))
    }

    fn spin<T>(
        &mut self,
        mut f: impl FnMut(&mut std::net::TcpStream) -> io::Result<T>,
    ) -> io::Result<T> {
        let t0 = Instant::now();
        loop {
            match f(&mut self.0) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if t0.elapsed() > SPIN_LIMIT {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "busy-poll socket: no progress for 10 s",
                        ));
                    }
                    std::hint::spin_loop();
                }
                r => return r,
            }
        }
    }
}

impl Read for Spinning {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.spin(|s| s.read(buf))
    }
}

impl Write for Spinning {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.spin(|s| s.write(buf))
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Conn for Spinning {
    fn shutdown_write(&mut self) -> io::Result<()> {
        self.0.shutdown(Shutdown::Write)
    }
    fn prepare(&mut self, _app_spin: Duration) -> io::Result<()> {
        self.0.set_nodelay(true)
    }
    fn retransmits(&self) -> Option<u64> {
        self.0.retransmits()
    }
    fn set_nonblocking(&mut self, _on: bool) -> io::Result<()> {
        Ok(())
    }
    fn dsacks(&self) -> Option<u64> {
        self.0.dsacks()
    }
    fn abort(self: Box<Self>) {
        Box::new(self.0).abort()
    }
}

impl Conn for TcpStream {
    fn shutdown_write(&mut self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
    fn prepare(&mut self, app_spin: Duration) -> io::Result<()> {
        self.set_spin(app_spin);
        self.set_nodelay(true)
    }
    /// The engine's loss-rescue retransmissions (`TcpInfo::retransmits`).
    fn retransmits(&self) -> Option<u64> {
        self.tcp_info().ok().map(|i| u64::from(i.retransmits))
    }
    fn set_nonblocking(&mut self, on: bool) -> io::Result<()> {
        TcpStream::set_nonblocking(self, on)
    }
    /// smoltcp counts no DSACKs (it discards the SACK blocks it receives).
    fn dsacks(&self) -> Option<u64> {
        None
    }
    fn abort(self: Box<Self>) {
        let _ = TcpStream::abort(*self);
    }
    fn rtos(&self) -> Option<u64> {
        self.tcp_info().ok().map(|i| u64::from(i.rtos))
    }
    fn trace_line(&self) -> Option<String> {
        self.tcp_info().ok().map(|i| {
            format!(
                "cwnd {} rto {:?} srtt {:?} rtos {} tlps {} frs {} dsacks {} retr {} sendq {} acked {}",
                i.cwnd,
                i.rto,
                i.rtt,
                i.rtos,
                i.tlps,
                i.fast_recoveries,
                i.dsacks,
                i.retransmits,
                i.send_queue,
                i.bytes_acked
            )
        })
    }
}

/// Core ids for (side A / engines, side B / apps).
pub(super) fn cores() -> (Option<usize>, Option<usize>) {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    match ids.len() {
        0 => (None, None),
        1 => (Some(ids[0].id), Some(ids[0].id)),
        _ => (Some(ids[0].id), Some(ids[1].id)),
    }
}

pub(super) fn pin_to(core: Option<usize>) {
    if let Some(id) = core {
        core_affinity::set_for_current(core_affinity::CoreId { id });
    }
}

/// Cores of (client app, server app, engine A, engine B).
pub(super) fn placement(pin: Pin) -> [Option<usize>; 4] {
    let (c0, c1) = cores();
    match pin {
        Pin::Sides => [c0, c1, c0, c1],
        Pin::Split => [c1, c1, c0, c0],
        Pin::None => [None; 4],
    }
}

pub(super) struct BulkSide {
    pub(super) bytes: u64,
    pub(super) elapsed: Duration,
    pub(super) cpu: Duration,
}

/// Client side of a bulk run: write for `dur`, then FIN. The pattern is generated once
/// (`msg` + one period) and every message is a window into it, so the sender spends its
/// time in `write`, not in making data.
pub(super) fn bulk_send(c: &mut dyn Conn, dur: Duration, msg: usize) -> io::Result<BulkSide> {
    let cpu0 = thread_cpu();
    let buf: Vec<u8> = (0..(msg as u64 + PATTERN_PERIOD)).map(pattern).collect();
    let t0 = Instant::now();
    let mut off = 0u64;
    // The retransmission count for the progress lines, four times a second.
    let mut next_sample = Duration::ZERO;
    loop {
        let now = t0.elapsed();
        if now >= dur {
            break;
        }
        if now >= next_sample {
            progress::set_retransmits(c.retransmits());
            next_sample = now + Duration::from_millis(250);
        }
        let start = (off % PATTERN_PERIOD) as usize;
        c.write_all(&buf[start..start + msg])?;
        off += msg as u64;
    }
    progress::set_retransmits(c.retransmits());
    c.shutdown_write()?;
    Ok(BulkSide {
        bytes: off,
        elapsed: t0.elapsed(),
        cpu: thread_cpu() - cpu0,
    })
}

/// Server side of a bulk run: read to end of stream, checking the pattern.
pub(super) fn bulk_recv(c: &mut dyn Conn) -> io::Result<BulkSide> {
    let cpu0 = thread_cpu();
    let mut buf = vec![0u8; 256 << 10];
    let mut off = 0u64;
    let mut t0 = None;
    loop {
        let n = c.read(&mut buf)?;
        if n == 0 {
            break;
        }
        t0.get_or_insert_with(Instant::now);
        // Check a few bytes of every read: catches loss, duplication and misordering
        // without making the receiver's loop about checking.
        for k in [0, n / 2, n - 1] {
            if buf[k] != pattern(off + k as u64) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bulk data mismatch at offset {}", off + k as u64),
                ));
            }
        }
        off += n as u64;
        progress::add(n as u64);
    }
    // Tell the sender we are done (it waits for our FIN).
    c.shutdown_write()?;
    Ok(BulkSide {
        bytes: off,
        elapsed: t0.map(|t| t.elapsed()).unwrap_or_default(),
        cpu: thread_cpu() - cpu0,
    })
}

/// Client side of ping-pong: returns the half-round-trip histogram (ns).
pub(super) fn ping(c: &mut dyn Conn, dur: Duration) -> io::Result<Histogram<u64>> {
    let mut h = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3)
        .map_err(|e| io::Error::other(format!("histogram: {e}")))?;
    let mut msg = [0u8; PING_SIZE];
    let mut back = [0u8; PING_SIZE];
    let mut i = 0u32;
    let mut t_end = None;
    loop {
        msg[..4].copy_from_slice(&i.to_le_bytes());
        let t = Instant::now();
        c.write_all(&msg)?;
        c.read_exact(&mut back)?;
        let rtt = t.elapsed();
        if back != msg {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "ping-pong reply differs from the request",
            ));
        }
        i = i.wrapping_add(1);
        if i == WARMUP {
            t_end = Some(Instant::now() + dur);
        }
        if let Some(end) = t_end {
            let _ = h.record((rtt.as_nanos() / 2).max(1) as u64);
            if Instant::now() >= end {
                break;
            }
        }
    }
    c.shutdown_write()?;
    let mut rest = [0u8; 1];
    let _ = c.read(&mut rest)?;
    Ok(h)
}

/// Server side of ping-pong: echo 64-byte messages until end of stream.
pub(super) fn pong(c: &mut dyn Conn) -> io::Result<()> {
    let mut msg = [0u8; PING_SIZE];
    loop {
        let mut got = 0;
        while got < PING_SIZE {
            let n = c.read(&mut msg[got..])?;
            if n == 0 {
                return if got == 0 {
                    c.shutdown_write()
                } else {
                    Err(io::ErrorKind::UnexpectedEof.into())
                };
            }
            got += n;
        }
        c.write_all(&msg)?;
    }
}

/// Something that accepts one connection on the server side.
pub(super) type Acceptor = Box<dyn FnOnce() -> io::Result<Box<dyn Conn>> + Send>;
/// Something that opens the client connection.
pub(super) type Connector<'a> = Box<dyn FnOnce() -> io::Result<Box<dyn Conn>> + 'a>;

pub(super) struct Ends {
    pub(super) client_core: Option<usize>,
    pub(super) server_core: Option<usize>,
}

/// Run bulk over one connection with `msg`-byte writes: server on its own thread, client
/// on another.
pub(super) fn run_bulk(
    ends: &Ends,
    accept: Acceptor,
    connect: Connector<'_>,
    o: &Options,
    msg: usize,
) -> io::Result<(BulkSide, BulkSide)> {
    let server_core = ends.server_core;
    let app_spin = o.app_spin;
    let (tx, rx) = mpsc::channel();
    let server = std::thread::Builder::new()
        .name("bench-server".into())
        .spawn(move || {
            pin_to(server_core);
            let r = accept().and_then(|mut c| {
                c.prepare(app_spin)?;
                bulk_recv(&mut *c)
            });
            let _ = tx.send(());
            r
        })?;
    let mut c = connect()?;
    c.prepare(o.app_spin)?;
    let (dur, client_core) = (o.duration, ends.client_core);
    let client = std::thread::scope(|s| {
        s.spawn(move || {
            pin_to(client_core);
            let r = bulk_send(&mut *c, dur, msg);
            // Wait for the server's FIN so the connection is idle when we return.
            let mut b = [0u8; 1];
            let _ = c.read(&mut b);
            r
        })
        .join()
    })
    .map_err(|_| io::Error::other("bulk client panicked"))??;
    let _ = rx.recv_timeout(dur + Duration::from_secs(30));
    let server = server
        .join()
        .map_err(|_| io::Error::other("bulk server panicked"))??;
    if server.bytes != client.bytes {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("sent {} bytes, received {}", client.bytes, server.bytes),
        ));
    }
    Ok((client, server))
}

/// Run ping-pong over one connection.
pub(super) fn run_ping(
    ends: &Ends,
    accept: Acceptor,
    connect: Connector<'_>,
    o: &Options,
) -> io::Result<Histogram<u64>> {
    let server_core = ends.server_core;
    let app_spin = o.app_spin;
    let server = std::thread::Builder::new()
        .name("bench-pong".into())
        .spawn(move || {
            pin_to(server_core);
            accept().and_then(|mut c| {
                c.prepare(app_spin)?;
                pong(&mut *c)
            })
        })?;
    let mut c = connect()?;
    c.prepare(o.app_spin)?;
    let (dur, client_core) = (o.duration, ends.client_core);
    let h = std::thread::scope(|s| {
        s.spawn(move || {
            pin_to(client_core);
            ping(&mut *c, dur)
        })
        .join()
    })
    .map_err(|_| io::Error::other("ping client panicked"))??;
    server
        .join()
        .map_err(|_| io::Error::other("pong server panicked"))??;
    Ok(h)
}
