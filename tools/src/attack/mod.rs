//! The attack suite (issue 14): a crafted peer attacks a running engine while a legitimate
//! connection keeps working. Shared by `tools/tests/attack.rs` (small volumes, every
//! expectation asserted) and `xwarp bench attack` (bigger volumes, a table and JSON).
//!
//! Each attack returns an [`Outcome`]: the volume sent, what the victim held before, during
//! and after (live heap bytes through [`lab::CountingAlloc`], RSS of the process, the
//! victim's `StackStats`), the bound it must stay
//! within, the legitimate flow's throughput during the attack against without, what the
//! attacker received (Terminate layer/EType/code per docs/ddp-rdmap.md §3.4–3.5 and
//! §2.6, RST, MPA Reject), the bytes changed outside what the peer may touch (regions in
//! two PDs, a local-only and a no-access region filled with a pattern), and the list of
//! checks with their result.
//!
//! Where it attacks from: the in-process virtual wire ([`lab`]); the victim's NIC is a
//! wrapper that forwards its frames to the legitimate peer engine and lets the test inject
//! raw frames from spoofed addresses and capture the answers; iWARP-level attacks run over
//! a TCP connection from the peer engine with bytes built by `xwarp_ddp`'s encoders
//! ([`iwarp`]). No root needed.

pub mod cases;
pub mod iwarp;
pub mod lab;

/// Every limit the attacks assume, in one place. The fixes of issue 14 add configuration
/// knobs; until they are merged the victim runs with what the base has, and the cases
/// that depend on a missing knob fail (by design: they check the behaviour the fix must
/// have). The integrator adjusts names and values here.
pub mod knobs {
    use xwarp::stack::StackConfig;

    /// Handshakes in progress per listening port: `StackConfig::syn_backlog` (exists).
    pub const SYN_BACKLOG: usize = 64;
    /// Sockets the victim engine holds at most (connections, handshakes, armed
    /// listeners). Knob of the stack fix (branch h-stack: `StackConfig::max_sockets`);
    /// set in [`victim_stack`].
    pub const MAX_CONNECTIONS: usize = 64;
    /// Flows the ACK watch tracks at most (h-stack: `StackConfig::max_tracked_flows`).
    pub const MAX_TRACKED_FLOWS: usize = 1024;
    /// Backlog of the victim's verbs listener (`Device::listen`'s argument): pending MPA
    /// Requests beyond it must be refused (verbs fix).
    pub const MPA_BACKLOG: usize = 8;
    /// Growth of the process's live heap (RSS without the counting allocator) a
    /// spoofed-ACK flood may cause (the stack fix bounds the
    /// per-flow table; with 4096 flows of a 66-byte frame copy that is well under this).
    pub const ACK_FLOOD_RSS_BOUND: u64 = 8 << 20;
    /// Growth of the live heap (or RSS) any other attack may cause.
    pub const RSS_BOUND: u64 = 64 << 20;
    /// The victim's socket buffers (small, so connection floods measure quickly); the
    /// attacker's and legitimate peer's engine uses the same.
    pub const SOCKET_BUFFER: usize = 256 << 10;
    /// What one connection costs an engine of the lab: receive + send buffer and the two
    /// application rings (`ring_size` = half the buffer each).
    pub const BYTES_PER_CONNECTION: u64 = (2 * SOCKET_BUFFER + SOCKET_BUFFER) as u64;
    /// Smallest fraction of its unattacked throughput the legitimate flow must keep.
    /// Low on purpose: the machines have 2 shared cores and the attacker runs on them.
    pub const MIN_LEGIT_FRACTION: f64 = 0.02;
    /// IRD of the victim's QPs in the Read-beyond-IRD attack.
    pub const VICTIM_IRD: u32 = 2;

    /// The victim's stack configuration on top of its address.
    pub fn victim_stack(cfg: &mut StackConfig) {
        cfg.syn_backlog = SYN_BACKLOG;
        cfg.rx_buffer = SOCKET_BUFFER;
        cfg.tx_buffer = SOCKET_BUFFER;
        cfg.ring_size = SOCKET_BUFFER / 2;
        cfg.max_sockets = MAX_CONNECTIONS;
        cfg.max_tracked_flows = MAX_TRACKED_FLOWS;
    }
}

use lab::Memory;

