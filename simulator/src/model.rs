//! The per-GPU interference model: what one online service and one offline job sharing a GPU
//! get, as pure functions of the service's request rate, the offline job's SM cap and launch
//! duty. Explicit, seeded through its inputs only, and calibrated at two ends:
//!
//! * **Shape: the emulator's physics** (`tests/emu-device/src/physics.rs`). Each kernel set
//!   demands a fraction of the SMs (`d_on`, `d_off`); the offline demand is first capped by its
//!   MPS percentage (`cap`); if the capped demands exceed the SMs every kernel is scaled by
//!   `1 / total` (processor sharing); the SM clock is full boost up to 50% occupancy, then
//!   linear down to 80% at full occupancy, and a further 10% as demand grows to twice the SMs.
//!   A kernel's speed is its SM share times the clock.
//! * **Magnitude: Gavel's measured pairs.** Gavel ran the two jobs side by side,
//!   unrestricted (`cap = 1`, duty 1): its normalized throughputs `(gavel_off, gavel_on)` are
//!   what each side got. Whatever the SM physics does not explain (memory bandwidth, caches)
//!   is a residual factor `r = gavel / physics(cap = 1)`, clamped to `[0.2, 5]` (above 1
//!   where the SM physics alone overstates what Gavel measured); speeds never exceed 1. The offline
//!   side pays its residual whenever both run; the online side pays `r_on ^ x`, `x` the
//!   offline job's SM pressure relative to unrestricted (so a capped or throttled offline job
//!   interferes less). At `cap = 1`, duty 1 the model gives Gavel's pair back exactly (unless
//!   clamped): `tests::full_colocation_reproduces_gavel`.
//!
//! Time within a tick: the online service is busy a fraction `rho` of the time (requests
//! arrive at `qps`, each needs `s0` alone); the offline job has kernels in flight a fraction
//! `duty` of the time (the throttle's launch budget), independent of the online requests.
//! Online latency is that of an M/M/1 processor-sharing server: mean `s / (1 - rho)`,
//! exponentially distributed (p99 = mean x ln 100).
//!
//! **Several offline jobs per GPU** ([`evaluate_multi`], `max_offline_per_gpu` > 1): every
//! offline process is capped at the same MPS percentage (the shim gives each the budget);
//! while job `i` has kernels in flight the others' are in flight their own duty of the time,
//! independently, and job `i` sees their mean capped demand `O_i` (mean field): processor
//! sharing over `d_on + off_i + O_i` (online busy) or `off_i + O_i` (online idle), the clock
//! from that total, and job `i`'s Gavel residual with the online service as for one job. The
//! online service sees the offline side as one job in flight whenever any is (probability
//! `1 - prod(1 - duty_j)`), with the mean demand of those in flight and each job's residual
//! weighted by its share of that time. One job gives [`evaluate`] exactly.
//!
//! Limits, plainly: offline-offline interference is SM sharing and clock only (Gavel's
//! pairs of two training jobs are not applied between offline jobs); no memory-bandwidth model beyond Gavel's
//! residual; Gavel measured training next to training, so online services are stood in for by
//! Gavel job types (as the matcher's predictor also does); the throttle's 10 ms loop is stepped
//! at the tick's inner step; a job's exclusive speed does not depend on the GPU model
//! (heterogeneity is left out of durations); queueing is M/M/1 (real inference servers batch).

use serde::Serialize;

/// SM clock as a fraction of boost for a given occupancy (granted SMs / SMs) and demand
/// ratio (wanted / SMs): the emulator's `clock_mhz` divided by the boost clock.
pub fn clock_frac(occupancy: f64, demand_ratio: f64) -> f64 {
    let load_drop = 0.2 * ((occupancy - 0.5) / 0.5).clamp(0.0, 1.0);
    let oversub_drop = 0.1 * (demand_ratio - 1.0).clamp(0.0, 1.0);
    1.0 - load_drop - oversub_drop
}

