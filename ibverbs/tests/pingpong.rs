//! A Send ping-pong through the context's ops table, as `ib_send_lat` runs it: each
//! round, one side posts a receive, sends a 64-byte message (inline, or from two SGEs of a
//! registered buffer), the other polls the receive, checks every byte, re-posts its
//! receive and sends the message back, which the first checks in turn. Two xwarp verbs
//! engines on the in-process virtual wire (no privileges needed).
//!
//! `XWARP_PINGPONG_ROUNDS` (default 300) sets the rounds, for counting the instructions
//! of the data-path calls per operation (`valgrind --tool=callgrind
//! --toggle-collect='*post_send*'` etc.; ibverbs/README.md, "Data-path cost").

use std::net::SocketAddr;
use std::ptr::null_mut;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use xwarp_ibverbs::abi::*;
use xwarp_ibverbs::cq::*;
use xwarp_ibverbs::exports::*;
use xwarp_ibverbs::mr::*;
use xwarp_ibverbs::pd::*;
use xwarp_ibverbs::qp::*;
use xwarp_ibverbs::testing;
use xwarp_poll_driver::vwire::VirtualNic;
use xwarp_verbs::{vwire_pair_simple, CmEvent, ConnectParams, Context};

const T: Duration = Duration::from_secs(30);
const SIZE: usize = 64;

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

fn open(ctx: &Context<VirtualNic>) -> *mut ibv_context {
    // SAFETY: a device of the list.
    let c = unsafe { testing::open_on(device(), ctx.device().clone()) };
    assert!(!c.is_null());
    c
}

fn rounds() -> usize {
    std::env::var("XWARP_PINGPONG_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// Round `i`'s message: distinct in every byte position and round.
fn message(i: usize, from_a: bool) -> [u8; SIZE] {
    let mut m = [0u8; SIZE];
    for (k, b) in m.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31) ^ (k as u8).wrapping_mul(7) ^ u8::from(from_a) << 7;
    }
    m
}

struct Side {
    scq: *mut ibv_cq,
    rcq: *mut ibv_cq,
    qp: *mut ibv_qp,
    /// Send buffer (two SGEs of 32 bytes for the non-inline variant) and receive buffer.
    sbuf: Box<[u8; SIZE]>,
    rbuf: Box<[u8; SIZE]>,
    smr: *mut ibv_mr,
    rmr: *mut ibv_mr,
}

// SAFETY: the library's objects may be used from any thread (as libibverbs'); each side
// is used by one thread at a time.
unsafe impl Send for Side {}

unsafe fn side(ctx: *mut ibv_context) -> Side {
    // SAFETY: our context; the attributes are local; the buffers outlive their MRs.
    unsafe {
        let pd = ibv_alloc_pd(ctx);
        assert!(!pd.is_null(), "alloc_pd: {}", errno());
        let scq = ibv_create_cq(ctx, 16, null_mut(), null_mut(), 0);
        let rcq = ibv_create_cq(ctx, 16, null_mut(), null_mut(), 0);
        assert!(!scq.is_null() && !rcq.is_null());
        let mut a: ibv_qp_init_attr = std::mem::zeroed();
        a.send_cq = scq;
        a.recv_cq = rcq;
        a.qp_type = IBV_QPT_RC;
        a.cap = ibv_qp_cap {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: SIZE as u32,
        };
        let qp = ibv_create_qp(pd, &mut a);
        assert!(!qp.is_null(), "create_qp: {}", errno());
        let mut at: ibv_qp_attr = std::mem::zeroed();
        at.qp_state = IBV_QPS_INIT;
        at.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
        let mask = (IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PORT) as i32;
        assert_eq!(ibv_modify_qp(qp, &mut at, mask), 0);
        let mut sbuf = Box::new([0u8; SIZE]);
        let mut rbuf = Box::new([0u8; SIZE]);
        let smr = ibv_reg_mr(pd, sbuf.as_mut_ptr().cast(), SIZE, 0);
        let rmr = ibv_reg_mr(
            pd,
            rbuf.as_mut_ptr().cast(),
            SIZE,
            IBV_ACCESS_LOCAL_WRITE as i32,
        );
        assert!(!smr.is_null() && !rmr.is_null(), "reg_mr: {}", errno());
        Side {
            scq,
            rcq,
            qp,
            sbuf,
            rbuf,
            smr,
            rmr,
        }
    }
}

