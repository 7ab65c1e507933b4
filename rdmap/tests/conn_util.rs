//! Shared harness for the `conn_*` tests (and the root `wire_tshark` test): two
//! [`Connection`]s wired back to back through byte pipes that re-segment the stream at
//! random points. Included with `#[path]` by the tests that use it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Orders transmissions of all peers (for captures).
static TX_CLOCK: AtomicU64 = AtomicU64::new(0);

use xwarp_ddp::mpa::AcceptParams;
use xwarp_rdmap::conn::{ConnConfig, ConnEvent, Connection};
use xwarp_rdmap::*;

/// Small deterministic PRNG (xorshift64*), so failures reproduce from the seed.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0.max(1);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// One end: its connection, resources, PD, everything it ever sent, and events seen.
pub struct Peer {
    pub conn: Connection,
    pub res: Resources,
    pub pd: PdId,
    pub sent: Vec<u8>,
    /// Every non-empty transmit burst with its global order stamp.
    pub chunks: Vec<(u64, Vec<u8>)>,
    pub events: Vec<ConnEvent>,
    pub closed_tcp: bool,
}

pub fn qp_config(pd: PdId, ird: u32, ord: u32) -> QpConfig {
    QpConfig {
        pd,
        ird,
        ord,
        sq_depth: 256,
        rq: RqConfig::Own(256),
    }
}

impl Peer {
    /// `tweak` edits the config (CRC, markers, EMSS, P2P ...) before the connection is made.
    pub fn new(initiator: bool, now: Instant, tweak: impl FnOnce(&mut ConnConfig)) -> Peer {
        // Seeded STags: a property run and its replay must hand out the same STags.
        let mut res = Resources::with_stags(StagTable::with_seed(u64::from(initiator)));
        let pd = res.stags.alloc_pd();
        let mut cfg = ConnConfig::new(qp_config(pd, 4, 4));
        tweak(&mut cfg);
        let conn = if initiator {
            Connection::initiator(cfg, now).unwrap()
        } else {
            Connection::responder(cfg, now).unwrap()
        };
        Peer {
            conn,
            res,
            pd,
            sent: Vec::new(),
            chunks: Vec::new(),
            events: Vec::new(),
            closed_tcp: false,
        }
    }

    pub fn reg(&mut self, base: u64, data: Vec<u8>, access: Access) -> Stag {
        self.res
            .stags
            .register(self.pd, access, base, Box::new(data))
            .unwrap()
    }

    pub fn mem(&self, stag: Stag) -> Vec<u8> {
        let r = self.res.stags.region(stag).unwrap();
        r.memory().read_at(0, r.len()).to_vec()
    }

    pub fn completions(&mut self) -> Vec<Completion> {
        let mut v = Vec::new();
        while let Some(c) = self.conn.poll_completion() {
            v.push(c);
        }
        v
    }

    /// Pull events into `self.events`; returns the new ones.
    pub fn drain_events(&mut self) -> Vec<ConnEvent> {
        let mut v = Vec::new();
        while let Some(e) = self.conn.poll_event() {
            v.push(e);
        }
        self.events.extend(v.iter().cloned());
        v
    }

    /// Everything the connection has to send now; each poll_transmit burst is also
    /// recorded in `chunks`.
    pub fn transmit(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let start = out.len();
            if self.conn.poll_transmit(&self.res, &mut out) == 0 {
                break;
            }
            let t = TX_CLOCK.fetch_add(1, Ordering::Relaxed);
            self.chunks.push((t, out[start..].to_vec()));
        }
        self.sent.extend_from_slice(&out);
        out
    }

    pub fn send(&mut self, wr_id: u64, op: SendOp, sgl: Vec<Sge>) {
        self.conn
            .post_send(SendWr {
                wr_id,
                op,
                sgl,
                signaled: true,
                fence: false,
            })
            .unwrap();
    }

    pub fn recv(&mut self, wr_id: u64, sgl: Vec<Sge>) {
        self.conn.post_recv(RecvWr { wr_id, sgl }).unwrap();
    }
}

/// Deliver `bytes` to `to` in random pieces (1..=max_piece bytes). Returns the first
/// error handle_input reported, if any.
pub fn deliver(
    to: &mut Peer,
    bytes: &[u8],
    rng: &mut Rng,
    max_piece: usize,
    now: Instant,
) -> Option<conn::ConnError> {
    let mut err = None;
    let mut at = 0;
    while at < bytes.len() {
        let n = rng.range(1, max_piece).min(bytes.len() - at);
        if let Err(e) = to.conn.handle_input(now, &bytes[at..at + n], &mut to.res) {
            err.get_or_insert(e);
        }
        at += n;
    }
    err
}

