//! Stream captures in progress, so that the exit path's context synchronisations wait for
//! them to end instead of breaking them.
//!
//! CUDA forbids synchronising a context while a stream of it captures a graph
//! (`cuCtxSynchronize` would wait on a stream whose work is recorded, not run): the call is
//! refused and the capture invalidated. The signal helper and the drain synchronise every
//! context, so an application that handles SIGTERM and was capturing at that moment
//! (`torch.cuda.graph`, a `reduce-overhead` recompile) saw its capture fail with
//! `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` instead of finishing its checkpoint, and the
//! synchronisation, refused, waited for nothing. Now the capture entry points count the
//! captures begun through them, and a synchronisation first waits (bounded) until none is in
//! progress, holding new ones off while it runs ([`quiesced`]); launches into a capturing
//! stream, which record and run nothing, pass a frozen throttle ([`owns`]), so a
//! capture can end while launches are stopped.
//!
//! A capture its context's destruction ends (`cuCtxDestroy`, a primary context's reset or last
//! release, mid-capture) leaves the count with its context ([`context_gone`]).
//!
//! Protocol (Dekker-style, both sides store then load, `SeqCst`): a beginning capture counts
//! itself in `ACTIVE` and then checks `SYNCING`; a synchronisation counts itself in
//! `SYNCING` and then waits until `ACTIVE` reads 0. So either the capture sees the
//! synchronisation (and waits for it to finish before beginning) or the synchronisation sees
//! the capture (and waits for it to end, new captures held off meanwhile, so that overlapping
//! captures of several threads cannot starve it): never both running. Not a hot path:
//! captures and the exit path only; a launch reads its thread's count only when it has to
//! wait.
//!
//! Only a capture the launching thread itself began in a mode other than relaxed lets its
//! launches pass, known by the capture's id (`cuStreamGetCaptureInfo_v2`, asked when it
//! began): such a capture can be ended only by that thread (cuda.h), so the stream cannot
//! stop capturing between the driver's answer and the launch, which then records rather than
//! runs. A stream another thread captures, or a relaxed capture, may end in that window (a
//! tenant looping begin/end on one thread would have run its other thread's kernels past a
//! frozen throttle): its launches wait, and its stream-ordered allocations are counted both
//! as a graph node and as an allocation ([`owns`]).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::time::{Duration, Instant};

use cuda_abi::{CUresult, CUstream, CUstreamCaptureStatus};

use crate::state::call_real;

/// Captures begun through the shim's entry points (`cuStreamBeginCapture_v2`, the CUDA 10.0
/// `cuStreamBeginCapture`, `cuStreamBeginCaptureToGraph`, each with its per-thread twin) and
/// not yet ended (saturating: an end never takes the count below zero).
static ACTIVE: AtomicU32 = AtomicU32::new(0);
/// Context synchronisations of the exit path running now (the helper's and the drain's may
/// overlap).
static SYNCING: AtomicU32 = AtomicU32::new(0);

/// The captures in progress of each context (its handle; 0: a free slot), so that those its
/// context's destruction ends leave [`ACTIVE`] with it (`cuCtxDestroy` mid-capture; the driver
/// drops the capture, and no `cuStreamEndCapture` will come). Read and written under
/// [`BY_CTX_LOCK`]. A capture of a context that finds no slot free (more than [`CTX_SLOTS`]
/// contexts capturing at once) is counted in [`ACTIVE`] alone: should its context be
/// destroyed, the exit path waits its bound for it, as it would without the table.
const CTX_SLOTS: usize = 16;
static BY_CTX_LOCK: crate::spin::SpinLock = crate::spin::SpinLock::new();
static CTXS: [AtomicU64; CTX_SLOTS] = [const { AtomicU64::new(0) }; CTX_SLOTS];
static COUNTS: [AtomicU32; CTX_SLOTS] = [const { AtomicU32::new(0) }; CTX_SLOTS];

/// Captures of its own one thread keeps track of at once (past them a capture is not known as
/// the thread's: its launches wait, as another thread's would).
const OWN_SLOTS: usize = 8;

