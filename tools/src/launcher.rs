//! `xwarp run -- CMD`: run an unmodified program with the LD_PRELOAD socket shim and the
//! libibverbs-compatible library.
//!
//! ```text
//! xwarp run [--iface IF] [--addr A.B.C.D/P] [--addr6 X::Y/P] [--gateway A.B.C.D]
//!           [--ports LIST] [--connect subnet|all|none] [--spin-us N]
//!           [--mode thread|inline] [--profile latency]
//!           [--log FILTER] [--strict] [--pcap FILE] [--preload PATH]
//!           [--rdma-lib PATH | --no-rdma]
//!           -- CMD [ARGS...]
//! ```
//! Each option sets the `XWARP_*` variable of the same name (see `preload/README.md`);
//! variables already in the environment are kept unless an option overrides them.
//! `libxwarp_preload.so` is looked up at `--preload`, `$XWARP_PRELOAD`, next to the
//! `xwarp` executable, in `../lib` and `../lib/xwarp` relative to it, then in the
//! workspace target directory the tools were built in ([`candidates`]). The shim itself
//! validates the configuration when it loads (a misconfiguration exits with status 2).
//!
//! `libxwarp_ibverbs.so` (the `xwarp-ibverbs` crate: libibverbs' functions with their
//! symbol versions, so `ibv_devices`, `ibv_devinfo` and later rping/perftest see the
//! xwarp device `xwarp_<iface>`) goes into `LD_PRELOAD` after the shim. It is preloaded
//! by default rather than behind a flag: `xwarp run` exists to put a program on the
//! engine, and a program that never calls `ibv_*` never reaches the library (it has no
//! constructor, starts no thread and defines only `ibv_*` names), while one that does
//! would otherwise silently use the kernel's RDMA devices instead of the engine. It is
//! looked up at `--rdma-lib`, `$XWARP_IBVERBS` (both must exist), then in the same places
//! as the shim; when the default lookup finds nothing (only the shim was built) the
//! program runs with the shim alone. `--no-rdma` leaves it out.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// What `xwarp run` will execute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Environment variables to set.
    pub env: Vec<(String, OsString)>,
    /// The program.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
}

