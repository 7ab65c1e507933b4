//! A random packet dropper as an XDP program: loss on a path without `tc netem`.
//!
//! Some kernels (this project's test machines among them) are built without `sch_netem`,
//! so `tc qdisc add ... netem loss P` fails with "qdisc kind unknown". [`LossDropper`] gives
//! the same random loss with what AF_XDP already needs: an XDP program, generated as raw
//! eBPF instructions like the steering program, that drops each IPv4 TCP frame with
//! probability P (`bpf_get_prandom_u32() < P * 2^32`) and passes everything else. Attach it
//! to the receiving interfaces of a forwarding namespace between two ends (XDP sees only
//! received frames, so one attachment per direction); frames are counted as they are judged,
//! so a bench reports the loss the path really had, not the one asked for.
//!
//! One array map holds three u64 slots: `[0]` TCP frames dropped, `[1]` TCP frames passed,
//! `[2]` the drop threshold (`P * 2^32`), which [`LossDropper::set_loss`] changes while the
//! program runs. Frames other than IPv4 TCP (ARP, ICMP, IPv6) are passed and not counted:
//! dropping ARP would stall a path for seconds and measure nothing about TCP.
//!
//! The program reads only the first 34 bytes of a frame, so it is loaded with
//! `BPF_F_XDP_HAS_FRAGS` and takes multi-buffer (jumbo) frames as they are. Each frame
//! counts once whatever its size: the ends must not send GSO/GRO super-frames through it
//! (turn TSO, GSO and GRO off on the path), or one verdict would drop dozens of segments.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use super::bpf::{self, BpfInsn};
use super::program::{
    attach_fd, be16, Asm, XdpLink, XdpMode, ADD, B, BPF_F_XDP_HAS_FRAGS, BPF_PSEUDO_MAP_FD, CALL,
    EXIT, H, JEQ, JLT, JMP, JNE, MOV, W, XDP_PASS,
};

const XDP_DROP: i32 = 1;
const BPF_FUNC_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_FUNC_GET_PRANDOM_U32: i32 = 7;
/// `BPF_ST | BPF_MEM | BPF_W`: store an immediate word.
const ST_MEM_W: u8 = 0x62;
/// `BPF_STX | BPF_ATOMIC | BPF_DW` with `imm = BPF_ADD`: atomic 64-bit add.
const ATOMIC_ADD_DW: u8 = 0xdb;
/// `BPF_LDX | BPF_MEM | BPF_DW`.
const LDX_DW: u8 = 0x79;

/// Map slots.
const SLOT_DROPPED: i32 = 0;
const SLOT_PASSED: i32 = 1;
const SLOT_THRESHOLD: u32 = 2;

/// Program name (starts with [`super::PROGRAM_NAME_PREFIX`]: a stale one is replaced).
const NAME: &str = "xwarp_loss";

/// The drop threshold for loss probability `p` (clamped to 0..=1): `p * 2^32`.
pub fn threshold(p: f64) -> u64 {
    let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
    (p * 4_294_967_296.0).round() as u64
}

/// Emit `map[slot] += 1` (r1..r5 and r0 clobbered; r10 - 4 used for the key).
fn count(a: &mut Asm, map_fd: i32, slot: i32) {
    let skip = a.label();
    a.raw(ST_MEM_W, 10, 0, -4, slot);
    a.raw(0x18, 1, BPF_PSEUDO_MAP_FD, 0, map_fd); // ld_imm64 r1 = map
    a.raw(0, 0, 0, 0, 0);
    a.alu_x(MOV, 2, 10);
    a.alu_k(ADD, 2, -4);
    a.raw(JMP | CALL, 0, 0, 0, BPF_FUNC_MAP_LOOKUP_ELEM);
    a.jmp_k(JMP, JEQ, 0, 0, skip);
    a.alu_k(MOV, 1, 1);
    a.raw(ATOMIC_ADD_DW, 0, 1, 0, 0);
    a.bind(skip);
}

