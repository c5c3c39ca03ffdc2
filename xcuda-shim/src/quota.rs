//! Device-memory quota: one-step check-and-reserve (in the shared ledger when available, else
//! process-local), exact give-back on free through per-kind allocation maps, and array sizes.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};

use cuda_abi::{array_format_bytes, CUarray_format};
use node_ledger::{Ledger, ProcHandle};

use crate::ptrmap::PtrMap;

/// What an allocation key names; each kind has its own map (keys of different kinds may collide).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Device pointer from cuMemAlloc*/Pitch/Managed.
    DevicePtr,
    /// Device pointer from cuMemAllocAsync/cuMemAllocFromPoolAsync: in the same table as
    /// [`Kind::DevicePtr`] (either free gives it back), but owned by no context: it belongs to
    /// its pool and outlives the context it was made in (`cuCtxDestroy` "will not destroy
    /// memory allocations by cuMemCreate(), cuMemAllocAsync() and cuMemAllocFromPoolAsync()").
    StreamOrdered,
    /// cuMemCreate handle.
    Vmm,
    /// A `cuMemMap` mapping (by address) of a handle this process's shim did not create (an
    /// import, `cuMemImportFromShareableHandle`): its size counted while mapped.
    VmmImportMap,
    /// CUarray / CUmipmappedArray handle.
    Array,
    /// A `cuCtxSetLimit` limit of a context (`crate::limits`): owned by that context.
    CtxLimit,
}

impl Kind {
    /// Whether a record of this kind is owned by the context it was made in (given back when
    /// that context ends, [`Quota::release_context`]).
    #[inline]
    fn context_owned(self) -> bool {
        matches!(self, Kind::DevicePtr | Kind::Array | Kind::CtxLimit)
    }
}

/// Where reservations are counted.
pub enum Backend {
    /// The per-GPU ledger: the quota is shared by every process of the group.
    Ledger {
        /// The mapped ledger of this GPU.
        ledger: Ledger,
        /// This process's registration (group << 32 | slot; `u64::MAX` once retired).
        handle: AtomicU64,
        /// Bytes this process holds in the ledger (what its slot's `mem_bytes` says while it
        /// holds the slot's lock): what it counts again in a new slot after losing the lock
        /// ([`Quota::check_ledger`]), when a reclaimer may have given the old slot's back.
        held: AtomicU64,
    },
    /// No ledger: this process alone, same limit.
    Local {
        /// Bytes reserved by this process.
        used: AtomicU64,
        /// The process's limit in bytes.
        limit: u64,
    },
}

/// The quota of this process's group plus its live allocations.
pub struct Quota {
    backend: Backend,
    dptrs: PtrMap,
    /// cuMemCreate handles: bytes, and in the owner word the handle's state ([`VMM_RELEASED`],
    /// mappings in units of [`VMM_MAP`], `cuMemRetainAllocationHandle` references in units of
    /// [`VMM_RETAIN`]): counted until released as often as retained and no longer mapped.
    vmm: PtrMap,
    /// cuMemMap mappings: address -> (size, handle), to find the handle at cuMemUnmap.
    vmm_maps: PtrMap,
    /// cuMemMap mappings of handles not in `vmm` ([`Kind::VmmImportMap`]): address -> size.
    import_maps: PtrMap,
    arrays: PtrMap,
    /// Bytes the `cuCtxSetLimit` limits of each context hold (`crate::limits`).
    limits: PtrMap,
    last_reclaim_ns: AtomicU64,
    /// After fork: group slot + 1 to register the child in lazily (0 = nothing pending).
    fork_group: AtomicU64,
    /// After fork: the group's quota at the fork, for a child that finds the group gone.
    fork_quota: AtomicU64,
    /// The calling thread's current context (owner of a new allocation; 0 = unknown).
    owner_source: fn() -> u64,
    /// Set (for good) once the ledger is found damaged: new reservations are refused and the
    /// mapping is no longer touched; frees still succeed.
    damaged: AtomicBool,
    /// Id of the group this process registered in (ledger backend).
    group_id: u64,
    /// The MPS percentage recorded in this process's slot (0 = none), recorded again by a
    /// fork child that registers (it inherits the environment its MPS client starts with).
    mps_pct: u32,
    /// Fault injection for tests only (`memory.test_ledger_check_pause_ms`, default 0): pause
    /// [`Quota::check_ledger`] this long between its slot-lock and owner checks, the window in
    /// which this process's own exit release once made a sound ledger look overwritten.
    test_check_pause_ms: AtomicU64,
    /// How many times [`Quota::check_ledger`] entered that pause (tests wait on it).
    test_check_pauses: AtomicU64,
    /// The context teardowns in progress (changed under `teardown_lock`).
    teardowns: [Teardown; TEARDOWNS],
    /// Held while a teardown begins or ends (off the hot path; freed in a fork child).
    teardown_lock: crate::spin::SpinLock,
    /// Allocations of context-owned kinds on their way ([`Flight`]: from before the driver's
    /// call to their record), counted in the phase [`Quota::flight_phase`] said when they
    /// began.
    flights: [AtomicU32; 2],
    /// Which of `flights` a new allocation counts in; flipped by a teardown that waits for
    /// the other's to end ([`Quota::drain_flights`]), so that allocations beginning meanwhile
    /// never keep it waiting.
    flight_phase: AtomicU32,
    /// How many of `teardowns` are in progress: 0, an allocation's only look at them.
    tearing: AtomicU32,
    /// How many times an allocation waited for its context's teardown to end, or a teardown
    /// for allocations on their way (tests wait on it).
    teardown_waits: AtomicU64,
}

/// An allocation on its way, from before the driver's call until its record is made (or it
/// failed), and the owner its record takes ([`Quota::flight`], [`Quota::track_in`]). A
/// teardown of the context waits for those begun before it ([`Quota::context_teardown_begin`]),
/// whose records it then sets aside with the others: their memory was allocated before the
/// driver's teardown, which frees it. One of that context begun during the teardown waits
/// for its end, so that its driver's call comes after the driver's answer (it fails if the
/// context was destroyed, and is counted under the context otherwise: a release that was
/// not the last, a primary context retained again). Before, an allocation another thread
/// made between the records being set aside and the driver's call was recorded under the
/// context and stayed counted after the driver freed it.
#[must_use]
pub struct Flight<'a> {
    /// The phase count it is counted in (`None`: a kind no context owns, not counted).
    count: Option<&'a AtomicU32>,
    /// The context its record is owned by (0: none).
    owner: u64,
}

impl Drop for Flight<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(c) = self.count {
            c.fetch_sub(1, Release);
        }
    }
}

/// Live VMM handles (`cuMemCreate`) and live mappings one [`Quota`] (one GPU) records. PyTorch's
/// expandable segments create and map one handle per 20 MiB page (2 MiB in its small pool) and
/// keep them while mapped: 4096 stopped a job at 80 GiB whatever its quota (an H200 has 141).
/// A full table refuses the allocation (`CUDA_ERROR_OUT_OF_MEMORY`), never counts it short.
pub const VMM_CAPACITY: usize = 1 << 16;

/// How many contexts' concurrent teardowns one [`Quota`] tells apart; past them a teardown
/// ends on its own, as if alone.
const TEARDOWNS: usize = 16;

/// The teardowns in progress of one context (concurrent primary-context releases, say).
#[derive(Debug)]
struct Teardown {
    /// The context (0: the slot is free).
    ctx: AtomicU64,
    /// Its teardowns begun and not ended.
    running: AtomicU32,
    /// One of them destroyed the context.
    gone: AtomicBool,
}

impl Teardown {
    const fn new() -> Self {
        Self { ctx: AtomicU64::new(0), running: AtomicU32::new(0), gone: AtomicBool::new(false) }
    }
}

fn no_owner() -> u64 {
    0
}

/// A VMM handle's state word: `cuMemRelease` has returned for it.
const VMM_RELEASED: u64 = 1;
/// A VMM handle's state word: one mapping (made, or being made).
const VMM_MAP: u64 = 2;
/// A VMM handle's state word: one reference taken by `cuMemRetainAllocationHandle` (the driver
/// keeps the memory until each is released too).
const VMM_RETAIN: u64 = 1 << 32;
/// A VMM handle's state word: exported (`cuMemExportToShareableHandle`). The driver keeps the
/// memory while a shareable handle (an fd, its copies in other processes) or an import of it
/// lives, which the shim cannot see: released and unmapped, its record goes but its bytes stay
/// counted until the process leaves the ledger.
const VMM_EXPORTED: u64 = 1 << 31;

/// A handle's state word without its [`VMM_EXPORTED`] mark.
fn bare(w: u64) -> u64 {
    w & !VMM_EXPORTED
}

/// What [`Quota::vmm_release_begin`] marked, for [`Quota::vmm_release_end`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReleaseMark {
    /// The handle's state word after the mark.
    now: u64,
    /// The release took one `cuMemRetainAllocationHandle` reference (not the handle's own).
    retained: bool,
}

const NO_HANDLE: u64 = u64::MAX;

/// The owner word of the records of context `ctx` set aside during its teardown
/// ([`Quota::context_teardown_begin`]): a context handle is a user-space pointer, below 2^63,
/// so no live context owns it.
fn context_marked(ctx: u64) -> u64 {
    ctx | 1 << 63
}

/// A registration in one word: its owner generation, group slot and registry slot (below
/// 2^16 each: `node_ledger::layout::MAX_GROUPS`, `MAX_PROCS`), so it is loaded and swapped at once.
fn pack(h: ProcHandle) -> u64 {
    (u64::from(h.gen) << 32) | ((h.group as u64 & 0xffff) << 16) | (h.slot as u64 & 0xffff)
}

fn unpack(v: u64) -> Option<ProcHandle> {
    (v != NO_HANDLE).then_some(ProcHandle { slot: (v & 0xffff) as usize, group: ((v >> 16) & 0xffff) as usize, gen: (v >> 32) as u32 })
}

