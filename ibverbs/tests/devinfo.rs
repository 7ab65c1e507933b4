//! Device discovery by Debian's unmodified `ibv_devices` and `ibv_devinfo` (ibverbs-utils)
//! with `libxwarp_ibverbs.so` preloaded, and the exported symbols' versions.
//!
//! * `exported_versions_match_the_imports`: `objdump -T` of the library against
//!   `nm -D --undefined-only --with-symbol-versions` of both programs and the versions
//!   libibverbs.so.1 defines: every `ibv_*` function the programs import, each at the
//!   version they import it at, and every other export at libibverbs.so.1's version.
//! * `bad_or_missing_iface_lists_nothing`: `XWARP_IFACE` unset or naming no interface
//!   gives an empty device list and one line on stderr, no crash.
//! * `devinfo_on_a_veth` (root): a veth pair in test namespaces; the programs run in
//!   namespace A with `XWARP_IFACE=veth-a`: the device name, transport, node GUID from
//!   the MAC, port state with the link up and down, MTUs, and every `-v` attribute equal to
//!   the engine's limits; the same interface name from outside the namespace is not found.
//! * `calls_in_process`: the exported functions called directly (the `ibv_query_port`
//!   symbol itself, which the programs reach only through the inline wrapper, and the error
//!   returns).

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use xwarp_ibverbs::abi::*;
use xwarp_ibverbs::attr;
use xwarp_ibverbs::exports::*;
use xwarp_poll_driver::netns::VethPair;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `libxwarp_ibverbs.so` of this build: the cdylib cargo built with this test's rlib.
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("deps dir");
    for p in [
        deps.join("libxwarp_ibverbs.so"),
        deps.parent()
            .expect("profile dir")
            .join("libxwarp_ibverbs.so"),
    ] {
        if p.exists() {
            return p;
        }
    }
    panic!("libxwarp_ibverbs.so not found beside {}", deps.display());
}

