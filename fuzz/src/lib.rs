//! Fuzz targets for the xwarp wire paths, shared by the cargo-fuzz binaries in
//! `fuzz/libfuzzer/` (nightly, coverage-guided, overflow checks and debug assertions on)
//! and by this crate's tests, which replay the seed corpus in `fuzz/corpus/` on stable.
//!
//! Each `pub fn` in [`targets`] takes one input and panics when an oracle fails. Oracles
//! beyond "no panic" live in [`oracle`]: regions in several PDs filled with known bytes,
//! checked after every input for bytes changed outside what the peer may address, bytes of
//! regions the peer may not read leaving in what the QP transmits, and Sends writing
//! outside their posted SGEs.

pub mod corpus;
pub mod cursor;
pub mod oracle;
pub mod targets;
pub mod tcp;

/// One fuzz target: it panics when an input breaks an oracle.
pub type Target = fn(&[u8]);

/// Every target by name, as the cargo-fuzz binaries and `fuzz/corpus/<name>/` call it.
pub static TARGETS: &[(&str, Target)] = &[
    ("mpa_frame", targets::mpa_frame),
    ("mpa_negotiator", targets::mpa_negotiator),
    ("fpdu", targets::fpdu),
    ("rdmap_rx", targets::rdmap_rx),
    ("conn", targets::conn),
    ("mpa_pending", targets::mpa_pending),
    ("tcp_frames", tcp::tcp_frames),
];
