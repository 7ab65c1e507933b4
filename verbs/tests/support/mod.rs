//! Shared opening of the verbs integration tests: two engines on the virtual wire and a
//! connected (client, server) pair of QPs, each with its own PD and send/receive CQs.

use std::net::SocketAddr;
use std::time::Duration;

use xwarp_poll_driver::vwire::VirtualNic;
use xwarp_verbs::{
    vwire_pair_simple, CmEvent, CompletionQueue, ConnectParams, Context, ProtectionDomain,
    QpInitAttr, QueuePair,
};

/// Timeout of one connection step or completion.
pub const T: Duration = Duration::from_secs(20);

/// One side: its PD, CQs and QP.
pub struct End {
    pub pd: ProtectionDomain,
    pub scq: CompletionQueue,
    pub rcq: CompletionQueue,
    pub qp: QueuePair,
}

/// Queue sizes of an [`End`].
#[derive(Clone, Copy)]
pub struct Depths {
    /// Entries of each CQ.
    pub cq: usize,
    /// Send work requests.
    pub send_wr: usize,
    /// Receive work requests.
    pub recv_wr: usize,
}

fn end(ctx: &Context<VirtualNic>, d: Depths) -> End {
    let dev = ctx.device();
    let pd = dev.alloc_pd();
    let scq = dev.create_cq(d.cq).unwrap();
    let rcq = dev.create_cq(d.cq).unwrap();
    let mut a = QpInitAttr::new(&scq, &rcq);
    a.max_send_wr = d.send_wr;
    a.max_recv_wr = d.recv_wr;
    let qp = pd.create_qp(&a).unwrap();
    End { pd, scq, rcq, qp }
}

/// Two engines and a connected (client, server) QP pair; the server listens on
/// 10.77.0.2:`port`. Both sides have seen `Established` when this returns.
pub fn connected(port: u16, d: Depths) -> (Context<VirtualNic>, Context<VirtualNic>, End, End) {
    let (a, b) = vwire_pair_simple(Default::default()).unwrap();
    let at = SocketAddr::from(([10, 77, 0, 2], port));
    let listener = b.device().listen(at, 4).unwrap();
    let (c, s) = (end(&a, d), end(&b, d));
    c.qp.connect(
        at,
        ConnectParams {
            private_data: vec![],
            timeout: T,
        },
    )
    .unwrap();
    listener.get_request(T).unwrap().accept(&s.qp, b"").unwrap();
    for qp in [&c.qp, &s.qp] {
        match qp.next_event(T).unwrap() {
            CmEvent::Established { .. } => {}
            e => panic!("expected Established, got {e:?}"),
        }
    }
    (a, b, c, s)
}
