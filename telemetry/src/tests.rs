use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::layout::{h, ConnRecord, QpRecord, QpState, MAGIC, STATE_STOPPED};
use crate::reader::{
    clean, decode_text, parse_name, parse_tmp_name, read_segment, scan, Liveness, ReadError,
};
use crate::{Capacity, EngineCounters, NicCounters, Segment, SegmentInfo, StackCounters};

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "xwarp-telemetry-{tag}-{}-{}",
            std::process::id(),
            crate::unix_ns()
        ));
        fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn info() -> SegmentInfo {
    SegmentInfo {
        program: "unit-test".into(),
        interface: "vwire".into(),
        address: "10.77.0.1/24".into(),
    }
}

fn small() -> Capacity {
    Capacity { conns: 4, qps: 2 }
}

fn conn(id: u64) -> ConnRecord {
    ConnRecord {
        id,
        state: 1,
        local: Some("10.77.0.1:5000".parse().unwrap()),
        remote: Some(format!("10.77.0.2:{}", 40000 + id).parse().unwrap()),
        bytes_sent: id * 1000,
        bytes_received: id * 10,
        srtt_us: Some(100 + id),
        ..ConnRecord::default()
    }
}

fn write_words(path: &Path, words: &[(usize, u64)]) {
    let mut b = fs::read(path).unwrap();
    for &(i, v) in words {
        b[i * 8..i * 8 + 8].copy_from_slice(&v.to_ne_bytes());
    }
    fs::write(path, b).unwrap();
}

#[test]
fn a_segment_reads_back_what_was_written_and_is_removed_on_drop() {
    let dir = TempDir::new("rt");
    let seg = Segment::create_in(&dir.0, 3, &info(), small()).unwrap();
    let name = seg.path().file_name().unwrap().to_str().unwrap().to_owned();
    assert_eq!(parse_name(&name), Some((std::process::id(), 3)));
    // Nothing half-made is left behind: only the final name exists.
    let names: Vec<_> = fs::read_dir(&dir.0).unwrap().collect();
    assert_eq!(names.len(), 1);
    let e = EngineCounters {
        iterations: 42,
        sleep_ns: 7,
        ..EngineCounters::default()
    };
    let n = NicCounters {
        mode: crate::layout::MODE_VWIRE,
        rx_frames: 5,
        ..NicCounters::default()
    };
    let s = StackCounters {
        established: 2,
        ..StackCounters::default()
    };
    seg.set_engine(&e);
    seg.set_nic(&n);
    seg.set_stack(&s);
    let conns: Vec<_> = (1..=6).map(conn).collect();
    seg.publish_conns(&conns, conns.len());
    let qp = QpRecord {
        qp_num: 9,
        state: QpState::Rts,
        ..QpRecord::default()
    };
    seg.publish_qps(&[qp], 1);
    let snap = read_segment(seg.path()).unwrap();
    assert_eq!(snap.pid, std::process::id());
    assert_eq!(snap.index, 3);
    assert_eq!(snap.program, "unit-test");
    assert_eq!(snap.interface, "vwire");
    assert_eq!(snap.address, "10.77.0.1/24");
    assert_eq!(snap.liveness, Liveness::Alive);
    assert_eq!((snap.engine, snap.nic, snap.stack), (e, n, s));
    // Capacity 4: the first 4 are kept, 2 did not fit.
    assert_eq!(snap.conns.records, conns[..4].to_vec());
    assert_eq!(snap.conns.dropped, 2);
    assert!(snap.conns.consistent && snap.conns.published_unix_ns > 0);
    assert_eq!(snap.qps.records, vec![qp]);
    // A smaller table later shrinks the count.
    seg.publish_conns(&conns[..1], 1);
    let snap = read_segment(seg.path()).unwrap();
    assert_eq!((snap.conns.records.len(), snap.conns.dropped), (1, 0));
    let path = seg.path().to_path_buf();
    drop(seg);
    assert!(!path.exists(), "segment left behind after drop");
}

