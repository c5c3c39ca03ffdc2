//! Reader of the per-GPU health state files that node monitors publish; missing, stale or
//! unreadable files read as "not Healthy".

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// A GPU's state as the matcher sees it. Only `Healthy` admits offline work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "detail")]
pub enum GpuHealth {
    /// The monitor has started but given no verdict yet; no offline work.
    Init,
    /// All metrics below their thresholds: offline work may be placed here.
    Healthy,
    /// A metric is past its Unhealthy threshold; no new offline work.
    Unhealthy,
    /// A metric is past its Overlimit threshold; offline work there is evicted.
    Overlimit,
    /// The device is unavailable.
    Disabled,
    /// No state file: no monitor runs there (or it has not started).
    Missing,
    /// The file is older than the staleness limit: the monitor may be dead.
    Stale {
        /// Seconds since the file's last update.
        age_s: u64,
    },
    /// The file is dated further in the future than the allowed clock skew: its clock (or
    /// the file) is wrong, so it proves nothing about the monitor being alive now.
    FromFuture {
        /// How far ahead of this host's clock the file is dated, milliseconds.
        ahead_ms: u64,
    },
    /// The file exists but cannot be read or parsed.
    Unreadable {
        /// The read or parse error.
        why: String,
    },
}

impl GpuHealth {
    /// Whether this state admits offline work (only `Healthy` does).
    pub fn is_healthy(&self) -> bool {
        matches!(self, GpuHealth::Healthy)
    }

    /// Short label for tables and logs.
    pub fn label(&self) -> String {
        match self {
            GpuHealth::Stale { age_s } => format!("Stale({age_s}s)"),
            GpuHealth::FromFuture { ahead_ms } => format!("Stale(dated {ahead_ms}ms ahead)"),
            GpuHealth::Unreadable { why } => format!("Unreadable({why})"),
            other => format!("{other:?}"),
        }
    }
}

/// The fields the matcher needs from a sysmonitor state file (sysmonitor's `Snapshot`; other
/// fields are ignored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateFile {
    /// `init`, `healthy`, `unhealthy`, `overlimit` or `disabled` (any case).
    pub state: String,
    /// Wall-clock time of the last update, milliseconds since the Unix epoch.
    pub updated_unix_ms: u64,
    /// GPU index the file describes, when the monitor says.
    #[serde(default)]
    pub gpu: Option<u32>,
    /// The monitor's own admission verdict, when it says.
    #[serde(default)]
    pub admits_offline: Option<bool>,
}

/// Default for [`max_clock_skew`]: how far ahead of this host's clock a heartbeat may be
/// dated and still count (node clocks drift a little even under NTP).
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_secs(2);

static MAX_CLOCK_SKEW_MS: AtomicU64 = AtomicU64::new(DEFAULT_MAX_CLOCK_SKEW.as_millis() as u64);

/// How far in the future a heartbeat may be dated before it reads as stale (process-wide;
/// `cluster-matcher serve --max-clock-skew-ms` sets it).
pub fn max_clock_skew() -> Duration {
    Duration::from_millis(MAX_CLOCK_SKEW_MS.load(Ordering::Relaxed))
}

/// Sets [`max_clock_skew`].
pub fn set_max_clock_skew(skew: Duration) {
    MAX_CLOCK_SKEW_MS.store(u64::try_from(skew.as_millis()).unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// Reads health state files under one directory.
#[derive(Debug, Clone)]
pub struct HealthReader {
    /// Directory holding one subdirectory (or file set) per node.
    pub dir: PathBuf,
    /// Files last updated longer ago than this read as [`GpuHealth::Stale`].
    pub stale_after: Duration,
}

impl HealthReader {
    /// Path of the state file for `node`'s GPU `index`: `<dir>/<node>/gpu<i>/state.json`
    /// (a mirror of the node's ledger directory, where sysmonitor writes it) when that exists,
    /// else `<dir>/<node>/gpu<i>.json`.
    pub fn path(&self, node: &str, index: u32) -> PathBuf {
        let mirrored = self.dir.join(node).join(format!("gpu{index}")).join("state.json");
        if mirrored.exists() {
            mirrored
        } else {
            self.dir.join(node).join(format!("gpu{index}.json"))
        }
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
        parse_state(&path, &text, index, now, self.stale_after, max_clock_skew())
    }
}

fn parse_state(
    path: &Path,
    text: &str,
    index: u32,
    now: SystemTime,
    stale_after: Duration,
    max_skew: Duration,
) -> GpuHealth {
    let file: StateFile = match serde_json::from_str(text) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "unreadable GPU state file");
            return GpuHealth::Unreadable { why: e.to_string() };
        }
    };
    if let Some(g) = file.gpu.filter(|g| *g != index) {
        return GpuHealth::Unreadable { why: format!("file describes GPU {g}, not {index}") };
    }
    let now_ms = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    // A heartbeat from the future is no proof of life: without this, a file dated ahead (or
    // `u64::MAX`) would read as fresh forever, even after its monitor died.
    let ahead_ms = file.updated_unix_ms.saturating_sub(now_ms);
    if ahead_ms > max_skew.as_millis() as u64 {
        tracing::warn!(path = %path.display(), ahead_ms, "GPU state file dated in the future");
        return GpuHealth::FromFuture { ahead_ms };
    }
    let age_ms = now_ms.saturating_sub(file.updated_unix_ms);
    if age_ms > stale_after.as_millis() as u64 {
        return GpuHealth::Stale { age_s: age_ms / 1000 };
    }
    let state = match file.state.to_ascii_lowercase().as_str() {
        "init" => GpuHealth::Init,
        "healthy" => GpuHealth::Healthy,
        "unhealthy" => GpuHealth::Unhealthy,
        "overlimit" => GpuHealth::Overlimit,
        "disabled" => GpuHealth::Disabled,
        other => GpuHealth::Unreadable {
            why: format!("unknown state `{other}`"),
        },
    };
    if state.is_healthy() && file.admits_offline == Some(false) {
        return GpuHealth::Unreadable { why: "healthy but the monitor does not admit offline work".into() };
    }
    state
}

