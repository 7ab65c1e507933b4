//! Registered memory: buffers shared between the application and the engine.
//!
//! # Memory-aliasing contract
//!
//! A registered buffer is owned by its [`MemoryRegion`](crate::MemoryRegion) (it was
//! either allocated by xwarp or handed over by the application as a `Vec<u8>`/`Box<[u8]>`),
//! never borrowed, so it cannot be freed or moved while the engine may touch it: the
//! engine holds its own reference, dropped only when the engine deregistered the STag.
//! Application memory registered in place ([`crate::foreign`]) is the exception: the
//! application owns it, and deregistration waits until the engine dropped its reference.
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
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

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
    /// Application memory registered in place (`ProtectionDomain::register_raw`): never
    /// freed here; the application owns it.
    Foreign,
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
// SAFETY: see `Send`: shared access never creates references to the bytes; every access
// (both the application's and the engine's, `EngineRegion::read_into`/`write_at`) is a
// raw-pointer copy inside the allocation.
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

    /// Application memory at `[ptr, ptr+len)`, used in place (not owned, never freed).
    ///
    /// # Safety
    /// The range must be one allocation (or mapping) valid for reads and writes for as
    /// long as this RawBuf or any copy of the engine's [`EngineRegion`] over it lives, and
    /// `len <= isize::MAX`.
    pub(crate) unsafe fn foreign(ptr: NonNull<u8>, len: usize) -> RawBuf {
        RawBuf {
            ptr,
            len,
            backing: Backing::Foreign,
            huge: false,
        }
    }

    /// Whether the bytes are application memory registered in place.
    pub(crate) fn is_foreign(&self) -> bool {
        matches!(self.backing, Backing::Foreign)
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
            // Application memory: the application frees it, after deregistration.
            Backing::Empty | Backing::Foreign => {}
        }
    }
}

/// Set once, when the engine dropped its [`EngineRegion`] of one registration: from then
/// on the engine holds no pointer into the region's bytes.
#[derive(Default)]
pub(crate) struct Released {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Released {
    fn signal(&self) {
        // A poisoned lock still holds the flag; set it anyway.
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        *done = true;
        self.cv.notify_all();
    }

    /// Wait up to `timeout` for the signal; whether it came.
    pub(crate) fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        while !*done {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            done = match self.cv.wait_timeout(done, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        true
    }
}

/// The engine's view of a registered buffer (what the STag table holds). The engine
/// reaches region bytes only through it; dropping it (deregistration, a failed
/// registration, an unprocessed command, or the engine's whole table when the engine
/// stops) signals [`Released`].
pub(crate) struct EngineRegion {
    buf: Arc<RawBuf>,
    released: Arc<Released>,
}

impl EngineRegion {
    /// The engine's reference to `buf` and the signal its drop gives.
    pub(crate) fn new(buf: Arc<RawBuf>) -> (EngineRegion, Arc<Released>) {
        let released = Arc::new(Released::default());
        (
            EngineRegion {
                buf,
                released: released.clone(),
            },
            released,
        )
    }
}

impl Drop for EngineRegion {
    fn drop(&mut self) {
        // Every engine access to the bytes went through `&self`/`&mut self` of this value,
        // so all of them are sequenced before this point on the dropping thread; the
        // mutex in `signal` releases them to the waiter (see `MemoryRegion::dereg`).
        self.released.signal();
    }
}

impl RegionMemory for EngineRegion {
    fn len(&self) -> usize {
        self.buf.len
    }

    fn write_at(&mut self, offset: usize, data: &[u8]) {
        // The StagTable checked the bounds; copy_in re-checks and does nothing outside.
        let _ = self.buf.copy_in(offset, data);
    }

