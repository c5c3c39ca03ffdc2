//! Graceful exit: SIGINT/SIGTERM freeze launches (handler touches atomics and a pipe only), a
//! helper thread synchronises, releases contexts (default action) or hands the signal to the
//! application's own handler; contexts are also released at normal exit; fork children start
//! clean. Also owns the registry of contexts this process holds.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicU8, Ordering::*};
use std::cell::{Cell, UnsafeCell};
use std::sync::Once;

use cuda_abi::{CUcontext, CUdevice, CUresult};

use crate::config::Config;
use crate::ptrmap::PtrMap;
use crate::state::{self, call_real};

/// Most `CUdevice` ordinals the shim tracks (contexts, quotas, throttles).
pub const MAX_DEVICES: usize = 64;

/// Contexts this process created or retained, so they can be released before it dies.
pub struct Contexts {
    created: PtrMap,
    primary: [AtomicU32; MAX_DEVICES],
    /// The primary context's handle per device, as last retained (0 = never seen).
    primary_handle: [AtomicU64; MAX_DEVICES],
}

impl Default for Contexts {
    fn default() -> Self {
        Self::new()
    }
}

impl Contexts {
    /// An empty registry.
    pub fn new() -> Self {
        Self {
            created: PtrMap::new(256),
            primary: [const { AtomicU32::new(0) }; MAX_DEVICES],
            primary_handle: [const { AtomicU64::new(0) }; MAX_DEVICES],
        }
    }

    /// A context from cuCtxCreate*: false when the registry is full (256 live contexts), so it
    /// could not be released before the process dies.
    #[must_use]
    pub fn created(&self, ctx: CUcontext) -> bool {
        self.created.insert(ctx as u64, 1)
    }

    /// A context destroyed by the application.
    pub fn destroyed(&self, ctx: CUcontext) {
        self.created.remove(ctx as u64);
    }

    /// A primary-context retain on `dev` that returned `ctx`.
    pub fn retained(&self, dev: CUdevice, ctx: CUcontext) {
        if let Some(c) = self.primary.get(dev as usize) {
            c.fetch_add(1, Relaxed);
        }
        if let Some(h) = self.primary_handle.get(dev as usize) {
            if !ctx.is_null() {
                h.store(ctx as u64, Relaxed);
            }
        }
    }

    /// The primary context of `dev` as last retained through us (0 = unknown).
    pub fn primary_handle(&self, dev: CUdevice) -> u64 {
        self.primary_handle.get(dev as usize).map_or(0, |h| h.load(Relaxed))
    }

    /// A primary-context release on `dev`.
    pub fn released(&self, dev: CUdevice) {
        if let Some(c) = self.primary.get(dev as usize) {
            let _ = c.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(1)));
        }
    }

    /// Retains outstanding per device, for tests and logs.
    pub fn retains(&self, dev: CUdevice) -> u32 {
        self.primary.get(dev as usize).map_or(0, |c| c.load(Relaxed))
    }

    /// Waits for all work of every held context to finish.
    pub fn synchronize_all(&self) {
        for (key, _) in self.created.entries() {
            sync_in(key as CUcontext);
        }
        for (dev, count) in self.primary.iter().enumerate() {
            if count.load(Relaxed) > 0 {
                if let Some(ctx) = primary_ctx(dev as CUdevice) {
                    sync_in(ctx);
                    call_real!(cuDevicePrimaryCtxRelease_v2: cuda_abi::PFN_cuDevicePrimaryCtxRelease_v11000, dev as CUdevice);
                }
            }
        }
    }

    /// Synchronises, then destroys created contexts and drops every primary retain.
    pub fn release_all(&self) -> usize {
        let mut n = 0;
        for (key, _) in self.created.entries() {
            let ctx = key as CUcontext;
            sync_in(ctx);
            let rc = call_real!(cuCtxDestroy_v2: cuda_abi::PFN_cuCtxDestroy_v4000, ctx);
            tracing::info!(?ctx, rc = rc.0, "xcuda: destroyed context before exit");
            self.created.remove(key);
            n += 1;
        }
        for (dev, count) in self.primary.iter().enumerate() {
            let held = count.swap(0, AcqRel);
            if held == 0 {
                continue;
            }
            test_pause();
            if let Some(ctx) = primary_ctx(dev as CUdevice) {
                sync_in(ctx);
                // Our own retain in primary_ctx adds one.
                for _ in 0..=held {
                    call_real!(cuDevicePrimaryCtxRelease_v2: cuda_abi::PFN_cuDevicePrimaryCtxRelease_v11000, dev as CUdevice);
                }
            }
            tracing::info!(dev, held, "xcuda: released primary context before exit");
            n += 1;
        }
        n
    }

    pub(crate) fn clear(&self) {
        self.created.clear();
        for c in &self.primary {
            c.store(0, Relaxed);
        }
    }
}

/// Fault injection for tests only (`exit.test_release_pause_ms`, default 0): widens the window
/// in which a release is in progress, so races with it show up every time.
static TEST_PAUSE_MS: AtomicU64 = AtomicU64::new(0);

/// Fault injection for tests only (`exit.test_raise_delay_ms`, default 0): delays the signal
/// helper's re-raise after the release, so an exit racing with it wins every time.
static TEST_RAISE_DELAY_MS: AtomicU64 = AtomicU64::new(0);

/// Fault injection for tests only (`exit.test_sigaction_hold_ms`, default 0): holds the lock on
/// the application's signal actions inside our `sigaction`, so a fork racing with it lands
/// while it is held every time.
static TEST_SIGACTION_HOLD_MS: AtomicU64 = AtomicU64::new(0);

fn test_pause() {
    let ms = TEST_PAUSE_MS.load(Relaxed);
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

// ---- the one release of this process's contexts ----------------------------------------------
//
// The exit path (atexit) and the signal helper (default action of SIGINT/SIGTERM) both want to
// release every context before the process is gone, and can run at the same time: CPython, after
// KeyboardInterrupt, finalises and then kills itself with SIGINT while returning from main, so the
// helper's release and the exit path's race. One atomic decides: the first to move it from IDLE
// to RELEASING does the release; the other waits (bounded) until it reads RELEASED. So never both
// (no double destroy), never neither, and the default action of a fatal signal is taken only
// after the release is complete (or its time is up: a hung driver must not keep the process).

const IDLE: u8 = 0;
const RELEASING: u8 = 1;
const RELEASED: u8 = 2;
static RELEASE: AtomicU8 = AtomicU8::new(IDLE);

/// What one call to [`release_once`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// This caller released this many contexts.
    Released(usize),
    /// Another caller's release was in progress; this one waited until it completed.
    WaitedForOther,
    /// Already released before this call.
    AlreadyDone,
    /// The release (ours or another's) did not complete within the release timeout.
    TimedOut,
}

/// Releases every context and leaves the quota, exactly once per process; concurrent callers
/// wait for the one doing it (at most `exit.release_timeout_ms`). Never call from a signal
/// handler (it spawns a thread and sleeps); the handler wakes the helper thread instead.
///
/// The state is looked up only after the creation gate is closed and the creations in flight
/// have finished, so a signal that lands before `cuInit` built the state, or while a context is
/// being created, still releases whatever was created.
pub fn release_once(what: &str) -> ReleaseOutcome {
    release_once_with(what, move || {
        wait_for_creations();
        let Some(st) = state::get() else { return 0 };
        // Each context is synchronised before it goes: a capture in progress would make that
        // synchronisation a refusal that waits for nothing.
        let (n, _) = crate::capture::quiesced(crate::capture::wait_limit(), || st.contexts.release_all());
        st.quotas().for_each(|q| q.retire());
        n
    })
}

