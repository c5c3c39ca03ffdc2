//! Each served GPU's UUID and product name, from NVML (`nvmlDeviceGetUUID`,
//! `nvmlDeviceGetName`): what `NVIDIA_VISIBLE_DEVICES` / `CUDA_VISIBLE_DEVICES` get at Allocate,
//! the heartbeat and the metrics carry. A UUID typed into the config cannot override NVML: when
//! NVML answers, a config UUID that differs is an error (the config names another GPU than the
//! one at that index: a container would get the wrong device). Only where NVML cannot be
//! loaded (no driver: e.g. `node-agent cdi-spec` run off the node) does a config UUID stand in,
//! with a warning.

use crate::config::AgentConfig;

/// A GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlGpu {
    /// `GPU-...` (or `MIG-...`).
    pub uuid: String,
    /// Product name (`nvidia-smi --query-gpu=name`).
    pub name: String,
}

/// Looks GPUs up by host index in NVML.
pub struct NvmlLookup(Result<nvml_wrapper::Nvml, String>);

impl NvmlLookup {
    /// Loads and initializes NVML (`libnvidia-ml.so`); a failure is kept and reported per GPU.
    pub fn init() -> Self {
        Self(nvml_wrapper::Nvml::init().map_err(|e| format!("NVML: {e}")))
    }

    /// GPU `index`'s UUID and name.
    pub fn gpu(&self, index: u32) -> Result<NvmlGpu, String> {
        let nvml = self.0.as_ref().map_err(Clone::clone)?;
        let d = nvml
            .device_by_index(index)
            .map_err(|e| format!("NVML: GPU {index}: {e}"))?;
        Ok(NvmlGpu {
            uuid: d
                .uuid()
                .map_err(|e| format!("NVML: GPU {index}: uuid: {e}"))?,
            name: d.name().unwrap_or_default(),
        })
    }
}

/// Fills every GPU's `uuid` (and an empty `model`) from `lookup`; see the module docs for the
/// rules. Errors name the GPU and say what to fix.
pub fn resolve(
    cfg: &mut AgentConfig,
    lookup: impl Fn(u32) -> Result<NvmlGpu, String>,
) -> Result<(), String> {
    for g in &mut cfg.gpus {
        match lookup(g.index) {
            Ok(n) => {
                if !n.uuid.starts_with("GPU-") && !n.uuid.starts_with("MIG-") {
                    return Err(format!(
                        "GPU {}: NVML reports UUID `{}`, not a GPU UUID",
                        g.index, n.uuid
                    ));
                }
                if !g.uuid.is_empty() && g.uuid != n.uuid {
                    return Err(format!(
                        "gpus[index={}].uuid is `{}` in the config but NVML reports `{}` for GPU {}: remove the uuid (NVML's is used) or fix the index",
                        g.index, g.uuid, n.uuid, g.index
                    ));
                }
                g.uuid = n.uuid;
                if g.model.is_empty() {
                    g.model = n.name;
                }
            }
            Err(e) if !g.uuid.is_empty() => {
                tracing::warn!(gpu = g.index, uuid = %g.uuid, error = %e, "NVML unavailable: using the config's UUID unchecked");
            }
            Err(e) => {
                return Err(format!(
                    "GPU {}: no UUID: NVML cannot tell it ({e}) and the config has none",
                    g.index
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn cfg(t: &str) -> AgentConfig {
        AgentConfig::from_text(Path::new("a.json"), t, |_| None).unwrap()
    }

    #[test]
    fn nvml_fills_checks_and_only_stands_in_without_nvml() {
        let nvml = |i: u32| {
            Ok(NvmlGpu {
                uuid: format!("GPU-{i}{i}"),
                name: "NVIDIA H100".into(),
            })
        };
        let mut c = cfg(r#"{"node_name": "n", "gpus": [{"index": 0}, {"index": 1, "uuid": "GPU-11", "model": "mine"}]}"#);
        resolve(&mut c, nvml).unwrap();
        assert_eq!(c.gpus[0].uuid, "GPU-00");
        assert_eq!(c.gpus[0].model, "NVIDIA H100");
        assert_eq!(c.gpus[1].model, "mine");
        // A config UUID that NVML contradicts is refused, naming both.
        let mut c = cfg(r#"{"node_name": "n", "gpus": [{"index": 1, "uuid": "GPU-zz"}]}"#);
        let e = resolve(&mut c, nvml).unwrap_err();
        assert!(e.contains("GPU-zz") && e.contains("GPU-11"), "{e}");
        // No NVML: the config's UUID stands in; none at all is an error.
        let none = |_| Err("NVML: library not found".to_string());
        let mut c = cfg(r#"{"node_name": "n", "gpus": [{"index": 0, "uuid": "GPU-a"}]}"#);
        resolve(&mut c, none).unwrap();
        assert_eq!(c.gpus[0].uuid, "GPU-a");
        let mut c = cfg(r#"{"node_name": "n", "gpus": [{"index": 0}]}"#);
        let e = resolve(&mut c, none).unwrap_err();
        assert!(e.contains("no UUID") && e.contains("library not found"), "{e}");
    }
}