/// Move bytes both ways until neither side has anything more to send. `max_piece`
/// bounds the random re-segmentation. Closes "TCP" (handle_peer_closed on the other side)
/// when one side wants to close.
pub fn pump(a: &mut Peer, b: &mut Peer, rng: &mut Rng, max_piece: usize, now: Instant) {
    for _ in 0..1_000_000 {
        let ab = a.transmit();
        let ba = b.transmit();
        if !ab.is_empty() {
            deliver(b, &ab, rng, max_piece, now);
        }
        if !ba.is_empty() {
            deliver(a, &ba, rng, max_piece, now);
        }
        a.drain_events();
        b.drain_events();
        let closed = close_tcp(a, b) | close_tcp(b, a);
        a.drain_events();
        b.drain_events();
        if ab.is_empty() && ba.is_empty() && !closed {
            return;
        }
    }
    panic!("pump did not converge");
}

/// If `x` wants TCP closed, close it: `y` sees the FIN.
fn close_tcp(x: &mut Peer, y: &mut Peer) -> bool {
    if x.conn.wants_close() && !x.closed_tcp {
        x.closed_tcp = true;
        y.conn.handle_peer_closed();
        return true;
    }
    false
}

/// Connect an initiator and a responder (responder accepts with IRD/ORD 4/4).
pub fn connect(
    tweak_i: impl FnOnce(&mut ConnConfig),
    tweak_r: impl FnOnce(&mut ConnConfig),
    rng: &mut Rng,
    max_piece: usize,
) -> (Peer, Peer) {
    connect_with(tweak_i, tweak_r, |_, _| {}, rng, max_piece)
}

/// [`connect`], running `before` on both peers before anything is exchanged.
pub fn connect_with(
    tweak_i: impl FnOnce(&mut ConnConfig),
    tweak_r: impl FnOnce(&mut ConnConfig),
    before: impl FnOnce(&mut Peer, &mut Peer),
    rng: &mut Rng,
    max_piece: usize,
) -> (Peer, Peer) {
    let now = Instant::now();
    let mut i = Peer::new(true, now, tweak_i);
    let mut r = Peer::new(false, now, tweak_r);
    before(&mut i, &mut r);
    pump(&mut i, &mut r, rng, max_piece, now);
    let req = r
        .events
        .iter()
        .find_map(|e| match e {
            ConnEvent::ConnectRequest(c) => Some(c.clone()),
            _ => None,
        })
        .expect("ConnectRequest");
    assert!(req.peer_ird.is_some() || req.revision == 1);
    r.conn
        .accept(AcceptParams {
            ird: 4,
            ord: 4,
            private_data: Vec::new(),
        })
        .unwrap();
    pump(&mut i, &mut r, rng, max_piece, now);
    assert!(i.conn.is_established(), "initiator not established");
    assert!(r.conn.is_established(), "responder not established");
    (i, r)
}

pub fn established(p: &Peer) -> bool {
    p.events
        .iter()
        .any(|e| matches!(e, ConnEvent::Established(_)))
}

// ------------------------------------------------------------------ rping (docs/protocols.md §5.2)

pub fn info(buf: u64, rkey: Stag, size: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&buf.to_be_bytes());
    b.extend_from_slice(&rkey.0.to_be_bytes());
    b.extend_from_slice(&size.to_be_bytes());
    b
}

pub fn parse_info(b: &[u8]) -> (u64, Stag, u32) {
    (
        u64::from_be_bytes(b[..8].try_into().unwrap()),
        Stag(u32::from_be_bytes(b[8..12].try_into().unwrap())),
        u32::from_be_bytes(b[12..16].try_into().unwrap()),
    )
}

/// rping's start buffer pattern for iteration `i` (docs/protocols.md §5.2).
pub fn rping_pattern(i: usize, size: usize) -> Vec<u8> {
    let mut v = format!("rdma-ping-{i}: ").into_bytes();
    let mut c = 65 + (i % 58) as u8;
    while v.len() < size - 1 {
        v.push(c);
        c += 1;
        if c > 122 {
            c = 65;
        }
    }
    v.truncate(size - 1);
    v.push(0);
    v
}

fn single(completions: &[Completion], opcode: WcOpcode) -> Completion {
    let c: Vec<_> = completions.iter().filter(|c| c.opcode == opcode).collect();
    assert_eq!(
        c.len(),
        1,
        "expected one {opcode:?} completion in {completions:?}"
    );
    assert_eq!(c[0].status, CompletionStatus::Success, "{:?}", c[0]);
    *c[0]
}