fn release_once_with(what: &str, release: impl FnOnce() -> usize + Send + 'static) -> ReleaseOutcome {
    let limit = std::time::Duration::from_millis(state::config().exit.release_timeout_ms);
    // SeqCst pairs with CreationGate::enter (store-then-load on both sides): either the
    // creator sees RELEASING and refuses, or wait_for_creations sees it in flight.
    match RELEASE.compare_exchange(IDLE, RELEASING, SeqCst, SeqCst) {
        Ok(_) => {
            // No thread to run it on: released on this thread anyway (see `with_deadline`).
            let n = with_deadline(what, true, move || {
                let n = release();
                RELEASE.store(RELEASED, Release);
                n
            });
            n.map_or(ReleaseOutcome::TimedOut, ReleaseOutcome::Released)
        }
        Err(RELEASED) => ReleaseOutcome::AlreadyDone,
        Err(_) => {
            let start = std::time::Instant::now();
            while RELEASE.load(Acquire) != RELEASED {
                if start.elapsed() >= limit {
                    tracing::error!(timeout_ms = limit.as_millis() as u64, "xcuda: gave up waiting for the release in progress to {what}");
                    return ReleaseOutcome::TimedOut;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            ReleaseOutcome::WaitedForOther
        }
    }
}

// ---- the creation gate ------------------------------------------------------------------------
//
// Context-creating entry points (cuCtxCreate*, cuDevicePrimaryCtxRetain) hold a CreationGate
// across the driver call and the recording of its result. Once a release has started the gate
// refuses (the entry point answers CUDA_ERROR_DEINITIALIZED, as the driver does while it shuts
// down), and the release waits for creations already inside the gate, so no context is created
// after the release looked and left alive when the process dies. Not a hot path.

/// How long a refused context creation waits after the release for a re-raised signal to end
/// the process before it answers `CUDA_ERROR_DEINITIALIZED`.
const REFUSED_CREATION_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

/// Context creations in progress (inside a CreationGate).
static CREATING: AtomicU32 = AtomicU32::new(0);

/// Held across one context creation; see above.
pub struct CreationGate(());

impl CreationGate {
    /// Enters the gate, or None at once if a release has started (no wait: for work that is
    /// simply skipped then, such as a synchronisation).
    pub fn try_enter() -> Option<Self> {
        CREATING.fetch_add(1, SeqCst);
        if RELEASE.load(SeqCst) != IDLE {
            CREATING.fetch_sub(1, SeqCst);
            return None;
        }
        Some(Self(()))
    }

    /// Enters the gate, or None once a release has started (the caller must refuse).
    ///
    /// A refused caller first waits (bounded by `exit.release_timeout_ms`) for the release to
    /// finish, plus a short grace: on the signal path the helper re-raises the signal right
    /// after the release, so the process ends by that signal rather than by the application
    /// reacting to an error code (a C client exiting 2 instead of dying of SIGTERM).
    pub fn enter() -> Option<Self> {
        CREATING.fetch_add(1, SeqCst);
        if RELEASE.load(SeqCst) != IDLE {
            CREATING.fetch_sub(1, SeqCst);
            let limit = std::time::Duration::from_millis(state::config().exit.release_timeout_ms);
            let start = std::time::Instant::now();
            while RELEASE.load(Acquire) != RELEASED && start.elapsed() < limit {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            std::thread::sleep(REFUSED_CREATION_GRACE);
            return None;
        }
        Some(Self(()))
    }
}

impl Drop for CreationGate {
    fn drop(&mut self) {
        CREATING.fetch_sub(1, SeqCst);
    }
}

/// Waits until no creation is in progress (called with the gate closed, so none can start).
/// Bounded by the caller's deadline (it runs inside with_deadline).
fn wait_for_creations() {
    let mut logged = false;
    while CREATING.load(SeqCst) != 0 {
        if !logged {
            tracing::info!("xcuda: waiting for a context creation in progress before releasing");
            logged = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Whether a release has started (or finished) in this process.
pub fn release_started() -> bool {
    RELEASE.load(Acquire) != IDLE
}

/// The calling thread's current context (0 if none or unknown): the owner of a new allocation.
pub fn current_context() -> u64 {
    let mut ctx: CUcontext = std::ptr::null_mut();
    match call_real!(cuCtxGetCurrent: cuda_abi::PFN_cuCtxGetCurrent_v4000, &mut ctx) {
        CUresult::CUDA_SUCCESS => ctx as u64,
        _ => 0,
    }
}

/// Whether `dev`'s primary context is active (true when it cannot be told).
pub fn primary_active(dev: CUdevice) -> bool {
    let (mut flags, mut active): (std::ffi::c_uint, c_int) = (0, 0);
    match call_real!(cuDevicePrimaryCtxGetState: cuda_abi::PFN_cuDevicePrimaryCtxGetState_v7000, dev, &mut flags, &mut active) {
        CUresult::CUDA_SUCCESS => active != 0,
        _ => true,
    }
}

fn primary_ctx(dev: CUdevice) -> Option<CUcontext> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    let rc = call_real!(cuDevicePrimaryCtxRetain: cuda_abi::PFN_cuDevicePrimaryCtxRetain_v7000, &mut ctx, dev);
    (rc == CUresult::CUDA_SUCCESS && !ctx.is_null()).then_some(ctx)
}

fn sync_in(ctx: CUcontext) {
    if call_real!(cuCtxPushCurrent_v2: cuda_abi::PFN_cuCtxPushCurrent_v4000, ctx) == CUresult::CUDA_SUCCESS {
        call_real!(cuCtxSynchronize: cuda_abi::PFN_cuCtxSynchronize_v2000,);
        let mut popped: CUcontext = std::ptr::null_mut();
        call_real!(cuCtxPopCurrent_v2: cuda_abi::PFN_cuCtxPopCurrent_v4000, &mut popped);
    }
}

const SIGS: [c_int; 2] = [libc::SIGINT, libc::SIGTERM];

/// Our handlers are installed; the application's actions for SIGS live in `APP_ACTIONS`.
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Set while we install our own handlers (our `sigaction` export passes those through).
static INSTALLING: AtomicBool = AtomicBool::new(false);
static PIPE_WR: AtomicI32 = AtomicI32::new(-1);
/// The exit helper's end of the pipe (closed in fork children, which have no helper).
static PIPE_RD: AtomicI32 = AtomicI32::new(-1);
static APP_ACTIONS: ActionsLock = ActionsLock::new();
static PROCESS_HOOKS: Once = Once::new();
/// The signal whose application action the helper has put in the kernel for a moment, to run
/// the application's handler ([`handle_signal`]); 0 = none. Written under `APP_ACTIONS`. An
/// action the application sets for it meanwhile (its handler's `signal(sig, SIG_DFL)` before
/// re-raising, the glibc manual's idiom) is recorded and the shim's handler put back at once,
/// so the re-raised signal comes back through the shim and is handled with the new action.
static FORWARDING: AtomicI32 = AtomicI32::new(0);

/// When the first SIGTERM arrived (monotonic ns, set in the signal handler:
/// `clock_gettime` is async-signal-safe); 0 = none yet. The kubelet's grace runs from it, not
/// from when the helper thread got to it (behind an earlier signal's synchronisation).
static SIGTERM_AT_NS: AtomicU64 = AtomicU64::new(0);
/// The drain before an expected SIGKILL has been armed ([`crate::config::ExitConfig::drain_before_kill_ms`]).
static DRAIN_ARMED: AtomicBool = AtomicBool::new(false);
/// The drain has begun: launches stay frozen (the SIGKILL is coming), whatever a later signal's
/// handling would unfreeze, until the drain gives up waiting for the kill ([`drain_thread`]).
static DRAINED: AtomicBool = AtomicBool::new(false);
/// How long after the expected SIGKILL a drained process gives up on it and launches again, ms:
/// the SIGTERM was not the kubelet's (a launcher's, an application's own), or its grace was
/// longer than the pod's spec said.
const RESUME_AFTER_KILL_MS: u64 = 10_000;

/// How often the drain thread reads the pod's termination file while it waits
/// ([`crate::config::ExitConfig::termination_file`]): node-agent writes it when its watch sees
/// the deletion, about when the kubelet's SIGTERM comes.
const TERMINATION_POLL_MS: u64 = 100;
/// How long the drain thread reads a termination file that says nothing, when no grace is
/// known either (a SIGTERM that was not the kubelet's, or a node-agent that never writes).
const TERMINATION_WAIT_MS: u64 = 600_000;

/// Arms the drain after SIGTERM `sig` (the first one: the kubelet's grace runs from it), when
/// a drain is wanted (`exit.drain_before_kill_ms`) and the expected SIGKILL's time is known
/// (`exit.kill_grace_ms`, node-agent's `XCUDA_KILL_GRACE_MS`) or may become known (the pod's
/// termination file, `XCUDA_TERMINATION_FILE`): a thread of its own waits for the drain's time
/// (the controller thread ends when a daemon asks the process to leave, so it cannot be the
/// one).
fn arm_drain(sig: c_int) {
    if sig != libc::SIGTERM || DRAIN_ARMED.load(Acquire) {
        return;
    }
    let e = &state::config().exit;
    if e.drain_before_kill_ms == 0 || (e.kill_grace_ms == 0 && e.termination_file.is_none()) {
        return;
    }
    let term_ns = match SIGTERM_AT_NS.load(Acquire) {
        0 => node_ledger::clock::now_ns(),
        t => t,
    };
    start_drain_thread(term_ns, "SIGTERM");
}

/// Checks the pod's termination file (the controller's housekeeping, every 250 ms: one
/// `stat` while it is empty): a deletion written there arms the drain whether or not a SIGTERM
/// reaches this process. The kubelet signals the container's PID 1 only: a GPU process behind
/// a PID 1 that does not forward SIGTERM (`sh -c`, a launcher), or under a `STOPSIGNAL` other
/// than SIGTERM, gets no SIGTERM, and the SIGKILL still comes at the deletion's end. The
/// deletion's grace then runs from when it is seen here, close to when the kubelet saw it.
pub fn watch_termination_file() {
    if DRAIN_ARMED.load(Acquire) {
        return;
    }
    let e = &state::config().exit;
    let Some(path) = e.termination_file.as_deref() else { return };
    if e.drain_before_kill_ms == 0 || !std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
        return;
    }
    // A write in progress is read again at the next housekeeping; a file that never reads is
    // said once.
    match node_ledger::termination::read(path) {
        Ok(Some(_)) => {}
        Ok(None) => return,
        Err(err) => {
            static SAID: AtomicBool = AtomicBool::new(false);
            if !SAID.swap(true, Relaxed) {
                tracing::warn!("xcuda: the pod's termination file does not read (read again every 250 ms; until it does, only a SIGTERM arms the drain): {err}");
            }
            return;
        }
    }
    start_drain_thread(node_ledger::clock::now_ns(), "the pod's termination file");
}

/// Starts the drain thread of a kill whose grace runs from `term_ns` (monotonic), once per
/// process (`DRAIN_ARMED`), saying what armed it.
fn start_drain_thread(term_ns: u64, by: &'static str) {
    if DRAIN_ARMED.swap(true, AcqRel) {
        return;
    }
    let e = &state::config().exit;
    tracing::info!(
        armed_by = by,
        kill_grace_ms = e.kill_grace_ms,
        termination_file = ?e.termination_file,
        "xcuda: should the process still run then, launches stop and the GPU is drained before the expected SIGKILL"
    );
    if let Err(err) = spawn_shim_thread("xcuda-drain", move || drain_thread(term_ns)) {
        DRAIN_ARMED.store(false, Release);
        tracing::error!("xcuda: cannot start a thread to drain the GPU before the expected SIGKILL: {err}");
    }
}

/// When a drain is due (monotonic ns) for a SIGKILL expected at `kill_ns`: `drain_before_kill_ms`
/// before it, or at once when that is before the SIGTERM at `term_ns`.
fn drain_at(term_ns: u64, kill_ns: u64, e: &crate::config::ExitConfig) -> u64 {
    kill_ns.saturating_sub(e.drain_before_kill_ms.saturating_mul(1_000_000)).max(term_ns)
}

/// The SIGKILL the drain waits for, as known so far after a SIGTERM (or a deletion seen) at
/// `term_ns` (monotonic ns): the pod's grace from it (`exit.kill_grace_ms`) until the pod's
/// termination file says how the kubelet kills it, which then decides, shorter or longer than
/// the spec's (the kubelet takes the deletion's grace first:
/// [`node_ledger::termination::Termination::kill_ns`]); a later reading only brings it
/// earlier. A reading that does not parse is a write in progress and is read again later.
struct KillClock {
    term_ns: u64,
    /// By the pod's spec grace, if known.
    spec_ns: Option<u64>,
    /// By the deletion readings (the earliest), once one was read.
    deletion_ns: Option<u64>,
    read: Option<node_ledger::termination::Termination>,
    said_error: bool,
}

impl KillClock {
    fn new(term_ns: u64, e: &crate::config::ExitConfig) -> Self {
        let spec_ns = (e.kill_grace_ms != 0).then(|| term_ns.saturating_add(e.kill_grace_ms.saturating_mul(1_000_000)));
        KillClock { term_ns, spec_ns, deletion_ns: None, read: None, said_error: false }
    }

    /// The expected kill, if known.
    fn kill_ns(&self) -> Option<u64> {
        self.deletion_ns.or(self.spec_ns)
    }

    /// Whether a deletion was read: the kill is certain, however late it comes.
    fn deletion_seen(&self) -> bool {
        self.deletion_ns.is_some()
    }

    /// Takes reading `r` of the termination file made at monotonic `now_ns` = `now_unix_ms`.
    fn take(&mut self, r: Result<Option<node_ledger::termination::Termination>, String>, now_ns: u64, now_unix_ms: u64) {
        match r {
            Ok(Some(t)) if self.read != Some(t) => {
                self.read = Some(t);
                let k = t.kill_ns(now_ns, now_unix_ms, self.term_ns);
                self.deletion_ns = Some(self.deletion_ns.map_or(k, |old| old.min(k)));
                tracing::warn!(
                    grace_ms = t.grace_ms,
                    deletion_unix_ms = t.deletion_unix_ms,
                    kill_in_ms = self.deletion_ns.map(|k| k.saturating_sub(now_ns) / 1_000_000),
                    spec_kill_in_ms = self.spec_ns.map(|k| k.saturating_sub(now_ns) / 1_000_000),
                    "xcuda: the pod is being deleted or evicted (its termination file): the SIGKILL is expected then, by that grace"
                );
            }
            Ok(_) => {}
            Err(err) => {
                if !std::mem::replace(&mut self.said_error, true) {
                    tracing::warn!("xcuda: the pod's termination file does not read (a write in progress is read again): {err}");
                }
            }
        }
    }

    /// Reads the termination file at `path`, if there is one.
    fn poll(&mut self, path: Option<&std::path::Path>) {
        if let Some(path) = path {
            self.take(node_ledger::termination::read(path), node_ledger::clock::now_ns(), unix_ms());
        }
    }
}

/// The wall clock, ms since the epoch.
fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Sleeps until monotonic `ns` (absolute; a signal's interruption sleeps on).
fn sleep_until_ns(ns: u64) {
    let ts = libc::timespec { tv_sec: (ns / 1_000_000_000) as libc::time_t, tv_nsec: (ns % 1_000_000_000) as libc::c_long };
    // SAFETY: a valid timespec; no remainder is asked for (absolute sleep).
    while unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) } == libc::EINTR {}
}

/// Whether launches are stopped for good (the drain before an expected SIGKILL began).
pub fn drained() -> bool {
    DRAINED.load(Acquire)
}

/// The drain thread of a SIGTERM (or a deletion seen, [`watch_termination_file`]) at `term_ns`: it waits
/// for the drain's time, reading the pod's termination file every [`TERMINATION_POLL_MS`]
/// meanwhile when there is one (the kubelet kills by a deletion's grace, shorter or longer
/// than the spec's), then every GPU's launches are frozen and the process's contexts
/// synchronised (at most `exit.release_timeout_ms`), so that the SIGKILL finds no kernel of
/// this process in flight. Under MPS a client killed mid-kernel can take the server's other
/// clients down (the online workload); one killed between kernels harms nobody. Contexts are
/// kept: the application may still copy its state out (copies are not throttled). Should the
/// kill not come within [`RESUME_AFTER_KILL_MS`] of the time the spec's grace gave, launches
/// resume (the SIGTERM was not the kubelet's: a process frozen for ever would hold its quota
/// for ever) — never once the file recorded a deletion, whose kill is certain however late.
fn drain_thread(term_ns: u64) {
    let _log = state::log_on_this_thread();
    let e = &state::config().exit;
    let file = e.termination_file.as_deref();
    let mut clock = KillClock::new(term_ns, e);
    let poll_ns = TERMINATION_POLL_MS * 1_000_000;
    let kill_ns = loop {
        clock.poll(file);
        let now = node_ledger::clock::now_ns();
        match clock.kill_ns() {
            Some(k) if now >= drain_at(term_ns, k, e) => break k,
            Some(k) if file.is_none() => sleep_until_ns(drain_at(term_ns, k, e)),
            Some(k) => sleep_until_ns(drain_at(term_ns, k, e).min(now.saturating_add(poll_ns))),
            None if now.saturating_sub(term_ns) > TERMINATION_WAIT_MS * 1_000_000 => {
                // Nothing came.
                disarm(term_ns);
                return;
            }
            None => sleep_until_ns(now.saturating_add(poll_ns)),
        }
    };
    let Some(st) = state::get() else { return };
    if DRAINED.swap(true, AcqRel) {
        return;
    }
    st.throttles().for_each(|t| t.freeze());
    tracing::warn!(
        kill_in_ms = kill_ns.saturating_sub(node_ledger::clock::now_ns()) / 1_000_000,
        drain_before_kill_ms = e.drain_before_kill_ms,
        by_deletion = clock.deletion_seen(),
        "xcuda: the process still runs before its expected SIGKILL: kernel launches stopped, draining the GPU"
    );
    // The captures in progress get half the drain's margin at most: the synchronisation must
    // be done before the SIGKILL it drains for.
    let capture_wait = crate::capture::wait_limit().min(std::time::Duration::from_millis(e.drain_before_kill_ms / 2));
    if let Some(done) = synchronize_unless_released(st, "drain the GPU before the expected SIGKILL", capture_wait) {
        tracing::warn!(drained = done, "xcuda: GPU drained; launches stay stopped until the SIGKILL");
    }
    // Until the spec's kill is long past, still looking for a deletion (which keeps the drain).
    loop {
        clock.poll(file);
        if release_started() || clock.deletion_seen() {
            return;
        }
        let now = node_ledger::clock::now_ns();
        let resume = kill_ns.saturating_add(RESUME_AFTER_KILL_MS * 1_000_000);
        if now >= resume {
            break;
        }
        sleep_until_ns(if file.is_some() { resume.min(now.saturating_add(poll_ns)) } else { resume });
    }
    if !DRAINED.swap(false, AcqRel) {
        return;
    }
    st.throttles().for_each(|t| t.unfreeze());
    tracing::warn!(waited_ms = RESUME_AFTER_KILL_MS, "xcuda: the expected SIGKILL did not come: launches resume (the SIGTERM was not the kubelet's, or its grace was longer than XCUDA_KILL_GRACE_MS)");
    disarm(term_ns);
}

/// The drain armed at `term_ns` is over without a kill: the next SIGTERM arms it again from its
/// own time, and the housekeeping on a deletion in the termination file (one written while
/// this drain ended included).
fn disarm(term_ns: u64) {
    let _ = SIGTERM_AT_NS.compare_exchange(term_ns, 0, AcqRel, Acquire);
    DRAIN_ARMED.store(false, Release);
}

/// Synchronises every context of `st` (at most `exit.release_timeout_ms`) unless a release has
/// begun, as a creation in progress ([`CreationGate`]): the sync retains each primary context,
/// which after a release would bring it back to life (a new MPS client), and a release that
/// begins meanwhile waits for it instead of destroying the contexts it is synchronising.
/// `None`: a release had begun; else whether it completed in time.
fn synchronize_unless_released(st: &'static state::State, what: &str, capture_wait: std::time::Duration) -> Option<bool> {
    // No thread to run it on: skipped (unbounded here, it could keep the signal's own
    // handling waiting for ever behind a hung kernel).
    let entered = with_deadline(what, false, move || {
        let Some(_gate) = CreationGate::try_enter() else { return false };
        // After the captures in progress end: a synchronisation would break them (CUDA forbids
        // synchronising a context while a stream of it captures) and wait for nothing.
        crate::capture::quiesced(capture_wait, || st.contexts.synchronize_all());
        true
    });
    match entered {
        Some(false) => None,
        Some(true) => Some(true),
        None => Some(false),
    }
}

/// The application's actions for SIGS behind a small lock of our own (not a std `Mutex`): the
/// fork hooks take it in the prepare handler and release it in the parent and child handlers,
/// so a child always reads a complete copy. (The child handler used to `try_lock` a std Mutex
/// and, when another thread held it at the moment of fork, left the shim's handler in the
/// child with no helper thread behind it: every SIGINT/SIGTERM to the child was lost, and its
/// byte on the shared pipe woke the *parent's* helper instead.) Never taken in a signal
/// handler. Holders: `install_signal_handlers`, `app_sigaction`, `handle_signal` (a copy, and
/// each swap of the kernel's action around its raise, never the raise itself) and a fork
/// between its prepare and parent/child hooks.
///
/// Every holder blocks all signals on its own thread *before* taking the lock and restores its
/// mask only *after* releasing it ([`ActionsLock::acquire`] / [`ActionsLock::release`], and
/// [`ActionsGuard`] for the scoped holders). Otherwise a signal delivered to the holder (a
/// SIGUSR1, SIGALRM, SIGCHLD, a crash reporter's SIGSEGV sent with pthread_kill) ran the
/// application's handler on that thread, and a handler that sets SIGINT/SIGTERM's action
/// (resetting handlers to SIG_DFL before re-raising is common) came back into `app_sigaction`
/// and spun forever on the lock its own thread held: the process hung (`shim_sigaction_nested`).
/// Now such a signal stays pending until the lock is free and is delivered then, before the
/// holder's call returns. So no handler ever runs on a thread that holds the lock: a fork from
/// a signal handler never finds its own thread holding it (the prepare hook used to check for
/// that case by thread id; it cannot happen any more). What a holder runs must not itself fork
/// or set SIGINT/SIGTERM.
///
/// Synchronous fault signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS) are blocked
/// too, on purpose: the critical sections touch only our own memory (`app_sigaction` reads
/// and writes the caller's pointers outside the lock), so a fault inside one is a shim bug,
/// and for a fault raised while its signal is blocked the kernel takes the default action (the
/// process dies with a core dump) rather than running the application's crash handler, which
/// could call `sigaction` and hang on the lock. Loud, never a hang. SIGKILL/SIGSTOP cannot be
/// blocked, and glibc keeps its two internal signals (cancellation, setxid) unblocked; their
/// handlers never call `sigaction`.
struct ActionsLock {
    held: AtomicBool,
    actions: UnsafeCell<[Option<libc::sigaction>; 2]>,
}

// SAFETY: `actions` is only reached through an ActionsGuard (or by a fork hook that holds the
// lock, or in the single-threaded child), and `held` admits one holder at a time.
unsafe impl Sync for ActionsLock {}

impl ActionsLock {
    const fn new() -> Self {
        Self { held: AtomicBool::new(false), actions: UnsafeCell::new([None, None]) }
    }

    /// Blocks every signal on this thread, then spins (yielding) until the lock is ours;
    /// returns the thread's mask as it was, for [`ActionsLock::release`]. Holders keep it for
    /// a copy or one sigaction(2) call (the install also for its test-only pause): never long.
    fn acquire(&self) -> SavedMask {
        let saved = block_all_signals();
        while self.held.compare_exchange_weak(false, true, Acquire, Relaxed).is_err() {
            std::thread::yield_now();
        }
        saved
    }

    /// Releases the lock, then puts back this thread's mask as [`ActionsLock::acquire`] saved
    /// it (on the same thread, or in a fork child on the forking thread's copy): signals that
    /// arrived meanwhile are delivered now, with the lock free.
    fn release(&self, saved: SavedMask) {
        self.held.store(false, Release);
        restore_signals(saved);
    }

    fn lock(&self) -> ActionsGuard<'_> {
        let saved = self.acquire();
        ActionsGuard { lock: self, saved }
    }
}

/// A thread's signal mask from before [`block_all_signals`] (`None`: pthread_sigmask failed,
/// which it cannot with these arguments, and nothing was changed).
#[derive(Clone, Copy)]
#[must_use = "the thread's signal mask must be restored"]
struct SavedMask(Option<libc::sigset_t>);

/// Blocks every blockable signal on the calling thread; returns its previous mask.
fn block_all_signals() -> SavedMask {
    // SAFETY: sigfillset on a local set; pthread_sigmask changes the calling thread's mask only
    // and writes the old one to a local.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        let mut old: libc::sigset_t = std::mem::zeroed();
        SavedMask((libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old) == 0).then_some(old))
    }
}

