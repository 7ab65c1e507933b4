//! Queue pairs: `ibv_create_qp`, `ibv_modify_qp`, `ibv_query_qp`, `ibv_destroy_qp`, and the
//! `post_send`/`post_recv` slots of the context's ops table (the header-inline
//! `ibv_post_send`/`ibv_post_recv`).
//!
//! For ibv-cm (`rdma_create_qp`, connect/accept):
//! * [`create`]`(pd, attr)` makes a QP exactly as `ibv_create_qp` does (and writes the
//!   real capacities into `attr.cap`); [`destroy`] frees it;
//! * [`from_raw`]`(qp)` gives the [`XQp`]; [`XQp::qp`] is its `xwarp_verbs::QueuePair`
//!   (`connect`, `ConnRequest::accept(qp, ..)`, `modify` for IRD/ORD, CM events: this
//!   module never reads the QP's CM events, they are ibv-cm's);
//! * [`XQp::set_state`] records the verbs state the program sees in `qp->state` (call it
//!   with `IBV_QPS_RTS` once the connection is established, `IBV_QPS_ERR` on an error);
//!   [`XQp::report_fatal`] queues `IBV_EVENT_QP_FATAL` on the context's async fd.
//!
//! Mapping: one `ibv_qp` (RC only: UD/UC/raw/XRC are `EOPNOTSUPP`, as siw) = one
//! `xwarp_verbs::QueuePair`. The state machine follows siw's `siw_verbs_modify_qp`
//! (docs/siw.md §4.10): RESET
//! and INIT map to the engine's IDLE, RTR is accepted in IDLE without effect, RTS is
//! entered only through the connection manager (`rdma_connect`/`rdma_accept`; a modify to
//! RTS of an unconnected QP is `EINVAL`, as siw refuses RTS without a socket), SQD is a
//! graceful close (siw's CLOSING), SQE a Terminate, ERR abortive; RESET of a QP in ERROR
//! (or closed) resets it for a new connection. Attribute bits other than the state are
//! accepted and ignored (siw ignores them too: IRD/ORD come from the CM's connection
//! parameters); bits beyond the standard set are `EOPNOTSUPP`.
//!
//! Posting: each work request of the chain is checked and handed to the engine in
//! order; the first bad one stops the walk, is stored in `*bad_wr` and its errno
//! returned (the earlier ones are posted). `EINVAL`: a QP in RESET, more SGEs than the
//! QP's `max_send_sge`/`max_recv_sge`, inline data larger than `max_inline_data`, inline
//! with RDMA Read, a NULL SGE list, an unknown opcode, receives on a QP with an SRQ;
//! `EOPNOTSUPP` (one warning line): opcodes the engine does not carry (immediate data,
//! atomics, memory-window binds, TSO); `ENOMEM`: a chain longer than the queue's depth.
//! `IBV_SEND_INLINE` copies the SGEs' bytes at post time (their lkeys are not checked, as
//! in verbs); `IBV_SEND_SIGNALED` (or `sq_sig_all`), `IBV_SEND_SOLICITED` (Send with SE),
//! `IBV_SEND_FENCE` are honoured.

use core::cell::UnsafeCell;
use core::ffi::c_int;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use xwarp_verbs::{
    CompletionStatus, PostError, QpInitAttr, QpModify, QpState, QueuePair, SendOpcode, SendRequest,
    Sge, Stag, MAX_INLINE_DATA, MAX_SGE,
};

use crate::abi::*;
use crate::cq::{self, XCq};
use crate::device::XwContext;
use crate::ffi::{guard, io_errno, set_errno, unsupported, warn_once, Registry};
use crate::pd::{self, XPd, NEXT_HANDLE};
use crate::srq::{self, XSrq};

/// A QP.
#[repr(C)]
pub struct XQp {
    /// What the program sees (`state` changes, hence the cell).
    c: UnsafeCell<ibv_qp>,
    qp: QueuePair,
    ctx: &'static XwContext,
    pd: &'static XPd,
    send_cq: &'static XCq,
    recv_cq: &'static XCq,
    srq: Option<&'static XSrq>,
    /// The capacities the QP was created with (as written back to the program).
    cap: ibv_qp_cap,
    sig_all: bool,
    /// The verbs state the program was last told (`qp->state`).
    state: AtomicU32,
    /// `qp_access_flags` last set by a modify.
    access: AtomicU32,
    /// (`IBV_EVENT_QP_FATAL` was queued already, the QP is being destroyed): held while
    /// an event is queued, so destroy and a report cannot cross.
    fatal: Mutex<(bool, bool)>,
    /// Async events naming this QP that `ibv_get_async_event` handed out, and those
    /// acknowledged (rdma-core's `async_events`/`events_completed`: destroy waits until
    /// they match).
    events_handed_out: AtomicU64,
    events_acked: AtomicU64,
    /// Signalled on every ack (with `acked_lock`), for destroy's wait.
    acked_lock: Mutex<()>,
    acked_cv: Condvar,
}

