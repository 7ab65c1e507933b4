//! Memory regions on any application memory: `ibv_reg_mr`, `ibv_reg_mr_iova2`,
//! `ibv_dereg_mr`.
//!
//! For ibv-cm (`rdma_reg_msgs` etc. are header inlines over `ibv_reg_mr`, so it needs
//! nothing here beyond [`from_raw`]).
//!
//! Mapping: one `ibv_mr` = one `xwarp_verbs::MemoryRegion` made by
//! `ProtectionDomain::register_raw` (the program's heap, stack or mmap memory in place;
//! iova = the address, lkey = rkey = the STag). `ibv_dereg_mr` returns once the engine let
//! go of the memory (the STag revoked first, placement in flight finished); it never
//! fails with `EBUSY`: a stuck engine makes it wait, with a warning line per
//! `xwarp_verbs::ENGINE_WAIT` ([`destroy`]).
//!
//! Checks, as the kernel's `ib_check_mr_access` and `ib_uverbs_reg_mr` make them for
//! siw (docs/siw.md §4.10): remote write (or remote atomic) needs local write (`EINVAL`); unknown flag bits
//! are `EINVAL`; `IBV_ACCESS_ON_DEMAND` is `EOPNOTSUPP` (siw has no ODP); length 0 is
//! `EINVAL` (siw); an address range that is not mapped, or not writable when the access
//! lets anyone write it, is `EFAULT` (the kernel's page pinning fails the same way; read
//! here from `/proc/self/maps`, since the engine will touch the memory without the
//! kernel). The optional flags (`IBV_ACCESS_RELAXED_ORDERING` and the rest of the
//! optional range) are accepted and ignored. `ibv_reg_mr_iova2` with an iova other than
//! the address is `EOPNOTSUPP` (the engine's tagged offsets are virtual addresses).

use core::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use xwarp_verbs::{Access, MemoryRegion};

use crate::abi::*;
use crate::ffi::{guard, io_errno, set_errno, unsupported, Registry};
use crate::pd::{self, NEXT_HANDLE};

/// An MR: the `ibv_mr` the program reads (`lkey`, `rkey`, `addr`, `length`), then the
/// region (taken out by deregistration).
#[repr(C)]
pub struct XMr {
    /// What the program sees.
    pub c: ibv_mr,
    region: Mutex<Option<MemoryRegion>>,
    pd: &'static pd::XPd,
}

// SAFETY: the C part is written once at creation; the region is behind a Mutex.
unsafe impl Sync for XMr {}
// SAFETY: as above.
unsafe impl Send for XMr {}

static MRS: Registry = Registry::new();

/// The MR behind `p`, if it is a live MR of ours.
pub fn from_raw(p: *mut ibv_mr) -> Option<&'static XMr> {
    if !MRS.contains(p.cast()) {
        return None;
    }
    // SAFETY: registered MRs are live XMr allocations whose first field is the ibv_mr.
    Some(unsafe { &*p.cast::<XMr>() })
}

/// Every access bit the kernel's `IB_ACCESS_SUPPORTED` knows (up to `IBV_ACCESS_HUGETLB`),
/// without the optional range.
const KNOWN_ACCESS: c_uint = (IBV_ACCESS_HUGETLB << 1) - 1;
/// `IBV_ACCESS_OPTIONAL_RANGE`: bits 20..=29, which a device may ignore.
const OPTIONAL_ACCESS: c_uint = (((1 << 29) << 1) - 1) & !((1 << 20) - 1);

/// The engine's access rights for verbs access flags, or the errno (see the module docs).
pub(crate) fn access_from_flags(flags: c_uint) -> Result<Access, c_int> {
    let flags_known = flags & !OPTIONAL_ACCESS;
    if flags_known & !KNOWN_ACCESS != 0 {
        return Err(libc::EINVAL);
    }
    if flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
        && flags & IBV_ACCESS_LOCAL_WRITE == 0
    {
        return Err(libc::EINVAL);
    }
    if flags & IBV_ACCESS_ON_DEMAND != 0 {
        unsupported("ibv_reg_mr(IBV_ACCESS_ON_DEMAND)", "no on-demand paging");
        return Err(libc::EOPNOTSUPP);
    }
    let mut a = Access::NONE;
    if flags & IBV_ACCESS_LOCAL_WRITE != 0 {
        a = a | Access::LOCAL_WRITE;
    }
    if flags & IBV_ACCESS_REMOTE_WRITE != 0 {
        a = a | Access::REMOTE_WRITE;
    }
    if flags & IBV_ACCESS_REMOTE_READ != 0 {
        a = a | Access::REMOTE_READ;
    }
    Ok(a)
}

