//! A peer (a Linux socket) sends its data and FIN, then closes; the application reads
//! slowly. (a) After acknowledging the FIN the engine sends no window updates (Linux does
//! not: the peer has nothing more to send, and a peer whose socket is gone answers each with
//! a RST). (b) A RST arriving while the application still has unread bytes, in its rx ring
//! and in smoltcp's receive buffer, leaves every byte readable, then `ConnectionReset`.

use std::io;
use std::net::Ipv4Addr;

use smoltcp::wire::{TcpControl, TcpPacket};
use xwarp_stack::{new_stack, Stream};

#[path = "support/peer.rs"]
mod peer;
#[path = "support/scripted_nic.rs"]
mod scripted_nic;
use peer::{byte, Watch};

const US: Ipv4Addr = Ipv4Addr::new(10, 66, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 66, 0, 2);

/// The peer's FIN and what the engine sent after acknowledging it.
#[derive(Default)]
struct FinWatch {
    /// Sequence number after the peer's FIN, once sent.
    fin_end: Option<u32>,
    /// The engine acknowledged the FIN.
    fin_acked: bool,
    /// Pure ACKs repeating the FIN's acknowledgement (window updates) after it.
    window_updates: usize,
}

impl Watch for FinWatch {
    fn segment(&mut self, t: &TcpPacket<&[u8]>, their_next: &mut u32) {
        if t.fin() {
            // The engine's FIN: the peer acknowledges it from now on.
            *their_next = (t.seq_number().0 as u32)
                .wrapping_add(t.payload().len() as u32)
                .wrapping_add(1);
        }
        if t.ack() && Some(t.ack_number().0 as u32) == self.fin_end {
            let pure = t.payload().is_empty() && !t.syn() && !t.fin() && !t.rst();
            if self.fin_acked && pure {
                self.window_updates += 1;
            }
            self.fin_acked = true;
        }
    }
}

type Peer = peer::Peer<FinWatch>;

/// An engine with a small application ring, an accepted connection, and the peer's data
/// sent (the window nearly closed) with its FIN.
fn setup(half_close_first: bool) -> (Peer, Stream, xwarp_stack::ListenSocket, u32) {
    setup_with(half_close_first, false)
}

/// [`setup`]; `rst_behind_fin`: the peer's RST arrives in the same poll as its FIN.
fn setup_with(
    half_close_first: bool,
    rst_behind_fin: bool,
) -> (Peer, Stream, xwarp_stack::ListenSocket, u32) {
    let cfg = peer::config(US, 24, 64 << 10, 64 << 10, 16 << 10);
    let (svc, h) = new_stack(cfg).unwrap();
    let mut peer = Peer::new(svc, US, PEER, FinWatch::default());
    let listener = peer.listen(&h);
    peer.arp();
    peer.send(TcpControl::Syn, &[], 999, Some(7));
    peer.send(TcpControl::None, &[], 1000, None);
    let mut stream = listener.try_accept().expect("accepted");
    if half_close_first {
        // The application closes its side first (asyncio's `write_eof`): FIN-WAIT-2, then
        // TIME-WAIT once the peer's FIN is in.
        stream.shutdown_write().unwrap();
        peer.poll();
        assert!(peer.heard.fin, "the engine sent its FIN");
        let seq = peer.next;
        peer.send(TcpControl::None, &[], seq, None);
    }
    // Fill ring and socket buffer (the application reads nothing yet).
    let sent = peer.fill();
    assert!(sent > (48 << 10), "only {sent} bytes fit");
    let seq = peer.next;
    peer.watch.fin_end = Some(seq.wrapping_add(1));
    if rst_behind_fin {
        peer.queue(TcpControl::Fin, &[], seq, None);
        peer.queue(TcpControl::Rst, &[], seq.wrapping_add(1), None);
        peer.poll();
        peer.next = seq.wrapping_add(1);
        return (peer, stream, listener, sent);
    }
    peer.send(TcpControl::Fin, &[], seq, None);
    peer.next = seq.wrapping_add(1);
    assert!(peer.watch.fin_acked, "FIN acknowledged");
    (peer, stream, listener, sent)
}

