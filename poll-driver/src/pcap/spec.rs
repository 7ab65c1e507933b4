//! Which engines capture, to which file: [`CaptureSpec`] (a path template and the file
//! settings), read from `XWARP_PCAP` or set for the whole process
//! ([`set_process_capture`], the tools' `--pcap`), and turned into one file per engine.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::format::{PcapFormat, TsPrecision, SNAPLEN};
use super::sink::{Capture, PcapSink, SinkConfig};

/// The environment variable naming the capture file template.
pub const PCAP_ENV: &str = "XWARP_PCAP";
/// Set to `1` for nanosecond timestamps (default: microseconds).
pub const PCAP_NS_ENV: &str = "XWARP_PCAP_NS";
/// Bytes of each frame recorded (1 to 262144, default 262144: whole frames).
pub const PCAP_SNAPLEN_ENV: &str = "XWARP_PCAP_SNAPLEN";

/// A capture configuration: where and how the engines of this process record frames.
///
/// `path` is a template: `%p` becomes the process id, `%e` the index of the engine
/// among the engines this process started with capture on (0, 1, ...), `%%` a `%`.
/// Without `%e`, engine 0 writes the path as it is and engine N ≥ 1 writes it with
/// `-eN` before the extension (`x.pcapng`, `x-e1.pcapng`, ...), so every engine has a
/// file of its own. A process forked from the one that opened the first capture (a
/// program under the shim that forks and uses sockets in the child) adds `-pPID` too when
/// the template has no `%p`, so parent and children never write one file. The format
/// follows the extension unless `format` is set: `.pcap` is classic pcap, anything else
/// pcapng.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureSpec {
    /// The file name template.
    pub path: String,
    /// The file format (`None`: by the extension, [`PcapFormat::from_path`]).
    pub format: Option<PcapFormat>,
    /// Timestamp resolution.
    pub precision: TsPrecision,
    /// Bytes of each frame recorded.
    pub snaplen: u32,
}

/// `None`: not set (the environment decides); `Some(None)`: capture off.
static PROCESS: Mutex<Option<Option<CaptureSpec>>> = Mutex::new(None);
static NEXT_ENGINE: AtomicUsize = AtomicUsize::new(0);
/// The process that opened the first engine capture (a forked child inherits it).
static FIRST_PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// Set the capture of every engine this process starts from now on, overriding
/// `XWARP_PCAP` (`None`: no capture). The tools' `--pcap FILE` calls it.
pub fn set_process_capture(spec: Option<CaptureSpec>) {
    *PROCESS.lock() = Some(spec);
}

impl CaptureSpec {
    /// Capture to `path` (a template, see the type's docs), microsecond timestamps,
    /// whole frames.
    pub fn new(path: impl Into<String>) -> CaptureSpec {
        CaptureSpec {
            path: path.into(),
            format: None,
            precision: TsPrecision::Micros,
            snaplen: SNAPLEN,
        }
    }

    /// The capture `XWARP_PCAP`, `XWARP_PCAP_NS` and `XWARP_PCAP_SNAPLEN` describe:
    /// `Ok(None)` when `XWARP_PCAP` is unset or empty, `Err` for a malformed snap length.
    pub fn from_env() -> Result<Option<CaptureSpec>, String> {
        let path = match std::env::var(PCAP_ENV) {
            Ok(p) if !p.is_empty() => p,
            Ok(_) => return Ok(None),
            Err(std::env::VarError::NotPresent) => return Ok(None),
            Err(std::env::VarError::NotUnicode(p)) => {
                return Err(format!("{PCAP_ENV}={p:?}: not UTF-8"))
            }
        };
        CaptureSpec::with_env_settings(path).map(Some)
    }

