//! Completion channels and completion queues: `ibv_create_comp_channel`,
//! `ibv_destroy_comp_channel`, `ibv_create_cq`, `ibv_resize_cq`, `ibv_destroy_cq`,
//! `ibv_get_cq_event`, `ibv_ack_cq_events`, and the `poll_cq`/`req_notify_cq` slots of
//! the context's ops table (the header-inline `ibv_poll_cq`/`ibv_req_notify_cq`).
//!
//! For ibv-cm: [`create`] makes a CQ (what `ibv_create_cq` does), [`from_raw`] turns the
//! program's `ibv_cq` pointer into [`XCq`], whose [`XCq::cq`] is the
//! `xwarp_verbs::CompletionQueue` a `QpInitAttr` takes; [`channel_from_raw`] likewise for
//! a completion channel.
//!
//! Mapping: one `ibv_cq` = one `xwarp_verbs::CompletionQueue` (its queue grows as needed,
//! so `cqe` is only recorded and a CQ never overflows). A completion channel's `fd` is an
//! epoll instance holding the eventfd of every CQ attached to it: it is readable (poll,
//! epoll, select) exactly when an armed CQ's notification fired, with no thread between
//! the engine and the program. `ibv_get_cq_event` waits on it (or returns `EAGAIN` at
//! once when the program set `O_NONBLOCK` on the fd), consumes that CQ's notification and
//! counts the event; `ibv_destroy_cq` waits until every event it returned was
//! acknowledged, as rdma-core's does (a program that never acks blocks there, as it
//! would on rdma-core; docs/siw.md §4.10).

use core::cell::UnsafeCell;
use core::ffi::{c_int, c_void};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use xwarp_verbs::{CompletionQueue, CompletionStatus, WcOpcode, WorkCompletion};

use crate::abi::*;
use crate::device::XwContext;
use crate::ffi::{errno, guard, set_errno, wait_readable_cancellable, Attempt, Registry};
use crate::pd::NEXT_HANDLE;

/// A completion channel.
#[repr(C)]
pub struct XChannel {
    /// What the program sees (`fd` is the epoll instance; `refcnt` changes as CQs
    /// attach, hence the cell).
    c: UnsafeCell<ibv_comp_channel>,
    fd: c_int,
    ctx: &'static XwContext,
    /// CQs attached.
    cqs: AtomicUsize,
}

// SAFETY: the C part is written at creation, then only `refcnt`, by atomic adds
// (`add_refcnt`); the rest is atomics.
unsafe impl Sync for XChannel {}
// SAFETY: as above.
unsafe impl Send for XChannel {}

/// A completion queue.
#[repr(C)]
pub struct XCq {
    /// What the program sees (`cqe` changes on resize, hence the cell).
    c: UnsafeCell<ibv_cq>,
    cq: CompletionQueue,
    ctx: &'static XwContext,
    channel: Option<&'static XChannel>,
    /// (events returned by `ibv_get_cq_event`, events acknowledged).
    events: Mutex<(u64, u64)>,
    acked: Condvar,
    /// QPs using the CQ.
    pub(crate) users: AtomicUsize,
}

// SAFETY: the C part is written at creation; afterwards only `cqe` (resize) and
// `comp_events_completed` (ack) change, each by an atomic store through
// `AtomicI32`/`AtomicU32::from_ptr`; the rest is synchronised.
unsafe impl Sync for XCq {}
// SAFETY: as above.
unsafe impl Send for XCq {}

static CHANNELS: Registry = Registry::new();
static CQS: Registry = Registry::new();

impl XChannel {
    /// The `ibv_comp_channel` pointer the program holds.
    pub fn raw(&self) -> *mut ibv_comp_channel {
        self.c.get()
    }

    fn add_refcnt(&self, d: c_int) {
        // SAFETY: `refcnt` is an int of our live allocation, aligned for AtomicI32; CQs
        // made and destroyed on several threads change it, always through this atomic
        // add (the program only reads it).
        unsafe {
            let f = core::ptr::addr_of_mut!((*self.c.get()).refcnt);
            core::sync::atomic::AtomicI32::from_ptr(f).fetch_add(d, Ordering::SeqCst);
        }
    }
}

impl XCq {
    /// The `ibv_cq` pointer the program holds.
    pub fn raw(&self) -> *mut ibv_cq {
        self.c.get()
    }

    /// The engine's completion queue.
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// The context it was made on.
    pub fn context(&self) -> &'static XwContext {
        self.ctx
    }
}

