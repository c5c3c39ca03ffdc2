//! Rates between two points of the device's cumulative counters (GPM metrics, utilization
//! samples).

/// The cumulative counters at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Point {
    /// Device time, ns (CLOCK_MONOTONIC).
    pub now_ns: u64,
    /// Cumulative time with a kernel running, ns.
    pub busy_ns: u64,
    /// Cumulative SM-active integral (busy SMs / SM count over time), ns.
    pub sm_active_ns: u64,
    /// SM clock at that instant, MHz.
    pub sm_clock_mhz: u32,
}

/// Fraction (0..=1) of `a..b` by which the counter `f` advanced; `None` when no time passed.
pub fn ratio(a: &Point, b: &Point, f: fn(&Point) -> u64) -> Option<f64> {
    let dt = b.now_ns.checked_sub(a.now_ns)?;
    if dt == 0 {
        return None;
    }
    Some((f(b).saturating_sub(f(a)) as f64 / dt as f64).clamp(0.0, 1.0))
}

/// Samples newer than `after_us` (µs timestamps): one per consecutive pair of points, valued
/// by `value(a, b)`.
pub fn samples(
    points: &[Point],
    after_us: u64,
    value: impl Fn(&Point, &Point) -> f64,
) -> Vec<(u64, f64)> {
    points
        .windows(2)
        .filter(|w| w[1].now_ns / 1000 > after_us)
        .map(|w| (w[1].now_ns / 1000, value(&w[0], &w[1])))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(ms: u64, busy_ms: u64) -> Point {
        Point {
            now_ns: ms * 1_000_000,
            busy_ns: busy_ms * 1_000_000,
            ..Default::default()
        }
    }

    #[test]
    fn ratio_is_the_busy_fraction() {
        assert_eq!(ratio(&p(100, 0), &p(150, 25), |q| q.busy_ns), Some(0.5));
        assert_eq!(ratio(&p(100, 0), &p(100, 0), |q| q.busy_ns), None);
        assert_eq!(ratio(&p(150, 0), &p(100, 0), |q| q.busy_ns), None);
    }

    #[test]
    fn samples_after_a_timestamp() {
        let pts = [p(0, 0), p(10, 5), p(20, 15)];
        let s = samples(&pts, 10_000, |a, b| {
            ratio(a, b, |q| q.busy_ns).unwrap() * 100.0
        });
        assert_eq!(s, vec![(20_000, 100.0)]);
        assert_eq!(samples(&pts, 0, |_, _| 0.0).len(), 2);
    }
}