/// Writes a state file the way a monitor does (write to a temporary file, then rename).
pub fn write_state(path: &Path, state: &str, updated: SystemTime) -> std::io::Result<()> {
    let file = StateFile {
        state: state.to_ascii_lowercase(),
        updated_unix_ms: updated.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        gpu: None,
        admits_offline: Some(state.eq_ignore_ascii_case("healthy")),
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
        assert!(matches!(r.read_at("n0", 4, now), GpuHealth::Unreadable { why } if why.contains("sleepy")));
        assert_eq!(r.read_at("n0", 9, now), GpuHealth::Missing);
        assert!(r.read_at("n0", 0, now).is_healthy());
        assert!(!r.read_at("n0", 2, now).is_healthy());
        std::fs::remove_dir_all(&r.dir).unwrap();
    }

    #[test]
    fn heartbeat_dated_in_the_future_is_not_healthy() {
        let r = reader("future");
        let now = SystemTime::now();
        let p0 = r.path("n0", 0);
        write_state(&p0, "Healthy", now + Duration::from_secs(3600)).unwrap();
        assert_eq!(r.read_at("n0", 0, now), GpuHealth::FromFuture { ahead_ms: 3_600_000 });
        assert!(!r.read_at("n0", 0, now).is_healthy());
        // Within the default skew allowance (2 s) a heartbeat a little ahead still counts.
        write_state(&p0, "Healthy", now + Duration::from_millis(1500)).unwrap();
        assert_eq!(r.read_at("n0", 0, now), GpuHealth::Healthy);
        // updated_unix_ms = u64::MAX never reads as fresh.
        std::fs::write(&p0, format!(r#"{{"state":"healthy","updated_unix_ms":{}}}"#, u64::MAX)).unwrap();
        assert!(matches!(r.read_at("n0", 0, now), GpuHealth::FromFuture { .. }));
        assert!(r.read_at("n0", 0, now).label().starts_with("Stale("));
        std::fs::remove_dir_all(&r.dir).unwrap();
    }

    #[test]
    fn clock_skew_allowance_is_a_parameter() {
        let now = SystemTime::now();
        let ms = now.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        let text = format!(r#"{{"state":"healthy","updated_unix_ms":{}}}"#, ms + 5_000);
        let p = Path::new("x");
        let ten = Duration::from_secs(10);
        assert_eq!(parse_state(p, &text, 0, now, ten, Duration::from_secs(10)), GpuHealth::Healthy);
        assert_eq!(parse_state(p, &text, 0, now, ten, Duration::from_secs(1)), GpuHealth::FromFuture { ahead_ms: 5_000 });
        assert_eq!(parse_state(p, &text, 0, now, ten, Duration::ZERO), GpuHealth::FromFuture { ahead_ms: 5_000 });
    }

    #[test]
    fn reads_sysmonitor_snapshots_in_a_mirrored_ledger_dir() {
        let r = reader("b");
        let now = SystemTime::now();
        let ms = now.duration_since(UNIX_EPOCH).unwrap().as_millis();
        let p = r.dir.join("n1").join("gpu2").join("state.json");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let snap = format!(
            r#"{{"gpu":2,"monitor_pid":7,"boot_id":"b","state":"healthy","admits_offline":true,"disabled_by":null,"updated_unix_ms":{ms},"updated_mono_ms":1,"interval_ms":5,"sample":null,"hold_ms":0}}"#
        );
        std::fs::write(&p, &snap).unwrap();
        assert_eq!(r.path("n1", 2), p);
        assert_eq!(r.read_at("n1", 2, now), GpuHealth::Healthy);
        std::fs::write(&p, snap.replace("\"gpu\":2", "\"gpu\":3")).unwrap();
        assert!(matches!(r.read_at("n1", 2, now), GpuHealth::Unreadable { why } if why.contains("GPU 3")));
        std::fs::write(&p, snap.replace("\"admits_offline\":true", "\"admits_offline\":false")).unwrap();
        assert!(!r.read_at("n1", 2, now).is_healthy());
        std::fs::write(&p, snap.replace("healthy", "overlimit")).unwrap();
        assert_eq!(r.read_at("n1", 2, now), GpuHealth::Overlimit);
        std::fs::remove_dir_all(&r.dir).unwrap();
    }
}
