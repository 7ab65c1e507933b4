//! Shared receive queues.

use xwarp_rdmap::verbs::{PostError, Sge, MAX_SGE};

use crate::context::Device;
use crate::engine::cmd::Cmd;

/// A shared receive queue.
#[derive(Debug)]
pub struct SharedReceiveQueue {
    pub(crate) dev: Device,
    pub(crate) id: xwarp_rdmap::verbs::SrqId,
}

impl SharedReceiveQueue {
    /// Post a receive to the SRQ. A full SRQ completes the request on no CQ (the error
    /// is counted in the engine); keep within the depth.
    pub fn post_recv(&self, wr_id: u64, sgl: &[Sge]) -> Result<(), PostError> {
        if sgl.len() > MAX_SGE {
            return Err(PostError::InvalidSgl);
        }
        self.dev
            .inner
            .send(Cmd::PostSrqRecv {
                srq: self.id,
                wr: xwarp_rdmap::verbs::RecvWr {
                    wr_id,
                    sgl: sgl.to_vec(),
                },
            })
            .map_err(|_| PostError::InvalidState)
    }
}
