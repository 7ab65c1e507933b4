//! Registered memory: buffers shared between the application and the engine.
//!
//! # Memory-aliasing contract
//!
//! A registered buffer is owned by its [`MemoryRegion`](crate::MemoryRegion) (it was
//! either allocated by xwarp or handed over by the application as a `Vec<u8>`/`Box<[u8]>`),
//! never borrowed, so it cannot be freed or moved while the engine may touch it: the
//! engine holds its own reference, dropped only when the engine deregistered the STag.
//! No Rust reference (`&[u8]`/`&mut [u8]`) to region bytes is created on the application
//! side by the safe API; the application copies in and out with
//! [`MemoryRegion::write`](crate::MemoryRegion::write) and
//! [`MemoryRegion::read`](crate::MemoryRegion::read). The engine writes only inside the
//! bounds the [`StagTable`](xwarp_rdmap::StagTable) checked.
//!
//! What the application may touch while operations are in flight (as in C verbs):
//! * the source of a posted Send/Write and the memory exposed for remote Read must not
//!   be written until the work request completed (resp. access was revoked), or the peer
//!   may see a mix of old and new bytes;
//! * the sink of a posted receive or Read, and memory exposed for remote Write, must not
//!   be read until the completion (or the ULP's own message saying the Write is done) —
//!   before that its bytes are unspecified.
//!
//! Breaking those rules gives unspecified byte values in the buffer, never access
//! outside it: copies on both sides are plain `u8` copies through raw pointers inside
//! the allocation (the same model as memory a NIC writes by DMA).

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use xwarp_rdmap::RegionMemory;

/// Page size assumed for alignment.
pub const PAGE_SIZE: usize = 4096;
/// Huge page size used with `MAP_HUGETLB`.
pub const HUGE_PAGE_SIZE: usize = 2 * 1024 * 1024;

enum Backing {
    /// `mmap`ed (page-aligned, maybe huge pages); unmapped on drop.
    Mmap { map_len: usize },
    /// A `Box<[u8]>` taken from the application (turned into a raw pointer).
    Boxed,
    /// Zero length: no allocation.
    Empty,
}

/// A buffer shared by the application and the engine.
pub(crate) struct RawBuf {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
    huge: bool,
}

// SAFETY: RawBuf owns its allocation exclusively (no other owner of the pointer exists);
// all accesses go through raw-pointer copies inside `[ptr, ptr+len)`, which is valid for
// the lifetime of the RawBuf regardless of thread. Concurrent copies of the same bytes
// follow the contract documented at module level.
unsafe impl Send for RawBuf {}
// SAFETY: see `Send`: shared access never creates references to the bytes outside the
// engine's `read_at` (bounded by the StagTable check; see its comment).
unsafe impl Sync for RawBuf {}

impl RawBuf {
    /// A zeroed, page-aligned buffer of `len` bytes; with `huge`, try `MAP_HUGETLB`
    /// first and fall back to normal pages.
    pub(crate) fn alloc(len: usize, huge: bool) -> io::Result<RawBuf> {
        if len == 0 {
            return Ok(RawBuf {
                ptr: NonNull::dangling(),
                len: 0,
                backing: Backing::Empty,
                huge: false,
            });
        }
        if huge {
            let map_len = len.div_ceil(HUGE_PAGE_SIZE) * HUGE_PAGE_SIZE;
            if let Some(ptr) = mmap_anon(map_len, libc::MAP_HUGETLB) {
                return Ok(RawBuf {
                    ptr,
                    len,
                    backing: Backing::Mmap { map_len },
                    huge: true,
                });
            }
        }
        let map_len = len.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let ptr = mmap_anon(map_len, 0).ok_or_else(io::Error::last_os_error)?;
        Ok(RawBuf {
            ptr,
            len,
            backing: Backing::Mmap { map_len },
            huge: false,
        })
    }