/// The channel behind `p`, if it is a live channel of ours.
pub fn channel_from_raw(p: *mut ibv_comp_channel) -> Option<&'static XChannel> {
    if !CHANNELS.contains(p.cast()) {
        return None;
    }
    // SAFETY: registered channels are live XChannel allocations (C struct first).
    Some(unsafe { &*p.cast::<XChannel>() })
}

/// The CQ behind `p`, if it is a live CQ of ours.
pub fn from_raw(p: *mut ibv_cq) -> Option<&'static XCq> {
    if !CQS.contains(p.cast()) {
        return None;
    }
    // SAFETY: registered CQs are live XCq allocations (C struct first).
    Some(unsafe { &*p.cast::<XCq>() })
}

/// Make a completion channel on `ctx`.
pub fn create_channel(ctx: *mut ibv_context) -> Result<*mut ibv_comp_channel, c_int> {
    let c = XwContext::from_raw(ctx).ok_or(libc::EINVAL)?;
    // SAFETY: epoll_create1 with a valid flag.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(errno());
    }
    let x = Box::new(XChannel {
        c: UnsafeCell::new(ibv_comp_channel {
            context: ctx,
            fd,
            refcnt: 0,
        }),
        fd,
        ctx: c,
        cqs: AtomicUsize::new(0),
    });
    c.objects.fetch_add(1, Ordering::SeqCst);
    let p = Box::into_raw(x);
    CHANNELS.insert(p.cast());
    Ok(p.cast())
}

/// Free a channel: 0, `EINVAL` (not ours), `EBUSY` (CQs still attached, as rdma-core).
pub fn destroy_channel(p: *mut ibv_comp_channel) -> c_int {
    let Some(x) = channel_from_raw(p) else {
        return libc::EINVAL;
    };
    if x.cqs.load(Ordering::SeqCst) > 0 {
        return libc::EBUSY;
    }
    if !CHANNELS.remove(p.cast()) {
        return libc::EINVAL;
    }
    x.ctx.objects.fetch_sub(1, Ordering::SeqCst);
    // SAFETY: our epoll fd, closed once; the allocation `create_channel` leaked.
    unsafe {
        libc::close(x.fd);
        drop(Box::from_raw(p.cast::<XChannel>()));
    }
    0
}

/// Make a CQ (what `ibv_create_cq` does): `cqe` 1..=INT_MAX, `channel` NULL or a channel
/// of the same context, `comp_vector` 0 (the device has one); else `EINVAL`.
pub fn create(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut ibv_cq, c_int> {
    let c = XwContext::from_raw(ctx).ok_or(libc::EINVAL)?;
    if cqe < 1 || comp_vector != 0 {
        return Err(libc::EINVAL);
    }
    let ch = if channel.is_null() {
        None
    } else {
        let ch = channel_from_raw(channel).ok_or(libc::EINVAL)?;
        if !core::ptr::eq(ch.ctx, c) {
            return Err(libc::EINVAL);
        }
        Some(ch)
    };
    let cq = c
        .verbs()?
        .create_cq(cqe as usize)
        .map_err(|e| crate::ffi::io_errno(&e, libc::ENOMEM))?;
    // SAFETY: ibv_cq's pthread fields are initialised below; zero is valid for the rest.
    let mut cc: ibv_cq = unsafe { core::mem::zeroed() };
    cc.context = ctx;
    cc.channel = channel;
    cc.cq_context = cq_context;
    cc.handle = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
    cc.cqe = cqe;
    let p = Box::into_raw(Box::new(XCq {
        c: UnsafeCell::new(cc),
        cq,
        ctx: c,
        channel: ch,
        events: Mutex::new((0, 0)),
        acked: Condvar::new(),
        users: AtomicUsize::new(0),
    }));
    // SAFETY: `p` is live; the mutex and cond are initialised once, in place (programs
    // never use them, but libibverbs initialises them too).
    unsafe {
        let c = (*p).c.get();
        libc::pthread_mutex_init(&mut (*c).mutex, core::ptr::null());
        libc::pthread_cond_init(&mut (*c).cond, core::ptr::null());
    }
    if let Some(ch) = ch {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: p as u64,
        };
        // SAFETY: `p` is live; both fds are ours.
        let r =
            unsafe { libc::epoll_ctl(ch.fd, libc::EPOLL_CTL_ADD, (*p).cq.as_raw_fd(), &mut ev) };
        if r != 0 {
            let e = errno();
            // SAFETY: the allocation just made, never handed out.
            drop(unsafe { Box::from_raw(p) });
            return Err(e);
        }
        ch.cqs.fetch_add(1, Ordering::SeqCst);
        ch.add_refcnt(1);
    }
    c.objects.fetch_add(1, Ordering::SeqCst);
    CQS.insert(p.cast());
    Ok(p.cast())
}

