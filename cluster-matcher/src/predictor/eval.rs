//! Held-out evaluation of the speed predictor on Gavel data: splits by pair, by job and by
//! model family; MAPE of the shipped model beside every baseline (MuxFlow's MLP, 3-nearest
//! neighbours, the mean pair value, the offline job's mean).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::features::{pair_input, INPUT_WIDTH};
use super::gavel::{GavelData, PairSample};
use super::mlp::SplitMix;
use super::neighbours::knn_baseline;
use super::{NeighbourConfig, PredictorError, SpeedPredictor, TrainConfig};

/// What [`cross_validate`] fits on every fold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalConfig {
    /// The shipped model's hyper-parameters.
    pub model: NeighbourConfig,
    /// MuxFlow's MLP, reported beside it; `None` skips it (it is the slow part). Its seed
    /// also seeds the folds, so keep it when comparing runs.
    pub mlp: Option<TrainConfig>,
    /// Seed of the pair and job folds.
    pub seed: u64,
    /// Neighbours of the k-nearest-neighbour baseline.
    pub knn_k: usize,
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self { model: NeighbourConfig::default(), mlp: Some(TrainConfig::default()), seed: TrainConfig::default().seed, knn_k: 3 }
    }
}

/// How the test set is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Split {
    /// Unordered job pairs are held out whole (both directions, every GPU type).
    ByPair,
    /// Jobs are held out whole: a test sample involves at least one held-out job, a training
    /// sample none.
    ByJob,
    /// Model families (ResNet-50, LM, ...) are held out whole, every batch size with them:
    /// leave-one-family-out when `folds` is the number of families.
    ByFamily,
}

/// A job's model family: its name without the batch size.
pub fn family(job: &str) -> &str {
    job.split(" (batch size").next().unwrap_or(job).trim()
}

/// Fold of every job for [`Split::ByFamily`]: families in name order dealt round-robin.
pub fn family_folds(data: &GavelData, folds: usize) -> BTreeMap<String, usize> {
    let families: BTreeSet<&str> = data.profiles.keys().map(|j| family(j)).collect();
    let fold_of: BTreeMap<&str, usize> = families.into_iter().enumerate().map(|(i, f)| (f, i % folds)).collect();
    data.profiles.keys().map(|j| (j.clone(), fold_of[family(j)])).collect()
}

/// Held-out error on one GPU type, summed over folds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GpuReport {
    /// GPU type (`k80`, `p100`, `v100`).
    pub gpu: String,
    /// Training pairs seen, summed over folds.
    pub train_samples: usize,
    /// Held-out pairs scored, summed over folds (each pair is held out once).
    pub test_samples: usize,
    /// Mean absolute percentage error of the shipped model (job effects + neighbours).
    pub mape_model: f64,
    /// MAPE of MuxFlow's MLP (`None` when skipped).
    pub mape_mlp: Option<f64>,
    /// MAPE of a 3-nearest-neighbour regressor on the same standardized inputs (geometric
    /// mean of the neighbours' targets).
    pub mape_knn: f64,
    /// MAPE of always predicting the training mean pair value.
    pub mape_mean: f64,
    /// MAPE of predicting the offline job's mean over its training pairs (global mean when
    /// the job has none).
    pub mape_job_mean: f64,
}

/// Input row and target for one pair sample.
pub fn sample_row(data: &GavelData, p: &PairSample) -> Option<[f64; INPUT_WIDTH]> {
    pair_input(&data.profiles[&p.offline], &data.profiles[&p.online], &p.gpu, 100.0)
}

fn pair_key(p: &PairSample) -> (String, String) {
    if p.offline <= p.online {
        (p.offline.clone(), p.online.clone())
    } else {
        (p.online.clone(), p.offline.clone())
    }
}

