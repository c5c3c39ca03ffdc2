//! Loader for Gavel's measured co-location throughputs: isolated job profiles and pair samples.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::features::JobProfile;
use super::PredictorError;

/// GPU types with scale-1 pair measurements in the Gavel files.
pub const GAVEL_GPU_TYPES: [&str; 3] = ["k80", "p100", "v100"];

/// One measured pair on one GPU type: `offline` ran next to `online`.
#[derive(Debug, Clone, PartialEq)]
pub struct PairSample {
    /// GPU type the pair was measured on (one of [`GAVEL_GPU_TYPES`]).
    pub gpu: String,
    /// Job whose throughput was measured.
    pub offline: String,
    /// Job that ran beside it.
    pub online: String,
    /// Offline job's throughput next to `online` divided by its isolated throughput.
    pub normalized: f64,
}

/// Profiles of every scale-1 job plus all measured pairs.
#[derive(Debug, Clone)]
pub struct GavelData {
    /// Job name (e.g. `ResNet-50 (batch size 64)`) to its isolated profile.
    pub profiles: BTreeMap<String, JobProfile>,
    /// Pairs that could share the GPU (value not `[0, 0]`).
    pub pairs: Vec<PairSample>,
    /// Pairs measured as `[0, 0]`: could not share (memory); excluded from regression.
    pub infeasible: Vec<(String, String, String)>,
}

/// Directory holding the shared data: `$XSHARE_DATA_DIR`, else `../shared/data` from the
/// workspace root, else `/work/shared/data`.
pub fn data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XSHARE_DATA_DIR") {
        return PathBuf::from(d);
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let rel = workspace.join("../shared/data");
    if rel.is_dir() {
        return rel;
    }
    PathBuf::from("/work/shared/data")
}

/// Splits a Gavel key `('Model (batch size N)', scale)` into `(name, scale)`.
pub fn parse_job_key(key: &str) -> Option<(String, u32)> {
    let inner = key.strip_prefix("('")?.strip_suffix(')')?;
    let (name, scale) = inner.rsplit_once("', ")?;
    Some((name.to_string(), scale.trim().parse().ok()?))
}

/// Batch size from a job name such as `LM (batch size 20)`; `None` for `A3C`, `CycleGAN`.
pub fn batch_size(name: &str) -> Option<u32> {
    let start = name.find("(batch size ")? + "(batch size ".len();
    name[start..].trim_end_matches(')').parse().ok()
}

