//! Shared helpers for the integration tests: Vec-backed regions, QP setup and a
//! segment pump that wires two QPs back to back at the DDP-segment level.
#![allow(dead_code)]

use xwarp_rdmap::*;

/// One side of a connection: its resources, PD and QP.
pub struct Side {
    pub res: Resources,
    pub pd: PdId,
    pub qp: QueuePair,
}

impl Side {
    pub fn new(ird: u32, ord: u32, rq_depth: usize) -> Side {
        // Byte-exact Terminate tests name STags (0x101, 0x201, ...): predictable ones.
        let mut res = Resources::with_stags(StagTable::sequential());
        let pd = res.stags.alloc_pd();
        let mut qp = QueuePair::new(QpConfig {
            pd,
            ird,
            ord,
            sq_depth: 64,
            rq: RqConfig::Own(rq_depth),
        });
        qp.set_rts().unwrap();
        Side { res, pd, qp }
    }

    /// Register `len` bytes filled with `fill` at tagged offset `base`.
    pub fn reg(&mut self, base: u64, len: usize, fill: u8, access: Access) -> Stag {
        self.res
            .stags
            .register(self.pd, access, base, Box::new(vec![fill; len]))
            .unwrap()
    }

    /// Register `data` at `base`.
    pub fn reg_data(&mut self, base: u64, data: &[u8], access: Access) -> Stag {
        self.res
            .stags
            .register(self.pd, access, base, Box::new(data.to_vec()))
            .unwrap()
    }

    pub fn mem(&self, stag: Stag) -> Vec<u8> {
        let r = self.res.stags.region(stag).unwrap();
        r.memory().read_at(0, r.len()).to_vec()
    }

    pub fn recv(&mut self, wr_id: u64, lkey: Stag, addr: u64, len: u32) {
        self.qp
            .post_recv(RecvWr {
                wr_id,
                sgl: vec![Sge { lkey, addr, len }],
            })
            .unwrap();
    }

    /// Next outbound segment as bytes.
    pub fn next_segment(&mut self, mulpdu: usize) -> Option<Vec<u8>> {
        self.qp
            .poll_segment(&self.res, mulpdu, |h, p| {
                let mut v = h.to_vec();
                v.extend_from_slice(&p.to_vec());
                v
            })
            .unwrap()
    }

    /// All outbound segments available now.
    pub fn drain_segments(&mut self, mulpdu: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(s) = self.next_segment(mulpdu) {
            out.push(s);
        }
        out
    }

    pub fn completions(&mut self) -> Vec<Completion> {
        let mut v = Vec::new();
        while let Some(c) = self.qp.poll_completion() {
            v.push(c);
        }
        v
    }

    pub fn events(&mut self) -> Vec<QpEvent> {
        let mut v = Vec::new();
        while let Some(e) = self.qp.poll_event() {
            v.push(e);
        }
        v
    }

    /// Deliver one segment, payload split at the given points.
    pub fn deliver_split(&mut self, seg: &[u8], cuts: &[usize]) {
        let hlen = xwarp_ddp::segment::header_len(seg[0]);
        self.qp
            .on_header_bytes(&mut self.res, &seg[..hlen], seg.len())
            .unwrap();
        let payload = &seg[hlen..];
        let mut at = 0;
        for &c in cuts {
            let c = c.min(payload.len()).max(at);
            self.qp.on_payload(&mut self.res, &payload[at..c]).unwrap();
            at = c;
        }
        self.qp.on_payload(&mut self.res, &payload[at..]).unwrap();
        self.qp.on_end(&mut self.res).unwrap();
    }

    pub fn deliver(&mut self, seg: &[u8]) {
        self.qp.on_segment(&mut self.res, seg).unwrap();
    }
}

/// Move every segment `from` can produce into `to` (repeat until both are quiet, in both
/// directions, so Read Requests get their Responses). Returns the number of segments.
pub fn pump(a: &mut Side, b: &mut Side, mulpdu: usize) -> usize {
    let mut n = 0;
    loop {
        let mut moved = 0;
        while let Some(s) = a.next_segment(mulpdu) {
            b.deliver(&s);
            moved += 1;
        }
        while let Some(s) = b.next_segment(mulpdu) {
            a.deliver(&s);
            moved += 1;
        }
        if moved == 0 {
            return n;
        }
        n += moved;
    }
}

/// The full DDP segment of a Terminate as this stack emits it (QN 2, MSN 1, MO 0, L).
pub fn term_segment(body: &[u8]) -> Vec<u8> {
    let mut v = vec![0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0];
    v.extend_from_slice(body);
    v
}

pub fn send_wr(wr_id: u64, lkey: Stag, addr: u64, len: u32) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sgl: vec![Sge { lkey, addr, len }],
        signaled: true,
        fence: false,
    }
}

pub fn ok(wr_id: u64, opcode: WcOpcode, byte_len: u32) -> Completion {
    Completion {
        wr_id,
        status: CompletionStatus::Success,
        opcode,
        byte_len,
        solicited: false,
        invalidated_stag: None,
    }
}
