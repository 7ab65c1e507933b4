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
