//! `xwarp run -- ibv_devinfo`: the launcher preloads `libxwarp_ibverbs.so` beside the
//! socket shim, so Debian's unmodified `ibv_devices`/`ibv_devinfo` list the xwarp device of
//! `--iface`; `--no-rdma` leaves it out. Root (a veth pair in test namespaces); without
//! root the test prints `SKIPPED:` and returns. No engine starts: discovery never opens a
//! socket, and the shim starts its engine on first use.
#![cfg(target_os = "linux")]

#[path = "support/shim_env.rs"]
mod shim_env;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use xwarp::poll_driver::netns::VethPair;

/// `libxwarp_ibverbs.so` built into the directory of the `xwarp` executable under test,
/// where `xwarp run` looks first.
fn ibverbs_beside_xwarp() -> &'static Path {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| {
        let exe = Path::new(env!("CARGO_BIN_EXE_xwarp"));
        let profile_dir = exe.parent().expect("profile dir");
        let target = profile_dir.parent().expect("target dir");
        let profile = profile_dir
            .file_name()
            .and_then(|s| s.to_str())
            .unwrap_or("release");
        let mut c = Command::new(env!("CARGO"));
        c.args(["build", "-q", "-p", "xwarp-ibverbs", "--target-dir"])
            .arg(target)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile == "release" {
            c.arg("--release");
        }
        let st = c.status().expect("run cargo");
        assert!(st.success(), "building xwarp-ibverbs failed");
        let so = profile_dir.join("libxwarp_ibverbs.so");
        assert!(so.exists(), "{} missing", so.display());
        so
    })
}

#[test]
fn xwarp_run_lists_the_xwarp_device() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED: xwarp run -- ibv_devinfo: needs root (network namespaces)");
        return;
    }
    let _serial = shim_env::serial();
    shim_env::ensure_tool("ibv_devinfo", "ibverbs-utils");
    let shim = shim_env::shim();
    ibverbs_beside_xwarp();
    let net = VethPair::new(96).expect("veth pair");
    let run = |extra: &[&str], prog: &[&str]| {
        let mut c = net.a.command("timeout").expect("ns A");
        c.arg("30")
            .arg(env!("CARGO_BIN_EXE_xwarp"))
            .args([
                "run",
                "--iface",
                &net.if_a,
                "--addr",
                "10.88.96.10/24",
                "--preload",
            ])
            .arg(shim)
            .args(extra)
            .arg("--")
            .args(prog);
        for (k, _) in std::env::vars() {
            if k.starts_with("XWARP_") || k == "LD_PRELOAD" {
                c.env_remove(k);
            }
        }
        let o = c.output().expect("spawn xwarp run");
        (
            o.status,
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (st, out, err) = run(&[], &["ibv_devinfo"]);
    assert!(st.success(), "{out}{err}");
    assert!(out.contains("hca_id:\txwarp_veth-a"), "{out}");
    assert!(out.contains("transport:\t\t\tiWARP (1)"), "{out}");
    assert!(out.contains("PORT_ACTIVE (4)"), "{out}");
    assert!(
        !err.contains("engine started"),
        "discovery started an engine: {err}"
    );
    let (st, out, err) = run(&[], &["ibv_devices"]);
    assert!(st.success(), "{out}{err}");
    assert!(out.contains("xwarp_veth-a"), "{out}");
    // --no-rdma: the program sees the kernel's devices (none named xwarp_*).
    let (_, out, err) = run(&["--no-rdma"], &["ibv_devinfo", "-l"]);
    assert!(!out.contains("xwarp_"), "{out}{err}");
}
