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
//! Built as `libxwarp_ibverbs.so` (a `cdylib`, preloaded by `xwarp run`), it exports so
//! far the device-discovery calls of Debian's `ibv_devices` and `ibv_devinfo`
//! ([`exports`]), with libibverbs' symbol versions: one device per `XWARP_IFACE`, named
//! `xwarp_<iface>` ([`device`]), node type RNIC, transport iWARP, with the attributes of
//! [`attr`]. `README.md` lists the whole ABI surface the target programs import and the
//! plan for the rest.

pub mod abi;
pub mod attr;
pub mod config;
pub mod cq;
pub mod device;
pub mod engine;
pub mod exports;
pub(crate) mod ffi;
pub mod misc;
pub mod mr;
pub mod netdev;
mod ops;
pub mod pd;
pub mod qp;
pub mod srq;
pub mod testing;
