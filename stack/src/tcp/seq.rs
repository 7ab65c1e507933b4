//! Wrapping 32-bit TCP sequence-number arithmetic (RFC 9293 §3.4).
//!
//! smoltcp's `wire::TcpSeqNumber` is not used for the arithmetic: its `+ usize` panics above
//! `i32::MAX` and its `a - b` panics when `b` is after `a`, and a peer picks the numbers we
//! compute with. [`Seq`] never panics; it converts to and from `TcpSeqNumber` for the wire.

use smoltcp::wire::TcpSeqNumber;

/// A TCP sequence number: an integer modulo 2^32, compared within half the space.
///
/// `a.before(b)` holds when `b - a` (mod 2^32) is in `1..2^31`. The order is not transitive
/// across more than 2^31, so `Seq` deliberately implements no `Ord`/`PartialOrd`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Seq(pub u32);

impl Seq {
    /// `self + n` modulo 2^32.
    #[inline]
    pub fn wrapping_add(self, n: u32) -> Seq {
        Seq(self.0.wrapping_add(n))
    }

    /// `self - n` modulo 2^32.
    #[inline]
    pub fn wrapping_sub(self, n: u32) -> Seq {
        Seq(self.0.wrapping_sub(n))
    }

    /// The distance from `from` forward to `self`, modulo 2^32 (`self - from`).
    #[inline]
    pub fn since(self, from: Seq) -> u32 {
        self.0.wrapping_sub(from.0)
    }

    /// The signed difference `self - other`, in `-2^31..2^31`.
    #[inline]
    pub fn diff(self, other: Seq) -> i32 {
        self.0.wrapping_sub(other.0) as i32
    }

    /// `self < other` in sequence space.
    #[inline]
    pub fn before(self, other: Seq) -> bool {
        self.diff(other) < 0
    }

    /// `self <= other` in sequence space.
    #[inline]
    pub fn before_eq(self, other: Seq) -> bool {
        self.diff(other) <= 0
    }

    /// `self > other` in sequence space.
    #[inline]
    pub fn after(self, other: Seq) -> bool {
        self.diff(other) > 0
    }

    /// `self >= other` in sequence space.
    #[inline]
    pub fn after_eq(self, other: Seq) -> bool {
        self.diff(other) >= 0
    }

    /// The later of the two (sequence order).
    #[inline]
    pub fn max_seq(self, other: Seq) -> Seq {
        if self.after(other) {
            self
        } else {
            other
        }
    }

    /// The earlier of the two (sequence order).
    #[inline]
    pub fn min_seq(self, other: Seq) -> Seq {
        if self.before(other) {
            self
        } else {
            other
        }
    }

    /// `lo <= self < hi`, measured forward from `lo` (well defined for any `lo`, `hi`:
    /// the range is the `hi - lo` numbers starting at `lo`).
    #[inline]
    pub fn in_range(self, lo: Seq, hi: Seq) -> bool {
        self.since(lo) < hi.since(lo)
    }
}

impl From<TcpSeqNumber> for Seq {
    fn from(s: TcpSeqNumber) -> Seq {
        Seq(s.0 as u32)
    }
}

impl From<Seq> for TcpSeqNumber {
    fn from(s: Seq) -> TcpSeqNumber {
        TcpSeqNumber(s.0 as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rfc9293_3_4_comparison_across_wraparound() {
        let a = Seq(u32::MAX - 10);
        let b = a.wrapping_add(20);
        assert_eq!(b, Seq(9));
        assert!(a.before(b) && b.after(a));
        assert_eq!(b.since(a), 20);
        assert_eq!(a.diff(b), -20);
        assert!(Seq(5).in_range(a, b));
        assert!(!b.in_range(a, b) && a.in_range(a, b));
        assert_eq!(a.max_seq(b), b);
        assert_eq!(a.min_seq(b), a);
    }

    #[test]
    fn half_space_boundary_does_not_panic() {
        let a = Seq(0);
        let far = Seq(1 << 31);
        // Exactly half the space apart: both read as "before" (i32::MIN < 0).
        assert!(far.before(a) && a.before(far));
        assert_eq!(far.since(a), 1 << 31);
        let w: TcpSeqNumber = far.into();
        assert_eq!(Seq::from(w), far);
    }

    proptest! {
        #[test]
        fn add_then_since_roundtrips(a in any::<u32>(), n in any::<u32>()) {
            let s = Seq(a);
            prop_assert_eq!(s.wrapping_add(n).since(s), n);
            prop_assert_eq!(s.wrapping_add(n).wrapping_sub(n), s);
            if n > 0 && n < (1 << 31) {
                prop_assert!(s.before(s.wrapping_add(n)));
                prop_assert!(s.wrapping_add(n).after(s));
            }
        }
    }
}
