//! The XDP steering program, generated as raw eBPF instructions at run time, and its
//! attachment as a bpf_link (detached by the kernel when the process dies).
//!
//! The program redirects to the XSKMAP (key = `rx_queue_index`) only the frames addressed to
//! the engine and returns `XDP_PASS` for everything else, so the host stack keeps working on
//! the same interface:
//! * IPv4 whose destination is one of the engine's IPv4 addresses;
//! * IPv6 whose destination is one of the engine's IPv6 addresses;
//! * ARP whose target protocol address is an engine IPv4 address;
//! * ICMPv6 Neighbor Solicitation/Advertisement whose target is an engine IPv6 address (an NS
//!   goes to a solicited-node multicast address, so the destination alone does not match);
//! * optionally, of the IP traffic above, only TCP to a set of destination ports.
//!
//! Frames with VLAN tags and IPv6 extension headers are passed to the kernel.

use super::bpf::{self, BpfInsn};
use super::netlink::{self, XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// Prefix of every program name xwarp loads; a stale program with this prefix is replaced
/// without asking.
pub const PROGRAM_NAME_PREFIX: &str = "xwarp";
const PROGRAM_NAME: &str = "xwarp_steer";

pub(super) const XDP_PASS: i32 = 2;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
pub(super) const BPF_PSEUDO_MAP_FD: u8 = 1;
/// `prog_flags` bit: the program handles multi-buffer (fragmented) frames.
pub(super) const BPF_F_XDP_HAS_FRAGS: u32 = 1 << 5;

/// Which frames the steering program hands to the engine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SteeringFilter {
    /// The engine's IPv4 addresses (never configured on the kernel interface).
    pub ipv4: Vec<Ipv4Addr>,
    /// The engine's IPv6 addresses.
    pub ipv6: Vec<Ipv6Addr>,
    /// `Some(ports)`: of the IP traffic to the engine's addresses, redirect only TCP segments
    /// to these destination ports (ARP/NDP still follow `neighbor_discovery`).
    pub tcp_ports: Option<Vec<u16>>,
    /// Redirect ARP and ICMPv6 NS/NA targeting the engine's addresses (the engine answers
    /// neighbor discovery itself). `true` unless the kernel resolves on the engine's behalf.
    pub neighbor_discovery: bool,
}

impl SteeringFilter {
    /// A filter for an engine owning `ipv4` and `ipv6`, all traffic, with neighbor discovery.
    pub fn new(ipv4: Vec<Ipv4Addr>, ipv6: Vec<Ipv6Addr>) -> Self {
        SteeringFilter {
            ipv4,
            ipv6,
            tcp_ports: None,
            neighbor_discovery: true,
        }
    }
}

// Opcode pieces (include/uapi/linux/bpf_common.h, bpf.h).
pub(super) const LDX: u8 = 0x01;
pub(super) const ALU64: u8 = 0x07;
pub(super) const JMP: u8 = 0x05;
pub(super) const JMP32: u8 = 0x06;
pub(super) const W: u8 = 0x00;
pub(super) const H: u8 = 0x08;
pub(super) const B: u8 = 0x10;
pub(super) const MEM: u8 = 0x60;
pub(super) const K: u8 = 0x00;
pub(super) const X: u8 = 0x08;
pub(super) const ADD: u8 = 0x00;
pub(super) const AND: u8 = 0x50;
pub(super) const LSH: u8 = 0x60;
pub(super) const MOV: u8 = 0xb0;
pub(super) const JA: u8 = 0x00;
pub(super) const JEQ: u8 = 0x10;
pub(super) const JGT: u8 = 0x20;
pub(super) const JNE: u8 = 0x50;
pub(super) const JSET: u8 = 0x40;
pub(super) const JLT: u8 = 0xa0;
pub(super) const CALL: u8 = 0x80;
pub(super) const EXIT: u8 = 0x90;

#[derive(Clone, Copy)]
pub(super) struct Label(usize);

