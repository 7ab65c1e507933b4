//! Programs under the LD_PRELOAD shim with `XWARP_MODE=inline`: the program's own threads
//! drive the engine from their socket calls (`preload/README.md`). The same topology and
//! helpers as `preload_programs.rs`: the program in namespace A on the engine, kernel
//! peers in B, data verified by SHA-256. Root and AF_XDP are required (`SKIPPED:`
//! otherwise).
#![cfg(target_os = "linux")]

#[macro_use]
#[path = "../../tests/support/afxdp_skip.rs"]
mod afxdp_skip;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

#[path = "support/shim_env.rs"]
mod shim_env;

use shim_env::*;

fn inline(mut c: Command) -> Command {
    c.env("XWARP_MODE", "inline");
    c
}

#[test]
fn inline_c_program_mixes_kernel_and_xwarp_fds_in_one_edge_triggered_epoll_set() {
    require_root_and_afxdp!();
    let _g = serial();
    let net = Net::new(176);
    let mix = epoll_mix(&net, "epoll-inline", 8, &[("XWARP_MODE", "inline")]);
    assert!(
        mix.stderr.contains("inline mode"),
        "engine not inline: {}",
        mix.stderr
    );
}

/// A single-threaded python server (blocking accept, `selectors` over the connections:
/// `epoll_wait` plus non-blocking reads and writes) echoes 16 concurrent clients.
#[test]
fn inline_python_selectors_echo_server_serves_concurrent_clients() {
    require_root_and_afxdp!();
    let _g = serial();
    selectors_echo_server("DefaultSelector", 177);
}

/// The same with `selectors.PollSelector`: inline mode's spinning `poll`, whose looks
/// between engine iterations are user-space ones.
#[test]
fn inline_python_poll_selector_echo_server_serves_concurrent_clients() {
    require_root_and_afxdp!();
    let _g = serial();
    selectors_echo_server("PollSelector", 180);
}

fn selectors_echo_server(selector: &str, net_id: u8) {
    let net = Net::new(net_id);
    let conns = 16;
    let server = format!(
        r#"
import selectors, socket, sys
sel = selectors.{selector}()
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("{ip}", 7100)); ls.listen(64); ls.setblocking(False)
sel.register(ls, selectors.EVENT_READ)
pending = {{}}
closed = 0
while closed < {conns} + 1:
    for key, ev in sel.select(timeout=30):
        s = key.fileobj
        if s is ls:
            c, _ = ls.accept(); c.setblocking(False)
            pending[c] = bytearray()
            sel.register(c, selectors.EVENT_READ)
            continue
        if ev & selectors.EVENT_READ:
            try:
                b = s.recv(1 << 16)
            except BlockingIOError:
                continue
            if not b:
                out = pending[s]
                s.setblocking(True); s.sendall(out); s.close()
                sel.unregister(s); del pending[s]; closed += 1
                continue
            pending[s] += b
            # Echo what is in hand as we go, the rest at the end.
            try:
                n = s.send(pending[s])
                del pending[s][:n]
            except BlockingIOError:
                pass
print("served", closed)
"#,
        ip = net.engine,
        conns = conns,
        selector = selector
    );
    let srv = spawn(
        inline(net.shimmed(60, "python3", &["-c", &server])),
        "python selectors server",
    );
    wait_port(&net, net.engine, 7100);
    echo_clients(&net, 7100, conns, 300_000);
    let out = srv.wait_output(Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "server failed: {text} {err}");
    assert!(
        text.contains(&format!("served {}", conns + 1)),
        "{text} {err}"
    );
    assert!(err.contains("inline mode"), "engine not inline: {err}");
}