/// Sets the calling thread's mask back to `saved` (nothing if it was not saved).
fn restore_signals(saved: SavedMask) {
    if let Some(old) = saved.0 {
        // SAFETY: a mask pthread_sigmask returned; it changes the calling thread's mask only.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    }
}

/// Blocks every asynchronous signal on the calling thread (all but the synchronous fault
/// signals, which must still reach their handlers: the ledger's SIGBUS repair runs on whichever
/// thread touched a truncated mapping); returns its previous mask.
fn block_async_signals() -> SavedMask {
    // SAFETY: sigset operations on a local set; pthread_sigmask changes the calling thread's
    // mask only and writes the old one to a local.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for s in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS] {
            libc::sigdelset(&mut set, s);
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        SavedMask((libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) == 0).then_some(old))
    }
}

/// Starts one of the shim's own threads with every asynchronous signal blocked from its first
/// instruction (the mask is inherited from the spawning thread, blocked around the spawn), so
/// that the kernel never picks a shim thread for a process-directed signal: SIGINT/SIGTERM an
/// application blocks everywhere and reads through `signalfd` or `sigwait` stays its own, and
/// no application handler runs on a shim thread. (The exit helper used to unblock SIGINT and
/// SIGTERM, and the controller inherited whatever mask its spawner had: a SIGTERM for an
/// event-loop server was taken by the shim, which released its contexts and killed it.)
pub(crate) fn spawn_shim_thread<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    let saved = block_async_signals();
    let r = std::thread::Builder::new().name(name.into()).spawn(f);
    restore_signals(saved);
    r
}

