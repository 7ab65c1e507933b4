//! Configuration from `XWARP_*` environment variables (see the crate README).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::time::Duration;

/// Which destinations `connect` runs on the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectScope {
    /// Only destinations inside the engine's own subnets.
    Subnet,
    /// Every non-loopback destination of the engine's address families (needs a gateway
    /// for the ones outside the subnet).
    All,
    /// No outgoing connection is accelerated.
    None,
}

/// The shim's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Interface the engine binds AF_XDP to (`XWARP_IFACE`).
    pub iface: String,
    /// The engine's IPv4 address and prefix (`XWARP_ADDR`, e.g. `10.88.1.10/24`).
    pub ipv4: Option<(Ipv4Addr, u8)>,
    /// The engine's IPv6 address and prefix (`XWARP_ADDR6`).
    pub ipv6: Option<(Ipv6Addr, u8)>,
    /// IPv4 default gateway (`XWARP_GATEWAY`).
    pub gateway: Option<Ipv4Addr>,
    /// Ports whose wildcard-bound listeners run on the engine (`XWARP_PORTS`, e.g.
    /// `80,8000-8100`); `None`: every port. Binding the engine's own address always
    /// accelerates.
    pub ports: Option<Vec<RangeInclusive<u16>>>,
    /// Which `connect` destinations run on the engine (`XWARP_CONNECT`).
    pub connect: ConnectScope,
    /// Spin budget of blocking calls before they sleep (`XWARP_SPIN_US`).
    pub spin: Duration,
    /// How long the idle engine thread keeps polling before it sleeps
    /// (`XWARP_ENGINE_SPIN_US`).
    pub engine_spin: Duration,
    /// Spinning threads (blocking calls and the idle engine) give their core away with
    /// `sched_yield` on every round instead of busy-spinning (`XWARP_YIELD`).
    pub yield_spin: bool,
    /// Log filter (`XWARP_LOG`, env_logger syntax: `off`, `warn`, `info`, `debug`,
    /// `xwarp_preload=debug,smoltcp=trace`, ...; the shim's logger applies it at load).
    pub log: String,
    /// Exit instead of falling back to the kernel when the engine cannot start
    /// (`XWARP_STRICT=1`).
    pub strict: bool,
    /// Engine MTU (`XWARP_MTU`, default 1500).
    pub mtu: usize,
    /// Run-to-completion: the program's threads drive the engine from their socket calls
    /// (`XWARP_MODE=inline`; `thread`, the default, hands work to the engine thread).
    pub inline: bool,
}

/// Default of `XWARP_SPIN_US`.
pub const SPIN_US_DEFAULT: u64 = 20;
/// Default of `XWARP_SPIN_US` with `XWARP_MODE=inline` (the calling thread is the
/// engine while it spins: a longer budget keeps answers off the keeper's wakeup path).
pub const INLINE_SPIN_US_DEFAULT: u64 = 200;
/// Default of `XWARP_ENGINE_SPIN_US` (the engine loop's own default).
pub const ENGINE_SPIN_US_DEFAULT: u64 = 50;
/// Default of `XWARP_YIELD`.
pub const YIELD_DEFAULT: bool = false;
/// Default of `XWARP_YIELD` with `XWARP_MODE=inline`: the program's thread spins as the
/// engine (up to `XWARP_SPIN_US` per wait), and a busy-spinning one keeps the core from a
/// thread woken onto it (a local peer its transmit just woke, the keeper) until the spin
/// runs out: redis-benchmark `-c 50` against an inline redis went from 0.5x to 1.5x of
/// the kernel's rate when the waits yielded (preload/README.md).
pub const INLINE_YIELD_DEFAULT: bool = true;

