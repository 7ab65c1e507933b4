//! The ABI surface table of `ibverbs/README.md` is the work list of the implementation: it
//! must stay what Debian's rdma-core and perftest programs really import. This test reruns
//! `scripts/abi-inventory.sh` (nm on the installed programs) and compares its table with the
//! README's, line by line. A second test requires every row of that table to be exported
//! by the built `libxwarp_ibverbs.so` as a global defined function at the row's version
//! (`objdump -T`): LLVM gives trivial Rust functions local linkage, and a symbol lost
//! that way links and loads fine but leaves the program calling the real libibverbs.

mod common;

use std::collections::BTreeMap;
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

/// The rows of the README's import table: (symbol, version).
fn readme_rows() -> Vec<(String, String)> {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(crate_dir.join("README.md")).expect("ibverbs/README.md");
    let table = readme
        .split_once(BEGIN)
        .and_then(|(_, rest)| rest.split_once(END))
        .map(|(table, _)| table.trim().to_string())
        .expect("README.md has the abi-inventory markers");
    table
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split('|').map(str::trim).collect();
            let sym = cols.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((sym.to_string(), cols.get(2)?.to_string()))
        })
        .collect()
}

/// The global defined functions of `lib` by name: their version (`objdump -T`).
fn exported_functions(lib: &Path) -> BTreeMap<String, String> {
    let o = Command::new("objdump")
        .arg("-T")
        .arg(lib)
        .output()
        .expect("objdump -T");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut m = BTreeMap::new();
    for l in String::from_utf8_lossy(&o.stdout).lines() {
        // "0000000000121000 g    DF .text\t0000000000000003  IBVERBS_1.1 ibv_fork_init"
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() >= 7 && f[1] == "g" && f[2] == "DF" && f[3] != "*UND*" {
            m.insert(f[6].to_string(), f[5].to_string());
        }
    }
    m
}

#[test]
fn every_imported_symbol_is_exported_at_its_version() {
    if Command::new("objdump").arg("--version").output().is_err() {
        println!("SKIPPED: export check: no objdump (binutils)");
        return;
    }
    let rows = readme_rows();
    assert!(rows.len() > 40, "implausibly few rows: {rows:?}");
    let ours = exported_functions(&common::library());
    // The librdmacm rows count once the library exports any rdma_ function (ibv-cm).
    let cm = ours.keys().any(|n| n.starts_with("rdma_"));
    let mut missing = Vec::new();
    for (sym, ver) in &rows {
        if ver.starts_with("RDMACM_") && !cm {
            continue;
        }
        match ours.get(sym) {
            Some(v) if v == ver => {}
            Some(v) => missing.push(format!("{sym}: exported at {v}, imported at {ver}")),
            None => missing.push(format!("{sym}@{ver}: not a global defined function")),
        }
    }
    assert!(
        missing.is_empty(),
        "libxwarp_ibverbs.so lacks imports of the README table:\n  {}",
        missing.join("\n  ")
    );
}