// SAFETY: the C part is in a cell whose only field written after creation is `state`,
// stored atomically (`AtomicU32::from_ptr`) by `set_state`; everything else is immutable,
// atomic or behind a Mutex.
unsafe impl Sync for XQp {}
// SAFETY: as above.
unsafe impl Send for XQp {}

static QPS: Registry = Registry::new();
/// Live QPs by QP number (several engines may reuse a number: a list).
static BY_QPN: Mutex<Option<HashMap<u32, Vec<usize>>>> = Mutex::new(None);

impl XQp {
    /// The engine's queue pair.
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }

    /// The `ibv_qp` pointer the program holds.
    pub fn raw(&self) -> *mut ibv_qp {
        self.c.get()
    }

    /// The context it was made on.
    pub fn context(&self) -> &'static XwContext {
        self.ctx
    }

    /// Its PD.
    pub fn pd(&self) -> &'static XPd {
        self.pd
    }

    /// Its send CQ.
    pub fn send_cq(&self) -> &'static XCq {
        self.send_cq
    }

    /// Its receive CQ.
    pub fn recv_cq(&self) -> &'static XCq {
        self.recv_cq
    }

    /// Its SRQ, if it takes receives from one.
    pub fn srq(&self) -> Option<&'static XSrq> {
        self.srq
    }

    /// The capacities it was created with.
    pub fn cap(&self) -> ibv_qp_cap {
        self.cap
    }

    /// The verbs state last recorded (what `qp->state` shows).
    pub fn ibv_state(&self) -> u32 {
        self.state.load(Ordering::SeqCst)
    }

    /// Record the verbs state the program sees in `qp->state` (any thread may call it:
    /// the C field is stored atomically).
    pub fn set_state(&self, s: u32) {
        self.state.store(s, Ordering::SeqCst);
        // SAFETY: `state` is a u32 of our live allocation, aligned for AtomicU32; every
        // write of it after creation goes through this atomic store (the program only
        // reads it, as it reads rdma-core's).
        unsafe {
            let f = core::ptr::addr_of_mut!((*self.c.get()).state);
            AtomicU32::from_ptr(f).store(s, Ordering::SeqCst);
        }
    }

    /// Queue `IBV_EVENT_QP_FATAL` for this QP on its context's async fd (once per QP
    /// until it is reset; nothing once its destroy began).
    ///
    /// For ibv-cm: call it when the connection fails in a way the program must hear of
    /// on the async fd (a Terminate received, an MPA error, the peer's abort): the engine
    /// then flushes the outstanding work, and flush completions alone do not raise the
    /// event (only error completions other than a flush do, `note_error`). Queue QP
    /// events only through this function: `ibv_destroy_qp` drops the queued ones naming
    /// the QP and waits for the acks of those handed out.
    pub fn report_fatal(&self) {
        let mut f = self.fatal.lock().unwrap_or_else(|e| e.into_inner());
        if f.0 || f.1 {
            return;
        }
        f.0 = true;
        self.ctx.post_async_event(ibv_async_event {
            element: ibv_async_event_element { qp: self.raw() },
            event_type: IBV_EVENT_QP_FATAL,
        });
    }
}

/// `ibv_get_async_event` hands out `ev` (called with the context's event queue locked):
/// the QP it names counts it, for `ibv_destroy_qp`'s wait.
pub(crate) fn note_async_event_handed_out(ev: &ibv_async_event) {
    if let Some(q) = qp_of_event(ev) {
        q.events_handed_out.fetch_add(1, Ordering::SeqCst);
    }
}

/// `ibv_ack_async_event` of `ev`: the QP it names counts the ack and wakes its destroy.
pub(crate) fn note_async_event_acked(ev: &ibv_async_event) {
    if let Some(q) = qp_of_event(ev) {
        let _ = q
            .events_acked
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < q.events_handed_out.load(Ordering::SeqCst)).then_some(n + 1)
            });
        let _l = q.acked_lock.lock().unwrap_or_else(|e| e.into_inner());
        q.acked_cv.notify_all();
    }
}

/// Whether an async event type names a QP (`element.qp`), as libibverbs sorts them.
pub(crate) fn is_qp_event(ty: u32) -> bool {
    matches!(
        ty,
        IBV_EVENT_QP_FATAL
            | IBV_EVENT_QP_REQ_ERR
            | IBV_EVENT_QP_ACCESS_ERR
            | IBV_EVENT_COMM_EST
            | IBV_EVENT_SQ_DRAINED
            | IBV_EVENT_PATH_MIG
            | IBV_EVENT_PATH_MIG_ERR
            | IBV_EVENT_QP_LAST_WQE_REACHED
    )
}

