//! Dynamic SM allocation (MuxFlow §4.3): the offline side's SM percentage is the complement of
//! the online workload's measured SM activity, minus headroom, within limits, smoothed.

use serde::{Deserialize, Serialize};

/// Knobs of the allocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetConfig {
    /// SM percentage kept free above the online workload's activity.
    pub headroom_pct: f64,
    pub min_pct: f64,
    pub max_pct: f64,
    /// Only apply a new value when it moved at least this much (avoids command churn).
    pub min_step_pct: f64,
    /// Weight of the newest measurement in the moving average of online activity (0..=1].
    pub smoothing: f64,
    /// Budget while the GPU is not Healthy/Unhealthy (Overlimit, Disabled, Init, no monitor).
    pub unsafe_pct: f64,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            headroom_pct: 10.0,
            min_pct: 10.0,
            max_pct: 90.0,
            min_step_pct: 5.0,
            smoothing: 0.5,
            unsafe_pct: 10.0,
        }
    }
}

impl BudgetConfig {
    pub fn validate(&self) -> Result<(), (String, String)> {
        let pct = |v: f64| v.is_finite() && (0.0..=100.0).contains(&v);
        for (f, v) in [
            ("headroom_pct", self.headroom_pct),
            ("min_step_pct", self.min_step_pct),
        ] {
            if !pct(v) {
                return Err((
                    format!("budget.{f}"),
                    format!("must be within 0..=100, got {v}"),
                ));
            }
        }
        for (f, v) in [
            ("min_pct", self.min_pct),
            ("max_pct", self.max_pct),
            ("unsafe_pct", self.unsafe_pct),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= 100.0) {
                return Err((
                    format!("budget.{f}"),
                    format!("MPS needs a percentage in (0, 100], got {v}"),
                ));
            }
        }
        if self.min_pct > self.max_pct {
            return Err((
                "budget.min_pct".into(),
                format!("must be <= max_pct ({})", self.max_pct),
            ));
        }
        if !(self.smoothing > 0.0 && self.smoothing <= 1.0) {
            return Err((
                "budget.smoothing".into(),
                format!("must be within (0, 1], got {}", self.smoothing),
            ));
        }
        Ok(())
    }
}

/// Running state of the allocator.
#[derive(Debug, Clone, Default)]
pub struct Allocator {
    online_avg: Option<f64>,
    applied: Option<f64>,
}

impl Allocator {
    /// Estimate of the online workload's SM activity from the total measured activity: the
    /// offline side can use at most its current budget, so `online ≈ total − offline share`.
    pub fn online_estimate(
        total_sm_pct: f64,
        offline_active: bool,
        current_budget_pct: f64,
    ) -> f64 {
        let off = if offline_active {
            current_budget_pct.min(total_sm_pct)
        } else {
            0.0
        };
        (total_sm_pct - off).clamp(0.0, 100.0)
    }

    /// Feeds one measurement; returns `Some(new budget)` when it should be applied.
    /// `safe` is false when the GPU does not admit more offline work (Overlimit, Disabled...).
    pub fn update(&mut self, cfg: &BudgetConfig, online_sm_pct: f64, safe: bool) -> Option<f64> {
        let target = if safe {
            let v = online_sm_pct.clamp(0.0, 100.0);
            let avg = match self.online_avg {
                Some(a) => a + cfg.smoothing * (v - a),
                None => v,
            };
            self.online_avg = Some(avg);
            (100.0 - avg - cfg.headroom_pct).clamp(cfg.min_pct, cfg.max_pct)
        } else {
            cfg.unsafe_pct.clamp(cfg.min_pct.min(cfg.unsafe_pct), 100.0)
        };
        let target = (target * 10.0).round() / 10.0;
        match self.applied {
            // Small moves wait for a real change, except a cut while the GPU is unsafe.
            Some(a) if (safe || target >= a) && (target - a).abs() < cfg.min_step_pct => None,
            _ => {
                self.applied = Some(target);
                Some(target)
            }
        }
    }

    pub fn applied(&self) -> Option<f64> {
        self.applied
    }

    /// Forget the applied value (after an MPS reset every setting must be re-sent).
    pub fn reset_applied(&mut self) {
        self.applied = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg() -> BudgetConfig {
        BudgetConfig {
            smoothing: 1.0,
            ..Default::default()
        }
    }

    #[test]
    fn complement_of_online_minus_headroom() {
        let mut a = Allocator::default();
        assert_eq!(a.update(&cfg(), 30.0, true), Some(60.0));
        assert_eq!(
            a.update(&cfg(), 32.0, true),
            None,
            "moves under min_step are not applied"
        );
        assert_eq!(a.update(&cfg(), 50.0, true), Some(40.0));
        assert_eq!(
            a.update(&cfg(), 95.0, true),
            Some(10.0),
            "floored at min_pct"
        );
        assert_eq!(a.update(&cfg(), 0.0, true), Some(90.0), "capped at max_pct");
    }

    #[test]
    fn unsafe_state_drops_to_the_unsafe_budget_at_once() {
        let mut a = Allocator::default();
        a.update(&cfg(), 30.0, true);
        let c = BudgetConfig {
            unsafe_pct: 58.0,
            ..cfg()
        };
        assert_eq!(
            a.update(&c, 30.0, false),
            Some(58.0),
            "a 2-point drop still applies when unsafe"
        );
    }

    #[test]
    fn online_estimate_removes_the_offline_share() {
        assert_eq!(Allocator::online_estimate(90.0, true, 30.0), 60.0);
        assert_eq!(Allocator::online_estimate(20.0, true, 30.0), 0.0);
        assert_eq!(Allocator::online_estimate(90.0, false, 30.0), 90.0);
    }

    #[test]
    fn smoothing_damps_a_spike() {
        let c = BudgetConfig {
            smoothing: 0.5,
            min_step_pct: 0.0,
            ..Default::default()
        };
        let mut a = Allocator::default();
        a.update(&c, 20.0, true);
        assert_eq!(a.update(&c, 80.0, true), Some(40.0), "avg 50 -> 100-50-10");
    }

    #[test]
    fn validation_names_fields() {
        assert!(BudgetConfig::default().validate().is_ok());
        let c = BudgetConfig {
            min_pct: 95.0,
            ..Default::default()
        };
        assert_eq!(c.validate().unwrap_err().0, "budget.min_pct");
        let c = BudgetConfig {
            max_pct: 0.0,
            ..Default::default()
        };
        assert_eq!(c.validate().unwrap_err().0, "budget.max_pct");
    }

    proptest! {
        #[test]
        fn budget_always_within_limits(seq in proptest::collection::vec((0.0..=100.0f64, any::<bool>()), 1..50)) {
            let c = BudgetConfig::default();
            let mut a = Allocator::default();
            for (v, safe) in seq {
                a.update(&c, v, safe);
                let b = a.applied().unwrap();
                prop_assert!(b > 0.0 && b <= 100.0);
                if safe { prop_assert!(b >= c.min_pct - 1e-9); }
            }
        }
    }
}
