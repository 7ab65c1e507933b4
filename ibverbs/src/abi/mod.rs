//! `#[repr(C)]` definitions of the structures and constants of the libibverbs and librdmacm
//! ABI (rdma-core 44 on x86_64 Linux), named as in C so that the mapping is obvious.
//!
//! C enums are plain integer type aliases with their values as constants: a C program may
//! store any value in them, so a Rust `enum` would be unsound to read back. Anonymous C
//! unions get a named Rust field; the doc comment of each says which.

#![allow(non_camel_case_types, non_snake_case)]

pub mod rdma_cma;
pub mod verbs;
pub mod verbs_attr;
pub mod verbs_base;
pub mod verbs_consts;

pub use rdma_cma::*;
pub use verbs::*;
pub use verbs_attr::*;
pub use verbs_base::*;
pub use verbs_consts::*;
