//! The run/reload loop under real signals: SIGHUP reloads, a bad config is refused and the
//! last good one kept (and reported), SIGTERM stops. One test per file: the signal flags are
//! process-wide.

use std::path::PathBuf;

use node_daemon::run::{run, Service};
use node_daemon::sdnotify::Notifier;
use node_daemon::ConfigError;

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Cfg {
    level: u32,
}

struct Fake {
    file: PathBuf,
    level: u32,
    ticks: u32,
    reload_error: Option<String>,
    log: Vec<String>,
    stopped: bool,
}

impl Service for Fake {
    type Config = Cfg;
    fn load(&mut self) -> Result<Cfg, ConfigError> {
        node_daemon::layered::load(std::slice::from_ref(&self.file), |c: &Cfg| {
            if c.level == 0 {
                Err(("level".into(), "must be > 0".into()))
            } else {
                Ok(())
            }
        })
    }
    fn apply(&mut self, cfg: Cfg) {
        self.level = cfg.level;
        self.reload_error = None;
        self.log.push(format!("applied {}", cfg.level));
    }
    fn reload_failed(&mut self, error: &ConfigError) {
        self.reload_error = Some(error.to_string());
        self.log.push(format!("kept {}", self.level));
    }
    fn tick(&mut self, now_ms: u64, _: &Notifier) -> u64 {
        self.ticks += 1;
        let hup = |text: &str| {
            std::fs::write(&self.file, text).unwrap();
            // SAFETY: raise(3) with a valid signal number; the handler only sets a flag.
            unsafe { libc::raise(libc::SIGHUP) };
        };
        match self.ticks {
            2 => hup("{\"level\": 7}"),
            4 => hup("{\n\"level\": 0\n}"),
            6 => hup("{\"level\": \"high\"}"),
            8 => hup("{\"level\": 9}"),
            // SAFETY: as above; the handler only sets the stop flag.
            10 => unsafe {
                libc::raise(libc::SIGTERM);
            },
            _ => {}
        }
        now_ms + 1
    }
    fn stop(&mut self) {
        self.stopped = true;
    }
}

#[test]
fn sighup_reloads_a_bad_config_is_refused_loudly_and_sigterm_stops() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("c.json");
    let mut svc = Fake {
        file: file.clone(),
        level: 1,
        ticks: 0,
        reload_error: None,
        log: Vec::new(),
        stopped: false,
    };
    run(&mut svc, &Notifier::from_env());
    assert_eq!(
        svc.log,
        ["applied 7", "kept 7", "kept 7", "applied 9"],
        "each SIGHUP reloads once; bad configs keep the last good one"
    );
    assert!(svc.stopped, "SIGTERM ends the loop through stop()");
    assert_eq!(
        svc.ticks, 10,
        "the loop stops at the first check after SIGTERM"
    );
    assert_eq!(svc.level, 9);
    assert_eq!(svc.reload_error, None, "a good reload clears the error");
}

#[test]
fn a_failed_reload_is_reported_with_file_line_and_field() {
    // `reload` alone (no signals): the error the service records names where the fault is.
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("c.json");
    std::fs::write(&file, "{\n\"level\": 0\n}").unwrap();
    let mut svc = Fake {
        file: file.clone(),
        level: 3,
        ticks: 0,
        reload_error: None,
        log: Vec::new(),
        stopped: false,
    };
    let r = node_daemon::run::reload(&mut svc);
    assert!(matches!(r, node_daemon::run::Reload::Kept(_)));
    assert_eq!(svc.level, 3);
    assert_eq!(
        svc.reload_error.as_deref(),
        Some(format!("{}:2: field `level`: must be > 0", file.display()).as_str())
    );
}