    /// Copies through raw pointers (`RawBuf::copy_out`), never forming a `&[u8]` over
    /// the application-writable bytes: the transmit path and read responder copy payload
    /// from here straight into the FPDU. Out of bounds copies nothing (`dst` is left as it
    /// is); the StagTable checked the bounds before.
    fn read_into(&self, offset: usize, dst: &mut [u8]) {
        let _ = self.buf.copy_out(offset, dst);
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
    fn released_fires_when_the_engine_region_drops_after_all_its_writes() {
        let buf = Arc::new(RawBuf::alloc(4096, false).unwrap());
        let (mut r, released) = EngineRegion::new(buf.clone());
        assert!(!released.wait(Duration::from_millis(20)), "fired early");
        let engine = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            for i in 0..4096 {
                r.write_at(i, &[(i * 7 + 1) as u8]);
            }
            drop(r);
        });
        assert!(released.wait(Duration::from_secs(10)), "never fired");
        // Every write the "engine" made before dropping is visible after the wait.
        let mut out = vec![0u8; 4096];
        assert!(buf.copy_out(0, &mut out));
        assert!(out.iter().enumerate().all(|(i, &b)| b == (i * 7 + 1) as u8));
        assert!(released.wait(Duration::ZERO), "stays set");
        engine.join().unwrap();
    }

    #[test]
    fn foreign_bytes_are_used_in_place_and_never_freed() {
        let mut app = vec![3u8; 100];
        let ptr = NonNull::new(app.as_mut_ptr()).unwrap();
        // SAFETY: `app` outlives the RawBuf and is not touched while it lives.
        let b = unsafe { RawBuf::foreign(ptr, app.len()) };
        assert!(b.is_foreign() && !b.is_huge());
        assert_eq!(b.addr(), app.as_ptr() as u64);
        assert!(b.copy_in(10, &[9, 9]));
        assert!(!b.copy_in(99, &[1, 1]), "bounds are the registered length");
        drop(b);
        // The application's Vec is intact and still its own (freed once, by the Vec).
        assert_eq!(&app[9..13], &[3, 9, 9, 3]);
        app.push(1);
    }

    #[test]
    fn engine_region_writes_and_reads_through_the_shared_buffer() {
        let buf = Arc::new(RawBuf::alloc(4096, false).unwrap());
        let mut r = EngineRegion::new(buf.clone()).0;
        assert_eq!(RegionMemory::len(&r), 4096);
        r.write_at(4000, &[1, 2, 3]);
        let mut out = [0u8; 3];
        assert!(buf.copy_out(4000, &mut out));
        assert_eq!(out, [1, 2, 3]);
        let mut got = [0u8; 3];
        r.read_into(4000, &mut got);
        assert_eq!(got, [1, 2, 3]);
        // Out of bounds: nothing written, nothing read.
        r.write_at(4095, &[9, 9]);
        assert_eq!(buf.load_volatile(4095), Some(0));
        let mut two = [7u8; 2];
        r.read_into(4095, &mut two);
        assert_eq!(two, [7, 7]);
        r.read_into(usize::MAX, &mut two);
        assert_eq!(two, [7, 7]);
    }

