//! Run metrics: online latency (mean and p99, normalized to the same services alone, which is
//! what Online-only measures), SLO violations, offline JCT and makespan, oversold GPU (MuxFlow
//! eq. 3), utilization, evictions; the terminal table and JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use cluster_matcher::policy::Policy;
use serde::Serialize;

use crate::engine::SimConfig;
use crate::model::View;

const BIN_BASE_MS: f64 = 0.01;
const BIN_RATIO: f64 = 1.02;
const BINS: usize = 1200;

/// Request-weighted histogram of tick mean latencies; each tick's latency is exponential
/// (M/M/1 processor sharing), so quantiles are those of the mixture.
#[derive(Debug, Clone)]
pub struct LatencyHist {
    w: Vec<f64>,
}

impl Default for LatencyHist {
    fn default() -> Self {
        Self { w: vec![0.0; BINS] }
    }
}

impl LatencyHist {
    fn bin(ms: f64) -> usize {
        ((ms.max(BIN_BASE_MS) / BIN_BASE_MS).ln() / BIN_RATIO.ln())
            .floor()
            .clamp(0.0, (BINS - 1) as f64) as usize
    }
    fn center(b: usize) -> f64 {
        BIN_BASE_MS * BIN_RATIO.powf(b as f64 + 0.5)
    }
    /// Adds `weight` requests whose latency is exponential with mean `mean_ms` (ms).
    pub fn add(&mut self, mean_ms: f64, weight: f64) {
        self.w[Self::bin(mean_ms)] += weight;
    }

    /// The mixture's CDF at `x` ms.
    pub fn cdf(&self, x: f64) -> f64 {
        let total: f64 = self.w.iter().sum();
        if total <= 0.0 {
            return 0.0;
        }
        self.w
            .iter()
            .enumerate()
            .filter(|(_, w)| **w > 0.0)
            .map(|(b, w)| w / total * (1.0 - (-x / Self::center(b)).exp()))
            .sum()
    }

