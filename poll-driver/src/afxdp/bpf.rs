//! Thin wrappers around `bpf(2)`: maps, program load (with the verifier log on failure),
//! XDP links, object info and test runs. Attribute blocks are built as zeroed byte arrays
//! with fields written at their `union bpf_attr` offsets (include/uapi/linux/bpf.h).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

// bpf(2) commands.
const BPF_MAP_CREATE: i32 = 0;
const BPF_MAP_UPDATE_ELEM: i32 = 2;
const BPF_MAP_DELETE_ELEM: i32 = 3;
const BPF_PROG_LOAD: i32 = 5;
const BPF_PROG_TEST_RUN: i32 = 10;
const BPF_PROG_GET_FD_BY_ID: i32 = 13;
const BPF_OBJ_GET_INFO_BY_FD: i32 = 15;
const BPF_LINK_CREATE: i32 = 28;
const BPF_LINK_GET_FD_BY_ID: i32 = 30;
const BPF_LINK_GET_NEXT_ID: i32 = 31;
const BPF_LINK_DETACH: i32 = 34;

/// `BPF_MAP_TYPE_XSKMAP`.
pub const BPF_MAP_TYPE_XSKMAP: u32 = 17;
/// `BPF_PROG_TYPE_XDP`.
pub const BPF_PROG_TYPE_XDP: u32 = 6;
/// `BPF_XDP` attach type.
pub const BPF_XDP: u32 = 37;
/// `BPF_LINK_TYPE_XDP`.
pub const BPF_LINK_TYPE_XDP: u32 = 6;

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BpfInsn {
    /// Opcode.
    pub code: u8,
    /// `dst_reg` in the low nibble, `src_reg` in the high nibble.
    pub regs: u8,
    /// Signed offset (jumps: in instructions, relative to the next one).
    pub off: i16,
    /// Signed immediate.
    pub imm: i32,
}

/// A zeroed `union bpf_attr` image, large enough for every command used here.
struct Attr([u64; 16]);