impl Quota {
    /// A quota counted in `ledger` for registered process `handle`.
    pub fn with_ledger(ledger: Ledger, handle: ProcHandle) -> Self {
        let group_id = ledger.group_id(handle.group);
        let mps_pct = ledger.layout().procs.get(handle.slot).map_or(0, |p| p.mps_pct.load(Relaxed));
        let mut q = Self::new(Backend::Ledger { ledger, handle: AtomicU64::new(pack(handle)), held: AtomicU64::new(0) });
        q.group_id = group_id;
        q.mps_pct = mps_pct;
        q
    }

    /// A process-local quota of `limit` bytes.
    pub fn local(limit: u64) -> Self {
        Self::new(Backend::Local { used: AtomicU64::new(0), limit })
    }

    fn new(backend: Backend) -> Self {
        Self { backend, dptrs: PtrMap::new(1 << 16), vmm: PtrMap::new(VMM_CAPACITY), vmm_maps: PtrMap::new(VMM_CAPACITY), import_maps: PtrMap::new(VMM_CAPACITY), arrays: PtrMap::new(1 << 12), limits: PtrMap::new(1 << 10), last_reclaim_ns: AtomicU64::new(0), fork_group: AtomicU64::new(0), fork_quota: AtomicU64::new(0), owner_source: no_owner, damaged: AtomicBool::new(false), group_id: 0, mps_pct: 0, test_check_pause_ms: AtomicU64::new(0), test_check_pauses: AtomicU64::new(0), teardowns: [const { Teardown::new() }; TEARDOWNS], teardown_lock: crate::spin::SpinLock::new(), flights: [AtomicU32::new(0), AtomicU32::new(0)], flight_phase: AtomicU32::new(0), tearing: AtomicU32::new(0), teardown_waits: AtomicU64::new(0) }
    }

    /// Records each new allocation's owner as `f` answers (the current CUDA context), so that
    /// [`Quota::release_context`] can give back what a destroyed context held.
    pub fn owned_by(mut self, f: fn() -> u64) -> Self {
        self.owner_source = f;
        self
    }

    /// Fault injection for tests only: see `memory.test_ledger_check_pause_ms` (0 = never).
    pub fn set_test_check_pause_ms(&self, ms: u64) {
        self.test_check_pause_ms.store(ms, Relaxed);
    }

    fn test_check_pause(&self) {
        let ms = self.test_check_pause_ms.load(Relaxed);
        if ms > 0 {
            self.test_check_pauses.fetch_add(1, AcqRel);
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
    }

    fn map(&self, k: Kind) -> &PtrMap {
        match k {
            Kind::DevicePtr | Kind::StreamOrdered => &self.dptrs,
            Kind::Vmm => &self.vmm,
            Kind::VmmImportMap => &self.import_maps,
            Kind::Array => &self.arrays,
            Kind::CtxLimit => &self.limits,
        }
    }

    /// Whether the ledger was found damaged (see [`Quota::check_ledger`]).
    pub fn ledger_damaged(&self) -> bool {
        self.damaged.load(Relaxed)
    }

    /// Periodic check (controller thread, never the hot path): the ledger's header still
    /// validates, this process still owns its registry slot and its group slot still holds its
    /// group. Returns the damage the first time it is found; from then on new reservations are
    /// refused. A body overwritten under a valid header is marked in the header, so that no
    /// newcomer re-creates the group with a fresh 0 usage and the monitor reports it. A slot
    /// lock this process lost is no damage: it registers again (`Quota::register_again`),
    /// and only if that fails is it returned and are reservations refused.
    pub fn check_ledger(&self) -> Option<String> {
        let Backend::Ledger { ledger, handle, held } = &self.backend else { return None };
        if self.damaged.load(Acquire) {
            return None;
        }
        let err = match ledger.check_header() {
            Err(e) => e,
            Ok(()) => {
                let raw = handle.load(Acquire);
                let h = unpack(raw)?;
                // `Ledger::check_registration` in its two halves, with the tests' pause between
                // them (the window the exit release once hit).
                let checked = ledger.check_slot_lock(h).and_then(|()| {
                    self.test_check_pause();
                    ledger.check_owner(h, std::process::id(), self.group_id)
                });
                match checked {
                    Ok(()) => return None,
                    // The exit release (retire) unregistered this process between the load
                    // above and the check: it swaps the handle out before it gives the slot
                    // lock, slot and group back, so a lock, slot or group we gave back
                    // ourselves is seen here as a changed handle, not as damage (the signal
                    // stress marked a sound ledger damaged this way after ~400 signalled
                    // clients; `a_check_racing_our_own_exit_release_is_not_damage`).
                    Err(_) if handle.load(Acquire) != raw => return None,
                    // Our own slot lock is gone (the application closed its fd): the ledger
                    // itself is sound, and what this process holds is counted again in a new
                    // slot; only if that cannot be done does it refuse from now on.
                    Err(node_ledger::LedgerError::Corrupt { field: "slot_lock", .. }) => {
                        match self.register_again(ledger, handle, held, raw, h) {
                            Ok(()) => return None,
                            Err(e) => e,
                        }
                    }
                    Err(e) => {
                        ledger.mark_damaged();
                        e
                    }
                }
            }
        };
        self.damaged.store(true, Release);
        Some(err.to_string())
    }

    /// The ledger, when counting there (and not found damaged).
    pub fn ledger(&self) -> Option<(&Ledger, Option<ProcHandle>)> {
        match &self.backend {
            Backend::Ledger { .. } if self.damaged.load(Relaxed) => None,
            Backend::Ledger { ledger, handle, .. } => Some((ledger, unpack(handle.load(Relaxed)))),
            Backend::Local { .. } => None,
        }
    }

    /// Reserves `bytes` if the quota allows, atomically; `false` = refuse the allocation.
    #[inline]
    pub fn try_reserve(&self, bytes: u64) -> bool {
        match &self.backend {
            Backend::Ledger { .. } if self.damaged.load(Relaxed) => false,
            Backend::Ledger { ledger, handle, held } => match unpack(handle.load(Relaxed)) {
                Some(h) => {
                    // Damage the controller has not seen yet (random bytes, an overwritten
                    // group): atomics only; the controller names it within a tick.
                    if !ledger.header_intact() || ledger.group_id(h.group) != self.group_id {
                        return false;
                    }
                    if ledger.try_reserve(h, bytes).is_ok() {
                        held.fetch_add(bytes, Relaxed);
                        return true;
                    }
                    // Dead neighbours may still hold quota: reclaim (at most every 100 ms), retry.
                    let now = node_ledger::clock::now_ns();
                    let last = self.last_reclaim_ns.load(Relaxed);
                    if now.saturating_sub(last) < 100_000_000
                        || self.last_reclaim_ns.compare_exchange(last, now, Relaxed, Relaxed).is_err()
                    {
                        return false;
                    }
                    let reclaimed = crate::state::logged(|| ledger.reclaim_dead()).map(|v| !v.is_empty()).unwrap_or(false);
                    let ok = reclaimed && ledger.try_reserve(h, bytes).is_ok();
                    if ok {
                        held.fetch_add(bytes, Relaxed);
                    }
                    ok
                }
                None => self.register_after_fork(ledger, handle) && self.try_reserve(bytes),
            },
            Backend::Local { used, limit } => {
                let mut cur = used.load(Relaxed);
                loop {
                    let Some(new) = cur.checked_add(bytes).filter(|n| n <= limit) else { return false };
                    match used.compare_exchange_weak(cur, new, AcqRel, Relaxed) {
                        Ok(_) => return true,
                        Err(a) => cur = a,
                    }
                }
            }
        }
    }

    /// Reserves `bytes`, or as much of them as the quota has room for (off the hot path: memory
    /// the driver already holds, counted as far as the quota allows so that the group sees
    /// itself at its limit). Returns the bytes reserved.
    pub fn reserve_up_to(&self, bytes: u64) -> u64 {
        // A few tries: each lost one means a neighbour took or gave back room in between.
        for _ in 0..8 {
            let room = self.limit().saturating_sub(self.used()).min(bytes);
            if room == 0 {
                return 0;
            }
            if self.try_reserve(room) {
                return room;
            }
        }
        0
    }

    /// Gives back `bytes` reserved earlier.
    #[inline]
    pub fn release(&self, bytes: u64) {
        match &self.backend {
            // A damaged ledger's counters mean nothing any more: the free succeeds, uncounted.
            Backend::Ledger { .. } if self.damaged.load(Relaxed) => {}
            Backend::Ledger { ledger, handle, held } => {
                // `held` first: a free while [`Quota::register_again`] moves the registration
                // (no handle) leaves the new slot over-counted by it (conservative).
                let _ = held.fetch_update(AcqRel, Relaxed, |v| Some(v.saturating_sub(bytes)));
                if let Some(h) = unpack(handle.load(Relaxed)) {
                    ledger.release(h, bytes);
                }
            }
            Backend::Local { used, .. } => {
                let _ = used.fetch_update(AcqRel, Relaxed, |v| Some(v.saturating_sub(bytes)));
            }
        }
    }

    /// Bytes in use by the group (ledger) or the process (local).
    pub fn used(&self) -> u64 {
        match &self.backend {
            Backend::Ledger { .. } if self.damaged.load(Relaxed) => 0,
            Backend::Ledger { ledger, handle, .. } => {
                unpack(handle.load(Relaxed)).map_or(0, |h| ledger.group_used(h.group))
            }
            Backend::Local { used, .. } => used.load(Relaxed),
        }
    }

    /// The group's quota in bytes.
    pub fn limit(&self) -> u64 {
        match &self.backend {
            Backend::Ledger { .. } if self.damaged.load(Relaxed) => 0,
            Backend::Ledger { ledger, handle, .. } => {
                unpack(handle.load(Relaxed)).map_or(0, |h| ledger.group_quota(h.group))
            }
            Backend::Local { limit, .. } => *limit,
        }
    }

    /// Begins an allocation of `kind` by the calling thread, before the driver is asked: see
    /// [`Flight`]. Its record is made with [`Quota::track_in`] while it lives. For a kind a
    /// context owns, it waits first while the current context is being torn down.
    #[inline]
    pub fn flight(&self, kind: Kind) -> Flight<'_> {
        if !kind.context_owned() {
            return Flight { count: None, owner: 0 };
        }
        self.flight_in((self.owner_source)())
    }