    /// Capture to `path` with the timestamp resolution and snap length that
    /// `XWARP_PCAP_NS` and `XWARP_PCAP_SNAPLEN` set (`Err` for a malformed snap length).
    pub fn with_env_settings(path: impl Into<String>) -> Result<CaptureSpec, String> {
        let mut spec = CaptureSpec::new(path);
        if std::env::var(PCAP_NS_ENV).is_ok_and(|v| v == "1") {
            spec.precision = TsPrecision::Nanos;
        }
        if let Ok(v) = std::env::var(PCAP_SNAPLEN_ENV) {
            spec.snaplen = parse_snaplen(&v).map_err(|e| format!("{PCAP_SNAPLEN_ENV}: {e}"))?;
        }
        Ok(spec)
    }

    /// The capture engines of this process get: the one [`set_process_capture`] set,
    /// else [`CaptureSpec::from_env`] (a malformed variable is reported once and turns
    /// capture off).
    pub fn configured() -> Option<CaptureSpec> {
        if let Some(s) = PROCESS.lock().clone() {
            return s;
        }
        match CaptureSpec::from_env() {
            Ok(s) => s,
            Err(e) => {
                super::sink::report_once(&format!("xwarp: capture off: {e}"));
                None
            }
        }
    }

    /// The file of engine `engine` (see the type's docs).
    pub fn path_for(&self, engine: usize) -> PathBuf {
        let pid = std::process::id();
        let forked = FIRST_PID.get().is_some_and(|&p| p != pid);
        self.expand(engine, pid, forked)
    }

    /// [`CaptureSpec::path_for`] for process `pid`, `forked` from the first capturing one.
    fn expand(&self, engine: usize, pid: u32, forked: bool) -> PathBuf {
        let mut out = String::with_capacity(self.path.len() + 8);
        let (mut has_e, mut has_p) = (false, false);
        let mut chars = self.path.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('p') => {
                    has_p = true;
                    out.push_str(&pid.to_string());
                }
                Some('e') => {
                    has_e = true;
                    out.push_str(&engine.to_string());
                }
                Some('%') => out.push('%'),
                Some(o) => {
                    out.push('%');
                    out.push(o);
                }
                None => out.push('%'),
            }
        }
        let mut suffix = String::new();
        if forked && !has_p {
            suffix.push_str(&format!("-p{pid}"));
        }
        if !has_e && engine > 0 {
            suffix.push_str(&format!("-e{engine}"));
        }
        PathBuf::from(insert_before_extension(&out, &suffix))
    }

    /// The sink settings for the file at `path`.
    pub fn sink_config(&self, path: &Path) -> SinkConfig {
        SinkConfig {
            format: self.format.unwrap_or_else(|| PcapFormat::from_path(path)),
            precision: self.precision,
            snaplen: self.snaplen,
        }
    }

    /// Check what can be checked before any engine starts: the directory of the file
    /// exists, the snap length is in range. The error says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.path.is_empty() {
            return Err("capture file name is empty".into());
        }
        if self.snaplen == 0 || self.snaplen > SNAPLEN {
            return Err(format!("snap length {} not in 1..={SNAPLEN}", self.snaplen));
        }
        let p = self.path_for(0);
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !dir.is_dir() {
            return Err(format!(
                "capture file {}: directory {} does not exist",
                p.display(),
                dir.display()
            ));
        }
        Ok(())
    }

    /// Open the capture of the next engine of this process: its file
    /// ([`CaptureSpec::path_for`] with the next engine index) and an interface named
    /// `name` described as `description`. An error names the file.
    pub fn open_engine(&self, name: &str, description: &str) -> io::Result<Capture> {
        FIRST_PID.get_or_init(std::process::id);
        let index = NEXT_ENGINE.fetch_add(1, Ordering::Relaxed);
        let path = self.path_for(index);
        let sink = PcapSink::create_with(&path, self.sink_config(&path))?;
        Ok(sink.interface(name, description))
    }
}

/// `path` with `suffix` inserted before the extension of its file name (appended when the
/// name has none).
pub fn insert_before_extension(path: &str, suffix: &str) -> String {
    let mut out = path.to_owned();
    let name_start = out.rfind('/').map_or(0, |i| i + 1);
    match out[name_start..].rfind('.') {
        Some(dot) if dot > 0 => out.insert_str(name_start + dot, suffix),
        _ => out.push_str(suffix),
    }
    out
}

