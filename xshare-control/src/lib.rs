//! The offline launch throttle's control law, free of FFI and of clocks: MuxFlow eq. 1-2
//! ([`clock_factor`], [`gpu_load`]) feeding a [`Pid`] whose output is a launch budget in
//! SM-waves per second, enforced by the token bucket of a [`Throttle`] (atomics only).
//!
//! Online protection under MPS (no preemption) is the online-pressure hold: a fresh sample
//! whose SM clock is under `hold_below_clock` of the top clock stops every launch of a process
//! capped at most at [`HOLD_MAX_OWN_SHARE`] until `hold_ms` after the last such
//! sample ([`Decision::held`]).
//!
//! Time is injected: the controller tick takes the elapsed seconds `dt` and the latest
//! [`Sample`], the bucket is refilled for `dt`; nothing here reads a clock, sleeps, logs or
//! calls the driver. `xcuda-shim` drives it from its controller thread (and blocks launches
//! while [`Throttle::must_wait`]); a simulator can drive the same code on a simulated clock:
//!
//! ```
//! use xshare_control::{Pid, Sample, Throttle, ThrottleConfig};
//! let cfg = ThrottleConfig::default();
//! let throttle = Throttle::new(&cfg, 80); // 80 SMs
//! throttle.set_own_share(0.42); // its MPS active-thread fraction, fixed at client start
//! let mut pid = Pid::new(&cfg);
//! // Each period: feed the monitor's sample (None when stale) and the offline SM budget.
//! let s = Sample { u_sm: 0.95, c_sm: 1400.0, c_h: 1500.0 };
//! let d = throttle.control_with_budget(&mut pid, Some(s), Some(0.5), 0.010);
//! throttle.refill(0.010);
//! // Per launch: a kernel of 160 blocks costs 2 waves; `take` says whether it may go now.
//! let go_now = throttle.take(throttle.kernel_cost(160));
//! assert!(d.rate > 0.0 && (go_now || throttle.must_wait()));
//! ```

mod config;
mod law;
mod throttle;

pub use config::ThrottleConfig;
pub use law::{clock_factor, gpu_load, Pid, Sample};
pub use throttle::{Decision, Throttle, Tightened, HOLD_MAX_OWN_SHARE, MPS_ENFORCED_TARGET};
