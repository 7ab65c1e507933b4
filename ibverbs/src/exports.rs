//! The exported libibverbs functions: device discovery, exactly what Debian's
//! `ibv_devices` and `ibv_devinfo` import (see `README.md`). Each is a plain Rust
//! `extern "C"` function; the `global_asm!` at the end gives it its C name with the symbol
//! version libibverbs.so.1 defines it at (`.symver`, the nodes in `libxwarp_ibverbs.map`),
//! so the versioned references of the programs (`ibv_open_device@IBVERBS_1.1`) bind to
//! these definitions when the library is preloaded.
//!
//! Errors behave as libibverbs': calls returning `int` give an errno value (or -1 where
//! libibverbs gives -1, with `errno` set), calls returning pointers give NULL with `errno`.
//! Nothing panics across the boundary.

use core::ffi::{c_char, c_int, c_uint, CStr};

use crate::abi::*;
use crate::attr;
use crate::config::DeviceConfig;
use crate::device::{self, XwContext, XwDevice};

use crate::ffi::set_errno;

/// The one line a program's stderr gets when no device can be listed.
fn warn(reason: &str) {
    crate::ffi::warn_line(&format!("{reason}; no xwarp RDMA device listed"));
}

/// `ibv_get_device_list@IBVERBS_1.1`: a NULL-terminated array (free it with
/// `ibv_free_device_list`) of the xwarp device of `XWARP_IFACE`; empty, with one line on
/// stderr saying why, when the variable is unset or bad or the interface does not exist.
/// Stores the count in `*num` when `num` is not NULL.
///
/// # Safety
/// `num` is NULL or writable.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    crate::ffi::guard("ibv_get_device_list", core::ptr::null_mut(), || {
        let devices = DeviceConfig::from_vars(|k| std::env::var(k).ok())
            .and_then(|cfg| device::discover(&cfg))
            .unwrap_or_else(|why| {
                warn(&why);
                Vec::new()
            });
        // SAFETY: calloc with a small count; the result is checked.
        let list =
            unsafe { libc::calloc(devices.len() + 1, core::mem::size_of::<*mut ibv_device>()) }
                .cast::<*mut ibv_device>();
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return core::ptr::null_mut();
        }
        for (i, d) in devices.iter().enumerate() {
            // SAFETY: `list` has devices.len() + 1 slots (the last stays NULL).
            unsafe { *list.add(i) = (&d.dev as *const ibv_device).cast_mut() };
        }
        if !num.is_null() {
            // SAFETY: the caller's pointer, writable per the contract.
            unsafe { *num = devices.len() as c_int };
        }
        list
    })
}

/// `ibv_free_device_list@IBVERBS_1.1`: free a list `ibv_get_device_list` returned (the
/// devices themselves live on).
///
/// # Safety
/// `list` is NULL or from `ibv_get_device_list`, freed once.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    crate::ffi::guard("ibv_free_device_list", (), || {
        // SAFETY: per the contract the pointer came from calloc.
        unsafe { libc::free(list.cast()) };
    })
}

/// `ibv_get_device_name@IBVERBS_1.1`: the device's name (`xwarp_<iface>`); NULL with
/// `EINVAL` for a pointer that is not an xwarp device.
///
/// # Safety
/// `dev` is NULL or a pointer the program got from `ibv_get_device_list`.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    crate::ffi::guard("ibv_get_device_name", core::ptr::null(), || {
        // SAFETY: per the contract.
        match unsafe { XwDevice::from_ptr(dev) } {
            Some(d) => d.dev.name.as_ptr(),
            None => {
                set_errno(libc::EINVAL);
                core::ptr::null()
            }
        }
    })
}

/// `ibv_get_device_guid@IBVERBS_1.1`: the node GUID (network byte order), the EUI-64 of
/// the interface's MAC; 0 for a pointer that is not an xwarp device.
///
/// # Safety
/// As [`ibv_get_device_name`].
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    crate::ffi::guard("ibv_get_device_guid", 0, || {
        // SAFETY: per the contract.
        match unsafe { XwDevice::from_ptr(dev) } {
            Some(d) => attr::node_guid(d.mac),
            None => {
                set_errno(libc::EINVAL);
                0
            }
        }
    })
}

