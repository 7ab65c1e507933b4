//! The process's xwarp verbs engine, shared by every `ibv_context` the program opens.
//!
//! For ibv-cm (librdmacm, `src/cm/`) and the object modules:
//! * [`engine()`] starts the engine on first need (the first PD, CQ, ... of any context)
//!   and returns it for the life of the process; the error is an errno value
//!   (`ENODEV`: no usable configuration, or the engine could not start; one line on
//!   stderr says why, once).
//! * [`Engine::device`] is the `xwarp_verbs::Device` every verbs object is made from
//!   (`listen`, `alloc_pd`, `create_cq`); [`Engine::ipv4`]/[`Engine::prefix`] the address
//!   the engine owns (what `rdma_bind_addr`/`rdma_resolve_addr` check against).
//! * A context normally reaches it through `device::XwContext::verbs()`, which tests may
//!   point at another engine (`testing::open_on`).
//!
//! Configuration: the variables `xwarp run` sets for the socket shim (names and rules as
//! `preload/src/config.rs`): `XWARP_IFACE` (the interface, AF_XDP queue 0), `XWARP_ADDR`
//! (`A.B.C.D/P`, the address the engine owns), `XWARP_GATEWAY` (optional IPv4 gateway),
//! `XWARP_MTU` (576..=9000, default 1500; capped by what the NIC's frames carry),
//! `XWARP_ENGINE_SPIN_US` (the engine loop's spin budget before it sleeps, default 50),
//! `XWARP_YIELD=1` (`sched_yield` while spinning instead of busy-spinning).
//!
//! One engine per process: when the socket shim runs in the same process it has its own
//! engine for sockets today (both bind AF_XDP queue 0 of the interface, so the second one
//! fails to start: `README.md`, "Open questions").

use core::ffi::c_int;
use std::net::Ipv4Addr;
use std::sync::Mutex;
use std::time::Duration;

use xwarp_poll_driver::engine::SpinBudget;
use xwarp_stack::builder::EngineBuilder;
use xwarp_stack::xdp::{open_xdp_nic, XdpEngineConfig};
use xwarp_verbs::{Device, XdpContext};

use crate::config::EngineSettings;

/// Default of `XWARP_ENGINE_SPIN_US` (the shim's and the engine loop's default).
pub const ENGINE_SPIN_US_DEFAULT: u64 = 50;

/// The running engine (see the module docs).
pub struct Engine {
    /// Keeps the engine thread running (never stopped: it lives as long as the process).
    ctx: XdpContext,
    ipv4: Ipv4Addr,
    prefix: u8,
    iface: String,
}

impl Engine {
    /// The verbs device every object is created from.
    pub fn device(&self) -> &Device {
        self.ctx.device()
    }

    /// The whole verbs context (statistics, the TCP stack).
    pub fn context(&self) -> &XdpContext {
        &self.ctx
    }

    /// The IPv4 address the engine owns (`XWARP_ADDR`).
    pub fn ipv4(&self) -> Ipv4Addr {
        self.ipv4
    }

    /// Its prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// The interface it is bound to.
    pub fn iface(&self) -> &str {
        &self.iface
    }
}

enum State {
    NotStarted,
    Running(&'static Engine),
    Failed(c_int),
}

static ENGINE: Mutex<State> = Mutex::new(State::NotStarted);

fn start(s: &EngineSettings) -> std::io::Result<Engine> {
    let mut cfg = XdpEngineConfig::new(&s.iface, s.ipv4, s.prefix);
    cfg.stack.ipv4_gateway = s.gateway;
    // Consecutive programs (perftest's runs, one engine each) would all start at 49152 and
    // reuse the 4-tuples of the previous run: the peer may still hold them in TIME_WAIT,
    // and a merged capture folds the connections together. Spread the start by pid.
    cfg.stack.ephemeral_ports = ephemeral_start(std::process::id())..=65535;
    cfg.engine.name = "xwarp-ibverbs".into();
    let spin = Duration::from_micros(s.engine_spin_us.unwrap_or(ENGINE_SPIN_US_DEFAULT));
    cfg.engine.spin = if s.yield_spin {
        SpinBudget::Yield(spin)
    } else {
        SpinBudget::Duration(spin)
    };
    let iface = cfg.ifname.clone();
    let (nic, mut stack, engine) = open_xdp_nic(None, cfg)?;
    stack.mtu = stack.mtu.min(s.mtu);
    let ctx =
        XdpContext::from_builder(EngineBuilder::new(nic, stack, engine).interface_name(iface))?;
    Ok(Engine {
        ctx,
        ipv4: s.ipv4,
        prefix: s.prefix,
        iface: s.iface.clone(),
    })
}

/// First ephemeral port of a process's engine: 49152..=57340, spread by process id. The
/// range then runs to 65535, so every process keeps at least 8,196 ephemeral ports (a start
/// spread over the whole range left a process as few as 4).
fn ephemeral_start(pid: u32) -> u16 {
    49152 + ((pid % 2048) * 4) as u16
}

/// The process's engine, started on first use (see the module docs).
pub fn engine() -> Result<&'static Engine, c_int> {
    let mut st = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    match &*st {
        State::Running(e) => return Ok(e),
        State::Failed(e) => return Err(*e),
        State::NotStarted => {}
    }
    let settings = match EngineSettings::from_vars(|k| std::env::var(k).ok()) {
        Ok(s) => s,
        Err(why) => {
            crate::ffi::warn_line(&format!("cannot start the xwarp engine: {why}"));
            *st = State::Failed(libc::ENODEV);
            return Err(libc::ENODEV);
        }
    };
    match start(&settings) {
        Ok(e) => {
            let e: &'static Engine = Box::leak(Box::new(e));
            *st = State::Running(e);
            Ok(e)
        }
        Err(err) => {
            crate::ffi::warn_line(&format!(
                "cannot start the xwarp engine on {} ({}/{}): {err}",
                settings.iface, settings.ipv4, settings.prefix
            ));
            *st = State::Failed(libc::ENODEV);
            Err(libc::ENODEV)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ephemeral_start_differs_between_consecutive_pids_and_stays_in_range() {
        for pid in [0u32, 1, 2, 2047, 2048, 4095, 4096, 4097, u32::MAX] {
            let p = super::ephemeral_start(pid);
            assert!((49152..=57340).contains(&p), "pid {pid}: {p}");
            assert!(
                65535 - p + 1 >= 8196,
                "pid {pid}: only {} ports",
                65535 - p + 1
            );
            assert_ne!(p, super::ephemeral_start(pid.wrapping_add(1)));
        }
    }
}
