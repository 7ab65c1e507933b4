//! The engine's side: create a segment, store counters, publish tables, remove it.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, Once};

use crate::layout::{
    h, ConnRecord, EngineCounters, NicCounters, QpRecord, Record, StackCounters, HEADER_WORDS,
    MAGIC, STATE_RUNNING, STATE_STOPPED, TABLE_HEADER_WORDS, VERSION,
};
use crate::map::Mapping;
use crate::{proc_start_ticks, segment_name, unix_ns};

/// What a segment says about its engine, set when it is created.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Program name (default: [`crate::program_name`]).
    pub program: String,
    /// Interface the engine runs on (`veth0 q0`, `vwire`, ...).
    pub interface: String,
    /// The engine's addresses (`10.0.0.1/24`).
    pub address: String,
}

/// Table capacities of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Connection records.
    pub conns: usize,
    /// QP records.
    pub qps: usize,
}

impl Default for Capacity {
    fn default() -> Self {
        Capacity {
            conns: 256,
            qps: 256,
        }
    }
}

/// Where each section starts (word offsets) and how big it is.
#[derive(Debug, Clone, Copy)]
struct Sections {
    engine: usize,
    nic: usize,
    stack: usize,
    conns: usize,
    qps: usize,
    total: usize,
}

fn sections(cap: Capacity) -> Sections {
    let engine = HEADER_WORDS;
    let nic = engine + EngineCounters::LEN;
    let stack = nic + NicCounters::LEN;
    let conns = stack + StackCounters::LEN;
    let qps = conns + TABLE_HEADER_WORDS + cap.conns * ConnRecord::WORDS;
    let total = qps + TABLE_HEADER_WORDS + cap.qps * QpRecord::WORDS;
    Sections {
        engine,
        nic,
        stack,
        conns,
        qps,
        total,
    }
}

/// One engine's live segment (writer side). Counters are relaxed stores; tables are
/// published under a seqlock. The file is removed by [`Segment::remove`], on drop and at
/// process exit (`atexit`), whichever comes first, and only by the process that made it.
#[derive(Debug)]
pub struct Segment {
    map: Mapping,
    path: PathBuf,
    pid: u32,
    index: u32,
    sec: Sections,
    cap: Capacity,
    /// `(st_dev, st_ino)` of the file this segment made.
    id: FileId,
    removed: AtomicBool,
}

/// A file's `(st_dev, st_ino)`.
type FileId = (u64, u64);

/// This process's live segments (pid, path, file id), for the exit hook.
static LIVE: Mutex<Vec<(u32, PathBuf, FileId)>> = Mutex::new(Vec::new());
static NEXT_INDEX: AtomicU32 = AtomicU32::new(0);

/// Unlink `path` only if it is still the file `id` (`(st_dev, st_ino)`): a file another
/// process put at that name since is left alone.
fn remove_if_ours(path: &Path, id: FileId) {
    if let Ok(m) = fs::symlink_metadata(path) {
        if (m.dev(), m.ino()) == id {
            let _ = fs::remove_file(path);
        }
    }
}

extern "C" fn remove_at_exit() {
    let pid = std::process::id();
    // try_lock: never block exit behind a thread that died holding the lock.
    if let Ok(mut live) = LIVE.try_lock() {
        for (p, path, id) in live.drain(..) {
            if p == pid {
                remove_if_ours(&path, id);
            }
        }
    }
}

/// Reserve the file's `bytes` now, so that a full tmpfs fails here (`ENOSPC`) instead of
/// raising `SIGBUS` at the first store to a page of the sparse file.
fn reserve(file: &File, bytes: usize) -> io::Result<()> {
    let len = libc::off_t::try_from(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment too large"))?;
    // SAFETY: a plain syscall on an fd `file` owns for the duration of the call; no
    // memory is passed.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    match rc {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// Move `from` to `to` unless `to` exists (`EEXIST` then). Uses `renameat2(2)` with
/// `RENAME_NOREPLACE`; where the filesystem does not support it, `link` + `unlink`.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
    };
    let (f, t) = (c(from)?, c(to)?);
    // SAFETY: both are valid NUL-terminated paths that live across the call; AT_FDCWD
    // resolves relative paths like rename(2).
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL) | Some(libc::ENOSYS) => {
            fs::hard_link(from, to)?;
            let _ = fs::remove_file(from);
            Ok(())
        }
        _ => Err(e),
    }
}

