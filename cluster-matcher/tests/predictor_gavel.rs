//! The speed predictor on real Gavel co-location data: held-out error against baselines.

use std::path::Path;

use cluster_matcher::predictor::eval::{cross_validate, cross_validate_folds, sample_row, EvalConfig, Split};
use cluster_matcher::predictor::gavel::{self, GavelData};
use cluster_matcher::predictor::{GpuTypeModel, SpeedPredictor, TrainConfig};

fn data() -> Option<GavelData> {
    let p = gavel::data_dir().join("gavel/simulation_throughputs.json");
    if !p.exists() {
        eprintln!("skipping: no Gavel data at {} (set XSHARE_DATA_DIR)", p.display());
        return None;
    }
    Some(gavel::load(&p).unwrap())
}

fn shipped() -> SpeedPredictor {
    SpeedPredictor::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/speed-predictor.json")).unwrap()
}

/// The shipped model's hyper-parameters (every GPU type's model is fitted with the same).
fn shipped_config() -> EvalConfig {
    let m = shipped();
    let GpuTypeModel::Neighbours(n) = &m.models["v100"] else {
        panic!("the shipped model is not the job-effect + neighbours kind")
    };
    EvalConfig { model: n.config, mlp: None, ..EvalConfig::default() }
}

/// The shipped predictor, refitted per fold with its own hyper-parameters, is at least as good
/// as every simple baseline (3-nearest neighbours, mean pair value, offline job's mean) on
/// every split and GPU type. The folds are the ones `cluster-matcher evaluate` uses (pair and
/// job: 5 seeded folds; family: one per family); fitting needs no training loop, so the whole
/// cross-validation runs in seconds even in debug builds.
#[test]
fn shipped_predictor_is_at_least_as_good_as_every_simple_baseline() {
    let Some(d) = data() else { return };
    let cfg = shipped_config();
    let families = d.profiles.keys().map(|j| cluster_matcher::predictor::eval::family(j)).collect::<std::collections::BTreeSet<_>>().len();
    for (split, folds) in [(Split::ByPair, 5), (Split::ByJob, 5), (Split::ByFamily, families)] {
        let reports = cross_validate(&d, split, folds, &cfg).unwrap();
        assert_eq!(reports.len(), 3, "{split:?}");
        for r in &reports {
            eprintln!(
                "{split:?} {}: model {:.2} 3-NN {:.2} mean {:.2} job-mean {:.2}",
                r.gpu, r.mape_model, r.mape_knn, r.mape_mean, r.mape_job_mean
            );
            let best = r.mape_knn.min(r.mape_mean).min(r.mape_job_mean);
            assert!(r.mape_model <= best, "{split:?} {}: model {:.2}% worse than the best baseline {best:.2}%", r.gpu, r.mape_model);
        }
    }
}

/// The shipped file is exactly what `cluster-matcher train` fits on all of Gavel's pairs
/// (deterministic), so the evaluation above speaks for it.
#[test]
fn shipped_file_is_the_fit_on_all_pairs() {
    let Some(d) = data() else { return };
    let m = shipped();
    let GpuTypeModel::Neighbours(n) = &m.models["v100"] else { panic!("not the neighbours kind") };
    let samples: Vec<_> =
        d.pairs.iter().filter_map(|p| sample_row(&d, p).map(|r| (p.gpu.clone(), r, p.normalized))).collect();
    let refit = SpeedPredictor::fit(&samples, &n.config).unwrap();
    assert_eq!(refit.models.keys().collect::<Vec<_>>(), m.models.keys().collect::<Vec<_>>());
    for (gpu, row, _) in &samples {
        let (a, b) = (refit.models[gpu].predict(row), m.models[gpu].predict(row));
        assert!((a - b).abs() < 1e-9, "{gpu}: refit {a} vs shipped {b}");
    }
}

/// On pairs never seen in training, MuxFlow's MLP (kept as a baseline) beats predicting the
/// mean pair value. (One fold of V100 with a short schedule, to stay quick in debug builds;
/// `cluster-matcher evaluate` runs the full cross-validation.)
#[test]
fn mlp_beats_the_mean_baseline_on_held_out_pairs() {
    let Some(mut d) = data() else { return };
    d.pairs.retain(|p| p.gpu == "v100");
    let cfg = EvalConfig { mlp: Some(TrainConfig { epochs: 250, ..TrainConfig::default() }), ..EvalConfig::default() };
    let r = cross_validate_folds(&d, Split::ByPair, 5, &[0], &cfg).unwrap();
    assert_eq!(r.len(), 1);
    let r = &r[0];
    eprintln!("{r:?}");
    assert!(r.test_samples > 50 && r.train_samples > 300, "{r:?}");
    let mlp = r.mape_mlp.unwrap();
    assert!(mlp < r.mape_mean, "MLP {mlp:.1}% vs mean baseline {:.1}%", r.mape_mean);
}
