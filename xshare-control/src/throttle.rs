//! The per-process token bucket plus the controller tick that sets its refill rate.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::*};

use crate::{clock_factor, gpu_load, Pid, Sample, ThrottleConfig};

/// Milli-waves per wave: token unit.
const MILLI: f64 = 1000.0;
/// Token level while frozen: far below zero so that every launch waits.
const FROZEN_LEVEL: i64 = i64::MIN / 4;

fn q16_per_block(sm_count: u32) -> u64 {
    (1000u64 << 16).div_ceil(u64::from(sm_count.max(1)))
}

/// The per-process token bucket plus controller state. Shared between the launching threads
/// ([`Throttle::take`], [`Throttle::must_wait`]: one atomic RMW on the fast path) and one
/// controller ([`Throttle::control_with_budget`] then [`Throttle::refill`] each period).
#[derive(Debug)]
pub struct Throttle {
    enabled: bool,
    tokens: AtomicI64,
    rate_milli: AtomicU64,
    /// Load target of the last tick, milli (configured, or lowered by a fresh SM budget).
    target_milli: AtomicU64,
    frozen: AtomicBool,
    /// Milli-waves per block in 16.16 fixed point (1000 / SM count): no division on launch.
    milli_per_block_q16: AtomicU64,
    graph_cost: i64,
    burst: i64,
    cfg: ThrottleConfig,
    /// Launches that had to wait.
    pub delayed: AtomicU64,
    /// Launches issued (approximate under concurrent launches from several threads).
    pub launches: AtomicU64,
}

/// What the controller decided on one tick (for logs and tests).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// Launch budget, SM-waves per second.
    pub rate: f64,
    /// GPU load U_GPU the decision was made on (`None` when the sample was stale).
    pub load: Option<f64>,
    /// Whether monitor data were missing or stale (the fallback rate applies).
    pub stale: bool,
}

impl Throttle {
    /// A bucket starting full at the fallback rate, costing kernels for `sm_count` SMs.
    pub fn new(cfg: &ThrottleConfig, sm_count: u32) -> Self {
        let burst = (cfg.burst * MILLI) as i64;
        Self {
            enabled: cfg.enabled,
            tokens: AtomicI64::new(burst),
            rate_milli: AtomicU64::new((cfg.fallback_rate * MILLI) as u64),
            target_milli: AtomicU64::new((cfg.target_load * MILLI) as u64),
            frozen: AtomicBool::new(false),
            milli_per_block_q16: AtomicU64::new(q16_per_block(sm_count)),
            graph_cost: (cfg.graph_launch_waves * MILLI) as i64,
            burst,
            cfg: cfg.clone(),
            delayed: AtomicU64::new(0),
            launches: AtomicU64::new(0),
        }
    }

    /// The settings this throttle was built with.
    pub fn config(&self) -> &ThrottleConfig {
        &self.cfg
    }

    /// Cost of a kernel of `blocks` thread blocks, in milli-waves (a wave = one block per SM).
    #[inline]
    pub fn kernel_cost(&self, blocks: u64) -> i64 {
        let q = self.milli_per_block_q16.load(Relaxed);
        (blocks.saturating_mul(q) >> 16).clamp(1, 1 << 40) as i64
    }

    /// Cost of a graph launch, milli-waves.
    pub fn graph_cost(&self) -> i64 {
        self.graph_cost
    }

    /// Takes `cost` milli-waves for one launch (counted in [`Throttle::launches`]). Under
    /// budget this is one atomic RMW and returns `true`: launch now. Otherwise the debt is
    /// recorded, the launch counted in [`Throttle::delayed`], and it returns `false`: the
    /// caller must hold the launch while [`Throttle::must_wait`].
    #[inline]
    pub fn take(&self, cost: i64) -> bool {
        // Statistics only: a plain load+store (no locked RMW); concurrent launches from several
        // threads may lose an increment.
        self.launches
            .store(self.launches.load(Relaxed).wrapping_add(1), Relaxed);
        if !self.enabled && !self.frozen.load(Relaxed) {
            return true;
        }
        // Freezing parks the bucket far below zero, so one RMW also answers "frozen?".
        let before = self.tokens.fetch_sub(cost, AcqRel);
        if before >= cost {
            return true;
        }
        self.delayed.fetch_add(1, Relaxed);
        false
    }

    /// Whether a launch that [`Throttle::take`] held must keep waiting: frozen, or the bucket
    /// still in debt (and the throttle enabled).
    pub fn must_wait(&self) -> bool {
        let frozen = self.frozen.load(Acquire);
        frozen || (self.enabled && self.tokens.load(Acquire) < 0)
    }