/// What one GPU hosts: the online service's kernel demand and the offline job's, with
/// Gavel's measured pair for their types on this GPU type.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Pair {
    /// Online kernels' SM demand (fraction of the SMs, 0..1].
    pub d_on: f64,
    /// Offline kernels' SM demand (fraction of the SMs, 0..1].
    pub d_off: f64,
    /// Gavel: offline job's normalized throughput next to the online one (unrestricted).
    pub gavel_off: f64,
    /// Gavel: online job's normalized throughput next to the offline one.
    pub gavel_on: f64,
}

/// Relative speeds at one SM cap (1 = as fast as alone, unrestricted).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Speeds {
    /// Online speed while offline kernels run beside it.
    pub on_both: f64,
    /// Offline speed while online kernels run beside it.
    pub off_both: f64,
    /// Offline speed while the online service is idle (capped by `cap`).
    pub off_alone: f64,
    /// SM occupancy and clock fraction while both run.
    pub occ_both: f64,
    /// Clock fraction (of the max SM clock) while both run.
    pub clock_both: f64,
    /// SM share and clock fraction of the offline job alone (capped).
    pub occ_off: f64,
    /// Clock fraction of the offline job alone (capped).
    pub clock_off: f64,
}

struct Phys {
    on_both: f64,
    off_both: f64,
    off_alone: f64,
    occ_both: f64,
    clock_both: f64,
    occ_off: f64,
    clock_off: f64,
    pressure: f64,
}

fn physics(p: &Pair, cap: f64) -> Phys {
    let d_on = p.d_on.clamp(0.01, 1.0);
    let d_off = p.d_off.clamp(0.01, 1.0);
    let off = d_off.min(cap.clamp(0.0, 1.0));
    let total = d_on + off;
    let scale = if total > 1.0 { 1.0 / total } else { 1.0 };
    let (s_on, s_off) = (d_on * scale, off * scale);
    let clock_both = clock_frac(s_on + s_off, total);
    let clock_on = clock_frac(d_on, d_on);
    let clock_solo = clock_frac(d_off, d_off);
    let clock_off = clock_frac(off, off);
    Phys {
        on_both: s_on * clock_both / (d_on * clock_on),
        off_both: s_off * clock_both / (d_off * clock_solo),
        off_alone: off * clock_off / (d_off * clock_solo),
        occ_both: s_on + s_off,
        clock_both,
        occ_off: off,
        clock_off,
        pressure: s_off / d_off,
    }
}

/// Speeds at SM cap `cap` (fraction of the SMs the offline job may use).
pub fn speeds(p: &Pair, cap: f64) -> Speeds {
    let full = physics(p, 1.0);
    let now = physics(p, cap);
    let resid = |gavel: f64, phys: f64| (gavel / phys.max(1e-9)).clamp(0.2, 5.0);
    let r_on = resid(p.gavel_on, full.on_both);
    let r_off = resid(p.gavel_off, full.off_both);
    let x = (now.pressure / full.pressure.max(1e-9)).clamp(0.0, 1.0);
    Speeds {
        on_both: (now.on_both * r_on.powf(x)).min(1.0),
        off_both: (now.off_both * r_off).min(1.0),
        off_alone: now.off_alone,
        occ_both: now.occ_both,
        clock_both: now.clock_both,
        occ_off: now.occ_off,
        clock_off: now.clock_off,
    }
}

/// How the offline job shares the GPU in one tick.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Share {
    /// No offline job.
    None,
    /// Both run concurrently (MPS), the offline job capped at `cap` SMs and in flight `duty`
    /// of the time.
    Space {
        /// Offline SM cap, fraction of the SMs (0..1).
        cap: f64,
        /// Fraction of the tick the offline job has kernels in flight (0..1).
        duty: f64,
    },
    /// Time slicing without priorities (Gandiva): contexts take turns; while both have work
    /// each gets what Gavel measured for the pair (the driver's slices), unrestricted.
    Slices,
    /// Online priority (PB-time-sharing): offline kernels run only while the online service
    /// is idle; each online request pays `switch` (relative) for preempting the offline slice.
    Priority {
        /// Extra service time per online request, relative to its time alone.
        switch: f64,
    },
}