/// Parse a snap length (1 to 262144).
pub fn parse_snaplen(v: &str) -> Result<u32, String> {
    match v.trim().parse::<u32>() {
        Ok(n) if (1..=SNAPLEN).contains(&n) => Ok(n),
        _ => Err(format!(
            "expected a snap length in 1..={SNAPLEN}, got {v:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_expand_pid_engine_and_get_a_suffix_per_engine() {
        let pid = std::process::id();
        let s = CaptureSpec::new("/tmp/cap-%p.pcapng");
        assert_eq!(
            s.path_for(0),
            PathBuf::from(format!("/tmp/cap-{pid}.pcapng"))
        );
        assert_eq!(
            s.path_for(2),
            PathBuf::from(format!("/tmp/cap-{pid}-e2.pcapng"))
        );
        let s = CaptureSpec::new("/tmp/x.d/e%e-100%%.pcap");
        assert_eq!(s.path_for(0), PathBuf::from("/tmp/x.d/e0-100%.pcap"));
        assert_eq!(s.path_for(3), PathBuf::from("/tmp/x.d/e3-100%.pcap"));
        // No extension, a dot only in the directory, a hidden file, a stray %.
        assert_eq!(
            CaptureSpec::new("/tmp/x.d/cap").path_for(1),
            PathBuf::from("/tmp/x.d/cap-e1")
        );
        assert_eq!(
            CaptureSpec::new(".cap").path_for(1),
            PathBuf::from(".cap-e1")
        );
        assert_eq!(CaptureSpec::new("a%z%").path_for(0), PathBuf::from("a%z%"));
        // A forked child without %p gets its pid; with %p nothing is added.
        let s = CaptureSpec::new("/tmp/c.pcapng");
        assert_eq!(s.expand(0, 77, true), PathBuf::from("/tmp/c-p77.pcapng"));
        assert_eq!(s.expand(2, 77, true), PathBuf::from("/tmp/c-p77-e2.pcapng"));
        assert_eq!(s.expand(2, 77, false), PathBuf::from("/tmp/c-e2.pcapng"));
        let s = CaptureSpec::new("/tmp/c-%p.pcapng");
        assert_eq!(s.expand(0, 77, true), PathBuf::from("/tmp/c-77.pcapng"));
        assert_eq!(insert_before_extension("/a.b/c", "-x"), "/a.b/c-x");
    }

    #[test]
    fn format_follows_the_extension_unless_set() {
        let s = CaptureSpec::new("x.pcap");
        assert_eq!(s.sink_config(&s.path_for(1)).format, PcapFormat::Pcap);
        let mut s = CaptureSpec::new("x");
        assert_eq!(s.sink_config(&s.path_for(0)).format, PcapFormat::PcapNg);
        s.format = Some(PcapFormat::Pcap);
        assert_eq!(s.sink_config(&s.path_for(0)).format, PcapFormat::Pcap);
    }

    #[test]
    fn validation_and_snaplen_errors_say_what_is_wrong() {
        assert!(CaptureSpec::new("/tmp/ok.pcapng").validate().is_ok());
        assert!(CaptureSpec::new("relative.pcapng").validate().is_ok());
        let e = CaptureSpec::new("/nonexistent-xwarp-dir/x.pcapng")
            .validate()
            .unwrap_err();
        assert!(
            e.contains("/nonexistent-xwarp-dir") && e.contains("does not exist"),
            "{e}"
        );
        assert!(CaptureSpec::new("").validate().is_err());
        let mut s = CaptureSpec::new("/tmp/x");
        s.snaplen = 0;
        assert!(s.validate().is_err());
        assert_eq!(parse_snaplen("128"), Ok(128));
        assert!(parse_snaplen("0").is_err());
        assert!(parse_snaplen("262145").is_err());
        assert!(parse_snaplen("lots").unwrap_err().contains("lots"));
    }
}
