//! Latency statistics: nearest-rank percentiles over recorded samples.

/// Summary of a set of latency samples, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencySummary {
    /// Number of samples.
    pub count: usize,
    /// Arithmetic mean.
    pub mean_ms: f64,
    /// Median (nearest rank).
    pub p50_ms: f64,
    /// 90th percentile (nearest rank).
    pub p90_ms: f64,
    /// 99th percentile (nearest rank).
    pub p99_ms: f64,
    /// Largest sample.
    pub max_ms: f64,
}

/// Nearest-rank percentile `p` (0..=100) of an ascending slice; 0 for an empty one.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summarises samples (any order).
pub fn summarize(samples_ms: &[f64]) -> LatencySummary {
    let mut s: Vec<f64> = samples_ms.iter().copied().filter(|v| v.is_finite()).collect();
    s.sort_by(|a, b| a.total_cmp(b));
    let mean = if s.is_empty() { 0.0 } else { s.iter().sum::<f64>() / s.len() as f64 };
    LatencySummary {
        count: s.len(),
        mean_ms: mean,
        p50_ms: percentile(&s, 50.0),
        p90_ms: percentile(&s, 90.0),
        p99_ms: percentile(&s, 99.0),
        max_ms: s.last().copied().unwrap_or(0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_on_one_to_hundred() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = summarize(&v);
        assert_eq!((s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms), (50.0, 90.0, 99.0, 100.0));
        assert_eq!(s.mean_ms, 50.5);
    }

    #[test]
    fn small_and_empty_sets() {
        assert_eq!(summarize(&[]).p99_ms, 0.0);
        let s = summarize(&[3.0, 1.0, 2.0]);
        assert_eq!((s.p50_ms, s.p99_ms), (2.0, 3.0));
    }
}