    /// The `q` quantile (0..1) of the mixture of exponentials, ms.
    pub fn quantile(&self, q: f64) -> f64 {
        let total: f64 = self.w.iter().sum();
        if total <= 0.0 {
            return 0.0;
        }
        let used: Vec<(f64, f64)> = self
            .w
            .iter()
            .enumerate()
            .filter(|(_, w)| **w > 0.0)
            .map(|(b, w)| (Self::center(b), *w / total))
            .collect();
        let cdf = |x: f64| {
            used.iter()
                .map(|(m, w)| w * (1.0 - (-x / m).exp()))
                .sum::<f64>()
        };
        let (mut lo, mut hi) = (0.0, used.iter().map(|(m, _)| *m).fold(0.0, f64::max) * 20.0);
        for _ in 0..80 {
            let mid = 0.5 * (lo + hi);
            if cdf(mid) < q {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        0.5 * (lo + hi)
    }
}

/// Running sums of one run.
#[derive(Debug, Clone, Default)]
pub struct Accum {
    /// Online requests served while latency counted.
    pub requests: f64,
    /// Sum over requests of their mean latency, ms.
    pub latency_sum: f64,
    /// Sum over requests of the same service's latency alone at that rate, ms.
    pub latency_alone_sum: f64,
    /// Latency distribution of the requests (shared, as simulated).
    pub hist: LatencyHist,
    /// Latency distribution the same requests would have had alone.
    pub hist_alone: LatencyHist,
    /// Requests in ticks past the SLO slowdown or saturated.
    pub slo_violations: f64,
    /// Requests in saturated ticks.
    pub saturated: f64,
    /// Seconds of online GPUs simulated (one GPU for one second = 1).
    pub gpu_s: f64,
    /// Of `gpu_s`, seconds with an offline job on the GPU.
    pub shared_s: f64,
    /// Sum of GPU utilization (%) times seconds.
    pub util_s: f64,
    /// Sum of SM activity (%) times seconds.
    pub sm_s: f64,
    /// Online pods given their GPUs.
    pub online_placed: usize,
    /// Online pods that found no free GPUs (never simulated).
    pub online_unplaced: usize,
    /// Offline jobs evicted by the health machine.
    pub evictions: u64,
    /// Health state changes over all GPUs.
    pub health_transitions: u64,
    /// Ticks simulated.
    pub ticks: u64,
    /// Placement rounds run (skipped rounds not counted).
    pub rounds: u64,
    /// Planner time summed over rounds (weights + matching), ms.
    pub plan_ms: f64,
    /// Running jobs the plan took off their GPU (moved or broken).
    pub plan_breaks: u64,
    /// Jobs put on a GPU by a round.
    pub placements: u64,
    /// Offline jobs finished.
    pub jobs_done: usize,
    /// Sum of finished jobs' JCT (finish - arrival), seconds.
    pub jct_sum: f64,
    /// Earliest offline arrival, seconds (valid once `any_job`).
    pub first_arrival: f64,
    /// Latest offline finish, seconds.
    pub last_finish: f64,
    /// Sum over jobs ever placed of their work done per placed second (capped at 1).
    pub norm_tput_sum: f64,
    /// Jobs counted in `norm_tput_sum`.
    pub norm_tput_jobs: usize,
    /// Offline work done, in seconds of exclusive run time.
    pub work_done: f64,
    /// Seconds offline jobs spent placed on a GPU.
    pub placed_s: f64,
    /// Times jobs were moved to another GPU by the plan.
    pub moves: u64,
    /// Times jobs were taken off a GPU for another reason (plan break, eviction, online gone).
    pub breaks: u64,
    /// Whether any job was added (makes `first_arrival` valid).
    pub any_job: bool,
    /// Per hour of simulated time: (utilization x seconds, GPU seconds).
    pub util_hourly: Vec<(f64, f64)>,
    /// Finished jobs: (tenant, JCT s, exclusive duration s).
    pub finished: Vec<(String, f64, f64)>,
}

impl Accum {
    /// One online GPU over `dt` seconds (`lat_dt` of which count for latency).
    /// `t` is the middle of the interval (s), for the hourly utilization series.
    #[allow(clippy::too_many_arguments)]
    pub fn add_gpu(&mut self, t: f64, v: &View, qps: f64, dt: f64, lat_dt: f64, slo: f64, shared: bool) {
        let hour = (t.max(0.0) / 3600.0) as usize;
        if self.util_hourly.len() <= hour {
            self.util_hourly.resize(hour + 1, (0.0, 0.0));
        }
        self.util_hourly[hour].0 += dt * v.gpu_util;
        self.util_hourly[hour].1 += dt;
        self.gpu_s += dt;
        if shared {
            self.shared_s += dt;
        }
        self.util_s += dt * v.gpu_util;
        self.sm_s += dt * v.sm_activity;
        if lat_dt > 0.0 {
            let req = qps * lat_dt;
            self.requests += req;
            self.latency_sum += req * v.latency_ms;
            self.latency_alone_sum += req * v.latency_alone_ms;
            self.hist.add(v.latency_ms, req);
            self.hist_alone.add(v.latency_alone_ms, req);
            if v.saturated || v.latency_ms > slo * v.latency_alone_ms {
                self.slo_violations += req;
            }
            if v.saturated {
                self.saturated += req;
            }
        }
    }

    /// Adds one offline job's totals at the end of the run (`finish` is `None` if unfinished; times in seconds, `done` in exclusive-run seconds).
    #[allow(clippy::too_many_arguments)]
    pub fn add_job(
        &mut self,
        tenant: &str,
        arrival: f64,
        finish: Option<f64>,
        duration: f64,
        done: f64,
        placed_s: f64,
        moves: u32,
        breaks: u32,
    ) {
        if !self.any_job || arrival < self.first_arrival {
            self.first_arrival = arrival;
        }
        self.any_job = true;
        if let Some(f) = finish {
            self.jobs_done += 1;
            self.jct_sum += f - arrival;
            self.finished.push((tenant.to_string(), f - arrival, duration));
            self.last_finish = self.last_finish.max(f);
        }
        if placed_s > 0.0 {
            self.norm_tput_sum += (done / placed_s).min(1.0);
            self.norm_tput_jobs += 1;
        }
        self.work_done += done;
        self.placed_s += placed_s;
        self.moves += u64::from(moves);
        self.breaks += u64::from(breaks);
    }
}

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Row label of the mode (see [`crate::Mode::label`]).
    pub mode: String,
    /// The planner's offline allocation policy.
    pub policy: Policy,
    /// Whether the offline SM budget followed each service's SLO slack.
    pub slo_follow_slack: bool,
    /// Seed of the run.
    pub seed: u64,
    /// Simulated time, hours.
    pub simulated_h: f64,
    /// Online pods given their GPUs.
    pub online_pods_placed: usize,
    /// Online pods that found no GPUs.
    pub online_pods_unplaced: usize,
    /// Online mean / p99 latency normalized to the same services alone (Online-only = 1).
    pub online_latency_norm: f64,
    /// p99 latency over the p99 of the same requests alone.
    pub online_p99_norm: f64,
    /// Mean online latency, ms.
    pub online_latency_ms: f64,
    /// p99 online latency, ms.
    pub online_p99_ms: f64,
    /// Share of requests in ticks slower than `slo_slowdown` x alone, or saturated.
    pub slo_violation_pct: f64,
    /// Share of requests in saturated ticks, percent.
    pub saturated_pct: f64,
    /// Offline jobs in the run.
    pub offline_jobs: usize,
    /// Of those, jobs finished.
    pub offline_done: usize,
    /// Mean JCT of finished jobs, seconds.
    pub offline_avg_jct_s: f64,
    /// First offline arrival to last finish, hours.
    pub makespan_h: f64,
    /// MuxFlow eq. 3 as the mean over jobs of real / exclusive throughput while placed.
    pub oversold_gpu: f64,
    /// Offline solo-work seconds per placed second over all jobs (time-weighted eq. 3).
    pub oversold_gpu_time_weighted: f64,
    /// Mean GPU utilization over online GPUs, percent.
    pub gpu_util_pct: f64,
    /// Mean SM activity over online GPUs, percent.
    pub sm_activity_pct: f64,
    /// Share of online GPU time with an offline job beside it, percent.
    pub shared_gpu_pct: f64,
    /// Health evictions.
    pub evictions: u64,
    /// Plan moves of running jobs.
    pub moves: u64,
    /// Other removals of running jobs (plan breaks, evictions, online gone).
    pub breaks: u64,
    /// Placements made by rounds.
    pub placements: u64,
    /// Placement rounds run.
    pub rounds: u64,
    /// Planner time over all rounds, ms.
    pub plan_ms_total: f64,
    /// Health state changes over all GPUs.
    pub health_transitions: u64,
    /// Which throttle implementation ran (see `throttle::description`).
    pub throttle: String,
    /// Jain's index over tenants of their mean job speed (exclusive duration / JCT): 1 = equal.
    pub jain_tenants: f64,
    /// Gavel's finish-time fairness rho = JCT / JCT on an exclusive GPU, mean and worst over
    /// finished jobs (Gavel's FTF policy minimizes the worst).
    pub ftf_mean: f64,
    /// Worst finish-time fairness over finished jobs.
    pub ftf_max: f64,
    /// Global multiplier on the offline SM budget of every GPU (1 = as shipped); see
    /// [`crate::SimConfig::budget_scale`].
    pub budget_scale: f64,
    /// Curves for plots (not in the JSON).
    #[serde(skip)]
    pub series: Series,
}

/// The curves behind the plots.
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// Online latency (mixture of exponentials).
    pub latency: LatencyHist,
    /// Finished jobs' JCT, s, sorted.
    pub jct_s: Vec<f64>,
    /// GPU utilization (%) per simulated hour.
    pub util_hourly_pct: Vec<f64>,
}

