//! `xwarp devices [IFACE] [--json] [--probe]`: every network interface of this namespace
//! (or one) with what AF_XDP can do on it, like `ibv_devices` / `ibv_devinfo` for RNICs.
//! The data comes from `xwarp::poll_driver::afxdp::caps` (rtnetlink, ethtool ioctls and
//! the kernel's `netdev` generic-netlink family; unknown where the kernel has no such
//! family). `--probe IFACE` attaches XDP in both modes and binds AF_XDP sockets for real,
//! and detaches everything before it returns.

use std::process::ExitCode;

use serde_json::{json, Value};
use xwarp::poll_driver::afxdp::caps::{
    self, flag_names, DeviceCaps, KernelCaps, ProbeOutcome, ProbeReport, RX_METADATA_NAMES,
    XDP_FEATURE_NAMES, XSK_FEATURE_NAMES,
};

/// The options of `xwarp devices`.
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct DevicesArgs {
    /// Only this interface (default: every interface of this network namespace).
    #[arg(value_name = "IFACE")]
    pub iface: Option<String>,
    /// Print JSON (one object: `kernel` and `devices`) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Try for real (root; needs IFACE): attach an XDP program in generic and in native
    /// mode, bind AF_XDP sockets in copy, zero-copy, multi-buffer and TX-metadata mode,
    /// and detach everything. Refused on an interface that runs an XDP program.
    #[arg(long)]
    pub probe: bool,
}

