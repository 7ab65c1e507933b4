//! Shared receive queues: `ibv_create_srq`, `ibv_modify_srq`, `ibv_query_srq`,
//! `ibv_destroy_srq`, and the `post_srq_recv` slot of the ops table (the inline
//! `ibv_post_srq_recv`).
//!
//! For ibv-cm: [`from_raw`] gives the [`XSrq`] of a program's `ibv_srq` (for
//! `rdma_create_qp` with `init_attr.srq`); [`XSrq::srq`] is the engine's queue.
//!
//! Mapping: one `ibv_srq` = one `xwarp_verbs::SharedReceiveQueue` of `max_wr` entries.
//! Resizing (`IBV_SRQ_MAX_WR`) is `EOPNOTSUPP`, as siw refuses it (docs/siw.md §4.10); the limit event
//! (`IBV_SRQ_LIMIT`) is `EOPNOTSUPP` too, since the engine does not report the SRQ's fill
//! level (one warning line). Posting checks as `ibv_post_recv` does (SGE count against
//! `max_sge`, chains bounded by `max_wr`).

use core::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};

use xwarp_verbs::{SharedReceiveQueue, MAX_SGE};

use crate::abi::*;
use crate::ffi::{guard, io_errno, set_errno, unsupported, Registry};
use crate::pd::{self, XPd, NEXT_HANDLE};

/// An SRQ.
#[repr(C)]
pub struct XSrq {
    /// What the program sees.
    c: ibv_srq,
    srq: SharedReceiveQueue,
    pd: &'static XPd,
    max_wr: u32,
    max_sge: u32,
    /// QPs using it.
    pub(crate) users: AtomicUsize,
}

// SAFETY: the C part is written at creation only; the rest is Sync or atomic.
unsafe impl Sync for XSrq {}
// SAFETY: as above.
unsafe impl Send for XSrq {}

static SRQS: Registry = Registry::new();

impl XSrq {
    /// The engine's shared receive queue.
    pub fn srq(&self) -> &SharedReceiveQueue {
        &self.srq
    }

    /// The `ibv_srq` pointer the program holds.
    pub fn raw(&self) -> *mut ibv_srq {
        (&self.c as *const ibv_srq).cast_mut()
    }
}

/// The SRQ behind `p`, if it is a live SRQ of ours.
pub fn from_raw(p: *mut ibv_srq) -> Option<&'static XSrq> {
    if !SRQS.contains(p.cast()) {
        return None;
    }
    // SAFETY: registered SRQs are live XSrq allocations (C struct first).
    Some(unsafe { &*p.cast::<XSrq>() })
}

/// Make an SRQ (what `ibv_create_srq` does): `max_wr` 1..=INT_MAX, `max_sge` at most the
/// device's; `attr.attr` gets the real values.
///
/// # Safety
/// `attr` NULL or the program's readable and writable attributes.
pub unsafe fn create(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> Result<*mut ibv_srq, c_int> {
    let p = pd::from_raw(pd).ok_or(libc::EINVAL)?;
    if attr.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: non-NULL, the program's attributes.
    let a = unsafe { &mut *attr };
    let (max_wr, max_sge) = (a.attr.max_wr, a.attr.max_sge);
    if max_wr == 0 || max_wr > c_int::MAX as u32 || max_sge as usize > MAX_SGE {
        return Err(libc::EINVAL);
    }
    let srq = p
        .pd()
        .create_srq(max_wr as usize)
        .map_err(|e| io_errno(&e, libc::ENOMEM))?;
    a.attr.srq_limit = 0;
    // SAFETY: ibv_srq's pthread fields are initialised below; zero is valid for the rest.
    let mut c: ibv_srq = unsafe { core::mem::zeroed() };
    c.context = p.ctx.raw();
    c.srq_context = a.srq_context;
    c.pd = pd;
    c.handle = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
    let x = Box::into_raw(Box::new(XSrq {
        c,
        srq,
        pd: p,
        max_wr,
        max_sge,
        users: AtomicUsize::new(0),
    }));
    // SAFETY: `x` is live; the pthread objects are initialised once, in place.
    unsafe {
        libc::pthread_mutex_init(&mut (*x).c.mutex, core::ptr::null());
        libc::pthread_cond_init(&mut (*x).c.cond, core::ptr::null());
    }
    p.users.fetch_add(1, Ordering::SeqCst);
    p.ctx.objects.fetch_add(1, Ordering::SeqCst);
    SRQS.insert(x.cast());
    Ok(x.cast())
}

/// Free an SRQ: 0, `EINVAL` (not ours), `EBUSY` (QPs still use it).
pub fn destroy(p: *mut ibv_srq) -> c_int {
    let Some(x) = from_raw(p) else {
        return libc::EINVAL;
    };
    if x.users.load(Ordering::SeqCst) > 0 {
        return libc::EBUSY;
    }
    if !SRQS.remove(p.cast()) {
        return libc::EINVAL;
    }
    x.pd.users.fetch_sub(1, Ordering::SeqCst);
    x.pd.ctx.objects.fetch_sub(1, Ordering::SeqCst);
    // SAFETY: out of the registry: the allocation `create` leaked, freed once.
    unsafe {
        let s = p.cast::<XSrq>();
        libc::pthread_cond_destroy(&mut (*s).c.cond);
        libc::pthread_mutex_destroy(&mut (*s).c.mutex);
        drop(Box::from_raw(s));
    }
    0
}

/// `ibv_context_ops.post_srq_recv` (the inline `ibv_post_srq_recv`).
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    crate::ffi::guard_data_path("ibv_post_srq_recv", libc::EIO, || {
        let Some(x) = from_raw(srq) else {
            if !bad.is_null() {
                // SAFETY: writable per the verbs contract.
                unsafe { *bad = wr };
            }
            return libc::EINVAL;
        };
        if !bad.is_null() {
            // SAFETY: as above.
            unsafe { *bad = core::ptr::null_mut() };
        }
        let mut w = wr;
        let mut n = 0u32;
        while !w.is_null() {
            // SAFETY: a WR of the program's chain.
            let r = unsafe { &*w };
            let res = if n >= x.max_wr {
                Err(libc::ENOMEM)
            } else {
                // SAFETY: the WR's SGE list is the program's.
                unsafe { crate::qp::sges(r.sg_list, r.num_sge, x.max_sge) }.and_then(|sgl| {
                    x.srq
                        .post_recv(r.wr_id, sgl.as_slice())
                        .map_err(crate::qp::post_errno)
                })
            };
            if let Err(e) = res {
                if !bad.is_null() {
                    // SAFETY: as above.
                    unsafe { *bad = w };
                }
                return e;
            }
            n += 1;
            w = r.next;
        }
        0
    })
}