/// Jain's fairness index of `x`: `(sum x)^2 / (n sum x^2)`, 1 when all equal (0 when empty).
pub fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let s2: f64 = x.iter().map(|v| v * v).sum();
    if x.is_empty() || s2 <= 0.0 {
        0.0
    } else {
        s * s / (x.len() as f64 * s2)
    }
}

fn div(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

impl Report {
    /// The report of a finished run from its sums; `end` is the simulated end, seconds, and `jobs` the offline jobs in the run.
    pub fn new(
        mode: &str,
        policy: Policy,
        cfg: &SimConfig,
        end: f64,
        _lat_until: f64,
        a: Accum,
        jobs: usize,
    ) -> Self {
        let p99 = a.hist.quantile(0.99);
        let p99a = a.hist_alone.quantile(0.99);
        let mut per_tenant: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
        let mut rho = Vec::new();
        for (t, jct, d) in &a.finished {
            let speed = if *jct > 0.0 { (d / jct).min(1.0) } else { 1.0 };
            let e = per_tenant.entry(t.as_str()).or_default();
            e.0 += speed;
            e.1 += 1;
            rho.push(if *d > 0.0 { (jct / d).max(1.0) } else { 1.0 });
        }
        let speeds: Vec<f64> = per_tenant.values().map(|(s, n)| s / *n as f64).collect();
        let mut jct_s: Vec<f64> = a.finished.iter().map(|f| f.1).collect();
        jct_s.sort_by(f64::total_cmp);
        let series = Series {
            latency: a.hist.clone(),
            jct_s,
            util_hourly_pct: a.util_hourly.iter().map(|(u, s)| div(*u, *s)).collect(),
        };
        Self {
            jain_tenants: jain(&speeds),
            ftf_mean: div(rho.iter().sum(), rho.len() as f64),
            ftf_max: rho.iter().copied().fold(0.0, f64::max),
            series,
            policy,
            slo_follow_slack: cfg.slo_follow_slack,
            budget_scale: cfg.budget_scale,
            mode: mode.to_string(),
            seed: cfg.seed,
            simulated_h: end / 3600.0,
            online_pods_placed: a.online_placed,
            online_pods_unplaced: a.online_unplaced,
            online_latency_norm: div(a.latency_sum, a.latency_alone_sum),
            online_p99_norm: div(p99, p99a),
            online_latency_ms: div(a.latency_sum, a.requests),
            online_p99_ms: p99,
            slo_violation_pct: 100.0 * div(a.slo_violations, a.requests),
            saturated_pct: 100.0 * div(a.saturated, a.requests),
            offline_jobs: jobs,
            offline_done: a.jobs_done,
            offline_avg_jct_s: div(a.jct_sum, a.jobs_done as f64),
            makespan_h: if a.jobs_done > 0 {
                (a.last_finish - a.first_arrival) / 3600.0
            } else {
                0.0
            },
            oversold_gpu: div(a.norm_tput_sum, a.norm_tput_jobs as f64),
            oversold_gpu_time_weighted: div(a.work_done, a.placed_s),
            gpu_util_pct: div(a.util_s, a.gpu_s),
            sm_activity_pct: div(a.sm_s, a.gpu_s),
            shared_gpu_pct: 100.0 * div(a.shared_s, a.gpu_s),
            evictions: a.evictions,
            moves: a.moves,
            breaks: a.breaks,
            placements: a.placements,
            rounds: a.rounds,
            plan_ms_total: a.plan_ms,
            health_transitions: a.health_transitions,
            throttle: crate::throttle::description().to_string(),
        }
    }
}

impl Report {
    /// The row label (see [`run_label`]).
    pub fn label(&self) -> String {
        let mut s = run_label(&self.mode, self.policy, self.slo_follow_slack);
        if self.budget_scale != 1.0 {
            s.push_str(&format!(" SMx{:.3}", self.budget_scale));
        }
        s
    }
}

/// A run's label: the mode, `/policy` unless the default, `+slack` when the SM budget follows
/// the SLO slack.
pub fn run_label(mode: &str, policy: Policy, slack: bool) -> String {
    let mut s = mode.to_string();
    if policy != Policy::MaxThroughput {
        s = format!("{s}/{}", policy.name());
    }
    if slack {
        s.push_str("+slack");
    }
    s
}

/// The terminal table: one row per run, JCT and oversold GPU also normalized to MuxFlow's
/// run (KM policy) when there is one (as MuxFlow figures 11 and 13 do).
pub fn table(reports: &[Report]) -> String {
    let mux = reports.iter().find(|r| {
        r.mode == "MuxFlow"
            && r.policy == Policy::MaxThroughput
            && !r.slo_follow_slack
            && r.budget_scale == 1.0
    });
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<24} {:>7} {:>7} {:>6} {:>9} {:>7} {:>7} {:>8} {:>8} {:>6} {:>6} {:>6} {:>6} {:>6} {:>5} {:>6} {:>6}",
        "mode/policy",
        "lat/on",
        "p99/on",
        "SLO%",
        "done",
        "JCT s",
        "JCT/MF",
        "mkspan h",
        "oversold",
        "OS/MF",
        "util%",
        "SM%",
        "evict",
        "moves",
        "Jain",
        "FTFavg",
        "FTFmax"
    );
    for r in reports {
        let jct_mf = mux.map_or(String::from("-"), |m| {
            if r.offline_done > 0 && m.offline_avg_jct_s > 0.0 {
                format!("{:.2}", r.offline_avg_jct_s / m.offline_avg_jct_s)
            } else {
                "-".into()
            }
        });
        let os_mf = mux.map_or(String::from("-"), |m| {
            if m.oversold_gpu > 0.0 && r.offline_jobs > 0 {
                format!("{:.2}", r.oversold_gpu / m.oversold_gpu)
            } else {
                "-".into()
            }
        });
        let _ = writeln!(
            s,
            "{:<24} {:>7.3} {:>7.3} {:>6.2} {:>9} {:>7.0} {:>7} {:>8.2} {:>8.3} {:>6} {:>6.1} {:>6.1} {:>6} {:>6} {:>5.3} {:>6.2} {:>6.1}",
            r.label(),
            r.online_latency_norm,
            r.online_p99_norm,
            r.slo_violation_pct,
            format!("{}/{}", r.offline_done, r.offline_jobs),
            r.offline_avg_jct_s,
            jct_mf,
            r.makespan_h,
            r.oversold_gpu,
            os_mf,
            r.gpu_util_pct,
            r.sm_activity_pct,
            r.evictions,
            r.moves,
            r.jain_tenants,
            r.ftf_mean,
            r.ftf_max
        );
    }
    s
}

