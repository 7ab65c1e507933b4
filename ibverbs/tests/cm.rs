//! librdmacm on xwarp: C programs and Debian's unmodified rdma-core tools with
//! `libxwarp_ibverbs.so` preloaded, each process with its own xwarp engine (AF_XDP on one end
//! of a veth pair, in its own test namespace; root). Without root the network tests print
//! `SKIPPED:`.
//!
//! * `cm_pair_over_a_veth`: `tests/c/cm_pair.c` (built with the system cc against Debian's
//!   headers): error returns, ADDR_ERROR, a reject with private data both ways, accept with
//!   private data and IRD/ORD, Send/Recv and 64 KiB RDMA Read and Write through the
//!   `<rdma/rdma_verbs.h>` inline helpers with the pattern checked, DISCONNECTED on both
//!   sides.
//! * `rping_xwarp_to_xwarp`: `rping -s -v -C 10` ↔ `rping -c -v -C 10`, every ping line's
//!   data checked against rping's pattern on both sides.
//! * `mpa_crc_setting_asks_for_crc`: `rping -c` with `XWARP_MPA_CRC=1`, `0`, unset and a
//!   bad value, the client engine's own capture (`XWARP_PCAP`) read for the MPA Request's
//!   and Reply's C bit (markers off): C=1 both ways only with `1`, the bad value one
//!   warning line and the default; every run's ping data checked.
//! * `rdma_server_client_xwarp_to_xwarp`: rdmacm-utils' `rdma_server`/`rdma_client` (the
//!   synchronous API: `rdma_getaddrinfo`, `rdma_create_ep`, `rdma_get_request`).
//! * `ucmatose_xwarp_to_xwarp`: two connections with data transfers, both ways; again with
//!   `-m` (`rdma_migrate_id` to a new event channel).
//! * `perftest_xwarp_to_xwarp`: perftest's `ib_write_bw`, `ib_read_bw`, `ib_send_bw`,
//!   `ib_send_lat`, `ib_write_lat` with `-R` (rdma_cm connection setup), 200 iterations:
//!   both sides exit 0 and print their result row (installed with apt-get when missing);
//!   the client retries refused connects inside `rdma_connect` (`XWARP_CONNECT_RETRY_MS`).
//! * `exit_without_disconnect_closes_the_connection`: a client that queues a Send and
//!   returns from `main` without `rdma_disconnect`: the Send arrives and the server gets
//!   DISCONNECTED (the library's exit hook closes what is still open).
//! * `connect_retry_lets_a_client_start_before_its_server`: with
//!   `XWARP_CONNECT_RETRY_MS` a client whose connects are refused for 3 s (the server's
//!   engine is up, its listen comes later) connects once the server listens.
//! * `no_device_fails_cleanly`: without `XWARP_IFACE` the calls fail with `ENODEV`.
//! * `exported_versions_match_librdmacm`: every `rdma_*` function the rdmacm-utils programs
//!   import is exported at the version they import, which is librdmacm.so.1's.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use xwarp_poll_driver::netns::VethPair;

/// One network test at a time: two engines each already share the 2 cores.
static SERIAL: Mutex<()> = Mutex::new(());

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("deps dir");
    for p in [
        deps.join("libxwarp_ibverbs.so"),
        deps.parent()
            .expect("profile dir")
            .join("libxwarp_ibverbs.so"),
    ] {
        if p.exists() {
            return p;
        }
    }
    panic!("libxwarp_ibverbs.so not found beside {}", deps.display());
}

