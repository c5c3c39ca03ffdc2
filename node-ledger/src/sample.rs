//! The one GPU sample type of the node runtime and its units, from NVML (the monitor) through
//! the ledger (per-mille integers) to its readers (the MPS manager, the shim's throttle).

use serde::{Deserialize, Serialize};

/// Where the SM activity figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SmSource {
    /// NVML GPM `SM_UTIL` (Hopper and later): true SM activity.
    Gpm,
    /// `nvmlDeviceGetSamples(GPU_UTILIZATION)` averaged since the last sample.
    UtilSamples,
    /// `nvmlDeviceGetUtilizationRates().gpu`: coarse fallback.
    UtilRates,
}

impl SmSource {
    /// The snake_case name (its serde form and the metrics label).
    pub fn as_str(self) -> &'static str {
        match self {
            SmSource::Gpm => "gpm",
            SmSource::UtilSamples => "util_samples",
            SmSource::UtilRates => "util_rates",
        }
    }
}

/// One GPU reading, as the monitor takes it from NVML and writes it to its state file.
///
/// Units: load figures in **percent** (0..=100), clocks in MHz, memory in bytes. The ledger
/// stores the load figures as per-mille integers ([`pct_to_permille`]); readers convert back
/// with [`permille_to_pct`] or [`permille_to_fraction`] (the shim's controller works in 0..1).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct GpuSample {
    /// Monotonic ms when taken.
    pub t_ms: u64,
    /// GPU utilization (a kernel was running), percent.
    pub gpu_util: f64,
    /// SM activity, percent; where it came from is [`GpuSample::sm_source`].
    pub sm_activity: f64,
    /// Source of `sm_activity`; `None` when no source answered.
    pub sm_source: Option<SmSource>,
    /// Current SM clock, MHz.
    pub sm_clock_mhz: u32,
    /// Highest SM clock, MHz (0 when unknown).
    pub sm_clock_max_mhz: u32,
    /// The driver gives idleness as the only reason the SM clock is below its maximum
    /// (`nvmlClocksEventReasonGpuIdle`, no power, thermal or slowdown reason): a real card
    /// drops to a few hundred MHz when nothing runs, which says nothing about online load.
    #[serde(default)]
    pub clock_idle: bool,
    /// Device memory in use, bytes.
    pub mem_used: u64,
    /// Device memory in total, bytes.
    pub mem_total: u64,
    /// Board power, milliwatts, when NVML reports it.
    pub power_mw: Option<u32>,
    /// GPU temperature, degrees Celsius, when NVML reports it.
    pub temp_c: Option<u32>,
}

impl GpuSample {
    /// The SM clock as a sign of load, MHz: the clock, or the highest clock while the card has
    /// lowered it only because it is idle ([`GpuSample::clock_idle`]; work brings the boost
    /// clock back within moments). What the health machine judges and the ledger publishes to
    /// the shims' throttles, whose online-pressure hold reads a low clock as SMs in demand.
    pub fn load_clock_mhz(&self) -> u32 {
        if self.clock_idle && self.sm_clock_max_mhz > 0 {
            self.sm_clock_max_mhz
        } else {
            self.sm_clock_mhz
        }
    }
}

/// Percent (0..=100, clamped) to the ledger's per-mille integer, rounded.
pub fn pct_to_permille(pct: f64) -> u32 {
    if pct.is_nan() {
        return 0;
    }
    (pct * 10.0).round().clamp(0.0, 1000.0) as u32
}

/// The ledger's per-mille integer back to percent.
pub fn permille_to_pct(permille: u32) -> f64 {
    f64::from(permille) / 10.0
}

/// The ledger's per-mille integer as a fraction (0..=1 for valid values).
pub fn permille_to_fraction(permille: u32) -> f64 {
    f64::from(permille) / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_and_permille_round_trip_and_clamp() {
        assert_eq!(pct_to_permille(42.34), 423);
        assert_eq!(permille_to_pct(423), 42.3);
        assert_eq!(permille_to_fraction(423), 0.423);
        assert_eq!(pct_to_permille(-5.0), 0);
        assert_eq!(pct_to_permille(250.0), 1000);
        assert_eq!(pct_to_permille(f64::NAN), 0);
    }

    #[test]
    fn the_ledger_sample_reads_back_in_each_unit() {
        let m = crate::MonitorSample {
            sm_active_permille: pct_to_permille(37.5),
            gpu_util_permille: pct_to_permille(80.0),
            ..Default::default()
        };
        assert_eq!(m.sm_active_pct(), 37.5);
        assert_eq!(m.sm_active_fraction(), 0.375);
        assert_eq!(m.gpu_util_pct(), 80.0);
    }

    #[test]
    fn an_idle_lowered_clock_is_no_sign_of_load() {
        let busy = GpuSample {
            sm_clock_mhz: 1400,
            sm_clock_max_mhz: 1980,
            ..Default::default()
        };
        assert_eq!(busy.load_clock_mhz(), 1400);
        let idle = GpuSample {
            sm_clock_mhz: 345,
            clock_idle: true,
            ..busy
        };
        assert_eq!(idle.load_clock_mhz(), 1980);
        let unknown_top = GpuSample {
            sm_clock_max_mhz: 0,
            ..idle
        };
        assert_eq!(unknown_top.load_clock_mhz(), 345);
    }

    #[test]
    fn state_file_names_are_stable() {
        let s = GpuSample {
            sm_source: Some(SmSource::UtilSamples),
            ..Default::default()
        };
        let v = serde_json::to_value(s).unwrap();
        assert_eq!(v["sm_source"], "util_samples");
        assert_eq!(SmSource::Gpm.as_str(), "gpm");
    }
}
