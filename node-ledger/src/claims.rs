//! Start claims: the MPS active-thread percentage an offline job took at library load, seen by
//! the next job to start before either has registered.
//!
//! # Why
//!
//! Real MPS fixes a client's active-thread percentage when the client starts, so the shim's
//! library constructor sets `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` from the offline SM budget,
//! split between the jobs on the GPU by [`crate::jobs::start_share`]: a new job takes what the
//! other jobs hold no part of. Those jobs are read from registered slots
//! ([`crate::layout::ProcSlot::mps_pct`]), and a process registers on its first driver call,
//! seconds after library load for Python + torch. Two jobs loading within each other's window
//! saw no one and both took the whole budget (40 % + 40 % against a 40 % budget). The claim
//! closes that window: each constructor records its percentage here as it decides it.
//!
//! # Protocol
//!
//! 1. **Serialised decisions.** A starting process takes the *claims lock* (an open-file-
//!    description write lock, `F_OFD_SETLK`, on the claims block's own byte range,
//!    [`claims_offset`] / [`CLAIMS_LEN`]; it lies after every registry slot's lock range, so it
//!    never meets the slot protocol of `ledger.rs`), then reads the registered jobs and the
//!    claims, computes its start share ([`ClaimsLock::start_jobs`] + `start_share`), records
//!    its claim ([`ClaimsLock::record`]) and lets go. The kernel drops the lock when its holder
//!    dies, however it dies; nobody waits on a dead holder.
//! 2. **Bounded wait, fail closed.** The lock is tried without blocking and retried for
//!    [`CLAIM_LOCK_WAIT`] at most (a decision takes microseconds; a holder stopped by a signal,
//!    or a hostile one, must not stall every process start). A process that cannot have it
//!    takes the floor percentage, never the whole budget, and records nothing.
//! 3. **What a claim counts for.** Only for a *starting* process's share, and only while fresh
//!    (younger than the TTL the caller gives, default [`DEFAULT_CLAIM_TTL_MS`]): a fresh claim
//!    of another group that has no registered process counts exactly as a registered job with
//!    that percentage ([`crate::jobs::with_claims`]); a claim of a registered group is redundant
//!    (the job's slots say what it holds); a process of the claiming group takes its group's
//!    claimed percentage (a job's processes share the job's share).
//! 4. **What it never counts for.** The monitor's co-location judgement
//!    ([`crate::jobs::offline_cap_pct`]), mps-manager's online estimate and the running split
//!    ([`crate::jobs::job_share`]) read registered slots only. A claim says that a process
//!    *will* start with a percentage, not that any SM is in use: every process of an offline
//!    container loads the shim, its shell and `pip` too, and a claim from one that never calls
//!    CUDA must not make the monitor take a cap off the reading (the whole reading counts as
//!    online until a job is registered: fail closed), nor give a registered job a smaller part.
//! 5. **Withdrawal.** A process that registers withdraws the claim it made (entry of its
//!    group whose latest claimer it is, by pid and pid namespace), after its slot is
//!    published: from then on the slot says what the job holds, and when the job's processes
//!    have all left, nothing of it lingers for newcomers. A claim whose process never
//!    registers (a shell, `pip`) counts until its TTL, unless a later process of its group
//!    refreshes the entry and registers. Withdrawal waits for the lock [`WITHDRAW_WAIT`] at
//!    most; a claim not withdrawn stays until its TTL (a newcomer leaves more room: tighter).
//! 6. **Reuse.** An entry is refreshed by its group's next claim (time now, the larger
//!    percentage while fresh), and may be refilled, under the lock, when free, expired, or
//!    redundant. An entry is filled group id last, so one torn by its writer's death reads as
//!    free, or as a claim with an unknown percentage (counted as uncapped: the tighter reading).
//!
//! # Hostile or damaged values
//!
//! Anyone who may start an offline process may write the ledger. Nothing read here loosens a
//! limit: a percentage outside 1..=100 reads as uncapped (it leaves a newcomer nothing: the
//! floor); a claim time in the future reads as now (held), and the next claimer rewrites it to
//! now under the lock, so it expires within one TTL instead of never; a table full of claims
//! leaves a newcomer the floor. What a hostile writer can do is make newcomers start at the
//! floor for a TTL, or hold the lock so that every start waits [`CLAIM_LOCK_WAIT`] and takes
//! the floor: a tighter limit, never a looser one.

