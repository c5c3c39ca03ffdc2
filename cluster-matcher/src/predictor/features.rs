//! Input features of the speed predictor, computed only from each job's isolated profile.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What the workload profiler measured for one job running alone. No pair value appears here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobProfile {
    /// Job name, for messages only; never a feature.
    #[serde(default)]
    pub name: String,
    /// Mini-batch size, when the job has one.
    #[serde(default)]
    pub batch_size: Option<u32>,
    /// Isolated steps per second on one GPU, per GPU type (`k80`, `p100`, `v100`, ...).
    pub isolated: BTreeMap<String, f64>,
    /// Isolated steps per second on two GPUs of a type, when profiled.
    #[serde(default)]
    pub isolated_2gpu: BTreeMap<String, f64>,
}

/// Number of features per job.
pub const JOB_FEATURES: usize = 6;
/// Width of one predictor input: offline job, online job, assigned SM fraction.
pub const INPUT_WIDTH: usize = 2 * JOB_FEATURES + 1;
/// Index of the SM-fraction input.
pub const SM_INPUT: usize = 2 * JOB_FEATURES;

fn ratio_feature(num: Option<&f64>, den: Option<&f64>) -> (f64, f64) {
    match (num, den) {
        (Some(&a), Some(&b)) if a > 0.0 && b > 0.0 => ((a / b).ln(), 1.0),
        _ => (0.0, 0.0),
    }
}

impl JobProfile {
    /// Per-job features on `gpu`: log isolated speed, log batch size, log V100/K80 speed-up
    /// (how compute-bound the job is) and 2-GPU scaling efficiency, each with a presence flag
    /// where it can be missing. `None` when the job was never profiled on `gpu`.
    pub fn features(&self, gpu: &str) -> Option<[f64; JOB_FEATURES]> {
        let iso = *self.isolated.get(gpu).filter(|v| **v > 0.0)?;
        let batch = self.batch_size.map_or(0.0, |b| f64::from(b.max(1)).ln());
        let (speedup, has_speedup) =
            ratio_feature(self.isolated.get("v100"), self.isolated.get("k80"));
        let (scaling, has_scaling) = match self.isolated_2gpu.get(gpu) {
            Some(&two) if two > 0.0 => (two / (2.0 * iso), 1.0),
            _ => (0.0, 0.0),
        };
        Some([iso.ln(), batch, speedup, has_speedup, scaling, has_scaling])
    }
}

/// One predictor input row: `[offline features, online features, sm_percent / 100]`.
pub fn pair_input(
    offline: &JobProfile,
    online: &JobProfile,
    gpu: &str,
    sm_percent: f64,
) -> Option<[f64; INPUT_WIDTH]> {
    let a = offline.features(gpu)?;
    let b = online.features(gpu)?;
    let mut row = [0.0; INPUT_WIDTH];
    row[..JOB_FEATURES].copy_from_slice(&a);
    row[JOB_FEATURES..SM_INPUT].copy_from_slice(&b);
    row[SM_INPUT] = sm_percent.clamp(0.0, 100.0) / 100.0;
    Some(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> JobProfile {
        JobProfile {
            name: "x".into(),
            batch_size: Some(64),
            isolated: [("k80".to_string(), 2.0), ("v100".to_string(), 8.0)].into(),
            isolated_2gpu: [("v100".to_string(), 12.0)].into(),
        }
    }

    #[test]
    fn features_come_from_the_profile() {
        let f = profile().features("v100").unwrap();
        assert!((f[0] - 8f64.ln()).abs() < 1e-12);
        assert!((f[1] - 64f64.ln()).abs() < 1e-12);
        assert!((f[2] - 4f64.ln()).abs() < 1e-12);
        assert_eq!(f[3], 1.0);
        assert!((f[4] - 0.75).abs() < 1e-12);
        assert_eq!(f[5], 1.0);
        let k = profile().features("k80").unwrap();
        assert_eq!((k[4], k[5]), (0.0, 0.0));
        assert!(profile().features("t4").is_none());
    }

    #[test]
    fn pair_input_layout() {
        let row = pair_input(&profile(), &profile(), "v100", 250.0).unwrap();
        assert_eq!(row[SM_INPUT], 1.0);
        assert_eq!(row[..JOB_FEATURES], row[JOB_FEATURES..SM_INPUT]);
    }
}
