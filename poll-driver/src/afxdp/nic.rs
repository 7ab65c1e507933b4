//! [`AfXdpNic`]: one AF_XDP socket on one RX queue, with its UMEM and steering program,
//! as a smoltcp `Device` and an engine [`Backend`].

use super::program::{Steering, SteeringFilter, XdpMode, XdpProgram};
use super::socket::kernel_accepts_tx_metadata;
use super::socket::{
    BindOptions, ChunkSize, RingSizes, Umem, XdpStatistics, XskSocket, UNALIGNED_ADDR_MASK,
    UNALIGNED_OFFSET_SHIFT, XDP_PACKET_HEADROOM,
};
use super::txcsum::{self, TX_METADATA_LEN};
use super::txslab::TxSlabs;
use crate::backend::{Backend, BackendStats};
use smoltcp::phy::{self, Checksum, ChecksumCapabilities, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use std::collections::VecDeque;
use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

mod telemetry;

/// Zero-copy policy for the bind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZeroCopy {
    /// Try zero-copy, fall back to copy mode on `EOPNOTSUPP` (veth).
    Auto,
    /// Zero-copy or fail.
    Require,
    /// Copy mode only.
    Off,
}

/// TX L4 (TCP/UDP) checksum offload through AF_XDP TX metadata (see the module docs,
/// "Checksums").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TxChecksumOffload {
    /// Offload when the kernel accepts TX metadata at UMEM registration, the socket is
    /// bound in copy mode and this NIC does not verify received TCP/UDP checksums
    /// ([`AfXdpConfig::checksum`] without RX for TCP and UDP); else software. The last
    /// condition keeps engines that verify (and expect their peers to send complete
    /// checksums, like themselves) on software checksums: over a veth an offloaded
    /// checksum is never completed for an AF_XDP receiver. The environment variable
    /// `XWARP_TX_CHECKSUM_OFFLOAD=off` turns `Auto` into [`TxChecksumOffload::Off`] (for
    /// comparisons).
    #[default]
    Auto,
    /// Software checksums (smoltcp computes them); no TX metadata.
    Off,
    /// Offload or fail to open: [`AfXdpNic::open`] returns `Unsupported` when the kernel
    /// rejects TX metadata or the socket binds in zero-copy mode (driver support for the
    /// checksum request is not checked).
    On,
}

/// Environment variable that turns [`TxChecksumOffload::Auto`] off (value `off` or `0`).
pub const TX_CHECKSUM_OFFLOAD_ENV: &str = "XWARP_TX_CHECKSUM_OFFLOAD";

/// Everything an [`AfXdpNic`] needs.
#[derive(Debug, Clone)]
pub struct AfXdpConfig {
    /// Interface name (in the calling thread's network namespace).
    pub ifname: String,
    /// RX queue to bind (keep the interface at one queue, or open one NIC per queue).
    pub queue: u32,
    /// XDP attach mode.
    pub mode: XdpMode,
    /// Zero-copy policy.
    pub zero_copy: ZeroCopy,
    /// Honour `XDP_USE_NEED_WAKEUP` (kick only when the kernel asks).
    pub need_wakeup: bool,
    /// UMEM chunk size.
    pub chunk: ChunkSize,
    /// UMEM chunks reserved for RX (cycled through the fill and RX rings).
    pub rx_frames: u32,
    /// UMEM chunks reserved for TX (cycled through the TX and completion rings).
    pub tx_frames: u32,
    /// Ring sizes (powers of two).
    pub rings: RingSizes,
    /// Descriptors pulled from the RX ring at a time.
    pub rx_batch: u32,
    /// TX descriptors queued before they are published and kicked without waiting for
    /// [`Backend::flush`].
    pub tx_batch: u32,
    /// Which frames the steering program redirects to this socket.
    pub filter: SteeringFilter,
    /// Replace an attached XDP program even if it is not an xwarp one.
    pub force_replace: bool,
    /// Checksum capabilities reported to smoltcp. Frames from a veth/tap peer arrive with a
    /// partial L4 checksum; see the module docs: the stack decides what to verify. With TX
    /// checksum offload active, TCP and UDP lose their TX bit (RX stays as given).
    pub checksum: ChecksumCapabilities,
    /// TX TCP/UDP checksum offload through TX metadata.
    pub tx_checksum: TxChecksumOffload,
    /// Multi-buffer frames (`XDP_USE_SG` + a `BPF_F_XDP_HAS_FRAGS` program): frames up to
    /// the interface MTU (at most [`MAX_CHAIN`] chunks) travel as descriptor chains, so
    /// the MTU is no longer capped by the chunk size. Received chains are copied into
    /// one buffer for the stack; transmitted frames are built in place in runs of
    /// consecutive TX chunks (one descriptor per chunk), so `tx_frames` is rounded up to a
    /// multiple of [`MAX_CHAIN`].
    pub multi_buffer: bool,
}

/// Most chunks one multi-buffer frame may span (the kernel allows up to
/// `MAX_SKB_FRAGS` + 1 = 18 on the copy path).
pub const MAX_CHAIN: usize = 16;