use std::sync::atomic::Ordering::*;
use std::time::{Duration, Instant};

use crate::jobs::{with_claims, OfflineJob};
use crate::layout::ClaimSlot;
pub use crate::layout::{claims_offset, CLAIMS_LEN, MAX_CLAIMS};
use crate::ledger::{io_err, range_lock, Ledger, LedgerError};

/// How long a claim counts by default, ms: the window between library load and first driver
/// call it covers (seconds for Python + torch), with room to spare. After it the claim
/// neither counts nor blocks its entry.
pub const DEFAULT_CLAIM_TTL_MS: u64 = 30_000;

/// Longest wait for the claims lock (non-blocking tries, 1 ms apart). Each holder keeps it for
/// a few microseconds, so only a holder stopped mid-decision or a hostile one reaches this.
pub const CLAIM_LOCK_WAIT: Duration = Duration::from_millis(150);

/// Longest wait for the claims lock when a registering process withdraws its claim
/// ([`Ledger::withdraw_claim`]); registration is a first driver call, not a hot path.
pub const WITHDRAW_WAIT: Duration = Duration::from_millis(20);

/// One claim as read, its values made safe (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartClaim {
    /// Entry index in the claims block.
    pub entry: usize,
    /// The claiming quota group's id (non-zero).
    pub group_id: u64,
    /// The percentage claimed; `None` when the entry holds none in 1..=100 (read as uncapped).
    pub mps_pct: Option<u32>,
    /// CLOCK_MONOTONIC ns of the latest claim, never later than the reader's now.
    pub claim_ns: u64,
    /// The latest claimer's pid in its own namespace (reports; with `pid_ns`, the claimer's
    /// own withdrawal at registration).
    pub pid: u32,
    /// The latest claimer's pid-namespace inode.
    pub pid_ns: u64,
}

impl StartClaim {
    /// Whether the claim still counts at `now_ns`: younger than `ttl_ns`.
    pub fn is_fresh(&self, now_ns: u64, ttl_ns: u64) -> bool {
        now_ns.saturating_sub(self.claim_ns) < ttl_ns
    }
}

fn read_entry(entry: usize, e: &ClaimSlot, now_ns: u64) -> Option<StartClaim> {
    let group_id = e.group_id.load(Acquire);
    if group_id == 0 {
        return None;
    }
    let pct = e.mps_pct.load(Relaxed);
    Some(StartClaim {
        entry,
        group_id,
        mps_pct: (1..=100).contains(&pct).then_some(pct),
        claim_ns: e.claim_ns.load(Relaxed).min(now_ns),
        pid: e.pid.load(Relaxed),
        pid_ns: e.pid_ns.load(Relaxed),
    })
}

