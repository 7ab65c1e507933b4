//! # xwarp-rdmap — RDMAP (RFC 5040) over DDP, sans-IO
#![warn(missing_docs)]