/// rdmacm-utils and the rdma_cm headers, installed with apt-get when root; else why not.
fn packages() -> Result<(), String> {
    let have = || {
        Path::new("/usr/bin/rping").exists()
            && Path::new("/usr/bin/rdma_server").exists()
            && Path::new("/usr/include/rdma/rdma_verbs.h").exists()
            && Path::new("/usr/include/infiniband/verbs.h").exists()
    };
    if have() {
        return Ok(());
    }
    if !is_root() {
        return Err("rdmacm-utils/librdmacm-dev are not installed and we are not root".into());
    }
    let pk = "rdmacm-utils librdmacm-dev libibverbs-dev";
    let _ = Command::new("sh")
        .args([
            "-c",
            &format!(
                "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends {pk} \
                 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
                 --no-install-recommends {pk})"
            ),
        ])
        .stdout(Stdio::null())
        .status();
    if have() {
        Ok(())
    } else {
        Err(format!("apt-get install {pk} failed"))
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `tests/c/cm_pair.c`, compiled once into the test's temporary directory.
fn cm_pair() -> PathBuf {
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut g = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = &*g {
        return p.clone();
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/cm_pair.c");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cm_pair");
    let o = Command::new("cc")
        .args(["-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs"])
        .output()
        .expect("cc");
    assert!(o.status.success(), "cc cm_pair.c: {}", text(&o));
    *g = Some(out.clone());
    out
}

/// The two engines: A owns `10.88.<net>.10`, B `10.88.<net>.20` (the kernel's addresses on
/// the veths are .1 and .2).
struct Net {
    pair: VethPair,
    net: u8,
}

impl Net {
    fn new(net: u8) -> Net {
        Net {
            pair: VethPair::new(net).expect("veth pair"),
            net,
        }
    }

    fn addr(&self, side: char) -> String {
        format!("10.88.{}.{}", self.net, if side == 'a' { 10 } else { 20 })
    }

    /// `program args` in namespace `side` with the library preloaded on that side's veth,
    /// bounded by `timeout secs`.
    fn command(&self, side: char, secs: u32, program: &str, args: &[&str]) -> Command {
        let (ns, ifname) = if side == 'a' {
            (&self.pair.a, &self.pair.if_a)
        } else {
            (&self.pair.b, &self.pair.if_b)
        };
        let mut c = ns.command("timeout").expect("ns command");
        c.arg(secs.to_string()).arg(program).args(args);
        for (k, _) in std::env::vars() {
            if k.starts_with("XWARP_") {
                c.env_remove(k);
            }
        }
        c.env("LD_PRELOAD", library())
            .env("XWARP_IFACE", ifname)
            .env("XWARP_ADDR", format!("{}/24", self.addr(side)));
        c
    }

    /// Start a server on A; returns once `ready` shows in its stdout (or at once for "").
    fn server(&self, program: &str, args: &[&str], ready: &str) -> Server {
        let mut c = self.command('a', 60, program, args);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().expect("spawn server");
        let mut lines = None;
        if !ready.is_empty() {
            let out = child.stdout.take().expect("stdout");
            let (tx, rx) = std::sync::mpsc::channel();
            let ready = ready.to_string();
            std::thread::spawn(move || {
                let mut seen = String::new();
                let mut r = BufReader::new(out);
                let mut line = String::new();
                let mut sent = false;
                while r.read_line(&mut line).unwrap_or(0) > 0 {
                    seen.push_str(&line);
                    if !sent && line.contains(&ready) {
                        let _ = tx.send(None);
                        sent = true;
                    }
                    line.clear();
                }
                let _ = tx.send(Some(seen));
            });
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(None) => {}
                other => {
                    let _ = child.kill();
                    let err = child
                        .wait_with_output()
                        .map(|o| text(&o))
                        .unwrap_or_default();
                    panic!("{program} never became ready: {other:?} {err}");
                }
            }
            lines = Some(rx);
        }
        Server { child, lines }
    }
}

/// A running server; its stdout is read by a thread once it was waited for readiness.
struct Server {
    child: Child,
    lines: Option<std::sync::mpsc::Receiver<Option<String>>>,
}

