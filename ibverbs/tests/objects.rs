//! The verbs objects through the exported functions and the context's ops table (what the
//! header-inline `ibv_post_send`/`ibv_poll_cq`/`ibv_req_notify_cq` jump through), on two
//! xwarp verbs engines joined by the in-process virtual wire (no privileges needed).
//!
//! * `data_moves_through_the_ops_table`: two contexts (one per engine, via
//!   `testing::open_on`), QPs connected with the engine's own connect/accept (what
//!   librdmacm will drive): a Send with two SGEs from heap and stack memory into an mmap'ed
//!   receive buffer, announced through a completion channel armed for solicited events;
//!   unsignaled RDMA Writes then a signaled one; an RDMA Read; an inline Send whose source
//!   is overwritten right after the post; every byte checked against its pattern and every
//!   work-completion field checked; a Send from a bad lkey completes with
//!   `IBV_WC_LOC_PROT_ERR`, queues `IBV_EVENT_QP_FATAL` on the async fd, and the QP in
//!   ERROR flushes later work.
//! * `errors_as_libibverbs`: the NULL/errno and errno returns of every call on bad input
//!   (bad access flags, NULL or foreign objects, unmapped or read-only memory, destroy
//!   while in use, posts to a QP in RESET, too many SGEs, inline too large, unsupported
//!   opcodes and QP types), the state machine of `ibv_modify_qp`/`ibv_query_qp`, flushes
//!   on ERROR, `ibv_destroy_cq` blocking until the events are acked, non-blocking channel
//!   and async fds, SRQs, and the small verbs.

use std::ffi::CStr;
use std::net::SocketAddr;
use std::ptr::{null, null_mut};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use xwarp_ibverbs::abi::*;
use xwarp_ibverbs::cq::*;
use xwarp_ibverbs::exports::*;
use xwarp_ibverbs::misc::*;
use xwarp_ibverbs::mr::*;
use xwarp_ibverbs::pd::*;
use xwarp_ibverbs::qp::*;
use xwarp_ibverbs::srq::*;
use xwarp_ibverbs::testing;
use xwarp_poll_driver::vwire::VirtualNic;
use xwarp_verbs::{vwire_pair_simple, CmEvent, ConnectParams, Context};

const T: Duration = Duration::from_secs(20);
const RW: i32 = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) as i32;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The xwarp device (on `lo`, which every namespace has; the engines are the vwire's).
fn device() -> *mut ibv_device {
    static DEV: OnceLock<usize> = OnceLock::new();
    *DEV.get_or_init(|| {
        std::env::set_var("XWARP_IFACE", "lo");
        let mut n = 0;
        // SAFETY: `n` writable; the list is kept (the device lives for the process).
        let list = unsafe { ibv_get_device_list(&mut n) };
        assert_eq!(n, 1);
        // SAFETY: one entry.
        unsafe { *list as usize }
    }) as *mut ibv_device
}

fn engines() -> (Context<VirtualNic>, Context<VirtualNic>) {
    vwire_pair_simple(Default::default()).expect("vwire pair")
}

fn open(ctx: &Context<VirtualNic>) -> *mut ibv_context {
    // SAFETY: a device of the list.
    let c = unsafe { testing::open_on(device(), ctx.device().clone()) };
    assert!(!c.is_null());
    c
}

/// A deterministic pattern (xorshift) for `len` bytes.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

unsafe fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr) -> (i32, *mut ibv_send_wr) {
    let mut bad = null_mut();
    // SAFETY: our QP's context and its ops table.
    let f = unsafe { (*(*qp).context).ops.post_send.expect("post_send slot") };
    // SAFETY: the caller's WR chain.
    (unsafe { f(qp, wr, &mut bad) }, bad)
}

unsafe fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr) -> (i32, *mut ibv_recv_wr) {
    let mut bad = null_mut();
    // SAFETY: as above.
    let f = unsafe { (*(*qp).context).ops.post_recv.expect("post_recv slot") };
    // SAFETY: as above.
    (unsafe { f(qp, wr, &mut bad) }, bad)
}

