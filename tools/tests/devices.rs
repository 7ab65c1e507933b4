//! `xwarp devices` against the real kernel (root): a veth pair with 4 RX and 3 TX queues in
//! a test namespace must be reported with native XDP, those queue counts and no zero-copy;
//! `--probe` on it must attach XDP in generic and native mode and bind AF_XDP in copy mode,
//! and leave no program attached. Bad interface names give one clear line and exit 1.
//! Without root / AF_XDP / `ip` each test prints `SKIPPED:` and returns.

#[macro_use]
#[path = "../../tests/support/afxdp_skip.rs"]
mod afxdp_skip;
#[path = "support/bounded.rs"]
mod bounded;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use xwarp_poll_driver::netns::NetNs;

const XWARP: &str = env!("CARGO_BIN_EXE_xwarp");

/// A namespace with `veth-q` (4 RX, 3 TX queues) whose peer `veth-p` sits in a second
/// namespace; both removed on drop, also when the test fails.
struct Net {
    a: NetNs,
    _b: NetNs,
}

fn net() -> Net {
    let a = NetNs::new("dev").expect("netns");
    let b = NetNs::new("peer").expect("netns");
    a.ip(&[
        "link",
        "add",
        "veth-q",
        "numrxqueues",
        "4",
        "numtxqueues",
        "3",
        "type",
        "veth",
        "peer",
        "name",
        "veth-p",
        "netns",
        b.name(),
        "numrxqueues",
        "4",
        "numtxqueues",
        "3",
    ])
    .expect("veth pair");
    a.ip(&["link", "set", "veth-q", "up"]).expect("up");
    b.ip(&["link", "set", "veth-p", "up"]).expect("up");
    Net { a, _b: b }
}

/// Run `xwarp args...` inside `ns` (killed after 60 s).
fn xwarp(ns: &NetNs, args: &[&str]) -> Output {
    let mut cmd = ns.command(XWARP).expect("command in netns");
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    bounded::output_within(cmd, Duration::from_secs(60))
}

fn json_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "exit {:?}, stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

fn device<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["devices"]
        .as_array()
        .expect("devices array")
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed: {v}"))
}

#[test]
fn veth_is_reported_with_its_queues_and_native_xdp() {
    require_root_and_afxdp!();
    let net = net();
    // Every interface of the namespace: lo and the veth.
    let all = json_of(&xwarp(&net.a, &["devices", "--json"]));
    let names: Vec<_> = all["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(names, ["lo", "veth-q"], "only this namespace's interfaces");
    let d = device(&all, "veth-q");
    assert_eq!(d["kind"], "veth");
    assert_eq!(d["driver"]["name"], "veth");
    assert_eq!(d["rx_queues"], 4);
    assert_eq!(d["tx_queues"], 3);
    assert_eq!(d["up"], true);
    assert_eq!(d["mtu"], 1500);
    assert_eq!(d["attached"].as_array().unwrap().len(), 0);
    if all["kernel"]["netdev_family"] == true {
        assert_eq!(d["xdp"]["source"], "netdev");
        assert_eq!(d["xdp"]["native"], true, "{d}");
        assert_eq!(d["xdp"]["zero_copy"], false, "{d}");
        let f = d["xdp"]["features"].as_array().unwrap();
        assert!(f.iter().any(|x| x == "basic") && f.iter().any(|x| x == "redirect"));
        assert!(!f.iter().any(|x| x == "xsk-zerocopy"));
    } else {
        afxdp_skip::report_skip(
            "no netdev netlink family: XDP capabilities are reported unknown",
            file!(),
            line!(),
        );
        assert_eq!(d["xdp"]["native"], Value::Null);
    }
    // One interface by name: the same record.
    let one = json_of(&xwarp(&net.a, &["devices", "veth-q", "--json"]));
    assert_eq!(one["devices"].as_array().unwrap().len(), 1);
    assert_eq!(device(&one, "veth-q")["rx_queues"], 4);
    // Text output names the same facts.
    let text = xwarp(&net.a, &["devices", "veth-q"]);
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("veth-q (veth)"), "{text}");
    assert!(text.contains("rx 4, tx 3"), "{text}");
}

