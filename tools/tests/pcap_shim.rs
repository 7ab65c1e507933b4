//! A capture from the LD_PRELOAD shim: a Python TCP echo server under `xwarp run --pcap`
//! on the engine (namespace A, AF_XDP on `veth-a`), a kernel client in namespace B sending
//! a pattern. tshark reads the shim's capture back: exactly the frames of the connection
//! that a kernel capture on the other end of the veth saw, each with its direction, and
//! the TCP payload in both directions equal to the pattern sent.
#![cfg(target_os = "linux")]

#[macro_use]
#[path = "../../tests/support/afxdp_skip.rs"]
mod afxdp_skip;

#[path = "support/shim_env.rs"]
mod shim_env;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use shim_env::*;

const PORT: u16 = 7411;
const LEN: usize = 300_000;

/// Echo server: accepts one connection, echoes LEN bytes, closes, exits.
const SERVER: &str = r#"
import socket, sys
n, port = int(sys.argv[1]), int(sys.argv[2])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port))
s.listen(1)
print("listening", flush=True)
c, _ = s.accept()
got = 0
while got < n:
    d = c.recv(65536)
    if not d:
        break
    c.sendall(d)
    got += len(d)
c.close()
s.close()
print("echoed", got, flush=True)
"#;

/// Client: sends the pattern, reads the echo back, checks it.
const CLIENT: &str = r#"
import socket, sys
ip, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = bytes((i * 31 + 7) % 251 for i in range(n))
c = socket.create_connection((ip, port), timeout=20)
c.sendall(data)
back = b""
while len(back) < n:
    d = c.recv(65536)
    if not d:
        break
    back += d
c.close()
assert back == data, "echo differs"
print("ok", len(back))
"#;

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| ((i * 31 + 7) % 251) as u8).collect()
}

/// Wait (bounded by the child's own `timeout`) for a line containing `what` on `r`, then
/// keep reading (the child must not meet a closed pipe); the thread returns the rest.
fn wait_line(
    r: impl std::io::Read + Send + 'static,
    what: &'static str,
) -> std::thread::JoinHandle<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let mut rest = String::new();
        let mut seen = false;
        for l in BufReader::new(r).lines() {
            let Ok(l) = l else { break };
            if !seen && l.contains(what) {
                seen = true;
                let _ = tx.send(());
            } else {
                rest.push_str(&l);
                rest.push('\n');
            }
        }
        rest
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(60)).is_ok(),
        "child ended before printing {what:?}"
    );
    h
}

/// tshark fields of `path`'s frames matching `filter`.
fn fields(path: &Path, filter: &str, fields: &[&str]) -> Vec<Vec<String>> {
    let mut c = Command::new("tshark");
    c.arg("-r")
        .arg(path)
        .args(["-Y", filter, "-T", "fields", "-E", "separator=|"]);
    for f in fields {
        c.args(["-e", f]);
    }
    let out = c.output().expect("tshark");
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split('|').map(str::to_owned).collect())
        .collect()
}

fn num(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap_or_else(|_| panic!("{s:?}")),
        None => s.parse().unwrap_or_else(|_| panic!("{s:?}")),
    }
}

/// The payload of TCP stream 0 in `path` as tshark reassembles it: (from the connection's
/// initiator, to it).
fn follow(path: &Path) -> (Vec<u8>, Vec<u8>) {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(path)
        .args(["-q", "-z", "follow,tcp,raw,0"])
        .output()
        .expect("tshark follow");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let (mut fwd, mut back) = (Vec::new(), Vec::new());
    let unhex = |s: &str| -> Vec<u8> {
        (0..s.len() / 2)
            .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
            .collect()
    };
    for line in text.lines() {
        if line.starts_with("===") || line.contains(':') || line.trim().is_empty() {
            continue;
        }
        match line.strip_prefix('\t') {
            Some(h) => back.extend(unhex(h.trim())),
            None => fwd.extend(unhex(line.trim())),
        }
    }
    (fwd, back)
}

