//! The speed predictor on real Gavel co-location data: held-out error against baselines.

use cluster_matcher::predictor::eval::{cross_validate_folds, Split};
use cluster_matcher::predictor::gavel::{self, GavelData};
use cluster_matcher::predictor::TrainConfig;

fn v100_data() -> Option<GavelData> {
    let p = gavel::data_dir().join("gavel/simulation_throughputs.json");
    if !p.exists() {
        eprintln!("skipping: no Gavel data at {} (set XSHARE_DATA_DIR)", p.display());
        return None;
    }
    let mut d = gavel::load(&p).unwrap();
    d.pairs.retain(|p| p.gpu == "v100");
    Some(d)
}

/// On pairs never seen in training, the MLP beats predicting the mean pair value. (One fold
/// of one GPU type with a short schedule, to stay quick in debug builds; `cluster-matcher
/// evaluate` runs the full cross-validation.)
#[test]
fn mlp_beats_the_mean_baseline_on_held_out_pairs() {
    let Some(d) = v100_data() else { return };
    let cfg = TrainConfig { epochs: 250, ..TrainConfig::default() };
    let r = cross_validate_folds(&d, Split::ByPair, 5, &[0], &cfg).unwrap();
    assert_eq!(r.len(), 1);
    let r = &r[0];
    eprintln!("{r:?}");
    assert!(r.test_samples > 50 && r.train_samples > 300, "{r:?}");
    assert!(r.mape_mlp < r.mape_mean, "MLP {:.1}% vs mean baseline {:.1}%", r.mape_mlp, r.mape_mean);
}