/// The command line of `xwarp run` as clap sees it. Each option sets the `XWARP_*`
/// variable named in its help.
#[derive(clap::Parser, Debug)]
#[command(
    name = "xwarp run",
    version,
    override_usage = "xwarp run [options] -- CMD [ARGS...]",
    about = "Runs CMD with libxwarp_preload.so: its TCP sockets on the engine's address run \
             on the xwarp engine (AF_XDP on --iface), everything else stays on the kernel; \
             with libxwarp_ibverbs.so its ibv_* calls see the xwarp device xwarp_<iface>.",
    after_help = "The shim is looked up at --preload, $XWARP_PRELOAD, next to the xwarp \
                  executable, in ../lib/ and ../lib/xwarp/ relative to it, then in the \
                  target directory of the checkout xwarp was built from (release/, then \
                  debug/): see tools/README.md. libxwarp_ibverbs.so is looked up at \
                  --rdma-lib, $XWARP_IBVERBS, then in the same places, and left out when \
                  not found."
)]
struct Cli {
    /// Interface the engine binds AF_XDP to [XWARP_IFACE].
    #[arg(long, value_name = "IF")]
    iface: Option<OsString>,
    /// Engine IPv4 address/prefix (not on the kernel) [XWARP_ADDR].
    #[arg(long, value_name = "A/P")]
    addr: Option<OsString>,
    /// Engine IPv6 address/prefix [XWARP_ADDR6].
    #[arg(long, value_name = "A/P")]
    addr6: Option<OsString>,
    /// IPv4 default gateway [XWARP_GATEWAY].
    #[arg(long, value_name = "A")]
    gateway: Option<OsString>,
    /// Wildcard listener ports to accelerate, e.g. 80,8000-8100 [XWARP_PORTS].
    #[arg(long, value_name = "LIST")]
    ports: Option<OsString>,
    /// Outgoing connections: subnet (default), all, none [XWARP_CONNECT].
    #[arg(long, value_name = "MODE")]
    connect: Option<OsString>,
    /// Spin budget of blocking calls in microseconds [XWARP_SPIN_US].
    #[arg(long = "spin-us", value_name = "N")]
    spin_us: Option<OsString>,
    /// Who runs the engine: `thread` (default: an engine thread, for programs with many
    /// threads) or `inline` (the program's threads drive it from their socket calls, no
    /// thread hand-off: for single-threaded servers) [XWARP_MODE].
    #[arg(long, value_name = "MODE", value_parser = ["thread", "inline"])]
    mode: Option<String>,
    /// A preset: `latency` = `--mode inline` (with its 200 µs spin of blocking calls)
    /// and an engine keeper that yields its core while it spins. Options given
    /// explicitly win.
    #[arg(long, value_name = "NAME", value_parser = ["latency"])]
    profile: Option<String>,
    /// The shim's log filter, env_logger syntax: a level (off, error, warn (default),
    /// info, debug, trace) or `target=level,...` (e.g. `xwarp_preload=debug,smoltcp=trace`)
    /// [XWARP_LOG].
    #[arg(long, value_name = "FILTER")]
    log: Option<OsString>,
    /// Exit if the engine cannot start [XWARP_STRICT=1].
    #[arg(long)]
    strict: bool,
    /// Record every frame of the engine to FILE: pcapng (`.pcap`: classic pcap); `%p`
    /// becomes the pid, `%e` the engine's index [XWARP_PCAP]. `-%p` is added before the
    /// extension unless FILE has a `%p` already, so every process the command starts
    /// writes its own file (`cap.pcapng` -> `cap-1234.pcapng`).
    #[arg(long, value_name = "FILE", value_parser = pcap_path_arg)]
    pcap: Option<OsString>,
    /// The shim library (default: see below) [XWARP_PRELOAD].
    #[arg(long, value_name = "PATH")]
    preload: Option<PathBuf>,
    /// The libibverbs-compatible library, libxwarp_ibverbs.so (default: looked up like the
    /// shim, left out if not found) [XWARP_IBVERBS].
    #[arg(long = "rdma-lib", value_name = "PATH", conflicts_with = "no_rdma")]
    rdma_lib: Option<PathBuf>,
    /// Do not preload libxwarp_ibverbs.so (RDMA programs then see the kernel's devices).
    #[arg(long = "no-rdma")]
    no_rdma: bool,
    /// The program to run and its arguments, after `--`.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<OsString>,
}

impl Cli {
    /// The variables the options set, in the order of the options above.
    fn vars(&mut self) -> Vec<(String, OsString)> {
        let mut out: Vec<(String, OsString)> = [
            ("XWARP_IFACE", self.iface.take()),
            ("XWARP_ADDR", self.addr.take()),
            ("XWARP_ADDR6", self.addr6.take()),
            ("XWARP_GATEWAY", self.gateway.take()),
            ("XWARP_PORTS", self.ports.take()),
            ("XWARP_CONNECT", self.connect.take()),
            ("XWARP_SPIN_US", self.spin_us.take()),
            ("XWARP_LOG", self.log.take()),
            ("XWARP_PCAP", self.pcap.take()),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_string(), v?)))
        .collect();
        if self.strict {
            out.push(("XWARP_STRICT".into(), "1".into()));
        }
        let mode = self
            .mode
            .take()
            .or_else(|| self.profile.as_ref().map(|_| "inline".to_string()));
        if let Some(m) = mode {
            out.push(("XWARP_MODE".into(), m.into()));
        }
        if self.profile.take().is_some() {
            // latency: the keeper (inline mode) or the engine thread gives its core away
            // while it spins, so the program's own thread gets it back at once.
            out.push(("XWARP_YIELD".into(), "1".into()));
        }
        out
    }
}

