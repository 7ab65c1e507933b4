//! perftest_peer — the CLIENT side of perftest's `ib_write_bw -R` / `ib_read_bw -R` /
//! `ib_send_bw -R`
//! (linux-rdma/perftest 6.06, Debian's `perftest 4.5+0.17`) on [`xwarp::verbs`] (an
//! AF_XDP verbs engine, placement on the engine thread), so a kernel siw peer can run the
//! perftest SERVER. Debian's own perftest clients run on xwarp too (`xwarp run`, the
//! `xwarp_lib_perftest_client` case); this one stays for what they cannot show: it
//! verifies the data of every Read (below).
//!
//! ```text
//! perftest_peer -a server [-p 18515] --test write|read|send [-s size] [-n iters]
//!               [--rx-depth N] [--crc]
//! ```
//!
//! perftest's control protocol with `-R` (docs/protocols.md §5.4; perftest_communication.c at
//! tag v4.5-0.17): a "comm" rdma_cm connection on the test port carries every control
//! message as one Send into a 56-byte receive (`sizeof(struct pingpong_dest)` in 6.06 —
//! no `tail_markers_vaddr`, so 56 bytes, not 64); the client always sends first, then waits
//! for the server's message of the same kind:
//!
//! 1. versions: 16 bytes, NUL-padded `"6.06"` (the server exits unless ours ≥ 5.70);
//! 2. cycle buffer (page size), cache-line size: 4-byte big-endian ints each;
//! 3. MTU: 2 bytes, the `ibv_mtu` enum as a decimal string (`"3"` = 1024, siw on a 1500-byte
//!    netdev);
//! 4. a handshake of 56-byte `pingpong_dest`s (zeroed), then the test connection (a second
//!    rdma_cm connection to the same port; IRD/ORD 0/0 for Write, `out_reads` for Read),
//!    then another handshake;
//! 5. three handshakes carrying our `pingpong_dest` (BE `lid, out_reads, qpn, psn, rkey`,
//!    4 pad bytes, BE `vaddr`, 16-byte GID, BE `srqn, gid_index`); the server's gives the
//!    rkey/vaddr of its buffer;
//! 6. the test on the test connection (`iters` RDMA Writes, or Reads, of `size` bytes to
//!    the server's buffer); the Send test differs: see [`send_test`];
//! 7. a handshake, the bandwidth report (5 exchanges: size u64, iters u64 (≥ 5.33),
//!    bw_peak, bw_avg, msg_rate as big-endian f64), a closing handshake; then both
//!    connections are closed.
//!
//! Data check: the Read test first RDMA-Writes a known pattern into the server's buffer
//! (perftest registers it REMOTE_READ|REMOTE_WRITE on iWARP) and verifies that every Read
//! returns it. The Write test cannot read back (the server's MR has no REMOTE_READ); it
//! verifies completions, ends with a zero-length Read as a fence (its response means the
//! server took every Write) and leaves the bytes to MPA CRC (run against siw-crc).
//! Output lines for the interop case: `XWARP-PERFTEST ...`.

use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use xwarp::poll_driver::backend::Backend;
use xwarp::verbs::{
    Access, CompletionStatus, ConnectParams, ConnectTuning, Context, MemoryRegion,
    ProtectionDomain, SendRequest, Stag, WcOpcode,
};

use xwarp_tools::support::conn::{start_engine, Conn};
use xwarp_tools::support::transport::NetArgs;

/// perftest's default port.
const DEFAULT_PORT: u16 = 18515;
/// `sizeof(struct pingpong_dest)` in perftest 6.06 (LP64).
const DEST_LEN: usize = 56;
/// The version we announce (the same protocol revision as the peer's).
const VERSION: &str = "6.06";
/// `MAX_VERSION`.
const VERSION_LEN: usize = 16;
/// Most Reads/Writes we keep in flight.
const WINDOW: usize = 16;
/// TCP handshake plus MPA negotiation, per connection attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a refused connect is tried again (`ConnectTuning::retry_refused`).
const CONNECT_RETRY: Duration = Duration::from_secs(20);
/// Local, remote-read and remote-write access.
const RW: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0);

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Test {
    /// ib_write_bw
    Write,
    /// ib_read_bw
    Read,
    /// ib_send_bw (with perftest's iWARP receive-credit scheme)
    Send,
}

