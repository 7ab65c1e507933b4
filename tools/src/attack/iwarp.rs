//! A hand-driven iWARP peer for attacks: an MPA Request made by the `xwarp_ddp` negotiator
//! over a plain TCP stream, then FPDUs built byte by byte from DDP headers (any STag, TO,
//! MSN, split anywhere), and a reader that reports what the victim answered: a Terminate
//! (layer, EType, code; docs/ddp-rdmap.md §3.4), a Reject, a reset, an EOF, or nothing.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use xwarp::ddp::mpa::{Event, FpduEncoder, FpduEvent, FpduParser, InitiatorConfig, Negotiator};
use xwarp::ddp::segment::{TaggedHeader, UntaggedHeader};
use xwarp::net::TcpStream;
use xwarp::rdmap::wire::{Opcode, ReadRequest, Terminate};
use xwarp::stack::StackHandle;

/// What the attacker saw from the victim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Saw {
    /// A Terminate (raw layer, EType, code of its best reading).
    Terminate {
        /// Layer (0 RDMAP, 1 DDP, 2 LLP).
        layer: u8,
        /// EType.
        etype: u8,
        /// Error code.
        code: u8,
    },
    /// An MPA Reply with the Reject flag.
    Rejected,
    /// The connection was reset (RST) or refused.
    Reset,
    /// The victim closed the connection (FIN) without a Terminate.
    Eof,
    /// Nothing within the time allowed (still pending / silently accepted).
    Nothing,
    /// Something else (a protocol error of the victim's answer, ...).
    Other(String),
}

impl Saw {
    /// Whether this is the Terminate (layer, EType, code).
    pub fn is_terminate(&self, l: u8, e: u8, c: u8) -> bool {
        *self
            == Saw::Terminate {
                layer: l,
                etype: e,
                code: c,
            }
    }

    /// Whether the victim refused or ended the connection in any way.
    pub fn refused(&self) -> bool {
        !matches!(self, Saw::Nothing)
    }
}

impl fmt::Display for Saw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Saw::Terminate { layer, etype, code } => {
                write!(f, "Terminate {layer}/{etype}/0x{code:02x}")
            }
            Saw::Rejected => f.write_str("MPA Reject"),
            Saw::Reset => f.write_str("RST"),
            Saw::Eof => f.write_str("FIN"),
            Saw::Nothing => f.write_str("nothing"),
            Saw::Other(s) => write!(f, "other: {s}"),
        }
    }
}

fn mpa_err(e: impl fmt::Debug) -> io::Error {
    io::Error::other(format!("{e:?}"))
}

fn classify(e: &io::Error) -> Saw {
    match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Saw::Nothing,
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionRefused
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => Saw::Reset,
        _ => Saw::Other(e.to_string()),
    }
}

/// A connection whose MPA Request was sent; the victim's application has not answered yet.
pub struct PendingIwarp {
    stream: TcpStream,
    neg: Negotiator,
}

impl PendingIwarp {
    /// Connect from `stack` to `addr` and send an MPA v2 Request (enhanced, IRD/ORD given).
    pub fn start(stack: &StackHandle, addr: SocketAddr, ird: u16, ord: u16) -> io::Result<Self> {
        let stream = TcpStream::connect_timeout(stack, addr, Duration::from_secs(10))?;
        Self::over(stream, ird, ord)
    }

    /// Send an MPA v2 Request (enhanced, IRD/ORD given) over the connected `stream`.
    pub fn over(mut stream: TcpStream, ird: u16, ord: u16) -> io::Result<Self> {
        stream.set_nonblocking(false)?;
        let mut neg = Negotiator::initiator(
            InitiatorConfig {
                ird,
                ord,
                private_data: b"attacker".to_vec(),
                ..InitiatorConfig::default()
            },
            Instant::now(),
        )
        .map_err(mpa_err)?;
        while let Some(b) = neg.poll_transmit() {
            stream.write_all(&b)?;
        }
        Ok(PendingIwarp { stream, neg })
    }

    /// Wait up to `timeout` for the Reply: an established attacker, or what came instead.
    pub fn finish(mut self, timeout: Duration) -> Result<EvilIwarp, Saw> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Saw::Nothing);
            }
            if let Err(e) = self.stream.set_read_timeout(Some(left)) {
                return Err(classify(&e));
            }
            let n = match self.stream.read(&mut buf) {
                Ok(0) => return Err(Saw::Eof),
                Ok(n) => n,
                Err(e) => return Err(classify(&e)),
            };
            let used = match self.neg.handle_input(Instant::now(), &buf[..n]) {
                Ok(u) => u,
                Err(e) => return Err(Saw::Other(format!("{e:?}"))),
            };
            if let Some(ev) = self.neg.poll_event() {
                match ev {
                    Event::Established(neg) => {
                        return Ok(EvilIwarp {
                            stream: self.stream,
                            enc: neg.fpdu_encoder(),
                            parser: neg.fpdu_parser(),
                            send_msn: 1,
                            read_msn: 1,
                            pending: buf[used..n].to_vec(),
                        });
                    }
                    Event::Rejected { .. } => return Err(Saw::Rejected),
                    Event::Failed(e) => return Err(Saw::Other(format!("{e:?}"))),
                    Event::ConnectRequest(_) => return Err(Saw::Other("request?".into())),
                }
            }
        }
    }

    /// Whether the victim answered anything (Reply, Reject, RST, FIN) within `timeout`.
    pub fn probe(self, timeout: Duration) -> Saw {
        match self.finish(timeout) {
            Ok(_) => Saw::Other("accepted".into()),
            Err(s) => s,
        }
    }
}

