//! The two file formats, byte by byte, as pure encoders into a `Vec<u8>` (no I/O, no
//! allocation beyond the vector's growth): classic pcap (libpcap 2.4, little-endian) and
//! pcapng (draft-ietf-opsawg-pcapng: Section Header, Interface Description, Enhanced
//! Packet and Interface Statistics Blocks, little-endian), plus [`PcapWriter`], a classic
//! pcap writer over any [`Write`].

use std::io::{self, Write};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// pcap LINKTYPE_ETHERNET (also the pcapng interface link type).
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Largest frame recorded in full by default; longer frames are truncated to the snap
/// length (and their original length kept in the record).
pub const SNAPLEN: u32 = 262_144;

/// pcapng block type of a Section Header Block.
pub const BT_SHB: u32 = 0x0A0D_0D0A;
/// pcapng block type of an Interface Description Block.
pub const BT_IDB: u32 = 0x0000_0001;
/// pcapng block type of an Interface Statistics Block.
pub const BT_ISB: u32 = 0x0000_0005;
/// pcapng block type of an Enhanced Packet Block.
pub const BT_EPB: u32 = 0x0000_0006;
/// pcapng byte-order magic (written in the writer's byte order: little-endian here).
pub const BYTE_ORDER_MAGIC: u32 = 0x1A2B_3C4D;

// Option codes (draft-ietf-opsawg-pcapng §3.5, §4.2, §4.3, §4.6).
const OPT_ENDOFOPT: u16 = 0;
const SHB_USERAPPL: u16 = 4;
const IF_NAME: u16 = 2;
const IF_DESCRIPTION: u16 = 3;
const IF_TSRESOL: u16 = 9;
const EPB_FLAGS: u16 = 2;
const ISB_IFRECV: u16 = 4;
const ISB_OSDROP: u16 = 7;
const ISB_USRDELIV: u16 = 8;

/// Timestamp resolution of a capture file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TsPrecision {
    /// Microseconds (classic magic `0xa1b2c3d4`; pcapng `if_tsresol` 6), understood by
    /// every reader.
    #[default]
    Micros,
    /// Nanoseconds (classic magic `0xa1b23c4d`; pcapng `if_tsresol` 9).
    Nanos,
}

impl TsPrecision {
    /// The pcapng `if_tsresol` value: 10^-6 or 10^-9 seconds.
    pub fn tsresol(self) -> u8 {
        match self {
            TsPrecision::Micros => 6,
            TsPrecision::Nanos => 9,
        }
    }

    /// `since` (time since the Unix epoch) in units of this resolution.
    pub fn units(self, since: Duration) -> u64 {
        let n = match self {
            TsPrecision::Micros => since.as_micros(),
            TsPrecision::Nanos => since.as_nanos(),
        };
        u64::try_from(n).unwrap_or(u64::MAX)
    }
}

/// Which file format a capture is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PcapFormat {
    /// Classic libpcap format: one link type, no direction per packet.
    Pcap,
    /// pcapng: one interface per engine, the direction of every packet.
    #[default]
    PcapNg,
}

impl PcapFormat {
    /// The format a file name asks for: `.pcap` (any case) is classic pcap, anything else
    /// (`.pcapng`, no extension) pcapng.
    pub fn from_path(path: &Path) -> PcapFormat {
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("pcap") => PcapFormat::Pcap,
            _ => PcapFormat::PcapNg,
        }
    }
}

/// Which way a frame went through the engine's NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Received by the engine.
    Inbound,
    /// Sent by the engine.
    Outbound,
    /// Not known (written without a direction flag).
    Unknown,
}

impl Direction {
    /// The `epb_flags` bits 0–1 (01 inbound, 10 outbound); `None` for unknown.
    pub fn epb_flags(self) -> Option<u32> {
        match self {
            Direction::Inbound => Some(0b01),
            Direction::Outbound => Some(0b10),
            Direction::Unknown => None,
        }
    }
}

fn since_epoch(ts: SystemTime) -> Duration {
    ts.duration_since(UNIX_EPOCH).unwrap_or_default()
}

fn pad4(n: usize) -> usize {
    (4 - n % 4) % 4
}

fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// One option: code, length, value padded to 32 bits. Values longer than 65535 bytes are
/// cut (option lengths are 16 bits).
fn put_opt(out: &mut Vec<u8>, code: u16, value: &[u8]) {
    let value = &value[..value.len().min(u16::MAX as usize)];
    put_u16(out, code);
    put_u16(out, value.len() as u16);
    out.extend_from_slice(value);
    out.resize(out.len() + pad4(value.len()), 0);
}

/// Start a block of type `bt` at the end of `out`; returns its start for [`end_block`].
fn begin_block(out: &mut Vec<u8>, bt: u32) -> usize {
    let start = out.len();
    put_u32(out, bt);
    put_u32(out, 0); // total length, patched by end_block
    start
}

/// Close the block begun at `start`: write the trailing total length and patch the
/// leading one.
fn end_block(out: &mut Vec<u8>, start: usize) {
    let total = (out.len() - start + 4) as u32;
    put_u32(out, total);
    out[start + 4..start + 8].copy_from_slice(&total.to_le_bytes());
}

/// The classic pcap global header (24 bytes).
pub fn pcap_file_header(out: &mut Vec<u8>, precision: TsPrecision, snaplen: u32) {
    let magic: u32 = match precision {
        TsPrecision::Micros => 0xa1b2_c3d4,
        TsPrecision::Nanos => 0xa1b2_3c4d,
    };
    put_u32(out, magic);
    put_u16(out, 2); // version major
    put_u16(out, 4); // version minor
    put_u32(out, 0); // thiszone
    put_u32(out, 0); // sigfigs
    put_u32(out, snaplen);
    put_u32(out, LINKTYPE_ETHERNET);
}

/// One classic pcap record (16-byte header, then the frame cut to `snaplen`). Times
/// before the Unix epoch are recorded as the epoch.
pub fn pcap_record(
    out: &mut Vec<u8>,
    precision: TsPrecision,
    snaplen: u32,
    ts: SystemTime,
    frame: &[u8],
) {
    let since = since_epoch(ts);
    let secs = since.as_secs().min(u32::MAX as u64) as u32;
    let frac = match precision {
        TsPrecision::Micros => since.subsec_micros(),
        TsPrecision::Nanos => since.subsec_nanos(),
    };
    let orig_len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
    let incl_len = orig_len.min(snaplen);
    put_u32(out, secs);
    put_u32(out, frac);
    put_u32(out, incl_len);
    put_u32(out, orig_len);
    out.extend_from_slice(&frame[..incl_len as usize]);
}

/// Bytes [`pcap_record`] appends for a frame of `len` bytes.
pub fn pcap_record_len(snaplen: u32, len: usize) -> usize {
    16 + len.min(snaplen as usize)
}

/// A pcapng Section Header Block (version 1.0, section length unknown) naming the
/// writing application in `shb_userappl`.
pub fn pcapng_section_header(out: &mut Vec<u8>, user_appl: &str) {
    let start = begin_block(out, BT_SHB);
    put_u32(out, BYTE_ORDER_MAGIC);
    put_u16(out, 1); // major
    put_u16(out, 0); // minor
    out.extend_from_slice(&(-1i64).to_le_bytes()); // section length: not specified
    put_opt(out, SHB_USERAPPL, user_appl.as_bytes());
    put_opt(out, OPT_ENDOFOPT, &[]);
    end_block(out, start);
}

/// A pcapng Interface Description Block: link type Ethernet, `snaplen`, `if_name`,
/// `if_description` (when not empty) and `if_tsresol`.
pub fn pcapng_interface(
    out: &mut Vec<u8>,
    name: &str,
    description: &str,
    precision: TsPrecision,
    snaplen: u32,
) {
    let start = begin_block(out, BT_IDB);
    put_u16(out, LINKTYPE_ETHERNET as u16);
    put_u16(out, 0); // reserved
    put_u32(out, snaplen);
    put_opt(out, IF_NAME, name.as_bytes());
    if !description.is_empty() {
        put_opt(out, IF_DESCRIPTION, description.as_bytes());
    }
    put_opt(out, IF_TSRESOL, &[precision.tsresol()]);
    put_opt(out, OPT_ENDOFOPT, &[]);
    end_block(out, start);
}