#[test]
fn readers_never_keep_a_torn_table() {
    let dir = TempDir::new("torn");
    let seg = Arc::new(Segment::create_in(&dir.0, 0, &info(), Capacity::default()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (seg, stop) = (seg.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut gen = 1u64;
            let mut recs = vec![ConnRecord::default(); 200];
            while !stop.load(Ordering::Relaxed) {
                // Every field of every record carries the generation; the count varies.
                let n = 1 + (gen % 200) as usize;
                for r in &mut recs[..n] {
                    *r = ConnRecord {
                        id: gen,
                        bytes_sent: gen,
                        bytes_received: gen,
                        mss: gen,
                        retransmits: n as u64,
                        ..ConnRecord::default()
                    };
                }
                seg.publish_conns(&recs[..n], n);
                gen += 1;
                // A short pause between publications (the engine publishes every 100 ms):
                // a writer that never pauses would starve the reader's retries on 2 cores,
                // while publications still overlap many of the reads.
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            gen
        })
    };
    let mut seen = 0;
    let mut gens = std::collections::HashSet::new();
    let t = std::time::Instant::now();
    while t.elapsed() < std::time::Duration::from_millis(500) {
        let snap = read_segment(seg.path()).unwrap();
        let recs = &snap.conns.records;
        if !snap.conns.consistent || recs.is_empty() {
            continue;
        }
        let g = recs[0].id;
        for r in recs {
            assert_eq!((r.id, r.bytes_sent, r.bytes_received, r.mss), (g, g, g, g));
            assert_eq!(
                r.retransmits,
                recs.len() as u64,
                "count from another generation"
            );
        }
        gens.insert(g);
        seen += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(seen > 10, "only {seen} consistent reads");
    assert!(
        gens.len() > 1,
        "reads never saw the writer progress ({written} written)"
    );
}

#[test]
fn a_table_left_mid_update_reads_as_inconsistent_not_torn() {
    let dir = TempDir::new("mid");
    let seg = Segment::create_in(&dir.0, 0, &info(), small()).unwrap();
    seg.publish_conns(&[conn(1)], 1);
    // The writer "dies" between its two sequence stores: the sequence stays odd.
    let off = read_off(seg.path(), h::CONNS);
    write_words(seg.path(), &[(off, 7)]);
    let snap = read_segment(seg.path()).unwrap();
    assert!(!snap.conns.consistent);
    assert!(snap.conns.records.is_empty());
    assert!(snap.qps.consistent);
}

fn read_off(path: &Path, at: usize) -> usize {
    let b = fs::read(path).unwrap();
    let off = u64::from_ne_bytes(b[at * 8..at * 8 + 8].try_into().unwrap());
    off as usize / 8
}

/// Pid of a process that has exited.
fn dead_pid() -> u32 {
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

#[test]
fn segments_of_dead_or_reused_pids_are_stale_and_cleaned() {
    let dir = TempDir::new("stale");
    let live = Segment::create_in(&dir.0, 0, &info(), small()).unwrap();
    // A copy claiming a dead pid (as if that process had been killed).
    let dead = dead_pid();
    let dead_path = dir.0.join(crate::segment_name(dead, 0));
    fs::copy(live.path(), &dead_path).unwrap();
    write_words(&dead_path, &[(h::PID, u64::from(dead))]);
    // A copy claiming our pid with another start time (the pid was reused).
    let reused_path = dir.0.join(crate::segment_name(std::process::id(), 9));
    fs::copy(live.path(), &reused_path).unwrap();
    write_words(&reused_path, &[(h::START_TICKS, 1)]);
    // Junk under a segment name from a dead pid: unreadable, stale by its name.
    let junk_path = dir.0.join(crate::segment_name(dead, 1));
    fs::write(&junk_path, b"not a segment").unwrap();
    // Not segment names at all: ignored.
    fs::write(dir.0.join("xwarp-notes"), b"x").unwrap();
    fs::write(dir.0.join(".xwarp-1-0.tmp"), b"x").unwrap();

    let found = scan(&dir.0).unwrap();
    assert_eq!(found.len(), 4, "{found:?}");
    let by_path = |p: &Path| found.iter().find(|f| f.path == p).unwrap();
    let l = by_path(live.path());
    assert!(!l.is_stale());
    assert_eq!(l.segment.as_ref().unwrap().liveness, Liveness::Alive);
    let d = by_path(&dead_path);
    assert_eq!(d.segment.as_ref().unwrap().liveness, Liveness::Dead);
    assert!(d.is_stale());
    let r = by_path(&reused_path);
    assert_eq!(r.segment.as_ref().unwrap().liveness, Liveness::PidReused);
    assert!(r.is_stale());
    let j = by_path(&junk_path);
    assert!(matches!(j.segment, Err(ReadError::Short { .. })));
    assert!(j.is_stale());

    let cleaned = clean(&dir.0).unwrap();
    assert!(cleaned.failed.is_empty(), "{:?}", cleaned.failed);
    let mut removed = cleaned.removed;
    removed.sort();
    let mut want = vec![dead_path, reused_path, junk_path];
    want.sort();
    assert_eq!(removed, want);
    assert!(live.path().exists());
    let left = scan(&dir.0).unwrap();
    assert_eq!(left.len(), 1);
    // A stopped engine whose file is still there reads as stopped.
    write_words(live.path(), &[(h::STATE, STATE_STOPPED)]);
    let s = read_segment(live.path()).unwrap();
    assert_eq!(s.liveness, Liveness::Stopped);
}

#[test]
fn bad_files_give_clear_errors() {
    let dir = TempDir::new("bad");
    let seg = Segment::create_in(&dir.0, 0, &info(), small()).unwrap();
    let good = fs::read(seg.path()).unwrap();
    let p = dir.0.join("victim");
    let check = |bytes: &[u8], want: &str| {
        fs::write(&p, bytes).unwrap();
        let e = read_segment(&p).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(want), "{msg:?} lacks {want:?}");
    };
    check(b"", "truncated segment: 0 bytes");
    check(&good[..100], "truncated segment: 100 bytes");
    // The header promises more than the file holds.
    check(&good[..good.len() - 8], "truncated segment");
    let mut b = good.clone();
    b[0] ^= 0xff;
    check(&b, "not an xwarp stats segment");
    let mut b = good.clone();
    b[8..16].copy_from_slice(&99u64.to_ne_bytes());
    check(&b, "layout version 99");
    let patch = |at: usize, v: u64| {
        let mut b = good.clone();
        b[at * 8..at * 8 + 8].copy_from_slice(&v.to_ne_bytes());
        b
    };
    check(&patch(h::CONNS + 1, u64::MAX / 2), "connection table");
    check(&patch(h::QPS + 2, 3), "QP table: 3 words per record");
    check(&patch(h::ENGINE, 12), "engine counters: bad offset 12");
    check(&patch(h::NIC, 8), "NIC counters: bad offset 8");
    check(&patch(h::SIZE, 7), "corrupt segment header: size 7");
    check(&patch(h::PID, u64::MAX), "pid");
    assert!(matches!(
        read_segment(&dir.0.join("missing")),
        Err(ReadError::Io(_))
    ));
    // Random bytes after a valid header decode (no panic), whatever they are.
    let mut b = good.clone();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for byte in b[crate::layout::HEADER_WORDS * 8..].iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *byte = x as u8;
    }
    fs::write(&p, &b).unwrap();
    let s = read_segment(&p);
    assert!(s.is_ok(), "{s:?}");
    assert_eq!(
        u64::from_ne_bytes(good[..8].try_into().unwrap()),
        MAGIC,
        "layout starts with the magic"
    );
}

#[test]
fn a_forked_child_does_not_remove_its_parents_segment() {
    let dir = TempDir::new("fork");
    let seg = Segment::create_in(&dir.0, 0, &info(), small()).unwrap();
    // SAFETY: the child only drops the segment (unlink attempt, skipped) and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        seg.remove();
        // SAFETY: plain _exit in the child.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(seg.path().exists());
}

#[test]
fn a_full_tmpfs_fails_segment_create_instead_of_sigbus() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: a_full_tmpfs_fails_segment_create_instead_of_sigbus needs root to mount a tmpfs");
        return;
    }
    let dir = TempDir::new("full");
    let c = |s: &str| std::ffi::CString::new(s).unwrap();
    let (src, target, fstype, opts) = (
        c("tmpfs"),
        c(dir.0.to_str().unwrap()),
        c("tmpfs"),
        c("size=64k"),
    );
    // SAFETY: valid NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            opts.as_ptr().cast(),
        )
    };
    if rc != 0 {
        eprintln!(
            "SKIPPED: a_full_tmpfs_fails_segment_create_instead_of_sigbus: mount tmpfs: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    struct Unmount(std::ffi::CString);
    impl Drop for Unmount {
        fn drop(&mut self) {
            // SAFETY: a valid NUL-terminated path; MNT_DETACH never blocks.
            unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
        }
    }
    let _u = Unmount(target.clone());
    // The default capacities need about 100 KiB, more than the 64 KiB tmpfs holds.
    let e = Segment::create_in(&dir.0, 0, &info(), Capacity::default()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert_eq!(
        fs::read_dir(&dir.0).unwrap().count(),
        0,
        "files left behind"
    );
    // A segment that fits still works.
    let seg = Segment::create_in(&dir.0, 1, &info(), small()).unwrap();
    seg.set_engine(&EngineCounters {
        iterations: 5,
        ..Default::default()
    });
    assert_eq!(read_segment(seg.path()).unwrap().engine.iterations, 5);
}

#[test]
fn the_reader_refuses_fifos_and_symlinks_without_blocking() {
    let dir = TempDir::new("fifo");
    let seg = Segment::create_in(&dir.0, 0, &info(), small()).unwrap();
    let fifo = dir.0.join("xwarp-1-0");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let link = dir.0.join("xwarp-2-0");
    std::os::unix::fs::symlink(seg.path(), &link).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (f2, l2) = (fifo.clone(), link.clone());
    std::thread::spawn(move || {
        let _ = tx.send((read_segment(&f2).map(|_| ()), read_segment(&l2).map(|_| ())));
    });
    let (f, l) = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the reader blocked on a FIFO");
    assert!(f.unwrap_err().to_string().contains("not a regular file"));
    let l = l.unwrap_err();
    assert!(
        matches!(&l, ReadError::Io(e) if e.raw_os_error() == Some(libc::ELOOP)),
        "{l}"
    );
    // scan reports both as errors and still reads the real segment.
    let found = scan(&dir.0).unwrap();
    assert_eq!(found.len(), 3);
    assert_eq!(found.iter().filter(|f| f.segment.is_ok()).count(), 1);
}

#[test]
fn crafted_headers_cannot_make_the_reader_allocate_unboundedly() {
    let dir = TempDir::new("craft");
    let seg = Segment::create_in(&dir.0, 0, &info(), small()).unwrap();
    seg.set_engine(&EngineCounters {
        iterations: 42,
        ..Default::default()
    });
    let good = fs::read(seg.path()).unwrap();
    let p = dir.0.join("victim");
    let patch = |at: usize, v: u64| {
        let mut b = good.clone();
        b[at * 8..at * 8 + 8].copy_from_slice(&v.to_ne_bytes());
        b
    };
    // A file above the cap is refused before anything is read from it.
    let f = fs::File::create(&p).unwrap();
    f.set_len(crate::reader::MAX_SEGMENT_BYTES + 8).unwrap();
    drop(f);
    let e = read_segment(&p).unwrap_err().to_string();
    assert!(e.contains("larger than"), "{e}");
    // A table capacity above 1 << 16 is refused.
    fs::write(&p, patch(h::QPS + 1, (1 << 16) + 1)).unwrap();
    let e = read_segment(&p).unwrap_err().to_string();
    assert!(e.contains("QP table: capacity 65537"), "{e}");
    // More engine counters than this reader knows (as many as fit): the known ones read.
    let eng = read_off(seg.path(), h::ENGINE);
    let fit = good.len() / 8 - eng;
    fs::write(&p, patch(h::ENGINE + 1, fit as u64)).unwrap();
    assert_eq!(read_segment(&p).unwrap().engine.iterations, 42);
}

#[test]
fn a_segment_truncated_while_read_gives_an_error_not_sigbus() {
    let dir = TempDir::new("trunc");
    let seg = Segment::create_in(&dir.0, 0, &info(), small()).unwrap();
    seg.publish_conns(&[conn(1), conn(2)], 2);
    let p = dir.0.join("xwarp-3-0");
    fs::copy(seg.path(), &p).unwrap();
    let full = fs::metadata(&p).unwrap().len();
    let stop = Arc::new(AtomicBool::new(false));
    let (s2, p2) = (stop.clone(), p.clone());
    let t = std::thread::spawn(move || {
        let f = fs::OpenOptions::new().write(true).open(&p2).unwrap();
        while !s2.load(Ordering::Relaxed) {
            f.set_len(crate::layout::HEADER_WORDS as u64 * 8).unwrap();
            f.set_len(full).unwrap();
        }
    });
    let (mut ok, mut err) = (0, 0);
    let until = std::time::Instant::now() + std::time::Duration::from_millis(300);
    while std::time::Instant::now() < until {
        match read_segment(&p) {
            Ok(_) => ok += 1,
            Err(_) => err += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    assert!(ok + err > 0);
    eprintln!("reads while truncating: {ok} ok, {err} errors");
}

#[test]
fn publishing_never_replaces_an_existing_file_and_remove_spares_a_replacement() {
    let dir = TempDir::new("noreplace");
    let pid = std::process::id();
    let taken = dir.0.join(format!("xwarp-{pid}-7"));
    fs::write(&taken, b"someone else's").unwrap();
    let seg = Segment::create_in(&dir.0, 7, &info(), small()).unwrap();
    assert_eq!(seg.index(), 8);
    assert_eq!(seg.path(), dir.0.join(format!("xwarp-{pid}-8")));
    assert_eq!(read_segment(seg.path()).unwrap().index, 8);
    assert_eq!(fs::read(&taken).unwrap(), b"someone else's");
    // Another file put at the segment's name is not unlinked by remove().
    let other = dir.0.join("other");
    fs::write(&other, b"new owner").unwrap();
    fs::rename(&other, seg.path()).unwrap();
    let path = seg.path().to_path_buf();
    drop(seg);
    assert_eq!(fs::read(&path).unwrap(), b"new owner");
    assert_eq!(fs::read(&taken).unwrap(), b"someone else's");
    // Our own segment is removed as before.
    let seg = Segment::create_in(&dir.0, 20, &info(), small()).unwrap();
    let path = seg.path().to_path_buf();
    drop(seg);
    assert!(!path.exists());
}

#[test]
fn clean_removes_tmp_files_of_dead_pids() {
    let dir = TempDir::new("tmpclean");
    let dead = dir.0.join(format!(".xwarp-{}-0.tmp", dead_pid()));
    let live = dir.0.join(format!(".xwarp-{}-0.tmp", std::process::id()));
    fs::write(&dead, b"x").unwrap();
    fs::write(&live, b"x").unwrap();
    assert_eq!(parse_tmp_name(".xwarp-12-3.tmp"), Some((12, 3)));
    assert_eq!(parse_tmp_name("xwarp-12-3.tmp"), None);
    assert_eq!(parse_tmp_name(".xwarp-12-3"), None);
    let c = clean(&dir.0).unwrap();
    assert_eq!(c.removed, vec![dead.clone()]);
    assert!(!dead.exists() && live.exists());
}

#[test]
fn segment_text_reaches_the_reader_without_control_characters() {
    assert_eq!(decode_text(b"ab\x1b[2Jc\0zz"), "ab?[2Jc");
    let dir = TempDir::new("ctl");
    let seg = Segment::create_in(
        &dir.0,
        0,
        &SegmentInfo {
            program: "evil\x1b]0;title\x07".into(),
            interface: "eth\r\n0".into(),
            address: "10.0.0.1/24\u{9b}".into(),
        },
        small(),
    )
    .unwrap();
    let s = read_segment(seg.path()).unwrap();
    assert_eq!(s.program, "evil?]0;title?");
    assert_eq!(s.interface, "eth??0");
    assert_eq!(s.address, "10.0.0.1/24?");
}

#[test]
fn a_new_engine_sweeps_segments_of_killed_processes_but_not_of_other_pid_namespaces() {
    let dir = TempDir::new("sweep");
    let live = Segment::create_in(&dir.0, 0, &info(), small()).unwrap();
    assert_ne!(crate::pid_namespace(), 0, "no /proc/self/ns/pid");
    let dead = dead_pid();
    // Killed without its exit hook: dead pid, our namespace.
    let killed = dir.0.join(crate::segment_name(dead, 0));
    fs::copy(live.path(), &killed).unwrap();
    write_words(&killed, &[(h::PID, u64::from(dead))]);
    // The same, written in another pid namespace: its pid means nothing here.
    let foreign = dir.0.join(crate::segment_name(dead, 1));
    fs::copy(live.path(), &foreign).unwrap();
    write_words(
        &foreign,
        &[
            (h::PID, u64::from(dead)),
            (h::PID_NS, crate::pid_namespace() + 1),
        ],
    );
    // Unreadable under a dead pid's name: left to `xwarp stat --clean`.
    let junk = dir.0.join(crate::segment_name(dead, 2));
    fs::write(&junk, b"not a segment").unwrap();

    assert_eq!(crate::reader::sweep_dead(&dir.0, 16), 1);
    assert!(!killed.exists());
    assert!(foreign.exists() && junk.exists() && live.path().exists());
    let f = read_segment(&foreign).unwrap();
    assert_eq!(f.liveness, Liveness::OtherNamespace);
    let found = scan(&dir.0).unwrap();
    assert!(!found.iter().find(|x| x.path == foreign).unwrap().is_stale());
    // The bound holds: nothing more to sweep, and max 0 removes nothing.
    assert_eq!(crate::reader::sweep_dead(&dir.0, 16), 0);
    assert_eq!(crate::reader::sweep_dead(&dir.0, 0), 0);
}
