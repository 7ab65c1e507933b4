//! Frame capture readable by tshark and Wireshark: pcapng (one interface per engine, the
//! direction of every packet) or classic pcap (LINKTYPE_ETHERNET).
//!
//! ## Enabling capture
//! * For every engine of a process: **`XWARP_PCAP=/path/file.pcapng`** (read when an
//!   engine is built; unset or empty: no capture, one branch per engine poll), or
//!   [`set_process_capture`] (the tools' `--pcap FILE`), which overrides the variable.
//!   `xwarp-stack`'s engine builder opens the capture of each engine it starts
//!   ([`CaptureSpec::open_engine`]), so the LD_PRELOAD shim, `xwarp::net`, `xwarp::toe`,
//!   `xwarp::verbs`, the benches and the demo all honour it.
//! * The path is a template: `%p` becomes the process id, `%e` the engine's index in the
//!   process; without `%e` engine 0 writes the path as given and engine N ≥ 1 the path with
//!   `-eN` before the extension ([`CaptureSpec`]).
//! * The extension picks the format: `.pcap` classic pcap, anything else (`.pcapng`) pcapng
//!   ([`PcapFormat::from_path`]). `XWARP_PCAP_NS=1` selects nanosecond timestamps (default
//!   microseconds), `XWARP_PCAP_SNAPLEN=N` records only the first N bytes of each frame.
//! * In code: a [`PcapSink`] ([`PcapSink::create`]) and its [`Capture`]s
//!   ([`PcapSink::interface`]); [`PcapTap`] wraps a backend owning one, [`Tapped`] borrows
//!   one for a poll. Sinks naming the same file in one process share one writer (pcapng:
//!   one interface each).
//!
//! ## Cost and failure
//! Frames are encoded into a bounded buffer on the engine thread and written to the file
//! by a writer thread of the sink ([`sink`]): a slow disk drops frames (counted, reported
//! when the capture ends, and in the pcapng Interface Statistics Block) instead of slowing
//! the engine. A write error (disk full, file removed) stops the capture and is reported
//! once on stderr; an engine whose file cannot be created runs without capture after saying
//! so once. Buffered frames reach the file every 50 ms, when the last capture of a file is
//! dropped, and at process exit (`atexit`, [`flush_all`]).

pub mod format;
pub mod sink;
pub mod spec;

pub use format::{Direction, PcapFormat, PcapWriter, TsPrecision, LINKTYPE_ETHERNET, SNAPLEN};
pub use sink::{active_captures, flush_all, Capture, PcapSink, SinkConfig, TapStats};
pub use spec::{set_process_capture, CaptureSpec, PCAP_ENV, PCAP_NS_ENV, PCAP_SNAPLEN_ENV};

use crate::backend::{Backend, BackendStats};
use smoltcp::phy::{Device, DeviceCapabilities, RxToken, TxToken};
use std::io;
use std::os::fd::RawFd;
use std::time::Instant;

/// Receive token of a [`PcapTap`] or [`Tapped`]: records the frame as inbound.
#[derive(Debug)]
pub struct TapRxToken<'a, T> {
    inner: T,
    cap: Option<&'a Capture>,
}

impl<T: RxToken> RxToken for TapRxToken<'_, T> {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        match self.cap {
            None => self.inner.consume(f),
            Some(cap) => self.inner.consume(|frame| {
                cap.record(Direction::Inbound, frame);
                f(frame)
            }),
        }
    }

    fn meta(&self) -> smoltcp::phy::PacketMeta {
        self.inner.meta()
    }
}

/// Transmit token of a [`PcapTap`] or [`Tapped`]: records the frame as outbound.
#[derive(Debug)]
pub struct TapTxToken<'a, T> {
    inner: T,
    cap: Option<&'a Capture>,
}

impl<T: TxToken> TxToken for TapTxToken<'_, T> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        match self.cap {
            None => self.inner.consume(len, f),
            Some(cap) => self.inner.consume(len, |buf| {
                let r = f(buf);
                cap.record(Direction::Outbound, buf);
                r
            }),
        }
    }

    fn set_meta(&mut self, meta: smoltcp::phy::PacketMeta) {
        self.inner.set_meta(meta)
    }
}

fn tokens<'a, R, T>(
    pair: Option<(R, T)>,
    cap: Option<&'a Capture>,
) -> Option<(TapRxToken<'a, R>, TapTxToken<'a, T>)> {
    pair.map(|(rx, tx)| (TapRxToken { inner: rx, cap }, TapTxToken { inner: tx, cap }))
}