impl AfXdpConfig {
    /// Defaults for `ifname` queue 0 with `filter`: auto mode, 2048-byte chunks, 2048-entry
    /// rings, 2048 RX + 2048 TX frames, batches of 64.
    pub fn new(ifname: &str, filter: SteeringFilter) -> Self {
        AfXdpConfig {
            ifname: ifname.to_string(),
            queue: 0,
            mode: XdpMode::Auto,
            zero_copy: ZeroCopy::Auto,
            need_wakeup: true,
            chunk: ChunkSize::C2048,
            rx_frames: 2048,
            tx_frames: 2048,
            rings: RingSizes {
                fill: 2048,
                completion: 2048,
                rx: 2048,
                tx: 2048,
            },
            rx_batch: 64,
            tx_batch: 64,
            filter,
            force_replace: false,
            checksum: ChecksumCapabilities::default(),
            tx_checksum: TxChecksumOffload::Auto,
            multi_buffer: false,
        }
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Where the UMEM chunks of an [`AfXdpNic`] are, for leak checks: once traffic has stopped
/// and [`Backend::flush`] has run, the idle counts equal the totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkCounts {
    /// RX chunks.
    pub rx_total: u32,
    /// RX chunks waiting for the kernel (on the fill ring, not yet taken), in the free list,
    /// or holding a received frame not yet handed to the stack.
    pub rx_idle: u32,
    /// TX chunks (`tx_frames`, rounded up to whole runs with multi-buffer).
    pub tx_total: u32,
    /// TX chunks on neither the TX nor the completion ring.
    pub tx_idle: u32,
    /// Completed TX addresses that were not outstanding (always 0 unless the kernel
    /// returned a chunk twice or one never sent).
    pub tx_stray: u64,
}

/// How received descriptor chains reached the stack.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxChainStats {
    /// Chains read in place (contiguous in the UMEM: no copy).
    pub in_place: u64,
    /// Chains copied into one buffer first.
    pub copied: u64,
}

/// RX-side state (disjoint from TX so smoltcp can hold both tokens at once).
#[derive(Debug)]
struct RxState {
    /// Frames taken off the RX ring, not yet handed to the stack.
    pending: VecDeque<RxFrame>,
    /// Descriptors of the multi-buffer frame being received (empty between frames). A
    /// chain may straddle RX batches; its buffers stay ours until the frame is consumed.
    chain: Vec<RxPiece>,
    /// Bytes in `chain`.
    chain_len: usize,
    /// A chain that grew past the largest frame: its remaining descriptors are dropped.
    chain_discard: bool,
    /// Where consumed frames give their buffers back.
    ret: RxReturn,
    batch: u32,
    frames: u64,
    bytes: u64,
    dropped: u64,
    /// Chains handed to the stack in place (their buffers were contiguous in the UMEM).
    chains_in_place: u64,
    /// Chains copied into one buffer (not contiguous, e.g. across the end of the RX area).
    chains_copied: u64,
}

/// What consumed RX frames give back (borrowed by [`RxToken`]).
#[derive(Debug, Default)]
struct RxReturn {
    /// RX buffers the stack is done with, oldest first, waiting to go back on the fill ring
    /// in that order (so the kernel fills them in address order again: see `pull_rx`).
    free: VecDeque<u64>,
    /// Copy buffers of consumed chains, reused for the next ones.
    spare: Vec<Vec<u8>>,
    /// Buffer lists of consumed chains, reused for the next ones.
    spare_bufs: Vec<Vec<u64>>,
}

impl RxReturn {
    fn give_back(&mut self, frame: RxFrame) {
        match frame {
            RxFrame::Single { buf, .. } => self.free.push_back(buf),
            RxFrame::Chain { mut bufs, copy, .. } => {
                self.free.extend(bufs.drain(..));
                self.spare_bufs.push(bufs);
                if let Some(c) = copy {
                    self.spare.push(c);
                }
            }
        }
    }
}

/// One received descriptor of a chain.
#[derive(Debug, Clone, Copy)]
struct RxPiece {
    /// The buffer (fill-ring address).
    buf: u64,
    /// UMEM offset of its data.
    data: u64,
    len: u32,
}

/// A received frame, with the RX buffers it holds until the stack has consumed it.
#[derive(Debug)]
enum RxFrame {
    /// One buffer: `len` bytes at UMEM offset `data`.
    Single { buf: u64, data: u64, len: u32 },
    /// A descriptor chain: `len` bytes in place at UMEM offset `data` (its buffers' data
    /// areas are contiguous), or copied into `copy`.
    Chain {
        data: u64,
        len: usize,
        bufs: Vec<u64>,
        copy: Option<Vec<u8>>,
    },
}

/// TX-side state.
#[derive(Debug)]
struct TxState {
    /// TX chunks not on the TX or completion ring, handed out in consecutive runs.
    slabs: TxSlabs,
    batch: u32,
    frames: u64,
    bytes: u64,
    dropped: u64,
    /// Where a reply goes when no TX chunk is available (it is then dropped and counted).
    scratch: Vec<u8>,
    /// Bytes of TX metadata in front of every frame (0, or [`TX_METADATA_LEN`] when the
    /// UMEM was registered with TX metadata).
    meta_len: usize,
    /// TCP/UDP checksums are left to the kernel through TX metadata.
    offload: bool,
    /// Test hook: prepare frames for offload but do not set `XDP_TX_METADATA`.
    withhold_meta: bool,
    /// Frames sent with a checksum request.
    offloaded: u64,
}

