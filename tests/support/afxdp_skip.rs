//! Loud skipping for tests that need root, AF_XDP and iproute2 (network namespaces, veth
//! pairs, XDP programs): the one copy, shared by the facade's tests and the poll-driver's.
//! Include with `#[macro_use] #[path = "support/afxdp_skip.rs"] mod afxdp_skip;` at the
//! test crate's root (from `poll-driver/tests/`: `"../../tests/support/afxdp_skip.rs"`) and
//! start each such test with `require_root_and_afxdp!();`. The including package must depend
//! on `xwarp-poll-driver`.

use std::io::Write;

use xwarp_poll_driver::netns;

/// Whether the effective user id is 0, from `/proc/self/status` (no libc needed).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// `Some(reason)` if tests that need root, AF_XDP and `ip` cannot run here.
pub fn skip_reason() -> Option<String> {
    if !is_root() {
        return Some("needs root (network namespaces, veth pairs, AF_XDP)".into());
    }
    if !xwarp_poll_driver::afxdp::available() {
        return Some("AF_XDP sockets are not available in this kernel".into());
    }
    if netns::ip(&["-V"]).is_err() {
        return Some("the `ip` tool (iproute2) is missing".into());
    }
    None
}

/// Print the `SKIPPED:` line straight to fd 2 (libtest's capture only swallows the print
/// macros).
pub fn report_skip(reason: &str, file: &str, line: u32) {
    let _ = writeln!(std::io::stderr(), "SKIPPED: {reason} ({file}:{line})");
}

/// Return from the calling test, loudly, when [`skip_reason`] says it cannot run here.
macro_rules! require_root_and_afxdp {
    () => {
        if let Some(reason) = $crate::afxdp_skip::skip_reason() {
            $crate::afxdp_skip::report_skip(&reason, file!(), line!());
            return;
        }
    };
}