/// Exclusive access to the application's actions; releases the lock and restores the thread's
/// signal mask when dropped (also when unwinding, so a panic cannot leave it held or leave the
/// thread's signals blocked).
struct ActionsGuard<'a> {
    lock: &'a ActionsLock,
    saved: SavedMask,
}

impl std::ops::Deref for ActionsGuard<'_> {
    type Target = [Option<libc::sigaction>; 2];
    fn deref(&self) -> &Self::Target {
        // SAFETY: we hold the lock: no one else reaches `actions` until we drop it.
        unsafe { &*self.lock.actions.get() }
    }
}

impl std::ops::DerefMut for ActionsGuard<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        // SAFETY: as in deref; `&mut self` makes this the only borrow through the guard.
        unsafe { &mut *self.lock.actions.get() }
    }
}

impl Drop for ActionsGuard<'_> {
    fn drop(&mut self) {
        self.lock.release(self.saved);
    }
}

thread_local! {
    /// Set by the prepare hook on the forking thread: it took APP_ACTIONS, and this is the
    /// thread's mask from before (the parent and child hooks, on the same thread, release the
    /// lock and restore it).
    static FORK_HELD: Cell<Option<SavedMask>> = const { Cell::new(None) };
}

fn sig_index(sig: c_int) -> Option<usize> {
    SIGS.iter().position(|s| *s == sig)
}