/// The live QP an async event names, if any.
fn qp_of_event(ev: &ibv_async_event) -> Option<&'static XQp> {
    if !is_qp_event(ev.event_type) {
        return None;
    }
    // SAFETY: a QP event's element is the `qp` pointer (plain read of the union).
    from_raw(unsafe { ev.element.qp })
}

/// The QP behind `p`, if it is a live QP of ours.
pub fn from_raw(p: *mut ibv_qp) -> Option<&'static XQp> {
    if !QPS.contains(p.cast()) {
        return None;
    }
    // SAFETY: registered QPs are live XQp allocations (C struct first).
    Some(unsafe { &*p.cast::<XQp>() })
}

/// A completion with an error other than a flush was polled for QP `qpn` of `cq`: the
/// QP went to ERROR through the engine (siw raises the QP's fatal event then).
pub(crate) fn note_error(cq: &XCq, qpn: u32, _status: CompletionStatus) {
    let list: Vec<usize> = BY_QPN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(&qpn).cloned())
        .unwrap_or_default();
    for p in list {
        if let Some(q) = from_raw(p as *mut ibv_qp) {
            if core::ptr::eq(q.send_cq, cq) || core::ptr::eq(q.recv_cq, cq) {
                q.report_fatal();
            }
        }
    }
}

