//! The offline launch throttle on a simulated GPU: the real control law of `xshare-control`
//! (the same `Throttle` and `Pid` the shim runs: eq. 1-2, PID on log2 rate, the dynamic SM
//! budget, the online-pressure hold), driven on the simulated clock.
//!
//! Each tick the controller is stepped `inner_steps` times over the tick (its real period is
//! 10 ms; the simulator steps it coarser, so the hold of `hold_ms` lasts at most one inner
//! step). Each step feeds it the sample the monitor would publish for the GPU under the
//! current launch rate (from [`crate::model`]); the rate becomes the offline job's duty: an
//! offline kernel wave (one block per SM) takes `wave_s` at full speed, so a rate of `r`
//! waves/s keeps kernels in flight `r * wave_s / share` of the time, `share` the SMs its
//! kernels get. The tick's view is the mean over the inner steps.

use serde::Serialize;
use xshare_control::{Pid, Sample, Throttle, ThrottleConfig};

use node_ledger::jobs::{job_share, OfflineJob};

use crate::model::{evaluate, evaluate_multi_capped, OnlineLoad, Pair, Share, View};

/// Throttle settings the simulator passes to the control law.
#[derive(Debug, Clone, Serialize)]
pub struct ThrottleSettings {
    /// The shim's throttle config (the shipped defaults unless changed).
    #[serde(skip)]
    pub config: ThrottleConfig,
    /// Controller steps per tick.
    pub inner_steps: u32,
    /// Seconds one offline wave takes at full speed.
    pub wave_s: f64,
    /// Highest SM clock (MHz) of the simulated GPUs.
    pub c_h_mhz: f64,
    /// SMs per simulated GPU.
    pub sm_count: u32,
}

impl Default for ThrottleSettings {
    fn default() -> Self {
        Self {
            config: ThrottleConfig::default(),
            inner_steps: 20,
            wave_s: 0.001,
            c_h_mhz: 1530.0,
            sm_count: 80,
        }
    }
}

/// Per-GPU controller state: one offline process's throttle and PID.
pub struct ThrottleState {
    throttle: Throttle,
    pid: Pid,
    /// The MPS cap the process started with (real MPS fixes it at client start).
    own_cap: f64,
}

impl ThrottleState {
    /// A fresh offline process started under MPS cap `own_cap` (fraction of the SMs).
    pub fn new(s: &ThrottleSettings, own_cap: f64) -> Self {
        let throttle = Throttle::new(&s.config, s.sm_count);
        throttle.set_own_share(own_cap);
        Self {
            throttle,
            pid: Pid::new(&s.config),
            own_cap: own_cap.clamp(0.0, 1.0),
        }
    }

    /// The GPU over one tick of `tick_s` with the offline SM budget `budget` (fraction).
    pub fn settle(
        &mut self,
        s: &ThrottleSettings,
        load: &OnlineLoad,
        pair: &Pair,
        budget: f64,
        tick_s: f64,
    ) -> View {
        let cap = self.own_cap;
        if !s.config.enabled {
            return evaluate(load, pair, Share::Space { cap, duty: 1.0 });
        }
        let n = s.inner_steps.max(1);
        let dt = tick_s / f64::from(n);
        let share = pair.d_off.min(cap).max(1e-3);
        let mut sum = View::default();
        for _ in 0..n {
            let duty = (self.throttle.rate() * s.wave_s / share).min(1.0);
            let v = evaluate(load, pair, Share::Space { cap, duty });
            let sample = sample_of(&v, s.c_h_mhz);
            self.throttle
                .control_with_budget(&mut self.pid, Some(sample), Some(budget), dt);
            self.launch(dt, share, s.wave_s);
            sum.add(&v);
        }
        sum.mean_of(n)
    }

    /// The offline job's launches over `dt` after its controller's step: back to back, it
    /// takes the rate's worth over the step, up to what its kernels can run (`share` of the
    /// SMs, a wave in `wave_s`). The controller measures this use and holds its rate near it
    /// (`xshare_control::Throttle::control_with_part`). The shim refills its bucket every 10 ms
    /// and the job takes each refill; the simulator's step is coarser (seconds), so the step's
    /// whole worth is taken after one refill (what the bucket's depth, a few periods' worth,
    /// does not hold is owed and paid by the next refill).
    fn launch(&self, dt: f64, share: f64, wave_s: f64) {
        self.throttle.refill(dt);
        let can = share / wave_s.max(1e-9) * dt * 1000.0;
        let n = (self.throttle.rate() * 1000.0 * dt).min(can) as i64;
        if n > 0 {
            self.throttle.take(n);
        }
    }

    /// Current launch budget, waves per second.
    pub fn rate(&self) -> f64 {
        self.throttle.rate()
    }

    /// The MPS cap the process started with (fraction of the SMs).
    pub fn own_cap(&self) -> f64 {
        self.own_cap
    }
}

/// The offline jobs of a GPU as the ledger would list them, one per process: job `k + 1` is
/// `states[k]`, with the MPS percentage it started with (rounded up, as the shim records it).
pub fn jobs_of<'a>(states: impl IntoIterator<Item = &'a ThrottleState>) -> Vec<OfflineJob> {
    states
        .into_iter()
        .enumerate()
        .map(|(k, st)| OfflineJob {
            group_id: k as u64 + 1,
            procs: 1,
            mps_pct: Some(((st.own_cap * 100.0 - 1e-9).ceil() as u32).clamp(1, 100)),
        })
        .collect()
}

