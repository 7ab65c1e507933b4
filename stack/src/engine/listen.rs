//! Listeners of the own core: which local endpoint listens, and per listener the SYN queue
//! (handshakes in SYN-RECEIVED, bounded by `StackConfig::syn_backlog` and expired after
//! `syn_received_timeout`) and the accept-queue count (bounded by the listen backlog, itself
//! capped by `max_backlog`). A half-open connection is only a `tcp::conn::Connection` (no
//! rings or buffers): they are allocated when the handshake completes.

use std::collections::{HashMap, VecDeque};

use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{IpAddress, IpEndpoint};

/// Why a SYN was not admitted (it is dropped, the client retransmits; Linux without SYN
/// cookies does the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SynRefused {
    /// The SYN queue holds `syn_backlog` handshakes.
    SynBacklog,
    /// Accepted-but-unaccepted connections plus handshakes reach the listen backlog
    /// (`ListenOverflows`).
    AcceptQueueFull,
}

/// One listener's queues.
#[derive(Debug)]
pub(crate) struct Listener {
    /// The listener's id (its `ListenerShared` id, or the host's listener id).
    pub(crate) id: u64,
    backlog: usize,
    syn_backlog: usize,
    /// Handshakes in progress: (connection id, SYN time), oldest first.
    syn_queue: VecDeque<(u64, Instant)>,
    /// Established connections not yet taken by `accept`.
    accept_queue: usize,
}

impl Listener {
    /// A listener with an accept backlog (already capped by `max_backlog`) and a SYN queue
    /// of `syn_backlog`.
    pub(crate) fn new(id: u64, backlog: usize, syn_backlog: usize) -> Listener {
        Listener {
            id,
            backlog: backlog.max(1),
            syn_backlog: syn_backlog.max(1),
            syn_queue: VecDeque::new(),
            accept_queue: 0,
        }
    }

    /// May a new SYN start a handshake now?
    pub(crate) fn admit(&self) -> Result<(), SynRefused> {
        if self.syn_queue.len() >= self.syn_backlog {
            return Err(SynRefused::SynBacklog);
        }
        if self.syn_queue.len() + self.accept_queue >= self.backlog {
            return Err(SynRefused::AcceptQueueFull);
        }
        Ok(())
    }

    /// Record handshake `conn` started at `now` (after [`Self::admit`] said yes).
    pub(crate) fn syn_received(&mut self, conn: u64, now: Instant) {
        self.syn_queue.push_back((conn, now));
    }

    /// Handshake `conn` completed: it moves to the accept queue. `false` if unknown.
    pub(crate) fn established(&mut self, conn: u64) -> bool {
        if self.forget(conn) {
            self.accept_queue += 1;
            true
        } else {
            false
        }
    }

    /// Handshake `conn` ended otherwise (RST, abort): forget it. `false` if unknown.
    pub(crate) fn forget(&mut self, conn: u64) -> bool {
        match self.syn_queue.iter().position(|&(c, _)| c == conn) {
            Some(i) => {
                self.syn_queue.remove(i);
                true
            }
            None => false,
        }
    }

    /// The application took one connection from the accept queue.
    pub(crate) fn accepted(&mut self) {
        self.accept_queue = self.accept_queue.saturating_sub(1);
    }

    /// Handshakes older than `timeout` at `now` (`syn_received_timeout`), removed from the
    /// queue and pushed to `out` for the caller to drop.
    pub(crate) fn expire(&mut self, now: Instant, timeout: Duration, out: &mut Vec<u64>) {
        while let Some(&(c, t)) = self.syn_queue.front() {
            if now < t + timeout {
                break;
            }
            self.syn_queue.pop_front();
            out.push(c);
        }
    }

    /// When the oldest handshake expires.
    pub(crate) fn next_expiry(&self, timeout: Duration) -> Option<Instant> {
        self.syn_queue.front().map(|&(_, t)| t + timeout)
    }

    /// Handshakes in progress.
    pub(crate) fn half_open(&self) -> usize {
        self.syn_queue.len()
    }
}

/// Listening endpoints: port → (specific address or any) → listener.
#[derive(Debug, Default)]
pub(crate) struct Listeners {
    by_port: HashMap<u16, Vec<(Option<IpAddress>, Listener)>>,
}

impl Listeners {
    /// Listen on `addr` (`None`: every address) and `port`; `false` when that exact
    /// endpoint already listens.
    pub(crate) fn add(&mut self, addr: Option<IpAddress>, port: u16, l: Listener) -> bool {
        let v = self.by_port.entry(port).or_default();
        if v.iter().any(|(a, _)| *a == addr) {
            return false;
        }
        v.push((addr, l));
        true
    }

