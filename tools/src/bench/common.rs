//! Helpers the benches share: the engines' buffer and UMEM sizing for an MTU, CPU time of
//! a thread or the process, the bulk data pattern, the cores the process may use, and the
//! teardown on SIGINT/SIGTERM/SIGHUP ([`install_teardown`]).

use std::io::{self, Write as _};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use xwarp::poll_driver::netns;

use xwarp::poll_driver::afxdp::{ChunkSize, XDP_PACKET_HEADROOM};

/// The engines' TCP socket buffers for an IP MTU: 64 segments, at least 256 KiB, at most
/// 2 MiB (the application rings get half of it, at least 256 KiB). Small buffers stay in L2 (docs/performance.md §8.2; at MTU 1500 measured ~4.3 Gbit/s with
/// 256 KiB vs ~3.9 with 1 MiB and ~1.9 with 4 MiB), but 256 KiB holds only ~4 segments at
/// MTU 60000 and the sender stalls on every ACK: measured xwarp-xwarp at MTU 60000 17.2
/// Gbit/s with 256 KiB, 20.2 with 512 KiB, 20.7 with 2 MiB; at 16000 14.7 -> 17.0 with 1 MiB;
/// at 9000 13.1 -> 13.5 with 1 MiB.
pub fn socket_buffer(mtu: usize) -> usize {
    (64 * mtu.saturating_sub(40)).clamp(256 << 10, 2 << 20)
}

/// The UMEM layout the benches' AF_XDP sockets use for an IP MTU: 4096-byte chunks when a
/// 2048-byte chunk cannot hold the frame, and multi-buffer chains (`multi_buffer`) when a
/// 4096-byte chunk cannot either.
pub fn umem_for_mtu(mtu: usize) -> (ChunkSize, bool) {
    let frame = mtu + 14;
    let chunk = if frame > ChunkSize::C2048.max_frame_size() {
        ChunkSize::C4096
    } else {
        ChunkSize::C2048
    };
    (chunk, frame > ChunkSize::C4096.max_frame_size())
}

/// RX UMEM chunks for an engine whose one bulk connection advertises `rx_buffer` bytes of
/// receive window at IP MTU `mtu` (see [`xwarp::toe::XdpEngineConfig::rx_frames`]): the
/// chunks a full window of full-sized frames occupies, plus a quarter, plus 64 for ACKs
/// and other small frames.
///
/// Why not the 2048-chunk default: the kernel fills RX chunks in address order, so the
/// whole area cycles through the cache, and over a veth that copy runs on the sending
/// engine's core, the bottleneck. At MTU 60000 the default area is 7.5 MiB; the copy into
/// it took 15-23% of the sending core against 10-14% with 768 chunks (3 interleaved pairs
/// of 3 s `perf` samples of write_bw, which ran 19.4 / 18.3 / 22.2 Gbit/s against
/// 21.6 / 24.3 / 23.3).
pub fn rx_frames_for(mtu: usize, rx_buffer: usize) -> u32 {
    let (chunk, multi_buffer) = umem_for_mtu(mtu);
    // TCP payload of a full frame (20-byte IP and TCP headers, 12 bytes of timestamps).
    let mss = mtu.saturating_sub(52).max(1);
    let frames = rx_buffer.div_ceil(mss);
    let per_frame = if multi_buffer {
        // Copy-mode multi-buffer RX chunks carry chunk - XDP_PACKET_HEADROOM bytes each.
        let data = chunk.bytes() as usize - XDP_PACKET_HEADROOM as usize;
        (mtu + 14).div_ceil(data)
    } else {
        1
    };
    let chunks = frames * per_frame;
    u32::try_from(chunks + chunks / 4 + 64).unwrap_or(u32::MAX)
}

/// (user + system) CPU time of the calling thread.
pub fn thread_cpu() -> Duration {
    // SAFETY: all-zero is a valid `rusage`; getrusage only writes into it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a live rusage; RUSAGE_THREAD is a valid `who`.
    let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    if r != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU time (user + system) of this process so far, from `/proc/self/stat` (clock ticks
/// of 10 ms: USER_HZ is 100 on Linux). Without `CONFIG_IRQ_TIME_ACCOUNTING` the softirq
/// work a thread triggers (veth transmit and receive, TCP input) is charged to it, so the
/// kernel pair and the engines are measured alike. Zero when unreadable.
pub fn process_cpu() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return Duration::ZERO;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Duration::from_millis((tick(11) + tick(12)) * 10)
}

/// Period of the bulk data pattern: a prime, so the pattern repeats at no power of two
/// (a segment misplaced by a power-of-two offset is caught).
pub const PATTERN_PERIOD: u64 = 65521;

/// The pattern byte at stream offset `i`.
pub fn pattern(i: u64) -> u8 {
    let j = i % PATTERN_PERIOD;
    (j ^ (j >> 8) ^ (j >> 13).wrapping_mul(31)) as u8
}

/// The cores this process may use, read once (`xwarp bench rdma` asks before it pins anything):
/// `core_affinity::get_core_ids` reports the *calling thread's* mask, so asking after the
/// main thread pinned itself to side A would put every later thread on that one core.
pub fn process_cores() -> &'static [core_affinity::CoreId] {
    static CORES: std::sync::OnceLock<Vec<core_affinity::CoreId>> = std::sync::OnceLock::new();
    CORES.get_or_init(|| core_affinity::get_core_ids().unwrap_or_default())
}

