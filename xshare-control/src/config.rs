//! The throttle's settings (the `throttle` block of the shim's `xcuda.json`).

use serde::Deserialize;

/// Launch-throttle settings (MuxFlow eq. 1-2 + PID). [`ThrottleConfig::default`] is what ships.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ThrottleConfig {
    /// Whether launches are throttled at all (freezing works either way).
    pub enabled: bool,
    /// Target GPU load U_GPU = U_SM * a_C (0..1), lowered to a fresh SM budget below the
    /// process's own MPS cap; a budget its MPS cap already enforces raises it to 1 (the PID
    /// then acts only on a clock under T_SM; see `Throttle::target_for`).
    pub target_load: f64,
    /// a_L: weight of a clock below threshold.
    pub a_l: f64,
    /// a_H: weight of a clock above threshold.
    pub a_h: f64,
    /// T_SM: SM clock threshold, MHz.
    pub t_sm_mhz: f64,
    /// C_H: highest SM clock, MHz (0 = use the monitor's published maximum).
    pub c_h_mhz: f64,
    /// PID proportional gain, on log2(rate) per unit of load error.
    pub kp: f64,
    /// PID integral gain, on log2(rate) per unit of load error and second.
    pub ki: f64,
    /// PID derivative gain, on log2(rate) per unit of load error per second.
    pub kd: f64,
    /// Controller period, ms.
    pub period_ms: u64,
    /// Monitor data older than this is stale, ms.
    pub stale_after_ms: u64,
    /// Rate used while monitor data are missing or stale, SM-waves per second.
    pub fallback_rate: f64,
    /// Lowest rate, SM-waves per second (a throttle never stops a process for good).
    pub min_rate: f64,
    /// Highest rate, SM-waves per second (a throttle is never unlimited).
    pub max_rate: f64,
    /// Bucket depth, SM-waves.
    pub burst: f64,
    /// Cost charged per graph launch, SM-waves.
    pub graph_launch_waves: f64,
    /// Online-pressure hold (fast attack): a fresh sample whose SM clock is below this
    /// fraction of the highest clock means the SMs are nearly all demanded — the online
    /// workload is running beside this process — so launches stop at once (0 = off).
    pub hold_below_clock: f64,
    /// Slow release: launches stay held until this long after the last such sample, ms.
    pub hold_ms: u64,
}

impl Default for ThrottleConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            target_load: 0.8,
            a_l: 2.0,
            a_h: 0.2,
            t_sm_mhz: 1200.0,
            c_h_mhz: 0.0,
            kp: 0.5,
            ki: 2.0,
            kd: 0.0,
            period_ms: 10,
            stale_after_ms: 500,
            fallback_rate: 50.0,
            min_rate: 5.0,
            // Far above what a GPU runs, so that it binds only as "never unlimited": a wave is
            // one block per SM whatever the block's length, and a 65,536-block elementwise
            // kernel of 28 us on an H200 costs 496 waves (100,000 a second allowed 201 such
            // kernels a second on an idle GPU, 0.6 % of it). The controller's ceiling keeps
            // the rate near what a process uses (`Throttle::control_with_part`).
            max_rate: 100_000_000.0,
            burst: 4.0,
            graph_launch_waves: 8.0,
            hold_below_clock: 0.85,
            hold_ms: 500,
        }
    }
}

impl ThrottleConfig {
    /// This configuration's control law held to `bound`'s (an operator's floor requiring a
    /// throttle holds a process's law to the shipped one, [`crate::Throttle::tighten`]): each
    /// parameter stays this configuration's where that is at least as tight as `bound`'s, else
    /// it is `bound`'s. Tighter means: a higher load read from the same sample (a larger a_L and
    /// T_SM, a smaller a_H), an earlier and longer online-pressure hold (a larger
    /// `hold_below_clock` and `hold_ms`), a shallower bucket (`burst`), a dearer graph launch
    /// (`graph_launch_waves`), a lower lowest rate (`min_rate`) and a quicker controller
    /// (`period_ms`). The PID gains and the staleness have no such order, so they are
    /// `bound`'s: a gain of 0 freezes the rate where it is, and a `stale_after_ms` shorter than
    /// the monitor's sampling calls every sample stale, which stops the online-pressure hold
    /// and the PID and leaves the open-loop fallback rate (longer keeps using old samples). The switch,
    /// load target and rates are the floor's own limits, not the law's, and are left as they are;
    /// so is `c_h_mhz`, which the throttle holds at use, against the monitor's highest clock.
    pub fn law_within(&self, bound: &ThrottleConfig) -> ThrottleConfig {
        ThrottleConfig {
            a_l: self.a_l.max(bound.a_l),
            a_h: self.a_h.min(bound.a_h),
            t_sm_mhz: self.t_sm_mhz.max(bound.t_sm_mhz),
            kp: bound.kp,
            ki: bound.ki,
            kd: bound.kd,
            period_ms: self.period_ms.min(bound.period_ms),
            stale_after_ms: bound.stale_after_ms,
            min_rate: self.min_rate.min(bound.min_rate),
            burst: self.burst.min(bound.burst),
            graph_launch_waves: self.graph_launch_waves.max(bound.graph_launch_waves),
            hold_below_clock: self.hold_below_clock.max(bound.hold_below_clock),
            hold_ms: self.hold_ms.max(bound.hold_ms),
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every law parameter a process can loosen comes back to the bound's, every tighter one is
    /// kept, and a law within its bound is unchanged (idempotent, and the shipped law within
    /// itself is itself).
    #[test]
    fn a_law_within_a_bound_keeps_what_is_tighter_and_takes_the_bound_for_the_rest() {
        let b = ThrottleConfig::default();
        assert_eq!(b.law_within(&b), b);
        let loose = ThrottleConfig {
            enabled: false,
            target_load: 3.0,
            a_l: 0.0,
            a_h: 1.0,
            t_sm_mhz: 100.0,
            c_h_mhz: 100.0,
            kp: 0.0,
            ki: 0.0,
            kd: 9.0,
            period_ms: 10_000,
            stale_after_ms: 1 << 40,
            fallback_rate: 1e9,
            min_rate: 1e9,
            max_rate: 1e9,
            burst: 1e12,
            graph_launch_waves: 0.0,
            hold_below_clock: 0.0,
            hold_ms: 0,
        };
        let held = loose.law_within(&b);
        let expect = ThrottleConfig {
            enabled: false,
            target_load: 3.0,
            c_h_mhz: 100.0,
            fallback_rate: 1e9,
            max_rate: 1e9,
            ..b.clone()
        };
        assert_eq!(held, expect, "every loosened law parameter held to the bound's; the floor's own limits untouched");
        let tight = ThrottleConfig {
            a_l: 4.0,
            a_h: 0.1,
            t_sm_mhz: 1400.0,
            kp: 0.9,
            period_ms: 5,
            stale_after_ms: 100,
            min_rate: 1.0,
            burst: 2.0,
            graph_launch_waves: 16.0,
            hold_below_clock: 0.95,
            hold_ms: 900,
            ..b.clone()
        };
        assert_eq!(
            tight.law_within(&b),
            ThrottleConfig { kp: b.kp, stale_after_ms: b.stale_after_ms, ..tight.clone() },
            "tighter kept; the gains and the staleness the bound's"
        );
        assert_eq!(held.law_within(&b), held, "idempotent");
        let blind = ThrottleConfig { stale_after_ms: 1, ..b.clone() };
        assert_eq!(blind.law_within(&b).stale_after_ms, b.stale_after_ms, "every sample stale is no tighter: the bound's");
    }
}
