//! UMEM (the frame memory shared with the kernel) and the XSK socket with its four rings.

use super::ring::{ConsumerRing, Mapping, ProducerRing, RingLayout};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Headroom the kernel reserves in front of every received frame (`XDP_PACKET_HEADROOM`).
pub const XDP_PACKET_HEADROOM: u32 = 256;

/// UMEM chunk (frame) size. Only these two aligned sizes are accepted on this kernel
/// (docs/afxdp.md §7.2: 1024 and 8192 are rejected).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkSize {
    /// 2048-byte chunks: frames up to 1792 bytes.
    C2048,
    /// 4096-byte chunks: frames up to 3840 bytes.
    C4096,
}

impl ChunkSize {
    /// The chunk size in bytes.
    pub fn bytes(self) -> u32 {
        match self {
            ChunkSize::C2048 => 2048,
            ChunkSize::C4096 => 4096,
        }
    }

    /// The largest Ethernet frame (without FCS) that can be received into one chunk:
    /// chunk − 256; one byte more is dropped silently by the kernel.
    pub fn max_frame_size(self) -> usize {
        (self.bytes() - XDP_PACKET_HEADROOM) as usize
    }
}

/// The frame memory: `frames` chunks of `chunk` bytes, page-aligned anonymous memory.
#[derive(Debug)]
pub struct Umem {
    area: Mapping,
    chunk: ChunkSize,
    frames: u32,
}

impl Umem {
    /// Allocate `frames` chunks.
    pub fn new(frames: u32, chunk: ChunkSize) -> io::Result<Self> {
        if frames == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "UMEM needs at least one frame",
            ));
        }
        let len = (frames as usize)
            .checked_mul(chunk.bytes() as usize)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "UMEM too large"))?;
        Ok(Umem {
            area: Mapping::anonymous(len)?,
            chunk,
            frames,
        })
    }

    /// Chunk size.
    pub fn chunk(&self) -> ChunkSize {
        self.chunk
    }

    /// Number of chunks.
    pub fn frames(&self) -> u32 {
        self.frames
    }

    /// Base address of the area.
    pub(crate) fn base(&self) -> *mut u8 {
        self.area.as_ptr()
    }

    /// Area length in bytes.
    pub fn len(&self) -> usize {
        self.area.len()
    }

    /// Always `false`: a UMEM has at least one frame.
    pub fn is_empty(&self) -> bool {
        self.area.len() == 0
    }

    /// UMEM offset of chunk `i`.
    pub fn frame_addr(&self, i: u32) -> u64 {
        u64::from(i) * u64::from(self.chunk.bytes())
    }
}

/// Ring sizes of one socket (each a power of two).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingSizes {
    /// Fill ring (frames handed to the kernel for RX).
    pub fill: u32,
    /// Completion ring (TX frames the kernel is done with).
    pub completion: u32,
    /// RX ring.
    pub rx: u32,
    /// TX ring.
    pub tx: u32,
}

/// Bind options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindOptions {
    /// Ask for zero-copy (`XDP_ZEROCOPY`) instead of copy mode (`XDP_COPY`).
    pub zero_copy: bool,
    /// Use `XDP_USE_NEED_WAKEUP`: the kernel flags rings that need a syscall.
    pub need_wakeup: bool,
    /// Use `XDP_USE_SG`: frames larger than a chunk travel as descriptor chains
    /// (`XDP_PKT_CONTD` on every descriptor but the last), in both directions.
    pub multi_buffer: bool,
    /// Register the UMEM in unaligned chunk mode (`XDP_UMEM_UNALIGNED_CHUNK_FLAG`): fill
    /// and TX addresses may be any offset, and RX descriptors carry the buffer address in
    /// bits 0..48 and the data offset inside it in bits 48..64.
    pub unaligned_chunks: bool,
    /// Bytes of TX metadata in front of every TX descriptor's `addr`
    /// (`XDP_UMEM_TX_METADATA_LEN`, a multiple of 8 below 256; 0 for none). With it, every
    /// TX descriptor must leave that many bytes in front of its data inside the UMEM
    /// (aligned mode: inside its chunk), and `len + tx_metadata_len` must fit a chunk.
    pub tx_metadata_len: u32,
}

