//! The `sysmonitor run` loop: schedule, signals (SIGHUP reload, SIGTERM stop), systemd
//! readiness and watchdog, state file, metrics endpoint, operator disable file.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::Config;
use crate::evictor::PidfdSignaller;
use crate::health::Input;
use crate::ledger::LedgerAdapter;
use crate::monitor::{boot_id, mono_ms, Monitor};
use crate::report;
use crate::sampler::{GpuSample, GpuSource, NvmlSource, ProcMem};
use crate::sdnotify::Notifier;

static RELOAD: AtomicBool = AtomicBool::new(false);
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_hup(_: libc::c_int) {
    RELOAD.store(true, Ordering::Relaxed);
}
extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Installs async-signal-safe handlers that only set flags.
pub fn install_signal_handlers() {
    // SAFETY: the handlers only store to atomics, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGHUP, on_hup as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_stop as *const () as libc::sighandler_t);
    }
}

/// Whether a stop was requested by signal.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Takes a pending SIGHUP.
pub fn take_reload() -> bool {
    RELOAD.swap(false, Ordering::Relaxed)
}

/// NVML source that keeps retrying to open the device; until it opens, samples fail (so the
/// machine goes Disabled) rather than the daemon exiting.
pub struct RetryingNvml {
    index: u32,
    inner: Option<NvmlSource>,
    next_try_ms: u64,
}

impl RetryingNvml {
    pub fn new(index: u32) -> Self {
        RetryingNvml {
            index,
            inner: None,
            next_try_ms: 0,
        }
    }
}

impl GpuSource for RetryingNvml {
    fn sample(&mut self, now_ms: u64) -> Result<GpuSample, String> {
        if self.inner.is_none() && now_ms >= self.next_try_ms {
            self.next_try_ms = now_ms + 1000;
            match NvmlSource::open(self.index) {
                Ok(s) => self.inner = Some(s),
                Err(e) => return Err(format!("NVML unavailable: {e}")),
            }
        }
        match &mut self.inner {
            Some(s) => s.sample(now_ms),
            None => Err("NVML unavailable (retrying every second)".into()),
        }
    }
    fn processes(&mut self) -> Result<Vec<ProcMem>, String> {
        self.inner.as_mut().ok_or("NVML unavailable")?.processes()
    }
    fn xids(&mut self) -> Vec<u64> {
        self.inner.as_mut().map(|s| s.xids()).unwrap_or_default()
    }
}

/// File whose presence means "an operator disabled this GPU".
pub fn operator_file(cfg: &Config) -> PathBuf {
    cfg.ledger_path().with_file_name("disabled")
}

/// Serves the latest Prometheus text over HTTP on TCP or a unix socket, one request at a time.
fn spawn_metrics(listen: &str, text: Arc<Mutex<String>>) -> std::io::Result<()> {
    fn serve(mut s: impl Read + Write, text: &Mutex<String>) {
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf);
        let body = text.lock().map(|t| t.clone()).unwrap_or_default();
        let _ = write!(
            s,
            "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{}",
            body.len(),
            body
        );
    }
    if let Some(path) = listen.strip_prefix("unix:") {
        let _ = std::fs::remove_file(path);
        let l = std::os::unix::net::UnixListener::bind(path)?;
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                for s in l.incoming().flatten() {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                    serve(s, &text);
                }
            })?;
    } else {
        let l = std::net::TcpListener::bind(listen)?;
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                for s in l.incoming().flatten() {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                    serve(s, &text);
                }
            })?;
    }
    Ok(())
}

/// Overlimit history from an earlier run's state file, if it is from this boot and this GPU.
fn resume_history(cfg: &Config) -> Vec<u64> {
    match report::read_state_file(&cfg.state_file) {
        Ok(s) if s.boot_id == boot_id() && s.gpu == cfg.gpu_index => {
            tracing::info!(
                entries = s.overlimit_entries_mono_ms.len(),
                "resumed Overlimit history from the state file"
            );
            s.overlimit_entries_mono_ms
        }
        _ => Vec::new(),
    }
}

