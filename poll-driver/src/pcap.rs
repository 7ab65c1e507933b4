//! Frame capture in classic pcap format (LINKTYPE_ETHERNET), readable by tshark and
//! Wireshark, and [`PcapTap`], a [`Backend`] wrapper that records every frame the stack
//! receives and sends through any backend.
//!
//! ## Enabling capture
//! * In code: [`PcapTap::new`] with a [`PcapSink`] from [`PcapSink::create`].
//! * From the environment: [`PcapTap::from_env`] captures to the file named by
//!   **`XWARP_PCAP=/path/file.pcap`** (unset or empty: no capture, no cost beyond a branch
//!   per frame). `XWARP_PCAP_NS=1` selects nanosecond timestamps (default: microseconds).
//!   Several taps in one process that name the same file share one writer, so a
//!   two-engine test writes one coherent capture containing both directions (each frame
//!   then appears twice: once sent, once received).
//!
//! The file is flushed when an engine is about to sleep ([`Backend::prepare_sleep`]), on
//! [`PcapSink::flush`] and when the last tap is dropped.

use crate::backend::{Backend, BackendStats};
use parking_lot::Mutex;
use smoltcp::phy::{Device, DeviceCapabilities, RxToken, TxToken};
use std::cell::Cell;
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The environment variable naming the capture file for [`PcapTap::from_env`].
pub const PCAP_ENV: &str = "XWARP_PCAP";
/// Set to `1` to make [`PcapTap::from_env`] write nanosecond timestamps.
pub const PCAP_NS_ENV: &str = "XWARP_PCAP_NS";

/// pcap LINKTYPE_ETHERNET.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Largest frame recorded in full; longer frames are truncated to this (and their
/// original length kept in the record header).
pub const SNAPLEN: u32 = 262_144;

/// Timestamp resolution of a capture file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TsPrecision {
    /// Microseconds (magic `0xa1b2c3d4`), understood by every reader.
    #[default]
    Micros,
    /// Nanoseconds (magic `0xa1b23c4d`).
    Nanos,
}

/// A classic pcap writer (little-endian, version 2.4, LINKTYPE_ETHERNET).
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    out: W,
    precision: TsPrecision,
    frames: u64,
}

impl<W: Write> PcapWriter<W> {
    /// Write the global header to `out` and return a writer for records.
    pub fn new(mut out: W, precision: TsPrecision) -> io::Result<Self> {
        let magic: u32 = match precision {
            TsPrecision::Micros => 0xa1b2_c3d4,
            TsPrecision::Nanos => 0xa1b2_3c4d,
        };
        let mut hdr = [0u8; 24];
        hdr[0..4].copy_from_slice(&magic.to_le_bytes());
        hdr[4..6].copy_from_slice(&2u16.to_le_bytes()); // version major
        hdr[6..8].copy_from_slice(&4u16.to_le_bytes()); // version minor
                                                        // thiszone, sigfigs: 0
        hdr[16..20].copy_from_slice(&SNAPLEN.to_le_bytes());
        hdr[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        out.write_all(&hdr)?;
        Ok(Self {
            out,
            precision,
            frames: 0,
        })
    }

    /// Append one frame captured at wall-clock time `ts`. Times before the Unix epoch are
    /// recorded as the epoch.
    pub fn write_frame(&mut self, ts: SystemTime, frame: &[u8]) -> io::Result<()> {
        let since = ts.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = since.as_secs().min(u32::MAX as u64) as u32;
        let frac = match self.precision {
            TsPrecision::Micros => since.subsec_micros(),
            TsPrecision::Nanos => since.subsec_nanos(),
        };
        let orig_len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        let incl_len = orig_len.min(SNAPLEN);
        let mut rec = [0u8; 16];
        rec[0..4].copy_from_slice(&secs.to_le_bytes());
        rec[4..8].copy_from_slice(&frac.to_le_bytes());
        rec[8..12].copy_from_slice(&incl_len.to_le_bytes());
        rec[12..16].copy_from_slice(&orig_len.to_le_bytes());
        self.out.write_all(&rec)?;
        self.out.write_all(&frame[..incl_len as usize])?;
        self.frames += 1;
        Ok(())
    }

    /// Records written so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Flush buffered records to the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Flush and return the underlying writer.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

struct SinkInner {
    writer: Mutex<PcapWriter<BufWriter<File>>>,
    path: PathBuf,
}

impl Drop for SinkInner {
    fn drop(&mut self) {
        // Best effort: nothing to report an error to from a destructor.
        let _ = self.writer.get_mut().flush();
    }
}

/// A capture file shared by any number of taps (on any threads).
#[derive(Clone)]
pub struct PcapSink {
    inner: Arc<SinkInner>,
}

impl std::fmt::Debug for PcapSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcapSink")
            .field("path", &self.inner.path)
            .finish()
    }
}