/// A tiny assembler with forward labels.
pub(super) struct Asm {
    insns: Vec<BpfInsn>,
    fixups: Vec<(usize, Label)>,
    labels: Vec<Option<usize>>,
}

impl Asm {
    pub(super) fn new() -> Self {
        Asm {
            insns: Vec::new(),
            fixups: Vec::new(),
            labels: Vec::new(),
        }
    }
    pub(super) fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }
    pub(super) fn used(&self, l: Label) -> bool {
        self.fixups.iter().any(|(_, f)| f.0 == l.0)
    }
    pub(super) fn bind(&mut self, l: Label) {
        self.labels[l.0] = Some(self.insns.len());
    }
    pub(super) fn raw(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) {
        self.insns.push(BpfInsn {
            code,
            regs: (src << 4) | (dst & 0x0f),
            off,
            imm,
        });
    }
    pub(super) fn ldx(&mut self, size: u8, dst: u8, src: u8, off: i16) {
        self.raw(LDX | size | MEM, dst, src, off, 0);
    }
    pub(super) fn alu_k(&mut self, op: u8, dst: u8, imm: i32) {
        self.raw(ALU64 | op | K, dst, 0, 0, imm);
    }
    pub(super) fn alu_x(&mut self, op: u8, dst: u8, src: u8) {
        self.raw(ALU64 | op | X, dst, src, 0, 0);
    }
    pub(super) fn jmp_k(&mut self, class: u8, op: u8, dst: u8, imm: i32, to: Label) {
        self.fixups.push((self.insns.len(), to));
        self.raw(class | op | K, dst, 0, 0, imm);
    }
    pub(super) fn jmp_x(&mut self, op: u8, dst: u8, src: u8, to: Label) {
        self.fixups.push((self.insns.len(), to));
        self.raw(JMP | op | X, dst, src, 0, 0);
    }
    pub(super) fn ja(&mut self, to: Label) {
        self.jmp_k(JMP, JA, 0, 0, to);
    }
    /// `if data + len > data_end goto fail` (r2 = data, r3 = data_end, clobbers r4).
    pub(super) fn need(&mut self, len: i32, fail: Label) {
        self.alu_x(MOV, 4, 2);
        self.alu_k(ADD, 4, len);
        self.jmp_x(JGT, 4, 3, fail);
    }
    pub(super) fn finish(mut self) -> io::Result<Vec<BpfInsn>> {
        for (at, l) in std::mem::take(&mut self.fixups) {
            let target = self.labels[l.0].ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "unbound label in XDP program")
            })?;
            let off = target as i64 - (at as i64 + 1);
            self.insns[at].off = i16::try_from(off).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "XDP program jump out of range")
            })?;
        }
        Ok(self.insns)
    }
}

/// A network-order field as the value a native-endian load produces.
pub(super) fn be16(v: u16) -> i32 {
    i32::from(u16::from_ne_bytes(v.to_be_bytes()))
}

fn be32(octets: [u8; 4]) -> i32 {
    i32::from_ne_bytes(octets)
}

