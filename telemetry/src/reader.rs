//! The reader's side (`xwarp stat`): find segments, check them, copy them out.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, Ordering};

use crate::layout::{
    h, ConnRecord, EngineCounters, NicCounters, QpRecord, Record, StackCounters, HEADER_WORDS,
    MAGIC, STATE_STOPPED, TABLE_HEADER_WORDS, VERSION,
};
use crate::proc_start_ticks;

/// Why a file could not be read as a segment.
#[derive(Debug)]
pub enum ReadError {
    /// It could not be opened, measured or mapped.
    Io(io::Error),
    /// Shorter than a header, or than the size its header gives.
    Short {
        /// Bytes in the file.
        len: u64,
        /// Bytes needed.
        need: u64,
    },
    /// The first word is not [`MAGIC`]: not an xwarp segment (or other endianness).
    BadMagic(u64),
    /// A layout version this reader does not know.
    Version(u64),
    /// The header describes sections that do not fit the file or overlap its header.
    Corrupt(String),
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Short { len, need } => {
                write!(f, "truncated segment: {len} bytes, need {need}")
            }
            ReadError::BadMagic(m) => write!(f, "not an xwarp stats segment (magic {m:#018x})"),
            ReadError::Version(v) => write!(
                f,
                "segment layout version {v}, this reader knows version {VERSION}"
            ),
            ReadError::Corrupt(why) => write!(f, "corrupt segment header: {why}"),
        }
    }
}

impl std::error::Error for ReadError {}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

/// Whether the process that wrote a segment is still there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Liveness {
    /// The writer runs (same pid and same process start time).
    Alive,
    /// No process with that pid: the writer died without removing its segment.
    Dead,
    /// The pid belongs to another process now (different start time).
    PidReused,
    /// The engine's loop ended but the file is still there (it is being removed).
    Stopped,
    /// Written in another pid namespace (a container sharing this directory): its pid
    /// means nothing here, so whether the writer lives cannot be told; never stale.
    OtherNamespace,
}

/// A copy of one table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Table<R> {
    /// The records, as of `published_unix_ns`.
    pub records: Vec<R>,
    /// Records the engine had that did not fit the table.
    pub dropped: u64,
    /// When the engine published it (Unix ns; 0: never).
    pub published_unix_ns: u64,
    /// `false` if no consistent copy could be taken (the writer was always mid-update,
    /// or died in the middle of one): `records` is then empty.
    pub consistent: bool,
}

/// Everything one segment holds, copied out at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct EngineSnapshot {
    /// The segment's file.
    pub path: PathBuf,
    /// Layout version.
    pub version: u64,
    /// Writer's pid.
    pub pid: u32,
    /// Engine index within that process.
    pub index: u32,
    /// Program name.
    pub program: String,
    /// Interface the engine runs on.
    pub interface: String,
    /// The engine's addresses.
    pub address: String,
    /// Whether the writer is alive.
    pub liveness: Liveness,
    /// Creation time (Unix ns).
    pub created_unix_ns: u64,
    /// Last update by the engine (Unix ns).
    pub updated_unix_ns: u64,
    /// Engine loop counters.
    pub engine: EngineCounters,
    /// NIC counters.
    pub nic: NicCounters,
    /// TCP stack counters.
    pub stack: StackCounters,
    /// TCP connections.
    pub conns: Table<ConnRecord>,
    /// Queue pairs.
    pub qps: Table<QpRecord>,
}

/// A segment file found in the stats directory, read or not.
#[derive(Debug)]
pub struct Found {
    /// The file.
    pub path: PathBuf,
    /// Pid and engine index from its name.
    pub pid: u32,
    /// Engine index from its name.
    pub index: u32,
    /// Its contents, or why they could not be read.
    pub segment: Result<EngineSnapshot, ReadError>,
}

impl Found {
    /// Whether the segment's writer is gone: it died (or its pid was reused), judged by
    /// the header if it could be read, else by the pid in the file name.
    pub fn is_stale(&self) -> bool {
        match &self.segment {
            Ok(s) => matches!(s.liveness, Liveness::Dead | Liveness::PidReused),
            Err(_) => proc_start_ticks(self.pid).is_none(),
        }
    }
}