/// The dropper's instructions for the counters and threshold in array map `map_fd`.
///
/// Registers: r6 ctx, r7 threshold, r2/r3 data/data_end, r5 loaded field.
pub fn dropper_program(map_fd: i32) -> io::Result<Vec<BpfInsn>> {
    let mut a = Asm::new();
    let pass_uncounted = a.label();
    let drop = a.label();
    a.alu_x(MOV, 6, 1);
    // r7 = map[2] (the threshold); a missing slot (never: arrays are preallocated) passes.
    a.raw(ST_MEM_W, 10, 0, -4, SLOT_THRESHOLD as i32);
    a.raw(0x18, 1, BPF_PSEUDO_MAP_FD, 0, map_fd);
    a.raw(0, 0, 0, 0, 0);
    a.alu_x(MOV, 2, 10);
    a.alu_k(ADD, 2, -4);
    a.raw(JMP | CALL, 0, 0, 0, BPF_FUNC_MAP_LOOKUP_ELEM);
    a.jmp_k(JMP, JEQ, 0, 0, pass_uncounted);
    a.raw(LDX_DW, 7, 0, 0, 0);
    // IPv4 TCP only: EtherType at 12, protocol at 14 + 9.
    a.ldx(W, 2, 6, 0);
    a.ldx(W, 3, 6, 4);
    a.need(34, pass_uncounted);
    a.ldx(H, 5, 2, 12);
    a.jmp_k(JMP, JNE, 5, be16(0x0800), pass_uncounted);
    a.ldx(B, 5, 2, 23);
    a.jmp_k(JMP, JNE, 5, 6, pass_uncounted);
    a.raw(JMP | CALL, 0, 0, 0, BPF_FUNC_GET_PRANDOM_U32);
    // Unsigned 64-bit compare: r0 is a zero-extended u32, r7 at most 2^32.
    a.jmp_x(JLT, 0, 7, drop);
    count(&mut a, map_fd, SLOT_PASSED);
    a.alu_k(MOV, 0, XDP_PASS);
    a.raw(JMP | EXIT, 0, 0, 0, 0);
    a.bind(drop);
    count(&mut a, map_fd, SLOT_DROPPED);
    a.alu_k(MOV, 0, XDP_DROP);
    a.raw(JMP | EXIT, 0, 0, 0, 0);
    a.bind(pass_uncounted);
    a.alu_k(MOV, 0, XDP_PASS);
    a.raw(JMP | EXIT, 0, 0, 0, 0);
    a.finish()
}

/// Frames a [`LossDropper`] judged so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DropCounts {
    /// IPv4 TCP frames dropped.
    pub dropped: u64,
    /// IPv4 TCP frames passed.
    pub passed: u64,
}

impl DropCounts {
    /// The counts since `earlier` (saturating).
    pub fn since(self, earlier: DropCounts) -> DropCounts {
        DropCounts {
            dropped: self.dropped.saturating_sub(earlier.dropped),
            passed: self.passed.saturating_sub(earlier.passed),
        }
    }

    /// Dropped over judged (0 when nothing was judged).
    pub fn fraction(self) -> f64 {
        let n = self.dropped + self.passed;
        if n == 0 {
            0.0
        } else {
            self.dropped as f64 / n as f64
        }
    }
}

/// A loaded dropper program and its map (see the module docs). One program may be attached
/// to several interfaces; they share the counters and the loss probability.
#[derive(Debug)]
pub struct LossDropper {
    prog: OwnedFd,
    map: OwnedFd,
}

impl LossDropper {
    /// Load the program with loss probability `p`.
    pub fn load(p: f64) -> io::Result<LossDropper> {
        let map = bpf::create_array_u64(3, "xwarp_loss")?;
        let insns = dropper_program(map.as_raw_fd())?;
        let prog = bpf::prog_load_xdp(&insns, NAME, BPF_F_XDP_HAS_FRAGS)?;
        let d = LossDropper { prog, map };
        d.set_loss(p)?;
        Ok(d)
    }