/// Generate the steering program for `filter`, redirecting through XSKMAP `map_fd`.
///
/// Registers: r1 ctx (then helper args), r2 data, r3 data_end, r4 bounds scratch,
/// r5 loaded field, r9 rx_queue_index.
pub fn steering_program(filter: &SteeringFilter, map_fd: RawFd) -> io::Result<Vec<BpfInsn>> {
    let mut a = Asm::new();
    let pass = a.label();
    let redirect = a.label();
    let ipv4 = a.label();
    let arp = a.label();
    let ipv6 = a.label();
    let ports = a.label();
    let v4_match = a.label();
    let v6_match = a.label();
    let ndp = a.label();
    let has_v4 = !filter.ipv4.is_empty();
    let has_v6 = !filter.ipv6.is_empty();

    // struct xdp_md: data @0, data_end @4, rx_queue_index @16.
    a.ldx(W, 9, 1, 16);
    a.ldx(W, 2, 1, 0);
    a.ldx(W, 3, 1, 4);
    a.need(14, pass);
    a.ldx(H, 5, 2, 12);
    if has_v4 {
        a.jmp_k(JMP, JEQ, 5, be16(0x0800), ipv4);
        if filter.neighbor_discovery {
            a.jmp_k(JMP, JEQ, 5, be16(0x0806), arp);
        }
    }
    if has_v6 {
        a.jmp_k(JMP, JEQ, 5, be16(0x86dd), ipv6);
    }
    a.ja(pass);

    if has_v4 {
        // IPv4: destination address at 14 + 16.
        a.bind(ipv4);
        a.need(34, pass);
        a.ldx(W, 5, 2, 30);
        for addr in &filter.ipv4 {
            a.jmp_k(JMP32, JEQ, 5, be32(addr.octets()), v4_match);
        }
        a.ja(pass);
        a.bind(v4_match);
        if filter.tcp_ports.is_some() {
            a.ldx(B, 5, 2, 23); // protocol
            a.jmp_k(JMP, JNE, 5, 6, pass);
            a.ldx(H, 5, 2, 20); // flags + fragment offset: later fragments carry no port
            a.jmp_k(JMP, JSET, 5, be16(0x1fff), pass);
            a.ldx(B, 5, 2, 14); // version + IHL
            a.alu_k(AND, 5, 0x0f);
            a.alu_k(LSH, 5, 2);
            a.jmp_k(JMP, JLT, 5, 20, pass);
            a.alu_x(MOV, 4, 2);
            a.alu_x(ADD, 4, 5); // r4 = data + IHL*4
            a.alu_x(MOV, 5, 4);
            a.alu_k(ADD, 5, 18); // Ethernet 14 + TCP ports 4
            a.jmp_x(JGT, 5, 3, pass);
            a.ldx(H, 5, 4, 16); // TCP destination port at 14 + IHL*4 + 2
            a.ja(ports);
        } else {
            a.ja(redirect);
        }

        if filter.neighbor_discovery {
            // ARP: target protocol address at 14 + 24.
            a.bind(arp);
            a.need(42, pass);
            a.ldx(W, 5, 2, 38);
            for addr in &filter.ipv4 {
                a.jmp_k(JMP32, JEQ, 5, be32(addr.octets()), redirect);
            }
            a.ja(pass);
        }
    }

    if has_v6 {
        // IPv6: destination address at 14 + 24, next header at 14 + 6.
        a.bind(ipv6);
        a.need(54, pass);
        for addr in &filter.ipv6 {
            let next = a.label();
            let o = addr.octets();
            for w in 0..4 {
                a.ldx(W, 5, 2, 38 + 4 * w as i16);
                let word = [o[4 * w], o[4 * w + 1], o[4 * w + 2], o[4 * w + 3]];
                a.jmp_k(JMP32, JNE, 5, be32(word), next);
            }
            a.ja(v6_match);
            a.bind(next);
        }
        if filter.neighbor_discovery {
            a.ja(ndp);
        } else {
            a.ja(pass);
        }

        a.bind(v6_match);
        if filter.tcp_ports.is_some() {
            a.ldx(B, 5, 2, 20);
            if filter.neighbor_discovery {
                // NS/NA addressed to the engine (e.g. the NA answering its own NS, whose
                // target is the peer): redirect whatever the target.
                let not_icmp = a.label();
                a.jmp_k(JMP, JNE, 5, 58, not_icmp);
                a.need(55, pass);
                a.ldx(B, 5, 2, 54);
                a.jmp_k(JMP, JEQ, 5, 135, redirect);
                a.jmp_k(JMP, JEQ, 5, 136, redirect);
                a.ja(pass);
                a.bind(not_icmp);
            }
            a.jmp_k(JMP, JNE, 5, 6, pass);
            a.need(58, pass);
            a.ldx(H, 5, 2, 56);
            a.ja(ports);
        } else {
            a.ja(redirect);
        }

        if filter.neighbor_discovery {
            // ICMPv6 NS (135) / NA (136): target address at 14 + 40 + 8.
            a.bind(ndp);
            a.ldx(B, 5, 2, 20);
            a.jmp_k(JMP, JNE, 5, 58, pass);
            a.need(78, pass);
            a.ldx(B, 5, 2, 54);
            let target = a.label();
            a.jmp_k(JMP, JEQ, 5, 135, target);
            a.jmp_k(JMP, JNE, 5, 136, pass);
            a.bind(target);
            for addr in &filter.ipv6 {
                let next = a.label();
                let o = addr.octets();
                for w in 0..4 {
                    a.ldx(W, 5, 2, 62 + 4 * w as i16);
                    let word = [o[4 * w], o[4 * w + 1], o[4 * w + 2], o[4 * w + 3]];
                    a.jmp_k(JMP32, JNE, 5, be32(word), next);
                }
                a.ja(redirect);
                a.bind(next);
            }
            a.ja(pass);
        }
    }

    // The verifier rejects unreachable instructions: emit only blocks something jumps to.
    if a.used(ports) {
        // Destination port (native-order load in r5) against the allowed set.
        a.bind(ports);
        for p in filter.tcp_ports.iter().flatten() {
            a.jmp_k(JMP, JEQ, 5, be16(*p), redirect);
        }
        a.ja(pass);
    }

    if a.used(redirect) {
        // return bpf_redirect_map(&xsks, rx_queue_index, XDP_PASS)
        a.bind(redirect);
        a.raw(0x18, 1, BPF_PSEUDO_MAP_FD, 0, map_fd); // ld_imm64 r1 = map
        a.raw(0, 0, 0, 0, 0);
        a.alu_x(MOV, 2, 9);
        a.alu_k(MOV, 3, XDP_PASS);
        a.raw(JMP | CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP);
        a.raw(JMP | EXIT, 0, 0, 0, 0);
    }

    a.bind(pass);
    a.alu_k(MOV, 0, XDP_PASS);
    a.raw(JMP | EXIT, 0, 0, 0, 0);
    a.finish()
}