thread_local! {
    /// The ids of the captures this thread began in a mode other than relaxed and has not
    /// ended (0: a free slot), each with its context and [`GONE_SEQ`] when it began.
    static OWN: std::cell::Cell<[(u64, u64, u64); OWN_SLOTS]> = const { std::cell::Cell::new([(0, 0, 0); OWN_SLOTS]) };
    /// [`GONE_SEQ`] when this thread last dropped the captures of contexts gone.
    static GONE_SEEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Contexts gone lately ([`context_gone`]): another thread's own captures in them ended with
/// them, which only that thread can forget (its [`OWN`] is thread-local): it does at its next
/// [`owns`]. A ring of the last 16; past them a thread keeps an ended capture's id (its
/// launches ask the driver, which says the stream no longer captures).
const GONE_RING: usize = 16;
/// Each gone context and the sequence number of its going (a context handle may come back: a
/// primary context's is its device's for good, a created one may be reused, so a capture is
/// forgotten only for a going after it began).
static GONE: [AtomicU64; GONE_RING] = [const { AtomicU64::new(0) }; GONE_RING];
static GONE_AT: [AtomicU64; GONE_RING] = [const { AtomicU64::new(0) }; GONE_RING];
static GONE_SEQ: AtomicU64 = AtomicU64::new(0);

/// `CU_STREAM_CAPTURE_MODE_RELAXED` (cuda.h): a capture any thread may end.
const MODE_RELAXED: u32 = 2;

/// `CU_STREAM_PER_THREAD` (cuda.h `((CUstream)0x2)`).
const STREAM_PER_THREAD: u64 = 0x2;

/// Whether this thread has a capture of its own in progress that no other thread can end
/// (one thread-local read).
#[inline]
pub fn own_active() -> bool {
    OWN.with(|c| c.get().iter().any(|&(id, _, _)| id != 0))
}

fn own_add(id: u64, ctx: u64) {
    if id == 0 {
        return;
    }
    OWN.with(|c| {
        let mut ids = c.get();
        if let Some(free) = ids.iter_mut().find(|i| i.0 == 0) {
            *free = (id, ctx, GONE_SEQ.load(SeqCst));
            c.set(ids);
        }
    });
}

fn own_remove(id: u64) {
    OWN.with(|c| {
        let mut ids = c.get();
        if let Some(at) = ids.iter_mut().find(|i| id != 0 && i.0 == id) {
            *at = (0, 0, 0);
            c.set(ids);
        }
    });
}

fn own_has(id: u64) -> bool {
    id != 0 && OWN.with(|c| c.get().iter().any(|i| i.0 == id))
}

/// Forgets this thread's own captures of contexts gone since they began.
fn own_prune() {
    let seq = GONE_SEQ.load(SeqCst);
    if GONE_SEEN.with(|g| g.get()) == seq {
        return;
    }
    GONE_SEEN.with(|g| g.set(seq));
    OWN.with(|c| {
        let mut ids = c.get();
        for i in ids.iter_mut().filter(|i| i.0 != 0 && i.1 != 0) {
            if GONE.iter().zip(&GONE_AT).any(|(g, at)| g.load(SeqCst) == i.1 && at.load(SeqCst) >= i.2) {
                *i = (0, 0, 0);
            }
        }
        c.set(ids);
    });
}

/// The stream a call names: a per-thread entry point's null stream is the calling thread's
/// default stream, which a plain query names `CU_STREAM_PER_THREAD`.
fn effective(stream: u64, ptsz: bool) -> u64 {
    if ptsz && stream == 0 {
        STREAM_PER_THREAD
    } else {
        stream
    }
}

/// The capture status of `stream` and its capture's id (`cuStreamGetCaptureInfo_v2`); `None`
/// when the driver cannot say.
fn capture_info(stream: u64) -> Option<(CUstreamCaptureStatus, u64)> {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: u64 = 0;
    let rc = call_real!(
        cuStreamGetCaptureInfo_v2: cuda_abi::PFN_cuStreamGetCaptureInfo_v11030,
        stream as CUstream,
        &mut status,
        &mut id,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut()
    );
    (rc == CUresult::CUDA_SUCCESS).then_some((status, id))
}

/// Whether `stream` (`ptsz`: named through a per-thread entry point) captures for a capture
/// this thread began in a mode other than relaxed: one no other thread can end, so work
/// queued there now is recorded, not run. Asks the driver when this thread has such a
/// capture; otherwise false at the cost of one thread-local read.
pub fn owns(stream: u64, ptsz: bool) -> bool {
    if !own_active() {
        return false;
    }
    own_prune();
    if !own_active() {
        return false;
    }
    matches!(capture_info(effective(stream, ptsz)), Some((status, id))
        if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE && own_has(id))
}

/// In a fork child: only the forking thread lives on, and the captures and synchronisations
/// counted were the parent's (of contexts the child does not have).
pub fn reset_after_fork() {
    ACTIVE.store(0, SeqCst);
    SYNCING.store(0, SeqCst);
    OWN.with(|c| c.set([(0, 0, 0); OWN_SLOTS]));
    GONE_SEEN.with(|g| g.set(GONE_SEQ.load(SeqCst)));
    BY_CTX_LOCK.reset_after_fork();
    for (c, n) in CTXS.iter().zip(&COUNTS) {
        c.store(0, Relaxed);
        n.store(0, Relaxed);
    }
}

/// Adds `delta` (+1 or -1) to context `ctx`'s captures in progress (0: unknown, nothing kept).
fn tally(ctx: u64, delta: i32) {
    if ctx == 0 {
        return;
    }
    let _held = BY_CTX_LOCK.lock();
    let at = CTXS.iter().position(|c| c.load(Relaxed) == ctx);
    match (at, delta > 0) {
        (Some(i), true) => {
            COUNTS[i].fetch_add(1, Relaxed);
        }
        (Some(i), false) => {
            let n = COUNTS[i].load(Relaxed).saturating_sub(1);
            COUNTS[i].store(n, Relaxed);
            if n == 0 {
                CTXS[i].store(0, Relaxed);
            }
        }
        (None, true) => {
            if let Some(i) = CTXS.iter().position(|c| c.load(Relaxed) == 0) {
                CTXS[i].store(ctx, Relaxed);
                COUNTS[i].store(1, Relaxed);
            }
        }
        (None, false) => {}
    }
}

/// Context `ctx` is gone (destroyed, its primary reset or last released): the captures in
/// progress in it ended with it.
pub fn context_gone(ctx: u64) {
    if ctx == 0 {
        return;
    }
    let n = {
        let _held = BY_CTX_LOCK.lock();
        match CTXS.iter().position(|c| c.load(Relaxed) == ctx) {
            Some(i) => {
                CTXS[i].store(0, Relaxed);
                COUNTS[i].swap(0, Relaxed)
            }
            None => 0,
        }
    };
    let seq = GONE_SEQ.fetch_add(1, SeqCst);
    let at = seq as usize % GONE_RING;
    GONE[at].store(0, SeqCst);
    GONE_AT[at].store(seq, SeqCst);
    GONE[at].store(ctx, SeqCst);
    if n > 0 {
        let _ = ACTIVE.fetch_update(SeqCst, SeqCst, |a| Some(a.saturating_sub(n)));
        crate::state::logged(|| tracing::info!(ctx, captures = n, "xcuda: stream captures ended with their context"));
    }
}

/// The context of the capture on `stream`: the stream's, or the current one for the legacy and
/// per-thread default streams (0: unknown).
fn stream_ctx(stream: u64) -> u64 {
    // 0 (the null stream of either kind), CU_STREAM_LEGACY (1), CU_STREAM_PER_THREAD (2).
    if stream <= 2 {
        return crate::exit::current_context();
    }
    let mut ctx: cuda_abi::CUcontext = std::ptr::null_mut();
    match call_real!(cuStreamGetCtx: cuda_abi::PFN_cuStreamGetCtx_v9020, stream as CUstream, &mut ctx) {
        CUresult::CUDA_SUCCESS => ctx as u64,
        _ => 0,
    }
}

/// Whether a capture begun through the shim may be in progress (one atomic load).
#[cfg(test)]
fn any_active() -> bool {
    ACTIVE.load(SeqCst) != 0
}

/// `cuStreamBeginCapture*` on `stream` (`ptsz`: through a per-thread entry point) through
/// `begin` (the real call): counted as in progress from before the call, uncounted if the
/// driver refuses it; a capture in a mode other than relaxed is then known as this thread's by
/// its id. While a synchronisation of the exit path runs the capture waits for it (at most
/// `limit`, then begins anyway: a synchronisation the driver never finishes must not stop the
/// application).
pub fn begin(limit: Duration, mode: u32, stream: u64, ptsz: bool, begin: impl FnOnce() -> CUresult) -> CUresult {
    let s = effective(stream, ptsz);
    let mut ctx = 0;
    let rc = begin_with(limit, mode, begin, || {
        ctx = stream_ctx(s);
        let id = capture_info(s).map_or(0, |(_, id)| id);
        if id == 0 && mode != MODE_RELAXED {
            id_unknown();
        }
        (id, ctx)
    });
    if rc == CUresult::CUDA_SUCCESS {
        if mode == MODE_RELAXED {
            ctx = stream_ctx(s);
        }
        tally(ctx, 1);
    }
    rc
}

/// Said once: the driver gave no id for a capture of this process's own (it predates
/// `cuStreamGetCaptureInfo_v2`, CUDA 11.3), so launches into such a capture wait while
/// launches are frozen, and a signal's synchronisation may then wait its bound for it.
fn id_unknown() {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, Relaxed) {
        crate::state::logged(|| tracing::warn!("xcuda: the driver gives no stream capture id (cuStreamGetCaptureInfo_v2): launches recorded into a capture wait while launches are frozen"));
    }
}

