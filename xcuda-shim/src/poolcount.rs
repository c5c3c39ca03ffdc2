//! The quota's count of memory a driver pool keeps across calls: the graph memory pool
//! ([`crate::graphmem`]) and the stream-ordered pools ([`crate::streampool`]) of one GPU. The
//! driver maps or reserves that memory inside calls the shim only brackets (a graph launch, a
//! `cuMemAllocAsync`) and keeps it after the application let go of it, so the shim counts what
//! the driver says the pools reserve:
//!
//! - before such a call, [`PoolCount::begin`] counts the caller in flight and reserves the
//!   growth the call may cause in the quota, under the count's lock (a refusal fails the call
//!   with `CUDA_ERROR_OUT_OF_MEMORY` before the driver is asked);
//! - after it, and whenever the pools may have shrunk (a trim, the controller tick),
//!   [`PoolCount::settle`] moves the count to what the driver reports.
//!
//! Settles may run at once (a trim, the controller tick, calls on several threads): each
//! applies its difference with one compare-and-swap on the count, and one that loses asks
//! again, so a difference is given back or reserved once. A settle lowers the count only under
//! the lock and only when no other call is between its reservation and its own settle (that
//! call's reservation is not in the pools yet): a lowering never slips between a call's read of
//! the count and its reservation.
//!
//! A call that sizes its growth from the driver's figures ([`PoolCount::begin_mapping`], a
//! graph launch) reads them before it takes the lock, so other calls may map memory the figures
//! do not show: the footprints of the calls in flight are added to its need (`pending`, each
//! exec's once however many of its launches are in flight, and never the caller's own exec's:
//! an exec's launches are ordered one behind the other and map the same memory), and figures
//! older than another call's begin or end are asked for again.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};

/// How many execs' pending footprints one [`PoolCount`] tells apart; launches past them are
/// pending on their own (their footprints added to every other call's need: fail closed).
const PENDING_EXECS: usize = 32;

/// Where a call's footprint is pending ([`PoolCount::begin_mapping`]), for its
/// [`PoolCount::end_mapping`]: an exec's slot, or on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pending(u8);

impl Pending {
    /// Pending on its own (no exec slot: none named, or every slot taken).
    pub const ALONE: Pending = Pending(u8::MAX);
}

/// The launches in flight of one exec (changed only under the [`PoolCount`]'s lock).
#[derive(Debug)]
struct PendingExec {
    /// The exec's handle (0: the slot is free).
    exec: AtomicU64,
    /// Its launches in flight.
    launches: AtomicU32,
    /// Its footprint, in `pending` once while any of its launches is in flight.
    fp: AtomicU64,
}

impl PendingExec {
    const fn new() -> Self {
        Self { exec: AtomicU64::new(0), launches: AtomicU32::new(0), fp: AtomicU64::new(0) }
    }
}

use cuda_abi::CUdevice;

use crate::quota::Quota;
use crate::spin::SpinLock;

/// One GPU's count of one kind of driver pool in the quota.
#[derive(Debug)]
pub struct PoolCount {
    /// Bytes counted in the quota for the pools.
    counted: AtomicU64,
    /// Calls between their reservation ([`PoolCount::begin`]) and their settle.
    inflight: AtomicU32,
    /// Bumped by every [`PoolCount::begin`] and [`PoolCount::end`]: a settle lowers the count
    /// only if none happened since it asked the driver (a whole call that began and ended in
    /// between, leaving the count where it was, may have grown the pools past that answer).
    epoch: AtomicU64,
    /// Bytes the calls in flight through [`PoolCount::begin_mapping`] may map, summed (an
    /// exec's footprint once however many of its launches are in flight): memory the driver's
    /// figures may not show yet (changed under `lock`).
    pending: AtomicU64,
    /// The execs whose launches are in flight, for `pending` (changed under `lock`).
    execs: [PendingExec; PENDING_EXECS],
    /// Held while a call counts itself in flight and reserves against `counted`, and while a
    /// settle decides to lower it (a few atomics; never across a driver call).
    lock: SpinLock,
    /// The pools grew past what the quota allows and are counted only up to it (logged once
    /// per such episode; cleared when the count catches up with the pools).
    over: AtomicBool,
    /// What grew past the quota, for the log line of such an episode.
    what: &'static str,
}

impl PoolCount {
    /// Nothing counted; `what` names the pools in the log line of a growth past the quota.
    pub const fn new(what: &'static str) -> Self {
        Self {
            counted: AtomicU64::new(0),
            inflight: AtomicU32::new(0),
            epoch: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            execs: [const { PendingExec::new() }; PENDING_EXECS],
            lock: SpinLock::new(),
            over: AtomicBool::new(false),
            what,
        }
    }