/// Where to run the XDP program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// Native (driver) mode, falling back to generic if the driver refuses.
    Auto,
    /// Native (driver) mode only.
    Native,
    /// Generic (skb) mode only.
    Generic,
}

impl XdpMode {
    /// The name used on command lines and in reports: `auto`, `native` or `generic`.
    pub fn name(self) -> &'static str {
        match self {
            XdpMode::Auto => "auto",
            XdpMode::Native => "native",
            XdpMode::Generic => "generic",
        }
    }

    /// Parses [`XdpMode::name`]'s spelling; `None` for anything else.
    pub fn from_name(s: &str) -> Option<XdpMode> {
        [XdpMode::Auto, XdpMode::Native, XdpMode::Generic]
            .into_iter()
            .find(|m| m.name() == s)
    }
}

/// A loaded steering program and its XSKMAP.
#[derive(Debug)]
pub struct XdpProgram {
    prog: OwnedFd,
    map: OwnedFd,
    id: u32,
}

impl XdpProgram {
    /// Create an XSKMAP with `queues` slots and load the steering program for `filter`.
    pub fn load(filter: &SteeringFilter, queues: u32) -> io::Result<Self> {
        Self::load_named(filter, queues, PROGRAM_NAME)
    }

    /// [`XdpProgram::load`] under another program name (at most 15 characters of
    /// `[A-Za-z0-9_.]`). Only names starting with [`PROGRAM_NAME_PREFIX`] count as xwarp's
    /// when a stale program is found; tests use other names to play a foreign program.
    pub fn load_named(filter: &SteeringFilter, queues: u32, name: &str) -> io::Result<Self> {
        Self::load_flags(filter, queues, name, 0)
    }