/// Installs signal handlers, the exit hook and the fork hook, once per process.
pub fn install_process_hooks(cfg: &Config) {
    let (signals, at_exit) = (cfg.exit.handle_signals, cfg.exit.release_at_exit);
    TEST_PAUSE_MS.store(cfg.exit.test_release_pause_ms, Relaxed);
    TEST_RAISE_DELAY_MS.store(cfg.exit.test_raise_delay_ms, Relaxed);
    TEST_SIGACTION_HOLD_MS.store(cfg.exit.test_sigaction_hold_ms, Relaxed);
    PROCESS_HOOKS.call_once(|| {
        // SAFETY: registering plain extern "C" functions that catch their own panics.
        unsafe {
            if at_exit {
                libc::atexit(on_exit);
            }
            libc::pthread_atfork(Some(on_fork_prepare), Some(on_fork_parent), Some(on_fork_child));
        }
        if signals {
            if let Err(e) = install_signal_handlers(cfg.exit.test_install_pause_ms) {
                tracing::error!("xcuda: cannot install SIGINT/SIGTERM handlers: {e}");
            }
        }
    });
}

fn install_signal_handlers(install_pause_ms: u64) -> std::io::Result<()> {
    let Some(real_sigaction) = crate::real::sigaction_fn() else {
        return Err(std::io::Error::other("libc sigaction not found"));
    };
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // The handler's end never blocks: a storm of signals while the helper is busy (a sibling's
    // `kill` loop during a long synchronisation) would otherwise fill the pipe and hang the
    // application's threads inside the handler. A byte that does not fit is dropped: the
    // ones before it already wake the helper for that signal.
    // SAFETY: fcntl on the descriptor just made.
    if unsafe { libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    PIPE_WR.store(fds[1], Release);
    PIPE_RD.store(fds[0], Release);
    let rd = fds[0];
    spawn_shim_thread("xcuda-exit", move || exit_helper(rd))?;
    let mut apps = APP_ACTIONS.lock();
    INSTALLING.store(true, Release);
    let ours = our_action();
    for (i, sig) in SIGS.into_iter().enumerate() {
        test_install_pause(install_pause_ms, sig);
        // One sigaction(2) swaps the application's action for ours and returns it: at every
        // instant one of the two is in force, so no signal is lost. (This used to set SIG_IGN
        // first and then register a signal-hook handler; the kernel discards a signal whose
        // action is SIG_IGN, so a SIGTERM/SIGINT landing in between was lost and the process
        // never ended: the stress tool's 5 + 60 s `client_hung`.)
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() }; // SAFETY: plain data.
        // SAFETY: both pointers are to locals; SIGINT/SIGTERM may be caught.
        if unsafe { real_sigaction(sig, &ours, &mut old) } != 0 {
            let e = std::io::Error::last_os_error();
            for (j, s) in SIGS.into_iter().enumerate().take(i) {
                // SAFETY: restoring the application's action recorded just above.
                unsafe { real_sigaction(s, apps[j].as_ref().unwrap(), std::ptr::null_mut()) };
            }
            INSTALLING.store(false, Release);
            return Err(e);
        }
        apps[i] = Some(old);
    }
    INSTALLING.store(false, Release);
    INSTALLED.store(true, Release);
    Ok(())
}

/// The shim's action for SIGS: [`on_signal_handler`], restarting interrupted calls.
fn our_action() -> libc::sigaction {
    // SAFETY: a zeroed sigaction is plain data; we fill in a handler that is async-signal-safe
    // (on_signal_handler: atomics and write(2), errno preserved) and block nothing extra.
    unsafe {
        let mut a: libc::sigaction = std::mem::zeroed();
        a.sa_sigaction = on_signal_handler as extern "C" fn(c_int) as libc::sighandler_t;
        a.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut a.sa_mask);
        a
    }
}

/// The kernel-level handler for SIGS: [`on_signal`] with the interrupted code's errno kept.
extern "C" fn on_signal_handler(sig: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot; reading and writing it back
    // is async-signal-safe, and write(2) in on_signal may change it.
    let saved = unsafe { *libc::__errno_location() };
    on_signal(sig);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
}

/// `exit.test_install_pause_ms` (tests only): announce the pause in the log, then pause.
fn test_install_pause(ms: u64, sig: c_int) {
    if ms > 0 {
        tracing::info!(sig, ms, "xcuda: test pause while installing the signal handler");
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Signal context: freeze launches and wake the helper. Atomics and write(2) only.
fn on_signal(sig: c_int) {
    if sig == libc::SIGTERM && SIGTERM_AT_NS.load(Relaxed) == 0 {
        // clock_gettime is async-signal-safe; the first SIGTERM's time stays.
        let _ = SIGTERM_AT_NS.compare_exchange(0, node_ledger::clock::now_ns().max(1), AcqRel, Relaxed);
    }
    if let Some(st) = state::get() {
        // Every GPU's throttle (a slice walk: no allocation, no lock).
        st.throttles().for_each(|t| t.freeze());
    }
    let fd = PIPE_WR.load(Acquire);
    if fd >= 0 {
        let b = sig as u8;
        // SAFETY: write(2) is async-signal-safe; b lives across the call.
        unsafe { libc::write(fd, (&b as *const u8).cast(), 1) };
    }
}

/// Runs `f` on a fresh thread and waits at most the configured release timeout for it. When
/// no thread can start, `inline` runs `f` on this thread without the deadline, else gives up.
fn with_deadline<T: Send + 'static>(what: &str, inline: bool, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let limit = std::time::Duration::from_millis(state::config().exit.release_timeout_ms);
    let (tx, rx) = std::sync::mpsc::channel();
    // Held here until the thread takes it: if no thread can start (a pod at its pids.max), a
    // release (`inline`) runs on this thread instead, without the deadline: skipped, it would
    // leave the process to die with its contexts live, which can hang its MPS neighbours.
    let job = std::sync::Arc::new(std::sync::Mutex::new(Some(f)));
    let theirs = job.clone();
    let spawned = spawn_shim_thread("xcuda-release", move || {
        let _log = state::log_on_this_thread();
        let f = theirs.lock().ok().and_then(|mut j| j.take());
        if let Some(f) = f {
            let _ = tx.send(f());
        }
    });
    if let Err(e) = spawned {
        if !inline {
            tracing::error!(error = %e, "xcuda: cannot start a thread to {what}: skipped");
            return None;
        }
        tracing::error!(error = %e, "xcuda: cannot start a thread to {what}: doing it on this thread, without a deadline");
        let f = job.lock().ok().and_then(|mut j| j.take());
        return f.map(|f| f());
    }
    let r = rx.recv_timeout(limit).ok();
    if r.is_none() {
        tracing::error!(timeout_ms = limit.as_millis() as u64, "xcuda: gave up waiting to {what} (driver hung?)");
    }
    r
}

fn exit_helper(rd: c_int) {
    let _log = state::log_on_this_thread();
    // Asynchronous signals stay blocked here (spawn_shim_thread): the kernel delivers SIGINT and
    // SIGTERM to a thread of the application's that takes them, or leaves them pending for its
    // signalfd or sigwait; the raises below unblock their one signal around the raise.
    loop {
        let mut b = 0u8;
        // SAFETY: reading one byte into b from our own pipe.
        let n = unsafe { libc::read(rd, (&mut b as *mut u8).cast(), 1) };
        if n == 1 {
            let _ = std::panic::catch_unwind(|| handle_signal(c_int::from(b)));
        } else if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        } else {
            return;
        }
    }
}

