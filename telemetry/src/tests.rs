use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::layout::{h, ConnRecord, QpRecord, QpState, MAGIC, STATE_STOPPED};
use crate::reader::{clean, parse_name, read_segment, scan, Liveness, ReadError};
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
