//! Memory object model: protection domains, memory regions with access flags and
//! STags, invalidation, and the STag table the receiver consults for lookup, bounds,
//! access and PD (stream) association before placing payload.
//!
//! STags follow the verbs convention (docs/ddp-rdmap.md §3.6): upper 24 bits index, low
//! 8 bits key; the full 32-bit value must match. STag 0 is never handed out (index 0 is
//! reserved). Tagged offsets are virtual addresses: a region registered at `base` covers
//! TOs `[base, base + len)`.
//!
//! Hostile peers (issue 14):
//! * **STags are hard to guess.** Every registration draws a random free index and a
//!   random key from a ChaCha12 generator (`rand::rngs::StdRng`) seeded once per table
//!   from the operating system (`getrandom`, through `rand::rngs::SysRng`); a peer that
//!   saw some STags learns nothing about the next ones. [`StagTable::with_seed`] gives a
//!   reproducible table for tests and fuzzing.
//! * **Placement is pinned to one registration.** Every registration, invalidation and
//!   revalidation gets a fresh 64-bit epoch that never repeats in the table's lifetime.
//!   A check that admits a message returns a [`RegionPin`] (STag + epoch), and every later
//!   chunk of that message goes through [`StagTable::write_pinned`] /
//!   [`StagTable::read_pinned`], which repeat the validity, PD, access and bounds checks
//!   and refuse the chunk if the epoch changed: a region invalidated, deregistered or
//!   re-registered mid-message (even under the same STag value) gets nothing more.
//! * **Remote invalidation is narrow** ([`StagTable::invalidate_remote`], RFC 5040 §5.3,
//!   §6.10): only a valid STag of the stream's PD that carries a remote right (Remote Read
//!   or Remote Write) and was not registered as internal. Local-only keys and the
//!   engine's own buffers (per-QP inline buffers and Read-RTR sinks are registered Local
//!   Write only; [`StagTable::register_internal`] marks any other) cannot be revoked by a
//!   peer. Regions the application registered for remote access in the same PD are fair
//!   game from any QP of that PD, as the RFC's stream/PD association allows.
//!
//! Region bytes live behind [`RegionMemory`], so tests use `Vec<u8>` and the engine can
//! back regions with registered application memory (with its unsafe code elsewhere).
//! Region bytes are only ever copied out ([`RegionMemory::read_into`], [`RegionBytes`]),
//! never borrowed: the application may be writing them.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use rand::rngs::{StdRng, SysRng};
use rand::{Rng, SeedableRng};

/// Bytes behind a memory region. `Send`, so a table of regions can move to the engine
/// thread.
pub trait RegionMemory: Send {
    /// Region length in bytes.
    fn len(&self) -> usize;
    /// Whether the region has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copy `data` to `offset`. Callers (this crate) guarantee `offset + data.len() <= len()`.
    fn write_at(&mut self, offset: usize, data: &[u8]);
    /// Copy `dst.len()` bytes at `offset` into `dst`. Callers (this crate) guarantee
    /// `offset + dst.len() <= len()`. A copy, never a borrow: region bytes may be memory
    /// the application writes concurrently, over which no `&[u8]` may be formed.
    fn read_into(&self, offset: usize, dst: &mut [u8]);
}

impl RegionMemory for Vec<u8> {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn write_at(&mut self, offset: usize, data: &[u8]) {
        self[offset..offset + data.len()].copy_from_slice(data);
    }
    fn read_into(&self, offset: usize, dst: &mut [u8]) {
        dst.copy_from_slice(&self[offset..offset + dst.len()]);
    }
}

impl dyn RegionMemory + '_ {
    /// A copy of `len` bytes at `offset` (tests, diagnostics; the transmit path copies
    /// straight into the FPDU through [`RegionBytes`]). Panics if out of bounds.
    pub fn read_at(&self, offset: usize, len: usize) -> Vec<u8> {
        assert!(
            offset.checked_add(len).is_some_and(|e| e <= self.len()),
            "read outside a region: {offset}+{len}"
        );
        let mut v = vec![0; len];
        self.read_into(offset, &mut v);
        v
    }
}

