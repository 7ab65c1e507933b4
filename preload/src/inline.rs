//! The running engine's inline driver (`XWARP_MODE=inline`), looked up lock-free by every
//! socket call: the engine module installs it once the engine started; the waits, reads,
//! writes and polls drive and park through it. A leaf module (it imports nothing of the
//! shim's), so the blocking helpers need not reach into the engine module.

use std::sync::atomic::{AtomicPtr, Ordering};

use xwarp_poll_driver::engine::InlineDriver;

/// The installed driver; null before the engine started, in thread mode, and in a child
/// after `fork` until its own engine starts.
static DRIVER: AtomicPtr<InlineDriver> = AtomicPtr::new(std::ptr::null_mut());

/// Install the running engine's driver (it lives for the rest of the process).
pub(crate) fn install(d: &'static InlineDriver) {
    DRIVER.store(
        d as *const InlineDriver as *mut InlineDriver,
        Ordering::Release,
    );
}

/// Forget the driver (in a child after `fork`: the parent's engine thread is not there).
pub(crate) fn forget() {
    DRIVER.store(std::ptr::null_mut(), Ordering::Release);
}

/// The running engine's inline driver, if it runs in inline mode (`None` before the
/// engine started, in thread mode, or with the shim inactive).
pub(crate) fn driver() -> Option<&'static InlineDriver> {
    let d = DRIVER.load(Ordering::Acquire);
    // SAFETY: a non-null pointer was installed from a `&'static InlineDriver` (inside the
    // leaked `Running` of this process generation), never freed.
    (!d.is_null()).then(|| unsafe { &*d })
}

/// Drive the engine once if it runs in inline mode (any thread; returns at once when
/// another thread drives).
pub(crate) fn drive() {
    if let Some(d) = driver() {
        d.try_drive();
    }
}

/// Before a socket call blocks in inline mode: let the engine's keeper take over.
pub(crate) fn park() {
    if let Some(d) = driver() {
        d.park();
    }
}
