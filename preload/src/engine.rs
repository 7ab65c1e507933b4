//! The process's engine: the AF_XDP engine started lazily on the first socket that
//! needs it (the configuration and logging are in [`crate::process`]).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};

use xwarp_poll_driver::afxdp::{AfXdpConfig, AfXdpNic, SteeringFilter};
use xwarp_poll_driver::engine::{
    EngineConfig, EngineHandle, EngineMode, InlineConfig, InlineDriver, SpinBudget,
};
use xwarp_stack::builder::{EngineBuilder, RunningEngine};
use xwarp_stack::{StackConfig, StackHandle, TcpService};

use crate::config::Config;
use crate::process::{config, xlog, GENERATION};

/// A running engine.
pub(crate) struct Running {
    /// Socket handle.
    pub(crate) stack: StackHandle,
    /// The engine's inline driver (`XWARP_MODE=inline`): the program's socket calls run
    /// engine iterations through it.
    pub(crate) driver: Option<InlineDriver>,
    /// Keeps the engine thread's handle alive (never joined: the process owns it).
    _engine: EngineHandle<AfXdpNic, TcpService>,
}

/// Whether the engine runs.
pub(crate) enum State {
    /// Not yet needed.
    NotStarted,
    /// Running (for the life of the process).
    Running(&'static Running),
    /// Could not start: sockets use the kernel.
    Failed,
}

static ENGINE: Mutex<State> = Mutex::new(State::NotStarted);

/// The engine's state, locked: the fork prepare handler takes it first, so that a child
/// never inherits it held by a thread starting the engine (it would hang on its first
/// socket).
pub(crate) type EngineGuard = MutexGuard<'static, State>;

/// Lock the engine's state (see [`EngineGuard`]).
pub(crate) fn lock_engine() -> EngineGuard {
    ENGINE.lock().unwrap_or_else(|p| p.into_inner())
}

fn start(cfg: &Config) -> io::Result<Running> {
    let filter = SteeringFilter::new(
        cfg.ipv4.iter().map(|a| a.0).collect(),
        cfg.ipv6.iter().map(|a| a.0).collect(),
    );
    let nic = AfXdpNic::open(AfXdpConfig::new(&cfg.iface, filter))?;
    let mtu = cfg.mtu.min(nic.max_frame_size().saturating_sub(14));
    let stack_config = StackConfig {
        mac: nic.mac_address(),
        ipv4: cfg.ipv4,
        ipv4_gateway: cfg.gateway,
        ipv6: cfg.ipv6,
        mtu,
        ..StackConfig::default()
    };
    let engine_config = EngineConfig {
        name: "xwarp-engine".into(),
        spin: if cfg.yield_spin {
            SpinBudget::Yield(cfg.engine_spin)
        } else {
            SpinBudget::Duration(cfg.engine_spin)
        },
        // The shim's own variable decides (parsed with the rest of its configuration).
        mode: if cfg.inline {
            EngineMode::Inline(InlineConfig {
                spin: cfg.spin,
                ..InlineConfig::default()
            })
        } else {
            EngineMode::Thread
        },
        ..EngineConfig::default()
    };
    let RunningEngine { stack, engine } = EngineBuilder::new(nic, stack_config, engine_config)
        .interface_name(cfg.iface.clone())
        .spawn()?;
    Ok(Running {
        stack,
        driver: engine.inline_driver(),
        _engine: engine,
    })
}

/// The engine, started on first use. `None` when the shim is inactive or the engine could
/// not start (then the caller falls back to the kernel).
pub(crate) fn engine() -> Option<&'static Running> {
    let cfg = config()?;
    let mut st = lock_engine();
    match &*st {
        State::Running(r) => return Some(r),
        State::Failed => return None,
        State::NotStarted => {}
    }
    match start(cfg) {
        Ok(r) => {
            xlog!(
                Info,
                "engine started on {} ({:?} {:?}, {} mode)",
                cfg.iface,
                cfg.ipv4,
                cfg.ipv6,
                if cfg.inline { "inline" } else { "thread" }
            );
            // The engine lives as long as the process.
            let r: &'static Running = Box::leak(Box::new(r));
            *st = State::Running(r);
            if let Some(d) = r.driver.as_ref() {
                crate::inline::install(d);
            }
            crate::exit::register();
            Some(r)
        }
        Err(e) => {
            let why = busy_hint(&e);
            if cfg.strict {
                log::error!(
                    "engine cannot start on {} in process `{}`: {e}{why} (XWARP_STRICT=1: exiting)",
                    cfg.iface,
                    process_name()
                );
                std::process::exit(1);
            }
            xlog!(
                Warn,
                "engine cannot start on {} in process `{}` (parent {}): {e}{why}; this process stays on the kernel TCP stack (a listener on the engine's address listens on the kernel's wildcard address, same port)",
                cfg.iface,
                process_name(),
                // SAFETY: getppid has no preconditions.
                unsafe { libc::getppid() }
            );
            *st = State::Failed;
            None
        }
    }
}

/// Why a failed start most likely failed, when the error says the interface is taken.
fn busy_hint(e: &io::Error) -> &'static str {
    if e.kind() == io::ErrorKind::ResourceBusy || e.raw_os_error() == Some(libc::EBUSY) {
        " (the interface's AF_XDP queue 0 is taken, most likely by another process running \
         the shim on it, such as another worker of a multi-process server: one process per \
         interface runs the engine)"
    } else {
        ""
    }
}

/// The process as `ps` shows it (`/proc/self/cmdline`, which servers such as nginx
/// rewrite to name their role, e.g. `nginx: worker process`), at most 80 characters.
fn process_name() -> String {
    let raw = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    let mut s: String = String::from_utf8_lossy(&raw)
        .split('\0')
        .filter(|a| !a.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if s.is_empty() {
        s = std::fs::read_to_string("/proc/self/comm")
            .unwrap_or_default()
            .trim()
            .to_string();
    }
    if s.chars().count() > 80 {
        s = s.chars().take(77).collect::<String>() + "...";
    }
    s
}

#[cfg_attr(test, allow(dead_code))]
/// In the child after `fork`: the parent's engine thread does not exist here. Forget it
/// (its memory stays allocated, never touched) so the child can start its own. `held` is
/// the lock the prepare handler took across `fork` (`None`: take it here).
pub(crate) fn after_fork_child(held: Option<&mut EngineGuard>) {
    GENERATION.fetch_add(1, Ordering::SeqCst);
    crate::inline::forget();
    match held {
        Some(st) => **st = State::NotStarted,
        None => *lock_engine() = State::NotStarted,
    }
}