fn parse_cidr<A: std::str::FromStr>(name: &str, v: &str, max: u8) -> Result<(A, u8), String> {
    let (a, p) = v
        .split_once('/')
        .ok_or_else(|| format!("{name}={v:?}: expected ADDRESS/PREFIX"))?;
    let addr = a
        .trim()
        .parse::<A>()
        .map_err(|_| format!("{name}={v:?}: {a:?} is not an address"))?;
    let prefix = p
        .trim()
        .parse::<u8>()
        .ok()
        .filter(|p| (1..=max).contains(p))
        .ok_or_else(|| format!("{name}={v:?}: prefix must be 1..={max}"))?;
    Ok((addr, prefix))
}

fn parse_ports(v: &str) -> Result<Vec<RangeInclusive<u16>>, String> {
    let mut out = Vec::new();
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("XWARP_PORTS={v:?}: {part:?} is not a port or LOW-HIGH range");
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let lo: u16 = lo.parse().map_err(|_| bad())?;
        let hi: u16 = hi.parse().map_err(|_| bad())?;
        if lo == 0 || lo > hi {
            return Err(bad());
        }
        out.push(lo..=hi);
    }
    if out.is_empty() {
        return Err(format!("XWARP_PORTS={v:?}: no port given"));
    }
    Ok(out)
}