#[derive(Parser, Debug)]
#[command(
    name = "xwarp-perftest-peer",
    version,
    about = "perftest -R client (write/read bw) over xwarp"
)]
struct Opts {
    /// Server address.
    #[arg(short = 'a')]
    addr: String,
    /// Port.
    #[arg(short = 'p', default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Which test the server runs.
    #[arg(long, value_enum)]
    test: Test,
    /// Message size.
    #[arg(short = 's', default_value_t = 4096)]
    size: u32,
    /// Iterations (perftest requires at least 5).
    #[arg(short = 'n', default_value_t = 100)]
    iters: u64,
    /// The server's receive depth (`ib_send_bw -r`; perftest default 512, capped at the
    /// iteration count): at most this many Sends beyond the last credit.
    #[arg(long, default_value_t = 512)]
    rx_depth: u64,
    /// Request MPA CRC on both connections.
    #[arg(long)]
    crc: bool,
    /// Debug output.
    #[arg(short = 'd')]
    debug: bool,
    /// The engine to run on (`--iface IF --addr A/P [--gateway G] [--rx-checksum
    /// verify]`); without these flags `XWARP_ENGINE=xdp:IF:A/P` names it.
    #[command(flatten)]
    net: NetArgs,
}

/// `struct pingpong_dest` as perftest 6.06 sends it (HAVE_ENDIAN: integers big-endian).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Dest {
    lid: i32,
    out_reads: i32,
    qpn: i32,
    psn: i32,
    rkey: u32,
    vaddr: u64,
    gid: [u8; 16],
    srqn: u32,
    gid_index: i32,
}

