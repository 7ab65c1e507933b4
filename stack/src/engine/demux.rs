//! The own core's demultiplexer: (local, remote) endpoint → connection id, O(1) per
//! segment, hashed with a per-process random key (std's `RandomState`, SipHash-1-3) so a
//! peer cannot choose 4-tuples that collide into one bucket.

use std::collections::hash_map::{Entry, RandomState};
use std::collections::HashMap;

use smoltcp::wire::IpEndpoint;

/// A connection's key: our endpoint and the peer's.
pub(crate) type FourTuple = (IpEndpoint, IpEndpoint);

/// The 4-tuple table.
#[derive(Debug, Default)]
pub(crate) struct Demux {
    map: HashMap<FourTuple, u64, RandomState>,
}

impl Demux {
    /// Map `key` to connection `id`; `false` (and nothing changed) when the 4-tuple is
    /// already taken.
    pub(crate) fn insert(&mut self, key: FourTuple, id: u64) -> bool {
        match self.map.entry(key) {
            Entry::Occupied(_) => false,
            Entry::Vacant(v) => {
                v.insert(id);
                true
            }
        }
    }

    /// The connection a segment from `remote` to `local` belongs to.
    pub(crate) fn lookup(&self, local: IpEndpoint, remote: IpEndpoint) -> Option<u64> {
        self.map.get(&(local, remote)).copied()
    }

    /// Forget `key` if it still maps to `id` (a recycled id never removes a newer
    /// connection on the same 4-tuple).
    pub(crate) fn remove(&mut self, key: &FourTuple, id: u64) -> bool {
        if self.map.get(key) == Some(&id) {
            self.map.remove(key);
            true
        } else {
            false
        }
    }

    /// Connections in the table.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::wire::IpAddress;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn ep4(last: u8, port: u16) -> IpEndpoint {
        IpEndpoint::new(IpAddress::Ipv4(Ipv4Addr::new(10, 0, 0, last)), port)
    }

    #[test]
    fn lookup_finds_exact_four_tuple_only() {
        let mut d = Demux::default();
        assert!(d.insert((ep4(1, 80), ep4(2, 5000)), 7));
        assert!(d.insert((ep4(1, 80), ep4(2, 5001)), 8));
        assert_eq!(d.lookup(ep4(1, 80), ep4(2, 5000)), Some(7));
        assert_eq!(d.lookup(ep4(1, 80), ep4(2, 5001)), Some(8));
        // Swapped direction, other peer address, other local port: no match.
        assert_eq!(d.lookup(ep4(2, 5000), ep4(1, 80)), None);
        assert_eq!(d.lookup(ep4(1, 80), ep4(3, 5000)), None);
        assert_eq!(d.lookup(ep4(1, 81), ep4(2, 5000)), None);
        let v6 = IpEndpoint::new(IpAddress::Ipv6(Ipv6Addr::LOCALHOST), 80);
        assert_eq!(d.lookup(v6, ep4(2, 5000)), None);
    }

    #[test]
    fn duplicate_four_tuple_is_refused_and_stale_remove_is_ignored() {
        let mut d = Demux::default();
        let k = (ep4(1, 80), ep4(2, 5000));
        assert!(d.insert(k, 1));
        assert!(!d.insert(k, 2));
        assert_eq!(d.lookup(k.0, k.1), Some(1));
        assert!(!d.remove(&k, 2));
        assert_eq!(d.len(), 1);
        assert!(d.remove(&k, 1));
        assert_eq!(d.len(), 0);
        assert!(d.insert(k, 3));
    }

    #[test]
    fn many_connections_from_one_peer_stay_distinct() {
        let mut d = Demux::default();
        for p in 1..=10_000u16 {
            assert!(d.insert((ep4(1, 80), ep4(2, p)), u64::from(p)));
        }
        for p in (1..=10_000u16).step_by(97) {
            assert_eq!(d.lookup(ep4(1, 80), ep4(2, p)), Some(u64::from(p)));
        }
        assert_eq!(d.len(), 10_000);
    }
}
