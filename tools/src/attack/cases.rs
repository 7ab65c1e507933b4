//! The attacks. Each starts a fresh [`Lab`], a verified legitimate flow, measures it, runs
//! the attack, and returns the [`Outcome`] with its checks.

use std::collections::HashSet;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use xwarp::net::{TcpListener, TcpStream};
use xwarp::verbs::{
    Access, CompletionQueue, Listener, MemoryRegion, ProtectionDomain, QpInitAttr, QueuePair,
    SendOpcode, SendRequest,
};

use super::iwarp::{EvilIwarp, PendingIwarp, Saw};
use super::knobs;
use super::lab::{parse_segment, tcp_flags, Lab, LegitFlow, Meter, Rng, Segment, VICTIM_IP};
use super::Outcome;

const T: Duration = Duration::from_secs(10);
/// The victim's verbs listener.
const RDMA_PORT: u16 = 4791;
/// A second TCP listener whose application accepts everything (connection flood).
const FLOOD_PORT: u16 = 7001;
/// Bytes every guarded region holds before an attack.
const GUARD: u8 = 0xA5;
/// Bytes the attacker writes.
const EVIL: u8 = 0x5A;
/// Size of each guarded region.
const REGION: usize = 64 << 10;

/// A running case: the lab, the legitimate flow, and the outcome being filled in.
struct Case {
    lab: Lab,
    flow: LegitFlow,
    out: Outcome,
    meter: Option<Meter>,
}

impl Case {
    fn new(attack: &str, volume: u64, unit: &'static str, bound: String) -> io::Result<Case> {
        let lab = Lab::new()?;
        let flow = LegitFlow::start(&lab)?;
        std::thread::sleep(Duration::from_millis(150));
        let legit_base = flow.rate_over(Duration::from_millis(300));
        let before = lab.memory();
        Ok(Case {
            lab,
            flow,
            out: Outcome {
                attack: attack.into(),
                volume,
                unit,
                before,
                during: before,
                after: before,
                bound,
                legit_base,
                legit_during: 0.0,
                attacker_got: String::new(),
                outside_changed: 0,
                checks: Vec::new(),
            },
            meter: None,
        })
    }

    fn begin(&mut self) {
        self.meter = Some(Meter::begin(&self.flow));
    }

    /// The attack is over: measure during, wait, measure after.
    fn end(&mut self) {
        if let Some(m) = self.meter.take() {
            // A window of at least 300 ms, so a short attack still measures the flow.
            std::thread::sleep(Duration::from_millis(300).saturating_sub(m.elapsed()));
            self.out.legit_during = m.end(&self.flow);
        }
        self.out.during = self.lab.memory();
    }

    fn check(&mut self, what: impl Into<String>, ok: bool) {
        self.out.checks.push((what.into(), ok));
    }

    fn finish(mut self, rss_bound: u64) -> io::Result<Outcome> {
        if self.meter.is_some() {
            self.end();
        }
        std::thread::sleep(Duration::from_millis(200));
        let alive = self.flow.rate_over(Duration::from_millis(200)) > 0.0;
        self.out.after = self.lab.memory();
        let bad = self.flow.bad();
        let stopped = self.flow.stop();
        let grew = self
            .out
            .during
            .held()
            .saturating_sub(self.out.before.held());
        let what = if self.out.before.heap > 0 {
            "live heap"
        } else {
            "process RSS"
        };
        let frac = self.out.legit_fraction();
        self.out.checks.push((
            format!("{what} grew {} KiB <= {} KiB", grew >> 10, rss_bound >> 10),
            grew <= rss_bound,
        ));
        self.out.checks.push((
            "legitimate flow still moving after the attack".into(),
            alive,
        ));
        self.out.checks.push((
            format!(
                "legitimate flow ended cleanly ({:?})",
                stopped.as_ref().err()
            ),
            stopped.is_ok(),
        ));
        self.out
            .checks
            .push((format!("legitimate bytes wrong: {bad}"), bad == 0));
        self.out.checks.push((
            format!(
                "legitimate throughput during the attack {:.3} of without >= {}",
                frac,
                knobs::MIN_LEGIT_FRACTION
            ),
            frac >= knobs::MIN_LEGIT_FRACTION,
        ));
        let changed = self.out.outside_changed;
        self.out
            .checks
            .push((format!("bytes changed outside: {changed}"), changed == 0));
        Ok(self.out)
    }
}

fn spoofed(i: u64) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 0, 100 + (i % 4) as u8)
}