/// Free a CQ: waits until every event `ibv_get_cq_event` returned for it was acked; 0,
/// `EINVAL` (not ours), `EBUSY` (QPs still use it, as the kernel refuses).
pub fn destroy(p: *mut ibv_cq) -> c_int {
    let Some(x) = from_raw(p) else {
        return libc::EINVAL;
    };
    if x.users.load(Ordering::SeqCst) > 0 {
        return libc::EBUSY;
    }
    {
        let mut ev = x.events.lock().unwrap_or_else(|e| e.into_inner());
        while ev.0 != ev.1 {
            ev = x.acked.wait(ev).unwrap_or_else(|e| e.into_inner());
        }
    }
    if !CQS.remove(p.cast()) {
        return libc::EINVAL;
    }
    if let Some(ch) = x.channel {
        // SAFETY: both fds are ours; the CQ's eventfd is still open (the CQ lives).
        unsafe {
            libc::epoll_ctl(
                ch.fd,
                libc::EPOLL_CTL_DEL,
                x.cq.as_raw_fd(),
                core::ptr::null_mut(),
            );
        }
        ch.add_refcnt(-1);
        ch.cqs.fetch_sub(1, Ordering::SeqCst);
    }
    x.ctx.objects.fetch_sub(1, Ordering::SeqCst);
    // SAFETY: out of the registry; the allocation `create` leaked, freed once, after the
    // pthread objects it initialised.
    unsafe {
        let p = p.cast::<XCq>();
        let c = (*p).c.get();
        libc::pthread_cond_destroy(&mut (*c).cond);
        libc::pthread_mutex_destroy(&mut (*c).mutex);
        drop(Box::from_raw(p));
    }
    0
}

/// `ibv_wc_status` of an engine completion status.
pub(crate) fn wc_status(s: CompletionStatus) -> u32 {
    match s {
        CompletionStatus::Success => IBV_WC_SUCCESS,
        CompletionStatus::LocalLengthError => IBV_WC_LOC_LEN_ERR,
        CompletionStatus::LocalProtectionError => IBV_WC_LOC_PROT_ERR,
        CompletionStatus::LocalQpOperationError => IBV_WC_LOC_QP_OP_ERR,
        CompletionStatus::RemoteAccessError => IBV_WC_REM_ACCESS_ERR,
        CompletionStatus::RemoteOperationError => IBV_WC_REM_OP_ERR,
        CompletionStatus::WrFlushError => IBV_WC_WR_FLUSH_ERR,
    }
}

/// The `ibv_wc` of an engine completion (every field set; UD-only fields 0).
pub(crate) fn fill_wc(wc: &WorkCompletion) -> ibv_wc {
    let (imm, flags) = match wc.invalidated_rkey {
        Some(s) => (s.0, IBV_WC_WITH_INV),
        None => (0, 0),
    };
    ibv_wc {
        wr_id: wc.wr_id,
        status: wc_status(wc.status),
        opcode: match wc.opcode {
            WcOpcode::Send => IBV_WC_SEND,
            WcOpcode::Write => IBV_WC_RDMA_WRITE,
            WcOpcode::Read => IBV_WC_RDMA_READ,
            WcOpcode::LocalInvalidate => IBV_WC_LOCAL_INV,
            WcOpcode::Recv => IBV_WC_RECV,
        },
        vendor_err: 0,
        byte_len: wc.byte_len,
        imm: ibv_wc_imm {
            invalidated_rkey: imm,
        },
        qp_num: wc.qp_num,
        src_qp: 0,
        wc_flags: flags,
        pkey_index: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    }
}

/// `ibv_context_ops.poll_cq` (the inline `ibv_poll_cq`): up to `n` completions into `wc`;
/// the count, or -1 for a CQ that is not ours or a bad argument.
///
/// # Safety
/// `wc` writable for `n` entries.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    crate::ffi::guard_data_path("ibv_poll_cq", -1, || {
        let Some(x) = from_raw(cq) else {
            return -1;
        };
        if n < 0 || (n > 0 && wc.is_null()) {
            return -1;
        }
        let mut got = 0;
        while got < n {
            let Some(c) = x.cq.poll_one() else {
                break;
            };
            if c.status != CompletionStatus::Success && c.status != CompletionStatus::WrFlushError {
                crate::qp::note_error(x, c.qp_num, c.status);
            }
            // SAFETY: `got < n` entries of the caller's array.
            unsafe { wc.add(got as usize).write(fill_wc(&c)) };
            got += 1;
        }
        if got == 0 && n > 0 && yield_on_empty_poll() {
            // The engine thread that produces completions may share this core (2 engines
            // and 2 busy-polling programs on 2 cores): give it the core rather than spin
            // through the time slice, as `CompletionQueue::next_polling` does.
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
        got
    })
}

