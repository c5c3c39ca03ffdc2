//! A daemon's writable status file (`node_ledger::status`), kept usable: opened when first
//! needed, checked once a second (a `stat`) and reopened in place when damaged, truncated or
//! deleted; a failure said once per distinct error. The one such loop for sysmonitor and
//! mps-manager.

use std::path::PathBuf;

use node_ledger::{Status, StatusWriter};

/// How often the file is checked against its path and header, and a failed open retried.
pub const CHECK_EVERY_MS: u64 = 1000;

/// The status file of one GPU as one of its two writers holds it.
pub struct StatusKeeper {
    path: PathBuf,
    gpu: u32,
    /// What a reader misses while the file cannot be opened (the ERROR line says it).
    consequence: &'static str,
    writer: Option<StatusWriter>,
    error: Option<String>,
    next_check_ms: u64,
}

impl StatusKeeper {
    /// GPU `gpu`'s status file at `path`, opened at the first [`StatusKeeper::get`].
    pub fn new(path: PathBuf, gpu: u32, consequence: &'static str) -> Self {
        StatusKeeper { path, gpu, consequence, writer: None, error: None, next_check_ms: 0 }
    }

    /// The writer at monotonic ms `now_ms`: opened, or checked and reopened when damaged or
    /// gone, when due; `None` while it cannot be opened.
    pub fn get(&mut self, now_ms: u64) -> Option<&StatusWriter> {
        if now_ms >= self.next_check_ms {
            self.next_check_ms = now_ms.saturating_add(CHECK_EVERY_MS);
            let r = match &self.writer {
                Some(w) => w.reopened_if_needed(self.gpu),
                None => Status::open_or_create(&self.path, self.gpu).map(Some),
            };
            match r {
                Ok(Some(w)) => {
                    if self.writer.is_some() || self.error.is_some() {
                        tracing::warn!(file = %self.path.display(), "status file reopened (it was damaged, deleted or not openable)");
                    }
                    self.writer = Some(w);
                    self.error = None;
                }
                Ok(None) => {}
                Err(e) => {
                    let e = e.to_string();
                    if self.error.as_ref() != Some(&e) {
                        tracing::error!(error = %e, "cannot open the status file: {}", self.consequence);
                        self.error = Some(e);
                    }
                }
            }
        }
        self.writer.as_ref()
    }

    /// The writer as last opened, without a check.
    pub fn current(&self) -> Option<&StatusWriter> {
        self.writer.as_ref()
    }

    /// Why the file could not be opened at the last try, if it could not.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use node_ledger::{HealthState, MonitorSample};

    #[test]
    fn opens_when_first_needed_reopens_a_deleted_file_when_due_and_keeps_the_error() {
        let d = tempfile::tempdir().unwrap();
        let path = node_ledger::config::status_path(d.path(), 0);
        let mut k = StatusKeeper::new(path.clone(), 0, "test");
        assert!(k.current().is_none());
        k.get(0).unwrap().publish(&MonitorSample::default().with_health(HealthState::Healthy));
        std::fs::remove_file(&path).unwrap();
        k.get(CHECK_EVERY_MS - 1).unwrap();
        assert!(!path.exists(), "not checked before it is due");
        k.get(CHECK_EVERY_MS).unwrap().publish(&MonitorSample::default().with_health(HealthState::Healthy));
        assert_eq!(Status::open(&path).unwrap().health(), HealthState::Healthy, "made again and published");
        let blocked = d.path().join("file");
        std::fs::write(&blocked, "").unwrap();
        let mut k = StatusKeeper::new(blocked.join("status/gpu0"), 0, "test");
        assert!(k.get(0).is_none());
        assert!(k.error().is_some_and(|e| e.contains("status file")), "{:?}", k.error());
    }
}
