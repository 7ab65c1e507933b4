//! Memory regions over application memory, registered in place (`ibv_reg_mr`).
//!
//! [`ProtectionDomain::register_raw`] registers memory the application owns and keeps
//! using — heap, stack, an `mmap`ed file or anonymous mapping — without copying or
//! taking ownership: the engine places inbound RDMA Writes, Read Responses and Sends
//! straight into it and serves the peer's RDMA Reads and the local Sends/Writes from it.
//! As with `ibv_reg_mr`, the region's tagged offset of byte 0 (its iova) is the
//! address itself: the peer addresses a Write at `addr + offset` with the rkey, which is
//! what siw does for user memory (RFC 5040 tagged offsets as virtual addresses,
//! docs/ddp-rdmap.md, docs/siw.md), so a C peer sees siw's semantics.
//!
//! # Deregistration waits for placement in flight
//!
//! [`MemoryRegion::dereg`] (and dropping the region) sends the deregistration to the
//! engine and blocks until the engine has dropped its reference to the memory. The
//! engine reaches region bytes only through that reference, on the engine thread, and
//! every chunk of a message is placed through a [`RegionPin`](xwarp_rdmap::RegionPin)
//! that dies with the registration: so once `dereg` returned, no byte of the region is
//! read or written again, even when a peer's Writes are streaming in (they get the
//! RFC 5040 invalid-STag Terminate), and the memory may be freed, unmapped or reused.
//! The wait is bounded ([`ENGINE_WAIT`](crate::pd::ENGINE_WAIT)): on timeout `dereg`
//! hands the region back inside a [`DeregError`](crate::pd::DeregError) (still
//! registered); a drop keeps waiting, with a log line per period, since returning would
//! let the application free memory the engine may write. When the engine stops, its
//! table goes with it and every wait ends at once.
//!
//! # What the application may do meanwhile
//!
//! The rules of [`crate::mem`] (those of C verbs): do not write a Send/Write source or
//! memory exposed for remote Read until the work completed (or access was revoked);
//! do not expect sink bytes before the completion. Breaking them gives unspecified
//! byte values, never an access outside the registered range. Rust code that keeps a
//! `&mut [u8]` over registered bytes while the engine may write them is a data race in
//! Rust's model; reach the bytes through raw pointers (or [`MemoryRegion::read`] /
//! [`MemoryRegion::write`]) while work is in flight, as a C program does.
//!
//! Safe forms: [`ProtectionDomain::register_static`] (a `&'static mut [u8]`, e.g. from
//! `Box::leak`) and [`ProtectionDomain::with_registered`] (a borrowed buffer, registered
//! for the duration of a closure and deregistered — with the wait — before it returns).

use std::io;
use std::ptr::NonNull;

use xwarp_rdmap::Access;

use crate::mem::RawBuf;
use crate::pd::{MemoryRegion, ProtectionDomain};

/// Why `[addr, addr+len)` cannot be registered; `None` if it can.
fn bad_range(addr: *mut u8, len: usize) -> Option<&'static str> {
    if addr.is_null() {
        Some("null address")
    } else if len == 0 {
        Some("zero length")
    } else if len > isize::MAX as usize {
        Some("length above isize::MAX")
    } else if (addr as usize).checked_add(len).is_none() {
        Some("address + length overflows")
    } else {
        None
    }
}

impl ProtectionDomain {
    /// Register `len` bytes of application memory at `addr` in place (`ibv_reg_mr`): the
    /// engine places into and sends from that memory directly; the region's
    /// [`addr`](MemoryRegion::addr) (its tagged offset of byte 0, the iova) is `addr`.
    /// See [`crate::foreign`].
    ///
    /// Errors (`InvalidInput`): a null `addr`, `len` 0 (as siw refuses it), `len` above
    /// `isize::MAX`, or `addr + len` overflowing the address space; `ConnectionAborted`
    /// if the engine stopped.
    ///
    /// # Safety
    /// `[addr, addr+len)` must be memory of this process valid for reads and writes
    /// (read-only mappings are not supported: nothing probes the protection, as the kernel
    /// does for `ibv_reg_mr`, so a placement into one would fault the process),
    /// within one allocation or mapping, from this call until the region's
    /// [`dereg`](MemoryRegion::dereg) returned `Ok` or its drop returned (both wait until
    /// the engine let go). It must not be freed, unmapped or made inaccessible before
    /// (e.g. a stack buffer must outlive the region). The engine writes it concurrently
    /// with the application as the rules of [`crate::foreign`] describe.
    pub unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> io::Result<MemoryRegion> {
        if let Some(why) = bad_range(addr, len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("register_raw({addr:p}, {len}): {why}"),
            ));
        }
        let Some(ptr) = NonNull::new(addr) else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "null address"));
        };
        // SAFETY: the range was checked above (non-null, `len <= isize::MAX`, no wrap); its
        // validity until deregistration completed is this function's own contract, and
        // `MemoryRegion::dereg`/drop wait for exactly that.
        let buf = unsafe { RawBuf::foreign(ptr, len) };
        self.register_buf(buf, access)
    }

    /// Register memory that lives for the rest of the program (a `static`, or a buffer
    /// from `Box::leak`) in place; safe, since nothing else can reach the slice any more.
    /// Errors as [`register_raw`](Self::register_raw) (an empty slice is refused).
    pub fn register_static(
        &self,
        buf: &'static mut [u8],
        access: Access,
    ) -> io::Result<MemoryRegion> {
        // SAFETY: `'static mut`: valid for ever and not reachable through anything else
        // after this call (the unique borrow is consumed here).
        unsafe { self.register_raw(buf.as_mut_ptr(), buf.len(), access) }
    }

    /// Register `buf` in place for the duration of `f`: `f` gets the region (post work
    /// with its lkey/rkey, read and write it through the region); before this returns —
    /// also when `f` panics — the region is deregistered and the engine let go of `buf`.
    /// Errors as [`register_raw`](Self::register_raw); the region's own deregistration
    /// waits as long as it takes (see [`crate::foreign`]).
    pub fn with_registered<R>(
        &self,
        buf: &mut [u8],
        access: Access,
        f: impl FnOnce(&MemoryRegion) -> R,
    ) -> io::Result<R> {
        // SAFETY: `buf` is uniquely borrowed for the whole call; the region cannot escape
        // `f` (it gets a shared reference only) and is dropped — which waits until the
        // engine released the memory — before the borrow ends, on unwinding too.
        let mr = unsafe { self.register_raw(buf.as_mut_ptr(), buf.len(), access)? };
        Ok(f(&mr))
    }
}

#[cfg(test)]
mod tests {
    use super::bad_range;

    #[test]
    fn bad_ranges_are_named() {
        let mut b = [0u8; 8];
        let p = b.as_mut_ptr();
        assert_eq!(bad_range(p, 8), None);
        assert_eq!(bad_range(std::ptr::null_mut(), 8), Some("null address"));
        assert_eq!(bad_range(p, 0), Some("zero length"));
        assert_eq!(
            bad_range(p, isize::MAX as usize + 1),
            Some("length above isize::MAX")
        );
        assert_eq!(
            bad_range(usize::MAX as *mut u8, 2),
            Some("address + length overflows")
        );
    }
}