impl Dest {
    fn to_bytes(self) -> [u8; DEST_LEN] {
        let mut b = [0u8; DEST_LEN];
        b[0..4].copy_from_slice(&self.lid.to_be_bytes());
        b[4..8].copy_from_slice(&self.out_reads.to_be_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        b[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        b[32..48].copy_from_slice(&self.gid);
        b[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        b[52..56].copy_from_slice(&self.gid_index.to_be_bytes());
        b
    }

    fn parse(b: &[u8]) -> Result<Dest, String> {
        if b.len() < DEST_LEN {
            return Err(format!("pingpong_dest of {} bytes", b.len()));
        }
        let u32_at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut vaddr = [0u8; 8];
        vaddr.copy_from_slice(&b[24..32]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[32..48]);
        Ok(Dest {
            lid: u32_at(0) as i32,
            out_reads: u32_at(4) as i32,
            qpn: u32_at(8) as i32,
            psn: u32_at(12) as i32,
            rkey: u32_at(16),
            vaddr: u64::from_be_bytes(vaddr),
            gid,
            srqn: u32_at(48),
            gid_index: u32_at(52) as i32,
        })
    }
}

/// The comm connection: one 56-byte receive always posted, Sends of control messages.
struct Comm {
    c: Conn,
    send: MemoryRegion,
    recv: MemoryRegion,
}

fn e2s(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn post_err(e: xwarp::verbs::PostError) -> String {
    format!("posting a work request: {e:?}")
}

impl Comm {
    fn post_recv(&self) -> Result<(), String> {
        let sge = self.recv.sge(0, DEST_LEN).ok_or("comm receive buffer")?;
        self.c.qp.post_recv(2, &[sge]).map_err(post_err)
    }

    fn send(&mut self, data: &[u8]) -> Result<(), String> {
        self.send.write(0, data).map_err(e2s)?;
        let sge = self
            .send
            .sge(0, data.len())
            .ok_or("control message too long")?;
        self.c
            .qp
            .post_send(SendRequest::send(1, vec![sge]))
            .map_err(post_err)?;
        self.c
            .wait(WcOpcode::Send)
            .map_err(|e| format!("comm send: {e}"))?;
        Ok(())
    }

    fn recv(&mut self) -> Result<Vec<u8>, String> {
        let c = self
            .c
            .wait(WcOpcode::Recv)
            .map_err(|e| format!("comm recv: {e}"))?;
        let data = self
            .recv
            .to_vec(0, (c.byte_len as usize).min(DEST_LEN))
            .map_err(e2s)?;
        self.post_recv()?;
        Ok(data)
    }

    /// `ctx_xchg_data` / `ctx_hand_shake` as the client: write first, then read.
    fn xchg(&mut self, data: &[u8]) -> Result<Vec<u8>, String> {
        self.send(data)?;
        let got = self.recv()?;
        if got.len() != data.len() {
            return Err(format!(
                "control message of {} bytes, expected {}",
                got.len(),
                data.len()
            ));
        }
        Ok(got)
    }
}

/// Resolves `-a` (an IPv4 address or a host name) with port `-p`.
fn resolve(o: &Opts) -> Result<SocketAddr, String> {
    if let Ok(ip) = o.addr.parse::<Ipv4Addr>() {
        return Ok(SocketAddr::from((ip, o.port)));
    }
    (o.addr.as_str(), o.port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {}: {e}", o.addr))?
        .find(SocketAddr::is_ipv4)
        .ok_or(format!("{} has no IPv4 address", o.addr))
}

/// A QP (SQ 128, RQ 4) with IRD/ORD `ird`/`ord`, no P2P RTR (siw's perftest asks for
/// none), CRC as `--crc` says; `before` runs before the connect (post the first receive),
/// then it connects and waits for Established.
fn connect<B: Backend + Send + 'static>(
    o: &Opts,
    ctx: &Context<B>,
    pd: &ProtectionDomain,
    ird: u32,
    ord: u32,
    before: impl FnOnce(&Conn) -> Result<(), String>,
) -> Result<Conn, String> {
    let c = Conn::new(
        ctx,
        pd,
        256,
        |at| {
            at.max_send_wr = 128;
            at.max_recv_wr = 4;
            at.ird = ird;
            at.ord = ord;
            at.mpa.crc = o.crc;
            at.mpa.p2p_rtr = None;
        },
        o.debug,
    )?;
    before(&c)?;
    c.qp.connect_tuned(
        resolve(o)?,
        ConnectParams {
            private_data: Vec::new(),
            timeout: CONNECT_TIMEOUT,
        },
        ConnectTuning {
            // siw quirk (docs/siw.md §4.3): the perftest server's siw QP may not read an
            // FPDU arriving right behind its Reply; hold our first FPDU back briefly.
            first_fpdu_delay: Duration::from_millis(100),
            // perftest's server with -R does not listen between its comm and its test
            // connection for a moment (seen: the test connection refused), and the next
            // server in the guest starts a moment after the previous test ended.
            retry_refused: Some(CONNECT_RETRY),
            ..ConnectTuning::default()
        },
    )
    .map_err(e2s)?;
    c.established(CONNECT_TIMEOUT + Duration::from_secs(2))?;
    Ok(c)
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

/// The test connection and its registered buffer (`size × WINDOW` bytes).
struct TestConn {
    c: Conn,
    buf: MemoryRegion,
}

fn run<B: Backend + Send + 'static>(o: &Opts, ctx: &Context<B>) -> Result<(), String> {
    if o.iters < 5 {
        return Err("perftest needs at least 5 iterations".into());
    }
    let size = o.size as usize;
    let pd = ctx.device().alloc_pd();
    // ---- comm connection (perftest: conn_param 0/0; we advertise 1/1, siw relaxes)
    let send = pd
        .alloc_mr(DEST_LEN, Access::LOCAL_WRITE, false)
        .map_err(e2s)?;
    let recv = pd
        .alloc_mr(DEST_LEN, Access::LOCAL_WRITE, false)
        .map_err(e2s)?;
    let c = connect(o, ctx, &pd, 1, 1, |c| {
        let sge = recv.sge(0, DEST_LEN).ok_or("comm receive buffer")?;
        c.qp.post_recv(2, &[sge]).map_err(post_err)
    })?;
    let mut comm = Comm { c, send, recv };
    let mut v = [0u8; VERSION_LEN];
    v[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
    let rv = comm.xchg(&v)?;
    let rem_version =
        String::from_utf8_lossy(&rv[..rv.iter().position(|&b| b == 0).unwrap_or(rv.len())])
            .into_owned();
    let rcb = comm.xchg(&4096i32.to_be_bytes())?;
    let rcl = comm.xchg(&64i32.to_be_bytes())?;
    let rmtu = comm.xchg(b"3\0")?;
    println!(
        "XWARP-PERFTEST remote version={rem_version:?} cycle_buffer={} cache_line={} mtu={:?}",
        i32::from_be_bytes([rcb[0], rcb[1], rcb[2], rcb[3]]),
        i32::from_be_bytes([rcl[0], rcl[1], rcl[2], rcl[3]]),
        String::from_utf8_lossy(&rmtu[..1])
    );
    comm.xchg(&[0u8; DEST_LEN])?;

    // ---- test connection (Write: 0/0 → 1/1; Read: out_reads both ways)
    let (ird, ord) = match o.test {
        Test::Write | Test::Send => (1, 1),
        Test::Read => (WINDOW as u32, WINDOW as u32),
    };
    let window = WINDOW.max(1);
    let buf = pd.alloc_mr(size * window, RW, false).map_err(e2s)?;
    let tc = connect(o, ctx, &pd, ird, ord, |_| Ok(()))?;
    let q = tc.qp.query().map_err(e2s)?;
    let neg = q.negotiated.ok_or("no negotiation")?;
    println!(
        "XWARP-PERFTEST test connection crc={} ird={} ord={}",
        neg.crc, q.ird, q.ord
    );
    let mut test = TestConn { c: tc, buf };
    comm.xchg(&[0u8; DEST_LEN])?;

    let my = Dest {
        lid: 0,
        out_reads: ord as i32,
        qpn: 0x11,
        psn: 0x1234,
        rkey: test.buf.rkey().0,
        vaddr: test.buf.addr(),
        gid: [0; 16],
        srqn: 0,
        gid_index: 0,
    };
    if o.test == Test::Send {
        return send_test(o, &pd, comm, test, my);
    }
    let rem = Dest::parse(&comm.xchg(&my.to_bytes())?)?;
    comm.xchg(&my.to_bytes())?;
    comm.xchg(&my.to_bytes())?;
    println!(
        "XWARP-PERFTEST remote dest rkey={:#x} vaddr={:#x} out_reads={} qpn={:#x}",
        rem.rkey, rem.vaddr, rem.out_reads, rem.qpn
    );

    // ---- the test
    let pat = pattern(size);
    test.buf.write(0, &pat).map_err(e2s)?;
    let t0 = Instant::now();
    let (done, verified) = if o.test == Test::Write {
        (write_test(&mut test, o.iters, size, &rem)?, 0)
    } else {
        read_test(&mut test, o.iters, size, &rem, &pat, window)?
    };
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    let mbps = (done as f64 * size as f64) / secs / 1e6;
    let rate = done as f64 / secs / 1e6;
    println!(
        "XWARP-PERFTEST test={:?} size={size} iters={done} verified={verified} secs={secs:.3} MBps={mbps:.2}",
        o.test
    );

    // ---- results and close (client, half duplex)
    comm.xchg(&[0u8; DEST_LEN])?;
    comm.xchg(&(size as u64).to_be_bytes())?;
    comm.xchg(&done.to_be_bytes())?;
    comm.xchg(&mbps.to_bits().to_be_bytes())?;
    comm.xchg(&mbps.to_bits().to_be_bytes())?;
    comm.xchg(&rate.to_bits().to_be_bytes())?;
    comm.xchg(&[0u8; DEST_LEN])?;
    teardown(comm, test)
}

/// Closes the test connection, lingers, closes the comm connection (as perftest's client
/// tears the test QP down first).
fn teardown(comm: Comm, test: TestConn) -> Result<(), String> {
    test.c.close();
    // siw quirk (docs/siw.md §4.7 teardown; interop/README.md "siw completes a Send after
    // its TX path returns"): a FIN that arrives before siw completed its Send flushes that
    // WQE with an error although every byte was on the wire (seen: the server's last
    // handshake Send failing with status 2 when we closed 0.7 ms after receiving it).
    // perftest's own client spends that time tearing down the test QP; linger before
    // closing the comm connection.
    std::thread::sleep(Duration::from_millis(500));
    comm.c.close();
    println!(
        "XWARP-PERFTEST done test_cqes={:?} comm_cqes={:?}",
        test.c.stats, comm.c.stats
    );
    Ok(())
}

/// The credit count the server last RDMA-Wrote (u32, host byte order) at offset 4.
fn credit_count(credit: &MemoryRegion) -> Result<u64, String> {
    let c = credit.to_vec(4, 4).map_err(e2s)?;
    Ok(u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
}

/// `ib_send_bw` client: our `pingpong_dest` advertises the credit buffer (4 bytes the
/// server RDMA-Writes its receive count into, host byte order, every `rx_depth / 3`
/// receives — perftest's iWARP replacement for RNR retry, docs/siw.md §4.8.13);
/// four handshakes (the last after the server posted its receives), `iters` Sends of
/// `size` bytes with at most `rx_depth` beyond the last credit, the closing handshake.
/// No bandwidth report is exchanged in the half-duplex Send test.
fn send_test(
    o: &Opts,
    pd: &ProtectionDomain,
    mut comm: Comm,
    mut test: TestConn,
    mut my: Dest,
) -> Result<(), String> {
    let size = o.size as usize;
    // perftest: rx_depth is capped at iters and made even.
    let mut rx_depth = o.rx_depth.min(o.iters);
    rx_depth += rx_depth % 2;
    // ctrl_buf[0] (what a receiver would write) + credit_buf[0] at offset 4.
    let credit = pd.alloc_mr(8, RW, false).map_err(e2s)?;
    my.rkey = credit.rkey().0;
    my.vaddr = credit.addr() + 4;
    let rem = Dest::parse(&comm.xchg(&my.to_bytes())?)?;
    comm.xchg(&my.to_bytes())?;
    comm.xchg(&my.to_bytes())?;
    println!(
        "XWARP-PERFTEST remote dest rkey={:#x} vaddr={:#x} qpn={:#x} rx_depth={rx_depth}",
        rem.rkey, rem.vaddr, rem.qpn
    );
    // The server posts its receives, then this handshake.
    comm.xchg(&my.to_bytes())?;
    test.buf.write(0, &pattern(size)).map_err(e2s)?;
    let sge = test.buf.sge(0, size).ok_or("send buffer")?;
    let t0 = Instant::now();
    let (mut posted, mut done, mut max_credit) = (0u64, 0u64, 0u64);
    let mut idle_since = Instant::now();
    while done < o.iters {
        let credits = credit_count(&credit)?;
        max_credit = max_credit.max(credits);
        let mut progressed = false;
        while posted < o.iters
            && posted - done < WINDOW as u64
            && posted + 1 - credits.min(posted + 1) < rx_depth
        {
            test.c
                .qp
                .post_send(SendRequest::send(posted, vec![sge]))
                .map_err(post_err)?;
            posted += 1;
            progressed = true;
        }
        match test.c.poll(Duration::from_millis(5)).map_err(e2s)? {
            Some(c) if c.status != CompletionStatus::Success => {
                return Err(format!("{:?} {} failed: {:?}", c.opcode, c.wr_id, c.status));
            }
            Some(c) if c.opcode == WcOpcode::Send => {
                done += 1;
                progressed = true;
            }
            Some(c) => test.c.pending.push_back(c),
            None => {}
        }
        if let Some(why) = test.c.closed_event() {
            return Err(format!("test connection: {why}"));
        }
        if progressed {
            idle_since = Instant::now();
        } else if idle_since.elapsed() > Duration::from_secs(30) {
            return Err(format!(
                "stalled: {posted} posted, {done} done, credit {credits}"
            ));
        }
    }
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    // Credits that arrive after our last completion still count.
    std::thread::sleep(Duration::from_millis(300));
    max_credit = max_credit.max(credit_count(&credit)?);
    println!(
        "XWARP-PERFTEST test=Send size={size} iters={done} verified=0 credits={max_credit} secs={secs:.3} MBps={:.2}",
        (done as f64 * size as f64) / secs / 1e6
    );
    comm.xchg(&my.to_bytes())?;
    teardown(comm, test)
}

/// `iters` RDMA Writes of `size` bytes to the server's buffer, at most [`WINDOW`] in flight.
fn write_test(test: &mut TestConn, iters: u64, size: usize, rem: &Dest) -> Result<u64, String> {
    let sge = test.buf.sge(0, size).ok_or("write buffer")?;
    let (mut posted, mut done) = (0u64, 0u64);
    while done < iters {
        while posted < iters && posted - done < WINDOW as u64 {
            test.c
                .qp
                .post_send(SendRequest::write(
                    posted,
                    vec![sge],
                    Stag(rem.rkey),
                    rem.vaddr,
                ))
                .map_err(post_err)?;
            posted += 1;
        }
        test.c.wait(WcOpcode::Write).map_err(e2s)?;
        done += 1;
    }
    // A Write completes once its bytes are queued for TCP (as siw completes it), so the
    // last ones may still be in flight when the report tells the server the test is done,
    // and siw's server closes (then resets) the test connection on them. A zero-length
    // Read behind them is answered only after the server took every one (RDMAP orders it
    // behind them on the stream; a zero-length Read accesses no memory, like the Read RTR
    // of RFC 6581), so every Write reached the server before we report.
    let fence = test.buf.sge(0, 0).ok_or("fence sink")?;
    test.c
        .qp
        .post_send(SendRequest::read(
            iters + 1,
            fence,
            Stag(rem.rkey),
            rem.vaddr,
        ))
        .map_err(post_err)?;
    let c = test.c.wait(WcOpcode::Read).map_err(e2s)?;
    if c.byte_len != 0 {
        return Err(format!("the fence Read returned {} bytes", c.byte_len));
    }
    Ok(done)
}

/// Writes the pattern into the server's buffer, then `iters` Reads of it (at most
/// `window` in flight, each into its own slot), verifying every one. Returns
/// (reads done, reads verified).
fn read_test(
    test: &mut TestConn,
    iters: u64,
    size: usize,
    rem: &Dest,
    pat: &[u8],
    window: usize,
) -> Result<(u64, u64), String> {
    let src = test.buf.sge(0, size).ok_or("read buffer")?;
    // wr_id 0: slot 0 is the pattern's (the Reads use 1..window); `u64::MAX` would be
    // the engine's reserved RTR id, whose completion is never reported (xwarp::verbs docs).
    test.c
        .qp
        .post_send(SendRequest::write(0, vec![src], Stag(rem.rkey), rem.vaddr))
        .map_err(post_err)?;
    test.c.wait(WcOpcode::Write).map_err(e2s)?;
    // Slot 0 holds the source pattern; reads land in slots 1..window.
    let slots = (window - 1).max(1) as u64;
    let (mut posted, mut done, mut verified) = (0u64, 0u64, 0u64);
    let mut free: Vec<u64> = (1..=slots).collect();
    let zero = vec![0u8; size];
    while done < iters {
        while posted < iters {
            let Some(slot) = free.pop() else { break };
            let off = slot as usize * size;
            test.buf.write(off, &zero).map_err(e2s)?;
            let sink = test.buf.sge(off, size).ok_or("read slot")?;
            test.c
                .qp
                .post_send(SendRequest::read(slot, sink, Stag(rem.rkey), rem.vaddr))
                .map_err(post_err)?;
            posted += 1;
        }
        let c = test.c.wait(WcOpcode::Read).map_err(e2s)?;
        let off = c.wr_id as usize * size;
        let got = test.buf.to_vec(off, size).map_err(e2s)?;
        if got == pat && c.byte_len as usize == size {
            verified += 1;
        } else {
            return Err(format!("Read {done} returned different data"));
        }
        free.push(c.wr_id);
        done += 1;
    }
    Ok((done, verified))
}

fn main() -> ExitCode {
    xwarp_tools::cli::init_logging();
    let o: Opts = NetArgs::parse_checked(|o: &Opts| &o.net);
    let r = (|| {
        let spec = o.net.engine_spec()?.ok_or(
            "xwarp-perftest-peer runs on an xwarp engine: give --iface IF --addr \
             A.B.C.D/PREFIX (or XWARP_ENGINE=xdp:IF:A.B.C.D/PREFIX)",
        )?;
        let ctx = start_engine(&spec, "xwarp-perftest-peer")?;
        let r = run(&o, &ctx);
        // Stopping the engine sends what is queued and flushes the capture.
        if let Err(e) = ctx.stop() {
            eprintln!("xwarp: stopping the engine: {e}");
        }
        r
    })();
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("perftest_peer: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pingpong_dest_is_56_big_endian_bytes() {
        let d = Dest {
            lid: 1,
            out_reads: 2,
            qpn: 3,
            psn: 4,
            rkey: 0x0102_0304,
            vaddr: 0x1122_3344_5566_7788,
            gid: [9; 16],
            srqn: 5,
            gid_index: 6,
        };
        let b = d.to_bytes();
        assert_eq!(&b[16..20], &[1, 2, 3, 4]);
        assert_eq!(&b[20..24], &[0, 0, 0, 0]);
        assert_eq!(
            &b[24..32],
            &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]
        );
        assert_eq!(&b[52..56], &[0, 0, 0, 6]);
        assert_eq!(Dest::parse(&b).unwrap(), d);
        assert!(Dest::parse(&b[..55]).is_err());
    }
}
