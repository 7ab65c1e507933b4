//! Selective acknowledgment: the receiver's reassembly map and the SACK/DSACK blocks it
//! sends (RFC 2018, RFC 2883), and the sender's scoreboard (RFC 6675).

pub mod receiver;
pub mod scoreboard;

pub use receiver::{DropReason, Reassembly, ReassemblyConfig, Received};
pub use scoreboard::{AckInfo, NextSeg, Scoreboard, ScoreboardConfig};

use super::seq::Seq;

/// One SACK block: the octets `start..end` (`end` exclusive, as on the wire: RFC 2018 §3
/// "Right Edge of Block" is the sequence number just past the block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SackBlock {
    /// First octet of the block.
    pub start: Seq,
    /// One past the last octet.
    pub end: Seq,
}

impl SackBlock {
    /// The block `start..end`.
    pub fn new(start: Seq, end: Seq) -> Self {
        SackBlock { start, end }
    }

    /// Its length in octets (`end - start` modulo 2^32).
    pub fn len(&self) -> u32 {
        self.end.since(self.start)
    }

    /// Whether it holds no octet.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Whether `other` lies inside this block.
    pub fn contains_block(&self, other: &SackBlock) -> bool {
        let s = other.start.since(self.start);
        let e = other.end.since(self.start);
        s <= e && e <= self.len()
    }

    /// As carried by smoltcp's `TcpOption::SackRange`.
    pub fn to_wire(self) -> (u32, u32) {
        (self.start.0, self.end.0)
    }

    /// From smoltcp's `TcpRepr::sack_ranges` / `TcpOption::SackRange` element.
    pub fn from_wire((l, r): (u32, u32)) -> Self {
        SackBlock::new(Seq(l), Seq(r))
    }
}

/// At most four SACK blocks for one outgoing segment (RFC 2018 §3: 40 option bytes hold
/// four; three when the timestamp option is present too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SackList {
    blocks: [Option<SackBlock>; 4],
    len: usize,
}

impl SackList {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append a block; `false` (and nothing changes) when four are held.
    pub fn push(&mut self, b: SackBlock) -> bool {
        if self.len == 4 {
            return false;
        }
        self.blocks[self.len] = Some(b);
        self.len += 1;
        true
    }

    /// The blocks, first to last.
    pub fn iter(&self) -> impl Iterator<Item = SackBlock> + '_ {
        self.blocks[..self.len].iter().flatten().copied()
    }

    /// How many blocks.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first three, for smoltcp's `TcpRepr::sack_ranges` (which carries at most three).
    pub fn to_smoltcp(&self) -> [Option<(u32, u32)>; 3] {
        let mut out = [None; 3];
        for (o, b) in out.iter_mut().zip(self.iter()) {
            *o = Some(b.to_wire());
        }
        out
    }

    /// The blocks of a received segment (`TcpRepr::sack_ranges`).
    pub fn from_smoltcp(ranges: &[Option<(u32, u32)>]) -> Self {
        let mut l = SackList::new();
        for r in ranges.iter().flatten() {
            l.push(SackBlock::from_wire(*r));
        }
        l
    }
}
