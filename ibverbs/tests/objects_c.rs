//! `tests/c/objects.c`, a C program compiled against Debian's `<infiniband/verbs.h>` and
//! linked with `-libverbs`, run with `libxwarp_ibverbs.so` preloaded on a veth in a test
//! namespace (root): the engine starts with AF_XDP on `veth-a`, and every call of the
//! program (the header-inline ones included) reaches the library. The program checks
//! the results and error returns itself; this test requires it to pass, and requires
//! one warning line per unsupported verb it tried on stderr.

use std::path::PathBuf;
use std::process::Command;

use xwarp_poll_driver::netns::VethPair;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `libxwarp_ibverbs.so` of this build (beside the test executable).
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("deps dir");
    for p in [
        deps.join("libxwarp_ibverbs.so"),
        deps.parent().expect("profile").join("libxwarp_ibverbs.so"),
    ] {
        if p.exists() {
            return p;
        }
    }
    panic!("libxwarp_ibverbs.so not found beside {}", deps.display());
}

/// The headers and libibverbs.so (libibverbs-dev), installed when missing (root).
fn headers() -> Result<(), String> {
    let have = || {
        std::path::Path::new("/usr/include/infiniband/verbs.h").exists()
            && std::path::Path::new("/usr/lib/x86_64-linux-gnu/libibverbs.so").exists()
    };
    if !have() {
        let _ = Command::new("sh")
            .args([
                "-c",
                "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs-dev \
                 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs-dev)",
            ])
            .status();
    }
    if have() {
        Ok(())
    } else {
        Err("libibverbs-dev is not installed".into())
    }
}

#[test]
fn c_program_on_a_veth() {
    if !is_root() {
        println!("SKIPPED: the C verbs-object test: needs root (network namespace, AF_XDP)");
        return;
    }
    if let Err(why) = headers() {
        println!("SKIPPED: the C verbs-object test: {why}");
        return;
    }
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/objects.c");
    let dir = std::env::temp_dir().join(format!("xwarp-ibv-objects-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("objects");
    let cc = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(["-libverbs", "-ldl", "-lpthread"])
        .output()
        .expect("cc");
    assert!(
        cc.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let net = VethPair::new(93).expect("veth pair");
    let mut cmd = net.a.command("timeout").expect("ns command");
    cmd.arg("60").arg(&exe);
    for (k, _) in std::env::vars() {
        if k.starts_with("XWARP_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("LD_PRELOAD", library())
        .env("XWARP_IFACE", &net.if_a)
        .env("XWARP_ADDR", "10.88.93.10/24");
    let o = cmd.output().expect("run the C test");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    drop(net);
    assert!(
        o.status.success(),
        "C test failed ({:?}):\n{out}\n{err}",
        o.status
    );
    assert!(out.contains(", 0 failures"), "{out}");
    // One warning line per unsupported verb tried (UD QP, immediate data, SRQ resize, AH)
    // and for the modify to RTS without a connection; nothing else from the library.
    let ours: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("xwarp-ibverbs:"))
        .collect();
    for verb in [
        "ibv_create_qp(qp_type 4)",
        "WITH_IMM",
        "ibv_create_ah",
        "IBV_SRQ_MAX_WR",
        "IBV_QPS_RTS",
    ] {
        assert_eq!(
            ours.iter().filter(|l| l.contains(verb)).count(),
            1,
            "one warning naming {verb}: {err}"
        );
    }
    assert_eq!(ours.len(), 5, "{err}");
    println!("{out}");
}
