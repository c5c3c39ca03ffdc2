//! The MPS manager's configuration schema and validation.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sysmonitor::layered::{self, ConfigError};

use crate::budget::BudgetConfig;
use crate::detect::{DetectConfig, RateConfig};

pub const DEFAULT_PATH: &str = "/etc/xshare/mps-manager.json";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub gpu_index: u32,
    /// Ledger directory (`<dir>/gpu<N>/ledger`); `$XSHARE_LEDGER_DIR` overrides.
    pub ledger_dir: PathBuf,
    /// The control program (searched in PATH when not absolute).
    pub control_bin: PathBuf,
    /// `CUDA_MPS_PIPE_DIRECTORY`; empty means `<ledger_dir>/gpu<N>/mps-pipe`.
    pub pipe_dir: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY`; empty means `<ledger_dir>/gpu<N>/mps-log`.
    pub log_dir: PathBuf,
    /// Timeout of one control command, ms (a longer wait is a daemon hang).
    pub command_timeout_ms: u64,
    /// How often the SM budget is recomputed, ms.
    pub period_ms: u64,
    /// How often MPS health is checked, ms.
    pub check_every_ms: u64,
    /// Stop MPS (`quit`) when the manager stops.
    pub quit_on_exit: bool,
    /// The monitor's state file (for XID reports); empty means `<ledger_dir>/gpu<N>/state.json`.
    pub monitor_state_file: PathBuf,
    /// This manager's state file; empty means `<ledger_dir>/gpu<N>/mps-manager.json`.
    pub state_file: PathBuf,
    /// SIGTERM -> SIGKILL grace when recovery evicts offline clients, ms.
    pub evict_grace_ms: u64,
    pub budget: BudgetConfig,
    pub detect: DetectConfig,
    pub recovery: RateConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            gpu_index: 0,
            ledger_dir: node_ledger::config::DEFAULT_LEDGER_DIR.into(),
            control_bin: "nvidia-cuda-mps-control".into(),
            pipe_dir: PathBuf::new(),
            log_dir: PathBuf::new(),
            command_timeout_ms: 2000,
            period_ms: 100,
            check_every_ms: 500,
            quit_on_exit: true,
            monitor_state_file: PathBuf::new(),
            state_file: PathBuf::new(),
            evict_grace_ms: 5000,
            budget: BudgetConfig::default(),
            detect: DetectConfig::default(),
            recovery: RateConfig::default(),
        }
    }
}

impl Config {
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.command_timeout_ms == 0 {
            return Err(("command_timeout_ms".into(), "must be > 0".into()));
        }
        if self.period_ms == 0 {
            return Err(("period_ms".into(), "must be > 0".into()));
        }
        if self.check_every_ms == 0 {
            return Err(("check_every_ms".into(), "must be > 0".into()));
        }
        if self.recovery.max_per_hour == 0 {
            return Err(("recovery.max_per_hour".into(), "must be >= 1".into()));
        }
        self.budget.validate()
    }

    /// Loads `base` plus `<stem>.d/*.json` overrides.
    pub fn load(base: &Path) -> Result<(Config, Vec<PathBuf>), ConfigError> {
        let mut files = vec![base.to_path_buf()];
        files.extend(layered::override_files(base));
        Ok((layered::load(&files, Config::validate)?, files))
    }

    /// Applies `$XSHARE_LEDGER_DIR`, `--gpu`, and fills derived paths.
    pub fn finalize(&mut self, gpu: Option<u32>) {
        if let Some(d) =
            std::env::var_os(node_ledger::config::ENV_LEDGER_DIR).filter(|d| !d.is_empty())
        {
            self.ledger_dir = d.into();
        }
        if let Some(g) = gpu {
            self.gpu_index = g;
        }
        let gdir = self
            .ledger_path()
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let fill = |p: &mut PathBuf, name: &str| {
            if p.as_os_str().is_empty() {
                *p = gdir.join(name);
            }
        };
        fill(&mut self.pipe_dir, "mps-pipe");
        fill(&mut self.log_dir, "mps-log");
        fill(&mut self.monitor_state_file, "state.json");
        fill(&mut self.state_file, "mps-manager.json");
    }

    pub fn ledger_path(&self) -> PathBuf {
        node_ledger::config::ledger_path(&self.ledger_dir, self.gpu_index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_paths_derive_from_the_gpu() {
        let mut c = Config::default();
        assert!(c.validate().is_ok());
        c.ledger_dir = "/run/x".into();
        c.finalize(Some(3));
        assert_eq!(c.pipe_dir, PathBuf::from("/run/x/gpu3/mps-pipe"));
        assert_eq!(
            c.monitor_state_file,
            PathBuf::from("/run/x/gpu3/state.json")
        );
    }

    #[test]
    fn bad_budget_names_file_line_and_field() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("mps-manager.json");
        std::fs::write(
            &p,
            "{\n  \"budget\": {\n    \"min_pct\": 80,\n    \"max_pct\": 50\n  }\n}\n",
        )
        .unwrap();
        let e = Config::load(&p).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("budget.min_pct"));
        assert_eq!(e.line, Some(3));
    }
}