/// `ibv_open_device@IBVERBS_1.1`: a context on the device (no engine is started yet);
/// NULL with `EINVAL` for a pointer that is not an xwarp device, or with the errno of
/// the failed allocation. The engine MTU comes from `XWARP_MTU` as at discovery.
///
/// # Safety
/// As [`ibv_get_device_name`].
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    crate::ffi::guard("ibv_open_device", core::ptr::null_mut(), || {
        // SAFETY: per the contract.
        unsafe { open_device(dev) }
    })
}

/// What `ibv_open_device` does (the crate calls this, never the exported symbol: a
/// `.symver` needs its function defined in the same object file).
///
/// # Safety
/// As [`ibv_get_device_name`].
pub(crate) unsafe fn open_device(dev: *mut ibv_device) -> *mut ibv_context {
    // SAFETY: per the contract.
    let Some(d) = (unsafe { XwDevice::from_ptr(dev) }) else {
        set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    };
    let mtu = DeviceConfig::from_vars(|k| std::env::var(k).ok())
        .map(|c| c.mtu)
        .unwrap_or(crate::config::DEFAULT_ENGINE_MTU);
    match XwContext::open(d, mtu, query_port_slot) {
        Ok(ctx) => ctx,
        Err(e) => {
            set_errno(e.raw_os_error().unwrap_or(libc::ENOMEM));
            core::ptr::null_mut()
        }
    }
}

/// `ibv_close_device@IBVERBS_1.1`: 0, or `EINVAL` for a pointer that is not an open
/// xwarp context.
///
/// # Safety
/// `ctx` is not used after this call if it was an open context (any other pointer gives
/// `EINVAL` without being dereferenced).
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    crate::ffi::guard("ibv_close_device", libc::EIO, || {
        // SAFETY: the program gives the context up with this call (a pointer that is
        // not an open context of ours is only compared, never dereferenced).
        if unsafe { XwContext::close(ctx) } {
            0
        } else {
            libc::EINVAL
        }
    })
}

/// `ibv_query_device@IBVERBS_1.1`: the device attributes ([`attr::device_attr`]); 0, or
/// `EINVAL` for a bad context or NULL `attr`.
///
/// # Safety
/// `ctx` as [`ibv_close_device`]; `attr` NULL or writable for an `ibv_device_attr`.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_query_device(
    ctx: *mut ibv_context,
    out: *mut ibv_device_attr,
) -> c_int {
    crate::ffi::guard("ibv_query_device", libc::EIO, || {
        let Some(c) = XwContext::from_raw(ctx) else {
            return libc::EINVAL;
        };
        if out.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `out` is writable per the contract.
        unsafe { out.write(attr::device_attr(c.device.mac)) };
        0
    })
}

/// Port 1's attributes, written as the first `len` bytes of `out`.
///
/// # Safety
/// `ctx` as [`ibv_close_device`]; `out` NULL or writable for `len` bytes.
unsafe fn query_port_into(ctx: *mut ibv_context, port: u8, out: *mut u8, len: usize) -> c_int {
    let Some(c) = XwContext::from_raw(ctx) else {
        return libc::EINVAL;
    };
    if port != 1 || out.is_null() {
        return libc::EINVAL;
    }
    let facts = match c.device.facts() {
        Ok(f) => f,
        Err(_) => return libc::ENODEV,
    };
    let a = attr::port_attr(&facts, c.engine_mtu);
    let n = len.min(core::mem::size_of::<ibv_port_attr>());
    // SAFETY: `a` is a live ibv_port_attr of at least `n` bytes; `out` is writable for
    // `len >= n` bytes per the contract.
    unsafe { core::ptr::copy_nonoverlapping((&a as *const ibv_port_attr).cast::<u8>(), out, n) };
    0
}

