//! DDP segment headers (RFC 5041).
