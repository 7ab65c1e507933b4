//! A shared mapping of a segment file, accessed only as aligned atomic `u64` words.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicU64;

/// `len` bytes of a file mapped `MAP_SHARED`, read-only or read-write.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is only ever accessed through `AtomicU64` words (`word`), which are
// safe to share and send between threads; the pointer is owned by this value.
unsafe impl Send for Mapping {}
// SAFETY: as above, every access is atomic.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map the first `len` bytes of `file` (`len` a non-zero multiple of 8 no larger
    /// than the file).
    pub(crate) fn new(file: &File, len: usize, writable: bool) -> io::Result<Mapping> {
        if len == 0 || !len.is_multiple_of(8) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "mapping length must be a non-zero multiple of 8",
            ));
        }
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh mapping chosen by the kernel (addr NULL) of a valid fd; the
        // result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: p.cast(), len })
    }

    /// Number of words mapped.
    pub(crate) fn words(&self) -> usize {
        self.len / 8
    }

    /// Word `i` (`None` past the end).
    pub(crate) fn word(&self, i: usize) -> Option<&AtomicU64> {
        if i >= self.words() {
            return None;
        }
        // SAFETY: `i * 8 + 8 <= len`, the mapping is page aligned so the word is 8-byte
        // aligned, it lives as long as `self`, and it is only accessed atomically (a
        // read-only mapping only ever sees loads, which are sound on read-only memory for
        // lock-free atomics of pointer size).
        Some(unsafe { &*(self.ptr.add(i * 8) as *const AtomicU64) })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; no reference into the
        // mapping outlives `self` (`word` borrows it).
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}
