//! Per-QP counters: what a queue pair and its connection did, kept as plain integers by
//! the code that does the work (no atomics: the sans-IO layer is single-threaded; an
//! increment costs one add on a field the same code already touches).
//!
//! [`QueuePair::counters`](crate::QueuePair::counters) gives the QP's own counts;
//! [`Connection::counters`](crate::Connection::counters) adds what only the connection
//! sees (MPA CRC, marker and length errors, work it flushed before or after the QP
//! existed, the MPA negotiation result). What each field counts is below and in
//! `docs/ddp-rdmap.md` §4.
//!
//! Invariant (tested): every work request accepted by a post is counted once in
//! `*_wrs_posted` and, once it finished, once in exactly one of `*_wrs_completed`,
//! `*_wrs_flushed` or `*_wrs_failed`. The internal RTR message of an MPA v2 P2P
//! Initiator is not a work request of the ULP and is not counted as one (its segment is
//! still counted in `segments_sent`).

use xwarp_ddp::mpa::{Negotiated, RtrType};

use crate::verbs::{CompletionStatus, WcOpcode};
use crate::wire::Terminate;

/// The code of a Terminate message (RFC 5040 §4.8): its Layer, EType and Error Code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TerminateCode {
    /// Layer: 0 RDMAP, 1 DDP, 2 LLP (MPA).
    pub layer: u8,
    /// Error type within the layer (e.g. RDMAP 1 remote protection, DDP 1 tagged buffer,
    /// DDP 2 untagged buffer; LLP 0).
    pub etype: u8,
    /// Error code (RFC 5040 §4.8, RFC 5041 §7.2, RFC 5044 §8; e.g. LLP 0x02 CRC error).
    pub code: u8,
}

impl From<&Terminate> for TerminateCode {
    fn from(t: &Terminate) -> Self {
        TerminateCode {
            layer: t.layer,
            etype: t.etype,
            code: t.code,
        }
    }
}

/// What MPA negotiated for the connection (RFC 5044, RFC 6581).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MpaResult {
    /// MPA revision in use (1 or 2).
    pub revision: u8,
    /// CRC32c on every FPDU, both directions.
    pub crc: bool,
    /// We insert markers in the FPDUs we send.
    pub markers_tx: bool,
    /// The peer inserts markers in the FPDUs we receive.
    pub markers_rx: bool,
    /// Our negotiated IRD (inbound Read Requests served at once).
    pub ird: u16,
    /// Our negotiated ORD (outbound Read Requests outstanding at once).
    pub ord: u16,
    /// P2P mode (RFC 6581): the RTR message the Initiator sends first; `None`: no P2P.
    pub p2p_rtr: Option<RtrType>,
}

impl From<&Negotiated> for MpaResult {
    fn from(n: &Negotiated) -> Self {
        MpaResult {
            revision: n.revision,
            crc: n.crc,
            markers_tx: n.markers_tx,
            markers_rx: n.markers_rx,
            ird: n.ird,
            ord: n.ord,
            p2p_rtr: n.rtr,
        }
    }
}

