//! Memory regions over application memory registered in place
//! (`ProtectionDomain::register_raw`, the `ibv_reg_mr` model) between two verbs engines on
//! the virtual wire: RDMA Write, RDMA Read and Send land in and leave from heap (`Vec`),
//! stack (a local array) and `mmap`ed memory the test reaches through its own pointers,
//! data verified byte for byte; deregistration while Writes stream in returns only when
//! the engine let go (the memory is then made `PROT_NONE` — a stray write would SIGSEGV
//! this process — and a guard pattern stays intact); a Write to the dead STag gets the
//! RFC 5040/5041 invalid-STag Terminate; bad ranges are refused; a region outliving its
//! engine deregisters at once.

mod support;
use support::{Depths, End, T};

use std::time::{Duration, Instant};

use xwarp_poll_driver::vwire::VirtualNic;
use xwarp_verbs::{
    vwire_pair_simple, Access, CmEvent, CompletionQueue, CompletionStatus, Context, MemoryRegion,
    SendRequest, WcOpcode, WorkCompletion,
};

const ALL: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0);

const DEPTHS: Depths = Depths {
    cq: 4096,
    send_wr: 4096,
    recv_wr: 64,
};

/// Two engines and a connected (client, server) QP pair.
fn connected(port: u16) -> (Context<VirtualNic>, Context<VirtualNic>, End, End) {
    support::connected(port, DEPTHS)
}

fn wc(cq: &CompletionQueue) -> WorkCompletion {
    let t0 = Instant::now();
    loop {
        if let Some(w) = cq.poll_one() {
            return w;
        }
        assert!(t0.elapsed() < T, "no completion within {T:?}");
        let _ = cq.wait(Some(Duration::from_millis(50)));
    }
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) as u8 ^ (i >> 9) as u8
        })
        .collect()
}

/// FNV-1a over `len` bytes at `p` (read through the raw pointer, as C would).
fn hash(p: *const u8, len: usize) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for i in 0..len {
        // SAFETY: the callers pass live memory of at least `len` bytes.
        h = (h ^ u64::from(unsafe { p.add(i).read_volatile() })).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Three slices of `L` bytes per side. Client: [0, L) Write source, [L, 2L) Read sink,
/// [2L, 3L) Send source. Server: [0, L) Write sink, [L, 2L) Read source, [2L, 3L)
/// receive buffer.
const L: usize = 20_000;

/// Write, Read and Send between application memory at `cmem` (client) and `smem`
/// (server), both `3 * L` bytes, registered in place; each side writes its sources and
/// checks its sinks through its own pointers, never through the region.
fn exchange(c: &End, s: &End, cmem: *mut u8, smem: *mut u8, seed: u32) {
    // SAFETY (every raw access below): `cmem`/`smem` are live buffers of 3 * L bytes that
    // the callers keep valid until after both regions are deregistered at the end.
    let put = |p: *mut u8, off: usize, data: &[u8]| unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), p.add(off), data.len())
    };
    let get = |p: *mut u8, off: usize, len: usize| -> Vec<u8> {
        let mut v = vec![0u8; len];
        unsafe { std::ptr::copy_nonoverlapping(p.add(off), v.as_mut_ptr(), len) };
        v
    };
    let (w, r, snd) = (pattern(L, seed), pattern(L, seed + 1), pattern(L, seed + 2));
    put(cmem, 0, &w);
    put(cmem, L, &[0x11; L]);
    put(cmem, 2 * L, &snd);
    put(smem, 0, &[0x22; L]);
    put(smem, L, &r);
    put(smem, 2 * L, &[0x33; L]);
    let cmr = unsafe { c.pd.register_raw(cmem, 3 * L, ALL) }.unwrap();
    let smr = unsafe { s.pd.register_raw(smem, 3 * L, ALL) }.unwrap();
    assert!(cmr.is_foreign() && smr.is_foreign());
    // iova = addr, as ibv_reg_mr: the peer addresses the memory by its virtual address.
    assert_eq!((cmr.addr(), smr.addr()), (cmem as u64, smem as u64));
    assert_eq!(smr.len(), 3 * L);

    s.qp.post_recv(9, &[smr.sge(2 * L, L).unwrap()]).unwrap();
    c.qp.post_send(SendRequest::write(
        1,
        vec![cmr.sge(0, L).unwrap()],
        smr.rkey(),
        smem as u64,
    ))
    .unwrap();
    c.qp.post_send(SendRequest::read(
        2,
        cmr.sge(L, L).unwrap(),
        smr.rkey(),
        smem as u64 + L as u64,
    ))
    .unwrap();
    c.qp.post_send(SendRequest::send(3, vec![cmr.sge(2 * L, L).unwrap()]))
        .unwrap();
    let mut got: Vec<(u64, WcOpcode, CompletionStatus)> = (0..3)
        .map(|_| {
            let w = wc(&c.scq);
            (w.wr_id, w.opcode, w.status)
        })
        .collect();
    got.sort_by_key(|g| g.0);
    let ok = CompletionStatus::Success;
    assert_eq!(
        got,
        vec![
            (1, WcOpcode::Write, ok),
            (2, WcOpcode::Read, ok),
            (3, WcOpcode::Send, ok)
        ]
    );
    let rw = wc(&s.rcq);
    assert_eq!((rw.wr_id, rw.status, rw.byte_len as usize), (9, ok, L));

    // The Send's receive completed after the Write was placed (RDMAP ordering).
    assert!(get(smem, 0, L) == w, "Write landed in the server's memory");
    assert!(
        get(cmem, L, L) == r,
        "Read Response landed in the client's memory"
    );
    assert!(
        get(smem, 2 * L, L) == snd,
        "Send landed in the server's memory"
    );
    // Through the region the same bytes are seen.
    assert!(
        smr.to_vec(0, L).unwrap() == w,
        "the region reads other bytes"
    );
    assert_eq!(
        hash(smem, 3 * L),
        hash(smr.to_vec(0, 3 * L).unwrap().as_ptr(), 3 * L)
    );
    cmr.dereg().unwrap();
    smr.dereg().unwrap();
}

