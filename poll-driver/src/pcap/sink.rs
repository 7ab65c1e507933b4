//! The capture file ([`PcapSink`]) and one engine's interface in it ([`Capture`]).
//!
//! Engine threads never write to the file. A frame is encoded into a bounded in-memory
//! buffer ([`BUFFER_BYTES`]) under a short lock; a writer thread of the sink swaps that
//! buffer out and writes it to the file every [`WRITE_EVERY`] (sooner when it is half
//! full). A frame that does not fit is dropped and counted (the engine is never held up
//! by a slow disk). The first write error (disk full, file gone) stops the capture: it is
//! reported once on stderr and kept ([`PcapSink::error`]); later frames are refused
//! without touching the buffer. Memory per sink: at most two buffers of
//! [`BUFFER_BYTES`].

use std::cell::Cell;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Once, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use parking_lot::{Condvar, Mutex};

use super::format::{self, Direction, InterfaceCounts, PcapFormat, TsPrecision, SNAPLEN};

/// Bytes of encoded frames a sink holds before the writer thread has written them; a
/// frame that does not fit is dropped (counted in [`PcapSink::dropped`]).
pub const BUFFER_BYTES: usize = 4 << 20;
/// How often the writer thread writes the buffer to the file (sooner when half full).
pub const WRITE_EVERY: Duration = Duration::from_millis(50);

/// How a sink writes its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkConfig {
    /// File format.
    pub format: PcapFormat,
    /// Timestamp resolution.
    pub precision: TsPrecision,
    /// Longest part of a frame recorded (the original length is kept).
    pub snaplen: u32,
}

impl SinkConfig {
    /// The format `path`'s extension asks for ([`PcapFormat::from_path`]), the full
    /// [`SNAPLEN`].
    pub fn for_path(path: &Path, precision: TsPrecision) -> SinkConfig {
        SinkConfig {
            format: PcapFormat::from_path(path),
            precision,
            snaplen: SNAPLEN,
        }
    }
}

/// Report a capture problem to the user (the one place the capture code reports): a
/// warning record of the `log` facade, which the CLI's, the tools' and the shim's loggers
/// show by default (`XWARP_LOG`).
pub(crate) fn report(msg: &str) {
    log::warn!("{msg}");
}

/// Print a capture problem on stderr, once per distinct message in this process (at
/// most 64 remembered): how engines report a capture they could not open.
pub fn report_once(msg: &str) {
    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut seen = SEEN.lock();
    if seen.iter().any(|m| m == msg) {
        return;
    }
    if seen.len() < 64 {
        seen.push(msg.to_owned());
    }
    drop(seen);
    report(msg);
}

struct Pending {
    buf: Vec<u8>,
    closing: bool,
    ifaces: Vec<InterfaceCounts>,
    default_iface: Option<u32>,
}

struct Out {
    file: Option<File>,
    spare: Vec<u8>,
}

struct Shared {
    path: PathBuf,
    config: SinkConfig,
    pid: u32,
    pending: Mutex<Pending>,
    wake: Condvar,
    out: Mutex<Out>,
    stopped: AtomicBool,
    /// The closing statistics (pcapng Interface Statistics Blocks, the drop report) are
    /// written: at drop or at process exit, whichever comes first.
    finished: AtomicBool,
    error: Mutex<Option<String>>,
    frames: AtomicU64,
    dropped: AtomicU64,
}

/// Why a frame was not recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    Stopped,
    Full,
}

impl Shared {
    fn add_interface(&self, name: &str, description: &str) -> u32 {
        let mut p = self.pending.lock();
        let id = p.ifaces.len() as u32;
        p.ifaces.push(InterfaceCounts::default());
        if self.config.format == PcapFormat::PcapNg {
            // Always written, even past the bound: packets will refer to it.
            let (precision, snaplen) = (self.config.precision, self.config.snaplen);
            format::pcapng_interface(&mut p.buf, name, description, precision, snaplen);
        }
        id
    }