/// An AF_XDP NIC queue: socket, UMEM, steering program and its link.
#[derive(Debug)]
pub struct AfXdpNic {
    // Drop order: release the program (detached with its last holder), then close the
    // socket, then free the UMEM.
    steering: Arc<Steering>,
    sock: XskSocket,
    umem: Umem,
    rxs: RxState,
    txs: TxState,
    chunk_mask: u64,
    max_frame: usize,
    /// Bound with `XDP_USE_SG` (descriptor chains).
    multi_buffer: bool,
    /// RX chunks (`rx_frames`).
    rx_total: u32,
    /// UMEM registered in unaligned chunk mode (multi-buffer).
    unaligned: bool,
    /// UMEM length in bytes.
    umem_len: u64,
    mtu: usize,
    mac: [u8; 6],
    checksum: ChecksumCapabilities,
    /// Interface name (for `xwarp stat`).
    ifname: String,
}

// SAFETY: the raw pointers inside (rings, UMEM) point into mappings owned by this value;
// nothing else references them, so moving the whole NIC to another thread is sound. It is
// not `Sync`: all ring access needs `&mut self`.
unsafe impl Send for AfXdpNic {}

fn ifreq(ifname: &str) -> io::Result<libc::ifreq> {
    // SAFETY: all-zero is a valid ifreq.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if ifname.len() >= req.ifr_name.len() {
        return Err(invalid(format!("interface name too long: {ifname}")));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(ifname.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(req)
}

fn ioctl_ifreq(ifname: &str, request: libc::c_ulong) -> io::Result<libc::ifreq> {
    let mut req = ifreq(ifname)?;
    // SAFETY: plain socket(2), closed below.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: valid fd and a live ifreq, as SIOCGIF* expects.
    let r = unsafe { libc::ioctl(s, request as _, &mut req) };
    let err = io::Error::last_os_error();
    // SAFETY: `s` is our fd.
    unsafe { libc::close(s) };
    if r < 0 {
        return Err(err);
    }
    Ok(req)
}

/// MTU (L3) and MAC address of `ifname`.
fn link_info(ifname: &str) -> io::Result<(usize, [u8; 6])> {
    let req = ioctl_ifreq(ifname, libc::SIOCGIFMTU)?;
    // SAFETY: SIOCGIFMTU filled the `ifru_mtu` member.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu }.max(0) as usize;
    let req = ioctl_ifreq(ifname, libc::SIOCGIFHWADDR)?;
    // SAFETY: SIOCGIFHWADDR filled the `ifru_hwaddr` member.
    let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *d = *s as u8;
    }
    Ok((mtu, mac))
}

fn ifindex_of(ifname: &str) -> io::Result<u32> {
    let name =
        CString::new(ifname).map_err(|_| invalid(format!("bad interface name {ifname:?}")))?;
    // SAFETY: `name` is a valid NUL-terminated string.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("interface {ifname}: {e}")));
    }
    Ok(ifindex)
}

impl AfXdpNic {
    /// Open queue `config.queue` of `config.ifname`: allocate the UMEM, bind the socket
    /// (zero-copy where allowed, else copy), load the steering program, register the socket
    /// in its XSKMAP and attach it (native where available, else generic), replacing a stale
    /// xwarp program if one is in the way.
    pub fn open(config: AfXdpConfig) -> io::Result<Self> {
        Self::open_inner(config, None)
    }

    /// Open one more RX queue of an interface whose steering program is already attached
    /// (multi-queue: one NIC per queue, all sharing `steering`, which must have been attached
    /// to the same interface with room for `config.queue`). `config.mode`, `filter` and
    /// `force_replace` are those of `steering` and ignored here.
    pub fn open_shared(config: AfXdpConfig, steering: Arc<Steering>) -> io::Result<Self> {
        Self::open_inner(config, Some(steering))
    }

    /// Attach the steering program of `config` to its interface with room for `queues` RX
    /// queues, for use with [`AfXdpNic::open_shared`].
    pub fn attach_steering(config: &AfXdpConfig, queues: u32) -> io::Result<Arc<Steering>> {
        let ifindex = ifindex_of(&config.ifname)?;
        Steering::attach(
            ifindex,
            &config.filter,
            queues,
            config.mode,
            config.force_replace,
        )
    }

