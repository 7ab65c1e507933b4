//! Completion queues read as async streams (`cq_async`, feature `tokio`) over two verbs
//! engines on the virtual wire: every completion of N posted work requests arrives
//! through the stream with the right wr_id, in order, and the data they moved is
//! verified; solicited-only streams sleep through unsolicited completions.

mod support;
use support::{Depths, End, T};

use std::time::Duration;

use futures_core::Stream;
use xwarp_poll_driver::vwire::VirtualNic;
use xwarp_verbs::cq::AsyncCq;
use xwarp_verbs::{
    vwire_pair_simple, Access, CompletionStatus, Context, MemoryRegion, SendOpcode, SendRequest,
    WcOpcode, WorkCompletion,
};

/// Bound on one whole test on a loaded 2-core machine.
const LIMIT: Duration = Duration::from_secs(90);

const DEPTHS: Depths = Depths {
    cq: 1024,
    send_wr: 1024,
    recv_wr: 1024,
};

/// Two engines and a connected (client, server) QP pair.
fn connected(port: u16) -> (Context<VirtualNic>, Context<VirtualNic>, End, End) {
    support::connected(port, DEPTHS)
}

fn mr(e: &End, len: usize) -> MemoryRegion {
    e.pd.alloc_mr(
        len,
        Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
        false,
    )
    .unwrap()
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) as u8 ^ (i >> 9) as u8
        })
        .collect()
}

/// Take `n` completions from `cq` through `futures_core::Stream::poll_next`.
async fn take(cq: &mut AsyncCq, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let wc = std::future::poll_fn(|cx| std::pin::Pin::new(&mut *cq).poll_next(cx))
            .await
            .expect("the stream ended");
        out.push(wc);
    }
    out
}

async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("completions did not all arrive in time")
}

const N: usize = 200;
const SEND_SLOT: usize = 4096;
const WRITE_SLOT: usize = 8192;

