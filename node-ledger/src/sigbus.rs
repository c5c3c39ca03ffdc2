//! Truncation of a mapped ledger must not kill the process with SIGBUS: a process-wide SIGBUS
//! handler (installed once, when the first ledger is mapped) maps anonymous zero pages over a
//! faulting ledger mapping and flags it damaged; the access then retries on zeros, the header
//! no longer validates and every user fails closed. A SIGBUS a process sends (no fault address)
//! while a ledger mapping is past its file's end is taken as that mapping's fault passed on by
//! a handler installed after ours (CPython's faulthandler re-raises it), and repaired alike.
//! Faults elsewhere go to the previous handler, or kill the process as SIGBUS always did.
//!
//! The handler allocates nothing and takes no lock: registered ranges live in fixed static
//! arrays of atomics, and it calls mmap(2), sigaction(2), getpid(2) and process_vm_readv(2)
//! only (async-signal-safe syscalls).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::Once;

/// Ledger mappings one process may have registered at once. A daemon maps, per GPU, the
/// GPU's ledger, the status file and one ledger per pod (pods gone within the grace
/// included): 64 was reachable on one GPU. A mapping that finds no slot is refused by its
/// opener ([`Guard::protected`]), never mapped unprotected: a tenant's truncation of its own
/// ledger would then kill the root daemon that reads it.
const SLOTS: usize = 1024;

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicUsize = AtomicUsize::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const NO: AtomicBool = AtomicBool::new(false);
/// Length of each registered mapping (0 = free slot); claimed first, by CAS.
static LEN: [AtomicUsize; SLOTS] = [ZERO; SLOTS];
/// Start address of each registered mapping (0 = not yet published / free).
static START: [AtomicUsize; SLOTS] = [ZERO; SLOTS];
/// Set by the handler when it replaced a slot's mapping with zero pages.
static FAULTED: [AtomicBool; SLOTS] = [NO; SLOTS];

struct Prev(std::cell::UnsafeCell<libc::sigaction>);
// SAFETY: written once inside `INSTALL.call_once`, before the handler that reads it is
// installed; only read afterwards.
unsafe impl Sync for Prev {}
// SAFETY: an all-zero sigaction is SIG_DFL with an empty mask.
static PREV: Prev = Prev(std::cell::UnsafeCell::new(unsafe { std::mem::zeroed() }));
static INSTALL: Once = Once::new();

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = if info.is_null() {
        0
    } else {
        (unsafe { (*info).si_addr() }) as usize
    };
    // SAFETY: as above.
    let sent = !info.is_null() && unsafe { (*info).si_code } <= 0;
    let mut repaired = false;
    for i in 0..SLOTS {
        let start = START[i].load(Acquire);
        let len = LEN[i].load(Acquire);
        if start == 0 || len == 0 {
            continue;
        }
        // A fault in this mapping; or, for a SIGBUS sent by a process (no fault address), a
        // mapping whose file no longer covers it. That is how a chained fatal-error handler
        // installed after ours passes the fault on: CPython's faulthandler (PYTHONFAULTHANDLER,
        // pytest, torchrun's workers) restores the previous handler, ours, and `raise`s the
        // signal, which carries no address; without this the retried access then died.
        let hit = if sent { !readable(start + len - 1) } else { addr >= start && addr - start < len };
        if !hit {
            continue;
        }
        // SAFETY: [start, start+len) is a live ledger mapping of this process (registered
        // while mapped, unregistered before unmapping); replacing it with private zero pages
        // keeps the address range valid for every reference into it.
        let p = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            FAULTED[i].store(true, Release);
            if !sent {
                return; // the faulting access retries on zeros
            }
            repaired = true;
        }
    }
    if repaired {
        // The sender's fault was in a ledger mapping that reads zeros now: it retries there.
        return;
    }
    // Not ours: the previous handler, or the default action (death by SIGBUS, as before).
    // SAFETY: PREV is only read here, after `install` wrote it.
    let prev = unsafe { &*PREV.0.get() };
    let h = prev.sa_sigaction;
    if h != libc::SIG_DFL && h != libc::SIG_IGN {
        if prev.sa_flags & libc::SA_SIGINFO != 0 {
            // SAFETY: the previous SA_SIGINFO handler, called as the kernel would.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(h) };
            f(sig, info, ctx);
        } else {
            // SAFETY: the previous plain handler, called as the kernel would.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
            f(sig);
        }
        return;
    }
    // SAFETY: restoring the default action; returning re-executes the faulting access, which
    // now takes it.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
    }
}

/// Whether this process can read the byte at `addr` without a fault: `process_vm_readv` on
/// itself, which answers EFAULT where an access would fault (a page past the end of a
/// truncated file) instead of raising SIGBUS. A raw syscall: async-signal-safe.
fn readable(addr: usize) -> bool {
    let mut byte = 0u8;
    let local = libc::iovec { iov_base: (&mut byte as *mut u8).cast(), iov_len: 1 };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: 1 };
    // SAFETY: reads one byte of this process's own memory into `byte`; a bad address is an
    // error return, never a fault.
    let n = unsafe { libc::syscall(libc::SYS_process_vm_readv, libc::getpid(), &local, 1usize, &remote, 1usize, 0usize) };
    n == 1
}

fn install() {
    INSTALL.call_once(|| {
        // SAFETY: plain sigaction(2) calls with valid structs; PREV is written before our
        // handler can run.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_sigbus as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(libc::SIGBUS, std::ptr::null(), PREV.0.get());
            libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut());
        }
    });
}

/// A registered ledger mapping; unregisters on drop (drop it before unmapping).
#[derive(Debug)]
pub struct Guard(Option<usize>);

impl Guard {
    /// Registers `[start, start+len)` (installing the handler on first use). With every slot
    /// taken the mapping is not protected ([`Guard::protected`] false): the caller refuses it.
    pub fn register(start: usize, len: usize) -> Guard {
        install();
        for i in 0..SLOTS {
            if LEN[i].compare_exchange(0, len, AcqRel, Relaxed).is_ok() {
                FAULTED[i].store(false, Relaxed);
                START[i].store(start, Release);
                return Guard(Some(i));
            }
        }
        Guard(None)
    }

    /// Whether the mapping is registered with the handler (a slot was free).
    pub fn protected(&self) -> bool {
        self.0.is_some()
    }

    /// Whether a truncation was caught on this mapping (it now reads zeros).
    pub fn faulted(&self) -> bool {
        self.0.is_some_and(|i| FAULTED[i].load(Acquire))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            START[i].store(0, Release);
            LEN[i].store(0, Release);
        }
    }
}
