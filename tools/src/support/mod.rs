//! Code the interop tools (`xwarp-rping`, `xwarp-perftest-peer`) share: the engine
//! selection from the command line or `XWARP_ENGINE` ([`transport`]), and the verbs
//! engine and connection helpers on `xwarp::verbs` ([`conn`]).

pub mod conn;
pub mod transport;