/// Poll `cq` through the ops table until one completion arrives.
unsafe fn wc(cq: *mut ibv_cq) -> ibv_wc {
    // SAFETY: our CQ's context.
    let f = unsafe { (*(*cq).context).ops.poll_cq.expect("poll_cq slot") };
    let t0 = Instant::now();
    loop {
        // SAFETY: ibv_wc is plain data.
        let mut w: ibv_wc = unsafe { std::mem::zeroed() };
        // SAFETY: one entry.
        let n = unsafe { f(cq, 1, &mut w) };
        assert!(n >= 0);
        if n == 1 {
            return w;
        }
        assert!(t0.elapsed() < T, "no completion within {T:?}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// No completion on `cq` for a little while.
unsafe fn none(cq: *mut ibv_cq) {
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: as in `wc`.
    let f = unsafe { (*(*cq).context).ops.poll_cq.unwrap() };
    // SAFETY: ibv_wc is plain data.
    let mut w: ibv_wc = unsafe { std::mem::zeroed() };
    // SAFETY: one entry.
    assert_eq!(unsafe { f(cq, 1, &mut w) }, 0, "unexpected wc {}", w.wr_id);
}

unsafe fn notify(cq: *mut ibv_cq, solicited: bool) {
    // SAFETY: as in `wc`.
    let f = unsafe { (*(*cq).context).ops.req_notify_cq.unwrap() };
    // SAFETY: our CQ.
    assert_eq!(unsafe { f(cq, i32::from(solicited)) }, 0);
}

fn sge(addr: *const u8, len: usize, lkey: u32) -> ibv_sge {
    ibv_sge {
        addr: addr as u64,
        length: len as u32,
        lkey,
    }
}

fn send_wr(wr_id: u64, sg: &mut [ibv_sge], opcode: u32, flags: u32) -> ibv_send_wr {
    // SAFETY: ibv_send_wr is plain data and pointers: zero is valid.
    let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
    w.wr_id = wr_id;
    w.sg_list = sg.as_mut_ptr();
    w.num_sge = sg.len() as i32;
    w.opcode = opcode;
    w.send_flags = flags;
    w
}

fn recv_wr(wr_id: u64, sg: &mut [ibv_sge]) -> ibv_recv_wr {
    ibv_recv_wr {
        wr_id,
        next: null_mut(),
        sg_list: sg.as_mut_ptr(),
        num_sge: sg.len() as i32,
    }
}

struct Side {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    ch: *mut ibv_comp_channel,
    scq: *mut ibv_cq,
    rcq: *mut ibv_cq,
    qp: *mut ibv_qp,
}

unsafe fn side(ctx: *mut ibv_context, tag: usize) -> Side {
    // SAFETY: our context; the attributes are local.
    unsafe {
        let pd = ibv_alloc_pd(ctx);
        assert!(!pd.is_null(), "alloc_pd: {}", errno());
        let ch = ibv_create_comp_channel(ctx);
        assert!(!ch.is_null());
        let scq = ibv_create_cq(ctx, 64, null_mut(), null_mut(), 0);
        let rcq = ibv_create_cq(ctx, 64, tag as *mut _, ch, 0);
        assert!(!scq.is_null() && !rcq.is_null());
        let mut a: ibv_qp_init_attr = std::mem::zeroed();
        a.send_cq = scq;
        a.recv_cq = rcq;
        a.qp_type = IBV_QPT_RC;
        a.cap = ibv_qp_cap {
            max_send_wr: 32,
            max_recv_wr: 32,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        };
        let qp = ibv_create_qp(pd, &mut a);
        assert!(!qp.is_null(), "create_qp: {}", errno());
        assert_eq!((*qp).state, IBV_QPS_RESET);
        assert_eq!(a.cap.max_send_wr, 32);
        Side {
            ctx,
            pd,
            ch,
            scq,
            rcq,
            qp,
        }
    }
}

/// Move a QP to INIT (as rdma_create_qp does).
unsafe fn to_init(qp: *mut ibv_qp) {
    // SAFETY: plain data.
    let mut at: ibv_qp_attr = unsafe { std::mem::zeroed() };
    at.qp_state = IBV_QPS_INIT;
    at.qp_access_flags = RW as u32;
    // SAFETY: our QP.
    let r = unsafe {
        ibv_modify_qp(
            qp,
            &mut at,
            (IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PORT) as i32,
        )
    };
    assert_eq!(r, 0);
}

/// An anonymous mapping of `len` bytes.
fn mmap(len: usize, prot: i32) -> *mut u8 {
    // SAFETY: a fresh private anonymous mapping.
    let p = unsafe {
        libc::mmap(
            null_mut(),
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

#[test]
fn data_moves_through_the_ops_table() {
    let (ea, eb) = engines();
    let (ca, cb) = (open(&ea), open(&eb));
    // SAFETY: every pointer below is one of ours or a local buffer that outlives its MR.
    unsafe {
        let a = side(ca, 0xa);
        let b = side(cb, 0xb);
        for s in [&a, &b] {
            to_init(s.qp);
        }

        // Memory: A sends from heap + stack, B receives into an mmap'ed region.
        let heap = pattern(1, 8192);
        let mut stack = [0u8; 3000];
        stack.copy_from_slice(&pattern(2, 3000));
        let rlen = 1 << 16;
        let rbuf = mmap(rlen, libc::PROT_READ | libc::PROT_WRITE);
        let mut abuf = vec![0u8; 1 << 16];
        let mr_heap = ibv_reg_mr(a.pd, heap.as_ptr() as *mut _, heap.len(), 0);
        let mr_stack = ibv_reg_mr(a.pd, stack.as_mut_ptr().cast(), stack.len(), 0);
        let mr_abuf = ibv_reg_mr(a.pd, abuf.as_mut_ptr().cast(), abuf.len(), RW);
        let mr_r = ibv_reg_mr_iova2(
            b.pd,
            rbuf.cast(),
            rlen,
            rbuf as u64,
            RW as u32 | IBV_ACCESS_RELAXED_ORDERING,
        );
        for m in [mr_heap, mr_stack, mr_abuf, mr_r] {
            assert!(!m.is_null(), "reg_mr: {}", errno());
        }
        assert_eq!((*mr_r).addr, rbuf.cast());
        assert_eq!((*mr_r).length, rlen);
        assert_eq!((*mr_r).lkey, (*mr_r).rkey);

        // Connect with the engine's own CM (librdmacm's job under a real program).
        let at = SocketAddr::from(([10, 77, 0, 2], 7471));
        let listener = eb.device().listen(at, 4).unwrap();
        let qa = testing::queue_pair(a.qp).unwrap();
        let qb = testing::queue_pair(b.qp).unwrap();
        qa.connect(
            at,
            ConnectParams {
                private_data: vec![],
                timeout: T,
            },
        )
        .unwrap();
        listener.get_request(T).unwrap().accept(qb, b"").unwrap();
        for (q, p) in [(qa, a.qp), (qb, b.qp)] {
            match q.next_event(T).unwrap() {
                CmEvent::Established { .. } => testing::set_qp_state(p, IBV_QPS_RTS),
                e => panic!("expected Established, got {e:?}"),
            }
        }
        // The program may change the public context fields after creation (rdma-core
        // returns the current `(*cq)->cq_context` and `qp->qp_context`).
        (*a.qp).qp_context = 0xa11 as *mut _;
        (*b.rcq).cq_context = 0xb0b as *mut _;
        let mut qa_attr: ibv_qp_attr = std::mem::zeroed();
        let mut qa_init: ibv_qp_init_attr = std::mem::zeroed();
        assert_eq!(
            ibv_query_qp(a.qp, &mut qa_attr, IBV_QP_STATE as i32, &mut qa_init),
            0
        );
        assert_eq!(qa_init.qp_context as usize, 0xa11, "the current qp_context");
        assert_eq!(qa_attr.qp_state, IBV_QPS_RTS);
        assert_eq!(qa_init.send_cq, a.scq);
        assert_eq!(qa_init.cap.max_send_sge, 2);

        // 1. Send, two SGEs (heap 5000 + stack 3000), solicited; B's receive has two SGEs
        //    in the mmap region, and B's CQ is armed for solicited events only.
        let mut rsg = [
            sge(rbuf.add(100), 4000, (*mr_r).lkey),
            sge(rbuf.add(20000), 6000, (*mr_r).lkey),
        ];
        let mut rwr = recv_wr(77, &mut rsg);
        assert_eq!(post_recv(b.qp, &mut rwr).0, 0);
        notify(b.rcq, true);
        let mut ssg = [
            sge(heap.as_ptr().add(10), 5000, (*mr_heap).lkey),
            sge(stack.as_ptr(), 3000, (*mr_stack).lkey),
        ];
        let mut swr = send_wr(
            1,
            &mut ssg,
            IBV_WR_SEND,
            IBV_SEND_SIGNALED | IBV_SEND_SOLICITED,
        );
        let (r, bad) = post_send(a.qp, &mut swr);
        assert_eq!((r, bad), (0, null_mut()));
        let mut ev_cq = null_mut();
        let mut ev_ctx = null_mut();
        assert_eq!(ibv_get_cq_event(b.ch, &mut ev_cq, &mut ev_ctx), 0);
        assert_eq!(
            (ev_cq, ev_ctx as usize),
            (b.rcq, 0xb0b),
            "the current cq_context"
        );
        ibv_ack_cq_events(b.rcq, 1);
        let w = wc(b.rcq);
        assert_eq!(
            (w.wr_id, w.status, w.opcode, w.byte_len, w.qp_num, w.wc_flags),
            (77, IBV_WC_SUCCESS, IBV_WC_RECV, 8000, (*b.qp).qp_num, 0)
        );
        let w = wc(a.scq);
        assert_eq!(
            (w.wr_id, w.status, w.opcode, w.byte_len, w.qp_num),
            (1, IBV_WC_SUCCESS, IBV_WC_SEND, 8000, (*a.qp).qp_num)
        );
        let mut want = heap[10..5010].to_vec();
        want.extend_from_slice(&stack);
        let got1 = std::slice::from_raw_parts(rbuf.add(100), 4000);
        let got2 = std::slice::from_raw_parts(rbuf.add(20000), 4000);
        assert!(got1 == &want[..4000] && got2 == &want[4000..], "Send data");
        assert_eq!(*rbuf.add(99), 0, "nothing before the first SGE");
        assert_eq!(*rbuf.add(24000), 0, "nothing after the message");

        // 2. Three unsignaled Writes and a signaled one into B's region: one completion.
        let chunks = [(0usize, 1000usize), (1000, 2500), (3500, 500), (4000, 4192)];
        let mut wrs: Vec<ibv_send_wr> = Vec::new();
        let mut sgs: Vec<[ibv_sge; 1]> = chunks
            .iter()
            .map(|&(o, l)| [sge(heap.as_ptr().add(o), l, (*mr_heap).lkey)])
            .collect();
        for (i, (&(o, _), sg)) in chunks.iter().zip(sgs.iter_mut()).enumerate() {
            let last = i == chunks.len() - 1;
            let mut w = send_wr(
                10 + i as u64,
                sg,
                IBV_WR_RDMA_WRITE,
                if last { IBV_SEND_SIGNALED } else { 0 },
            );
            w.wr.rdma = ibv_send_wr_rdma {
                remote_addr: rbuf as u64 + 30000 + o as u64,
                rkey: (*mr_r).rkey,
            };
            wrs.push(w);
        }
        for i in 0..wrs.len() - 1 {
            let next: *mut ibv_send_wr = &mut wrs[i + 1];
            wrs[i].next = next;
        }
        assert_eq!(post_send(a.qp, wrs.as_mut_ptr()).0, 0, "a chain of four");
        let w = wc(a.scq);
        assert_eq!(
            (w.wr_id, w.status, w.opcode, w.byte_len),
            (13, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, 4192)
        );
        none(a.scq);
        assert!(
            std::slice::from_raw_parts(rbuf.add(30000), 8192) == &heap[..],
            "Write data"
        );

        // 3. RDMA Read of B's region back into A's buffer.
        let mut rdsg = [sge(abuf.as_ptr().add(50), 8192, (*mr_abuf).lkey)];
        let mut rd = send_wr(20, &mut rdsg, IBV_WR_RDMA_READ, IBV_SEND_SIGNALED);
        rd.wr.rdma = ibv_send_wr_rdma {
            remote_addr: rbuf as u64 + 30000,
            rkey: (*mr_r).rkey,
        };
        assert_eq!(post_send(a.qp, &mut rd).0, 0);
        let w = wc(a.scq);
        assert_eq!(
            (w.wr_id, w.status, w.opcode, w.byte_len),
            (20, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, 8192)
        );
        assert!(
            std::slice::from_raw_parts(abuf.as_ptr().add(50), 8192) == &heap[..],
            "Read data"
        );

        // 4. Inline Send from unregistered memory, overwritten right after the post.
        let mut rsg = [sge(rbuf.add(40000), 64, (*mr_r).lkey)];
        let mut rwr = recv_wr(78, &mut rsg);
        assert_eq!(post_recv(b.qp, &mut rwr).0, 0);
        let mut src = pattern(3, 60);
        let orig = src.clone();
        let mut isg = [sge(src.as_ptr(), 60, 0)];
        let mut iw = send_wr(30, &mut isg, IBV_WR_SEND, IBV_SEND_INLINE);
        assert_eq!(post_send(a.qp, &mut iw).0, 0);
        src.fill(0xee);
        let w = wc(b.rcq);
        assert_eq!((w.wr_id, w.status, w.byte_len), (78, IBV_WC_SUCCESS, 60));
        assert!(
            std::slice::from_raw_parts(rbuf.add(40000), 60) == &orig[..],
            "inline data"
        );
        none(a.scq);

        // 5. A Send from a bad lkey: a local protection error, which moves the QP to
        //    ERROR (IBV_EVENT_QP_FATAL on A's async fd), and the QP flushes what follows.
        let mut bsg = [sge(heap.as_ptr(), 16, (*mr_heap).lkey ^ 0x5500)];
        let mut bw = send_wr(40, &mut bsg, IBV_WR_SEND, IBV_SEND_SIGNALED);
        assert_eq!(post_send(a.qp, &mut bw).0, 0);
        let w = wc(a.scq);
        assert_eq!(
            (w.wr_id, w.status, w.opcode),
            (40, IBV_WC_LOC_PROT_ERR, IBV_WC_SEND),
            "{}",
            w.status
        );
        let mut ev: ibv_async_event = std::mem::zeroed();
        assert_eq!(ibv_get_async_event(ca, &mut ev), 0);
        assert_eq!(ev.event_type, IBV_EVENT_QP_FATAL);
        assert_eq!(ev.element.qp, a.qp);
        ibv_ack_async_event(&mut ev);
        let t0 = Instant::now();
        loop {
            let mut at: ibv_qp_attr = std::mem::zeroed();
            assert_eq!(ibv_query_qp(a.qp, &mut at, 0, null_mut()), 0);
            if at.qp_state == IBV_QPS_ERR {
                assert_eq!((*a.qp).state, IBV_QPS_ERR);
                break;
            }
            assert!(t0.elapsed() < T, "A never reached ERROR: {}", at.qp_state);
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut fw = send_wr(41, &mut bsg, IBV_WR_SEND, IBV_SEND_SIGNALED);
        assert_eq!(post_send(a.qp, &mut fw).0, 0);
        let w = wc(a.scq);
        assert_eq!((w.wr_id, w.status), (41, IBV_WC_WR_FLUSH_ERR));

        // Teardown in an order libibverbs accepts; the in-use checks on the way.
        assert_eq!(ibv_dealloc_pd(a.pd), libc::EBUSY);
        assert_eq!(ibv_destroy_cq(a.scq), libc::EBUSY, "the QP uses it");
        for s in [&a, &b] {
            assert_eq!(ibv_destroy_qp(s.qp), 0);
        }
        for m in [mr_heap, mr_stack, mr_abuf, mr_r] {
            assert_eq!(ibv_dereg_mr(m), 0);
        }
        assert_eq!(ibv_dereg_mr(mr_r), libc::EINVAL, "already deregistered");
        // The engine let go of the mmap'ed memory: unmapping it is safe now.
        assert_eq!(libc::munmap(rbuf.cast(), rlen), 0);
        for s in [a, b] {
            assert_eq!(ibv_destroy_comp_channel(s.ch), libc::EBUSY);
            assert_eq!(ibv_destroy_cq(s.scq), 0);
            assert_eq!(ibv_destroy_cq(s.rcq), 0);
            assert_eq!(ibv_destroy_comp_channel(s.ch), 0);
            assert_eq!(ibv_dealloc_pd(s.pd), 0);
            assert_eq!(ibv_close_device(s.ctx), 0);
        }
    }
}

#[test]
fn errors_as_libibverbs() {
    let (ea, _eb) = engines();
    let ctx = open(&ea);
    // SAFETY: the pointers are ours, NULL, or deliberately foreign (never dereferenced by
    // the library); the buffers outlive their MRs.
    unsafe {
        // PDs.
        assert!(ibv_alloc_pd(null_mut()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let mut junk = [0u64; 64];
        assert!(ibv_alloc_pd(junk.as_mut_ptr().cast()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let pd = ibv_alloc_pd(ctx);
        assert!(!pd.is_null());
        assert_eq!(ibv_dealloc_pd(junk.as_mut_ptr().cast()), libc::EINVAL);

        // MRs: flags as ib_check_mr_access, ranges as the kernel's pinning.
        let mut buf = vec![0u8; 4096];
        let b = buf.as_mut_ptr().cast();
        let reg_err = |pd, addr, len, acc| {
            let m = ibv_reg_mr(pd, addr, len, acc);
            assert!(m.is_null(), "reg_mr({acc:#x}) succeeded");
            errno()
        };
        assert_eq!(reg_err(null_mut(), b, 4096, 0), libc::EINVAL, "NULL pd");
        assert_eq!(
            reg_err(pd, b, 4096, IBV_ACCESS_REMOTE_WRITE as i32),
            libc::EINVAL,
            "remote write without local write"
        );
        assert_eq!(reg_err(pd, b, 4096, 1 << 14), libc::EINVAL, "unknown bit");
        assert_eq!(
            reg_err(pd, b, 4096, IBV_ACCESS_ON_DEMAND as i32),
            libc::EOPNOTSUPP
        );
        assert_eq!(reg_err(pd, b, 0, 0), libc::EINVAL, "length 0");
        assert_eq!(
            reg_err(pd, 0x1000 as *mut _, 4096, 0),
            libc::EFAULT,
            "unmapped"
        );
        let ro = mmap(8192, libc::PROT_READ);
        assert_eq!(
            reg_err(pd, ro.cast(), 8192, IBV_ACCESS_LOCAL_WRITE as i32),
            libc::EFAULT,
            "read-only memory the engine may write"
        );
        let ro_mr = ibv_reg_mr(pd, ro.cast(), 8192, IBV_ACCESS_REMOTE_READ as i32);
        assert!(
            !ro_mr.is_null(),
            "read-only memory for remote reads: {}",
            errno()
        );
        assert!(ibv_reg_mr_iova2(pd, b, 4096, 0, 0).is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP, "iova != addr");
        let mr = ibv_reg_mr(pd, b, 4096, RW);
        assert!(!mr.is_null());
        assert_eq!(ibv_dealloc_pd(pd), libc::EBUSY, "MRs of the PD exist");
        assert_eq!(ibv_dereg_mr(null_mut()), libc::EINVAL);
        assert_eq!(ibv_dereg_mr(ro_mr), 0);

        // Channels and CQs.
        let ch = ibv_create_comp_channel(ctx);
        assert!(!ch.is_null());
        assert!(ibv_create_comp_channel(null_mut()).is_null());
        assert!(ibv_create_cq(ctx, 0, null_mut(), null_mut(), 0).is_null());
        assert_eq!(errno(), libc::EINVAL, "cqe 0");
        assert!(ibv_create_cq(ctx, 16, null_mut(), null_mut(), 1).is_null());
        assert_eq!(errno(), libc::EINVAL, "comp_vector 1 of 1");
        assert!(ibv_create_cq(ctx, 16, null_mut(), junk.as_mut_ptr().cast(), 0).is_null());
        assert_eq!(errno(), libc::EINVAL, "foreign channel");
        let cq = ibv_create_cq(ctx, 16, null_mut(), ch, 0);
        assert!(!cq.is_null());
        assert_eq!((*ch).refcnt, 1);
        assert_eq!(ibv_resize_cq(cq, 64), 0);
        assert_eq!((*cq).cqe, 64);
        assert_eq!(ibv_resize_cq(cq, 0), libc::EINVAL);
        assert_eq!(ibv_destroy_comp_channel(ch), libc::EBUSY);

        // The channel fd is non-blocking when the program makes it so; poll(2) works.
        let fl = libc::fcntl((*ch).fd, libc::F_GETFL);
        assert_eq!(
            libc::fcntl((*ch).fd, libc::F_SETFL, fl | libc::O_NONBLOCK),
            0
        );
        let (mut ecq, mut ectx) = (null_mut(), null_mut());
        assert_eq!(ibv_get_cq_event(ch, &mut ecq, &mut ectx), -1);
        assert_eq!(errno(), libc::EAGAIN);
        let mut pfd = libc::pollfd {
            fd: (*ch).fd,
            events: libc::POLLIN,
            revents: 0,
        };
        assert_eq!(libc::poll(&mut pfd, 1, 0), 0, "nothing yet");

        // QPs.
        let mut qa: ibv_qp_init_attr = std::mem::zeroed();
        qa.send_cq = cq;
        qa.recv_cq = cq;
        qa.qp_type = IBV_QPT_UD;
        qa.cap = ibv_qp_cap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 16,
        };
        assert!(ibv_create_qp(pd, &mut qa).is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP, "UD");
        qa.qp_type = IBV_QPT_RC;
        assert!(ibv_create_qp(null_mut(), &mut qa).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(ibv_create_qp(pd, null_mut()).is_null());
        let mut big = std::ptr::read(&qa);
        big.cap.max_send_sge = 17;
        assert!(ibv_create_qp(pd, &mut big).is_null());
        assert_eq!(errno(), libc::EINVAL, "17 SGEs");
        let mut big = std::ptr::read(&qa);
        big.cap.max_inline_data = 1 << 20;
        assert!(ibv_create_qp(pd, &mut big).is_null());
        assert_eq!(errno(), libc::EINVAL, "inline 1 MiB");
        let mut nocq = std::ptr::read(&qa);
        nocq.recv_cq = null_mut();
        assert!(ibv_create_qp(pd, &mut nocq).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let qp = ibv_create_qp(pd, &mut qa);
        assert!(!qp.is_null());
        assert_eq!((*qp).qp_type, IBV_QPT_RC);
        assert_eq!((*qp).context, ctx);

        // Posts to a QP in RESET.
        let mut sg = [sge(buf.as_ptr(), 8, (*mr).lkey)];
        let mut rw = recv_wr(1, &mut sg);
        assert_eq!(post_recv(qp, &mut rw), (libc::EINVAL, &mut rw as *mut _));
        let mut sw = send_wr(2, &mut sg, IBV_WR_SEND, IBV_SEND_SIGNALED);
        assert_eq!(post_send(qp, &mut sw), (libc::EINVAL, &mut sw as *mut _));

        // RESET -> INIT -> RTR are accepted, RTS is not (iWARP: rdma_cm connects).
        let mut at: ibv_qp_attr = std::mem::zeroed();
        for st in [IBV_QPS_INIT, IBV_QPS_RTR] {
            at.qp_state = st;
            assert_eq!(ibv_modify_qp(qp, &mut at, IBV_QP_STATE as i32), 0);
            assert_eq!((*qp).state, st);
            let mut q: ibv_qp_attr = std::mem::zeroed();
            assert_eq!(ibv_query_qp(qp, &mut q, IBV_QP_STATE as i32, null_mut()), 0);
            assert_eq!(q.qp_state, st);
            assert_eq!(q.cap.max_send_sge, 1);
            assert_eq!(q.port_num, 1);
        }
        at.qp_state = IBV_QPS_RTS;
        assert_eq!(
            ibv_modify_qp(qp, &mut at, IBV_QP_STATE as i32),
            libc::EINVAL
        );
        assert_eq!(
            ibv_modify_qp(qp, &mut at, 1 << 25),
            libc::EOPNOTSUPP,
            "rate limit"
        );
        assert_eq!(
            ibv_modify_qp(qp, &mut at, 0),
            0,
            "empty mask: nothing happens"
        );
        assert_eq!(ibv_modify_qp(null_mut(), &mut at, 0), libc::EINVAL);

        // Post errors: the first bad WR of a chain is returned, the ones before it posted.
        let mut sg2 = [sg[0], sg[0]];
        let mut r2 = recv_wr(4, &mut sg2);
        let mut r1 = recv_wr(3, &mut sg);
        r1.next = &mut r2;
        assert_eq!(
            post_recv(qp, &mut r1),
            (libc::EINVAL, &mut r2 as *mut _),
            "2 SGEs > 1"
        );
        let bad_send = |w: &mut ibv_send_wr| post_send(qp, w).0;
        assert_eq!(
            bad_send(&mut send_wr(5, &mut sg2, IBV_WR_SEND, 0)),
            libc::EINVAL,
            "too many SGEs"
        );
        let big_src = [7u8; 32];
        let mut bsg = [sge(big_src.as_ptr(), 32, 0)];
        assert_eq!(
            bad_send(&mut send_wr(6, &mut bsg, IBV_WR_SEND, IBV_SEND_INLINE)),
            libc::EINVAL,
            "inline 32 > 16"
        );
        assert_eq!(
            bad_send(&mut send_wr(7, &mut sg, IBV_WR_SEND_WITH_IMM, 0)),
            libc::EOPNOTSUPP
        );
        assert_eq!(
            bad_send(&mut send_wr(8, &mut sg, IBV_WR_ATOMIC_FETCH_AND_ADD, 0)),
            libc::EOPNOTSUPP
        );
        assert_eq!(bad_send(&mut send_wr(9, &mut sg, 99, 0)), libc::EINVAL);
        assert_eq!(
            bad_send(&mut send_wr(10, &mut sg, IBV_WR_RDMA_READ, IBV_SEND_INLINE)),
            libc::EINVAL
        );
        let mut nul = send_wr(11, &mut sg, IBV_WR_SEND, 0);
        nul.sg_list = null_mut();
        assert_eq!(bad_send(&mut nul), libc::EINVAL, "NULL SGE list");

        // ERROR flushes the posted receive (wr 3); the armed CQ fires the channel.
        notify(cq, false);
        at.qp_state = IBV_QPS_ERR;
        assert_eq!(ibv_modify_qp(qp, &mut at, IBV_QP_STATE as i32), 0);
        assert_eq!(libc::poll(&mut pfd, 1, 5000), 1, "channel fd readable");
        assert_eq!(ibv_get_cq_event(ch, &mut ecq, &mut ectx), 0);
        assert_eq!(ecq, cq);
        let w = wc(cq);
        assert_eq!(
            (w.wr_id, w.status, w.opcode, w.qp_num),
            (3, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, (*qp).qp_num)
        );
        assert_eq!(
            CStr::from_ptr(ibv_wc_status_str(w.status))
                .to_str()
                .unwrap(),
            "Work Request Flushed Error"
        );
        let mut sw = send_wr(12, &mut sg, IBV_WR_SEND, IBV_SEND_SIGNALED);
        assert_eq!(post_send(qp, &mut sw).0, 0, "posting in ERROR flushes");
        let w = wc(cq);
        assert_eq!((w.wr_id, w.status), (12, IBV_WC_WR_FLUSH_ERR));
        at.qp_state = IBV_QPS_RESET;
        assert_eq!(
            ibv_modify_qp(qp, &mut at, IBV_QP_STATE as i32),
            0,
            "reset from ERROR"
        );
        assert_eq!((*qp).state, IBV_QPS_RESET);

        // Destroying the CQ waits for the unacked event (after the QP, which uses it).
        assert_eq!(ibv_destroy_cq(cq), libc::EBUSY);
        assert_eq!(ibv_destroy_qp(qp), 0);
        assert_eq!(ibv_destroy_qp(qp), libc::EINVAL, "twice");
        let cq_addr = cq as usize;
        let t = std::thread::spawn(move || ibv_destroy_cq(cq_addr as *mut ibv_cq));
        std::thread::sleep(Duration::from_millis(300));
        assert!(!t.is_finished(), "destroy returned with an event unacked");
        ibv_ack_cq_events(cq, 1);
        assert_eq!(t.join().unwrap(), 0);
        assert_eq!(ibv_destroy_comp_channel(ch), 0);

        // SRQs.
        let mut sa: ibv_srq_init_attr = std::mem::zeroed();
        sa.attr.max_wr = 0;
        assert!(ibv_create_srq(pd, &mut sa).is_null());
        assert_eq!(errno(), libc::EINVAL);
        sa.attr = ibv_srq_attr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 0,
        };
        let srq = ibv_create_srq(pd, &mut sa);
        assert!(!srq.is_null());
        let mut q = ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: 9,
        };
        assert_eq!(ibv_query_srq(srq, &mut q), 0);
        assert_eq!((q.max_wr, q.max_sge, q.srq_limit), (8, 1, 0));
        assert_eq!(
            ibv_modify_srq(srq, &mut q, IBV_SRQ_MAX_WR as i32),
            libc::EOPNOTSUPP
        );
        assert_eq!(
            ibv_modify_srq(srq, &mut q, IBV_SRQ_LIMIT as i32),
            libc::EOPNOTSUPP
        );
        let f = (*ctx).ops.post_srq_recv.unwrap();
        let mut bad = null_mut();
        let mut r2 = recv_wr(20, &mut sg2);
        assert_eq!(f(srq, &mut r2, &mut bad), libc::EINVAL, "2 SGEs > 1");
        assert_eq!(bad, &mut r2 as *mut _);
        let mut r1 = recv_wr(21, &mut sg);
        assert_eq!(f(srq, &mut r1, &mut bad), 0);
        let cq2 = ibv_create_cq(ctx, 4, null_mut(), null_mut(), 0);
        let mut qs = std::ptr::read(&qa);
        qs.send_cq = cq2;
        qs.recv_cq = cq2;
        qs.srq = srq;
        let qp2 = ibv_create_qp(pd, &mut qs);
        assert!(!qp2.is_null(), "{}", errno());
        assert_eq!(qs.cap.max_recv_wr, 0);
        to_init(qp2);
        let mut rw = recv_wr(22, &mut sg);
        assert_eq!(
            post_recv(qp2, &mut rw).0,
            libc::EINVAL,
            "receives go to the SRQ"
        );
        assert_eq!(ibv_destroy_srq(srq), libc::EBUSY);

        // A QP created with 0 send and 0 receive SGEs takes requests without SGEs only
        // (siw: num_sge > max_sge is EINVAL).
        let mut q0 = std::ptr::read(&qa);
        q0.send_cq = cq2;
        q0.recv_cq = cq2;
        q0.cap.max_send_sge = 0;
        q0.cap.max_recv_sge = 0;
        let qp0 = ibv_create_qp(pd, &mut q0);
        assert!(!qp0.is_null(), "{}", errno());
        to_init(qp0);
        let mut w1 = recv_wr(30, &mut sg);
        assert_eq!(post_recv(qp0, &mut w1).0, libc::EINVAL, "1 SGE > 0");
        let mut w0 = recv_wr(31, &mut []);
        assert_eq!(post_recv(qp0, &mut w0).0, 0, "no SGE");
        let mut s1 = send_wr(32, &mut sg, IBV_WR_SEND, 0);
        assert_eq!(post_send(qp0, &mut s1).0, libc::EINVAL, "1 send SGE > 0");
        assert_eq!(ibv_destroy_qp(qp0), 0);
        assert_eq!(ibv_destroy_qp(qp2), 0);
        assert_eq!(ibv_destroy_srq(srq), 0);
        assert_eq!(ibv_destroy_cq(cq2), 0);

        // Async events: nothing queued; non-blocking fd.
        let afd = (*ctx).async_fd;
        let fl = libc::fcntl(afd, libc::F_GETFL);
        assert_eq!(libc::fcntl(afd, libc::F_SETFL, fl | libc::O_NONBLOCK), 0);
        let mut ev: ibv_async_event = std::mem::zeroed();
        assert_eq!(ibv_get_async_event(ctx, &mut ev), -1);
        assert_eq!(errno(), libc::EAGAIN);

        // The small verbs.
        assert_eq!(ibv_fork_init(), 0);
        assert_eq!(ibv_is_fork_initialized(), IBV_FORK_UNNEEDED);
        let mut pkey = 0u16;
        assert_eq!(ibv_query_pkey(ctx, 1, 0, &mut pkey), 0);
        assert_eq!(pkey, 0xffff);
        assert_eq!(ibv_query_pkey(ctx, 1, 1, &mut pkey), -1);
        let mut ge: ibv_gid_entry = std::mem::zeroed();
        let sz = std::mem::size_of::<ibv_gid_entry>();
        assert_eq!(_ibv_query_gid_ex(ctx, 1, 0, &mut ge, 0, sz), 0);
        assert_eq!(
            (ge.gid_index, ge.port_num, ge.gid_type),
            (0, 1, IBV_GID_TYPE_IB)
        );
        assert_eq!(ge.ndev_ifindex, 1, "lo");
        assert_eq!(_ibv_query_gid_ex(ctx, 1, 1, &mut ge, 0, sz), libc::ENODATA);
        assert_eq!(_ibv_query_gid_ex(ctx, 1, 0, &mut ge, 1, sz), libc::EINVAL);
        assert_eq!(
            CStr::from_ptr(ibv_wc_status_str(0)).to_str().unwrap(),
            "success"
        );
        assert_eq!(
            CStr::from_ptr(ibv_wc_status_str(999)).to_str().unwrap(),
            "unknown"
        );
        assert!(ibv_create_ah(pd, null_mut()).is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);
        assert_eq!(ibv_attach_mcast(null_mut(), null(), 0), libc::EOPNOTSUPP);
        assert!(ibv_qp_to_qp_ex(null_mut()).is_null());

        assert_eq!(ibv_dereg_mr(mr), 0);
        assert_eq!(ibv_dealloc_pd(pd), 0);
        assert_eq!(libc::munmap(ro.cast(), 8192), 0);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}

/// Async events do not outlive their QP: `ibv_destroy_qp` drops the queued events naming
/// it (the kernel drops an object's unread events) and waits until the ones handed out
/// were acked (rdma-core waits on `events_completed`), so no later `ibv_get_async_event`
/// returns a freed QP pointer.
#[test]
fn async_events_do_not_outlive_their_qp() {
    let (ea, _eb) = engines();
    let ca = open(&ea);
    // SAFETY: our objects; local attributes.
    unsafe {
        let a = side(ca, 0xa);
        to_init(a.qp);
        let afd = (*ca).async_fd;
        let fl = libc::fcntl(afd, libc::F_GETFL);
        assert_eq!(libc::fcntl(afd, libc::F_SETFL, fl | libc::O_NONBLOCK), 0);

        // 1. Queued, never read: destroy drops it.
        testing::report_qp_fatal(a.qp);
        let mut pfd = libc::pollfd {
            fd: afd,
            events: libc::POLLIN,
            revents: 0,
        };
        assert_eq!(libc::poll(&mut pfd, 1, 0), 1, "the event is queued");
        assert_eq!(ibv_destroy_qp(a.qp), 0);
        let mut ev: ibv_async_event = std::mem::zeroed();
        assert_eq!(
            ibv_get_async_event(ca, &mut ev),
            -1,
            "the destroyed QP's event"
        );
        assert_eq!(errno(), libc::EAGAIN);
        pfd.revents = 0;
        assert_eq!(libc::poll(&mut pfd, 1, 0), 0, "async_fd no longer readable");

        // 2. Handed out, not yet acked: destroy waits for the ack.
        let mut qa: ibv_qp_init_attr = std::mem::zeroed();
        qa.send_cq = a.scq;
        qa.recv_cq = a.rcq;
        qa.qp_type = IBV_QPT_RC;
        qa.cap.max_send_wr = 4;
        qa.cap.max_recv_wr = 4;
        qa.cap.max_send_sge = 1;
        qa.cap.max_recv_sge = 1;
        let qp2 = ibv_create_qp(a.pd, &mut qa);
        assert!(!qp2.is_null(), "{}", errno());
        testing::report_qp_fatal(qp2);
        assert_eq!(ibv_get_async_event(ca, &mut ev), 0);
        assert_eq!((ev.event_type, ev.element.qp), (IBV_EVENT_QP_FATAL, qp2));
        let q = qp2 as usize;
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            // SAFETY: our QP, destroyed once.
            let r = ibv_destroy_qp(q as *mut ibv_qp);
            tx.send(r).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "destroy returned before the event was acked"
        );
        ibv_ack_async_event(&mut ev);
        assert_eq!(rx.recv_timeout(T).expect("destroy after the ack"), 0);
        t.join().unwrap();
        assert_eq!(ibv_get_async_event(ca, &mut ev), -1);
        assert_eq!(errno(), libc::EAGAIN);

        assert_eq!(ibv_destroy_cq(a.scq), 0);
        assert_eq!(ibv_destroy_cq(a.rcq), 0);
        assert_eq!(ibv_destroy_comp_channel(a.ch), 0);
        assert_eq!(ibv_dealloc_pd(a.pd), 0);
        assert_eq!(ibv_close_device(ca), 0);
    }
}