    /// Stop listener `id`; returns it (its handshakes are the caller's to reset).
    pub(crate) fn remove(&mut self, id: u64) -> Option<Listener> {
        let mut out = None;
        self.by_port.retain(|_, v| {
            if let Some(i) = v.iter().position(|(_, l)| l.id == id) {
                out = Some(v.remove(i).1);
            }
            !v.is_empty()
        });
        out
    }

    /// The listener a SYN to `local` finds: one bound to that address before a wildcard.
    pub(crate) fn find_mut(&mut self, local: IpEndpoint) -> Option<&mut Listener> {
        let v = self.by_port.get_mut(&local.port)?;
        let i = v
            .iter()
            .position(|(a, _)| *a == Some(local.addr))
            .or_else(|| v.iter().position(|(a, _)| a.is_none()))?;
        Some(&mut v[i].1)
    }

    /// Listener `id`.
    pub(crate) fn get_mut(&mut self, id: u64) -> Option<&mut Listener> {
        self.by_port
            .values_mut()
            .flat_map(|v| v.iter_mut())
            .map(|(_, l)| l)
            .find(|l| l.id == id)
    }

    /// Handshakes in progress over all listeners (`EngineUsage::half_open`).
    pub(crate) fn half_open(&self) -> usize {
        self.by_port
            .values()
            .flat_map(|v| v.iter())
            .map(|(_, l)| l.half_open())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn at(ms: i64) -> Instant {
        Instant::from_millis(ms)
    }

    #[test]
    fn syn_beyond_syn_backlog_is_refused_until_a_handshake_ends() {
        let mut l = Listener::new(1, 100, 3);
        for c in 0..3 {
            assert_eq!(l.admit(), Ok(()));
            l.syn_received(c, at(0));
        }
        assert_eq!(l.admit(), Err(SynRefused::SynBacklog));
        assert!(l.forget(1));
        assert_eq!(l.admit(), Ok(()));
        assert!(!l.forget(1));
    }

    #[test]
    fn accept_queue_plus_handshakes_bounded_by_backlog() {
        let mut l = Listener::new(1, 2, 10);
        l.syn_received(10, at(0));
        assert!(l.established(10));
        l.syn_received(11, at(0));
        assert_eq!(l.admit(), Err(SynRefused::AcceptQueueFull));
        assert!(l.established(11));
        assert_eq!(l.admit(), Err(SynRefused::AcceptQueueFull));
        l.accepted();
        assert_eq!(l.admit(), Ok(()));
        assert!(!l.established(99));
    }

    #[test]
    fn handshakes_expire_after_syn_received_timeout_oldest_first() {
        let mut l = Listener::new(1, 10, 10);
        l.syn_received(1, at(0));
        l.syn_received(2, at(500));
        let t = Duration::from_millis(1000);
        assert_eq!(l.next_expiry(t), Some(at(1000)));
        let mut out = Vec::new();
        l.expire(at(999), t, &mut out);
        assert!(out.is_empty());
        l.expire(at(1000), t, &mut out);
        assert_eq!(out, vec![1]);
        assert_eq!(l.half_open(), 1);
        l.expire(at(5000), t, &mut out);
        assert_eq!(out, vec![1, 2]);
        assert_eq!(l.next_expiry(t), None);
    }

    #[test]
    fn specific_address_listener_wins_over_wildcard_and_duplicates_refused() {
        let a = IpAddress::Ipv4(Ipv4Addr::new(10, 0, 0, 1));
        let b = IpAddress::Ipv4(Ipv4Addr::new(10, 0, 0, 2));
        let mut ls = Listeners::default();
        assert!(ls.add(None, 80, Listener::new(1, 8, 8)));
        assert!(ls.add(Some(a), 80, Listener::new(2, 8, 8)));
        assert!(!ls.add(None, 80, Listener::new(3, 8, 8)));
        assert_eq!(ls.find_mut(IpEndpoint::new(a, 80)).map(|l| l.id), Some(2));
        assert_eq!(ls.find_mut(IpEndpoint::new(b, 80)).map(|l| l.id), Some(1));
        assert!(ls.find_mut(IpEndpoint::new(a, 81)).is_none());
        ls.get_mut(1).unwrap().syn_received(5, at(0));
        assert_eq!(ls.half_open(), 1);
        assert_eq!(ls.remove(1).map(|l| l.id), Some(1));
        assert!(ls.find_mut(IpEndpoint::new(b, 80)).is_none());
        assert_eq!(ls.remove(2).map(|l| l.id), Some(2));
        assert!(ls.remove(2).is_none());
        assert!(ls.by_port.is_empty());
    }
}
