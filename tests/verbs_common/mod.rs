//! Shared setup of the verbs tests: ends (PD, CQs, QP) on any engine, two engines on a
//! virtual wire and connected QPs, completion and CM-event helpers.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use xwarp::net::PairConfig;
use xwarp::poll_driver::backend::Backend;
use xwarp::poll_driver::vwire::{VirtualNic, WireConfig};
use xwarp::verbs::{
    vwire_pair, Access, CmEvent, CompletionQueue, ConnectParams, Context, MemoryRegion,
    ProtectionDomain, QpInitAttr, QueuePair, WorkCompletion,
};

pub const T: Duration = Duration::from_secs(20);

/// One end: PD, CQs, QP.
pub struct End {
    pub pd: ProtectionDomain,
    pub scq: CompletionQueue,
    pub rcq: CompletionQueue,
    pub qp: QueuePair,
}

pub fn pair(wire: WireConfig) -> (Context<VirtualNic>, Context<VirtualNic>) {
    vwire_pair(PairConfig {
        wire,
        ..Default::default()
    })
    .expect("engines")
}

pub fn server_addr(port: u16) -> SocketAddr {
    SocketAddr::from(([10, 77, 0, 2], port))
}

pub fn end<B: Backend + Send + 'static>(
    ctx: &Context<B>,
    tweak: impl FnOnce(&mut QpInitAttr<'_>),
) -> End {
    let dev = ctx.device();
    let pd = dev.alloc_pd();
    let scq = dev.create_cq(256).unwrap();
    let rcq = dev.create_cq(256).unwrap();
    let qp = {
        let mut a = QpInitAttr::new(&scq, &rcq);
        tweak(&mut a);
        pd.create_qp(&a).unwrap()
    };
    End { pd, scq, rcq, qp }
}

/// Connect a client end on `a` to a server end on `b` (port `port`); returns
/// (client, server) after both saw Established.
pub fn connect(
    a: &Context<VirtualNic>,
    b: &Context<VirtualNic>,
    port: u16,
    tweak: impl Fn(&mut QpInitAttr<'_>) + Copy,
) -> (End, End) {
    connect_pre(a, b, port, tweak, |_| {})
}

/// [`connect`], running `pre` on the server end before it accepts (e.g. to post the
/// receive a zero-length Send RTR consumes).
pub fn connect_pre(
    a: &Context<VirtualNic>,
    b: &Context<VirtualNic>,
    port: u16,
    tweak: impl Fn(&mut QpInitAttr<'_>) + Copy,
    pre: impl FnOnce(&End),
) -> (End, End) {
    let listener = b.device().listen(server_addr(port), 8).unwrap();
    let client = end(a, tweak);
    let server = end(b, tweak);
    pre(&server);
    client
        .qp
        .connect(
            server_addr(port),
            ConnectParams {
                private_data: b"hello".to_vec(),
                timeout: T,
            },
        )
        .unwrap();
    let req = listener.get_request(T).unwrap();
    assert_eq!(req.private_data, b"hello");
    req.accept(&server.qp, b"welcome").unwrap();
    match client.qp.next_event(T).unwrap() {
        CmEvent::Established { private_data, .. } => assert_eq!(private_data, b"welcome"),
        e => panic!("client: {e:?}"),
    }
    match server.qp.next_event(T).unwrap() {
        CmEvent::Established { private_data, .. } => assert_eq!(private_data, b"hello"),
        e => panic!("server: {e:?}"),
    }
    (client, server)
}

pub fn mr(e: &End, len: usize) -> MemoryRegion {
    e.pd.alloc_mr(
        len,
        Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
        false,
    )
    .unwrap()
}

pub fn wc(cq: &CompletionQueue) -> WorkCompletion {
    cq.next(T).expect("completion")
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// Read CM events until one equals `want`; returns the events seen before it.
pub fn expect_event(qp: &QueuePair, want: &CmEvent) -> Vec<CmEvent> {
    let mut seen = Vec::new();
    loop {
        match qp.next_event(T) {
            Ok(e) if &e == want => return seen,
            Ok(e) => seen.push(e),
            Err(err) => panic!("waiting for {want:?}: {err}; seen {seen:?}"),
        }
    }
}

/// Read CM events until every one of `want` was seen (in any order); returns all seen.
pub fn expect_events(qp: &QueuePair, want: &[CmEvent]) -> Vec<CmEvent> {
    let mut seen = Vec::new();
    while !want.iter().all(|w| seen.contains(w)) {
        match qp.next_event(T) {
            Ok(e) => seen.push(e),
            Err(err) => panic!("waiting for {want:?}: {err}; seen {seen:?}"),
        }
    }
    seen
}

/// The Terminate events of one error, as (the sender's, the receiver's).
pub fn term(layer: u8, etype: u8, code: u8) -> (CmEvent, CmEvent) {
    (
        CmEvent::TerminateSent { layer, etype, code },
        CmEvent::TerminateReceived { layer, etype, code },
    )
}
