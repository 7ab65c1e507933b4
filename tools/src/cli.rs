//! What every command line of the tools shares: the engine-selection flags
//! ([`EngineArgs`]: `--iface IF --addr A/P [--gateway G] [--pcap FILE]`), their value
//! parsers, the `--pcap FILE` capture option ([`pcap_arg`], [`take_pcap_flag`]), how a
//! clap error is turned into a one-line message, and the logger every program installs
//! ([`init_logging`], governed by `XWARP_LOG`).

use std::ffi::OsString;
use std::net::Ipv4Addr;

use xwarp::poll_driver::pcap::{set_process_capture, CaptureSpec};

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// The environment variable holding the log filter, in env_logger syntax: `debug`,
/// `xwarp_stack=debug,smoltcp=trace`, `info,xwarp_poll_driver=off`, ...
pub const LOG_ENV: &str = "XWARP_LOG";

/// The filter when [`LOG_ENV`] is unset: warnings, plus the `XWARP_STACK_TRACE` /
/// `XWARP_PROTO_TRACE` dumps (info records of target `xwarp_stack::trace`) when enabled.
pub const DEFAULT_LOG_FILTER: &str = "warn,xwarp_stack::trace=info";

/// Install the logger of the `xwarp` command and the tools: the `log` records of every
/// crate (xwarp's libraries and smoltcp) go to stderr as `[LEVEL target] message`,
/// filtered by `XWARP_LOG` (default [`DEFAULT_LOG_FILTER`]). A malformed directive is
/// reported on stderr and ignored; an empty or blank `XWARP_LOG` counts as unset. Call
/// first thing in `main`; later calls do nothing.
pub fn init_logging() {
    let spec = log_filter(std::env::var(LOG_ENV).ok().as_deref());
    let _ = env_logger::Builder::new()
        .parse_filters(&spec)
        .target(env_logger::Target::Stderr)
        .try_init();
}

/// The filter `XWARP_LOG=value` selects: [`DEFAULT_LOG_FILTER`] when unset, empty or
/// blank, else the value trimmed.
pub fn log_filter(value: Option<&str>) -> String {
    match value.map(str::trim) {
        None | Some("") => DEFAULT_LOG_FILTER.to_owned(),
        Some(v) => v.to_owned(),
    }
}

/// Parse `A.B.C.D/PREFIX` (prefix 0..=32).
pub fn parse_cidr(s: &str) -> Option<(Ipv4Addr, u8)> {
    let (a, p) = s.split_once('/')?;
    let p: u8 = p.parse().ok()?;
    (p <= 32).then_some(())?;
    Some((a.parse().ok()?, p))
}

/// clap value parser of `--addr`.
pub fn cidr_arg(s: &str) -> Result<(Ipv4Addr, u8), String> {
    parse_cidr(s).ok_or(format!("--addr: expected A.B.C.D/PREFIX, got {s}"))
}

/// clap value parser of `--gateway`.
pub fn gateway_arg(s: &str) -> Result<Ipv4Addr, String> {
    s.parse()
        .map_err(|_| format!("--gateway: not an IPv4 address: {s}"))
}

/// The engine-selection flags every tool takes: run on an xwarp engine bound by AF_XDP
/// to `--iface` and owning `--addr` (an address the kernel does not have; root).
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineArgs {
    /// Run on an xwarp engine bound by AF_XDP to interface IF (root).
    #[arg(long = "iface", id = "engine_iface", value_name = "IF")]
    pub iface: Option<String>,
    /// The engine's own IPv4 address and prefix (not configured in the kernel).
    #[arg(long = "addr", id = "engine_addr", value_name = "A/P", value_parser = cidr_arg)]
    pub addr: Option<(Ipv4Addr, u8)>,
    /// IPv4 default gateway of the engine.
    #[arg(long = "gateway", id = "engine_gateway", value_name = "G", value_parser = gateway_arg)]
    pub gateway: Option<Ipv4Addr>,
    /// Record every frame of the engines to FILE: pcapng (`.pcap`: classic pcap); `%p`
    /// becomes the pid, `%e` the engine's index [XWARP_PCAP].
    #[arg(long = "pcap", id = "engine_pcap", value_name = "FILE", value_parser = pcap_arg)]
    pub pcap: Option<CaptureSpec>,
}

impl EngineArgs {
    /// True when no engine-selection flag was given (`--pcap` selects no engine).
    pub fn is_empty(&self) -> bool {
        self.iface.is_none() && self.addr.is_none() && self.gateway.is_none()
    }

    /// With `--pcap`: make every engine this process starts from now on capture there
    /// (overriding `XWARP_PCAP`).
    pub fn apply_pcap(&self) {
        if let Some(spec) = &self.pcap {
            set_process_capture(Some(spec.clone()));
        }
    }
}

/// clap value parser of `--pcap FILE`: the capture of every engine, as `XWARP_PCAP_NS`
/// and `XWARP_PCAP_SNAPLEN` refine it; the file's directory must exist.
pub fn pcap_arg(s: &str) -> Result<CaptureSpec, String> {
    let spec = CaptureSpec::with_env_settings(s).map_err(|e| format!("--pcap: {e}"))?;
    spec.validate().map_err(|e| format!("--pcap: {e}"))?;
    Ok(spec)
}

