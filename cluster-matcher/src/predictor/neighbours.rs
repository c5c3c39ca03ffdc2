//! The shipped per-GPU-type model: job effects in log space, looked up by nearest profile,
//! blended with a nearest-neighbour regressor (see the README's predictor section for why it
//! replaced the MLP).
//!
//! In log space a pair's normalized throughput is, to first order, the offline job's own
//! sensitivity plus the online job's pressure (`ln y ≈ μ + a(offline) + b(online)`; on Gavel's
//! data this additive part alone explains 85 % (K80), 83 % (P100) and 63 % (V100) of the
//! variance). The model keeps, per training job, its two effects found by backfitting, with
//! the job's profile features; a new job takes the effects of the training job nearest in
//! profile, shrunk towards zero by `exp(-distance / tau)` (an unlike job tells little). The
//! pair residuals of the 3 nearest training pairs, shrunk the same way, add the interaction;
//! the result is geometrically averaged with a plain 3-nearest-neighbour prediction.
//! Everything is deterministic (no random state); ties go to the earlier training sample.

use serde::{Deserialize, Serialize};

use super::features::{INPUT_WIDTH, JOB_FEATURES, SM_INPUT};
use super::mlp::{mean_and_variance, MAX_PREDICTION, MIN_TARGET};
use super::PredictorError;

/// Hyper-parameters of [`NeighbourModel`]; stored in the model file.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NeighbourConfig {
    /// Neighbours for the residual and the plain nearest-neighbour part.
    pub k: usize,
    /// Distance scale (standardized units) over which an online job's effect fades.
    pub tau_online: f64,
    /// Same for the offline job's effect.
    pub tau_offline: f64,
    /// Weight of the plain nearest-neighbour prediction in the geometric blend (the job-effect
    /// prediction has weight 1); 0 turns it off.
    pub knn_weight: f64,
    /// Backfitting sweeps for the job effects.
    pub sweeps: usize,
}

impl Default for NeighbourConfig {
    fn default() -> Self {
        Self { k: 3, tau_online: 2.0, tau_offline: 2.0, knn_weight: 1.0, sweeps: 10 }
    }
}

/// A training job's profile (standardized, one side of the input) and its effect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobEffect {
    /// The job's standardized profile features.
    pub features: Vec<f64>,
    /// The job's fitted effect on the log target, relative to `mu`.
    pub effect: f64,
}

/// A training pair: standardized input, log target, residual after the job effects.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Point {
    /// Standardized input (both jobs' features and the SM share).
    pub x: Vec<f64>,
    /// Log of the measured normalized throughput.
    pub log_y: f64,
    /// What `mu` and the two job effects leave unexplained of `log_y`; neighbours average it.
    pub residual: f64,
}

/// One GPU type's fitted model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NeighbourModel {
    /// Hyper-parameters it was fitted with.
    pub config: NeighbourConfig,
    /// Input standardization (a constant input gets std 1 and weight 0 in distances).
    pub mean: Vec<f64>,
    /// Input standard deviations, paired with `mean`.
    pub std: Vec<f64>,
    /// Inputs that vary in the training data; only these enter distances.
    pub used: Vec<bool>,
    /// Mean log target.
    pub mu: f64,
    /// Known offline jobs; a query's offline side borrows effects from the nearest.
    pub offline: Vec<JobEffect>,
    /// Known online jobs, likewise.
    pub online: Vec<JobEffect>,
    /// Training pairs, for the nearest-neighbour residual.
    pub points: Vec<Point>,
}

fn dist2(a: &[f64], b: &[f64], used: &[bool]) -> f64 {
    a.iter().zip(b).zip(used).filter(|(_, u)| **u).map(|((x, y), _)| (x - y).powi(2)).sum()
}

/// Index and squared distance of the nearest entry (first on ties).
fn nearest<'a>(items: impl Iterator<Item = &'a [f64]>, q: &[f64], used: &[bool]) -> Option<(usize, f64)> {
    let mut best: Option<(usize, f64)> = None;
    for (i, f) in items.enumerate() {
        let d = dist2(f, q, used);
        if best.is_none_or(|(_, b)| d < b) {
            best = Some((i, d));
        }
    }
    best
}

