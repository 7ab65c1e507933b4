//! What keeps the intercepted calls safe to make from a signal handler.
//!
//! A handler may call `read`/`write`/`close` (a self-pipe) while its own thread is inside
//! the shim holding one of its locks; taking that lock again would deadlock the thread.
//! So:
//! * every descriptor table of the shim keeps an [`FdBits`] beside it: lock-free bits set
//!   while the table may hold the descriptor. A call on a descriptor the shim does not own
//!   (a self-pipe, a regular file) checks the bits and goes to the C library without
//!   taking any lock;
//! * the descriptor table's write side is only taken with every signal blocked
//!   ([`SignalsBlocked`]), so a handler never runs on a thread that holds it; its read side
//!   (every lookup, the data calls' hot path) leaves the signal mask alone and counts a
//!   [`ReadSection`] instead: a handler that interrupted one never waits for the table
//!   (it reads the map its thread already holds, or only tries, or refuses with
//!   `EDEADLK`; `sock.rs` has the argument);
//! * a stream's own lock is counted per thread ([`LockCount`]): a read or write on an
//!   engine descriptor that finds its thread already holding shim locks (it comes from a
//!   handler that interrupted the shim) only tries the stream's lock, its options' lock
//!   and the table's (`sock::lookup_io`: a `fork` prepare handler on another thread may
//!   hold the table while it waits for a socket lock this thread holds) and fails with
//!   `EDEADLK` when one is taken, instead of waiting for itself.

use std::cell::Cell;
use std::ops::{Deref, DerefMut};
use std::os::fd::RawFd;
use std::sync::atomic::{compiler_fence, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// Descriptors below this have an ownership bit; calls on higher ones take the table's
/// read side to find out. 2^20 covers the usual hard
/// `RLIMIT_NOFILE`; the bits of one table take 128 KiB of zero pages, touched only where
/// descriptors are set.
pub(crate) const FD_BITS: usize = 1 << 20;

/// One bit per descriptor number: "the table beside it may hold this descriptor". Set
/// before an entry is inserted and cleared after it is removed (both under the table's
/// lock), so a clear bit proves the descriptor is not in the table.
pub(crate) struct FdBits([AtomicU64; FD_BITS / 64]);

impl FdBits {
    /// No descriptor set.
    pub(crate) const fn new() -> FdBits {
        FdBits([const { AtomicU64::new(0) }; FD_BITS / 64])
    }

    /// `false` only if `fd` is certainly not in the table (lock-free, async-signal-safe).
    pub(crate) fn maybe(&self, fd: RawFd) -> bool {
        if fd < 0 {
            return false;
        }
        let fd = fd as usize;
        if fd >= FD_BITS {
            return true;
        }
        self.0[fd / 64].load(Ordering::Acquire) & (1 << (fd % 64)) != 0
    }

    /// `fd` may be in the table from now on.
    pub(crate) fn set(&self, fd: RawFd) {
        if (0..FD_BITS as RawFd).contains(&fd) {
            let fd = fd as usize;
            self.0[fd / 64].fetch_or(1 << (fd % 64), Ordering::AcqRel);
        }
    }

    /// `fd` is no longer in the table.
    pub(crate) fn clear(&self, fd: RawFd) {
        if (0..FD_BITS as RawFd).contains(&fd) {
            let fd = fd as usize;
            self.0[fd / 64].fetch_and(!(1 << (fd % 64)), Ordering::AcqRel);
        }
    }
}

/// Every signal blocked on this thread until dropped (the previous mask is restored).
pub(crate) struct SignalsBlocked(libc::sigset_t);

impl SignalsBlocked {
    /// Block every signal on this thread.
    pub(crate) fn new() -> SignalsBlocked {
        // SAFETY: sigset_t is plain data; filled and applied by libc.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            SignalsBlocked(old)
        }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restoring the mask saved by `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

thread_local! {
    static HELD: Cell<u32> = const { Cell::new(0) };
    static READING: Cell<u32> = const { Cell::new(0) };
}

/// This thread is in a read section of the descriptor table until dropped: counted before
/// the table's lock is touched and uncounted after it is released, so a signal handler
/// that interrupts the section sees it ([`in_read_section`]) and does not wait for the
/// table (`sock.rs` explains the whole argument).
pub(crate) struct ReadSection(());

impl ReadSection {
    /// Enter a read section.
    pub(crate) fn enter() -> ReadSection {
        READING.with(|r| r.set(r.get() + 1));
        // The count is visible to a handler before the lock is touched (a plain store
        // could otherwise move after the lock's acquire).
        compiler_fence(Ordering::SeqCst);
        ReadSection(())
    }
}

impl Drop for ReadSection {
    fn drop(&mut self) {
        // The lock was released (before this drop) before the count goes.
        compiler_fence(Ordering::SeqCst);
        READING.with(|r| r.set(r.get().saturating_sub(1)));
    }
}

/// `true` if this thread is inside a read section of the descriptor table: a call now
/// comes from a signal handler that interrupted it, and must not wait for the table.
pub(crate) fn in_read_section() -> bool {
    READING.with(|r| r.get()) != 0
}

/// One socket lock held (or being taken) by this thread, counted while alive.
struct LockCount(());

impl LockCount {
    fn new() -> LockCount {
        HELD.with(|h| h.set(h.get() + 1));
        LockCount(())
    }
}

impl Drop for LockCount {
    fn drop(&mut self) {
        HELD.with(|h| h.set(h.get().saturating_sub(1)));
    }
}

/// A socket's lock, held and counted for this thread (see [`nested`]).
pub(crate) struct Counted<'a, T> {
    // Field order is drop order: unlock, then uncount.
    g: MutexGuard<'a, T>,
    _count: LockCount,
}

impl<'a, T> Counted<'a, T> {
    /// Lock `m` (a poisoned lock is taken as it is).
    pub(crate) fn lock(m: &'a Mutex<T>) -> Counted<'a, T> {
        // Counted before taking it: a signal arriving right after the lock is taken
        // must already see it held.
        let count = LockCount::new();
        let g = m.lock().unwrap_or_else(|p| p.into_inner());
        Counted { g, _count: count }
    }

    /// Lock `m` for a read or write on an engine descriptor: waits as [`Counted::lock`]
    /// does, unless this thread already holds socket locks ([`nested`], a signal
    /// handler's call): then only tries, and gives `EDEADLK` when `m` is taken (maybe
    /// by the very frame the handler interrupted).
    pub(crate) fn lock_io(m: &'a Mutex<T>) -> Result<Counted<'a, T>, libc::c_int> {
        if !nested() {
            return Ok(Counted::lock(m));
        }
        let count = LockCount::new();
        let g = match m.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Err(libc::EDEADLK),
        };
        Ok(Counted { g, _count: count })
    }
}

impl<T> Deref for Counted<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.g
    }
}

impl<T> DerefMut for Counted<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.g
    }
}

/// `true` if this thread holds a socket lock of the shim: a call now comes from a signal
/// handler that interrupted the shim, and must not wait for a lock.
pub(crate) fn nested() -> bool {
    HELD.with(|h| h.get()) != 0
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod cost_tests;