/// Make a QP (what `ibv_create_qp` does; see the module docs); `attr.cap` gets the real
/// capacities.
///
/// # Safety
/// `attr` NULL or the program's readable and writable attributes.
pub unsafe fn create(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> Result<*mut ibv_qp, c_int> {
    let p = pd::from_raw(pd).ok_or(libc::EINVAL)?;
    if attr.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: non-NULL; the program's struct, read and written back as libibverbs does.
    let a = unsafe { &mut *attr };
    if a.qp_type != IBV_QPT_RC {
        unsupported(
            &format!("ibv_create_qp(qp_type {})", a.qp_type),
            "only RC queue pairs (iWARP)",
        );
        return Err(libc::EOPNOTSUPP);
    }
    let scq = cq::from_raw(a.send_cq).ok_or(libc::EINVAL)?;
    let rcq = cq::from_raw(a.recv_cq).ok_or(libc::EINVAL)?;
    if !core::ptr::eq(scq.context(), p.ctx) || !core::ptr::eq(rcq.context(), p.ctx) {
        return Err(libc::EINVAL);
    }
    let srq = if a.srq.is_null() {
        None
    } else {
        Some(srq::from_raw(a.srq).ok_or(libc::EINVAL)?)
    };
    let cap = a.cap;
    // siw's checks (siw_create_qp, docs/siw.md §4.10): SGE counts within the device's,
    // inline within the engine's, and room for at least one work request in SQ + RQ.
    if cap.max_send_sge as usize > MAX_SGE
        || cap.max_recv_sge as usize > MAX_SGE
        || cap.max_inline_data as usize > MAX_INLINE_DATA
        || cap.max_send_wr > c_int::MAX as u32
        || cap.max_recv_wr > c_int::MAX as u32
        || (cap.max_send_wr == 0 && cap.max_recv_wr == 0 && srq.is_none())
    {
        return Err(libc::EINVAL);
    }
    let max_send_wr = cap.max_send_wr.max(1) as usize;
    let max_recv_wr = cap.max_recv_wr.max(1) as usize;
    let mut init = QpInitAttr::new(scq.cq(), rcq.cq());
    init.srq = srq.map(|s| s.srq());
    init.max_send_wr = max_send_wr;
    init.max_recv_wr = if srq.is_some() { 0 } else { max_recv_wr };
    init.max_inline_data = cap.max_inline_data as usize;
    // The programs this library runs are written against siw, whose Responder sends
    // right after its MPA Reply when no RTR was negotiated (perftest's latency servers
    // post first); with P2P the QP still waits for the RTR. siw quirk, docs/siw.md §4.8.14.
    init.mpa.responder_sends_after_reply = true;
    let qp = p
        .pd()
        .create_qp(&init)
        .map_err(|e| io_errno(&e, libc::ENOMEM))?;
    let real = ibv_qp_cap {
        max_send_wr: max_send_wr as u32,
        max_recv_wr: if srq.is_some() { 0 } else { max_recv_wr as u32 },
        max_send_sge: cap.max_send_sge,
        max_recv_sge: if srq.is_some() { 0 } else { cap.max_recv_sge },
        max_inline_data: cap.max_inline_data,
    };
    a.cap = real;
    // SAFETY: ibv_qp's pthread fields are initialised below; zero is valid for the rest.
    let mut c: ibv_qp = unsafe { core::mem::zeroed() };
    c.context = p.ctx.raw();
    c.qp_context = a.qp_context;
    c.pd = pd;
    c.send_cq = a.send_cq;
    c.recv_cq = a.recv_cq;
    c.srq = a.srq;
    c.handle = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
    c.qp_num = qp.qp_num();
    c.state = IBV_QPS_RESET;
    c.qp_type = IBV_QPT_RC;
    let qpn = c.qp_num;
    let x = Box::into_raw(Box::new(XQp {
        c: UnsafeCell::new(c),
        qp,
        ctx: p.ctx,
        pd: p,
        send_cq: scq,
        recv_cq: rcq,
        srq,
        cap: real,
        sig_all: a.sq_sig_all != 0,
        state: AtomicU32::new(IBV_QPS_RESET),
        access: AtomicU32::new(0),
        fatal: Mutex::new((false, false)),
        events_handed_out: AtomicU64::new(0),
        events_acked: AtomicU64::new(0),
        acked_lock: Mutex::new(()),
        acked_cv: Condvar::new(),
    }));
    // SAFETY: `x` is live; the pthread objects are initialised once, in place.
    unsafe {
        let c = (*x).c.get();
        libc::pthread_mutex_init(&mut (*c).mutex, core::ptr::null());
        libc::pthread_cond_init(&mut (*c).cond, core::ptr::null());
    }
    p.users.fetch_add(1, Ordering::SeqCst);
    scq.users.fetch_add(1, Ordering::SeqCst);
    rcq.users.fetch_add(1, Ordering::SeqCst);
    if let Some(s) = srq {
        s.users.fetch_add(1, Ordering::SeqCst);
    }
    p.ctx.objects.fetch_add(1, Ordering::SeqCst);
    // SAFETY: `x` is live.
    let raw = unsafe { (*x).raw() };
    QPS.insert(raw.cast());
    BY_QPN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .entry(qpn)
        .or_default()
        .push(raw as usize);
    Ok(raw)
}

/// Free a QP (what `ibv_destroy_qp` does): its connection is reset, outstanding work is
/// dropped; 0 or `EINVAL` (not ours).
///
/// Async events naming the QP: the queued ones are dropped (the kernel drops an object's
/// unread events when it is destroyed), and destroy waits until every one
/// `ibv_get_async_event` handed out was acknowledged (rdma-core's `ibv_cmd_destroy_qp`
/// waits for `events_completed` the same way; a program that never acks blocks here, as
/// there). No event naming it can be queued once destroy began ([`XQp::report_fatal`]).
pub fn destroy(p: *mut ibv_qp) -> c_int {
    let Some(x) = from_raw(p) else {
        return libc::EINVAL;
    };
    x.fatal.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
    x.ctx.drop_async_events(|ev| {
        // SAFETY: a QP event's element is the `qp` pointer (plain read of the union).
        is_qp_event(ev.event_type) && unsafe { ev.element.qp } == p
    });
    {
        let mut l = x.acked_lock.lock().unwrap_or_else(|e| e.into_inner());
        while x.events_acked.load(Ordering::SeqCst) < x.events_handed_out.load(Ordering::SeqCst) {
            l = x.acked_cv.wait(l).unwrap_or_else(|e| e.into_inner());
        }
    }
    if !QPS.remove(p.cast()) {
        return libc::EINVAL;
    }
    let qpn = x.qp.qp_num();
    if let Some(m) = BY_QPN.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        if let Some(v) = m.get_mut(&qpn) {
            v.retain(|&q| q != p as usize);
            if v.is_empty() {
                m.remove(&qpn);
            }
        }
    }
    x.pd.users.fetch_sub(1, Ordering::SeqCst);
    x.send_cq.users.fetch_sub(1, Ordering::SeqCst);
    x.recv_cq.users.fetch_sub(1, Ordering::SeqCst);
    if let Some(s) = x.srq {
        s.users.fetch_sub(1, Ordering::SeqCst);
    }
    x.ctx.objects.fetch_sub(1, Ordering::SeqCst);
    // SAFETY: out of the registry; the allocation `create` leaked, freed once (the
    // QueuePair's drop tells the engine), after the pthread objects it initialised.
    unsafe {
        let q = p.cast::<XQp>();
        let c = (*q).c.get();
        libc::pthread_cond_destroy(&mut (*c).cond);
        libc::pthread_mutex_destroy(&mut (*c).mutex);
        drop(Box::from_raw(q));
    }
    0
}