/// Run `xwarp devices`.
pub fn main(a: &DevicesArgs) -> ExitCode {
    match run(a) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xwarp devices: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The whole output of `xwarp devices` for `a`, or the error to print.
pub fn run(a: &DevicesArgs) -> Result<String, String> {
    if a.probe && a.iface.is_none() {
        return Err(
            "--probe needs an interface name: it attaches XDP programs, and a \
                    native attach may reset a NIC's queues"
                .into(),
        );
    }
    let devs = match &a.iface {
        Some(name) => vec![caps::device(name).map_err(|e| e.to_string())?],
        None => caps::devices().map_err(|e| e.to_string())?,
    };
    let probe = match (&a.iface, a.probe) {
        (Some(name), true) => Some(caps::probe(name).map_err(|e| format!("--probe: {e}"))?),
        _ => None,
    };
    let kernel = caps::kernel();
    let out = if a.json {
        let v = to_json(&kernel, &devs, probe.as_ref());
        let text = serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?;
        format!("{text}\n")
    } else {
        text(&kernel, &devs, probe.as_ref())
    };
    if probe.as_ref().is_some_and(|p| !p.clean) {
        return Err(format!(
            "{out}--probe: an XDP program is still attached to {} afterwards",
            a.iface.as_deref().unwrap_or_default()
        ));
    }
    Ok(out)
}

fn names(bits: u64, table: &[(u64, &'static str)]) -> Value {
    json!(flag_names(bits, table))
}

fn probe_json(p: &ProbeOutcome) -> Value {
    json!({ "status": p.status(), "detail": p.detail() })
}

/// The JSON document: `{"kernel": {...}, "devices": [...]}` (schema in tools/README.md).
pub fn to_json(kernel: &KernelCaps, devs: &[DeviceCaps], probe: Option<&ProbeReport>) -> Value {
    let devices: Vec<Value> = devs
        .iter()
        .map(|d| {
            let l = &d.link;
            let n = d.netdev;
            let mut v = json!({
                "name": l.name,
                "ifindex": l.ifindex,
                "kind": l.kind,
                "driver": d.driver.as_ref().map(|i| json!({
                    "name": i.driver, "version": i.version,
                    "firmware": i.firmware, "bus": i.bus,
                })),
                "mtu": l.mtu,
                "mtu_min": l.mtu_range.map(|r| r.0),
                "mtu_max": l.mtu_range.map(|r| r.1),
                "up": d.is_up(),
                "operstate": d.operstate(),
                "carrier": l.carrier,
                "speed_mbps": d.speed_mbps,
                "rx_queues": l.rx_queues,
                "tx_queues": l.tx_queues,
                "channels": d.channels.map(|c| json!({
                    "rx": c.rx, "tx": c.tx, "other": c.other, "combined": c.combined,
                    "max_rx": c.max_rx, "max_tx": c.max_tx, "max_combined": c.max_combined,
                })),
                "xdp": {
                    "source": if n.is_some() { "netdev" } else { "unknown" },
                    "generic": true,
                    "native": d.native_xdp(),
                    "redirect": d.redirect(),
                    "features": n.map(|n| names(n.xdp_features, &XDP_FEATURE_NAMES)),
                    "zero_copy": d.zero_copy(),
                    "multi_buffer": d.multi_buffer(),
                    "zc_max_segs": d.zc_max_segs(),
                    "rx_metadata": n.and_then(|n| n.xdp_rx_metadata)
                        .map(|b| names(b, &RX_METADATA_NAMES)),
                },
                "tx_metadata": {
                    "xsk_features": n.and_then(|n| n.xsk_features)
                        .map(|b| names(b, &XSK_FEATURE_NAMES)),
                    "zc_checksum": d.zc_tx_checksum(),
                    "zc_timestamp": d.zc_tx_timestamp(),
                    "copy_checksum": kernel.tx_metadata,
                    "device_tx_checksum_offload": d.tx_checksum_offload,
                },
                "attached": d.attached.iter().map(|p| json!({
                    "mode": p.mode, "id": p.id, "name": p.name,
                    "holders": p.holders.iter()
                        .map(|h| json!({ "pid": h.pid, "comm": h.comm }))
                        .collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            });
            if let Some(p) = probe.filter(|p| p.name == l.name) {
                v["probe"] = json!({
                    "generic": probe_json(&p.generic),
                    "native": probe_json(&p.native),
                    "copy": probe_json(&p.copy),
                    "zero_copy": probe_json(&p.zero_copy),
                    "multi_buffer": probe_json(&p.multi_buffer),
                    "tx_metadata": probe_json(&p.tx_metadata),
                    "clean": p.clean,
                });
            }
            v
        })
        .collect();
    json!({
        "kernel": {
            "af_xdp": kernel.af_xdp,
            "netdev_family": kernel.netdev_family,
            "tx_metadata": kernel.tx_metadata,
        },
        "devices": devices,
    })
}

fn yn(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "yes",
        Some(false) => "no",
        None => "unknown",
    }
}

fn list(v: Vec<String>) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// The text report.
pub fn text(kernel: &KernelCaps, devs: &[DeviceCaps], probe: Option<&ProbeReport>) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "kernel: AF_XDP {}, netdev netlink family {}, AF_XDP TX metadata {}",
        if kernel.af_xdp {
            "yes"
        } else {
            "no (not root, or no kernel support)"
        },
        if kernel.netdev_family {
            "yes"
        } else {
            "absent (Linux < 6.3: native XDP, zero-copy and multi-buffer unknown; try --probe)"
        },
        yn(kernel.tx_metadata),
    );
    for d in devs {
        let l = &d.link;
        let driver = match &d.driver {
            Some(i) if !i.bus.is_empty() => {
                format!("driver {} {} at {}", i.driver, i.version, i.bus)
            }
            Some(i) => format!("driver {}", i.driver),
            None => "driver unknown".into(),
        };
        let kind = l
            .kind
            .as_deref()
            .map(|k| format!(" ({k})"))
            .unwrap_or_default();
        let _ = writeln!(s, "\n{}{kind}: ifindex {}, {driver}", l.name, l.ifindex);
        let speed = d
            .speed_mbps
            .map(|m| format!(", {m} Mb/s"))
            .unwrap_or_default();
        let range = l
            .mtu_range
            .map(|(a, b)| format!(" ({a}..{b})"))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "    link         {}, operstate {}, carrier {}{speed}, mtu {}{range}",
            if d.is_up() { "up" } else { "down" },
            d.operstate(),
            yn(l.carrier),
            l.mtu
        );
        let ch = match d.channels {
            Some(c) => format!(
                "; channels combined {}/{} rx {}/{} tx {}/{} (current/max)",
                c.combined, c.max_combined, c.rx, c.max_rx, c.tx, c.max_tx
            ),
            None => String::new(),
        };
        let _ = writeln!(
            s,
            "    queues       rx {}, tx {}{ch}",
            l.rx_queues, l.tx_queues
        );
        let features = d
            .netdev
            .map(|n| {
                format!(
                    " ({})",
                    list(flag_names(n.xdp_features, &XDP_FEATURE_NAMES))
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "    XDP          native {}{features}, generic yes",
            yn(d.native_xdp())
        );
        let segs = d
            .zc_max_segs()
            .map(|n| format!(", zero-copy max segs {n}"))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "    AF_XDP       zero-copy {}, multi-buffer (rx-sg) {}{segs}",
            yn(d.zero_copy()),
            yn(d.multi_buffer())
        );
        let xsk = d
            .netdev
            .and_then(|n| n.xsk_features)
            .map(|b| list(flag_names(b, &XSK_FEATURE_NAMES)))
            .unwrap_or_else(|| "unknown".into());
        let _ = writeln!(
            s,
            "    TX metadata  zero-copy: {xsk}; copy mode checksum {} (device tx-checksumming {})",
            yn(kernel.tx_metadata),
            match d.tx_checksum_offload {
                Some(true) => "on",
                Some(false) => "off: the kernel completes it",
                None => "unknown",
            }
        );
        if let Some(rx) = d.netdev.and_then(|n| n.xdp_rx_metadata) {
            let _ = writeln!(
                s,
                "    RX metadata  {}",
                list(flag_names(rx, &RX_METADATA_NAMES))
            );
        }
        if d.attached.is_empty() {
            let _ = writeln!(s, "    attached     none");
        }
        for p in &d.attached {
            let holders = if p.holders.is_empty() {
                "no process holds a link (netlink-attached?)".into()
            } else {
                p.holders
                    .iter()
                    .map(|h| format!("pid {} ({})", h.pid, h.comm))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let _ = writeln!(
                s,
                "    attached     {} mode: {} (id {}), {holders}",
                p.mode,
                p.name.as_deref().unwrap_or("?"),
                p.id
            );
        }
        if let Some(p) = probe.filter(|p| p.name == l.name) {
            for (what, o) in [
                ("XDP generic", &p.generic),
                ("XDP native", &p.native),
                ("XSK copy", &p.copy),
                ("XSK zero-copy", &p.zero_copy),
                ("XSK multi-buf", &p.multi_buffer),
                ("XSK TX meta", &p.tx_metadata),
            ] {
                let _ = writeln!(
                    s,
                    "    probe        {what:<14} {}: {}",
                    o.status(),
                    o.detail()
                );
            }
            let _ = writeln!(
                s,
                "    probe        left attached: {}",
                if p.clean { "nothing" } else { "A PROGRAM" }
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_without_an_interface_is_refused() {
        let e = run(&DevicesArgs {
            probe: true,
            ..DevicesArgs::default()
        })
        .unwrap_err();
        assert!(e.contains("--probe needs an interface"), "{e}");
    }

    #[test]
    fn unknown_interface_is_a_clear_error() {
        let e = run(&DevicesArgs {
            iface: Some("nope-xw0".into()),
            ..DevicesArgs::default()
        })
        .unwrap_err();
        assert!(e.contains("no network interface named \"nope-xw0\""), "{e}");
    }

    /// What a kernel without the `netdev` family (Debian 12's 6.1) yields: rtnetlink and
    /// ethtool facts, XDP capabilities unknown.
    #[test]
    fn without_the_netdev_family_capabilities_read_unknown() {
        use xwarp::poll_driver::afxdp::genl::Link;
        let kernel = KernelCaps {
            af_xdp: true,
            netdev_family: false,
            tx_metadata: Some(false),
        };
        let dev = DeviceCaps {
            link: Link {
                ifindex: 2,
                name: "eth0".into(),
                flags: 1,
                mtu: 1500,
                operstate: 6,
                rx_queues: 8,
                tx_queues: 8,
                ..Link::default()
            },
            driver: None,
            channels: None,
            speed_mbps: Some(25000),
            tx_checksum_offload: Some(true),
            netdev: None,
            attached: Vec::new(),
        };
        let t = text(&kernel, std::slice::from_ref(&dev), None);
        assert!(
            t.contains("netdev netlink family absent (Linux < 6.3"),
            "{t}"
        );
        assert!(
            t.contains("XDP          native unknown, generic yes"),
            "{t}"
        );
        assert!(
            t.contains("zero-copy unknown, multi-buffer (rx-sg) unknown"),
            "{t}"
        );
        assert!(t.contains("rx 8, tx 8") && t.contains("25000 Mb/s"), "{t}");
        let v = to_json(&kernel, &[dev], None);
        let d = &v["devices"][0];
        assert_eq!(v["kernel"]["netdev_family"], false);
        assert_eq!(d["xdp"]["source"], "unknown");
        assert_eq!(d["xdp"]["native"], Value::Null);
        assert_eq!(d["xdp"]["zero_copy"], Value::Null);
        assert_eq!(d["tx_metadata"]["zc_checksum"], Value::Null);
        assert_eq!(d["tx_metadata"]["copy_checksum"], false);
        assert_eq!(d["rx_queues"], 8);
    }

    #[test]
    fn loopback_is_listed_in_text_and_json() {
        let out = run(&DevicesArgs {
            iface: Some("lo".into()),
            json: true,
            ..DevicesArgs::default()
        })
        .unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        let lo = &v["devices"][0];
        assert_eq!(lo["name"], "lo");
        assert_eq!(lo["xdp"]["generic"], true);
        assert!(lo["mtu"].as_u64().unwrap() >= 1500);
        let text = run(&DevicesArgs {
            iface: Some("lo".into()),
            ..DevicesArgs::default()
        })
        .unwrap();
        assert!(
            text.contains("\nlo") && text.contains("XDP          native"),
            "{text}"
        );
    }
}
