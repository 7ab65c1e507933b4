//! async_cq — RDMA Sends and Writes whose completions arrive through async streams
//! (`xwarp::verbs::cq::AsyncCq`, a `futures_core::Stream` of work completions).
//!
//! ```text
//! cargo run --release --example async_cq -- [--wrs N] [--size BYTES]
//! ```
//!
//! Two verbs engines on the in-process virtual wire (no privileges). The client posts N
//! RDMA Writes and N Sends, interleaved; one task takes the client's send-queue
//! completions from a stream, another the server's receive completions, both asleep on
//! their CQ's eventfd in the runtime's reactor until completions arrive. At the end
//! every wr_id is checked (in posting order) and every byte the Writes and Sends moved.

use std::io;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use xwarp::verbs::{
    vwire_pair_simple, Access, CmEvent, CompletionStatus, ConnectParams, QpInitAttr, SendRequest,
    WcOpcode,
};

const T: Duration = Duration::from_secs(20);

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
        .collect()
}

fn fail(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn posting(e: xwarp::verbs::PostError) -> io::Error {
    io::Error::other(format!("posting a work request: {e:?}"))
}

async fn run(wrs: usize, size: usize) -> io::Result<()> {
    let (a, b) = vwire_pair_simple(Default::default())?;
    let at = SocketAddr::from(([10, 77, 0, 2], 4791));
    let listener = b.device().listen(at, 1)?;
    let (cdev, sdev) = (a.device(), b.device());
    let (cpd, spd) = (cdev.alloc_pd(), sdev.alloc_pd());
    let (cscq, crcq) = (cdev.create_cq(2 * wrs)?, cdev.create_cq(1)?);
    let (sscq, srcq) = (sdev.create_cq(1)?, sdev.create_cq(wrs)?);
    let attr = |scq, rcq| {
        let mut a = QpInitAttr::new(scq, rcq);
        a.max_send_wr = 2 * wrs;
        a.max_recv_wr = wrs;
        a
    };
    let cqp = cpd.create_qp(&attr(&cscq, &crcq))?;
    let sqp = spd.create_qp(&attr(&sscq, &srcq))?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    // Per WR: a Send slot and a Write slot of `size` bytes each.
    let cbuf = cpd.alloc_mr(2 * wrs * size, access, false)?;
    let sbuf = spd.alloc_mr(2 * wrs * size, access, false)?;
    let sge = |mr: &xwarp::verbs::MemoryRegion, off: usize| {
        mr.sge(off, size)
            .ok_or_else(|| fail(format!("no SGE at {off}")))
    };
    for i in 0..wrs {
        sqp.post_recv(i as u64, &[sge(&sbuf, i * size)?])
            .map_err(posting)?;
        cbuf.write(i * size, &pattern(size, i as u64))?;
        cbuf.write((wrs + i) * size, &pattern(size, (wrs + i) as u64))?;
    }

    // Connection setup is blocking (microseconds on the virtual wire).
    cqp.connect(
        at,
        ConnectParams {
            private_data: vec![],
            timeout: T,
        },
    )?;
    listener.get_request(T)?.accept(&sqp, b"")?;
    for qp in [&cqp, &sqp] {
        match qp.next_event(T)? {
            CmEvent::Established { .. } => {}
            e => return Err(fail(format!("expected Established, got {e:?}"))),
        }
    }

    let sends = cscq.clone().into_stream()?;
    let recvs = srcq.clone().into_stream()?;
    let t = Instant::now();
    let send_side = tokio::spawn(async move {
        let mut got = Vec::with_capacity(2 * wrs);
        while got.len() < 2 * wrs {
            got.push(sends.next().await?);
        }
        io::Result::Ok(got)
    });
    let recv_side = tokio::spawn(async move {
        let mut got = Vec::with_capacity(wrs);
        while got.len() < wrs {
            got.push(recvs.next().await?);
        }
        io::Result::Ok(got)
    });
    for i in 0..wrs {
        let w = (wrs + i) * size;
        cqp.post_send(SendRequest::write(
            1_000_000 + i as u64,
            vec![sge(&cbuf, w)?],
            sbuf.rkey(),
            sbuf.addr() + w as u64,
        ))
        .map_err(posting)?;
        cqp.post_send(SendRequest::send(
            2_000_000 + i as u64,
            vec![sge(&cbuf, i * size)?],
        ))
        .map_err(posting)?;
    }
    let sent = tokio::time::timeout(T, send_side)
        .await
        .map_err(|_| fail("send completions timed out".into()))?
        .map_err(io::Error::other)??;
    let received = tokio::time::timeout(T, recv_side)
        .await
        .map_err(|_| fail("receive completions timed out".into()))?
        .map_err(io::Error::other)??;
    let elapsed = t.elapsed();

    for (k, wc) in sent.iter().enumerate() {
        let i = (k / 2) as u64;
        let want = if k % 2 == 0 {
            (1_000_000 + i, WcOpcode::Write)
        } else {
            (2_000_000 + i, WcOpcode::Send)
        };
        if (wc.wr_id, wc.opcode) != want || wc.status != CompletionStatus::Success {
            return Err(fail(format!(
                "send completion {k}: {wc:?}, wanted {want:?}"
            )));
        }
    }
    for (i, wc) in received.iter().enumerate() {
        if wc.wr_id != i as u64
            || wc.status != CompletionStatus::Success
            || wc.byte_len as usize != size
        {
            return Err(fail(format!("receive completion {i}: {wc:?}")));
        }
    }
    for i in 0..wrs {
        if sbuf.to_vec(i * size, size)? != pattern(size, i as u64) {
            return Err(fail(format!("Send {i}: payload differs")));
        }
        let w = (wrs + i) * size;
        if sbuf.to_vec(w, size)? != pattern(size, (wrs + i) as u64) {
            return Err(fail(format!("Write {i}: payload differs")));
        }
    }
    println!(
        "async_cq: {wrs} RDMA Writes + {wrs} Sends of {size} bytes: {} send-queue and {} receive completions through async streams, wr_ids in order and data verified, in {:.1} ms",
        sent.len(),
        received.len(),
        elapsed.as_secs_f64() * 1e3
    );
    Ok(())
}

fn main() -> ExitCode {
    let mut wrs = 100usize;
    let mut size = 4096usize;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(k) = it.next() {
        let v = it
            .next()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&v| v > 0);
        match (k.as_str(), v) {
            ("--wrs", Some(v)) if v <= 100_000 => wrs = v,
            ("--size", Some(v)) if v <= 1 << 20 => size = v,
            _ => {
                eprintln!("usage: async_cq [--wrs N (1..=100000)] [--size BYTES (1..=1048576)]");
                return ExitCode::from(2);
            }
        }
    }
    if 2 * wrs * size > 512 << 20 {
        eprintln!("async_cq: --wrs times --size must stay within 256 MiB");
        return ExitCode::from(2);
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("async_cq: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(wrs, size)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("async_cq: {e}");
            ExitCode::FAILURE
        }
    }
}
