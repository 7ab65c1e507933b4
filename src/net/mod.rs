//! The native socket API over an xwarp engine.
