//! Per-second progress of a bandwidth measurement, as perftest and iperf3 print it: a
//! [`Meter`] thread wakes every second and prints, on stderr, the interval, the bytes the
//! receiver counted ([`add`]) and the bandwidth, and the sending socket's TCP
//! retransmissions where the sending stack counts them ([`set_retransmits`]):
//!
//! ```text
//! [bulk kernel-kernel 65536 B]   1.00-2.00 s    1.152 GB    9.22 Gbit/s   retr 0
//! ```
//!
//! One measurement at a time per process (the benches run their tests one after the
//! other): the counters are process-wide relaxed atomics, one add per receive, read once a
//! second. [`set_quiet`] (`--quiet`) stops the printing; the intervals are still kept for
//! the JSON report.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::report::Interval;

/// Bytes received since the current meter started.
static BYTES: AtomicU64 = AtomicU64::new(0);
/// The sender's retransmission count since its connection opened (`u64::MAX`: unknown).
static RETRANS: AtomicU64 = AtomicU64::new(u64::MAX);
/// No progress lines (`--quiet`).
static QUIET: AtomicBool = AtomicBool::new(false);
/// The intervals of every meter finished since the last [`take_log`].
static LOG: Mutex<Vec<Interval>> = Mutex::new(Vec::new());

/// The shortest final partial interval that is reported.
const MIN_TAIL: Duration = Duration::from_millis(50);

/// Count `n` bytes received (the receiving loop of a bandwidth measurement).
#[inline]
pub fn add(n: u64) {
    BYTES.fetch_add(n, Ordering::Relaxed);
}

/// The sending socket's retransmissions so far (cumulative; `None`: not counted).
pub fn set_retransmits(total: Option<u64>) {
    RETRANS.store(total.unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// Print no progress lines from now on (`--quiet`).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// A running progress meter; [`Meter::finish`] stops it.
pub struct Meter {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Interval>>>,
}

/// The intervals of the meters finished since the last call (for the JSON report).
pub fn take_log() -> Vec<Interval> {
    LOG.lock()
        .map(|mut l| std::mem::take(&mut *l))
        .unwrap_or_default()
}

/// Start a meter for the row `test` / `name` (message size `size`): resets the counters.
pub fn start(test: &str, name: &str, size: Option<usize>) -> Meter {
    BYTES.store(0, Ordering::Relaxed);
    RETRANS.store(u64::MAX, Ordering::Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let (test, name, st) = (test.to_string(), name.to_string(), stop.clone());
    let thread = std::thread::Builder::new()
        .name("bench-progress".into())
        .spawn(move || tick(&test, &name, size, &st))
        .ok();
    Meter { stop, thread }
}

impl Meter {
    /// Stop the meter (the last partial interval is reported if it is long enough) and
    /// return the intervals (also kept for [`take_log`]).
    pub fn finish(mut self) -> Vec<Interval> {
        self.stop.store(true, Ordering::Relaxed);
        let iv = match self.thread.take() {
            Some(t) => {
                t.thread().unpark();
                t.join().unwrap_or_default()
            }
            None => Vec::new(),
        };
        if let Ok(mut log) = LOG.lock() {
            log.extend(iv.iter().cloned());
        }
        iv
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn tick(test: &str, name: &str, size: Option<usize>, stop: &AtomicBool) -> Vec<Interval> {
    let t0 = Instant::now();
    let mut out = Vec::new();
    let (mut last_t, mut last_b) = (Duration::ZERO, 0u64);
    let mut last_r = None::<u64>;
    let label = match size {
        Some(s) => format!("{test} {name} {s} B"),
        None => format!("{test} {name}"),
    };
    for k in 1u32.. {
        let due = Duration::from_secs(k.into());
        while !stop.load(Ordering::Relaxed) && t0.elapsed() < due {
            std::thread::park_timeout(due.saturating_sub(t0.elapsed()));
        }
        let stopped = stop.load(Ordering::Relaxed);
        let now = t0.elapsed().min(due);
        if stopped && now - last_t < MIN_TAIL {
            break;
        }
        let bytes = BYTES.load(Ordering::Relaxed);
        let retr = match RETRANS.load(Ordering::Relaxed) {
            u64::MAX => None,
            r => Some(r),
        };
        let db = bytes.saturating_sub(last_b);
        let secs = (now - last_t).as_secs_f64().max(1e-9);
        let iv = Interval {
            test: test.into(),
            name: name.into(),
            size: size.map(|s| s as u64),
            start_s: round3(last_t.as_secs_f64()),
            end_s: round3(now.as_secs_f64()),
            bytes: db,
            gbps: round3(db as f64 * 8.0 / secs / 1e9),
            retransmits: retr.map(|r| r.saturating_sub(last_r.unwrap_or(0))),
        };
        if !QUIET.load(Ordering::Relaxed) {
            eprintln!("{}", line(&label, &iv));
        }
        out.push(iv);
        (last_t, last_b, last_r) = (now, bytes, retr.or(last_r));
        if stopped {
            break;
        }
    }
    out
}

fn round3(v: f64) -> f64 {
    (v * 1e3).round() / 1e3
}

/// One progress line.
pub fn line(label: &str, iv: &Interval) -> String {
    format!(
        "[{label}] {:>16} {:>9.3} GB {:>8.2} Gbit/s   retr {}",
        format!("{:.2}-{:.2} s", iv.start_s, iv.end_s),
        iv.bytes as f64 / 1e9,
        iv.gbps,
        iv.retransmits
            .map(|r| r.to_string())
            .unwrap_or_else(|| "-".into())
    )
}

/// `TCP_INFO` of a kernel socket, `None` when it cannot be read.
pub fn kernel_tcp_info(fd: std::os::fd::RawFd) -> Option<libc::tcp_info> {
    // SAFETY: all-zero is a valid `tcp_info` (plain integers).
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is a live, writable tcp_info of `len` bytes; getsockopt writes at
    // most `len` bytes and stores the length it wrote.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(info)
}

/// The retransmissions the kernel counted on `fd`'s TCP connection (`TCP_INFO`
/// `tcpi_total_retrans`), `None` when it cannot be read.
pub fn kernel_retransmits(fd: std::os::fd::RawFd) -> Option<u64> {
    kernel_tcp_info(fd).map(|i| u64::from(i.tcpi_total_retrans))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One meter over a counted stream: the intervals add up to the bytes and cover the
    /// time; the kernel's retransmission count of a loopback connection reads as zero.
    #[test]
    fn meter_reports_intervals_that_add_up() {
        set_quiet(true);
        let m = start("bulk", "test", Some(64));
        let t0 = Instant::now();
        let mut n = 0u64;
        while t0.elapsed() < Duration::from_millis(1300) {
            add(1000);
            n += 1000;
            std::thread::sleep(Duration::from_millis(1));
        }
        set_retransmits(Some(3));
        let iv = m.finish();
        set_quiet(false);
        assert_eq!(iv.len(), 2, "{iv:?}");
        assert_eq!(iv.iter().map(|i| i.bytes).sum::<u64>(), n);
        assert_eq!((iv[0].start_s, iv[0].end_s, iv[1].start_s), (0.0, 1.0, 1.0));
        assert!(iv[1].end_s >= 1.29, "{iv:?}");
        assert_eq!(iv[1].retransmits, Some(3));
        assert!(
            line("x", &iv[0]).contains("retr -"),
            "{}",
            line("x", &iv[0])
        );
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        use std::os::fd::AsRawFd;
        assert_eq!(kernel_retransmits(c.as_raw_fd()), Some(0));
        assert_eq!(kernel_retransmits(-1), None);
    }
}