/// clap value parser of `--pcap`: the file's directory must exist; `-%p` is added
/// unless the path has a `%p` ([`crate::cli::per_process`]): a command may start several
/// processes, and two writing one file would truncate and interleave it.
fn pcap_path_arg(s: &str) -> Result<OsString, String> {
    crate::cli::pcap_arg(s).map(|_| OsString::from(crate::cli::per_process(s)))
}

/// clap's view of `args` (after `xwarp run`); help and version requests are errors of
/// their kind.
fn parse_cli(args: &[OsString]) -> Result<Cli, clap::Error> {
    let argv = std::iter::once(OsString::from("xwarp run")).chain(args.iter().cloned());
    <Cli as clap::Parser>::try_parse_from(argv)
}

/// A clap error as `plan` reports it.
fn message(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    match (e.kind(), e.get(ContextKind::InvalidArg)) {
        (ErrorKind::UnknownArgument, Some(ContextValue::String(a))) if a.starts_with('-') => {
            format!("unknown option {a}")
        }
        (ErrorKind::UnknownArgument, Some(ContextValue::String(a))) => {
            format!("unexpected {a:?}: put the command after `--`")
        }
        _ => crate::cli::clap_message(e),
    }
}

/// The shim library's file name.
const SHIM: &str = "libxwarp_preload.so";
/// The libibverbs-compatible library's file name.
const IBVERBS: &str = "libxwarp_ibverbs.so";

/// The target directory of the workspace these tools were built in, as cargo had it at
/// build time (`$CARGO_TARGET_DIR`, else `<workspace>/target`).
fn build_target_dir() -> PathBuf {
    match option_env!("CARGO_TARGET_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("target"),
    }
}

/// Candidate locations of the shim library for an `xwarp` executable in `exe_dir`, in
/// lookup order (after `--preload` and `$XWARP_PRELOAD`):
/// 1. beside the executable (`target/release/` after `cargo build --release`);
/// 2. its parent directory (`target/<profile>/deps/..`: test binaries);
/// 3. `../lib/` and `../lib/xwarp/` relative to it (an installed `bin/` + `lib/` layout,
///    e.g. `~/.cargo/bin/xwarp` with the shim copied to `~/.cargo/lib/xwarp/`);
/// 4. the workspace target directory the tools were built in (`release/`, then `debug/`),
///    so `cargo install --path tools` finds a shim built with
///    `cargo build --release -p xwarp-preload` in the same checkout.
pub fn candidates(exe_dir: &Path) -> Vec<PathBuf> {
    candidates_for(exe_dir, SHIM)
}

/// [`candidates`] for the library file `name` (`libxwarp_ibverbs.so` is looked up the
/// same way as the shim).
pub fn candidates_for(exe_dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut v = vec![exe_dir.join(name)];
    if let Some(parent) = exe_dir.parent() {
        v.push(parent.join(name));
        v.push(parent.join("lib").join(name));
        v.push(parent.join("lib").join("xwarp").join(name));
    }
    let target = build_target_dir();
    v.push(target.join("release").join(name));
    v.push(target.join("debug").join(name));
    v
}