    fn open_inner(config: AfXdpConfig, steering: Option<Arc<Steering>>) -> io::Result<Self> {
        let c = &config;
        if c.rx_batch == 0 || c.tx_batch == 0 {
            return Err(invalid("rx_batch and tx_batch must be at least 1".into()));
        }
        if c.rx_frames == 0 || c.tx_frames == 0 {
            return Err(invalid("rx_frames and tx_frames must be at least 1".into()));
        }
        // Multi-buffer frames are built in runs of consecutive TX chunks (`TxSlabs`): the TX
        // area is whole slabs of MAX_CHAIN chunks. Single-buffer frames need runs of one.
        let tx_per_slab: u32 = if c.multi_buffer { MAX_CHAIN as u32 } else { 1 };
        let tx_slab_count = c.tx_frames.div_ceil(tx_per_slab);
        let total = tx_slab_count
            .checked_mul(tx_per_slab)
            .and_then(|tx| c.rx_frames.checked_add(tx))
            .ok_or_else(|| invalid("too many frames".into()))?;
        let ifindex = ifindex_of(&c.ifname)?;
        if let Some(st) = &steering {
            if st.link().ifindex() != ifindex {
                return Err(invalid(format!(
                    "steering program is attached to ifindex {}, not {} ({})",
                    st.link().ifindex(),
                    ifindex,
                    c.ifname
                )));
            }
            if c.queue >= st.queues() {
                return Err(invalid(format!(
                    "queue {} is outside the steering program's {} queues",
                    c.queue,
                    st.queues()
                )));
            }
        }
        let (l3_mtu, mac) = link_info(&c.ifname)?;
        let umem = Umem::new(total, c.chunk)?;
        let want_offload = match c.tx_checksum {
            TxChecksumOffload::Off => false,
            TxChecksumOffload::On => true,
            TxChecksumOffload::Auto => {
                let env_off = matches!(
                    std::env::var(TX_CHECKSUM_OFFLOAD_ENV).as_deref(),
                    Ok("off") | Ok("0")
                );
                !env_off && !c.checksum.tcp.rx() && !c.checksum.udp.rx()
            }
        };
        let tx_metadata_len = if !want_offload {
            0
        } else if c.tx_checksum == TxChecksumOffload::On {
            if !kernel_accepts_tx_metadata(TX_METADATA_LEN)? {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "TX checksum offload: the kernel rejects TX metadata (XDP_UMEM_TX_METADATA_LEN)",
                ));
            }
            TX_METADATA_LEN
        } else if kernel_accepts_tx_metadata(TX_METADATA_LEN).unwrap_or(false) {
            TX_METADATA_LEN
        } else {
            0
        };

        let bind = |zero_copy| {
            // A socket closed a moment ago may still hold the queue: the kernel releases
            // its buffer pool from a work queue (EBUSY meanwhile). Retry for up to 2 s.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            loop {
                let r = XskSocket::bind(
                    &umem,
                    ifindex,
                    c.queue,
                    c.rings,
                    BindOptions {
                        zero_copy,
                        need_wakeup: c.need_wakeup,
                        multi_buffer: c.multi_buffer,
                        unaligned_chunks: c.multi_buffer,
                        tx_metadata_len,
                    },
                );
                match r {
                    Err(e)
                        if e.kind() == io::ErrorKind::ResourceBusy
                            && std::time::Instant::now() < deadline =>
                    {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    r => return r,
                }
            }
        };
        let sock = match c.zero_copy {
            ZeroCopy::Off => bind(false)?,
            ZeroCopy::Require => bind(true)?,
            ZeroCopy::Auto => match bind(true) {
                Ok(s) => s,
                // EOPNOTSUPP (veth, generic-only drivers) or EINVAL: no zero-copy here.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Unsupported | io::ErrorKind::InvalidInput
                    ) =>
                {
                    bind(false)?
                }
                Err(e) => return Err(e),
            },
        };
        // A zero-copy driver may ignore the checksum request (its support is advertised
        // per device, not checked here): offload only in copy mode. The metadata room stays
        // reserved either way, as the kernel checks it on every descriptor.
        let offload = tx_metadata_len > 0 && !sock.is_zero_copy();
        if c.tx_checksum == TxChecksumOffload::On && !offload {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "TX checksum offload: not available in zero-copy mode",
            ));
        }

        let steering = match steering {
            Some(st) => st,
            None => Steering::attach_with_frags(
                ifindex,
                &c.filter,
                c.queue + 1,
                c.mode,
                c.force_replace,
                c.multi_buffer,
            )?,
        };
        steering.program().set_socket(c.queue, sock.fd())?;

        let chunk = u64::from(c.chunk.bytes());
        // RX buffer layout. Single-buffer: one aligned chunk each. Multi-buffer (unaligned
        // UMEM) in copy mode: buffer `i` starts at `i * (chunk - 256)`, so its data area
        // (after the 256-byte XDP headroom) begins exactly where buffer `i - 1`'s ends and a
        // descriptor chain filling consecutive buffers is one contiguous frame the stack can
        // read in place. The overlap is only ever headroom, which the kernel's copy path
        // leaves alone (it copies packet data only; our program adds no metadata). In
        // zero-copy mode a driver may use the headroom (e.g. for an xdp_frame), so there
        // buffers do not overlap. All buffers end inside the RX area of `rx_frames` chunks.
        let rx_stride = if c.multi_buffer && !sock.is_zero_copy() {
            chunk - u64::from(XDP_PACKET_HEADROOM)
        } else {
            chunk
        };
        let rx_free: VecDeque<u64> = (0..u64::from(c.rx_frames)).map(|i| i * rx_stride).collect();
        let tx_slabs = TxSlabs::new(
            umem.frame_addr(c.rx_frames),
            chunk,
            tx_slab_count,
            tx_per_slab,
        );
        let max_frame = c.chunk.max_frame_size();
        let largest = if c.multi_buffer {
            max_frame * MAX_CHAIN
        } else {
            max_frame
        };
        let umem_len = umem.len();
        let mut nic = AfXdpNic {
            steering,
            sock,
            umem,
            rxs: RxState {
                pending: VecDeque::with_capacity(c.rx_batch as usize),
                chain: Vec::with_capacity(MAX_CHAIN),
                chain_len: 0,
                chain_discard: false,
                ret: RxReturn {
                    free: rx_free,
                    spare: Vec::new(),
                    spare_bufs: Vec::new(),
                },
                batch: c.rx_batch,
                frames: 0,
                bytes: 0,
                dropped: 0,
                chains_in_place: 0,
                chains_copied: 0,
            },
            txs: TxState {
                slabs: tx_slabs,
                batch: c.tx_batch,
                frames: 0,
                bytes: 0,
                dropped: 0,
                scratch: Vec::new(),
                meta_len: tx_metadata_len as usize,
                offload,
                withhold_meta: false,
                offloaded: 0,
            },
            chunk_mask: !(chunk - 1),
            max_frame,
            mtu: largest.min(l3_mtu + 14),
            multi_buffer: c.multi_buffer,
            rx_total: c.rx_frames,
            unaligned: c.multi_buffer,
            umem_len: umem_len as u64,
            mac,
            checksum: config.checksum.clone(),
            ifname: config.ifname.clone(),
        };
        nic.refill();
        super::caps::Opened {
            ifname: &c.ifname,
            queue: c.queue,
            zero_copy: nic.is_zero_copy(),
            native: nic.is_native(),
            multi_buffer: c.multi_buffer,
            tx_checksum_offload: offload,
            max_frame: nic.mtu,
        }
        .log();
        Ok(nic)
    }

    /// Largest Ethernet frame (without FCS) this NIC can receive: chunk − 256. The stack
    /// must keep its MTU at or below this (smoltcp's Ethernet "MTU" includes the header).
    pub fn max_frame_size(&self) -> usize {
        self.max_frame
    }

    /// `true` if TCP/UDP TX checksums are left to the kernel through AF_XDP TX metadata
    /// (see [`TxChecksumOffload`]); smoltcp then sees no TX checksum capability for them.
    pub fn tx_checksum_offload(&self) -> bool {
        self.txs.offload
    }

    /// Frames sent so far with a TX checksum request (TCP/UDP frames while offload is
    /// active; ARP, ICMP and fragments keep their software checksums and are not counted).
    pub fn tx_checksum_offloaded_frames(&self) -> u64 {
        self.txs.offloaded
    }

    /// Test hook (negative control): keep preparing TCP/UDP frames for offload (the
    /// checksum field holds only the pseudo-header sum) but do not set `XDP_TX_METADATA`,
    /// so the kernel never completes the checksum and a verifying receiver drops the
    /// frames. Never useful outside tests.
    #[doc(hidden)]
    pub fn set_tx_metadata_withheld(&mut self, withhold: bool) {
        self.txs.withhold_meta = withhold;
    }

    /// The interface's MAC address (the engine answers ARP/NDP with it).
    pub fn mac_address(&self) -> [u8; 6] {
        self.mac
    }

    /// `true` if the XDP program runs in native (driver) mode.
    pub fn is_native(&self) -> bool {
        self.steering.link().is_native()
    }

    /// `true` if the socket is bound in zero-copy mode.
    pub fn is_zero_copy(&self) -> bool {
        self.sock.is_zero_copy()
    }

    /// Id of the attached steering program (as `ip link` shows it).
    pub fn program_id(&self) -> u32 {
        self.steering.program().id()
    }

    /// The loaded steering program (e.g. to test-run frames against it).
    pub fn program(&self) -> &XdpProgram {
        self.steering.program()
    }

    /// The shared steering attachment (clone it for [`AfXdpNic::open_shared`]).
    pub fn steering(&self) -> &Arc<Steering> {
        &self.steering
    }

    /// A one-line snapshot of the rings and free lists, for diagnosing stalls.
    pub fn ring_snapshot(&mut self) -> String {
        format!(
            "tx_chunks_in_use {} tx_ring_free {} tx_unpublished {} tx_kernel_pending {} tx_needs_wakeup {} completion_avail {} rx_free_chunks {} rx_pending {} rx_avail {} chain {:?}",
            self.txs.slabs.in_use(),
            self.sock.tx.free(u32::MAX),
            self.sock.tx.unpublished(),
            self.sock.tx.kernel_pending(),
            self.sock.tx.needs_wakeup(),
            self.sock.completion.available(u32::MAX),
            self.rxs.ret.free.len(),
            self.rxs.pending.len(),
            self.sock.rx.available(u32::MAX),
            self.rxs.chain_len,
        )
    }

    /// How many received chains were read in place or copied.
    pub fn rx_chain_stats(&self) -> RxChainStats {
        RxChainStats {
            in_place: self.rxs.chains_in_place,
            copied: self.rxs.chains_copied,
        }
    }

    /// Where the UMEM chunks are (reclaims completed TX chunks first).
    pub fn chunk_counts(&mut self) -> ChunkCounts {
        reclaim(&mut self.sock, &mut self.txs);
        let held: usize = self
            .rxs
            .pending
            .iter()
            .map(|f| match f {
                RxFrame::Single { .. } => 1,
                RxFrame::Chain { bufs, .. } => bufs.len(),
            })
            .sum::<usize>()
            + self.rxs.chain.len();
        let rx_idle = self.sock.fill.outstanding() as usize + self.rxs.ret.free.len() + held;
        ChunkCounts {
            rx_total: self.rx_total,
            rx_idle: rx_idle as u32,
            tx_total: self.txs.slabs.capacity(),
            tx_idle: self.txs.slabs.capacity() - self.txs.slabs.in_use(),
            tx_stray: self.txs.slabs.stray(),
        }
    }

    /// The kernel's counters for this socket.
    pub fn xdp_statistics(&self) -> io::Result<XdpStatistics> {
        self.sock.statistics()
    }

    /// Put free RX chunks back on the fill ring; wake the driver if it asks.
    fn refill(&mut self) {
        let fill = &mut self.sock.fill;
        let free = &mut self.rxs.ret.free;
        let n = fill.free(free.len() as u32) as usize;
        let n = n.min(free.len());
        if n == 0 {
            return;
        }
        for _ in 0..n {
            if let Some(addr) = free.pop_front() {
                if !fill.push(addr) {
                    free.push_front(addr);
                    break;
                }
            }
        }
        fill.submit();
        if self.sock.uses_need_wakeup() && self.sock.fill.needs_wakeup() {
            self.sock.kick_rx();
        }
    }

    /// Buffer (fill-ring) address and UMEM data offset of an RX descriptor address.
    fn split_rx_addr(&self, addr: u64) -> (u64, u64) {
        if self.unaligned {
            let buf = addr & UNALIGNED_ADDR_MASK;
            (buf, buf + (addr >> UNALIGNED_OFFSET_SHIFT))
        } else {
            (addr & self.chunk_mask, addr)
        }
    }

    /// Move up to `rx_batch` descriptors from the RX ring to the pending queue. A
    /// descriptor chain (multi-buffer) whose data areas are contiguous in the UMEM is handed
    /// to the stack in place; any other chain is copied into one buffer.
    ///
    /// Contiguity comes from the RX layout of a copy-mode multi-buffer NIC (see
    /// `open_inner`): buffers overlap so that each one's data area starts where the
    /// previous one's ends, they go on the fill ring in address order, the kernel takes them
    /// in ring order, and the stack consumes frames (and so frees buffers) in arrival order.
    /// Nothing here relies on that: every chain is checked.
    fn pull_rx(&mut self) {
        let n = self.sock.rx.available(self.rxs.batch);
        for i in 0..n {
            let d = self.sock.rx.read(i);
            let more = d.options & libc::XDP_PKT_CONTD != 0;
            let len = d.len as usize;
            let (buf, data) = self.split_rx_addr(d.addr);
            let rxs = &mut self.rxs;
            if len > self.max_frame
                || (more && !self.multi_buffer)
                || data.saturating_add(len as u64) > self.umem_len
            {
                // A chain without XDP_USE_SG is never expected; a descriptor longer than
                // a chunk (or outside the UMEM) is invalid. Drop the frame (and the rest of
                // its chain).
                rxs.ret.free.push_back(buf);
                rxs.ret.free.extend(rxs.chain.drain(..).map(|p| p.buf));
                rxs.chain_len = 0;
                rxs.chain_discard = more;
                rxs.dropped += 1;
                continue;
            }
            if rxs.chain_discard {
                rxs.ret.free.push_back(buf);
                rxs.chain_discard = more;
                continue;
            }
            if rxs.chain.is_empty() && !more {
                rxs.pending.push_back(RxFrame::Single {
                    buf,
                    data,
                    len: d.len,
                });
                continue;
            }
            if rxs.chain_len + len > self.mtu {
                // Larger than any frame we accept: drop the whole chain.
                rxs.ret.free.extend(rxs.chain.drain(..).map(|p| p.buf));
                rxs.ret.free.push_back(buf);
                rxs.chain_len = 0;
                rxs.chain_discard = more;
                rxs.dropped += 1;
                continue;
            }
            rxs.chain.push(RxPiece {
                buf,
                data,
                len: d.len,
            });
            rxs.chain_len += len;
            if !more {
                self.finish_chain();
            }
        }
        self.sock.rx.release(n);
    }

    /// The last descriptor of `rxs.chain` arrived: queue the frame, in place if its pieces
    /// are contiguous, else copied.
    fn finish_chain(&mut self) {
        let base = self.umem.base();
        let rxs = &mut self.rxs;
        let contiguous = rxs
            .chain
            .windows(2)
            .all(|w| w[0].data + u64::from(w[0].len) == w[1].data);
        let mut bufs = rxs.ret.spare_bufs.pop().unwrap_or_default();
        bufs.clear();
        bufs.extend(rxs.chain.iter().map(|p| p.buf));
        let copy = if contiguous {
            rxs.chains_in_place += 1;
            None
        } else {
            rxs.chains_copied += 1;
            let mut c = rxs.ret.spare.pop().unwrap_or_default();
            c.clear();
            for p in &rxs.chain {
                // SAFETY: `p.data..p.data + p.len` lies inside the UMEM (checked in
                // `pull_rx`) in a buffer the kernel filled and handed to us; it stays ours
                // (listed in `bufs`) until the frame is consumed.
                let piece = unsafe {
                    std::slice::from_raw_parts(base.add(p.data as usize), p.len as usize)
                };
                c.extend_from_slice(piece);
            }
            Some(c)
        };
        rxs.pending.push_back(RxFrame::Chain {
            data: rxs.chain[0].data,
            len: rxs.chain_len,
            bufs,
            copy,
        });
        rxs.chain.clear();
        rxs.chain_len = 0;
    }
}