    /// [`Quota::flight`] of an allocation owned by context `ctx` (a context limit).
    #[inline]
    pub fn flight_in(&self, ctx: u64) -> Flight<'_> {
        loop {
            let count = &self.flights[(self.flight_phase.load(SeqCst) & 1) as usize];
            // Counted before the look at the teardowns (both SeqCst, as their side's are): a
            // teardown either sees this allocation on its way, or is seen by it.
            count.fetch_add(1, SeqCst);
            if self.tearing.load(SeqCst) == 0 || !self.tearing_down(ctx) {
                return Flight { count: Some(count), owner: ctx };
            }
            count.fetch_sub(1, Release);
            self.await_teardown(ctx);
        }
    }

    /// Whether a teardown of context `ctx` is in progress.
    fn tearing_down(&self, ctx: u64) -> bool {
        ctx != 0 && self.teardowns.iter().any(|t| t.ctx.load(SeqCst) == ctx)
    }

    /// Waits, counting no allocation on its way, until no teardown of `ctx` is in progress.
    #[cold]
    #[inline(never)]
    fn await_teardown(&self, ctx: u64) {
        self.teardown_waits.fetch_add(1, Relaxed);
        let mut spins = 0u32;
        while self.tearing_down(ctx) {
            spins = spins.saturating_add(1);
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// A teardown (under `teardown_lock`) waits until the allocations on their way when it
    /// began have made their records (or failed): those that began later count in the other
    /// phase, which it does not wait for.
    #[cold]
    fn drain_flights(&self) {
        let old = &self.flights[(self.flight_phase.fetch_xor(1, SeqCst) & 1) as usize];
        if old.load(SeqCst) == 0 {
            return;
        }
        self.teardown_waits.fetch_add(1, Relaxed);
        let mut spins = 0u32;
        while old.load(SeqCst) != 0 {
            spins = spins.saturating_add(1);
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// How many times an allocation waited for its context's teardown, or a teardown for
    /// allocations on their way (see [`Flight`]).
    pub fn teardown_waits(&self) -> u64 {
        self.teardown_waits.load(Relaxed)
    }

    /// Records allocation `key` of `bytes`, which the driver just made during `flight`
    /// (begun for `kind` before the driver's call), under the flight's owner; `false` if it
    /// could not be tracked.
    #[inline]
    pub fn track_in(&self, flight: &Flight<'_>, kind: Kind, key: u64, bytes: u64) -> bool {
        let owner = if kind.context_owned() { flight.owner } else { 0 };
        self.map(kind).insert_owned(key, bytes, owner)
    }

    /// Records an allocation that the driver just made; `false` if it could not be tracked.
    /// Its owner is read now, without a [`Flight`]: for kinds no context owns, and tests; an
    /// allocation a context owns is begun with [`Quota::flight`] and recorded with
    /// [`Quota::track_in`].
    #[inline]
    pub fn track(&self, kind: Kind, key: u64, bytes: u64) -> bool {
        // cuMemCreate handles belong to the device, not to a context: they outlive it. Their
        // owner word is their state instead (0: not released, not mapped).
        // Stream-ordered allocations belong to their pool: no owner, so a context's end
        // (`release_context`) never gives back bytes the driver still holds.
        let owner = if matches!(kind, Kind::Vmm | Kind::VmmImportMap | Kind::StreamOrdered) { 0 } else { (self.owner_source)() };
        self.map(kind).insert_owned(key, bytes, owner)
    }

    /// Context `ctx` is gone (destroyed, reset, or the primary context's last release): the
    /// driver freed every allocation made in it, so give their bytes back. Returns the bytes.
    pub fn release_context(&self, ctx: u64) -> u64 {
        let mut total = 0u64;
        for m in [&self.dptrs, &self.arrays, &self.limits] {
            total = total.saturating_add(m.remove_owned_by(ctx).1);
        }
        if total > 0 {
            self.release(total);
        }
        total
    }

    /// Before the driver tears context `ctx` down (destroy, reset, a primary context's
    /// release): the records of what it holds are set aside (their owner word marked, see
    /// `context_marked`), so that the allocations of another context the driver hands the
    /// same handle value to once `ctx` is gone are never taken for `ctx`'s. Ended by
    /// [`Quota::context_teardown_end`]; concurrent teardowns of one context (two threads
    /// releasing its primary context) are counted, and only the last to end ends them.
    ///
    /// The first teardown of `ctx` in progress makes the context's new allocations wait for
    /// its end, and waits for those on their way before setting records aside ([`Flight`]).
    pub fn context_teardown_begin(&self, ctx: u64) {
        let _one = self.teardown_lock.lock();
        if ctx != 0 {
            let first = match self.teardowns.iter().find(|t| t.ctx.load(Relaxed) == ctx).or_else(|| self.teardowns.iter().find(|t| t.ctx.load(Relaxed) == 0)) {
                Some(t) => {
                    let first = t.ctx.load(Relaxed) == 0;
                    if first {
                        t.gone.store(false, Relaxed);
                        t.ctx.store(ctx, SeqCst);
                        self.tearing.fetch_add(1, SeqCst);
                    }
                    t.running.fetch_add(1, Relaxed);
                    first
                }
                // Past TEARDOWNS contexts at once: allocations begun meanwhile are not held
                // back (their bytes may stay counted), those on their way are waited for.
                None => true,
            };
            if first {
                self.drain_flights();
            }
        }
        for m in [&self.dptrs, &self.arrays, &self.limits] {
            m.relabel_owner(ctx, context_marked(ctx));
        }
    }

    /// The driver answered a teardown [`Quota::context_teardown_begin`] began: `gone`, it
    /// destroyed the context. The last of the context's teardowns in progress to end removes
    /// the records set aside and gives their bytes back (returned) if any of them destroyed it,
    /// or makes them `ctx`'s again (0); the others only say what they found (0). Before, a
    /// teardown that left the context (not the last primary release) put back the records of a
    /// concurrent one that destroyed it, whose bytes then stayed counted for good.
    pub fn context_teardown_end(&self, ctx: u64, gone: bool) -> u64 {
        let _one = self.teardown_lock.lock();
        let mut gone = gone;
        let mut ended = None;
        if ctx != 0 {
            if let Some(t) = self.teardowns.iter().find(|t| t.ctx.load(Relaxed) == ctx) {
                if t.running.fetch_sub(1, Relaxed) > 1 {
                    if gone {
                        t.gone.store(true, Relaxed);
                    }
                    return 0;
                }
                gone |= t.gone.swap(false, Relaxed);
                ended = Some(t);
            }
        }
        let given = if gone {
            self.release_context(context_marked(ctx))
        } else {
            for m in [&self.dptrs, &self.arrays, &self.limits] {
                m.relabel_owner(context_marked(ctx), ctx);
            }
            0
        };
        // The context's allocations waiting for this end go on (after the driver's answer,
        // and after the records set aside went).
        if let Some(t) = ended {
            t.ctx.store(0, SeqCst);
            self.tearing.fetch_sub(1, SeqCst);
        }
        given
    }

    /// Takes allocation `key`'s record out of its table, its bytes still counted: (bytes,
    /// owner word); `None` if unknown. See [`crate::memory::freed`].
    #[inline]
    pub fn take(&self, kind: Kind, key: u64) -> Option<(u64, u64)> {
        self.map(kind).remove_where(key, |_| true)
    }

    /// Puts back a record [`Quota::take`] took (the driver refused the free). With no room
    /// (cannot happen: its slot was freed, but another insert may have taken it) the bytes
    /// stay counted for the process's life: an over-count, never an under-count. The record
    /// of a context whose teardown is in progress goes back set aside with the others (it was
    /// made before the teardown began: see [`Flight`]).
    pub fn put_back(&self, kind: Kind, key: u64, bytes: u64, owner: u64) {
        let owner = if kind.context_owned() && self.tearing.load(SeqCst) != 0 && self.tearing_down(owner) { context_marked(owner) } else { owner };
        if !self.map(kind).insert_owned(key, bytes, owner) {
            crate::state::logged(|| tracing::warn!(key, bytes, "xcuda: allocation table full; a refused free's bytes stay counted until exit"));
        }
    }

    /// Records `bytes` (already reserved) for context limit `key` of the context `flight` (from
    /// [`Quota::flight_in`], begun before the driver's call) is owned by, replacing its record
    /// (`crate::limits`); none for 0. With no room in the table the bytes stay counted for the
    /// process's life: an over-count, never an under-count.
    pub fn set_ctx_limit(&self, flight: &Flight<'_>, key: u64, bytes: u64) {
        self.limits.remove(key);
        if bytes > 0 && !self.limits.insert_owned(key, bytes, flight.owner) {
            crate::state::logged(|| tracing::warn!(key, bytes, "xcuda: context limit table full; this limit's bytes stay counted until exit"));
        }
    }

    /// Forgets an allocation and gives its bytes back; `None` if unknown (not ours to count).
    #[inline]
    pub fn untrack(&self, kind: Kind, key: u64) -> Option<u64> {
        let bytes = self.map(kind).remove(key)?;
        self.release(bytes);
        Some(bytes)
    }

    /// A mapping of VMM handle `h` is about to be made (`cuMemMap`): counted before the driver
    /// maps it, so that a `cuMemRelease` racing on another thread cannot give the bytes back
    /// under it. `false`: not a handle of this quota (or one already released and unmapped,
    /// which the driver refuses).
    pub fn vmm_map_begin(&self, h: u64) -> bool {
        self.vmm.update_owner(h, |w| (bare(w) != VMM_RELEASED).then_some(w + VMM_MAP)).is_some()
    }

    /// A mapping of `h` made through [`Quota::vmm_map_begin`] is recorded at `addr` (the driver
    /// made it); `false` if the table is full (the caller undoes the mapping).
    pub fn vmm_mapped(&self, addr: u64, size: u64, h: u64) -> bool {
        self.vmm_maps.insert_owned(addr, size, h)
    }

    /// A mapping of `h` is gone (unmapped, or the driver refused to make it): when it was the
    /// last one and the handle is released, its bytes go back. Returns the bytes given back.
    pub fn vmm_unmapped(&self, h: u64) -> Option<u64> {
        let (_, now) = self.vmm.update_owner(h, |w| (bare(w) >= VMM_MAP).then(|| w - VMM_MAP))?;
        (bare(now) == VMM_RELEASED).then(|| self.vmm_done(h)).flatten()
    }

    /// Start addresses of the recorded VMM mappings.
    pub fn vmm_mapping_starts(&self) -> Vec<u64> {
        self.vmm_maps.entries().into_iter().map(|(addr, _)| addr).collect()
    }

    /// Start addresses of the recorded mappings of handles this process did not create.
    pub fn import_mapping_starts(&self) -> Vec<u64> {
        self.import_maps.entries().into_iter().map(|(addr, _)| addr).collect()
    }

    /// The handle of the recorded mapping that holds `addr` (any address in it).
    pub fn vmm_handle_at(&self, addr: u64) -> Option<u64> {
        let (start, _) = self.vmm_maps.entries().into_iter().find(|&(start, size)| start <= addr && addr - start < size)?;
        self.vmm_maps.get_owned(start).map(|(_, h)| h)
    }

    /// The recorded mapping that starts at `addr`: (size, handle). One lookup.
    pub fn vmm_mapping_at(&self, addr: u64) -> Option<(u64, u64)> {
        self.vmm_maps.get_owned(addr)
    }

    /// The recorded mapping at `addr`, taken out: (size, handle).
    pub fn vmm_unmap_take(&self, addr: u64) -> Option<(u64, u64)> {
        self.vmm_maps.remove_where(addr, |_| true)
    }

    /// Puts back a mapping taken by [`Quota::vmm_unmap_take`] (the driver refused the unmap).
    pub fn vmm_unmap_undo(&self, addr: u64, size: u64, h: u64) {
        if !self.vmm_maps.insert_owned(addr, size, h) {
            // Cannot happen (the slot it left is free); if it did, the handle stays counted.
            crate::state::logged(|| tracing::warn!(addr, h, "xcuda: VMM mapping table full; the handle stays counted until exit"));
        }
    }

    /// `cuMemRelease(h)` returned: the bytes go back now if `h` is not mapped, else at its last
    /// unmap (the driver keeps the memory alive as long as a mapping holds it). `None`: not a
    /// handle of this quota; `Some(0)`: still mapped.
    pub fn vmm_release(&self, h: u64) -> Option<u64> {
        let mark = self.vmm_release_begin(h)?;
        Some(self.vmm_release_end(h, true, mark))
    }

    /// Before the driver's `cuMemRetainAllocationHandle` answers with `h` (a handle of this
    /// quota mapped where the caller asked): one reference more, so that the bytes stay
    /// counted until it is released too. `false`: not a handle of this quota.
    pub fn vmm_retain(&self, h: u64) -> bool {
        self.vmm.update_owner(h, |w| Some(w + VMM_RETAIN)).is_some()
    }

    /// The driver refused the retain [`Quota::vmm_retain`] counted: taken off again (the bytes
    /// go back if that was all that held them).
    pub fn vmm_retain_undo(&self, h: u64) {
        if let Some((_, now)) = self.vmm.update_owner(h, |w| (w >= VMM_RETAIN).then(|| w - VMM_RETAIN)) {
            if bare(now) == VMM_RELEASED {
                self.vmm_done(h);
            }
        }
    }

    /// Before the driver's `cuMemRelease(h)`: takes one retained reference off `h`, or with
    /// none marks it released, so that once the driver has released it, and may hand the same
    /// handle value to another `cuMemCreate` at once, the new record is never taken for this
    /// one. `None`: not a handle of this quota, or released already as often as retained.
    pub fn vmm_release_begin(&self, h: u64) -> Option<ReleaseMark> {
        let (old, now) = self.vmm.update_owner(h, |w| {
            if w >= VMM_RETAIN {
                Some(w - VMM_RETAIN)
            } else {
                (w & VMM_RELEASED == 0).then_some(w | VMM_RELEASED)
            }
        })?;
        Some(ReleaseMark { now, retained: old >= VMM_RETAIN })
    }

    /// After the driver's `cuMemRelease(h)` (`ok`: it released), `now` the word
    /// [`Quota::vmm_release_begin`] left: unmapped, its bytes go back now (the bytes given
    /// back are returned); still mapped, at its last unmap. Refused, the mark is taken off.
    pub fn vmm_release_end(&self, h: u64, ok: bool, mark: ReleaseMark) -> u64 {
        if !ok {
            let _ = if mark.retained {
                self.vmm.update_owner(h, |w| Some(w + VMM_RETAIN))
            } else {
                self.vmm.update_owner(h, |w| (w & VMM_RELEASED != 0).then_some(w & !VMM_RELEASED))
            };
            return 0;
        }
        if bare(mark.now) == VMM_RELEASED { self.vmm_done(h).unwrap_or(0) } else { 0 }
    }

    /// Before the driver's `cuMemExportToShareableHandle(h)`: `h` marked exported (before, so
    /// that a release on another thread meanwhile keeps its bytes counted). `None`: not a
    /// handle of this quota; `Some(true)`: it was marked already.
    pub fn vmm_export_begin(&self, h: u64) -> Option<bool> {
        let (old, _) = self.vmm.update_owner(h, |w| Some(w | VMM_EXPORTED))?;
        Some(old & VMM_EXPORTED != 0)
    }

    /// The driver refused the export [`Quota::vmm_export_begin`] marked (it was not marked
    /// before): the mark taken off. If the handle was released and unmapped meanwhile, its
    /// bytes stay counted until exit (an over-count, never an under-count).
    pub fn vmm_export_undo(&self, h: u64) {
        let _ = self.vmm.update_owner(h, |w| Some(w & !VMM_EXPORTED));
    }

    /// `h` is released and unmapped: forgotten, its bytes given back; an exported handle's
    /// stay counted until exit (returns 0 given back).
    fn vmm_done(&self, h: u64) -> Option<u64> {
        let (bytes, w) = self.vmm.remove_where(h, |w| bare(w) == VMM_RELEASED)?;
        if w & VMM_EXPORTED != 0 {
            crate::state::logged(|| tracing::info!(h, bytes, "xcuda: an exported VMM allocation was released; its bytes stay counted until exit (its shareable handle may keep the memory)"));
            return Some(0);
        }
        self.release(bytes);
        Some(bytes)
    }

    /// Bytes counted for a live allocation.
    pub fn tracked(&self, kind: Kind, key: u64) -> Option<u64> {
        self.map(kind).get(key)
    }

    /// Leaves the ledger, giving back everything still counted (exit / contexts destroyed).
    pub fn retire(&self) {
        for m in [&self.dptrs, &self.vmm, &self.vmm_maps, &self.import_maps, &self.arrays, &self.limits] {
            m.clear();
        }
        match &self.backend {
            Backend::Ledger { .. } if self.damaged.load(Relaxed) => {}
            Backend::Ledger { ledger, handle, held } => {
                if let Some(h) = unpack(handle.swap(NO_HANDLE, AcqRel)) {
                    ledger.unregister(h);
                }
                held.store(0, Relaxed);
            }
            Backend::Local { used, .. } => used.store(0, Relaxed),
        }
    }

    /// In a fork child (no locks, no allocation): the parent's allocations and registration
    /// are not ours; the child registers on its first reservation (with a slot lock of its
    /// own), in its group looked up again by id ([`register_in_group`]). The parent's slot lock is inherited with its fd and left open: like the device
    /// memory behind the driver's inherited fds, the parent's usage stays counted until the
    /// parent and such children are all gone.
    pub fn after_fork_child(&self) {
        for m in [&self.dptrs, &self.vmm, &self.vmm_maps, &self.import_maps, &self.arrays, &self.limits] {
            m.clear();
        }
        for t in &self.teardowns {
            t.ctx.store(0, Relaxed);
            t.running.store(0, Relaxed);
            t.gone.store(false, Relaxed);
        }
        self.teardown_lock.reset_after_fork();
        for c in &self.flights {
            c.store(0, Relaxed);
        }
        self.tearing.store(0, Relaxed);
        match &self.backend {
            Backend::Ledger { ledger, handle, held } => {
                if let Some(h) = unpack(handle.swap(NO_HANDLE, AcqRel)) {
                    self.fork_quota.store(ledger.group_quota(h.group), Relaxed);
                    self.fork_group.store(h.group as u64 + 1, Release);
                }
                held.store(0, Relaxed);
            }
            Backend::Local { used, .. } => used.store(0, Relaxed),
        }
    }

    /// This process lost registration `lost`'s slot lock (the application closed or replaced
    /// its fd), `raw` its packed handle: a reclaimer may have given the slot's usage back, and
    /// a newcomer taken the slot, while this process still holds the memory. Fails closed: a
    /// new registration in this process's group (looked up again by id, never created), which
    /// counts everything this process holds ([`Backend::Ledger::held`]), past the quota if need
    /// be (the group then refuses until frees bring it back under). Meanwhile (no handle)
    /// reservations are refused and frees leave the new slot over-counted. `Err`: no new
    /// registration could be made; the caller refuses from now on.
    #[cold]
    fn register_again(&self, ledger: &Ledger, handle: &AtomicU64, held: &AtomicU64, raw: u64, lost: ProcHandle) -> Result<(), node_ledger::LedgerError> {
        if handle.compare_exchange(raw, NO_HANDLE, AcqRel, Acquire).is_err() {
            return Ok(()); // retired (exit) meanwhile
        }
        // Forgets the lost lock's fd (gives back nothing: the slot is no longer ours).
        ledger.unregister(lost);
        let group = if ledger.group_id(lost.group) == self.group_id { Some(lost.group) } else { ledger.find_group(self.group_id) };
        let h = match group.map(|g| ledger.register_with_mps(std::process::id(), g, self.mps_pct)) {
            Some(Ok(h)) if ledger.group_id(h.group) == self.group_id => h,
            Some(Ok(h)) => {
                ledger.unregister(h);
                return Err(corrupt_group(ledger, self.group_id));
            }
            Some(Err(e)) => return Err(e),
            None => return Err(corrupt_group(ledger, self.group_id)),
        };
        let bytes = held.load(Acquire);
        if ledger.try_reserve(h, bytes).is_err() {
            ledger.count_held(h, bytes);
        }
        handle.store(pack(h), Release);
        crate::state::logged(|| tracing::warn!(lost = lost.slot, slot = h.slot, bytes, "xcuda: this process's ledger slot lock was gone (its fd closed by the application?): registered again, its memory counted in the new slot"));
        Ok(())
    }

    #[cold]
    fn register_after_fork(&self, ledger: &Ledger, handle: &AtomicU64) -> bool {
        let g = self.fork_group.swap(0, AcqRel);
        if g == 0 {
            return false;
        }
        // The parent's group slot (g - 1) may hold another group by now: the parent left, its
        // group was unused and another container took the slot over. Looked up again by id, as
        // at start (created again with the quota it had at the fork if it is gone): never
        // another group's quota, and no registration that the checks would take for damage.
        let quota = self.fork_quota.load(Relaxed);
        match register_in_group(ledger, self.group_id, quota, self.mps_pct) {
            Ok(h) => {
                handle.store(pack(h), Release);
                true
            }
            Err(e) => {
                crate::state::logged(|| tracing::error!("xcuda: fork child cannot register in the ledger: {e}"));
                false
            }
        }
    }
}

/// A teardown of context `ctx` by `call` (the driver's) on every quota `quotas` gives: the
/// context's records set aside before the call ([`Quota::context_teardown_begin`]), their
/// bytes given back after it if `gone` says the driver freed the context's allocations, put
/// back otherwise. The teardown is ended on every path: a panic in the driver call or in
/// `gone` (caught at the C boundary) left it begun for good, and every later allocation in a
/// context of that handle waiting for its end; ended so, the records are put back (counted:
/// the conservative side). Returns the driver's answer.
pub fn context_teardown<'q, I: Iterator<Item = &'q Quota>>(
    quotas: impl Fn() -> I,
    ctx: u64,
    call: impl FnOnce() -> cuda_abi::CUresult,
    gone: impl FnOnce(cuda_abi::CUresult) -> bool,
) -> cuda_abi::CUresult {
    struct End<'q, I: Iterator<Item = &'q Quota>, F: Fn() -> I> {
        quotas: F,
        ctx: u64,
        gone: bool,
    }
    impl<'q, I: Iterator<Item = &'q Quota>, F: Fn() -> I> Drop for End<'q, I, F> {
        fn drop(&mut self) {
            // No second panic while a first unwinds (that would abort the process).
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                (self.quotas)().for_each(|q| {
                    q.context_teardown_end(self.ctx, self.gone);
                })
            }));
        }
    }
    quotas().for_each(|q| q.context_teardown_begin(ctx));
    let mut end = End { quotas, ctx, gone: false };
    let rc = call();
    end.gone = gone(rc);
    drop(end);
    rc
}

