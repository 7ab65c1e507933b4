//! Loud skipping for tests that need root, AF_XDP and iproute2 (network namespaces, veth
//! pairs, XDP programs). Include with
//! `#[macro_use] #[path = "support/afxdp_skip.rs"] mod afxdp_skip;` and start each such
//! test with `require_root_and_afxdp!();`.

use std::io::Write;

use xwarp::poll_driver::netns;

/// `Some(reason)` if tests that need root, AF_XDP and `ip` cannot run here.
pub fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, veth pairs, AF_XDP)".into());
    }
    if !xwarp::poll_driver::afxdp::available() {
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