    /// Take ownership of an application buffer.
    pub(crate) fn from_box(b: Box<[u8]>) -> RawBuf {
        let len = b.len();
        if len == 0 {
            return RawBuf {
                ptr: NonNull::dangling(),
                len: 0,
                backing: Backing::Empty,
                huge: false,
            };
        }
        let raw = Box::into_raw(b) as *mut u8;
        RawBuf {
            // Box::into_raw never returns null.
            ptr: NonNull::new(raw).unwrap_or(NonNull::dangling()),
            len,
            backing: Backing::Boxed,
            huge: false,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub(crate) fn is_huge(&self) -> bool {
        self.huge
    }

    /// Copy `data` to `offset`; `false` if out of bounds.
    pub(crate) fn copy_in(&self, offset: usize, data: &[u8]) -> bool {
        if offset.checked_add(data.len()).is_none_or(|e| e > self.len) {
            return false;
        }
        if data.is_empty() {
            return true;
        }
        // SAFETY: `[offset, offset+len)` is inside the allocation (checked above); `data`
        // is a separate Rust slice, so the ranges do not overlap. The destination is
        // reached through the raw pointer only: no `&mut [u8]` over region bytes (which
        // the engine may be reading or writing meanwhile) is formed.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len())
        };
        true
    }

    /// Copy bytes at `offset` into `out`; `false` if out of bounds.
    pub(crate) fn copy_out(&self, offset: usize, out: &mut [u8]) -> bool {
        if offset.checked_add(out.len()).is_none_or(|e| e > self.len) {
            return false;
        }
        if out.is_empty() {
            return true;
        }
        // SAFETY: in bounds (checked above); `out` is a distinct Rust slice. The source is
        // read through the raw pointer only: no `&[u8]` over region bytes (which the
        // engine may be writing meanwhile, e.g. a remote Write) is formed.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        true
    }

    /// One byte read with a volatile load (for polling memory a remote Write updates).
    pub(crate) fn load_volatile(&self, offset: usize) -> Option<u8> {
        if offset >= self.len {
            return None;
        }
        // SAFETY: in bounds (checked above); a volatile u8 load cannot tear.
        Some(unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(offset)) })
    }

    /// Fill `[offset, offset+len)` with `byte`; `false` if out of bounds.
    pub(crate) fn fill(&self, offset: usize, len: usize, byte: u8) -> bool {
        if offset.checked_add(len).is_none_or(|e| e > self.len) {
            return false;
        }
        if len == 0 {
            return true;
        }
        // SAFETY: in bounds (checked above); written through the raw pointer, no
        // reference to region bytes is formed.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(offset), byte, len) };
        true
    }
}

fn mmap_anon(len: usize, extra: libc::c_int) -> Option<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at a kernel-chosen address; no existing memory
    // is affected. The result is checked against MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    NonNull::new(p as *mut u8)
}

impl Drop for RawBuf {
    fn drop(&mut self) {
        match self.backing {
            Backing::Mmap { map_len } => {
                // SAFETY: this exact mapping was created by `mmap_anon` with `map_len` and
                // is unmapped once, here; no reference into it outlives the RawBuf.
                unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, map_len) };
            }
            Backing::Boxed => {
                let slice = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
                // SAFETY: the pointer came from `Box::into_raw` of a `Box<[u8]>` of `len`
                // bytes and is turned back into a Box exactly once.
                drop(unsafe { Box::from_raw(slice) });
            }
            Backing::Empty => {}
        }
    }
}

/// The engine's view of a registered buffer (what the STag table holds).
pub(crate) struct EngineRegion(pub(crate) Arc<RawBuf>);

impl RegionMemory for EngineRegion {
    fn len(&self) -> usize {
        self.0.len
    }

    fn write_at(&mut self, offset: usize, data: &[u8]) {
        // The StagTable checked the bounds; copy_in re-checks and does nothing outside.
        let _ = self.0.copy_in(offset, data);
    }

