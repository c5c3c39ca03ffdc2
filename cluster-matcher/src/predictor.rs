//! Speed predictor: normalized throughput of an offline job next to an online one, per GPU type.

pub mod eval;
pub mod features;
pub mod gavel;
pub mod mlp;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use features::{pair_input, JobProfile, INPUT_WIDTH};
pub use mlp::{GpuModel, TrainConfig};

/// Errors from loading data, training, or reading and writing model files.
#[derive(Debug, thiserror::Error)]
pub enum PredictorError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: bad training data: {why}")]
    Data { path: PathBuf, why: String },
    #[error("model file {path}: {why}")]
    ModelFile { path: PathBuf, why: String },
    #[error("training failed: {0}")]
    Training(String),
    #[error("no model for GPU type `{0}`")]
    UnknownGpu(String),
}

/// Magic string at the top of every model file.
pub const FORMAT_NAME: &str = "xshare-speed-predictor";
/// Model file format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// One MLP per GPU type.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpeedPredictor {
    pub models: BTreeMap<String, GpuModel>,
}

#[derive(Serialize, Deserialize)]
struct ModelFile {
    format: String,
    version: u32,
    input_width: usize,
    /// FNV-1a 64 over every number in `models`, in order, as hex.
    checksum: String,
    models: BTreeMap<String, GpuModel>,
}

fn checksum(models: &BTreeMap<String, GpuModel>) -> String {
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

impl SpeedPredictor {
    /// Trains one network per GPU type present in `samples` (`(gpu, input, target)`).
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
            models.insert(gpu.to_string(), mlp::train(&rows, &ys, cfg)?);
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
        let parsed: BTreeMap<String, GpuModel> = serde_json::from_str(&serde_json::to_string(&self.models)?)?;
        let file = ModelFile {
            format: FORMAT_NAME.into(),
            version: FORMAT_VERSION,
            input_width: INPUT_WIDTH,
            checksum: checksum(&parsed),
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
        match head.get("version").and_then(|v| v.as_u64()) {
            Some(v) if v == u64::from(FORMAT_VERSION) => {}
            Some(v) => {
                return Err(format!(
                    "format version {v} is not supported (this build reads version {FORMAT_VERSION})"
                ))
            }
            None => return Err("field `version` missing".into()),
        }
        let file: ModelFile =
            serde_json::from_value(head).map_err(|e| format!("malformed model file: {e}"))?;
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
        let sum = checksum(&file.models);
        if sum != file.checksum {
            return Err(format!(
                "checksum mismatch (file says {}, weights give {sum}): the file was altered or damaged",
                file.checksum
            ));
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
                ("v100".to_string(), r, 0.5)
            })
            .collect();
        SpeedPredictor::train(&samples, &TrainConfig { epochs: 3, ..Default::default() }).unwrap()
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
        let e = SpeedPredictor::from_json(&text.replace("\"version\":1", "\"version\":9")).unwrap_err();
        assert!(e.contains("version 9 is not supported"), "{e}");
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["models"]["v100"]["layers"][0]["b"][0] = serde_json::json!(0.123);
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
