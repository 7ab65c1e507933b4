//! Port events on the async fd (root): a context opened on `veth-a` inside a test
//! namespace gets `IBV_EVENT_PORT_ERR` when the link loses its carrier (the peer end goes
//! down) and `IBV_EVENT_PORT_ACTIVE` when it comes back, through `ibv_get_async_event`
//! after the async fd became readable (poll).

use std::time::{Duration, Instant};

use xwarp_ibverbs::abi::*;
use xwarp_ibverbs::exports::*;
use xwarp_ibverbs::misc::*;
use xwarp_poll_driver::netns::VethPair;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The next async event of `ctx` within `t` (poll on the fd, then get + ack).
fn next_event(ctx: *mut ibv_context, t: Duration) -> Option<(u32, i32)> {
    let t0 = Instant::now();
    // SAFETY: an open context of ours.
    let fd = unsafe { (*ctx).async_fd };
    while t0.elapsed() < t {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd.
        if unsafe { libc::poll(&mut p, 1, 100) } == 1 {
            // SAFETY: plain data; our context.
            unsafe {
                let mut ev: ibv_async_event = std::mem::zeroed();
                assert_eq!(ibv_get_async_event(ctx, &mut ev), 0);
                let r = (ev.event_type, ev.element.port_num);
                ibv_ack_async_event(&mut ev);
                return Some(r);
            }
        }
    }
    None
}

#[test]
fn port_events_follow_the_link() {
    if !is_root() {
        println!("SKIPPED: port events: needs root (network namespaces)");
        return;
    }
    let net = VethPair::new(91).expect("veth pair");
    std::env::set_var("XWARP_IFACE", &net.if_a);
    // Open in namespace A: the port watcher thread inherits it.
    let ctx = net
        .a
        .run(|| {
            let mut n = 0;
            // SAFETY: `n` writable; the device is ours.
            unsafe {
                let list = ibv_get_device_list(&mut n);
                assert_eq!(n, 1);
                let ctx = ibv_open_device(*list);
                ibv_free_device_list(list);
                ctx as usize
            }
        })
        .expect("run in namespace") as *mut ibv_context;
    assert!(!ctx.is_null());
    assert_eq!(
        next_event(ctx, Duration::from_millis(600)),
        None,
        "link is up"
    );
    net.b
        .ip(&["link", "set", &net.if_b, "down"])
        .expect("peer down");
    assert_eq!(
        next_event(ctx, Duration::from_secs(5)),
        Some((IBV_EVENT_PORT_ERR, 1))
    );
    net.b
        .ip(&["link", "set", &net.if_b, "up"])
        .expect("peer up");
    assert_eq!(
        next_event(ctx, Duration::from_secs(5)),
        Some((IBV_EVENT_PORT_ACTIVE, 1))
    );
    // SAFETY: our context, closed once (stops and joins the watcher).
    assert_eq!(unsafe { ibv_close_device(ctx) }, 0);
    drop(net);
}