fn put_ts(out: &mut Vec<u8>, precision: TsPrecision, ts: SystemTime) {
    let units = precision.units(since_epoch(ts));
    put_u32(out, (units >> 32) as u32);
    put_u32(out, units as u32);
}

/// A pcapng Enhanced Packet Block of interface `iface` (the frame cut to `snaplen`),
/// with the direction in `epb_flags` when known.
pub fn pcapng_packet(
    out: &mut Vec<u8>,
    iface: u32,
    precision: TsPrecision,
    snaplen: u32,
    ts: SystemTime,
    dir: Direction,
    frame: &[u8],
) {
    let orig_len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
    let cap_len = orig_len.min(snaplen);
    let start = begin_block(out, BT_EPB);
    put_u32(out, iface);
    put_ts(out, precision, ts);
    put_u32(out, cap_len);
    put_u32(out, orig_len);
    out.extend_from_slice(&frame[..cap_len as usize]);
    out.resize(out.len() + pad4(cap_len as usize), 0);
    if let Some(flags) = dir.epb_flags() {
        put_opt(out, EPB_FLAGS, &flags.to_le_bytes());
        put_opt(out, OPT_ENDOFOPT, &[]);
    }
    end_block(out, start);
}

/// Bytes [`pcapng_packet`] appends for a frame of `len` bytes.
pub fn pcapng_packet_len(snaplen: u32, len: usize, dir: Direction) -> usize {
    let cap = len.min(snaplen as usize);
    let opts = if dir.epb_flags().is_some() { 12 } else { 0 };
    32 + cap + pad4(cap) + opts
}

/// What one interface saw, for its Interface Statistics Block.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct InterfaceCounts {
    /// Frames offered to the capture (`isb_ifrecv`).
    pub offered: u64,
    /// Frames written to the file (`isb_usrdeliv`).
    pub written: u64,
    /// Frames dropped because the capture buffer was full (`isb_osdrop`).
    pub dropped: u64,
}

/// A pcapng Interface Statistics Block for interface `iface` at time `ts`.
pub fn pcapng_interface_stats(
    out: &mut Vec<u8>,
    iface: u32,
    precision: TsPrecision,
    ts: SystemTime,
    c: InterfaceCounts,
) {
    let start = begin_block(out, BT_ISB);
    put_u32(out, iface);
    put_ts(out, precision, ts);
    put_opt(out, ISB_IFRECV, &c.offered.to_le_bytes());
    put_opt(out, ISB_OSDROP, &c.dropped.to_le_bytes());
    put_opt(out, ISB_USRDELIV, &c.written.to_le_bytes());
    put_opt(out, OPT_ENDOFOPT, &[]);
    end_block(out, start);
}

/// A classic pcap writer (little-endian, version 2.4, LINKTYPE_ETHERNET) over any
/// [`Write`], writing synchronously.
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    out: W,
    precision: TsPrecision,
    frames: u64,
    scratch: Vec<u8>,
}

impl<W: Write> PcapWriter<W> {
    /// Write the global header to `out` and return a writer for records.
    pub fn new(mut out: W, precision: TsPrecision) -> io::Result<Self> {
        let mut hdr = Vec::with_capacity(24);
        pcap_file_header(&mut hdr, precision, SNAPLEN);
        out.write_all(&hdr)?;
        Ok(Self {
            out,
            precision,
            frames: 0,
            scratch: Vec::new(),
        })
    }