/// Protocol errors detected on this stream, by kind. MPA errors are found by the
/// negotiator and the FPDU parser of the connection; the others by the QP's receive side (RFC 5041 §7.2,
/// RFC 5040 §7) or its send side. Each error ends the stream, so after the first one
/// nothing more is validated: a stream counts at most one QP-level error and at most one
/// MPA error (an MPA error may follow a QP error found in the same input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ErrorCounters {
    /// MPA: an FPDU whose CRC32c did not match (RFC 5044 §8, LLP code 0x02).
    pub mpa_crc: u64,
    /// MPA: a marker whose FPDUPTR did not point at the current FPDU (LLP 0x03).
    pub mpa_marker: u64,
    /// MPA: any other framing error of the FPDU stream (ULPDU_Length shorter than the
    /// DDP header, LLP 0x01).
    pub mpa_framing: u64,
    /// MPA negotiation failed: an invalid or unusable Request/Reply (RFC 5044 §7,
    /// RFC 6581: IRD/ORD, no matching RTR) or a Request/Reply timeout.
    pub mpa_negotiation: u64,
    /// DDP tagged buffer errors (Layer 1, EType 1: invalid STag, base or bounds, STag not
    /// associated with the stream, TO wrap, bad DDP version).
    pub ddp_tagged: u64,
    /// DDP untagged buffer errors (Layer 1, EType 2: invalid QN, MSN range, no receive
    /// posted, invalid MO, message too long, bad DDP version).
    pub ddp_untagged: u64,
    /// DDP catastrophic errors (Layer 1, EType 0: e.g. a receive buffer or Read sink
    /// that changed under the data).
    pub ddp_catastrophic: u64,
    /// RDMAP remote protection errors (Layer 0, EType 1: invalid STag, access rights,
    /// base or bounds of a Read source or an invalidation).
    pub rdmap_protection: u64,
    /// RDMAP remote operation errors (Layer 0, EType 2: bad RDMAP version or opcode,
    /// more Read Requests than IRD, a malformed Read Request or Terminate).
    pub rdmap_operation: u64,
    /// Local catastrophic errors (Layer 0, EType 0): a source region that went away
    /// under a message being sent, a send WR with a bad SGL, or a modify to TERMINATE.
    pub local_catastrophic: u64,
}

impl ErrorCounters {
    /// Count the error behind a Terminate we queued (LLP errors are counted by the
    /// connection, which sees the MPA error itself).
    pub(crate) fn count_terminate(&mut self, t: &Terminate) {
        let c = match (t.layer, t.etype) {
            (0, 0) => &mut self.local_catastrophic,
            (0, 1) => &mut self.rdmap_protection,
            (0, _) => &mut self.rdmap_operation,
            (1, 1) => &mut self.ddp_tagged,
            (1, 2) => &mut self.ddp_untagged,
            (1, _) => &mut self.ddp_catastrophic,
            _ => return,
        };
        *c += 1;
    }

    /// The sum of every kind.
    pub fn total(&self) -> u64 {
        self.mpa_crc
            + self.mpa_marker
            + self.mpa_framing
            + self.mpa_negotiation
            + self.ddp_tagged
            + self.ddp_untagged
            + self.ddp_catastrophic
            + self.rdmap_protection
            + self.rdmap_operation
            + self.local_catastrophic
    }

    fn add(&mut self, o: &ErrorCounters) {
        self.mpa_crc += o.mpa_crc;
        self.mpa_marker += o.mpa_marker;
        self.mpa_framing += o.mpa_framing;
        self.mpa_negotiation += o.mpa_negotiation;
        self.ddp_tagged += o.ddp_tagged;
        self.ddp_untagged += o.ddp_untagged;
        self.ddp_catastrophic += o.ddp_catastrophic;
        self.rdmap_protection += o.rdmap_protection;
        self.rdmap_operation += o.rdmap_operation;
        self.local_catastrophic += o.local_catastrophic;
    }
}

