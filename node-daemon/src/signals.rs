//! Stop and reload requests by signal: SIGTERM/SIGINT ask the daemon to stop, SIGHUP to
//! reload its config. The handlers only store to atomics (async-signal-safe); the run loop
//! polls the flags.

use std::sync::atomic::{AtomicBool, Ordering};

static RELOAD: AtomicBool = AtomicBool::new(false);
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_hup(_: libc::c_int) {
    RELOAD.store(true, Ordering::Relaxed);
}

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Installs the handlers: SIGHUP sets the reload flag, SIGTERM and SIGINT the stop flag.
pub fn install_signal_handlers() {
    // SAFETY: the handlers only store to atomics, which is async-signal-safe; sigaction with
    // SA_RESTART (through signal(2) on glibc) keeps blocking calls from failing with EINTR.
    unsafe {
        libc::signal(libc::SIGHUP, on_hup as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_stop as *const () as libc::sighandler_t);
    }
}

/// Whether a stop was requested by signal (or by [`request_stop`]).
pub fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Takes a pending reload request (SIGHUP, or [`request_reload`]): true once per request.
pub fn take_reload() -> bool {
    RELOAD.swap(false, Ordering::Relaxed)
}

/// Asks the run loop to stop, as SIGTERM would (for embedding the loop in tests and tools).
pub fn request_stop() {
    STOP.store(true, Ordering::Relaxed);
}

/// Asks the run loop to reload its config, as SIGHUP would.
pub fn request_reload() {
    RELOAD.store(true, Ordering::Relaxed);
}