fn register_exit_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain `extern "C" fn()` that only touches statics.
        unsafe {
            libc::atexit(remove_at_exit);
        }
    });
}

fn put_text(map: &Mapping, (word, bytes): (usize, usize), s: &str) {
    let mut b = vec![0u8; bytes];
    // Truncate on a char boundary, leaving room for a NUL.
    let mut n = s.len().min(bytes - 1);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
    for (i, c) in b.chunks_exact(8).enumerate() {
        let v = u64::from_le_bytes(c.try_into().unwrap_or_default());
        if let Some(w) = map.word(word + i) {
            w.store(v, Ordering::Relaxed);
        }
    }
}

impl Segment {
    /// Create the segment of this process's next engine in [`crate::stats_dir`] with the
    /// default capacities.
    pub fn create(info: &SegmentInfo) -> io::Result<Segment> {
        let index = NEXT_INDEX.fetch_add(1, Ordering::Relaxed);
        Segment::create_in(&crate::stats_dir(), index, info, Capacity::default())
    }

    /// Create segment `xwarp-<pid>-<index>` in `dir`. The file is built under a hidden
    /// name and renamed into place, so a reader never sees a half-initialized header; an
    /// existing file of that name (a stale segment of an earlier process with this pid)
    /// is never replaced: the next free index is taken. The space is reserved up front,
    /// so a full filesystem is an error here, not a fault later.
    pub fn create_in(
        dir: &Path,
        index: u32,
        info: &SegmentInfo,
        cap: Capacity,
    ) -> io::Result<Segment> {
        let pid = std::process::id();
        let mut index = index;
        let tmp = dir.join(format!(".{}.tmp", segment_name(pid, index)));
        let sec = sections(cap);
        let bytes = sec.total * 8;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)?;
        let built = (|| {
            file.set_len(bytes as u64)?;
            reserve(&file, bytes)?;
            let meta = file.metadata()?;
            let map = Mapping::new(&file, bytes, true)?;
            let set = |i: usize, v: u64| {
                if let Some(w) = map.word(i) {
                    w.store(v, Ordering::Relaxed);
                }
            };
            set(h::MAGIC, MAGIC);
            set(h::VERSION, VERSION);
            set(h::SIZE, bytes as u64);
            set(h::PID, u64::from(pid));
            set(h::START_TICKS, proc_start_ticks(pid).unwrap_or(0));
            set(h::PID_NS, crate::pid_namespace());
            set(h::INDEX, u64::from(index));
            let now = unix_ns();
            set(h::CREATED_NS, now);
            set(h::UPDATED_NS, now);
            set(h::STATE, STATE_RUNNING);
            for (at, off, n, per) in [
                (h::ENGINE, sec.engine, EngineCounters::LEN, 0),
                (h::NIC, sec.nic, NicCounters::LEN, 0),
                (h::STACK, sec.stack, StackCounters::LEN, 0),
                (h::CONNS, sec.conns, cap.conns, ConnRecord::WORDS),
                (h::QPS, sec.qps, cap.qps, QpRecord::WORDS),
            ] {
                set(at, off as u64 * 8);
                set(at + 1, n as u64);
                set(at + 2, per as u64);
            }
            let program = if info.program.is_empty() {
                crate::program_name()
            } else {
                info.program.clone()
            };
            put_text(&map, h::PROGRAM, &program);
            put_text(&map, h::INTERFACE, &info.interface);
            put_text(&map, h::ADDRESS, &info.address);
            fence(Ordering::SeqCst);
            // Try up to 64 indices past a name already taken.
            let mut tries = 0;
            loop {
                set(h::INDEX, u64::from(index));
                fence(Ordering::SeqCst);
                let path = dir.join(segment_name(pid, index));
                match rename_noreplace(&tmp, &path) {
                    Ok(()) => {
                        NEXT_INDEX.fetch_max(index.saturating_add(1), Ordering::Relaxed);
                        return Ok((map, path, (meta.dev(), meta.ino())));
                    }
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 64 => {
                        tries += 1;
                        index = index.wrapping_add(1);
                    }
                    Err(e) => return Err(e),
                }
            }
        })();
        let (map, path, id) = match built {
            Ok(m) => m,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        };
        register_exit_hook();
        if let Ok(mut live) = LIVE.lock() {
            live.push((pid, path.clone(), id));
        }
        Ok(Segment {
            map,
            path,
            pid,
            index,
            sec,
            cap,
            id,
            removed: AtomicBool::new(false),
        })
    }

    /// The segment's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The engine index within the process.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Table capacities.
    pub fn capacity(&self) -> Capacity {
        self.cap
    }

    fn store_words(&self, at: usize, w: &[u64]) {
        for (i, &v) in w.iter().enumerate() {
            if let Some(a) = self.map.word(at + i) {
                a.store(v, Ordering::Relaxed);
            }
        }
    }

    fn touch(&self) {
        if let Some(w) = self.map.word(h::UPDATED_NS) {
            w.store(unix_ns(), Ordering::Relaxed);
        }
    }

    /// Store the engine loop's counters.
    pub fn set_engine(&self, c: &EngineCounters) {
        self.store_words(self.sec.engine, &c.to_words());
    }

    /// Store the NIC's counters (also marks the segment updated now).
    pub fn set_nic(&self, c: &NicCounters) {
        self.store_words(self.sec.nic, &c.to_words());
        self.touch();
    }

    /// Store the TCP stack's counters.
    pub fn set_stack(&self, c: &StackCounters) {
        self.store_words(self.sec.stack, &c.to_words());
    }

    fn publish<R: Record>(&self, at: usize, cap: usize, records: &[R], total: usize) {
        let word = |i: usize| self.map.word(at + i);
        let Some(seq) = word(0) else { return };
        let s = seq.load(Ordering::Relaxed);
        // Odd while writing: readers retry. The release fence orders the odd store
        // before every data store below.
        seq.store(s.wrapping_add(1) | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        let n = records.len().min(cap);
        let mut buf = [0u64; 32];
        for (k, r) in records[..n].iter().enumerate() {
            r.encode_into(&mut buf[..R::WORDS]);
            self.store_words(at + TABLE_HEADER_WORDS + k * R::WORDS, &buf[..R::WORDS]);
        }
        let store = |i: usize, v: u64| {
            if let Some(w) = word(i) {
                w.store(v, Ordering::Relaxed);
            }
        };
        store(1, n as u64);
        store(2, total.max(records.len()).saturating_sub(n) as u64);
        store(3, unix_ns());
        seq.store((s | 1).wrapping_add(1), Ordering::Release);
    }

    /// Publish the connection table: the first `capacity().conns` of `records`; `total`
    /// is how many the engine has (the difference is reported as not fitting).
    pub fn publish_conns(&self, records: &[ConnRecord], total: usize) {
        self.publish(self.sec.conns, self.cap.conns, records, total);
    }

    /// Publish the QP table (as [`Segment::publish_conns`]).
    pub fn publish_qps(&self, records: &[QpRecord], total: usize) {
        self.publish(self.sec.qps, self.cap.qps, records, total);
    }

    /// Mark the engine stopped and remove the file (idempotent; does nothing in a forked
    /// child, whose parent still owns the file).
    pub fn remove(&self) {
        if std::process::id() != self.pid || self.removed.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some(w) = self.map.word(h::STATE) {
            w.store(STATE_STOPPED, Ordering::Release);
        }
        remove_if_ours(&self.path, self.id);
        if let Ok(mut live) = LIVE.lock() {
            live.retain(|(_, p, _)| p != &self.path);
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.remove();
    }
}
