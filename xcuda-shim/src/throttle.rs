//! Launch throttle: the control law (MuxFlow eq. 1-2, PID, token bucket) lives in the
//! FFI-free `xshare-control` crate; this module adds what only a process can do: hold a launch
//! (sleeping) while the bucket is in debt or frozen, and refill it itself when the controller
//! thread is missing. Stale or missing monitor data => a fixed conservative rate, never unlimited.

use std::ops::Deref;
use std::time::Duration;

pub use xshare_control::{clock_factor, gpu_load, Decision, Pid, Sample};

use crate::config::ThrottleConfig;

/// The process's throttle: [`xshare_control::Throttle`] plus the blocking wait.
#[derive(Debug)]
pub struct Throttle(xshare_control::Throttle);

impl Deref for Throttle {
    type Target = xshare_control::Throttle;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Throttle {
    /// A bucket starting full at the fallback rate, knowing this process's own MPS cap (the
    /// active-thread percentage in its environment, fixed by MPS at client start).
    pub fn new(cfg: &ThrottleConfig, sm_count: u32) -> Self {
        let t = xshare_control::Throttle::new(cfg, sm_count);
        if let Some(f) = crate::budget::own_mps_share(&|k| std::env::var(k).ok()) {
            t.set_own_share(f);
        }
        Self(t)
    }

    /// Takes `cost` milli-waves; under budget this is one atomic RMW. Over budget (or frozen)
    /// it sleeps until the controller has refilled the debt.
    #[inline]
    pub fn acquire(&self, cost: i64) {
        if !self.0.take(cost) {
            self.wait_for_budget();
        }
    }

    /// [`Self::acquire`] for a kernel launched on `stream` (`ptsz`: through a per-thread entry
    /// point): a launch into a capture of this thread's own records a graph node and runs
    /// nothing, so it takes nothing from the bucket and never waits, frozen or in debt (a
    /// capture must be able to end while launches are stopped; the graph pays when it is
    /// launched). Asked of the driver only while this thread has a capture of its own in
    /// progress, one no other thread can end meanwhile (see `capture`); otherwise one
    /// thread-local read.
    #[inline]
    pub fn acquire_on(&self, cost: i64, stream: cuda_abi::CUstream, ptsz: bool) {
        if crate::capture::own_active() && crate::capture::owns(stream as u64, ptsz) {
            return;
        }
        if !self.0.take(cost) {
            self.wait_for_budget();
        }
    }

    #[cold]
    fn wait_for_budget(&self) {
        crate::state::ensure_controller();
        let mut pause = Duration::from_micros(50);
        while self.0.must_wait() {
            std::thread::sleep(pause);
            if !crate::state::controller_alive() {
                // No controller thread (it could not start): refill at the current rate here.
                self.0.refill(pause.as_secs_f64());
            }
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn freeze_blocks_and_unfreeze_releases() {
        let t = std::sync::Arc::new(Throttle::new(&ThrottleConfig::default(), 10));
        t.freeze();
        let t2 = t.clone();
        let h = std::thread::spawn(move || t2.acquire(1));
        std::thread::sleep(Duration::from_millis(30));
        assert!(!h.is_finished(), "frozen launch must wait");
        t.unfreeze();
        h.join().unwrap();
        assert!(!t.is_frozen());
        assert_eq!(t.delayed.load(Relaxed), 1);
    }
}