/// One GPU over one tick.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct View {
    /// Online busy fraction (0..1; 1 = saturated).
    pub rho: f64,
    /// Mean online latency (ms) and the same service's alone at this rate.
    pub latency_ms: f64,
    /// Mean latency of the same service alone at this rate, ms.
    pub latency_alone_ms: f64,
    /// Requests would queue without bound (rho >= `RHO_MAX`): latency is capped there.
    pub saturated: bool,
    /// Offline progress per second (1 = as fast as alone, unrestricted).
    pub progress: f64,
    /// NVML-style metrics, percent.
    pub gpu_util: f64,
    /// SM activity, percent.
    pub sm_activity: f64,
    /// SM clock, percent of the max.
    pub clock_pct: f64,
}

impl View {
    /// Adds `v` to this running sum of views (`saturated` if any was).
    pub fn add(&mut self, v: &View) {
        self.rho += v.rho;
        self.latency_ms += v.latency_ms;
        self.latency_alone_ms += v.latency_alone_ms;
        self.saturated |= v.saturated;
        self.progress += v.progress;
        self.gpu_util += v.gpu_util;
        self.sm_activity += v.sm_activity;
        self.clock_pct += v.clock_pct;
    }

    /// The mean of a sum of `n` views made with [`View::add`].
    pub fn mean_of(&self, n: u32) -> View {
        let k = f64::from(n.max(1));
        View {
            rho: self.rho / k,
            latency_ms: self.latency_ms / k,
            latency_alone_ms: self.latency_alone_ms / k,
            saturated: self.saturated,
            progress: self.progress / k,
            gpu_util: self.gpu_util / k,
            sm_activity: self.sm_activity / k,
            clock_pct: self.clock_pct / k,
        }
    }
}

/// Busy fraction past which the M/M/1 latency is capped and the tick counts as saturated.
pub const RHO_MAX: f64 = 0.98;

/// The online side of one service: kernel demand, request cost alone.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OnlineLoad {
    /// Requests per second now.
    pub qps: f64,
    /// Service time of one request alone, seconds.
    pub s0: f64,
    /// Kernel SM demand, fraction of the SMs (0..1].
    pub d_on: f64,
}

fn mm1(s: f64, rho: f64) -> (f64, bool) {
    let sat = rho >= RHO_MAX;
    (s / (1.0 - rho.min(RHO_MAX)), sat)
}

/// Evaluates one tick. `pair` is ignored with [`Share::None`].
pub fn evaluate(on: &OnlineLoad, pair: &Pair, share: Share) -> View {
    let rho0 = (on.qps * on.s0).max(0.0);
    let (alone, _) = mm1(on.s0, rho0);
    let clock_on = clock_frac(on.d_on, on.d_on);
    let mut v = View {
        latency_alone_ms: alone * 1e3,
        ..View::default()
    };
    match share {
        Share::None => {
            let (t, sat) = mm1(on.s0, rho0);
            v.rho = rho0.min(1.0);
            v.latency_ms = t * 1e3;
            v.saturated = sat;
            v.gpu_util = 100.0 * v.rho;
            v.sm_activity = 100.0 * v.rho * on.d_on;
            v.clock_pct = 100.0 * (v.rho * clock_on + (1.0 - v.rho));
        }
        Share::Space { cap, duty } => {
            let sp = speeds(pair, cap);
            let duty = duty.clamp(0.0, 1.0);
            let s = on.s0 * (duty / sp.on_both.max(1e-6) + (1.0 - duty));
            let rho = on.qps * s;
            let (t, sat) = mm1(s, rho);
            let r = rho.min(1.0);
            v.rho = r;
            v.latency_ms = t * 1e3;
            v.saturated = sat;
            v.progress = duty * (r * sp.off_both + (1.0 - r) * sp.off_alone);
            let both = r * duty;
            let on_only = r * (1.0 - duty);
            let off_only = (1.0 - r) * duty;
            v.gpu_util = 100.0 * (both + on_only + off_only);
            v.sm_activity =
                100.0 * (both * sp.occ_both + on_only * pair.d_on + off_only * sp.occ_off);
            let idle = 1.0 - both - on_only - off_only;
            v.clock_pct = 100.0
                * (both * sp.clock_both + on_only * clock_on + off_only * sp.clock_off + idle);
        }
        Share::Slices => {
            let sp = speeds(pair, 1.0);
            let s = on.s0 / sp.on_both.max(1e-6);
            let rho = on.qps * s;
            let (t, sat) = mm1(s, rho);
            let r = rho.min(1.0);
            v.rho = r;
            v.latency_ms = t * 1e3;
            v.saturated = sat;
            v.progress = r * sp.off_both + (1.0 - r) * 1.0;
            v.gpu_util = 100.0;
            v.sm_activity = 100.0 * (r * sp.occ_both + (1.0 - r) * pair.d_off.min(1.0));
            v.clock_pct =
                100.0 * (r * sp.clock_both + (1.0 - r) * clock_frac(pair.d_off, pair.d_off));
        }
        Share::Priority { switch } => {
            let s = on.s0 * (1.0 + switch.max(0.0));
            let rho = on.qps * s;
            let (t, sat) = mm1(s, rho);
            let r = rho.min(1.0);
            v.rho = r;
            v.latency_ms = t * 1e3;
            v.saturated = sat;
            v.progress = (1.0 - r) * (1.0 - switch.max(0.0)).max(0.0);
            v.gpu_util = 100.0;
            v.sm_activity = 100.0 * (r * on.d_on + (1.0 - r) * pair.d_off.min(1.0));
            v.clock_pct = 100.0 * (r * clock_on + (1.0 - r) * clock_frac(pair.d_off, pair.d_off));
        }
    }
    v
}

