//! The throttle's settings (the `throttle` block of the shim's `xcuda.json`).

use serde::Deserialize;

/// Launch-throttle settings (MuxFlow eq. 1-2 + PID). [`ThrottleConfig::default`] is what ships.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ThrottleConfig {
    /// Whether launches are throttled at all (freezing works either way).
    pub enabled: bool,
    /// Target GPU load U_GPU = U_SM * a_C (0..1).
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
            max_rate: 100_000.0,
            burst: 4.0,
            graph_launch_waves: 8.0,
            hold_below_clock: 0.85,
            hold_ms: 500,
        }
    }
}
