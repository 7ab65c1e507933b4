#![warn(missing_docs)]
//! The foundation of xwarp's libibverbs + librdmacm compatible library (issue 12).
//!
//! Unmodified rdma-core programs call the inline functions of `<infiniband/verbs.h>`
//! (`ibv_post_send`, `ibv_poll_cq`, ...), which read function pointers straight out of the
//! structures the library hands out. Those structures must therefore have byte-for-byte the
//! layout of the installed headers: [`abi`] holds them as `#[repr(C)]` Rust types, and
//! `tests/layout.rs` checks every size, alignment, field offset and enum value against the C
//! compiler's view of Debian 12's rdma-core 44 headers.
//!
//! No `ibv_*` / `rdma_*` symbol is exported yet; `README.md` lists the ABI surface the target
//! programs import and the plan for the implementation.

pub mod abi;