/// One GPU over one tick with several offline jobs (see the module docs): the GPU's view
/// (its `progress` is the jobs' sum) and each job's progress. `jobs` are each job's pair with
/// the online service and its duty; every job is capped at `cap`. One job: [`evaluate`].
pub fn evaluate_multi(on: &OnlineLoad, jobs: &[(Pair, f64)], cap: f64) -> (View, Vec<f64>) {
    let capped: Vec<(Pair, f64, f64)> = jobs.iter().map(|&(p, d)| (p, d, cap)).collect();
    evaluate_multi_capped(on, &capped)
}

/// [`evaluate_multi`] with each job's own MPS cap: `jobs` are `(pair, duty, cap)`. Several
/// jobs on one GPU split the offline SM budget (`node_ledger::jobs`), each under the cap it
/// started with.
pub fn evaluate_multi_capped(on: &OnlineLoad, jobs: &[(Pair, f64, f64)]) -> (View, Vec<f64>) {
    match jobs {
        [] => (evaluate(on, &Pair { d_on: on.d_on, d_off: 1.0, gavel_off: 1.0, gavel_on: 1.0 }, Share::None), Vec::new()),
        [(p, duty, cap)] => {
            let v = evaluate(on, p, Share::Space { cap: *cap, duty: *duty });
            (v, vec![v.progress])
        }
        _ => multi(on, jobs),
    }
}

