//! SIGTERM/SIGINT turn into a stop request the program loops poll (async-signal-safe: the
//! handler only stores an atomic).

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
    STOP.store(true, Ordering::SeqCst);
}

/// Installs the handler for SIGTERM and SIGINT.
pub fn install() -> std::io::Result<()> {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: sigaction is zero-initialisable; the handler only touches atomics, which is
        // async-signal-safe; no SA_SIGINFO, so sa_sigaction holds a plain handler.
        let rc = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Sets SIGTERM to SIG_IGN (replacing [`install`]'s handler): the process keeps running through
/// a SIGTERM, as an application that ignores the kubelet's does until its SIGKILL. Call it
/// before the driver is loaded, so that anything set up then (an LD_PRELOADed shim) finds
/// SIGTERM ignored. SIGINT keeps its handler.
pub fn ignore_sigterm() -> std::io::Result<()> {
    // SAFETY: sigaction is zero-initialisable; SIG_IGN is a valid disposition for SIGTERM.
    let rc = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = libc::SIG_IGN;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// True once SIGTERM or SIGINT arrived.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// The signal that requested the stop, if any.
pub fn received() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}
