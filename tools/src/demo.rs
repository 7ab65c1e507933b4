//! `xwarp demo`: the main job over the in-process virtual wire (no privileges needed).
//!
//! Two engines joined by a virtual wire with fault injection (loss, reordering,
//! duplication, delay). Over it, through `xwarp::verbs`: an rping-style exchange
//! (Send advert → Read → Send → Write → Send, data verified every iteration) and a short
//! RDMA Write bandwidth run (data hashed and compared); through `xwarp::net`: a TCP echo
//! on the same engines. Exits 0 only if every byte verified.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use xwarp::poll_driver::pcap::{self, CaptureSpec};
use xwarp::poll_driver::vwire::{LinkConfig, VirtualNic, WireConfig};

use xwarp::net::{PairConfig, TcpListener, TcpStream};
use xwarp::verbs::{
    vwire_pair, Access, CmEvent, CompletionQueue, CompletionStatus, ConnectParams, Context,
    QpInitAttr, QueuePair, SendRequest, Stag, WcOpcode, WorkCompletion,
};

const T: Duration = Duration::from_secs(10);
/// Options of `xwarp demo`.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// rping-style iterations (at least 1).
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub iterations: usize,
    /// Bytes per rping-style iteration (1 to 16 MiB).
    #[arg(long, value_name = "BYTES", default_value_t = 64 * 1024)]
    pub size: usize,
    /// MiB moved by the RDMA Write bandwidth run (1 to 4096).
    #[arg(long = "bw-mib", value_name = "MIB", default_value_t = 256)]
    pub bw_mib: usize,
    /// A perfect wire instead of one with fault injection.
    #[arg(long)]
    pub clean: bool,
    /// Record every frame of both engines: FILE for engine a, FILE with -e1 before the
    /// extension for engine b (pcapng; `.pcap`: classic pcap) [XWARP_PCAP].
    #[arg(long, value_name = "FILE", value_parser = crate::cli::pcap_arg)]
    pub pcap: Option<CaptureSpec>,
}

struct Opts {
    iterations: usize,
    size: usize,
    bw_bytes: usize,
    clean: bool,
}