/// An in-bounds byte range of one region, checked by the [`StagTable`]: the transmit
/// path copies from it straight into its output ([`RegionBytes::copy_to`]) instead of
/// borrowing the bytes.
#[derive(Clone, Copy)]
pub struct RegionBytes<'a> {
    mem: &'a dyn RegionMemory,
    offset: usize,
    len: usize,
}

/// Backing of [`RegionBytes::EMPTY`].
static NO_BYTES: Vec<u8> = Vec::new();

impl<'a> RegionBytes<'a> {
    /// No bytes.
    pub const EMPTY: RegionBytes<'static> = RegionBytes {
        mem: &NO_BYTES,
        offset: 0,
        len: 0,
    };

    /// Number of bytes in the range.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copy `dst.len()` bytes starting `from` bytes into the range into `dst`. Panics if
    /// `from + dst.len()` exceeds [`len`](Self::len).
    pub fn copy_to(&self, from: usize, dst: &mut [u8]) {
        assert!(
            from.checked_add(dst.len()).is_some_and(|e| e <= self.len),
            "copy outside the checked range"
        );
        self.mem.read_into(self.offset + from, dst);
    }

    /// A copy of the whole range.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        self.copy_to(0, &mut v);
        v
    }
}

impl core::fmt::Debug for RegionBytes<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RegionBytes")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

/// A steering tag: 24-bit index and 8-bit key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stag(pub u32);

impl Stag {
    /// Index part (upper 24 bits).
    pub fn index(self) -> u32 {
        self.0 >> 8
    }
    /// Key part (low 8 bits).
    pub fn key(self) -> u8 {
        self.0 as u8
    }
}

/// A protection domain handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PdId(pub u32);

/// Memory access rights of a region (bit set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(pub u8);

impl Access {
    /// No rights beyond local read.
    pub const NONE: Access = Access(0);
    /// Local write (receive buffers, Read sinks).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Remote read (source of inbound RDMA Reads).
    pub const REMOTE_READ: Access = Access(2);
    /// Remote write (sink of inbound RDMA Writes).
    pub const REMOTE_WRITE: Access = Access(4);

    /// Whether every right in `other` is present.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any remote right (Remote Read or Remote Write) is present.
    pub fn is_remote(self) -> bool {
        self.0 & (Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0) != 0
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// Why an STag check failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemError {
    /// No such STag, wrong key, STag 0, invalidated, or (for a [`RegionPin`]) no longer
    /// the registration the pin was taken on.
    InvalidStag,
    /// Region belongs to another PD (not associated with this stream).
    NotAssociated,
    /// The region lacks the required access right; for [`StagTable::invalidate_remote`],
    /// the STag may not be invalidated by a peer (local-only or internal).
    Access,
    /// `[to, to+len)` is not inside the region.
    Bounds,
    /// `to + len` overflows 64 bits.
    ToWrap,
    /// The STag index space (2^24 − 1 regions) is exhausted.
    Exhausted,
}

/// A registered memory region.
pub struct MemoryRegion {
    /// Owning protection domain.
    pub pd: PdId,
    /// Access rights.
    pub access: Access,
    /// Tagged offset (virtual address) of byte 0.
    pub base: u64,
    /// False after (local or remote) invalidation until [`StagTable::revalidate`].
    pub valid: bool,
    /// Registered by the engine for its own use: never remotely invalidated.
    internal: bool,
    mem: Box<dyn RegionMemory>,
}

impl MemoryRegion {
    /// Region length.
    pub fn len(&self) -> usize {
        self.mem.len()
    }
    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.mem.len() == 0
    }
    /// The backing memory.
    pub fn memory(&self) -> &dyn RegionMemory {
        &*self.mem
    }
    /// Whether the region was registered with [`StagTable::register_internal`].
    pub fn is_internal(&self) -> bool {
        self.internal
    }
}

/// One registration as it was when a message was admitted: the STag and the epoch of
/// the registration state the check passed against. Later chunks of the message use it
/// with [`StagTable::write_pinned`] / [`StagTable::read_pinned`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionPin {
    stag: Stag,
    epoch: u64,
}

impl RegionPin {
    /// The pinned STag.
    pub fn stag(self) -> Stag {
        self.stag
    }
}

