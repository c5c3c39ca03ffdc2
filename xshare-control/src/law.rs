//! MuxFlow eq. 1-2 and the PID controller on log2(rate).

use crate::ThrottleConfig;

/// Eq. 2: clock factor a_C from the SM clock `c_sm`, threshold `t_sm`, highest clock `c_h`
/// (all MHz) and the weights `a_l` (clock below threshold) and `a_h` (above).
pub fn clock_factor(c_sm: f64, t_sm: f64, c_h: f64, a_l: f64, a_h: f64) -> f64 {
    if c_sm < t_sm {
        1.0 + a_l * (t_sm - c_sm) / t_sm
    } else {
        let span = (c_h - t_sm).max(1.0);
        1.0 - a_h * ((c_sm - t_sm) / span).min(1.0)
    }
}

/// Eq. 1: GPU load U_GPU = U_SM * a_C.
pub fn gpu_load(u_sm: f64, a_c: f64) -> f64 {
    u_sm * a_c
}

/// PID on log2(rate): the output is a multiplicative correction, so the gains mean the same
/// thing whatever the kernel size or SM count (launch cost is already counted in SM-waves).
#[derive(Debug, Clone)]
pub struct Pid {
    kp: f64,
    ki: f64,
    kd: f64,
    integral: f64,
    prev_err: Option<f64>,
    base_log2: f64,
    lo_log2: f64,
    hi_log2: f64,
}

impl Pid {
    /// A controller starting at `cfg.fallback_rate`, bounded by `[min_rate, max_rate]`.
    pub fn new(cfg: &ThrottleConfig) -> Self {
        Self {
            kp: cfg.kp,
            ki: cfg.ki,
            kd: cfg.kd,
            integral: 0.0,
            prev_err: None,
            base_log2: cfg.fallback_rate.log2(),
            lo_log2: cfg.min_rate.log2(),
            hi_log2: cfg.max_rate.log2(),
        }
    }

    /// One step: `err` = target - load (positive = room to launch more), `dt` seconds since
    /// the previous step. Returns the new rate in waves per second.
    pub fn step(&mut self, err: f64, dt: f64) -> f64 {
        self.step_within(err, dt, f64::INFINITY)
    }

    /// [`Pid::step`] with the rate held to `ceiling` on this step as well (the throttle's: an
    /// eighth above what the process used lately, [`crate::Throttle::control_with_part`]). The integral
    /// never winds up past the ceiling, and a controller asked to come down (`err` < 0) from
    /// above it starts from the ceiling: the rate in force, not a level it never delivered
    /// (wound up on an idle GPU by a process using a fiftieth of it, or above a highest rate
    /// lowered since). Without that, a rate at its highest took seconds to bind once the online
    /// workload's load came (3 s for a budget lowered, 16 s for load over the target).
    pub fn step_within(&mut self, err: f64, dt: f64, ceiling: f64) -> f64 {
        let dt = dt.max(1e-4);
        let d = self.prev_err.map_or(0.0, |p| (err - p) / dt);
        self.prev_err = Some(err);
        let hi = if ceiling > 0.0 { self.hi_log2.min(ceiling.log2()).max(self.lo_log2) } else { self.lo_log2 };
        let fixed = self.base_log2 + self.kp * err + self.kd * d;
        let u = |i: f64| fixed + self.ki * i;
        if err < 0.0 && self.ki > 0.0 && u(self.integral) > hi {
            self.integral = (hi - fixed) / self.ki;
        }
        let candidate = self.integral + err * dt;
        // Anti-windup: integrate only while the output is not pinned in the error's direction,
        // and a step that would cross a bound integrates up to it (skipped whole, a coarse
        // step, or a ceiling just above, left the rate below it for good: the simulator's
        // 1.5 s steps against a ceiling an eighth above the use).
        let out = u(candidate);
        if (out < hi || err < 0.0) && (out > self.lo_log2 || err > 0.0) {
            self.integral = candidate;
        } else if self.ki > 0.0 && err > 0.0 {
            self.integral = self.integral.max((hi - fixed) / self.ki);
        } else if self.ki > 0.0 && err < 0.0 {
            self.integral = self.integral.min((self.lo_log2 - fixed) / self.ki);
        }
        u(self.integral).clamp(self.lo_log2, hi).exp2()
    }