/// Bits of an unaligned-mode descriptor address that hold the buffer address; the bits
/// above ([`UNALIGNED_OFFSET_SHIFT`]) hold the offset of the data inside the buffer.
pub const UNALIGNED_ADDR_MASK: u64 = (1 << UNALIGNED_OFFSET_SHIFT) - 1;

/// Shift of the data offset in an unaligned-mode descriptor address
/// (`XSK_UNALIGNED_BUF_OFFSET_SHIFT`).
pub const UNALIGNED_OFFSET_SHIFT: u32 = 48;

/// An AF_XDP socket bound to one (interface, queue), with its UMEM registered and its rings
/// mapped. The UMEM must outlive the socket (the owner drops the socket first).
#[derive(Debug)]
pub struct XskSocket {
    pub(crate) fill: ProducerRing<u64>,
    pub(crate) completion: ConsumerRing<u64>,
    pub(crate) rx: ConsumerRing<libc::xdp_desc>,
    pub(crate) tx: ProducerRing<libc::xdp_desc>,
    // Ring mappings must be dropped after the ring views above and before the fd.
    _maps: [Mapping; 4],
    fd: OwnedFd,
    ifindex: u32,
    queue: u32,
    opts: BindOptions,
}

fn check(r: libc::c_int, what: &str) -> io::Result<()> {
    if r < 0 {
        let e = io::Error::last_os_error();
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    } else {
        Ok(())
    }
}

fn setsockopt<T>(fd: RawFd, opt: libc::c_int, v: &T, what: &str) -> io::Result<()> {
    // SAFETY: valid fd; `v` points to a live value whose size is passed along.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_XDP,
            opt,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as u32,
        )
    };
    check(r, what)
}

/// `XDP_UMEM_REG` of `umem` on socket `fd`, with `tx_metadata_len` bytes of TX metadata
/// (flag `XDP_UMEM_TX_METADATA_LEN`) when non-zero.
fn register_umem(fd: RawFd, umem: &Umem, unaligned: bool, tx_metadata_len: u32) -> io::Result<()> {
    let mut flags = 0;
    if unaligned {
        flags |= libc::XDP_UMEM_UNALIGNED_CHUNK_FLAG;
    }
    if tx_metadata_len > 0 {
        flags |= libc::XDP_UMEM_TX_METADATA_LEN;
    }
    let reg = libc::xdp_umem_reg {
        addr: umem.base() as u64,
        len: umem.len() as u64,
        chunk_size: umem.chunk().bytes(),
        headroom: 0,
        flags,
        tx_metadata_len,
    };
    setsockopt(fd, libc::XDP_UMEM_REG, &reg, "XDP_UMEM_REG")
}

/// `true` if this kernel accepts `tx_metadata_len` bytes of TX metadata at UMEM
/// registration (`XDP_UMEM_TX_METADATA_LEN`, Linux 6.8+ with the flag): registers a
/// throwaway two-chunk UMEM on a throwaway socket. Older kernels reject the unknown flag
/// (`EINVAL`); other errors (no AF_XDP, no privileges) are returned.
pub(crate) fn kernel_accepts_tx_metadata(tx_metadata_len: u32) -> io::Result<bool> {
    let umem = Umem::new(2, ChunkSize::C2048)?;
    // SAFETY: plain socket(2); the result is checked and wrapped.
    let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    check(raw, "socket(AF_XDP)")?;
    // SAFETY: fresh fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    match register_umem(fd.as_raw_fd(), &umem, false, tx_metadata_len) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => Ok(false),
        Err(e) => Err(e),
    }
    // `fd` closes before `umem` unmaps (reverse declaration order).
}

