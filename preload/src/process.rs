//! What the whole process shares, independent of the engine: the configuration (read
//! once, at load time), the logging macro, and the fork generation. Every other
//! module may use it; it uses only `logging`.

use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;

use crate::config::Config;

/// Bumped in the child after every `fork`: sockets of an older generation belong to the
/// parent's engine, which does not exist in the child.
pub(crate) static GENERATION: AtomicU64 = AtomicU64::new(0);

/// `xlog!(Level, "fmt", args)`: a `log` record of the calling module at `log::Level::Level`,
/// written by the shim's logger (`logging.rs`) as `xwarp-preload[PID]: level: ...`.
macro_rules! xlog {
    ($lvl:ident, $($t:tt)*) => {
        ::log::log!(::log::Level::$lvl, $($t)*)
    };
}
pub(crate) use xlog;

/// How long a blocking socket call spins (driving an inline engine) before it sleeps.
pub(crate) fn spin() -> std::time::Duration {
    config().map(|c| c.spin).unwrap_or_default()
}

/// The configuration, read at load time (`None`: shim inactive).
pub(crate) fn config() -> Option<&'static Config> {
    static CFG: OnceLock<Option<Config>> = OnceLock::new();
    CFG.get_or_init(|| {
        crate::logging::init(std::env::var("XWARP_LOG").ok().as_deref());
        Config::from_vars(|k| std::env::var(k).ok()).unwrap_or_else(|e| {
            log::error!("configuration error: {e}");
            // A misconfiguration is the user's to fix: refuse to run rather than silently
            // measuring the kernel.
            std::process::exit(2);
        })
    })
    .as_ref()
}
