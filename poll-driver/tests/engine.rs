//! Engine loop: idle engines sleep (and cost ~no CPU), wake on the doorbell, on frame
//! arrival and on deadlines; two engines joined by a virtual wire exchange frames.

mod common;

use common::*;
use crossbeam_channel::{Receiver, Sender};
use smoltcp::phy::{RxToken, TxToken};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xwarp_poll_driver::backend::Backend;
use xwarp_poll_driver::engine::{
    Doorbell, Engine, EngineConfig, EngineStats, PollOutcome, Service, SpinBudget,
};
use xwarp_poll_driver::vwire::{LinkConfig, VirtualNic, VirtualWire, WireConfig};

fn smol_now() -> smoltcp::time::Instant {
    smoltcp::time::Instant::from_millis(0)
}

/// Echoes every received Ethernet frame back with source and destination MACs swapped;
/// also executes "send this frame" requests from an application queue.
#[derive(Debug)]
struct Echo {
    requests: Receiver<Vec<u8>>,
    echoed: u64,
    requested: u64,
}

impl<B: Backend> Service<B> for Echo {
    fn poll(&mut self, dev: &mut B, _now: Instant) -> PollOutcome {
        let mut busy = false;
        while let Some((rx, tx)) = dev.receive(smol_now()) {
            busy = true;
            rx.consume(|frame| {
                if frame.len() >= 14 {
                    tx.consume(frame.len(), |out| {
                        out.copy_from_slice(frame);
                        out[0..6].copy_from_slice(&frame[6..12]);
                        out[6..12].copy_from_slice(&frame[0..6]);
                    });
                }
            });
            self.echoed += 1;
        }
        while let Ok(req) = self.requests.try_recv() {
            busy = true;
            if let Some(tx) = dev.transmit(smol_now()) {
                tx.consume(req.len(), |out| out.copy_from_slice(&req));
            }
            self.requested += 1;
        }
        PollOutcome {
            busy,
            next_deadline: None,
        }
    }
}

fn echo() -> (Echo, Sender<Vec<u8>>) {
    let (tx, rx) = crossbeam_channel::unbounded();
    (
        Echo {
            requests: rx,
            echoed: 0,
            requested: 0,
        },
        tx,
    )
}

fn cfg(name: &str) -> EngineConfig {
    EngineConfig {
        name: name.into(),
        spin: SpinBudget::Duration(Duration::from_micros(50)),
        ..EngineConfig::default()
    }
}

fn wait_for(mut f: impl FnMut() -> bool, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    f()
}

#[test]
fn idle_engine_sleeps_and_costs_almost_no_cpu() {
    let (_a, b) = VirtualWire::pair(WireConfig::default()).unwrap();
    let (svc, _req) = echo();
    let eng = Engine::spawn(cfg("idle"), b, svc).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let cpu0 = eng.cpu_time().unwrap();
    let s0 = eng.stats();
    let wall = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    let wall = wall.elapsed();
    let cpu = eng.cpu_time().unwrap() - cpu0;
    let s1 = eng.stats();
    assert!(s1.sleeps >= 1, "engine never slept: {s1:?}");
    // Asleep the whole time: no further iterations, no wakeups.
    assert_eq!(s1.iterations, s0.iterations, "{s0:?} -> {s1:?}");
    assert!(
        cpu * 20 < wall,
        "idle engine used {cpu:?} CPU in {wall:?} wall time"
    );
    let exit = eng.stop().unwrap();
    assert!(exit.error.is_none());
    assert!(exit.stats.wakeups_doorbell >= 1, "stop rings the doorbell");
}

