//! The memory oracles for the RDMAP targets.
//!
//! [`Arena`] registers regions in two PDs: in the QP's PD one region per access mix
//! (read+write, read-only, write-only, no access, local-write receive buffers) and in a
//! second PD a read+write region at the same tagged offset as the first plus a no-access
//! one. Every region starts filled with a known pattern. Regions whose bytes the peer may
//! not read (no remote read in the QP's PD) are filled with a *secret*: the bytes
//! `0xf0..=0xff` repeating, so any 16 of them in a row are recognisable wherever they land.
//!
//! After an input, [`Arena::check_writes`] checks that only regions the peer may write
//! (remote write in the QP's PD) and the posted receive SGEs changed, and
//! [`Arena::check_leak`] checks that nothing the QP transmitted carries a run of secret
//! bytes (unless the peer itself supplied such a run, or wrote one into a region it may
//! read back, which is legitimate).

use xwarp_rdmap::{Access, PdId, RecvWr, Resources, Sge, Stag};

/// Length of every arena region.
pub const REGION_LEN: usize = 1024;

/// Shortest run of secret bytes that counts as a leak.
pub const LEAK_RUN: usize = 16;

/// One registered region and what the peer may do with it.
#[derive(Debug, Clone)]
pub struct Region {
    /// Its STag.
    pub stag: Stag,
    /// Its PD.
    pub pd: PdId,
    /// Its access rights.
    pub access: Access,
    /// Tagged offset of byte 0.
    pub base: u64,
    /// Initial contents.
    pub fill: Vec<u8>,
}

/// Regions in several PDs, the receive SGEs posted into them, and the QP's PD.
pub struct Arena {
    /// The STag table and SRQs.
    pub res: Resources,
    /// The QP's PD.
    pub pd: PdId,
    /// Every region, in the order of [`Arena::new`].
    pub regions: Vec<Region>,
    /// Receive work requests to post (SGEs in the local-write region only).
    pub recvs: Vec<RecvWr>,
}

/// Index of the read+write region in the QP's PD (TO 0x1000).
pub const RW: usize = 0;
/// Index of the remote-read-only region (TO 0x2000).
pub const RO: usize = 1;
/// Index of the remote-write-only region (TO 0x3000).
pub const WO: usize = 2;
/// Index of the no-access region (TO 0x4000).
pub const NONE: usize = 3;
/// Index of the local-write region holding the receive buffers (TO 0x5000).
pub const RECV: usize = 4;
/// Index of the read+write region of the other PD (TO 0x1000, like [`RW`]).
pub const OTHER_RW: usize = 5;
/// Index of the no-access region of the other PD (TO 0x6000).
pub const OTHER_NONE: usize = 6;

/// Secret byte `i` of a region the peer may not read.
fn secret(i: usize) -> u8 {
    0xf0 | (i % 16) as u8
}

/// Whether `bytes` has a run of [`LEAK_RUN`] consecutive secret bytes.
pub fn has_secret_run(bytes: &[u8]) -> bool {
    let mut run = 0usize;
    let mut prev = 0u8;
    for &b in bytes {
        run = if b >= 0xf0 && run > 0 && b == 0xf0 | (prev.wrapping_add(1) & 0x0f) {
            run + 1
        } else if b >= 0xf0 {
            1
        } else {
            0
        };
        if run >= LEAK_RUN {
            return true;
        }
        prev = b;
    }
    false
}

impl Arena {
    /// Registers the regions; the QP's PD is the first one allocated.
    pub fn new() -> Arena {
        let mut res = Resources::new();
        let pd = res.stags.alloc_pd();
        let other = res.stags.alloc_pd();
        let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let plan = [
            (pd, rw, 0x1000u64),
            (pd, Access::REMOTE_READ, 0x2000),
            (pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0x3000),
            (pd, Access::NONE, 0x4000),
            (pd, Access::LOCAL_WRITE, 0x5000),
            (other, rw, 0x1000),
            (other, Access::NONE, 0x6000),
        ];
        let mut regions = Vec::new();
        for (n, &(rpd, access, base)) in plan.iter().enumerate() {
            let readable = rpd == pd && access.contains(Access::REMOTE_READ);
            let fill: Vec<u8> = (0..REGION_LEN)
                .map(|i| {
                    if readable {
                        (n * 37 + i * 7) as u8 & 0x7f
                    } else {
                        secret(i)
                    }
                })
                .collect();
            let stag = res
                .stags
                .register(rpd, access, base, Box::new(fill.clone()))
                .expect("register an arena region");
            regions.push(Region {
                stag,
                pd: rpd,
                access,
                base,
                fill,
            });
        }
        // Four receives, each two SGEs with gaps around them (a Send must not touch the
        // gaps).
        let recv = &regions[RECV];
        let recvs = (0..4u64)
            .map(|i| RecvWr {
                wr_id: 100 + i,
                sgl: vec![
                    Sge {
                        lkey: recv.stag,
                        addr: recv.base + i * 256 + 16,
                        len: 64,
                    },
                    Sge {
                        lkey: recv.stag,
                        addr: recv.base + i * 256 + 112,
                        len: 96,
                    },
                ],
            })
            .collect();
        Arena {
            res,
            pd,
            regions,
            recvs,
        }
    }