/// Several offline processes on one GPU over one tick (`max_offline_per_gpu` > 1): each has
/// its own throttle (the shim runs one per process) and all see the same GPU-wide sample, as
/// on a real GPU; `evaluate_multi` gives the GPU and each job's progress. One process is
/// exactly [`ThrottleState::settle`]. Returns the mean view and each job's mean progress.
pub fn settle_multi(
    states: &mut [ThrottleState],
    s: &ThrottleSettings,
    load: &OnlineLoad,
    pairs: &[Pair],
    budget: f64,
    tick_s: f64,
) -> (View, Vec<f64>) {
    if let ([st], [p]) = (&mut *states, pairs) {
        let v = st.settle(s, load, p, budget, tick_s);
        return (v, vec![v.progress]);
    }
    // Each process under the cap it started with, its throttle judging its job's part of the
    // budget (in proportion to the caps: the parts sum to the budget), as the shim does.
    let jobs_now = jobs_of(&*states);
    let parts: Vec<f64> = (0..states.len())
        .map(|k| job_share(1.0, &jobs_now, k as u64 + 1, None))
        .collect();
    let duty = |st: &ThrottleState, p: &Pair| {
        if s.config.enabled {
            (st.throttle.rate() * s.wave_s / p.d_off.min(st.own_cap).max(1e-3)).min(1.0)
        } else {
            1.0
        }
    };
    let n = if s.config.enabled { s.inner_steps.max(1) } else { 1 };
    let dt = tick_s / f64::from(n);
    let mut sum = View::default();
    let mut prog = vec![0.0; pairs.len()];
    for _ in 0..n {
        let jobs: Vec<(Pair, f64, f64)> = states.iter().zip(pairs).map(|(st, p)| (*p, duty(st, p), st.own_cap)).collect();
        let (v, pr) = evaluate_multi_capped(load, &jobs);
        if s.config.enabled {
            let sample = sample_of(&v, s.c_h_mhz);
            for ((st, part), p) in states.iter_mut().zip(&parts).zip(pairs) {
                st.throttle.control_with_part(&mut st.pid, Some(sample), Some(budget), *part, dt);
                st.launch(dt, p.d_off.min(st.own_cap).max(1e-3), s.wave_s);
            }
        }
        sum.add(&v);
        for (a, b) in prog.iter_mut().zip(pr) {
            *a += b;
        }
    }
    let k = f64::from(n);
    let view = sum.mean_of(n);
    (view, prog.into_iter().map(|x| x / k).collect())
}

/// The sample the shim's throttle reads from NVML, from the model's view of the GPU.
fn sample_of(v: &View, c_h_mhz: f64) -> Sample {
    Sample { u_sm: v.sm_activity / 100.0, c_sm: v.clock_pct / 100.0 * c_h_mhz, c_h: c_h_mhz }
}

/// What the report says about the throttle.
pub fn description() -> &'static str {
    "xshare-control Throttle + Pid, stepped inner_steps per tick"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real law, stepped on the simulated clock, brings a lone offline job's load to the
    /// configured target (a lower target gives less progress): a stub returning duty 1 fails.
    #[test]
    fn the_real_controller_settles_on_its_target() {
        let load = OnlineLoad {
            qps: 20.0,
            s0: 0.001,
            d_on: 0.5,
        };
        let pair = Pair {
            d_on: 0.5,
            d_off: 1.0,
            gavel_off: 0.6,
            gavel_on: 0.6,
        };
        let run = |target: f64| {
            let mut s = ThrottleSettings::default();
            s.config.target_load = target;
            // A budget below the own cap: the PID aims at min(target, budget).
            let mut st = ThrottleState::new(&s, 1.0);
            let mut v = View::default();
            for _ in 0..10 {
                v = st.settle(&s, &load, &pair, 0.9, 30.0);
            }
            v
        };
        let (hi, lo) = (run(0.8), run(0.4));
        assert!(lo.sm_activity < hi.sm_activity - 15.0, "{lo:?} {hi:?}");
        assert!(lo.progress < hi.progress);
        assert!((lo.sm_activity - 40.0).abs() < 12.0, "{lo:?}");
    }

    /// Two offline jobs on one GPU, started under caps of 30 % and 10 %: with the budget cut
    /// to 20 %, each job's part (15 % and 5 %, summing to the budget) is under its cap, so
    /// both throttles aim the GPU's load at the budget (before: the second, judged on the
    /// whole budget, was left to its own cap, unthrottled).
    #[test]
    fn jobs_on_one_gpu_divide_the_budget_by_their_caps() {
        let load = OnlineLoad { qps: 20.0, s0: 0.001, d_on: 0.3 };
        let pair = Pair { d_on: 0.3, d_off: 1.0, gavel_off: 0.6, gavel_on: 0.6 };
        let s = ThrottleSettings::default();
        let mut states = vec![ThrottleState::new(&s, 0.3), ThrottleState::new(&s, 0.1)];
        let jobs = jobs_of(&states);
        assert_eq!(jobs.iter().map(|j| j.mps_pct).collect::<Vec<_>>(), [Some(30), Some(10)]);
        settle_multi(&mut states, &s, &load, &[pair, pair], 0.2, 1.0);
        let t: Vec<f64> = states.iter().map(|st| st.throttle.target()).collect();
        assert!((t[0] - 0.2).abs() < 1e-3 && (t[1] - 0.2).abs() < 1e-3, "{t:?}");
        // With the budget back at 40 % each part (30 %, 10 %) is its cap: MPS enforces both.
        settle_multi(&mut states, &s, &load, &[pair, pair], 0.4, 1.0);
        assert!(states.iter().all(|st| st.throttle.target() >= 1.0));
    }
}