/// Read 2 KiB at a time, polling the engine in between: the bytes until the end of stream
/// (`Ok`) or an error, or `None` at a stall.
fn read_slowly(
    s: &mut Stream,
    peer: &mut Peer,
    got: &mut Vec<u8>,
    max: usize,
) -> Option<io::Result<()>> {
    let mut buf = vec![0u8; 2 << 10];
    let mut idle = 0;
    let start = got.len();
    while idle < 8 && got.len() - start < max {
        match s.try_read(&mut buf) {
            Ok(0) => return Some(Ok(())),
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                idle = 0;
                peer.poll();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                peer.poll();
                idle += 1;
            }
            Err(e) => return Some(Err(e)),
        }
    }
    None
}

#[test]
fn no_window_updates_after_the_peers_fin() {
    for half_close_first in [false, true] {
        let (mut peer, mut stream, _l, sent) = setup(half_close_first);
        let mut got = Vec::new();
        let end = read_slowly(&mut stream, &mut peer, &mut got, usize::MAX);
        assert!(matches!(end, Some(Ok(()))), "end of stream: {end:?}");
        let expect: Vec<u8> = (0..sent).map(byte).collect();
        assert!(
            got == expect,
            "stream content ({} of {sent} bytes)",
            got.len()
        );
        assert_eq!(
            peer.watch.window_updates, 0,
            "window updates sent after the FIN was acknowledged (we closed first: \
             {half_close_first})"
        );
    }
}

#[test]
fn a_reset_keeps_the_bytes_already_acknowledged() {
    for half_close_first in [false, true] {
        let (mut peer, mut stream, _l, sent) = setup(half_close_first);
        // A little read: the ring is refilled from the socket, which still holds more.
        let mut got = Vec::new();
        assert!(read_slowly(&mut stream, &mut peer, &mut got, 4 << 10).is_none());
        assert!(
            (sent as usize) - got.len() > (16 << 10) + (8 << 10),
            "bytes left in the ring and the socket buffer: {}",
            sent as usize - got.len()
        );
        // The peer's socket is gone: RST.
        let seq = peer.next;
        peer.send(TcpControl::Rst, &[], seq, None);
        let end = read_slowly(&mut stream, &mut peer, &mut got, usize::MAX);
        let expect: Vec<u8> = (0..sent).map(byte).collect();
        assert_eq!(
            got.len(),
            expect.len(),
            "bytes read before the reset ({half_close_first})"
        );
        assert!(got == expect, "stream content");
        // In TIME-WAIT (we closed first) the stream was complete: a clean end of stream,
        // as before; in CLOSE-WAIT the reset error.
        // Under the own core the rx ring is the receive buffer too (16 KiB + 64 KiB): the
        // peer's FIN and every byte before it were in the ring before the RST, so the
        // end of stream was already announced; the bytes are what this test is about.
        let own = xwarp_stack::TcpCore::from_env() == xwarp_stack::TcpCore::Own;
        match end {
            Some(Ok(())) if half_close_first || own => {}
            Some(Err(e)) if !half_close_first => {
                assert_eq!(e.kind(), io::ErrorKind::ConnectionReset)
            }
            other => {
                panic!("after the bytes: {other:?}, expected ConnectionReset ({half_close_first})")
            }
        }
    }
}

#[test]
fn a_reset_right_behind_the_peers_fin_in_time_wait_ends_the_stream_cleanly() {
    // We closed first; the peer's FIN (TIME-WAIT) and its RST arrive in one poll, with
    // bytes still in the ring and the socket buffer: every byte, then a clean end.
    let (mut peer, mut stream, _l, sent) = setup_with(true, true);
    let mut got = Vec::new();
    let end = read_slowly(&mut stream, &mut peer, &mut got, usize::MAX);
    let expect: Vec<u8> = (0..sent).map(byte).collect();
    assert_eq!(got.len(), expect.len(), "bytes read before the end");
    assert!(got == expect, "stream content");
    assert!(matches!(end, Some(Ok(()))), "end of stream: {end:?}");
}
