//! The virtual wire recycles frame buffers: in steady state, sending and receiving a frame
//! allocates nothing (own test binary: it installs a counting global allocator).

mod common;

use common::*;
use smoltcp::phy::{Device, RxToken, TxToken};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;
use xwarp_poll_driver::backend::Backend;
use xwarp_poll_driver::vwire::{LinkConfig, VirtualWire, WireConfig};

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call unchanged to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(|c| c.get())
}

fn steady_state_allocations(link: LinkConfig) -> u64 {
    let (mut a, mut b) = VirtualWire::pair(WireConfig {
        a_to_b: link,
        ..WireConfig::default()
    })
    .unwrap();
    let payload = numbered_frame(1, 1200);
    let ts = smoltcp::time::Instant::from_millis(0);
    let mut checksum = 0u64;
    let mut round = |a: &mut xwarp_poll_driver::vwire::VirtualNic,
                     b: &mut xwarp_poll_driver::vwire::VirtualNic| {
        for _ in 0..32 {
            let tok = a.transmit(ts).unwrap();
            tok.consume(payload.len(), |buf| buf.copy_from_slice(&payload));
        }
        a.flush().unwrap();
        let mut n = 0;
        while n < 32 {
            b.poll_rx().unwrap();
            if let Some((rx, _)) = b.receive(ts) {
                checksum += rx.consume(|f| f.iter().map(|&x| x as u64).sum::<u64>());
                n += 1;
            }
        }
    };
    for _ in 0..10 {
        round(&mut a, &mut b); // warm-up: fills the buffer pool
    }
    let before = allocs();
    for _ in 0..300 {
        round(&mut a, &mut b);
    }
    let after = allocs();
    let per_frame: u64 = payload.iter().map(|&x| x as u64).sum();
    assert_eq!(checksum, per_frame * 32 * 310, "every frame arrived intact");
    after - before
}

#[test]
fn steady_state_send_and_receive_allocate_nothing() {
    assert_eq!(steady_state_allocations(LinkConfig::default()), 0);
    // Timed links (holding heap) recycle too.
    let timed = LinkConfig {
        jitter: Duration::from_micros(1),
        ..LinkConfig::default()
    };
    assert_eq!(steady_state_allocations(timed), 0);
}
