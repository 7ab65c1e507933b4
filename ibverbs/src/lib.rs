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
//! Built as `libxwarp_ibverbs.so` (a `cdylib`, preloaded by `xwarp run`), it exports,
//! with libibverbs' symbol versions, the device-discovery calls of Debian's `ibv_devices`
//! and `ibv_devinfo` ([`exports`]: one device per `XWARP_IFACE`, named `xwarp_<iface>`
//! ([`device`]), node type RNIC, transport iWARP, with the attributes of [`attr`]) and the
//! verbs objects on one xwarp verbs engine per process ([`engine`]): protection domains
//! ([`pd`]), memory regions on the program's own memory ([`mr`]), completion channels and
//! CQs ([`cq`]), RC queue pairs ([`qp`]), shared receive queues ([`srq`]), async events,
//! fork and the small or unsupported verbs ([`misc`]), and the context's ops table that
//! the header-inline `ibv_post_send`/`ibv_poll_cq`/... jump through. Every export runs
//! inside a panic guard; the blocking ones (`ibv_get_cq_event`, `ibv_get_async_event`)
//! survive `pthread_cancel`. `README.md` lists the whole ABI surface the target programs
//! import and how each object maps onto `xwarp::verbs`. librdmacm is [`cm`] (ids, event
//! channels, the pump thread turning engine CM events into rdma_cm events) with its C
//! entry points in [`exports_cm`].

pub mod abi;
pub mod attr;
pub mod cm;
pub mod config;
pub mod cq;
pub mod device;
pub mod engine;
pub mod exports;
pub mod exports_cm;
pub(crate) mod ffi;
pub mod misc;
pub mod mr;
pub mod netdev;
mod ops;
pub mod pd;
pub mod qp;
pub mod srq;
pub mod testing;