/// Reclaim completed TX chunks.
fn reclaim(sock: &mut XskSocket, txs: &mut TxState) {
    let n = sock.completion.available(u32::MAX);
    for i in 0..n {
        txs.slabs.complete(sock.completion.read(i));
    }
    sock.completion.release(n);
}

/// Publish queued TX descriptors and kick until the kernel has taken them all (copy mode
/// moves at most 32 per `sendto`), reclaiming completions on the way so they never fill up.
/// Every chain is pushed whole before a publish, so the kernel never sees part of one.
fn drive_tx(sock: &mut XskSocket, txs: &mut TxState) -> io::Result<()> {
    if sock.tx.unpublished() > 0 {
        sock.tx.submit();
    }
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    let limit = sock.tx.size() / 32 + 64;
    for _ in 0..limit {
        reclaim(sock, txs);
        if !sock.tx.kernel_pending() {
            break;
        }
        if sock.uses_need_wakeup() && !sock.tx.needs_wakeup() {
            // The driver drains the ring on its own (zero-copy without need_wakeup set).
            break;
        }
        sock.kick_tx()?;
    }
    reclaim(sock, txs);
    Ok(())
}

/// Receive token: a received frame lent to the stack (in place in the UMEM, or a copied
/// chain); its RX buffers go back to the fill pool, in arrival order, when it is dropped.
pub struct RxToken<'a> {
    /// Start of the frame in the UMEM (unused for a copied chain).
    data: *const u8,
    len: usize,
    /// `Some` until `Drop` gives it back.
    frame: Option<RxFrame>,
    ret: &'a mut RxReturn,
}

