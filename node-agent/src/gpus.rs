//! Each served GPU's UUID and product name, from NVML (`nvmlDeviceGetUUID`,
//! `nvmlDeviceGetName`): what `NVIDIA_VISIBLE_DEVICES` / `CUDA_VISIBLE_DEVICES` get at Allocate,
//! the heartbeat and the metrics carry. A UUID typed into the config cannot override NVML: when
//! NVML answers, a config UUID that differs is an error (the config names another GPU than the
//! one at that index: a container would get the wrong device). Where NVML cannot be loaded a
//! config UUID stands in, with a warning, only when the caller allows unchecked UUIDs
//! (`node-agent cdi-spec` run off the node, or `run` with `allow_unverified_uuids`); `run`
//! otherwise stops, naming the fix: a DaemonSet without NVML would hand out UUIDs nobody
//! checked.

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

/// What `run` says when NVML is unavailable and the config's UUIDs would go unchecked.
pub const NVML_FIX: &str = "give the agent NVML (deploy/node-agent.yaml: runtimeClassName: nvidia, env NVIDIA_VISIBLE_DEVICES=all and NVIDIA_DRIVER_CAPABILITIES=utility) or set \"allow_unverified_uuids\": true to run on the config's UUIDs unchecked";

/// Fills every GPU's `uuid` (and an empty `model`) from `lookup`; see the module docs for the
/// rules. `unchecked_ok`: a config UUID may stand in where NVML cannot tell (else an error).
/// Errors name the GPU and say what to fix.
pub fn resolve(
    cfg: &mut AgentConfig,
    lookup: impl Fn(u32) -> Result<NvmlGpu, String>,
    unchecked_ok: bool,
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
            Err(e) if !g.uuid.is_empty() && unchecked_ok => {
                tracing::warn!(gpu = g.index, uuid = %g.uuid, error = %e, "NVML unavailable: using the config's UUID unchecked");
            }
            Err(e) if !g.uuid.is_empty() => {
                return Err(format!(
                    "GPU {}: NVML is unavailable ({e}), so gpus[index={}].uuid `{}` cannot be checked against the GPU at that index (a wrong one gives containers another GPU): {NVML_FIX}",
                    g.index, g.index, g.uuid
                ))
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
        resolve(&mut c, nvml, false).unwrap();
        assert_eq!(c.gpus[0].uuid, "GPU-00");
        assert_eq!(c.gpus[0].model, "NVIDIA H100");
        assert_eq!(c.gpus[1].model, "mine");
        // A config UUID that NVML contradicts is refused, naming both.
        let mut c = cfg(r#"{"node_name": "n", "gpus": [{"index": 1, "uuid": "GPU-zz"}]}"#);
        let e = resolve(&mut c, nvml, true).unwrap_err();
        assert!(e.contains("GPU-zz") && e.contains("GPU-11"), "{e}");
        // No NVML: the config's UUID stands in where allowed, else an error naming the fix;
        // none at all is an error.
        let none = |_| Err("NVML: library not found".to_string());
        let mut c = cfg(r#"{"node_name": "n", "gpus": [{"index": 0, "uuid": "GPU-a"}]}"#);
        resolve(&mut c, none, true).unwrap();
        assert_eq!(c.gpus[0].uuid, "GPU-a");
        let e = resolve(&mut c, none, false).unwrap_err();
        assert!(e.contains("GPU-a") && e.contains("runtimeClassName: nvidia") && e.contains("allow_unverified_uuids"), "{e}");
        let mut c = cfg(r#"{"node_name": "n", "gpus": [{"index": 0}]}"#);
        let e = resolve(&mut c, none, true).unwrap_err();
        assert!(e.contains("no UUID") && e.contains("library not found"), "{e}");
    }
}
