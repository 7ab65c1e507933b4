//! Hostile input: random and mutated DDP segments never panic the receiver, never write
//! outside registered regions, and every Terminate the QP emits parses as RFC layout.

mod common;
use common::*;
use proptest::prelude::*;
use xwarp_rdmap::wire::{Terminate, TerminateLayout};
use xwarp_rdmap::*;

fn seg() -> impl Strategy<Value = Vec<u8>> {
    let hdr = (
        prop_oneof![
            Just(0xc1u8),
            Just(0x81),
            Just(0x41),
            Just(0x01),
            any::<u8>()
        ],
        prop_oneof![(0x40u8..0x48), any::<u8>()],
        prop_oneof![Just(0u32), Just(0x101), Just(0x201), any::<u32>()],
        prop_oneof![Just(0u32), Just(1), Just(2), any::<u32>()],
        prop_oneof![Just(1u32), Just(2), any::<u32>()],
        prop_oneof![Just(0u32), Just(0x1000), any::<u32>()],
    );
    (hdr, prop::collection::vec(any::<u8>(), 0..80)).prop_map(|((c, r, a, b, m, o), p)| {
        let mut v = vec![c, r];
        for x in [a, b, m, o] {
            v.extend_from_slice(&x.to_be_bytes());
        }
        let hlen = xwarp_ddp::segment::header_len(c);
        v.truncate(hlen);
        v.extend_from_slice(&p);
        v
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn random_segments_never_panic(segs in prop::collection::vec(seg(), 1..8), split in 0usize..80) {
        let mut b = Side::new(2, 2, 4);
        let w = b.reg(0x1000, 64, 0, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let r = b.reg(0x2000, 64, 9, Access::REMOTE_READ);
        let guard = b.reg(0x1040, 16, 0xee, Access::NONE);
        b.recv(1, w, 0x1000, 32);
        for s in &segs {
            let hlen = xwarp_ddp::segment::header_len(s[0]);
            let cut = split.min(s.len() - hlen);
            b.deliver_split(s, &[cut]);
        }
        while let Some(out) = b.next_segment(1500) {
            if out[1] == 0x47 {
                let p = Terminate::parse(&out[18..]).unwrap();
                prop_assert_eq!(p.chosen, TerminateLayout::Rfc);
                prop_assert!(p.best().unwrap().cause().is_some());
            }
        }
        prop_assert_eq!(b.mem(guard), vec![0xee; 16]);
        prop_assert_eq!(b.mem(r), vec![9; 64]);
    }
}
