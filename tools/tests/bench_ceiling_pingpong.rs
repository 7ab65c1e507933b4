//! The AF_XDP latency ceiling of `xwarp bench tcp` (`xwarp_tools::bench::ceiling::pingpong`)
//! on a veth pair between two namespaces this test creates: 1000 measured 64-byte round
//! trips after 100 warm-up ones, every request and reply payload checked (sequence number
//! and pattern) by the ping-pong itself. Root and AF_XDP, else a loud `SKIPPED:` line.

#[macro_use]
#[path = "../../tests/support/afxdp_skip.rs"]
mod afxdp_skip;

use std::net::Ipv4Addr;
use std::time::Duration;

use xwarp::poll_driver::afxdp::XdpMode;
use xwarp::poll_driver::netns::VethPair;
use xwarp_tools::bench::ceiling::{pingpong, PingSettings, Side};

#[test]
fn afxdp_ceiling_pingpong_runs_1000_checked_round_trips() {
    require_root_and_afxdp!();
    let net = 97;
    let veth = VethPair::new(net).expect("veth pair");
    let a = Side {
        ns: &veth.a,
        ifname: &veth.if_a,
        ip: Ipv4Addr::new(10, 88, net, 10),
        core: None,
    };
    let b = Side {
        ns: &veth.b,
        ifname: &veth.if_b,
        ip: Ipv4Addr::new(10, 88, net, 20),
        core: None,
    };
    let out = pingpong(
        &a,
        &b,
        &PingSettings {
            mode: XdpMode::Generic,
            warmup: 100,
            rounds: 1000,
            duration: Duration::from_secs(20),
        },
    )
    .expect("ceiling ping-pong");
    let h = &out.half_rtt_ns;
    assert_eq!(h.len(), 1000, "measured round trips");
    let (p50, p99) = (h.value_at_quantile(0.5), h.value_at_quantile(0.99));
    assert!(p50 > 0 && p50 <= p99, "p50 {p50} ns, p99 {p99} ns");
    eprintln!(
        "afxdp ceiling ping-pong: half RTT p50 {p50} ns p99 {p99} ns, {} resent",
        out.resent
    );
}
