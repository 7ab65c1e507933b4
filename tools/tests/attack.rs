//! The attack suite (issue 14): a crafted peer attacks a running engine on the virtual wire
//! while a legitimate TCP flow with verified data keeps running (no root needed). The
//! attacks and their checks live in `xwarp_tools::attack` (shared with `xwarp bench
//! attack`); the limits they assume, including knobs the fixes add, are in
//! `xwarp_tools::attack::knobs` (one place, for the integrator to adjust).
//!
//! Each case fails if any check fails: memory within its bound, the legitimate flow
//! alive, correct and above a fraction of its unattacked throughput, the Terminate / RST /
//! refusal the RFCs call for, and no byte changed outside what the attacker may touch.
//! Cases run one at a time (they measure the process's RSS).

use std::sync::Mutex;

use xwarp_tools::attack::lab::CountingAlloc;
use xwarp_tools::attack::{run, Volumes};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn case(name: &str) {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let o = run(name, &Volumes::test()).unwrap_or_else(|e| panic!("{name}: {e}"));
    eprintln!(
        "{name}: {} {}; heap {} -> {} -> {} KiB; RSS {} -> {} -> {} KiB; bound {}; legit {:.1} of {:.1} MB/s ({:.2}); attacker got: {}; outside changed {}",
        o.volume,
        o.unit,
        o.before.heap >> 10,
        o.during.heap >> 10,
        o.after.heap >> 10,
        o.before.rss >> 10,
        o.during.rss >> 10,
        o.after.rss >> 10,
        o.bound,
        o.legit_during / 1e6,
        o.legit_base / 1e6,
        o.legit_fraction(),
        o.attacker_got,
        o.outside_changed
    );
    for (c, ok) in &o.checks {
        eprintln!("  [{}] {c}", if *ok { "ok" } else { "FAIL" });
    }
    let f = o.failures();
    assert!(f.is_empty(), "{name}: failed checks: {f:#?}");
}

#[test]
fn hostile_spoofed_ack_flood() {
    case("spoofed-ack-flood");
}

#[test]
fn hostile_syn_flood() {
    case("syn-flood");
}

#[test]
fn hostile_connection_flood() {
    case("connection-flood");
}

#[test]
fn hostile_mpa_request_flood() {
    case("mpa-request-flood");
}

#[test]
fn hostile_out_of_order_segment_flood() {
    case("ooo-segment-flood");
}

#[test]
fn hostile_mid_fpdu_send_invalidate_from_other_qp() {
    case("mid-fpdu-send-inv-other-qp");
}

#[test]
fn hostile_tiny_fpdu_flood() {
    case("tiny-fpdu-flood");
}

#[test]
fn rfc5040_read_beyond_ird_terminates() {
    case("read-beyond-ird");
}

#[test]
fn rfc5041_mid_fpdu_local_invalidate() {
    case("mid-fpdu-invalidate");
}

#[test]
fn rfc5041_mid_fpdu_reregister() {
    case("mid-fpdu-reregister");
}

#[test]
fn hostile_mid_fpdu_destroy_qp() {
    case("mid-fpdu-destroy-qp");
}

#[test]
fn rfc5040_send_invalidate_cross_pd() {
    case("send-inv-cross-pd");
}

#[test]
fn rfc5040_send_invalidate_local_only() {
    case("send-inv-local-only");
}

#[test]
fn hostile_stag_guessing() {
    case("stag-guessing");
}