impl Attr {
    fn new() -> Self {
        Attr([0; 16])
    }
    fn bytes(&mut self) -> &mut [u8; 128] {
        // SAFETY: [u64; 16] and [u8; 128] have the same size; u8 has no alignment needs.
        unsafe { &mut *(self.0.as_mut_ptr().cast::<[u8; 128]>()) }
    }
    fn u32(&mut self, off: usize, v: u32) -> &mut Self {
        self.bytes()[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, off: usize, v: u64) -> &mut Self {
        self.bytes()[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn get_u32(&mut self, off: usize) -> u32 {
        let b = self.bytes();
        u32::from_ne_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
    }
    fn name(&mut self, off: usize, name: &str) -> &mut Self {
        let n = name.len().min(15);
        self.bytes()[off..off + n].copy_from_slice(&name.as_bytes()[..n]);
        self
    }
    fn call(&mut self, cmd: i32) -> io::Result<i64> {
        // SAFETY: the attribute block is a valid, zero-padded `union bpf_attr` image of 128
        // bytes; pointers stored inside it point to live buffers owned by the caller for the
        // duration of the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd as libc::c_long,
                self.0.as_mut_ptr(),
                128 as libc::c_long,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }
    fn call_fd(&mut self, cmd: i32) -> io::Result<OwnedFd> {
        let fd = self.call(cmd)? as RawFd;
        // SAFETY: the kernel returned a fresh file descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

fn ctx(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Create an XSKMAP with `entries` slots (one per RX queue).
pub fn create_xskmap(entries: u32) -> io::Result<OwnedFd> {
    Attr::new()
        .u32(0, BPF_MAP_TYPE_XSKMAP)
        .u32(4, 4)
        .u32(8, 4)
        .u32(12, entries)
        .name(28, "xwarp_xsks")
        .call_fd(BPF_MAP_CREATE)
        .map_err(|e| ctx(e, "bpf(BPF_MAP_CREATE, XSKMAP)"))
}

/// Set `map[key] = value` (u32 key and value).
pub fn map_update_u32(map: &OwnedFd, key: u32, value: u32) -> io::Result<()> {
    map_update(map, key, &value)
}

/// `BPF_MAP_UPDATE_ELEM` of a map with u32 keys: the kernel reads the map's value size
/// from `value`, which the caller's map type fixes (u32 or u64 here).
fn map_update<V: Copy>(map: &OwnedFd, key: u32, value: &V) -> io::Result<()> {
    Attr::new()
        .u32(0, map.as_raw_fd() as u32)
        .u64(8, &key as *const u32 as u64)
        .u64(16, value as *const V as u64)
        .call(BPF_MAP_UPDATE_ELEM)
        .map(|_| ())
        .map_err(|e| ctx(e, "bpf(BPF_MAP_UPDATE_ELEM)"))
}

/// Remove `map[key]`.
pub fn map_delete_u32(map: &OwnedFd, key: u32) -> io::Result<()> {
    let k = key;
    Attr::new()
        .u32(0, map.as_raw_fd() as u32)
        .u64(8, &k as *const u32 as u64)
        .call(BPF_MAP_DELETE_ELEM)
        .map(|_| ())
}

/// Load an XDP program. On failure the verifier log is part of the error message.
pub fn prog_load_xdp(insns: &[BpfInsn], name: &str, flags: u32) -> io::Result<OwnedFd> {
    let license = c"Dual MIT/GPL";
    let load = |log: Option<&mut Vec<u8>>| {
        let mut a = Attr::new();
        a.u32(0, BPF_PROG_TYPE_XDP)
            .u32(4, insns.len() as u32)
            .u64(8, insns.as_ptr() as u64)
            .u64(16, license.as_ptr() as u64)
            .u32(44, flags)
            .name(48, name);
        if let Some(buf) = log {
            a.u32(24, 1)
                .u32(28, buf.len() as u32)
                .u64(32, buf.as_mut_ptr() as u64);
        }
        a.call_fd(BPF_PROG_LOAD)
    };
    match load(None) {
        Ok(fd) => Ok(fd),
        Err(first) => {
            // Load again with the verifier log on to explain the refusal.
            let mut log = vec![0u8; 1 << 20];
            let second = load(Some(&mut log));
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            match second {
                Ok(fd) => Ok(fd),
                Err(_) => Err(io::Error::new(
                    first.kind(),
                    format!("bpf(BPF_PROG_LOAD) of {name}: {first}; verifier log:\n{text}"),
                )),
            }
        }
    }
}

/// Attach `prog` to `ifindex` as an XDP bpf_link in the given mode (`XDP_FLAGS_SKB_MODE`
/// or `XDP_FLAGS_DRV_MODE`). The kernel detaches it when the last link fd closes.
pub fn link_create_xdp(prog: &OwnedFd, ifindex: u32, mode_flags: u32) -> io::Result<OwnedFd> {
    Attr::new()
        .u32(0, prog.as_raw_fd() as u32)
        .u32(4, ifindex)
        .u32(8, BPF_XDP)
        .u32(12, mode_flags)
        .call_fd(BPF_LINK_CREATE)
}

/// Detach a link from its hook (the link object survives until its fds close).
pub fn link_detach(link: RawFd) -> io::Result<()> {
    Attr::new()
        .u32(0, link as u32)
        .call(BPF_LINK_DETACH)
        .map(|_| ())
}

/// Open a program by its id.
pub fn prog_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    Attr::new().u32(0, id).call_fd(BPF_PROG_GET_FD_BY_ID)
}

/// Open a link by its id.
pub fn link_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    Attr::new().u32(0, id).call_fd(BPF_LINK_GET_FD_BY_ID)
}

/// The next link id after `start` (`None` when there is none).
pub fn link_next_id(start: u32) -> io::Result<Option<u32>> {
    let mut a = Attr::new();
    a.u32(0, start);
    match a.call(BPF_LINK_GET_NEXT_ID) {
        Ok(_) => Ok(Some(a.get_u32(4))),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

fn obj_info(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<()> {
    Attr::new()
        .u32(0, fd.as_raw_fd() as u32)
        .u32(4, buf.len() as u32)
        .u64(8, buf.as_mut_ptr() as u64)
        .call(BPF_OBJ_GET_INFO_BY_FD)
        .map(|_| ())
}

/// Name and id of a loaded program (`struct bpf_prog_info`: id at 4, name at 64).
pub fn prog_name_and_id(fd: &OwnedFd) -> io::Result<(String, u32)> {
    let mut info = [0u8; 256];
    obj_info(fd, &mut info)?;
    let id = u32::from_ne_bytes([info[4], info[5], info[6], info[7]]);
    let name = &info[64..80];
    let end = name.iter().position(|&b| b == 0).unwrap_or(16);
    Ok((String::from_utf8_lossy(&name[..end]).into_owned(), id))
}

/// `(type, id, prog_id)` of a link (`struct bpf_link_info`).
pub fn link_info(fd: &OwnedFd) -> io::Result<(u32, u32, u32)> {
    let mut info = [0u8; 64];
    obj_info(fd, &mut info)?;
    let w = |o: usize| u32::from_ne_bytes([info[o], info[o + 1], info[o + 2], info[o + 3]]);
    Ok((w(0), w(4), w(8)))
}

/// Run `prog` once on `frame` (`BPF_PROG_TEST_RUN`) and return its XDP action.
pub fn prog_test_run(prog: &OwnedFd, frame: &[u8]) -> io::Result<u32> {
    let mut out = vec![0u8; frame.len() + 512];
    let mut a = Attr::new();
    a.u32(0, prog.as_raw_fd() as u32)
        .u32(8, frame.len() as u32)
        .u32(12, out.len() as u32)
        .u64(16, frame.as_ptr() as u64)
        .u64(24, out.as_mut_ptr() as u64)
        .u32(32, 1);
    a.call(BPF_PROG_TEST_RUN)
        .map_err(|e| ctx(e, "bpf(BPF_PROG_TEST_RUN)"))?;
    Ok(a.get_u32(4))
}

/// `BPF_MAP_TYPE_ARRAY`.
pub const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_MAP_LOOKUP_ELEM: i32 = 1;

/// Create an array map of `entries` u64 values (u32 keys), all zero.
pub fn create_array_u64(entries: u32, name: &str) -> io::Result<OwnedFd> {
    Attr::new()
        .u32(0, BPF_MAP_TYPE_ARRAY)
        .u32(4, 4)
        .u32(8, 8)
        .u32(12, entries)
        .name(28, name)
        .call_fd(BPF_MAP_CREATE)
        .map_err(|e| ctx(e, "bpf(BPF_MAP_CREATE, ARRAY)"))
}

/// `map[key]` of a u32 → u64 map.
pub fn map_lookup_u64(map: &OwnedFd, key: u32) -> io::Result<u64> {
    let k = key;
    let mut v = 0u64;
    Attr::new()
        .u32(0, map.as_raw_fd() as u32)
        .u64(8, &k as *const u32 as u64)
        .u64(16, &mut v as *mut u64 as u64)
        .call(BPF_MAP_LOOKUP_ELEM)
        .map_err(|e| ctx(e, "bpf(BPF_MAP_LOOKUP_ELEM)"))?;
    Ok(v)
}

/// Set `map[key] = value` (u32 key, u64 value).
pub fn map_update_u64(map: &OwnedFd, key: u32, value: u64) -> io::Result<()> {
    map_update(map, key, &value)
}