/// Groups equal feature vectors (exact), in order of first appearance.
fn group(keys: &[Vec<f64>]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut firsts: Vec<usize> = Vec::new();
    let mut members: Vec<Vec<usize>> = Vec::new();
    let mut of = Vec::with_capacity(keys.len());
    for (i, k) in keys.iter().enumerate() {
        let g = match firsts.iter().position(|&f| keys[f] == *k) {
            Some(g) => g,
            None => {
                firsts.push(i);
                members.push(Vec::new());
                firsts.len() - 1
            }
        };
        members[g].push(i);
        of.push(g);
    }
    (of, members)
}

impl NeighbourModel {
    /// Fits one GPU type's model on `rows` and `targets` (normalized throughputs).
    pub fn fit(rows: &[[f64; INPUT_WIDTH]], targets: &[f64], config: &NeighbourConfig) -> Result<Self, PredictorError> {
        if rows.is_empty() || rows.len() != targets.len() {
            return Err(PredictorError::Training(format!(
                "need matching non-empty inputs and targets, got {} and {}",
                rows.len(),
                targets.len()
            )));
        }
        if config.k == 0 || !(config.tau_online > 0.0 && config.tau_offline > 0.0 && config.knn_weight >= 0.0) {
            return Err(PredictorError::Training("need k > 0, tau > 0 and knn_weight >= 0".into()));
        }
        let n = rows.len() as f64;
        let (mean, mut std) = mean_and_variance(rows);
        let used: Vec<bool> = std.iter().map(|s| s.sqrt() >= 1e-6).collect();
        for s in &mut std {
            *s = if s.sqrt() >= 1e-6 { s.sqrt() } else { 1.0 };
        }
        let xs: Vec<Vec<f64>> =
            rows.iter().map(|r| r.iter().zip(&mean).zip(&std).map(|((x, m), s)| (x - m) / s).collect()).collect();
        let ys: Vec<f64> = targets.iter().map(|y| y.max(MIN_TARGET).ln()).collect();
        let mu = ys.iter().sum::<f64>() / n;
        let (off_of, off_members) = group(&xs.iter().map(|x| x[..JOB_FEATURES].to_vec()).collect::<Vec<_>>());
        let (on_of, on_members) =
            group(&xs.iter().map(|x| x[JOB_FEATURES..SM_INPUT].to_vec()).collect::<Vec<_>>());
        let mut a = vec![0.0; off_members.len()];
        let mut b = vec![0.0; on_members.len()];
        let mean_of = |m: &[usize], f: &dyn Fn(usize) -> f64| m.iter().map(|&i| f(i)).sum::<f64>() / m.len() as f64;
        for _ in 0..config.sweeps {
            a = off_members.iter().map(|m| mean_of(m, &|i| ys[i] - mu - b[on_of[i]])).collect();
            b = on_members.iter().map(|m| mean_of(m, &|i| ys[i] - mu - a[off_of[i]])).collect();
        }
        let effects = |members: &[Vec<usize>], e: &[f64], side: std::ops::Range<usize>| -> Vec<JobEffect> {
            members
                .iter()
                .zip(e)
                .map(|(m, e)| JobEffect { features: xs[m[0]][side.clone()].to_vec(), effect: *e })
                .collect()
        };
        let offline = effects(&off_members, &a, 0..JOB_FEATURES);
        let online = effects(&on_members, &b, JOB_FEATURES..SM_INPUT);
        let points = (0..rows.len())
            .map(|i| Point { x: xs[i].clone(), log_y: ys[i], residual: ys[i] - mu - a[off_of[i]] - b[on_of[i]] })
            .collect();
        Ok(Self { config: *config, mean, std, used, mu, offline, online, points })
    }