    /// Append one frame captured at wall-clock time `ts`. Times before the Unix epoch are
    /// recorded as the epoch.
    pub fn write_frame(&mut self, ts: SystemTime, frame: &[u8]) -> io::Result<()> {
        self.scratch.clear();
        pcap_record(&mut self.scratch, self.precision, SNAPLEN, ts, frame);
        self.out.write_all(&self.scratch)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn u16_at(b: &[u8], o: usize) -> u16 {
        u16::from_le_bytes(b[o..o + 2].try_into().unwrap())
    }

    fn u32_at(b: &[u8], o: usize) -> u32 {
        u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
    }

    /// Options of a block body: (code, value) until opt_endofopt.
    fn options(mut b: &[u8]) -> Vec<(u16, Vec<u8>)> {
        let mut v = Vec::new();
        loop {
            let code = u16_at(b, 0);
            let len = u16_at(b, 2) as usize;
            if code == 0 {
                assert_eq!(len, 0);
                assert_eq!(b.len(), 4, "bytes after opt_endofopt");
                return v;
            }
            v.push((code, b[4..4 + len].to_vec()));
            b = &b[4 + len + pad4(len)..];
        }
    }

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
        assert_eq!(u32_at(&b, 16), SNAPLEN);
        assert_eq!(u32_at(&b, 20), 1);
        assert_eq!(u32_at(&b, 24), 1_700_000_000);
        assert_eq!(u32_at(&b, 28), 123_456_789);
        assert_eq!(u32_at(&b, 32), 60);
        assert_eq!(u32_at(&b, 36), 60);
        assert_eq!(&b[40..], &[0xaa; 60]);

        let mut w = PcapWriter::new(Vec::new(), TsPrecision::Micros).unwrap();
        w.write_frame(ts, &[1, 2, 3]).unwrap();
        let b = w.into_inner().unwrap();
        assert_eq!(&b[0..4], &[0xd4, 0xc3, 0xb2, 0xa1]);
        assert_eq!(u32_at(&b, 28), 123_456);
    }

    #[test]
    fn oversized_frames_are_truncated_to_snaplen_with_original_length_kept() {
        let mut w = PcapWriter::new(Vec::new(), TsPrecision::Micros).unwrap();
        let big = vec![7u8; SNAPLEN as usize + 10];
        w.write_frame(UNIX_EPOCH, &big).unwrap();
        let b = w.into_inner().unwrap();
        assert_eq!(u32_at(&b, 32), SNAPLEN);
        assert_eq!(u32_at(&b, 36), SNAPLEN + 10);
        assert_eq!(b.len(), 24 + 16 + SNAPLEN as usize);
        assert_eq!(pcap_record_len(SNAPLEN, big.len()), 16 + SNAPLEN as usize);
    }

    #[test]
    fn section_header_block_layout() {
        let mut b = Vec::new();
        pcapng_section_header(&mut b, "xwarp 0.1");
        assert_eq!(b.len() % 4, 0);
        assert_eq!(u32_at(&b, 0), BT_SHB);
        let total = u32_at(&b, 4) as usize;
        assert_eq!(total, b.len());
        assert_eq!(u32_at(&b, total - 4) as usize, total, "trailing length");
        assert_eq!(&b[8..12], &[0x4d, 0x3c, 0x2b, 0x1a]);
        assert_eq!(u16_at(&b, 12), 1);
        assert_eq!(u16_at(&b, 14), 0);
        assert_eq!(&b[16..24], &[0xff; 8]);
        assert_eq!(
            options(&b[24..total - 4]),
            vec![(SHB_USERAPPL, b"xwarp 0.1".to_vec())]
        );
    }

    #[test]
    fn interface_description_block_layout() {
        for (p, res) in [(TsPrecision::Micros, 6u8), (TsPrecision::Nanos, 9)] {
            let mut b = Vec::new();
            pcapng_interface(&mut b, "veth-a", "xwarp engine", p, 1500);
            let total = u32_at(&b, 4) as usize;
            assert_eq!((u32_at(&b, 0), total, b.len() % 4), (BT_IDB, b.len(), 0));
            assert_eq!(u32_at(&b, total - 4) as usize, total);
            assert_eq!(u16_at(&b, 8), 1, "LINKTYPE_ETHERNET");
            assert_eq!(u16_at(&b, 10), 0);
            assert_eq!(u32_at(&b, 12), 1500);
            assert_eq!(
                options(&b[16..total - 4]),
                vec![
                    (IF_NAME, b"veth-a".to_vec()),
                    (IF_DESCRIPTION, b"xwarp engine".to_vec()),
                    (IF_TSRESOL, vec![res]),
                ]
            );
        }
        // No description: the option is left out.
        let mut b = Vec::new();
        pcapng_interface(&mut b, "x", "", TsPrecision::Micros, SNAPLEN);
        let total = b.len();
        assert_eq!(
            options(&b[16..total - 4]),
            vec![(IF_NAME, b"x".to_vec()), (IF_TSRESOL, vec![6])]
        );
    }

