//! Loss recovery help around smoltcp's sender (IPv4 flows).
//!
//! smoltcp has no SACK, no NewReno partial-ACK retransmission and a 1 s minimum RTO. A
//! second loss in one window, or a lost retransmission, therefore costs a full second.
//! The engine sees every frame, so it watches the ACKs arriving for each flow; when a
//! flow with data outstanding hears no ACK progress for `rto_floor`, the engine replays
//! the peer's last pure ACK into its own stack: one copy with the window field changed
//! by one unit (smoltcp treats that as a window update and resets its duplicate-ACK
//! count) and three identical copies (three duplicate ACKs: smoltcp fast-retransmits the
//! first unacknowledged segment). Nothing extra goes on the wire; the effect is a
//! retransmission timeout floor of `rto_floor` instead of 1 s (Linux: 200 ms). After a
//! rescue, an ACK that advances but stays below the highest sequence number sent at the
//! rescue (RFC 6582's partial ACK) is rescued at once: each further hole of a burst loss
//! then costs a round trip, not another floor.
//!
//! The replayed copies get a fresh checksum, so a template must first pass the checksums
//! smoltcp itself verifies: otherwise a bit flipped on the wire in the ACK number would be
//! laundered into a valid ACK for data the peer never received, smoltcp would drop those
//! bytes from its send buffer and the connection would wait forever for the hole to be
//! filled (seen in tests/net_lossy.rs: the sender's SND.UNA 8192 bytes (bit 13) past the
//! receiver's RCV.NXT, every retransmission and ACK then ignored as out of range).

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use smoltcp::phy::{ChecksumCapabilities, Device, DeviceCapabilities, RxToken, TxToken};
use smoltcp::wire::{
    EthernetFrame, EthernetProtocol, IpAddress, IpProtocol, Ipv4Packet, Ipv6Packet, TcpPacket,
};

/// (peer address, peer port, local port) of an IPv4 flow.
pub(crate) type FlowKey = (std::net::Ipv4Addr, u16, u16);

/// Most flows [`AckWatch::touched`] lists per engine iteration.
pub(crate) const TOUCHED_MAX: usize = 4096;

/// A [`FlowKey`] packed into one word: the map key (cheap to hash and compare). The maps
/// keep std's keyed SipHash (`RandomState`): the peer picks its address and port, so an
/// unkeyed hash would let it choose colliding keys.
pub(crate) fn pack(key: &FlowKey) -> u64 {
    (u64::from(u32::from(key.0)) << 32) | (u64::from(key.1) << 16) | u64::from(key.2)
}

/// ACK number and window of a flow's template, `None` before its first pure ACK.
type TemplateAck = Option<(u32, u16)>;

/// What the engine last heard from one flow.
#[derive(Debug)]
pub(crate) struct FlowAcks {
    /// The peer's last pure ACK frame, Ethernet header included, refreshed whenever a
    /// pure ACK brings a different ACK number or window (a repeat would only change
    /// options such as timestamps, which the replay does not need). Empty until the
    /// first pure ACK of the flow.
    template: Vec<u8>,
    /// ACK number and window of `template` (`None` while it is empty).
    template_ack: TemplateAck,
    ack: u32,
    last_progress: Instant,
    rescued_at: Option<Instant>,
    /// One past the highest sequence number this end has sent on the flow (from
    /// transmitted frames; `None` before the first data segment).
    snd_max: Option<u32>,
    /// RFC 6582 `recover`: `snd_max` when a rescue started a recovery, until an ACK covers
    /// it.
    recover: Option<u32>,
    /// The last ACK advance was a partial ACK (RFC 6582 §3.2 step 5): it stopped below
    /// `recover`, so the segment it asks for next is lost too and is rescued at once
    /// instead of after another `floor`.
    partial: bool,
}

/// `a` before `b` in sequence space (RFC 9293 §3.4, modulo 2^32).
fn seq_before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// The last pure ACK (checksums valid) of a flow the watch does not track: its packed
/// key, ACK number and window, and the frame.
#[derive(Debug, Default)]
struct Untracked {
    key: Option<u64>,
    seen: (u32, u16),
    frame: Vec<u8>,
}

