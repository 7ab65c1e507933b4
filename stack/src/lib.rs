//! # xwarp-stack — the TCP engine on smoltcp
#![warn(missing_docs)]
