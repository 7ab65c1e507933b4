//! `Device::disconnect_all` (what libxwarp_ibverbs calls at process exit): every open
//! connection of the engine closes gracefully, queued work drains first (the data is
//! verified on the peer), both sides see `Disconnected` (the peer's proves the FIN went
//! out); QPs that never connected are left alone. Two engines on the virtual wire.

mod support;
use support::{Depths, T};

use std::time::Duration;

use xwarp_verbs::{Access, CmEvent, CompletionStatus, QpInitAttr, SendRequest};

#[test]
fn disconnect_all_closes_every_open_connection_after_its_queued_work() {
    let d = Depths {
        cq: 64,
        send_wr: 16,
        recv_wr: 16,
    };
    let (a, _b, c, s) = support::connected(5401, d);
    // An idle QP on the same engine: nothing to close.
    let idle = c.pd.create_qp(&QpInitAttr::new(&c.scq, &c.rcq)).unwrap();
    let data: Vec<u8> = (0..30_000u32).map(|i| (i * 7 + (i >> 9)) as u8).collect();
    let smr =
        s.pd.register(vec![0u8; data.len()], Access::LOCAL_WRITE)
            .unwrap();
    let cmr = c.pd.register(data.clone(), Access::LOCAL_WRITE).unwrap();
    s.qp.post_recv(1, &[smr.sge_all().unwrap()]).unwrap();
    c.qp.post_send(SendRequest::send(2, vec![cmr.sge_all().unwrap()]))
        .unwrap();
    assert_eq!(a.device().disconnect_all().unwrap(), 1);
    let w = s.rcq.next(T).unwrap();
    assert_eq!((w.wr_id, w.status), (1, CompletionStatus::Success));
    assert_eq!(smr.to_vec(0, data.len()).unwrap(), data);
    for qp in [&c.qp, &s.qp] {
        assert_eq!(qp.next_event(T).unwrap(), CmEvent::Disconnected);
    }
    assert!(idle.next_event(Duration::from_millis(100)).is_err());
    // Nothing left to close.
    assert_eq!(a.device().disconnect_all().unwrap(), 0);
}