/// Set once a teardown started: an exit of another thread then waits for it (see
/// [`install_teardown`]).
static TEARING_DOWN: AtomicBool = AtomicBool::new(false);

/// `atexit` hook: while a teardown runs, the thread that called `exit` (the bench, whose
/// namespaces just vanished, returning an error) waits for it; the teardown ends the
/// process with `_exit(128 + signo)`, which runs no `atexit` hook.
extern "C" fn wait_for_teardown() {
    while TEARING_DOWN.load(Ordering::Acquire) {
        std::thread::park_timeout(Duration::from_secs(1));
    }
}

/// On SIGINT (Ctrl-C), SIGTERM or SIGHUP, tear down what this bench made ([`teardown`]) and
/// exit with status 128 + the signal's number; `program` starts its messages (`xwarp
/// bench tcp`). Call it before the bench creates anything (`xwarp bench ...` do, in
/// `main`, and the perftest tools with `--veth`). The handler is `signal-hook`'s: the
/// signal only wakes a thread, which does the work outside signal context. A second signal
/// during the teardown is ignored (it is bounded: a few `ip` commands and waits of at most
/// 1 s).
pub fn install_teardown(program: &'static str) -> io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    // SAFETY: registers a plain `extern "C" fn()` that only reads an atomic and sleeps.
    if unsafe { libc::atexit(wait_for_teardown) } != 0 {
        return Err(io::Error::other("atexit failed"));
    }
    std::thread::Builder::new()
        .name("xwarp-teardown".into())
        .spawn(move || {
            let Some(sig) = signals.forever().next() else {
                return;
            };
            TEARING_DOWN.store(true, Ordering::Release);
            eprintln!("{program}: {} received, tearing down", signal_name(sig));
            let t = teardown();
            eprintln!("{program}: {t}");
            let _ = io::stdout().flush();
            let _ = io::stderr().flush();
            // SAFETY: _exit ends the process at once (no atexit hook, so no wait).
            unsafe { libc::_exit(128 + sig) }
        })?;
    Ok(())
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// What [`teardown`] removed.
#[derive(Debug, Default)]
pub struct Teardown {
    /// Namespaces deleted (with their veth pairs).
    pub namespaces: Vec<String>,
    /// Processes signalled: descendants of this process and anything in its namespaces.
    pub processes: Vec<u32>,
    /// Errors on the way (a namespace `ip` could not delete, ...).
    pub errors: Vec<String>,
}

impl std::fmt::Display for Teardown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "removed {} namespace(s) [{}], stopped {} process(es)",
            self.namespaces.len(),
            self.namespaces.join(" "),
            self.processes.len()
        )?;
        for e in &self.errors {
            write!(f, "; {e}")?;
        }
        Ok(())
    }
}