    fn append(&self, iface: u32, dir: Direction, frame: &[u8]) -> Result<(), Refused> {
        if self.stopped.load(Ordering::Relaxed) {
            return Err(Refused::Stopped);
        }
        let ts = SystemTime::now();
        let c = &self.config;
        let need = match c.format {
            PcapFormat::Pcap => format::pcap_record_len(c.snaplen, frame.len()),
            PcapFormat::PcapNg => format::pcapng_packet_len(c.snaplen, frame.len(), dir),
        };
        let mut p = self.pending.lock();
        let Pending { buf, ifaces, .. } = &mut *p;
        let counts = &mut ifaces[iface as usize];
        counts.offered += 1;
        if buf.len() + need > BUFFER_BYTES {
            counts.dropped += 1;
            drop(p);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            self.wake.notify_one();
            return Err(Refused::Full);
        }
        match c.format {
            PcapFormat::Pcap => format::pcap_record(buf, c.precision, c.snaplen, ts, frame),
            PcapFormat::PcapNg => {
                format::pcapng_packet(buf, iface, c.precision, c.snaplen, ts, dir, frame)
            }
        }
        counts.written += 1;
        let half = buf.len() >= BUFFER_BYTES / 2;
        drop(p);
        self.frames.fetch_add(1, Ordering::Relaxed);
        if half {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Write what is buffered to the file (the file lock is held across the swap, so
    /// concurrent drains keep the order).
    fn drain(&self) {
        self.drain_out(self.out.lock());
    }

    /// [`Shared::drain`], giving up after `wait` if the file is busy (the writer thread
    /// stuck writing to a stalled pipe or FIFO): for process exit, which must not hang.
    /// Returns whether it drained.
    fn drain_within(&self, wait: Duration) -> bool {
        match self.out.try_lock_for(wait) {
            Some(out) => {
                self.drain_out(out);
                true
            }
            None => false,
        }
    }

    fn drain_out(&self, mut out: parking_lot::MutexGuard<'_, Out>) {
        let Out { file, spare } = &mut *out;
        {
            let mut p = self.pending.lock();
            if file.is_none() {
                p.buf = Vec::new();
                return;
            }
            if p.buf.is_empty() {
                return;
            }
            std::mem::swap(&mut p.buf, spare);
        }
        let r = file.as_mut().map_or(Ok(()), |f| f.write_all(spare));
        spare.clear();
        if let Err(e) = r {
            *file = None;
            *spare = Vec::new();
            drop(out);
            self.fail(&format!("cannot write {}: {e}", self.path.display()));
        }
    }

    /// Stop the capture after an error: report it once, refuse further frames.
    fn fail(&self, msg: &str) {
        if self.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        *self.error.lock() = Some(msg.to_owned());
        self.pending.lock().buf = Vec::new();
        report(&format!(
            "xwarp: capture stopped: {msg} (the engine goes on without capture)"
        ));
    }

    /// Append the closing statistics once (pcapng: an Interface Statistics Block per
    /// interface with what was offered, written and dropped). `wait`: how long to wait
    /// for the buffer lock (`None`: as long as it takes). Returns whether this call wrote
    /// them.
    fn write_final_stats(&self, wait: Option<Duration>) -> bool {
        let mut p = match wait {
            None => self.pending.lock(),
            Some(w) => match self.pending.try_lock_for(w) {
                Some(p) => p,
                None => return false,
            },
        };
        if self.finished.swap(true, Ordering::SeqCst) {
            return false;
        }
        if self.config.format == PcapFormat::PcapNg && !self.stopped.load(Ordering::SeqCst) {
            let now = SystemTime::now();
            let Pending { buf, ifaces, .. } = &mut *p;
            for (i, c) in ifaces.iter().enumerate() {
                format::pcapng_interface_stats(buf, i as u32, self.config.precision, now, *c);
            }
        }
        true
    }

    /// Say how many frames were dropped, if any were (after the final drain).
    fn report_drops(&self) {
        let dropped = self.dropped.load(Ordering::Relaxed);
        if dropped > 0 && !self.stopped.load(Ordering::SeqCst) {
            report(&format!(
                "xwarp: capture {}: {} frames written, {dropped} dropped (the capture buffer was full: the disk did not keep up)",
                self.path.display(),
                self.frames.load(Ordering::Relaxed)
            ));
        }
    }

    fn writer_loop(&self) {
        loop {
            let closing = {
                let mut p = self.pending.lock();
                if !p.closing && p.buf.len() < BUFFER_BYTES / 2 {
                    self.wake.wait_for(&mut p, WRITE_EVERY);
                }
                p.closing
            };
            self.drain();
            if closing {
                return;
            }
        }
    }
}

/// The sink's writer thread, stopped and joined when the last [`PcapSink`] goes.
struct SinkHandle {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for SinkHandle {
    fn drop(&mut self) {
        let s = &self.shared;
        if std::process::id() != s.pid {
            // A forked child's copy: the writer thread lives in the parent only.
            if let Some(t) = self.thread.take() {
                std::mem::forget(t);
            }
            return;
        }
        let first = s.write_final_stats(None);
        s.pending.lock().closing = true;
        s.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        s.drain();
        if first {
            s.report_drops();
        }
    }
}

/// Spawn the `xwarp-pcap` writer thread with every signal blocked (it inherits the mask
/// of the spawning thread, restored right after): a write to a closed pipe then fails with
/// `EPIPE` (the capture's error path) instead of raising `SIGPIPE`, and the application's
/// signal handlers never run on this thread.
fn spawn_signals_blocked(f: impl FnOnce() + Send + 'static) -> io::Result<JoinHandle<()>> {
    // SAFETY: sigset_t is plain data; sigfillset initializes it fully before use.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `all` is a valid sigset_t owned by this frame.
    unsafe { libc::sigfillset(&mut all) };
    // SAFETY: valid pointers to sigsets on this frame; only this thread's mask changes.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old) };
    let spawned = std::thread::Builder::new()
        .name("xwarp-pcap".into())
        .spawn(f);
    if rc == 0 {
        // SAFETY: restores exactly the mask saved above, on the same thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    }
    spawned
}

fn registry() -> &'static Mutex<Vec<Weak<SinkHandle>>> {
    static REG: OnceLock<Mutex<Vec<Weak<SinkHandle>>>> = OnceLock::new();
    REG.get_or_init(|| Mutex::new(Vec::new()))
}

extern "C" fn flush_at_exit() {
    flush_all();
}

/// Finish every live capture of this process now: append its closing statistics
/// (pcapng Interface Statistics Blocks, once per sink) and write what is buffered,
/// waiting at most 200 ms per lock so a writer stuck on a stalled pipe cannot hang the
/// exit. Registered with `atexit` when the first sink is created, so a process that
/// exits with its engine still running (the LD_PRELOAD shim's) keeps its last frames and
/// its drop counts. Frames recorded afterwards are still written while the sink lives.
pub fn flush_all() {
    let Some(reg) = registry().try_lock_for(Duration::from_millis(200)) else {
        return;
    };
    let live: Vec<Arc<SinkHandle>> = reg.iter().filter_map(Weak::upgrade).collect();
    drop(reg);
    let pid = std::process::id();
    let wait = Duration::from_millis(200);
    for h in live.iter().filter(|h| h.shared.pid == pid) {
        let first = h.shared.write_final_stats(Some(wait));
        if h.shared.drain_within(wait) && first {
            h.shared.report_drops();
        }
    }
}

/// The files being captured to by this process.
pub fn active_captures() -> Vec<PathBuf> {
    let pid = std::process::id();
    registry()
        .lock()
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|h| h.shared.pid == pid)
        .map(|h| h.shared.path.clone())
        .collect()
}

/// A capture file shared by any number of [`Capture`]s (on any threads).
#[derive(Clone)]
pub struct PcapSink {
    inner: Arc<SinkHandle>,
}

impl std::fmt::Debug for PcapSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcapSink")
            .field("path", &self.inner.shared.path)
            .field("config", &self.inner.shared.config)
            .finish()
    }
}

impl PcapSink {
    /// Create (truncate) the capture file at `path` in the format its extension names
    /// ([`PcapFormat::from_path`]), or join the sink already writing it in this process.
    pub fn create(path: impl AsRef<Path>, precision: TsPrecision) -> io::Result<Self> {
        let config = SinkConfig::for_path(path.as_ref(), precision);
        Self::create_with(path, config)
    }