/// Remove at most `max` segments in `dir` whose writer died without removing them (killed
/// by a signal: a shim program stopped with SIGKILL or an unhandled SIGTERM runs no exit
/// hook), and return how many went. Only segments whose header reads well and says
/// [`Liveness::Dead`] are removed: a pid reused by a live process, a segment of another
/// pid namespace ([`Liveness::OtherNamespace`]) or an unreadable file is left for
/// `xwarp stat --clean` to judge. Engines call it when they create their own segment, so
/// stale segments do not pile up in /dev/shm.
pub fn sweep_dead(dir: &Path, max: usize) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        if removed >= max {
            break;
        }
        let Some((pid, _)) = e.file_name().to_str().and_then(parse_name) else {
            continue;
        };
        if proc_start_ticks(pid).is_some() {
            continue;
        }
        let path = e.path();
        if matches!(read_segment(&path), Ok(s) if s.liveness == Liveness::Dead)
            && fs::remove_file(&path).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// Parse a segment file name `xwarp-<pid>-<index>`.
pub fn parse_name(name: &str) -> Option<(u32, u32)> {
    let rest = name.strip_prefix("xwarp-")?;
    let (p, i) = rest.split_once('-')?;
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(p) || !all_digits(i) {
        return None;
    }
    Some((p.parse().ok()?, i.parse().ok()?))
}

/// Parse the name of a segment being built, `.xwarp-<pid>-<index>.tmp` (left behind
/// by a writer that died before publishing it).
pub fn parse_tmp_name(name: &str) -> Option<(u32, u32)> {
    parse_name(name.strip_prefix('.')?.strip_suffix(".tmp")?)
}

/// Every segment file in `dir` (names `xwarp-<pid>-<index>`), sorted by pid and index.
pub fn scan(dir: &Path) -> io::Result<Vec<Found>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let Some((pid, index)) = name.to_str().and_then(parse_name) else {
            continue;
        };
        let path = e.path();
        out.push(Found {
            segment: read_segment(&path),
            path,
            pid,
            index,
        });
    }
    out.sort_by_key(|f| (f.pid, f.index));
    Ok(out)
}

/// What [`clean`] did.
#[derive(Debug, Default)]
pub struct Cleaned {
    /// Stale segments removed.
    pub removed: Vec<PathBuf>,
    /// Stale segments that could not be removed, and why (e.g. another user's file in
    /// the sticky `/dev/shm`).
    pub failed: Vec<(PathBuf, io::Error)>,
}

/// Remove the segments of dead writers in `dir`, and the unpublished
/// `.xwarp-<pid>-<index>.tmp` files of dead pids.
pub fn clean(dir: &Path) -> io::Result<Cleaned> {
    let mut out = Cleaned::default();
    for e in fs::read_dir(dir)? {
        let e = e?;
        let Some((pid, _)) = e.file_name().to_str().and_then(parse_tmp_name) else {
            continue;
        };
        if proc_start_ticks(pid).is_none() {
            let path = e.path();
            match fs::remove_file(&path) {
                Ok(()) => out.removed.push(path),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => out.failed.push((path, e)),
            }
        }
    }
    for f in scan(dir)? {
        if f.is_stale() {
            match fs::remove_file(&f.path) {
                Ok(()) => out.removed.push(f.path),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => out.failed.push((f.path, e)),
            }
        }
    }
    Ok(out)
}

/// How many times a table copy is retried while the engine is writing it.
const SEQ_RETRIES: usize = 10_000;

/// The largest segment file a reader accepts (the default segment is about 100 KiB).
pub const MAX_SEGMENT_BYTES: u64 = 16 << 20;

/// The largest table capacity a reader accepts.
pub const MAX_TABLE_CAPACITY: u64 = 1 << 16;

