//! Record-aligned segmentation (docs/mpa.md §1.10): when the owner of the send queue frames
//! its bytes as records ([`TxSource::framed`], e.g. MPA FPDUs of the protocol host), every
//! segment starts where a record starts and carries exactly one whole record, like a Linux
//! sender given each FPDU with `MSG_EOR` (what siw does). RFC 5044 §8 sizes FPDUs (MULPDU)
//! so one fits a segment; these rules keep TCP from splitting or merging them:
//!
//! * new data: a segment carries as many whole records as fit (at least one). When the peer's window is smaller than the
//!   record the sender waits (for an ACK opening it, or, with nothing in flight, the
//!   persist probe of `transmit_synced`); only a peer that never offered a window as
//!   large as the record gets it split. When the congestion window is short of the record
//!   the sender waits for ACKs, unless nothing is in flight (then the record goes whole:
//!   at most one segment beyond cwnd, as a sender may always send one segment).
//! * bytes after the last record end (a record the owner has not finished writing) wait.
//! * retransmissions (RACK/RTO, fast retransmit, TLP) are cut at the first record end
//!   after their start: a range never spans two records, so they keep the original
//!   segments' alignment. SACK blocks in a segment give way to a whole record (the
//!   segment builder drops blocks that do not fit, as for retransmissions).
//!
//! A record larger than one segment (a producer sizing FPDUs beyond the MSS) is sent as a
//! byte stream; alignment is then the producer's problem.

use super::{Connection, SackBlock, TxSource, MAX_WINDOW};

/// What the next new segment may carry, by the send queue's records.
pub(super) enum RecordPlan {
    /// No records (or one larger than a segment): segment as a byte stream.
    Stream,
    /// The bytes from SND.NXT have no record end yet: wait for the owner to finish it.
    Incomplete,
    /// Whole records from SND.NXT, this many bytes of them: as many as fit one segment
    /// (at least one).
    Whole(u32),
}

impl Connection {
    /// Most payload a segment carrying a whole record may have: the effective MSS with
    /// no SACK blocks (they give way to the record).
    fn record_mss(&self) -> u32 {
        self.seg_max
            .saturating_sub(self.options_len(0))
            .clamp(1, self.snd_mss)
    }

    /// The plan for new data `sent` bytes past SND.UNA, `avail` bytes queued beyond it.
    pub(super) fn record_plan(&self, tx: &impl TxSource, sent: u64, avail: u32) -> RecordPlan {
        if !tx.framed() || avail == 0 {
            return RecordPlan::Stream;
        }
        let max = self.record_mss();
        match tx.next_boundary(sent) {
            Some(b) if b > sent => {
                let rec = (b - sent).min(MAX_WINDOW as u64) as u32;
                // Records share a segment only from a record's start (the rest of a
                // record streamed because it was larger than a segment goes alone).
                let at_start = sent == 0 || tx.next_boundary(sent - 1) == Some(sent);
                if rec <= max && rec <= avail && at_start {
                    RecordPlan::Whole(records_fitting(tx, sent, max.min(avail)))
                } else if rec <= max && rec <= avail {
                    RecordPlan::Whole(rec)
                } else {
                    RecordPlan::Stream
                }
            }
            // A tail shorter than a segment with no end yet: the rest of the record is
            // still to be written. A longer one is not the owner's framing: stream it.
            _ if avail < max => RecordPlan::Incomplete,
            _ => RecordPlan::Stream,
        }
    }

    /// The length to send of the whole records from `sent` (`rec` bytes of them fit a
    /// segment) when the window (`wnd_left`) or the congestion quota allow less: as many
    /// whole records as they allow, else `None` to wait.
    pub(super) fn record_len(
        &self,
        tx: &impl TxSource,
        sent: u64,
        wnd_left: u32,
        quota: u32,
        pipe: u32,
    ) -> Option<u32> {
        let fit = records_fitting(tx, sent, wnd_left.min(quota));
        if fit > 0 {
            return Some(fit);
        }
        let first = tx.next_boundary(sent).map_or(0, |b| (b - sent) as u32);
        if wnd_left < first {
            if first <= self.max_snd_wnd {
                // The window will open (an ACK, a window update, or the persist probe's
                // answer): the record waits rather than being split.
                return None;
            }
            // The peer never offered a window this large: split, or nothing ever moves.
            return Some(wnd_left.min(quota)).filter(|&l| l > 0);
        }
        if pipe > 0 {
            // ACKs in flight will grow the quota.
            return None;
        }
        // Nothing in flight: one whole record, even beyond the quota (one segment).
        Some(first)
    }

    /// A retransmission range `b` cut at the first record end after its start.
    pub(super) fn record_clamp(&self, tx: &impl TxSource, b: SackBlock) -> SackBlock {
        if !tx.framed() {
            return b;
        }
        let off = b.start.since(self.snd_una) as u64;
        match tx.next_boundary(off) {
            Some(end) if end > off && end - off < b.len() as u64 => {
                SackBlock::new(b.start, b.start.wrapping_add((end - off) as u32))
            }
            _ => b,
        }
    }
}

/// The largest run of whole records from `sent` that is at most `limit` bytes (0 when the
/// first is longer). Walks at most `limit / 8` records (an FPDU is at least 8 bytes).
fn records_fitting(tx: &impl TxSource, sent: u64, limit: u32) -> u32 {
    let mut at = sent;
    while let Some(b) = tx.next_boundary(at) {
        if b <= at || b - sent > u64::from(limit) {
            break;
        }
        at = b;
    }
    (at - sent) as u32
}