impl Ledger {
    /// Every occupied claim entry as it reads at `now_ns` (fresh or not), values made safe.
    /// Takes no lock: for reports and tests. A starting process reads them through
    /// [`Ledger::lock_claims`].
    pub fn claims(&self, now_ns: u64) -> Vec<StartClaim> {
        let entries = &self.layout().claims.entries;
        entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| read_entry(i, e, now_ns))
            .collect()
    }

    /// Withdraws the start claim of group `group_id` if process `pid` in pid namespace `pid_ns`
    /// made its latest claim (module docs, point 5), under the claims lock (tried for at most
    /// `wait`). Whether an entry was freed; `Ok(false)` also when the lock was not had.
    pub fn withdraw_claim(
        &self,
        group_id: u64,
        pid: u32,
        pid_ns: u64,
        wait: Duration,
    ) -> Result<bool, LedgerError> {
        let Some(_lock) = self.lock_claims(wait)? else {
            return Ok(false);
        };
        let mut freed = false;
        for e in &self.layout().claims.entries {
            if e.group_id.load(Acquire) == group_id
                && e.pid.load(Relaxed) == pid
                && e.pid_ns.load(Relaxed) == pid_ns
            {
                e.group_id.store(0, Release);
                freed = true;
            }
        }
        Ok(freed)
    }

    /// Takes the claims lock (module docs, "Protocol"), trying for at most `wait`.
    /// `Ok(None)`: another description held it all that time (the caller fails closed).
    ///
    /// The lock belongs to this handle's open file description: it excludes other processes
    /// and other `Ledger`s of the file, not two threads sharing one `Ledger`. Cost when free:
    /// one `fcntl` to take it, one to let go, and a store for each claim time found in the
    /// future (rewritten to now: see the module docs).
    pub fn lock_claims(&self, wait: Duration) -> Result<Option<ClaimsLock<'_>>, LedgerError> {
        let start = Instant::now();
        loop {
            let got = range_lock(self.raw_fd(), claims_offset(), CLAIMS_LEN, libc::F_WRLCK)
                .map_err(|e| io_err(self.path(), "fcntl(F_OFD_SETLK) on the claims", e))?;
            if got {
                let now = crate::clock::now_ns();
                for e in &self.layout().claims.entries {
                    if e.claim_ns.load(Relaxed) > now {
                        e.claim_ns.store(now, Relaxed);
                    }
                }
                return Ok(Some(ClaimsLock { ledger: self }));
            }
            if start.elapsed() >= wait {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(1).min(wait));
        }
    }
}

/// The claims lock, held until dropped (see [`Ledger::lock_claims`]).
pub struct ClaimsLock<'a> {
    ledger: &'a Ledger,
}

impl std::fmt::Debug for ClaimsLock<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimsLock")
            .field("ledger", &self.ledger.path())
            .finish()
    }
}

impl Drop for ClaimsLock<'_> {
    fn drop(&mut self) {
        let _ = range_lock(
            self.ledger.raw_fd(),
            claims_offset(),
            CLAIMS_LEN,
            libc::F_UNLCK,
        );
    }
}