/// `n` words of `file` from word `at`, copied out with `pread` (a file truncated meanwhile
/// gives an error, never a fault).
fn read_words(file: &File, at: usize, n: usize) -> io::Result<Vec<u64>> {
    let mut b = vec![0u8; n * 8];
    file.read_exact_at(&mut b, at as u64 * 8)?;
    Ok(b.chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or_default()))
        .collect())
}

/// Decode a NUL-padded text field, control characters replaced by `?` so a crafted
/// segment cannot send escape sequences to the terminal.
pub(crate) fn decode_text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end])
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// A copy of a segment's words, with the file for fresh copies of its tables.
struct View<'a> {
    words: &'a [u64],
    file: &'a File,
}

impl View<'_> {
    fn get(&self, i: usize) -> u64 {
        self.words.get(i).copied().unwrap_or(0)
    }

    fn text(&self, (word, bytes): (usize, usize)) -> String {
        let mut b = Vec::with_capacity(bytes);
        for i in 0..bytes / 8 {
            b.extend_from_slice(&self.get(word + i).to_le_bytes());
        }
        decode_text(&b)
    }

    fn counters(&self, at: usize, n: usize) -> Vec<u64> {
        (0..n).map(|i| self.get(at + i)).collect()
    }

    /// Copy table `at` (capacity `cap`, already checked against the file) under its
    /// sequence lock: each attempt reads the table header, the records and the sequence
    /// word again from the file, and is kept only if the sequence is even and unchanged.
    fn table<R: Record>(&self, at: usize, cap: usize) -> Result<Table<R>, ReadError> {
        for attempt in 0..SEQ_RETRIES {
            let head = read_words(self.file, at, TABLE_HEADER_WORDS)?;
            let s1 = head[0];
            if s1 & 1 == 1 {
                if attempt > 100 {
                    std::thread::yield_now();
                }
                continue;
            }
            let count = (head[1] as usize).min(cap);
            let words = read_words(self.file, at + TABLE_HEADER_WORDS, count * R::WORDS)?;
            fence(Ordering::Acquire);
            if read_words(self.file, at, 1)?[0] != s1 {
                continue;
            }
            return Ok(Table {
                records: words.chunks_exact(R::WORDS).map(R::decode_from).collect(),
                dropped: head[2],
                published_unix_ns: head[3],
                consistent: true,
            });
        }
        Ok(Table {
            records: Vec::new(),
            dropped: 0,
            published_unix_ns: 0,
            consistent: false,
        })
    }
}

/// Check a section `(offset bytes, count, words per item)` against the file.
fn section(
    v: &View<'_>,
    at: usize,
    what: &str,
    per_item: usize,
    header: usize,
    total_words: usize,
) -> Result<(usize, usize), ReadError> {
    let off = v.get(at);
    let n = v.get(at + 1);
    let per = v.get(at + 2);
    if per_item != 0 && per != per_item as u64 {
        return Err(ReadError::Corrupt(format!(
            "{what}: {per} words per record, expected {per_item}"
        )));
    }
    if !off.is_multiple_of(8) || off / 8 < HEADER_WORDS as u64 {
        return Err(ReadError::Corrupt(format!("{what}: bad offset {off}")));
    }
    if per_item != 0 && n > MAX_TABLE_CAPACITY {
        return Err(ReadError::Corrupt(format!(
            "{what}: capacity {n} above {MAX_TABLE_CAPACITY}"
        )));
    }
    let start = off / 8;
    let words = n
        .checked_mul(per_item.max(1) as u64)
        .and_then(|w| w.checked_add(header as u64))
        .and_then(|w| w.checked_add(start));
    match words {
        Some(end) if end <= total_words as u64 => Ok((start as usize, n as usize)),
        _ => Err(ReadError::Corrupt(format!(
            "{what}: {n} items at {off} do not fit {} bytes",
            total_words * 8
        ))),
    }
}

/// Open `path` for reading without following a symlink or blocking on a FIFO, and
/// require a regular file.
fn open_regular(path: &Path) -> Result<File, ReadError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(ReadError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    Ok(file)
}