/// Make sure ibverbs-utils is installed (root: apt-get), else `None` with the reason.
fn programs() -> Result<(), String> {
    let have =
        || Path::new("/usr/bin/ibv_devinfo").exists() && Path::new("/usr/bin/ibv_devices").exists();
    if have() {
        return Ok(());
    }
    if !is_root() {
        return Err("ibverbs-utils is not installed and we are not root".into());
    }
    let _ = Command::new("sh")
        .args([
            "-c",
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ibverbs-utils \
             || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ibverbs-utils)",
        ])
        .stdout(Stdio::null())
        .status();
    if have() {
        Ok(())
    } else {
        Err("apt-get install ibverbs-utils failed".into())
    }
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Run `cmd` with the library preloaded and `vars` set (everything `XWARP_*` cleared
/// first); bounded by `timeout 20`.
fn run(mut cmd: Command, vars: &[(&str, &str)]) -> Output {
    for (k, _) in std::env::vars() {
        if k.starts_with("XWARP_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("LD_PRELOAD", library());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("spawn");
    use std::os::unix::process::ExitStatusExt;
    assert!(
        o.status.signal().is_none(),
        "killed by signal {:?}: {:?}",
        o.status.signal(),
        text(&o)
    );
    o
}

fn timed(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new("timeout");
    c.arg("20").arg(program).args(args);
    c
}

/// `name -> version` of the dynamic symbols an object defines (`objdump -T`); for
/// libibverbs, the default (`@@`) version of each name.
fn defined(obj: &Path) -> BTreeMap<String, String> {
    let o = Command::new("objdump")
        .arg("-T")
        .arg(obj)
        .output()
        .expect("objdump");
    assert!(
        o.status.success(),
        "objdump -T {}: {:?}",
        obj.display(),
        text(&o)
    );
    let mut m = BTreeMap::new();
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // addr flags... section size version name; hidden (compat) versions are "(V)".
        if f.len() < 6 || !line.contains(".text") {
            continue;
        }
        let (ver, name) = (f[f.len() - 2], f[f.len() - 1]);
        if ver.starts_with('(') {
            continue;
        }
        m.insert(name.to_string(), ver.to_string());
    }
    m
}

/// `name -> version` of the `ibv_*` functions `program` imports.
fn imported(program: &str) -> BTreeMap<String, String> {
    let o = Command::new("nm")
        .args(["-D", "--undefined-only", "--with-symbol-versions", program])
        .output()
        .expect("nm");
    assert!(o.status.success(), "nm {program}: {:?}", text(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|s| s.starts_with("ibv_"))
        .filter_map(|s| s.split_once('@'))
        .map(|(n, v)| (n.to_string(), v.trim_start_matches('@').to_string()))
        .collect()
}

#[test]
fn exported_versions_match_the_imports() {
    if let Err(why) = programs() {
        println!("SKIPPED: symbol versions: {why}");
        return;
    }
    let ours = defined(&library());
    let ours: BTreeMap<_, _> = ours
        .into_iter()
        .filter(|(n, _)| !n.starts_with('_') || n.starts_with("_ibv"))
        .collect();
    let mut wanted = imported("/usr/bin/ibv_devices");
    wanted.extend(imported("/usr/bin/ibv_devinfo"));
    assert_eq!(
        wanted.len(),
        11,
        "the programs' imports changed: {wanted:?}"
    );
    let exported: BTreeMap<_, _> = ours
        .iter()
        .filter(|(n, _)| n.starts_with("ibv_") || n.starts_with("_ibv"))
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    for (n, v) in &wanted {
        assert_eq!(
            exported.get(n),
            Some(v),
            "libxwarp_ibverbs.so must export {n} at the version ibv_devices/ibv_devinfo \
             import it at"
        );
    }
    let real = Path::new("/usr/lib/x86_64-linux-gnu/libibverbs.so.1");
    if real.exists() {
        let real = defined(real);
        for (n, v) in &exported {
            assert_eq!(
                real.get(n),
                Some(v),
                "{n}: libibverbs.so.1 defines it at another version"
            );
        }
    }
    // Nothing else leaks out under a libibverbs name, and no Rust symbol is exported.
    for n in ours.keys() {
        assert!(
            n.starts_with("ibv_") || n.starts_with("_ibv_") || n.starts_with("rdma_"),
            "unexpected export {n} in libxwarp_ibverbs.so"
        );
    }
}

#[test]
fn bad_or_missing_iface_lists_nothing() {
    if let Err(why) = programs() {
        println!("SKIPPED: bad XWARP_IFACE: {why}");
        return;
    }
    for vars in [&[("XWARP_IFACE", "xwno-such0")][..], &[][..]] {
        let o = run(timed("ibv_devices", &[]), vars);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{vars:?}: {out}{err}");
        assert!(!out.contains("xwarp_"), "{vars:?}: {out}");
        assert_eq!(err.lines().count(), 1, "{vars:?}: one line expected: {err}");
        assert!(err.starts_with("xwarp-ibverbs: "), "{err}");
        if vars.is_empty() {
            assert!(err.contains("XWARP_IFACE is not set"), "{err}");
        } else {
            assert!(
                err.contains("XWARP_IFACE=\"xwno-such0\": no such interface"),
                "{err}"
            );
        }
        let o = run(timed("ibv_devinfo", &[]), vars);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(255), "{out}{err}");
        assert!(err.contains("No IB devices found"), "{err}");
        assert_eq!(
            err.lines()
                .filter(|l| l.starts_with("xwarp-ibverbs"))
                .count(),
            1
        );
    }
    let o = run(
        timed("ibv_devinfo", &["-l"]),
        &[("XWARP_IFACE", "xwno-such0")],
    );
    let (out, _) = text(&o);
    assert!(out.starts_with("0 HCAs found:"), "{out}");
}

/// The `key: value` lines of `ibv_devinfo` output (tabs collapsed), first occurrence.
fn fields(out: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for l in out.lines() {
        if let Some((k, v)) = l.trim().split_once(':') {
            m.entry(k.trim().to_string())
                .or_insert_with(|| v.trim().to_string());
        }
    }
    m
}

#[test]
fn devinfo_on_a_veth() {
    if !is_root() {
        println!("SKIPPED: ibv_devinfo on a veth: needs root (network namespaces)");
        return;
    }
    if let Err(why) = programs() {
        println!("SKIPPED: ibv_devinfo on a veth: {why}");
        return;
    }
    let net = VethPair::new(97).expect("veth pair");
    let mac = [0x02u8, 0x5a, 0x17, 0x3c, 0x4d, 0x6e];
    let mac_s = mac.map(|b| format!("{b:02x}")).join(":");
    net.a
        .ip(&["link", "set", &net.if_a, "address", &mac_s])
        .expect("set MAC");
    net.a
        .ip(&["link", "set", &net.if_a, "mtu", "9000"])
        .expect("set MTU");
    let vars = [("XWARP_IFACE", "veth-a"), ("XWARP_ADDR", "10.88.97.10/24")];
    let in_a = |prog: &str, args: &[&str], vars: &[(&str, &str)]| {
        let mut c = net.a.command("timeout").expect("ns command");
        c.arg("20").arg(prog).args(args);
        let o = run(c, vars);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{prog} {args:?}: {out}{err}");
        assert!(err.is_empty(), "{prog} {args:?}: stderr {err}");
        out
    };

    // ibv_devices: the name and the GUID (EUI-64 of the MAC, printed big-endian).
    let out = in_a("ibv_devices", &[], &vars);
    let guid = format!("{:016x}", u64::from_be(attr::node_guid(mac)));
    assert_eq!(guid, "005a17fffe3c4d6e");
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["xwarp_veth-a", guid.as_str()]),
        "{out}"
    );

    // ibv_devinfo: identity and port 1 with the link up.
    let out = in_a("ibv_devinfo", &[], &vars);
    let f = fields(&out);
    assert_eq!(f["hca_id"], "xwarp_veth-a", "{out}");
    assert_eq!(f["transport"], "iWARP (1)");
    assert_eq!(f["node_guid"], "005a:17ff:fe3c:4d6e");
    assert_eq!(f["sys_image_guid"], "005a:17ff:fe3c:4d6e");
    assert_eq!(f["vendor_id"], format!("0x{:04x}", attr::XWARP_VENDOR_ID));
    assert_eq!(f["phys_port_cnt"], "1");
    assert_eq!(f["state"], "PORT_ACTIVE (4)", "{out}");
    assert_eq!(f["max_mtu"], "4096 (5)", "interface MTU 9000");
    assert_eq!(
        f["active_mtu"], "1024 (3)",
        "engine MTU 1500 (XWARP_MTU default)"
    );
    assert_eq!(f["link_layer"], "Ethernet");
    let out = in_a(
        "ibv_devinfo",
        &["-d", "xwarp_veth-a", "-i", "1"],
        &[vars[0], vars[1], ("XWARP_MTU", "9000")],
    );
    assert_eq!(fields(&out)["active_mtu"], "4096 (5)", "{out}");

    // -v: every attribute the engine's limits give.
    let out = in_a("ibv_devinfo", &["-v"], &vars);
    let f = fields(&out);
    let a = attr::device_attr(mac);
    let int = |k: &str| -> i64 {
        f.get(k)
            .unwrap_or_else(|| panic!("{k} missing: {out}"))
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k}: {}", f[k]))
    };
    for (k, want) in [
        ("max_qp", a.max_qp),
        ("max_qp_wr", a.max_qp_wr),
        ("max_sge", a.max_sge),
        ("max_sge_rd", a.max_sge_rd),
        ("max_cq", a.max_cq),
        ("max_cqe", a.max_cqe),
        ("max_mr", a.max_mr),
        ("max_pd", a.max_pd),
        ("max_qp_rd_atom", a.max_qp_rd_atom),
        ("max_qp_init_rd_atom", a.max_qp_init_rd_atom),
        ("max_res_rd_atom", a.max_res_rd_atom),
        ("max_srq", a.max_srq),
        ("max_srq_wr", a.max_srq_wr),
        ("max_srq_sge", a.max_srq_sge),
        ("max_mw", 0),
        ("max_ah", 0),
    ] {
        assert_eq!(int(k), i64::from(want), "{k}");
    }
    // The values are the engine's own constants.
    assert_eq!(int("max_sge"), xwarp_rdmap::verbs::MAX_SGE as i64);
    assert_eq!(int("max_sge_rd"), xwarp_rdmap::verbs::MAX_SGE_RD as i64);
    assert_eq!(int("max_mr"), i64::from(xwarp_rdmap::mem::MAX_INDEX));
    assert_eq!(
        int("max_qp_rd_atom"),
        i64::from(xwarp_ddp::mpa::frame::IRD_ORD_MAX)
    );
    assert_eq!(f["max_mr_size"], "0xffffffffffffffff");
    assert_eq!(f["atomic_cap"], "ATOMIC_NONE (0)");
    assert_eq!(f["max_msg_sz"], "0xffffffff");
    assert_eq!(f["port_cap_flags"], "0x00090000");
    assert_eq!(f["gid_tbl_len"], "1");
    assert_eq!(f["active_speed"], "10.0 Gbps (8)", "veth reports 10 Gb/s");
    assert_eq!(f["num_comp_vectors"], "1");
    assert_eq!(
        f["page_size_cap"],
        // SAFETY: sysconf has no preconditions.
        format!("0x{:x}", unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
    );

    // Link down (the peer end down: no carrier), then up again.
    net.b
        .ip(&["link", "set", &net.if_b, "down"])
        .expect("peer down");
    let state = || fields(&in_a("ibv_devinfo", &[], &vars))["state"].clone();
    assert_eq!(state(), "PORT_DOWN (1)");
    net.b
        .ip(&["link", "set", &net.if_b, "up"])
        .expect("peer up");
    // veth raises the carrier when both ends are up; allow the kernel a moment.
    let t0 = std::time::Instant::now();
    while state() != "PORT_ACTIVE (4)" && t0.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(state(), "PORT_ACTIVE (4)");
    net.a.ip(&["link", "set", &net.if_a, "down"]).expect("down");
    assert_eq!(state(), "PORT_DOWN (1)", "interface administratively down");

    // The interface exists only in namespace A.
    let o = run(timed("ibv_devices", &[]), &vars);
    let (out, err) = text(&o);
    assert!(!out.contains("xwarp_veth-a"), "{out}");
    assert!(err.contains("no such interface"), "{err}");
}

