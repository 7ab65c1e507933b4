//! The child's side of `fork`: descriptors whose engine connection the parent relays
//! over a unix socket, with what the child still knows about the connection.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockWriteGuard};

use libc::c_int;

use crate::sigsafe::FdBits;
use crate::sock::Opts;

/// What a child knows about a connection relayed by its parent.
#[derive(Debug)]
pub(crate) struct Relayed {
    /// `AF_INET` or `AF_INET6`, as created by the program.
    pub(crate) domain: c_int,
    /// TCP local address.
    pub(crate) local: Option<SocketAddr>,
    /// TCP peer address.
    pub(crate) peer: Option<SocketAddr>,
    /// Options as the program set them (TCP-level ones are reported, not applied).
    pub(crate) opts: Mutex<Opts>,
}

impl Relayed {
    /// The remembered options.
    pub(crate) fn opts(&self) -> MutexGuard<'_, Opts> {
        self.opts.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub(super) type RelayedMap = BTreeMap<RawFd, Arc<Relayed>>;

static RELAYED_COUNT: AtomicUsize = AtomicUsize::new(0);
static RELAYED: RwLock<RelayedMap> = RwLock::new(BTreeMap::new());
/// The descriptors [`RELAYED`] may hold (a `close` of any other takes no lock).
static RELAYED_BITS: FdBits = FdBits::new();

pub(super) fn relayed_write() -> RwLockWriteGuard<'static, RelayedMap> {
    RELAYED.write().unwrap_or_else(|p| p.into_inner())
}

/// The relayed connection behind `fd`, if any.
pub(crate) fn relayed(fd: RawFd) -> Option<Arc<Relayed>> {
    if RELAYED_COUNT.load(Ordering::Acquire) == 0 || !RELAYED_BITS.maybe(fd) {
        return None;
    }
    RELAYED
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(&fd)
        .cloned()
}

pub(super) fn insert_locked(m: &mut RelayedMap, fd: RawFd, r: Arc<Relayed>) {
    RELAYED_BITS.set(fd);
    if m.insert(fd, r).is_none() {
        RELAYED_COUNT.fetch_add(1, Ordering::Release);
    }
}

/// `fd` was closed (or reused): forget it.
pub(crate) fn forget(fd: RawFd) {
    if RELAYED_COUNT.load(Ordering::Acquire) == 0 || !RELAYED_BITS.maybe(fd) {
        return;
    }
    let mut m = relayed_write();
    if m.remove(&fd).is_some() {
        RELAYED_COUNT.fetch_sub(1, Ordering::Release);
    }
    RELAYED_BITS.clear(fd);
}

/// `new` was made a duplicate of `old` (`dup*`, `F_DUPFD*`).
pub(crate) fn after_dup(old: RawFd, new: RawFd) {
    if RELAYED_COUNT.load(Ordering::Acquire) == 0 || old == new {
        return;
    }
    let mut m = relayed_write();
    if m.remove(&new).is_some() {
        RELAYED_COUNT.fetch_sub(1, Ordering::Release);
    }
    RELAYED_BITS.clear(new);
    if let Some(r) = m.get(&old).cloned() {
        insert_locked(&mut m, new, r);
    }
}