/// [`begin`] with the capture's id asked of `id` once the driver began it.
/// `id`: the capture's id and context, asked once the driver began it (for a mode other than
/// relaxed).
fn begin_with(limit: Duration, mode: u32, begin: impl FnOnce() -> CUresult, id: impl FnOnce() -> (u64, u64)) -> CUresult {
    let start = Instant::now();
    loop {
        ACTIVE.fetch_add(1, SeqCst);
        if SYNCING.load(SeqCst) == 0 || start.elapsed() >= limit {
            break;
        }
        uncount();
        while SYNCING.load(SeqCst) != 0 && start.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let rc = begin();
    if rc != CUresult::CUDA_SUCCESS {
        uncount();
        return rc;
    }
    if mode != MODE_RELAXED {
        let (id, ctx) = id();
        own_add(id, ctx);
    }
    rc
}

/// `cuStreamEndCapture*` on `stream` (`ptsz`: through a per-thread entry point) through `end`
/// (the real call): the capture is over when it succeeded or ended invalidated (cuda.h: the
/// graph is then null), or when the stream no longer captures after a refusal (an unjoined
/// fork); a refusal that leaves it capturing (`CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`) or
/// an end of a stream that did not capture (`CUDA_ERROR_STREAM_CAPTURE_UNMATCHED`) ended
/// nothing.
pub fn end(stream: u64, ptsz: bool, end: impl FnOnce() -> CUresult) -> CUresult {
    let s = effective(stream, ptsz);
    let before = capture_info(s);
    if before.is_some_and(|(status, _)| status == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE) {
        return end();
    }
    // The stream's context, asked while the capture still holds it.
    let ctx = stream_ctx(s);
    let rc = end();
    let over = rc == CUresult::CUDA_SUCCESS
        || rc == CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        || (before.is_some()
            && capture_info(s).is_some_and(|(status, _)| status == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE));
    if over {
        ended(ctx, before.map_or(0, |(_, id)| id));
    }
    rc
}

/// [`end`]'s bookkeeping once a capture of context `ctx` with id `id` ended.
fn ended(ctx: u64, id: u64) {
    uncount();
    own_remove(id);
    tally(ctx, -1);
}

/// How long a synchronisation of the exit path waits for captures in progress:
/// `exit.capture_wait_ms`, at most half of `exit.release_timeout_ms` (the synchronisation
/// itself must fit in what is left).
pub fn wait_limit() -> Duration {
    let e = &crate::state::config().exit;
    Duration::from_millis(e.capture_wait_ms.min(e.release_timeout_ms / 2))
}

fn uncount() {
    let _ = ACTIVE.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1));
}

