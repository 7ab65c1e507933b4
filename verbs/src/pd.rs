//! Protection domains and memory regions: [`ProtectionDomain`] (registration, QP and
//! SRQ creation) and [`MemoryRegion`] (see [`crate::mem`] for the aliasing contract).

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use xwarp_rdmap::verbs::Sge;
use xwarp_rdmap::{Access, Stag};
use xwarp_stack::Readiness;

use crate::context::Device;
use crate::engine::cmd::Cmd;
use crate::mem::RawBuf;
use crate::qp::{QpInitAttr, QueuePair};
use crate::qp_attr::check_inline;
use crate::srq::SharedReceiveQueue;

impl Device {
    /// Allocate a protection domain.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        ProtectionDomain {
            dev: self.clone(),
            pd: xwarp_rdmap::PdId(self.inner.next_pd.fetch_add(1, Ordering::Relaxed)),
        }
    }
}

/// A protection domain: memory regions and QPs of one PD may be used together.
#[derive(Debug, Clone)]
pub struct ProtectionDomain {
    pub(crate) dev: Device,
    pub(crate) pd: xwarp_rdmap::PdId,
}

impl ProtectionDomain {
    fn register_raw(&self, buf: RawBuf, access: Access) -> io::Result<MemoryRegion> {
        let buf = Arc::new(buf);
        let base = buf.addr();
        let stag = self
            .dev
            .inner
            .call(|reply| Cmd::RegMr {
                pd: self.pd,
                access,
                base,
                buf: buf.clone(),
                reply,
            })?
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{e:?}")))?;
        Ok(MemoryRegion {
            dev: self.dev.clone(),
            buf,
            stag,
            access,
        })
    }

    /// Allocate and register a zeroed, page-aligned buffer of `len` bytes; with `huge`,
    /// 2 MiB huge pages are tried first (`MAP_HUGETLB`), normal pages otherwise.
    pub fn alloc_mr(&self, len: usize, access: Access, huge: bool) -> io::Result<MemoryRegion> {
        self.register_raw(RawBuf::alloc(len, huge)?, access)
    }

    /// Register an application buffer; the region owns it from now on (read it back
    /// through [`MemoryRegion::read`]).
    pub fn register(&self, buf: impl Into<Box<[u8]>>, access: Access) -> io::Result<MemoryRegion> {
        self.register_raw(RawBuf::from_box(buf.into()), access)
    }

    /// Create a shared receive queue of `depth` entries.
    pub fn create_srq(&self, depth: usize) -> io::Result<SharedReceiveQueue> {
        let id = self
            .dev
            .inner
            .call(|reply| Cmd::CreateSrq { depth, reply })?;
        Ok(SharedReceiveQueue {
            dev: self.dev.clone(),
            id,
        })
    }

    /// Create an RC queue pair (not connected yet: use [`QueuePair::connect`] or
    /// [`ConnRequest::accept`](crate::ConnRequest::accept)).
    pub fn create_qp(&self, attr: &QpInitAttr<'_>) -> io::Result<QueuePair> {
        if attr.max_send_wr == 0 || (attr.srq.is_none() && attr.max_recv_wr == 0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "queue depths must be at least 1",
            ));
        }
        attr.mpa
            .validate()
            .map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
        check_inline(attr.max_inline_data, attr.max_send_wr)
            .map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
        let qpn = self.dev.inner.next_qpn.fetch_add(1, Ordering::Relaxed);
        let (ev_tx, ev_rx) = crossbeam_channel::unbounded();
        let ready = Arc::new(Readiness::new()?);
        let rq = match attr.srq {
            Some(s) => xwarp_rdmap::RqConfig::Shared(s.id),
            None => xwarp_rdmap::RqConfig::Own(attr.max_recv_wr),
        };
        let qp = xwarp_rdmap::QpConfig {
            pd: self.pd,
            ird: attr.ird,
            ord: attr.ord,
            sq_depth: attr.max_send_wr,
            rq,
        };
        self.dev.inner.send(Cmd::CreateQp {
            qpn,
            qp,
            max_inline: attr.max_inline_data,
            mpa: attr.mpa.clone(),
            send_cq: attr.send_cq.shared.clone(),
            recv_cq: attr.recv_cq.shared.clone(),
            events: ev_tx,
            ready: ready.clone(),
        })?;
        Ok(QueuePair {
            dev: self.dev.clone(),
            qpn,
            max_inline: AtomicUsize::new(attr.max_inline_data),
            max_send_wr: attr.max_send_wr,
            events: ev_rx,
            ready,
        })
    }
}