#[test]
fn write_read_send_into_and_out_of_heap_memory() {
    let (_a, _b, c, s) = connected(5101);
    let mut cv = vec![0u8; 3 * L];
    let mut sv = vec![0u8; 3 * L];
    exchange(&c, &s, cv.as_mut_ptr(), sv.as_mut_ptr(), 1);
    // Deregistered: the Vecs are ours again.
    cv.fill(0);
    sv.clear();
    sv.shrink_to_fit();
}

#[test]
fn write_read_send_into_and_out_of_stack_memory() {
    let (_a, _b, c, s) = connected(5102);
    // Local arrays of this thread's stack frame; both regions are deregistered inside
    // `exchange`, before the arrays go out of scope.
    let mut cstack = [0u8; 3 * L];
    let mut sstack = [0u8; 3 * L];
    exchange(&c, &s, cstack.as_mut_ptr(), sstack.as_mut_ptr(), 2);
    assert!(sstack[..L] == pattern(L, 2)[..], "stack Write sink");
    assert!(cstack[L..2 * L] == pattern(L, 3)[..], "stack Read sink");
}

/// An anonymous private mapping of `len` bytes (page-rounded), unmapped on drop.
struct Map {
    p: *mut u8,
    len: usize,
}

impl Map {
    fn new(len: usize) -> Map {
        let len = len.div_ceil(4096) * 4096;
        // SAFETY: a fresh anonymous mapping; checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(
            p,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        Map {
            p: p as *mut u8,
            len,
        }
    }

    fn protect(&self, prot: libc::c_int) {
        // SAFETY: this mapping, whole.
        let r = unsafe { libc::mprotect(self.p as *mut libc::c_void, self.len, prot) };
        assert_eq!(r, 0, "mprotect: {}", std::io::Error::last_os_error());
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: this mapping, unmapped once.
        unsafe { libc::munmap(self.p as *mut libc::c_void, self.len) };
    }
}

#[test]
fn write_read_send_into_and_out_of_mmap_memory() {
    let (_a, _b, c, s) = connected(5103);
    let cm = Map::new(3 * L);
    let sm = Map::new(3 * L);
    exchange(&c, &s, cm.p, sm.p, 3);
    drop((cm, sm)); // munmap right after deregistration
}