    /// Create (truncate) the capture file at `path` written as `config` says, or join the
    /// sink already writing it in this process (whose settings then apply). An error
    /// names the path.
    pub fn create_with(path: impl AsRef<Path>, config: SinkConfig) -> io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        if config.snaplen == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "capture snap length must be at least 1",
            ));
        }
        let pid = std::process::id();
        let mut reg = registry().lock();
        reg.retain(|w| w.strong_count() > 0);
        if let Some(inner) = reg
            .iter()
            .filter_map(Weak::upgrade)
            .find(|h| h.shared.path == path && h.shared.pid == pid)
        {
            return Ok(Self { inner });
        }
        let file = File::create(&path).map_err(|e| {
            io::Error::new(e.kind(), format!("capture file {}: {e}", path.display()))
        })?;
        let mut buf = Vec::new();
        match config.format {
            PcapFormat::Pcap => {
                format::pcap_file_header(&mut buf, config.precision, config.snaplen)
            }
            PcapFormat::PcapNg => format::pcapng_section_header(
                &mut buf,
                concat!("xwarp ", env!("CARGO_PKG_VERSION")),
            ),
        }
        let shared = Arc::new(Shared {
            path: path.clone(),
            config,
            pid,
            pending: Mutex::new(Pending {
                buf,
                closing: false,
                ifaces: Vec::new(),
                default_iface: None,
            }),
            wake: Condvar::new(),
            out: Mutex::new(Out {
                file: Some(file),
                spare: Vec::new(),
            }),
            stopped: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            error: Mutex::new(None),
            frames: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        });
        let s2 = shared.clone();
        let thread = spawn_signals_blocked(move || s2.writer_loop())
            .map_err(|e| io::Error::new(e.kind(), format!("capture writer thread: {e}")))?;
        let inner = Arc::new(SinkHandle {
            shared,
            thread: Some(thread),
        });
        reg.push(Arc::downgrade(&inner));
        drop(reg);
        static AT_EXIT: Once = Once::new();
        AT_EXIT.call_once(|| {
            // SAFETY: registering a plain extern "C" function without arguments.
            unsafe { libc::atexit(flush_at_exit) };
        });
        Ok(Self { inner })
    }

    /// The file this sink writes.
    pub fn path(&self) -> &Path {
        &self.inner.shared.path
    }

    /// How the file is written.
    pub fn config(&self) -> SinkConfig {
        self.inner.shared.config
    }

    /// Frames recorded so far (by all captures sharing the sink).
    pub fn frames(&self) -> u64 {
        self.inner.shared.frames.load(Ordering::Relaxed)
    }

    /// Frames dropped because the buffer was full.
    pub fn dropped(&self) -> u64 {
        self.inner.shared.dropped.load(Ordering::Relaxed)
    }

    /// The error that stopped the capture, if one did.
    pub fn error(&self) -> Option<String> {
        self.inner.shared.error.lock().clone()
    }

    /// Whether the capture stopped after an error.
    pub fn is_stopped(&self) -> bool {
        self.inner.shared.stopped.load(Ordering::SeqCst)
    }

    /// A new interface of this file (pcapng: an Interface Description Block named
    /// `name`, with `description`; classic pcap has a single link and ignores both).
    pub fn interface(&self, name: &str, description: &str) -> Capture {
        let iface = self.inner.shared.add_interface(name, description);
        Capture {
            sink: self.clone(),
            iface,
            recorded: Cell::new(0),
            dropped: Cell::new(0),
            errors: Cell::new(0),
        }
    }

    /// Record one frame now, without a direction, on a default interface named `xwarp`.
    pub fn record(&self, frame: &[u8]) -> io::Result<()> {
        let s = &self.inner.shared;
        let iface = {
            let d = s.pending.lock().default_iface;
            match d {
                Some(i) => i,
                None => {
                    let i = s.add_interface("xwarp", "");
                    s.pending.lock().default_iface = Some(i);
                    i
                }
            }
        };
        match s.append(iface, Direction::Unknown, frame) {
            Ok(()) => Ok(()),
            Err(Refused::Full) => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "capture buffer full: frame dropped",
            )),
            Err(Refused::Stopped) => Err(self.stopped_error()),
        }
    }

    fn stopped_error(&self) -> io::Error {
        io::Error::other(self.error().unwrap_or_else(|| "capture stopped".into()))
    }

    /// Write everything buffered to the file now. Fails if the capture has stopped after
    /// a write error.
    pub fn flush(&self) -> io::Result<()> {
        self.inner.shared.drain();
        if self.is_stopped() {
            return Err(self.stopped_error());
        }
        Ok(())
    }
}

