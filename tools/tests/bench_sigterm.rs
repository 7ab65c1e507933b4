//! A bench stopped by SIGTERM or SIGINT tears down what it made (root): `xwarp bench tcp`
//! is signalled while it measures and while it is still creating its namespaces, `xwarp
//! bench rdma` while its AF_XDP engines run and while its perftest rows' processes run
//! (`ib_write_bw` under `xwarp run`); it must
//! exit with 128 + the signal's number within a bound, and leave no namespace (they hold
//! its veth pair), no process it started and no stats segment behind.
#![cfg(target_os = "linux")]

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "support/shim_env.rs"]
mod shim_env;

const XWARP: &str = env!("CARGO_BIN_EXE_xwarp");

/// How long a signalled bench may take to exit.
const EXIT_BOUND: Duration = Duration::from_secs(15);

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The namespaces of process `pid` (`/run/netns/xw<pid>-*`, as `poll-driver`'s netns names them).
fn namespaces_of(pid: u32) -> Vec<String> {
    let prefix = format!("xw{pid}-");
    let mut v: Vec<String> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    v.sort();
    v
}

/// Live descendants of `root` from `/proc`.
fn descendants(root: u32) -> Vec<u32> {
    let stat = |p: u32| -> Option<(char, u32)> {
        let s = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        let rest = &s[s.rfind(')')? + 1..];
        let mut f = rest.split_whitespace();
        Some((f.next()?.chars().next()?, f.next()?.parse().ok()?))
    };
    let procs: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter_map(|p| stat(p).filter(|(s, _)| *s != 'Z').map(|(_, pp)| (p, pp)))
        .collect();
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(parent) = todo.pop() {
        for &(p, pp) in &procs {
            if pp == parent && !out.contains(&p) {
                out.push(p);
                todo.push(p);
            }
        }
    }
    out
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rfind(')')
                .map(|i| s[i + 1..].trim_start().starts_with(['Z', 'X']))
        })
        .is_some_and(|zombie| !zombie)
}

/// A private stats directory, removed on drop.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The bench, killed and its namespaces removed if the test fails half-way.
struct Bench(Option<Child>, u32);

impl Drop for Bench {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in namespaces_of(self.1) {
            let _ = Command::new("ip").args(["netns", "del", &ns]).status();
        }
    }
}

/// Start `xwarp bench BENCH` on net `net`, wait until it has `want` namespaces (and then
/// `settle` more), send `sig`, and check it exits with 128 + sig leaving nothing behind.
fn signal_bench(bench: &str, net: u8, want: usize, settle: Duration, sig: i32) {
    signal_bench_with(bench, &[], net, want, settle, sig)
}