/// Tear down what this process made for a bench, safe at any point of its setup:
/// 1. stop further namespace creation ([`netns::hold_creation`]; kept until the process
///    ends) after the one being made, if any, exists;
/// 2. SIGTERM every descendant process (kernel peers, shim servers and their clients,
///    running `ip`) and every process inside this process's namespaces (a server that
///    daemonized), wait up to 1 s, SIGKILL what is left; repeated until none appears;
/// 3. delete every namespace named [`netns::name_prefix`] of this pid (their veth pairs
///    go with them);
/// 4. remove the stats segments of this process and of the processes it stopped.
///
/// The registry of what to tear down is the system's own: the names carry this pid, the
/// processes are found through `/proc`, so nothing made mid-setup escapes a list.
pub fn teardown() -> Teardown {
    let hold = netns::hold_creation();
    std::mem::forget(hold);
    let me = std::process::id();
    let prefix = netns::name_prefix(me);
    let ours = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir("/run/netns")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with(&prefix))
            .collect();
        v.sort();
        v
    };
    let mut t = Teardown::default();
    for _round in 0..5 {
        let mut pids = descendants(me);
        for ns in ours() {
            pids.extend(netns_pids(&ns));
        }
        pids.sort_unstable();
        pids.dedup();
        pids.retain(|p| *p != me && alive(*p));
        if pids.is_empty() {
            break;
        }
        for &p in &pids {
            signal(p, libc::SIGTERM);
        }
        let t0 = Instant::now();
        while pids.iter().any(|p| alive(*p)) && t0.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(10));
        }
        for &p in pids.iter().filter(|p| alive(**p)) {
            signal(p, libc::SIGKILL);
        }
        t.processes.extend(pids);
    }
    for ns in ours() {
        match netns::ip(&["netns", "del", &ns]) {
            Ok(_) => t.namespaces.push(ns),
            // The bench's own error path may have deleted it meanwhile.
            Err(_) if !Path::new("/run/netns").join(&ns).exists() => {}
            Err(e) => t.errors.push(e.to_string()),
        }
    }
    t.processes.sort_unstable();
    t.processes.dedup();
    remove_segments(&xwarp_telemetry::stats_dir(), me, &t.processes);
    t
}

/// Remove the stats segments (`xwarp-<pid>-<n>`) of `me` and of `others` in `dir`.
fn remove_segments(dir: &Path, me: u32, others: &[u32]) {
    let prefixes: Vec<String> = std::iter::once(me)
        .chain(others.iter().copied())
        .map(|p| format!("xwarp-{p}-"))
        .collect();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if prefixes.iter().any(|p| name.starts_with(p.as_str())) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The process's state letter and parent from `/proc/PID/stat`.
fn proc_stat(pid: u32) -> Option<(char, u32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    Some((state, ppid))
}

/// True when `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    proc_stat(pid).is_some_and(|(s, _)| s != 'Z' && s != 'X')
}

/// Every live descendant of `root` (children, their children, ...).
pub fn descendants(root: u32) -> Vec<u32> {
    let procs: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|p| {
            let (s, ppid) = proc_stat(p)?;
            (s != 'Z' && s != 'X').then_some((p, ppid))
        })
        .collect();
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(p, pp) in &procs {
            if pp == parent && !out.contains(&p) {
                out.push(p);
                frontier.push(p);
            }
        }
    }
    out
}

/// The processes inside namespace `ns` (`ip netns pids`).
fn netns_pids(ns: &str) -> Vec<u32> {
    netns::ip(&["netns", "pids", ns])
        .map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn signal(pid: u32, sig: i32) {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) with a positive pid only sends a signal; no memory is touched.
    unsafe {
        libc::kill(p, sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full receive window of full-sized frames fits the RX area with room to spare, and
    /// the area is far below the 2048-chunk default at the bench MTUs.
    #[test]
    fn rx_frames_cover_a_full_window_of_full_frames() {
        for mtu in [1500usize, 4000, 9000, 16000, 60000] {
            let window = socket_buffer(mtu);
            let n = rx_frames_for(mtu, window) as usize;
            let (chunk, multi) = umem_for_mtu(mtu);
            let per_frame = if multi {
                (mtu + 14).div_ceil(chunk.bytes() as usize - 256)
            } else {
                1
            };
            let full_frames = window.div_ceil(mtu - 52);
            assert!(
                n >= full_frames * per_frame + 64,
                "mtu {mtu}: {n} chunks for {full_frames} frames of {per_frame}"
            );
            assert!(n < 2048, "mtu {mtu}: {n}");
        }
        // MTU 60000: 2 MiB window, 16 chunks a frame.
        assert_eq!(rx_frames_for(60000, 2 << 20), 764);
    }

    /// The teardown finds grandchildren (a shim server's own children, `ip netns exec`'s
    /// shell) and no zombie; a stopped child is no longer alive.
    #[test]
    fn descendants_include_grandchildren() {
        let mut c = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .unwrap();
        let pid = c.id();
        let t0 = Instant::now();
        let found = loop {
            let d = descendants(pid);
            if !d.is_empty() || t0.elapsed() > Duration::from_secs(5) {
                break d;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let mine = descendants(std::process::id());
        signal(found.first().copied().unwrap_or(pid), libc::SIGKILL);
        let _ = c.kill();
        let _ = c.wait();
        assert_eq!(found.len(), 1, "sleep under sh: {found:?}");
        assert!(mine.contains(&pid) && mine.contains(&found[0]), "{mine:?}");
        assert!(alive(std::process::id()));
        assert!(!alive(pid), "reaped");
        assert_eq!(proc_stat(u32::MAX), None);
    }
}