impl phy::RxToken for RxToken<'_> {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        if let Some(RxFrame::Chain { copy: Some(c), .. }) = &self.frame {
            return f(c);
        }
        // SAFETY: `data..data+len` lies inside the UMEM (bounds checked in `pull_rx`) and
        // is the data the kernel wrote into the buffers this token holds: one buffer, or a
        // chain whose data areas were checked to be contiguous (`finish_chain`). The
        // buffers are ours until `Drop` puts them back on the free list, so the kernel does
        // not write them meanwhile; the data areas of distinct RX buffers never overlap
        // (overlapping layouts only share a buffer's headroom, which copy mode does not
        // write: our steering program adds no metadata); the UMEM outlives the borrow `'a`.
        let frame = unsafe { std::slice::from_raw_parts(self.data, self.len) };
        f(frame)
    }
}

impl Drop for RxToken<'_> {
    fn drop(&mut self) {
        if let Some(frame) = self.frame.take() {
            self.ret.give_back(frame);
        }
    }
}

/// Transmit token: the stack writes straight into UMEM: one chunk, or (multi-buffer) a run
/// of consecutive chunks sent as a descriptor chain.
pub struct TxToken<'a> {
    sock: &'a mut XskSocket,
    txs: &'a mut TxState,
    umem: *mut u8,
    max_frame: usize,
    /// Largest frame: `max_frame`, or up to [`MAX_CHAIN`] chunks with multi-buffer.
    largest: usize,
}