fn registry() -> &'static Mutex<HashMap<PathBuf, Weak<SinkInner>>> {
    static REG: OnceLock<Mutex<HashMap<PathBuf, Weak<SinkInner>>>> = OnceLock::new();
    REG.get_or_init(|| Mutex::new(HashMap::new()))
}

impl PcapSink {
    /// Create (truncate) the capture file at `path`, or join the sink already writing it
    /// in this process.
    pub fn create(path: impl AsRef<Path>, precision: TsPrecision) -> io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        let mut reg = registry().lock();
        reg.retain(|_, w| w.strong_count() > 0);
        if let Some(inner) = reg.get(&path).and_then(Weak::upgrade) {
            return Ok(Self { inner });
        }
        let file = File::create(&path)?;
        let writer = PcapWriter::new(BufWriter::with_capacity(1 << 16, file), precision)?;
        let inner = Arc::new(SinkInner {
            writer: Mutex::new(writer),
            path: path.clone(),
        });
        reg.insert(path, Arc::downgrade(&inner));
        Ok(Self { inner })
    }

    /// The sink configured by `XWARP_PCAP` / `XWARP_PCAP_NS`, or `None` if capture is off.
    pub fn from_env() -> io::Result<Option<Self>> {
        match std::env::var_os(PCAP_ENV) {
            Some(p) if !p.is_empty() => {
                let ns = std::env::var(PCAP_NS_ENV).is_ok_and(|v| v == "1");
                let precision = if ns {
                    TsPrecision::Nanos
                } else {
                    TsPrecision::Micros
                };
                Self::create(PathBuf::from(p), precision).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The file this sink writes.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Records written so far (by all taps sharing the sink).
    pub fn frames(&self) -> u64 {
        self.inner.writer.lock().frames()
    }

    /// Record one frame now.
    pub fn record(&self, frame: &[u8]) -> io::Result<()> {
        self.inner
            .writer
            .lock()
            .write_frame(SystemTime::now(), frame)
    }

    /// Flush buffered records to the file.
    pub fn flush(&self) -> io::Result<()> {
        self.inner.writer.lock().flush()
    }
}

/// Counters of a [`PcapTap`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TapStats {
    /// Frames recorded.
    pub recorded: u64,
    /// Frames that could not be written (I/O error); capture continues.
    pub errors: u64,
}

/// What both tokens of one `receive` share (immutably).
#[derive(Debug, Default)]
struct TapState {
    sink: Option<PcapSink>,
    recorded: Cell<u64>,
    errors: Cell<u64>,
}

impl TapState {
    fn record(&self, frame: &[u8]) {
        if let Some(sink) = &self.sink {
            let c = match sink.record(frame) {
                Ok(()) => &self.recorded,
                Err(_) => &self.errors,
            };
            c.set(c.get() + 1);
        }
    }
}

/// A [`Backend`] that records every frame received and sent through `B`.
#[derive(Debug)]
pub struct PcapTap<B: Backend> {
    inner: B,
    state: TapState,
}

impl<B: Backend> PcapTap<B> {
    /// Wrap `inner`, recording to `sink` (`None`: pass through without recording).
    pub fn new(inner: B, sink: Option<PcapSink>) -> Self {
        Self {
            inner,
            state: TapState {
                sink,
                ..TapState::default()
            },
        }
    }

    /// Wrap `inner`, recording to the file named by `XWARP_PCAP` if it is set.
    pub fn from_env(inner: B) -> io::Result<Self> {
        Ok(Self::new(inner, PcapSink::from_env()?))
    }

    /// Whether frames are being recorded.
    pub fn is_capturing(&self) -> bool {
        self.state.sink.is_some()
    }

    /// Capture counters.
    pub fn tap_stats(&self) -> TapStats {
        TapStats {
            recorded: self.state.recorded.get(),
            errors: self.state.errors.get(),
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The wrapped backend, mutably.
    pub fn inner_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// Flush the capture and return the wrapped backend.
    pub fn into_inner(self) -> B {
        if let Some(s) = &self.state.sink {
            // Best effort: the backend is still returned if the capture cannot be flushed.
            let _ = s.flush();
        }
        self.inner
    }
}

/// Receive token of a [`PcapTap`].
#[derive(Debug)]
pub struct TapRxToken<'a, T> {
    inner: T,
    state: &'a TapState,
}

impl<T: RxToken> RxToken for TapRxToken<'_, T> {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        let state = self.state;
        self.inner.consume(|frame| {
            state.record(frame);
            f(frame)
        })
    }

    fn meta(&self) -> smoltcp::phy::PacketMeta {
        self.inner.meta()
    }
}

