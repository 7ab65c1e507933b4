//! The shim's logger: every `log` record of the crates linked into the shim (the shim
//! itself, `xwarp_stack`, `xwarp_poll_driver`, `smoltcp`) goes to stderr as one line,
//! filtered by `XWARP_LOG` in env_logger syntax (`warn`, `xwarp_preload=debug`,
//! `info,smoltcp=trace`; default [`DEFAULT_FILTER`]). The shim's own lines read
//! `xwarp-preload[PID]: warning: ...` (`error`, `info`, `debug`, `trace`); another crate's
//! carry its target: `xwarp-preload[PID]: debug: smoltcp::iface: ...`.
//!
//! Writing takes no lock and allocates nothing: the line is formatted into a buffer on the
//! stack (cut at [`LINE_MAX`] bytes) and written with one raw `write(2)` system call,
//! which bypasses the C library, the shim's own `write` and std's stderr lock. So a record
//! emitted while another thread, or a signal handler on this thread, is in the middle of
//! one cannot deadlock or corrupt anything. The shim still logs nothing from signal
//! handlers or from the fork child handler (`fork::child`), and the filter's optional
//! `/regex` part formats the message into a `String` (avoid it on hot paths).
//!
//! Errors the shim exits on (configuration errors, `XWARP_STRICT=1`) are `error` records of
//! `xwarp_preload` and always printed, whatever the filter.

use std::fmt;
use std::sync::OnceLock;

use log::{Level, LevelFilter, Log, Metadata, Record};

/// The filter when `XWARP_LOG` is unset: warnings (the shim's one-line notices such as
/// "this process stays on the kernel TCP stack"), and the `XWARP_STACK_TRACE` /
/// `XWARP_PROTO_TRACE` dumps (target `xwarp_stack::trace`, info) when those are set.
pub const DEFAULT_FILTER: &str = "warn,xwarp_stack::trace=info";

/// Longest line written; longer messages are cut and end in `...`.
pub const LINE_MAX: usize = 1024;

const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Check an `XWARP_LOG` value: env_logger syntax (`DIRECTIVE[,DIRECTIVE...][/REGEX]`, a
/// directive being `LEVEL`, `TARGET` or `TARGET=LEVEL`), where a bare word must be a level
/// or name a crate of the shim (`xwarp...` or `smoltcp...`), so a typo such as `debgu` is
/// an error instead of a filter that matches nothing.
pub fn check(spec: &str) -> Result<(), String> {
    let directives = spec.split_once('/').map_or(spec, |(d, _)| d);
    for d in directives
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
    {
        if d.contains('=') {
            continue;
        }
        let known = LEVELS.iter().any(|l| d.eq_ignore_ascii_case(l))
            || d.starts_with("xwarp")
            || d.starts_with("smoltcp");
        if !known {
            return Err(format!(
                "{d:?} is neither a level ({}) nor a target of the shim's crates \
                 (xwarp_preload, xwarp_stack, xwarp_poll_driver, smoltcp; e.g. \
                 xwarp_stack=debug)",
                LEVELS.join(", ")
            ));
        }
    }
    env_filter::Builder::new()
        .try_parse(spec)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn build(spec: &str) -> env_filter::Filter {
    let mut b = env_filter::Builder::new();
    if b.try_parse(spec).is_err() {
        b = env_filter::Builder::new();
        let _ = b.try_parse(DEFAULT_FILTER);
    }
    b.build()
}

struct ShimLogger {
    filter: env_filter::Filter,
}

/// An error of the shim itself: printed whatever the filter says.
fn always(m: &Metadata<'_>) -> bool {
    m.level() == Level::Error && m.target().starts_with("xwarp_preload")
}

impl Log for ShimLogger {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        always(m) || self.filter.enabled(m)
    }

    fn log(&self, r: &Record<'_>) {
        if !(always(r.metadata()) || self.filter.matches(r)) {
            return;
        }
        let mut line = Line::new();
        format_record(&mut line, r, std::process::id());
        write_stderr(line.finish());
    }

    fn flush(&self) {}
}

/// One record as the line the shim writes (without the newline).
fn format_record(out: &mut impl fmt::Write, r: &Record<'_>, pid: u32) {
    let tag = match r.level() {
        Level::Error => "error",
        Level::Warn => "warning",
        Level::Info => "info",
        Level::Debug => "debug",
        Level::Trace => "trace",
    };
    let _ = write!(out, "xwarp-preload[{pid}]: {tag}: ");
    if !r.target().starts_with("xwarp_preload") {
        let _ = write!(out, "{}: ", r.target());
    }
    let _ = write!(out, "{}", r.args());
}

/// A line buffer on the stack; what does not fit is dropped and the line ends in `...`.
struct Line {
    buf: [u8; LINE_MAX],
    len: usize,
    cut: bool,
}

impl Line {
    fn new() -> Self {
        Line {
            buf: [0; LINE_MAX],
            len: 0,
            cut: false,
        }
    }

    /// The line with its newline (and `...` if cut).
    fn finish(&mut self) -> &[u8] {
        let tail: &[u8] = if self.cut { b"...\n" } else { b"\n" };
        let at = self.len.min(LINE_MAX - tail.len());
        self.buf[at..at + tail.len()].copy_from_slice(tail);
        &self.buf[..at + tail.len()]
    }
}

impl fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // Keep room for "...\n".
        let room = LINE_MAX - 4 - self.len.min(LINE_MAX - 4);
        let mut n = s.len().min(room);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        if n < s.len() {
            self.cut = true;
        }
        Ok(())
    }
}