/// The verbs state for the engine's state (`mirror`: what the program was told last,
/// which tells RESET, INIT and RTR apart: the engine has one IDLE for all three).
///
/// A QP that was connected (RTS, SQD, SQE) or in ERR and whose engine QP is IDLE again
/// (the connection closed or was torn down) is ERR, and stays ERR until the program
/// modifies it to RESET: siw's `siw_qp_llp_close` moves an RTS/TERMINATE QP (and a
/// CLOSING one with no send in progress) to ERROR when its connection closes, and it
/// stays there until a reset (docs/siw.md §4.7 teardown, §4.10 the state mapping); it
/// never falls back to INIT by itself.
fn ibv_state_of(s: QpState, mirror: u32) -> u32 {
    match s {
        _ if mirror == IBV_QPS_ERR => IBV_QPS_ERR,
        QpState::Idle if mirror <= IBV_QPS_RTR => mirror,
        QpState::Idle => IBV_QPS_ERR,
        QpState::Rts => IBV_QPS_RTS,
        QpState::Closing => IBV_QPS_SQD,
        QpState::Terminate => IBV_QPS_SQE,
        QpState::Error => IBV_QPS_ERR,
    }
}

/// The standard `ibv_qp_attr_mask` bits (up to `IBV_QP_DEST_QPN`).
const STANDARD_MASK: u32 = (IBV_QP_DEST_QPN << 1) - 1;

/// What `ibv_modify_qp` does (see the module docs; siw's rules, docs/siw.md §4.10): 0 or
/// an errno.
pub fn modify(x: &XQp, attr: &ibv_qp_attr, mask: c_int) -> c_int {
    let mask = mask as u32;
    if mask & !STANDARD_MASK != 0 {
        unsupported(
            "ibv_modify_qp(attribute mask beyond IBV_QP_DEST_QPN)",
            "rate limits and other extended attributes",
        );
        return libc::EOPNOTSUPP;
    }
    if mask & IBV_QP_ACCESS_FLAGS != 0 {
        x.access.store(attr.qp_access_flags, Ordering::SeqCst);
    }
    if mask & IBV_QP_STATE == 0 {
        return 0;
    }
    let to = attr.qp_state;
    let cur = match x.qp.state() {
        Ok(s) => s,
        Err(e) => return io_errno(&e, libc::EIO),
    };
    let engine = |s: QpState| match x.qp.modify(&QpModify::to_state(s)) {
        Ok(()) => 0,
        Err(e) => io_errno(&e, libc::EINVAL),
    };
    let r = match to {
        IBV_QPS_RESET => engine(QpState::Idle),
        IBV_QPS_INIT | IBV_QPS_RTR if x.ibv_state() == IBV_QPS_ERR => libc::EINVAL,
        IBV_QPS_INIT | IBV_QPS_RTR if cur == QpState::Idle => 0,
        IBV_QPS_INIT | IBV_QPS_RTR => libc::EINVAL,
        IBV_QPS_RTS if cur == QpState::Rts => 0,
        IBV_QPS_RTS => {
            warn_once(
                "modify-rts",
                "ibv_modify_qp(IBV_QPS_RTS) on a QP that is not connected: on iWARP a QP \
                 enters RTS through rdma_connect/rdma_accept (EINVAL, as siw)",
            );
            libc::EINVAL
        }
        IBV_QPS_SQD => engine(QpState::Closing),
        IBV_QPS_SQE => engine(QpState::Terminate),
        IBV_QPS_ERR => engine(QpState::Error),
        _ => libc::EINVAL,
    };
    if r == 0 {
        if to == IBV_QPS_RESET {
            x.fatal.lock().unwrap_or_else(|e| e.into_inner()).0 = false;
        }
        x.set_state(to);
    }
    r
}

/// What `ibv_query_qp` does: fills `attr` (and `init` when not NULL); 0 or an errno.
pub fn query(x: &XQp, attr: &mut ibv_qp_attr, init: Option<&mut ibv_qp_init_attr>) -> c_int {
    let q = match x.qp.query() {
        Ok(q) => q,
        Err(e) => return io_errno(&e, libc::EIO),
    };
    let st = ibv_state_of(q.state, x.ibv_state());
    x.set_state(st);
    // SAFETY: ibv_qp_attr is integers only: zero is valid.
    *attr = unsafe { core::mem::zeroed() };
    attr.qp_state = st;
    attr.cur_qp_state = st;
    attr.path_mtu = crate::attr::mtu_enum(x.ctx.engine_mtu as u32);
    attr.qp_access_flags = x.access.load(Ordering::SeqCst);
    attr.cap = x.cap;
    attr.cap.max_inline_data = q.max_inline_data as u32;
    attr.max_rd_atomic = q.ord.min(255) as u8;
    attr.max_dest_rd_atomic = q.ird.min(255) as u8;
    attr.sq_draining = u8::from(q.state == QpState::Closing);
    attr.port_num = 1;
    if let Some(i) = init {
        // SAFETY: a live QP; the program's own pointer, read from its struct.
        i.qp_context = unsafe { (*x.raw()).qp_context };
        i.send_cq = x.send_cq.raw();
        i.recv_cq = x.recv_cq.raw();
        i.srq = x.srq.map_or(core::ptr::null_mut(), |s| s.raw());
        i.cap = attr.cap;
        i.qp_type = IBV_QPT_RC;
        i.sq_sig_all = c_int::from(x.sig_all);
    }
    0
}