/// Per-flow ACK progress, fed from the receive path.
///
/// Only flows of connections the engine has are tracked: the connection table registers
/// a flow with [`AckWatch::track`] when it opens a connection or promotes an accepted one,
/// and [`AckWatch::forget`]s it when the connection is removed. A frame of any other flow
/// (a forged ACK, a stray segment) creates nothing; the one exception is a single reused
/// slot holding the last such pure ACK, so that the final ACK of a passive handshake, seen
/// before its connection is promoted, can still become that connection's first template.
/// The table is bounded by [`AckWatch::max_flows`] anyway.
#[derive(Debug)]
pub(crate) struct AckWatch {
    flows: HashMap<u64, FlowAcks>,
    /// Flows (packed [`FlowKey`]s) of the IPv4 TCP frames received since the service last
    /// took them: after ingress the service serves only their connections (plus the dirty
    /// ones) instead of every connection (issue 16). At most [`TOUCHED_MAX`]; beyond that,
    /// or after a frame that is not IPv4 TCP (IPv6, ARP, ...), `touched_all` is set and
    /// every connection is served as before.
    pub(crate) touched: Vec<u64>,
    /// See `touched`.
    pub(crate) touched_all: bool,
    /// Most entries of `flows` (`StackConfig::max_tracked_flows`): tracking one more evicts
    /// the flow whose ACK number moved least recently.
    pub(crate) max_flows: usize,
    /// Flows evicted that way.
    pub(crate) evicted: u64,
    /// See [`Untracked`].
    untracked: Untracked,
    /// The flow of the last observed frame with its ACK number and template state
    /// afterwards: a frame of the same flow that changes neither skips the map (bulk
    /// data from one peer repeats the same ACK number frame after frame).
    last: Option<(u64, u32, TemplateAck)>,
    /// Local ports whose listeners are full (accept queue at the backlog): a SYN to one of
    /// them is dropped before smoltcp sees it, so the client retransmits it later instead
    /// of getting the RST smoltcp would send for a port without an armed listener. Linux
    /// drops such SYNs too (`ListenOverflows`, unless `tcp_abort_on_overflow`).
    pub(crate) full_ports: Vec<u16>,
    /// SYNs dropped that way.
    pub(crate) syn_drops: u64,
    /// The checksums smoltcp verifies on received frames (the device's capabilities; the
    /// default verifies all): a pure ACK becomes a template only if it passes them too.
    pub(crate) checksums: ChecksumCapabilities,
    /// Flows whose connection sent its FIN: the FIN's sequence number, from transmitted
    /// frames (see [`AckWatch::dup_ack_behind_fin`]); tracked flows only.
    fins: HashMap<u64, u32>,
    /// Duplicate ACKs withheld from smoltcp while only a FIN was unacknowledged.
    pub(crate) dup_acks_withheld: u64,
    /// A flow got a partial ACK during a recovery ([`FlowAcks::partial`]): the next
    /// rescue scan should run now rather than at its period.
    pub(crate) partial_pending: bool,
    /// FIN-only segments split off received data+FIN segments, to be fed to smoltcp right
    /// after the data (see [`split_fin`]).
    pub(crate) split_fins: VecDeque<Vec<u8>>,
    /// Data+FIN segments split that way.
    pub(crate) fins_split: u64,
    /// RSTs of tracked flows held back from smoltcp until the engine saved what the
    /// socket's receive buffer still holds (`ConnTable::save_unread`); then fed as they
    /// are. At most [`HELD_RSTS_MAX`].
    pub(crate) held_rsts: VecDeque<Vec<u8>>,
}

/// Most RSTs held at once ([`AckWatch::held_rsts`]); one more goes to smoltcp directly.
const HELD_RSTS_MAX: usize = 64;

impl Default for AckWatch {
    fn default() -> Self {
        AckWatch {
            flows: HashMap::new(),
            touched: Vec::new(),
            touched_all: false,
            max_flows: crate::config::DEFAULT_MAX_SOCKETS,
            evicted: 0,
            untracked: Untracked::default(),
            last: None,
            full_ports: Vec::new(),
            syn_drops: 0,
            checksums: ChecksumCapabilities::default(),
            fins: HashMap::new(),
            dup_acks_withheld: 0,
            partial_pending: false,
            split_fins: VecDeque::new(),
            fins_split: 0,
            held_rsts: VecDeque::new(),
        }
    }
}