/// N Writes and N Sends, interleaved, posted while both streams already wait.
fn writes_and_sends(rt: tokio::runtime::Runtime, port: u16) {
    let (_a, _b, c, s) = connected(port);
    let cbuf = mr(&c, N * (SEND_SLOT + WRITE_SLOT));
    let sbuf = mr(&s, N * (SEND_SLOT + WRITE_SLOT));
    let send_len = |i: usize| 1 + (i * 977) % SEND_SLOT;
    for i in 0..N {
        s.qp.post_recv(
            30_000 + i as u64,
            &[sbuf.sge(i * SEND_SLOT, SEND_SLOT).unwrap()],
        )
        .unwrap();
        cbuf.write(i * SEND_SLOT, &pattern(send_len(i), i as u32))
            .unwrap();
        let woff = N * SEND_SLOT + i * WRITE_SLOT;
        cbuf.write(woff, &pattern(WRITE_SLOT, 1_000 + i as u32))
            .unwrap();
    }
    rt.block_on(bounded(async {
        let mut scq = c.scq.clone().into_stream().unwrap();
        let mut rcq = s.rcq.clone().into_stream().unwrap();
        let sends = tokio::spawn(async move { take(&mut scq, 2 * N).await });
        let recvs = tokio::spawn(async move { take(&mut rcq, N).await });
        // Both consumers are asleep on an empty queue before anything is posted.
        tokio::time::sleep(Duration::from_millis(30)).await;
        for i in 0..N {
            let woff = N * SEND_SLOT + i * WRITE_SLOT;
            c.qp.post_send(SendRequest::write(
                10_000 + i as u64,
                vec![cbuf.sge(woff, WRITE_SLOT).unwrap()],
                sbuf.rkey(),
                sbuf.addr() + woff as u64,
            ))
            .unwrap();
            c.qp.post_send(SendRequest::send(
                20_000 + i as u64,
                vec![cbuf.sge(i * SEND_SLOT, send_len(i)).unwrap()],
            ))
            .unwrap();
            if i % 50 == 49 {
                // Let the consumers drain part of the queue and go back to sleep.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let sends = sends.await.unwrap();
        let recvs = recvs.await.unwrap();
        // Send-queue completions in posting order: Write i, Send i, ...
        let want: Vec<(u64, WcOpcode)> = (0..N as u64)
            .flat_map(|i| [(10_000 + i, WcOpcode::Write), (20_000 + i, WcOpcode::Send)])
            .collect();
        let got: Vec<(u64, WcOpcode)> = sends.iter().map(|w| (w.wr_id, w.opcode)).collect();
        assert_eq!(got, want, "send-queue completions");
        assert!(sends.iter().all(|w| w.status == CompletionStatus::Success));
        for (i, w) in recvs.iter().enumerate() {
            assert_eq!(
                (w.wr_id, w.opcode, w.status, w.byte_len as usize),
                (
                    30_000 + i as u64,
                    WcOpcode::Recv,
                    CompletionStatus::Success,
                    send_len(i)
                ),
                "receive {i}"
            );
        }
    }));
    // Receive i completed after Write i was placed (RDMAP ordering): all data is there.
    for i in 0..N {
        assert_eq!(
            sbuf.to_vec(i * SEND_SLOT, send_len(i)).unwrap(),
            pattern(send_len(i), i as u32),
            "Send {i} payload"
        );
        let woff = N * SEND_SLOT + i * WRITE_SLOT;
        assert_eq!(
            sbuf.to_vec(woff, WRITE_SLOT).unwrap(),
            pattern(WRITE_SLOT, 1_000 + i as u32),
            "Write {i} payload"
        );
    }
    // Nothing more than the N + 2N completions was produced.
    assert!(c.scq.poll_one().is_none() && s.rcq.poll_one().is_none());
}

#[test]
fn every_completion_arrives_current_thread() {
    writes_and_sends(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
        4801,
    );
}

#[test]
fn every_completion_arrives_multi_thread() {
    writes_and_sends(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap(),
        4802,
    );
}

/// A solicited-only stream sleeps through plain Sends and wakes at the Send with
/// Solicited Event, then yields everything queued, in order.
#[test]
fn solicited_only_stream_wakes_at_the_solicited_send() {
    const K: usize = 20;
    let (_a, _b, c, s) = connected(4803);
    let sbuf = mr(&s, (K + 1) * 64);
    for i in 0..=K {
        s.qp.post_recv(i as u64, &[sbuf.sge(i * 64, 64).unwrap()])
            .unwrap();
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(bounded(async {
        let mut rcq = s.rcq.clone().into_stream().unwrap().solicited_only(true);
        let waiter = tokio::spawn(async move {
            let first = rcq.next().await.unwrap();
            let rest = take(&mut rcq, K).await;
            (first, rest)
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        for i in 0..K {
            c.qp.post_send(SendRequest {
                inline: Some(format!("plain {i}").into_bytes()),
                ..SendRequest::send(100 + i as u64, vec![])
            })
            .unwrap();
        }
        // All K are queued on the server's CQ, but none is solicited.
        let deadline = tokio::time::Instant::now() + T;
        while s.rcq.queued() < K {
            assert!(
                tokio::time::Instant::now() < deadline,
                "plain Sends did not arrive"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished(), "woken by an unsolicited completion");
        c.qp.post_send(SendRequest {
            inline: Some(b"wake up".to_vec()),
            ..SendRequest::new(200, SendOpcode::SendWithSolicitedEvent, vec![])
        })
        .unwrap();
        let (first, rest) = waiter.await.unwrap();
        assert_eq!((first.wr_id, first.solicited), (0, false));
        let ids: Vec<u64> = rest.iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, (1..=K as u64).collect::<Vec<_>>());
        assert!(rest[K - 1].solicited, "the last one carried SE");
    }));
    assert_eq!(sbuf.to_vec(K * 64, 7).unwrap(), b"wake up");
    assert_eq!(sbuf.to_vec(3 * 64, 7).unwrap(), b"plain 3");
}

#[test]
fn creating_a_stream_outside_a_runtime_fails_cleanly() {
    let (a, _b) = vwire_pair_simple(Default::default()).unwrap();
    let cq = a.device().create_cq(4).unwrap();
    let e = cq.into_stream().unwrap_err();
    assert!(e.to_string().contains("tokio runtime"), "{e}");
}

/// One Send at a time, each awaited on both ends before the next is posted: every
/// completion finds its consumer asleep (armed, the queue empty), so one lost wakeup
/// stalls the test. 1000 rounds on a multi-thread runtime.
#[test]
fn one_completion_at_a_time_never_loses_a_wakeup() {
    const ROUNDS: u64 = 1000;
    let (_a, _b, c, s) = connected(4804);
    let sbuf = mr(&s, 64);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(bounded(async {
        let scq = c.scq.clone().into_stream().unwrap();
        let rcq = s.rcq.clone().into_stream().unwrap();
        for i in 0..ROUNDS {
            s.qp.post_recv(i, &[sbuf.sge(0, 64).unwrap()]).unwrap();
            c.qp.post_send(SendRequest {
                inline: Some(i.to_le_bytes().to_vec()),
                ..SendRequest::send(1_000_000 + i, vec![])
            })
            .unwrap();
            let (sent, received) = tokio::join!(scq.next(), rcq.next());
            let (sent, received) = (sent.unwrap(), received.unwrap());
            assert_eq!((sent.wr_id, sent.opcode), (1_000_000 + i, WcOpcode::Send));
            assert_eq!((received.wr_id, received.byte_len), (i, 8));
            assert_eq!(sbuf.to_vec(0, 8).unwrap(), i.to_le_bytes());
        }
    }));
}
