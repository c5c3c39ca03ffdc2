//! The run/reload loop both daemons use: run until SIGTERM/SIGINT; on SIGHUP load the config
//! afresh and apply it, or keep the last good one and say why, loudly (log at error level and
//! [`Service::reload_failed`], which puts it in the daemon's state file).

use crate::clock::{mono_ms, sleep_until_ms};
use crate::sdnotify::Notifier;
use crate::signals::{install_signal_handlers, stop_requested, take_reload};
use crate::ConfigError;

/// A daemon driven by [`run`].
pub trait Service {
    /// Its configuration.
    type Config;

    /// Loads the configuration afresh from its files (called on SIGHUP).
    fn load(&mut self) -> Result<Self::Config, ConfigError>;

    /// Puts a freshly loaded configuration in force. Settings that need a restart are the
    /// service's to keep (and to warn about).
    fn apply(&mut self, cfg: Self::Config);

    /// A reload failed: the previous configuration stays in force. The service records
    /// `error` where operators look (state file, metrics) until a reload succeeds.
    fn reload_failed(&mut self, error: &ConfigError);

    /// One turn of work at monotonic time `now_ms`; returns the monotonic ms of the next turn
    /// (a time already past means "again now").
    fn tick(&mut self, now_ms: u64, notifier: &Notifier) -> u64;

    /// Called once after a stop was requested and `STOPPING=1` sent.
    fn stop(&mut self);
}

/// Outcome of one reload, for logs and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// The new configuration is in force.
    Applied,
    /// The new configuration was refused; the previous one stays.
    Kept(ConfigError),
}

/// Loads and applies the configuration once, or keeps the last good one: what [`run`] does on
/// SIGHUP.
pub fn reload<S: Service>(svc: &mut S) -> Reload {
    match svc.load() {
        Ok(cfg) => {
            svc.apply(cfg);
            tracing::info!("config reloaded");
            Reload::Applied
        }
        Err(e) => {
            tracing::error!(error = %e, "config reload failed; keeping the previous config");
            svc.reload_failed(&e);
            Reload::Kept(e)
        }
    }
}

/// Runs `svc` until SIGTERM or SIGINT: installs the signal handlers, reloads on SIGHUP
/// ([`reload`]), calls [`Service::tick`] and sleeps until the time it returns. At the end it
/// sends `STOPPING=1` and calls [`Service::stop`].
///
/// A period costs one wake-up, one syscall (an absolute `clock_nanosleep`, [`sleep_until_ms`])
/// and one clock read (vDSO) besides the tick's own. A signal ends the sleep at once: a stop
/// or reload is acted on then, not at the next tick, and any other handler (the monitor's
/// `SIGIO`) only sends the loop back to sleep until the same deadline, never to an early tick.
pub fn run<S: Service>(svc: &mut S, notifier: &Notifier) {
    install_signal_handlers();
    let mut next = 0;
    while !stop_requested() {
        if take_reload() {
            reload(svc);
        }
        let now = mono_ms();
        if now < next {
            // Woken by a signal before the deadline.
            sleep_until_ms(next);
            continue;
        }
        next = svc.tick(now, notifier);
        if !stop_requested() {
            sleep_until_ms(next);
        }
    }
    notifier.notify("STOPPING=1");
    svc.stop();
}