struct Parsed<'a> {
    ip: Ipv4Packet<&'a [u8]>,
    tcp: TcpPacket<&'a [u8]>,
    key: FlowKey,
    ack: u32,
    window: u16,
    pure_ack: bool,
}

/// The IPv4 and TCP views of one frame.
type Ipv4Tcp<'a> = (Ipv4Packet<&'a [u8]>, TcpPacket<&'a [u8]>);

/// The IPv4 and TCP views of `frame` if it is an unfragmented IPv4 TCP segment (one parse
/// for the ACK watch, the template checksum check and the backlog's SYN check).
fn ipv4_tcp(frame: &[u8]) -> Option<Ipv4Tcp<'_>> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    if ip.next_header() != IpProtocol::Tcp || ip.more_frags() || ip.frag_offset() != 0 {
        return None;
    }
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    Some((ip, tcp))
}

/// The TCP view of `frame` if it is a TCP segment over IPv6 (no extension headers).
fn ipv6_tcp(frame: &[u8]) -> Option<TcpPacket<&[u8]>> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv6 {
        return None;
    }
    let ip = Ipv6Packet::new_checked(eth.payload()).ok()?;
    if ip.next_header() != IpProtocol::Tcp {
        return None;
    }
    TcpPacket::new_checked(ip.payload()).ok()
}

#[cfg(test)]
fn parse(frame: &[u8]) -> Option<Parsed<'_>> {
    let (ip, tcp) = ipv4_tcp(frame)?;
    parse_from(ip, tcp)
}

/// [`parse`] of a frame already split into its IPv4 and TCP views.
fn parse_from<'a>(ip: Ipv4Packet<&'a [u8]>, tcp: TcpPacket<&'a [u8]>) -> Option<Parsed<'a>> {
    if !tcp.ack() || tcp.syn() || tcp.rst() {
        return None;
    }
    Some(Parsed {
        key: (ip.src_addr(), tcp.src_port(), tcp.dst_port()),
        ack: tcp.ack_number().0 as u32,
        window: tcp.window_len(),
        pure_ack: tcp.payload().is_empty() && !tcp.fin(),
        ip,
        tcp,
    })
}

/// `true` if the IPv4 and TCP checksums of a parsed segment are correct, as far as `caps`
/// has smoltcp verify them on receive (RFC 9293 §3.1: a segment with a bad checksum is
/// discarded; a device with checksum offload has verified them already).
fn checksums_valid(p: &Parsed<'_>, caps: &ChecksumCapabilities) -> bool {
    if caps.ipv4.rx() && !p.ip.verify_checksum() {
        return false;
    }
    if !caps.tcp.rx() {
        return true;
    }
    let (src, dst) = (
        IpAddress::Ipv4(p.ip.src_addr()),
        IpAddress::Ipv4(p.ip.dst_addr()),
    );
    p.tcp.verify_checksum(&src, &dst)
}

/// `true` if `frame` is a TCP SYN (without ACK), over IPv4 or IPv6, to one of `ports`.
fn is_syn_to(frame: &[u8], ports: &[u16]) -> bool {
    let tcp = ipv4_tcp(frame)
        .map(|(_, tcp)| tcp)
        .or_else(|| ipv6_tcp(frame));
    tcp.is_some_and(|t| t.syn() && !t.ack() && !t.rst() && ports.contains(&t.dst_port()))
}

impl AckWatch {
    /// Record an incoming frame (tests; the receive path parses once and calls
    /// [`AckWatch::observe_parsed`]).
    #[cfg(test)]
    pub(crate) fn observe(&mut self, frame: &[u8], now: Instant) {
        if let Some(p) = parse(frame) {
            self.observe_parsed(frame, &p, now);
        }
    }