/// Counters of one [`Capture`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TapStats {
    /// Frames recorded.
    pub recorded: u64,
    /// Frames dropped because the capture buffer was full.
    pub dropped: u64,
    /// Frames not recorded because the capture stopped after a write error.
    pub errors: u64,
}

/// One engine's interface in a capture file: what the engine's NIC receives and sends,
/// each frame with its direction (pcapng).
pub struct Capture {
    sink: PcapSink,
    iface: u32,
    recorded: Cell<u64>,
    dropped: Cell<u64>,
    errors: Cell<u64>,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture")
            .field("path", &self.sink.path())
            .field("interface", &self.iface)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Capture {
    /// Record one frame that went `dir`. Never fails: a frame that cannot be recorded is
    /// counted ([`Capture::stats`]).
    pub fn record(&self, dir: Direction, frame: &[u8]) {
        let c = match self.sink.inner.shared.append(self.iface, dir, frame) {
            Ok(()) => &self.recorded,
            Err(Refused::Full) => &self.dropped,
            Err(Refused::Stopped) => &self.errors,
        };
        c.set(c.get() + 1);
    }

    /// This capture's counters.
    pub fn stats(&self) -> TapStats {
        TapStats {
            recorded: self.recorded.get(),
            dropped: self.dropped.get(),
            errors: self.errors.get(),
        }
    }

    /// The file written to.
    pub fn sink(&self) -> &PcapSink {
        &self.sink
    }

    /// The pcapng interface id of this capture.
    pub fn interface_id(&self) -> u32 {
        self.iface
    }
}
