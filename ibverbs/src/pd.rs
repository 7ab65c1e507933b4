//! Protection domains: `ibv_alloc_pd`, `ibv_dealloc_pd`.
//!
//! For ibv-cm: [`create`] makes a PD on a context (what `ibv_alloc_pd` does),
//! [`from_raw`] turns the program's `ibv_pd` pointer into [`XPd`] (`None` for NULL or
//! anything that is not a live PD of ours); [`XPd::pd`] is the `xwarp_verbs`
//! `ProtectionDomain` (registration, QP/SRQ creation).
//!
//! Mapping: one `ibv_pd` = one `xwarp_verbs::ProtectionDomain` (a PD id on the engine).
//! `ibv_dealloc_pd` refuses (`EBUSY`, as the kernel does) while MRs, QPs or SRQs of the
//! PD exist.

use core::ffi::c_int;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use xwarp_verbs::ProtectionDomain;

use crate::abi::*;
use crate::device::XwContext;
use crate::ffi::{guard, set_errno, Registry};

/// Handles of every object kind come from one counter (they only need to differ).
pub(crate) static NEXT_HANDLE: AtomicU32 = AtomicU32::new(1);

/// A PD: the `ibv_pd` the program holds, then xwarp's fields.
#[repr(C)]
pub struct XPd {
    /// What the program sees.
    pub c: ibv_pd,
    /// The engine's protection domain.
    pd: ProtectionDomain,
    /// The context it was made on.
    pub(crate) ctx: &'static XwContext,
    /// MRs, QPs and SRQs of this PD still alive.
    pub(crate) users: AtomicUsize,
}

// SAFETY: the C part is plain data only the program writes after creation (nothing does);
// the Rust part is Send + Sync.
unsafe impl Sync for XPd {}
// SAFETY: as above.
unsafe impl Send for XPd {}

static PDS: Registry = Registry::new();

impl XPd {
    /// The engine's protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The context it was made on.
    pub fn context(&self) -> &'static XwContext {
        self.ctx
    }

    /// The `ibv_pd` pointer the program holds.
    pub fn raw(&self) -> *mut ibv_pd {
        (&self.c as *const ibv_pd).cast_mut()
    }
}

/// The PD behind `p`, if it is a live PD of ours.
pub fn from_raw(p: *mut ibv_pd) -> Option<&'static XPd> {
    if !PDS.contains(p.cast()) {
        return None;
    }
    // SAFETY: registered PDs are live XPd allocations whose first field is the ibv_pd.
    Some(unsafe { &*p.cast::<XPd>() })
}

/// Make a PD on `ctx` (what `ibv_alloc_pd` does); the errno on failure (`EINVAL`: not
/// an open context of ours; `ENODEV`: the engine cannot start).
pub fn create(ctx: *mut ibv_context) -> Result<*mut ibv_pd, c_int> {
    let c = XwContext::from_raw(ctx).ok_or(libc::EINVAL)?;
    let pd = c.verbs()?.alloc_pd();
    let x = Box::new(XPd {
        c: ibv_pd {
            context: ctx,
            handle: NEXT_HANDLE.fetch_add(1, Ordering::Relaxed),
        },
        pd,
        ctx: c,
        users: AtomicUsize::new(0),
    });
    c.objects.fetch_add(1, Ordering::SeqCst);
    let p = Box::into_raw(x);
    PDS.insert(p.cast());
    Ok(p.cast())
}

/// Free a PD (what `ibv_dealloc_pd` does): 0, `EINVAL` (not ours), `EBUSY` (still used).
pub fn destroy(p: *mut ibv_pd) -> c_int {
    let Some(x) = from_raw(p) else {
        return libc::EINVAL;
    };
    if x.users.load(Ordering::SeqCst) > 0 {
        return libc::EBUSY;
    }
    if !PDS.remove(p.cast()) {
        return libc::EINVAL;
    }
    x.ctx.objects.fetch_sub(1, Ordering::SeqCst);
    // SAFETY: the allocation `create` leaked, now out of the registry: freed once.
    drop(unsafe { Box::from_raw(p.cast::<XPd>()) });
    0
}

/// `ibv_alloc_pd@IBVERBS_1.1`: a new PD, or NULL with `errno` (`EINVAL` for a context
/// that is not ours, `ENODEV` when the engine cannot start).
///
/// # Safety
/// `ctx` is any pointer (only ours are dereferenced).
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    guard("ibv_alloc_pd", core::ptr::null_mut(), || {
        match create(ctx) {
            Ok(p) => p,
            Err(e) => {
                set_errno(e);
                core::ptr::null_mut()
            }
        }
    })
}

/// `ibv_dealloc_pd@IBVERBS_1.1`: 0, `EINVAL` (not a live PD of ours), `EBUSY` (MRs, QPs
/// or SRQs of it still exist).
///
/// # Safety
/// `pd` is any pointer; a PD of ours must not be used after a 0 return.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard("ibv_dealloc_pd", libc::EIO, || destroy(pd))
}

core::arch::global_asm!(
    ".symver {alloc}, ibv_alloc_pd@@IBVERBS_1.1",
    ".symver {dealloc}, ibv_dealloc_pd@@IBVERBS_1.1",
    alloc = sym ibv_alloc_pd,
    dealloc = sym ibv_dealloc_pd,
);