/// An established attacker connection.
pub struct EvilIwarp {
    stream: TcpStream,
    enc: FpduEncoder,
    parser: FpduParser,
    send_msn: u32,
    read_msn: u32,
    pending: Vec<u8>,
}

impl EvilIwarp {
    /// One FPDU carrying a tagged RDMA Write segment.
    pub fn write_fpdu(&mut self, stag: u32, to: u64, data: &[u8], last: bool) -> Vec<u8> {
        let mut h = [0u8; 14];
        TaggedHeader {
            last,
            rsvd_ulp: Opcode::Write.ctrl_byte(),
            stag,
            to,
        }
        .emit(&mut h);
        self.enc.encode_to_vec(&[&h, data]).expect("fpdu")
    }

    fn untagged(&mut self, op: Opcode, qn: u32, msn: u32, inv: u32, body: &[u8]) -> Vec<u8> {
        let mut h = [0u8; 18];
        UntaggedHeader {
            last: true,
            rsvd_ulp: op.ctrl_byte(),
            rsvd_ulp_ext: inv,
            qn,
            msn,
            mo: 0,
        }
        .emit(&mut h);
        self.enc.encode_to_vec(&[&h, body]).expect("fpdu")
    }

    /// One FPDU: a Send (with Invalidate of `invalidate` when it is `Some`).
    pub fn send_fpdu(&mut self, data: &[u8], invalidate: Option<u32>) -> Vec<u8> {
        let msn = self.send_msn;
        self.send_msn += 1;
        match invalidate {
            Some(s) => self.untagged(Opcode::SendInvalidate, 0, msn, s, data),
            None => self.untagged(Opcode::Send, 0, msn, 0, data),
        }
    }

    /// One FPDU: a Read Request for `size` bytes of `src_stag`/`src_to` into our sink.
    pub fn read_request_fpdu(
        &mut self,
        sink: u32,
        src_stag: u32,
        src_to: u64,
        size: u32,
    ) -> Vec<u8> {
        let msn = self.read_msn;
        self.read_msn += 1;
        let body = ReadRequest {
            sink_stag: sink,
            sink_to: 0,
            size,
            src_stag,
            src_to,
        }
        .to_bytes();
        self.untagged(Opcode::ReadRequest, 1, msn, 0, &body)
    }

    /// Put raw bytes on the stream.
    pub fn raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Read what the victim sends for up to `timeout`: the first Terminate, or how the
    /// stream ended, or [`Saw::Nothing`]. Read Responses and other FPDUs are skipped
    /// (their count is returned too).
    pub fn watch(&mut self, timeout: Duration) -> (Saw, u64) {
        let deadline = Instant::now() + timeout;
        let mut buf = std::mem::take(&mut self.pending);
        let mut fpdus = 0u64;
        let mut header: Option<[u8; 18]> = None;
        let mut body = Vec::new();
        loop {
            let mut input: &[u8] = &buf;
            loop {
                match self.parser.next(&mut input) {
                    Ok(None) => break,
                    Ok(Some(FpduEvent::Header(h))) => {
                        let mut hb = [0u8; 18];
                        hb[..h.ddp_header().len()].copy_from_slice(h.ddp_header());
                        header = Some(hb);
                        body.clear();
                    }
                    Ok(Some(FpduEvent::Payload(p))) => body.extend_from_slice(p),
                    Ok(Some(FpduEvent::End)) => {
                        fpdus += 1;
                        if let Some(h) = header.take() {
                            if h[0] & 0x80 == 0 && h[1] & 0x0f == Opcode::Terminate as u8 {
                                return (terminate_of(&body), fpdus);
                            }
                        }
                    }
                    Err(e) => return (Saw::Other(format!("{e:?}")), fpdus),
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return (Saw::Nothing, fpdus);
            }
            if let Err(e) = self.stream.set_read_timeout(Some(left)) {
                return (classify(&e), fpdus);
            }
            buf.resize(64 << 10, 0);
            match self.stream.read(&mut buf) {
                Ok(0) => return (Saw::Eof, fpdus),
                Ok(n) => buf.truncate(n),
                Err(e) => return (classify(&e), fpdus),
            }
        }
    }
}

fn terminate_of(body: &[u8]) -> Saw {
    match Terminate::parse(body) {
        Ok(p) => match p.best() {
            Some(t) => Saw::Terminate {
                layer: t.layer,
                etype: t.etype,
                code: t.code,
            },
            None => Saw::Other("unreadable Terminate".into()),
        },
        Err(e) => Saw::Other(format!("Terminate: {e:?}")),
    }
}