    /// [`XdpProgram::load`] flagged `BPF_F_XDP_HAS_FRAGS`: the program only reads the
    /// first buffer, so frames larger than a page (multi-buffer, jumbo MTU) may reach it.
    /// Native mode refuses a program without the flag on an interface whose MTU exceeds a
    /// page (docs/afxdp.md §7.2).
    pub fn load_with_frags(filter: &SteeringFilter, queues: u32) -> io::Result<Self> {
        Self::load_flags(filter, queues, PROGRAM_NAME, BPF_F_XDP_HAS_FRAGS)
    }

    fn load_flags(
        filter: &SteeringFilter,
        queues: u32,
        name: &str,
        flags: u32,
    ) -> io::Result<Self> {
        let map = bpf::create_xskmap(queues.max(1))?;
        let insns = steering_program(filter, map.as_raw_fd())?;
        let prog = bpf::prog_load_xdp(&insns, name, flags)?;
        let (_, id) = bpf::prog_name_and_id(&prog)?;
        Ok(XdpProgram { prog, map, id })
    }

    /// The kernel's id for this program (as `ip link` shows it).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The program fd (for callers attaching it another way, e.g. tests simulating a crash).
    pub fn fd(&self) -> RawFd {
        self.prog.as_raw_fd()
    }

    /// Steer RX queue `queue` to the XSK `xsk_fd`.
    pub fn set_socket(&self, queue: u32, xsk_fd: RawFd) -> io::Result<()> {
        bpf::map_update_u32(&self.map, queue, xsk_fd as u32)
    }

    /// Stop steering RX queue `queue`.
    pub fn clear_socket(&self, queue: u32) -> io::Result<()> {
        bpf::map_delete_u32(&self.map, queue)
    }

    /// Run the program once on `frame` (`BPF_PROG_TEST_RUN`, RX queue 0) and return the
    /// XDP action: 2 = pass, 4 = redirect.
    pub fn test_run(&self, frame: &[u8]) -> io::Result<u32> {
        bpf::prog_test_run(&self.prog, frame)
    }

    /// Attach to `ifindex` as a bpf_link. If another program is attached (a stale one left by
    /// a crash, via netlink or a surviving link) it is detached first when its name starts
    /// with [`PROGRAM_NAME_PREFIX`] or when `force` is set; otherwise the error says whose
    /// program is in the way. Returns the link and the mode actually used.
    pub fn attach(&self, ifindex: u32, mode: XdpMode, force: bool) -> io::Result<XdpLink> {
        self.attach_inner(ifindex, mode, Some(force))
    }

    /// Attach to `ifindex` as a bpf_link, never detaching anything: if a program is
    /// attached already (`EBUSY`/`EEXIST`) the error has kind
    /// [`io::ErrorKind::AddrInUse`] and the interface is left as it was. For probes,
    /// which must not disturb another process's program.
    pub fn attach_no_replace(&self, ifindex: u32, mode: XdpMode) -> io::Result<XdpLink> {
        self.attach_inner(ifindex, mode, None)
    }

    /// `replace`: `Some(force)` to detach a program in the way (see [`XdpProgram::attach`]),
    /// `None` to fail instead.
    fn attach_inner(
        &self,
        ifindex: u32,
        mode: XdpMode,
        replace: Option<bool>,
    ) -> io::Result<XdpLink> {
        attach_fd(&self.prog, ifindex, mode, replace)
    }
}

