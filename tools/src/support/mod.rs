//! Code the interop tools share: the engine selection and byte transport (kernel TCP or
//! an xwarp engine) and, for the two peers that still drive the sans-IO connection on
//! their own thread (`xwarp-rping-interop`, `xwarp-perftest-peer`), the endpoint that
//! runs it over that transport. `xwarp-rping` uses only the engine selection
//! ([`transport::NetArgs::engine_spec`]) and runs on `xwarp::verbs`.

pub mod endpoint;
pub mod transport;