/// Whether an empty `ibv_poll_cq` yields the core (`XWARP_POLL_YIELD`, default 1; 0 turns
/// it off for machines where every engine and program has a core of its own).
fn yield_on_empty_poll() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("XWARP_POLL_YIELD").map_or(true, |v| v.trim() != "0"))
}

/// `ibv_context_ops.req_notify_cq` (the inline `ibv_req_notify_cq`): arm the CQ's
/// notification (for any completion, or with `solicited_only` for the next solicited
/// one or error); 0, or `EINVAL` for a CQ that is not ours.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    crate::ffi::guard_data_path("ibv_req_notify_cq", libc::EIO, || {
        let Some(x) = from_raw(cq) else {
            return libc::EINVAL;
        };
        x.cq.req_notify(solicited_only != 0);
        0
    })
}

/// Look for the next CQ event of `ch` without blocking: the CQ, or `Err(EAGAIN)` when no
/// armed CQ of the channel fired (the caller waits on the fd unless the program set
/// `O_NONBLOCK`), or another errno.
fn try_get_event(ch: &XChannel) -> Result<&'static XCq, c_int> {
    loop {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: one event slot; timeout 0 never blocks.
        let n = unsafe { libc::epoll_wait(ch.fd, &mut ev, 1, 0) };
        if n < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(libc::EAGAIN);
        }
        let Some(cq) = from_raw(ev.u64 as usize as *mut ibv_cq) else {
            continue;
        };
        // Take the notification; another thread may have taken it first (then the
        // eventfd is empty and epoll stops reporting it: look again).
        let mut buf = 0u64;
        // SAFETY: 8 bytes into a live u64 from the CQ's non-blocking eventfd.
        let r = unsafe { libc::read(cq.cq.as_raw_fd(), (&mut buf as *mut u64).cast(), 8) };
        if r == 8 {
            cq.events.lock().unwrap_or_else(|e| e.into_inner()).0 += 1;
            return Ok(cq);
        }
    }
}

/// Whether the program set `O_NONBLOCK` on `fd`.
pub(crate) fn is_nonblocking(fd: c_int) -> bool {
    // SAFETY: fcntl(F_GETFL) on an fd of ours.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

/// One non-blocking attempt of `ibv_get_cq_event` (under the panic guard): its return
/// value, or the channel's fd to wait on.
///
/// # Safety
/// As [`ibv_get_cq_event`].
unsafe fn get_cq_event_attempt(
    ch: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> Attempt<c_int> {
    let Some(x) = channel_from_raw(ch) else {
        set_errno(libc::EINVAL);
        return Attempt::Done(-1);
    };
    if cq.is_null() || cq_context.is_null() {
        set_errno(libc::EINVAL);
        return Attempt::Done(-1);
    }
    match try_get_event(x) {
        Ok(c) => {
            // SAFETY: writable per the contract; `cq_context` is read from the public
            // field the program may have changed since creation (as rdma-core returns
            // `(*cq)->cq_context`).
            unsafe {
                *cq = c.raw();
                *cq_context = core::ptr::read_volatile(&(*c.raw()).cq_context);
            }
            Attempt::Done(0)
        }
        Err(libc::EAGAIN) if !is_nonblocking(x.fd) => Attempt::Wait(x.fd),
        Err(e) => {
            set_errno(e);
            Attempt::Done(-1)
        }
    }
}

/// `ibv_create_comp_channel@IBVERBS_1.0`: a channel whose `fd` works with poll/epoll;
/// NULL with `errno` (`EINVAL`: not our context).
///
/// # Safety
/// `ctx` any pointer.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    guard("ibv_create_comp_channel", core::ptr::null_mut(), || {
        create_channel(ctx).unwrap_or_else(|e| {
            set_errno(e);
            core::ptr::null_mut()
        })
    })
}

/// `ibv_destroy_comp_channel@IBVERBS_1.0`: 0, `EINVAL`, or `EBUSY` while CQs use it.
///
/// # Safety
/// `ch` any pointer; ours is not used after a 0 return.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    guard("ibv_destroy_comp_channel", libc::EIO, || {
        destroy_channel(ch)
    })
}