/// Count the victim's answers to spoofed sources: (RSTs, SYN-ACK flows).
fn tally(lab: &Lab, rsts: &mut u64, synacks: &mut HashSet<(Ipv4Addr, u16)>) {
    for f in lab.raw.drain() {
        if let Some(s) = parse_segment(&f) {
            if s.flags & tcp_flags::RST != 0 {
                *rsts += 1;
            }
            if s.flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN | tcp_flags::ACK {
                synacks.insert((s.dst, s.dport));
            }
        }
    }
}

/// Pure ACKs with valid checksums from spoofed sources and ports, no handshake
/// (issue 14 item 1). RFC 793 §3.4: a segment for no connection gets a RST.
pub fn spoofed_ack_flood(n: u64) -> io::Result<Outcome> {
    let mut c = Case::new(
        "spoofed-ack-flood",
        n,
        "ACKs",
        format!(
            "heap +{} MiB (flow table bounded)",
            knobs::ACK_FLOOD_RSS_BOUND >> 20
        ),
    )?;
    let mut rng = Rng::new(14);
    let (mut rsts, mut sa) = (0u64, HashSet::new());
    c.begin();
    for i in 0..n {
        let r = rng.next_u64();
        let dport = if i % 2 == 0 {
            super::lab::LEGIT_PORT
        } else {
            1024 + (r >> 48) as u16 % 50_000
        };
        let f = Segment {
            src: spoofed(i),
            sport: 1024 + (r as u16 % 60_000),
            dport,
            seq: (r >> 16) as u32,
            ack: (r >> 24) as u32,
            flags: tcp_flags::ACK,
            window: 1024,
            payload: &[],
        }
        .frame();
        c.lab.raw.send(f);
        if i % 4096 == 0 {
            tally(&c.lab, &mut rsts, &mut sa);
        }
    }
    std::thread::sleep(Duration::from_millis(100));
    tally(&c.lab, &mut rsts, &mut sa);
    c.end();
    c.out.attacker_got = format!("{rsts} RST (+{} lost)", c.lab.raw.lost());
    c.check("the attacker got RSTs (RFC 793 §3.4)", rsts > 0);
    c.finish(knobs::ACK_FLOOD_RSS_BOUND)
}

