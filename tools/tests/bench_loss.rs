//! `xwarp bench tcp --loss 0.01` end to end (root, AF_XDP): the real `xwarp` binary runs a
//! short loss row set through its forwarding namespace with the XDP dropper, and its JSON
//! must show what the loss rows promise:
//!
//! * the kernel pair moved data at 1% loss, one-way and both ways on one connection;
//! * the dropper really dropped about 1% of the TCP frames it judged (a wide bound: a
//!   dropper that drops nothing, everything, or ten times too much fails), and the kernel
//!   ends retransmitted;
//! * the xwarp rows of the same run exist with their drop counts;
//! * nothing of the run's namespaces is left behind.

#[macro_use]
#[path = "../../tests/support/afxdp_skip.rs"]
mod afxdp_skip;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use xwarp_tools::bench::report::{Report, Side, Unit};

const XWARP: &str = env!("CARGO_BIN_EXE_xwarp");

#[test]
fn bench_tcp_loss_rows_move_data_and_the_dropper_drops_about_one_percent_root() {
    require_root_and_afxdp!();
    let json = std::env::temp_dir().join(format!("xwarp-bench-loss-{}.json", std::process::id()));
    let mut child = Command::new(XWARP)
        .args([
            "bench",
            "tcp",
            "--only",
            "kernel-kernel,xwarp-kernel",
            "--mode",
            "thread",
            "--duration",
            "1",
            "--repeat",
            "1",
            "--loss",
            "0.01",
            "--net",
            "172",
            "--quiet",
            "--json",
            json.to_str().unwrap(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn xwarp");
    let pid = child.id();
    // Bounded: the clean rows take seconds, each loss row at most 1 s + its 15 s bound.
    let t0 = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if t0.elapsed() > Duration::from_secs(240) {
            let _ = child.kill();
            panic!("xwarp bench tcp --loss ran for 240 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let leftovers: Vec<String> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(&format!("xw{pid}-")))
        .collect();
    assert!(leftovers.is_empty(), "namespaces left: {leftovers:?}");
    let text = std::fs::read_to_string(&json).expect("the JSON file");
    let _ = std::fs::remove_file(&json);
    let rep = Report::from_json(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let t = "loss-0.01";
    let k = "kernel-kernel";
    for m in ["goodput_oneway", "goodput_duplex_fwd", "goodput_duplex_rev"] {
        let r = rep
            .find(t, k, m)
            .unwrap_or_else(|| panic!("no {k} {m}:\n{stdout}"));
        assert_eq!((r.side, r.unit), (Side::Kernel, Unit::Gbps));
        assert!(r.value > 0.0 && r.bytes.unwrap_or(0) > 0, "{r:?}\n{stdout}");
    }
    for dir in ["oneway", "duplex"] {
        let v = |m: &str| rep.value(t, k, &format!("{dir}_{m}"));
        let drops = v("path_drops").expect("path_drops");
        let frac = v("drop_fraction").expect("drop_fraction");
        // Enough frames judged for the fraction to mean something (at ~1 Gbit/s for 1 s,
        // tens of thousands).
        let judged = drops / frac.max(1e-12);
        assert!(
            drops >= 20.0 && judged >= 2000.0,
            "{dir}: {drops} of {judged}"
        );
        assert!(
            (0.004..=0.025).contains(&frac),
            "{dir}: the dropper dropped {:.3}% of the frames, asked 1%\n{stdout}",
            frac * 100.0
        );
        assert!(
            v("kernel_retrans").is_some_and(|r| r > 0.0),
            "{dir}: no kernel retransmission at 1% loss\n{stdout}"
        );
        assert!(v("kernel_rtos").is_some() && v("kernel_dsacks").is_some());
    }
    // The xwarp rows of the same run.
    let x = "xwarp-kernel/thread/smoltcp";
    let g = rep.find(t, x, "goodput_oneway").expect("xwarp loss row");
    assert_eq!(g.side, Side::Xwarp);
    assert_eq!(g.kernel_row.as_deref(), Some(k), "{g:?}");
    assert!(rep.value(t, x, "duplex_path_drops").is_some());
    assert!(rep.value(t, x, "oneway_xwarp_rescues").is_some());
    assert!(stdout.contains("--loss") && stdout.contains(x), "{stdout}");
}
