//! The few Linux syscalls the engine loop and the virtual wire need, on top of `rustix`:
//! `eventfd(2)` for wakeups and `ppoll(2)` for sleeping on several descriptors.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::io::Errno;

/// A non-blocking, close-on-exec eventfd used as a wakeup signal.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// Create a new eventfd with a zero counter.
    pub fn new() -> io::Result<Self> {
        let fd = rustix::event::eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
        Ok(Self { fd })
    }

    /// Add one to the counter, making the descriptor readable. Never blocks; a counter
    /// that is already saturated (impossible in practice) is reported as success because
    /// the descriptor is readable anyway.
    pub fn notify(&self) -> io::Result<()> {
        match rustix::io::write(&self.fd, &1u64.to_ne_bytes()) {
            Ok(_) | Err(Errno::AGAIN) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Reset the counter to zero. Returns `true` if it was non-zero (a notification was
    /// pending).
    pub fn drain(&self) -> io::Result<bool> {
        let mut value = [0u8; 8];
        match rustix::io::read(&self.fd, &mut value[..]) {
            Ok(_) => Ok(u64::from_ne_bytes(value) != 0),
            Err(Errno::AGAIN) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Wait until one of `fds` is readable or `timeout` passes (`None`: no timeout), with
/// `ppoll(2)`. On return, `readable[i]` tells whether `fds[i]` was readable (or in error or
/// hung up). `EINTR` counts as an ordinary wakeup with nothing readable. Negative entries are
/// ignored, as `ppoll` does. At most 4 descriptors are supported.
pub fn wait_readable(
    fds: &[RawFd],
    readable: &mut [bool],
    timeout: Option<Duration>,
) -> io::Result<()> {
    const MAX: usize = 4;
    if fds.len() > MAX || readable.len() < fds.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "wait_readable: at most 4 descriptors and one result slot each",
        ));
    }
    let ts = timeout.map(|d| Timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: i64::from(d.subsec_nanos()),
    });
    // Which `fds` index each poll entry stands for (the non-negative ones, in order).
    let mut index = [0usize; MAX];
    let mut n = 0;
    for (i, &fd) in fds.iter().enumerate() {
        if fd >= 0 {
            index[n] = i;
            n += 1;
        }
    }
    let borrow = |i: usize| {
        // SAFETY: `fds[index[i]]` is non-negative (so not the -1 a `BorrowedFd` cannot hold),
        // and the borrow lives only inside this call, where `poll` hands the number to the
        // kernel and nothing else: it is never read, written or closed here, and a number
        // that is not open comes back as POLLNVAL, not as an effect on some other file.
        let fd = unsafe { BorrowedFd::borrow_raw(fds[index[i.min(n.saturating_sub(1))]]) };
        PollFd::from_borrowed_fd(fd, PollFlags::IN)
    };
    readable.iter_mut().for_each(|r| *r = false);
    let result = if n == 0 {
        // Nothing to watch: just sleep.
        rustix::event::poll(&mut [], ts.as_ref()).map(|_| ())
    } else {
        // A fixed array (entries past `n` repeat the last one and are not passed to the
        // kernel) keeps the sleep path allocation-free.
        let mut pfds: [PollFd<'_>; MAX] = std::array::from_fn(borrow);
        let pfds = &mut pfds[..n];
        rustix::event::poll(pfds, ts.as_ref()).map(|_| {
            let woke = PollFlags::IN | PollFlags::ERR | PollFlags::HUP;
            for (p, &i) in pfds.iter().zip(&index[..n]) {
                readable[i] = p.revents().intersects(woke);
            }
        })
    };
    match result {
        Ok(()) | Err(Errno::INTR) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The kernel thread id of the calling thread.
pub fn current_tid() -> i32 {
    rustix::thread::gettid().as_raw_nonzero().get()
}

/// CPU time (user + system) consumed so far by thread `tid` of this process, read from
/// `/proc/self/task/<tid>/stat` (clock-tick resolution, usually 10 ms).
pub fn thread_cpu_time(tid: i32) -> io::Result<Duration> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))?;
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "unexpected /proc stat format");
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let rest = text.rsplit_once(')').ok_or_else(bad)?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': index 0 is field 3 (state); utime is field 14, stime field 15.
    let utime: u64 = fields
        .get(11)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let stime: u64 = fields
        .get(12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let hz = match rustix::param::clock_ticks_per_second() {
        0 => 100,
        hz => hz,
    };
    let ticks = utime.saturating_add(stime);
    Ok(Duration::from_nanos(
        ticks.saturating_mul(1_000_000_000) / hz,
    ))
}