/// The errno of an engine post error (`QueueFull`: `ENOMEM`, as the providers answer a
/// full queue).
pub(crate) fn post_errno(e: PostError) -> c_int {
    match e {
        PostError::QueueFull => libc::ENOMEM,
        PostError::InvalidSgl | PostError::InvalidState | PostError::NoSuchSrq => libc::EINVAL,
    }
}

/// A work request's SGEs, copied from the program's list onto the stack: a receive and an
/// inline send need no heap allocation for them ([`Self::as_slice`] is what the engine
/// takes). Only the first `n` entries are written.
pub(crate) struct Sges {
    n: usize,
    a: [core::mem::MaybeUninit<Sge>; MAX_SGE],
}

impl Sges {
    /// The SGEs.
    pub(crate) fn as_slice(&self) -> &[Sge] {
        // SAFETY: `sges` wrote the first `n <= MAX_SGE` entries; MaybeUninit<Sge> has
        // Sge's layout.
        unsafe { core::slice::from_raw_parts(self.a.as_ptr().cast::<Sge>(), self.n) }
    }
}

/// Checks `num_sge` against `max` (the QP's or SRQ's capacity: a queue created with 0
/// SGEs takes only requests without SGEs, as siw's `num_sge > max_sge` check refuses any
/// other with `EINVAL`) and MAX_SGE, and `sg_list` against NULL.
fn check_sges(sg_list: *const ibv_sge, num_sge: c_int, max: u32) -> Result<usize, c_int> {
    if num_sge < 0 || num_sge as u32 > max.min(MAX_SGE as u32) {
        return Err(libc::EINVAL);
    }
    if num_sge > 0 && sg_list.is_null() {
        return Err(libc::EINVAL);
    }
    Ok(num_sge as usize)
}

/// SGE `i` of the program's list as the engine's.
///
/// # Safety
/// `sg_list` readable for more than `i` entries.
unsafe fn sge_at(sg_list: *const ibv_sge, i: usize) -> Sge {
    // SAFETY: per the contract.
    let s = unsafe { &*sg_list.add(i) };
    Sge {
        lkey: Stag(s.lkey),
        addr: s.addr,
        len: s.length,
    }
}

/// The SGEs of a work request on the stack, checked as [`check_sges`] says.
///
/// # Safety
/// `sg_list` readable for `num_sge` entries when `num_sge > 0`.
pub(crate) unsafe fn sges(
    sg_list: *const ibv_sge,
    num_sge: c_int,
    max: u32,
) -> Result<Sges, c_int> {
    let n = check_sges(sg_list, num_sge, max)?;
    let mut v = Sges {
        n,
        a: [core::mem::MaybeUninit::uninit(); MAX_SGE],
    };
    for (i, d) in v.a.iter_mut().enumerate().take(n) {
        // SAFETY: `i < num_sge` entries of the program's list.
        d.write(unsafe { sge_at(sg_list, i) });
    }
    Ok(v)
}

/// The SGEs of a work request in the `Vec` a (not inline) send request carries, checked
/// as [`check_sges`] says.
///
/// # Safety
/// As [`sges`].
unsafe fn sges_vec(sg_list: *const ibv_sge, num_sge: c_int, max: u32) -> Result<Vec<Sge>, c_int> {
    let n = check_sges(sg_list, num_sge, max)?;
    // SAFETY: `i < num_sge` entries of the program's list.
    Ok((0..n).map(|i| unsafe { sge_at(sg_list, i) }).collect())
}