/// `path` with `-%p` before its extension unless it has a `%p` already: one file per
/// process for commands that start several programs (`xwarp bench shim`).
pub fn per_process(path: &str) -> String {
    if path.contains("%p") {
        return path.to_owned();
    }
    xwarp::poll_driver::pcap::spec::insert_before_extension(path, "-%p")
}

/// Take `--pcap FILE` (or `--pcap=FILE`) out of `args` (a command whose own parser does
/// not know it: `xwarp bench ...`), before any `--`. Returns the checked file, or an
/// error for a missing or bad value.
pub fn take_pcap_flag(args: &mut Vec<OsString>) -> Result<Option<String>, String> {
    let mut found = None;
    let mut i = 0;
    while i < args.len() {
        let Some(a) = args[i].to_str() else {
            i += 1;
            continue;
        };
        if a == "--" {
            break;
        }
        let value = if a == "--pcap" {
            let v = args
                .get(i + 1)
                .and_then(|v| v.to_str())
                .filter(|v| !v.starts_with('-'))
                .ok_or("--pcap needs a value")?
                .to_owned();
            args.drain(i..i + 2);
            v
        } else if let Some(v) = a.strip_prefix("--pcap=") {
            let v = v.to_owned();
            args.remove(i);
            v
        } else {
            i += 1;
            continue;
        };
        pcap_arg(&value)?;
        found = Some(value);
    }
    Ok(found)
}

/// The message of a clap parse error on one line, without clap's `error: ` prefix and
/// usage tail (the tools print their own usage after it). A missing option value reads
/// `OPTION needs a value`.
pub fn clap_message(e: &clap::Error) -> String {
    let arg = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(s)) => s.split(' ').next().unwrap_or(s).to_owned(),
        _ => String::new(),
    };
    let missing =
        matches!(e.get(ContextKind::InvalidValue), Some(ContextValue::String(v)) if v.is_empty());
    if e.kind() == ErrorKind::InvalidValue && missing && !arg.is_empty() {
        return format!("{arg} needs a value");
    }
    let text = e.render().to_string();
    text.split("\n\n")
        .next()
        .unwrap_or_default()
        .trim()
        .trim_start_matches("error: ")
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct T {
        #[command(flatten)]
        engine: EngineArgs,
        #[arg(short = 's', long = "size")]
        size: Option<u32>,
    }

    #[test]
    fn blank_xwarp_log_means_default_filter() {
        for blank in [None, Some(""), Some("   "), Some("\n")] {
            assert_eq!(log_filter(blank), DEFAULT_LOG_FILTER, "{blank:?}");
        }
        assert_eq!(log_filter(Some(" debug ")), "debug");
    }

    #[test]
    fn engine_flags_and_error_messages() {
        let t = T::try_parse_from(["t", "--iface", "v", "--addr", "10.0.0.1/24"]).unwrap();
        assert_eq!(t.engine.iface.as_deref(), Some("v"));
        assert_eq!(t.engine.addr, Some((Ipv4Addr::new(10, 0, 0, 1), 24)));
        assert!(!t.engine.is_empty() && T::try_parse_from(["t"]).unwrap().engine.is_empty());
        let e = T::try_parse_from(["t", "--addr", "10.0.0.1/40"]).unwrap_err();
        assert!(clap_message(&e).contains("expected A.B.C.D/PREFIX"), "{e}");
        let e = T::try_parse_from(["t", "-s"]).unwrap_err();
        assert_eq!(clap_message(&e), "--size needs a value");
        let e = T::try_parse_from(["t", "--bogus"]).unwrap_err();
        assert!(clap_message(&e).contains("--bogus"), "{e}");
        assert!(!clap_message(&e).contains('\n'), "{e}");
    }

    #[test]
    fn pcap_flag_is_checked_and_selects_no_engine() {
        let t = T::try_parse_from(["t", "--pcap", "/tmp/x-%p.pcapng"]).unwrap();
        assert_eq!(t.engine.pcap.as_ref().unwrap().path, "/tmp/x-%p.pcapng");
        assert!(t.engine.is_empty());
        let e = T::try_parse_from(["t", "--pcap", "/nonexistent-xwarp/x.pcapng"]).unwrap_err();
        assert!(clap_message(&e).contains("does not exist"), "{e}");
    }

    #[test]
    fn pcap_flag_is_taken_out_of_a_foreign_command_line() {
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        let mut a = os(&["--secs", "3", "--pcap", "/tmp/b.pcapng", "--json", "x"]);
        assert_eq!(take_pcap_flag(&mut a), Ok(Some("/tmp/b.pcapng".into())));
        assert_eq!(a, os(&["--secs", "3", "--json", "x"]));
        let mut a = os(&["--pcap=/tmp/c.pcap"]);
        assert_eq!(take_pcap_flag(&mut a), Ok(Some("/tmp/c.pcap".into())));
        assert!(a.is_empty());
        let mut a = os(&["--", "prog", "--pcap", "/tmp/d"]);
        assert_eq!(take_pcap_flag(&mut a), Ok(None));
        assert_eq!(a.len(), 4);
        assert!(take_pcap_flag(&mut os(&["--pcap"])).is_err());
        assert!(take_pcap_flag(&mut os(&["--pcap", "--secs"])).is_err());
        let e = take_pcap_flag(&mut os(&["--pcap", "/nonexistent-xwarp/x"])).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
        assert_eq!(per_process("/tmp/s.pcapng"), "/tmp/s-%p.pcapng");
        assert_eq!(per_process("/tmp/s-%p.pcap"), "/tmp/s-%p.pcap");
    }
}