/// Runs the monitor until SIGTERM/SIGINT. `files` are the config files (base first).
pub fn run(mut cfg: Config, base: &Path, mut files: Vec<PathBuf>) -> Result<(), String> {
    install_signal_handlers();
    let lpath = cfg.ledger_path();
    let ledger = node_ledger::Ledger::open_or_create(&lpath, cfg.gpu_index)
        .map_err(|e| format!("ledger: {e}"))?;
    // Re-applied on every start: a drifted mode would lock non-root offline processes out.
    ledger
        .set_access(node_ledger::ledger::DEFAULT_MODE, None)
        .map_err(|e| format!("ledger: {e}"))?;
    if let Some(dir) = cfg.state_file.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let history = resume_history(&cfg);
    let gpu = RetryingNvml::new(cfg.gpu_index);
    let mut mon = Monitor::new(
        cfg.clone(),
        gpu,
        LedgerAdapter::new(ledger),
        PidfdSignaller,
        history,
    );
    let metrics_text = Arc::new(Mutex::new(String::new()));
    if let Some(l) = &cfg.metrics_listen {
        spawn_metrics(l, metrics_text.clone()).map_err(|e| format!("metrics_listen `{l}`: {e}"))?;
    }
    let notifier = Notifier::from_env();
    let mut config_error: Option<String> = None;
    let mut reloads = 0u64;
    let mut ready = false;
    let mut next_report = 0u64;
    let mut operator_disabled = false;
    tracing::info!(
        gpu = cfg.gpu_index,
        interval_ms = cfg.interval_ms,
        ledger = %lpath.display(),
        state_file = %cfg.state_file.display(),
        "sysmonitor running"
    );
    let mut next = mono_ms();
    while !stop_requested() {
        let now = mono_ms();
        mon.tick(now);
        if take_reload() {
            match Config::load(base) {
                Ok((new, f)) => {
                    if new.gpu_index != cfg.gpu_index
                        || new.ledger_dir != cfg.ledger_dir
                        || new.state_file != cfg.state_file
                        || new.xid_log != cfg.xid_log
                    {
                        tracing::warn!("gpu_index, ledger_dir, state_file and xid_log changes need a restart; keeping the old ones");
                    }
                    let mut applied = new;
                    applied.gpu_index = cfg.gpu_index;
                    applied.ledger_dir = cfg.ledger_dir.clone();
                    applied.state_file = cfg.state_file.clone();
                    applied.metrics_listen = cfg.metrics_listen.clone();
                    applied.xid_log = cfg.xid_log.clone();
                    applied.xid_log_match = cfg.xid_log_match.clone();
                    cfg = applied;
                    mon.cfg = cfg.clone();
                    files = f;
                    config_error = None;
                    reloads += 1;
                    tracing::info!(files = ?files, "config reloaded");
                }
                Err(e) => {
                    tracing::error!(error = %e, "config reload failed; keeping the previous config");
                    config_error = Some(e.to_string());
                }
            }
            next_report = 0;
        }
        if now >= next_report {
            next_report = now + cfg.state_file_every_ms;
            let disabled_now = operator_file(&cfg).exists();
            if disabled_now != operator_disabled {
                operator_disabled = disabled_now;
                mon.input(
                    now,
                    if disabled_now {
                        Input::OperatorDisable
                    } else {
                        Input::OperatorEnable
                    },
                );
            }
            mon.refresh_offline();
            let names: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
            let snap = mon.snapshot(now, &names, config_error.clone(), reloads);
            if let Err(e) = report::write_state_file(&cfg.state_file, &snap) {
                tracing::warn!(path = %cfg.state_file.display(), error = %e, "cannot write the state file");
            }
            if cfg.metrics_listen.is_some() {
                if let Ok(mut t) = metrics_text.lock() {
                    *t = report::prometheus(&snap);
                }
            }
            if !ready {
                ready = true;
                notifier.notify("READY=1");
            }
            notifier.notify(&format!(
                "STATUS=GPU {} {}\nWATCHDOG=1",
                cfg.gpu_index,
                snap.state.as_str()
            ));
        }
        next += cfg.interval_ms;
        let after = mono_ms();
        if next > after {
            std::thread::sleep(Duration::from_millis(next - after));
        } else {
            // Fell behind (slow NVML call): skip missed ticks rather than bursting.
            next = after;
        }
    }
    notifier.notify("STOPPING=1");
    let names: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    let _ = report::write_state_file(
        &cfg.state_file,
        &mon.snapshot(mono_ms(), &names, config_error, reloads),
    );
    tracing::info!("sysmonitor stopped");
    Ok(())
}