/// SYNs from spoofed sources that never complete: the victim keeps at most
/// `knobs::SYN_BACKLOG` handshakes in progress on the port.
pub fn syn_flood(n: u64) -> io::Result<Outcome> {
    let mut c = Case::new(
        "syn-flood",
        n,
        "SYNs",
        format!("half-open <= {} per port", knobs::SYN_BACKLOG),
    )?;
    let mut rng = Rng::new(15);
    let (mut rsts, mut sa) = (0u64, HashSet::new());
    c.begin();
    for i in 0..n {
        let r = rng.next_u64();
        let f = Segment {
            src: spoofed(i),
            sport: 1024 + (i % 60_000) as u16,
            dport: super::lab::LEGIT_PORT,
            seq: r as u32,
            ack: 0,
            flags: tcp_flags::SYN,
            window: 65535,
            payload: &[],
        }
        .frame();
        c.lab.raw.send(f);
        if i % 1024 == 0 {
            tally(&c.lab, &mut rsts, &mut sa);
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    tally(&c.lab, &mut rsts, &mut sa);
    // A new legitimate connection while the queue is full of spoofed handshakes.
    let addr = SocketAddr::from((VICTIM_IP, FLOOD_PORT));
    let l = TcpListener::bind(c.lab.victim.stack(), addr)?;
    let newconn = TcpStream::connect_timeout(c.lab.peer.stack(), addr, Duration::from_secs(3));
    drop(l);
    c.end();
    let dropped = c.out.during.stats.syn_dropped_backlog - c.out.before.stats.syn_dropped_backlog;
    c.out.attacker_got = format!(
        "SYN-ACK to {} flows, {rsts} RST, {dropped} SYNs dropped; new legit connect: {}",
        sa.len(),
        if newconn.is_ok() { "ok" } else { "failed" }
    );
    c.check(
        format!(
            "half-open handshakes {} <= {}",
            sa.len(),
            knobs::SYN_BACKLOG
        ),
        sa.len() <= knobs::SYN_BACKLOG,
    );
    c.finish(knobs::RSS_BOUND)
}

/// Real connections (full handshakes) to a listener whose application accepts them all:
/// the engine holds at most `knobs::MAX_CONNECTIONS`; beyond it connections are refused.
pub fn connection_flood(n: u64) -> io::Result<Outcome> {
    let mut c = Case::new(
        "connection-flood",
        n,
        "connections",
        format!("<= {} connections", knobs::MAX_CONNECTIONS),
    )?;
    let addr = SocketAddr::from((VICTIM_IP, FLOOD_PORT));
    let listener = TcpListener::bind_with_backlog(c.lab.victim.stack(), addr, 1024)?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let acceptor = std::thread::spawn(move || {
        let mut held = Vec::new();
        let mut l = listener;
        let _ = l.set_nonblocking(true);
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            match l.accept() {
                Ok((s, _)) => held.push(s),
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        held.len()
    });
    c.begin();
    // Non-blocking: beyond the limit the victim may drop SYNs rather than reset them.
    let mut conns = Vec::new();
    let mut refused = 0u64;
    for _ in 0..n {
        match TcpStream::connect_nonblocking(c.lab.peer.stack(), addr) {
            Ok(s) => conns.push((s, None)),
            Err(_) => refused += 1,
        }
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && conns.iter().any(|(_, r)| r.is_none()) {
        for (s, r) in conns.iter_mut().filter(|(_, r)| r.is_none()) {
            match s.poll_connect() {
                Ok(true) => *r = Some(true),
                Ok(false) => {}
                Err(_) => *r = Some(false),
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let ok = conns.iter().filter(|(_, r)| *r == Some(true)).count() as u64;
    refused += conns.iter().filter(|(_, r)| *r == Some(false)).count() as u64;
    let unanswered = n - ok - refused;
    std::thread::sleep(Duration::from_millis(100));
    c.end();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let accepted = acceptor.join().unwrap_or(0);
    drop(conns);
    c.out.attacker_got =
        format!("{ok} connected ({accepted} accepted), {refused} refused, {unanswered} unanswered");
    let held = c.out.during.connections();
    c.check(
        format!(
            "attacker connections {ok} <= {} (refused beyond)",
            knobs::MAX_CONNECTIONS
        ),
        ok as usize <= knobs::MAX_CONNECTIONS,
    );
    c.check(
        format!(
            "victim holds {held} connections <= {}",
            knobs::MAX_CONNECTIONS + 1
        ),
        held as usize <= knobs::MAX_CONNECTIONS + 1,
    );
    c.finish(two_engine_bound(n))
}

/// Heap bound of a flood of `n` connections: the heap is the process's, so the attacker's
/// own engine (every socket it opened, `n`; rejected ones linger in TIME-WAIT) lives in it
/// beside the victim (at most `MAX_CONNECTIONS + 1` sockets, its `max_sockets`).
fn two_engine_bound(n: u64) -> u64 {
    let victim = (knobs::MAX_CONNECTIONS as u64 + 1) * knobs::BYTES_PER_CONNECTION;
    let attacker = n * knobs::BYTES_PER_CONNECTION;
    victim + attacker + knobs::RSS_BOUND
}

/// Valid MPA Requests the application never looks at: at most `knobs::MPA_BACKLOG`
/// stay pending, the rest are refused (Reject, RST or close).
pub fn mpa_request_flood(n: u64) -> io::Result<Outcome> {
    let mut c = Case::new(
        "mpa-request-flood",
        n,
        "MPA Requests",
        format!("<= {} pending", knobs::MPA_BACKLOG),
    )?;
    let listener = c
        .lab
        .victim
        .device()
        .listen(SocketAddr::from((VICTIM_IP, RDMA_PORT)), knobs::MPA_BACKLOG)?;
    c.begin();
    // Non-blocking connects: a full engine may drop SYNs instead of resetting them.
    let addr = SocketAddr::from((VICTIM_IP, RDMA_PORT));
    let mut conns = Vec::new();
    let mut connect_failed = 0u64;
    for _ in 0..n {
        match TcpStream::connect_nonblocking(c.lab.peer.stack(), addr) {
            Ok(s) => conns.push((s, None)),
            Err(_) => connect_failed += 1,
        }
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && conns.iter().any(|(_, r)| r.is_none()) {
        for (s, r) in conns.iter_mut().filter(|(_, r)| r.is_none()) {
            match s.poll_connect() {
                Ok(true) => *r = Some(true),
                Ok(false) => {}
                Err(_) => *r = Some(false),
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut pend = Vec::new();
    for (s, r) in conns {
        match r {
            Some(true) => match PendingIwarp::over(s, 1, 1) {
                Ok(p) => pend.push(p),
                Err(_) => connect_failed += 1,
            },
            _ => connect_failed += 1,
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut kinds = std::collections::BTreeMap::<String, u64>::new();
    let mut pending = 0u64;
    for p in pend {
        let s = p.probe(Duration::from_millis(30));
        if s == Saw::Nothing {
            pending += 1;
        }
        *kinds.entry(s.to_string()).or_default() += 1;
    }
    c.end();
    drop(listener);
    c.out.attacker_got = format!(
        "{} ; TCP connect failed {connect_failed}",
        kinds
            .iter()
            .map(|(k, v)| format!("{v}× {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    c.check(
        format!("pending MPA Requests {pending} <= {}", knobs::MPA_BACKLOG),
        pending as usize <= knobs::MPA_BACKLOG,
    );
    c.finish(two_engine_bound(n))
}

/// The byte at stream offset `off` of the out-of-order flood's connection.
fn ooo_byte(off: u64) -> u8 {
    (off % 239) as u8 ^ 0x3c
}

/// A spoofed source completes a handshake by hand, then sends segments scattered over
/// the receive window and never the first bytes (reassembly flood). The victim answers
/// each with an immediate duplicate ACK (RFC 9293 §3.10.7.4, RFC 5681 §4.2), holds no
/// more than its receive buffer, and once the hole is filled delivers correct bytes.
pub fn ooo_flood(n: u64) -> io::Result<Outcome> {
    let mut c = Case::new(
        "ooo-segment-flood",
        n,
        "segments",
        format!("receive buffer {} KiB", knobs::SOCKET_BUFFER >> 10),
    )?;
    let addr = SocketAddr::from((VICTIM_IP, FLOOD_PORT));
    let mut listener = TcpListener::bind(c.lab.victim.stack(), addr)?;
    listener.set_nonblocking(true)?;
    let src = Ipv4Addr::new(10, 77, 0, 150);
    let sport = 40_000;
    let isn = 0x1000_0000u32;
    let seg = |seq: u32, ack: u32, flags: u8, payload: &[u8]| {
        Segment {
            src,
            sport,
            dport: FLOOD_PORT,
            seq,
            ack,
            flags,
            window: 65535,
            payload,
        }
        .frame()
    };
    c.lab.raw.send(seg(isn, 0, tcp_flags::SYN, &[]));
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut their = None;
    while their.is_none() && Instant::now() < deadline {
        for f in c.lab.raw.drain() {
            if let Some(s) = parse_segment(&f) {
                if s.dport == sport && s.flags & (tcp_flags::SYN | tcp_flags::ACK) == 0x12 {
                    their = Some(s.seq);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let y = their.ok_or_else(|| io::Error::other("no SYN-ACK to the spoofed handshake"))?;
    c.lab.raw.send(seg(isn + 1, y + 1, tcp_flags::ACK, &[]));
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut app = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(e),
        }
    };
    let data = |off: u64, len: usize| {
        (0..len as u64)
            .map(|k| ooo_byte(off + k))
            .collect::<Vec<u8>>()
    };
    let window = (knobs::SOCKET_BUFFER as u64 / 2).max(8192);
    let mut rng = Rng::new(16);
    let mut dupacks = 0u64;
    let count = |lab: &Lab, dupacks: &mut u64| {
        for f in lab.raw.drain() {
            if let Some(s) = parse_segment(&f) {
                if s.dport == sport && s.ack == isn + 1 && s.flags & tcp_flags::ACK != 0 {
                    *dupacks += 1;
                }
            }
        }
    };
    c.begin();
    for i in 0..n {
        let off = 1024 + (rng.next_u64() % (window - 2048)) / 512 * 512;
        let f = seg(
            isn + 1 + off as u32,
            y + 1,
            tcp_flags::ACK | tcp_flags::PSH,
            &data(off, 512),
        );
        c.lab.raw.send(f);
        if i % 256 == 0 {
            count(&c.lab, &mut dupacks);
        }
    }
    std::thread::sleep(Duration::from_millis(100));
    count(&c.lab, &mut dupacks);
    c.end();
    // Fill the hole and read what the application gets.
    for off in [0u64, 512] {
        c.lab.raw.send(seg(
            isn + 1 + off as u32,
            y + 1,
            tcp_flags::ACK | tcp_flags::PSH,
            &data(off, 512),
        ));
    }
    app.set_read_timeout(Some(Duration::from_millis(300)))?;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(800) {
        match std::io::Read::read(&mut app, &mut buf) {
            Ok(0) => break,
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(_) => break,
        }
    }
    let wrong = got
        .iter()
        .enumerate()
        .filter(|(k, &b)| b != ooo_byte(*k as u64))
        .count();
    c.lab
        .raw
        .send(seg(isn + 1 + window as u32, y + 1, tcp_flags::RST, &[]));
    c.out.attacker_got = format!(
        "{dupacks} duplicate ACKs; app read {} bytes after the hole was filled",
        got.len()
    );
    c.check(
        format!("duplicate ACKs for out-of-order segments ({dupacks})"),
        dupacks > 0,
    );
    c.check(
        format!(
            "reassembled bytes correct ({} read, {wrong} wrong)",
            got.len()
        ),
        got.len() >= 1024 && wrong == 0,
    );
    c.finish(knobs::RSS_BOUND)
}

/// Regions the attacker must not touch, filled with [`GUARD`]: one in the attacker's PD
/// without remote access, one no-access, one with remote write in another PD.
struct Guards {
    _pd_b: ProtectionDomain,
    regions: Vec<MemoryRegion>,
}

impl Guards {
    fn new(lab: &Lab, pd_a: &ProtectionDomain) -> io::Result<Guards> {
        let pd_b = lab.victim.device().alloc_pd();
        let regions = vec![
            pd_a.alloc_mr(REGION, Access::LOCAL_WRITE, false)?,
            pd_a.alloc_mr(REGION, Access::NONE, false)?,
            pd_b.alloc_mr(REGION, Access::LOCAL_WRITE | Access::REMOTE_WRITE, false)?,
        ];
        for r in &regions {
            r.fill(0, REGION, GUARD)?;
        }
        Ok(Guards {
            _pd_b: pd_b,
            regions,
        })
    }

    fn changed(&self) -> u64 {
        self.regions
            .iter()
            .map(|r| {
                r.to_vec(0, REGION)
                    .map(|v| v.iter().filter(|&&b| b != GUARD).count() as u64)
                    .unwrap_or(REGION as u64)
            })
            .sum()
    }

    fn stag(&self, i: usize) -> u32 {
        self.regions[i].rkey().0
    }
}

/// One victim QP the attacker connected to.
struct Victim {
    _scq: CompletionQueue,
    rcq: CompletionQueue,
    scq_ref: CompletionQueue,
    qp: Option<QueuePair>,
}

/// Accept one attacker connection on `listener` with a fresh QP in `pd`, the attacker
/// running `PendingIwarp::start` meanwhile.
fn accept_attacker(
    lab: &Lab,
    listener: &Listener,
    pd: &ProtectionDomain,
    ird: u32,
) -> io::Result<(EvilIwarp, Victim)> {
    let dev = lab.victim.device();
    let scq = dev.create_cq(64)?;
    let rcq = dev.create_cq(64)?;
    let qp = {
        let mut a = QpInitAttr::new(&scq, &rcq);
        a.ird = ird;
        a.ord = 1;
        pd.create_qp(&a)?
    };
    let p = PendingIwarp::start(
        lab.peer.stack(),
        SocketAddr::from((VICTIM_IP, RDMA_PORT)),
        1,
        ird as u16,
    )?;
    let req = listener.get_request(T)?;
    req.accept(&qp, b"")?;
    let evil = p
        .finish(T)
        .map_err(|s| io::Error::other(format!("attacker not connected: {s}")))?;
    Ok((
        evil,
        Victim {
            scq_ref: scq.clone(),
            _scq: scq,
            rcq,
            qp: Some(qp),
        },
    ))
}

/// A flood of 1-byte RDMA Writes into a region the attacker may write: every byte lands
/// where it should, nothing else changes, no Terminate.
pub fn tiny_fpdu_flood(n: u64) -> io::Result<Outcome> {
    let mut c = Case::new(
        "tiny-fpdu-flood",
        n,
        "FPDUs",
        "RSS bound, no queueing".into(),
    )?;
    let dev = c.lab.victim.device().clone();
    let pd = dev.alloc_pd();
    let guards = Guards::new(&c.lab, &pd)?;
    let target = pd.alloc_mr(REGION, Access::LOCAL_WRITE | Access::REMOTE_WRITE, false)?;
    target.fill(0, REGION, GUARD)?;
    let listener = dev.listen(SocketAddr::from((VICTIM_IP, RDMA_PORT)), 4)?;
    let (mut evil, _v) = accept_attacker(&c.lab, &listener, &pd, 1)?;
    c.begin();
    let mut batch = Vec::new();
    for i in 0..n {
        let off = (i % REGION as u64) as usize;
        let f = evil.write_fpdu(
            target.rkey().0,
            target.addr() + off as u64,
            &[off as u8],
            true,
        );
        batch.extend_from_slice(&f);
        if batch.len() > 60_000 {
            evil.raw(&batch)?;
            batch.clear();
        }
    }
    evil.raw(&batch)?;
    let (saw, _) = evil.watch(Duration::from_millis(500));
    c.end();
    let placed = target.to_vec(0, REGION)?;
    let expect = |off: usize| if (off as u64) < n { off as u8 } else { GUARD };
    let wrong = placed
        .iter()
        .enumerate()
        .filter(|(o, &b)| b != expect(*o))
        .count();
    c.out.outside_changed = guards.changed();
    c.out.attacker_got = saw.to_string();
    c.check(
        format!("no Terminate for valid Writes ({saw})"),
        saw == Saw::Nothing,
    );
    c.check(format!("target bytes wrong: {wrong}"), wrong == 0);
    c.finish(knobs::RSS_BOUND)
}

/// More Read Requests than the negotiated IRD at once: Terminate RDMAP remote operation
/// 0x07 (docs/ddp-rdmap.md §3.6), and no byte of another region leaves.
pub fn read_beyond_ird(n: u64) -> io::Result<Outcome> {
    let ird = knobs::VICTIM_IRD;
    let mut c = Case::new("read-beyond-ird", n, "Read Requests", format!("IRD {ird}"))?;
    let dev = c.lab.victim.device().clone();
    let pd = dev.alloc_pd();
    let guards = Guards::new(&c.lab, &pd)?;
    let src = pd.alloc_mr(REGION, Access::LOCAL_WRITE | Access::REMOTE_READ, false)?;
    src.fill(0, REGION, 0x11)?;
    let listener = dev.listen(SocketAddr::from((VICTIM_IP, RDMA_PORT)), 4)?;
    let (mut evil, _v) = accept_attacker(&c.lab, &listener, &pd, ird)?;
    c.begin();
    let mut batch = Vec::new();
    for _ in 0..n {
        let f = evil.read_request_fpdu(0x1234_5600, src.rkey().0, src.addr(), 4096);
        batch.extend_from_slice(&f);
    }
    evil.raw(&batch)?;
    let (saw, fpdus) = evil.watch(Duration::from_secs(3));
    c.end();
    c.out.outside_changed = guards.changed();
    c.out.attacker_got = format!("{saw} after {fpdus} FPDUs");
    c.check(
        format!("Terminate 0/2/0x07 for Reads beyond IRD (got {saw})"),
        saw.is_terminate(0, 2, 0x07),
    );
    c.finish(knobs::RSS_BOUND)
}

/// What the victim does between the two halves of one Write FPDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MidFpdu {
    /// Local Invalidate of the target STag (completes before the rest arrives).
    LocalInvalidate,
    /// Deregister the target and register new regions in the same PD (slot reuse).
    Reregister,
    /// Destroy the QP.
    DestroyQp,
    /// A second attacker QP in the same PD invalidates the target with a Send with
    /// Invalidate (allowed: the target is a remote-access region of its PD).
    OtherQpInvalidate,
}

/// A 60 KiB Write FPDU split after its header and 1000 bytes; the victim revokes the
/// target meanwhile (issue 14 item 2). Nothing may land after the revocation; the
/// attacker gets Terminate DDP tagged "invalid STag" (1/1/0x00, docs/ddp-rdmap.md §2.6)
/// or, when the QP is gone, the connection ends.
pub fn mid_fpdu(what: MidFpdu) -> io::Result<Outcome> {
    let name = match what {
        MidFpdu::LocalInvalidate => "mid-fpdu-invalidate",
        MidFpdu::Reregister => "mid-fpdu-reregister",
        MidFpdu::DestroyQp => "mid-fpdu-destroy-qp",
        MidFpdu::OtherQpInvalidate => "mid-fpdu-send-inv-other-qp",
    };
    let mut c = Case::new(name, 60_000, "bytes", "0 bytes after revocation".into())?;
    let dev = c.lab.victim.device().clone();
    let pd = dev.alloc_pd();
    let mut guards = Guards::new(&c.lab, &pd)?;
    let target = pd.alloc_mr(REGION, Access::LOCAL_WRITE | Access::REMOTE_WRITE, false)?;
    target.fill(0, REGION, GUARD)?;
    let listener = dev.listen(SocketAddr::from((VICTIM_IP, RDMA_PORT)), 4)?;
    let (mut evil, mut v) = accept_attacker(&c.lab, &listener, &pd, 1)?;
    let data = vec![EVIL; 60_000];
    let fpdu = evil.write_fpdu(target.rkey().0, target.addr(), &data, true);
    let head = 2 + 14 + 1000;
    c.begin();
    evil.raw(&fpdu[..head])?;
    std::thread::sleep(Duration::from_millis(100));
    let mut target = Some(target);
    let mut note = String::new();
    let mut keep = None;
    match what {
        MidFpdu::LocalInvalidate => {
            let stag = target.as_ref().map(|t| t.rkey()).expect("target");
            let qp = v.qp.as_ref().expect("qp");
            qp.post_send(SendRequest::new(
                1,
                SendOpcode::LocalInvalidate(stag),
                vec![],
            ))
            .map_err(|e| io::Error::other(format!("{e:?}")))?;
            match v.scq_ref.next(Duration::from_secs(1)) {
                Ok(wc) => note = format!("invalidate completed: {:?}", wc.status),
                Err(_) => note = "invalidate did not complete within 1 s".into(),
            }
        }
        MidFpdu::Reregister => {
            drop(target.take());
            std::thread::sleep(Duration::from_millis(50));
            // Re-registrations into the freed slot: more than the 8-bit key can tell apart.
            for _ in 0..300 {
                let r = pd.alloc_mr(REGION, Access::LOCAL_WRITE, false)?;
                drop(r);
            }
            for _ in 0..4 {
                let r = pd.alloc_mr(REGION, Access::LOCAL_WRITE | Access::REMOTE_WRITE, false)?;
                r.fill(0, REGION, GUARD)?;
                guards.regions.push(r);
            }
        }
        MidFpdu::DestroyQp => {
            drop(v.qp.take());
            std::thread::sleep(Duration::from_millis(100));
        }
        MidFpdu::OtherQpInvalidate => {
            let (mut b, vb) = accept_attacker(&c.lab, &listener, &pd, 1)?;
            let recv = pd.alloc_mr(4096, Access::LOCAL_WRITE, false)?;
            vb.qp
                .as_ref()
                .expect("qp")
                .post_recv(1, &[recv.sge_all().expect("sge")])
                .map_err(|e| io::Error::other(format!("{e:?}")))?;
            let stag = target.as_ref().map(|t| t.rkey().0).expect("target");
            let f = b.send_fpdu(b"invalidate", Some(stag));
            b.raw(&f)?;
            note = match vb.rcq.next(Duration::from_secs(1)) {
                Ok(wc) => format!("other QP's Send with Invalidate: {:?}", wc.status),
                Err(_) => "other QP's Send with Invalidate: no receive completion".into(),
            };
            keep = Some((b, vb, recv));
        }
    }
    let _ = evil.raw(&fpdu[head..]);
    let (saw, _) = evil.watch(Duration::from_secs(2));
    c.end();
    // Bytes of the target after the first 1000 (what arrived before the revocation).
    let late = match &target {
        Some(t) => t
            .to_vec(1000, REGION - 1000)?
            .iter()
            .filter(|&&b| b == EVIL)
            .count() as u64,
        None => 0,
    };
    c.out.outside_changed = guards.changed() + late;
    c.out.attacker_got = format!(
        "{saw}{}",
        if note.is_empty() {
            String::new()
        } else {
            format!(" ({note})")
        }
    );
    let _ = (&v.rcq, &keep);
    match what {
        MidFpdu::DestroyQp => c.check(
            format!("the connection ends when the QP is destroyed (got {saw})"),
            matches!(saw, Saw::Reset | Saw::Eof | Saw::Terminate { .. }),
        ),
        _ => c.check(
            format!("Terminate 1/1/0x00 DDP tagged invalid STag (got {saw})"),
            saw.is_terminate(1, 1, 0x00),
        ),
    }
    c.finish(knobs::RSS_BOUND)
}

/// Which STag a Send with Invalidate names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendInv {
    /// A remote-write region of another PD.
    CrossPd,
    /// A local-only region of the attacker's own PD.
    LocalOnly,
}

/// Send with Invalidate of an STag the attacker may not invalidate (issue 14 item 3):
/// Terminate RDMAP code 0x09 "STag cannot be invalidated" (EType 1 or 2,
/// docs/ddp-rdmap.md §3.3), and the region stays valid: a Write into it from a
/// legitimate QP of its PD still lands.
pub fn send_invalidate(which: SendInv) -> io::Result<Outcome> {
    let name = match which {
        SendInv::CrossPd => "send-inv-cross-pd",
        SendInv::LocalOnly => "send-inv-local-only",
    };
    let mut c = Case::new(name, 1, "Send-with-Invalidate", "region stays valid".into())?;
    let dev = c.lab.victim.device().clone();
    let pd = dev.alloc_pd();
    let guards = Guards::new(&c.lab, &pd)?;
    let recv = pd.alloc_mr(4096, Access::LOCAL_WRITE, false)?;
    let listener = dev.listen(SocketAddr::from((VICTIM_IP, RDMA_PORT)), 4)?;
    let (mut evil, v) = accept_attacker(&c.lab, &listener, &pd, 1)?;
    v.qp.as_ref()
        .expect("qp")
        .post_recv(1, &[recv.sge_all().expect("sge")])
        .map_err(|e| io::Error::other(format!("{e:?}")))?;
    let (victim_stag, idx) = match which {
        SendInv::CrossPd => (guards.stag(2), 2),
        SendInv::LocalOnly => (guards.stag(0), 0),
    };
    c.begin();
    let f = evil.send_fpdu(b"invalidate!", Some(victim_stag));
    evil.raw(&f)?;
    let (saw, _) = evil.watch(Duration::from_secs(2));
    c.end();
    let valid = match which {
        // Still valid: a Write from a new QP in PD B lands.
        SendInv::CrossPd => {
            let (mut w, _vb) = accept_attacker(&c.lab, &listener, &guards._pd_b, 1)?;
            let f = w.write_fpdu(victim_stag, guards.regions[idx].addr(), &[EVIL; 16], true);
            w.raw(&f)?;
            let (s2, _) = w.watch(Duration::from_millis(500));
            let landed = guards.regions[idx].to_vec(0, 16)? == vec![EVIL; 16];
            guards.regions[idx].fill(0, 16, GUARD)?;
            s2 == Saw::Nothing && landed
        }
        SendInv::LocalOnly => true,
    };
    c.out.outside_changed = guards.changed();
    c.out.attacker_got = saw.to_string();
    let ok = matches!(
        saw,
        Saw::Terminate {
            layer: 0,
            etype: 1 | 2,
            code: 0x09
        }
    );
    c.check(format!("Terminate 0/1|2/0x09 (got {saw})"), ok);
    c.check("the named region is still valid afterwards", valid);
    c.finish(knobs::RSS_BOUND)
}

/// Writes to guessed STags, one connection per guess (a miss ends the stream): sequential
/// indices with low keys, the guesses an attacker makes against counting STags. With
/// random STags (rdmap fix) no guess lands; each miss gets 1/1/0x00.
pub fn stag_guessing(n: u64) -> io::Result<Outcome> {
    let mut c = Case::new("stag-guessing", n, "guesses", "0 hits".into())?;
    let dev = c.lab.victim.device().clone();
    let pd = dev.alloc_pd();
    let guards = Guards::new(&c.lab, &pd)?;
    // The secret region: remote write, the attacker knows its address but not its STag.
    let secret = pd.alloc_mr(REGION, Access::LOCAL_WRITE | Access::REMOTE_WRITE, false)?;
    secret.fill(0, REGION, GUARD)?;
    let listener = dev.listen(SocketAddr::from((VICTIM_IP, RDMA_PORT)), 4)?;
    let (mut hits, mut terms, mut other, mut landed_total) = (0u64, 0u64, 0u64, 0u64);
    let t0 = Instant::now();
    c.begin();
    for g in 0..n {
        if t0.elapsed() > Duration::from_secs(15) {
            break;
        }
        let (mut evil, _v) = accept_attacker(&c.lab, &listener, &pd, 1)?;
        // index 1.., key 0..: (index << 8) | key
        let index = 1 + (g / 4) as u32;
        let key = (g % 4) as u32;
        let stag = (index << 8) | key;
        let f = evil.write_fpdu(stag, secret.addr(), &[EVIL; 8], true);
        evil.raw(&f)?;
        let saw = evil.watch(Duration::from_millis(500)).0;
        // The oracle is the region itself: a guess hit if its bytes landed.
        if secret.to_vec(0, 8)?.iter().any(|&b| b != GUARD) {
            hits += 1;
            secret.fill(0, 8, GUARD)?;
            landed_total += 8;
        } else if saw.is_terminate(1, 1, 0x00) {
            terms += 1;
        } else {
            other += 1;
        }
    }
    c.end();
    let landed = secret
        .to_vec(0, REGION)?
        .iter()
        .filter(|&&b| b != GUARD)
        .count() as u64;
    c.out.outside_changed = guards.changed() + landed + landed_total;
    c.out.attacker_got = format!("{terms}× Terminate 1/1/0x00, {other} other, {hits} hits");
    c.check(
        format!("every miss got Terminate 1/1/0x00 ({other} other answers)"),
        other == 0,
    );
    c.check(format!("no guessed STag accepted ({hits} hits)"), hits == 0);
    c.finish(knobs::RSS_BOUND)
}
