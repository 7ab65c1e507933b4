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
use crate::mem::{EngineRegion, RawBuf, Released};
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
    /// Register `buf` (owned, or application memory in place): the tagged offset of
    /// byte 0 is the buffer's virtual address, as `ibv_reg_mr` gives (iova = addr).
    pub(crate) fn register_buf(&self, buf: RawBuf, access: Access) -> io::Result<MemoryRegion> {
        let buf = Arc::new(buf);
        let base = buf.addr();
        let foreign = buf.is_foreign();
        let (region, released) = EngineRegion::new(buf.clone());
        let (tx, rx) = crossbeam_channel::bounded(1);
        // On error the command (and the engine's reference in it) came back and was dropped.
        self.dev.inner.send(Cmd::RegMr {
            pd: self.pd,
            access,
            base,
            region,
            reply: tx,
        })?;
        let stag = loop {
            match rx.recv_timeout(ENGINE_WAIT) {
                Ok(r) => break r,
                // Owned memory: the engine keeps it alive as long as it needs it, and
                // deregisters an STag nobody waits for (the reply fails to send).
                Err(_) if !foreign => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "engine did not answer",
                    ))
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    // The command was dropped unprocessed (the engine stopped): wait
                    // until its engine reference is gone before the caller reuses memory.
                    wait_released(&released, &buf, None);
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "engine stopped",
                    ));
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    // Application memory: returning now would let the caller free memory
                    // the engine may still register; wait for the answer.
                    log::warn!(
                        "registering application memory at {:#x} (+{}): no \
                         answer from the engine after {:?}; still waiting",
                        base,
                        buf.len(),
                        ENGINE_WAIT
                    );
                }
            }
        };
        let stag = match stag {
            Ok(s) => s,
            Err(e) => {
                // The table dropped the engine reference when it refused the region.
                wait_released(&released, &buf, None);
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{e:?}"),
                ));
            }
        };
        Ok(MemoryRegion {
            dev: self.dev.clone(),
            buf,
            stag,
            access,
            released,
            dereg_sent: false,
        })
    }

    /// Allocate and register a zeroed, page-aligned buffer of `len` bytes; with `huge`,
    /// 2 MiB huge pages are tried first (`MAP_HUGETLB`), normal pages otherwise.
    pub fn alloc_mr(&self, len: usize, access: Access, huge: bool) -> io::Result<MemoryRegion> {
        self.register_buf(RawBuf::alloc(len, huge)?, access)
    }

    /// Register an application buffer; the region owns it from now on (read it back
    /// through [`MemoryRegion::read`]).
    pub fn register(&self, buf: impl Into<Box<[u8]>>, access: Access) -> io::Result<MemoryRegion> {
        self.register_buf(RawBuf::from_box(buf.into()), access)
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

/// How long one wait for the engine lasts (registration answer, deregistration release)
/// before [`MemoryRegion::dereg`] gives up or a drop logs that it is still waiting.
pub const ENGINE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Block until the engine dropped its reference to `buf`'s registration; `None` waits for
/// ever (one log line per [`ENGINE_WAIT`]), `Some(t)` at most `t`. Whether it was released.
pub(crate) fn wait_released(
    released: &Released,
    buf: &RawBuf,
    limit: Option<std::time::Duration>,
) -> bool {
    if let Some(t) = limit {
        return released.wait(t);
    }
    while !released.wait(ENGINE_WAIT) {
        log::warn!(
            "deregistration of application memory at {:#x} (+{}) not \
             acknowledged by the engine after {:?} (engine thread stuck?); the memory stays \
             in use, still waiting",
            buf.addr(),
            buf.len(),
            ENGINE_WAIT
        );
    }
    true
}

/// A registered memory region: an owned buffer ([`ProtectionDomain::alloc_mr`],
/// [`ProtectionDomain::register`]) or application memory registered in place
/// ([`ProtectionDomain::register_raw`], see [`crate::foreign`]). Deregistered on drop
/// or by [`MemoryRegion::dereg`].
pub struct MemoryRegion {
    dev: Device,
    buf: Arc<RawBuf>,
    stag: Stag,
    access: Access,
    /// Set when the engine dropped its reference (the STag is gone from its table).
    released: Arc<Released>,
    /// `DeregMr` was sent (sent once: the STag value may be reused afterwards).
    dereg_sent: bool,
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

impl MemoryRegion {
    /// Whether the bytes are application memory registered in place
    /// ([`ProtectionDomain::register_raw`]).
    pub fn is_foreign(&self) -> bool {
        self.buf.is_foreign()
    }

    fn send_dereg(&mut self) {
        if !self.dereg_sent {
            self.dereg_sent = true;
            // If the engine stopped, its table (and the engine's reference) is dropped
            // with it: `released` fires all the same.
            let _ = self.dev.inner.send(Cmd::DeregMr { stag: self.stag });
        }
    }

    /// Deregister and wait (at most [`ENGINE_WAIT`]) until the engine let go of the
    /// memory: once this returns `Ok`, the engine never reads or writes the region's bytes
    /// again (a remote access to the old STag gets an invalid-STag Terminate), so memory
    /// registered with [`ProtectionDomain::register_raw`] may be freed, unmapped or
    /// reused. Work requests still posted with its lkey complete with an error.
    ///
    /// If the engine does not acknowledge in time (its thread is stuck), the region comes
    /// back inside the [`DeregError`]: it is still registered and its memory must stay
    /// valid; call `dereg` again or drop it (a drop waits as long as it takes).
    pub fn dereg(self) -> Result<(), DeregError> {
        self.dereg_within(ENGINE_WAIT)
    }

    /// [`dereg`](Self::dereg) waiting at most `timeout`.
    pub fn dereg_within(mut self, timeout: std::time::Duration) -> Result<(), DeregError> {
        self.send_dereg();
        // `Ok` only once `Released` fired: the memory-ordering argument is in `Drop`.
        if wait_released(&self.released, &self.buf, Some(timeout)) {
            Ok(())
        } else {
            Err(DeregError { region: self })
        }
    }
}

/// [`MemoryRegion::dereg`] timed out: the engine has not let go of the memory yet.
pub struct DeregError {
    region: MemoryRegion,
}

impl DeregError {
    /// The region, still registered (its memory must stay valid).
    pub fn into_region(self) -> MemoryRegion {
        self.region
    }
}

impl std::fmt::Debug for DeregError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeregError")
            .field("stag", &self.region.stag)
            .finish()
    }
}

impl std::fmt::Display for DeregError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "deregistration of STag {:#x} not acknowledged by the engine in time; \
             the memory is still in use",
            self.region.stag.0
        )
    }
}

impl std::error::Error for DeregError {}

/// For `?` in functions returning `io::Result`: the region is dropped with the error, and
/// that drop blocks until the engine let go (see [`MemoryRegion::dereg`]).
impl From<DeregError> for io::Error {
    fn from(e: DeregError) -> io::Error {
        // The region goes down with the error: its drop waits until the engine let go.
        io::Error::new(io::ErrorKind::TimedOut, e.to_string())
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        self.send_dereg();
        if self.buf.is_foreign() {
            // SAFETY (of the application's later reuse of the memory): the engine reaches
            // the bytes only through its `EngineRegion` in the STag table, on the engine
            // thread. `released` is set in that value's drop, after every access it made
            // (program order on the engine thread), under a mutex; `wait_released` takes
            // the same mutex and sees the flag, so every engine access happens-before our
            // return and the caller's free/munmap/overwrite. Dropping the table without
            // processing `DeregMr` (the engine stopped) drops the value as well.
            wait_released(&self.released, &self.buf, None);
        }
        // Owned memory: the engine's reference keeps the buffer alive until it let go.
    }
}