/// Read the segment at `path`: a regular file (not followed through a symlink) of at
/// most [`MAX_SEGMENT_BYTES`], copied out with `pread`, so neither a crafted file nor one
/// truncated meanwhile can hang, fault or exhaust the reader.
pub fn read_segment(path: &Path) -> Result<EngineSnapshot, ReadError> {
    let file = open_regular(path)?;
    let len = file.metadata()?.len();
    let need = (HEADER_WORDS * 8) as u64;
    if len < need {
        return Err(ReadError::Short { len, need });
    }
    if len > MAX_SEGMENT_BYTES {
        return Err(ReadError::Corrupt(format!(
            "file of {len} bytes, larger than {MAX_SEGMENT_BYTES}"
        )));
    }
    let header = read_words(&file, 0, HEADER_WORDS).map_err(|e| short(e, len, need))?;
    let hv = View {
        words: &header,
        file: &file,
    };
    let magic = hv.get(h::MAGIC);
    if magic != MAGIC {
        return Err(ReadError::BadMagic(magic));
    }
    let version = hv.get(h::VERSION);
    if version != VERSION {
        return Err(ReadError::Version(version));
    }
    let size = hv.get(h::SIZE);
    if size > len {
        return Err(ReadError::Short { len, need: size });
    }
    if size < need || !size.is_multiple_of(8) {
        return Err(ReadError::Corrupt(format!("size {size}")));
    }
    let all = read_words(&file, 0, size as usize / 8).map_err(|e| short(e, len, size))?;
    let v = View {
        words: &all,
        file: &file,
    };
    let total = all.len();
    let (eng, eng_n) = section(&v, h::ENGINE, "engine counters", 0, 0, total)?;
    let (nic, nic_n) = section(&v, h::NIC, "NIC counters", 0, 0, total)?;
    let (stk, stk_n) = section(&v, h::STACK, "stack counters", 0, 0, total)?;
    // Counters past the ones this reader knows are ignored (a newer writer's additions).
    let eng_n = eng_n.min(EngineCounters::LEN);
    let nic_n = nic_n.min(NicCounters::LEN);
    let stk_n = stk_n.min(StackCounters::LEN);
    let (conns, conns_cap) = section(
        &v,
        h::CONNS,
        "connection table",
        ConnRecord::WORDS,
        TABLE_HEADER_WORDS,
        total,
    )?;
    let (qps, qps_cap) = section(
        &v,
        h::QPS,
        "QP table",
        QpRecord::WORDS,
        TABLE_HEADER_WORDS,
        total,
    )?;
    let pid = v.get(h::PID);
    let pid = u32::try_from(pid).map_err(|_| ReadError::Corrupt(format!("pid {pid}")))?;
    let start = v.get(h::START_TICKS);
    let ns = v.get(h::PID_NS);
    let liveness = match proc_start_ticks(pid) {
        _ if ns != 0 && ns != crate::pid_namespace() => Liveness::OtherNamespace,
        None => Liveness::Dead,
        Some(t) if start != 0 && t != start => Liveness::PidReused,
        Some(_) if v.get(h::STATE) == STATE_STOPPED => Liveness::Stopped,
        Some(_) => Liveness::Alive,
    };
    Ok(EngineSnapshot {
        path: path.to_path_buf(),
        version,
        pid,
        index: v.get(h::INDEX) as u32,
        program: v.text(h::PROGRAM),
        interface: v.text(h::INTERFACE),
        address: v.text(h::ADDRESS),
        liveness,
        created_unix_ns: v.get(h::CREATED_NS),
        updated_unix_ns: v.get(h::UPDATED_NS),
        engine: EngineCounters::from_words(&v.counters(eng, eng_n)),
        nic: NicCounters::from_words(&v.counters(nic, nic_n)),
        stack: StackCounters::from_words(&v.counters(stk, stk_n)),
        conns: v.table(conns, conns_cap)?,
        qps: v.table(qps, qps_cap)?,
    })
}

/// A read that hit the end of a file truncated meanwhile is reported as [`ReadError::Short`].
fn short(e: io::Error, len: u64, need: u64) -> ReadError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        ReadError::Short { len, need }
    } else {
        ReadError::Io(e)
    }
}
