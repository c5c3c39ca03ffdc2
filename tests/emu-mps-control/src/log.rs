//! `control.log` in `CUDA_MPS_LOG_DIRECTORY`, in the real daemon's line format
//! (`[2024-06-10 15:16:40.777 Control 111377] Starting control daemon using socket ...`), and
//! `server.log` beside it, where the emulated servers' lines go (`[... Server ...] ...`).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Appends timestamped lines to `control.log` (or `server.log`).
pub struct ControlLog {
    file: Option<File>,
    pid: u32,
    /// `Control` or `Server`, as the real logs tag their lines.
    tag: &'static str,
}

/// `YYYY-MM-DD HH:MM:SS.mmm` (UTC) for a time since the epoch.
pub fn timestamp(since_epoch: std::time::Duration) -> String {
    let secs = since_epoch.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from day count (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since_epoch.subsec_millis()
    )
}

impl ControlLog {
    /// Opens (creating) `<dir>/control.log` for appending.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        Self::open_as(dir, "control.log", "Control")
    }

    /// Opens (creating) `<dir>/server.log` for appending: what the servers report (a client
    /// a fatal GPU error tore down).
    pub fn open_server(dir: &Path) -> std::io::Result<Self> {
        Self::open_as(dir, "server.log", "Server")
    }

    fn open_as(dir: &Path, name: &str, tag: &'static str) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let file = OpenOptions::new().create(true).append(true).open(dir.join(name))?;
        Ok(ControlLog {
            file: Some(file),
            pid: std::process::id(),
            tag,
        })
    }

    /// A log that drops everything (unit tests).
    #[cfg(test)]
    pub fn discard() -> Self {
        ControlLog {
            file: None,
            pid: std::process::id(),
            tag: "Control",
        }
    }

    /// Re-reads the pid (after daemonising, the writer is a new process).
    pub fn refresh_pid(&mut self) {
        self.pid = std::process::id();
    }

    /// Writes one line.
    pub fn line(&mut self, msg: &str) {
        if let Some(f) = &mut self.file {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let _ = writeln!(f, "[{} {} {:>5}] {msg}", timestamp(now), self.tag, self.pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_match_known_dates() {
        assert_eq!(
            timestamp(Duration::from_millis(0)),
            "1970-01-01 00:00:00.000"
        );
        assert_eq!(
            timestamp(Duration::from_millis(1_718_032_600_777)),
            "2024-06-10 15:16:40.777"
        );
        assert_eq!(
            timestamp(Duration::from_secs(951_782_400)),
            "2000-02-29 00:00:00.000"
        );
    }
}