impl TxState {
    /// Count a frame that cannot be sent; the stack still builds it (into `scratch`).
    fn drop_frame<R>(&mut self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
        self.dropped += 1;
        self.scratch.resize(len, 0);
        f(&mut self.scratch[..len])
    }
}

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        let TxToken {
            sock,
            txs,
            umem,
            max_frame,
            largest,
        } = self;
        // A frame up to `max_frame` takes one chunk; a larger one a run of `k` consecutive
        // chunks, one descriptor per chunk. The frame starts `meta` bytes into its first
        // chunk (TX metadata, 0 without offload) and is cut into pieces of `chunk - meta`
        // bytes: the kernel checks `len + tx_metadata_len <= chunk` on every descriptor.
        // The pieces are contiguous and end inside the run (`meta + k * (chunk - meta) <=
        // k * chunk`); one completion per descriptor keeps the slab count exact.
        let chunk = txs.slabs.chunk_bytes() as usize;
        let meta = txs.meta_len;
        let piece_max = chunk - meta;
        let k = if len <= max_frame {
            1
        } else if len <= largest && len.div_ceil(piece_max) <= MAX_CHAIN {
            len.div_ceil(piece_max)
        } else {
            // Oversized: the stack never asks for more than the MTU; drop and count.
            return txs.drop_frame(len, f);
        };
        let k32 = k as u32;
        if !txs.slabs.can_alloc(k32) || (sock.tx.free(k32) as usize) < k {
            let _ = drive_tx(sock, txs);
        }
        if (sock.tx.free(k32) as usize) < k {
            // No ring slots for the whole chain: drop and count.
            return txs.drop_frame(len, f);
        }
        let Some(addr) = txs.slabs.alloc(k32) else {
            // No run of free chunks: drop and count.
            return txs.drop_frame(len, f);
        };
        let frame = addr + meta as u64;
        // SAFETY: `addr..addr + k * chunk` are `k` consecutive TX chunks just handed out by
        // the allocator (inside the UMEM, on no ring, lent to nobody else until their
        // completions come back), `meta + len <= k * chunk` (`k = 1`: `len <= max_frame =
        // chunk - 256` and `meta < 256`; else `len <= k * (chunk - meta)`), and the UMEM
        // outlives this token.
        let buf = unsafe { std::slice::from_raw_parts_mut(umem.add(frame as usize), len) };
        let r = f(buf);
        let mut first_options = 0;
        if txs.offload {
            if let Some(req) = txcsum::prepare(buf) {
                let md = txcsum::metadata_bytes(req);
                // SAFETY: `addr..addr + meta` is the start of the first chunk of the run
                // handed out above (`meta == md.len()` when offloading), in front of the
                // frame, not overlapping `buf` (no longer used); the kernel reads it only
                // after the descriptor is published below.
                unsafe {
                    std::ptr::copy_nonoverlapping(md.as_ptr(), umem.add(addr as usize), md.len())
                };
                if !txs.withhold_meta {
                    first_options = libc::XDP_TX_METADATA;
                }
                txs.offloaded += 1;
            }
        }
        let mut off = 0usize;
        for i in 0..k {
            let piece = (len - off).min(piece_max);
            let mut options = if i + 1 < k { libc::XDP_PKT_CONTD } else { 0 };
            if i == 0 {
                options |= first_options;
            }
            let pushed = sock.tx.push(libc::xdp_desc {
                addr: frame + off as u64,
                len: piece as u32,
                options,
            });
            debug_assert!(pushed, "k slots checked above");
            off += piece;
        }
        txs.frames += 1;
        txs.bytes += len as u64;
        if sock.tx.unpublished() >= txs.batch {
            if let Err(_e) = drive_tx(sock, txs) {
                txs.dropped += 1;
            }
        }
        r
    }
}

