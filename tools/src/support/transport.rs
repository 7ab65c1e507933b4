//! How the interop tools choose their engine: the command line's engine flags
//! ([`NetArgs`]: `--iface IF --addr A.B.C.D/PREFIX [--gateway G] [--rx-checksum verify]`),
//! or without them the variable **`XWARP_ENGINE=xdp:IFACE:ADDR/PREFIX[,verify]`**
//! ([`EngineSpec::parse`]). The tools (`xwarp-rping`, `xwarp-perftest-peer`) start an
//! `xwarp::verbs` engine bound with AF_XDP to that interface, owning that address
//! (`support::verbs::start_engine`); the interop harness runs them inside its network
//! namespace with `ip netns exec`. `--rx-checksum verify` (or the variable's `,verify`
//! suffix) checks every received L4 checksum ([`RxChecksum::Verify`]); the default
//! trusts them ([`RxChecksum::TrustL4`], see `xwarp::toe`). Like every engine, it records
//! every frame it receives and sends when **`XWARP_PCAP`** is set
//! (`xwarp_poll_driver::pcap`); `%p` in that path becomes the process id, so several
//! tool processes of one run write separate files.

use std::net::Ipv4Addr;

use xwarp::toe::RxChecksum;

use crate::cli::EngineArgs;

/// The environment variable naming the engine (see the module docs).
pub const ENGINE_ENV: &str = "XWARP_ENGINE";

/// A parsed `xdp:IFACE:ADDR/PREFIX[,verify]` engine selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineSpec {
    /// Interface to bind AF_XDP to.
    pub ifname: String,
    /// The engine's own IPv4 address (not configured on the kernel's interface).
    pub ipv4: Ipv4Addr,
    /// Prefix length of `ipv4`.
    pub prefix: u8,
    /// Received L4 checksum policy.
    pub rx_checksum: RxChecksum,
    /// IPv4 default gateway of the engine (`--gateway`; none from `XWARP_ENGINE`).
    pub gateway: Option<Ipv4Addr>,
}

/// What the received L4 checksums get (`--rx-checksum`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxPolicy {
    /// Trust them (`RxChecksum::TrustL4`, the default).
    Trust,
    /// Check every one (`RxChecksum::Verify`).
    Verify,
}

/// The engine flags of the rping-family tools: [`EngineArgs`] plus the checksum policy.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NetArgs {
    /// The engine to run on (`--iface IF --addr A/P [--gateway G]`).
    #[command(flatten)]
    pub engine: EngineArgs,
    /// With --iface: check every received L4 checksum (verify) or trust them (trust, the
    /// default).
    #[arg(long, value_name = "POLICY")]
    pub rx_checksum: Option<RxPolicy>,
}

impl EngineSpec {
    /// Parses `xdp:IFACE:ADDR/PREFIX` with an optional `,verify` or `,trust` suffix.
    pub fn parse(s: &str) -> Result<EngineSpec, String> {
        let bad = |why: &str| format!("{ENGINE_ENV}={s:?}: {why} (want xdp:IFACE:ADDR/PREFIX)");
        let (main, opt) = match s.split_once(',') {
            Some((m, o)) => (m, Some(o)),
            None => (s, None),
        };
        let rx_checksum = match opt {
            None | Some("trust") => RxChecksum::TrustL4,
            Some("verify") => RxChecksum::Verify,
            Some(_) => return Err(bad("unknown option")),
        };
        let rest = main
            .strip_prefix("xdp:")
            .ok_or_else(|| bad("no xdp: prefix"))?;
        let (ifname, net) = rest.split_once(':').ok_or_else(|| bad("no address"))?;
        if ifname.is_empty() || ifname.len() > 15 {
            return Err(bad("bad interface name"));
        }
        let (addr, prefix) = net.split_once('/').ok_or_else(|| bad("no prefix length"))?;
        let ipv4: Ipv4Addr = addr.parse().map_err(|_| bad("bad IPv4 address"))?;
        let prefix: u8 = prefix.parse().map_err(|_| bad("bad prefix length"))?;
        if prefix > 32 || ipv4.is_unspecified() {
            return Err(bad("address or prefix out of range"));
        }
        Ok(EngineSpec {
            ifname: ifname.to_string(),
            ipv4,
            prefix,
            rx_checksum,
            gateway: None,
        })
    }
}