#[test]
fn calls_in_process() {
    // The one test of this binary that sets XWARP_* in its own environment.
    std::env::set_var("XWARP_IFACE", "lo");
    std::env::remove_var("XWARP_MTU");
    let mut n = -1;
    // SAFETY: `n` is writable.
    let list = unsafe { ibv_get_device_list(&mut n) };
    assert!(!list.is_null());
    assert_eq!(n, 1);
    // SAFETY: the list has n + 1 entries.
    let (dev, end) = unsafe { (*list, *list.add(1)) };
    assert!(end.is_null());
    // SAFETY: a device from the list.
    let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) };
    assert_eq!(name.to_str().unwrap(), "xwarp_lo");
    // SAFETY: as above.
    let d = unsafe { &*dev };
    assert_eq!(d.node_type, IBV_NODE_RNIC);
    assert_eq!(d.transport_type, IBV_TRANSPORT_IWARP);
    // SAFETY: as above.
    let ctx = unsafe { ibv_open_device(dev) };
    assert!(!ctx.is_null());

    // The 1.1 symbol fills the compat struct only: port_cap_flags2 stays untouched.
    // SAFETY: all-integer struct.
    let mut pa: ibv_port_attr = unsafe { std::mem::zeroed() };
    pa.port_cap_flags2 = 0xbeef;
    // SAFETY: `pa` is larger than the compat struct.
    let r = unsafe { ibv_query_port(ctx, 1, (&mut pa as *mut ibv_port_attr).cast()) };
    assert_eq!(r, 0);
    assert_eq!(pa.port_cap_flags2, 0xbeef);
    assert_eq!(pa.gid_tbl_len, 1);
    assert_eq!(pa.link_layer, IBV_LINK_LAYER_ETHERNET);
    assert_eq!(pa.state, IBV_PORT_ACTIVE, "lo is up");
    // SAFETY: valid pointers; port 2 does not exist.
    assert_eq!(
        unsafe { ibv_query_port(ctx, 2, (&mut pa as *mut ibv_port_attr).cast()) },
        libc::EINVAL
    );
    // The inline wrapper's slot.
    // SAFETY: the context is a verbs_context tail.
    let vctx = unsafe {
        &*ctx
            .cast::<u8>()
            .sub(std::mem::offset_of!(verbs_context, context))
            .cast::<verbs_context>()
    };
    assert_eq!(vctx.sz, std::mem::size_of::<verbs_context>());
    // SAFETY: as above.
    assert_eq!(unsafe { (*ctx).abi_compat }, VERBS_ABI_IS_EXTENDED);
    let slot = vctx.query_port.expect("query_port slot");
    // SAFETY: all-integer struct.
    let mut pb: ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: full-size struct.
    assert_eq!(
        unsafe { slot(ctx, 1, &mut pb, std::mem::size_of::<ibv_port_attr>()) },
        0
    );
    assert_eq!(pb.max_msg_sz, u32::MAX);

    // SAFETY: zeroable.
    let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers.
    unsafe {
        assert_eq!(ibv_query_gid(ctx, 1, 0, &mut gid), 0);
        assert_eq!(ibv_query_gid(ctx, 1, 1, &mut gid), -1);
        let mut ty = 99u32;
        assert_eq!(ibv_query_gid_type(ctx, 1, 0, &mut ty), 0);
        assert_eq!(ty, IBV_GID_TYPE_SYSFS_IB_ROCE_V1);
        assert_eq!(ibv_query_gid_type(ctx, 1, 3, &mut ty), -1);
        // SAFETY: zeroable.
        let mut da: ibv_device_attr = std::mem::zeroed();
        assert_eq!(ibv_query_device(ctx, &mut da), 0);
        assert_eq!(da.node_guid, ibv_get_device_guid(dev));
        assert_eq!(ibv_query_device(ctx, std::ptr::null_mut()), libc::EINVAL);
    }
    // sysfs: ours answered, others read from disk.
    let mut buf = [0 as libc::c_char; 64];
    let dir = d.ibdev_path.as_ptr();
    // SAFETY: NUL-terminated strings, buffer of its length.
    unsafe {
        let n = ibv_read_sysfs_file(dir, c"node_type".as_ptr(), buf.as_mut_ptr(), buf.len());
        assert_eq!(CStr::from_ptr(buf.as_ptr()).to_str().unwrap(), "4: RNIC");
        assert_eq!(n, 7);
        assert_eq!(
            ibv_read_sysfs_file(dir, c"nothing".as_ptr(), buf.as_mut_ptr(), buf.len()),
            -1
        );
        let n = ibv_read_sysfs_file(
            c"/proc/sys/kernel".as_ptr(),
            c"ostype".as_ptr(),
            buf.as_mut_ptr(),
            buf.len(),
        );
        assert_eq!(n, 5);
        assert_eq!(CStr::from_ptr(buf.as_ptr()).to_str().unwrap(), "Linux");
    }
    // SAFETY: our context, closed once; then a pointer that is not a context.
    unsafe {
        assert_eq!(ibv_close_device(ctx), 0);
        assert_eq!(
            ibv_close_device(std::ptr::NonNull::<ibv_context>::dangling().as_ptr()),
            libc::EINVAL
        );
        ibv_free_device_list(list);
    }
    // A bad interface: an empty list, no crash.
    std::env::set_var("XWARP_IFACE", "xwno-such0");
    // SAFETY: `n` writable.
    let list = unsafe { ibv_get_device_list(&mut n) };
    assert_eq!(n, 0);
    // SAFETY: a one-entry list.
    unsafe {
        assert!((*list).is_null());
        ibv_free_device_list(list);
    }
    std::env::remove_var("XWARP_IFACE");
}
