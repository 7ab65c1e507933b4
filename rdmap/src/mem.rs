//! Memory object model: protection domains, memory regions with access flags and
//! STags, invalidation, and the STag table the receiver consults for lookup, bounds,
//! access and PD (stream) association before placing payload.
//!
//! STags follow the verbs convention (docs/ddp-rdmap.md §3.6): upper 24 bits index, low
//! 8 bits key; the full 32-bit value must match. STag 0 is never handed out (index 0 is
//! reserved). Tagged offsets are virtual addresses: a region registered at `base` covers
//! TOs `[base, base + len)`.
//!
//! Region bytes live behind [`RegionMemory`], so tests use `Vec<u8>` and the engine can
//! back regions with registered application memory (with its unsafe code elsewhere).

/// Bytes behind a memory region.
pub trait RegionMemory {
    /// Region length in bytes.
    fn len(&self) -> usize;
    /// Whether the region has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copy `data` to `offset`. Callers (this crate) guarantee `offset + data.len() <= len()`.
    fn write_at(&mut self, offset: usize, data: &[u8]);
    /// Borrow `len` bytes at `offset`. Callers guarantee the range is in bounds.
    fn read_at(&self, offset: usize, len: usize) -> &[u8];
}

impl RegionMemory for Vec<u8> {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn write_at(&mut self, offset: usize, data: &[u8]) {
        self[offset..offset + data.len()].copy_from_slice(data);
    }
    fn read_at(&self, offset: usize, len: usize) -> &[u8] {
        &self[offset..offset + len]
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
    /// No such STag, wrong key, STag 0, or invalidated.
    InvalidStag,
    /// Region belongs to another PD (not associated with this stream).
    NotAssociated,
    /// The region lacks the required access right.
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
}

struct Slot {
    key: u8,
    mr: Option<MemoryRegion>,
}

const MAX_INDEX: u32 = (1 << 24) - 1;

/// The STag table: all regions of all PDs of one engine/device.
#[derive(Default)]
pub struct StagTable {
    slots: Vec<Slot>,
    free: Vec<u32>,
    next_pd: u32,
}

impl StagTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Allocate a protection domain.
    pub fn alloc_pd(&mut self) -> PdId {
        self.next_pd += 1;
        PdId(self.next_pd)
    }

    /// Register `mem` as a region of `pd` at tagged offset `base` with `access`.
    /// Returns its STag (never 0); STag keys change when a slot is reused.
    pub fn register(
        &mut self,
        pd: PdId,
        access: Access,
        base: u64,
        mem: Box<dyn RegionMemory>,
    ) -> Result<Stag, MemError> {
        if base.checked_add(mem.len() as u64).is_none() {
            return Err(MemError::ToWrap);
        }
        let mr = MemoryRegion {
            pd,
            access,
            base,
            valid: true,
            mem,
        };
        if self.slots.is_empty() {
            // Index 0 is reserved so that STag 0 is never handed out.
            self.slots.push(Slot { key: 0, mr: None });
        }
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = self.slots.len() as u32;
                if i > MAX_INDEX {
                    return Err(MemError::Exhausted);
                }
                self.slots.push(Slot { key: 0, mr: None });
                i
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.key = slot.key.wrapping_add(1);
        slot.mr = Some(mr);
        Ok(Stag((index << 8) | slot.key as u32))
    }

    /// Deregister a region and hand its memory back.
    pub fn deregister(&mut self, stag: Stag) -> Result<Box<dyn RegionMemory>, MemError> {
        let index = stag.index();
        self.get(stag)?;
        let mr = self.slots[index as usize]
            .mr
            .take()
            .ok_or(MemError::InvalidStag)?;
        self.free.push(index);
        Ok(mr.mem)
    }

    fn get(&self, stag: Stag) -> Result<&MemoryRegion, MemError> {
        let slot = self
            .slots
            .get(stag.index() as usize)
            .ok_or(MemError::InvalidStag)?;
        match &slot.mr {
            Some(mr) if slot.key == stag.key() && stag.0 != 0 => Ok(mr),
            _ => Err(MemError::InvalidStag),
        }
    }

    fn get_mut(&mut self, stag: Stag) -> Result<&mut MemoryRegion, MemError> {
        let slot = self
            .slots
            .get_mut(stag.index() as usize)
            .ok_or(MemError::InvalidStag)?;
        match &mut slot.mr {
            Some(mr) if slot.key == stag.key() && stag.0 != 0 => Ok(mr),
            _ => Err(MemError::InvalidStag),
        }
    }

    /// The region behind `stag` (valid or not).
    pub fn region(&self, stag: Stag) -> Option<&MemoryRegion> {
        self.get(stag).ok()
    }

    /// Invalidate `stag` for use by `pd` (Local Invalidate, or the invalidation a Send with
    /// Invalidate requests). Fails for unknown STags, another PD, or an already invalid one.
    pub fn invalidate(&mut self, stag: Stag, pd: PdId) -> Result<(), MemError> {
        let mr = self.get_mut(stag)?;
        if mr.pd != pd {
            return Err(MemError::NotAssociated);
        }
        if !mr.valid {
            return Err(MemError::InvalidStag);
        }
        mr.valid = false;
        Ok(())
    }

    /// Make an invalidated STag usable again (the fast-register step of verbs).
    pub fn revalidate(&mut self, stag: Stag) -> Result<(), MemError> {
        self.get_mut(stag)?.valid = true;
        Ok(())
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
        let mr = self.get(stag)?;
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

    /// Copy `data` into the region at byte `offset` (after a successful [`check`](Self::check)).
    pub fn write(&mut self, stag: Stag, offset: usize, data: &[u8]) -> Result<(), MemError> {
        let mr = self.get_mut(stag)?;
        if offset
            .checked_add(data.len())
            .is_none_or(|e| e > mr.mem.len())
        {
            return Err(MemError::Bounds);
        }
        mr.mem.write_at(offset, data);
        Ok(())
    }

    /// Borrow `len` bytes of the region at byte `offset`.
    pub fn read(&self, stag: Stag, offset: usize, len: usize) -> Result<&[u8], MemError> {
        let mr = self.get(stag)?;
        if offset.checked_add(len).is_none_or(|e| e > mr.mem.len()) {
            return Err(MemError::Bounds);
        }
        Ok(mr.mem.read_at(offset, len))
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
        assert_eq!(a.index(), 1);
        assert_eq!(
            t.check(Stag(0), pd, 0, 0, Access::NONE),
            Err(MemError::InvalidStag)
        );
        t.deregister(a).unwrap();
        let b = t
            .register(pd, Access::REMOTE_WRITE, 0x1000, Box::new(vec![0u8; 16]))
            .unwrap();
        assert_eq!(b.index(), a.index());
        assert_ne!(b, a, "reused slot gets a new key");
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
}
