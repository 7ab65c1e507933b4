//! # xwarp-telemetry — live engine counters in shared memory
//!
//! Every xwarp engine creates a segment file `xwarp-<pid>-<engine index>` in
//! [`stats_dir`] (`/dev/shm`, or `$XWARP_STATS_DIR`), maps it and keeps its counters
//! there, so `xwarp stat` in another process can read them while the engine runs:
//!
//! * counters (engine loop, NIC, TCP stack) are relaxed atomic stores by the engine
//!   thread, no locks;
//! * tables (TCP connections, queue pairs) are published a few times a second under a
//!   seqlock ([`Segment::publish_conns`]), so a reader never keeps a torn record;
//! * the file is removed when the engine stops ([`Segment::remove`], on drop, and by an
//!   `atexit` hook on a normal process exit); [`reader::scan`] tells segments of dead
//!   processes apart (pid gone, or reused: the header keeps the process start time) and
//!   [`reader::clean`] removes them.
//!
//! The binary layout (versioned, with a magic) is documented in [`layout`]. This crate
//! depends on nothing of xwarp: `xwarp-poll-driver`, `xwarp-stack` and the tools build on
//! it. `XWARP_STATS=0` turns publishing off ([`enabled`]).
#![warn(missing_docs)]

pub mod layout;
mod map;
pub mod reader;
mod writer;

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

pub use layout::{
    ConnRecord, EngineCounters, NicCounters, QpRecord, QpState, StackCounters, TermCode,
};
pub use writer::{Capacity, Segment, SegmentInfo};

/// Where segments live: `$XWARP_STATS_DIR` if set and not empty, else `/dev/shm`.
pub fn stats_dir() -> PathBuf {
    match std::env::var_os("XWARP_STATS_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from("/dev/shm"),
    }
}

/// Whether engines publish: yes unless `XWARP_STATS` is `0`, `off`, `no` or `false`.
pub fn enabled() -> bool {
    match std::env::var("XWARP_STATS") {
        Ok(v) => !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "off" | "no" | "false"
        ),
        Err(_) => true,
    }
}

/// File name of engine `index` of process `pid`.
pub fn segment_name(pid: u32, index: u32) -> String {
    format!("xwarp-{pid}-{index}")
}

/// This program's name: the file name of `argv[0]`, else `/proc/self/comm`.
pub fn program_name() -> String {
    let arg0 = std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .filter(|n| !n.is_empty());
    arg0.or_else(|| {
        std::fs::read_to_string("/proc/self/comm")
            .ok()
            .map(|s| s.trim().to_owned())
    })
    .unwrap_or_else(|| "?".into())
}

/// Start time of process `pid` (clock ticks after boot, `/proc/PID/stat` field 22), or
/// `None` if there is no such process.
pub fn proc_start_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces or ')'.
    let after = &s[s.rfind(')')? + 1..];
    // Fields from 3 on; field 22 is the 20th of them.
    after.split_whitespace().nth(19)?.parse().ok()
}

/// This process's pid namespace: the inode of `/proc/self/ns/pid` (0 if it cannot be
/// read). A segment records its writer's, so a reader in another namespace, where the
/// writer's pid means nothing, does not take a live segment for a dead one.
pub fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// Now, in nanoseconds since the Unix epoch.
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests;