    /// Predicted normalized throughput for one input row, in `[0, MAX_PREDICTION]`.
    pub fn predict(&self, row: &[f64; INPUT_WIDTH]) -> f64 {
        let x: Vec<f64> = row.iter().zip(&self.mean).zip(&self.std).map(|((v, m), s)| (v - m) / s).collect();
        let c = &self.config;
        let side = |effects: &[JobEffect], range: std::ops::Range<usize>, tau: f64| -> (f64, f64) {
            let used = &self.used[range.clone()];
            match nearest(effects.iter().map(|e| e.features.as_slice()), &x[range], used) {
                Some((i, d2)) => {
                    let w = (-d2.sqrt() / tau).exp();
                    (w * effects[i].effect, w)
                }
                None => (0.0, 0.0),
            }
        };
        let (a, wa) = side(&self.offline, 0..JOB_FEATURES, c.tau_offline);
        let (b, wb) = side(&self.online, JOB_FEATURES..SM_INPUT, c.tau_online);
        // k nearest training pairs (stable: the earlier sample wins a tie).
        let mut d: Vec<(f64, usize)> =
            self.points.iter().enumerate().map(|(i, p)| (dist2(&p.x, &x, &self.used), i)).collect();
        let k = c.k.min(d.len());
        if k < d.len() {
            d.select_nth_unstable_by(k - 1, |p, q| p.0.total_cmp(&q.0).then(p.1.cmp(&q.1)));
            d.truncate(k);
        }
        let kn = k.max(1) as f64;
        let residual = d.iter().map(|&(_, i)| self.points[i].residual).sum::<f64>() / kn;
        let knn = d.iter().map(|&(_, i)| self.points[i].log_y).sum::<f64>() / kn;
        let additive = self.mu + a + b + wa * wb * residual;
        let log = (additive + c.knn_weight * knn) / (1.0 + c.knn_weight);
        log.exp().clamp(0.0, MAX_PREDICTION)
    }

    /// Checks shapes and values; `what` names the model in the error.
    pub fn validate(&self, what: &str) -> Result<(), String> {
        let c = &self.config;
        if c.k == 0 || !(c.tau_online > 0.0 && c.tau_offline > 0.0 && c.knn_weight >= 0.0 && c.knn_weight.is_finite()) {
            return Err(format!("{what}: config needs k > 0, tau > 0 and a finite knn_weight >= 0"));
        }
        if self.mean.len() != INPUT_WIDTH || self.std.len() != INPUT_WIDTH || self.used.len() != INPUT_WIDTH {
            return Err(format!("{what}: standardization has wrong width (want {INPUT_WIDTH})"));
        }
        if self.std.iter().any(|s| !(s.is_finite() && *s > 0.0)) || self.mean.iter().any(|m| !m.is_finite()) {
            return Err(format!("{what}: standardization has a non-finite or non-positive value"));
        }
        if !self.mu.is_finite() {
            return Err(format!("{what}: `mu` is not finite"));
        }
        if self.points.is_empty() || self.offline.is_empty() || self.online.is_empty() {
            return Err(format!("{what}: holds no training points or job effects"));
        }
        for (name, list) in [("offline", &self.offline), ("online", &self.online)] {
            if let Some(i) = list.iter().position(|e| e.features.len() != JOB_FEATURES || !e.effect.is_finite() || e.features.iter().any(|v| !v.is_finite())) {
                return Err(format!("{what}: {name} effect {i} has wrong width or a non-finite value"));
            }
        }
        if let Some(i) = self.points.iter().position(|p| p.x.len() != INPUT_WIDTH || !p.log_y.is_finite() || !p.residual.is_finite() || p.x.iter().any(|v| !v.is_finite())) {
            return Err(format!("{what}: point {i} has wrong width or a non-finite value"));
        }
        Ok(())
    }

    /// Whether the SM-fraction input can move the output (never: Gavel's pairs all ran at
    /// 100 %, so the input is constant in training and left out of distances).
    pub fn uses_sm_input(&self) -> bool {
        self.used[SM_INPUT]
    }
}