/// Registers this process in group `id` of `ledger`, found or created with `quota` bytes
/// ([`Ledger::group`]: the tighter quota wins), recording MPS percentage `mps_pct`. A full group
/// table lets a newcomer take over an unused group's slot: one taken over between the lookup
/// and the registration names another group then, whose quota this process must never use:
/// looked up and registered once more; another group's again, an error.
pub fn register_in_group(ledger: &Ledger, id: u64, quota: u64, mps_pct: u32) -> Result<ProcHandle, String> {
    for _ in 0..2 {
        let group = ledger.group(id, quota).map_err(|e| e.to_string())?;
        let h = ledger.register_with_mps(std::process::id(), group, mps_pct).map_err(|e| e.to_string())?;
        if ledger.group_id(h.group) == id {
            return Ok(h);
        }
        ledger.unregister(h);
    }
    Err(format!("group {id:#x} of {} was taken over by another group twice while registering", ledger.path().display()))
}

/// Why [`Quota::register_again`] found no slot of this process's group.
fn corrupt_group(ledger: &Ledger, id: u64) -> node_ledger::LedgerError {
    node_ledger::LedgerError::Corrupt {
        path: ledger.path().to_owned(),
        field: "groups.id",
        detail: format!("this process's group {id:#x} is gone (taken over): its memory can no longer be counted there"),
    }
}