    #[test]
    fn enhanced_packet_block_layout_with_direction_and_padding() {
        let ts = UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
        for (dir, flags) in [
            (Direction::Inbound, Some(1u32)),
            (Direction::Outbound, Some(2)),
            (Direction::Unknown, None),
        ] {
            for len in [60usize, 61, 62, 63, 64] {
                let frame: Vec<u8> = (0..len as u8).collect();
                let mut b = Vec::new();
                pcapng_packet(&mut b, 3, TsPrecision::Nanos, SNAPLEN, ts, dir, &frame);
                let total = u32_at(&b, 4) as usize;
                assert_eq!(total, b.len());
                assert_eq!(total, pcapng_packet_len(SNAPLEN, len, dir));
                assert_eq!(total % 4, 0);
                assert_eq!(u32_at(&b, 0), BT_EPB);
                assert_eq!(u32_at(&b, total - 4) as usize, total);
                assert_eq!(u32_at(&b, 8), 3, "interface id");
                let units = (u64::from(u32_at(&b, 12)) << 32) | u64::from(u32_at(&b, 16));
                assert_eq!(units, 1_700_000_000_123_456_789);
                assert_eq!(u32_at(&b, 20) as usize, len);
                assert_eq!(u32_at(&b, 24) as usize, len);
                assert_eq!(&b[28..28 + len], &frame[..]);
                let padded = 28 + len + pad4(len);
                assert!(b[28 + len..padded].iter().all(|&x| x == 0));
                match flags {
                    Some(f) => assert_eq!(
                        options(&b[padded..total - 4]),
                        vec![(EPB_FLAGS, f.to_le_bytes().to_vec())]
                    ),
                    None => assert_eq!(padded, total - 4),
                }
            }
        }
        // Microseconds and the snap length.
        let mut b = Vec::new();
        let frame = [9u8; 100];
        pcapng_packet(
            &mut b,
            0,
            TsPrecision::Micros,
            54,
            ts,
            Direction::Outbound,
            &frame,
        );
        let units = (u64::from(u32_at(&b, 12)) << 32) | u64::from(u32_at(&b, 16));
        assert_eq!(units, 1_700_000_000_123_456);
        assert_eq!((u32_at(&b, 20), u32_at(&b, 24)), (54, 100));
        assert_eq!(b.len(), pcapng_packet_len(54, 100, Direction::Outbound));
    }

    #[test]
    fn interface_statistics_block_layout() {
        let mut b = Vec::new();
        let c = InterfaceCounts {
            offered: 10,
            written: 7,
            dropped: 3,
        };
        pcapng_interface_stats(&mut b, 1, TsPrecision::Micros, UNIX_EPOCH, c);
        let total = u32_at(&b, 4) as usize;
        assert_eq!((u32_at(&b, 0), total), (BT_ISB, b.len()));
        assert_eq!(u32_at(&b, 8), 1);
        assert_eq!(
            options(&b[20..total - 4]),
            vec![
                (ISB_IFRECV, 10u64.to_le_bytes().to_vec()),
                (ISB_OSDROP, 3u64.to_le_bytes().to_vec()),
                (ISB_USRDELIV, 7u64.to_le_bytes().to_vec()),
            ]
        );
    }

    #[test]
    fn the_extension_picks_the_format() {
        for (p, f) in [
            ("/tmp/a.pcap", PcapFormat::Pcap),
            ("/tmp/a.PCAP", PcapFormat::Pcap),
            ("/tmp/a.pcapng", PcapFormat::PcapNg),
            ("/tmp/a", PcapFormat::PcapNg),
            ("/tmp/a.cap", PcapFormat::PcapNg),
        ] {
            assert_eq!(PcapFormat::from_path(Path::new(p)), f, "{p}");
        }
    }
}