/// Prediction of the plain k-nearest-neighbour baseline on standardized inputs (geometric mean
/// of the neighbours' targets): what the evaluation compares the shipped model with.
pub fn knn_baseline(train: &[[f64; INPUT_WIDTH]], targets: &[f64], k: usize) -> impl Fn(&[f64; INPUT_WIDTH]) -> f64 {
    let cfg = NeighbourConfig { k, knn_weight: 0.0, ..NeighbourConfig::default() };
    let model = NeighbourModel::fit(train, targets, &cfg).ok();
    move |row| {
        let Some(m) = &model else { return 1.0 };
        let x: Vec<f64> = row.iter().zip(&m.mean).zip(&m.std).map(|((v, mu), s)| (v - mu) / s).collect();
        let mut d: Vec<(f64, usize)> = m.points.iter().enumerate().map(|(i, p)| (dist2(&p.x, &x, &m.used), i)).collect();
        d.sort_by(|p, q| p.0.total_cmp(&q.0).then(p.1.cmp(&q.1)));
        let k = k.min(d.len()).max(1);
        (d[..k].iter().map(|&(_, i)| m.points[i].log_y).sum::<f64>() / k as f64).exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predictor::mlp::SplitMix;

    /// Data that is exactly additive in log space over 8 offline and 8 online "jobs".
    fn additive_data() -> (Vec<[f64; INPUT_WIDTH]>, Vec<f64>) {
        let mut rng = SplitMix(5);
        let jobs: Vec<[f64; JOB_FEATURES]> = (0..8).map(|_| std::array::from_fn(|_| rng.unit())).collect();
        let (mut rows, mut ys) = (Vec::new(), Vec::new());
        for a in &jobs {
            for b in &jobs {
                let mut r = [1.0; INPUT_WIDTH];
                r[..JOB_FEATURES].copy_from_slice(a);
                r[JOB_FEATURES..SM_INPUT].copy_from_slice(b);
                rows.push(r);
                ys.push((-0.5 - 0.4 * a[0] - 0.6 * b[1]).exp());
            }
        }
        (rows, ys)
    }

    #[test]
    fn seen_jobs_are_predicted_from_their_effects() {
        let (rows, ys) = additive_data();
        let cfg = NeighbourConfig { knn_weight: 0.0, ..NeighbourConfig::default() };
        let m = NeighbourModel::fit(&rows, &ys, &cfg).unwrap();
        m.validate("t").unwrap();
        for (r, y) in rows.iter().zip(&ys) {
            assert!((m.predict(r) / y - 1.0).abs() < 1e-6, "{} vs {y}", m.predict(r));
        }
        assert!(!m.uses_sm_input());
        let mut r = rows[3];
        let before = m.predict(&r);
        r[SM_INPUT] = 0.2;
        assert_eq!(before, m.predict(&r));
    }

    #[test]
    fn an_unlike_job_falls_back_towards_the_mean() {
        let (rows, ys) = additive_data();
        let m = NeighbourModel::fit(&rows, &ys, &NeighbourConfig { knn_weight: 0.0, ..Default::default() }).unwrap();
        let mut far = rows[0];
        far[JOB_FEATURES..SM_INPUT].iter_mut().for_each(|v| *v = 1e6);
        far[..JOB_FEATURES].iter_mut().for_each(|v| *v = -1e6);
        assert!((m.predict(&far).ln() - m.mu).abs() < 1e-9);
    }

    #[test]
    fn validate_names_the_fault() {
        let (rows, ys) = additive_data();
        let m = NeighbourModel::fit(&rows, &ys, &NeighbourConfig::default()).unwrap();
        let mut bad = m.clone();
        bad.points[4].x.pop();
        assert!(bad.validate("m").unwrap_err().contains("point 4"));
        let mut bad = m.clone();
        bad.online[1].effect = f64::NAN;
        assert!(bad.validate("m").unwrap_err().contains("online effect 1"));
        let mut bad = m;
        bad.config.k = 0;
        assert!(bad.validate("m").unwrap_err().contains("k > 0"));
    }
}