#[test]
fn scoped_and_static_registration_are_safe_forms_of_the_same() {
    let (_a, _b, c, s) = connected(5104);
    let src =
        c.pd.register_static(Box::leak(pattern(L, 7).into_boxed_slice()), ALL)
            .unwrap();
    assert!(src.is_foreign());
    let mut sink = vec![0u8; L];
    let sink_addr = sink.as_ptr() as u64;
    let note = s.pd.alloc_mr(64, ALL, false).unwrap();
    let done =
        s.pd.with_registered(&mut sink, ALL, |smr| {
            assert_eq!(smr.addr(), sink_addr);
            s.qp.post_recv(5, &[note.sge(0, 64).unwrap()]).unwrap();
            c.qp.post_send(SendRequest::write(
                1,
                vec![src.sge(0, L).unwrap()],
                smr.rkey(),
                smr.addr(),
            ))
            .unwrap();
            // A Send after the Write: its receive completes once the Write was placed.
            c.qp.post_send(SendRequest::send(2, vec![src.sge(0, 8).unwrap()]))
                .unwrap();
            let w = [wc(&c.scq).status, wc(&c.scq).status];
            (w, wc(&s.rcq).status)
        })
        .unwrap();
    let ok = CompletionStatus::Success;
    assert_eq!(done, ([ok, ok], ok));
    // The scope returned: deregistered, the borrow is over and the bytes are there.
    assert!(
        sink == pattern(L, 7),
        "the Write's bytes are not in the sink"
    );
    assert!(c.pd.register_static(Box::leak(Box::new([])), ALL).is_err());
}

#[test]
fn bad_ranges_are_refused_with_clear_errors() {
    let (a, _b) = vwire_pair_simple(Default::default()).unwrap();
    let pd = a.device().alloc_pd();
    let mut v = vec![0u8; 64];
    let p = v.as_mut_ptr();
    let cases: [(*mut u8, usize, &str); 4] = [
        (std::ptr::null_mut(), 64, "null address"),
        (p, 0, "zero length"),
        (p, usize::MAX, "length above isize::MAX"),
        (
            (usize::MAX - 15) as *mut u8,
            64,
            "address + length overflows",
        ),
    ];
    for (addr, len, why) in cases {
        // SAFETY: every case is refused before anything is registered.
        let e = unsafe { pd.register_raw(addr, len, ALL) }.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{why}");
        assert!(e.to_string().contains(why), "{e} does not say {why}");
    }
    // The valid one works.
    let mr = unsafe { pd.register_raw(p, 64, ALL) }.unwrap();
    mr.dereg().unwrap();
}

/// Expect a Terminate with `want` = (layer, etype, code) at the server (sent) and the
/// client (received).
fn expect_terminate(c: &End, s: &End, want: (u8, u8, u8)) {
    for (qp, sent) in [(&s.qp, true), (&c.qp, false)] {
        let t0 = Instant::now();
        loop {
            let e = qp
                .next_event(T)
                .unwrap_or_else(|e| panic!("no Terminate: {e}"));
            match e {
                CmEvent::TerminateSent { layer, etype, code } if sent => {
                    assert_eq!((layer, etype, code), want);
                    break;
                }
                CmEvent::TerminateReceived { layer, etype, code } if !sent => {
                    assert_eq!((layer, etype, code), want);
                    break;
                }
                _ => assert!(t0.elapsed() < T, "no Terminate"),
            }
        }
    }
}

/// DDP tagged buffer error, invalid STag (RFC 5041 §7.2: layer 1, EType 1, code 0).
const INVALID_STAG: (u8, u8, u8) = (1, 1, 0);

#[test]
fn rfc5040_write_to_a_deregistered_foreign_stag_gets_invalid_stag_terminate() {
    let (_a, _b, c, s) = connected(5105);
    let mut sv = vec![0u8; 4096];
    let smr = unsafe { s.pd.register_raw(sv.as_mut_ptr(), sv.len(), ALL) }.unwrap();
    let (rkey, addr) = (smr.rkey(), smr.addr());
    smr.dereg().unwrap();
    sv.fill(0x5a);
    let src = c.pd.alloc_mr(4096, ALL, false).unwrap();
    src.write(0, &pattern(4096, 9)).unwrap();
    c.qp.post_send(SendRequest::write(
        1,
        vec![src.sge(0, 4096).unwrap()],
        rkey,
        addr,
    ))
    .unwrap();
    expect_terminate(&c, &s, INVALID_STAG);
    assert!(
        sv.iter().all(|&b| b == 0x5a),
        "a byte landed after deregistration"
    );
}