impl Config {
    /// Read the configuration through `get` (the environment in production).
    /// `Ok(None)`: `XWARP_IFACE` is unset, the shim passes everything to the kernel.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<Config>, String> {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let Some(iface) = get("XWARP_IFACE") else {
            return Ok(None);
        };
        let iface = iface.trim().to_string();
        if iface.len() >= libc::IFNAMSIZ || iface.contains('/') {
            return Err(format!("XWARP_IFACE={iface:?}: not an interface name"));
        }
        let ipv4 = get("XWARP_ADDR")
            .map(|v| parse_cidr::<Ipv4Addr>("XWARP_ADDR", &v, 32))
            .transpose()?;
        let ipv6 = get("XWARP_ADDR6")
            .map(|v| parse_cidr::<Ipv6Addr>("XWARP_ADDR6", &v, 128))
            .transpose()?;
        if ipv4.is_none() && ipv6.is_none() {
            return Err("XWARP_IFACE is set but neither XWARP_ADDR nor XWARP_ADDR6".into());
        }
        for ip in ipv4
            .iter()
            .map(|a| IpAddr::V4(a.0))
            .chain(ipv6.iter().map(|a| IpAddr::V6(a.0)))
        {
            if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
                return Err(format!(
                    "engine address {ip} must be a unicast, non-loopback address"
                ));
            }
        }
        let gateway = get("XWARP_GATEWAY")
            .map(|v| {
                v.trim()
                    .parse::<Ipv4Addr>()
                    .map_err(|_| format!("XWARP_GATEWAY={v:?}: not an IPv4 address"))
            })
            .transpose()?;
        if gateway.is_some() && ipv4.is_none() {
            return Err("XWARP_GATEWAY needs XWARP_ADDR".into());
        }
        let ports = get("XWARP_PORTS").map(|v| parse_ports(&v)).transpose()?;
        let connect = match get("XWARP_CONNECT").as_deref().map(str::trim) {
            None | Some("subnet") => ConnectScope::Subnet,
            Some("all") => ConnectScope::All,
            Some("none") => ConnectScope::None,
            Some(v) => return Err(format!("XWARP_CONNECT={v:?}: expected subnet, all or none")),
        };
        let micros = |name: &str, default: u64| -> Result<Duration, String> {
            match get(name) {
                None => Ok(Duration::from_micros(default)),
                Some(v) => v
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|u| *u <= 1_000_000)
                    .map(Duration::from_micros)
                    .ok_or_else(|| format!("{name}={v:?}: expected 0..=1000000")),
            }
        };
        let inline = match get("XWARP_MODE").as_deref().map(str::trim) {
            None | Some("") | Some("thread") => false,
            Some("inline") => true,
            Some(v) => return Err(format!("XWARP_MODE={v:?}: expected thread or inline")),
        };
        let spin = micros(
            "XWARP_SPIN_US",
            if inline {
                INLINE_SPIN_US_DEFAULT
            } else {
                SPIN_US_DEFAULT
            },
        )?;
        let engine_spin = micros("XWARP_ENGINE_SPIN_US", ENGINE_SPIN_US_DEFAULT)?;
        let yield_spin = match get("XWARP_YIELD").as_deref().map(str::trim) {
            None if inline => INLINE_YIELD_DEFAULT,
            None => YIELD_DEFAULT,
            Some("0") => false,
            Some("1") => true,
            Some(v) => return Err(format!("XWARP_YIELD={v:?}: expected 0 or 1")),
        };
        let log = match get("XWARP_LOG") {
            None => crate::logging::DEFAULT_FILTER.to_owned(),
            Some(v) => {
                crate::logging::check(v.trim()).map_err(|e| format!("XWARP_LOG={v:?}: {e}"))?;
                v.trim().to_owned()
            }
        };
        let strict = match get("XWARP_STRICT").as_deref().map(str::trim) {
            None | Some("0") => false,
            Some("1") => true,
            Some(v) => return Err(format!("XWARP_STRICT={v:?}: expected 0 or 1")),
        };
        let mtu = match get("XWARP_MTU") {
            None => 1500,
            Some(v) => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|m| (576..=9000).contains(m))
                .ok_or_else(|| format!("XWARP_MTU={v:?}: expected 576..=9000"))?,
        };
        Ok(Some(Config {
            iface,
            ipv4,
            ipv6,
            gateway,
            ports,
            connect,
            spin,
            engine_spin,
            yield_spin,
            log,
            strict,
            mtu,
            inline,
        }))
    }

    /// `true` if `ip` is one of the engine's own addresses.
    pub fn is_engine_addr(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => self.ipv4.is_some_and(|(e, _)| e == a),
            IpAddr::V6(a) => self.ipv6.is_some_and(|(e, _)| e == a),
        }
    }

    /// Does a listener bound to `addr` run on the engine?
    pub fn accelerate_bind(&self, addr: SocketAddr) -> bool {
        let ip = addr.ip();
        if self.is_engine_addr(ip) {
            return true;
        }
        if !ip.is_unspecified() || addr.port() == 0 {
            return false;
        }
        // A wildcard IPv6 listener also serves IPv4 (dual stack), so either family counts.
        let family_ok = match ip {
            IpAddr::V4(_) => self.ipv4.is_some(),
            IpAddr::V6(_) => self.ipv4.is_some() || self.ipv6.is_some(),
        };
        family_ok
            && self
                .ports
                .as_ref()
                .is_none_or(|ps| ps.iter().any(|r| r.contains(&addr.port())))
    }

    /// [`Config::accelerate_bind`] for a socket with `IPV6_V6ONLY` set to `v6only`: an IPv6
    /// wildcard that takes no IPv4 has nothing to serve on an engine without an IPv6
    /// address (asyncio's `start_server(host=None)` binds `0.0.0.0` and a `V6ONLY` `::`
    /// on the same port: the `::` one stays on the kernel).
    pub fn accelerate_bind_v6only(&self, addr: SocketAddr, v6only: bool) -> bool {
        if v6only && addr.is_ipv6() && addr.ip().is_unspecified() && self.ipv6.is_none() {
            return false;
        }
        self.accelerate_bind(addr)
    }

    /// Does a connection to `dst` run on the engine?
    pub fn accelerate_connect(&self, dst: SocketAddr) -> bool {
        let ip = dst.ip();
        if dst.port() == 0
            || ip.is_loopback()
            || ip.is_unspecified()
            || ip.is_multicast()
            || self.is_engine_addr(ip)
        {
            return false;
        }
        match (self.connect, ip) {
            (ConnectScope::None, _) => false,
            (ConnectScope::All, IpAddr::V4(_)) => self.ipv4.is_some(),
            (ConnectScope::All, IpAddr::V6(_)) => self.ipv6.is_some(),
            (ConnectScope::Subnet, IpAddr::V4(a)) => self
                .ipv4
                .is_some_and(|(e, p)| same_prefix(&e.octets(), &a.octets(), p)),
            (ConnectScope::Subnet, IpAddr::V6(a)) => self
                .ipv6
                .is_some_and(|(e, p)| same_prefix(&e.octets(), &a.octets(), p)),
        }
    }
}