    /// The STag a fuzz input means by `raw`: values below 0x100 pick an arena region
    /// (so inputs reach real regions whatever STags the table hands out), others are kept.
    pub fn stag(&self, raw: u32) -> u32 {
        if raw < 0x100 {
            self.regions[raw as usize % self.regions.len()].stag.0
        } else {
            raw
        }
    }

    /// Rewrites the STags a peer names in one DDP segment (tagged sink STag, invalidate
    /// STag of a Send with Invalidate, source STag of a Read Request) with [`Arena::stag`].
    pub fn translate_segment(&self, seg: &mut [u8]) {
        if seg.len() < 6 {
            return;
        }
        let fix = |s: &mut [u8], at: usize| {
            let raw = u32::from_be_bytes([s[at], s[at + 1], s[at + 2], s[at + 3]]);
            s[at..at + 4].copy_from_slice(&self.stag(raw).to_be_bytes());
        };
        if seg[0] & 0x80 != 0 {
            fix(seg, 2);
            return;
        }
        match seg[1] & 0x0f {
            4 | 6 => fix(seg, 2),
            // Read Request: 18-byte untagged header, then sink STag/TO, size, source STag.
            1 if seg.len() >= 18 + 20 => fix(seg, 18 + 16),
            _ => {}
        }
    }

    /// Current bytes of region `n` (empty if it is gone, e.g. invalidated... still
    /// registered regions read back whatever their state).
    pub fn bytes(&self, n: usize) -> Vec<u8> {
        let r = &self.regions[n];
        self.res
            .stags
            .read(r.stag, 0, REGION_LEN)
            .unwrap_or_else(|_| r.fill.clone())
    }

    /// Whether the peer may write anywhere in region `n` (remote write in the QP's PD).
    fn peer_writable(&self, n: usize) -> bool {
        let r = &self.regions[n];
        r.pd == self.pd && r.access.contains(Access::REMOTE_WRITE)
    }

    /// Panics if a byte changed that the peer may not address: anything outside the
    /// remote-writable regions of the QP's PD and the posted receive SGEs.
    pub fn check_writes(&self) {
        for n in 0..self.regions.len() {
            if self.peer_writable(n) {
                continue;
            }
            let r = &self.regions[n];
            let Ok(now) = self.res.stags.read(r.stag, 0, REGION_LEN) else {
                continue;
            };
            // One memcmp in the common case (the fuzzer's comparison hooks make a
            // byte-by-byte loop slow).
            if now[..] == r.fill[..] {
                continue;
            }
            let mut allowed = vec![false; REGION_LEN];
            for s in self.recvs.iter().flat_map(|w| &w.sgl) {
                if s.lkey == r.stag && s.addr >= r.base {
                    let from = (s.addr - r.base) as usize;
                    let to = (from + s.len as usize).min(REGION_LEN);
                    allowed[from.min(to)..to].iter_mut().for_each(|a| *a = true);
                }
            }
            for (i, (&a, &b)) in now.iter().zip(&r.fill).enumerate() {
                assert!(
                    a == b || allowed[i],
                    "byte {i} (TO {:#x}) of region {n} ({:?}, {:?}) changed: {b:#x} -> {a:#x}",
                    r.base + i as u64,
                    r.pd,
                    r.access
                );
            }
        }
    }

    /// Panics if `tx` (what the QP or connection transmitted) carries a run of secret
    /// bytes that the peer did not supply itself (`input`) and could not have written into
    /// a region it may read.
    pub fn check_leak(&self, tx: &[u8], input: &[u8]) {
        if !has_secret_run(tx) || has_secret_run(input) {
            return;
        }
        for n in 0..self.regions.len() {
            let r = &self.regions[n];
            if r.pd == self.pd
                && r.access.contains(Access::REMOTE_READ)
                && has_secret_run(&self.bytes(n))
            {
                return;
            }
        }
        panic!("bytes of a region the peer may not read left in the transmitted stream");
    }
}

impl Default for Arena {
    fn default() -> Self {
        Arena::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_runs_are_recognised_at_any_phase() {
        let s: Vec<u8> = (0..40).map(secret).collect();
        for start in 0..16 {
            assert!(has_secret_run(&s[start..start + LEAK_RUN]));
            assert!(!has_secret_run(&s[start..start + LEAK_RUN - 1]));
        }
        assert!(!has_secret_run(&[0xf3; 64]));
    }

    #[test]
    #[should_panic(expected = "changed")]
    fn a_write_into_a_read_only_region_is_caught() {
        let mut a = Arena::new();
        let s = a.regions[RO].stag;
        a.res.stags.write(s, 5, &[0xaa]).unwrap();
        a.check_writes();
    }

    #[test]
    #[should_panic(expected = "may not read")]
    fn a_leaked_no_access_byte_run_is_caught() {
        let a = Arena::new();
        let b = a.bytes(NONE);
        a.check_leak(&b[3..40], b"");
    }
}