fn handle_signal(sig: c_int) {
    let Some(i) = sig_index(sig) else { return };
    let st = state::get();
    tracing::warn!(sig, "xcuda: signal received; launches frozen");
    arm_drain(sig);
    if let Some(st) = st {
        // Nothing to synchronise once a release has begun (and retaining a primary context
        // then could bring it back to life).
        let _ = synchronize_unless_released(st, "synchronise contexts", crate::capture::wait_limit());
    }
    let unfreeze = || {
        // Once drained (the SIGKILL is coming), not before the drain gives up. A drain that
        // begins between the check and the unfreeze freezes again after it.
        if let (Some(st), false) = (st, drained()) {
            st.throttles().for_each(|t| t.unfreeze());
            if drained() {
                st.throttles().for_each(|t| t.freeze());
            }
        }
    };
    let Some(real_sigaction) = crate::real::sigaction_fn() else { return };
    // The application's action as it is now (it may have changed while we synchronised), and,
    // for a handler, put in the kernel under the same lock: an action set meanwhile is seen.
    let apps = APP_ACTIONS.lock();
    let app = apps[i];
    let handler = app.map_or(libc::SIG_DFL, |a| a.sa_sigaction);
    if handler == libc::SIG_IGN {
        drop(apps);
        unfreeze();
        return;
    }
    if handler == libc::SIG_DFL {
        drop(apps);
        // Recorded before the release: an exit that starts once the application sees errors
        // from its released contexts must end the process by this signal too (die_of).
        DYING_OF.store(sig, SeqCst);
        // Always, even if the state was not built yet: a context may be being created right now
        // (the release closes the creation gate and waits for it).
        let r = release_once("release contexts");
        tracing::warn!(sig, release = ?r, "xcuda: contexts released; taking the default action");
        let delay = TEST_RAISE_DELAY_MS.load(Relaxed);
        if delay > 0 {
            std::thread::sleep(std::time::Duration::from_millis(delay));
        }
        die_of(sig, real_sigaction);
        return;
    }
    // The application's own handler: run on this thread with its action swapped into the
    // kernel for one raise, then ours put back. Work was synchronised; contexts are released
    // when the process exits.
    FORWARDING.store(sig, SeqCst);
    // SAFETY: zeroed sigactions are plain data; `app` is the application's sigaction as it gave
    // it to us; the out-pointer is a local.
    let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
    unsafe { real_sigaction(sig, app.as_ref().unwrap_or(&ours), &mut ours) };
    drop(apps);
    // SAFETY: a local set with `sig`; pthread_sigmask changes this thread's mask only, and
    // raise delivers to this thread (unblocked just for it) before it returns.
    unsafe {
        let mut one: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut one);
        libc::sigaddset(&mut one, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
        libc::raise(sig);
        libc::pthread_sigmask(libc::SIG_BLOCK, &one, std::ptr::null_mut());
    }
    let mut apps = APP_ACTIONS.lock();
    // SAFETY: as above; `ours` is what the kernel held before the swap.
    let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
    unsafe { real_sigaction(sig, &ours, &mut now) };
    FORWARDING.store(0, SeqCst);
    // Still the application's action in the kernel, as the delivery left it: a one-shot action
    // (SA_RESETHAND, sysv_signal) is reset to SIG_DFL by the delivery, and is SIG_DFL for the
    // application from now on. (An action the application set meanwhile put ours back: kept.)
    if now.sa_sigaction != ours.sa_sigaction {
        apps[i] = Some(now);
    }
    drop(apps);
    unfreeze();
}

/// The fatal signal whose default action the signal helper is carrying out (0 = none).
///
/// Once the helper has released the contexts, the application's next driver call fails, and an
/// application that reacts by calling `exit` (a C client exiting 2) would otherwise race the
/// helper's re-raise and end with its own status: the exit path then takes the signal's default
/// action itself, so the process ends the way the signal demanded, as it would without the shim.
static DYING_OF: AtomicI32 = AtomicI32::new(0);

/// Takes `sig`'s default action in the calling thread: SIG_DFL installed, `sig` unblocked here,
/// then raised. Returns only if the signal does not end the process (it always does for
/// SIGINT/SIGTERM with SIG_DFL).
fn die_of(sig: c_int, real_sigaction: crate::real::SigactionFn) {
    // SAFETY: a zeroed sigaction with SIG_DFL is a valid action; the sigset is local and
    // pthread_sigmask changes this thread's mask only; raise delivers to this thread.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        real_sigaction(sig, &dfl, std::ptr::null_mut());
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
}

extern "C" fn on_exit() {
    let _ = std::panic::catch_unwind(|| state::logged(on_exit_inner));
}

fn on_exit_inner() {
    let sig = DYING_OF.load(SeqCst);
    if sig != 0 {
        // The signal helper is releasing (or has released) for a fatal signal: wait for that
        // release, then end by the signal rather than by the application's exit status.
        let r = release_once("release contexts at exit");
        tracing::warn!(sig, release = ?r, "xcuda: exit raced with a fatal signal; ending by the signal");
        if let Some(real_sigaction) = crate::real::sigaction_fn() {
            die_of(sig, real_sigaction);
        }
        return;
    }
    {
        let Some(st) = state::get() else { return };
        // No freeze here: exit handlers that run after this one must not block in a launch;
        // once the contexts are gone their launches simply fail.
        // exit() has already run this thread's TLS destructors, and drivers keep the current
        // context in TLS: the release runs on a fresh thread, bounded in time. If the signal
        // helper is releasing already, this waits for it instead (the process must not end
        // before that release is complete).
        let _ = st; // built: this process may hold contexts
        let r = release_once("release contexts at exit");
        tracing::debug!(release = ?r, "xcuda: released at exit");
    }
}

/// Before fork (on the forking thread): take APP_ACTIONS, so no other thread is changing it
/// when the address space is copied. Taking it blocks every signal on this thread first (see
/// [`ActionsLock`]), and they stay blocked across the fork: a signal sent to the child right
/// after fork waits until the child hook has put the application's actions back.
extern "C" fn on_fork_prepare() {
    let _ = std::panic::catch_unwind(|| {
        // No signal handler runs on a thread that holds the lock (holders block every
        // signal), so a fork from a handler never finds its own thread holding it.
        let saved = APP_ACTIONS.acquire();
        FORK_HELD.with(|c| c.set(Some(saved)));
    });
}

/// Undoes [`on_fork_prepare`] on the forking thread: the lock released, then the thread's mask
/// back as it was before the fork (in the child too: it starts with the application's mask).
fn fork_hooks_done() {
    if let Some(saved) = FORK_HELD.with(|c| c.take()) {
        APP_ACTIONS.release(saved);
    }
}

extern "C" fn on_fork_parent() {
    let _ = std::panic::catch_unwind(fork_hooks_done);
}

extern "C" fn on_fork_child() {
    let _ = std::panic::catch_unwind(|| {
        on_fork_child_inner();
        // Unblocks signals last: a signal already sent to the child is delivered now, by the
        // application's action.
        fork_hooks_done();
    });
}

fn on_fork_child_inner() {
    {
        state::controller_lost();
        RELEASE.store(IDLE, Release);
        DYING_OF.store(0, SeqCst);
        // The parent's SIGTERM and its expected SIGKILL are not the child's (nor its launches
        // stopped for good).
        SIGTERM_AT_NS.store(0, Release);
        DRAIN_ARMED.store(false, Release);
        if DRAINED.swap(false, AcqRel) {
            if let Some(st) = state::get() {
                st.throttles().for_each(|t| t.unfreeze());
            }
        }
        // Only the forking thread survives: no creation is in progress in the child, and no
        // capture or exit-path synchronisation of another thread (the forking thread's own
        // captures are of the parent's contexts, which the child does not have).
        CREATING.store(0, SeqCst);
        crate::capture::reset_after_fork();
        // Nor does any holder of the shim's locks.
        crate::api::VMM_UNMAP_RETAIN.reset_after_fork();
        crate::limits::CHANGES.reset_after_fork();
        if let Some(st) = state::get() {
            st.graph_mem.update.reset_after_fork();
            st.graph_cost.reset_after_fork();
        }
        if let Some(st) = state::get() {
            st.contexts.clear();
            st.quotas().for_each(|q| q.after_fork_child());
            // The child has no driver state: no graph pool or stream-ordered pool either.
            st.gpus.iter().for_each(|g| {
                g.graph.reset();
                g.stream_pools.reset();
                g.syncs.after_fork_child();
            });
            st.stream_pools.after_fork_child();
        }
        // The helper's pipe is the parent's: nothing in the child may wake the parent's helper.
        for fd in [PIPE_WR.swap(-1, AcqRel), PIPE_RD.swap(-1, AcqRel)] {
            if fd >= 0 {
                // SAFETY: our own descriptors (the child's copies).
                unsafe { libc::close(fd) };
            }
        }
        // The exit helper thread did not survive fork: give the child its application's
        // signal actions back.
        if INSTALLED.swap(false, AcqRel) {
            // SAFETY: the prepare hook took APP_ACTIONS on this thread, the only one in the
            // child; nothing else reads or writes it until fork_hooks_done.
            let apps = unsafe { *APP_ACTIONS.actions.get() };
            if let Some(real_sigaction) = crate::real::sigaction_fn() {
                for (i, sig) in SIGS.into_iter().enumerate() {
                    // SAFETY: restoring the application's own action (or the default).
                    unsafe {
                        let mut dfl: libc::sigaction = std::mem::zeroed();
                        dfl.sa_sigaction = libc::SIG_DFL;
                        real_sigaction(sig, apps[i].as_ref().unwrap_or(&dfl), std::ptr::null_mut());
                    }
                }
            }
        }
    }
}