    /// Bytes counted now.
    pub fn counted(&self) -> u64 {
        self.counted.load(Relaxed)
    }

    /// Calls in flight now.
    pub fn inflight(&self) -> u32 {
        self.inflight.load(Acquire)
    }

    /// Before a call that may grow the pools: counts the caller in flight and reserves
    /// `need(counted)` bytes in `quota` (the count as this call sees it under the lock).
    /// Returns whether the quota held them (nothing reserved if not). Either way the caller is
    /// in flight until its [`PoolCount::end`], after its own settle.
    pub fn begin(&self, quota: &Quota, need: impl FnOnce(u64) -> u64) -> bool {
        self.begin_mapping(quota, 0, 0, None, |counted, _| need(counted)).map(|(ok, _)| ok) == Some(true)
    }

    /// The caller of [`PoolCount::begin`] has settled: no longer in flight.
    pub fn end(&self) {
        self.epoch.fetch_add(1, AcqRel);
        self.inflight.fetch_sub(1, AcqRel);
    }

    /// The count's epoch, to take before asking the driver for the figures a
    /// [`PoolCount::begin_mapping`] sizes its need from.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Acquire)
    }

    /// Before a call that maps up to `fp` bytes into the pools for `exec` (a graph exec's
    /// handle; 0: none), its need sized from the driver's figures read after the epoch `seen`
    /// was taken. Under the lock: if a call began or ended since `seen` (it may have mapped
    /// memory, and settled it into the count, after those figures), nothing happens and `None`
    /// says to ask the driver again; `seen` `None` skips that check (the caller sizes without
    /// figures). Otherwise as [`PoolCount::begin`], with `need(counted, pending)` (`pending`:
    /// the footprints of the other execs with calls in flight through here, which the figures
    /// may not show; not `exec`'s own, whose launches are ordered behind one another and map
    /// the same memory) and this call's `fp` pending until its [`PoolCount::end_mapping`],
    /// given where it is pending. `Some((false, _))`: the quota refused (nothing reserved).
    pub fn begin_mapping(&self, quota: &Quota, exec: u64, fp: u64, seen: Option<u64>, need: impl FnOnce(u64, u64) -> u64) -> Option<(bool, Pending)> {
        let _one = self.lock.lock();
        if seen.is_some_and(|e| e != self.epoch.load(Acquire)) {
            return None;
        }
        self.inflight.fetch_add(1, AcqRel);
        self.epoch.fetch_add(1, AcqRel);
        let pending = self.pending.load(Relaxed);
        let (others, at) = match self.slot_of(exec, fp) {
            Some(i) => {
                let s = &self.execs[i];
                let own = s.fp.load(Relaxed);
                s.launches.fetch_add(1, Relaxed);
                // A reused handle with a bigger footprint: the bigger one stays pending.
                if fp > own {
                    s.fp.store(fp, Relaxed);
                    self.pending.fetch_add(fp - own, Relaxed);
                }
                (pending.saturating_sub(own), Pending(i as u8))
            }
            None => (pending, self.new_slot(exec, fp)),
        };
        let need = need(self.counted.load(Relaxed), others);
        let ok = need == 0 || quota.try_reserve(need);
        if ok && need > 0 {
            self.counted.fetch_add(need, Relaxed);
        }
        Some((ok, at))
    }

    /// The slot with `exec`'s launches in flight, if any (under the lock).
    fn slot_of(&self, exec: u64, fp: u64) -> Option<usize> {
        if exec == 0 || fp == 0 {
            return None;
        }
        self.execs.iter().position(|s| s.exec.load(Relaxed) == exec)
    }

    /// Makes `fp` pending for `exec`'s first launch in flight (under the lock): in a free slot,
    /// or on its own if none is free or no exec is named.
    fn new_slot(&self, exec: u64, fp: u64) -> Pending {
        self.pending.fetch_add(fp, Relaxed);
        if exec == 0 || fp == 0 {
            return Pending::ALONE;
        }
        let Some(i) = self.execs.iter().position(|s| s.exec.load(Relaxed) == 0) else { return Pending::ALONE };
        let s = &self.execs[i];
        s.exec.store(exec, Relaxed);
        s.launches.store(1, Relaxed);
        s.fp.store(fp, Relaxed);
        Pending(i as u8)
    }

    /// The caller of [`PoolCount::begin_mapping`] (footprint `fp`, pending `at`) has settled:
    /// its footprint is no longer pending (its exec's stays while another of its launches is in
    /// flight) and it is no longer in flight.
    pub fn end_mapping(&self, fp: u64, at: Pending) {
        let _one = self.lock.lock();
        self.epoch.fetch_add(1, AcqRel);
        match self.execs.get(at.0 as usize) {
            Some(s) => {
                if s.launches.fetch_sub(1, Relaxed) == 1 {
                    self.pending.fetch_sub(s.fp.load(Relaxed), Relaxed);
                    s.exec.store(0, Relaxed);
                    s.fp.store(0, Relaxed);
                }
            }
            None => {
                self.pending.fetch_sub(fp, Relaxed);
            }
        }
        self.inflight.fetch_sub(1, AcqRel);
    }

    /// Settles the count to `actual()` (the driver's figure; `None`: it cannot say, and the
    /// count stays). `own`: the calls the caller itself has in flight (their reservations
    /// are in `actual` by now, or never will be). While any other call is in flight the count
    /// is not lowered: that call's reservation is still above what the pools hold, and its own
    /// settle lowers it later. Growth past the quota is counted as far as the quota allows (the
    /// group sees itself at its limit: its next allocation is refused) and logged once until
    /// the count catches up. Returns whether it logged that now.
    pub fn settle(&self, quota: &Quota, dev: CUdevice, own: u32, actual: impl FnMut() -> Option<u64>) -> bool {
        self.settle_guarded(quota, dev, || self.inflight.load(Acquire) <= own, actual)
    }

    /// Controller tick: settles unless a call is between its reservation and its own settle.
    pub fn tick(&self, quota: &Quota, dev: CUdevice, actual: impl FnMut() -> Option<u64>) {
        if self.inflight() == 0 {
            self.settle(quota, dev, 0, actual);
        }
    }

    /// In a fork child (no driver state, only the forking thread): nothing counted, nothing in
    /// flight (the child's quota starts empty too).
    pub fn reset(&self) {
        self.counted.store(0, Relaxed);
        self.inflight.store(0, Relaxed);
        self.epoch.store(0, Relaxed);
        self.pending.store(0, Relaxed);
        for s in &self.execs {
            s.exec.store(0, Relaxed);
            s.launches.store(0, Relaxed);
            s.fp.store(0, Relaxed);
        }
        self.lock.reset_after_fork();
        self.over.store(false, Relaxed);
    }

    /// [`PoolCount::settle`] with the lowering decided by `may_shrink`, asked under the lock.
    fn settle_guarded(&self, quota: &Quota, dev: CUdevice, may_shrink: impl Fn() -> bool, mut actual: impl FnMut() -> Option<u64>) -> bool {
        let (counted, over) = (&self.counted, &self.over);
        // Each lost swap means another settle or a call moved the count: bounded, it is redone
        // on the next tick at the latest.
        for _ in 0..8 {
            let e = self.epoch.load(Acquire);
            let c = counted.load(Acquire);
            let Some(a) = actual() else { return false };
            if a > c {
                let more = a - c;
                let got = quota.reserve_up_to(more);
                if counted.compare_exchange(c, c + got, AcqRel, Acquire).is_err() {
                    quota.release(got);
                    continue;
                }
                if got == more {
                    over.store(false, Relaxed);
                    return false;
                }
                if over.swap(true, Relaxed) {
                    return false;
                }
                crate::state::logged(|| tracing::error!(device = dev, pool = a, counted = c + got, quota_used = quota.used(), quota = quota.limit(), "xcuda: the driver's {} grew past the group's quota: counted as far as the quota allows; the group is at its limit", self.what));
                return true;
            }
            if a < c {
                let Some(held) = self.lock.try_lock() else { return false };
                let shrink = may_shrink();
                // A call that began or ended since the driver was asked may have grown the pools
                // past `a` and left the count as it was: that answer is stale, ask again.
                let fresh = self.epoch.load(Acquire) == e;
                let lowered = shrink && fresh && counted.compare_exchange(c, a, AcqRel, Acquire).is_ok();
                drop(held);
                if !shrink {
                    return false;
                }
                if !lowered {
                    continue;
                }
                quota.release(c - a);
            }
            over.store(false, Relaxed);
            return false;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A settle whose lowering is decided up front (`shrink`: no other call in flight).
    fn settle_to(p: &PoolCount, q: &Quota, shrink: bool, actual: impl FnMut() -> Option<u64>) -> bool {
        p.settle_guarded(q, 0, || shrink, actual)
    }

    fn parts() -> (Quota, PoolCount) {
        (Quota::local(100 * MIB), PoolCount::new("test pool"))
    }

    /// A settle that runs while another is between reading the count and changing it (a trim
    /// against the controller tick, two launching threads): the pool's shrink is given back
    /// once. Both gave it back before: the count wrapped toward 2^64 and the quota's use went to
    /// zero (a later give-back would have freed the whole group's quota).
    #[test]
    fn concurrent_settles_give_a_shrink_back_once() {
        let (q, p) = parts();
        assert!(q.try_reserve(10 * MIB), "a plain allocation beside the pool");
        assert!(!settle_to(&p, &q, true, || Some(80 * MIB)));
        assert_eq!((p.counted(), q.used()), (80 * MIB, 90 * MIB));
        let mut first = true;
        settle_to(&p, &q, true, || {
            if std::mem::take(&mut first) {
                // The other settle, between this one's read of the count and its change.
                settle_to(&p, &q, true, || Some(30 * MIB));
            }
            Some(30 * MIB)
        });
        assert_eq!(p.counted(), 30 * MIB, "pool counted once");
        assert_eq!(q.used(), 40 * MIB, "the plain allocation and the pool, 50 MiB given back once");
    }

    /// A call that counts itself in flight after a settle read the pool (a trim emptied it)
    /// but before the settle lowers the count: the settle sees it in flight under the lock and
    /// leaves the count, which the call's reservation was read against. Before, the settle
    /// had decided to lower up front: the call reserved nothing against the stale count, the
    /// count went to 0, and the call's memory was mapped uncounted (a neighbour took the
    /// quota it freed).
    #[test]
    fn a_call_counted_in_flight_during_a_settle_keeps_the_count() {
        let (q, p) = parts();
        assert!(!settle_to(&p, &q, true, || Some(80 * MIB)));
        p.settle(&q, 0, 0, || {
            // A trim emptied the pool; a launch then counts itself in flight and finds the
            // count (80) covers its 60 MiB: it reserves nothing.
            assert!(p.begin(&q, |c| (60 * MIB).saturating_sub(c)));
            Some(0)
        });
        assert_eq!((p.counted(), q.used()), (80 * MIB, 80 * MIB), "not lowered under the call");
        p.settle(&q, 0, 1, || Some(60 * MIB));
        p.end();
        assert_eq!((p.counted(), q.used()), (60 * MIB, 60 * MIB), "the call's own settle lowers it");
    }

    /// A whole call (reservation, driver call, settle, end) between a settle's question to the
    /// driver and its lowering, leaving the count where it was: the settle's answer predates
    /// the call's growth, so it must not lower the count. Review finding: a trim's settle read
    /// an emptied pool, a launch then reserved nothing (the count covered it), mapped 80 MiB,
    /// settled to an unchanged count and ended; the trim's compare-and-swap then gave back
    /// 80 MiB the pool held.
    #[test]
    fn a_whole_call_between_a_settles_question_and_its_lowering_keeps_the_count() {
        let (q, p) = parts();
        assert!(!settle_to(&p, &q, true, || Some(80 * MIB)));
        let mut asked = 0;
        p.settle(&q, 0, 0, || {
            asked += 1;
            if asked == 1 {
                // The trim emptied the pool: the answer is 0. Then, before the settle takes its
                // lock, a launch runs through: it finds the count covers it, maps 80 MiB and
                // settles to 80 (no change), and ends.
                assert!(p.begin(&q, |c| (80 * MIB).saturating_sub(c)));
                p.settle(&q, 0, 1, || Some(80 * MIB));
                p.end();
                Some(0)
            } else {
                Some(80 * MIB)
            }
        });
        assert_eq!((p.counted(), q.used()), (80 * MIB, 80 * MIB), "the stale answer lowered nothing; asked again: {asked}");
        assert_eq!(asked, 2);
    }

    /// While another call is between its reservation and its settle, a settle does not lower
    /// the count (that call's reservation is not in the pool yet); growth is still counted.
    #[test]
    fn no_shrink_while_another_call_is_in_flight() {
        let (q, p) = parts();
        settle_to(&p, &q, true, || Some(60 * MIB));
        settle_to(&p, &q, false, || Some(20 * MIB));
        assert_eq!((p.counted(), q.used()), (60 * MIB, 60 * MIB));
        settle_to(&p, &q, false, || Some(70 * MIB));
        assert_eq!((p.counted(), q.used()), (70 * MIB, 70 * MIB));
        assert!(p.begin(&q, |_| 10 * MIB));
        p.tick(&q, 0, || Some(0));
        assert_eq!((p.counted(), q.used()), (80 * MIB, 80 * MIB), "the tick leaves a count with a call in flight");
        p.end();
        p.tick(&q, 0, || Some(0));
        assert_eq!((p.counted(), q.used()), (0, 0));
    }

    /// A reservation the quota refuses reserves nothing and still counts the caller in flight
    /// (it settles and ends like any other).
    #[test]
    fn a_refused_reservation_reserves_nothing() {
        let (q, p) = parts();
        assert!(p.begin(&q, |_| 70 * MIB));
        assert!(!p.begin(&q, |_| 40 * MIB), "70 + 40 > 100");
        assert_eq!((p.counted(), q.used(), p.inflight()), (70 * MIB, 70 * MIB, 2));
        p.settle(&q, 0, 2, || None);
        assert_eq!((p.counted(), q.used()), (70 * MIB, 70 * MIB), "the driver cannot say: the count stays (fail closed)");
        p.end();
        p.end();
        p.settle(&q, 0, 0, || Some(0));
        assert_eq!((p.counted(), q.used()), (0, 0));
    }

    /// An exec's footprint is pending once however many of its launches are in flight, never
    /// against its own launches; past the slots, launches are pending on their own (counted
    /// against every other call), and everything ends back at nothing pending.
    #[test]
    fn pending_footprints_are_kept_per_exec() {
        let (q, p) = parts();
        let seen = |p: &PoolCount, exec: u64, fp: u64| {
            let mut others = None;
            let (ok, at) = p.begin_mapping(&q, exec, fp, None, |_, o| {
                others = Some(o);
                0
            })
            .expect("no epoch to check");
            assert!(ok);
            (others.unwrap(), at)
        };
        let (o1, a1) = seen(&p, 0x2000, 64);
        let (o2, a2) = seen(&p, 0x2000, 64);
        assert_eq!((o1, o2), (0, 0), "an exec's own launches are not pending against it");
        let (o3, a3) = seen(&p, 0x3000, 8);
        assert_eq!(o3, 64, "the other exec's footprint once, not per launch");
        let mut ends = vec![(64, a1), (64, a2), (8, a3)];
        for e in 0..PENDING_EXECS as u64 {
            let (o, at) = seen(&p, 0x10_0000 + e, 1);
            assert_eq!(o, 72 + e);
            ends.push((1, at));
        }
        assert_eq!(ends.last().unwrap().1, Pending::ALONE, "no slot left: pending on its own");
        assert_eq!(p.pending.load(Relaxed), 72 + PENDING_EXECS as u64);
        for (fp, at) in ends {
            p.end_mapping(fp, at);
        }
        assert_eq!((p.pending.load(Relaxed), p.inflight()), (0, 0));
        assert!(p.execs.iter().all(|s| s.exec.load(Relaxed) == 0), "every slot free again");
    }

    /// The pool grew past the quota (memory the driver already holds): it is counted up to the
    /// limit, so the group's next allocation is refused, and said once per episode, not every
    /// tick. Before: nothing was counted and the error came every tick.
    #[test]
    fn growth_past_the_quota_is_counted_to_the_limit_and_said_once() {
        let (q, p) = parts();
        assert!(q.try_reserve(70 * MIB));
        assert!(settle_to(&p, &q, true, || Some(50 * MIB)), "said the first time");
        assert_eq!((p.counted(), q.used()), (30 * MIB, 100 * MIB), "counted as far as the quota allows");
        assert!(!q.try_reserve(1), "the group is at its limit");
        assert!(!settle_to(&p, &q, true, || Some(50 * MIB)), "not again on the next tick");
        assert_eq!((p.counted(), q.used()), (30 * MIB, 100 * MIB));
        q.release(20 * MIB);
        assert!(!settle_to(&p, &q, true, || Some(50 * MIB)), "room again: the rest is counted");
        assert_eq!((p.counted(), q.used()), (50 * MIB, 100 * MIB));
        assert!(!p.over.load(Relaxed), "episode over");
        assert!(!settle_to(&p, &q, true, || Some(10 * MIB)));
        assert!(settle_to(&p, &q, true, || Some(200 * MIB)), "a new episode is said again");
        assert_eq!((p.counted(), q.used()), (50 * MIB, 100 * MIB), "50 MiB beside 10 counted, 40 more fit");
    }
}