    /// The one place a `&[u8]` over application-writable bytes is still formed:
    /// `RegionMemory::read_at` (rdmap's trait, used by the QP's transmit path and read
    /// responder to gather payload slices for the FPDU encoder) must return a slice.
    /// Under Rust's rules that slice asserts the bytes do not change while it lives, which
    /// an application writing the source of an in-flight Send/Write or exposed for remote
    /// Read breaks (the contract above says it must not, but it can). Every other access
    /// (`copy_in`, `copy_out`, `fill`, `load_volatile`, `write_at`) copies through raw
    /// pointers without forming a reference. Removing this one needs a copying method on
    /// `RegionMemory` (`read_into(offset, &mut [u8])`, filled by `RawBuf::copy_out`) and
    /// callers that copy into the FPDU instead of gathering slices (rdmap `mem.rs`,
    /// `qp/tx.rs`, `qp/read_responder.rs`).
    fn read_at(&self, offset: usize, len: usize) -> &[u8] {
        if len == 0 || offset.checked_add(len).is_none_or(|e| e > self.0.len) {
            return &[];
        }
        // SAFETY: `[offset, offset+len)` is inside the allocation (checked above), which
        // lives as long as `self` (the Arc). The slice is used by the engine only while
        // encoding one segment; concurrent application writes break the module contract
        // (see the doc comment above: the bytes then read are unspecified).
        unsafe { std::slice::from_raw_parts(self.0.ptr.as_ptr().add(offset), len) }
    }
}

#[cfg(test)]
mod tests {
    //! The copy paths: every access to region bytes goes through raw pointers inside the
    //! bounds (Miri is not available here; these check the bounds and the bytes).
    use super::*;

    fn backings() -> Vec<RawBuf> {
        vec![
            RawBuf::alloc(8192, false).unwrap(),
            RawBuf::from_box(vec![0u8; 8192].into_boxed_slice()),
        ]
    }

    #[test]
    fn copy_in_and_copy_out_move_exactly_the_bytes_in_bounds() {
        for b in backings() {
            let data: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
            assert!(b.copy_in(100, &data));
            let mut out = vec![0xeeu8; 500];
            assert!(b.copy_out(0, &mut out));
            assert!(out[..100].iter().all(|&x| x == 0), "bytes before changed");
            assert_eq!(&out[100..400], &data[..]);
            assert!(out[400..].iter().all(|&x| x == 0), "bytes after changed");
            // Out of bounds and overflowing offsets do nothing.
            assert!(!b.copy_in(8192 - 10, &data));
            assert!(!b.copy_in(usize::MAX, &[1]));
            assert!(!b.copy_out(8000, &mut out));
            assert!(!b.copy_out(usize::MAX - 1, &mut [0u8; 4]));
            let mut tail = [0u8; 10];
            assert!(b.copy_out(8192 - 10, &mut tail));
            assert_eq!(tail, [0u8; 10], "the refused copy_in wrote nothing");
            // Zero length is fine at the end, not beyond it.
            assert!(b.copy_in(8192, &[]));
            assert!(!b.copy_in(8193, &[]));
        }
    }

    #[test]
    fn fill_and_load_volatile_stay_in_bounds() {
        for b in backings() {
            assert!(b.fill(10, 20, 0xab));
            assert_eq!(b.load_volatile(9), Some(0));
            assert_eq!(b.load_volatile(10), Some(0xab));
            assert_eq!(b.load_volatile(29), Some(0xab));
            assert_eq!(b.load_volatile(30), Some(0));
            assert_eq!(b.load_volatile(8192), None);
            assert!(!b.fill(8190, 3, 1));
            assert!(!b.fill(usize::MAX, 2, 1));
            assert_eq!(b.load_volatile(8191), Some(0));
        }
        let empty = RawBuf::alloc(0, false).unwrap();
        assert!(empty.copy_in(0, &[]) && empty.fill(0, 0, 1));
        assert_eq!(empty.load_volatile(0), None);
    }

    #[test]
    fn engine_region_writes_and_reads_through_the_shared_buffer() {
        let buf = Arc::new(RawBuf::alloc(4096, false).unwrap());
        let mut r = EngineRegion(buf.clone());
        assert_eq!(RegionMemory::len(&r), 4096);
        r.write_at(4000, &[1, 2, 3]);
        let mut out = [0u8; 3];
        assert!(buf.copy_out(4000, &mut out));
        assert_eq!(out, [1, 2, 3]);
        assert_eq!(r.read_at(4000, 3), &[1, 2, 3]);
        // Out of bounds: nothing written, nothing read.
        r.write_at(4095, &[9, 9]);
        assert_eq!(buf.load_volatile(4095), Some(0));
        assert!(r.read_at(4095, 2).is_empty());
        assert!(r.read_at(usize::MAX, 2).is_empty());
    }
}