/// Logic of our exported `sigaction`: while our handlers are installed, SIGINT/SIGTERM actions
/// set by the application are recorded (and reported back), not installed. `None` = forward.
///
/// # Safety
/// Same contract as sigaction(2): `act`/`old` are null or valid.
pub unsafe fn app_sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> Option<c_int> {
    if !INSTALLED.load(Acquire) || INSTALLING.load(Acquire) {
        return None;
    }
    let i = sig_index(sig)?;
    // The caller's memory is read before and written after the lock (with the thread's signals
    // unblocked), so a bad pointer faults into the application's own handler, never while the
    // lock is held (see ActionsLock).
    // SAFETY: caller's in-pointer per sigaction(2).
    let new = (!act.is_null()).then(|| unsafe { *act });
    let prev = {
        let mut apps = APP_ACTIONS.lock();
        let hold = TEST_SIGACTION_HOLD_MS.load(Relaxed);
        if hold > 0 {
            state::logged(|| tracing::info!(sig, ms = hold, "xcuda: test hold of the application's signal actions"));
            std::thread::sleep(std::time::Duration::from_millis(hold));
        }
        let prev = apps[i];
        if new.is_some() {
            apps[i] = new;
            if FORWARDING.load(SeqCst) == sig {
                // The helper has the application's old action in the kernel for a raise: the
                // new one is honoured through the shim (see FORWARDING), never left unseen.
                if let Some(real) = crate::real::sigaction_fn() {
                    // SAFETY: our own action, a local; no out-pointer.
                    unsafe { real(sig, &our_action(), std::ptr::null_mut()) };
                }
            }
        }
        prev
    };
    if !old.is_null() {
        // SAFETY: caller's out-pointer per sigaction(2); a zeroed sigaction is SIG_DFL.
        unsafe { *old = prev.unwrap_or_else(|| std::mem::zeroed()) };
    }
    Some(0)
}

/// Logic of our exported `signal` and `bsd_signal` (same recording as [`app_sigaction`]).
pub fn app_signal(sig: c_int, handler: libc::sighandler_t) -> Option<libc::sighandler_t> {
    app_signal_with(sig, handler, libc::SA_RESTART)
}

/// Logic of our exported `sysv_signal` and `__sysv_signal` (what `signal` is in a
/// strict-standards build): a one-shot action, not masked while its handler runs, as glibc's.
pub fn app_sysv_signal(sig: c_int, handler: libc::sighandler_t) -> Option<libc::sighandler_t> {
    app_signal_with(sig, handler, libc::SA_RESETHAND | libc::SA_NODEFER)
}

/// glibc's `SIG_HOLD` (`<signal.h>`: `((__sighandler_t) 2)`), `sigset`'s "block it" disposition.
pub const SIG_HOLD: libc::sighandler_t = 2;

/// `sig` and `handler` as glibc's `signal` family checks them (`SIG_ERR`, or a signal out of
/// range: `EINVAL`); `Some(SIG_ERR)` with errno set when refused.
fn refused(handler: libc::sighandler_t) -> Option<libc::sighandler_t> {
    (handler == libc::SIG_ERR).then(|| {
        // SAFETY: errno is thread-local and always writable.
        unsafe { *libc::__errno_location() = libc::EINVAL };
        libc::SIG_ERR
    })
}

/// The `signal` family over [`app_sigaction`]: `handler` with `flags` and an empty mask, the
/// previous handler returned. `None` for a signal the shim does not keep (the caller forwards).
fn app_signal_with(sig: c_int, handler: libc::sighandler_t, flags: c_int) -> Option<libc::sighandler_t> {
    if !INSTALLED.load(Acquire) || INSTALLING.load(Acquire) {
        return None;
    }
    sig_index(sig)?;
    if let Some(e) = refused(handler) {
        return Some(e);
    }
    // SAFETY: a zeroed sigaction is a valid value (empty mask); we fill the handler and flags
    // like glibc's signal family.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler;
    act.sa_flags = flags;
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to locals.
    unsafe { app_sigaction(sig, &act, &mut old) }.map(|_| old.sa_sigaction)
}

/// Logic of our exported `sigset` (System V), as glibc's: `SIG_HOLD` blocks `sig` in the
/// calling thread and leaves its action; any other disposition becomes its action (no flags,
/// an empty mask) and unblocks it. Returns `SIG_HOLD` if `sig` was blocked before, else the
/// previous action's handler. The mask is the kernel's (the shim keeps none); the action is
/// recorded behind the shim's handler as [`app_sigaction`] records it.
pub fn app_sigset(sig: c_int, disp: libc::sighandler_t) -> Option<libc::sighandler_t> {
    if !INSTALLED.load(Acquire) || INSTALLING.load(Acquire) {
        return None;
    }
    sig_index(sig)?;
    if let Some(e) = refused(disp) {
        return Some(e);
    }
    // SAFETY: sigset operations on locals; pthread_sigmask changes this thread's mask only.
    let was_blocked = |how: c_int| unsafe {
        let (mut one, mut before): (libc::sigset_t, libc::sigset_t) = (std::mem::zeroed(), std::mem::zeroed());
        libc::sigemptyset(&mut one);
        libc::sigaddset(&mut one, sig);
        libc::pthread_sigmask(how, &one, &mut before);
        libc::sigismember(&before, sig) == 1
    };
    // SAFETY: a zeroed sigaction is a valid value.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    if disp == SIG_HOLD {
        if was_blocked(libc::SIG_BLOCK) {
            return Some(SIG_HOLD);
        }
        // SAFETY: a null new action only reads; the out-pointer is a local.
        return unsafe { app_sigaction(sig, std::ptr::null(), &mut old) }.map(|_| old.sa_sigaction);
    }
    // SAFETY: as above.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = disp;
    // SAFETY: both pointers are to locals.
    unsafe { app_sigaction(sig, &act, &mut old) }?;
    Some(if was_blocked(libc::SIG_UNBLOCK) { SIG_HOLD } else { old.sa_sigaction })
}

#[cfg(test)]
mod tests {
    /// The registry says when it has no room, so the creation can be refused (a context it
    /// does not hold is never released before the process dies); a destroyed one frees room.
    #[test]
    fn a_full_context_registry_refuses_the_next_context() {
        let c = super::Contexts::new();
        for i in 1..=256u64 {
            assert!(c.created((i << 4) as cuda_abi::CUcontext), "context {i} recorded");
        }
        assert!(!c.created((257u64 << 4) as cuda_abi::CUcontext), "the 257th live context");
        c.destroyed((7u64 << 4) as cuda_abi::CUcontext);
        assert!(c.created((257u64 << 4) as cuda_abi::CUcontext), "room again once one is destroyed");
    }

    #[test]
    fn the_drain_comes_its_margin_before_the_expected_kill() {
        use crate::config::ExitConfig;
        let e = |drain_before_kill_ms| ExitConfig { drain_before_kill_ms, ..ExitConfig::default() };
        let s = 1_000_000_000;
        assert_eq!(super::drain_at(s, 31 * s, &e(2000)), 29 * s);
        assert_eq!(super::drain_at(s, 2 * s, &e(5000)), s, "a margin over the grace: at once");
        assert_eq!(super::drain_at(s, u64::MAX, &e(0)), u64::MAX, "saturates");
    }

    /// What the drain waits for: the pod's grace from the SIGTERM until the termination file
    /// says how the kubelet kills (its grace decides, shorter or longer than the spec's), then
    /// only ever earlier; a reading that does not parse changes nothing.
    #[test]
    fn the_termination_file_decides_the_kill_and_only_brings_it_earlier() {
        use crate::config::ExitConfig;
        use node_ledger::termination::Termination;
        let s = 1_000_000_000u64;
        let e = ExitConfig { kill_grace_ms: 30_000, ..ExitConfig::default() };
        let (term, now, unix) = (100 * s, 101 * s, 1_796_000_000_000u64);
        let mut k = super::KillClock::new(term, &e);
        assert_eq!((k.kill_ns(), k.deletion_seen()), (Some(130 * s), false), "the pod's grace");
        k.take(Ok(None), now, unix);
        k.take(Err("cut".into()), now, unix);
        assert_eq!((k.kill_ns(), k.deletion_seen()), (Some(130 * s), false), "nothing read yet");
        // `kubectl delete --grace-period=5` a second before the SIGTERM came.
        k.take(Ok(Some(Termination { deletion_unix_ms: unix + 4000, grace_ms: 5000 })), now, unix);
        assert_eq!((k.kill_ns(), k.deletion_seen()), (Some(105 * s), true));
        // A reading with a longer grace (an older event) does not push it back.
        k.take(Ok(Some(Termination { deletion_unix_ms: unix + 29_000, grace_ms: 30_000 })), now, unix);
        assert_eq!(k.kill_ns(), Some(105 * s));
        // A deletion grace longer than the spec's (`kubectl drain --grace-period=600`): the
        // kubelet waits the deletion's.
        let mut k = super::KillClock::new(term, &e);
        k.take(Ok(Some(Termination { deletion_unix_ms: unix + 600_000, grace_ms: 600_000 })), term, unix);
        assert_eq!(k.kill_ns(), Some(700 * s));
        // A second, shorter deletion read 300 s on: `deletionTimestamp` keeps the first
        // request's time (already past), so the drain is due at once, and with a deletion
        // seen the drain never gives up on the kill.
        k.take(Ok(Some(Termination { deletion_unix_ms: unix + 60_000, grace_ms: 60_000 })), term + 300 * s, unix + 300_000);
        assert_eq!(k.kill_ns(), Some(160 * s), "past when it was read");
        assert!(k.deletion_seen());
        // Without a known grace the file alone decides.
        let mut k = super::KillClock::new(term, &ExitConfig::default());
        assert_eq!(k.kill_ns(), None);
        k.take(Ok(Some(Termination { deletion_unix_ms: unix + 4000, grace_ms: 5000 })), now, unix);
        assert_eq!(k.kill_ns(), Some(105 * s));
    }

    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::{Arc, Mutex};