    /// Refills for `dt` seconds at the current rate (controller), capped at the burst.
    pub fn refill(&self, dt: f64) {
        if self.frozen.load(Acquire) {
            return;
        }
        let add = (self.rate_milli.load(Relaxed) as f64 * dt) as i64;
        let burst = self.burst;
        let _ = self.tokens.fetch_update(AcqRel, Acquire, |t| {
            Some((t.saturating_add(add)).min(burst))
        });
    }

    /// Tokens in the bucket, milli-waves (negative: launches owe that much).
    pub fn tokens(&self) -> i64 {
        self.tokens.load(Acquire)
    }

    /// Stops every launch (signal path). Async-signal-safe: atomics only.
    pub fn freeze(&self) {
        self.frozen.store(true, Release);
        self.tokens.store(FROZEN_LEVEL, Release);
    }

    /// Lets launches go again.
    pub fn unfreeze(&self) {
        self.tokens.store(self.burst, Release);
        self.frozen.store(false, Release);
    }

    /// Whether launches are frozen.
    pub fn is_frozen(&self) -> bool {
        self.frozen.load(Acquire)
    }

    /// Current budget, waves per second.
    pub fn rate(&self) -> f64 {
        self.rate_milli.load(Relaxed) as f64 / MILLI
    }

    /// Updates the SM count used to cost kernels.
    pub fn set_sm_count(&self, n: u32) {
        if n > 0 {
            self.milli_per_block_q16.store(q16_per_block(n), Relaxed);
        }
    }

    /// One controller tick: `sample` is `None` when monitor data are missing or stale.
    pub fn control(&self, pid: &mut Pid, sample: Option<Sample>, dt: f64) -> Decision {
        self.control_with_budget(pid, sample, None, dt)
    }

    /// The load target for a fresh offline SM budget (`budget`: fraction of the SMs, 0..1) or
    /// none (`None`: stale or absent): the configured target, lowered to the budget, never raised.
    pub fn target_for(&self, budget: Option<f64>) -> f64 {
        let t = self.cfg.target_load;
        match budget {
            Some(b) if b.is_finite() => t.min(b.max(0.0)),
            _ => t,
        }
    }

    /// One controller tick carrying the dynamic SM budget: real MPS fixes a client's SM
    /// percentage at its start, so a running offline process follows the budget here. The PID
    /// aims at [`Throttle::target_for`]; without monitor data the fallback rate is scaled down
    /// by the same ratio (target / configured target, never above 1), so a lower budget always
    /// means fewer launches, and a stale or absent budget means exactly the static behaviour.
    pub fn control_with_budget(
        &self,
        pid: &mut Pid,
        sample: Option<Sample>,
        budget: Option<f64>,
        dt: f64,
    ) -> Decision {
        let c = &self.cfg;
        let target = self.target_for(budget);
        let (rate, load) = match sample {
            None => {
                pid.reset();
                let scale = if c.target_load > 0.0 {
                    (target / c.target_load).min(1.0)
                } else {
                    1.0
                };
                (c.fallback_rate * scale, None)
            }
            Some(s) => {
                let c_h = if c.c_h_mhz > 0.0 { c.c_h_mhz } else { s.c_h };
                let load = gpu_load(s.u_sm, clock_factor(s.c_sm, c.t_sm_mhz, c_h, c.a_l, c.a_h));
                (pid.step(target - load, dt), Some(load))
            }
        };
        let rate = rate.clamp(c.min_rate, c.max_rate);
        self.rate_milli.store((rate * MILLI) as u64, Relaxed);
        self.target_milli.store((target * MILLI) as u64, Relaxed);
        Decision {
            rate,
            load,
            stale: sample.is_none(),
        }
    }

