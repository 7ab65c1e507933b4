//! The fuzz targets: each feeds arbitrary bytes to one wire parser.

use crate::engine::Target;

/// Every target, in the order `--all` runs them.
pub static ALL: &[Target] = &[];