    /// Change the loss probability (0..=1) of every attachment at once.
    pub fn set_loss(&self, p: f64) -> io::Result<()> {
        bpf::map_update_u64(&self.map, SLOT_THRESHOLD, threshold(p))
    }

    /// The frames judged so far, over every attachment.
    pub fn counts(&self) -> io::Result<DropCounts> {
        Ok(DropCounts {
            dropped: bpf::map_lookup_u64(&self.map, SLOT_DROPPED as u32)?,
            passed: bpf::map_lookup_u64(&self.map, SLOT_PASSED as u32)?,
        })
    }

    /// Attach to `ifindex` (an index in the calling thread's network namespace) in `mode`,
    /// replacing a stale xwarp program but no other. Detached when the link drops.
    pub fn attach(&self, ifindex: u32, mode: XdpMode) -> io::Result<XdpLink> {
        attach_fd(&self.prog, ifindex, mode, Some(false))
    }

    /// Run the program once on `frame` (`BPF_PROG_TEST_RUN`): 1 = drop, 2 = pass.
    pub fn test_run(&self, frame: &[u8]) -> io::Result<u32> {
        bpf::prog_test_run(&self.prog, frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_scales_the_probability_to_32_bits() {
        assert_eq!(threshold(0.0), 0);
        assert_eq!(threshold(1.0), 1 << 32);
        assert_eq!(threshold(0.5), 1 << 31);
        assert_eq!(threshold(2.0), 1 << 32);
        assert_eq!(threshold(-1.0), 0);
        assert_eq!(threshold(f64::NAN), 0);
        let c = DropCounts {
            dropped: 3,
            passed: 97,
        };
        assert_eq!(c.fraction(), 0.03);
        assert_eq!(c.since(c), DropCounts::default());
        assert_eq!(DropCounts::default().fraction(), 0.0);
    }

    /// The verifier accepts the program; it drops every TCP frame at loss 1, none at loss
    /// 0, about P of them in between, never a non-TCP frame, and counts what it judged.
    #[test]
    fn dropper_drops_tcp_frames_at_the_asked_rate_and_counts_them() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "SKIPPED: bpf(2) needs root");
            return;
        }
        let mut tcp = vec![0u8; 64];
        tcp[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        tcp[14] = 0x45;
        tcp[23] = 6;
        let mut udp = tcp.clone();
        udp[23] = 17;
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        let d = LossDropper::load(1.0).unwrap();
        assert_eq!(d.test_run(&tcp).unwrap(), 1);
        assert_eq!(d.test_run(&udp).unwrap(), 2);
        assert_eq!(d.test_run(&arp).unwrap(), 2);
        assert_eq!(
            d.counts().unwrap(),
            DropCounts {
                dropped: 1,
                passed: 0
            }
        );
        d.set_loss(0.0).unwrap();
        assert_eq!(d.test_run(&tcp).unwrap(), 2);
        d.set_loss(0.25).unwrap();
        let before = d.counts().unwrap();
        let mut dropped = 0;
        for _ in 0..4000 {
            dropped += u32::from(d.test_run(&tcp).unwrap() == 1);
        }
        let c = d.counts().unwrap().since(before);
        assert_eq!(c.dropped + c.passed, 4000);
        assert_eq!(c.dropped, u64::from(dropped));
        // 4000 draws at p = 0.25: mean 1000, sd ~27; 800..1200 is over 7 sd.
        assert!((800..=1200).contains(&dropped), "{dropped} of 4000");
        // A frame too short for the IPv4 header passes uncounted.
        assert_eq!(d.test_run(&tcp[..20]).unwrap(), 2);
        assert_eq!(d.counts().unwrap().since(before).passed, c.passed);
    }
}
