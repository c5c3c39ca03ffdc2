//! Speed predictor: normalized throughput of an offline job next to an online one, per GPU type.

pub mod eval;
pub mod features;
pub mod gavel;
pub mod mlp;
pub mod neighbours;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use features::{pair_input, JobProfile, INPUT_WIDTH};
pub use mlp::{GpuModel, TrainConfig};
pub use neighbours::{NeighbourConfig, NeighbourModel};

/// Errors from loading data, training, or reading and writing model files.
#[derive(Debug, thiserror::Error)]
pub enum PredictorError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Training data (the Gavel files) is missing or malformed.
    #[error("{path}: bad training data: {why}")]
    Data {
        /// The data file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// A saved model file cannot be used.
    #[error("model file {path}: {why}")]
    ModelFile {
        /// The model file.
        path: PathBuf,
        /// What is wrong with it (parse error, wrong shape, non-finite value).
        why: String,
    },
    /// Training refused its inputs or settings, or the tensor library failed (message given).
    #[error("training failed: {0}")]
    Training(String),
    /// No model was trained or loaded for this GPU type.
    #[error("no model for GPU type `{0}`")]
    UnknownGpu(String),
}

/// Magic string at the top of every model file.
pub const FORMAT_NAME: &str = "xshare-speed-predictor";
/// Model file format version this build writes (version 2: a model kind per GPU type).
pub const FORMAT_VERSION: u32 = 2;
/// Oldest model file version this build still reads (version 1: MLPs only).
pub const OLDEST_FORMAT_VERSION: u32 = 1;

/// One GPU type's model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuTypeModel {
    /// MuxFlow's MLP (see [`mlp`]); shipped until the job-effect model beat it.
    Mlp(GpuModel),
    /// Job effects plus nearest neighbours (see [`neighbours`]); the shipped kind.
    Neighbours(NeighbourModel),
}

impl From<GpuModel> for GpuTypeModel {
    fn from(m: GpuModel) -> Self {
        GpuTypeModel::Mlp(m)
    }
}

impl From<NeighbourModel> for GpuTypeModel {
    fn from(m: NeighbourModel) -> Self {
        GpuTypeModel::Neighbours(m)
    }
}

impl GpuTypeModel {
    /// Predicted normalized throughput for one input row, in `[0, mlp::MAX_PREDICTION]`.
    pub fn predict(&self, row: &[f64; INPUT_WIDTH]) -> f64 {
        match self {
            GpuTypeModel::Mlp(m) => m.predict(row),
            GpuTypeModel::Neighbours(m) => m.predict(row),
        }
    }

    /// Whether the SM-fraction input can move the output at all.
    pub fn uses_sm_input(&self) -> bool {
        match self {
            GpuTypeModel::Mlp(m) => m.uses_sm_input(),
            GpuTypeModel::Neighbours(m) => m.uses_sm_input(),
        }
    }

    /// Checks shapes and values; `what` names the model in the error.
    pub fn validate(&self, what: &str) -> Result<(), String> {
        match self {
            GpuTypeModel::Mlp(m) => m.validate(what),
            GpuTypeModel::Neighbours(m) => m.validate(what),
        }
    }
}

/// One model per GPU type.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpeedPredictor {
    /// GPU type (`k80`, `p100`, `v100`) to its model.
    pub models: BTreeMap<String, GpuTypeModel>,
}

#[derive(Serialize, Deserialize)]
struct ModelFile<M> {
    format: String,
    version: u32,
    input_width: usize,
    /// Version 1: FNV-1a 64 over every number in `models`, in order; version 2: FNV-1a 64 of
    /// the compact JSON of `models` as parsed back. Hex.
    checksum: String,
    models: BTreeMap<String, M>,
}

fn fnv_hex(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Version-2 checksum of parsed models.
fn checksum_v2(models: &BTreeMap<String, GpuTypeModel>) -> Result<String, serde_json::Error> {
    Ok(fnv_hex(serde_json::to_string(models)?.as_bytes()))
}

/// Version-1 checksum (MLP weights only).
fn checksum_v1(models: &BTreeMap<String, GpuModel>) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for (gpu, m) in models {
        eat(gpu.as_bytes());
        for v in m.mean.iter().chain(&m.std) {
            eat(&v.to_le_bytes());
        }
        for l in &m.layers {
            for v in l.w.iter().flatten().chain(&l.b) {
                eat(&v.to_le_bytes());
            }
        }
    }
    format!("{h:016x}")
}

/// Samples grouped per GPU type: `(rows, targets)`.
type ByGpu<'a> = BTreeMap<&'a str, (Vec<[f64; INPUT_WIDTH]>, Vec<f64>)>;

fn by_gpu(samples: &[(String, [f64; INPUT_WIDTH], f64)]) -> ByGpu<'_> {
    let mut by: ByGpu = BTreeMap::new();
    for (gpu, row, y) in samples {
        let e = by.entry(gpu).or_default();
        e.0.push(*row);
        e.1.push(*y);
    }
    by
}

