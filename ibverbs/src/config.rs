//! What the device list is made of: the `XWARP_*` variables `xwarp run` sets for the
//! socket shim (names and rules as in `preload/src/config.rs`), read afresh on every
//! `ibv_get_device_list`.

/// The configuration discovery needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// The interface the engine binds AF_XDP to (`XWARP_IFACE`): one device, named
    /// [`device_name`](crate::device::device_name)`(iface)`.
    pub iface: String,
    /// The engine's MTU (`XWARP_MTU`, 576..=9000, default 1500, as the shim reads it):
    /// the port's active MTU is the smaller of it and the interface's.
    pub mtu: usize,
}

/// A millisecond setting from the variable `name`, read through `get`: `Ok(None)` when unset
/// or empty, `Ok(Some(ms))` for a whole number `0..=max_ms`, else the one-line reason
/// naming the variable and its range.
pub fn millis_from(
    get: impl Fn(&str) -> Option<String>,
    name: &str,
    max_ms: u64,
) -> Result<Option<std::time::Duration>, String> {
    let Some(v) = get(name).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    match v.trim().parse::<u64>() {
        Ok(ms) if ms <= max_ms => Ok(Some(std::time::Duration::from_millis(ms))),
        _ => Err(format!(
            "{name}={v:?}: expected 0..={max_ms} (milliseconds)"
        )),
    }
}

#[cfg(test)]
mod millis_tests {
    use super::millis_from;
    use std::time::Duration;

    #[test]
    fn millis_settings_parse_or_name_the_variable() {
        let one = |v: &'static str| move |k: &str| (k == "XWARP_X_MS").then(|| v.to_string());
        assert_eq!(millis_from(|_| None, "XWARP_X_MS", 100), Ok(None));
        assert_eq!(millis_from(one(" "), "XWARP_X_MS", 100), Ok(None));
        assert_eq!(
            millis_from(one("0"), "XWARP_X_MS", 100),
            Ok(Some(Duration::ZERO))
        );
        assert_eq!(
            millis_from(one(" 100 "), "XWARP_X_MS", 100),
            Ok(Some(Duration::from_millis(100)))
        );
        for bad in ["101", "-1", "1.5", "soon", "18446744073709551616"] {
            let e = millis_from(one(bad), "XWARP_X_MS", 100).unwrap_err();
            assert!(e.starts_with("XWARP_X_MS=") && e.contains("0..=100"), "{e}");
        }
    }
}

/// The MPA CRC an active side asks for, from the variable `XWARP_MPA_CRC` read through
/// `get`: `1` asks for CRC32c (the MPA Request's C bit, markers stay off), `0` asks for
/// none, `auto` or unset/empty leaves the QP's own setting (C=0 unless the program's QP
/// says otherwise, the default). `1` is what turns CRC on for `xwarp-rping`
/// (tools/src/bin/rping.rs) too. `Ok(Some(crc))` to set, `Ok(None)` to leave, else the
/// one-line reason naming the variable and its values.
pub fn mpa_crc_from(get: impl Fn(&str) -> Option<String>) -> Result<Option<bool>, String> {
    let Some(v) = get("XWARP_MPA_CRC").filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    match v.trim() {
        "1" => Ok(Some(true)),
        "0" => Ok(Some(false)),
        a if a.eq_ignore_ascii_case("auto") => Ok(None),
        _ => Err(format!(
            "XWARP_MPA_CRC={v:?}: expected 1 (ask for MPA CRC), 0 (no CRC) or auto"
        )),
    }
}

#[cfg(test)]
mod mpa_crc_tests {
    use super::mpa_crc_from;