/// Work out what to run from `args` (after `xwarp run`), the environment (`env`) and the
/// directory of the `xwarp` executable. `exists` tells whether a file exists.
pub fn plan(
    args: &[OsString],
    env: impl Fn(&str) -> Option<OsString>,
    exe_dir: &Path,
    exists: impl Fn(&Path) -> bool,
) -> Result<Plan, String> {
    let mut cli = parse_cli(args).map_err(|e| message(&e))?;
    let out = cli.vars();
    let preload = cli.preload.take();
    let rdma_lib = cli.rdma_lib.take();
    let no_rdma = cli.no_rdma;
    let Some((program, cmd_args)) = cli.command.split_first() else {
        return Err("no command after `--` (xwarp run [options] -- CMD [ARGS...])".into());
    };
    let (program, cmd_args) = (program.clone(), cmd_args.to_vec());
    let has_iface = out.iter().any(|(k, _)| k == "XWARP_IFACE") || env("XWARP_IFACE").is_some();
    if !has_iface {
        return Err("no interface: give --iface (or set XWARP_IFACE)".into());
    }
    let so = match preload.or_else(|| env("XWARP_PRELOAD").map(PathBuf::from)) {
        Some(p) => {
            if !exists(&p) {
                return Err(format!("{}: no such file", p.display()));
            }
            p
        }
        None => candidates(exe_dir)
            .into_iter()
            .find(|p| exists(p))
            .ok_or_else(|| {
                format!(
                    "libxwarp_preload.so not found next to {} nor in {} (build it with \
                     `cargo build --release -p xwarp-preload`, or give --preload or XWARP_PRELOAD)",
                    exe_dir.display(),
                    build_target_dir().display()
                )
            })?,
    };
    let rdma = if no_rdma {
        None
    } else {
        match rdma_lib.or_else(|| env("XWARP_IBVERBS").map(PathBuf::from)) {
            Some(p) => {
                if !exists(&p) {
                    return Err(format!("{}: no such file", p.display()));
                }
                Some(p)
            }
            None => candidates_for(exe_dir, IBVERBS)
                .into_iter()
                .find(|p| exists(p)),
        }
    };
    let mut out = out;
    let mut ld = OsString::from(so.as_os_str());
    if let Some(r) = rdma {
        ld.push(":");
        ld.push(r);
    }
    if let Some(old) = env("LD_PRELOAD").filter(|v| !v.is_empty()) {
        ld.push(":");
        ld.push(old);
    }
    out.push(("LD_PRELOAD".into(), ld));
    Ok(Plan {
        env: out,
        program,
        args: cmd_args,
    })
}