    /// Lowers the highest rate to `max_rate` and the rate it starts from to `base_rate` where
    /// they are above (an operator's floor, [`crate::Throttle::tighten`]), and the lowest rate
    /// to both; never raises any.
    pub fn cap(&mut self, max_rate: f64, base_rate: f64) {
        if max_rate > 0.0 {
            self.hi_log2 = self.hi_log2.min(max_rate.log2());
        }
        if base_rate > 0.0 {
            self.base_log2 = self.base_log2.min(base_rate.log2());
        }
        self.lo_log2 = self.lo_log2.min(self.hi_log2).min(self.base_log2);
    }

    /// Lowers the lowest rate to `min_rate` where it is above (the law in force's, an
    /// operator's floor holding a process's own `min_rate` to the shipped one); never raises it.
    pub fn lower_floor(&mut self, min_rate: f64) {
        if min_rate > 0.0 {
            self.lo_log2 = self.lo_log2.min(min_rate.log2());
        }
    }

    /// Takes `law`'s gains (a throttle whose law an operator's floor holds,
    /// [`crate::Throttle::law`]); the state is kept.
    pub fn hold_gains(&mut self, law: &ThrottleConfig) {
        (self.kp, self.ki, self.kd) = (law.kp, law.ki, law.kd);
    }

    /// Forgets history (monitor came back after being stale).
    pub fn reset(&mut self) {
        self.integral = 0.0;
        self.prev_err = None;
    }
}

/// A measurement for the controller (the monitor's latest published sample).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// SM activity U_SM, 0..1.
    pub u_sm: f64,
    /// SM clock, MHz.
    pub c_sm: f64,
    /// Highest SM clock, MHz.
    pub c_h: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_factor_matches_eq2() {
        // Below threshold: 1 + a_L (T - C)/T.
        assert!((clock_factor(600.0, 1200.0, 1500.0, 2.0, 0.2) - 2.0).abs() < 1e-9);
        // At threshold: 1.
        assert!((clock_factor(1200.0, 1200.0, 1500.0, 2.0, 0.2) - 1.0).abs() < 1e-9);
        // At the top clock: 1 - a_H.
        assert!((clock_factor(1500.0, 1200.0, 1500.0, 2.0, 0.2) - 0.8).abs() < 1e-9);
        assert!(clock_factor(9999.0, 1200.0, 1500.0, 2.0, 0.2) >= 0.8 - 1e-9);
        assert_eq!(gpu_load(0.5, 2.0), 1.0);
    }

    /// A step long enough to cross a bound integrates up to the bound instead of being
    /// skipped: with 1.5-2 s steps (the simulator's) a skipped step left the rate below its
    /// ceiling, or above its lowest rate, for good (59.4 of 100 waves/s; 35.4 where 5 was due).
    #[test]
    fn a_coarse_step_that_would_cross_a_bound_reaches_it() {
        let cfg = ThrottleConfig::default();
        let mut pid = Pid::new(&cfg);
        let rates: Vec<f64> = (0..5).map(|_| pid.step_within(0.5, 1.5, 100.0)).collect();
        for r in rates {
            assert!((r - 100.0).abs() < 1e-6, "room to launch: the ceiling is reached, got {r}");
        }
        let mut pid = Pid::new(&cfg);
        let rates: Vec<f64> = (0..5).map(|_| pid.step(-1.0, 2.0)).collect();
        for r in rates {
            assert!((r - cfg.min_rate).abs() < 1e-6, "over the target: the lowest rate is reached, got {r}");
        }
    }
}