/// Whether `[addr, addr+len)` is mapped readable (and writable with `write`) in this
/// process, by `/proc/self/maps`; `false` on any doubt.
fn mapped(addr: usize, len: usize, write: bool) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    let mut at = addr;
    // The lines are sorted by address; walk the ones covering [at, end).
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        else {
            continue;
        };
        if hi <= at {
            continue;
        }
        if lo > at {
            return false;
        }
        let p = perms.as_bytes();
        if p.first() != Some(&b'r') || (write && p.get(1) != Some(&b'w')) {
            return false;
        }
        at = hi;
        if at >= end {
            return true;
        }
    }
    false
}

/// Register `[addr, addr+len)` in `pd` (what `ibv_reg_mr_iova2` does); the errno on
/// failure (see the module docs).
pub fn create(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    flags: c_uint,
) -> Result<*mut ibv_mr, c_int> {
    let x = pd::from_raw(pd).ok_or(libc::EINVAL)?;
    let access = access_from_flags(flags)?;
    if addr.is_null() || len == 0 {
        return Err(libc::EINVAL);
    }
    if iova != addr as u64 {
        unsupported(
            "ibv_reg_mr_iova2 (iova != addr)",
            "the engine addresses registered memory by its virtual address",
        );
        return Err(libc::EOPNOTSUPP);
    }
    let writable = flags & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) != 0;
    if !mapped(addr as usize, len, writable) {
        return Err(libc::EFAULT);
    }
    // SAFETY: the range is mapped readable (writable if anyone may write it) now; the
    // program keeps it valid until ibv_dereg_mr returned, as verbs require of it (the
    // same contract ibv_reg_mr has with the kernel's page pinning).
    let region = unsafe { x.pd().register_raw(addr.cast(), len, access) }
        .map_err(|e| io_errno(&e, libc::EINVAL))?;
    let stag = region.lkey().0;
    let m = Box::new(XMr {
        c: ibv_mr {
            context: x.ctx.raw(),
            pd,
            addr,
            length: len,
            handle: NEXT_HANDLE.fetch_add(1, Ordering::Relaxed),
            lkey: stag,
            rkey: stag,
        },
        region: Mutex::new(Some(region)),
        pd: x,
    });
    x.users.fetch_add(1, Ordering::SeqCst);
    let p = Box::into_raw(m);
    MRS.insert(p.cast());
    Ok(p.cast())
}

/// Deregister (what `ibv_dereg_mr` does): 0 once the engine let go of the memory, or
/// `EINVAL` (not ours). Never `EBUSY`.
///
/// The first `MemoryRegion::dereg` sends the deregistration: the engine takes the STag
/// out of its table (a peer's Write or Read to it from then on gets the invalid-STag
/// Terminate, RFC 5040) and its placement references die with the registration; the
/// call returns once the last one is gone. Placement happens only on the engine thread,
/// through those references, so after that no byte of the region is touched again. If
/// the engine does not answer within `xwarp_verbs::ENGINE_WAIT` (its thread stuck), this
/// keeps waiting (one warning line per period) rather than return an error: rping and
/// perftest ignore `ibv_dereg_mr`'s result and `free()` the buffer at once, so an early
/// return would let a late placement corrupt their heap.
pub fn destroy(p: *mut ibv_mr) -> c_int {
    let Some(m) = from_raw(p) else {
        return libc::EINVAL;
    };
    let Some(mut region) = m.region.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return libc::EINVAL;
    };
    // The deregistration is sent once (by the first dereg); each further round only
    // waits again.
    while let Err(e) = region.dereg() {
        crate::ffi::warn_line(&format!(
            "ibv_dereg_mr: the engine has not released the region at {:#x} (+{}) after \
             {:?}; still waiting (the memory must stay valid until it does)",
            m.c.addr as usize,
            m.c.length,
            xwarp_verbs::ENGINE_WAIT
        ));
        region = e.into_region();
    }
    if !MRS.remove(p.cast()) {
        return libc::EINVAL;
    }
    m.pd.users.fetch_sub(1, Ordering::SeqCst);
    // SAFETY: the allocation `create` leaked, out of the registry now: freed once.
    drop(unsafe { Box::from_raw(p.cast::<XMr>()) });
    0
}