/// Fold of every job for [`Split::ByJob`]: a seeded shuffle dealt round-robin.
pub fn job_folds(data: &GavelData, folds: usize, seed: u64) -> BTreeMap<String, usize> {
    let mut rng = SplitMix(seed);
    let mut jobs: Vec<&String> = data.profiles.keys().collect();
    for i in (1..jobs.len()).rev() {
        jobs.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    jobs.into_iter().enumerate().map(|(i, j)| (j.clone(), i % folds)).collect()
}

/// Fold (0..folds) of every sample under `split`, deterministic in `seed`.
pub fn assign_folds(data: &GavelData, split: Split, folds: usize, seed: u64) -> Vec<Vec<usize>> {
    let mut rng = SplitMix(seed);
    match split {
        Split::ByPair => {
            let keys: BTreeSet<_> = data.pairs.iter().map(pair_key).collect();
            let fold_of: BTreeMap<_, _> = keys
                .into_iter()
                .map(|k| (k, (rng.next_u64() % folds as u64) as usize))
                .collect();
            data.pairs.iter().map(|p| vec![fold_of[&pair_key(p)]]).collect()
        }
        Split::ByJob | Split::ByFamily => {
            let fold_of = if split == Split::ByJob { job_folds(data, folds, seed) } else { family_folds(data, folds) };
            data.pairs
                .iter()
                .map(|p| {
                    let mut f = vec![fold_of[&p.offline], fold_of[&p.online]];
                    f.dedup();
                    f
                })
                .collect()
        }
    }
}

fn ape(pred: f64, y: f64) -> f64 {
    (pred - y).abs() / y * 100.0
}

/// Cross-validated held-out MAPE per GPU type. A sample is in the test set of fold `k` when any
/// of its folds is `k`, in the training set when none is.
pub fn cross_validate(
    data: &GavelData,
    split: Split,
    folds: usize,
    cfg: &EvalConfig,
) -> Result<Vec<GpuReport>, PredictorError> {
    cross_validate_folds(data, split, folds, &(0..folds).collect::<Vec<_>>(), cfg)
}

/// As [`cross_validate`], running only the folds in `which` (each held out once).
pub fn cross_validate_folds(
    data: &GavelData,
    split: Split,
    folds: usize,
    which: &[usize],
    cfg: &EvalConfig,
) -> Result<Vec<GpuReport>, PredictorError> {
    if folds < 2 {
        return Err(PredictorError::Training(format!(
            "--folds {folds}: cross-validation needs at least 2 folds (one held out, the rest to train on)"
        )));
    }
    if let Some(&k) = which.iter().find(|&&k| k >= folds) {
        return Err(PredictorError::Training(format!("fold {k} does not exist (folds: {folds})")));
    }
    let fold_sets = assign_folds(data, split, folds, cfg.seed ^ 0x5eed);
    let mut reports: BTreeMap<String, GpuReport> = BTreeMap::new();
    for &k in which {
        let mut train = Vec::new();
        let mut test = Vec::new();
        for (p, f) in data.pairs.iter().zip(&fold_sets) {
            let Some(row) = sample_row(data, p) else { continue };
            if f.contains(&k) {
                test.push((p, row));
            } else {
                train.push((p.gpu.clone(), row, p.normalized));
            }
        }
        let model = SpeedPredictor::fit(&train, &cfg.model)?;
        let mlp = cfg.mlp.as_ref().map(|c| SpeedPredictor::train(&train, c)).transpose()?;
        let mut knn_rows: BTreeMap<&str, (Vec<[f64; INPUT_WIDTH]>, Vec<f64>)> = BTreeMap::new();
        for (gpu, row, y) in &train {
            let e = knn_rows.entry(gpu).or_default();
            e.0.push(*row);
            e.1.push(*y);
        }
        let knn: BTreeMap<&str, _> =
            knn_rows.iter().map(|(g, (r, y))| (*g, knn_baseline(r, y, cfg.knn_k))).collect();
        let mut gpu_mean: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
        let mut job_mean: BTreeMap<(&str, &str), (f64, usize)> = BTreeMap::new();
        for (gpu, _, y) in &train {
            let e = gpu_mean.entry(gpu).or_default();
            e.0 += y;
            e.1 += 1;
        }
        for (p, f) in data.pairs.iter().zip(&fold_sets) {
            if !f.contains(&k) {
                let e = job_mean.entry((&p.gpu, &p.offline)).or_default();
                e.0 += p.normalized;
                e.1 += 1;
            }
        }
        for (p, row) in test {
            let r = reports.entry(p.gpu.clone()).or_insert_with(|| GpuReport {
                gpu: p.gpu.clone(),
                ..Default::default()
            });
            let (s, n) = gpu_mean.get(p.gpu.as_str()).copied().unwrap_or((0.0, 0));
            let mean = if n > 0 { s / n as f64 } else { 1.0 };
            let jm = job_mean
                .get(&(p.gpu.as_str(), p.offline.as_str()))
                .map_or(mean, |(s, n)| s / *n as f64);
            let pred = model.models[&p.gpu].predict(&row);
            r.test_samples += 1;
            r.mape_model += ape(pred, p.normalized);
            if let Some(m) = &mlp {
                *r.mape_mlp.get_or_insert(0.0) += ape(m.models[&p.gpu].predict(&row), p.normalized);
            }
            r.mape_knn += knn.get(p.gpu.as_str()).map_or(100.0, |f| ape(f(&row), p.normalized));
            r.mape_mean += ape(mean, p.normalized);
            r.mape_job_mean += ape(jm, p.normalized);
        }
        for (gpu, (_, n)) in gpu_mean {
            if let Some(r) = reports.get_mut(gpu) {
                r.train_samples += n;
            }
        }
    }
    let mut out: Vec<GpuReport> = reports.into_values().collect();
    for r in &mut out {
        let n = r.test_samples.max(1) as f64;
        r.mape_model /= n;
        r.mape_knn /= n;
        if let Some(m) = &mut r.mape_mlp {
            *m /= n;
        }
        r.mape_mean /= n;
        r.mape_job_mean /= n;
        r.train_samples /= which.len().max(1);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predictor::gavel;

    fn data() -> Option<GavelData> {
        let p = gavel::data_dir().join("gavel/simulation_throughputs.json");
        p.exists().then(|| gavel::load(&p).unwrap())
    }

    #[test]
    fn folds_never_leak_a_pair_or_job_into_training() {
        let Some(d) = data() else { return };
        let jf = job_folds(&d, 5, 1);
        for split in [Split::ByPair, Split::ByJob, Split::ByFamily] {
            let f = assign_folds(&d, split, 5, 1);
            for k in 0..5 {
                let (test, train): (Vec<_>, Vec<_>) =
                    d.pairs.iter().zip(&f).partition(|(_, f)| f.contains(&k));
                assert!(!test.is_empty() && !train.is_empty());
                match split {
                    Split::ByPair => {
                        let held: BTreeSet<_> = test.iter().map(|(p, _)| pair_key(p)).collect();
                        assert!(train.iter().all(|(p, _)| !held.contains(&pair_key(p))));
                    }
                    Split::ByJob => {
                        assert!(train.iter().all(|(p, _)| jf[&p.offline] != k && jf[&p.online] != k));
                        assert!(test.iter().all(|(p, _)| jf[&p.offline] == k || jf[&p.online] == k));
                    }
                    Split::ByFamily => {
                        let held: BTreeSet<_> = test.iter().flat_map(|(p, _)| [family(&p.offline), family(&p.online)]).collect();
                        let seen: BTreeSet<_> = train.iter().flat_map(|(p, _)| [family(&p.offline), family(&p.online)]).collect();
                        assert!(held.iter().any(|f| !seen.contains(f)), "fold {k} holds out no family");
                        let ff = family_folds(&d, 5);
                        assert!(train.iter().all(|(p, _)| ff[&p.offline] != k && ff[&p.online] != k));
                    }
                }
            }
        }
    }
}