    /// The load target of the last controller tick (for logs and tests).
    pub fn target(&self) -> f64 {
        self.target_milli.load(Relaxed) as f64 / MILLI
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ThrottleConfig {
        ThrottleConfig::default()
    }

    #[test]
    fn stale_data_gives_fixed_rate_never_unlimited() {
        let t = Throttle::new(&cfg(), 100);
        let mut pid = Pid::new(&cfg());
        let d = t.control(&mut pid, None, 0.01);
        assert!(d.stale);
        assert_eq!(d.rate, cfg().fallback_rate);
        assert!(t.rate() < cfg().max_rate);
    }

    #[test]
    fn high_load_lowers_rate_low_load_raises_it() {
        let c = cfg();
        let t = Throttle::new(&c, 100);
        let mut pid = Pid::new(&c);
        let busy = Sample {
            u_sm: 1.0,
            c_sm: 900.0,
            c_h: 1500.0,
        };
        let mut r = c.fallback_rate;
        for _ in 0..100 {
            r = t.control(&mut pid, Some(busy), 0.01).rate;
        }
        assert!(r < c.fallback_rate / 2.0, "rate {r}");
        let idle = Sample {
            u_sm: 0.1,
            c_sm: 1500.0,
            c_h: 1500.0,
        };
        for _ in 0..300 {
            r = t.control(&mut pid, Some(idle), 0.01).rate;
        }
        assert!(r > c.fallback_rate * 2.0, "rate {r}");
        assert!(r <= c.max_rate);
    }

    /// Closed loop against a toy plant (load proportional to launch rate): settles near target.
    #[test]
    fn pid_settles_on_target_for_any_sm_count() {
        for sms in [20u32, 80, 132] {
            let c = cfg();
            let t = Throttle::new(&c, sms);
            let mut pid = Pid::new(&c);
            let base = 0.2;
            // Each kernel: `sms` blocks (one wave) lasting 1 ms => load share = rate * 1e-3.
            let mut load = base;
            for _ in 0..2000 {
                let r = t
                    .control(
                        &mut pid,
                        Some(Sample {
                            u_sm: load,
                            c_sm: 1400.0,
                            c_h: 1500.0,
                        }),
                        0.01,
                    )
                    .rate;
                load = (base + r * 1e-3).min(1.0);
            }
            let a_c = clock_factor(1400.0, c.t_sm_mhz, 1500.0, c.a_l, c.a_h);
            let settled = load * a_c;
            assert!(
                (settled - c.target_load).abs() < 0.03,
                "sms {sms}: load {settled}"
            );
            assert_eq!(
                t.kernel_cost(u64::from(sms)),
                1000,
                "one wave whatever the SM count"
            );
        }
    }

    /// Observation 10: with a fresh budget the same measurements give a lower launch rate at a
    /// low budget than at a high one (so launches wait more), with or without monitor data;
    /// a budget above the configured target, or a stale one (None), is exactly the static case.
    #[test]
    fn sm_budget_lowers_the_target_never_raises_it() {
        let c = cfg();
        let run = |budget: Option<f64>, sample: Option<Sample>| {
            let t = Throttle::new(&c, 100);
            let mut pid = Pid::new(&c);
            let mut d = None;
            for _ in 0..200 {
                d = Some(t.control_with_budget(&mut pid, sample, budget, 0.01));
            }
            (d.unwrap().rate, t.target())
        };
        let s = Some(Sample {
            u_sm: 0.3,
            c_sm: 1400.0,
            c_h: 1500.0,
        });
        for sample in [s, None] {
            let (low, t_low) = run(Some(0.1), sample);
            let (high, t_high) = run(Some(0.6), sample);
            let (stat, t_stat) = run(None, sample);
            let (above, t_above) = run(Some(1.0), sample);
            assert!(
                low < high,
                "{sample:?}: low budget {low} vs high budget {high}"
            );
            assert!(high <= stat, "{sample:?}: never looser than configured");
            assert_eq!(
                (above, t_above),
                (stat, t_stat),
                "budget above the target changes nothing"
            );
            assert_eq!(t_stat, c.target_load);
            assert!((t_low - 0.1).abs() < 1e-9 && (t_high - 0.6).abs() < 1e-9);
        }
        // Delays as a mechanism: same launches, more of them wait at the low budget.
        let delayed = |budget: f64| {
            let mut c = cfg();
            c.burst = 1.0;
            let t = Throttle::new(&c, 10);
            let mut pid = Pid::new(&c);
            let mut waits = 0;
            for _ in 0..50 {
                t.control_with_budget(&mut pid, None, Some(budget), 0.01);
                t.refill(0.01);
                let before = t.tokens.load(Relaxed);
                if before < 1000 {
                    waits += 1;
                } else {
                    t.tokens.fetch_sub(1000, Relaxed);
                }
            }
            waits
        };
        assert!(
            delayed(0.05) > delayed(0.8),
            "{} vs {}",
            delayed(0.05),
            delayed(0.8)
        );
    }

    #[test]
    fn bucket_allows_burst_then_waits_for_refill() {
        let mut c = cfg();
        c.burst = 2.0;
        let t = Throttle::new(&c, 10);
        assert!(t.take(1000));
        assert!(t.take(1000));
        assert_eq!(t.delayed.load(Relaxed), 0);
        assert_eq!(t.tokens(), 0);
        assert!(!t.must_wait());
        assert!(!t.take(1000), "empty bucket: the third launch is held");
        assert_eq!(t.delayed.load(Relaxed), 1);
        assert!(t.must_wait());
        t.refill(1.0);
        assert_eq!(t.tokens(), 2000, "capped at burst");
        assert!(!t.must_wait());
    }

    #[test]
    fn frozen_holds_even_a_disabled_throttle() {
        let mut c = cfg();
        c.enabled = false;
        let t = Throttle::new(&c, 10);
        assert!(t.take(1 << 30), "disabled: never held");
        t.freeze();
        assert!(!t.take(1) && t.must_wait(), "frozen: held");
        t.refill(10.0);
        assert!(t.must_wait(), "refill does not thaw");
        t.unfreeze();
        assert!(!t.must_wait() && t.take(1));
    }
}