    /// RELEASE and CREATING are process-wide: these tests must not run at the same time.
    static SERIAL: Mutex<()> = Mutex::new(());

    /// The calling thread's signal mask as the list of signals it blocks.
    fn blocked_now() -> Vec<c_int> {
        // SAFETY: pthread_sigmask with a null new set only reads this thread's mask into a
        // local; sigismember reads that local.
        unsafe {
            let mut cur: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut cur);
            (1..=libc::SIGRTMAX()).filter(|&s| libc::sigismember(&cur, s) == 1).collect()
        }
    }

    /// Sets the calling thread's mask to exactly `sigs`.
    fn set_mask(sigs: &[c_int]) {
        // SAFETY: sigset operations on a local; pthread_sigmask changes this thread's mask only.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for &s in sigs {
                libc::sigaddset(&mut set, s);
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        }
    }

    /// Every holder of the actions' lock (the guard, and acquire/release as the fork hooks use
    /// them) blocks every blockable signal while it holds it, and gets back exactly the mask it
    /// had, not an empty one nor the full one.
    #[test]
    fn holding_the_actions_lock_blocks_every_signal_and_restores_the_exact_mask() {
        std::thread::spawn(|| {
            let lock = ActionsLock::new();
            let own = [libc::SIGHUP, libc::SIGUSR2, libc::SIGRTMIN() + 3];
            set_mask(&own);
            let must_block: Vec<c_int> = (1..32)
                .filter(|&s| s != libc::SIGKILL && s != libc::SIGSTOP)
                .chain(libc::SIGRTMIN()..=libc::SIGRTMAX())
                .collect();
            {
                let _g = lock.lock();
                let b = blocked_now();
                let open: Vec<_> = must_block.iter().filter(|s| !b.contains(s)).collect();
                assert!(open.is_empty(), "signals left unblocked while holding the lock: {open:?}");
            }
            assert_eq!(blocked_now(), own, "the guard did not restore the thread's own mask");
            assert!(!lock.held.load(SeqCst));
            let saved = lock.acquire();
            assert!(blocked_now().contains(&libc::SIGSEGV) && blocked_now().contains(&libc::SIGUSR1));
            lock.release(saved);
            assert_eq!(blocked_now(), own, "release did not restore the thread's own mask");
            assert!(!lock.held.load(SeqCst));
        })
        .join()
        .unwrap();
    }

    static NESTED_LOCK: ActionsLock = ActionsLock::new();
    /// What the test handler saw: 0 = not run, 1 = ran while the lock was held, 2 = after.
    static NESTED_SEEN: AtomicU8 = AtomicU8::new(0);

    extern "C" fn nested_handler(_: c_int) {
        let held = NESTED_LOCK.held.load(SeqCst);
        NESTED_SEEN.store(if held { 1 } else { 2 }, SeqCst);
    }

    /// A signal sent to the thread holding the lock must not run its handler there until the
    /// lock is released: a handler that sets SIGINT/SIGTERM's action would take the lock and
    /// spin forever on its own thread (the hang of `shim_sigaction_nested`). Without the
    /// blocking, `pthread_kill` to oneself runs the handler before it returns, lock held.
    #[test]
    fn a_signal_to_the_holder_runs_its_handler_only_after_the_lock_is_released() {
        // SAFETY: installs an atomics-only handler for SIGUSR2 (used by no other test here,
        // and sent to this test's own thread only), then puts the previous action back.
        unsafe {
            let mut a: libc::sigaction = std::mem::zeroed();
            a.sa_sigaction = nested_handler as extern "C" fn(c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut a.sa_mask);
            let mut prev: libc::sigaction = std::mem::zeroed();
            assert_eq!(libc::sigaction(libc::SIGUSR2, &a, &mut prev), 0);
            std::thread::spawn(|| {
                set_mask(&[]);
                let g = NESTED_LOCK.lock();
                assert_eq!(libc::pthread_kill(libc::pthread_self(), libc::SIGUSR2), 0);
                assert_eq!(NESTED_SEEN.load(SeqCst), 0, "the handler ran on the thread holding the lock");
                drop(g);
                assert_eq!(NESTED_SEEN.load(SeqCst), 2, "the signal was not delivered once the lock was released");
            })
            .join()
            .unwrap();
            libc::sigaction(libc::SIGUSR2, &prev, std::ptr::null_mut());
        }
    }

    /// A drain's synchronisation enters the creation gate without waiting: refused once a
    /// release has begun (it would retain a released primary context), and while it is inside
    /// a release waits for it (`wait_for_creations`) instead of destroying what it syncs.
    #[test]
    fn a_synchronisation_is_skipped_after_a_release_and_waited_for_during_one() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        RELEASE.store(IDLE, SeqCst);
        let before = CREATING.load(SeqCst);
        let gate = CreationGate::try_enter().expect("no release: entered");
        assert_eq!(CREATING.load(SeqCst), before + 1, "a release now waits for it");
        drop(gate);
        RELEASE.store(RELEASING, SeqCst);
        assert!(CreationGate::try_enter().is_none(), "refused during a release");
        assert_eq!(CREATING.load(SeqCst), before);
        RELEASE.store(RELEASED, SeqCst);
        assert!(CreationGate::try_enter().is_none(), "refused after it");
        RELEASE.store(IDLE, SeqCst);
    }

    /// The exit path and the signal helper racing: exactly one releases, the other returns
    /// only after that release completed (never "nothing to do" while it is in progress).
    #[test]
    fn one_release_and_the_other_caller_waits_for_it() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        RELEASE.store(IDLE, SeqCst);
        let calls = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let (calls, done) = (calls.clone(), done.clone());
                std::thread::spawn(move || {
                    let (c2, d2) = (calls.clone(), done.clone());
                    let r = release_once_with("test", move || {
                        c2.fetch_add(1, SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(100));
                        d2.store(true, SeqCst);
                        1
                    });
                    assert!(done.load(SeqCst), "returned before the release completed: {r:?}");
                    r
                })
            })
            .collect();
        let mut rs: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        rs.sort_by_key(|r| format!("{r:?}"));
        assert_eq!(calls.load(SeqCst), 1, "released exactly once");
        assert_eq!(rs, vec![ReleaseOutcome::Released(1), ReleaseOutcome::WaitedForOther]);
        assert_eq!(release_once_with("again", || unreachable!()), ReleaseOutcome::AlreadyDone);
        RELEASE.store(IDLE, SeqCst);
    }

    /// A signal's release racing a context creation (issue 8, obs. 4): the release must not
    /// look at the registry while a creation is inside the gate, and once it started no new
    /// creation may get in. Without the gate the release ran while the creation was in flight
    /// and the context created afterwards was never released.
    #[test]
    fn release_waits_for_creation_in_flight_and_then_refuses_new_ones() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        RELEASE.store(IDLE, SeqCst);
        CREATING.store(0, SeqCst);
        let recorded = Arc::new(AtomicBool::new(false));
        let gate = CreationGate::enter().expect("gate open before any release");
        let r2 = recorded.clone();
        let creator = std::thread::spawn(move || {
            // The "driver call" still in progress when the release starts.
            std::thread::sleep(std::time::Duration::from_millis(200));
            r2.store(true, SeqCst); // recorded in the registry
            drop(gate);
        });
        let seen = Arc::new(AtomicBool::new(false));
        let (rec, s2) = (recorded.clone(), seen.clone());
        let r = release_once_with("test", move || {
            wait_for_creations();
            s2.store(rec.load(SeqCst), SeqCst);
            1
        });
        creator.join().unwrap();
        assert_eq!(r, ReleaseOutcome::Released(1));
        assert!(seen.load(SeqCst), "release looked at the registry before the creation in flight was recorded");
        assert!(CreationGate::enter().is_none(), "a creation got in after the release");
        assert_eq!(CREATING.load(SeqCst), 0, "a refused creation must not stay counted");
        RELEASE.store(IDLE, SeqCst);
    }
}