/// `verbs_context.query_port`, which the header-inline `ibv_query_port` calls with the
/// size of the program's `struct ibv_port_attr`.
unsafe extern "C" fn query_port_slot(
    ctx: *mut ibv_context,
    port: u8,
    out: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    crate::ffi::guard("ibv_query_port", libc::EIO, || {
        // SAFETY: the inline wrapper passes the program's struct and its size.
        unsafe { query_port_into(ctx, port, out.cast(), len) }
    })
}

/// `ibv_query_port@IBVERBS_1.1` (reached when a program bypasses the inline wrapper):
/// port 1's attributes ([`attr::port_attr`]) up to, not including, `port_cap_flags2`
/// (the size of the `struct _compat_ibv_port_attr` it is declared with); 0, or `EINVAL`
/// (bad context, port other than 1, NULL `attr`), `ENODEV` (the interface is gone).
///
/// # Safety
/// `ctx` as [`ibv_close_device`]; `out` NULL or writable for a `_compat_ibv_port_attr`.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port: u8,
    out: *mut _compat_ibv_port_attr,
) -> c_int {
    crate::ffi::guard("ibv_query_port", libc::EIO, || {
        let len = core::mem::offset_of!(ibv_port_attr, port_cap_flags2);
        // SAFETY: per the contract.
        unsafe { query_port_into(ctx, port, out.cast(), len) }
    })
}

/// `ibv_query_gid@IBVERBS_1.1`: GID 0 of port 1 (the MAC, then zeros, as siw); 0, or -1
/// with `EINVAL` for anything else.
///
/// # Safety
/// `ctx` as [`ibv_close_device`]; `gid` NULL or writable.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    crate::ffi::guard("ibv_query_gid", -1, || {
        let Some(c) = XwContext::from_raw(ctx) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if port != 1 || index != 0 || gid.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: writable per the contract.
        unsafe { gid.write(attr::gid0(c.device.mac)) };
        0
    })
}

/// `ibv_query_gid_type@IBVERBS_PRIVATE_34`: the type of GID 0 of port 1,
/// `IBV_GID_TYPE_SYSFS_IB_ROCE_V1` (the kernel types iWARP GIDs as IB GIDs); 0, or -1
/// with `EINVAL` for anything else.
///
/// # Safety
/// `ctx` as [`ibv_close_device`]; `ty` NULL or writable.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_query_gid_type(
    ctx: *mut ibv_context,
    port: u8,
    index: c_uint,
    ty: *mut ibv_gid_type_sysfs,
) -> c_int {
    crate::ffi::guard("ibv_query_gid_type", -1, || {
        if XwContext::from_raw(ctx).is_none() || port != 1 || index != 0 || ty.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: writable per the contract.
        unsafe { ty.write(IBV_GID_TYPE_SYSFS_IB_ROCE_V1) };
        0
    })
}

/// What the xwarp device's sysfs directory would hold, for the files programs read.
fn device_file(d: &XwDevice, file: &[u8]) -> Option<String> {
    let guid = || {
        let g = u64::from_be(attr::node_guid(d.mac));
        format!(
            "{:04x}:{:04x}:{:04x}:{:04x}",
            g >> 48,
            (g >> 32) & 0xffff,
            (g >> 16) & 0xffff,
            g & 0xffff
        )
    };
    Some(match file {
        b"node_type" => "4: RNIC".into(),
        b"node_guid" | b"sys_image_guid" => guid(),
        b"fw_ver" => concat!("xwarp ", env!("CARGO_PKG_VERSION")).into(),
        b"board_id" => format!("xwarp AF_XDP engine on {}", d.iface),
        b"hca_type" => "xwarp".into(),
        _ => return None,
    })
}

