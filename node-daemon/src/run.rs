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

    /// The systemd watchdog keep-alive, which [`run`] asks for at least every half watchdog
    /// period (`$WATCHDOG_USEC`) while the loop turns, however far apart the ticks are. A
    /// service that is not fit to be kept alive (not ready yet) sends nothing.
    fn keep_alive(&mut self, _now_ms: u64, notifier: &Notifier) {
        notifier.notify("WATCHDOG=1");
    }

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

/// The loop's time: the monotonic clock and an absolute sleep on it ([`Monotonic`]; a fake
/// one in tests, so that no test waits for a watchdog period).
pub trait LoopClock {
    /// Monotonic ms now.
    fn now_ms(&mut self) -> u64;
    /// Sleeps until monotonic ms `deadline_ms`, or less if a signal handler runs.
    fn sleep_until_ms(&mut self, deadline_ms: u64);
}

/// [`mono_ms`] and [`sleep_until_ms`].
pub struct Monotonic;

impl LoopClock for Monotonic {
    fn now_ms(&mut self) -> u64 {
        mono_ms()
    }
    fn sleep_until_ms(&mut self, deadline_ms: u64) {
        sleep_until_ms(deadline_ms);
    }
}

/// Runs `svc` until SIGTERM or SIGINT: installs the signal handlers, reloads on SIGHUP
/// ([`reload`]), calls [`Service::tick`] and sleeps until the time it returns. At the end it
/// sends `STOPPING=1` and calls [`Service::stop`].
///
/// Under a systemd watchdog (`$WATCHDOG_USEC`, [`Notifier::watchdog_usec`]) it never sleeps
/// longer than half the watchdog period without calling [`Service::keep_alive`]: ticks may
/// be further apart than the watchdog allows (an `interval_ms` of a minute under
/// `WatchdogSec=10s`). Keep-alives come from the loop's own turns, so a tick that hangs
/// still lets the watchdog fire.
///
/// A period costs one wake-up, one syscall (an absolute `clock_nanosleep`, [`sleep_until_ms`])
/// and one clock read (vDSO) besides the tick's own. A signal ends the sleep at once: a stop
/// or reload is acted on then, not at the next tick, and any other handler (the monitor's
/// `SIGIO`) only sends the loop back to sleep until the same deadline, never to an early tick.
pub fn run<S: Service>(svc: &mut S, notifier: &Notifier) {
    run_on(svc, notifier, &mut Monotonic)
}

/// [`run`] on the clock `clock`.
pub fn run_on<S: Service, C: LoopClock>(svc: &mut S, notifier: &Notifier, clock: &mut C) {
    install_signal_handlers();
    let keep_alive_ms = notifier.watchdog_usec.map(|us| (us / 2_000).max(1));
    let mut next = 0;
    let mut keep_alive_at = 0;
    while !stop_requested() {
        if take_reload() {
            reload(svc);
        }
        let now = clock.now_ms();
        if now >= next {
            next = svc.tick(now, notifier);
        }
        let mut wake = next;
        if let Some(every) = keep_alive_ms {
            if now >= keep_alive_at {
                svc.keep_alive(now, notifier);
                keep_alive_at = now.saturating_add(every);
            }
            wake = wake.min(keep_alive_at);
        }
        if !stop_requested() {
            // Woken early by a signal, the next turn only sleeps again until the same time.
            clock.sleep_until_ms(wake);
        }
    }
    notifier.notify("STOPPING=1");
    svc.stop();
}