/// `ibv_create_srq@IBVERBS_1.1`: NULL with `errno` on failure (see [`create`]).
///
/// # Safety
/// `pd` any pointer; `attr` NULL or the program's attributes.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard("ibv_create_srq", core::ptr::null_mut(), || {
        // SAFETY: per the contract.
        unsafe { create(pd, attr) }.unwrap_or_else(|e| {
            set_errno(e);
            core::ptr::null_mut()
        })
    })
}

/// `ibv_modify_srq@IBVERBS_1.1`: `EOPNOTSUPP` for `IBV_SRQ_MAX_WR` (as siw) and
/// `IBV_SRQ_LIMIT` (no limit events); 0 for an empty mask; `EINVAL` for a bad SRQ.
///
/// # Safety
/// `srq` any pointer; `attr` NULL or readable.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    guard("ibv_modify_srq", libc::EIO, || {
        if from_raw(srq).is_none() || attr.is_null() {
            return libc::EINVAL;
        }
        let mask = mask as u32;
        if mask & IBV_SRQ_MAX_WR != 0 {
            unsupported(
                "ibv_modify_srq(IBV_SRQ_MAX_WR)",
                "SRQs are not resized (as siw)",
            );
            return libc::EOPNOTSUPP;
        }
        if mask & IBV_SRQ_LIMIT != 0 {
            unsupported(
                "ibv_modify_srq(IBV_SRQ_LIMIT)",
                "the engine does not report an SRQ's fill level, so no limit event",
            );
            return libc::EOPNOTSUPP;
        }
        if mask != 0 {
            return libc::EINVAL;
        }
        0
    })
}

/// `ibv_query_srq@IBVERBS_1.1`: `max_wr`, `max_sge` as created, `srq_limit` 0; 0 or
/// `EINVAL`.
///
/// # Safety
/// `attr` writable.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard("ibv_query_srq", libc::EIO, || {
        let Some(x) = from_raw(srq) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: writable per the contract.
        unsafe {
            attr.write(ibv_srq_attr {
                max_wr: x.max_wr,
                max_sge: x.max_sge,
                srq_limit: 0,
            })
        };
        0
    })
}

/// `ibv_destroy_srq@IBVERBS_1.1`: see [`destroy`].
///
/// # Safety
/// `srq` any pointer; ours is not used after a 0 return.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard("ibv_destroy_srq", libc::EIO, || destroy(srq))
}

core::arch::global_asm!(
    ".symver {create}, ibv_create_srq@@IBVERBS_1.1",
    ".symver {modify}, ibv_modify_srq@@IBVERBS_1.1",
    ".symver {query}, ibv_query_srq@@IBVERBS_1.1",
    ".symver {destroy}, ibv_destroy_srq@@IBVERBS_1.1",
    create = sym ibv_create_srq,
    modify = sym ibv_modify_srq,
    query = sym ibv_query_srq,
    destroy = sym ibv_destroy_srq,
);