#[test]
fn doorbell_wakes_a_sleeping_engine_and_is_free_while_awake() {
    let (mut a, b) = VirtualWire::pair(WireConfig::default()).unwrap();
    let (svc, req) = echo();
    let eng = Engine::spawn(cfg("bell"), b, svc).unwrap();
    let bell: Doorbell = eng.doorbell();
    let mut latencies = Vec::new();
    for round in 0..10u64 {
        // Wait until the engine is asleep (again).
        assert!(wait_for(
            || eng.stats().sleeps > round,
            Duration::from_secs(2)
        ));
        let s0 = eng.stats();
        let f = numbered_frame(round, 100);
        req.send(f.clone()).unwrap();
        let t = Instant::now();
        bell.ring();
        let mut buf = Vec::new();
        // Spin (bounded) rather than sleep so the measured latency means something.
        while !a.recv_frame(&mut buf) && t.elapsed() < Duration::from_secs(2) {
            std::hint::spin_loop();
        }
        latencies.push(t.elapsed());
        assert_eq!(buf, f);
        let s1 = eng.stats();
        assert!(s1.wakeups_doorbell > s0.wakeups_doorbell, "{s1:?}");
        assert_eq!(bell.syscalls(), round + 1, "one eventfd write per sleep");
    }
    latencies.sort();
    eprintln!(
        "doorbell -> frame on the wire from a sleeping engine: min {:?}, median {:?}",
        latencies[0], latencies[5]
    );
    // Rings while the engine is not asleep make no syscall.
    let (svc2, _r2) = echo();
    let (_x, y) = VirtualWire::pair(WireConfig::default()).unwrap();
    let spinner = Engine::spawn(
        EngineConfig {
            spin: SpinBudget::Forever,
            ..cfg("spinner")
        },
        y,
        svc2,
    )
    .unwrap();
    let b2 = spinner.doorbell();
    for _ in 0..1000 {
        b2.ring();
    }
    assert_eq!(b2.rings(), 1000);
    assert_eq!(b2.syscalls(), 0);
    let ex = spinner.stop().unwrap();
    assert_eq!(ex.stats.sleeps, 0);
    let exit = eng.stop().unwrap();
    assert_eq!(exit.service.requested, 10);
}

#[test]
fn doorbell_made_before_spawn_wakes_the_engine() {
    let (mut a, b) = VirtualWire::pair(WireConfig::default()).unwrap();
    let (svc, req) = echo();
    let bell = Doorbell::new().unwrap();
    let app_side = bell.clone();
    let eng = Engine::spawn_with_doorbell(cfg("prebell"), bell, b, svc).unwrap();
    assert!(wait_for(|| eng.stats().sleeps >= 1, Duration::from_secs(2)));
    let f = numbered_frame(42, 120);
    req.send(f.clone()).unwrap();
    app_side.ring();
    let mut back = Vec::new();
    assert!(wait_for(|| a.recv_frame(&mut back), Duration::from_secs(2)));
    assert_eq!(back, f);
    assert_eq!(
        eng.doorbell().syscalls(),
        1,
        "the handle shares the same doorbell"
    );
    drop(eng); // dropping the handle stops and joins the engine
}

#[test]
fn frame_arrival_wakes_a_sleeping_engine() {
    let (mut a, b) = VirtualWire::pair(WireConfig::default()).unwrap();
    let (svc, _req) = echo();
    let eng = Engine::spawn(cfg("rx"), b, svc).unwrap();
    let mut asleep_count = 0;
    for round in 0..5u64 {
        // Wait until the engine went back to sleep after the previous round.
        assert!(wait_for(
            || eng.stats().sleeps > asleep_count,
            Duration::from_secs(2)
        ));
        asleep_count = eng.stats().sleeps;
        let f = numbered_frame(round, 200);
        a.send_frame(&f);
        a.flush().unwrap();
        let mut back = Vec::new();
        assert!(wait_for(|| a.recv_frame(&mut back), Duration::from_secs(2)));
        // The echo swapped the MACs and kept the rest.
        assert_eq!(back[0..6], f[6..12]);
        assert_eq!(back[6..12], f[0..6]);
        assert_eq!(back[12..], f[12..]);
    }
    let exit = eng.stop().unwrap();
    assert!(exit.stats.wakeups_backend >= 5, "{:?}", exit.stats);
    assert_eq!(exit.service.echoed, 5);
    assert_eq!(exit.backend.stats().rx_frames, 5);
}