fn multi(on: &OnlineLoad, jobs: &[(Pair, f64, f64)]) -> (View, Vec<f64>) {
    let caps: Vec<f64> = jobs.iter().map(|(_, _, c)| c.clamp(0.0, 1.0)).collect();
    let d_on = on.d_on.clamp(0.01, 1.0);
    let clock_on = clock_frac(d_on, d_on);
    let duty: Vec<f64> = jobs.iter().map(|(_, d, _)| d.clamp(0.0, 1.0)).collect();
    let off: Vec<f64> = jobs.iter().zip(&caps).map(|((p, _, _), c)| p.d_off.clamp(0.01, 1.0).min(*c)).collect();
    let mean_demand: f64 = off.iter().zip(&duty).map(|(o, d)| o * d).sum();
    let any = 1.0 - duty.iter().map(|d| 1.0 - d).product::<f64>();
    // Online side: the offline jobs as one job in flight `any` of the time, with the mean
    // demand of those in flight; each job's residual weighted by its share of that time.
    let d_c = if any > 0.0 { (mean_demand / any).min(1.0) } else { 0.0 };
    let total = d_on + d_c;
    let scale = if total > 1.0 { 1.0 / total } else { 1.0 };
    let clock_both = clock_frac((d_on + d_c) * scale, total);
    let mut on_both = d_on * scale * clock_both / (d_on * clock_on);
    for (k, (p, _, _)) in jobs.iter().enumerate() {
        if any > 0.0 && duty[k] > 0.0 {
            let full = physics(p, 1.0);
            let now = physics(p, caps[k]);
            let r_on = (p.gavel_on / full.on_both.max(1e-9)).clamp(0.2, 5.0);
            let x = (now.pressure / full.pressure.max(1e-9)).clamp(0.0, 1.0);
            on_both *= r_on.powf(x * duty[k] * off[k] / mean_demand.max(1e-12));
        }
    }
    let on_both = on_both.min(1.0);
    let rho0 = (on.qps * on.s0).max(0.0);
    let (alone, _) = mm1(on.s0, rho0);
    let s = on.s0 * (any / on_both.max(1e-6) + (1.0 - any));
    let (t, sat) = mm1(s, on.qps * s);
    let r = (on.qps * s).min(1.0);
    // Each offline job: processor sharing with the online service (busy `r` of the time)
    // and the others' mean capped demand.
    let mut progress = Vec::with_capacity(jobs.len());
    for (k, (p, _, _)) in jobs.iter().enumerate() {
        let d_off = p.d_off.clamp(0.01, 1.0);
        let others = mean_demand - duty[k] * off[k];
        let clock_solo = clock_frac(d_off, d_off);
        let speed = |online: f64| {
            let total = online + off[k] + others;
            let scale = if total > 1.0 { 1.0 / total } else { 1.0 };
            let occ = (online + off[k] + others) * scale;
            off[k] * scale * clock_frac(occ, total) / (d_off * clock_solo)
        };
        let full = physics(p, 1.0);
        let r_off = (p.gavel_off / full.off_both.max(1e-9)).clamp(0.2, 5.0);
        let both = (speed(d_on) * r_off).min(1.0);
        let alone_k = speed(0.0).min(1.0);
        progress.push(duty[k] * (r * both + (1.0 - r) * alone_k));
    }
    let occ_both = (d_on + d_c) * scale;
    let occ_off = d_c.min(1.0);
    let clock_off = clock_frac(occ_off, d_c);
    let both = r * any;
    let on_only = r * (1.0 - any);
    let off_only = (1.0 - r) * any;
    let idle = 1.0 - both - on_only - off_only;
    let v = View {
        rho: r,
        latency_ms: t * 1e3,
        latency_alone_ms: alone * 1e3,
        saturated: sat,
        progress: progress.iter().sum(),
        gpu_util: 100.0 * (both + on_only + off_only),
        sm_activity: 100.0 * (both * occ_both + on_only * d_on + off_only * occ_off),
        clock_pct: 100.0 * (both * clock_both + on_only * clock_on + off_only * clock_off + idle),
    };
    (v, progress)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_matches_the_emulator_curve() {
        // physics.rs: full boost to 50% occupancy, 80% at full, 70% at double demand.
        assert_eq!(clock_frac(0.5, 0.5), 1.0);
        assert!((clock_frac(1.0, 1.0) - 0.8).abs() < 1e-12);
        assert!((clock_frac(1.0, 2.0) - 0.7).abs() < 1e-12);
    }

    #[test]
    fn full_colocation_reproduces_gavel() {
        let p = Pair {
            d_on: 0.8,
            d_off: 0.9,
            gavel_off: 0.55,
            gavel_on: 0.6,
        };
        let s = speeds(&p, 1.0);
        assert!((s.on_both - 0.6).abs() < 1e-9, "{s:?}");
        assert!((s.off_both - 0.55).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn a_lower_cap_protects_online_and_slows_offline() {
        let p = Pair {
            d_on: 0.8,
            d_off: 0.9,
            gavel_off: 0.55,
            gavel_on: 0.6,
        };
        let (hi, lo) = (speeds(&p, 1.0), speeds(&p, 0.2));
        assert!(lo.on_both > hi.on_both);
        assert!(lo.off_both < hi.off_both && lo.off_alone < hi.off_alone);
    }

    #[test]
    fn processor_sharing_without_contention_is_free() {
        // Demands that fit in the SMs below 50% occupancy: no slowdown either side.
        let p = Pair {
            d_on: 0.2,
            d_off: 0.2,
            gavel_off: 1.0,
            gavel_on: 1.0,
        };
        let s = speeds(&p, 1.0);
        assert!((s.on_both - 1.0).abs() < 1e-12 && (s.off_both - 1.0).abs() < 1e-12);
    }

    #[test]
    fn duty_zero_is_online_alone() {
        let on = OnlineLoad {
            qps: 100.0,
            s0: 0.003,
            d_on: 0.7,
        };
        let p = Pair {
            d_on: 0.7,
            d_off: 0.9,
            gavel_off: 0.5,
            gavel_on: 0.5,
        };
        let v = evaluate(
            &on,
            &p,
            Share::Space {
                cap: 0.5,
                duty: 0.0,
            },
        );
        let a = evaluate(&on, &p, Share::None);
        assert!((v.latency_ms - a.latency_ms).abs() < 1e-9);
        assert_eq!(v.progress, 0.0);
        // Priority: online pays only the switch, offline gets the idle time.
        let pr = evaluate(&on, &p, Share::Priority { switch: 0.0 });
        assert!((pr.latency_ms - a.latency_ms).abs() < 1e-9);
        assert!((pr.progress - (1.0 - a.rho)).abs() < 1e-9);
    }

    /// Two offline jobs, hand-checked. Online idle (qps 0), duty 1, cap 1:
    /// * demands 0.2 + 0.2 fit in the SMs under 50 % occupancy: each runs as fast as alone;
    /// * demands 0.9 + 0.9: processor sharing gives each 0.5 of the SMs for the 0.9 it wants,
    ///   and the clock drops from 0.84 (0.9 alone: 1 - 0.2 x 0.8) to 0.72 (full occupancy,
    ///   demand 1.8: 1 - 0.2 - 0.08): each gets 0.5 / 0.9 x 0.72 / 0.84 = 0.4762 of its speed;
    /// * with the second job in flight half the time, the first sees half its demand (total
    ///   1.35): 1 / 1.35 x 0.765 / 0.84 = 0.6746.
    #[test]
    fn two_offline_jobs_share_the_sms_by_hand() {
        let idle = OnlineLoad { qps: 0.0, s0: 0.003, d_on: 0.5 };
        let pair = |d_off: f64| Pair { d_on: 0.5, d_off, gavel_off: 0.6, gavel_on: 0.6 };
        let (_, p) = evaluate_multi(&idle, &[(pair(0.2), 1.0), (pair(0.2), 1.0)], 1.0);
        assert!((p[0] - 1.0).abs() < 1e-12 && (p[1] - 1.0).abs() < 1e-12, "{p:?}");
        let (v, p) = evaluate_multi(&idle, &[(pair(0.9), 1.0), (pair(0.9), 1.0)], 1.0);
        let want = 0.5 / 0.9 * 0.72 / 0.84;
        assert!((p[0] - want).abs() < 1e-9 && (p[1] - want).abs() < 1e-9, "{p:?}");
        assert!((v.progress - 2.0 * want).abs() < 1e-9);
        assert!((v.gpu_util - 100.0).abs() < 1e-9 && (v.sm_activity - 100.0).abs() < 1e-9);
        let (_, p) = evaluate_multi(&idle, &[(pair(0.9), 1.0), (pair(0.9), 0.5)], 1.0);
        let want0 = 1.0 / 1.35 * (1.0 - 0.2 - 0.1 * 0.35) / 0.84;
        assert!((p[0] - want0).abs() < 1e-9, "{p:?} vs {want0}");
        // The second job runs half the time, seeing the first's full demand when it does.
        assert!((p[1] - 0.5 * want).abs() < 1e-9, "{p:?}");
        // A busy online service is slowed more by two offline jobs than by one.
        let busy = OnlineLoad { qps: 100.0, s0: 0.003, d_on: 0.5 };
        let (one, _) = evaluate_multi(&busy, &[(pair(0.9), 1.0)], 0.5);
        let (two, _) = evaluate_multi(&busy, &[(pair(0.9), 1.0), (pair(0.9), 1.0)], 0.5);
        assert!(two.latency_ms > one.latency_ms, "{one:?} {two:?}");
        // One job is exactly the pair model.
        let single = evaluate(&busy, &pair(0.9), Share::Space { cap: 0.5, duty: 1.0 });
        assert_eq!(one, single);
    }
}
