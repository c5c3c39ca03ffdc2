//! A SIGBUS handler installed after the ledger's own, in the way CPython's faulthandler is
//! (PYTHONFAULTHANDLER, pytest, torchrun's workers): on a fault it restores the previous handler
//! (the ledger's) and raises the signal again, which then carries no fault address. A
//! truncated ledger's fault must still be caught there; before, the ledger's handler took the
//! address-less signal for someone else's, restored the default action, and the retried
//! access killed the process. Its own test binary: it installs process-wide signal handlers.

use std::sync::atomic::{AtomicUsize, Ordering};

use node_ledger::Ledger;

/// The action faulthandler saved when it was enabled (the ledger's handler).
static SAVED: AtomicUsize = AtomicUsize::new(0);
static FATAL_ERRORS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn fatal_error(sig: libc::c_int) {
    FATAL_ERRORS.fetch_add(1, Ordering::SeqCst);
    // SAFETY: as faulthandler_fatal_error does: put the previous handler back and raise the
    // signal again (delivered at once thanks to SA_NODEFER).
    unsafe {
        let prev = SAVED.load(Ordering::SeqCst) as *const libc::sigaction;
        libc::sigaction(sig, prev, std::ptr::null_mut());
        libc::raise(sig);
    }
}

#[test]
fn a_truncated_ledger_survives_a_chained_fatal_error_handler() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("gpu0/ledger");
    let l = Ledger::open_or_create(&p, 0).unwrap();
    let g = l.group(node_ledger::ledger::group_id_for("c"), 1 << 30).unwrap();
    l.try_reserve_group(g, 1 << 20).unwrap();
    // faulthandler.enable(), after the ledger was mapped.
    // SAFETY: an all-zero sigaction is a valid value (SIG_DFL, empty mask), overwritten below.
    let saved: &'static mut libc::sigaction = Box::leak(Box::new(unsafe { std::mem::zeroed() }));
    // SAFETY: plain sigaction(2) calls with valid structs.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = fatal_error as *const () as usize;
        act.sa_flags = libc::SA_NODEFER;
        libc::sigemptyset(&mut act.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGBUS, &act, saved as *mut libc::sigaction), 0);
    }
    SAVED.store(saved as *const libc::sigaction as usize, Ordering::SeqCst);
    std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(0).unwrap();
    // The read faults: faulthandler's handler runs, then the ledger's through the raise.
    assert_eq!(l.group_used(g), 0, "the mapping reads zeros");
    assert_eq!(FATAL_ERRORS.load(Ordering::SeqCst), 1, "the chained handler saw the fault");
    assert!(l.check_header().is_err(), "the damage is seen");
}