/// Sends `total` numbered frames with at most `window` unanswered, checks every echo.
struct Pinger {
    total: u64,
    window: u64,
    next: u64,
    verified: u64,
    len: usize,
    bad: u64,
    progress: Arc<AtomicU64>,
}

impl<B: Backend> Service<B> for Pinger {
    fn poll(&mut self, dev: &mut B, _now: Instant) -> PollOutcome {
        let mut busy = false;
        while let Some((rx, _tx)) = dev.receive(smol_now()) {
            busy = true;
            let ok = rx.consume(|f| {
                let mut want = numbered_frame(self.verified, self.len);
                let (d, s) = want.split_at_mut(6);
                d.swap_with_slice(&mut s[..6]);
                f == &want[..]
            });
            if ok {
                self.verified += 1;
            } else {
                self.bad += 1;
            }
            self.progress.store(self.verified, Ordering::Release);
        }
        while self.next < self.total && self.next - self.verified < self.window {
            let f = numbered_frame(self.next, self.len);
            if let Some(tx) = dev.transmit(smol_now()) {
                tx.consume(f.len(), |out| out.copy_from_slice(&f));
            }
            self.next += 1;
            busy = true;
        }
        PollOutcome {
            busy,
            next_deadline: None,
        }
    }
}

struct PingResult {
    verified: u64,
    bad: u64,
    elapsed: Duration,
    ping: EngineStats,
    echo: EngineStats,
}

fn ping_pong(config: WireConfig, total: u64, window: u64, pin: bool) -> PingResult {
    let (a, b) = VirtualWire::pair(config).unwrap();
    let (svc, _req) = echo();
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let core = |i: usize| {
        if pin {
            cores.get(i % cores.len().max(1)).map(|c| c.id)
        } else {
            None
        }
    };
    let echo_eng = Engine::spawn(
        EngineConfig {
            core: core(1),
            ..cfg("echo")
        },
        b,
        svc,
    )
    .unwrap();
    let progress = Arc::new(AtomicU64::new(0));
    let pinger = Pinger {
        total,
        window,
        next: 0,
        verified: 0,
        len: 1000,
        bad: 0,
        progress: progress.clone(),
    };
    let start = Instant::now();
    let ping_eng = Engine::spawn(
        EngineConfig {
            core: core(0),
            ..cfg("ping")
        },
        a,
        pinger,
    )
    .unwrap();
    wait_for(
        || progress.load(Ordering::Acquire) >= total,
        Duration::from_secs(30),
    );
    let elapsed = start.elapsed();
    let exit = ping_eng.stop().unwrap();
    let echo_exit = echo_eng.stop().unwrap();
    assert!(exit.error.is_none() && echo_exit.error.is_none());
    assert_eq!(
        echo_exit.backend.stats().tx_frames,
        echo_exit.service.echoed
    );
    PingResult {
        verified: exit.service.verified,
        bad: exit.service.bad,
        elapsed,
        ping: exit.stats,
        echo: echo_exit.stats,
    }
}

#[test]
fn two_engines_joined_by_a_vwire_exchange_frames() {
    let r = ping_pong(WireConfig::default(), 20_000, 64, true);
    assert_eq!(r.bad, 0);
    assert_eq!(r.verified, 20_000);
    let elapsed = r.elapsed;
    eprintln!(
        "20000 echoed 1000-byte frames (64 in flight) in {elapsed:?} ({:.0} k frames/s)",
        20_000.0 / elapsed.as_secs_f64() / 1000.0
    );
}

#[test]
fn engines_wake_for_delayed_frames_via_backend_deadlines() {
    let link = LinkConfig {
        delay: Duration::from_millis(3),
        ..LinkConfig::seeded(9)
    };
    let r = ping_pong(WireConfig::symmetric(1500, link), 300, 64, false);
    assert_eq!(r.bad, 0);
    assert_eq!(r.verified, 300);
    // Frames sat in the holding queue while both engines slept until their due time.
    assert!(
        r.ping.wakeups_timeout + r.echo.wakeups_timeout > 0,
        "{:?} {:?}",
        r.ping,
        r.echo
    );
}

