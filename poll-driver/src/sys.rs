//! Thin, safe wrappers over the few Linux syscalls the engine loop and the virtual wire
//! need: `eventfd(2)` for wakeups and `ppoll(2)` for sleeping on several descriptors.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A non-blocking, close-on-exec eventfd used as a wakeup signal.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// Create a new eventfd with a zero counter.
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes no pointers; the flags are valid constants.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd })
    }

    /// Add one to the counter, making the descriptor readable. Never blocks; a counter
    /// that is already saturated (impossible in practice) is reported as success because
    /// the descriptor is readable anyway.
    pub fn notify(&self) -> io::Result<()> {
        let one: u64 = 1;
        // SAFETY: writes exactly 8 bytes from a live, properly aligned u64 to an fd we own.
        let n = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&one as *const u64).cast::<libc::c_void>(),
                std::mem::size_of::<u64>(),
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::WouldBlock {
                return Ok(());
            }
            return Err(err);
        }
        Ok(())
    }

    /// Reset the counter to zero. Returns `true` if it was non-zero (a notification was
    /// pending).
    pub fn drain(&self) -> io::Result<bool> {
        let mut value: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live, properly aligned u64 on an fd we own.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut value as *mut u64).cast::<libc::c_void>(),
                std::mem::size_of::<u64>(),
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::WouldBlock {
                return Ok(false);
            }
            return Err(err);
        }
        Ok(value != 0)
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Wait until one of `fds` is readable or `timeout` passes (`None`: no timeout).
/// On return, `readable[i]` tells whether `fds[i]` was readable. `EINTR` counts as an
/// ordinary wakeup with nothing readable. At most 4 descriptors are supported.
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
    let mut pfds = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; MAX];
    for (slot, &fd) in pfds.iter_mut().zip(fds) {
        slot.fd = fd;
        slot.events = libc::POLLIN;
    }
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `pfds` is a live array of at least `fds.len()` pollfd entries, `ts_ptr` is
    // null or points at a live timespec, and a null signal mask means "unchanged".
    let n = unsafe {
        libc::ppoll(
            pfds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            ts_ptr,
            std::ptr::null(),
        )
    };
    readable.iter_mut().for_each(|r| *r = false);
    if n < 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            return Ok(());
        }
        return Err(err);
    }
    for (r, p) in readable.iter_mut().zip(&pfds[..fds.len()]) {
        *r = p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0;
    }
    Ok(())
}

/// The kernel thread id of the calling thread.
pub fn current_tid() -> i32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
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
    // SAFETY: sysconf takes no pointers.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    let ticks = utime.saturating_add(stime);
    Ok(Duration::from_nanos(
        ticks.saturating_mul(1_000_000_000) / hz,
    ))
}