impl XskSocket {
    /// Create a socket, register `umem`, create and map the rings and bind to
    /// (`ifindex`, `queue`). Zero-copy binds return `EOPNOTSUPP` on drivers without it
    /// (veth): the caller retries in copy mode.
    pub fn bind(
        umem: &Umem,
        ifindex: u32,
        queue: u32,
        sizes: RingSizes,
        opts: BindOptions,
    ) -> io::Result<Self> {
        for (n, v) in [
            ("fill", sizes.fill),
            ("completion", sizes.completion),
            ("rx", sizes.rx),
            ("tx", sizes.tx),
        ] {
            if !v.is_power_of_two() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{n} ring size {v} is not a power of two"),
                ));
            }
        }
        // SAFETY: plain socket(2); the result is checked and wrapped.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        check(raw, "socket(AF_XDP)")?;
        // SAFETY: fresh fd owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let raw = fd.as_raw_fd();

        register_umem(raw, umem, opts.unaligned_chunks, opts.tx_metadata_len)?;
        setsockopt(
            raw,
            libc::XDP_UMEM_FILL_RING,
            &sizes.fill,
            "XDP_UMEM_FILL_RING",
        )?;
        setsockopt(
            raw,
            libc::XDP_UMEM_COMPLETION_RING,
            &sizes.completion,
            "XDP_UMEM_COMPLETION_RING",
        )?;
        setsockopt(raw, libc::XDP_RX_RING, &sizes.rx, "XDP_RX_RING")?;
        setsockopt(raw, libc::XDP_TX_RING, &sizes.tx, "XDP_TX_RING")?;

        // SAFETY: all-zero is a valid xdp_mmap_offsets.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut optlen = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: valid fd; `off`/`optlen` are live and sized correctly.
        let r = unsafe {
            libc::getsockopt(
                raw,
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                &mut optlen,
            )
        };
        check(r, "getsockopt(XDP_MMAP_OFFSETS)")?;

        let u64s = std::mem::size_of::<u64>();
        let descs = std::mem::size_of::<libc::xdp_desc>();
        let fill_map = Mapping::map_fd(
            raw,
            off.fr.desc as usize + sizes.fill as usize * u64s,
            libc::XDP_UMEM_PGOFF_FILL_RING,
        )?;
        let comp_map = Mapping::map_fd(
            raw,
            off.cr.desc as usize + sizes.completion as usize * u64s,
            libc::XDP_UMEM_PGOFF_COMPLETION_RING,
        )?;
        let rx_map = Mapping::map_fd(
            raw,
            off.rx.desc as usize + sizes.rx as usize * descs,
            libc::XDP_PGOFF_RX_RING as u64,
        )?;
        let tx_map = Mapping::map_fd(
            raw,
            off.tx.desc as usize + sizes.tx as usize * descs,
            libc::XDP_PGOFF_TX_RING as u64,
        )?;
        // SAFETY: each mapping covers the ring at the kernel-given offsets and lives in
        // `_maps` as long as the ring views; this socket is the only user-space end.
        let (fill, completion, rx, tx) = unsafe {
            (
                ProducerRing::new(fill_map.as_ptr(), RingLayout::from(&off.fr), sizes.fill),
                ConsumerRing::new(
                    comp_map.as_ptr(),
                    RingLayout::from(&off.cr),
                    sizes.completion,
                ),
                ConsumerRing::new(rx_map.as_ptr(), RingLayout::from(&off.rx), sizes.rx),
                ProducerRing::new(tx_map.as_ptr(), RingLayout::from(&off.tx), sizes.tx),
            )
        };

        let mut flags = if opts.zero_copy {
            libc::XDP_ZEROCOPY
        } else {
            libc::XDP_COPY
        };
        if opts.need_wakeup {
            flags |= libc::XDP_USE_NEED_WAKEUP;
        }
        if opts.multi_buffer {
            flags |= libc::XDP_USE_SG;
        }
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: flags,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: valid fd and a live sockaddr_xdp of the stated size.
        let r = unsafe {
            libc::bind(
                raw,
                (&sa as *const libc::sockaddr_xdp).cast(),
                std::mem::size_of::<libc::sockaddr_xdp>() as u32,
            )
        };
        check(
            r,
            &format!(
                "bind AF_XDP to ifindex {ifindex} queue {queue} ({})",
                if opts.zero_copy { "zero-copy" } else { "copy" }
            ),
        )?;
        Ok(XskSocket {
            fill,
            completion,
            rx,
            tx,
            _maps: [fill_map, comp_map, rx_map, tx_map],
            fd,
            ifindex,
            queue,
            opts,
        })
    }

    /// The socket's file descriptor.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Interface index the socket is bound to.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// RX queue the socket is bound to.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// `true` if bound in zero-copy mode.
    pub fn is_zero_copy(&self) -> bool {
        self.opts.zero_copy
    }

    /// `true` if bound with `XDP_USE_NEED_WAKEUP`.
    pub fn uses_need_wakeup(&self) -> bool {
        self.opts.need_wakeup
    }

    /// The kernel's per-socket counters (`XDP_STATISTICS`).
    pub fn statistics(&self) -> io::Result<XdpStatistics> {
        // SAFETY: all-zero is a valid xdp_statistics.
        let mut s: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_statistics>() as libc::socklen_t;
        // SAFETY: valid fd; `s`/`len` are live and sized correctly.
        let r = unsafe {
            libc::getsockopt(
                self.fd(),
                libc::SOL_XDP,
                libc::XDP_STATISTICS,
                (&mut s as *mut libc::xdp_statistics).cast(),
                &mut len,
            )
        };
        check(r, "getsockopt(XDP_STATISTICS)")?;
        Ok(XdpStatistics {
            rx_dropped: s.rx_dropped,
            rx_invalid_descs: s.rx_invalid_descs,
            tx_invalid_descs: s.tx_invalid_descs,
            rx_ring_full: s.rx_ring_full,
            rx_fill_ring_empty_descs: s.rx_fill_ring_empty_descs,
            tx_ring_empty_descs: s.tx_ring_empty_descs,
        })
    }

    /// One TX kick: `sendto(fd, NULL, 0, MSG_DONTWAIT)`. The kernel moves at most 32
    /// descriptors per call in copy mode. Transient errors (EAGAIN, EBUSY, ENOBUFS) are `Ok`.
    pub(crate) fn kick_tx(&self) -> io::Result<()> {
        // SAFETY: valid fd; a zero-length send with null buffer and address is the documented
        // AF_XDP TX wakeup.
        let r = unsafe {
            libc::sendto(
                self.fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::EINTR) => Ok(()),
                _ => Err(io::Error::new(e.kind(), format!("AF_XDP TX kick: {e}"))),
            }
        } else {
            Ok(())
        }
    }

    /// RX wakeup for drivers that flag the fill ring: `recvfrom(fd, NULL, 0, MSG_DONTWAIT)`.
    pub(crate) fn kick_rx(&self) {
        // SAFETY: valid fd; zero-length receive with null buffer is the AF_XDP RX wakeup.
        unsafe {
            libc::recvfrom(
                self.fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
        }
    }
}

/// The kernel's AF_XDP socket counters (`struct xdp_statistics`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct XdpStatistics {
    /// Frames dropped for reasons other than invalid descriptors (e.g. too big, no fill).
    pub rx_dropped: u64,
    /// Invalid descriptors on the fill ring.
    pub rx_invalid_descs: u64,
    /// Invalid descriptors on the TX ring.
    pub tx_invalid_descs: u64,
    /// Frames dropped because the RX ring was full.
    pub rx_ring_full: u64,
    /// Times the fill ring was empty when a frame arrived.
    pub rx_fill_ring_empty_descs: u64,
    /// Times the TX ring was empty when the kernel looked for work.
    pub tx_ring_empty_descs: u64,
}