fn reg(pd: *mut ibv_pd, addr: *mut c_void, len: usize, iova: u64, flags: c_uint) -> *mut ibv_mr {
    match create(pd, addr, len, iova, flags) {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            core::ptr::null_mut()
        }
    }
}

/// `ibv_reg_mr@IBVERBS_1.1`: register `length` bytes at `addr` in place (iova = addr);
/// NULL with `errno` on failure (see the module docs).
///
/// # Safety
/// `pd` any pointer; the memory stays valid until `ibv_dereg_mr` returned 0.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    guard("ibv_reg_mr", core::ptr::null_mut(), || {
        reg(pd, addr, length, addr as u64, access as c_uint)
    })
}

/// `ibv_reg_mr_iova2@IBVERBS_1.8` (what the `ibv_reg_mr` macro calls with optional access
/// flags, e.g. perftest's relaxed ordering): as [`ibv_reg_mr`]; `iova` must be `addr`.
///
/// # Safety
/// As [`ibv_reg_mr`].
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    guard("ibv_reg_mr_iova2", core::ptr::null_mut(), || {
        reg(pd, addr, length, iova, access)
    })
}

/// `ibv_dereg_mr@IBVERBS_1.1`: 0 once the engine no longer touches the memory; `EINVAL`
/// (not a live MR of ours); see [`destroy`].
///
/// # Safety
/// `mr` any pointer; a MR of ours must not be used after a 0 return.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard("ibv_dereg_mr", libc::EIO, || destroy(mr))
}

core::arch::global_asm!(
    ".symver {reg}, ibv_reg_mr@@IBVERBS_1.1",
    ".symver {iova2}, ibv_reg_mr_iova2@@IBVERBS_1.8",
    ".symver {dereg}, ibv_dereg_mr@@IBVERBS_1.1",
    reg = sym ibv_reg_mr,
    iova2 = sym ibv_reg_mr_iova2,
    dereg = sym ibv_dereg_mr,
);

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's `ib_check_mr_access` (siw's registration path): remote write needs
    /// local write, unknown bits fail, optional bits are ignored.
    #[test]
    fn access_flags_as_ib_check_mr_access() {
        assert_eq!(access_from_flags(0), Ok(Access::NONE));
        assert_eq!(
            access_from_flags(IBV_ACCESS_REMOTE_WRITE),
            Err(libc::EINVAL)
        );
        assert_eq!(
            access_from_flags(IBV_ACCESS_REMOTE_ATOMIC),
            Err(libc::EINVAL)
        );
        assert_eq!(access_from_flags(1 << 15), Err(libc::EINVAL));
        assert_eq!(
            access_from_flags(IBV_ACCESS_ON_DEMAND),
            Err(libc::EOPNOTSUPP)
        );
        let all = access_from_flags(
            IBV_ACCESS_LOCAL_WRITE
                | IBV_ACCESS_REMOTE_WRITE
                | IBV_ACCESS_REMOTE_READ
                | IBV_ACCESS_RELAXED_ORDERING,
        )
        .unwrap();
        assert_eq!(
            all,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ
        );
    }

    #[test]
    fn mapped_ranges_from_proc_maps() {
        let v = vec![0u8; 10000];
        assert!(mapped(v.as_ptr() as usize, v.len(), true));
        assert!(!mapped(8, 16, false), "page 0 is never mapped");
        let ro = c"read-only".as_ptr() as usize;
        assert!(mapped(ro, 4, false));
        assert!(
            !mapped(ro, 4, true),
            "string literals are in a read-only mapping"
        );
    }
}