/// `tests/preload/epoll_late_kernel_fd.c` under the shim in `mode`: its engine
/// connections stay readable at every `epoll_wait` (level-triggered, one 16-byte read per
/// event: it takes bytes in slower than the peers send), so the shim's user-space hot
/// list always has events to return, and a kernel pipe in the same set becomes readable
/// late, while that traffic flows. The pipe must be reported within a few calls and while
/// the connections are still open (the shim asks the kernel when a readiness eventfd was
/// signalled, and every 16th look for a set holding kernel descriptors), and every echo
/// is verified. A shim that asked the kernel only when its engine sockets ran dry failed
/// this: thousands of calls later, or after the traffic.
fn late_kernel_fd_is_reported_while_engine_sockets_are_busy(
    mode: &str,
    net_id: u8,
    maxevents: u32,
) {
    let dir = scratch(&format!("epoll-late-{mode}-{maxevents}"));
    let bin = dir.join("epoll_late_kernel_fd");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/preload/epoll_late_kernel_fd.c");
    let mut cc = Command::new("gcc");
    cc.args(["-O2", "-Wall", "-Werror", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src);
    run(cc, "gcc epoll_late_kernel_fd.c");
    let net = Net::new(net_id);
    let conns = 8;
    let mut cmd = net.shimmed(
        90,
        bin.to_str().unwrap(),
        &["7200", &conns.to_string(), &maxevents.to_string()],
    );
    cmd.env("XWARP_MODE", mode);
    let srv = spawn(cmd, "epoll_late_kernel_fd");
    wait_port(&net, net.engine, 7200);
    // wait_port's probe connection counts as one.
    let clients = conns - 1;
    echo_clients(&net, 7200, clients, 1_000_000);
    let out = srv.wait_output(Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "epoll_late_kernel_fd failed: {text} {err}"
    );
    assert!(
        err.contains(&format!("{mode} mode")),
        "engine not in {mode} mode: {err}"
    );
    let line = text
        .lines()
        .find(|l| l.starts_with("OK "))
        .unwrap_or_else(|| panic!("no result: {text} {err}"));
    eprintln!("{mode}, maxevents {maxevents}: {line}");
    let field = |k: &str| -> i64 {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} missing in {line}"))
    };
    assert_eq!(field("conns"), conns as i64);
    let expect: i64 = (0..clients).map(|i| 1_000_000 + 4099 * i as i64).sum();
    assert_eq!(field("bytes"), expect, "bytes echoed");
    assert!(
        field("live") > 0,
        "the pipe was reported only after the traffic ended: {line}"
    );
    // 16 looks between periodic asks, plus slack for calls that raced the write.
    assert!(
        field("waits") <= 40,
        "the pipe waited behind busy engine sockets for too many calls: {line}"
    );
    // Generous for a loaded 2-core machine.
    assert!(
        field("late_us") < 250_000,
        "the pipe waited too long behind busy engine sockets: {line}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn inline_late_kernel_fd_is_reported_while_engine_sockets_are_busy() {
    require_root_and_afxdp!();
    let _g = serial();
    late_kernel_fd_is_reported_while_engine_sockets_are_busy("inline", 178, 16);
}

#[test]
fn thread_mode_late_kernel_fd_is_reported_while_engine_sockets_are_busy() {
    require_root_and_afxdp!();
    let _g = serial();
    late_kernel_fd_is_reported_while_engine_sockets_are_busy("thread", 179, 16);
}

/// The same with an `epoll_wait` buffer of 4 events for 8 busy connections: the hot list
/// alone could fill every call, so the shim leaves the kernel a slot when it is to be
/// asked, and rotates the hot list so every connection gets its turn.
#[test]
fn late_kernel_fd_is_reported_when_busy_sockets_alone_would_fill_the_buffer() {
    require_root_and_afxdp!();
    let _g = serial();
    late_kernel_fd_is_reported_while_engine_sockets_are_busy("thread", 181, 4);
}

/// A thread spinning in an inline `epoll_wait` leaves its core to another runnable thread
/// (`tests/preload/inline_spin_yields.c`: both pinned to one CPU, the helper always
/// runnable, the spinner waiting on an idle engine listener for 25 x 20 ms with a 20 ms
/// spin). Before the inline waits yielded by default the spinner took half the core (the
/// scheduler splits it between equals), which is what kept redis-benchmark's client from
/// running while an inline redis-server spun with nothing to do: redis `-c 50` at 0.3-0.4x
/// of the kernel's rate (preload/README.md). Yielding, its share is its rounds between the
/// helper's time slices.
#[test]
fn inline_spinning_epoll_wait_leaves_the_core_to_a_runnable_thread() {
    require_root_and_afxdp!();
    let _g = serial();
    let dir = scratch("inline-spin-yields");
    let bin = dir.join("inline_spin_yields");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/preload/inline_spin_yields.c");
    let mut cc = Command::new("gcc");
    cc.args(["-O2", "-Wall", "-Werror", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src);
    run(cc, "gcc inline_spin_yields.c");
    let net = Net::new(182);
    let mut cmd = net.shimmed(60, bin.to_str().unwrap(), &["7300", "25", "20"]);
    cmd.env("XWARP_MODE", "inline")
        .env("XWARP_SPIN_US", "20000");
    let out = spawn(cmd, "inline_spin_yields").wait_output(Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "inline_spin_yields failed: {text} {err}"
    );
    assert!(err.contains("inline mode"), "engine not inline: {err}");
    let line = text
        .lines()
        .find(|l| l.starts_with("OK "))
        .unwrap_or_else(|| panic!("no result: {text} {err}"));
    eprintln!("{line}");
    let field = |k: &str| -> u64 {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} missing in {line}"))
    };
    let (spinner, helper) = (field("spinner_us"), field("helper_us"));
    // Measured: about 1:1 when the spin kept the core, 1:140 yielding.
    assert!(
        helper > 4 * spinner,
        "the spinning epoll_wait kept the core from a runnable thread: {line}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