/// A registered memory region (owns its buffer; deregistered on drop).
pub struct MemoryRegion {
    dev: Device,
    buf: Arc<RawBuf>,
    stag: Stag,
    access: Access,
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("stag", &self.stag)
            .field("len", &self.buf.len())
            .finish()
    }
}

impl MemoryRegion {
    /// Local key (the region's STag).
    pub fn lkey(&self) -> Stag {
        self.stag
    }

    /// Remote key (the same STag; give it to the peer with [`Self::addr`]).
    pub fn rkey(&self) -> Stag {
        self.stag
    }

    /// Tagged offset of byte 0 (the buffer's virtual address, as in verbs).
    pub fn addr(&self) -> u64 {
        self.buf.addr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.buf.len() == 0
    }

    /// Access rights.
    pub fn access(&self) -> Access {
        self.access
    }

    /// Whether the buffer got huge pages.
    pub fn is_huge(&self) -> bool {
        self.buf.is_huge()
    }

    /// A scatter/gather entry for `[offset, offset+len)`; `None` if out of bounds.
    pub fn sge(&self, offset: usize, len: usize) -> Option<Sge> {
        if offset.checked_add(len)? > self.len() {
            return None;
        }
        Some(Sge {
            lkey: self.stag,
            addr: self.addr() + offset as u64,
            len: u32::try_from(len).ok()?,
        })
    }

    /// The whole region as one SGE (`None` above 4 GiB).
    pub fn sge_all(&self) -> Option<Sge> {
        self.sge(0, self.len())
    }

    /// Copy `data` into the region at `offset` (see the aliasing contract in [`crate::mem`]).
    pub fn write(&self, offset: usize, data: &[u8]) -> io::Result<()> {
        if self.buf.copy_in(offset, data) {
            Ok(())
        } else {
            Err(io::Error::new(io::ErrorKind::InvalidInput, "out of bounds"))
        }
    }

    /// Copy region bytes at `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> io::Result<()> {
        if self.buf.copy_out(offset, out) {
            Ok(())
        } else {
            Err(io::Error::new(io::ErrorKind::InvalidInput, "out of bounds"))
        }
    }

    /// The byte at `offset`, read afresh on every call (to poll for a remote Write, as
    /// perftest's latency tests do); `None` out of bounds.
    pub fn poll_byte(&self, offset: usize) -> Option<u8> {
        self.buf.load_volatile(offset)
    }

    /// A copy of `len` region bytes at `offset`.
    pub fn to_vec(&self, offset: usize, len: usize) -> io::Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }

    /// Fill `[offset, offset+len)` with `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> io::Result<()> {
        if self.buf.fill(offset, len, byte) {
            Ok(())
        } else {
            Err(io::Error::new(io::ErrorKind::InvalidInput, "out of bounds"))
        }
    }

    /// Make an invalidated STag usable again (the verbs fast-register step, simplified).
    pub fn revalidate(&self) -> io::Result<()> {
        let stag = self.stag;
        self.dev
            .inner
            .call(|reply| Cmd::Revalidate { stag, reply })?
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{e:?}")))
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // The engine drops its own reference to the buffer when it deregisters.
        let _ = self.dev.inner.send(Cmd::DeregMr { stag: self.stag });
    }
}