/// Copy `text` into `buf` (`size` bytes) the way sysfs reads come back: at most `size`
/// bytes, NUL-terminated when there is room; returns the length.
///
/// # Safety
/// `buf` writable for `size` bytes.
unsafe fn fill(buf: *mut c_char, size: usize, text: &[u8]) -> c_int {
    let n = text.len().min(size.saturating_sub(1));
    // SAFETY: `buf` has `size > n` bytes.
    unsafe {
        core::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    n as c_int
}

/// `ibv_read_sysfs_file@IBVERBS_1.0`: read `<dir>/<file>` into `buf` (at most `size`
/// bytes, a trailing newline dropped, NUL-terminated when there is room) and return its
/// length, or -1 with `errno`. For an xwarp device's `ibdev_path`/`dev_path` (which do not
/// exist) the library answers itself: `node_type`, `node_guid`, `sys_image_guid`,
/// `fw_ver`, `board_id`, `hca_type`; other files there are `ENOENT`. Any other directory is
/// read from the file system, as libibverbs does.
///
/// # Safety
/// `dir` and `file` NUL-terminated strings; `buf` writable for `size` bytes.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    crate::ffi::guard("ibv_read_sysfs_file", -1, || {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: NUL-terminated per the contract.
        let (d, f) = unsafe {
            (
                CStr::from_ptr(dir).to_bytes(),
                CStr::from_ptr(file).to_bytes(),
            )
        };
        if let Some(dev) = device::by_sysfs_dir(d) {
            return match device_file(dev, f) {
                // SAFETY: per the contract.
                Some(text) => unsafe { fill(buf, size, text.as_bytes()) },
                None => {
                    set_errno(libc::ENOENT);
                    -1
                }
            };
        }
        let mut path = d.to_vec();
        path.push(b'/');
        path.extend_from_slice(f);
        path.push(0);
        // SAFETY: `path` is NUL-terminated.
        let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return -1;
        }
        // SAFETY: `buf` is writable for `size` bytes; fd is ours and closed once.
        let len = unsafe {
            let len = libc::read(fd, buf.cast(), size);
            let e = *libc::__errno_location();
            libc::close(fd);
            set_errno(e);
            len
        };
        if len < 0 {
            return -1;
        }
        let mut len = len as usize;
        // SAFETY: indices below `len <= size` are inside `buf`.
        unsafe {
            if len > 0 && *buf.add(len - 1) == b'\n' as c_char {
                len -= 1;
                *buf.add(len) = 0;
            } else if len < size {
                *buf.add(len) = 0;
            }
        }
        len as c_int
    })
}

// The C names and symbol versions (see the module docs). Every node is defined in
// libxwarp_ibverbs.map; the Rust functions keep their mangled names, so rustc's own
// export list does not claim the C names unversioned.
core::arch::global_asm!(
    ".symver {read_sysfs}, ibv_read_sysfs_file@@IBVERBS_1.0",
    ".symver {get_list}, ibv_get_device_list@@IBVERBS_1.1",
    ".symver {free_list}, ibv_free_device_list@@IBVERBS_1.1",
    ".symver {get_name}, ibv_get_device_name@@IBVERBS_1.1",
    ".symver {get_guid}, ibv_get_device_guid@@IBVERBS_1.1",
    ".symver {open}, ibv_open_device@@IBVERBS_1.1",
    ".symver {close}, ibv_close_device@@IBVERBS_1.1",
    ".symver {query_device}, ibv_query_device@@IBVERBS_1.1",
    ".symver {query_port}, ibv_query_port@@IBVERBS_1.1",
    ".symver {query_gid}, ibv_query_gid@@IBVERBS_1.1",
    ".symver {query_gid_type}, ibv_query_gid_type@@IBVERBS_PRIVATE_34",
    read_sysfs = sym ibv_read_sysfs_file,
    get_list = sym ibv_get_device_list,
    free_list = sym ibv_free_device_list,
    get_name = sym ibv_get_device_name,
    get_guid = sym ibv_get_device_guid,
    open = sym ibv_open_device,
    close = sym ibv_close_device,
    query_device = sym ibv_query_device,
    query_port = sym ibv_query_port,
    query_gid = sym ibv_query_gid,
    query_gid_type = sym ibv_query_gid_type,
);
