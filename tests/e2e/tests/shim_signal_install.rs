//! A SIGTERM/SIGINT that lands while the shim installs its signal handlers (during the
//! process's first driver call) must not be lost: the process ends by it, as it would without
//! the shim. The installation used to set each signal to SIG_IGN before registering the
//! shim's handler, and the kernel discards a signal whose action is SIG_IGN: a client
//! signalled in that window never exited (the stress tool's `client_hung`, 5 + 60 s).
//! `exit.test_install_pause_ms` holds the installation in that window every time.

mod shim_support;

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use e2e::{EmuChild, EmuHost};
use shim_support::*;

/// How long the shim pauses before changing each signal's action.
const PAUSE_MS: u64 = 1500;

/// A shimmed C client told to pause while installing its handlers, then create a context and
/// idle until killed.
fn paused_client(host: &EmuHost) -> EmuChild {
    let cfg = host.root().join("xcuda-install-pause.json");
    std::fs::write(&cfg, format!(r#"{{"exit": {{"test_install_pause_ms": {PAUSE_MS}}}}}"#)).unwrap();
    let mut c = limited(host, "shim_client", 1 << 30, "install");
    c.env("XCUDA_CONFIG", &cfg).args(["ctx", "ready", "hang"]);
    host.spawn(&mut c)
}

/// Waits until the client announces its `nth` installation pause (0: SIGINT's, 1: SIGTERM's).
fn wait_for_pause(c: &mut EmuChild, nth: usize) {
    let start = Instant::now();
    while c.stderr().matches("test pause while installing the signal handler").count() <= nth {
        assert!(c.alive(), "client ended before its install pause: {}", c.stderr());
        assert!(start.elapsed() < T, "no install pause announced: {}", c.stderr());
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn signal_during_install_ends_the_process(sig: i32, nth_pause: usize) {
    let host = EmuHost::new();
    let mut c = paused_client(&host);
    wait_for_pause(&mut c, nth_pause);
    c.signal(sig);
    // The pauses left (at most two) plus a generous bound for a loaded machine.
    let st = c.wait_timeout(Duration::from_millis(2 * PAUSE_MS) + Duration::from_secs(20));
    let err = c.stderr();
    if st.is_none() {
        c.kill9();
    }
    let st = st.unwrap_or_else(|| panic!("signal {sig} sent while the handlers were being installed was lost: the client never exited\n{err}"));
    assert_eq!(st.signal(), Some(sig), "{st:?}\n{err}");
}

#[test]
fn sigint_during_handler_install_is_not_lost() {
    signal_during_install_ends_the_process(libc::SIGINT, 0);
}

#[test]
fn sigterm_during_handler_install_is_not_lost() {
    signal_during_install_ends_the_process(libc::SIGTERM, 1);
}