impl SpeedPredictor {
    /// Fits the shipped kind of model ([`NeighbourModel`]) per GPU type present in `samples`
    /// (`(gpu, input, target)`). Deterministic: no random state.
    pub fn fit(samples: &[(String, [f64; INPUT_WIDTH], f64)], cfg: &NeighbourConfig) -> Result<Self, PredictorError> {
        let mut models = BTreeMap::new();
        for (gpu, (rows, ys)) in by_gpu(samples) {
            tracing::info!(gpu, samples = rows.len(), "fitting speed predictor (job effects + neighbours)");
            models.insert(gpu.to_string(), NeighbourModel::fit(&rows, &ys, cfg)?.into());
        }
        Ok(Self { models })
    }

    /// Trains one MLP (MuxFlow's model) per GPU type present in `samples` (`(gpu, input, target)`).
    pub fn train(
        samples: &[(String, [f64; INPUT_WIDTH], f64)],
        cfg: &TrainConfig,
    ) -> Result<Self, PredictorError> {
        let mut by_gpu: BTreeMap<&str, (Vec<[f64; INPUT_WIDTH]>, Vec<f64>)> = BTreeMap::new();
        for (gpu, row, y) in samples {
            let e = by_gpu.entry(gpu).or_default();
            e.0.push(*row);
            e.1.push(*y);
        }
        let mut models = BTreeMap::new();
        for (gpu, (rows, ys)) in by_gpu {
            tracing::info!(gpu, samples = rows.len(), epochs = cfg.epochs, "training speed predictor");
            models.insert(gpu.to_string(), mlp::train(&rows, &ys, cfg)?.into());
        }
        Ok(Self { models })
    }

    /// GPU types this predictor has a model for.
    pub fn gpu_types(&self) -> impl Iterator<Item = &str> {
        self.models.keys().map(String::as_str)
    }

    /// Predicted normalized throughput of `offline` next to `online` on `gpu` with the offline
    /// job capped at `sm_percent` of the SMs. `Ok(None)` when a job lacks a profile on `gpu`.
    pub fn predict(
        &self,
        gpu: &str,
        offline: &JobProfile,
        online: &JobProfile,
        sm_percent: f64,
    ) -> Result<Option<f64>, PredictorError> {
        let model = self
            .models
            .get(gpu)
            .ok_or_else(|| PredictorError::UnknownGpu(gpu.to_string()))?;
        Ok(pair_input(offline, online, gpu, sm_percent).map(|row| model.predict(&row)))
    }