/// Bytes of a 1-3D array: width * height * depth * channels * element size (unknown formats
/// are counted at 8 bytes per channel, conservatively).
pub fn array_bytes(width: usize, height: usize, depth: usize, format: CUarray_format, channels: u32) -> u64 {
    let elem = array_format_bytes(format).unwrap_or(8);
    (width.max(1) as u64)
        .saturating_mul(height.max(1) as u64)
        .saturating_mul(depth.max(1) as u64)
        .saturating_mul(u64::from(channels.max(1)))
        .saturating_mul(elem)
}

/// Bytes of a mipmapped array: the sum over its levels of the level sizes. Each spatial
/// dimension halves per level (never below 1); a layered or cubemap array (`flags`) keeps all
/// its layers or faces (`depth`) at every level. `levels` is taken at most up to a full chain
/// (1 + log2 of the largest spatial dimension, at most 64 levels): the driver refuses more
/// (`CUDA_ERROR_INVALID_VALUE`), and a hostile `u32::MAX` must not loop for seconds here.
pub fn mipmapped_bytes(
    width: usize,
    height: usize,
    depth: usize,
    format: CUarray_format,
    channels: u32,
    flags: u32,
    levels: u32,
) -> u64 {
    let layered = flags & (cuda_abi::CUDA_ARRAY3D_LAYERED | cuda_abi::CUDA_ARRAY3D_CUBEMAP) != 0;
    let layers = if layered { depth.max(1) as u64 } else { 1 };
    let (mut w, mut h, mut d) = (width.max(1), height, if layered { 0 } else { depth });
    let chain = usize::BITS - w.max(h).max(d).max(1).leading_zeros();
    let mut total = 0u64;
    for _ in 0..levels.clamp(1, chain) {
        total = total.saturating_add(array_bytes(w, h, d, format, channels).saturating_mul(layers));
        w = (w / 2).max(1);
        h = if h > 0 { (h / 2).max(1) } else { 0 };
        d = if d > 0 { (d / 2).max(1) } else { 0 };
    }
    total
}