/// Runs `sync` (a synchronisation of contexts) once no capture begun through the shim is in
/// progress and none can begin until it returns; waits at most `wait` for the captures in
/// progress to end, then runs it anyway (a capture left open for ever, or by a thread that
/// died, must not keep the process from draining; the driver then refuses the synchronisation
/// and invalidates that capture, as it did before). Returns `sync`'s result and whether it
/// had to give up waiting.
pub fn quiesced<T>(wait: Duration, sync: impl FnOnce() -> T) -> (T, bool) {
    let start = Instant::now();
    // Raised for the whole wait: the captures in progress end, and no new one begins.
    SYNCING.fetch_add(1, SeqCst);
    let mut logged = false;
    let gave_up = loop {
        if ACTIVE.load(SeqCst) == 0 {
            break false;
        }
        if start.elapsed() >= wait {
            break true;
        }
        if !logged {
            tracing::info!(captures = ACTIVE.load(SeqCst), "xcuda: waiting for the stream captures in progress to end before synchronising");
            logged = true;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    if gave_up {
        tracing::warn!(
            waited_ms = wait.as_millis() as u64,
            captures = ACTIVE.load(SeqCst),
            "xcuda: a stream capture is still in progress: synchronising anyway (the driver refuses the synchronisation and invalidates the capture)"
        );
    }
    let r = sync();
    SYNCING.fetch_sub(1, SeqCst);
    (r, gave_up)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    // One test owns the process-wide counters (tests in this module run one after another in
    // one function), so no other test's captures interfere.
    #[test]
    fn a_synchronisation_waits_for_the_capture_and_holds_new_ones_off() {
        let ok = || CUresult::CUDA_SUCCESS;
        // Refused begin: not counted, not this thread's.
        assert_eq!(begin_with(Duration::from_secs(1), 0, || CUresult::CUDA_ERROR_ILLEGAL_STATE, || (7, 0)), CUresult::CUDA_ERROR_ILLEGAL_STATE);
        assert!(!any_active() && !own_active());
        assert_eq!(begin_with(Duration::from_secs(1), 0, ok, || (0x11, 0)), CUresult::CUDA_SUCCESS);
        assert!(any_active() && own_has(0x11));
        // The synchronisation waits until the capture ends on another thread.
        let ended_at = Arc::new(AtomicBool::new(false));
        let e = ended_at.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            e.store(true, SeqCst);
            ended(0, 0x11);
        });
        let e = ended_at.clone();
        let (saw_end, gave_up) = quiesced(Duration::from_secs(30), move || e.load(SeqCst));
        t.join().unwrap();
        assert!(saw_end && !gave_up, "the synchronisation ran only after the capture ended");
        // While a synchronisation runs, a capture waits for it to finish.
        let syncing = Arc::new(AtomicBool::new(false));
        let (s, s2) = (syncing.clone(), syncing.clone());
        let sync = std::thread::spawn(move || {
            quiesced(Duration::from_secs(30), move || {
                s.store(true, SeqCst);
                std::thread::sleep(Duration::from_millis(150));
                s.store(false, SeqCst);
            })
        });
        while !syncing.load(SeqCst) {
            std::thread::yield_now();
        }
        let rc = begin_with(Duration::from_secs(30), 2, move || {
            assert!(!s2.load(SeqCst), "the capture began while the synchronisation ran");
            CUresult::CUDA_SUCCESS
        }, || (0x12, 0));
        assert_eq!(rc, CUresult::CUDA_SUCCESS);
        sync.join().unwrap();
        // A capture never ended: the synchronisation gives up after its wait and runs.
        let (ran, gave_up) = quiesced(Duration::from_millis(50), || true);
        assert!(ran && gave_up);
        // Ended on the thread that began it: this thread's capture 0x11 is no longer its own
        // once ended (by the other thread above, the driver allowing it: a relaxed capture).
        own_remove(0x11);
        ended(0, 0x12);
        assert!(!any_active() && !own_active());
        // Ends beyond the count never wrap it.
        ended(0, 0x12);
        assert!(!any_active());
        // Captures of a context that is destroyed end with it; another context's stay.
        for ctx in [0xA0, 0xA0, 0xB0] {
            assert_eq!(begin_with(Duration::from_secs(1), 2, ok, || (0, 0)), CUresult::CUDA_SUCCESS);
            tally(ctx, 1);
        }
        context_gone(0xA0);
        assert_eq!(ACTIVE.load(SeqCst), 1, "the other context's capture");
        context_gone(0xA0);
        assert_eq!(ACTIVE.load(SeqCst), 1, "gone once");
        ended(0xB0, 0);
        context_gone(0xB0);
        assert!(!any_active() && CTXS.iter().all(|c| c.load(Relaxed) == 0));
        // Only this thread's own non-relaxed captures, by id, let its launches pass.
        std::thread::spawn(move || {
            assert_eq!(begin_with(Duration::from_secs(1), 2, ok, || (0x21, 0)), CUresult::CUDA_SUCCESS);
            assert!(!own_active(), "a relaxed capture: another thread may end it");
            assert_eq!(begin_with(Duration::from_secs(1), 0, ok, || (0x22, 0)), CUresult::CUDA_SUCCESS);
            assert!(own_active() && own_has(0x22) && !own_has(0x21));
            std::thread::spawn(|| assert!(!own_active() && !own_has(0x22), "not another thread's")).join().unwrap();
            // Another thread's end of the relaxed capture leaves this thread's own one.
            std::thread::spawn(|| ended(0, 0x21)).join().unwrap();
            assert!(own_has(0x22));
            ended(0, 0x22);
            assert!(!own_active() && !any_active());
            // Past its slots a capture is not known as the thread's (its launches wait).
            for id in 1..=(OWN_SLOTS as u64 + 1) {
                assert_eq!(begin_with(Duration::from_secs(1), 1, ok, || (0x100 + id, 0)), CUresult::CUDA_SUCCESS);
            }
            assert!(own_has(0x100 + OWN_SLOTS as u64) && !own_has(0x101 + OWN_SLOTS as u64));
            for id in 1..=(OWN_SLOTS as u64 + 1) {
                ended(0, 0x100 + id);
            }
            assert!(!own_active() && !any_active());
            // An own capture of a context another thread destroyed (the capture ended with it)
            // is forgotten at this thread's next look; one of another context stays.
            assert_eq!(begin_with(Duration::from_secs(1), 0, ok, || (0x31, 0xC1)), CUresult::CUDA_SUCCESS);
            tally(0xC1, 1);
            assert_eq!(begin_with(Duration::from_secs(1), 0, ok, || (0x32, 0xC2)), CUresult::CUDA_SUCCESS);
            tally(0xC2, 1);
            std::thread::spawn(|| context_gone(0xC1)).join().unwrap();
            assert!(own_has(0x31));
            own_prune();
            assert!(!own_has(0x31) && own_has(0x32), "the gone context's capture forgotten, not the other's");
            ended(0xC2, 0x32);
            // The same handle back (a primary context's is its device's for good): a capture
            // begun in it after its going is not forgotten for that going.
            assert_eq!(begin_with(Duration::from_secs(1), 0, ok, || (0x33, 0xC1)), CUresult::CUDA_SUCCESS);
            tally(0xC1, 1);
            GONE_SEEN.with(|g| g.set(0));
            own_prune();
            assert!(own_has(0x33), "a capture begun after its context's handle went and came back");
            ended(0xC1, 0x33);
            assert!(!own_active() && !any_active());
        })
        .join()
        .unwrap();
    }
}