/// A snapshot of one QP's counters (a plain `Copy` value; taking one copies ~300 bytes).
///
/// "Segment" is a DDP segment (one FPDU on the wire). Payload bytes never include DDP or
/// RDMAP headers, MPA framing, the Read Request body or the Terminate body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QpCounters {
    /// Send work requests accepted by a post (Send, Write, Read; and, at the verbs
    /// layer, Local Invalidate), including ones posted in ERROR that flush at once.
    pub send_wrs_posted: u64,
    /// Receive work requests accepted by a post on the QP's own receive queue
    /// (receives posted to a shared receive queue belong to no QP and are not counted).
    pub recv_wrs_posted: u64,
    /// Send work requests finished successfully (signaled or not).
    pub send_wrs_completed: u64,
    /// Receives filled by an inbound Send and completed successfully (also those taken
    /// from a shared receive queue).
    pub recv_wrs_completed: u64,
    /// Send work requests completed with a flush status (the QP went to ERROR first).
    pub send_wrs_flushed: u64,
    /// Receives completed with a flush status.
    pub recv_wrs_flushed: u64,
    /// Send work requests completed with another error status (local protection or
    /// length error, a post the QP refused).
    pub send_wrs_failed: u64,
    /// Receives completed with another error status (e.g. a Send longer than the
    /// receive buffer, a receive whose memory was not registered).
    pub recv_wrs_failed: u64,
    /// DDP segments handed out to be sent: Sends, Writes, Read Requests, Read Responses
    /// and the Terminate (also the zero-length RTR).
    pub segments_sent: u64,
    /// Payload bytes of the Send, Write and Read Response segments sent.
    pub bytes_sent: u64,
    /// RDMA Read Requests sent (one per Read work request; the zero-length Read RTR
    /// included).
    pub read_requests_sent: u64,
    /// DDP segments received (every one whose header was read, valid or not, also while
    /// the stream is being torn down).
    pub segments_received: u64,
    /// Payload bytes written into local memory by inbound Writes, Read Responses and
    /// Sends. Payload is placed as it streams in and an FPDU's CRC is at its end, so the
    /// bytes of an FPDU that then fails its CRC check are counted too (its segment is
    /// not a placement, and the receive it went into is flushed).
    pub bytes_placed: u64,
    /// Tagged segments (RDMA Write or Read Response) placed whole, each with at least
    /// one payload byte (zero-length Writes, such as the Write RTR, place nothing).
    pub tagged_placements: u64,
    /// Untagged segments (Send) placed whole into a receive, each with at least one
    /// payload byte.
    pub untagged_placements: u64,
    /// Inbound RDMA Read Requests answered in full by the read responder (the last Read
    /// Response segment was sent; zero-length Reads included).
    pub read_requests_served: u64,
    /// Read Responses placed in full into our sink (one per completed Read).
    pub read_responses_placed: u64,
    /// Protocol errors detected on this stream, by kind.
    pub errors: ErrorCounters,
    /// Terminate messages sent (at most one per stream).
    pub terminates_sent: u64,
    /// Terminate messages received.
    pub terminates_received: u64,
    /// The code of the last Terminate sent.
    pub last_terminate_sent: Option<TerminateCode>,
    /// The code of the last Terminate received (as the peer laid it out; see
    /// [`ParsedTerminate::best`](crate::wire::ParsedTerminate::best)). `None` also when
    /// a received Terminate could not be read.
    pub last_terminate_received: Option<TerminateCode>,
    /// What MPA negotiated (`None` for a bare QP and before negotiation finished).
    pub mpa: Option<MpaResult>,
}

impl QpCounters {
    /// MPA CRC failures detected by the FPDU parser on this connection
    /// (`errors.mpa_crc`).
    pub fn crc_errors(&self) -> u64 {
        self.errors.mpa_crc
    }

    /// Adds `other`'s counts to these (e.g. a verbs QP keeps its counts across a reset).
    /// The last Terminate codes are `other`'s where it has them; the MPA result is
    /// `other`'s.
    pub fn accumulate(&mut self, other: &QpCounters) {
        self.send_wrs_posted += other.send_wrs_posted;
        self.recv_wrs_posted += other.recv_wrs_posted;
        self.send_wrs_completed += other.send_wrs_completed;
        self.recv_wrs_completed += other.recv_wrs_completed;
        self.send_wrs_flushed += other.send_wrs_flushed;
        self.recv_wrs_flushed += other.recv_wrs_flushed;
        self.send_wrs_failed += other.send_wrs_failed;
        self.recv_wrs_failed += other.recv_wrs_failed;
        self.segments_sent += other.segments_sent;
        self.bytes_sent += other.bytes_sent;
        self.read_requests_sent += other.read_requests_sent;
        self.segments_received += other.segments_received;
        self.bytes_placed += other.bytes_placed;
        self.tagged_placements += other.tagged_placements;
        self.untagged_placements += other.untagged_placements;
        self.read_requests_served += other.read_requests_served;
        self.read_responses_placed += other.read_responses_placed;
        self.errors.add(&other.errors);
        self.terminates_sent += other.terminates_sent;
        self.terminates_received += other.terminates_received;
        if other.last_terminate_sent.is_some() {
            self.last_terminate_sent = other.last_terminate_sent;
        }
        if other.last_terminate_received.is_some() {
            self.last_terminate_received = other.last_terminate_received;
        }
        self.mpa = other.mpa;
    }

