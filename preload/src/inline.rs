//! The running engine's inline driver (`XWARP_MODE=inline`), looked up lock-free by every
//! socket call: the engine module installs it once the engine started; the waits, reads,
//! writes and polls drive and park through it. A leaf module (it imports nothing of the
//! shim's), so the blocking helpers need not reach into the engine module.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

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

/// Readiness eventfds the shim itself signalled (re-signals after a drain, a second
/// queued connection): [`signals`] adds them to the engine's.
static SHIM_SIGNALS: AtomicU64 = AtomicU64::new(0);

/// Count one signal the shim wrote to a readiness eventfd (called right after the write).
pub(crate) fn count_signal() {
    SHIM_SIGNALS.fetch_add(1, Ordering::Release);
}

/// Every readiness signal of this process so far: the engine's
/// ([`xwarp_stack::readiness_signals`]) and the shim's own. Unchanged between two reads
/// means no readiness eventfd was written in between, so a wait that asked the kernel
/// about them at the first read learns nothing new by asking again.
pub(crate) fn signals() -> u64 {
    xwarp_stack::readiness_signals().wrapping_add(SHIM_SIGNALS.load(Ordering::Acquire))
}

/// When an `epoll_wait` on a set holding engine sockets asks the kernel, one per set.
/// Between asks it looks at the engine's sockets in user space (no system call: the hot
/// list, synthesized `EPOLLOUT`). The kernel's answer can be new only if a readiness
/// eventfd was signalled since the set last asked ([`signals`] moved), or for the
/// program's kernel descriptors (pipes, timers, kernel sockets), which signal nothing the
/// shim sees: when the set may hold some it asks every [`KernelLooks::EVERY`]th look.
/// Inline mode's spinning waits look once per engine iteration, so this is what keeps
/// their system calls down; a wait about to block always asks.
#[derive(Debug, Default)]
pub(crate) struct KernelLooks {
    seen: u64,
    skipped: u32,
}

impl KernelLooks {
    /// Looks between two kernel asks while nothing was signalled (for kernel descriptors).
    pub(crate) const EVERY: u32 = 16;

    /// Whether this look asks the kernel: when it `must` (it would block otherwise, or the
    /// kernel's last answer filled the buffer), after a signal, or every
    /// [`KernelLooks::EVERY`]th look when the set may hold kernel descriptors
    /// (`kernel_fds`). Call once per look, right before asking: the count it records is
    /// read before the kernel is.
    pub(crate) fn due(&mut self, must: bool, kernel_fds: bool) -> bool {
        self.due_at(signals(), must, kernel_fds)
    }

    /// Count a look that could not ask the kernel (user space filled the caller's buffer).
    pub(crate) fn skip(&mut self) {
        self.skipped = self.skipped.saturating_add(1);
    }

    /// Whether [`KernelLooks::due`] would say yes now, without counting a look.
    pub(crate) fn would_ask(&self, must: bool, kernel_fds: bool) -> bool {
        self.asks(signals(), must, kernel_fds)
    }

    fn asks(&self, now: u64, must: bool, kernel_fds: bool) -> bool {
        must || now != self.seen || (kernel_fds && self.skipped + 1 >= Self::EVERY)
    }

    /// [`KernelLooks::due`] with the signal count `now` read by the caller.
    fn due_at(&mut self, now: u64, must: bool, kernel_fds: bool) -> bool {
        let due = self.asks(now, must, kernel_fds);
        if due {
            self.seen = now;
            self.skipped = 0;
        } else {
            self.skipped += 1;
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_looks_after_a_signal_and_every_16th_look_with_kernel_fds() {
        let looked = |kernel_fds: bool| -> Vec<usize> {
            let mut k = KernelLooks {
                seen: 7,
                skipped: 0,
            };
            (0..40)
                .filter(|&i| k.due_at(if i < 20 { 7 } else { 8 }, i == 30, kernel_fds))
                .collect()
        };
        // The 16th look (15), the first that saw the count move (20), the one that must
        // (30); each restarts the count of 16.
        assert_eq!(looked(true), vec![15, 20, 30]);
        // Engine descriptors only: nothing but signals and `must` is worth a look.
        assert_eq!(looked(false), vec![20, 30]);
    }

    #[test]
    fn shim_signals_move_the_count() {
        let before = signals();
        count_signal();
        assert!(signals() > before);
    }
}