    /// Record an incoming frame, already parsed.
    fn observe_parsed(&mut self, frame: &[u8], p: &Parsed<'_>, now: Instant) {
        let key = pack(&p.key);
        let seen = (p.ack, p.window);
        if let Some((k, ack, template_ack)) = self.last {
            if k == key && ack == p.ack && (!p.pure_ack || template_ack == Some(seen)) {
                return;
            }
        }
        // A pure ACK may become the template whose copies are replayed with a fresh
        // checksum: one that smoltcp would discard must be ignored here too (headers only,
        // so cheap). Data frames are not verified (that would checksum every payload
        // twice); a corrupted one can at worst fake ACK progress and postpone a rescue by
        // one `floor`, as it never becomes a template.
        if p.pure_ack && !checksums_valid(p, &self.checksums) {
            return;
        }
        match self.flows.get_mut(&key) {
            Some(f) => {
                if f.ack != p.ack {
                    f.ack = p.ack;
                    f.last_progress = now;
                    f.rescued_at = None;
                    // smoltcp has no NewReno (see the module docs): after a rescued
                    // loss, an ACK that stops short of `recover` means the next
                    // segment is missing as well. Without this, a burst of lost
                    // segments (a full NIC queue) cost one `floor` each: 200 ms per
                    // segment, a few KB/s for a minute. A pure ACK only, which becomes
                    // the template the rescue replays.
                    match f.recover {
                        Some(r) if seq_before(p.ack, r) => {
                            f.partial = p.pure_ack;
                            self.partial_pending |= p.pure_ack;
                        }
                        _ => {
                            f.recover = None;
                            f.partial = false;
                        }
                    }
                }
                if p.pure_ack && f.template_ack != Some(seen) {
                    f.template.clear();
                    f.template.extend_from_slice(frame);
                    f.template_ack = Some(seen);
                }
                self.last = Some((key, f.ack, f.template_ack));
            }
            None if p.pure_ack => {
                // Not a flow of ours (yet): only the one reused slot.
                let u = &mut self.untracked;
                u.key = Some(key);
                u.seen = seen;
                u.frame.clear();
                u.frame.extend_from_slice(frame);
            }
            None => {}
        }
    }

    /// Track the flow of a connection the engine has (opened or just promoted): from now
    /// on its ACKs are watched. If the last untracked pure ACK was of this flow (the final
    /// ACK of its handshake) it becomes the first template. At [`AckWatch::max_flows`] the
    /// flow whose ACK number moved least recently is evicted first. `passive`: a
    /// connection accepted from a listener (only its flow can have a handshake ACK seen
    /// before it was tracked; an active open adopts nothing).
    pub(crate) fn track(&mut self, key: &FlowKey, passive: bool, now: Instant) {
        let key = pack(key);
        if self.max_flows == 0 || self.flows.contains_key(&key) {
            return;
        }
        if self.flows.len() >= self.max_flows {
            let oldest = self
                .flows
                .iter()
                .min_by_key(|(_, f)| f.last_progress)
                .map(|(&k, _)| k);
            if let Some(k) = oldest {
                self.forget_packed(k);
                self.evicted += 1;
            }
        }
        let mut f = FlowAcks {
            template: Vec::new(),
            template_ack: None,
            ack: 0,
            last_progress: now,
            rescued_at: None,
            snd_max: None,
            recover: None,
            partial: false,
        };
        if passive && self.untracked.key == Some(key) {
            let u = &mut self.untracked;
            u.key = None;
            f.template = std::mem::take(&mut u.frame);
            f.template_ack = Some(u.seen);
            f.ack = u.seen.0;
        }
        self.flows.insert(key, f);
    }

    /// Number of flows tracked.
    pub(crate) fn tracked(&self) -> usize {
        self.flows.len()
    }

    /// Record a transmitted frame: the highest sequence number sent on the flow (the
    /// recovery point of a rescue), and for a segment carrying our FIN the FIN's sequence
    /// number for the flow of the peer's ACKs.
    pub(crate) fn observe_tx(&mut self, frame: &[u8]) {
        let Some((ip, tcp)) = ipv4_tcp(frame) else {
            return;
        };
        let len = tcp.payload().len() as u32;
        if tcp.rst() || (len == 0 && !tcp.fin()) {
            return;
        }
        let seq = (tcp.seq_number().0 as u32).wrapping_add(len);
        let key = pack(&(ip.dst_addr(), tcp.dst_port(), tcp.src_port()));
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let end = seq.wrapping_add(u32::from(tcp.fin()));
        if f.snd_max.is_none_or(|m| seq_before(m, end)) {
            f.snd_max = Some(end);
        }
        if tcp.fin() {
            self.fins.insert(key, seq);
        }
    }

