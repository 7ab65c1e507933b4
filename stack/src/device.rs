//! A `Device` adaptor that caps the MTU the stack sees at the configured one.

use smoltcp::phy::{Device, DeviceCapabilities};
use smoltcp::time::Instant;

/// Length of an Ethernet II header; smoltcp's Ethernet MTU includes it.
pub(crate) const ETHERNET_HEADER_LEN: usize = 14;

/// Borrowed device whose `max_transmission_unit` is at most `max_frame`.
pub(crate) struct CappedDevice<'d, D: ?Sized> {
    pub(crate) inner: &'d mut D,
    pub(crate) max_frame: usize,
}

impl<D: Device + ?Sized> Device for CappedDevice<'_, D> {
    type RxToken<'a>
        = D::RxToken<'a>
    where
        Self: 'a;
    type TxToken<'a>
        = D::TxToken<'a>
    where
        Self: 'a;

    fn receive(&mut self, timestamp: Instant) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        self.inner.receive(timestamp)
    }

    fn transmit(&mut self, timestamp: Instant) -> Option<Self::TxToken<'_>> {
        self.inner.transmit(timestamp)
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = self.inner.capabilities();
        caps.max_transmission_unit = caps.max_transmission_unit.min(self.max_frame);
        caps
    }
}