/// Entry point of `xwarp demo`: runs two xwarp engines joined by an in-process virtual
/// wire with fault injection (`--clean`: a perfect wire) and checks an rping-style RDMA
/// exchange, an RDMA Write bandwidth run and a TCP echo.
pub fn main(a: &DemoArgs) -> ExitCode {
    let opts = Opts {
        iterations: a.iterations.max(1),
        size: a.size.clamp(1, 16 << 20),
        bw_bytes: a.bw_mib.clamp(1, 4096) << 20,
        clean: a.clean,
    };
    if let Some(spec) = &a.pcap {
        pcap::set_process_capture(Some(spec.clone()));
    }
    match run(&opts) {
        Ok(()) => {
            println!("demo: all data verified");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("demo: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn faults(seed: u64) -> LinkConfig {
    LinkConfig {
        drop: 0.002,
        duplicate: 0.001,
        reorder: 0.002,
        reorder_delay: Duration::from_micros(300),
        delay: Duration::from_micros(20),
        ..LinkConfig::seeded(seed)
    }
}

fn err(s: impl std::fmt::Display) -> String {
    s.to_string()
}

struct End {
    qp: QueuePair,
    scq: CompletionQueue,
    rcq: CompletionQueue,
}

fn end(ctx: &Context<VirtualNic>, pd: &xwarp::verbs::ProtectionDomain) -> Result<End, String> {
    let dev = ctx.device();
    let scq = dev.create_cq(64).map_err(err)?;
    let rcq = dev.create_cq(64).map_err(err)?;
    let mut a = QpInitAttr::new(&scq, &rcq);
    a.max_send_wr = 256;
    a.max_recv_wr = 64;
    a.mpa.crc = true;
    let qp = pd.create_qp(&a).map_err(err)?;
    Ok(End { qp, scq, rcq })
}

fn want(cq: &CompletionQueue, opcode: WcOpcode) -> Result<WorkCompletion, String> {
    let wc = cq
        .next(T)
        .map_err(|e| format!("waiting for {opcode:?}: {e}"))?;
    if wc.status != CompletionStatus::Success || wc.opcode != opcode {
        return Err(format!("expected {opcode:?}, got {wc:?}"));
    }
    Ok(wc)
}

/// An advert: address, rkey, length (as rping sends them).
fn advert(addr: u64, rkey: Stag, len: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&addr.to_be_bytes());
    b[8..12].copy_from_slice(&rkey.0.to_be_bytes());
    b[12..].copy_from_slice(&len.to_be_bytes());
    b
}

fn parse_advert(b: &[u8]) -> (u64, Stag, u32) {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    let mut k = [0u8; 4];
    k.copy_from_slice(&b[8..12]);
    let mut l = [0u8; 4];
    l.copy_from_slice(&b[12..16]);
    (
        u64::from_be_bytes(a),
        Stag(u32::from_be_bytes(k)),
        u32::from_be_bytes(l),
    )
}

fn fnv(data: &[u8], mut h: u64) -> u64 {
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

fn run(o: &Opts) -> Result<(), String> {
    let wire = if o.clean {
        WireConfig::default()
    } else {
        WireConfig {
            a_to_b: faults(1),
            b_to_a: faults(2),
            ..WireConfig::default()
        }
    };
    println!(
        "demo: two engines on a virtual wire (MTU {}), faults per direction: {}",
        wire.mtu,
        if o.clean {
            "none".to_string()
        } else {
            "drop 0.2%, duplicate 0.1%, reorder 0.2%, delay 20 us".to_string()
        }
    );
    let (a, b) = vwire_pair(PairConfig {
        wire,
        ..PairConfig::default()
    })
    .map_err(err)?;
    for p in pcap::active_captures() {
        println!("demo: capturing to {}", p.display());
    }
    let started = Instant::now();
    rping(&a, &b, o)?;
    write_bw(&a, &b, o)?;
    tcp_echo(&a, &b)?;
    println!(
        "demo: engine a: {} TCP resets, engine b: {} TCP resets; total {:.2} s",
        a.stack_stats().resets,
        b.stack_stats().resets,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// rping: client adverts its source buffer; server Reads it, asks for the sink, Writes
/// it back, says done; client compares.
fn rping(a: &Context<VirtualNic>, b: &Context<VirtualNic>, o: &Opts) -> Result<(), String> {
    let addr: SocketAddr = "10.77.0.2:7174".parse().map_err(err)?;
    let listener = b.device().listen(addr, 4).map_err(err)?;
    let cpd = a.device().alloc_pd();
    let spd = b.device().alloc_pd();
    let c = end(a, &cpd)?;
    let s = end(b, &spd)?;
    let acc = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let size = o.size;
    let c_src = cpd.alloc_mr(size, acc, false).map_err(err)?;
    let c_sink = cpd.alloc_mr(size, acc, false).map_err(err)?;
    let c_msg = cpd.alloc_mr(64, acc, false).map_err(err)?;
    let s_buf = spd.alloc_mr(size, acc, true).map_err(err)?;
    let s_msg = spd.alloc_mr(64, acc, false).map_err(err)?;

    let t0 = Instant::now();
    c.qp.connect(
        addr,
        ConnectParams {
            private_data: b"xwarp-demo rping".to_vec(),
            timeout: T,
        },
    )
    .map_err(err)?;
    let req = listener.get_request(T).map_err(err)?;
    println!(
        "rping: connection request from {} private data {:?} IRD/ORD {:?}/{:?}",
        req.peer,
        String::from_utf8_lossy(&req.private_data),
        req.peer_ird,
        req.peer_ord
    );
    req.accept(&s.qp, b"accepted").map_err(err)?;
    for (who, qp) in [("client", &c.qp), ("server", &s.qp)] {
        match qp.next_event(T).map_err(err)? {
            CmEvent::Established { crc, ird, ord, .. } => {
                println!("rping: {who} established (CRC {crc}, IRD {ird}, ORD {ord})")
            }
            e => return Err(format!("{who}: {e:?}")),
        }
    }
    println!(
        "rping: connected in {:.1} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );

    let t0 = Instant::now();
    let mut bytes = 0u64;
    for i in 0..o.iterations {
        let len = 1 + (size - 1) * (i + 1) / o.iterations;
        let data: Vec<u8> = (0..len)
            .map(|k| (k as u8).wrapping_mul(7).wrapping_add(i as u8))
            .collect();
        c_src.write(0, &data).map_err(err)?;
        c_sink.fill(0, len, 0).map_err(err)?;
        // Server: receive for the advert.
        s.qp.post_recv(1, &[s_msg.sge(0, 16).ok_or("sge")?])
            .map_err(|e| format!("{e:?}"))?;
        c.qp.post_recv(2, &[c_msg.sge(0, 16).ok_or("sge")?])
            .map_err(|e| format!("{e:?}"))?;
        // Client: advert of the source buffer.
        let adv = advert(c_src.addr(), c_src.rkey(), len as u32);
        c.qp.post_send(SendRequest {
            inline: Some(adv.to_vec()),
            ..SendRequest::send(10, vec![])
        })
        .map_err(|e| format!("{e:?}"))?;
        want(&c.scq, WcOpcode::Send)?;
        want(&s.rcq, WcOpcode::Recv)?;
        let (raddr, rkey, rlen) = parse_advert(&s_msg.to_vec(0, 16).map_err(err)?);
        // Server: Read the client's buffer.
        s.qp.post_send(SendRequest::read(
            11,
            s_buf.sge(0, rlen as usize).ok_or("sge")?,
            rkey,
            raddr,
        ))
        .map_err(|e| format!("{e:?}"))?;
        want(&s.scq, WcOpcode::Read)?;
        // Server: "go ahead" Send; client answers with the sink advert.
        s.qp.post_recv(3, &[s_msg.sge(0, 16).ok_or("sge")?])
            .map_err(|e| format!("{e:?}"))?;
        s.qp.post_send(SendRequest {
            inline: Some(b"go".to_vec()),
            ..SendRequest::send(12, vec![])
        })
        .map_err(|e| format!("{e:?}"))?;
        want(&s.scq, WcOpcode::Send)?;
        want(&c.rcq, WcOpcode::Recv)?;
        c.qp.post_recv(4, &[c_msg.sge(0, 16).ok_or("sge")?])
            .map_err(|e| format!("{e:?}"))?;
        let adv = advert(c_sink.addr(), c_sink.rkey(), len as u32);
        c.qp.post_send(SendRequest {
            inline: Some(adv.to_vec()),
            ..SendRequest::send(13, vec![])
        })
        .map_err(|e| format!("{e:?}"))?;
        want(&c.scq, WcOpcode::Send)?;
        want(&s.rcq, WcOpcode::Recv)?;
        let (waddr, wkey, wlen) = parse_advert(&s_msg.to_vec(0, 16).map_err(err)?);
        // Server: Write its copy into the client's sink, then "done".
        s.qp.post_send(SendRequest::write(
            14,
            vec![s_buf.sge(0, wlen as usize).ok_or("sge")?],
            wkey,
            waddr,
        ))
        .map_err(|e| format!("{e:?}"))?;
        s.qp.post_send(SendRequest {
            inline: Some(b"done".to_vec()),
            ..SendRequest::send(15, vec![])
        })
        .map_err(|e| format!("{e:?}"))?;
        want(&s.scq, WcOpcode::Write)?;
        want(&s.scq, WcOpcode::Send)?;
        want(&c.rcq, WcOpcode::Recv)?;
        let got = c_sink.to_vec(0, len).map_err(err)?;
        if got != data {
            return Err(format!("rping iteration {i}: data mismatch ({len} bytes)"));
        }
        bytes += 2 * len as u64;
    }
    let el = t0.elapsed().as_secs_f64();
    println!(
        "rping: {} iterations (sizes 1..{} bytes, Read + Write each), {} bytes moved and verified in {:.1} ms",
        o.iterations,
        size,
        bytes,
        el * 1e3
    );
    c.qp.disconnect().map_err(err)?;
    for (who, qp) in [("client", &c.qp), ("server", &s.qp)] {
        loop {
            match qp
                .next_event(T)
                .map_err(|e| format!("{who} disconnect: {e}"))?
            {
                CmEvent::Disconnected => break,
                CmEvent::Error(e) => return Err(format!("{who}: {e}")),
                _ => {}
            }
        }
    }
    println!("rping: disconnected gracefully");
    Ok(())
}

/// RDMA Write bandwidth: 64 KiB Writes from a 4 MiB ring into the server, pipelined;
/// the server's region is hashed at the end and compared with the client's data.
fn write_bw(a: &Context<VirtualNic>, b: &Context<VirtualNic>, o: &Opts) -> Result<(), String> {
    let addr: SocketAddr = "10.77.0.2:7175".parse().map_err(err)?;
    let listener = b.device().listen(addr, 4).map_err(err)?;
    let cpd = a.device().alloc_pd();
    let spd = b.device().alloc_pd();
    let c = end(a, &cpd)?;
    let s = end(b, &spd)?;
    let acc = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    const MSG: usize = 64 * 1024;
    const RING: usize = 4 << 20;
    let total = o.bw_bytes.div_ceil(MSG) * MSG;
    let src = cpd.alloc_mr(RING, acc, true).map_err(err)?;
    let dst = spd.alloc_mr(total, acc, true).map_err(err)?;
    let data: Vec<u8> = (0..RING).map(|k| (k as u8) ^ (k >> 12) as u8).collect();
    src.write(0, &data).map_err(err)?;
    c.qp.connect(addr, ConnectParams::default()).map_err(err)?;
    listener
        .get_request(T)
        .map_err(err)?
        .accept(&s.qp, &advert(dst.addr(), dst.rkey(), 0))
        .map_err(err)?;
    let (daddr, dkey) = match c.qp.next_event(T).map_err(err)? {
        CmEvent::Established { private_data, .. } if private_data.len() == 16 => {
            let (a, k, _) = parse_advert(&private_data);
            (a, k)
        }
        e => return Err(format!("bw connect: {e:?}")),
    };
    match s.qp.next_event(T).map_err(err)? {
        CmEvent::Established { .. } => {}
        e => return Err(format!("bw server: {e:?}")),
    }
    let n = total / MSG;
    let depth = 64;
    let signal_every = 16;
    let t0 = Instant::now();
    let (mut posted, mut done) = (0usize, 0usize);
    while done < n {
        while posted < n && posted - done < depth {
            let off = (posted * MSG) % RING;
            let mut wr = SendRequest::write(
                posted as u64,
                vec![src.sge(off, MSG).ok_or("sge")?],
                dkey,
                daddr + (posted * MSG) as u64,
            );
            wr.signaled = (posted + 1) % signal_every == 0 || posted + 1 == n;
            c.qp.post_send(wr).map_err(|e| format!("{e:?}"))?;
            posted += 1;
        }
        let wc = c.scq.next(T).map_err(|e| format!("bw: {e}"))?;
        if wc.status != CompletionStatus::Success {
            return Err(format!("bw: {wc:?}"));
        }
        done = wc.wr_id as usize + 1;
    }
    let el = t0.elapsed().as_secs_f64();
    // Make sure every Write was placed: a Send behind them arrives after them.
    s.qp.post_recv(1, &[dst.sge(0, 0).ok_or("sge")?])
        .map_err(|e| format!("{e:?}"))?;
    c.qp.post_send(SendRequest::send(99, vec![]))
        .map_err(|e| format!("{e:?}"))?;
    want(&s.rcq, WcOpcode::Recv)?;
    let mut want_h = 0xcbf2_9ce4_8422_2325u64;
    for i in 0..n {
        let off = (i * MSG) % RING;
        want_h = fnv(&data[off..off + MSG], want_h);
    }
    let mut got_h = 0xcbf2_9ce4_8422_2325u64;
    let mut chunk = vec![0u8; MSG];
    for i in 0..n {
        dst.read(i * MSG, &mut chunk).map_err(err)?;
        got_h = fnv(&chunk, got_h);
    }
    let gbps = total as f64 * 8.0 / el / 1e9;
    println!(
        "write_bw: {} MiB in {} x 64 KiB RDMA Writes: {:.3} s, {:.2} Gb/s ({:.0} MB/s, {:.0} msg/s); hash {:016x} {}",
        total >> 20,
        n,
        el,
        gbps,
        total as f64 / el / 1e6,
        n as f64 / el,
        got_h,
        if got_h == want_h { "verified" } else { "MISMATCH" }
    );
    if got_h != want_h {
        return Err("write_bw: data mismatch".into());
    }
    c.qp.disconnect().map_err(err)?;
    Ok(())
}

/// TCP echo through `xwarp::net` on the same engines.
fn tcp_echo(a: &Context<VirtualNic>, b: &Context<VirtualNic>) -> Result<(), String> {
    let addr: SocketAddr = "10.77.0.2:7".parse().map_err(err)?;
    let listener = TcpListener::bind(b.stack(), addr).map_err(err)?;
    let server = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut n = 0u64;
        loop {
            let k = s.read(&mut buf)?;
            if k == 0 {
                return Ok(n);
            }
            s.write_all(&buf[..k])?;
            n += k as u64;
        }
    });
    let t0 = Instant::now();
    let mut c = TcpStream::connect(a.stack(), addr).map_err(err)?;
    let total = 2 << 20;
    let data: Vec<u8> = (0..total).map(|k| (k * 13 % 251) as u8).collect();
    let mut back = vec![0u8; total];
    for (out, inp) in data.chunks(32 * 1024).zip(back.chunks_mut(32 * 1024)) {
        c.write_all(out).map_err(err)?;
        c.read_exact(inp).map_err(err)?;
    }
    let el = t0.elapsed().as_secs_f64();
    drop(c);
    let echoed = server
        .join()
        .map_err(|_| "echo server panicked".to_string())?
        .map_err(err)?;
    println!(
        "tcp echo: {} MiB through xwarp::net and back in {:.3} s ({:.2} Gb/s each way), server echoed {} bytes, {}",
        total >> 20,
        el,
        total as f64 * 8.0 / el / 1e9,
        echoed,
        if back == data { "verified" } else { "MISMATCH" }
    );
    if back != data {
        return Err("tcp echo: data mismatch".into());
    }
    Ok(())
}