    /// [`AckWatch::dup_ack_behind_fin`] of an unparsed frame (tests).
    #[cfg(test)]
    pub(crate) fn is_dup_ack_behind_fin(&mut self, frame: &[u8]) -> bool {
        parse(frame).is_some_and(|p| self.dup_ack_behind_fin(&p))
    }

    /// `true` if `p` is a duplicate ACK that smoltcp must not see: a pure ACK that
    /// acknowledges every byte before our FIN but not the FIN, repeating the ACK number
    /// and window this flow already sent.
    ///
    /// smoltcp 0.14 bug worked around: on the third duplicate ACK it starts a fast
    /// retransmit, which re-sends only data (`seq_to_transmit` needs a non-empty send
    /// buffer for it) and turns the retransmit timer off (`dispatch` sets it idle before
    /// sending). With only the FIN outstanding nothing is re-sent and no timer is left: a
    /// lost FIN is never retransmitted. Seen on the lossy wire, where duplicated segments
    /// make the peer repeat its ACK: 60 s in FIN-WAIT-1 with `Timer::Idle`, every byte
    /// acknowledged, the peer still ESTABLISHED. Withheld, the duplicates cannot start that
    /// fast retransmit, and smoltcp's retransmit timer re-sends the FIN. (A duplicate ACK
    /// carries nothing else: no data, no new ACK number, no window change.)
    fn dup_ack_behind_fin(&mut self, p: &Parsed<'_>) -> bool {
        let key = pack(&p.key);
        let Some(&fin) = self.fins.get(&key) else {
            return false;
        };
        if p.ack == fin.wrapping_add(1) {
            // The FIN is acknowledged: nothing more to guard.
            self.fins.remove(&key);
            return false;
        }
        p.pure_ack
            && p.ack == fin
            && self
                .flows
                .get(&key)
                .is_some_and(|f| f.ack == fin && f.template_ack == Some((fin, p.window)))
    }

    /// Forget a flow (its connection is gone).
    pub(crate) fn forget(&mut self, key: &FlowKey) {
        self.forget_packed(pack(key));
    }

    fn forget_packed(&mut self, key: u64) {
        self.flows.remove(&key);
        self.fins.remove(&key);
        if self.last.is_some_and(|l| l.0 == key) {
            self.last = None;
        }
    }

    /// If `key` has been stuck for `floor`, or got a partial ACK during a recovery a
    /// rescue started, queue the replayed ACKs into `out`. Each stall is rescued at most
    /// once per `floor`; each partial ACK once, at once.
    pub(crate) fn rescue(
        &mut self,
        key: &FlowKey,
        now: Instant,
        floor: std::time::Duration,
        out: &mut VecDeque<Vec<u8>>,
    ) -> bool {
        let Some(f) = self.flows.get_mut(&pack(key)) else {
            return false;
        };
        let since = f.rescued_at.unwrap_or(f.last_progress);
        if !f.partial && now.saturating_duration_since(since) < floor {
            return false;
        }
        f.partial = false;
        let Some(nudged) = nudge_window(&f.template) else {
            return false;
        };
        f.rescued_at = Some(now);
        if f.recover.is_none() {
            f.recover = f.snd_max;
        }
        for _ in 0..4 {
            out.push_back(nudged.clone());
        }
        true
    }
}

