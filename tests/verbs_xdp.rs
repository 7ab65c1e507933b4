//! Every verbs opcode end-to-end over AF_XDP: two verbs engines
//! ([`Context::start_xdp`]) on the two ends of a veth pair in two network namespaces,
//! data verified. Both engines compute full checksums, so both verify every received
//! checksum ([`RxChecksum::Verify`], see `xwarp::toe`). Root only: without root or
//! AF_XDP every test prints `SKIPPED: <reason>` to stderr and returns.
#![cfg(target_os = "linux")]

#[macro_use]
#[path = "support/afxdp_skip.rs"]
mod afxdp_skip;
mod verbs_common;

use verbs_common::{end, expect_events, mr, pattern, term, wc, End, T};

use std::net::{Ipv4Addr, SocketAddr};

use xwarp::poll_driver::afxdp::AfXdpNic;
use xwarp::poll_driver::netns::VethPair;
use xwarp::toe::{RxChecksum, XdpEngineConfig};
use xwarp::verbs::{
    Access, CmEvent, CompletionStatus, ConnectParams, Context, SendOpcode, SendRequest, WcOpcode,
};

/// Two verbs engines on a veth pair: `10.88.<n>.10` on veth-a (namespace A) and
/// `10.88.<n>.20` on veth-b (namespace B). The namespaces outlive the engines (field order).
struct Net {
    a: Context<AfXdpNic>,
    b: Context<AfXdpNic>,
    b_ip: Ipv4Addr,
    _veth: VethPair,
}

fn net(n: u8) -> Net {
    let veth = VethPair::new(n).expect("veth pair");
    let a_ip = Ipv4Addr::new(10, 88, n, 10);
    let b_ip = Ipv4Addr::new(10, 88, n, 20);
    let mut ca = XdpEngineConfig::new(&veth.if_a, a_ip, 24);
    ca.rx_checksum = RxChecksum::Verify;
    ca.engine.name = format!("vxdp-{n}a");
    let mut cb = XdpEngineConfig::new(&veth.if_b, b_ip, 24);
    cb.rx_checksum = RxChecksum::Verify;
    cb.engine.name = format!("vxdp-{n}b");
    let a = Context::start_xdp(Some(&veth.a), ca).expect("verbs engine on veth-a");
    let b = Context::start_xdp(Some(&veth.b), cb).expect("verbs engine on veth-b");
    assert_eq!(a.device().local_ipv4(), Some(a_ip));
    Net {
        a,
        b,
        b_ip,
        _veth: veth,
    }
}

/// Connect a client on engine A to a server on engine B (port `port`), private data
/// checked both ways; returns (client, server) once both saw Established.
fn connect(net: &Net, port: u16) -> (End, End) {
    let addr = SocketAddr::from((net.b_ip, port));
    let listener = net.b.device().listen(addr, 8).unwrap();
    let client = end(&net.a, |_| {});
    let server = end(&net.b, |_| {});
    client
        .qp
        .connect(
            addr,
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

/// Wait until `e`'s engine applied every work request posted so far (a synchronous
/// registration queues behind them). A receive posted just before the peer sends can
/// otherwise still sit in the command queue when the engine hands the arriving Send to
/// the verbs host (received bytes go to the host after every ingress packet, commands
/// only at the start of an engine iteration): DDP Terminate "no buffer".
fn applied(e: &End) {
    drop(e.pd.alloc_mr(64, Access::LOCAL_WRITE, false).unwrap());
}

/// Send (two SGEs, 100 KB, many segments), Send with Solicited Event, Send with
/// Invalidate (the STag is then refused: Terminate), all data verified.
#[test]
fn xdp_send_send_se_send_inv() {
    require_root_and_afxdp!();
    let net = net(61);
    let (c, s) = connect(&net, 4791);
    let cbuf = mr(&c, 1 << 20);
    let sbuf = mr(&s, 1 << 20);

    let data = pattern(100_000, 1);
    cbuf.write(0, &data).unwrap();
    s.qp.post_recv(7, &[sbuf.sge(0, 200_000).unwrap()]).unwrap();
    applied(&s);
    c.qp.post_send(SendRequest::send(
        1,
        vec![
            cbuf.sge(0, 60_000).unwrap(),
            cbuf.sge(60_000, 40_000).unwrap(),
        ],
    ))
    .unwrap();
    let w = wc(&c.scq);
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (1, CompletionStatus::Success, WcOpcode::Send)
    );
    let r = wc(&s.rcq);
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len, r.solicited),
        (7, CompletionStatus::Success, WcOpcode::Recv, 100_000, false)
    );
    assert_eq!(sbuf.to_vec(0, 100_000).unwrap(), data);

    // Send with Solicited Event wakes a solicited-only waiter.
    s.qp.post_recv(9, &[sbuf.sge(300_000, 64).unwrap()])
        .unwrap();
    s.qp.post_recv(10, &[sbuf.sge(300_064, 64).unwrap()])
        .unwrap();
    let victim = mr(&s, 4096);
    s.rcq.req_notify(true);
    c.qp.post_send(SendRequest {
        inline: Some(b"solicited".to_vec()),
        ..SendRequest::new(5, SendOpcode::SendWithSolicitedEvent, vec![])
    })
    .unwrap();
    assert!(s.rcq.wait(Some(T)).unwrap(), "solicited send fires the fd");
    let r = wc(&s.rcq);
    assert_eq!(
        (r.wr_id, r.status, r.byte_len, r.solicited),
        (9, CompletionStatus::Success, 9, true)
    );
    assert_eq!(sbuf.to_vec(300_000, 9).unwrap(), b"solicited");

    // Send with Invalidate carries the STag to invalidate at the receiver.
    c.qp.post_send(SendRequest {
        inline: Some(b"inv".to_vec()),
        ..SendRequest::new(6, SendOpcode::SendWithInvalidate(victim.rkey()), vec![])
    })
    .unwrap();
    let r = wc(&s.rcq);
    assert_eq!(
        (r.wr_id, r.status, r.invalidated_rkey),
        (10, CompletionStatus::Success, Some(victim.rkey()))
    );
    assert_eq!(sbuf.to_vec(300_064, 3).unwrap(), b"inv");
    assert_eq!(wc(&c.scq).wr_id, 5);
    assert_eq!(wc(&c.scq).wr_id, 6);

    // The invalidated STag refuses a Write: DDP Terminate (tagged buffer, invalid STag).
    c.qp.post_send(SendRequest::write(
        11,
        vec![cbuf.sge(0, 16).unwrap()],
        victim.rkey(),
        victim.addr(),
    ))
    .unwrap();
    // DDP layer, tagged buffer error, invalid STag.
    let (sent, received) = term(1, 1, 0);
    expect_events(&s.qp, &[sent, CmEvent::Disconnected]);
    expect_events(&c.qp, &[received, CmEvent::Disconnected]);
    assert_eq!(victim.to_vec(0, 16).unwrap(), vec![0u8; 16]);
}