/// Post one receive of the whole receive buffer through the ops table.
unsafe fn post_recv(s: &Side) {
    // SAFETY: our QP, its context's ops table, our registered buffer.
    unsafe {
        let mut sg = ibv_sge {
            addr: s.rbuf.as_ptr() as u64,
            length: SIZE as u32,
            lkey: (*s.rmr).lkey,
        };
        let mut wr = ibv_recv_wr {
            wr_id: 2,
            next: null_mut(),
            sg_list: &mut sg,
            num_sge: 1,
        };
        let mut bad = null_mut();
        let f = (*(*s.qp).context).ops.post_recv.expect("post_recv slot");
        assert_eq!(f(s.qp, &mut wr, &mut bad), 0, "post_recv");
    }
}

/// Send `m` (inline, or from the send buffer as two SGEs) through the ops table.
unsafe fn post_send(s: &mut Side, m: &[u8; SIZE], inline: bool) {
    // SAFETY: as in `post_recv`; for inline the SGEs point at `m`, read during the post.
    unsafe {
        let (base, lkey) = if inline {
            (m.as_ptr(), 0)
        } else {
            s.sbuf.copy_from_slice(m);
            (s.sbuf.as_ptr(), (*s.smr).lkey)
        };
        let half = (SIZE / 2) as u32;
        let mut sg = [
            ibv_sge {
                addr: base as u64,
                length: half,
                lkey,
            },
            ibv_sge {
                addr: base as u64 + u64::from(half),
                length: half,
                lkey,
            },
        ];
        let mut wr: ibv_send_wr = std::mem::zeroed();
        wr.wr_id = 1;
        wr.sg_list = sg.as_mut_ptr();
        wr.num_sge = 2;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED | if inline { IBV_SEND_INLINE } else { 0 };
        let mut bad = null_mut();
        let f = (*(*s.qp).context).ops.post_send.expect("post_send slot");
        assert_eq!(f(s.qp, &mut wr, &mut bad), 0, "post_send");
    }
}

/// Busy-poll `cq` through the ops table for one successful completion of `opcode`.
unsafe fn poll(cq: *mut ibv_cq, opcode: u32) -> ibv_wc {
    // SAFETY: our CQ's context and its ops table.
    let f = unsafe { (*(*cq).context).ops.poll_cq.expect("poll_cq slot") };
    let t0 = Instant::now();
    loop {
        // SAFETY: ibv_wc is plain data.
        let mut w: ibv_wc = unsafe { std::mem::zeroed() };
        // SAFETY: one entry.
        let n = unsafe { f(cq, 1, &mut w) };
        assert!(n >= 0);
        if n == 1 {
            assert_eq!(
                (w.status, w.opcode),
                (IBV_WC_SUCCESS, opcode),
                "wr_id {}",
                w.wr_id
            );
            return w;
        }
        assert!(t0.elapsed() < T, "no completion within {T:?}");
    }
}

fn pingpong(port: u16, inline: bool) {
    let (ea, eb) = vwire_pair_simple(Default::default()).expect("vwire pair");
    let (ca, cb) = (open(&ea), open(&eb));
    // SAFETY: every pointer is one of ours; the buffers live in the sides.
    unsafe {
        let mut a = side(ca);
        let mut b = side(cb);
        let at = SocketAddr::from(([10, 77, 0, 2], port));
        let listener = eb.device().listen(at, 4).unwrap();
        let qa = testing::queue_pair(a.qp).unwrap();
        let qb = testing::queue_pair(b.qp).unwrap();
        post_recv(&a);
        post_recv(&b);
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
        let n = rounds();
        // B answers on its own thread, as the other perftest process would.
        let echo = std::thread::spawn(move || {
            let b = &mut b;
            for i in 0..n {
                let w = poll(b.rcq, IBV_WC_RECV);
                assert_eq!(w.byte_len as usize, SIZE);
                assert_eq!(
                    *b.rbuf,
                    message(i, true),
                    "round {i}: B received other bytes"
                );
                post_recv(b);
                post_send(b, &message(i, false), inline);
                poll(b.scq, IBV_WC_SEND);
            }
            for p in [b.smr, b.rmr] {
                assert_eq!(ibv_dereg_mr(p), 0);
            }
        });
        for i in 0..n {
            post_send(&mut a, &message(i, true), inline);
            let w = poll(a.rcq, IBV_WC_RECV);
            assert_eq!(w.byte_len as usize, SIZE);
            assert_eq!(
                *a.rbuf,
                message(i, false),
                "round {i}: A received other bytes"
            );
            post_recv(&a);
            poll(a.scq, IBV_WC_SEND);
        }
        echo.join().expect("B's side");
        for p in [a.smr, a.rmr] {
            assert_eq!(ibv_dereg_mr(p), 0);
        }
    }
}

#[test]
fn inline_send_pingpong_through_the_ops_table_verifies_every_byte() {
    pingpong(7481, true);
}

#[test]
fn sge_send_pingpong_through_the_ops_table_verifies_every_byte() {
    pingpong(7482, false);
}