/// The frame with its TCP window lowered by one unit and the checksum refreshed; `None`
/// for a zero or one-unit window (smoltcp probes zero windows itself).
fn nudge_window(frame: &[u8]) -> Option<Vec<u8>> {
    let mut buf = frame.to_vec();
    let mut eth = EthernetFrame::new_checked(&mut buf[..]).ok()?;
    let mut ip = Ipv4Packet::new_checked(eth.payload_mut()).ok()?;
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    let ip_payload_len = usize::from(ip.total_len()).checked_sub(usize::from(ip.header_len()))?;
    let payload = ip.payload_mut();
    let mut tcp = TcpPacket::new_checked(payload.get_mut(..ip_payload_len)?).ok()?;
    let w = tcp.window_len();
    if w <= 1 {
        return None;
    }
    tcp.set_window_len(w - 1);
    tcp.fill_checksum(&IpAddress::Ipv4(src), &IpAddress::Ipv4(dst));
    Some(buf)
}

/// Split a received data+FIN segment into the data without FIN and a FIN-only segment
/// that follows it (same headers and options, sequence number after the data), or `None`
/// to leave the frame as it is.
///
/// Works around smoltcp 0.14's receive path: it trims a segment to the receive window it
/// last advertised and then acts on the segment's FIN even when the trimmed tail held the
/// last bytes before it (it checks only for a hole *before* the segment). The window's
/// right edge moves left by up to `2^wscale - 1` bytes when an advertised window is
/// rounded down to the scale, so a peer's last segment can end past it: the connection then
/// went to CLOSE-WAIT with those bytes missing and the application saw a clean end of
/// stream 16-24 bytes early (tests/xdp_tcp.rs, 3 of ~60 looped runs). Split, smoltcp keeps
/// what fits, and the FIN-only segment is accepted only if everything before it was (its
/// "hole before the FIN" check); otherwise the peer retransmits the rest (RFC 9293 §3.10.7.4:
/// a FIN is processed only once the data before it is in).
///
/// The data copy gets its checksum updated incrementally (RFC 1624), so a corrupted
/// segment stays corrupted for smoltcp's check; the FIN-only segment is built from a
/// segment whose checksums passed the checks smoltcp would make (`caps`), so it cannot
/// launder a corrupted header.
fn split_fin(
    frame: &[u8],
    p: &Parsed<'_>,
    caps: &ChecksumCapabilities,
) -> Option<(Vec<u8>, Vec<u8>)> {
    if !checksums_valid(p, caps) {
        return None;
    }
    let eth_len = frame.len() - p.ip.as_ref().len();
    let ip_hl = usize::from(p.ip.header_len());
    let tcp_at = eth_len + ip_hl;
    let tcp_hl = usize::from(p.tcp.header_len());
    let payload_len = p.tcp.payload().len();
    let ip_total = usize::from(p.ip.total_len());
    if tcp_at + tcp_hl + payload_len > frame.len() || ip_hl + tcp_hl + payload_len != ip_total {
        return None;
    }
    let data = data_without_fin(frame, tcp_at, tcp_hl + payload_len);
    // FIN-only: the headers, no payload, sequence number after the data.
    let mut fin = frame[..tcp_at + tcp_hl].to_vec();
    {
        let mut ip = Ipv4Packet::new_unchecked(&mut fin[eth_len..]);
        ip.set_total_len((ip_hl + tcp_hl) as u16);
        ip.fill_checksum();
    }
    let (src, dst) = (
        IpAddress::Ipv4(p.ip.src_addr()),
        IpAddress::Ipv4(p.ip.dst_addr()),
    );
    finish_fin_only(&mut fin[tcp_at..], payload_len, &src, &dst);
    Some((data, fin))
}

/// The segment at `frame[tcp_at..tcp_at + tcp_len]` (with everything before it) with its
/// FIN flag cleared and its checksum updated incrementally (RFC 1624): the flags share the
/// 16-bit word at TCP offset 12.
fn data_without_fin(frame: &[u8], tcp_at: usize, tcp_len: usize) -> Vec<u8> {
    const FIN: u16 = 0x0001;
    let mut data = frame[..tcp_at + tcp_len].to_vec();
    let word_at = tcp_at + 12;
    let old = u16::from_be_bytes([data[word_at], data[word_at + 1]]);
    let new = old & !FIN;
    data[word_at..word_at + 2].copy_from_slice(&new.to_be_bytes());
    let ck_at = tcp_at + 16;
    let ck = u16::from_be_bytes([data[ck_at], data[ck_at + 1]]);
    data[ck_at..ck_at + 2].copy_from_slice(&incremental_checksum(ck, old, new).to_be_bytes());
    data
}