    /// Model-file text (JSON with format name, version and checksum).
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        // The checksum covers the weights as a reader will parse them: JSON float parsing
        // may land one ulp away from the value written, so hash the parsed-back models.
        let parsed: BTreeMap<String, GpuTypeModel> = serde_json::from_str(&serde_json::to_string(&self.models)?)?;
        let file = ModelFile {
            format: FORMAT_NAME.into(),
            version: FORMAT_VERSION,
            input_width: INPUT_WIDTH,
            checksum: checksum_v2(&parsed)?,
            models: self.models.clone(),
        };
        serde_json::to_string(&file)
    }

    /// Writes the model file (see [`Self::to_json`]) through a temporary file and rename.
    pub fn save(&self, path: &Path) -> Result<(), PredictorError> {
        let text = self.to_json().map_err(|e| PredictorError::ModelFile {
            path: path.to_path_buf(),
            why: e.to_string(),
        })?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| PredictorError::Io {
                path: path.to_path_buf(),
                source: e,
            })
    }

    /// Reads a model file; any damage (truncation, wrong version, altered weights, bad
    /// shapes) is an error naming the file and what is wrong.
    pub fn load(path: &Path) -> Result<Self, PredictorError> {
        let text = std::fs::read_to_string(path).map_err(|e| PredictorError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        Self::from_json(&text).map_err(|why| PredictorError::ModelFile {
            path: path.to_path_buf(),
            why,
        })
    }

    /// Parses and checks model-file text.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let head: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not a model file (JSON error: {e})"))?;
        if head.get("format").and_then(|v| v.as_str()) != Some(FORMAT_NAME) {
            return Err(format!("not a model file (field `format` is not \"{FORMAT_NAME}\")"));
        }
        let version = match head.get("version").and_then(|v| v.as_u64()) {
            Some(v) if (u64::from(OLDEST_FORMAT_VERSION)..=u64::from(FORMAT_VERSION)).contains(&v) => v,
            Some(v) => {
                return Err(format!(
                    "format version {v} is not supported (this build reads versions {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION})"
                ))
            }
            None => return Err("field `version` missing".into()),
        };
        let file: ModelFile<GpuTypeModel> = if version == 1 {
            let v1: ModelFile<GpuModel> =
                serde_json::from_value(head).map_err(|e| format!("malformed model file: {e}"))?;
            let sum = checksum_v1(&v1.models);
            if sum != v1.checksum {
                return Err(format!(
                    "checksum mismatch (file says {}, weights give {sum}): the file was altered or damaged",
                    v1.checksum
                ));
            }
            ModelFile {
                format: v1.format,
                version: 1,
                input_width: v1.input_width,
                checksum: sum,
                models: v1.models.into_iter().map(|(k, m)| (k, m.into())).collect(),
            }
        } else {
            let f: ModelFile<GpuTypeModel> =
                serde_json::from_value(head).map_err(|e| format!("malformed model file: {e}"))?;
            let sum = checksum_v2(&f.models).map_err(|e| format!("malformed model file: {e}"))?;
            if sum != f.checksum {
                return Err(format!(
                    "checksum mismatch (file says {}, models give {sum}): the file was altered or damaged",
                    f.checksum
                ));
            }
            f
        };
        if file.input_width != INPUT_WIDTH {
            return Err(format!(
                "input width {} does not match this build's {INPUT_WIDTH}",
                file.input_width
            ));
        }
        if file.models.is_empty() {
            return Err("holds no GPU models".into());
        }
        for (gpu, m) in &file.models {
            m.validate(&format!("GPU `{gpu}`"))?;
        }
        Ok(Self { models: file.models })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> SpeedPredictor {
        let mut rng = mlp::SplitMix(1);
        let samples: Vec<_> = (0..30)
            .map(|_| {
                let mut r = [0.0; INPUT_WIDTH];
                r.iter_mut().for_each(|v| *v = rng.unit());
                let y = 0.2 + 0.5 * r[0];
                ("v100".to_string(), r, y)
            })
            .collect();
        SpeedPredictor::fit(&samples, &NeighbourConfig::default()).unwrap()
    }

    fn tiny_mlp() -> BTreeMap<String, GpuModel> {
        let samples: Vec<_> = (0..10).map(|i| ("v100".to_string(), [f64::from(i) / 10.0; INPUT_WIDTH], 0.5)).collect();
        let m = SpeedPredictor::train(&samples, &TrainConfig { epochs: 3, ..Default::default() }).unwrap();
        m.models
            .into_iter()
            .map(|(k, v)| match v {
                GpuTypeModel::Mlp(m) => (k, m),
                GpuTypeModel::Neighbours(_) => unreachable!(),
            })
            .collect()
    }

    #[test]
    fn version_1_mlp_files_still_load() {
        let models = tiny_mlp();
        let v1 = ModelFile {
            format: FORMAT_NAME.into(),
            version: 1,
            input_width: INPUT_WIDTH,
            checksum: checksum_v1(&serde_json::from_str(&serde_json::to_string(&models).unwrap()).unwrap()),
            models: models.clone(),
        };
        let text = serde_json::to_string(&v1).unwrap();
        let back = SpeedPredictor::from_json(&text).unwrap();
        let row = [0.4; INPUT_WIDTH];
        assert!((back.models["v100"].predict(&row) - models["v100"].predict(&row)).abs() < 1e-6);
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["models"]["v100"]["layers"][0]["b"][0] = serde_json::json!(0.123);
        assert!(SpeedPredictor::from_json(&v.to_string()).unwrap_err().contains("checksum mismatch"));
    }

    #[test]
    fn save_load_round_trip() {
        let dir = std::env::temp_dir().join(format!("xshare-pred-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.json");
        let m = tiny();
        m.save(&p).unwrap();
        let back = SpeedPredictor::load(&p).unwrap();
        // Equal up to JSON float parsing (at most an ulp); predictions agree.
        let row = [0.3; INPUT_WIDTH];
        assert!((back.models["v100"].predict(&row) - m.models["v100"].predict(&row)).abs() < 1e-6);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn damaged_files_give_clear_errors() {
        let text = tiny().to_json().unwrap();
        assert!(SpeedPredictor::from_json(&text).is_ok());
        let e = SpeedPredictor::from_json(&text[..text.len() / 2]).unwrap_err();
        assert!(e.contains("JSON error"), "{e}");
        let e = SpeedPredictor::from_json(&text.replace("\"version\":2", "\"version\":9")).unwrap_err();
        assert!(e.contains("version 9 is not supported"), "{e}");
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["models"]["v100"]["neighbours"]["points"][0]["residual"] = serde_json::json!(0.123);
        let e = SpeedPredictor::from_json(&v.to_string()).unwrap_err();
        assert!(e.contains("checksum mismatch"), "{e}");
        let e = SpeedPredictor::from_json(r#"{"format":"other"}"#).unwrap_err();
        assert!(e.contains("field `format`"), "{e}");
    }

    #[test]
    fn unknown_gpu_is_an_error() {
        let m = tiny();
        let p = JobProfile::default();
        assert!(matches!(m.predict("t4", &p, &p, 50.0), Err(PredictorError::UnknownGpu(_))));
    }
}