/// One `ibv_send_wr` as the engine's request, or the errno.
///
/// # Safety
/// The WR's SGE list (and, for inline, the bytes it points at) readable.
unsafe fn send_request(x: &XQp, wr: &ibv_send_wr) -> Result<SendRequest, c_int> {
    let flags = wr.send_flags;
    let inline = flags & IBV_SEND_INLINE != 0;
    let solicited = flags & IBV_SEND_SOLICITED != 0;
    // SAFETY: reading the unions as the opcode says, plain integers either way.
    let (rdma, inv) = unsafe { (wr.wr.rdma, wr.imm.invalidate_rkey) };
    let opcode = match wr.opcode {
        IBV_WR_SEND if solicited => SendOpcode::SendWithSolicitedEvent,
        IBV_WR_SEND => SendOpcode::Send,
        IBV_WR_SEND_WITH_INV if solicited => {
            SendOpcode::SendWithSolicitedEventInvalidate(Stag(inv))
        }
        IBV_WR_SEND_WITH_INV => SendOpcode::SendWithInvalidate(Stag(inv)),
        IBV_WR_RDMA_WRITE => SendOpcode::Write {
            rkey: Stag(rdma.rkey),
            remote_addr: rdma.remote_addr,
        },
        IBV_WR_RDMA_READ if inline => return Err(libc::EINVAL),
        IBV_WR_RDMA_READ => SendOpcode::Read {
            rkey: Stag(rdma.rkey),
            remote_addr: rdma.remote_addr,
        },
        IBV_WR_LOCAL_INV => SendOpcode::LocalInvalidate(Stag(inv)),
        IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE_WITH_IMM => {
            unsupported(
                "ibv_post_send(IBV_WR_*_WITH_IMM)",
                "immediate data (RFC 7306) is not carried by the engine",
            );
            return Err(libc::EOPNOTSUPP);
        }
        IBV_WR_ATOMIC_CMP_AND_SWP
        | IBV_WR_ATOMIC_FETCH_AND_ADD
        | IBV_WR_ATOMIC_WRITE
        | IBV_WR_BIND_MW
        | IBV_WR_TSO => {
            unsupported(
                &format!("ibv_post_send(opcode {})", wr.opcode),
                "atomics, memory windows and TSO",
            );
            return Err(libc::EOPNOTSUPP);
        }
        _ => return Err(libc::EINVAL),
    };
    let max_sge = if inline {
        MAX_SGE as u32
    } else {
        x.cap.max_send_sge
    };
    if !inline {
        return Ok(SendRequest {
            wr_id: wr.wr_id,
            opcode,
            // SAFETY: per the contract.
            sgl: unsafe { sges_vec(wr.sg_list, wr.num_sge, max_sge)? },
            inline: None,
            signaled: x.sig_all || flags & IBV_SEND_SIGNALED != 0,
            fence: flags & IBV_SEND_FENCE != 0,
        });
    }
    // SAFETY: per the contract.
    let sgl = unsafe { sges(wr.sg_list, wr.num_sge, max_sge)? };
    let sgl = sgl.as_slice();
    let data = {
        let total: u64 = sgl.iter().map(|s| u64::from(s.len)).sum();
        if total > u64::from(x.cap.max_inline_data) {
            return Err(libc::EINVAL);
        }
        let mut d = Vec::with_capacity(total as usize);
        for s in sgl {
            if s.len > 0 && s.addr == 0 {
                return Err(libc::EINVAL);
            }
            // SAFETY: inline data is the program's own memory at the SGE's address
            // (verbs copy it at post time without an lkey check).
            d.extend_from_slice(unsafe {
                core::slice::from_raw_parts(s.addr as usize as *const u8, s.len as usize)
            });
        }
        d
    };
    Ok(SendRequest {
        wr_id: wr.wr_id,
        opcode,
        sgl: Vec::new(),
        inline: Some(data),
        signaled: x.sig_all || flags & IBV_SEND_SIGNALED != 0,
        fence: flags & IBV_SEND_FENCE != 0,
    })
}

/// Walk a chain of `len`-bounded WRs, posting each with `post`; stores the failing one in
/// `*bad` and returns its errno.
///
/// # Safety
/// The chain is the program's list of valid WRs; `bad` NULL or writable.
unsafe fn walk<W>(
    mut wr: *mut W,
    bad: *mut *mut W,
    bound: usize,
    next: impl Fn(&W) -> *mut W,
    mut post: impl FnMut(&W) -> Result<(), c_int>,
) -> c_int {
    if !bad.is_null() {
        // SAFETY: writable per the contract.
        unsafe { *bad = core::ptr::null_mut() };
    }
    let mut n = 0usize;
    while !wr.is_null() {
        // SAFETY: a WR of the program's chain.
        let w = unsafe { &*wr };
        let r = if n >= bound {
            Err(libc::ENOMEM)
        } else {
            post(w)
        };
        if let Err(e) = r {
            if !bad.is_null() {
                // SAFETY: as above.
                unsafe { *bad = wr };
            }
            return e;
        }
        n += 1;
        wr = next(w);
    }
    0
}

/// `ibv_context_ops.post_send` (the inline `ibv_post_send`): see the module docs.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    crate::ffi::guard_data_path("ibv_post_send", libc::EIO, || {
        let Some(x) = from_raw(qp) else {
            if !bad.is_null() {
                // SAFETY: writable per the verbs contract.
                unsafe { *bad = wr };
            }
            return libc::EINVAL;
        };
        let reset = x.ibv_state() == IBV_QPS_RESET;
        let post = |w: &ibv_send_wr| {
            if reset {
                return Err(libc::EINVAL);
            }
            // SAFETY: the WR's SGEs and inline bytes are the program's.
            let req = unsafe { send_request(x, w)? };
            x.qp.post_send(req).map_err(post_errno)
        };
        let bound = x.cap.max_send_wr as usize;
        // SAFETY: the program's chain, as the verbs contract gives it.
        unsafe { walk(wr, bad, bound, |w| w.next, post) }
    })
}