#[test]
fn two_engines_one_frame_in_flight_round_trips() {
    let n = 5_000;
    let r = ping_pong(WireConfig::default(), n, 1, false);
    assert_eq!(r.bad, 0);
    assert_eq!(r.verified, n);
    eprintln!(
        "{n} sequential round trips of 1000-byte frames: {:.1} us mean",
        r.elapsed.as_secs_f64() * 1e6 / n as f64
    );
}

/// Records the CPU it runs on.
struct WhereAmI(Arc<AtomicU64>);

impl Service<VirtualNic> for WhereAmI {
    fn poll(&mut self, _dev: &mut VirtualNic, _now: Instant) -> PollOutcome {
        // SAFETY: sched_getcpu takes no arguments.
        let cpu = unsafe { libc::sched_getcpu() };
        self.0.store(cpu as u64, Ordering::Relaxed);
        PollOutcome::default()
    }
}

#[test]
fn engine_runs_on_the_configured_core() {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let Some(last) = cores.last() else {
        eprintln!("!!! SKIPPED: core_affinity reports no cores");
        return;
    };
    let cpu = Arc::new(AtomicU64::new(u64::MAX));
    let (_a, b) = VirtualWire::pair(WireConfig::default()).unwrap();
    let eng = Engine::spawn(
        EngineConfig {
            core: Some(last.id),
            max_sleep: Some(Duration::from_millis(1)),
            ..cfg("pinned")
        },
        b,
        WhereAmI(cpu.clone()),
    )
    .unwrap();
    // Bounded waits, not a fixed sleep: on a loaded 2-core CI machine the engine thread may
    // not run (or not reach its first timed sleep) within a few milliseconds.
    assert!(
        wait_for(
            || cpu.load(Ordering::Relaxed) != u64::MAX,
            Duration::from_secs(5)
        ),
        "the engine polled"
    );
    assert_eq!(cpu.load(Ordering::Relaxed), last.id as u64);
    assert!(
        wait_for(|| eng.stats().wakeups_timeout > 0, Duration::from_secs(5)),
        "max_sleep bounds each sleep: {:?}",
        eng.stats()
    );
    assert_eq!(cpu.load(Ordering::Relaxed), last.id as u64);
    let exit = eng.stop().unwrap();
    assert!(exit.stats.wakeups_timeout > 0);
}

#[test]
fn several_engines_in_one_process() {
    let mut handles = Vec::new();
    let mut peers = Vec::new();
    for i in 0..4 {
        let (a, b) = VirtualWire::pair(WireConfig::default()).unwrap();
        let (svc, _r) = echo();
        handles.push(Engine::spawn(cfg(&format!("multi{i}")), b, svc).unwrap());
        peers.push(a);
    }
    for (i, a) in peers.iter_mut().enumerate() {
        a.send_frame(&numbered_frame(i as u64, 90));
        a.flush().unwrap();
    }
    for (i, a) in peers.iter_mut().enumerate() {
        let mut back = Vec::new();
        assert!(wait_for(|| a.recv_frame(&mut back), Duration::from_secs(2)));
        assert_eq!(frame_seq(&back), i as u64);
    }
    let tids: std::collections::HashSet<i32> = handles.iter().map(|h| h.thread_id()).collect();
    assert_eq!(tids.len(), 4);
    for h in handles {
        assert_eq!(h.stop().unwrap().service.echoed, 1);
    }
}

#[test]
fn pinning_to_a_missing_core_is_an_error() {
    let (_a, b) = VirtualWire::pair(WireConfig::default()).unwrap();
    let (svc, _r) = echo();
    let err = Engine::spawn(
        EngineConfig {
            core: Some(100_000),
            ..cfg("nocore")
        },
        b,
        svc,
    )
    .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}

/// A service with a timer: asks to be polled every 10 ms and counts the polls that
/// happen at or after its deadline.
struct Ticker {
    next: Option<Instant>,
    ticks: u64,
}