/// Entry point of `xwarp run ARGS...` (ARGS excludes `xwarp run`).
pub fn main(args: Vec<OsString>) -> ExitCode {
    use clap::error::ErrorKind;
    if let Err(e) = parse_cli(&args) {
        if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."));
    let p = match plan(&args, |k| std::env::var_os(k), &exe_dir, |p| p.is_file()) {
        Ok(p) => p,
        Err(e) => {
            let usage = <Cli as clap::CommandFactory>::command().render_usage();
            eprintln!("xwarp run: {e}\n\n{usage}\n\nFor more information, try '--help'.");
            return ExitCode::from(2);
        }
    };
    let mut cmd = Command::new(&p.program);
    cmd.args(&p.args);
    for (k, v) in &p.env {
        cmd.env(k, v);
    }
    // Only returns on failure.
    let e = cmd.exec();
    eprintln!("xwarp run: cannot run {:?}: {e}", p.program);
    ExitCode::from(127)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn env_of(m: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let m: HashMap<String, OsString> = m
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn options_become_variables_and_the_shim_is_found_next_to_xwarp() {
        let p = plan(
            &os(&[
                "--iface",
                "veth-a",
                "--addr=10.88.1.10/24",
                "--strict",
                "--log",
                "info",
                "--",
                "redis-server",
                "--port",
                "6379",
            ]),
            env_of(&[("LD_PRELOAD", "/other.so")]),
            Path::new("/opt/xwarp/bin"),
            |p| p == Path::new("/opt/xwarp/lib/libxwarp_preload.so"),
        )
        .unwrap();
        assert_eq!(p.program, "redis-server");
        assert_eq!(p.args, os(&["--port", "6379"]));
        let get = |k: &str| p.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("XWARP_IFACE").unwrap(), "veth-a");
        assert_eq!(get("XWARP_ADDR").unwrap(), "10.88.1.10/24");
        assert_eq!(get("XWARP_STRICT").unwrap(), "1");
        assert_eq!(get("XWARP_LOG").unwrap(), "info");
        assert_eq!(
            get("LD_PRELOAD").unwrap(),
            "/opt/xwarp/lib/libxwarp_preload.so:/other.so"
        );
    }

    #[test]
    fn mode_and_latency_profile_set_xwarp_mode() {
        let run = |args: &[&str]| {
            plan(&os(args), env_of(&[]), Path::new("/opt/xwarp/bin"), |p| {
                p == Path::new("/opt/xwarp/lib/libxwarp_preload.so")
            })
            .unwrap()
        };
        let get = |p: &Plan, k: &str| p.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let p = run(&["--iface", "v", "--mode", "inline", "--", "redis-server"]);
        assert_eq!(get(&p, "XWARP_MODE").unwrap(), "inline");
        assert_eq!(get(&p, "XWARP_YIELD"), None);
        let p = run(&["--iface", "v", "--profile", "latency", "--", "redis-server"]);
        assert_eq!(get(&p, "XWARP_MODE").unwrap(), "inline");
        assert_eq!(get(&p, "XWARP_YIELD").unwrap(), "1");
        let p = run(&[
            "--iface",
            "v",
            "--profile=latency",
            "--mode=thread",
            "--",
            "x",
        ]);
        assert_eq!(get(&p, "XWARP_MODE").unwrap(), "thread");
        let p = run(&["--iface", "v", "--", "x"]);
        assert_eq!(get(&p, "XWARP_MODE"), None);
        assert!(parse_cli(&os(&["--mode", "fast", "--", "x"])).is_err());
    }

    #[test]
    fn pcap_sets_xwarp_pcap_for_the_program_and_is_checked() {
        let exists = |p: &Path| p == Path::new("/opt/xwarp/bin/libxwarp_preload.so");
        let args = os(&["--iface", "v", "--pcap", "/tmp/x-%p.pcapng", "--", "true"]);
        let p = plan(&args, env_of(&[]), Path::new("/opt/xwarp/bin"), exists).unwrap();
        let get = |k: &str| p.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("XWARP_PCAP").unwrap(), "/tmp/x-%p.pcapng");
        let bad = os(&[
            "--iface",
            "v",
            "--pcap",
            "/nonexistent-xwarp/x",
            "--",
            "true",
        ]);
        let e = plan(&bad, env_of(&[]), Path::new("/opt/xwarp/bin"), exists).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
    }

    #[test]
    fn run_pcap_gets_one_file_per_process() {
        let exists = |p: &Path| p == Path::new("/opt/xwarp/bin/libxwarp_preload.so");
        for (given, want) in [
            ("/tmp/cap.pcapng", "/tmp/cap-%p.pcapng"),
            ("/tmp/cap.pcap", "/tmp/cap-%p.pcap"),
            ("/tmp/cap", "/tmp/cap-%p"),
            ("/tmp/cap-%p-%e.pcapng", "/tmp/cap-%p-%e.pcapng"),
        ] {
            let args = os(&["--iface", "v", "--pcap", given, "--", "true"]);
            let p = plan(&args, env_of(&[]), Path::new("/opt/xwarp/bin"), exists).unwrap();
            let got = p.env.iter().find(|(n, _)| n == "XWARP_PCAP").unwrap();
            assert_eq!(got.1, want, "{given}");
        }
    }

    #[test]
    fn the_build_target_dir_is_the_last_place_looked_at() {
        let c = candidates(Path::new("/opt/xwarp/bin"));
        assert_eq!(c[0], Path::new("/opt/xwarp/bin/libxwarp_preload.so"));
        assert_eq!(c[3], Path::new("/opt/xwarp/lib/xwarp/libxwarp_preload.so"));
        let release = build_target_dir().join("release").join(SHIM);
        assert_eq!(c[c.len() - 2], release);
    }

    #[test]
    fn errors_are_reported_not_guessed() {
        let none = |_: &Path| false;
        let any = |_: &Path| true;
        let dir = Path::new("/x");
        let e = plan(&os(&["--iface", "v"]), env_of(&[]), dir, any).unwrap_err();
        assert!(e.contains("--"), "{e}");
        let e = plan(&os(&["--iface", "v", "--"]), env_of(&[]), dir, any).unwrap_err();
        assert!(e.contains("no command"), "{e}");
        let e = plan(&os(&["--", "true"]), env_of(&[]), dir, any).unwrap_err();
        assert!(e.contains("interface"), "{e}");
        let e = plan(&os(&["--bogus", "1", "--", "true"]), env_of(&[]), dir, any).unwrap_err();
        assert!(e.contains("unknown option"), "{e}");
        let e = plan(&os(&["--iface", "v", "--", "true"]), env_of(&[]), dir, none).unwrap_err();
        assert!(e.contains("libxwarp_preload.so not found"), "{e}");
        let e = plan(&os(&["--iface"]), env_of(&[]), dir, any).unwrap_err();
        assert!(e.contains("needs a value"), "{e}");
        // XWARP_IFACE from the environment is enough; XWARP_PRELOAD is honoured.
        let p = plan(
            &os(&["--", "curl", "http://x/"]),
            env_of(&[("XWARP_IFACE", "v"), ("XWARP_PRELOAD", "/s.so")]),
            dir,
            any,
        )
        .unwrap();
        assert!(p
            .env
            .iter()
            .any(|(k, v)| k == "LD_PRELOAD" && v == "/s.so:/x/libxwarp_ibverbs.so"));
    }

    #[test]
    fn the_ibverbs_library_is_preloaded_after_the_shim_when_found() {
        let both = |p: &Path| {
            p == Path::new("/opt/xwarp/bin/libxwarp_preload.so")
                || p == Path::new("/opt/xwarp/lib/libxwarp_ibverbs.so")
        };
        let dir = Path::new("/opt/xwarp/bin");
        let ld = |args: &[&str], env: &[(&str, &str)]| {
            plan(&os(args), env_of(env), dir, both).map(|p| {
                p.env
                    .into_iter()
                    .find(|(k, _)| k == "LD_PRELOAD")
                    .map(|(_, v)| v)
                    .unwrap()
            })
        };
        assert_eq!(
            ld(
                &["--iface", "v", "--", "ibv_devinfo"],
                &[("LD_PRELOAD", "/o.so")]
            )
            .unwrap(),
            "/opt/xwarp/bin/libxwarp_preload.so:/opt/xwarp/lib/libxwarp_ibverbs.so:/o.so"
        );
        assert_eq!(
            ld(&["--iface", "v", "--no-rdma", "--", "true"], &[]).unwrap(),
            "/opt/xwarp/bin/libxwarp_preload.so"
        );
        assert_eq!(
            ld(
                &["--iface", "v", "--", "true"],
                &[("XWARP_IBVERBS", "/opt/xwarp/lib/libxwarp_ibverbs.so")]
            )
            .unwrap(),
            "/opt/xwarp/bin/libxwarp_preload.so:/opt/xwarp/lib/libxwarp_ibverbs.so"
        );
        // An explicit path must exist; a default lookup that finds nothing is no error.
        let e = ld(
            &["--iface", "v", "--rdma-lib", "/nope.so", "--", "true"],
            &[],
        )
        .unwrap_err();
        assert!(e.contains("/nope.so: no such file"), "{e}");
        let e = ld(
            &[
                "--iface",
                "v",
                "--rdma-lib",
                "/a.so",
                "--no-rdma",
                "--",
                "true",
            ],
            &[],
        )
        .unwrap_err();
        assert!(e.contains("cannot be used with"), "{e}");
        let shim_only = |p: &Path| p == Path::new("/opt/xwarp/bin/libxwarp_preload.so");
        let p = plan(
            &os(&["--iface", "v", "--", "true"]),
            env_of(&[]),
            dir,
            shim_only,
        )
        .unwrap();
        assert!(p
            .env
            .iter()
            .any(|(k, v)| k == "LD_PRELOAD" && v == "/opt/xwarp/bin/libxwarp_preload.so"));
    }
}
