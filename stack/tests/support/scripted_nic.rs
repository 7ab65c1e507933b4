//! The scripted NIC of the hand-driven `TcpService` tests (`fin_trim.rs`, `hostile.rs`,
//! `peer_fin_reset.rs`): the test pushes the frames the engine receives and reads the frames
//! it sent; no threads, no timing. Included by `#[path]`; `peer.rs` builds the frames.

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;

use smoltcp::phy::{self, ChecksumCapabilities, DeviceCapabilities, Medium};
use xwarp_poll_driver::backend::{Backend, BackendStats};

/// A NIC the test scripts: frames to deliver, frames sent.
#[derive(Default)]
pub struct ScriptedNic {
    /// Frames the engine will receive, in order.
    pub rx: VecDeque<Vec<u8>>,
    /// Frames the engine sent.
    pub tx: Vec<Vec<u8>>,
}

/// A received frame handed to smoltcp.
pub struct Rx(Vec<u8>);
/// A frame smoltcp writes, kept in the NIC's `tx` list.
pub struct Tx<'a>(&'a mut Vec<Vec<u8>>);

impl phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = vec![0u8; len];
        let r = f(&mut buf);
        self.0.push(buf);
        r
    }
}

impl phy::Device for ScriptedNic {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;

    fn receive(
        &mut self,
        _t: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let f = self.rx.pop_front()?;
        Some((Rx(f), Tx(&mut self.tx)))
    }

    fn transmit(&mut self, _t: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        Some(Tx(&mut self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ethernet;
        c.max_transmission_unit = 1514;
        c.checksum = ChecksumCapabilities::default();
        c
    }
}

impl Backend for ScriptedNic {
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
    fn poll_rx(&mut self) -> io::Result<bool> {
        Ok(!self.rx.is_empty())
    }
    fn wait_fd(&self) -> Option<RawFd> {
        None
    }
    fn prepare_sleep(&mut self) -> io::Result<bool> {
        Ok(true)
    }
    fn stats(&self) -> BackendStats {
        BackendStats::default()
    }
}