/// `ibv_context_ops.post_recv` (the inline `ibv_post_recv`): see the module docs.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    crate::ffi::guard_data_path("ibv_post_recv", libc::EIO, || {
        let Some(x) = from_raw(qp) else {
            if !bad.is_null() {
                // SAFETY: writable per the verbs contract.
                unsafe { *bad = wr };
            }
            return libc::EINVAL;
        };
        let refuse = x.ibv_state() == IBV_QPS_RESET || x.srq.is_some();
        let post = |w: &ibv_recv_wr| {
            if refuse {
                return Err(libc::EINVAL);
            }
            // SAFETY: the WR's SGE list is the program's.
            let sgl = unsafe { sges(w.sg_list, w.num_sge, x.cap.max_recv_sge)? };
            x.qp.post_recv(w.wr_id, sgl.as_slice()).map_err(post_errno)
        };
        let bound = x.cap.max_recv_wr.max(1) as usize;
        // SAFETY: the program's chain.
        unsafe { walk(wr, bad, bound, |w| w.next, post) }
    })
}

/// `ibv_create_qp@IBVERBS_1.1`: NULL with `errno` on failure (see [`create`]).
///
/// # Safety
/// `pd` any pointer; `attr` NULL or the program's attributes.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard("ibv_create_qp", core::ptr::null_mut(), || {
        // SAFETY: per the contract.
        unsafe { create(pd, attr) }.unwrap_or_else(|e| {
            set_errno(e);
            core::ptr::null_mut()
        })
    })
}

/// `ibv_modify_qp@IBVERBS_1.1`: 0 or an errno (see the module docs).
///
/// # Safety
/// `qp` any pointer; `attr` NULL or readable.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    guard("ibv_modify_qp", libc::EIO, || {
        let Some(x) = from_raw(qp) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: non-NULL, the program's attributes.
        modify(x, unsafe { &*attr }, mask)
    })
}

/// `ibv_query_qp@IBVERBS_1.1`: 0 or an errno (`EINVAL`: not ours, NULL `attr`).
///
/// # Safety
/// `attr` writable; `init` NULL or writable.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard("ibv_query_qp", libc::EIO, || {
        let Some(x) = from_raw(qp) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: writable per the contract.
        unsafe { query(x, &mut *attr, init.as_mut()) }
    })
}

/// `ibv_destroy_qp@IBVERBS_1.1`: 0 or `EINVAL`.
///
/// # Safety
/// `qp` any pointer; ours is not used after a 0 return.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard("ibv_destroy_qp", libc::EIO, || destroy(qp))
}

core::arch::global_asm!(
    ".symver {create}, ibv_create_qp@@IBVERBS_1.1",
    ".symver {modify}, ibv_modify_qp@@IBVERBS_1.1",
    ".symver {query}, ibv_query_qp@@IBVERBS_1.1",
    ".symver {destroy}, ibv_destroy_qp@@IBVERBS_1.1",
    create = sym ibv_create_qp,
    modify = sym ibv_modify_qp,
    query = sym ibv_query_qp,
    destroy = sym ibv_destroy_qp,
);

#[cfg(test)]
mod tests {
    use super::*;

    /// siw keeps a QP whose connection ended in ERR until a RESET (docs/siw.md §4.7,
    /// §4.10):
    /// the engine's IDLE after a disconnect is not INIT.
    #[test]
    fn siw_err_sticks_until_reset() {
        assert_eq!(ibv_state_of(QpState::Idle, IBV_QPS_ERR), IBV_QPS_ERR);
        assert_eq!(ibv_state_of(QpState::Idle, IBV_QPS_RTS), IBV_QPS_ERR);
        assert_eq!(ibv_state_of(QpState::Idle, IBV_QPS_SQD), IBV_QPS_ERR);
        assert_eq!(ibv_state_of(QpState::Rts, IBV_QPS_ERR), IBV_QPS_ERR);
        // Before a connection the mirror tells RESET, INIT and RTR apart.
        for m in [IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR] {
            assert_eq!(ibv_state_of(QpState::Idle, m), m);
        }
        assert_eq!(ibv_state_of(QpState::Rts, IBV_QPS_INIT), IBV_QPS_RTS);
        assert_eq!(ibv_state_of(QpState::Error, IBV_QPS_RTS), IBV_QPS_ERR);
    }
}