/// The result of one attack.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Attack name.
    pub attack: String,
    /// How much the attacker sent.
    pub volume: u64,
    /// Unit of `volume`.
    pub unit: &'static str,
    /// Victim before the attack.
    pub before: Memory,
    /// Victim at the end of the attack (before cleanup).
    pub during: Memory,
    /// Victim a moment after the attack.
    pub after: Memory,
    /// The documented bound, in words.
    pub bound: String,
    /// Legitimate throughput without the attack, bytes/s.
    pub legit_base: f64,
    /// Legitimate throughput during the attack, bytes/s.
    pub legit_during: f64,
    /// What the attacker received.
    pub attacker_got: String,
    /// Bytes outside what the peer may touch that changed (must be 0).
    pub outside_changed: u64,
    /// (check, passed).
    pub checks: Vec<(String, bool)>,
}

impl Outcome {
    /// The checks that failed.
    pub fn failures(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|(_, ok)| !ok)
            .map(|(c, _)| c.clone())
            .collect()
    }

    /// Legitimate throughput during the attack as a fraction of without.
    pub fn legit_fraction(&self) -> f64 {
        if self.legit_base > 0.0 {
            self.legit_during / self.legit_base
        } else {
            0.0
        }
    }
}

/// Volumes of one run (the test uses [`Volumes::test`], the bench [`Volumes::bench`]).
#[derive(Debug, Clone, Copy)]
pub struct Volumes {
    /// Spoofed ACKs.
    pub acks: u64,
    /// Spoofed SYNs.
    pub syns: u64,
    /// Real TCP connections.
    pub connections: u64,
    /// MPA Requests never accepted.
    pub mpa_requests: u64,
    /// Out-of-order segments of 512 bytes.
    pub ooo_segments: u64,
    /// 1-byte Write FPDUs.
    pub tiny_fpdus: u64,
    /// Read Requests at once.
    pub reads: u64,
    /// STag guesses (one connection each).
    pub guesses: u64,
}

impl Volumes {
    /// Small volumes: each case well under 30 s on a loaded 2-core machine.
    pub fn test() -> Volumes {
        Volumes {
            acks: 100_000,
            syns: 2_000,
            connections: 160,
            mpa_requests: 40,
            ooo_segments: 5_000,
            tiny_fpdus: 50_000,
            reads: 16,
            guesses: 24,
        }
    }

    /// The bench's volumes (about 2-5× the test's).
    pub fn bench() -> Volumes {
        Volumes {
            acks: 400_000,
            syns: 10_000,
            connections: 400,
            mpa_requests: 200,
            ooo_segments: 30_000,
            tiny_fpdus: 300_000,
            reads: 64,
            guesses: 64,
        }
    }
}

/// Every attack's name, in the order [`run`] runs them.
pub const ATTACKS: &[&str] = &[
    "spoofed-ack-flood",
    "syn-flood",
    "connection-flood",
    "mpa-request-flood",
    "ooo-segment-flood",
    "tiny-fpdu-flood",
    "read-beyond-ird",
    "mid-fpdu-invalidate",
    "mid-fpdu-reregister",
    "mid-fpdu-destroy-qp",
    "mid-fpdu-send-inv-other-qp",
    "send-inv-cross-pd",
    "send-inv-local-only",
    "stag-guessing",
];

/// Run the attack `name` with volumes `v`.
pub fn run(name: &str, v: &Volumes) -> std::io::Result<Outcome> {
    use cases::*;
    match name {
        "spoofed-ack-flood" => spoofed_ack_flood(v.acks),
        "syn-flood" => syn_flood(v.syns),
        "connection-flood" => connection_flood(v.connections),
        "mpa-request-flood" => mpa_request_flood(v.mpa_requests),
        "ooo-segment-flood" => ooo_flood(v.ooo_segments),
        "tiny-fpdu-flood" => tiny_fpdu_flood(v.tiny_fpdus),
        "read-beyond-ird" => read_beyond_ird(v.reads),
        "mid-fpdu-invalidate" => mid_fpdu(MidFpdu::LocalInvalidate),
        "mid-fpdu-reregister" => mid_fpdu(MidFpdu::Reregister),
        "mid-fpdu-destroy-qp" => mid_fpdu(MidFpdu::DestroyQp),
        "mid-fpdu-send-inv-other-qp" => mid_fpdu(MidFpdu::OtherQpInvalidate),
        "send-inv-cross-pd" => send_invalidate(SendInv::CrossPd),
        "send-inv-local-only" => send_invalidate(SendInv::LocalOnly),
        "stag-guessing" => stag_guessing(v.guesses),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("unknown attack {name}"),
        )),
    }
}
