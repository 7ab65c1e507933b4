//! Local port bookkeeping: ephemeral allocation and listening ports.

use std::collections::HashMap;
use std::ops::RangeInclusive;

/// Which local ports are taken, and the ephemeral allocator's cursor.
#[derive(Debug)]
pub(crate) struct Ports {
    range: RangeInclusive<u16>,
    cursor: u16,
    /// Port → number of connections using it as their local port.
    used: HashMap<u16, usize>,
    /// Ports with a listener.
    listening: HashMap<u16, u64>,
}

impl Ports {
    pub(crate) fn new(range: RangeInclusive<u16>) -> Ports {
        Ports {
            cursor: *range.start(),
            range,
            used: HashMap::new(),
            listening: HashMap::new(),
        }
    }

    /// Take a free ephemeral port, round-robin so a port just released (and perhaps still
    /// known to the peer in TIME-WAIT) is reused as late as possible.
    pub(crate) fn allocate(&mut self) -> Option<u16> {
        let span = usize::from(self.range.end() - self.range.start()) + 1;
        for _ in 0..span {
            let p = self.cursor;
            self.cursor = if p >= *self.range.end() {
                *self.range.start()
            } else {
                p + 1
            };
            if !self.used.contains_key(&p) && !self.listening.contains_key(&p) {
                self.used.insert(p, 1);
                return Some(p);
            }
        }
        None
    }

    /// Use an explicit local port for an outgoing connection.
    pub(crate) fn claim(&mut self, port: u16) -> bool {
        if port == 0 || self.listening.contains_key(&port) || self.used.contains_key(&port) {
            return false;
        }
        self.used.insert(port, 1);
        true
    }

    /// Give back a port taken by [`Ports::allocate`] or [`Ports::claim`].
    pub(crate) fn release(&mut self, port: u16) {
        if let Some(n) = self.used.get_mut(&port) {
            *n -= 1;
            if *n == 0 {
                self.used.remove(&port);
            }
        }
    }

    /// Register a listener; `false` if the port is taken.
    pub(crate) fn listen(&mut self, port: u16, id: u64) -> bool {
        if port == 0 || self.listening.contains_key(&port) || self.used.contains_key(&port) {
            return false;
        }
        self.listening.insert(port, id);
        true
    }

    /// Remove a listener.
    pub(crate) fn unlisten(&mut self, port: u16) {
        self.listening.remove(&port);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ephemeral_ports_cycle_and_exhaust() {
        let mut p = Ports::new(100..=102);
        assert_eq!(p.allocate(), Some(100));
        assert_eq!(p.allocate(), Some(101));
        assert_eq!(p.allocate(), Some(102));
        assert_eq!(p.allocate(), None);
        p.release(101);
        assert_eq!(p.allocate(), Some(101));
    }

    #[test]
    fn listening_ports_are_not_handed_out() {
        let mut p = Ports::new(100..=101);
        assert!(p.listen(100, 7));
        assert!(!p.listen(100, 8));
        assert_eq!(p.allocate(), Some(101));
        assert_eq!(p.allocate(), None);
        assert!(!p.claim(100));
        p.unlisten(100);
        assert!(p.claim(100));
        assert!(!p.listen(100, 9));
    }
}