/// Run a client until it does not fail with REJECTED for a server not listening yet
/// (its engine may still be starting); at most 10 tries.
fn client(net: &Net, program: &str, args: &[&str]) -> Output {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let o = net
            .command('b', 30, program, args)
            .output()
            .expect("client");
        let t = text(&o);
        // Not listening yet: a RST (REJECTED, -ECONNREFUSED), or, when the server's engine
        // had taken the interface but not yet listened (or the previous server's XDP program
        // was still attached) under a loaded machine, the connect timing out (UNREACHABLE;
        // perftest prints the bare event number: "Unexpected CM event bl blka 7").
        let not_yet = !o.status.success()
            && (t.contains("REJECTED")
                || t.contains("-111")
                || t.contains("UNREACHABLE")
                || t.contains("Unexpected CM event bl blka 7"));
        if !not_yet || Instant::now() > deadline {
            return o;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn finish(server: Server) -> Output {
    let mut o = server.child.wait_with_output().expect("server exit");
    if let Some(rx) = server.lines {
        if let Ok(Some(seen)) = rx.recv_timeout(Duration::from_secs(10)) {
            o.stdout = seen.into_bytes();
        }
    }
    use std::os::unix::process::ExitStatusExt;
    assert!(
        o.status.signal().is_none(),
        "server killed by a signal: {}",
        text(&o)
    );
    o
}

fn skip(what: &str) -> bool {
    if !is_root() {
        println!("SKIPPED: {what}: needs root (network namespaces, AF_XDP)");
        return true;
    }
    if let Err(why) = packages() {
        println!("SKIPPED: {what}: {why}");
        return true;
    }
    false
}

#[test]
fn cm_pair_over_a_veth() {
    if skip("cm_pair over a veth") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bin = cm_pair();
    let bin = bin.to_str().unwrap();
    let net = Net::new(93);
    let a = net.addr('a');
    let server = net.server(bin, &["server", &a, "7471"], "listening");
    let o = net
        .command('b', 60, bin, &["client", &a, "7471", "10.99.0.1"])
        .output()
        .expect("client");
    let ct = text(&o);
    let so = finish(server);
    let st = text(&so);
    assert!(o.status.success(), "client:\n{ct}\nserver:\n{st}");
    assert!(so.status.success(), "server:\n{st}\nclient:\n{ct}");
    for want in [
        "event RDMA_CM_EVENT_ADDR_ERROR status -101",
        "error returns as librdmacm's",
        "event RDMA_CM_EVENT_REJECTED status -111 private_data_len 20",
        "event RDMA_CM_EVENT_ESTABLISHED status 0 private_data_len 25",
        "RDMA Write of 65536 bytes from the server verified",
        "event RDMA_CM_EVENT_DISCONNECTED",
        "client done",
    ] {
        assert!(ct.contains(want), "client lacks {want:?}:\n{ct}");
    }
    for want in [
        "rejected the first request",
        "event RDMA_CM_EVENT_ESTABLISHED status 0 private_data_len 30",
        "RDMA Read of 65536 bytes verified",
        "event RDMA_CM_EVENT_DISCONNECTED",
        "server done",
    ] {
        assert!(st.contains(want), "server lacks {want:?}:\n{st}");
    }
    // The one warning of the unsupported port space, nothing else on stderr.
    let cerr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(cerr.lines().count(), 1, "{cerr}");
    assert!(
        cerr.contains("port space 0x111 (UD) is not supported"),
        "{cerr}"
    );
    assert!(
        so.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&so.stderr)
    );
}

/// Runs `tests/c/cm_pair.c`'s `exit-server` on A (its engine up at once, listening
/// `listen_delay_ms` later) and then `exit-client` on B with `client_env`; returns
/// (client, server) output.
fn exit_pair(net: u8, listen_delay_ms: u32, client_env: &[(&str, &str)]) -> (Output, Output) {
    let bin = cm_pair();
    let bin = bin.to_str().unwrap();
    let net = Net::new(net);
    let a = net.addr('a');
    let delay = listen_delay_ms.to_string();
    let server = net.server(bin, &["exit-server", &a, "7473", &delay], "engine up");
    let mut cc = net.command('b', 40, bin, &["exit-client", &a, "7473"]);
    for (k, v) in client_env {
        cc.env(k, v);
    }
    let co = cc.output().expect("client");
    (co, finish(server))
}

#[test]
fn exit_without_disconnect_closes_the_connection() {
    if skip("exit without rdma_disconnect") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (co, so) = exit_pair(97, 0, &[]);
    let (ct, st) = (text(&co), text(&so));
    assert!(co.status.success(), "client:\n{ct}\nserver:\n{st}");
    assert!(ct.contains("exiting without rdma_disconnect"), "{ct}");
    // The Send queued right before the exit drained, then the FIN: DISCONNECTED.
    assert!(so.status.success(), "server:\n{st}\nclient:\n{ct}");
    for want in [
        "the client's last Send arrived",
        "event RDMA_CM_EVENT_DISCONNECTED",
        "exit-server done",
    ] {
        assert!(st.contains(want), "server lacks {want:?}:\n{st}");
    }
}

#[test]
fn connect_retry_lets_a_client_start_before_its_server() {
    if skip("XWARP_CONNECT_RETRY_MS") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // The server's engine answers the client's SYNs with RST for 3 s before it listens;
    // without the retry the client would get REJECTED (-ECONNREFUSED) and exit 1.
    let (co, so) = exit_pair(98, 3000, &[("XWARP_CONNECT_RETRY_MS", "20000")]);
    let (ct, st) = (text(&co), text(&so));
    assert!(co.status.success(), "client:\n{ct}\nserver:\n{st}");
    assert!(ct.contains("event RDMA_CM_EVENT_ESTABLISHED"), "{ct}");
    assert!(so.status.success(), "server:\n{st}\nclient:\n{ct}");
    assert!(st.contains("the client's last Send arrived"), "{st}");
    assert!(st.contains("event RDMA_CM_EVENT_DISCONNECTED"), "{st}");
    assert!(
        co.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&co.stderr)
    );
}

