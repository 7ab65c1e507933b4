//! What the whole process shares, independent of the engine: the configuration (read
//! once, at load time), the log level and logging, and the fork generation. Every other
//! module may use it; it uses none of them.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

use crate::config::{Config, LogLevel};

/// Log level as a number, readable without the configuration.
static LOG: AtomicU8 = AtomicU8::new(LogLevel::Warn as u8);

/// Bumped in the child after every `fork`: sockets of an older generation belong to the
/// parent's engine, which does not exist in the child.
pub(crate) static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Write one log line on stderr if `level` is enabled.
pub(crate) fn log(level: LogLevel, msg: std::fmt::Arguments<'_>) {
    if level as u8 <= LOG.load(Ordering::Relaxed) {
        let tag = match level {
            LogLevel::Warn => "warning",
            LogLevel::Info => "info",
            _ => "debug",
        };
        eprintln!("xwarp-preload[{}]: {tag}: {msg}", std::process::id());
    }
}

/// `log!(Level, "fmt", args)`.
macro_rules! xlog {
    ($lvl:ident, $($t:tt)*) => {
        $crate::process::log($crate::config::LogLevel::$lvl, format_args!($($t)*))
    };
}
pub(crate) use xlog;

/// The configuration, read at load time (`None`: shim inactive).
pub(crate) fn config() -> Option<&'static Config> {
    static CFG: OnceLock<Option<Config>> = OnceLock::new();
    CFG.get_or_init(|| match Config::from_vars(|k| std::env::var(k).ok()) {
        Ok(c) => {
            if let Some(c) = &c {
                LOG.store(c.log as u8, Ordering::Relaxed);
            }
            c
        }
        Err(e) => {
            eprintln!("xwarp-preload: configuration error: {e}");
            // A misconfiguration is the user's to fix: refuse to run rather than silently
            // measuring the kernel.
            std::process::exit(2);
        }
    })
    .as_ref()
}
