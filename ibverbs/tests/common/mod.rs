//! Helpers the C-program tests share: the built library, the headers, compiling a C test.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether the test runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `libxwarp_ibverbs.so` of this build (beside the test executable).
pub fn library() -> PathBuf {
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
pub fn headers() -> Result<(), String> {
    let have = || {
        Path::new("/usr/include/infiniband/verbs.h").exists()
            && Path::new("/usr/lib/x86_64-linux-gnu/libibverbs.so").exists()
    };
    if !have() && is_root() {
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

/// Compile `tests/c/<name>.c` (with `-Wall -Werror`, linked with libibverbs and pthread)
/// into `dir`; the executable's path.
pub fn compile_c(name: &str, dir: &Path) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    std::fs::create_dir_all(dir).unwrap();
    let exe = dir.join(name);
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
    exe
}

/// A command running `exe` under `timeout 60` with the library preloaded and every
/// inherited `XWARP_*` variable removed.
pub fn preloaded(mut cmd: Command, exe: &Path) -> Command {
    cmd.arg("60").arg(exe);
    for (k, _) in std::env::vars() {
        if k.starts_with("XWARP_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("LD_PRELOAD", library());
    cmd
}