/// Attach the XDP program `prog` to `ifindex` as a bpf_link (see [`XdpProgram::attach`];
/// `replace` as in `XdpProgram::attach_inner`). Shared with the loss dropper.
pub(super) fn attach_fd(
    prog: &OwnedFd,
    ifindex: u32,
    mode: XdpMode,
    replace: Option<bool>,
) -> io::Result<XdpLink> {
    let modes: &[u32] = match mode {
        XdpMode::Auto => &[XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE],
        XdpMode::Native => &[XDP_FLAGS_DRV_MODE],
        XdpMode::Generic => &[XDP_FLAGS_SKB_MODE],
    };
    let mut last = None;
    for &flags in modes {
        let mut replaced = false;
        loop {
            match bpf::link_create_xdp(prog, ifindex, flags) {
                Ok(fd) => {
                    return Ok(XdpLink {
                        fd,
                        ifindex,
                        native: flags == XDP_FLAGS_DRV_MODE,
                    })
                }
                Err(e)
                    if !replaced
                        && matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EEXIST)) =>
                {
                    let Some(force) = replace else {
                        return Err(io::Error::new(
                            io::ErrorKind::AddrInUse,
                            format!(
                                "ifindex {ifindex} has an XDP program attached \
                                     already ({e}); not replacing it"
                            ),
                        ));
                    };
                    replace_stale(ifindex, force)?;
                    replaced = true;
                }
                Err(e) => {
                    last = Some(io::Error::new(
                        e.kind(),
                        format!(
                            "attaching XDP program to ifindex {ifindex} in {} mode: {e}",
                            if flags == XDP_FLAGS_DRV_MODE {
                                "native"
                            } else {
                                "generic"
                            }
                        ),
                    ));
                    break;
                }
            }
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no XDP mode to try")))
}

/// Detach whatever XDP program sits on `ifindex` if it is ours (name prefix) or `force`.
fn replace_stale(ifindex: u32, force: bool) -> io::Result<()> {
    let att = netlink::xdp_attachment(ifindex)?;
    for (id, flags) in [(att.drv, XDP_FLAGS_DRV_MODE), (att.skb, XDP_FLAGS_SKB_MODE)] {
        if id == 0 {
            continue;
        }
        let name = bpf::prog_fd_by_id(id)
            .and_then(|fd| bpf::prog_name_and_id(&fd))
            .map(|(n, _)| n)
            .unwrap_or_default();
        if !force && !name.starts_with(PROGRAM_NAME_PREFIX) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "ifindex {ifindex} already runs XDP program '{name}' (id {id}); \
                     not an xwarp program, refusing to replace it without force"
                ),
            ));
        }
        match netlink::set_xdp_fd(ifindex, -1, flags) {
            Ok(()) => {}
            // Attached through a bpf_link that is still alive: find that link and detach it.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => detach_link_of(id)?,
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("detaching stale XDP program '{name}' (id {id}): {e}"),
                ))
            }
        }
    }
    Ok(())
}

/// Detach the XDP link(s) running program `prog_id` (ids are global, the program was found
/// through this namespace's interface, so this touches no other interface's link unless it
/// shares the very same program).
fn detach_link_of(prog_id: u32) -> io::Result<()> {
    let mut id = 0;
    let mut found = false;
    while let Some(next) = bpf::link_next_id(id)? {
        id = next;
        let Ok(fd) = bpf::link_fd_by_id(id) else {
            continue;
        };
        if let Ok((ty, _, pid)) = bpf::link_info(&fd) {
            if ty == bpf::BPF_LINK_TYPE_XDP && pid == prog_id {
                bpf::link_detach(fd.as_raw_fd())?;
                found = true;
            }
        }
    }
    if found {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("XDP program id {prog_id} is attached but no link for it was found"),
        ))
    }
}

/// An attached XDP program (bpf_link). Detached on drop; the kernel also detaches it when
/// the process dies.
#[derive(Debug)]
pub struct XdpLink {
    fd: OwnedFd,
    ifindex: u32,
    native: bool,
}

impl XdpLink {
    /// `true` for native (driver) mode, `false` for generic.
    pub fn is_native(&self) -> bool {
        self.native
    }

    /// The interface the program is attached to.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }
}

impl Drop for XdpLink {
    fn drop(&mut self) {
        // Explicit detach: a forked child holding a copy of the fd must not keep it alive.
        let _ = bpf::link_detach(self.fd.as_raw_fd());
    }
}

/// A steering program attached to one interface, shared by the [`crate::afxdp::AfXdpNic`]s
/// of its RX queues (one XSK per queue, all in the program's XSKMAP). The program is
/// detached when the last holder drops it.
#[derive(Debug)]
pub struct Steering {
    // Drop order: detach first, then close the program and its map.
    link: XdpLink,
    program: XdpProgram,
    queues: u32,
}