fn same_prefix(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let mut bits = usize::from(prefix);
    for (x, y) in a.iter().zip(b) {
        if bits == 0 {
            return true;
        }
        let take = bits.min(8);
        let mask = (0xffu16 << (8 - take)) as u8;
        if x & mask != y & mask {
            return false;
        }
        bits -= take;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<Option<Config>, String> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn blank_xwarp_log_means_default_filter() {
        for blank in ["", "  ", "\t"] {
            let c = cfg(&[
                ("XWARP_IFACE", "v"),
                ("XWARP_ADDR", "10.0.0.1/24"),
                ("XWARP_LOG", blank),
            ])
            .unwrap()
            .unwrap();
            assert_eq!(c.log, crate::logging::DEFAULT_FILTER, "{blank:?}");
        }
    }

    #[test]
    fn unset_iface_means_inactive() {
        assert_eq!(cfg(&[("XWARP_ADDR", "10.0.0.1/24")]).unwrap(), None);
    }

    #[test]
    fn full_config_parses() {
        let c = cfg(&[
            ("XWARP_IFACE", "veth-a"),
            ("XWARP_ADDR", "10.88.1.10/24"),
            ("XWARP_ADDR6", "fd00::10/64"),
            ("XWARP_GATEWAY", "10.88.1.1"),
            ("XWARP_PORTS", "80, 8000-8100"),
            ("XWARP_CONNECT", "all"),
            ("XWARP_SPIN_US", "5"),
            ("XWARP_ENGINE_SPIN_US", "0"),
            ("XWARP_YIELD", "1"),
            ("XWARP_LOG", "debug"),
            ("XWARP_STRICT", "1"),
            ("XWARP_MTU", "1400"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.iface, "veth-a");
        assert_eq!(c.ipv4, Some((Ipv4Addr::new(10, 88, 1, 10), 24)));
        assert_eq!(c.ipv6.unwrap().1, 64);
        assert_eq!(c.ports, Some(vec![80..=80, 8000..=8100]));
        assert_eq!(c.connect, ConnectScope::All);
        assert_eq!(c.spin, Duration::from_micros(5));
        assert_eq!(c.engine_spin, Duration::ZERO);
        assert!(c.yield_spin);
        assert_eq!(c.log, "debug");
        assert!(c.strict);
        assert_eq!(c.mtu, 1400);
        assert!(!c.inline);
    }

    #[test]
    fn inline_mode_parses_lengthens_the_default_spin_and_yields() {
        let base = [("XWARP_IFACE", "v"), ("XWARP_ADDR", "10.0.0.1/24")];
        let c = cfg(&[base[0], base[1], ("XWARP_MODE", "inline")])
            .unwrap()
            .unwrap();
        assert!(c.inline);
        assert_eq!(c.spin, Duration::from_micros(INLINE_SPIN_US_DEFAULT));
        assert_eq!(c.yield_spin, INLINE_YIELD_DEFAULT);
        let c = cfg(&[
            base[0],
            base[1],
            ("XWARP_MODE", "inline"),
            ("XWARP_YIELD", "0"),
        ])
        .unwrap()
        .unwrap();
        assert!(!c.yield_spin);
        let c = cfg(&[
            base[0],
            base[1],
            ("XWARP_MODE", "inline"),
            ("XWARP_SPIN_US", "7"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.spin, Duration::from_micros(7));
        let c = cfg(&[base[0], base[1], ("XWARP_MODE", "thread")])
            .unwrap()
            .unwrap();
        assert!(!c.inline);
        assert_eq!(c.spin, Duration::from_micros(SPIN_US_DEFAULT));
        assert_eq!(c.yield_spin, YIELD_DEFAULT);
    }

    #[test]
    fn misconfigurations_are_errors_naming_the_variable() {
        let base = [("XWARP_IFACE", "veth-a")];
        let cases: &[(&str, &str)] = &[
            ("XWARP_ADDR", "10.88.1.10"),
            ("XWARP_ADDR", "10.88.1.300/24"),
            ("XWARP_ADDR", "10.88.1.10/33"),
            ("XWARP_ADDR", "127.0.0.1/8"),
            ("XWARP_PORTS", "80-70"),
            ("XWARP_PORTS", "0"),
            ("XWARP_CONNECT", "sometimes"),
            ("XWARP_MODE", "fast"),
            ("XWARP_SPIN_US", "-1"),
            ("XWARP_ENGINE_SPIN_US", "1000001"),
            ("XWARP_YIELD", "yes"),
            ("XWARP_LOG", "loud"),
            ("XWARP_STRICT", "yes"),
            ("XWARP_MTU", "100"),
        ];
        for (k, v) in cases {
            let mut vars = base.to_vec();
            if *k != "XWARP_ADDR" {
                vars.push(("XWARP_ADDR", "10.88.1.10/24"));
            }
            vars.push((k, v));
            let e = cfg(&vars).expect_err(&format!("{k}={v} must be rejected"));
            assert!(e.contains(k) || e.contains("address"), "{k}={v}: {e}");
        }
        let e = cfg(&base).unwrap_err();
        assert!(e.contains("XWARP_ADDR"), "{e}");
    }

    #[test]
    fn bind_and_connect_rules() {
        let c = cfg(&[
            ("XWARP_IFACE", "veth-a"),
            ("XWARP_ADDR", "10.88.1.10/24"),
            ("XWARP_PORTS", "8000-8001"),
        ])
        .unwrap()
        .unwrap();
        let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(c.accelerate_bind(sa("10.88.1.10:9999")));
        assert!(c.accelerate_bind(sa("0.0.0.0:8000")));
        assert!(c.accelerate_bind(sa("[::]:8001")));
        assert!(!c.accelerate_bind(sa("0.0.0.0:8002")));
        assert!(!c.accelerate_bind(sa("127.0.0.1:8000")));
        assert!(!c.accelerate_bind(sa("10.88.1.1:8000")));
        // A V6ONLY `::` has nothing to serve without an engine IPv6 address.
        assert!(!c.accelerate_bind_v6only(sa("[::]:8001"), true));
        assert!(c.accelerate_bind_v6only(sa("[::]:8001"), false));
        assert!(c.accelerate_bind_v6only(sa("0.0.0.0:8000"), true));
        assert!(c.accelerate_connect(sa("10.88.1.2:80")));
        assert!(!c.accelerate_connect(sa("10.88.2.2:80")));
        assert!(!c.accelerate_connect(sa("127.0.0.1:80")));
        assert!(!c.accelerate_connect(sa("10.88.1.10:80")));
        assert!(!c.accelerate_connect(sa("[fd00::2]:80")));
    }

    #[test]
    fn prefix_match_handles_partial_bytes() {
        assert!(same_prefix(
            &[10, 0, 0, 0b1000_0000],
            &[10, 0, 0, 0b1011_1111],
            25
        ));
        assert!(!same_prefix(
            &[10, 0, 0, 0b1000_0000],
            &[10, 0, 0, 0b0000_0001],
            25
        ));
        assert!(same_prefix(&[1, 2, 3, 4], &[1, 2, 3, 4], 32));
    }
}