/// [`signal_bench`] with `extra` arguments for the bench.
fn signal_bench_with(
    bench: &str,
    extra: &[&str],
    net: u8,
    want: usize,
    settle: Duration,
    sig: i32,
) {
    let dir = Dir(std::env::temp_dir().join(format!("xwarp-sigterm-{}-{net}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).unwrap();
    let child = Command::new(XWARP)
        .args(["bench", bench, "--duration", "5", "--net", &net.to_string()])
        .args(extra)
        .env("XWARP_STATS_DIR", &dir.0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start xwarp bench");
    let pid = child.id();
    let mut b = Bench(Some(child), pid);
    let t0 = Instant::now();
    while namespaces_of(pid).len() < want {
        if let Some(st) = b.0.as_mut().unwrap().try_wait().unwrap() {
            let mut err = String::new();
            let _ =
                b.0.as_mut()
                    .unwrap()
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err);
            panic!("the bench exited ({st}) before making {want} namespace(s): {err}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no {want} namespace(s) of the bench after 60 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(settle);
    let before = namespaces_of(pid);
    let kids = descendants(pid);
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
    let sent = Instant::now();
    let status = loop {
        if let Some(st) = b.0.as_mut().unwrap().try_wait().unwrap() {
            break st;
        }
        assert!(
            sent.elapsed() < EXIT_BOUND,
            "the bench did not exit within {EXIT_BOUND:?} of signal {sig}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = sent.elapsed();
    let mut err = String::new();
    let _ = b.0.take().unwrap().stderr.unwrap().read_to_string(&mut err);
    println!("signal {sig} with namespaces {before:?}: exit {status} after {took:?}\n{err}");
    assert_eq!(status.code(), Some(128 + sig), "{err}");
    assert!(err.contains("tearing down"), "{err}");
    assert!(err.contains("removed"), "{err}");
    let left = namespaces_of(pid);
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
    let procs: Vec<u32> = kids.into_iter().filter(|p| alive(*p)).collect();
    assert!(
        procs.is_empty(),
        "processes it started still run: {procs:?}"
    );
    // The veth pair lives in the namespaces; none of the bench's names leaked into ours.
    let links = Command::new("ip")
        .args(["-o", "link", "show", "type", "veth"])
        .output()
        .unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(
        !links.contains("veth-a@")
            && !links.contains("veth-b@")
            && !links.contains("m-a@")
            && !links.contains("m-b@"),
        "a veth of the bench is in the root namespace: {links}"
    );
    let segs: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with(&format!("xwarp-{pid}-")))
        .collect();
    assert!(segs.is_empty(), "stats segments left: {segs:?}");
    assert!(!Path::new(&format!("/proc/{pid}")).exists() || !alive(pid));
}

#[test]
fn sigterm_while_measuring_tears_everything_down() {
    if !is_root() {
        println!("SKIPPED: bench_sigterm needs root (network namespaces)");
        return;
    }
    signal_bench("tcp", 211, 2, Duration::from_millis(1500), libc::SIGTERM);
}

#[test]
fn sigint_during_setup_tears_down_what_exists() {
    if !is_root() {
        println!("SKIPPED: bench_sigterm needs root (network namespaces)");
        return;
    }
    // As soon as the first namespace exists: the second may be under way.
    signal_bench("tcp", 212, 1, Duration::ZERO, libc::SIGINT);
}

#[test]
fn sigterm_with_rdma_engines_running_tears_everything_down() {
    if !is_root() {
        println!("SKIPPED: bench_sigterm needs root (network namespaces)");
        return;
    }
    signal_bench("rdma", 213, 2, Duration::from_millis(2500), libc::SIGTERM);
}

#[test]
fn sigterm_during_the_loss_rows_tears_the_loss_path_down() {
    if !is_root() {
        println!("SKIPPED: bench_sigterm needs root (network namespaces)");
        return;
    }
    // The loss rows' path has three namespaces (the ends and the forwarding one with the
    // XDP dropper); the veth pair of the loss-free rows, two, is gone by then.
    signal_bench_with(
        "tcp",
        &["--only", "kernel-kernel", "--repeat", "1", "--loss", "0.01"],
        214,
        3,
        Duration::from_millis(1500),
        libc::SIGTERM,
    );
}

#[test]
fn sigterm_during_the_perftest_rows_stops_the_perftest_processes() {
    if !is_root() {
        println!("SKIPPED: bench_sigterm needs root (network namespaces)");
        return;
    }
    if !Path::new("/usr/bin/ib_write_bw").exists() {
        println!("SKIPPED: sigterm during the perftest rows: /usr/bin/ib_write_bw missing (apt-get install perftest)");
        return;
    }
    let (shim, ibverbs) = (shim_env::shim(), shim_env::ibverbs());
    // Only ib_write_bw (5 s, --duration): the signal comes while both processes run.
    signal_bench_with(
        "rdma",
        &[
            "--only",
            "ib_write_bw",
            "--preload",
            shim.to_str().unwrap(),
            "--rdma-lib",
            ibverbs.to_str().unwrap(),
        ],
        215,
        2,
        Duration::from_millis(2500),
        libc::SIGTERM,
    );
}