/// RDMA Write (300 KB at an offset) and RDMA Read (500 KB, answered by the responder's
/// engine without its application), data verified on both sides.
#[test]
fn xdp_write_and_read() {
    require_root_and_afxdp!();
    let net = net(62);
    let (c, s) = connect(&net, 4792);
    let cbuf = mr(&c, 1 << 20);
    let sbuf = mr(&s, 1 << 20);

    let data = pattern(300_000, 2);
    cbuf.write(0, &data).unwrap();
    c.qp.post_send(SendRequest::write(
        2,
        vec![cbuf.sge(0, 300_000).unwrap()],
        sbuf.rkey(),
        sbuf.addr() + 4096,
    ))
    .unwrap();
    let w = wc(&c.scq);
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (2, CompletionStatus::Success, WcOpcode::Write)
    );
    // A Send after the Write makes the Write visible (ordering), then check the data.
    s.qp.post_recv(8, &[sbuf.sge(900_000, 16).unwrap()])
        .unwrap();
    applied(&s);
    c.qp.post_send(SendRequest {
        inline: Some(b"done".to_vec()),
        ..SendRequest::send(3, vec![])
    })
    .unwrap();
    assert_eq!(wc(&s.rcq).byte_len, 4);
    assert_eq!(wc(&c.scq).wr_id, 3);
    assert_eq!(sbuf.to_vec(900_000, 4).unwrap(), b"done");
    assert_eq!(sbuf.to_vec(4096, 300_000).unwrap(), data);

    let data = pattern(500_000, 3);
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

/// Local Invalidate: the completion arrives on the send CQ, and a remote Write to the
/// invalidated region is refused (Terminate) and does not land.
#[test]
fn xdp_local_invalidate() {
    require_root_and_afxdp!();
    let net = net(63);
    let (c, s) = connect(&net, 4793);
    let src = mr(&c, 4096);
    let dst = mr(&s, 4096);
    src.write(0, b"before").unwrap();
    c.qp.post_send(SendRequest::write(
        1,
        vec![src.sge(0, 6).unwrap()],
        dst.rkey(),
        dst.addr(),
    ))
    .unwrap();
    s.qp.post_recv(1, &[dst.sge(100, 8).unwrap()]).unwrap();
    applied(&s);
    c.qp.post_send(SendRequest::send(2, vec![src.sge(0, 1).unwrap()]))
        .unwrap();
    wc(&s.rcq);
    assert_eq!(dst.to_vec(0, 6).unwrap(), b"before");
    s.qp.post_send(SendRequest::new(
        9,
        SendOpcode::LocalInvalidate(dst.rkey()),
        vec![],
    ))
    .unwrap();
    let w = wc(&s.scq);
    assert_eq!(
        (w.wr_id, w.opcode, w.status),
        (9, WcOpcode::LocalInvalidate, CompletionStatus::Success)
    );
    src.write(0, b"after!").unwrap();
    c.qp.post_send(SendRequest::write(
        3,
        vec![src.sge(0, 6).unwrap()],
        dst.rkey(),
        dst.addr(),
    ))
    .unwrap();
    let (sent, received) = term(1, 1, 0);
    expect_events(&s.qp, &[sent]);
    expect_events(&c.qp, &[received]);
    assert_eq!(dst.to_vec(0, 6).unwrap(), b"before");
}