/// Reads a Gavel throughput file (`simulation_throughputs.json` layout).
pub fn load(path: &Path) -> Result<GavelData, PredictorError> {
    let text = std::fs::read_to_string(path).map_err(|e| PredictorError::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    parse(&text).map_err(|why| PredictorError::Data {
        path: path.to_path_buf(),
        why,
    })
}

/// Parses the Gavel JSON text; errors name the GPU type and job key at fault.
pub fn parse(text: &str) -> Result<GavelData, String> {
    let root: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let root = root.as_object().ok_or("top level is not an object")?;

    let mut profiles: BTreeMap<String, JobProfile> = BTreeMap::new();
    for gpu in GAVEL_GPU_TYPES {
        let Some(jobs) = root.get(gpu).and_then(|v| v.as_object()) else {
            return Err(format!("GPU type `{gpu}` missing"));
        };
        for (key, entry) in jobs {
            let (name, scale) =
                parse_job_key(key).ok_or_else(|| format!("{gpu}: bad job key `{key}`"))?;
            let tput = entry
                .get("null")
                .and_then(|v| v.as_f64())
                .filter(|v| *v >= 0.0)
                .ok_or_else(|| format!("{gpu}/{key}: missing or negative `null`"))?;
            if tput == 0.0 {
                // Gavel writes 0 when the job could not run there (memory): not profiled.
                continue;
            }
            let p = profiles.entry(name.clone()).or_insert_with(|| JobProfile {
                name: name.clone(),
                batch_size: batch_size(&name),
                ..JobProfile::default()
            });
            match scale {
                1 => {
                    p.isolated.insert(gpu.to_string(), tput);
                }
                2 => {
                    p.isolated_2gpu.insert(gpu.to_string(), tput);
                }
                _ => {}
            }
        }
    }
    profiles.retain(|_, p| !p.isolated.is_empty());

    let mut pairs = Vec::new();
    let mut infeasible = Vec::new();
    for gpu in GAVEL_GPU_TYPES {
        let jobs = root[gpu].as_object().expect("checked above");
        for (key, entry) in jobs {
            let Some((off, 1)) = parse_job_key(key) else { continue };
            let Some(&iso) = profiles.get(&off).and_then(|p| p.isolated.get(gpu)) else {
                continue;
            };
            let obj = entry.as_object().ok_or_else(|| format!("{gpu}/{key}: not an object"))?;
            for (other_key, v) in obj {
                if other_key == "null" {
                    continue;
                }
                let Some((on, 1)) = parse_job_key(other_key) else { continue };
                if !profiles.get(&on).is_some_and(|p| p.isolated.contains_key(gpu)) {
                    continue;
                }
                let arr = v
                    .as_array()
                    .filter(|a| a.len() == 2)
                    .ok_or_else(|| format!("{gpu}/{key}/{other_key}: expected [a, b]"))?;
                let mine = arr[0]
                    .as_f64()
                    .ok_or_else(|| format!("{gpu}/{key}/{other_key}: not a number"))?;
                let theirs = arr[1].as_f64().unwrap_or(0.0);
                if mine <= 0.0 && theirs <= 0.0 {
                    infeasible.push((gpu.to_string(), off.clone(), on));
                    continue;
                }
                pairs.push(PairSample {
                    gpu: gpu.to_string(),
                    offline: off.clone(),
                    online: on,
                    normalized: mine / iso,
                });
            }
        }
    }
    Ok(GavelData {
        profiles,
        pairs,
        infeasible,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_keys_and_batch_sizes() {
        assert_eq!(
            parse_job_key("('ResNet-18 (batch size 16)', 1)"),
            Some(("ResNet-18 (batch size 16)".into(), 1))
        );
        assert_eq!(parse_job_key("('A3C', 4)"), Some(("A3C".into(), 4)));
        assert_eq!(parse_job_key("null"), None);
        assert_eq!(batch_size("LM (batch size 20)"), Some(20));
        assert_eq!(batch_size("CycleGAN"), None);
    }

    #[test]
    fn pair_value_becomes_normalized_and_zero_pairs_are_infeasible() {
        let mut root = serde_json::Map::new();
        for gpu in GAVEL_GPU_TYPES {
            root.insert(
                gpu.into(),
                serde_json::json!({
                    "('A (batch size 8)', 1)": {"null": 10.0,
                        "('B', 1)": [4.0, 1.0], "('A (batch size 8)', 1)": [0.0, 0.0]},
                    "('B', 1)": {"null": 2.0, "('A (batch size 8)', 1)": [1.0, 4.0]},
                    "('A (batch size 8)', 2)": {"null": 15.0}
                }),
            );
        }
        let d = parse(&serde_json::Value::Object(root).to_string()).unwrap();
        assert_eq!(d.profiles.len(), 2);
        assert_eq!(d.profiles["A (batch size 8)"].isolated_2gpu["v100"], 15.0);
        let ab = d
            .pairs
            .iter()
            .find(|p| p.gpu == "k80" && p.offline.starts_with('A'))
            .unwrap();
        assert!((ab.normalized - 0.4).abs() < 1e-12);
        assert_eq!(d.infeasible.len(), 3);
        assert_eq!(d.pairs.len(), 6);
    }

    #[test]
    fn errors_name_the_place() {
        let e = parse(r#"{"k80": {}, "p100": {}}"#).unwrap_err();
        assert!(e.contains("v100"), "{e}");
        let e = parse(r#"{"k80": {"('A', 1)": {"null": -1}}, "p100": {}, "v100": {}}"#).unwrap_err();
        assert!(e.contains("k80/('A', 1)"), "{e}");
    }
}