/// One run of a scale search: `(budget scale, SLO violations %, oversold GPU, average JCT s)`.
pub type Point = (f64, f64, f64, f64);

/// Runs of the shipped SM budget under a global scale, searched for the scale at which its SLO
/// violations equal a target (see [`match_violations`]).
#[derive(Debug, Clone)]
pub struct Matched {
    /// The violation rate searched for, percent.
    pub target_pct: f64,
    /// Every new run, in the order made.
    pub runs: Vec<Report>,
    /// `(budget scale, SLO violations %, oversold GPU, average JCT s)` of every point known,
    /// the starting run included, sorted by scale.
    pub points: Vec<Point>,
}

impl Matched {
    /// The two known points bracketing the target (violations at or below, at or above).
    pub fn bracket(&self) -> (Option<Point>, Option<Point>) {
        let below = self
            .points
            .iter()
            .filter(|p| p.1 <= self.target_pct)
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .copied();
        let above = self
            .points
            .iter()
            .filter(|p| p.1 >= self.target_pct)
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .copied();
        (below, above)
    }

    /// Oversold GPU and average JCT at exactly the target, interpolated linearly in the
    /// violation rate between the bracketing points (`None` when the target is not bracketed).
    pub fn at_target(&self) -> Option<(f64, f64, f64)> {
        match self.bracket() {
            (Some(lo), Some(hi)) => {
                let t = if hi.1 > lo.1 { (self.target_pct - lo.1) / (hi.1 - lo.1) } else { 0.0 };
                let lerp = |a: f64, b: f64| a + t * (b - a);
                Some((lerp(lo.0, hi.0), lerp(lo.2, hi.2), lerp(lo.3, hi.3)))
            }
            _ => None,
        }
    }