    /// Count one finished work request of `opcode` with `status` (a send WR unless
    /// `opcode` is [`WcOpcode::Recv`]).
    pub fn count_completion(&mut self, opcode: WcOpcode, status: CompletionStatus) {
        let recv = opcode == WcOpcode::Recv;
        let c = match (status, recv) {
            (CompletionStatus::Success, false) => &mut self.send_wrs_completed,
            (CompletionStatus::Success, true) => &mut self.recv_wrs_completed,
            (CompletionStatus::WrFlushError, false) => &mut self.send_wrs_flushed,
            (CompletionStatus::WrFlushError, true) => &mut self.recv_wrs_flushed,
            (_, false) => &mut self.send_wrs_failed,
            (_, true) => &mut self.recv_wrs_failed,
        };
        *c += 1;
    }

    /// Count one work request accepted and finished at once (never reached a QP): a
    /// post plus its completion.
    pub fn count_posted_and_done(&mut self, opcode: WcOpcode, status: CompletionStatus) {
        if opcode == WcOpcode::Recv {
            self.recv_wrs_posted += 1;
        } else {
            self.send_wrs_posted += 1;
        }
        self.count_completion(opcode, status);
    }

    /// Work requests posted and not finished yet (posted − completed − flushed − failed,
    /// both queues).
    pub fn wrs_outstanding(&self) -> u64 {
        (self.send_wrs_posted + self.recv_wrs_posted).saturating_sub(
            self.send_wrs_completed
                + self.recv_wrs_completed
                + self.send_wrs_flushed
                + self.recv_wrs_flushed
                + self.send_wrs_failed
                + self.recv_wrs_failed,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{RdmapErrorCode, RdmapEtype, TerminateCause};
    use xwarp_ddp::segment::{DdpError, TaggedErrorCode, UntaggedErrorCode};

    #[test]
    fn terminate_kinds_map_to_rfc_layers() {
        let mut e = ErrorCounters::default();
        for c in [
            TerminateCause::Ddp(DdpError::Tagged(TaggedErrorCode::InvalidStag)),
            TerminateCause::Ddp(DdpError::Untagged(UntaggedErrorCode::NoBufferAvailable)),
            TerminateCause::Ddp(DdpError::Catastrophic),
            TerminateCause::Rdmap(RdmapEtype::RemoteProtection, RdmapErrorCode::AccessRights),
            TerminateCause::remote_op(RdmapErrorCode::UnexpectedOpcode),
            TerminateCause::Rdmap(RdmapEtype::LocalCatastrophic, RdmapErrorCode::Unspecified),
            TerminateCause::Llp(crate::wire::LlpErrorCode::CrcError),
        ] {
            e.count_terminate(&Terminate::new(c));
        }
        assert_eq!(
            e,
            ErrorCounters {
                ddp_tagged: 1,
                ddp_untagged: 1,
                ddp_catastrophic: 1,
                rdmap_protection: 1,
                rdmap_operation: 1,
                local_catastrophic: 1,
                ..Default::default()
            }
        );
        assert_eq!(e.total(), 6);
    }

    #[test]
    fn completions_sorted_by_queue_and_status() {
        let mut c = QpCounters::default();
        c.count_posted_and_done(WcOpcode::Send, CompletionStatus::Success);
        c.count_posted_and_done(WcOpcode::Recv, CompletionStatus::WrFlushError);
        c.count_posted_and_done(WcOpcode::Read, CompletionStatus::LocalProtectionError);
        c.recv_wrs_posted += 1;
        assert_eq!(
            (c.send_wrs_posted, c.send_wrs_completed, c.send_wrs_failed),
            (2, 1, 1)
        );
        assert_eq!((c.recv_wrs_posted, c.recv_wrs_flushed), (2, 1));
        assert_eq!(c.wrs_outstanding(), 1);
        let mut sum = QpCounters::default();
        sum.accumulate(&c);
        sum.accumulate(&c);
        assert_eq!(sum.send_wrs_posted, 4);
        assert_eq!(sum.wrs_outstanding(), 2);
    }
}