/// Transmit token of a [`PcapTap`].
#[derive(Debug)]
pub struct TapTxToken<'a, T> {
    inner: T,
    state: &'a TapState,
}

impl<T: TxToken> TxToken for TapTxToken<'_, T> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        let state = self.state;
        self.inner.consume(len, |buf| {
            let r = f(buf);
            state.record(buf);
            r
        })
    }

    fn set_meta(&mut self, meta: smoltcp::phy::PacketMeta) {
        self.inner.set_meta(meta)
    }
}

impl<B: Backend> Device for PcapTap<B> {
    type RxToken<'a>
        = TapRxToken<'a, B::RxToken<'a>>
    where
        Self: 'a;
    type TxToken<'a>
        = TapTxToken<'a, B::TxToken<'a>>
    where
        Self: 'a;

    fn receive(
        &mut self,
        timestamp: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let state = &self.state;
        self.inner.receive(timestamp).map(|(rx, tx)| {
            (
                TapRxToken { inner: rx, state },
                TapTxToken { inner: tx, state },
            )
        })
    }

    fn transmit(&mut self, timestamp: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        let state = &self.state;
        self.inner
            .transmit(timestamp)
            .map(|tx| TapTxToken { inner: tx, state })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        self.inner.capabilities()
    }
}

impl<B: Backend> Backend for PcapTap<B> {
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    fn poll_rx(&mut self) -> io::Result<bool> {
        self.inner.poll_rx()
    }

    fn wait_fd(&self) -> Option<RawFd> {
        self.inner.wait_fd()
    }

    fn prepare_sleep(&mut self) -> io::Result<bool> {
        if let Some(s) = &self.state.sink {
            if s.flush().is_err() {
                self.state.errors.set(self.state.errors.get() + 1);
            }
        }
        self.inner.prepare_sleep()
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.inner.next_deadline()
    }

    fn stats(&self) -> BackendStats {
        self.inner.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn global_and_record_headers_follow_the_classic_format() {
        let mut w = PcapWriter::new(Vec::new(), TsPrecision::Nanos).unwrap();
        let ts = UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
        w.write_frame(ts, &[0xaa; 60]).unwrap();
        assert_eq!(w.frames(), 1);
        let b = w.into_inner().unwrap();
        assert_eq!(&b[0..4], &[0x4d, 0x3c, 0xb2, 0xa1]);
        assert_eq!(&b[4..8], &[2, 0, 4, 0]);
        assert_eq!(&b[8..16], &[0; 8]);
        assert_eq!(u32::from_le_bytes(b[16..20].try_into().unwrap()), SNAPLEN);
        assert_eq!(u32::from_le_bytes(b[20..24].try_into().unwrap()), 1);
        let r = &b[24..40];
        assert_eq!(
            u32::from_le_bytes(r[0..4].try_into().unwrap()),
            1_700_000_000
        );
        assert_eq!(u32::from_le_bytes(r[4..8].try_into().unwrap()), 123_456_789);
        assert_eq!(u32::from_le_bytes(r[8..12].try_into().unwrap()), 60);
        assert_eq!(u32::from_le_bytes(r[12..16].try_into().unwrap()), 60);
        assert_eq!(&b[40..], &[0xaa; 60]);

        let mut w = PcapWriter::new(Vec::new(), TsPrecision::Micros).unwrap();
        w.write_frame(ts, &[1, 2, 3]).unwrap();
        let b = w.into_inner().unwrap();
        assert_eq!(&b[0..4], &[0xd4, 0xc3, 0xb2, 0xa1]);
        assert_eq!(u32::from_le_bytes(b[28..32].try_into().unwrap()), 123_456);
    }

    #[test]
    fn oversized_frames_are_truncated_to_snaplen_with_original_length_kept() {
        let mut w = PcapWriter::new(Vec::new(), TsPrecision::Micros).unwrap();
        let big = vec![7u8; SNAPLEN as usize + 10];
        w.write_frame(UNIX_EPOCH, &big).unwrap();
        let b = w.into_inner().unwrap();
        assert_eq!(u32::from_le_bytes(b[32..36].try_into().unwrap()), SNAPLEN);
        assert_eq!(
            u32::from_le_bytes(b[36..40].try_into().unwrap()),
            SNAPLEN + 10
        );
        assert_eq!(b.len(), 24 + 16 + SNAPLEN as usize);
    }
}