/// `ibv_create_cq@IBVERBS_1.1`: NULL with `errno` on failure (see [`create`]).
///
/// # Safety
/// `ctx`, `channel` any pointers.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard("ibv_create_cq", core::ptr::null_mut(), || {
        create(ctx, cqe, cq_context, channel, comp_vector).unwrap_or_else(|e| {
            set_errno(e);
            core::ptr::null_mut()
        })
    })
}

/// `ibv_resize_cq@IBVERBS_1.1`: the engine's CQs grow as needed, so only `cqe` is
/// recorded; 0, or `EINVAL` (not ours, `cqe` < 1).
///
/// # Safety
/// `cq` any pointer.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guard("ibv_resize_cq", libc::EIO, || {
        if from_raw(cq).is_none() || cqe < 1 {
            return libc::EINVAL;
        }
        // SAFETY: a live CQ of ours; `cqe` is an aligned int of its cell, written only
        // here, atomically (resizes may race; the program only reads it).
        unsafe {
            core::sync::atomic::AtomicI32::from_ptr(core::ptr::addr_of_mut!((*cq).cqe))
                .store(cqe, Ordering::SeqCst)
        };
        0
    })
}

/// `ibv_destroy_cq@IBVERBS_1.1`: see [`destroy`].
///
/// # Safety
/// `cq` any pointer; ours is not used after a 0 return.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard("ibv_destroy_cq", libc::EIO, || destroy(cq))
}

/// `ibv_get_cq_event@IBVERBS_1.1`: the CQ whose notification fired and its
/// `cq_context`; 0, or -1 with `errno` (`EAGAIN` with `O_NONBLOCK` on the fd and no event,
/// `EINVAL` for a channel that is not ours or NULL out-pointers).
///
/// `extern "C-unwind"` and blocking outside the panic guard, so that `pthread_cancel` of
/// a thread waiting here unwinds it (see `ffi::wait_readable_cancellable`).
///
/// # Safety
/// `cq`, `cq_context` writable.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C-unwind" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    loop {
        // SAFETY: per the contract.
        let step = guard("ibv_get_cq_event", Attempt::Done(-1), || unsafe {
            get_cq_event_attempt(ch, cq, cq_context)
        });
        match step {
            Attempt::Done(r) => return r,
            // Only integers are alive in this frame: a cancellation unwinds through it.
            Attempt::Wait(fd) => {
                wait_readable_cancellable(fd, -1);
            }
        }
    }
}

/// `ibv_ack_cq_events@IBVERBS_1.1`: acknowledge `n` events of `cq` (what
/// `ibv_destroy_cq` waits for). A CQ that is not ours is ignored.
///
/// # Safety
/// `cq` any pointer.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, n: core::ffi::c_uint) {
    guard("ibv_ack_cq_events", (), || {
        let Some(x) = from_raw(cq) else {
            return;
        };
        let mut ev = x.events.lock().unwrap_or_else(|e| e.into_inner());
        ev.1 = (ev.1 + u64::from(n)).min(ev.0);
        // SAFETY: a live CQ; the counter the C struct shows (programs may read it, from
        // any thread), an aligned u32 of its cell, stored atomically.
        unsafe {
            AtomicU32::from_ptr(core::ptr::addr_of_mut!((*x.raw()).comp_events_completed))
                .store(ev.1 as u32, Ordering::SeqCst)
        };
        x.acked.notify_all();
    })
}

core::arch::global_asm!(
    ".symver {create_ch}, ibv_create_comp_channel@@IBVERBS_1.0",
    ".symver {destroy_ch}, ibv_destroy_comp_channel@@IBVERBS_1.0",
    ".symver {create}, ibv_create_cq@@IBVERBS_1.1",
    ".symver {resize}, ibv_resize_cq@@IBVERBS_1.1",
    ".symver {destroy}, ibv_destroy_cq@@IBVERBS_1.1",
    ".symver {get_ev}, ibv_get_cq_event@@IBVERBS_1.1",
    ".symver {ack}, ibv_ack_cq_events@@IBVERBS_1.1",
    create_ch = sym ibv_create_comp_channel,
    destroy_ch = sym ibv_destroy_comp_channel,
    create = sym ibv_create_cq,
    resize = sym ibv_resize_cq,
    destroy = sym ibv_destroy_cq,
    get_ev = sym ibv_get_cq_event,
    ack = sym ibv_ack_cq_events,
);