/// Turn a copy of a data+FIN segment's TCP header (`tcp`, no payload) into the FIN-only
/// segment that follows `payload_len` bytes of data, with a full checksum.
fn finish_fin_only(tcp: &mut [u8], payload_len: usize, src: &IpAddress, dst: &IpAddress) {
    let mut t = TcpPacket::new_unchecked(tcp);
    t.set_seq_number(t.seq_number() + payload_len);
    t.fill_checksum(src, dst);
}

/// [`split_fin`] for a TCP segment over IPv6 (no extension headers, as smoltcp's TCP
/// sockets see it); `None` for anything else.
fn split_fin_ipv6(frame: &[u8], caps: &ChecksumCapabilities) -> Option<(Vec<u8>, Vec<u8>)> {
    let tcp = ipv6_tcp(frame)?;
    let payload_len = tcp.payload().len();
    if !tcp.fin() || payload_len == 0 || !tcp.ack() || tcp.syn() || tcp.rst() {
        return None;
    }
    let eth = EthernetFrame::new_checked(frame).ok()?;
    let ip = Ipv6Packet::new_checked(eth.payload()).ok()?;
    let (src, dst) = (
        IpAddress::Ipv6(ip.src_addr()),
        IpAddress::Ipv6(ip.dst_addr()),
    );
    if caps.tcp.rx() && !tcp.verify_checksum(&src, &dst) {
        return None;
    }
    const IPV6_HEADER: usize = 40;
    let tcp_at = 14 + IPV6_HEADER;
    let tcp_hl = usize::from(tcp.header_len());
    if usize::from(ip.payload_len()) != tcp_hl + payload_len
        || tcp_at + tcp_hl + payload_len > frame.len()
    {
        return None;
    }
    let data = data_without_fin(frame, tcp_at, tcp_hl + payload_len);
    let mut fin = frame[..tcp_at + tcp_hl].to_vec();
    Ipv6Packet::new_unchecked(&mut fin[14..]).set_payload_len(tcp_hl as u16);
    finish_fin_only(&mut fin[tcp_at..], payload_len, &src, &dst);
    Some((data, fin))
}

/// RFC 1624 eqn. 3: the Internet checksum `ck` after one 16-bit word changed `old -> new`.
fn incremental_checksum(ck: u16, old: u16, new: u16) -> u16 {
    let mut sum = u32::from(!ck) + u32::from(!old) + u32::from(new);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Receive token of [`WatchedDevice`]: shows the frame to the [`AckWatch`] first.
pub(crate) struct WatchedRx<'w, T> {
    inner: T,
    watch: &'w mut AckWatch,
    now: Instant,
}

impl<T: RxToken> RxToken for WatchedRx<'_, T> {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        let watch = self.watch;
        let now = self.now;
        self.inner.consume(|frame| {
            if !watch.full_ports.is_empty() && is_syn_to(frame, &watch.full_ports) {
                watch.syn_drops += 1;
                // An empty frame: smoltcp rejects it as too short to be Ethernet.
                return f(&[]);
            }
            // One parse per frame for the RST hold, the duplicate-ACK guard and the ACK
            // watch.
            let v4 = ipv4_tcp(frame);
            match &v4 {
                Some((ip, tcp)) if watch.touched.len() < TOUCHED_MAX => watch
                    .touched
                    .push(pack(&(ip.src_addr(), tcp.src_port(), tcp.dst_port()))),
                _ => watch.touched_all = true,
            }
            if let Some((ip, tcp)) = &v4 {
                if tcp.rst() && watch.held_rsts.len() < HELD_RSTS_MAX {
                    let key = pack(&(ip.src_addr(), tcp.src_port(), tcp.dst_port()));
                    if watch.flows.contains_key(&key) {
                        watch.held_rsts.push_back(frame.to_vec());
                        return f(&[]);
                    }
                }
            }
            let split = if let Some(p) = v4.and_then(|(ip, tcp)| parse_from(ip, tcp)) {
                if !watch.fins.is_empty() && watch.dup_ack_behind_fin(&p) {
                    watch.dup_acks_withheld += 1;
                    return f(&[]);
                }
                watch.observe_parsed(frame, &p, now);
                if p.tcp.fin() && !p.tcp.payload().is_empty() {
                    split_fin(frame, &p, &watch.checksums)
                } else {
                    None
                }
            } else {
                split_fin_ipv6(frame, &watch.checksums)
            };
            if let Some((data, fin)) = split {
                watch.fins_split += 1;
                watch.split_fins.push_back(fin);
                return f(&data);
            }
            f(frame)
        })
    }
}

