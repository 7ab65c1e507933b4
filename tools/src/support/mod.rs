//! Code the rping-family binaries share: the byte transport (kernel TCP or an xwarp
//! engine) and the endpoint that drives a sans-IO iWARP connection over it.

pub mod endpoint;
pub mod transport;