#[test]
fn a_shim_programs_capture_has_every_frame_with_its_direction_and_the_data() {
    require_root_and_afxdp!();
    let _g = serial();
    ensure_tool("tshark", "tshark");
    let net = Net::new(121);
    let dir = scratch("pcap-shim");
    let b_cap = dir.join("kernel-b.pcapng");

    // The kernel's view from the other end of the veth pair.
    let mut k = net.pair.b.command("timeout").expect("ns B");
    k.args(["-s", "INT", "60", "tshark", "-i", &net.pair.if_b, "-w"])
        .arg(&b_cap)
        .args(["-f", &format!("tcp port {PORT}")]);
    let mut kcap = spawn(k, "tshark on veth-b");
    let _kcap_err = wait_line(
        kcap.0.as_mut().unwrap().stderr.take().unwrap(),
        "Capturing on",
    );

    let template = dir.join("shim-%p.pcapng");
    let mut srv = net.pair.a.command("timeout").expect("ns A");
    srv.arg("60")
        .arg(env!("CARGO_BIN_EXE_xwarp"))
        .args(["run", "--iface", &net.pair.if_a])
        .args(["--addr", &format!("{}/24", net.engine)])
        .args([
            "--strict",
            "--log",
            "info",
            "--pcap",
            template.to_str().unwrap(),
        ])
        .arg("--preload")
        .arg(shim())
        .args([
            "--",
            "python3",
            "-c",
            SERVER,
            &LEN.to_string(),
            &PORT.to_string(),
        ]);
    let mut srv = spawn(srv, "python echo server under xwarp run");
    let srv_stdout = wait_line(srv.0.as_mut().unwrap().stdout.take().unwrap(), "listening");

    let engine = net.engine.to_string();
    let t = Instant::now();
    let out = run(
        net.in_b(
            60,
            "python3",
            &["-c", CLIENT, &engine, &PORT.to_string(), &LEN.to_string()],
        ),
        "kernel client",
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok 300000"));
    let srv_out = srv.wait_output(Duration::from_secs(30));
    assert!(srv_out.status.success(), "server: {srv_out:?}");
    let said = srv_stdout.join().unwrap();
    assert!(said.contains("echoed 300000"), "server said {said:?}");
    eprintln!("echo of {LEN} bytes in {:.2} s", t.elapsed().as_secs_f64());
    // Let the kernel capture see the last frames, then stop it cleanly.
    std::thread::sleep(Duration::from_millis(300));
    let pid = kcap.0.as_ref().unwrap().id();
    let _ = Command::new("kill")
        .args(["-INT", "--", &format!("-{pid}")])
        .stderr(Stdio::null())
        .status();
    let _ = kcap.wait_output(Duration::from_secs(10));

    let shim_caps: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("shim-")
        })
        .collect();
    assert_eq!(
        shim_caps.len(),
        1,
        "one capture, of the python process: {shim_caps:?}"
    );
    let cap = &shim_caps[0];
    let flow = format!("tcp.port == {PORT}");
    let mine = fields(
        cap,
        &flow,
        &["frame.packet_flags_direction", "ip.src", "tcp.len"],
    );
    let theirs = fields(&b_cap, &flow, &["ip.src", "tcp.len"]);
    let count =
        |rows: &[Vec<String>], col: usize, src: &str| rows.iter().filter(|r| r[col] == src).count();
    let b_ip = net.pair.addr_b.to_string();
    assert!(
        theirs.len() > 2 * LEN / 1448,
        "kernel capture: {} frames",
        theirs.len()
    );
    assert_eq!(
        mine.len(),
        theirs.len(),
        "the engine's frames = what the peer's end saw"
    );
    assert_eq!(count(&mine, 1, &engine), count(&theirs, 0, &engine));
    assert_eq!(count(&mine, 1, &b_ip), count(&theirs, 0, &b_ip));
    for r in &mine {
        // Outbound (2) from the engine's address, inbound (1) from the peer.
        let want = if r[1] == engine { 2 } else { 1 };
        assert_eq!(num(&r[0]), want, "direction of {r:?}");
    }
    let (to_engine, from_engine) = follow(cap);
    let data = pattern(LEN);
    assert!(
        to_engine == data,
        "client→server payload differs ({} bytes)",
        to_engine.len()
    );
    assert!(
        from_engine == data,
        "server→client payload differs ({} bytes)",
        from_engine.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