/// Runs `iterations` rping iterations (client = `c`, server = `s`) with `size`-byte
/// buffers and verifies every buffer (the `-V` check).
pub fn rping(
    c: &mut Peer,
    s: &mut Peer,
    iterations: usize,
    size: usize,
    rng: &mut Rng,
    max_piece: usize,
) {
    let now = Instant::now();
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let c_start_va = 0x0000_559d_4c2a_1000;
    let c_rdma_va = 0x0000_559d_4c2b_0000;
    let s_rdma_va = 0x0000_55d0_e0a0_b000;
    let c_start = c.reg(
        c_start_va,
        vec![0; size],
        Access::REMOTE_READ | Access::REMOTE_WRITE,
    );
    let c_rdma = c.reg(c_rdma_va, vec![0; size], rw);
    let c_send = c.reg(0x1000, vec![0; 16], Access::LOCAL_WRITE);
    let c_recv = c.reg(0x2000, vec![0; 16], Access::LOCAL_WRITE);
    let s_rdma = s.reg(s_rdma_va, vec![0; size], rw);
    let s_send = s.reg(0x1000, vec![0; 16], Access::LOCAL_WRITE);
    let s_recv = s.reg(0x2000, vec![0; 16], Access::LOCAL_WRITE);
    let sge = |lkey, addr, len| vec![Sge { lkey, addr, len }];
    let send = SendOp::Send {
        solicited: false,
        invalidate: None,
    };
    s.recv(100, sge(s_recv, 0x2000, 16));
    for i in 0..iterations {
        let pattern = rping_pattern(i, size);
        c.res.stags.write(c_start, 0, &pattern).unwrap();
        c.res
            .stags
            .write(c_send, 0, &info(c_start_va, c_start, size as u32))
            .unwrap();
        c.recv(200, sge(c_recv, 0x2000, 16));
        // 1. C → S Send {start_buf, rkey, size}.
        c.send(1, send, sge(c_send, 0x1000, 16));
        pump(c, s, rng, max_piece, now);
        assert_eq!(single(&c.completions(), WcOpcode::Send).wr_id, 1);
        let rc = single(&s.completions(), WcOpcode::Recv);
        assert_eq!(rc.byte_len, 16);
        let (buf, rkey, len) = parse_info(&s.mem(s_recv));
        assert_eq!((buf, rkey, len as usize), (c_start_va, c_start, size));
        // 2. S reads the client's start buffer into its rdma_buf.
        s.recv(100, sge(s_recv, 0x2000, 16));
        s.send(
            2,
            SendOp::Read {
                remote_stag: rkey,
                remote_to: buf,
            },
            sge(s_rdma, s_rdma_va, len),
        );
        pump(c, s, rng, max_piece, now);
        let rd = single(&s.completions(), WcOpcode::Read);
        assert_eq!(rd.byte_len as usize, size);
        assert_eq!(s.mem(s_rdma), pattern, "iteration {i}: read data");
        // 4. S → C Send "go ahead" (16 zero bytes).
        s.send(3, send, sge(s_send, 0x1000, 16));
        pump(c, s, rng, max_piece, now);
        assert_eq!(single(&c.completions(), WcOpcode::Recv).byte_len, 16);
        assert_eq!(single(&s.completions(), WcOpcode::Send).wr_id, 3);
        // 5. C → S Send {rdma_buf, rkey, size}.
        c.recv(200, sge(c_recv, 0x2000, 16));
        c.res
            .stags
            .write(c_send, 0, &info(c_rdma_va, c_rdma, size as u32))
            .unwrap();
        c.send(4, send, sge(c_send, 0x1000, 16));
        pump(c, s, rng, max_piece, now);
        single(&c.completions(), WcOpcode::Send);
        assert_eq!(single(&s.completions(), WcOpcode::Recv).byte_len, 16);
        let (buf, rkey, len) = parse_info(&s.mem(s_recv));
        assert_eq!((buf, rkey, len as usize), (c_rdma_va, c_rdma, size));
        // 6./7. S writes its rdma_buf to the client's, then Sends.
        if i + 1 < iterations {
            s.recv(100, sge(s_recv, 0x2000, 16));
        }
        s.send(
            5,
            SendOp::Write {
                remote_stag: rkey,
                remote_to: buf,
            },
            sge(s_rdma, s_rdma_va, len),
        );
        s.send(6, send, sge(s_send, 0x1000, 16));
        pump(c, s, rng, max_piece, now);
        let sc = s.completions();
        assert_eq!(
            sc.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            vec![
                (5, CompletionStatus::Success),
                (6, CompletionStatus::Success)
            ]
        );
        assert_eq!(single(&c.completions(), WcOpcode::Recv).byte_len, 16);
        // 8. -V
        assert_eq!(
            c.mem(c_rdma),
            c.mem(c_start),
            "iteration {i}: data mismatch"
        );
        assert_eq!(c.mem(c_rdma), pattern);
    }
}
