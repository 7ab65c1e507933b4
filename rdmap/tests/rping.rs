//! An rping-style exchange (docs/protocols.md §5.2) between two QueuePairs wired back to
//! back at the DDP-segment level, with data verified.

mod common;
use common::*;
use xwarp_rdmap::*;

const SIZE: usize = 64;

fn info(buf: u64, rkey: Stag, size: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&buf.to_be_bytes());
    b[8..12].copy_from_slice(&rkey.0.to_be_bytes());
    b[12..].copy_from_slice(&size.to_be_bytes());
    b
}

fn parse_info(b: &[u8]) -> (u64, Stag, u32) {
    (
        u64::from_be_bytes(b[..8].try_into().unwrap()),
        Stag(u32::from_be_bytes(b[8..12].try_into().unwrap())),
        u32::from_be_bytes(b[12..16].try_into().unwrap()),
    )
}

fn fill_start(i: usize) -> Vec<u8> {
    let mut v = format!("rdma-ping-{i}: ").into_bytes();
    let mut c = 65 + (i % 58) as u8;
    while v.len() < SIZE - 1 {
        v.push(c);
        c += 1;
        if c > 122 {
            c = 65;
        }
    }
    v.push(0);
    v
}

#[test]
fn rping_send_read_send_write_send_exchange() {
    let mut c = Side::new(1, 1, 2);
    let mut s = Side::new(1, 1, 2);
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let c_start = c.reg(
        0x0000_559d_4c2a_1000,
        SIZE,
        0,
        Access::REMOTE_READ | Access::REMOTE_WRITE,
    );
    let c_rdma = c.reg(0x7000, SIZE, 0, rw);
    let c_send = c.reg(0x8000, 16, 0, Access::LOCAL_WRITE);
    let c_recv = c.reg(0x9000, 16, 0, Access::LOCAL_WRITE);
    let s_rdma = s.reg(0x0000_55d0_e0a0_b000, SIZE, 0, rw);
    let s_send = s.reg(0x8000, 16, 0, Access::LOCAL_WRITE);
    let s_recv = s.reg(0x9000, 16, 0, Access::LOCAL_WRITE);

    // MULPDU small enough that the 64-byte read and write are segmented.
    let mulpdu = 72;
    for i in 0..3u64 {
        c.recv(100 + i, c_recv, 0x9000, 16);
        s.recv(200 + i, s_recv, 0x9000, 16);
        // 1. C -> S SEND {start_buf, rkey, size}.
        let start = fill_start(i as usize);
        let r = c.res.stags.region(c_start).unwrap().memory().len();
        assert_eq!(r, SIZE);
        c.res.stags.write(c_start, 0, &start).unwrap();
        c.res
            .stags
            .write(
                c_send,
                0,
                &info(0x0000_559d_4c2a_1000, c_start, SIZE as u32),
            )
            .unwrap();
        c.qp.post_send(send_wr(1, c_send, 0x8000, 16)).unwrap();
        let seg = c.next_segment(mulpdu).unwrap();
        // Untagged Send header, QN 0, MSN 2i+1 (two Sends per iteration), MO 0, then the 16-byte info.
        let mut hdr = vec![0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0];
        hdr.extend_from_slice(&(2 * i as u32 + 1).to_be_bytes());
        hdr.extend_from_slice(&[0, 0, 0, 0]);
        assert_eq!(&seg[..18], &hdr[..]);
        assert_eq!(seg.len(), 34, "ULPDU 34 as in docs/protocols.md §5.2");
        s.deliver(&seg);
        assert_eq!(c.completions(), vec![ok(1, WcOpcode::Send, 16)]);
        assert_eq!(s.completions(), vec![ok(200 + i, WcOpcode::Recv, 16)]);

        // 2./3. S reads `size` bytes from the advertised buffer.
        let (buf, rkey, size) = parse_info(&s.mem(s_recv));
        assert_eq!(size as usize, SIZE);
        s.qp.post_send(SendWr {
            wr_id: 2,
            op: SendOp::Read {
                remote_stag: rkey,
                remote_to: buf,
            },
            sgl: vec![Sge {
                lkey: s_rdma,
                addr: 0x0000_55d0_e0a0_b000,
                len: size,
            }],
            signaled: true,
            fence: false,
        })
        .unwrap();
        let rreq = s.next_segment(mulpdu).unwrap();
        assert_eq!(rreq.len(), 46);
        assert_eq!(&rreq[..2], &[0x41, 0x41]);
        assert_eq!(&rreq[6..10], &1u32.to_be_bytes(), "QN 1");
        assert_eq!(&rreq[10..14], &(i as u32 + 1).to_be_bytes(), "read MSN");
        c.deliver(&rreq);
        let resp = c.drain_segments(mulpdu);
        assert_eq!(resp.len(), 2, "64 bytes in 58-byte chunks");
        assert_eq!(resp[0][0], 0x81);
        assert_eq!(resp[1][0], 0xc1);
        for r in &resp {
            s.deliver(r);
        }
        assert_eq!(s.completions(), vec![ok(2, WcOpcode::Read, SIZE as u32)]);
        assert_eq!(s.mem(s_rdma), start);

        // 4. S -> C go-ahead SEND (16 zero bytes).
        s.qp.post_send(send_wr(3, s_send, 0x8000, 16)).unwrap();
        c.recv(300 + i, c_recv, 0x9000, 16);
        assert_eq!(pump(&mut s, &mut c, mulpdu), 1);
        assert_eq!(c.completions(), vec![ok(100 + i, WcOpcode::Recv, 16)]);
        // 5. C -> S SEND {rdma_buf, rkey, size}.
        c.res
            .stags
            .write(c_send, 0, &info(0x7000, c_rdma, SIZE as u32))
            .unwrap();
        s.recv(400 + i, s_recv, 0x9000, 16);
        c.qp.post_send(send_wr(4, c_send, 0x8000, 16)).unwrap();
        pump(&mut c, &mut s, mulpdu);
        let (buf, rkey, size) = parse_info(&s.mem(s_recv));
        // 6. S -> C RDMA WRITE, then 7. SEND.
        s.qp.post_send(SendWr {
            wr_id: 5,
            op: SendOp::Write {
                remote_stag: rkey,
                remote_to: buf,
            },
            sgl: vec![Sge {
                lkey: s_rdma,
                addr: 0x0000_55d0_e0a0_b000,
                len: size,
            }],
            signaled: true,
            fence: false,
        })
        .unwrap();
        s.qp.post_send(send_wr(6, s_send, 0x8000, 16)).unwrap();
        pump(&mut s, &mut c, mulpdu);
        assert_eq!(
            s.completions(),
            vec![
                ok(3, WcOpcode::Send, 16),
                ok(400 + i, WcOpcode::Recv, 16),
                ok(5, WcOpcode::Write, SIZE as u32),
                ok(6, WcOpcode::Send, 16)
            ]
        );
        assert_eq!(
            c.completions(),
            vec![ok(4, WcOpcode::Send, 16), ok(300 + i, WcOpcode::Recv, 16)]
        );
        // 8. -V: the data came back intact.
        assert_eq!(c.mem(c_rdma), c.mem(c_start));
        assert_eq!(c.mem(c_rdma), start);
        c.res.stags.write(c_rdma, 0, &[0u8; SIZE]).unwrap();
    }
    assert_eq!(c.qp.state(), QpState::Rts);
    assert_eq!(s.qp.state(), QpState::Rts);
}