/// Transmit token that lets the [`AckWatch`] see what was sent (for FINs).
pub(crate) struct WatchedTx<'w, T> {
    inner: T,
    watch: Option<&'w mut AckWatch>,
}

impl<T: TxToken> TxToken for WatchedTx<'_, T> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        let Some(watch) = self.watch else {
            return self.inner.consume(len, f);
        };
        self.inner.consume(len, |buf| {
            let r = f(buf);
            watch.observe_tx(buf);
            r
        })
    }
}

/// Device adaptor that caps the MTU and lets the [`AckWatch`] see received frames.
pub(crate) struct WatchedDevice<'d, D: ?Sized> {
    pub(crate) inner: &'d mut D,
    pub(crate) max_frame: usize,
    pub(crate) watch: &'d mut AckWatch,
    pub(crate) now: Instant,
}

impl<D: Device + ?Sized> Device for WatchedDevice<'_, D> {
    type RxToken<'a>
        = WatchedRx<'a, D::RxToken<'a>>
    where
        Self: 'a;
    type TxToken<'a>
        = WatchedTx<'a, D::TxToken<'a>>
    where
        Self: 'a;

    fn receive(
        &mut self,
        timestamp: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let (rx, tx) = self.inner.receive(timestamp)?;
        Some((
            WatchedRx {
                inner: rx,
                watch: &mut *self.watch,
                now: self.now,
            },
            // The reply token of a received frame: smoltcp sends only immediate replies
            // through it (ACK, challenge ACK, RST), never a FIN, which goes out from socket
            // egress through `transmit`; so it needs no watch (the receive token holds it).
            WatchedTx {
                inner: tx,
                watch: None,
            },
        ))
    }

    fn transmit(&mut self, timestamp: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        let tx = self.inner.transmit(timestamp)?;
        Some(WatchedTx {
            inner: tx,
            watch: Some(&mut *self.watch),
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = self.inner.capabilities();
        caps.max_transmission_unit = caps.max_transmission_unit.min(self.max_frame);
        caps
    }
}

/// The flow (peer address, peer port, local port) of a received IPv4 TCP segment.
pub(crate) fn rst_flow(frame: &[u8]) -> Option<FlowKey> {
    let (ip, tcp) = ipv4_tcp(frame)?;
    Some((ip.src_addr(), tcp.src_port(), tcp.dst_port()))
}

/// Receive token of a replayed frame.
pub(crate) struct ReplayRx(Vec<u8>);

impl RxToken for ReplayRx {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        f(&self.0)
    }
}

/// Device that feeds replayed frames to the stack; transmissions go to the real device.
pub(crate) struct ReplayDevice<'d, D: ?Sized> {
    pub(crate) inner: &'d mut D,
    pub(crate) max_frame: usize,
    pub(crate) frames: &'d mut VecDeque<Vec<u8>>,
}

impl<D: Device + ?Sized> Device for ReplayDevice<'_, D> {
    type RxToken<'a>
        = ReplayRx
    where
        Self: 'a;
    type TxToken<'a>
        = D::TxToken<'a>
    where
        Self: 'a;

    fn receive(
        &mut self,
        timestamp: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        if self.frames.is_empty() {
            return None;
        }
        let tx = self.inner.transmit(timestamp)?;
        let frame = self.frames.pop_front()?;
        Some((ReplayRx(frame), tx))
    }

    fn transmit(&mut self, timestamp: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        self.inner.transmit(timestamp)
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = self.inner.capabilities();
        caps.max_transmission_unit = caps.max_transmission_unit.min(self.max_frame);
        caps
    }
}

#[cfg(test)]
mod tests;
