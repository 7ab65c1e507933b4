//! The verbs API over engines in inline mode: posts and CQ polls drive the engine on the
//! calling thread. Write, Read and Send on the virtual wire, data verified.

mod verbs_common;

use verbs_common::*;
use xwarp::net::PairConfig;
use xwarp::poll_driver::engine::{EngineConfig, EngineMode, InlineConfig};
use xwarp::verbs::{vwire_pair, CompletionStatus, SendRequest, WcOpcode};

#[test]
fn inline_send_write_read_verified() {
    let (a, b) = vwire_pair(PairConfig {
        engine: EngineConfig {
            mode: EngineMode::Inline(InlineConfig::default()),
            ..EngineConfig::default()
        },
        ..PairConfig::default()
    })
    .unwrap();
    let (c, s) = connect(&a, &b, 4795, |_| {});
    assert!(c.scq.inline_driver().is_some());
    let cbuf = mr(&c, 1 << 20);
    let sbuf = mr(&s, 1 << 20);
    for round in 0..20u8 {
        // Send: 100 KB from two SGEs into a posted receive.
        let data = pattern(100_000, round);
        cbuf.write(0, &data).unwrap();
        s.qp.post_recv(7, &[sbuf.sge(0, 200_000).unwrap()]).unwrap();
        c.qp.post_send(SendRequest::send(
            1,
            vec![
                cbuf.sge(0, 60_000).unwrap(),
                cbuf.sge(60_000, 40_000).unwrap(),
            ],
        ))
        .unwrap();
        let w = wc(&c.scq);
        assert_eq!((w.wr_id, w.status), (1, CompletionStatus::Success));
        let r = wc(&s.rcq);
        assert_eq!(
            (r.wr_id, r.opcode, r.byte_len),
            (7, WcOpcode::Recv, 100_000)
        );
        assert_eq!(sbuf.to_vec(0, 100_000).unwrap(), data);

        // Write 300 KB at offset 4096, made visible by a Send after it.
        let data = pattern(300_000, round.wrapping_add(100));
        cbuf.write(0, &data).unwrap();
        c.qp.post_send(SendRequest::write(
            2,
            vec![cbuf.sge(0, 300_000).unwrap()],
            sbuf.rkey(),
            sbuf.addr() + 4096,
        ))
        .unwrap();
        assert_eq!(wc(&c.scq).opcode, WcOpcode::Write);
        s.qp.post_recv(8, &[sbuf.sge(900_000, 16).unwrap()])
            .unwrap();
        c.qp.post_send(SendRequest {
            inline: Some(b"done".to_vec()),
            ..SendRequest::send(3, vec![])
        })
        .unwrap();
        assert_eq!(wc(&s.rcq).byte_len, 4);
        assert_eq!(wc(&c.scq).wr_id, 3);
        assert_eq!(sbuf.to_vec(4096, 300_000).unwrap(), data);

        // Read 500 KB back from the server.
        let data = pattern(500_000, round.wrapping_add(200));
        sbuf.write(100, &data).unwrap();
        c.qp.post_send(SendRequest::read(
            4,
            cbuf.sge(1000, 500_000).unwrap(),
            sbuf.rkey(),
            sbuf.addr() + 100,
        ))
        .unwrap();
        let w = wc(&c.scq);
        assert_eq!(
            (w.wr_id, w.status, w.opcode, w.byte_len),
            (4, CompletionStatus::Success, WcOpcode::Read, 500_000)
        );
        assert_eq!(cbuf.to_vec(1000, 500_000).unwrap(), data);
    }
    let st = a.engine_stats();
    assert!(st.inline_iterations > 0, "{st:?}");
}