/// All of `b` to fd 2 with raw `write(2)` system calls (no lock, no C library wrapper).
fn write_stderr(mut b: &[u8]) {
    while !b.is_empty() {
        // SAFETY: write(2) on fd 2 with a pointer/length pair into a live slice.
        let n = unsafe { libc::syscall(libc::SYS_write, 2, b.as_ptr(), b.len()) };
        if n > 0 {
            b = &b[(n as usize).min(b.len())..];
        } else if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        } else {
            return;
        }
    }
}

/// The filter the logger uses for `XWARP_LOG=spec`: the trimmed value if it is valid and
/// not blank, else [`DEFAULT_FILTER`].
fn effective(spec: Option<&str>) -> &str {
    spec.map(str::trim)
        .filter(|s| !s.is_empty() && check(s).is_ok())
        .unwrap_or(DEFAULT_FILTER)
}

/// Install the shim's logger with `spec` (the `XWARP_LOG` value; `None`, blank or an
/// invalid value: [`DEFAULT_FILTER`], the configuration reports the invalid value). Only the first
/// call installs; later ones do nothing.
pub(crate) fn init(spec: Option<&str>) {
    static LOGGER: OnceLock<ShimLogger> = OnceLock::new();
    if LOGGER.get().is_some() {
        return;
    }
    let spec = effective(spec);
    let logger = LOGGER.get_or_init(|| ShimLogger {
        filter: build(spec),
    });
    if log::set_logger(logger).is_ok() {
        log::set_max_level(logger.filter.filter().max(LevelFilter::Error));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_checked() {
        for ok in [
            "warn",
            "off",
            "DEBUG",
            "xwarp_stack=debug,smoltcp=trace",
            "info,xwarp_preload::engine=trace",
            "xwarp_poll_driver",
            "debug/engine",
            "",
        ] {
            assert!(check(ok).is_ok(), "{ok}: {:?}", check(ok));
        }
        for bad in ["loud", "debgu", "warn,verbose", "xwarp_stack=loud", "a=b=c"] {
            assert!(check(bad).is_err(), "{bad}");
        }
        assert!(check("loud").unwrap_err().contains("\"loud\""));
    }

    #[test]
    fn blank_xwarp_log_means_default_filter() {
        for blank in [None, Some(""), Some("  "), Some("\t\n")] {
            assert_eq!(effective(blank), DEFAULT_FILTER, "{blank:?}");
        }
        assert_eq!(effective(Some(" debug ")), "debug");
        assert_eq!(effective(Some("loud")), DEFAULT_FILTER);
    }

    #[test]
    fn default_filter_keeps_warnings_and_the_stack_trace() {
        let f = build(DEFAULT_FILTER);
        let m = |level, target| Metadata::builder().level(level).target(target).build();
        assert!(f.enabled(&m(Level::Warn, "xwarp_preload::engine")));
        assert!(!f.enabled(&m(Level::Info, "xwarp_preload::engine")));
        assert!(f.enabled(&m(Level::Info, "xwarp_stack::trace")));
        assert!(!f.enabled(&m(Level::Debug, "smoltcp::iface")));
        assert!(always(&m(Level::Error, "xwarp_preload::process")));
        assert!(!always(&m(Level::Error, "smoltcp::iface")));
    }

    fn line(level: Level, target: &str, msg: fmt::Arguments<'_>) -> String {
        let mut l = Line::new();
        let r = Record::builder()
            .level(level)
            .target(target)
            .args(msg)
            .build();
        format_record(&mut l, &r, 42);
        String::from_utf8(l.finish().to_vec()).unwrap()
    }

    #[test]
    fn lines_keep_the_shim_format_and_name_other_targets() {
        assert_eq!(
            line(
                Level::Warn,
                "xwarp_preload::engine",
                format_args!("x {}", 1)
            ),
            "xwarp-preload[42]: warning: x 1\n"
        );
        assert_eq!(
            line(Level::Debug, "smoltcp::iface", format_args!("y")),
            "xwarp-preload[42]: debug: smoltcp::iface: y\n"
        );
        let long = "é".repeat(LINE_MAX);
        let l = line(Level::Info, "xwarp_preload", format_args!("{long}"));
        assert!(l.len() <= LINE_MAX && l.ends_with("...\n"), "{}", l.len());
    }
}
