//! Derived metrics over time windows: utilization (NVML: percent of the sample period during
//! which a kernel ran), SM activity (GPM: busy-SM fraction), clock samples; and the history
//! ring this process keeps for `nvmlDeviceGetSamples`.

use std::collections::VecDeque;

use crate::source::Snapshot;

/// NVML's utilization sample period on datacenter parts is between 1/6 s and 1 s.
pub const WINDOW_NS: u64 = 166_666_667;
/// Points kept for `nvmlDeviceGetSamples`.
pub const HISTORY: usize = 120;

/// One point of cumulative counters.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Point {
    /// Emulated time, ns.
    pub now_ns: u64,
    /// Cumulative busy time, ns.
    pub busy_ns: u64,
    /// Cumulative SM-active integral, ns.
    pub sm_active_ns: u64,
    /// SM clock at that time, MHz.
    pub sm_clock_mhz: u32,
}

impl From<&Snapshot> for Point {
    fn from(s: &Snapshot) -> Self {
        Point { now_ns: s.now_ns, busy_ns: s.busy_ns, sm_active_ns: s.sm_active_ns, sm_clock_mhz: s.sm_clock_mhz }
    }
}

/// Fraction (0..=1) of `a..b` during which the counter `f` advanced.
pub fn ratio(a: &Point, b: &Point, f: fn(&Point) -> u64) -> Option<f64> {
    let dt = b.now_ns.checked_sub(a.now_ns)?;
    if dt == 0 {
        return None;
    }
    Some((f(b).saturating_sub(f(a)) as f64 / dt as f64).clamp(0.0, 1.0))
}

/// Points recorded by this process, oldest first.
#[derive(Debug, Default)]
pub struct History {
    points: VecDeque<Point>,
}

impl History {
    /// Records `p` (ignored when time did not advance).
    pub fn record(&mut self, p: Point) {
        if self.points.back().is_some_and(|last| p.now_ns <= last.now_ns) {
            return;
        }
        if self.points.len() == HISTORY {
            self.points.pop_front();
        }
        self.points.push_back(p);
    }

    /// The oldest point within `WINDOW_NS` before `p` that is at least 1 ms older than it.
    fn window_start(&self, p: &Point) -> Option<&Point> {
        self.points
            .iter()
            .find(|q| q.now_ns + WINDOW_NS >= p.now_ns && q.now_ns + 1_000_000 <= p.now_ns)
    }

    /// GPU utilization percent over the window ending at `s` (instantaneous when this process
    /// has no earlier point).
    pub fn utilization(&self, s: &Snapshot) -> u32 {
        let p = Point::from(s);
        let frac = match self.window_start(&p).and_then(|a| ratio(a, &p, |q| q.busy_ns)) {
            Some(f) => f,
            None => f64::from(u8::from(s.now_activity().0)),
        };
        (frac * 100.0).round() as u32
    }

    /// Samples newer than `after_ns`: (timestamp in µs, value) built from consecutive points
    /// with `value(a, b)`.
    pub fn samples(&self, after_us: u64, value: impl Fn(&Point, &Point) -> f64) -> Vec<(u64, f64)> {
        self.points
            .iter()
            .zip(self.points.iter().skip(1))
            .filter(|(_, b)| b.now_ns / 1000 > after_us)
            .map(|(a, b)| (b.now_ns / 1000, value(a, b)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(now_ms: u64, busy_ms: u64, busy_now: bool) -> Snapshot {
        Snapshot { now_ns: now_ms * 1_000_000, busy_ns: busy_ms * 1_000_000, busy_now, ..Default::default() }
    }

    #[test]
    fn utilization_over_the_window_and_instantaneous_fallback() {
        let mut h = History::default();
        assert_eq!(h.utilization(&snap(100, 0, true)), 100);
        assert_eq!(h.utilization(&snap(100, 0, false)), 0);
        h.record(Point::from(&snap(100, 0, false)));
        assert_eq!(h.utilization(&snap(150, 25, false)), 50);
        // Points older than the window are not used.
        assert_eq!(h.utilization(&snap(1_000, 900, true)), 100);
    }

    #[test]
    fn history_is_bounded_and_monotonic() {
        let mut h = History::default();
        for i in 0..(HISTORY as u64 + 10) {
            h.record(Point { now_ns: (i + 1) * 1000, ..Default::default() });
        }
        h.record(Point { now_ns: 1000, ..Default::default() });
        assert_eq!(h.points.len(), HISTORY);
        assert_eq!(h.samples(0, |_, _| 0.0).len(), HISTORY - 1);
    }
}