    #[test]
    fn read_into_copies_exactly_the_bytes_in_bounds_for_both_backings() {
        for b in backings() {
            let data: Vec<u8> = (0..8192u32).map(|i| (i * 31 + 3) as u8).collect();
            assert!(b.copy_in(0, &data));
            let r = EngineRegion::new(Arc::new(b)).0;
            // In bounds: exactly the bytes, at the start, middle and the very end.
            for (off, n) in [
                (0, 1),
                (0, 8192),
                (100, 300),
                (8191, 1),
                (8192, 0),
                (4000, 0),
            ] {
                let mut dst = vec![0xeeu8; n];
                r.read_into(off, &mut dst);
                assert_eq!(&dst[..], &data[off..off + n], "{off}+{n}");
            }
            // Out of bounds (past the end, straddling it, overflowing): nothing copied.
            for (off, n) in [(8192, 1), (8191, 2), (8193, 0), (usize::MAX, 1), (1, 8192)] {
                let mut dst = vec![0xeeu8; n];
                r.read_into(off, &mut dst);
                assert!(dst.iter().all(|&x| x == 0xee), "{off}+{n} copied");
            }
            // Through the trait object, as the STag table reads it.
            let m: &dyn RegionMemory = &r;
            assert_eq!(m.read_at(10, 5), &data[10..15]);
        }
    }
}

#[cfg(test)]
mod fpdu_tests {
    //! The transmit path copies payload from engine regions straight into the FPDU: the
    //! FPDUs (bytes and CRC) are the same as with `Vec<u8>` regions framed the old way
    //! (header and payload slices concatenated by `FpduEncoder::encode`).
    use super::*;
    use xwarp_ddp::mpa::FpduEncoder;
    use xwarp_rdmap::qp::Payload;
    use xwarp_rdmap::{
        Access, PdId, QpConfig, QueuePair, Resources, RqConfig, SendOp, SendWr, Sge, Stag,
        StagTable,
    };

    /// Region bytes: three SGE sources of odd lengths, then a Read source.
    fn pattern(len: usize) -> Vec<u8> {
        (0..len as u32).map(|i| (i * 89 + i / 251) as u8).collect()
    }

    #[derive(Clone, Copy)]
    enum Kind {
        Vec,
        Mmap,
        Boxed,
        Foreign,
    }

    fn side(kind: Kind, data: &[u8]) -> (Resources, PdId, QueuePair, Stag) {
        let mut res = Resources::with_stags(StagTable::sequential());
        let pd = res.stags.alloc_pd();
        let mem: Box<dyn RegionMemory> = match kind {
            Kind::Vec => Box::new(data.to_vec()),
            Kind::Mmap => {
                let b = RawBuf::alloc(data.len(), false).unwrap();
                assert!(b.copy_in(0, data));
                Box::new(EngineRegion::new(Arc::new(b)).0)
            }
            Kind::Boxed => Box::new(
                EngineRegion::new(Arc::new(RawBuf::from_box(data.to_vec().into_boxed_slice()))).0,
            ),
            Kind::Foreign => {
                let leaked: &'static mut [u8] = Box::leak(data.to_vec().into_boxed_slice());
                let ptr = NonNull::new(leaked.as_mut_ptr()).unwrap();
                // SAFETY: leaked, so valid for the rest of the test process and reachable
                // only through this RawBuf.
                let b = unsafe { RawBuf::foreign(ptr, data.len()) };
                Box::new(EngineRegion::new(Arc::new(b)).0)
            }
        };
        let access = Access::LOCAL_WRITE | Access::REMOTE_READ;
        let stag = res.stags.register(pd, access, 0x10_0000, mem).unwrap();
        let mut qp = QueuePair::new(QpConfig {
            pd,
            ird: 4,
            ord: 4,
            sq_depth: 16,
            rq: RqConfig::Own(4),
        });
        qp.set_rts().unwrap();
        (res, pd, qp, stag)
    }

    /// The FPDU of one segment, framed as the connection does (payload copied straight
    /// from the region into the output).
    fn frame_new(enc: &mut FpduEncoder, h: &[u8], p: &Payload<'_>) -> Vec<u8> {
        let mut out = vec![0u8; enc.max_encoded_len(h.len() + p.len())];
        let (mut hdr, mut rd) = (h, p.reader());
        let fill = |dst: &mut [u8]| {
            let k = hdr.len().min(dst.len());
            dst[..k].copy_from_slice(&hdr[..k]);
            hdr = &hdr[k..];
            rd.fill(&mut dst[k..]);
        };
        let n = enc.encode_with(h.len() + p.len(), fill, &mut out).unwrap();
        out.truncate(n);
        out
    }

