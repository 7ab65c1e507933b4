//! The ABI surface table of `ibverbs/README.md` is the work list of the implementation: it
//! must stay what Debian's rdma-core and perftest programs really import. This test reruns
//! `scripts/abi-inventory.sh` (nm on the installed programs) and compares its table with the
//! README's, line by line.

use std::path::Path;
use std::process::Command;

const BEGIN: &str = "<!-- abi-inventory:begin -->";
const END: &str = "<!-- abi-inventory:end -->";

#[test]
fn readme_table_matches_the_programs_imports() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let programs = [
        "rping",
        "ucmatose",
        "udaddy",
        "rdma_server",
        "rdma_client",
        "ibv_devices",
        "ibv_devinfo",
        "ibv_rc_pingpong",
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
        "ib_write_lat",
        "ib_send_lat",
    ];
    let missing: Vec<&str> = programs
        .iter()
        .copied()
        .filter(|p| {
            !std::env::var_os("PATH")
                .map(|paths| std::env::split_paths(&paths).any(|d| d.join(p).is_file()))
                .unwrap_or(false)
        })
        .collect();
    if !missing.is_empty() {
        println!(
            "SKIPPED: ABI inventory check: not installed: {} (packages rdmacm-utils, ibverbs-utils, perftest)",
            missing.join(" ")
        );
        return;
    }
    if Command::new("nm").arg("--version").output().is_err() {
        println!("SKIPPED: ABI inventory check: no nm (binutils)");
        return;
    }
    let out = Command::new("bash")
        .arg(crate_dir.join("scripts/abi-inventory.sh"))
        .output()
        .expect("run scripts/abi-inventory.sh");
    assert!(
        out.status.success(),
        "abi-inventory.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let generated = String::from_utf8(out.stdout).expect("UTF-8 table");
    let readme = std::fs::read_to_string(crate_dir.join("README.md")).expect("ibverbs/README.md");
    let table = readme
        .split_once(BEGIN)
        .and_then(|(_, rest)| rest.split_once(END))
        .map(|(table, _)| table.trim())
        .expect("README.md has the abi-inventory markers");
    assert!(
        generated.lines().count() > 10,
        "implausibly short table:\n{generated}"
    );
    let want: Vec<&str> = generated.trim().lines().collect();
    let have: Vec<&str> = table.lines().collect();
    let only_programs: Vec<&&str> = want.iter().filter(|l| !have.contains(l)).collect();
    let only_readme: Vec<&&str> = have.iter().filter(|l| !want.contains(l)).collect();
    assert!(
        only_programs.is_empty() && only_readme.is_empty(),
        "README table out of date (regenerate with ibverbs/scripts/abi-inventory.sh):\n\
         imported but not in the README:\n  {}\nin the README but not imported:\n  {}",
        only_programs
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join("\n  "),
        only_readme
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join("\n  ")
    );
}