/// rping's ping data of iteration `i` at `-S size`: `rdma-ping-<i>: ` then letters counting
/// up from `65 + i mod 58`, wrapping from 122 to 65, `size - 1` bytes in all.
fn rping_data(i: usize, size: usize) -> String {
    let mut s = format!("rdma-ping-{i}: ");
    let mut c = 65 + (i % 58) as u8;
    while s.len() < size - 1 {
        s.push(c as char);
        c += 1;
        if c > 122 {
            c = 65;
        }
    }
    s
}

fn check_rping(out: &str, prefix: &str, count: usize, size: usize) {
    let got: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix(prefix)).collect();
    assert_eq!(got.len(), count, "{prefix:?} lines:\n{out}");
    for (i, g) in got.iter().enumerate() {
        assert_eq!(*g, rping_data(i, size), "iteration {i}:\n{out}");
    }
}

#[test]
fn rping_xwarp_to_xwarp() {
    if skip("rping xwarp to xwarp") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let net = Net::new(94);
    let a = net.addr('a');
    for size in ["64", "4096"] {
        let server = net.server("rping", &["-s", "-a", &a, "-v", "-C", "10", "-S", size], "");
        let o = client(
            &net,
            "rping",
            &["-c", "-a", &a, "-v", "-C", "10", "-S", size],
        );
        let ct = text(&o);
        let so = finish(server);
        let st = text(&so);
        assert!(
            o.status.success(),
            "rping -c -S {size}:\n{ct}\nserver:\n{st}"
        );
        assert!(
            so.status.success(),
            "rping -s -S {size}:\n{st}\nclient:\n{ct}"
        );
        let n: usize = size.parse().unwrap();
        check_rping(&ct, "ping data: ", 10, n);
        check_rping(&st, "server ping data: ", 10, n);
    }
}