    /// One line comparing `slack` (the run whose violations were the target) with the
    /// shipped budget at equal violations.
    pub fn describe(&self, slack: &Report) -> String {
        let head = format!(
            "equal SLO violations ({:.2} %): {} oversold {:.3}, JCT {:.0} s",
            self.target_pct,
            slack.label(),
            slack.oversold_gpu,
            slack.offline_avg_jct_s
        );
        match (self.at_target(), self.bracket()) {
            (Some((scale, os, jct)), (Some(lo), Some(hi))) => format!(
                "{head}; shipped budget x{scale:.3} (interpolated between x{:.3} at {:.2} % and x{:.3} at {:.2} %) oversold {os:.3}, JCT {jct:.0} s: slack sells {:+.1} % GPU",
                lo.0,
                lo.1,
                hi.0,
                hi.1,
                100.0 * (slack.oversold_gpu / os.max(1e-12) - 1.0)
            ),
            _ => format!(
                "{head}; the shipped budget does not reach that rate at any scale tried ({})",
                self.points
                    .iter()
                    .map(|p| format!("x{:.3}: {:.2} %", p.0, p.1))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// Searches the global SM budget scale at which the shipped budget's SLO violations equal
/// `target_pct`: from `start` (whose run is `base`) halving or doubling until the target is
/// bracketed, then bisecting in log scale until within 0.05 points or 10 runs made.
/// Violations grow with the budget (more SM for offline work), which the search assumes.
pub fn match_violations(
    target_pct: f64,
    start: f64,
    base: &Report,
    mut run: impl FnMut(f64) -> Report,
) -> Matched {
    let point = |r: &Report, scale: f64| (scale, r.slo_violation_pct, r.oversold_gpu, r.offline_avg_jct_s);
    let mut m = Matched { target_pct, runs: Vec::new(), points: vec![point(base, start)] };
    const MAX_RUNS: usize = 10;
    const TOL: f64 = 0.05;
    if (base.slo_violation_pct - target_pct).abs() <= TOL {
        return m;
    }
    let (mut lo, mut hi) = if base.slo_violation_pct > target_pct { (None, Some(start)) } else { (Some(start), None) };
    while m.runs.len() < MAX_RUNS {
        let scale = match (lo, hi) {
            (Some(l), Some(h)) => (l * h).sqrt(),
            (None, Some(h)) => h / 2.0,
            (Some(l), None) => l * 2.0,
            (None, None) => unreachable!("one side is always known"),
        };
        if !(1e-3..=64.0).contains(&scale) {
            break;
        }
        let r = run(scale);
        let v = r.slo_violation_pct;
        m.points.push(point(&r, scale));
        m.runs.push(r);
        if (v - target_pct).abs() <= TOL {
            break;
        }
        // The same rate as the last point on that side: the budget is at a floor (the
        // smallest SM cap) or a ceiling; going further changes nothing.
        let same_side = m.points[..m.points.len() - 1]
            .iter()
            .any(|p| p.1 == v && (p.1 > target_pct) == (v > target_pct));
        if same_side && (lo.is_none() || hi.is_none()) {
            break;
        }
        if v > target_pct {
            hi = Some(scale);
        } else {
            lo = Some(scale);
        }
    }
    m.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_index_by_hand() {
        assert_eq!(jain(&[1.0, 1.0, 1.0]), 1.0);
        // (1 + 0)^2 / (2 * 1) = 0.5: one of two gets everything.
        assert_eq!(jain(&[1.0, 0.0]), 0.5);
        assert_eq!(jain(&[]), 0.0);
    }

    #[test]
    fn p99_of_one_exponential_is_ln100_times_its_mean() {
        let mut h = LatencyHist::default();
        h.add(10.0, 1.0);
        let c = LatencyHist::center(LatencyHist::bin(10.0));
        assert!((h.quantile(0.99) - c * 100f64.ln()).abs() < 1e-6 * c);
    }

    fn base_report() -> Report {
        let cfg = crate::SimConfig::new(crate::Mode::Muxflow);
        Report::new("MuxFlow", Policy::MaxThroughput, &cfg, 0.0, 0.0, Accum::default(), 0)
    }

    /// The search brackets and interpolates: a made-up monotone response (violations =
    /// 10 x scale %, oversold = 0.5 x scale) is matched at 2.5 % by scale 0.25, oversold 0.125.
    #[test]
    fn match_violations_finds_the_scale_by_hand() {
        let fake = |scale: f64| {
            let mut r = base_report();
            r.slo_violation_pct = 10.0 * scale;
            r.oversold_gpu = 0.5 * scale;
            r.budget_scale = scale;
            r
        };
        let base = fake(1.0);
        let m = match_violations(2.5, 1.0, &base, fake);
        let (scale, os, _) = m.at_target().expect("bracketed");
        assert!((scale - 0.25).abs() < 0.01, "{m:?}");
        assert!((os - 0.125).abs() < 0.005, "{m:?}");
        assert!(m.runs.len() <= 10);
        // Unreachable: violations never below 3 % whatever the scale.
        let floor = |scale: f64| {
            let mut r = fake(scale);
            r.slo_violation_pct = 3.0 + scale;
            r
        };
        let m = match_violations(2.5, 1.0, &floor(1.0), floor);
        assert!(m.at_target().is_none());
        assert!(m.describe(&base).contains("does not reach"));
    }
}