struct Slot {
    key: u8,
    /// Changes on every registration, invalidation and revalidation; never repeats.
    epoch: u64,
    mr: MemoryRegion,
}

/// Highest STag index (24 bits; index 0 is never used): a [`StagTable`] holds at most this
/// many regions, then registration fails with [`MemError::Exhausted`].
pub const MAX_INDEX: u32 = (1 << 24) - 1;

/// Random index draws before a linear probe for a free index (only a nearly full table
/// ever gets there).
const INDEX_DRAWS: usize = 32;

/// Hashes the table's keys, STag indices, with one multiply (Fibonacci hashing). The
/// indices are drawn by the table itself (random, or counting up for a
/// [`sequential`](StagTable::sequential) table), never chosen by a peer: a peer only
/// looks keys up, which cannot lengthen any probe sequence, so SipHash's flooding
/// resistance buys nothing here, while the lookup is on every segment's path (placement
/// and transmit each check the STag; SipHash was ~10% of the instructions per FPDU).
#[derive(Debug, Default, Clone, Copy)]
struct IndexHasher(u64);

impl Hasher for IndexHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u32(u32::from(b));
        }
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.0 = (self.0.rotate_left(32) ^ u64::from(i)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The STag table: all regions of all PDs of one engine/device.
pub struct StagTable {
    slots: HashMap<u32, Slot, BuildHasherDefault<IndexHasher>>,
    rng: StdRng,
    /// `Some(next index)` for a [`sequential`](Self::sequential) table.
    sequential: Option<u32>,
    next_epoch: u64,
    next_pd: u32,
}

impl Default for StagTable {
    fn default() -> Self {
        Self::new()
    }
}

impl StagTable {
    /// An empty table whose STags are drawn from a generator seeded by the operating
    /// system (falling back to std's randomly keyed hasher if that fails).
    pub fn new() -> Self {
        let rng = StdRng::try_from_rng(&mut SysRng).unwrap_or_else(|_| {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(0x7877_6172_705f_7374);
            StdRng::seed_from_u64(h.finish())
        });
        Self::with_rng(rng)
    }

    /// An empty table whose STag sequence is fixed by `seed` (tests, fuzzing, replay).
    /// Still random-looking; never use a known seed against real peers.
    pub fn with_seed(seed: u64) -> Self {
        Self::with_rng(StdRng::seed_from_u64(seed))
    }

    /// An empty table handing out predictable STags: indices count up from 1 (never
    /// reused until the index space wraps), key 1. Only for byte-exact tests and fuzz
    /// targets that hard-code STags; the engine never uses it, as a peer could guess
    /// every STag. Placement is still pinned per registration (epochs).
    pub fn sequential() -> Self {
        let mut t = Self::with_rng(StdRng::seed_from_u64(0));
        t.sequential = Some(1);
        t
    }

    fn with_rng(rng: StdRng) -> Self {
        StagTable {
            slots: HashMap::default(),
            rng,
            sequential: None,
            next_epoch: 1,
            next_pd: 0,
        }
    }

    /// Allocate a protection domain.
    pub fn alloc_pd(&mut self) -> PdId {
        self.next_pd += 1;
        PdId(self.next_pd)
    }

    /// Number of registered regions.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no region is registered.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Every registered region with its STag (no particular order).
    pub fn iter(&self) -> impl Iterator<Item = (Stag, &MemoryRegion)> + '_ {
        self.slots
            .iter()
            .map(|(&i, s)| (Stag((i << 8) | u32::from(s.key)), &s.mr))
    }

    fn epoch(&mut self) -> u64 {
        let e = self.next_epoch;
        self.next_epoch += 1;
        e
    }

    /// Register `mem` as a region of `pd` at tagged offset `base` with `access`.
    /// Returns its STag (never 0): a random free index and a random key.
    pub fn register(
        &mut self,
        pd: PdId,
        access: Access,
        base: u64,
        mem: Box<dyn RegionMemory>,
    ) -> Result<Stag, MemError> {
        self.register_as(pd, access, base, mem, false)
    }

    /// Like [`register`](Self::register), for a buffer the engine uses itself (an inline
    /// buffer, a Read-RTR sink): a peer can never invalidate it.
    pub fn register_internal(
        &mut self,
        pd: PdId,
        access: Access,
        base: u64,
        mem: Box<dyn RegionMemory>,
    ) -> Result<Stag, MemError> {
        self.register_as(pd, access, base, mem, true)
    }

    fn register_as(
        &mut self,
        pd: PdId,
        access: Access,
        base: u64,
        mem: Box<dyn RegionMemory>,
        internal: bool,
    ) -> Result<Stag, MemError> {
        if base.checked_add(mem.len() as u64).is_none() {
            return Err(MemError::ToWrap);
        }
        if self.slots.len() >= MAX_INDEX as usize {
            return Err(MemError::Exhausted);
        }
        let (index, key) = match self.sequential {
            Some(mut i) => {
                while self.slots.contains_key(&i) {
                    i = if i == MAX_INDEX { 1 } else { i + 1 };
                }
                self.sequential = Some(if i == MAX_INDEX { 1 } else { i + 1 });
                (i, 1)
            }
            None => (self.free_index(), self.rng.next_u32() as u8),
        };
        let epoch = self.epoch();
        let mr = MemoryRegion {
            pd,
            access,
            base,
            valid: true,
            internal,
            mem,
        };
        self.slots.insert(index, Slot { key, epoch, mr });
        Ok(Stag((index << 8) | u32::from(key)))
    }

    /// A random free index in `1..=MAX_INDEX` (the table is not full).
    fn free_index(&mut self) -> u32 {
        let mut i = 1;
        for _ in 0..INDEX_DRAWS {
            i = 1 + self.rng.next_u32() % MAX_INDEX;
            if !self.slots.contains_key(&i) {
                return i;
            }
        }
        // Nearly full: probe on from the last draw (a free index exists).
        loop {
            i = if i == MAX_INDEX { 1 } else { i + 1 };
            if !self.slots.contains_key(&i) {
                return i;
            }
        }
    }

    /// Deregister a region and hand its memory back. Pins taken on it stop working.
    pub fn deregister(&mut self, stag: Stag) -> Result<Box<dyn RegionMemory>, MemError> {
        self.get(stag)?;
        let slot = self
            .slots
            .remove(&stag.index())
            .ok_or(MemError::InvalidStag)?;
        Ok(slot.mr.mem)
    }

    fn slot(&self, stag: Stag) -> Result<&Slot, MemError> {
        match self.slots.get(&stag.index()) {
            Some(s) if s.key == stag.key() && stag.0 != 0 => Ok(s),
            _ => Err(MemError::InvalidStag),
        }
    }

    fn slot_mut(&mut self, stag: Stag) -> Result<&mut Slot, MemError> {
        match self.slots.get_mut(&stag.index()) {
            Some(s) if s.key == stag.key() && stag.0 != 0 => Ok(s),
            _ => Err(MemError::InvalidStag),
        }
    }

    fn get(&self, stag: Stag) -> Result<&MemoryRegion, MemError> {
        self.slot(stag).map(|s| &s.mr)
    }

    /// The region behind `stag` (valid or not).
    pub fn region(&self, stag: Stag) -> Option<&MemoryRegion> {
        self.get(stag).ok()
    }

    /// Invalidate `stag` for use by `pd` (Local Invalidate). Fails for unknown STags,
    /// another PD, or an already invalid one. Pins taken on it stop working.
    pub fn invalidate(&mut self, stag: Stag, pd: PdId) -> Result<(), MemError> {
        let epoch = self.next_epoch;
        let slot = self.slot_mut(stag)?;
        if slot.mr.pd != pd {
            return Err(MemError::NotAssociated);
        }
        if !slot.mr.valid {
            return Err(MemError::InvalidStag);
        }
        slot.mr.valid = false;
        slot.epoch = epoch;
        self.next_epoch += 1;
        Ok(())
    }

    /// The invalidation a peer's Send with Invalidate requests on a stream of `pd`
    /// (RFC 5040 §5.3, §6.10): besides [`invalidate`](Self::invalidate)'s checks, the
    /// region must carry a remote right and not be internal, else [`MemError::Access`].
    pub fn invalidate_remote(&mut self, stag: Stag, pd: PdId) -> Result<(), MemError> {
        let mr = self.get(stag)?;
        if mr.pd != pd {
            return Err(MemError::NotAssociated);
        }
        if mr.internal || !mr.access.is_remote() {
            return Err(MemError::Access);
        }
        self.invalidate(stag, pd)
    }

    /// Make an invalidated STag usable again (the fast-register step of verbs). Pins
    /// taken before never work again.
    pub fn revalidate(&mut self, stag: Stag) -> Result<(), MemError> {
        let epoch = self.next_epoch;
        let slot = self.slot_mut(stag)?;
        slot.mr.valid = true;
        slot.epoch = epoch;
        self.next_epoch += 1;
        Ok(())
    }

    fn check_region(
        mr: &MemoryRegion,
        pd: PdId,
        to: u64,
        len: u64,
        access: Access,
    ) -> Result<usize, MemError> {
        if !mr.valid {
            return Err(MemError::InvalidStag);
        }
        let end = to.checked_add(len).ok_or(MemError::ToWrap)?;
        if mr.pd != pd {
            return Err(MemError::NotAssociated);
        }
        if !mr.access.contains(access) {
            return Err(MemError::Access);
        }
        if to < mr.base || end > mr.base + mr.mem.len() as u64 {
            return Err(MemError::Bounds);
        }
        Ok((to - mr.base) as usize)
    }

    /// Check that `pd` may access `[to, to+len)` through `stag` with `access`; returns
    /// the byte offset of `to` inside the region. Checks in order: STag valid, TO wrap,
    /// PD association, access rights, bounds.
    pub fn check(
        &self,
        stag: Stag,
        pd: PdId,
        to: u64,
        len: u64,
        access: Access,
    ) -> Result<usize, MemError> {
        Self::check_region(self.get(stag)?, pd, to, len, access)
    }

    /// [`check`](Self::check), and pin the registration the check passed against.
    pub fn check_pin(
        &self,
        stag: Stag,
        pd: PdId,
        to: u64,
        len: u64,
        access: Access,
    ) -> Result<(RegionPin, usize), MemError> {
        let slot = self.slot(stag)?;
        let off = Self::check_region(&slot.mr, pd, to, len, access)?;
        Ok((
            RegionPin {
                stag,
                epoch: slot.epoch,
            },
            off,
        ))
    }

    /// [`check`](Self::check) against the pinned registration: [`MemError::InvalidStag`]
    /// if it was invalidated, revalidated, deregistered or replaced since the pin.
    pub fn check_pinned(
        &self,
        pin: RegionPin,
        pd: PdId,
        to: u64,
        len: u64,
        access: Access,
    ) -> Result<usize, MemError> {
        let slot = self.slot(pin.stag)?;
        if slot.epoch != pin.epoch {
            return Err(MemError::InvalidStag);
        }
        Self::check_region(&slot.mr, pd, to, len, access)
    }

    /// Copy `data` to tagged offset `to` of the pinned registration, after repeating
    /// every check ([`check_pinned`](Self::check_pinned)); nothing is written on error.
    pub fn write_pinned(
        &mut self,
        pin: RegionPin,
        pd: PdId,
        access: Access,
        to: u64,
        data: &[u8],
    ) -> Result<(), MemError> {
        let off = self.check_pinned(pin, pd, to, data.len() as u64, access)?;
        self.write(pin.stag, off, data)
    }

    /// The `len` bytes at tagged offset `to` of the pinned registration, after repeating
    /// every check ([`check_pinned`](Self::check_pinned)), to copy from.
    pub fn bytes_pinned(
        &self,
        pin: RegionPin,
        pd: PdId,
        access: Access,
        to: u64,
        len: usize,
    ) -> Result<RegionBytes<'_>, MemError> {
        let off = self.check_pinned(pin, pd, to, len as u64, access)?;
        self.bytes(pin.stag, off, len)
    }

    /// A copy of what [`bytes_pinned`](Self::bytes_pinned) designates.
    pub fn read_pinned(
        &self,
        pin: RegionPin,
        pd: PdId,
        access: Access,
        to: u64,
        len: usize,
    ) -> Result<Vec<u8>, MemError> {
        self.bytes_pinned(pin, pd, access, to, len)
            .map(|b| b.to_vec())
    }

    /// Copy `data` into the region at byte `offset` (after a successful [`check`](Self::check)).
    /// Checks key and bounds only: message placement uses [`write_pinned`](Self::write_pinned).
    pub fn write(&mut self, stag: Stag, offset: usize, data: &[u8]) -> Result<(), MemError> {
        let mr = &mut self.slot_mut(stag)?.mr;
        if offset
            .checked_add(data.len())
            .is_none_or(|e| e > mr.mem.len())
        {
            return Err(MemError::Bounds);
        }
        mr.mem.write_at(offset, data);
        Ok(())
    }

    /// The `len` bytes of the region at byte `offset`, to copy from (checks key and
    /// bounds only, like [`write`](Self::write)).
    pub fn bytes(
        &self,
        stag: Stag,
        offset: usize,
        len: usize,
    ) -> Result<RegionBytes<'_>, MemError> {
        let mr = self.get(stag)?;
        if offset.checked_add(len).is_none_or(|e| e > mr.mem.len()) {
            return Err(MemError::Bounds);
        }
        Ok(RegionBytes {
            mem: &*mr.mem,
            offset,
            len,
        })
    }

    /// Copy `dst.len()` bytes of the region at byte `offset` into `dst` (checks key and
    /// bounds only); nothing is copied on error.
    pub fn read_into(&self, stag: Stag, offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        self.bytes(stag, offset, dst.len())?.copy_to(0, dst);
        Ok(())
    }

    /// A copy of `len` bytes of the region at byte `offset` (tests, diagnostics).
    pub fn read(&self, stag: Stag, offset: usize, len: usize) -> Result<Vec<u8>, MemError> {
        self.bytes(stag, offset, len).map(|b| b.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stag_zero_never_handed_out_and_keys_rotate() {
        let mut t = StagTable::new();
        let pd = t.alloc_pd();
        let a = t
            .register(pd, Access::REMOTE_WRITE, 0x1000, Box::new(vec![0u8; 16]))
            .unwrap();
        assert_ne!(a.0, 0);
        assert_ne!(a.index(), 0);
        assert_eq!(
            t.check(Stag(0), pd, 0, 0, Access::NONE),
            Err(MemError::InvalidStag)
        );
        t.deregister(a).unwrap();
        let b = t
            .register(pd, Access::REMOTE_WRITE, 0x1000, Box::new(vec![0u8; 16]))
            .unwrap();
        assert_ne!(b, a, "a new registration never gets the old STag back");
        assert_eq!(
            t.check(a, pd, 0x1000, 1, Access::NONE),
            Err(MemError::InvalidStag)
        );
        assert_eq!(t.check(b, pd, 0x1000, 1, Access::NONE), Ok(0));
    }

    #[test]
    fn check_order_bounds_access_pd_wrap() {
        let mut t = StagTable::new();
        let pd = t.alloc_pd();
        let other = t.alloc_pd();
        let s = t
            .register(pd, Access::REMOTE_READ, 0x1000, Box::new(vec![7u8; 16]))
            .unwrap();
        assert_eq!(t.check(s, pd, 0x1004, 12, Access::REMOTE_READ), Ok(4));
        assert_eq!(
            t.check(s, pd, 0x1004, 13, Access::REMOTE_READ),
            Err(MemError::Bounds)
        );
        assert_eq!(
            t.check(s, pd, 0xfff, 1, Access::REMOTE_READ),
            Err(MemError::Bounds)
        );
        assert_eq!(
            t.check(s, pd, 0x1000, 1, Access::REMOTE_WRITE),
            Err(MemError::Access)
        );
        assert_eq!(
            t.check(s, other, 0x1000, 1, Access::REMOTE_READ),
            Err(MemError::NotAssociated)
        );
        assert_eq!(
            t.check(s, pd, u64::MAX, 2, Access::REMOTE_READ),
            Err(MemError::ToWrap)
        );
        assert_eq!(t.read(s, 14, 2).unwrap(), &[7, 7]);
        assert_eq!(t.read(s, 15, 2), Err(MemError::Bounds));
        assert_eq!(t.write(s, 16, &[1]), Err(MemError::Bounds));
    }

    #[test]
    fn invalidate_and_revalidate() {
        let mut t = StagTable::new();
        let pd = t.alloc_pd();
        let other = t.alloc_pd();
        let s = t
            .register(pd, Access::REMOTE_WRITE, 0, Box::new(vec![0u8; 4]))
            .unwrap();
        assert_eq!(t.invalidate(s, other), Err(MemError::NotAssociated));
        t.invalidate(s, pd).unwrap();
        assert_eq!(t.invalidate(s, pd), Err(MemError::InvalidStag));
        assert_eq!(
            t.check(s, pd, 0, 1, Access::REMOTE_WRITE),
            Err(MemError::InvalidStag)
        );
        t.revalidate(s).unwrap();
        assert_eq!(t.check(s, pd, 0, 1, Access::REMOTE_WRITE), Ok(0));
    }

    fn reg(t: &mut StagTable, pd: PdId, access: Access) -> Stag {
        t.register(pd, access, 0x1000, Box::new(vec![0u8; 16]))
            .unwrap()
    }

    /// Longest run of consecutive STags (in registration order) whose values differ by
    /// one constant step.
    fn longest_arithmetic_run(v: &[u32]) -> usize {
        let (mut best, mut run) = (1, 1);
        for w in v.windows(3) {
            if w[1].wrapping_sub(w[0]) == w[2].wrapping_sub(w[1]) {
                run += 1;
                best = best.max(run + 1);
            } else {
                run = 1;
            }
        }
        best
    }

    fn assert_no_pattern(v: &[u32]) {
        let n = v.len();
        let distinct: std::collections::HashSet<_> = v.iter().collect();
        assert_eq!(distinct.len(), n, "an STag value repeated");
        assert!(
            longest_arithmetic_run(v) < 4,
            "STags follow a constant step"
        );
        // Indices spread over the 24-bit space; keys over all 256 values.
        let high = v.iter().filter(|s| (*s >> 8) > (1 << 23)).count();
        assert!(
            high > n / 4 && high < 3 * n / 4,
            "indices not spread: {high}/{n}"
        );
        let keys: std::collections::HashSet<_> = v.iter().map(|s| s & 0xff).collect();
        assert!(keys.len() > 200, "keys not spread: {}", keys.len());
        let sorted = {
            let mut s = v.to_vec();
            s.sort_unstable();
            s
        };
        assert_ne!(sorted, v, "STags count up");
    }

    #[test]
    fn hostile_stag_guessing_1000_registrations_show_no_pattern() {
        // Live registrations (OS-seeded table).
        let mut t = StagTable::new();
        let pd = t.alloc_pd();
        let v: Vec<u32> = (0..1000).map(|_| reg(&mut t, pd, Access::NONE).0).collect();
        assert_no_pattern(&v);
        assert_eq!(t.len(), 1000);
        // Register/deregister cycles: a LIFO free list would hand one index back each time.
        let mut t = StagTable::with_seed(0x5eed);
        let pd = t.alloc_pd();
        let v: Vec<u32> = (0..1000)
            .map(|_| {
                let s = reg(&mut t, pd, Access::REMOTE_WRITE);
                t.deregister(s).unwrap();
                s.0
            })
            .collect();
        assert_no_pattern(&v);
        // Two OS-seeded tables do not hand out the same sequence.
        let first = |mut t: StagTable| {
            let pd = t.alloc_pd();
            (0..8)
                .map(|_| reg(&mut t, pd, Access::NONE))
                .collect::<Vec<_>>()
        };
        assert_ne!(first(StagTable::new()), first(StagTable::new()));
        // A seeded table is reproducible.
        assert_eq!(
            first(StagTable::with_seed(7)),
            first(StagTable::with_seed(7))
        );
    }

    #[test]
    fn hostile_pin_dies_with_its_registration() {
        let mut t = StagTable::new();
        let pd = t.alloc_pd();
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let s = reg(&mut t, pd, all);
        let (pin, off) = t.check_pin(s, pd, 0x1004, 4, Access::REMOTE_WRITE).unwrap();
        assert_eq!(off, 4);
        t.write_pinned(pin, pd, Access::REMOTE_WRITE, 0x1004, &[1, 2])
            .unwrap();
        // Every check repeated: bounds, access, PD.
        let other = t.alloc_pd();
        let w =
            |t: &mut StagTable, pd, acc, to, n| t.write_pinned(pin, pd, acc, to, &[9u8; 16][..n]);
        assert_eq!(
            w(&mut t, pd, Access::REMOTE_WRITE, 0x100f, 2),
            Err(MemError::Bounds)
        );
        assert_eq!(
            w(&mut t, other, Access::REMOTE_WRITE, 0x1000, 1),
            Err(MemError::NotAssociated)
        );
        // Invalidate, then revalidate: the pin stays dead.
        t.invalidate(s, pd).unwrap();
        assert_eq!(
            w(&mut t, pd, Access::REMOTE_WRITE, 0x1000, 1),
            Err(MemError::InvalidStag)
        );
        t.revalidate(s).unwrap();
        assert_eq!(
            w(&mut t, pd, Access::REMOTE_WRITE, 0x1000, 1),
            Err(MemError::InvalidStag)
        );
        assert!(t.check(s, pd, 0x1000, 1, Access::REMOTE_WRITE).is_ok());
        // Even if a new registration got the very same STag value, the old pin misses it.
        let (pin2, _) = t.check_pin(s, pd, 0x1000, 1, Access::NONE).unwrap();
        let key = s.key();
        t.deregister(s).unwrap();
        let epoch = t.epoch();
        t.slots.insert(
            s.index(),
            Slot {
                key,
                epoch,
                mr: MemoryRegion {
                    pd,
                    access: all,
                    base: 0x1000,
                    valid: true,
                    internal: false,
                    mem: Box::new(vec![0u8; 16]),
                },
            },
        );
        assert!(t.check(s, pd, 0x1000, 1, Access::REMOTE_WRITE).is_ok());
        assert_eq!(
            t.write_pinned(pin2, pd, Access::NONE, 0x1000, &[5]),
            Err(MemError::InvalidStag)
        );
        assert_eq!(
            t.read_pinned(pin2, pd, Access::NONE, 0x1000, 1),
            Err(MemError::InvalidStag)
        );
        assert_eq!(t.read(s, 0, 16).unwrap(), &[0u8; 16], "nothing landed");
    }

    #[test]
    fn rfc5040_remote_invalidate_needs_remote_access_and_not_internal() {
        let mut t = StagTable::new();
        let pd = t.alloc_pd();
        let other = t.alloc_pd();
        let local = reg(&mut t, pd, Access::LOCAL_WRITE);
        let none = reg(&mut t, pd, Access::NONE);
        let internal = t
            .register_internal(
                pd,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                0,
                Box::new(vec![0u8; 4]),
            )
            .unwrap();
        let remote = reg(&mut t, pd, Access::REMOTE_READ);
        let foreign = reg(&mut t, other, Access::REMOTE_WRITE);
        assert_eq!(t.invalidate_remote(local, pd), Err(MemError::Access));
        assert_eq!(t.invalidate_remote(none, pd), Err(MemError::Access));
        assert_eq!(t.invalidate_remote(internal, pd), Err(MemError::Access));
        assert!(t.region(internal).unwrap().is_internal());
        assert_eq!(
            t.invalidate_remote(foreign, pd),
            Err(MemError::NotAssociated)
        );
        assert_eq!(t.invalidate_remote(Stag(0), pd), Err(MemError::InvalidStag));
        t.invalidate_remote(remote, pd).unwrap();
        assert_eq!(t.invalidate_remote(remote, pd), Err(MemError::InvalidStag));
        // Refused ones stay valid; local invalidation of a local key still works.
        for s in [local, none, internal] {
            assert!(t.region(s).unwrap().valid);
        }
        t.invalidate(local, pd).unwrap();
    }

    #[test]
    fn sequential_table_counts_up_without_reuse() {
        let mut t = StagTable::sequential();
        let pd = t.alloc_pd();
        let a = reg(&mut t, pd, Access::NONE);
        assert_eq!(a, Stag(0x101));
        t.deregister(a).unwrap();
        assert_eq!(reg(&mut t, pd, Access::NONE), Stag(0x201));
    }
}
