//! The engine encodes FPDUs straight into the free space of the TCP send buffer
//! (`Connection::poll_transmit_into`). With a send buffer of only a few FPDUs, that free
//! space is almost never a whole FPDU and wraps around the ring all the time: FPDUs that
//! do not fit are finished by later calls. Every byte must still arrive in order, with
//! valid CRCs (a cut or reordered FPDU fails the CRC check and the connection).

mod verbs_common;

use verbs_common::*;
use xwarp::net::PairConfig;
use xwarp::poll_driver::vwire::WireConfig;
use xwarp::verbs::{vwire_pair, CompletionStatus, SendRequest, WcOpcode};

#[test]
fn tiny_send_buffers_carry_write_send_and_read_intact_with_crc() {
    const LEN: usize = 300_000;
    let mut cfg = PairConfig {
        wire: WireConfig::default(),
        ..Default::default()
    };
    // A bit over two full-size FPDUs, and no multiple of the FPDU size.
    for s in [&mut cfg.a, &mut cfg.b] {
        s.tx_buffer = 3001;
        s.rx_buffer = 4096;
    }
    let (a, b) = vwire_pair(cfg).expect("engines");
    let (c, s) = connect(&a, &b, 7100, |at| at.mpa.crc = true);
    let (csrc, cdst) = (mr(&c, LEN), mr(&c, LEN));
    let (sdst, smsg) = (mr(&s, LEN), mr(&s, 4096));
    let data = pattern(LEN, 0x3c);
    csrc.write(0, &data).unwrap();
    // Write the whole buffer, Send its first 4000 bytes, Read it all back.
    s.qp.post_recv(5, &[smsg.sge(0, 4096).unwrap()]).unwrap();
    c.qp.post_send(SendRequest::write(
        1,
        vec![csrc.sge(0, LEN).unwrap()],
        sdst.rkey(),
        sdst.addr(),
    ))
    .unwrap();
    c.qp.post_send(SendRequest::send(2, vec![csrc.sge(0, 4000).unwrap()]))
        .unwrap();
    let w = wc(&c.scq);
    assert_eq!((w.wr_id, w.status), (1, CompletionStatus::Success));
    let w = wc(&c.scq);
    assert_eq!((w.wr_id, w.status), (2, CompletionStatus::Success));
    let r = wc(&s.rcq);
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len),
        (5, CompletionStatus::Success, WcOpcode::Recv, 4000)
    );
    assert_eq!(smsg.to_vec(0, 4000).unwrap(), data[..4000]);
    assert!(sdst.to_vec(0, LEN).unwrap() == data, "Write data differs");
    c.qp.post_send(SendRequest::read(
        3,
        cdst.sge(0, LEN).unwrap(),
        sdst.rkey(),
        sdst.addr(),
    ))
    .unwrap();
    let w = wc(&c.scq);
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (3, CompletionStatus::Success, WcOpcode::Read)
    );
    assert!(cdst.to_vec(0, LEN).unwrap() == data, "Read data differs");
}