impl Service<VirtualNic> for Ticker {
    fn poll(&mut self, _dev: &mut VirtualNic, now: Instant) -> PollOutcome {
        let next = *self.next.get_or_insert(now + Duration::from_millis(10));
        if now >= next {
            self.ticks += 1;
            self.next = Some(now + Duration::from_millis(10));
        }
        PollOutcome {
            busy: false,
            next_deadline: self.next,
        }
    }
}

#[test]
fn service_deadlines_wake_the_engine() {
    let (_a, b) = VirtualWire::pair(WireConfig::default()).unwrap();
    let eng = Engine::spawn(
        cfg("ticker"),
        b,
        Ticker {
            next: None,
            ticks: 0,
        },
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let exit = eng.stop().unwrap();
    // ~20 ticks in 200 ms; allow a slow, shared machine.
    assert!(
        (8..=21).contains(&exit.service.ticks),
        "ticks {}",
        exit.service.ticks
    );
    assert!(
        exit.stats.wakeups_timeout >= exit.service.ticks - 1,
        "{:?}",
        exit.stats
    );
    // And between ticks it slept rather than spun.
    assert!(exit.stats.iterations < 200_000, "{:?}", exit.stats);
}

/// A virtual NIC whose `flush` fails with a chosen error kind after `ok_flushes` calls.
struct Flaky {
    nic: VirtualNic,
    ok_flushes: u64,
    flushes: u64,
    kind: std::io::ErrorKind,
}

impl smoltcp::phy::Device for Flaky {
    type RxToken<'a> = <VirtualNic as smoltcp::phy::Device>::RxToken<'a>;
    type TxToken<'a> = <VirtualNic as smoltcp::phy::Device>::TxToken<'a>;
    fn receive(
        &mut self,
        t: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        self.nic.receive(t)
    }
    fn transmit(&mut self, t: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        self.nic.transmit(t)
    }
    fn capabilities(&self) -> smoltcp::phy::DeviceCapabilities {
        self.nic.capabilities()
    }
}

impl Backend for Flaky {
    fn flush(&mut self) -> std::io::Result<()> {
        self.flushes += 1;
        if self.flushes > self.ok_flushes {
            return Err(std::io::Error::new(self.kind, "injected"));
        }
        self.nic.flush()
    }
    fn poll_rx(&mut self) -> std::io::Result<bool> {
        self.nic.poll_rx()
    }
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        self.nic.wait_fd()
    }
    fn prepare_sleep(&mut self) -> std::io::Result<bool> {
        self.nic.prepare_sleep()
    }
    fn stats(&self) -> xwarp_poll_driver::backend::BackendStats {
        self.nic.stats()
    }
}

#[test]
fn hard_backend_errors_end_the_loop_and_soft_ones_are_counted() {
    use std::io::ErrorKind;
    let (_a, b) = VirtualWire::pair(WireConfig::default()).unwrap();
    let (svc, _r) = echo();
    let flaky = Flaky {
        nic: b,
        ok_flushes: 10,
        flushes: 0,
        kind: ErrorKind::BrokenPipe,
    };
    let eng = Engine::spawn(cfg("hard"), flaky, svc).unwrap();
    assert!(wait_for(|| eng.is_finished(), Duration::from_secs(2)));
    let exit = eng.stop().unwrap();
    let err = exit.error.expect("the loop reports why it ended");
    assert_eq!(err.kind(), ErrorKind::BrokenPipe);
    assert_eq!(exit.backend.flushes, 11, "no iteration after the failure");

    let (_a, b) = VirtualWire::pair(WireConfig::default()).unwrap();
    let (svc, _r) = echo();
    let flaky = Flaky {
        nic: b,
        ok_flushes: 0,
        flushes: 0,
        kind: ErrorKind::WouldBlock,
    };
    let eng = Engine::spawn(cfg("soft"), flaky, svc).unwrap();
    assert!(wait_for(|| eng.stats().sleeps >= 1, Duration::from_secs(2)));
    assert!(!eng.is_finished());
    let exit = eng.stop().unwrap();
    assert!(exit.error.is_none());
    assert_eq!(exit.stats.backend_soft_errors, exit.backend.flushes);
    assert!(exit.stats.backend_soft_errors > 0);
}