/// First local port of a process's engine: spread over 49152..=65532 by process id, so
/// consecutive example processes in one capture use different 4-tuples (each engine starts
/// its ephemeral ports at the range's start; identical 4-tuples from sequential processes
/// make tshark fold connections together, and could meet the peer's TIME_WAIT).
pub fn ephemeral_start(pid: u32) -> u16 {
    49152 + ((pid % 4096) * 4) as u16
}

impl NetArgs {
    /// Whether the engine flags go together (`--iface` with `--addr`; `--gateway` and
    /// `--rx-checksum` only with them): the tools call it right after parsing, so a bad
    /// combination is a command-line error (status 2 with the usage).
    pub fn check(&self) -> Result<(), String> {
        let e = &self.engine;
        if e.iface.is_none() && (e.addr.is_some() || e.gateway.is_some()) {
            return Err("--addr and --gateway need --iface".into());
        }
        if e.iface.is_some() && e.addr.is_none() {
            return Err("--iface needs --addr A.B.C.D/PREFIX (the engine's own address)".into());
        }
        if e.iface.is_none() && self.rx_checksum.is_some() {
            return Err("--rx-checksum needs --iface".into());
        }
        Ok(())
    }

    /// The engine the flags select, or without them `XWARP_ENGINE`; `None`: neither
    /// names one (`XWARP_ENGINE` unset, empty or `kernel`). Applies `--pcap` (every engine started afterwards captures).
    pub fn engine_spec(&self) -> Result<Option<EngineSpec>, String> {
        self.check()?;
        self.engine.apply_pcap();
        if self.engine.is_empty() {
            return match std::env::var(ENGINE_ENV) {
                Err(_) => Ok(None),
                Ok(v) if v.is_empty() || v == "kernel" => Ok(None),
                Ok(v) => EngineSpec::parse(&v).map(Some),
            };
        }
        let ifname = self
            .engine
            .iface
            .clone()
            .ok_or("--addr and --gateway need --iface")?;
        let (ipv4, prefix) = self
            .engine
            .addr
            .ok_or("--iface needs --addr A.B.C.D/PREFIX (the engine's own address)")?;
        let rx_checksum = match self.rx_checksum {
            Some(RxPolicy::Verify) => RxChecksum::Verify,
            Some(RxPolicy::Trust) | None => RxChecksum::TrustL4,
        };
        Ok(Some(EngineSpec {
            ifname,
            ipv4,
            prefix,
            rx_checksum,
            gateway: self.engine.gateway,
        }))
    }

    /// Parse `T` from the process's command line and check its engine flags (`net` of
    /// it): exits with status 2 and the usage on a bad combination, like clap does.
    pub fn parse_checked<T: clap::Parser>(net: impl Fn(&T) -> &NetArgs) -> T {
        let t = T::parse();
        if let Err(e) = net(&t).check() {
            T::command()
                .error(clap::error::ErrorKind::ArgumentConflict, e)
                .exit();
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_spec_parses_interface_address_prefix_and_policy() {
        let s = EngineSpec::parse("xdp:tap0:10.77.0.3/24").unwrap();
        assert_eq!(s.ifname, "tap0");
        assert_eq!(s.ipv4, Ipv4Addr::new(10, 77, 0, 3));
        assert_eq!(s.prefix, 24);
        assert_eq!(s.rx_checksum, RxChecksum::TrustL4);
        let v = EngineSpec::parse("xdp:veth1:192.168.5.9/30,verify").unwrap();
        assert_eq!(v.rx_checksum, RxChecksum::Verify);
        assert_eq!(v.prefix, 30);
    }

    #[test]
    fn ephemeral_ports_differ_between_consecutive_processes_and_stay_in_range() {
        for pid in [0u32, 1, 4095, 4096, 123_456, u32::MAX] {
            let p = ephemeral_start(pid);
            assert!((49152..=65532).contains(&p), "pid {pid}: {p}");
            assert_ne!(p, ephemeral_start(pid.wrapping_add(1)), "pid {pid}");
        }
    }

    #[test]
    fn engine_spec_rejects_malformed_selections() {
        for bad in [
            "",
            "tap0:10.77.0.3/24",
            "xdp:tap0",
            "xdp::10.77.0.3/24",
            "xdp:tap0:10.77.0.3",
            "xdp:tap0:10.77.0.300/24",
            "xdp:tap0:10.77.0.3/33",
            "xdp:tap0:0.0.0.0/24",
            "xdp:tap0:10.77.0.3/24,fast",
            "xdp:averyveryverylongname:10.77.0.3/24",
        ] {
            assert!(EngineSpec::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
