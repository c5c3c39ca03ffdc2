//! A lock for the shim's rare, short critical sections that a fork child can always take: only
//! the forking thread survives `fork`, so a lock another thread held then would never be given
//! back in the child; the fork-child hook frees every [`SpinLock`] (`crate::exit`).

use std::sync::atomic::{AtomicBool, Ordering::*};

/// A spin-then-yield lock (held for a few driver calls at most; never in a signal handler).
#[derive(Debug)]
pub struct SpinLock(AtomicBool);

/// Held [`SpinLock`]; unlocks when dropped.
pub struct SpinGuard<'a>(&'a AtomicBool);

impl SpinLock {
    /// Unlocked.
    pub const fn new() -> Self {
        Self(AtomicBool::new(false))
    }

    /// Takes the lock: spins briefly, then yields the CPU between tries.
    pub fn lock(&self) -> SpinGuard<'_> {
        let mut spins = 0u32;
        while self.0.compare_exchange_weak(false, true, Acquire, Relaxed).is_err() {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        SpinGuard(&self.0)
    }

    /// Takes the lock if it is free, without waiting.
    pub fn try_lock(&self) -> Option<SpinGuard<'_>> {
        self.0.compare_exchange(false, true, Acquire, Relaxed).is_ok().then_some(SpinGuard(&self.0))
    }

    /// In a fork child (async-signal-safe: one store): whoever held it is not there.
    pub fn reset_after_fork(&self) {
        self.0.store(false, Release);
    }
}

impl Default for SpinLock {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for SpinGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn one_holder_at_a_time_and_a_fork_reset_frees_it() {
        static L: SpinLock = SpinLock::new();
        static N: AtomicU64 = AtomicU64::new(0);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..10_000 {
                        let _g = L.lock();
                        // A read-modify-write in two steps: lost updates without mutual exclusion.
                        let v = N.load(Relaxed);
                        N.store(v + 1, Relaxed);
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(N.load(Relaxed), 40_000);
        let held = L.lock();
        std::mem::forget(held);
        L.reset_after_fork();
        drop(L.lock());
    }
}
