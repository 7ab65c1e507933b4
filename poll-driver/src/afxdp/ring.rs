//! AF_XDP single-producer/single-consumer rings shared with the kernel.
//!
//! Each ring is a power-of-two array of descriptors plus a producer and a consumer index
//! (free-running `u32`s) and a flags word. Ordering rules (the same as the kernel's
//! `xsk_queue.h`):
//! * a producer writes descriptors, then publishes them with a **release** store of the
//!   producer index; a consumer reads the producer index with an **acquire** load before
//!   reading the descriptors;
//! * a consumer reads descriptors, then frees the slots with a **release** store of the
//!   consumer index; a producer reads the consumer index with an **acquire** load before
//!   overwriting slots.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};

/// An `mmap`ed region, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    /// Map `len` bytes of `fd` at `offset` (shared, read/write, populated).
    pub(crate) fn map_fd(fd: i32, len: usize, offset: u64) -> io::Result<Self> {
        // SAFETY: a fresh shared mapping chosen by the kernel; arguments are plain values and
        // the result is checked against MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    /// Map `len` bytes of anonymous private memory (the UMEM area).
    pub(crate) fn anonymous(len: usize) -> io::Result<Self> {
        // SAFETY: a fresh anonymous mapping chosen by the kernel; checked against MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    /// Start of the mapping.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe a mapping this value created and nobody else unmaps;
        // every ring or token pointing into it is owned by (or borrows) the owner of this value.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// The raw layout of one ring inside a mapping.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingLayout {
    /// Offset of the producer index.
    pub producer: usize,
    /// Offset of the consumer index.
    pub consumer: usize,
    /// Offset of the descriptor array.
    pub desc: usize,
    /// Offset of the flags word.
    pub flags: usize,
}

impl From<&libc::xdp_ring_offset> for RingLayout {
    fn from(o: &libc::xdp_ring_offset) -> Self {
        RingLayout {
            producer: o.producer as usize,
            consumer: o.consumer as usize,
            desc: o.desc as usize,
            flags: o.flags as usize,
        }
    }
}

/// Pointers shared by both ring ends.
#[derive(Debug)]
struct RingPtrs<T> {
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    descs: *mut T,
    mask: u32,
    size: u32,
}

impl<T: Copy> RingPtrs<T> {
    /// # Safety
    /// `base` must point to memory valid for the whole ring (`layout.desc + size *
    /// size_of::<T>()` bytes, 4-byte aligned indices) for as long as the ring is used.
    unsafe fn new(base: *mut u8, layout: RingLayout, size: u32) -> Self {
        debug_assert!(size.is_power_of_two());
        RingPtrs {
            // SAFETY: in-bounds offsets given by the kernel (or a test) for this mapping.
            producer: unsafe { base.add(layout.producer) }.cast(),
            // SAFETY: as above.
            consumer: unsafe { base.add(layout.consumer) }.cast(),
            // SAFETY: as above.
            flags: unsafe { base.add(layout.flags) }.cast(),
            // SAFETY: as above.
            descs: unsafe { base.add(layout.desc) }.cast(),
            mask: size - 1,
            size,
        }
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: valid for the ring's life (constructor contract); atomics are the only access.
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as in `producer`.
        unsafe { &*self.consumer }
    }

    fn flags(&self) -> &AtomicU32 {
        // SAFETY: as in `producer`.
        unsafe { &*self.flags }
    }
}

/// The producer end of a ring (fill and TX rings: userspace produces).
#[derive(Debug)]
pub struct ProducerRing<T> {
    p: RingPtrs<T>,
    cached_prod: u32,
    cached_cons: u32,
}

impl<T: Copy> ProducerRing<T> {
    /// # Safety
    /// See [`RingPtrs::new`]; in addition, this must be the only producer of the ring.
    pub(crate) unsafe fn new(base: *mut u8, layout: RingLayout, size: u32) -> Self {
        // SAFETY: forwarded contract.
        let p = unsafe { RingPtrs::new(base, layout, size) };
        let cached_prod = p.producer().load(Ordering::Relaxed);
        let cached_cons = p.consumer().load(Ordering::Acquire);
        ProducerRing {
            p,
            cached_prod,
            cached_cons,
        }
    }

    /// Number of entries in the ring.
    pub fn size(&self) -> u32 {
        self.p.size
    }

    /// Free slots, refreshing the consumer index from the kernel only when fewer than
    /// `wanted` are known to be free.
    pub fn free(&mut self, wanted: u32) -> u32 {
        let free = self.p.size - self.cached_prod.wrapping_sub(self.cached_cons);
        if free >= wanted {
            return free;
        }
        self.cached_cons = self.p.consumer().load(Ordering::Acquire);
        self.p.size - self.cached_prod.wrapping_sub(self.cached_cons)
    }

    /// Write one entry into the next slot (not yet visible to the kernel). Returns `false`
    /// if the ring is full.
    pub fn push(&mut self, value: T) -> bool {
        if self.free(1) == 0 {
            return false;
        }
        let idx = (self.cached_prod & self.p.mask) as usize;
        // SAFETY: idx < size, the slot lies in the mapping, and it is free (between the
        // consumer and producer indices) so the kernel does not read it concurrently.
        unsafe { self.p.descs.add(idx).write_volatile(value) };
        self.cached_prod = self.cached_prod.wrapping_add(1);
        true
    }

    /// Entries written by `push` but not yet published.
    pub fn unpublished(&self) -> u32 {
        self.cached_prod
            .wrapping_sub(self.p.producer().load(Ordering::Relaxed))
    }

    /// Entries pushed (published or not) that the kernel has not consumed yet.
    pub fn outstanding(&mut self) -> u32 {
        self.cached_cons = self.p.consumer().load(Ordering::Acquire);
        self.cached_prod.wrapping_sub(self.cached_cons)
    }

    /// Publish every pushed entry to the kernel (release store of the producer index).
    pub fn submit(&mut self) {
        self.p.producer().store(self.cached_prod, Ordering::Release);
    }

    /// `true` while the kernel has not consumed every published entry.
    pub fn kernel_pending(&mut self) -> bool {
        self.cached_cons = self.p.consumer().load(Ordering::Acquire);
        self.cached_cons != self.cached_prod
    }

    /// `true` if the kernel asks for a syscall to make progress (`XDP_RING_NEED_WAKEUP`).
    pub fn needs_wakeup(&self) -> bool {
        self.p.flags().load(Ordering::Acquire) & libc::XDP_RING_NEED_WAKEUP != 0
    }
}

/// The consumer end of a ring (RX and completion rings: userspace consumes).
#[derive(Debug)]
pub struct ConsumerRing<T> {
    p: RingPtrs<T>,
    cached_prod: u32,
    cached_cons: u32,
}

impl<T: Copy> ConsumerRing<T> {
    /// # Safety
    /// See [`RingPtrs::new`]; in addition, this must be the only consumer of the ring.
    pub(crate) unsafe fn new(base: *mut u8, layout: RingLayout, size: u32) -> Self {
        // SAFETY: forwarded contract.
        let p = unsafe { RingPtrs::new(base, layout, size) };
        let cached_cons = p.consumer().load(Ordering::Relaxed);
        let cached_prod = p.producer().load(Ordering::Acquire);
        ConsumerRing {
            p,
            cached_prod,
            cached_cons,
        }
    }

    /// Number of entries in the ring.
    pub fn size(&self) -> u32 {
        self.p.size
    }

    /// Entries ready to read (at most `max`), refreshing the producer index from the kernel
    /// when the cached view is empty.
    pub fn available(&mut self, max: u32) -> u32 {
        if self.cached_prod == self.cached_cons {
            self.cached_prod = self.p.producer().load(Ordering::Acquire);
        }
        self.cached_prod.wrapping_sub(self.cached_cons).min(max)
    }

    /// Read the `i`-th available entry; `i` must be below the last `available` result.
    pub fn read(&self, i: u32) -> T {
        debug_assert!(i < self.cached_prod.wrapping_sub(self.cached_cons));
        let idx = (self.cached_cons.wrapping_add(i) & self.p.mask) as usize;
        // SAFETY: idx < size, inside the mapping; the slot was published by the producer
        // (acquire load in `available`) and is not reused until `release`.
        unsafe { self.p.descs.add(idx).read_volatile() }
    }

    /// Hand `n` read entries back to the producer (release store of the consumer index).
    pub fn release(&mut self, n: u32) {
        debug_assert!(n <= self.cached_prod.wrapping_sub(self.cached_cons));
        self.cached_cons = self.cached_cons.wrapping_add(n);
        self.p.consumer().store(self.cached_cons, Ordering::Release);
    }

    /// `true` if the kernel asks for a syscall to make progress (`XDP_RING_NEED_WAKEUP`).
    pub fn needs_wakeup(&self) -> bool {
        self.p.flags().load(Ordering::Acquire) & libc::XDP_RING_NEED_WAKEUP != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring in plain memory: both ends in userspace, as a model of the kernel's side.
    fn memory_ring(size: u32) -> (Vec<u64>, RingLayout) {
        let layout = RingLayout {
            producer: 0,
            consumer: 64,
            flags: 128,
            desc: 192,
        };
        let words = (192 + size as usize * 8) / 8;
        (vec![0u64; words], layout)
    }

    #[test]
    fn ring_wraps_and_respects_capacity() {
        let (mut mem, layout) = memory_ring(8);
        let base = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: `mem` outlives both ends and is large enough for the layout.
        let mut prod = unsafe { ProducerRing::<u64>::new(base, layout, 8) };
        // SAFETY: as above.
        let mut cons = unsafe { ConsumerRing::<u64>::new(base, layout, 8) };
        let mut next_in = 0u64;
        let mut next_out = 0u64;
        for round in 0..50u64 {
            let burst = (round % 9) as u32;
            let mut pushed = 0;
            for _ in 0..burst {
                if prod.push(next_in) {
                    next_in += 1;
                    pushed += 1;
                }
            }
            assert!(pushed <= 8);
            // Not visible before submit.
            let before = cons.available(u32::MAX);
            prod.submit();
            let n = cons.available(3);
            assert!(n <= 3);
            assert!(before <= 8);
            for i in 0..n {
                assert_eq!(cons.read(i), next_out);
                next_out += 1;
            }
            cons.release(n);
        }
        // Drain the rest.
        loop {
            let n = cons.available(u32::MAX);
            if n == 0 {
                break;
            }
            for i in 0..n {
                assert_eq!(cons.read(i), next_out);
                next_out += 1;
            }
            cons.release(n);
        }
        assert_eq!(next_in, next_out);
        assert!(next_in > 16, "the indices wrapped past the ring size");
    }

    #[test]
    fn full_ring_rejects_push_until_consumer_releases() {
        let (mut mem, layout) = memory_ring(4);
        let base = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: `mem` outlives both ends and is large enough for the layout.
        let mut prod = unsafe { ProducerRing::<u64>::new(base, layout, 4) };
        // SAFETY: as above.
        let mut cons = unsafe { ConsumerRing::<u64>::new(base, layout, 4) };
        for v in 0..4 {
            assert!(prod.push(v));
        }
        assert!(!prod.push(99));
        assert_eq!(prod.unpublished(), 4);
        prod.submit();
        assert!(prod.kernel_pending());
        assert_eq!(prod.outstanding(), 4);
        assert_eq!(cons.available(u32::MAX), 4);
        cons.release(1);
        assert!(prod.push(4));
        prod.submit();
        assert_eq!(cons.read(0), 1);
        assert_eq!(cons.available(u32::MAX), 3);
        cons.release(3);
        assert_eq!(cons.available(u32::MAX), 1);
        assert_eq!(cons.read(0), 4);
        cons.release(1);
        assert!(!prod.kernel_pending());
        assert_eq!(prod.outstanding(), 0);
    }
}