/// Implements smoltcp's `Device` and the crate's [`Backend`] for a wrapper that records
/// frames: `$parts` gives the wrapped backend mutably with the capture (if any), `$inner`
/// the backend shared; everything but the tokens forwards to the backend. Written once for
/// [`PcapTap`] (owns both) and [`Tapped`] (borrows both).
macro_rules! tapped_device {
    ($ty:ty, |$m:ident| $parts:expr, |$s:ident| $inner:expr) => {
        impl<B: Backend> Device for $ty {
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
                let $m = self;
                let (inner, cap) = $parts;
                tokens(inner.receive(timestamp), cap)
            }

            fn transmit(&mut self, timestamp: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
                let $m = self;
                let (inner, cap) = $parts;
                inner
                    .transmit(timestamp)
                    .map(|tx| TapTxToken { inner: tx, cap })
            }

            fn capabilities(&self) -> DeviceCapabilities {
                let $s = self;
                $inner.capabilities()
            }
        }

        impl<B: Backend> Backend for $ty {
            fn flush(&mut self) -> io::Result<()> {
                let $m = self;
                $parts.0.flush()
            }

            fn poll_rx(&mut self) -> io::Result<bool> {
                let $m = self;
                $parts.0.poll_rx()
            }

            fn wait_fd(&self) -> Option<RawFd> {
                let $s = self;
                $inner.wait_fd()
            }

            fn prepare_sleep(&mut self) -> io::Result<bool> {
                let $m = self;
                $parts.0.prepare_sleep()
            }

            fn next_deadline(&self) -> Option<Instant> {
                let $s = self;
                $inner.next_deadline()
            }

            fn stats(&self) -> BackendStats {
                let $s = self;
                $inner.stats()
            }

            fn telemetry(&self) -> xwarp_telemetry::NicCounters {
                let $s = self;
                $inner.telemetry()
            }

            fn interface_label(&self) -> String {
                let $s = self;
                $inner.interface_label()
            }
        }
    };
}

/// A [`Backend`] that records every frame received and sent through `B` (it owns the
/// backend and its [`Capture`]).
#[derive(Debug)]
pub struct PcapTap<B: Backend> {
    inner: B,
    cap: Option<Capture>,
}

impl<B: Backend> PcapTap<B> {
    /// Wrap `inner`, recording to a new interface named `xwarp` of `sink` (`None`: pass
    /// through without recording).
    pub fn new(inner: B, sink: Option<PcapSink>) -> Self {
        let cap = sink.map(|s| s.interface("xwarp", ""));
        Self::with_capture(inner, cap)
    }

    /// Wrap `inner`, recording through `cap`.
    pub fn with_capture(inner: B, cap: Option<Capture>) -> Self {
        Self { inner, cap }
    }

    /// Wrap `inner`, recording as the process's capture configuration says
    /// ([`CaptureSpec::configured`]: `XWARP_PCAP`), as the next engine of the process.
    pub fn from_env(inner: B) -> io::Result<Self> {
        let cap = match CaptureSpec::configured() {
            Some(spec) => Some(spec.open_engine("xwarp", "")?),
            None => None,
        };
        Ok(Self::with_capture(inner, cap))
    }

    /// Whether frames are being recorded.
    pub fn is_capturing(&self) -> bool {
        self.cap.is_some()
    }

    /// Capture counters.
    pub fn tap_stats(&self) -> TapStats {
        self.cap.as_ref().map(Capture::stats).unwrap_or_default()
    }

    /// The capture, if recording.
    pub fn capture(&self) -> Option<&Capture> {
        self.cap.as_ref()
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The wrapped backend, mutably.
    pub fn inner_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// Write the capture to its file and return the wrapped backend.
    pub fn into_inner(self) -> B {
        if let Some(c) = &self.cap {
            // Best effort: a stopped capture was reported when it stopped.
            let _ = c.sink().flush();
        }
        self.inner
    }
}

tapped_device!(PcapTap<B>, |t| (&mut t.inner, t.cap.as_ref()), |t| &t.inner);

/// A backend borrowed for one engine poll with a [`Capture`] recording every frame
/// through it: what an engine service polls instead of its backend while capturing, so
/// neither the engine's nor the backend's type changes with capture.
#[derive(Debug)]
pub struct Tapped<'a, B> {
    inner: &'a mut B,
    cap: &'a Capture,
}

impl<'a, B: Backend> Tapped<'a, B> {
    /// `inner`, recorded through `cap`.
    pub fn new(inner: &'a mut B, cap: &'a Capture) -> Self {
        Tapped { inner, cap }
    }
}

tapped_device!(Tapped<'_, B>, |t| (&mut *t.inner, Some(t.cap)), |t| &*t
    .inner);