impl ClaimsLock<'_> {
    /// The jobs a process starting at `now_ns` must leave room for: the registered ones and
    /// the fresh claims of other groups ([`with_claims`]). Pass them to
    /// [`crate::jobs::start_share`]; for nothing else (module docs, point 4).
    pub fn start_jobs(&self, now_ns: u64, ttl_ns: u64) -> Vec<OfflineJob> {
        with_claims(
            &self.ledger.offline_jobs(),
            &self.ledger.claims(now_ns),
            now_ns,
            ttl_ns,
        )
    }

    /// Records that a process (`pid` in pid namespace `pid_ns`: for reports and its withdrawal,
    /// [`Ledger::withdraw_claim`]) of group `group_id` starts at
    /// `now_ns` with MPS percentage `mps_pct`. Its group's entry is refreshed (time now, the
    /// larger percentage while the entry is fresh); else a free, expired (older than `ttl_ns`)
    /// or redundant (its group registered) entry is filled. `false`: every entry holds a fresh
    /// claim of another unregistered group (the caller's share already counted them all).
    /// A claim that others did not count yet (a new entry, a larger percentage, an entry that
    /// was no longer fresh) is announced ([`Ledger::announce`]): the monitor copies it into its
    /// jobs table, which the starting processes of other pods read, at its next tick rather
    /// than at the table's next period. A mere refresh (the same fresh percentage, as every
    /// `sh` or `pip` of a running job records) is not.
    pub fn record(
        &self,
        group_id: u64,
        mps_pct: u32,
        pid: u32,
        pid_ns: u64,
        now_ns: u64,
        ttl_ns: u64,
    ) -> bool {
        let group_id = group_id.max(1);
        let entries = &self.ledger.layout().claims.entries;
        let claims = self.ledger.claims(now_ns);
        if let Some(c) = claims.iter().find(|c| c.group_id == group_id) {
            let e = &entries[c.entry];
            let pct = match c.mps_pct {
                Some(p) if c.is_fresh(now_ns, ttl_ns) => p.max(mps_pct),
                _ => mps_pct,
            };
            e.mps_pct.store(pct, Relaxed);
            e.pid.store(pid, Relaxed);
            e.pid_ns.store(pid_ns, Relaxed);
            e.claim_ns.store(now_ns, Release);
            if !c.is_fresh(now_ns, ttl_ns) || c.mps_pct != Some(pct) {
                self.ledger.announce();
            }
            return true;
        }
        let registered: Vec<u64> = self
            .ledger
            .offline_jobs()
            .iter()
            .map(|j| j.group_id)
            .collect();
        let taken = |i: usize| claims.iter().find(|c| c.entry == i);
        let free = (0..MAX_CLAIMS).find(|&i| taken(i).is_none());
        let expired =
            || (0..MAX_CLAIMS).find(|&i| taken(i).is_some_and(|c| !c.is_fresh(now_ns, ttl_ns)));
        let redundant = || {
            (0..MAX_CLAIMS).find(|&i| taken(i).is_some_and(|c| registered.contains(&c.group_id)))
        };
        let Some(i) = free.or_else(expired).or_else(redundant) else {
            return false;
        };
        let e = &entries[i];
        // Group id last: an entry torn by our death reads as free (or, refilled in place of
        // another group, as that entry emptied).
        e.group_id.store(0, Release);
        e.mps_pct.store(mps_pct, Relaxed);
        e.pid.store(pid, Relaxed);
        e.pid_ns.store(pid_ns, Relaxed);
        e.claim_ns.store(now_ns, Relaxed);
        e.group_id.store(group_id, Release);
        self.ledger.announce();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::{offline_cap_pct, start_share};
    use proptest::prelude::*;

    const TTL: u64 = 30_000_000_000;

    fn fresh() -> (tempfile::TempDir, Ledger) {
        let d = tempfile::tempdir().unwrap();
        let l = Ledger::open_or_create(&d.path().join("gpu0/ledger"), 0).unwrap();
        (d, l)
    }

    /// MPS percentage for a share (the shim's rounding: up to whole percent, floor 10).
    fn pct_of(share: f64) -> u32 {
        ((share * 1000.0).round() as u32)
            .div_ceil(10)
            .clamp(10, 100)
    }

    /// What a constructor does: under the lock, read, decide, record.
    fn start(l: &Ledger, group: u64, budget: f64, now: u64) -> u32 {
        let lock = l.lock_claims(CLAIM_LOCK_WAIT).unwrap().expect("lock free");
        let pct = pct_of(start_share(budget, &lock.start_jobs(now, TTL), group));
        assert!(lock.record(group, pct, 1, 0, now, TTL));
        pct
    }

    /// A claim others have not counted is announced (an `IN_ATTRIB` event on the file, what
    /// the daemons' inotify watches report; stores through the mapping raise none); a refresh
    /// of the same fresh claim is not.
    #[test]
    fn a_new_claim_is_announced_and_a_refresh_is_not() {
        use std::os::unix::ffi::OsStrExt;
        let (_d, l) = fresh();
        // SAFETY: plain syscalls on a descriptor this test owns and closes.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0);
        let path = std::ffi::CString::new(l.path().as_os_str().as_bytes()).unwrap();
        // SAFETY: valid descriptor and NUL-terminated path.
        assert!(unsafe { libc::inotify_add_watch(fd, path.as_ptr(), libc::IN_ATTRIB) } >= 0);
        // The events queued since the last call (queued inside the syscall that caused them).
        let events = || {
            let mut buf = [0u8; 4096];
            let mut n = 0;
            // SAFETY: reading into a local buffer of the length passed.
            loop {
                let got = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
                if got <= 0 {
                    return n;
                }
                n += got as usize / std::mem::size_of::<libc::inotify_event>();
            }
        };
        let record = |group, pct, now| {
            let lock = l.lock_claims(CLAIM_LOCK_WAIT).unwrap().unwrap();
            assert!(lock.record(group, pct, 1, 0, now, TTL));
        };
        let now = crate::clock::now_ns();
        events();
        record(1, 20, now);
        assert_eq!(events(), 1, "a new entry");
        record(1, 20, now + 1);
        assert_eq!(events(), 0, "the same claim refreshed");
        record(1, 10, now + 2);
        assert_eq!(events(), 0, "a smaller percentage: the entry keeps the larger");
        record(1, 30, now + 3);
        assert_eq!(events(), 1, "a larger percentage");
        record(1, 30, now + 3 + TTL);
        assert_eq!(events(), 1, "a claim no longer fresh, made again");
        record(2, 30, now + 4 + TTL);
        assert_eq!(events(), 1, "another group's new entry");
        // SAFETY: closing the descriptor opened above.
        unsafe { libc::close(fd) };
    }

    /// Two jobs starting one after the other, neither registered yet: the second sees the
    /// first's claim (without claims it took the whole budget too: 40 + 40).
    #[test]
    fn two_unregistered_jobs_in_sequence_split_the_budget() {
        let (_d, l) = fresh();
        let (a, b) = (
            Ledger::open_existing(l.path()).unwrap(),
            Ledger::open_existing(l.path()).unwrap(),
        );
        let now = crate::clock::now_ns();
        let pa = start(&a, 1, 0.3, now);
        let pb = start(&b, 2, 0.3, now + 1);
        assert_eq!(
            (pa, pb),
            (30, 10),
            "the second gets the floor, not the budget again"
        );
        let (_d, l) = fresh();
        let lock = l.lock_claims(CLAIM_LOCK_WAIT).unwrap().unwrap();
        assert!(lock.record(1, 25, 1, 0, now, TTL));
        drop(lock);
        let pc = start(&l, 3, 0.4, now);
        assert_eq!(pc, 15);
        assert!(25 + pc <= 40, "sum within the budget");
        let pd = start(&l, 4, 0.404, now);
        assert_eq!(pd, MIN, "the budget is held: the floor");
        assert_eq!(
            start(&l, 5, 0.57, now),
            MIN,
            "57 - (25 + 15 + 10) = 7 % left: the floor"
        );
    }
    const MIN: u32 = 10;

    #[test]
    fn a_claim_expires_after_its_ttl_and_its_entry_is_reused() {
        let (_d, l) = fresh();
        let now = crate::clock::now_ns().max(TTL + 1);
        assert_eq!(start(&l, 1, 0.4, now - TTL), 40);
        assert_eq!(
            start(&l, 2, 0.4, now - 1),
            10,
            "still fresh one ns before the TTL"
        );
        assert_eq!(
            start(&l, 3, 0.4, now + 1),
            30,
            "group 1's claim expired, group 2's 10 % is held"
        );
        let later = now + 1 + TTL;
        assert_eq!(
            start(&l, 4, 0.4, later),
            40,
            "every claim expired: the whole budget"
        );
        assert_eq!(l.claims(later).len(), 4, "a free entry first");
        // A full table: an expired entry is refilled, a fresh one never.
        let (_d, l) = fresh();
        let lock = l.lock_claims(Duration::ZERO).unwrap().unwrap();
        for g in 1..=MAX_CLAIMS as u64 {
            assert!(lock.record(g, 10, 1, 0, now - TTL + g, TTL));
        }
        assert!(
            !lock.record(1000, 10, 1, 0, now, TTL),
            "all fresh: nothing to take"
        );
        assert!(
            lock.record(1000, 10, 1, 0, now + 1, TTL),
            "group 1's expired"
        );
        let c = l.claims(now + 1);
        assert_eq!(
            (c[0].group_id, c[0].mps_pct, c[0].claim_ns),
            (1000, Some(10), now + 1)
        );
        assert_eq!(c.len(), MAX_CLAIMS);
    }

    #[test]
    fn the_same_group_takes_its_claims_percentage() {
        let (_d, l) = fresh();
        let now = crate::clock::now_ns();
        assert_eq!(start(&l, 1, 0.4, now), 40);
        assert_eq!(start(&l, 2, 0.4, now), 10);
        assert_eq!(
            start(&l, 2, 0.4, now + 5),
            10,
            "a job's next process shares its share"
        );
        assert_eq!(start(&l, 1, 0.4, now + 5), 40);
        let c = l.claims(now + 5);
        assert_eq!(c.len(), 2, "one entry per group: {c:?}");
        assert!(c.iter().all(|c| c.claim_ns == now + 5), "refreshed");
    }

    /// Once the group registered, its claim is redundant: the slot's percentage counts (once),
    /// and the entry may go to a newcomer when the table is full.
    #[test]
    fn a_registered_groups_claim_is_redundant() {
        let (_d, l) = fresh();
        let now = crate::clock::now_ns();
        assert_eq!(start(&l, 7, 0.4, now), 40);
        let g = l.group(7, 100).unwrap();
        let h = l.register_with_mps(std::process::id(), g, 20).unwrap();
        let lock = l.lock_claims(CLAIM_LOCK_WAIT).unwrap().unwrap();
        let jobs = lock.start_jobs(now, TTL);
        assert_eq!(
            jobs.len(),
            1,
            "the claim is not counted beside the job: {jobs:?}"
        );
        assert_eq!(
            jobs[0].mps_pct,
            Some(20),
            "the slot says what the job holds"
        );
        for grp in 100..100 + MAX_CLAIMS as u64 - 1 {
            assert!(lock.record(grp, 10, 1, 0, now, TTL));
        }
        assert!(
            lock.record(1000, 10, 1, 0, now, TTL),
            "the redundant entry is reused"
        );
        assert!(
            !lock.record(1001, 10, 1, 0, now, TTL),
            "full of fresh claims of unregistered groups"
        );
        drop(lock);
        l.unregister(h);
    }

    /// The monitor's and the manager's judgements and the running split use registered slots
    /// only: a claim from a process that never calls CUDA (the container's shell) leaves the
    /// whole reading online (no cap is subtracted: fail closed).
    #[test]
    fn a_claim_never_counts_as_offline_work() {
        let (_d, l) = fresh();
        let now = crate::clock::now_ns();
        assert_eq!(start(&l, 1, 0.4, now), 40);
        assert!(l.offline_jobs().is_empty());
        assert_eq!(
            offline_cap_pct(Some(40.0), &crate::jobs::jobs_of(&l.procs())),
            None
        );
        let g = l.group(2, 100).unwrap();
        let h = l.register_with_mps(std::process::id(), g, 10).unwrap();
        assert_eq!(
            offline_cap_pct(Some(40.0), &l.offline_jobs()),
            Some(10.0),
            "job 2 only, not job 1's claim"
        );
        assert!(
            (crate::jobs::job_share(0.4, &l.offline_jobs(), 2, None) - 0.4).abs() < 1e-9,
            "the running split: registered jobs only"
        );
        l.unregister(h);
    }

    /// Registration withdraws the registering process's own claim: once its job has left,
    /// nothing of it lingers for newcomers (a claim left for its TTL gave the floor here).
    #[test]
    fn registration_withdraws_the_processs_own_claim() {
        let (_d, l) = fresh();
        let now = crate::clock::now_ns();
        let (me, ns) = (std::process::id(), crate::procinfo::own_pid_ns());
        let lock = l.lock_claims(CLAIM_LOCK_WAIT).unwrap().unwrap();
        assert!(lock.record(1, 40, me, ns, now, TTL));
        assert!(
            lock.record(2, 10, me + 1, ns, now, TTL),
            "another process of another job"
        );
        drop(lock);
        let g = l.group(1, 100).unwrap();
        let h = l.register_with_mps(me, g, 40).unwrap();
        assert_eq!(
            l.claims(now).iter().map(|c| c.group_id).collect::<Vec<_>>(),
            [2],
            "its own claim withdrawn"
        );
        assert_eq!(
            start(&l, 3, 0.6, now),
            10,
            "job 1's slot (40 %) and job 2's claim (10 %) are held"
        );
        l.unregister(h);
        assert_eq!(
            start(&l, 4, 0.6, now),
            40,
            "job 1 left: only job 2's and 3's claims are held"
        );
        // Not the latest claimer of its group: the claim stays (another process of the job
        // claimed after it and has not registered yet).
        let lock = l.lock_claims(CLAIM_LOCK_WAIT).unwrap().unwrap();
        assert!(lock.record(5, 10, me + 7, ns, now, TTL));
        drop(lock);
        let g5 = l.group(5, 100).unwrap();
        let h = l.register_with_mps(me, g5, 10).unwrap();
        assert!(l.claims(now).iter().any(|c| c.group_id == 5));
        l.unregister(h);
        // The lock held elsewhere: registration goes on, the claim stays (until its TTL).
        let lock = l.lock_claims(CLAIM_LOCK_WAIT).unwrap().unwrap();
        assert!(lock.record(6, 10, me, ns, now, TTL));
        let other = Ledger::open_existing(l.path()).unwrap();
        let g6 = other.group(6, 100).unwrap();
        let h = other.register_with_mps(me, g6, 10).unwrap();
        drop(lock);
        assert!(l.claims(now).iter().any(|c| c.group_id == 6));
        other.unregister(h);
    }

    #[test]
    fn the_lock_excludes_another_description_and_is_given_back() {
        let (_d, l) = fresh();
        let other = Ledger::open_existing(l.path()).unwrap();
        let held = l.lock_claims(CLAIM_LOCK_WAIT).unwrap().unwrap();
        let t = Instant::now();
        assert!(other
            .lock_claims(Duration::from_millis(20))
            .unwrap()
            .is_none());
        assert!(
            t.elapsed() >= Duration::from_millis(20),
            "retried for the wait given"
        );
        // The registry's slot locks are another range: registration is not held up.
        let g = other.group(1, 10).unwrap();
        let h = other.register(std::process::id(), g).unwrap();
        drop(held);
        assert!(other.lock_claims(Duration::ZERO).unwrap().is_some());
        other.unregister(h);
        // A holder that dies (its description closes) lets go too.
        let dying = Ledger::open_existing(l.path()).unwrap();
        let lock = dying.lock_claims(Duration::ZERO).unwrap().unwrap();
        std::mem::forget(lock);
        drop(dying);
        assert!(l.lock_claims(Duration::ZERO).unwrap().is_some());
    }

    #[test]
    fn hostile_entries_read_tighter_never_looser() {
        let (_d, l) = fresh();
        let now = crate::clock::now_ns();
        let e = &l.layout().claims.entries;
        // pct 250 from group 1, a claim dated 1000 s in the future from group 2.
        e[0].mps_pct.store(250, Relaxed);
        e[0].claim_ns.store(now, Relaxed);
        e[0].group_id.store(1, Relaxed);
        e[1].mps_pct.store(5, Relaxed);
        e[1].claim_ns.store(now + 1_000 * 1_000_000_000, Relaxed);
        e[1].group_id.store(2, Relaxed);
        let c = l.claims(now);
        assert_eq!(c[0].mps_pct, None, "out of range: uncapped");
        assert_eq!(c[1].claim_ns, now, "the future reads as now");
        assert_eq!(
            start(&l, 3, 0.4, now),
            MIN,
            "group 1 reads as uncapped: the floor"
        );
        let when = e[1].claim_ns.load(Relaxed);
        assert!(
            when <= crate::clock::now_ns(),
            "the claimer rewrote the future time to now"
        );
        assert_eq!(
            start(&l, 4, 0.4, when + TTL),
            40,
            "so it expires within one TTL"
        );
    }

    /// Layout v5 added this block: a v4 ledger (as the previous build left it) is refused by
    /// every opener, naming both versions, and the monitor's open moves it aside once.
    #[test]
    fn a_v4_ledger_is_refused_and_moved_aside_once() {
        let (d, l) = fresh();
        let p = l.path().to_owned();
        drop(l);
        let mut v4 = std::fs::read(&p).unwrap();
        v4.truncate(crate::layout::LAYOUT_SIZE - CLAIMS_LEN as usize);
        v4[8..12].copy_from_slice(&4u32.to_le_bytes());
        let n = v4.len() as u64;
        v4[16..24].copy_from_slice(&n.to_le_bytes());
        std::fs::write(&p, &v4).unwrap();
        let e = Ledger::open_existing(&p).unwrap_err().to_string();
        assert!(
            e.contains("layout_version")
                && e.contains(&format!("found 4, this build reads {}", crate::layout::LAYOUT_VERSION)),
            "{e}"
        );
        let (l, moved) = Ledger::open_or_recreate(&p, 0).unwrap();
        let moved = moved.expect("moved aside");
        assert!(moved.error.to_string().contains("layout_version"));
        assert_eq!(
            std::fs::read(&moved.moved_to).unwrap(),
            v4,
            "the old file is kept aside"
        );
        assert!(l.claims(0).is_empty());
        drop(l);
        let (_l, again) = Ledger::open_or_recreate(&p, 0).unwrap();
        assert!(again.is_none(), "once");
        drop(d);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any claims-block content: a starting process's share is never more than it would be
        /// with only the block's valid claims (each percentage in 1..=100, at most now) counted
        /// as written, never more than the budget, and a claim recorded after it counts for
        /// the next starter.
        #[test]
        fn any_claims_block_never_loosens_a_start_share(
            words in proptest::collection::vec(any::<u64>(), MAX_CLAIMS * 4),
            budget in 0.0f64..=1.0,
            me in 1u64..4,
        ) {
            let (_d, l) = fresh();
            let now = crate::clock::now_ns();
            for (i, e) in l.layout().claims.entries.iter().enumerate() {
                e.group_id.store(words[i * 4] % 6, Relaxed);
                e.claim_ns.store(now.wrapping_add(words[i * 4 + 1] % (4 * TTL)).wrapping_sub(2 * TTL), Relaxed);
                e.pid_ns.store(words[i * 4 + 2], Relaxed);
                e.mps_pct.store((words[i * 4 + 3] % 130) as u32, Relaxed);
            }
            // The tightest honest reading: every fresh or future entry of another group counts
            // as written when valid, as 100 when not.
            let held: u32 = {
                let mut per: Vec<(u64, u32)> = Vec::new();
                for e in l.layout().claims.entries.iter() {
                    let (g, t, p) = (e.group_id.load(Relaxed), e.claim_ns.load(Relaxed), e.mps_pct.load(Relaxed));
                    if g == 0 || g == me || now.saturating_sub(t) >= TTL { continue; }
                    let p = if (1..=100).contains(&p) { p } else { 100 };
                    match per.iter_mut().find(|x| x.0 == g) { Some(x) => x.1 = x.1.max(p), None => per.push((g, p)) }
                }
                per.iter().map(|x| x.1).sum()
            };
            let lock = l.lock_claims(Duration::ZERO).unwrap().unwrap();
            let jobs = lock.start_jobs(now, TTL);
            let share = start_share(budget, &jobs, me);
            prop_assert!(share <= budget + 1e-12 || jobs.iter().any(|j| j.group_id == me), "{share} > {budget}");
            if !jobs.iter().any(|j| j.group_id == me) {
                prop_assert!(share <= (budget - f64::from(held) / 100.0).max(0.0) + 1e-9, "{share} with {held} held");
            }
            for j in &jobs {
                prop_assert!(j.mps_pct.is_none_or(|p| (1..=100).contains(&p)));
            }
            let pct = pct_of(share);
            if lock.record(me, pct, 1, 0, now, TTL) {
                drop(lock);
                let other = Ledger::open_existing(l.path()).unwrap();
                let lock = other.lock_claims(Duration::ZERO).unwrap().unwrap();
                let jobs = lock.start_jobs(now, TTL);
                let mine = jobs.iter().find(|j| j.group_id == me).expect("the claim counts");
                prop_assert!(mine.mps_pct.is_none_or(|p| p >= pct));
            }
        }
    }
}