impl phy::Device for AfXdpNic {
    type RxToken<'a> = RxToken<'a>;
    type TxToken<'a> = TxToken<'a>;

    fn receive(&mut self, _timestamp: Instant) -> Option<(RxToken<'_>, TxToken<'_>)> {
        if self.rxs.pending.is_empty() {
            self.refill();
            self.pull_rx();
        }
        let frame = self.rxs.pending.pop_front()?;
        self.rxs.frames += 1;
        let base = self.umem.base();
        let (data, len) = match &frame {
            RxFrame::Single { data, len, .. } => (*data, *len as usize),
            RxFrame::Chain { data, len, .. } => (*data, *len),
        };
        self.rxs.bytes += len as u64;
        // SAFETY: `data` is an offset inside the UMEM (`data + len <= umem_len`, checked in
        // `pull_rx`); the pointer is only read through in `RxToken::consume`.
        let data = unsafe { base.add(data as usize) };
        let rx = RxToken {
            data,
            len,
            frame: Some(frame),
            ret: &mut self.rxs.ret,
        };
        Some((
            rx,
            TxToken {
                sock: &mut self.sock,
                txs: &mut self.txs,
                umem: base,
                max_frame: self.max_frame,
                largest: self.mtu,
            },
        ))
    }

    fn transmit(&mut self, _timestamp: Instant) -> Option<TxToken<'_>> {
        if !self.txs.slabs.can_alloc(1) || self.sock.tx.free(1) == 0 {
            let _ = drive_tx(&mut self.sock, &mut self.txs);
            if !self.txs.slabs.can_alloc(1) || self.sock.tx.free(1) == 0 {
                return None;
            }
        }
        Some(TxToken {
            sock: &mut self.sock,
            txs: &mut self.txs,
            umem: self.umem.base(),
            max_frame: self.max_frame,
            largest: self.mtu,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.mtu;
        caps.max_burst_size = None;
        caps.checksum = self.checksum.clone();
        if self.txs.offload {
            caps.checksum.tcp = rx_only(caps.checksum.tcp);
            caps.checksum.udp = rx_only(caps.checksum.udp);
        }
        caps
    }
}

/// `c` without its TX half (the kernel fills that checksum).
fn rx_only(c: Checksum) -> Checksum {
    if c.rx() {
        Checksum::Rx
    } else {
        Checksum::None
    }
}

impl Backend for AfXdpNic {
    fn flush(&mut self) -> io::Result<()> {
        drive_tx(&mut self.sock, &mut self.txs)
    }

    fn poll_rx(&mut self) -> io::Result<bool> {
        self.refill();
        if self.rxs.pending.is_empty() {
            self.pull_rx();
        }
        reclaim(&mut self.sock, &mut self.txs);
        Ok(!self.rxs.pending.is_empty())
    }

    fn wait_fd(&self) -> Option<RawFd> {
        Some(self.sock.fd())
    }

    fn prepare_sleep(&mut self) -> io::Result<bool> {
        self.flush()?;
        self.refill();
        if !self.rxs.pending.is_empty() {
            return Ok(false);
        }
        // Anything that landed while we were deciding to sleep?
        Ok(self.sock.rx.available(1) == 0)
    }

    fn stats(&self) -> BackendStats {
        let k = self.sock.statistics().unwrap_or_default();
        BackendStats {
            rx_frames: self.rxs.frames,
            rx_bytes: self.rxs.bytes,
            tx_frames: self.txs.frames,
            tx_bytes: self.txs.bytes,
            dropped: self.rxs.dropped
                + self.txs.dropped
                + k.rx_dropped
                + k.rx_ring_full
                + k.rx_invalid_descs
                + k.tx_invalid_descs,
        }
    }

    fn telemetry(&self) -> xwarp_telemetry::NicCounters {
        telemetry::counters(self)
    }

    fn interface_label(&self) -> String {
        format!("{} q{}", self.ifname, self.sock.queue())
    }
}

impl Drop for AfXdpNic {
    fn drop(&mut self) {
        // Stop steering to this socket before it closes; the program detaches when the last
        // NIC sharing it drops (first field).
        let _ = self.steering.program().clear_socket(self.sock.queue());
    }
}