/// Pitch reservation before the driver answers: rows padded to 512 bytes.
pub fn pitch_estimate(width: usize, height: usize) -> u64 {
    (width as u64).div_ceil(512).saturating_mul(512).max(512).saturating_mul(height.max(1) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    /// An exported handle (cuMemExportToShareableHandle) released unmapped: the driver keeps
    /// its memory while the fd or an import lives, so its bytes stay counted (until exit), and
    /// its record goes, so that the driver's reuse of the handle value is counted afresh.
    /// Without the mark, the release gave the bytes back, and create + export + release (+
    /// import + map) could be repeated without limit.
    #[test]
    fn an_exported_vmm_handle_stays_counted_after_its_release() {
        let q = Quota::local(100);
        assert!(q.try_reserve(40) && q.track(Kind::Vmm, 0xa, 40));
        assert_eq!(q.vmm_export_begin(0xa), Some(false));
        assert_eq!(q.vmm_export_begin(0xa), Some(true), "exported twice");
        assert_eq!(q.vmm_release(0xa), Some(0), "exported: nothing given back");
        assert_eq!((q.used(), q.tracked(Kind::Vmm, 0xa)), (40, None), "counted, the record gone");
        assert!(q.try_reserve(40) && q.track(Kind::Vmm, 0xa, 40), "the handle value reused by the driver");
        assert_eq!(q.vmm_release(0xa), Some(40), "not exported: given back");
        // Mapped when released: kept at the last unmap too; a refused export takes its mark off.
        assert!(q.try_reserve(20) && q.track(Kind::Vmm, 0xb, 20));
        assert_eq!(q.vmm_export_begin(0xb), Some(false));
        assert!(q.vmm_map_begin(0xb) && q.vmm_mapped(0x7000, 20, 0xb));
        assert_eq!(q.vmm_release(0xb), Some(0));
        assert_eq!(q.vmm_unmap_take(0x7000), Some((20, 0xb)));
        assert_eq!(q.vmm_unmapped(0xb), Some(0), "unmapped: the record goes, the bytes stay");
        assert_eq!(q.used(), 60);
        assert!(q.try_reserve(10) && q.track(Kind::Vmm, 0xc, 10));
        assert_eq!(q.vmm_export_begin(0xc), Some(false));
        q.vmm_export_undo(0xc);
        assert_eq!(q.vmm_release(0xc), Some(10), "the driver refused the export: given back");
        assert_eq!(q.vmm_export_begin(0xd), None, "not a handle of this quota");
    }

    /// PyTorch's expandable segments: one handle created and mapped per 20 MiB page, kept while
    /// mapped. 8192 pages (160 GiB, past an H200) are all counted and given back; before, the
    /// 4097th page was refused at 80 GiB whatever the quota.
    #[test]
    fn expandable_segments_past_80_gib_are_counted_page_by_page() {
        const PAGE: u64 = 20 << 20;
        let q = Quota::local(200 << 30);
        let (handle, addr) = (|i: u64| 0x10_0000 + i * 16, |i: u64| 0x7f00_0000_0000 + i * PAGE);
        for i in 0..8192 {
            assert!(q.try_reserve(PAGE) && q.track(Kind::Vmm, handle(i), PAGE), "page {i} created");
            assert!(q.vmm_map_begin(handle(i)) && q.vmm_mapped(addr(i), PAGE, handle(i)), "page {i} mapped");
        }
        assert_eq!(q.used(), 8192 * PAGE);
        for i in 0..8192 {
            assert_eq!(q.vmm_unmap_take(addr(i)), Some((PAGE, handle(i))));
            assert_eq!(q.vmm_unmapped(handle(i)), None, "still held by its handle");
            assert_eq!(q.vmm_release(handle(i)), Some(PAGE));
        }
        assert_eq!(q.used(), 0);
    }


    /// bytes stay counted until the handle is released once more than it was retained and no
    /// mapping holds it. NVIDIA's idiom (create, map, release at once), then a retain, an
    /// unmap, and a map of the retained handle: without the retain counted, the unmap gave the
    /// bytes back while the driver still held them, and the new mapping went uncounted.
    #[test]
    fn a_retained_vmm_handle_stays_counted_until_each_reference_is_released() {
        let q = Quota::local(100);
        assert!(q.try_reserve(40) && q.track(Kind::Vmm, 0xa, 40));
        assert!(q.vmm_map_begin(0xa) && q.vmm_mapped(0x7000, 40, 0xa));
        assert_eq!(q.vmm_release(0xa), Some(0), "released while mapped");
        assert_eq!(q.vmm_handle_at(0x7000 + 39), Some(0xa), "any address in the mapping names its handle");
        assert_eq!(q.vmm_handle_at(0x7000 + 40), None);
        assert!(q.vmm_retain(0xa));
        assert_eq!(q.vmm_unmap_take(0x7000), Some((40, 0xa)));
        assert_eq!(q.vmm_unmapped(0xa), None, "unmapped, but a retained reference holds it");
        assert_eq!(q.used(), 40);
        assert!(q.vmm_map_begin(0xa) && q.vmm_mapped(0x9000, 40, 0xa), "the retained handle maps again");
        let mark = q.vmm_release_begin(0xa).expect("the retained reference");
        assert_eq!(q.vmm_release_end(0xa, false, mark), 0, "the driver refused that release");
        assert_eq!(q.vmm_release(0xa), Some(0), "the retained reference, still mapped");
        assert_eq!(q.vmm_release(0xa), None, "released as often as retained: nothing left to release");
        assert_eq!(q.vmm_unmap_take(0x9000), Some((40, 0xa)));
        assert_eq!(q.vmm_unmapped(0xa), Some(40), "the last unmap gives it back");
        assert_eq!((q.used(), q.tracked(Kind::Vmm, 0xa)), (0, None));
        // A retain the driver refused is taken back; the bytes go if it was all that held them.
        assert!(q.try_reserve(40) && q.track(Kind::Vmm, 0xb, 40));
        assert_eq!(q.vmm_release(0xb), Some(40), "unmapped: released at once");
        assert!(!q.vmm_retain(0xb), "a handle no longer counted");
        assert!(q.try_reserve(40) && q.track(Kind::Vmm, 0xc, 40));
        assert!(q.vmm_map_begin(0xc) && q.vmm_mapped(0x7000, 40, 0xc));
        assert_eq!(q.vmm_release(0xc), Some(0));
        assert!(q.vmm_retain(0xc));
        assert_eq!(q.vmm_unmap_take(0x7000), Some((40, 0xc)));
        assert_eq!(q.vmm_unmapped(0xc), None);
        q.vmm_retain_undo(0xc);
        assert_eq!((q.used(), q.tracked(Kind::Vmm, 0xc)), (0, None), "the refused retain held it alone");
    }

    /// A cuMemCreate handle stays counted until it is released and no mapping holds it, in
    /// whichever order the two happen, and a mapping being made keeps it counted through a
    /// release on another thread (the driver refusing the mapping then gives the bytes back).
    #[test]
    fn vmm_bytes_go_back_at_the_last_of_release_and_unmap() {
        let q = Quota::local(100);
        let created = |h: u64| assert!(q.try_reserve(40) && q.track(Kind::Vmm, h, 40));
        created(0xa);
        assert!(q.vmm_map_begin(0xa) && q.vmm_mapped(0x7000, 40, 0xa));
        assert_eq!(q.vmm_release(0xa), Some(0), "released while mapped: still counted");
        assert_eq!(q.used(), 40);
        assert!(!q.vmm_map_begin(0xb), "not a handle of ours");
        assert_eq!(q.vmm_unmap_take(0x7000), Some((40, 0xa)));
        assert_eq!(q.vmm_unmapped(0xa), Some(40), "the last unmap gives it back");
        assert_eq!((q.used(), q.tracked(Kind::Vmm, 0xa)), (0, None));
        created(0xa);
        assert!(q.vmm_map_begin(0xa) && q.vmm_mapped(0x7000, 40, 0xa));
        assert_eq!(q.vmm_unmap_take(0x7000), Some((40, 0xa)));
        assert_eq!(q.vmm_unmapped(0xa), None, "unmapped, not released: still counted");
        assert_eq!(q.vmm_release(0xa), Some(40));
        created(0xc);
        assert!(q.vmm_map_begin(0xc), "a mapping on its way");
        assert_eq!(q.vmm_release(0xc), Some(0), "a release meanwhile keeps the bytes counted");
        assert_eq!(q.used(), 40);
        assert_eq!(q.vmm_unmapped(0xc), Some(40), "the driver refused the mapping");
        assert_eq!(q.used(), 0);
    }

    #[test]
    fn local_quota_refuses_and_returns_exactly() {
        let q = Quota::local(1000);
        assert!(q.try_reserve(600));
        assert!(q.track(Kind::DevicePtr, 0x1000, 600));
        assert!(!q.try_reserve(401));
        assert_eq!(q.untrack(Kind::DevicePtr, 0x1000), Some(600));
        assert_eq!(q.untrack(Kind::DevicePtr, 0x1000), None, "unknown pointer not counted");
        assert_eq!(q.used(), 0);
        assert!(q.try_reserve(1000));
    }

    #[test]
    fn ledger_quota_is_shared_between_two_quotas_of_one_group() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("gpu0/ledger");
        let (l1, l2) = (Ledger::open_or_create(&p, 0).unwrap(), Ledger::open_or_create(&p, 0).unwrap());
        let g = l1.group(5, 1000).unwrap();
        let h1 = l1.register(std::process::id(), g).unwrap();
        // A second process configured looser gets the group's (tighter) quota, not its own.
        let h2 = l2.register(std::process::id(), l2.group(5, 5000).unwrap()).unwrap();
        let (a, b) = (Quota::with_ledger(l1, h1), Quota::with_ledger(l2, h2));
        assert!(a.try_reserve(700));
        assert!(!b.try_reserve(301));
        assert!(b.try_reserve(300));
        assert_eq!(a.used(), 1000);
        a.retire();
        assert_eq!(b.used(), 300, "retiring gives back only a's share");
        assert_eq!(b.limit(), 1000);
    }

    thread_local!(static CUR: std::cell::Cell<u64> = const { std::cell::Cell::new(0) });

    /// This test thread's current context, as a quota's owner source.
    fn cur() -> u64 {
        CUR.with(|c| c.get())
    }

    /// A 1000-byte local quota that records each allocation's owner as [`cur`], holding 600
    /// bytes of device memory (0x1000) and a 100-byte array made in context 0xc1.
    fn two_in_context_c1() -> Quota {
        let q = Quota::local(1000).owned_by(cur);
        CUR.with(|c| c.set(0xc1));
        assert!(q.try_reserve(600) && q.track(Kind::DevicePtr, 0x1000, 600));
        assert!(q.try_reserve(100) && q.track(Kind::Array, 0x1100, 100));
        q
    }

    #[test]
    fn destroyed_context_gives_back_its_allocations_only() {
        let q = two_in_context_c1();
        assert!(q.try_reserve(50) && q.track(Kind::Vmm, 0x1000, 50));
        CUR.with(|c| c.set(0xc2));
        assert!(q.try_reserve(200) && q.track(Kind::DevicePtr, 0x2000, 200));
        assert!(!q.try_reserve(51));
        assert_eq!(q.release_context(0xc1), 700);
        assert_eq!(q.used(), 250, "the other context's and the VMM handle's bytes stay");
        assert_eq!(q.untrack(Kind::DevicePtr, 0x1000), None, "a free after the destroy is not counted twice");
        assert_eq!(q.release_context(0xc1), 0);
        assert!(q.try_reserve(750));
    }

    /// Review finding: a context's teardown gave its bytes back by handle after the driver
    /// call; a context another thread created meanwhile under the same handle value (the
    /// driver reuses them) lost its new allocation's bytes with it. The records are set aside
    /// before the call now: a new allocation under the reused handle stays counted, and a
    /// refused teardown puts them back.
    #[test]
    fn a_context_handle_reused_during_a_teardown_keeps_its_new_allocations() {
        let q = two_in_context_c1();
        q.context_teardown_begin(0xc1);
        assert_eq!(q.context_teardown_end(0xc1, false), 0, "the driver refused: nothing given back");
        assert_eq!(q.used(), 700);
        q.context_teardown_begin(0xc1);
        // The driver destroyed 0xc1; another thread's new context got the same handle and
        // allocated before this thread gives the old one's bytes back.
        assert!(q.try_reserve(200) && q.track(Kind::DevicePtr, 0x2000, 200));
        assert_eq!(q.context_teardown_end(0xc1, true), 700);
        assert_eq!(q.used(), 200, "the new context's allocation stays counted");
        assert_eq!(q.untrack(Kind::DevicePtr, 0x2000), Some(200));
        assert_eq!(q.used(), 0);
    }

    /// Review finding: two threads released the same primary context at once, one not the
    /// last retain (the driver keeps the context) and one the last (the driver destroys it).
    /// Both set its records aside; the first ended first and put them all back, so the last
    /// found nothing set aside and the destroyed context's bytes stayed counted for the
    /// process's life. Only the last of concurrent teardowns ends them now, giving the bytes
    /// back if any of them destroyed the context; in either order.
    #[test]
    fn concurrent_teardowns_of_one_context_give_its_bytes_back_if_any_destroyed_it() {
        for destroyer_ends_first in [false, true] {
            let q = two_in_context_c1();
            q.context_teardown_begin(0xc1);
            q.context_teardown_begin(0xc1);
            let (first, last) = if destroyer_ends_first { (true, false) } else { (false, true) };
            q.context_teardown_end(0xc1, first);
            q.context_teardown_end(0xc1, last);
            assert_eq!(q.used(), 0, "destroyer ended first: {destroyer_ends_first}");
            assert_eq!(q.untrack(Kind::DevicePtr, 0x1000), None);
        }
        // Neither destroyed it: everything is the context's again.
        let q = two_in_context_c1();
        q.context_teardown_begin(0xc1);
        q.context_teardown_begin(0xc1);
        q.context_teardown_end(0xc1, false);
        q.context_teardown_end(0xc1, false);
        assert_eq!(q.release_context(0xc1), 700, "still recorded as the context's");
    }

    /// Waits until `done`, or until `q` counted a wait for a teardown ([`Quota::teardown_waits`]):
    /// where another thread's call stands, whichever way it goes. Panics past a minute (a
    /// hang, not a measure).
    fn until_done_or_waiting(q: &Quota, done: &AtomicBool) {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !done.load(SeqCst) && q.teardown_waits() == 0 {
            assert!(std::time::Instant::now() < end, "neither done nor waiting for a teardown");
            std::thread::yield_now();
        }
    }

    /// README, left open by session 12's review: an allocation another thread made in a
    /// context while its teardown was in progress (after its records were set aside) was
    /// recorded under the context and stayed counted once the driver had freed it, for the
    /// process's life. An allocation on its way when the teardown begins is now waited for,
    /// and set aside with the rest; one begun during the teardown waits for its end, when the
    /// driver has answered: destroyed, its call fails; kept (a primary context's release that
    /// was not the last), it is counted under the context. The driver here: context 0xc1
    /// allocates while `live`, else answers CUDA_ERROR_CONTEXT_IS_DESTROYED.
    /// A driver call that panics inside a teardown (caught at the C boundary) still ends it:
    /// the records are put back (counted), and a later allocation in a context of that handle
    /// goes through instead of waiting for an end that never comes.
    #[test]
    fn a_teardown_whose_driver_call_panics_is_ended() {
        use crate::memory::counted;
        use cuda_abi::CUresult;
        let q = Arc::new(two_in_context_c1());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            context_teardown(|| std::iter::once(&*q), 0xc1, || panic!("a driver call that panics"), |_| true)
        }));
        assert!(r.is_err());
        assert_eq!(q.used(), 700, "put back: still counted");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn({
            let q = q.clone();
            move || {
                CUR.with(|c| c.set(0xc1));
                let _ = tx.send(counted(&q, Kind::DevicePtr, 200, || CUresult::CUDA_SUCCESS, || 0x2000, |_| {}));
            }
        });
        let rc = rx.recv_timeout(std::time::Duration::from_secs(60)).expect("an allocation waited for a teardown that had ended in a panic");
        assert_eq!((rc, q.used()), (CUresult::CUDA_SUCCESS, 900));
    }

    #[test]
    fn allocations_made_in_a_context_during_its_teardown_are_not_left_counted() {
        use crate::memory::counted;
        use cuda_abi::CUresult;
        let destroyed = CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED;
        for gone in [true, false] {
            // In the driver's allocation when the teardown begins; recorded after.
            let q = Arc::new(two_in_context_c1());
            let live = Arc::new(AtomicBool::new(true));
            let (in_call_tx, in_call) = std::sync::mpsc::channel();
            let (go, go_rx) = std::sync::mpsc::channel::<()>();
            let alloc = std::thread::spawn({
                let (q, live) = (q.clone(), live.clone());
                move || {
                    CUR.with(|c| c.set(0xc1));
                    let driver = || {
                        in_call_tx.send(()).unwrap();
                        go_rx.recv().unwrap();
                        if live.load(SeqCst) { CUresult::CUDA_SUCCESS } else { destroyed }
                    };
                    counted(&q, Kind::DevicePtr, 200, driver, || 0x2000, |_| {})
                }
            });
            in_call.recv().unwrap();
            let begun = Arc::new(AtomicBool::new(false));
            let teardown = std::thread::spawn({
                let (q, begun) = (q.clone(), begun.clone());
                move || {
                    q.context_teardown_begin(0xc1);
                    begun.store(true, SeqCst);
                }
            });
            // The teardown has set the records aside, or waits for this allocation.
            until_done_or_waiting(&q, &begun);
            go.send(()).unwrap();
            teardown.join().unwrap();
            assert_eq!(alloc.join().unwrap(), CUresult::CUDA_SUCCESS, "made before the driver's teardown");
            // The driver's teardown.
            live.store(!gone, SeqCst);
            q.context_teardown_end(0xc1, gone);
            if gone {
                assert_eq!(q.used(), 0, "an allocation on its way when the teardown began stayed counted after the driver freed it");
                assert_eq!(q.tracked(Kind::DevicePtr, 0x2000), None);
            } else {
                assert_eq!(q.release_context(0xc1), 900, "kept: the context's, with the rest");
            }

            // Begun during the teardown, between the records set aside and the driver's call.
            let q = Arc::new(two_in_context_c1());
            let live = Arc::new(AtomicBool::new(true));
            q.context_teardown_begin(0xc1);
            let done = Arc::new(AtomicBool::new(false));
            let alloc = std::thread::spawn({
                let (q, live, done) = (q.clone(), live.clone(), done.clone());
                move || {
                    CUR.with(|c| c.set(0xc1));
                    let driver = || if live.load(SeqCst) { CUresult::CUDA_SUCCESS } else { destroyed };
                    let rc = counted(&q, Kind::DevicePtr, 200, driver, || 0x2000, |_| {});
                    done.store(true, SeqCst);
                    rc
                }
            });
            // Made (and recorded), or waiting for the teardown's end.
            until_done_or_waiting(&q, &done);
            live.store(!gone, SeqCst);
            q.context_teardown_end(0xc1, gone);
            let rc = alloc.join().unwrap();
            if gone {
                assert_eq!(q.used(), 0, "an allocation made during the teardown stayed counted after the driver freed it");
                assert_eq!(rc, destroyed, "made once the context was gone");
            } else {
                assert_eq!(rc, CUresult::CUDA_SUCCESS, "the context kept: made, not refused");
                assert_eq!(q.tracked(Kind::DevicePtr, 0x2000), Some(200));
                assert_eq!(q.release_context(0xc1), 900, "counted under the context");
            }

            // A free the driver refuses while the teardown begins: its record, out of the
            // table when the records were set aside, goes back set aside with them.
            let q = two_in_context_c1();
            let refused = crate::memory::freed(&q, Kind::DevicePtr, 0x1000, || {
                q.context_teardown_begin(0xc1);
                CUresult::CUDA_ERROR_INVALID_VALUE
            });
            assert_eq!(refused, CUresult::CUDA_ERROR_INVALID_VALUE);
            assert_eq!(q.context_teardown_end(0xc1, gone), if gone { 700 } else { 0 }, "a refused free's record set aside with the rest");
            assert_eq!(q.used(), if gone { 0 } else { 700 });
        }
    }

    /// Issue 8 obs. 6: a neighbour of the group that died holding quota (here: its ledger
    /// handle, so its slot lock, is gone; its pid is this live process's) is reclaimed by the
    /// next refused reservation, which then succeeds. The pid-based reclaim kept it forever.
    #[test]
    fn a_refused_reservation_reclaims_a_dead_neighbour_and_retries() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("gpu0/ledger");
        let (l1, l2) = (Ledger::open_or_create(&p, 0).unwrap(), Ledger::open_or_create(&p, 0).unwrap());
        let g = l1.group(5, 1000).unwrap();
        let h1 = l1.register(std::process::id(), g).unwrap();
        let h2 = l2.register(std::process::id(), g).unwrap();
        let (dead, live) = (Quota::with_ledger(l1, h1), Quota::with_ledger(l2, h2));
        assert!(dead.try_reserve(700));
        assert!(!live.try_reserve(400), "the neighbour is alive: its 700 count");
        drop(dead); // dies without retiring: its descriptions close, its slot lock goes
        live.last_reclaim_ns.store(0, Relaxed);
        assert!(live.try_reserve(400), "reclaimed on refusal, then reserved");
        assert_eq!(live.used(), 400);
    }

    /// A quota of group 5 (1000 bytes) registered in a fresh ledger: (its directory, the
    /// ledger's path, the group slot, the registration, the quota).
    fn registered() -> (tempfile::TempDir, std::path::PathBuf, usize, ProcHandle, Quota) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("gpu0/ledger");
        let l = Ledger::open_or_create(&p, 0).unwrap();
        let g = l.group(5, 1000).unwrap();
        let h = l.register(std::process::id(), g).unwrap();
        (d, p, g, h, Quota::with_ledger(l, h))
    }

    /// Review: the application closed the shim's slot-lock fd; the lock went, a newcomer of
    /// the group reclaimed the slot (giving back this process's 300 it still holds) and took
    /// it. This process stopped counting (its frees and its exit too), and the group admitted
    /// 1000 more while 300 were held. It now registers again and counts what it holds, past the
    /// quota if it must (then refusing until frees bring the group back under).
    #[test]
    fn a_lost_slot_lock_registers_again_and_counts_what_this_process_holds() {
        let (_d, p, g, h, q) = registered();
        assert!(q.try_reserve(200) && q.try_reserve(150));
        q.release(50);
        assert!(q.check_ledger().is_none());
        let fd = q.ledger().unwrap().0.slot_lock_fd(h).unwrap();
        // SAFETY: closing the fd as a careless application would.
        unsafe { libc::close(fd) };
        let b = Ledger::open_existing(&p).unwrap();
        let hb = b.register(std::process::id(), g).unwrap();
        assert_eq!((hb.slot, b.group_used(g)), (h.slot, 0), "reclaimed and taken: our 300 given back");
        b.try_reserve(hb, 600).unwrap();
        assert_eq!(q.check_ledger(), None, "registered again, not refusing");
        assert!(!q.ledger_damaged());
        let (l, now) = q.ledger().unwrap();
        let now = now.expect("a new registration");
        assert!(now.slot != h.slot && l.holds_slot_lock(now));
        assert_eq!(b.group_used(g), 900, "our 300 counted again beside B's 600");
        assert!(!q.try_reserve(101) && q.try_reserve(100));
        q.release(400);
        assert_eq!(b.group_used(g), 600);
        // Not fitting any more (C takes the room meanwhile): counted past the quota, refusing.
        assert!(q.try_reserve(400));
        // SAFETY: as above.
        unsafe { libc::close(q.ledger().unwrap().0.slot_lock_fd(now).unwrap()) };
        let c = Ledger::open_existing(&p).unwrap();
        let hc = c.register(std::process::id(), g).unwrap();
        c.try_reserve(hc, 400).unwrap();
        assert_eq!(q.check_ledger(), None);
        assert_eq!(b.group_used(g), 1400, "all held memory counted");
        assert!(!q.try_reserve(1) && c.try_reserve(hc, 1).is_err(), "the group refuses until back under");
        q.retire();
        assert_eq!(b.group_used(g), 1000, "our exit gives back ours only");
        b.check_registration(hb, std::process::id(), 5).unwrap();
        c.check_registration(hc, std::process::id(), 5).unwrap();
        assert!(Ledger::open_existing(&p).unwrap().check_header().is_ok(), "the ledger is not marked damaged for it");
    }

    /// Review: between losing its slot lock (the application closed the fd) and its next check,
    /// a reservation landed on the stale slot after a reclaim had freed it: the group and the
    /// free slot counted it, the new registration counted it again with the rest this process
    /// holds, and nobody gave the free slot's copy back: the group stayed over-counted by it for
    /// good (100 after this process had left). The stale slot now refuses it (fail closed until
    /// the check registers again).
    #[test]
    fn a_reservation_on_a_reclaimed_slot_is_refused_not_counted_twice() {
        let (_d, p, g, h, q) = registered();
        assert!(q.try_reserve(300));
        let fd = q.ledger().unwrap().0.slot_lock_fd(h).unwrap();
        // SAFETY: closing the fd as a careless application would.
        unsafe { libc::close(fd) };
        let r = Ledger::open_existing(&p).unwrap();
        assert_eq!(r.reclaim_dead().unwrap(), vec![(std::process::id(), 300)], "the slot reclaimed");
        assert_eq!(r.group_used(g), 0);
        assert!(!q.try_reserve(100), "the slot is no longer this process's");
        assert_eq!(r.group_used(g), 0, "nothing counted on the free slot");
        assert_eq!(q.check_ledger(), None, "registered again");
        assert_eq!(r.group_used(g), 300, "what this process holds, once");
        assert!(q.try_reserve(100));
        q.retire();
        assert_eq!(r.group_used(g), 0, "nothing left counted after this process left");
    }

    /// Review: a fork child registered into its parent's group slot without looking at whose
    /// it is now: the parent had left, its unused group's slot was taken over by another
    /// container, and the child counted in that container's group; the next check took it for
    /// an overwritten ledger and marked the ledger damaged (every later client refused).
    #[test]
    fn a_fork_child_registers_in_its_own_group_not_a_takeover_of_its_slot() {
        let (_d, p, g, h, q) = registered();
        assert!(q.try_reserve(100));
        q.after_fork_child();
        // The parent leaves; another container takes its unused group's slot over.
        let other = Ledger::open_existing(&p).unwrap();
        q.ledger().unwrap().0.unregister(h);
        other.layout().groups[g].quota_bytes.store(10, Relaxed);
        other.layout().groups[g].id.store(77, Release);
        assert!(q.try_reserve(50), "registered in its own group, found again");
        assert_eq!(q.check_ledger(), None, "no damage");
        let (l, now) = q.ledger().unwrap();
        let now = now.unwrap();
        assert!(now.group != g && l.group_id(now.group) == 5);
        assert_eq!((l.group_used(now.group), l.group_quota(now.group)), (50, 1000), "the quota it had at the fork");
        assert_eq!(other.group_used(g), 0, "nothing counted in the other container's group");
        assert!(Ledger::open_existing(&p).unwrap().check_header().is_ok(), "the ledger is not marked damaged");
    }

    /// The race fixed in 94cde23, made deterministic: the controller's registration check has
    /// passed the slot-lock half when this process's own exit release (retire) unregisters it,
    /// so the owner half finds the slot given back. That is not damage: the ledger must not be
    /// marked damaged (every later client of the GPU would be refused) and a later client is
    /// admitted. Without the handle re-check this marked the sound ledger damaged.
    #[test]
    fn a_check_racing_our_own_exit_release_is_not_damage() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("gpu0/ledger");
        let l = Ledger::open_or_create(&p, 0).unwrap();
        let h = l.register(std::process::id(), l.group(5, 1000).unwrap()).unwrap();
        let q = Arc::new(Quota::with_ledger(l, h));
        assert!(q.try_reserve(300));
        q.set_test_check_pause_ms(400);
        let checker = {
            let q = q.clone();
            std::thread::spawn(move || q.check_ledger())
        };
        // Inside the window (slot lock checked, owner not yet): the exit release runs.
        while q.test_check_pauses.load(Acquire) == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        q.retire();
        let found = checker.join().unwrap();
        let later = Ledger::open_existing(&p).unwrap_or_else(|e| panic!("a later client is refused: {e} (check: {found:?})"));
        assert!(later.check_header().is_ok(), "a sound ledger was marked damaged: {:?} (check: {found:?})", later.check_header());
        assert_eq!(found, None, "our own release reported as damage");
        assert!(!q.ledger_damaged());
        let g = later.group(5, 1000).unwrap();
        let lh = later.register(std::process::id(), g).unwrap();
        let next = Quota::with_ledger(later, lh);
        assert!(next.try_reserve(1000), "a later client is admitted, with the retired 300 given back");
    }

    #[test]
    fn array_sizes() {
        let f = CUarray_format::CU_AD_FORMAT_FLOAT;
        assert_eq!(array_bytes(100, 0, 0, f, 4), 1600);
        assert_eq!(array_bytes(100, 10, 2, CUarray_format::CU_AD_FORMAT_UNSIGNED_INT8, 1), 2000);
        let u8f = CUarray_format::CU_AD_FORMAT_UNSIGNED_INT8;
        assert_eq!(mipmapped_bytes(8, 8, 0, u8f, 1, 0, 4), 64 + 16 + 4 + 1);
        // A layered array keeps its 10 layers at every level (was counted halving them:
        // 64*10 + 16*5 + 4*2 + 1, 14 % short, a quota escape).
        assert_eq!(mipmapped_bytes(8, 8, 10, u8f, 1, cuda_abi::CUDA_ARRAY3D_LAYERED, 4), (64 + 16 + 4 + 1) * 10);
        // A cubemap keeps its 6 faces.
        assert_eq!(mipmapped_bytes(4, 4, 6, u8f, 1, cuda_abi::CUDA_ARRAY3D_CUBEMAP, 3), (16 + 4 + 1) * 6);
        // More levels than a chain has: the full chain (8x8: 4 levels), at once, even u32::MAX.
        // (Before, u32::MAX levels looped 4 billion times: this test did not finish.)
        assert_eq!(mipmapped_bytes(8, 8, 0, u8f, 1, 0, u32::MAX), 64 + 16 + 4 + 1);
        assert_eq!(mipmapped_bytes(usize::MAX, 1, 0, u8f, 1, 0, u32::MAX), u64::MAX, "saturates");
        // A 3D (not layered) array halves its depth too.
        assert_eq!(mipmapped_bytes(4, 4, 4, u8f, 1, 0, 3), 64 + 8 + 1);
        assert_eq!(pitch_estimate(1000, 3), 3072);
        assert_eq!(array_bytes(usize::MAX, usize::MAX, 2, f, 4), u64::MAX, "saturates");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        /// Random alloc/free interleavings on threads never pass the limit and end at zero.
        #[test]
        fn threads_never_exceed_and_return_to_zero(
            limit in 1u64..5000,
            plans in proptest::collection::vec(proptest::collection::vec(1u64..900, 1..80), 2..5),
        ) {
            let q = Arc::new(Quota::local(limit));
            let hs: Vec<_> = plans.into_iter().enumerate().map(|(t, plan)| {
                let q = q.clone();
                std::thread::spawn(move || {
                    let mut live = Vec::new();
                    for (i, b) in plan.into_iter().enumerate() {
                        let key = ((t as u64) << 32) | ((i as u64) << 8);
                        if q.try_reserve(b) {
                            assert!(q.track(Kind::DevicePtr, key, b));
                            live.push(key);
                        }
                        assert!(q.used() <= limit);
                        if i % 2 == 1 { if let Some(k) = live.pop() { q.untrack(Kind::DevicePtr, k).unwrap(); } }
                    }
                    for k in live { q.untrack(Kind::DevicePtr, k).unwrap(); }
                })
            }).collect();
            for h in hs { h.join().unwrap(); }
            prop_assert_eq!(q.used(), 0);
        }
    }
}
