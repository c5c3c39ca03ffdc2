//! Reader of the per-GPU health state files that node monitors publish; missing, stale or
//! unreadable files read as "not Healthy".

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// A GPU's state as the matcher sees it. Only `Healthy` admits offline work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "detail")]
pub enum GpuHealth {
    Init,
    Healthy,
    Unhealthy,
    Overlimit,
    Disabled,
    /// No state file: no monitor runs there (or it has not started).
    Missing,
    /// The file is older than the staleness limit: the monitor may be dead.
    Stale { age_s: u64 },
    /// The file exists but cannot be read or parsed.
    Unreadable { why: String },
}

impl GpuHealth {
    pub fn is_healthy(&self) -> bool {
        matches!(self, GpuHealth::Healthy)
    }

    /// Short label for tables and logs.
    pub fn label(&self) -> String {
        match self {
            GpuHealth::Stale { age_s } => format!("Stale({age_s}s)"),
            GpuHealth::Unreadable { why } => format!("Unreadable({why})"),
            other => format!("{other:?}"),
        }
    }
}

/// What a monitor writes to `<dir>/<node>/gpu<index>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateFile {
    /// `Init`, `Healthy`, `Unhealthy`, `Overlimit` or `Disabled`.
    pub state: String,
    /// Wall-clock time of the last update, milliseconds since the Unix epoch.
    pub updated_unix_ms: u64,
}

/// Reads health state files under one directory.
#[derive(Debug, Clone)]
pub struct HealthReader {
    pub dir: PathBuf,
    pub stale_after: Duration,
}

impl HealthReader {
    /// Path of the state file for `node`'s GPU `index`.
    pub fn path(&self, node: &str, index: u32) -> PathBuf {
        self.dir.join(node).join(format!("gpu{index}.json"))
    }

    /// Health of one GPU now.
    pub fn read(&self, node: &str, index: u32) -> GpuHealth {
        self.read_at(node, index, SystemTime::now())
    }

    /// Health of one GPU as of `now` (for tests and replays).
    pub fn read_at(&self, node: &str, index: u32, now: SystemTime) -> GpuHealth {
        let path = self.path(node, index);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return GpuHealth::Missing,
            Err(e) => return GpuHealth::Unreadable { why: e.to_string() },
        };
        parse_state(&path, &text, now, self.stale_after)
    }
}

fn parse_state(path: &Path, text: &str, now: SystemTime, stale_after: Duration) -> GpuHealth {
    let file: StateFile = match serde_json::from_str(text) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "unreadable GPU state file");
            return GpuHealth::Unreadable { why: e.to_string() };
        }
    };
    let now_ms = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let age_ms = now_ms.saturating_sub(file.updated_unix_ms);
    if age_ms > stale_after.as_millis() as u64 {
        return GpuHealth::Stale { age_s: age_ms / 1000 };
    }
    match file.state.as_str() {
        "Init" => GpuHealth::Init,
        "Healthy" => GpuHealth::Healthy,
        "Unhealthy" => GpuHealth::Unhealthy,
        "Overlimit" => GpuHealth::Overlimit,
        "Disabled" => GpuHealth::Disabled,
        other => GpuHealth::Unreadable {
            why: format!("unknown state `{other}`"),
        },
    }
}

/// Writes a state file the way a monitor does (write to a temporary file, then rename).
pub fn write_state(path: &Path, state: &str, updated: SystemTime) -> std::io::Result<()> {
    let file = StateFile {
        state: state.into(),
        updated_unix_ms: updated.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(&file).map_err(std::io::Error::other)?)?;
    std::fs::rename(tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(tag: &str) -> HealthReader {
        let dir = std::env::temp_dir().join(format!("xshare-health-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        HealthReader { dir, stale_after: Duration::from_secs(10) }
    }

    #[test]
    fn fresh_missing_stale_and_corrupt_files() {
        let r = reader("a");
        let now = SystemTime::now();
        write_state(&r.path("n0", 0), "Healthy", now).unwrap();
        write_state(&r.path("n0", 1), "Overlimit", now).unwrap();
        write_state(&r.path("n0", 2), "Healthy", now - Duration::from_secs(60)).unwrap();
        std::fs::write(r.path("n0", 3), "{\"state\": \"Healt").unwrap();
        write_state(&r.path("n0", 4), "Sleepy", now).unwrap();
        assert_eq!(r.read_at("n0", 0, now), GpuHealth::Healthy);
        assert_eq!(r.read_at("n0", 1, now), GpuHealth::Overlimit);
        assert_eq!(r.read_at("n0", 2, now), GpuHealth::Stale { age_s: 60 });
        assert!(matches!(r.read_at("n0", 3, now), GpuHealth::Unreadable { .. }));
        assert!(matches!(r.read_at("n0", 4, now), GpuHealth::Unreadable { why } if why.contains("Sleepy")));
        assert_eq!(r.read_at("n0", 9, now), GpuHealth::Missing);
        assert_eq!(r.read_at("n0", 0, now).is_healthy(), true);
        assert!(!r.read_at("n0", 2, now).is_healthy());
        std::fs::remove_dir_all(&r.dir).unwrap();
    }
}