    #[test]
    fn mpa_crc_setting_parses_or_names_the_variable() {
        let one = |v: &'static str| move |k: &str| (k == "XWARP_MPA_CRC").then(|| v.to_string());
        assert_eq!(mpa_crc_from(|_| None), Ok(None));
        assert_eq!(mpa_crc_from(one("")), Ok(None));
        assert_eq!(mpa_crc_from(one(" 1 ")), Ok(Some(true)));
        assert_eq!(mpa_crc_from(one("0")), Ok(Some(false)));
        assert_eq!(mpa_crc_from(one("auto")), Ok(None));
        assert_eq!(mpa_crc_from(one("AUTO")), Ok(None));
        for bad in ["2", "yes", "on", "true", "-1", "1 0"] {
            let e = mpa_crc_from(one(bad)).unwrap_err();
            assert!(e.starts_with("XWARP_MPA_CRC=") && e.contains("auto"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}

/// Default engine MTU (the shim's `XWARP_MTU` default).
pub const DEFAULT_ENGINE_MTU: usize = 1500;

impl DeviceConfig {
    /// Read the configuration through `get` (the environment in production). The error is
    /// the one-line reason no device is listed.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<DeviceConfig, String> {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let Some(iface) = get("XWARP_IFACE") else {
            return Err(
                "XWARP_IFACE is not set (run the program under `xwarp run --iface IF \
                        --addr A/P -- CMD`)"
                    .into(),
            );
        };
        let iface = iface.trim().to_string();
        if iface.len() >= libc::IFNAMSIZ || iface.contains('/') || iface.contains('\0') {
            return Err(format!("XWARP_IFACE={iface:?}: not an interface name"));
        }
        let mtu = match get("XWARP_MTU") {
            None => DEFAULT_ENGINE_MTU,
            Some(v) => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|m| (576..=9000).contains(m))
                .ok_or_else(|| format!("XWARP_MTU={v:?}: expected 576..=9000"))?,
        };
        Ok(DeviceConfig { iface, mtu })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(vars: &[(&str, &str)]) -> Result<DeviceConfig, String> {
        DeviceConfig::from_vars(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn iface_and_mtu() {
        assert_eq!(
            cfg(&[("XWARP_IFACE", " veth0 ")]).unwrap(),
            DeviceConfig {
                iface: "veth0".into(),
                mtu: 1500
            }
        );
        assert_eq!(
            cfg(&[("XWARP_IFACE", "e"), ("XWARP_MTU", "9000")])
                .unwrap()
                .mtu,
            9000
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        assert!(cfg(&[]).unwrap_err().contains("XWARP_IFACE is not set"));
        assert!(cfg(&[("XWARP_IFACE", "  ")])
            .unwrap_err()
            .contains("not set"));
        assert!(cfg(&[("XWARP_IFACE", "a/b")])
            .unwrap_err()
            .contains("not an interface name"));
        assert!(cfg(&[("XWARP_IFACE", "0123456789abcdef")])
            .unwrap_err()
            .contains("not an interface name"));
        assert!(cfg(&[("XWARP_IFACE", "e"), ("XWARP_MTU", "100")])
            .unwrap_err()
            .contains("XWARP_MTU"));
    }
}

/// What the engine needs besides the device configuration (see `engine.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineSettings {
    /// `XWARP_IFACE`.
    pub iface: String,
    /// `XWARP_ADDR`'s address.
    pub ipv4: std::net::Ipv4Addr,
    /// `XWARP_ADDR`'s prefix length.
    pub prefix: u8,
    /// `XWARP_GATEWAY`.
    pub gateway: Option<std::net::Ipv4Addr>,
    /// `XWARP_MTU` (as [`DeviceConfig::mtu`]).
    pub mtu: usize,
    /// `XWARP_ENGINE_SPIN_US`.
    pub engine_spin_us: Option<u64>,
    /// `XWARP_YIELD=1`: the idle engine calls `sched_yield` while it spins instead of
    /// busy-spinning (as the shim's engine).
    pub yield_spin: bool,
}

impl EngineSettings {
    /// Read the settings through `get`; the error names the bad variable.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<EngineSettings, String> {
        let dev = DeviceConfig::from_vars(&get)?;
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let addr = get("XWARP_ADDR").ok_or("XWARP_ADDR is not set (A.B.C.D/PREFIX)")?;
        let bad = || format!("XWARP_ADDR={addr:?}: expected A.B.C.D/PREFIX");
        let (ip, prefix) = addr.trim().split_once('/').ok_or_else(bad)?;
        let ipv4: std::net::Ipv4Addr = ip.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().ok().filter(|p| *p <= 32).ok_or_else(bad)?;
        let gateway = get("XWARP_GATEWAY")
            .map(|v| {
                v.trim()
                    .parse()
                    .map_err(|_| format!("XWARP_GATEWAY={v:?}: not an IPv4 address"))
            })
            .transpose()?;
        let engine_spin_us = get("XWARP_ENGINE_SPIN_US")
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| format!("XWARP_ENGINE_SPIN_US={v:?}: not a number"))
            })
            .transpose()?;
        let yield_spin = match get("XWARP_YIELD").as_deref().map(str::trim) {
            None | Some("0") => false,
            Some("1") => true,
            Some(v) => return Err(format!("XWARP_YIELD={v:?}: expected 0 or 1")),
        };
        Ok(EngineSettings {
            yield_spin,
            iface: dev.iface,
            ipv4,
            prefix,
            gateway,
            mtu: dev.mtu,
            engine_spin_us,
        })
    }
}

#[cfg(test)]
mod engine_settings_tests {
    use super::*;

    fn s(vars: &[(&str, &str)]) -> Result<EngineSettings, String> {
        EngineSettings::from_vars(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn addr_gateway_and_errors() {
        let e = s(&[
            ("XWARP_IFACE", "veth0"),
            ("XWARP_ADDR", "10.1.0.10/24"),
            ("XWARP_GATEWAY", "10.1.0.1"),
        ])
        .unwrap();
        assert_eq!((e.ipv4, e.prefix), ("10.1.0.10".parse().unwrap(), 24));
        assert_eq!(e.gateway, Some("10.1.0.1".parse().unwrap()));
        assert!(s(&[("XWARP_IFACE", "v")])
            .unwrap_err()
            .contains("XWARP_ADDR"));
        for bad in ["10.1.0.10", "10.1.0.10/33", "x/24"] {
            assert!(s(&[("XWARP_IFACE", "v"), ("XWARP_ADDR", bad)])
                .unwrap_err()
                .contains("XWARP_ADDR"));
        }
        assert!(s(&[
            ("XWARP_IFACE", "v"),
            ("XWARP_ADDR", "1.2.3.4/8"),
            ("XWARP_GATEWAY", "g")
        ])
        .unwrap_err()
        .contains("XWARP_GATEWAY"));
        let y = |v| {
            s(&[
                ("XWARP_IFACE", "v"),
                ("XWARP_ADDR", "1.2.3.4/8"),
                ("XWARP_YIELD", v),
            ])
        };
        assert!(y("1").unwrap().yield_spin);
        assert!(!y("0").unwrap().yield_spin);
        assert!(y("yes").unwrap_err().contains("XWARP_YIELD"));
    }
}
