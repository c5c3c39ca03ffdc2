//! Online services' load: a diurnal request rate per service (MuxFlow §7.1: 20-190 QPS,
//! smooth within minutes, periodic over days) and the seeded per-service parameters.

use serde::Serialize;

use crate::rng::{hash2, Rng};

/// Lowest request rate, QPS (MuxFlow's production services span 20-190).
pub const QPS_MIN: f64 = 20.0;
/// Highest request rate, QPS.
pub const QPS_MAX: f64 = 190.0;
const DAY_S: f64 = 86_400.0;

/// A service's request rate over time: a daily cosine between 20 and 190 QPS (trough at the
/// service's phase, peak twelve hours later) plus three slow waves (periods 20-90 min,
/// amplitude up to 6 QPS each) so the rate is smooth within minutes but not a pure cosine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diurnal {
    /// Offset of the daily cycle, seconds (trough at `-phase_s`, within +-2 h across services).
    pub phase_s: f64,
    /// Slow waves as `(amplitude QPS, period s, phase rad)`.
    pub waves: [(f64, f64, f64); 3],
}

impl Diurnal {
    /// Draws a phase and three waves from `rng`.
    pub fn seeded(rng: &mut Rng) -> Self {
        // Services peak within +-2 hours of one another (one region's day).
        let phase_s = rng.range(-7200.0, 7200.0);
        let mut wave = || {
            (
                rng.range(2.0, 6.0),
                rng.range(1200.0, 5400.0),
                rng.range(0.0, std::f64::consts::TAU),
            )
        };
        Self {
            phase_s,
            waves: [wave(), wave(), wave()],
        }
    }

    /// Requests per second at simulated time `t` (s).
    pub fn qps(&self, t: f64) -> f64 {
        let day = 0.5 - 0.5 * (std::f64::consts::TAU * (t + self.phase_s) / DAY_S).cos();
        let noise: f64 = self
            .waves
            .iter()
            .map(|(a, p, ph)| a * (std::f64::consts::TAU * t / p + ph).sin())
            .sum();
        (QPS_MIN + (QPS_MAX - QPS_MIN) * day + noise).clamp(QPS_MIN, QPS_MAX)
    }
}

/// Seeded parameters of one online service (one LS pod; every GPU of a multi-GPU pod runs
/// the same service and gets the same parameters).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Service {
    /// Gavel job type standing in for the service (index into `JobTypes`).
    pub job_type: usize,
    /// Kernel SM demand, fraction of the SMs (0.4-1.0).
    pub d_on: f64,
    /// Busy fraction alone at the peak rate: 0.6 x gpu_milli/1000, jittered x0.8-1.25.
    pub peak_busy: f64,
    /// Service time of one request alone, s (= peak_busy / QPS_MAX).
    pub s0: f64,
    /// Its request rate over time.
    pub diurnal: Diurnal,
}

impl Service {
    /// The parameters of online pod `pod` (GPU share `milli`), drawn from `seed` and the name.
    pub fn seeded(seed: u64, pod: &str, milli: u32, job_type: usize) -> Self {
        let mut rng = Rng::new(hash2(seed, &format!("service:{pod}")));
        let d_on = rng.range(0.4, 1.0);
        let peak_busy =
            (0.6 * f64::from(milli.min(1000)) / 1000.0 * rng.range(0.8, 1.25)).clamp(0.02, 0.9);
        let diurnal = Diurnal::seeded(&mut rng);
        Self {
            job_type,
            d_on,
            peak_busy,
            s0: peak_busy / QPS_MAX,
            diurnal,
        }
    }

    /// SM activity alone at the peak rate, fraction.
    pub fn peak_sm(&self) -> f64 {
        self.peak_busy * self.d_on
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diurnal_stays_in_range_is_smooth_and_daily() {
        let d = Diurnal::seeded(&mut Rng::new(7));
        let mut lo = f64::MAX;
        let mut hi = f64::MIN;
        let mut t = 0.0;
        while t < 2.0 * DAY_S {
            let q = d.qps(t);
            lo = lo.min(q);
            hi = hi.max(q);
            // Smooth within minutes: one minute moves the rate by a few QPS at most.
            assert!((d.qps(t + 60.0) - q).abs() < 5.0);
            t += 60.0;
        }
        assert!(lo < 30.0 && hi > 180.0, "{lo} {hi}");
        assert!((QPS_MIN..=QPS_MAX).contains(&lo) && hi <= QPS_MAX);
        // Periodic over days: the daily component repeats (the slow waves do not align).
        assert!((d.qps(3600.0) - d.qps(3600.0 + DAY_S)).abs() < 20.0);
    }

    #[test]
    fn same_seed_same_service() {
        assert_eq!(
            Service::seeded(3, "p", 500, 1),
            Service::seeded(3, "p", 500, 1)
        );
        assert_ne!(
            Service::seeded(3, "p", 500, 1),
            Service::seeded(4, "p", 500, 1)
        );
    }
}