impl Steering {
    /// Load the program for `filter` with room for `queues` RX queues and attach it to
    /// `ifindex` (see [`XdpProgram::attach`] for `mode` and `force`).
    pub fn attach(
        ifindex: u32,
        filter: &SteeringFilter,
        queues: u32,
        mode: XdpMode,
        force: bool,
    ) -> io::Result<std::sync::Arc<Self>> {
        Self::attach_with_frags(ifindex, filter, queues, mode, force, false)
    }

    /// [`Steering::attach`]; with `frags` the program is loaded with
    /// [`XdpProgram::load_with_frags`] (needed for multi-buffer sockets).
    pub fn attach_with_frags(
        ifindex: u32,
        filter: &SteeringFilter,
        queues: u32,
        mode: XdpMode,
        force: bool,
        frags: bool,
    ) -> io::Result<std::sync::Arc<Self>> {
        let queues = queues.max(1);
        let program = if frags {
            XdpProgram::load_with_frags(filter, queues)?
        } else {
            XdpProgram::load(filter, queues)?
        };
        let link = program.attach(ifindex, mode, force)?;
        Ok(std::sync::Arc::new(Steering {
            link,
            program,
            queues,
        }))
    }

    /// The loaded program.
    pub fn program(&self) -> &XdpProgram {
        &self.program
    }

    /// The attachment.
    pub fn link(&self) -> &XdpLink {
        &self.link
    }

    /// Number of RX queues the XSKMAP has room for.
    pub fn queues(&self) -> u32 {
        self.queues
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_jumps_stay_inside_the_program() {
        let filter = SteeringFilter {
            ipv4: vec![Ipv4Addr::new(10, 88, 0, 10), Ipv4Addr::new(10, 88, 1, 10)],
            ipv6: vec!["fd00:88::10".parse().unwrap()],
            tcp_ports: Some(vec![80, 4791]),
            neighbor_discovery: true,
        };
        let insns = steering_program(&filter, 3).unwrap();
        for (i, ins) in insns.iter().enumerate() {
            let class = ins.code & 0x07;
            let op = ins.code & 0xf0;
            if (class == JMP || class == JMP32) && op != CALL && op != EXIT {
                let target = i as i64 + 1 + ins.off as i64;
                assert!(target >= 0 && (target as usize) < insns.len(), "insn {i}");
            }
        }
        let last = insns.last().unwrap();
        assert_eq!(last.code, JMP | EXIT);
    }

    #[test]
    fn verifier_rejection_carries_the_log() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "SKIPPED: bpf(2) needs root");
            return;
        }
        // r0 = *(u32 *)(data + 0) without comparing against data_end.
        let mut a = Asm::new();
        a.ldx(W, 2, 1, 0);
        a.ldx(W, 0, 2, 0);
        a.raw(JMP | EXIT, 0, 0, 0, 0);
        let insns = a.finish().unwrap();
        let err = bpf::prog_load_xdp(&insns, "xwarp_bad", 0).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("verifier log"), "{msg}");
        assert!(msg.contains("invalid access to packet"), "{msg}");
    }

    #[test]
    fn empty_filter_passes_everything() {
        let insns = steering_program(&SteeringFilter::default(), 3).unwrap();
        // No address: no redirect block (the verifier would reject it as unreachable) and
        // the only return value is XDP_PASS.
        assert!(insns.iter().all(|i| i.code != (JMP | CALL)));
        assert!(insns.iter().all(|i| i.code != 0x18), "no map reference");
        let movs_to_r0: Vec<_> = insns
            .iter()
            .filter(|i| i.code == (ALU64 | MOV | K) && i.regs & 0x0f == 0)
            .collect();
        assert_eq!(movs_to_r0.len(), 1);
        assert_eq!(movs_to_r0[0].imm, XDP_PASS);
    }
}