    /// The FPDU framed the old way: the header and one slice per payload range.
    fn frame_old(enc: &mut FpduEncoder, h: &[u8], p: &Payload<'_>) -> Vec<u8> {
        let owned: Vec<Vec<u8>> = p.parts().iter().map(|b| b.to_vec()).collect();
        let mut parts: Vec<&[u8]> = vec![h];
        parts.extend(owned.iter().map(|v| &v[..]));
        enc.encode_to_vec(&parts).unwrap()
    }

    /// Every FPDU the QP emits now, new way (and, for `Vec` regions, checked equal to the
    /// old way on a parallel encoder).
    fn drain(res: &Resources, qp: &mut QueuePair, kind: Kind, markers: bool) -> Vec<Vec<u8>> {
        let mut enc = FpduEncoder::new(true, markers);
        let mut old = FpduEncoder::new(true, markers);
        let mut out = Vec::new();
        while let Some(f) = qp
            .poll_segment(res, 1000, |h, p| {
                let f = frame_new(&mut enc, h, p);
                if matches!(kind, Kind::Vec) {
                    assert_eq!(f, frame_old(&mut old, h, p), "framed unlike before");
                }
                f
            })
            .unwrap()
        {
            out.push(f);
        }
        out
    }

    #[test]
    fn multi_sge_send_and_read_response_fpdus_match_vec_regions() {
        let data = pattern(9000);
        let base = 0x10_0000u64;
        for markers in [false, true] {
            let mut sends = Vec::new();
            let mut resps = Vec::new();
            for kind in [Kind::Vec, Kind::Mmap, Kind::Boxed, Kind::Foreign] {
                // A Send gathering three SGEs (crossing segment boundaries).
                let (mut res, _, mut qp, stag) = side(kind, &data);
                let sge = |addr: u64, len: u32| Sge {
                    lkey: stag,
                    addr: base + addr,
                    len,
                };
                qp.post_send(SendWr {
                    wr_id: 1,
                    op: SendOp::Send {
                        solicited: false,
                        invalidate: None,
                    },
                    sgl: vec![sge(3, 777), sge(5000, 1501), sge(100, 13)],
                    signaled: true,
                    fence: false,
                })
                .unwrap();
                sends.push(drain(&res, &mut qp, kind, markers));

                // A Read Response: a peer's Read Request of 2500 bytes at an odd offset.
                let (mut req_res, req_pd, mut req_qp, _) = side(Kind::Vec, &[0u8; 4096]);
                let sink = req_res
                    .stags
                    .register(req_pd, Access::LOCAL_WRITE, 0, Box::new(vec![0u8; 4096]))
                    .unwrap();
                req_qp
                    .post_send(SendWr {
                        wr_id: 2,
                        op: SendOp::Read {
                            remote_stag: stag,
                            remote_to: base + 4321,
                        },
                        sgl: vec![Sge {
                            lkey: sink,
                            addr: 0,
                            len: 2500,
                        }],
                        signaled: true,
                        fence: false,
                    })
                    .unwrap();
                let rr = req_qp
                    .poll_segment(&req_res, 1000, |h, p| {
                        let mut v = h.to_vec();
                        v.extend_from_slice(&p.to_vec());
                        v
                    })
                    .unwrap()
                    .unwrap();
                qp.on_segment(&mut res, &rr).unwrap();
                resps.push(drain(&res, &mut qp, kind, markers));
            }
            assert!(sends[0].len() >= 3 && resps[0].len() >= 3);
            assert_eq!(sends[1], sends[0], "mmap region Send, markers {markers}");
            assert_eq!(sends[2], sends[0], "boxed region Send, markers {markers}");
            assert_eq!(resps[1], resps[0], "mmap region Read Response");
            assert_eq!(resps[2], resps[0], "boxed region Read Response");
            assert_eq!(sends[3], sends[0], "foreign region Send, markers {markers}");
            assert_eq!(resps[3], resps[0], "foreign region Read Response");
        }
    }
}