/// The MPA flags byte (M C R S Res) after the first `key` (RFC 5044 §7.1: the 16-byte key,
/// then the flags) in a capture file's bytes; the frames are small enough to sit whole in
/// one captured packet.
fn mpa_flags(cap: &[u8], key: &[u8; 16]) -> Option<u8> {
    cap.windows(17).find(|w| &w[..16] == key).map(|w| w[16])
}

#[test]
fn mpa_crc_setting_asks_for_crc() {
    if skip("XWARP_MPA_CRC") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let net = Net::new(99);
    let a = net.addr('a');
    let dir = std::env::temp_dir().join(format!("xwarp-ibverbs-crc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("capture dir");
    // (XWARP_MPA_CRC of the client, the C bit wanted in the Request and the Reply, a warning)
    let runs: [(Option<&str>, bool, bool); 4] = [
        (Some("1"), true, false),
        (Some("0"), false, false),
        (None, false, false),
        (Some("yes"), false, true),
    ];
    for (i, (var, want_c, warns)) in runs.into_iter().enumerate() {
        let server = net.server("rping", &["-s", "-a", &a, "-v", "-C", "4", "-S", "128"], "");
        let pcap = dir.join(format!("client-{i}.pcapng"));
        let deadline = Instant::now() + Duration::from_secs(60);
        // As `client`, but each try with a fresh capture and the variable.
        let o = loop {
            let _ = std::fs::remove_file(&pcap);
            let mut c = net.command(
                'b',
                30,
                "rping",
                &["-c", "-a", &a, "-v", "-C", "4", "-S", "128"],
            );
            c.env("XWARP_PCAP", &pcap);
            if let Some(v) = var {
                c.env("XWARP_MPA_CRC", v);
            }
            let o = c.output().expect("client");
            let t = text(&o);
            let not_yet = !o.status.success()
                && (t.contains("REJECTED") || t.contains("-111") || t.contains("UNREACHABLE"));
            if !not_yet || Instant::now() > deadline {
                break o;
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        let ct = text(&o);
        let so = finish(server);
        let st = text(&so);
        let what = format!("XWARP_MPA_CRC={var:?}");
        assert!(o.status.success(), "{what} client:\n{ct}\nserver:\n{st}");
        assert!(so.status.success(), "{what} server:\n{st}\nclient:\n{ct}");
        check_rping(&ct, "ping data: ", 4, 128);
        check_rping(&st, "server ping data: ", 4, 128);
        // rping's own stderr line aside ("DISCONNECT EVENT..."), the library's warnings.
        let cerr = String::from_utf8_lossy(&o.stderr);
        let warned: Vec<&str> = cerr
            .lines()
            .filter(|l| !l.contains("DISCONNECT EVENT"))
            .collect();
        if warns {
            assert_eq!(warned.len(), 1, "{what}: {cerr}");
            assert!(
                warned[0].contains("XWARP_MPA_CRC=\"yes\"") && warned[0].contains("using auto"),
                "{what}: {cerr}"
            );
        } else {
            assert!(warned.is_empty(), "{what}: {cerr}");
        }
        let cap = std::fs::read(&pcap).unwrap_or_else(|e| panic!("{what}: {pcap:?}: {e}"));
        let req = mpa_flags(&cap, b"MPA ID Req Frame").expect("MPA Request in the capture");
        let rep = mpa_flags(&cap, b"MPA ID Rep Frame").expect("MPA Reply in the capture");
        // M (0x80) off both ways, C (0x40) as asked, R (0x20) clear on the Reply.
        assert_eq!(req & 0x80, 0, "{what}: Request M bit, flags {req:#04x}");
        assert_eq!(rep & 0xa0, 0, "{what}: Reply M/R bits, flags {rep:#04x}");
        assert_eq!(
            req & 0x40 != 0,
            want_c,
            "{what}: Request C bit, flags {req:#04x}"
        );
        assert_eq!(
            rep & 0x40 != 0,
            want_c,
            "{what}: Reply C bit, flags {rep:#04x}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rdma_server_client_xwarp_to_xwarp() {
    if skip("rdma_server/rdma_client") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let net = Net::new(95);
    let a = net.addr('a');
    let server = net.server("rdma_server", &["-s", &a, "-p", "7472"], "");
    let o = client(&net, "rdma_client", &["-s", &a, "-p", "7472"]);
    let ct = text(&o);
    let so = finish(server);
    let st = text(&so);
    assert!(o.status.success(), "rdma_client:\n{ct}\nserver:\n{st}");
    assert!(ct.contains("rdma_client: end 0"), "{ct}");
    assert!(so.status.success(), "rdma_server:\n{st}");
    assert!(st.contains("rdma_server: end 0"), "{st}");
}

#[test]
fn ucmatose_xwarp_to_xwarp() {
    if skip("ucmatose") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let net = Net::new(96);
    let a = net.addr('a');
    // Plain, then with -m: every id moves to a new event channel (rdma_migrate_id).
    for extra in [&[][..], &["-m"][..]] {
        let mut sargs = vec!["-b", a.as_str(), "-c", "2", "-C", "5"];
        sargs.extend_from_slice(extra);
        let mut cargs = vec!["-s", a.as_str(), "-c", "2", "-C", "5"];
        cargs.extend_from_slice(extra);
        let server = net.server("ucmatose", &sargs, "");
        let o = client(&net, "ucmatose", &cargs);
        let ct = text(&o);
        let so = finish(server);
        let st = text(&so);
        assert!(
            o.status.success(),
            "ucmatose -s {extra:?}:\n{ct}\nserver:\n{st}"
        );
        assert!(ct.contains("return status 0"), "{ct}");
        assert!(so.status.success(), "ucmatose -b {extra:?}:\n{st}");
        assert!(
            st.contains("disconnected") && st.contains("return status 0"),
            "{st}"
        );
        if !extra.is_empty() {
            assert!(ct.contains("migrating to new event channel"), "{ct}");
            assert!(st.contains("migrating to new event channel"), "{st}");
        }
    }
}

/// The numbers row under perftest's `#bytes` header, if any.
fn perftest_row(out: &str) -> Option<&str> {
    let mut lines = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"));
    lines.next()?;
    lines.next().filter(|l| {
        l.split_whitespace().count() >= 4 && l.trim_start().starts_with(char::is_numeric)
    })
}

#[test]
fn perftest_xwarp_to_xwarp() {
    if skip("perftest -R") {
        return;
    }
    if !Path::new("/usr/bin/ib_write_bw").exists() {
        let _ = Command::new("sh")
            .args([
                "-c",
                "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends perftest",
            ])
            .stdout(Stdio::null())
            .status();
        if !Path::new("/usr/bin/ib_write_bw").exists() {
            println!("SKIPPED: perftest -R: apt-get install perftest failed");
            return;
        }
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let net = Net::new(92);
    let a = net.addr('a');
    for t in [
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
        "ib_send_lat",
        "ib_write_lat",
    ] {
        let server = net.server(t, &["-R", "-n", "200"], "");
        // Not `client()`: perftest -R makes two connections to the same port. The server
        // accepts the control connection, destroys that listener, syncs over the control
        // connection, and only then listens for the test connection, while the client
        // connects the test connection as soon as the sync message arrives. Under load the
        // SYN comes first and is refused (RST, REJECTED), and Debian's perftest (4.5-0.17)
        // cannot retry: its retry loop reuses the cm_ids it just destroyed. Running the
        // client again, as `client()` does, then points a new control connection at the
        // old server's test listener, and both sides fail with flushed Sends (status 5).
        // A refused connect is retried inside `rdma_connect` instead, as in
        // interop/README.md ("perftest clients start before their server listens").
        let o = net
            .command('b', 60, t, &["-R", "-n", "200", &a])
            .env("XWARP_CONNECT_RETRY_MS", "20000")
            .output()
            .expect("client");
        let ct = text(&o);
        let so = finish(server);
        let st = text(&so);
        assert!(o.status.success(), "{t} client:\n{ct}\nserver:\n{st}");
        assert!(so.status.success(), "{t} server:\n{st}\nclient:\n{ct}");
        let row = perftest_row(&ct).unwrap_or_else(|| panic!("{t}: no result row:\n{ct}"));
        println!("{t} -R: {row}");
        assert!(
            row.split_whitespace().next() == Some(if t.ends_with("lat") { "2" } else { "65536" }),
            "{t}: {row}"
        );
    }
}

#[test]
fn no_device_fails_cleanly() {
    if let Err(why) = packages() {
        println!("SKIPPED: no device: {why}");
        return;
    }
    let mut c = Command::new("timeout");
    c.arg("20")
        .arg(cm_pair())
        .args(["nodev", "10.1.0.1", "7000"]);
    for (k, _) in std::env::vars() {
        if k.starts_with("XWARP_") {
            c.env_remove(k);
        }
    }
    let o = c.env("LD_PRELOAD", library()).output().expect("cm_pair");
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("every call failed with ENODEV"), "{t}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.lines().all(|l| l.starts_with("xwarp-ibverbs: ")),
        "{err}"
    );
    assert!(err.contains("XWARP_IFACE is not set"), "{err}");
}

/// `name -> version` of the dynamic functions an object defines (`objdump -T`).
fn defined(obj: &Path) -> BTreeMap<String, String> {
    let o = Command::new("objdump")
        .arg("-T")
        .arg(obj)
        .output()
        .expect("objdump");
    assert!(o.status.success(), "objdump -T {}", obj.display());
    let mut m = BTreeMap::new();
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || !line.contains(".text") {
            continue;
        }
        let (ver, name) = (f[f.len() - 2], f[f.len() - 1]);
        if !ver.starts_with('(') {
            m.insert(name.to_string(), ver.to_string());
        }
    }
    m
}

fn imported_rdma(program: &str) -> BTreeMap<String, String> {
    let o = Command::new("nm")
        .args(["-D", "--undefined-only", "--with-symbol-versions", program])
        .output()
        .expect("nm");
    assert!(o.status.success(), "nm {program}");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|s| s.starts_with("rdma_"))
        .filter_map(|s| s.split_once('@'))
        .map(|(n, v)| (n.to_string(), v.trim_start_matches('@').to_string()))
        .collect()
}

#[test]
fn exported_versions_match_librdmacm() {
    if let Err(why) = packages() {
        println!("SKIPPED: rdma_cm symbol versions: {why}");
        return;
    }
    let ours = defined(&library());
    let real = defined(Path::new("/usr/lib/x86_64-linux-gnu/librdmacm.so.1"));
    let mut n = 0;
    for p in [
        "rping",
        "rdma_server",
        "rdma_client",
        "ucmatose",
        "udaddy",
        "mckey",
        "cmtime",
    ] {
        let path = format!("/usr/bin/{p}");
        if !Path::new(&path).exists() {
            continue;
        }
        for (name, ver) in imported_rdma(&path) {
            assert_eq!(ours.get(&name), Some(&ver), "{p} imports {name}@{ver}");
            n += 1;
        }
    }
    assert!(n > 40, "only {n} imports checked");
    // Every rdma_* we export is librdmacm's, at its version.
    for (name, ver) in ours.iter().filter(|(k, _)| k.starts_with("rdma_")) {
        assert_eq!(
            real.get(name),
            Some(ver),
            "{name}: librdmacm.so.1 has another version"
        );
    }
    // And every rdma_* function of librdmacm is ours (a program reaching the real one
    // with one of our ids would crash).
    for name in real.keys().filter(|k| k.starts_with("rdma_")) {
        assert!(ours.contains_key(name), "{name} is not exported");
    }
}
