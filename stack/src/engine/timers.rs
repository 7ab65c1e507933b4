//! Connection deadlines for the own core: a min-heap of (deadline, connection id) with
//! lazy deletion. Re-arming pushes a new entry; an entry whose deadline no longer equals
//! the connection's current one is skipped when it surfaces.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use smoltcp::time::Instant;

/// The timer heap.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    /// The live deadline of each armed connection.
    armed: HashMap<u64, Instant>,
}

impl Timers {
    /// Set connection `id`'s deadline (`None`: disarm).
    pub(crate) fn set(&mut self, id: u64, at: Option<Instant>) {
        match at {
            Some(t) => {
                if self.armed.insert(id, t) != Some(t) {
                    self.heap.push(Reverse((t, id)));
                }
            }
            None => {
                self.armed.remove(&id);
            }
        }
        // Bound the stale entries: rebuild when they outnumber the live ones 4:1.
        if self.heap.len() > 64 && self.heap.len() > 4 * self.armed.len() {
            self.heap = self
                .armed
                .iter()
                .map(|(&id, &t)| Reverse((t, id)))
                .collect();
        }
    }

    /// Pop the ids whose deadline is at or before `now` into `out` (each disarmed).
    pub(crate) fn expired(&mut self, now: Instant, out: &mut Vec<u64>) {
        while let Some(&Reverse((t, id))) = self.heap.peek() {
            if t > now {
                break;
            }
            self.heap.pop();
            if self.armed.get(&id) == Some(&t) {
                self.armed.remove(&id);
                out.push(id);
            }
        }
    }

    /// The earliest live deadline (stale entries at the top are dropped on the way).
    pub(crate) fn next(&mut self) -> Option<Instant> {
        while let Some(&Reverse((t, id))) = self.heap.peek() {
            if self.armed.get(&id) == Some(&t) {
                return Some(t);
            }
            self.heap.pop();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: i64) -> Instant {
        Instant::from_millis(v)
    }

    #[test]
    fn expired_returns_due_ids_in_deadline_order_once() {
        let mut t = Timers::default();
        t.set(1, Some(ms(30)));
        t.set(2, Some(ms(10)));
        t.set(3, Some(ms(20)));
        assert_eq!(t.next(), Some(ms(10)));
        let mut out = Vec::new();
        t.expired(ms(20), &mut out);
        assert_eq!(out, vec![2, 3]);
        out.clear();
        t.expired(ms(20), &mut out);
        assert!(out.is_empty());
        assert_eq!(t.next(), Some(ms(30)));
    }

    #[test]
    fn rearmed_and_disarmed_deadlines_leave_no_stale_firing() {
        let mut t = Timers::default();
        t.set(1, Some(ms(10)));
        t.set(1, Some(ms(50)));
        t.set(2, Some(ms(5)));
        t.set(2, None);
        assert_eq!(t.next(), Some(ms(50)));
        let mut out = Vec::new();
        t.expired(ms(40), &mut out);
        assert!(out.is_empty());
        t.expired(ms(50), &mut out);
        assert_eq!(out, vec![1]);
        assert_eq!(t.next(), None);
    }

    #[test]
    fn stale_entries_stay_bounded() {
        let mut t = Timers::default();
        for i in 0..10_000i64 {
            t.set(1, Some(ms(i + 1)));
        }
        assert!(t.heap.len() <= 65, "heap {}", t.heap.len());
        assert_eq!(t.next(), Some(ms(10_000)));
    }
}