#[test]
fn dereg_while_writes_stream_in_returns_only_when_the_engine_let_go() {
    const CHUNK: usize = 16 * 1024;
    const SLOTS: usize = 64;
    const WRITES: usize = 3000;
    let (_a, _b, c, s) = connected(5106);
    let map = Map::new(CHUNK * SLOTS);
    let smr = unsafe { s.pd.register_raw(map.p, map.len, ALL) }.unwrap();
    let src = c.pd.alloc_mr(CHUNK, ALL, false).unwrap();
    src.write(0, &pattern(CHUNK, 11)).unwrap();
    for i in 0..WRITES {
        let to = smr.addr() + ((i % SLOTS) * CHUNK) as u64;
        c.qp.post_send(SendRequest::write(
            i as u64,
            vec![src.sge(0, CHUNK).unwrap()],
            smr.rkey(),
            to,
        ))
        .unwrap();
    }
    // Writes are streaming in: wait until the first one is in the application's memory.
    let want = pattern(CHUNK, 11);
    let t0 = Instant::now();
    while smr.to_vec(0, CHUNK).unwrap() != want {
        assert!(t0.elapsed() < T, "the first Write never landed");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut done = 0;
    while c.scq.poll_one().is_some() {
        done += 1;
    }
    let rkey = smr.rkey();
    let t0 = Instant::now();
    smr.dereg().unwrap();
    let dereg_took = t0.elapsed();
    // From here the engine must never touch the mapping: at once no access at all (a
    // stray write by the engine thread would kill this process with SIGSEGV), later a
    // guard pattern.
    map.protect(libc::PROT_NONE);
    // One more Write after deregistration, in case the stream had already ended.
    c.qp.post_send(SendRequest::write(
        WRITES as u64,
        vec![src.sge(0, CHUNK).unwrap()],
        rkey,
        map.p as u64,
    ))
    .unwrap();
    expect_terminate(&c, &s, INVALID_STAG);
    // Every remaining work request completes (the rest flushed by the error).
    let mut statuses = vec![];
    while done + statuses.len() < WRITES + 1 {
        statuses.push(wc(&c.scq).status);
    }
    // Locally a Write completes once handed to TCP: most succeed, whatever the server did.
    let late_ok = statuses
        .iter()
        .filter(|&&st| st == CompletionStatus::Success)
        .count();
    // Let anything still on the wire arrive at the server while memory is PROT_NONE.
    std::thread::sleep(Duration::from_millis(200));
    map.protect(libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: the mapping is live and no region covers it any more.
    unsafe { std::ptr::write_bytes(map.p, 0xa5, map.len) };
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: readable again; nothing else refers to it.
    let guard = unsafe { std::slice::from_raw_parts(map.p, map.len) };
    assert!(
        guard.iter().all(|&b| b == 0xa5),
        "the engine wrote after deregistration"
    );
    eprintln!(
        "dereg took {dereg_took:?} with Writes streaming; {done} of {WRITES} sent when it \
         began, {late_ok} more sent before the Terminate, {} flushed",
        statuses.len() - late_ok
    );
}

#[test]
fn a_region_outliving_its_engine_deregisters_at_once() {
    let (a, b) = vwire_pair_simple(Default::default()).unwrap();
    let pd = a.device().alloc_pd();
    let mut v = vec![0u8; 8192];
    let mr: MemoryRegion = unsafe { pd.register_raw(v.as_mut_ptr(), v.len(), ALL) }.unwrap();
    let mr2 = unsafe { pd.register_raw(v.as_mut_ptr(), 4096, ALL) }.unwrap();
    drop(a);
    drop(b);
    // The engine stopped and dropped its table: both the explicit and the implicit
    // deregistration return without waiting for an answer.
    let t0 = Instant::now();
    mr.dereg().unwrap();
    drop(mr2);
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "waited {:?}",
        t0.elapsed()
    );
    v.fill(1);
    // Registering on a stopped engine fails cleanly.
    let e = unsafe { pd.register_raw(v.as_mut_ptr(), v.len(), ALL) }.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionAborted);
}