#[test]
fn probe_attaches_both_modes_binds_copy_and_detaches() {
    require_root_and_afxdp!();
    let net = net();
    let v = json_of(&xwarp(&net.a, &["devices", "veth-q", "--probe", "--json"]));
    let d = device(&v, "veth-q");
    let p = &d["probe"];
    assert_eq!(p["generic"]["status"], "ok", "{p}");
    assert_eq!(p["native"]["status"], "ok", "{p}");
    assert_eq!(p["copy"]["status"], "ok", "{p}");
    // veth has no zero-copy: the kernel refuses the bind.
    assert_eq!(p["zero_copy"]["status"], "failed", "{p}");
    let why = p["zero_copy"]["detail"].as_str().unwrap();
    assert!(
        why.contains("not supported"),
        "EOPNOTSUPP, not a busy queue: {why}"
    );
    // Copy mode with multi-buffer and TX metadata work on veth (Linux 6.6+ / 6.8+).
    assert_eq!(p["multi_buffer"]["status"], "ok", "{p}");
    if v["kernel"]["tx_metadata"] == true {
        assert_eq!(p["tx_metadata"]["status"], "ok", "{p}");
    }
    assert_eq!(p["clean"], true, "{p}");
    // Nothing left on the interface, as the kernel sees it.
    let link = net.a.ip(&["-d", "link", "show", "veth-q"]).unwrap();
    assert!(!link.contains("prog/xdp"), "{link}");
    let after = json_of(&xwarp(&net.a, &["devices", "veth-q", "--json"]));
    assert_eq!(
        device(&after, "veth-q")["attached"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
}

#[test]
fn probe_refuses_an_interface_that_runs_a_program_and_names_it() {
    require_root_and_afxdp!();
    let net = net();
    let out = net
        .a
        .run(|| {
            use xwarp_poll_driver::afxdp::{SteeringFilter, XdpMode, XdpProgram};
            let idx = {
                let c = std::ffi::CString::new("veth-q").unwrap();
                // SAFETY: valid C string.
                unsafe { libc::if_nametoindex(c.as_ptr()) }
            };
            let prog = XdpProgram::load_named(&SteeringFilter::default(), 1, "other_prog").unwrap();
            let link = prog.attach(idx, XdpMode::Generic, false).unwrap();
            let mut cmd = Command::new(XWARP);
            cmd.args(["devices", "veth-q", "--json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let listed = bounded::output_within(cmd, Duration::from_secs(60));
            let mut cmd = Command::new(XWARP);
            cmd.args(["devices", "veth-q", "--probe"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let probed = bounded::output_within(cmd, Duration::from_secs(60));
            drop(link);
            (listed, probed, std::process::id())
        })
        .unwrap();
    let (listed, probed, pid) = out;
    let v = json_of(&listed);
    let att = &device(&v, "veth-q")["attached"][0];
    assert_eq!(att["mode"], "generic", "{att}");
    assert_eq!(att["name"], "other_prog", "{att}");
    assert!(
        att["holders"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["pid"] == pid),
        "this test process holds the link: {att}"
    );
    assert_eq!(probed.status.code(), Some(1));
    let err = String::from_utf8_lossy(&probed.stderr);
    assert!(
        err.contains("other_prog") && err.contains("not probing"),
        "{err}"
    );
}

#[test]
fn bad_interface_names_are_one_line_errors() {
    // No root needed: the lookup fails before anything is touched.
    for args in [
        &["devices", "no-such-if0"][..],
        &["devices", "no-such-if0", "--json"],
        &["devices", "no-such-if0", "--probe"],
        &["devices", "--probe"],
    ] {
        let mut cmd = Command::new(XWARP);
        cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        let out = bounded::output_within(cmd, Duration::from_secs(60));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains("no network interface named \"no-such-if0\"")
                || err.contains("--probe needs an interface"),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}
