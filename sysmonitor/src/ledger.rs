//! `LedgerPort` over the shared `node-ledger` files: reads the offline registry (the ledger),
//! publishes the monitor block and records its eviction requests (the status file, which only
//! the daemons write).

use std::sync::atomic::Ordering::Acquire;

use node_ledger::layout::{owner_pid, LIVENESS_LOCK};
use node_ledger::pods::{PodChange, PodLedgers};
use node_ledger::{HealthState, Ledger, MonitorSample, PodUid, ProcId, ProcSnapshot, Requester};

use crate::filewatch::FileWatch;
use crate::health::State;
use crate::port::{EvictReason, LedgerPort, OfflineProc, Published};

/// [`LedgerPort`] over the shared ledger file, with the monitor's damage and deletion handling.
pub struct LedgerAdapter {
    /// The ledger in use (replaced by a restored copy if the file is deleted while mapped).
    pub ledger: Ledger,
    /// Pids here of processes registered from other pid namespaces (containers).
    host_pids: node_daemon::procns::HostPids,
    /// The slots (ledger, slot, identity) whose owner the last [`LedgerPort::offline`] found
    /// holding the slot's lock: only those may take the eviction table's last
    /// [`EVICT_RESERVED_FOR_FOUND`] entries. Not every slot with a host pid: one naming a pid
    /// no live process has gets that pid too, and proves nothing.
    found: std::collections::HashSet<(Option<PodUid>, usize, ProcId)>,
    /// Set once the mapped header stops validating: the mapping is no longer read or written
    /// (a truncated file would fault), offline processes fail closed on their own check.
    damage: Option<String>,
    /// The GPU ledger's registrations as last read while it was usable. Once it is damaged
    /// (any local user may write a word of it), these stay the GPU ledger's offline processes
    /// while their owners are found alive holding their slots' locks (in the damaged file,
    /// where the kernel keeps them): their load is still offline load and they are still
    /// evicted (signalled) at an Overlimit, Disabled or host-memory eviction, until they exit.
    /// Before, a damaged ledger listed nobody: eviction was off for all of them.
    gpu_procs: Vec<ProcSnapshot>,
    /// Deleted ledgers this monitor restored a copy of, kept open: their processes' slot locks
    /// are there (dropped once no slot of the copy depends on them).
    previous: Vec<Ledger>,
    reclaim_error_logged: bool,
    /// Monotonic ms of the next reclaim scan whatever the watch says (see [`RECLAIM_EVERY_MS`]).
    next_reclaim_ms: u64,
    reclaim_every_ms: u64,
    reclaim_fallback_ms: u64,
    /// Whether the last reclaim scan saw a slot whose owner's liveness is not a lock in this
    /// file (a proxy registration, a restored ledger's): no close of this file tells of its end.
    reclaim_polls: bool,
    /// Changes the watch reported (one per look that found some), and how many of them the
    /// full check and the reclaim scan have acted on.
    file_events: u64,
    check_seen: u64,
    reclaim_seen: u64,
    /// Ticks left in which a reclaim scan runs because of the last reported change.
    reclaim_due: u8,
    /// Reclaim scans run so far.
    reclaim_scans: u64,
    /// Tells of an unlink or truncation of the file without a syscall per tick; `None` where
    /// it cannot be set up: then every check runs the full check (an `fstat`).
    watch: Option<FileWatch>,
    /// Monotonic ms of the next full check whatever the watch says.
    next_full_check_ms: u64,
    full_check_every_ms: u64,
    /// Full checks (with an `fstat`) run so far.
    full_checks: u64,
    /// Monotonic ms of the next publish of the jobs table (on the grid of [`JOBS_EVERY_MS`]).
    next_jobs_ms: u64,
    /// The pod ledgers of this GPU (`node_ledger::pods`), read beside the GPU's own ledger.
    pods: PodLedgers,
    /// Monotonic ms of the next scan of the pods directory.
    next_pod_scan_ms: u64,
    /// One watch of every open pod ledger (`None` where it cannot be set up): a registered
    /// process's death is reported as it happens, as for the GPU's ledger ([`RECLAIM_EVERY_MS`]).
    pod_watch: Option<FileWatch>,
    /// The watch descriptor of each pod ledger in [`Self::pod_watch`].
    pod_wds: std::collections::BTreeMap<PodUid, i32>,
    /// Ticks left in which the pod ledgers' dead processes are reclaimed because a watch
    /// reported a change.
    pod_reclaim_due: u8,
    /// Monotonic ms of the next reclaim in the pod ledgers whatever their watches say.
    next_pod_reclaim_ms: u64,
    /// This process's pid, published with every sample (a monitor never forks).
    pid: u32,
    /// The GPU index the ledger was opened with (its header is not read once damaged).
    gpu: u32,
    /// Where the monitor publishes (`<ledger_dir>/status/gpu<N>`), kept usable.
    status: node_daemon::status::StatusKeeper,
}

/// How often the ledger file is `fstat`ed and its whole registry checked whatever its watch
/// says (belt and braces for the file; the watch reports an unlink or truncation at the next
/// tick). The per-tick check reads only the header's cache line.
pub const FULL_CHECK_EVERY_MS: u64 = 100;

/// The first multiple of `period` after `now`: the periodic jobs of the monitor (full ledger
/// check, reclaim scan, housekeeping, verification) run on one grid of monotonic time, so
/// that those whose periods divide each other fall in the same tick, and the registry's 256
/// cache lines, cold after a 10 ms sleep, are brought in once for all of them rather than
/// once for each. `period` 0 means every tick.
pub fn next_on_grid(now: u64, period: u64) -> u64 {
    if period == 0 {
        return now;
    }
    (now / period).saturating_add(1).saturating_mul(period)
}

fn watch(ledger: &Ledger) -> Option<FileWatch> {
    let r = ledger
        .inode()
        .map_err(|e| e.to_string())
        .and_then(|ino| FileWatch::new(ledger.path(), ino));
    match r {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(ledger = %ledger.path().display(), error = %e, "no inotify watch on the ledger: checking it with fstat at every tick");
            None
        }
    }
}

/// How often the monitor scans the registry for dead processes when it cannot count on its
/// watch of the ledger (no watch, or a registration whose liveness is not a lock in this file:
/// a proxy, a restored ledger's): a dead process's quota is back within this plus one tick.
///
/// Otherwise the scan (256 slots' cache lines, one `fcntl` per occupied slot) runs when the
/// watch reports a change to the file, which includes the close of a description opened for
/// writing (`IN_CLOSE_WRITE`): a registered process holds its slot lock on such a description,
/// and the kernel releases the lock when the description is closed, for whatever reason the
/// process ended, so its quota is back at the next tick (the tick after it too, since the close
/// is reported a moment before the lock is released). [`RECLAIM_FALLBACK_MS`] bounds what a
/// lost signal could delay.
pub const RECLAIM_EVERY_MS: u64 = 50;

/// Longest time between two reclaim scans whatever the watch says.
pub const RECLAIM_FALLBACK_MS: u64 = 1000;

/// How often the jobs table is published in the status file (the offline jobs registered in
/// the ledger; an offline process, which sees only its own pod's ledger, splits the SM budget
/// by it). On the grid of the other registry reads; its readers count it stale after seconds.
/// Also at the tick after a ledger's watch reports a change: a new start claim is announced
/// that way (`node_ledger::claims`), and reaches other pods within a tick or two.
pub const JOBS_EVERY_MS: u64 = 100;

/// Entries of the monitor's eviction table (`node_ledger::status::EVICT_ENTRIES`, one table for
/// the GPU's ledger and every pod ledger; the reserve is shared with mps-manager's own table) that a request for a slot
/// whose owner was not found holding its lock may not take: only processes found holding their
/// slot's lock get them. Such a slot is one no visible process owns (the monitor sees every
/// process and may read their locks), which any ledger client can write by the hundred: without
/// the reserve, one pod's forged slots filled the table at an Overlimit, and the real processes
/// of every other ledger got no request and no eviction-log record. A slot naming a pid no live
/// process has is one of them, though it gets that pid as its host pid (`HostPids::of`).
pub use node_ledger::status::EVICT_RESERVED_FOR_FOUND;

/// How often the pods directory is read (pod ledgers come and go with pods), and the longest
/// time between two reclaims of the pod ledgers' dead processes whatever their watches say
/// (a dead container's memory is back within this, and usually at the next tick: each open
/// pod ledger is watched as the GPU's own is).
pub const POD_SCAN_EVERY_MS: u64 = 250;

impl LedgerAdapter {
    /// The processes either daemon has asked to leave (the status file's tables; none while
    /// it is not open).
    fn asked_to_leave(&self) -> std::collections::HashSet<ProcId> {
        self.status.current().map_or_else(Default::default, |s| s.evict_requests().into_iter().map(|r| r.id).collect())
    }

    /// The processes either daemon has asked to leave, each with whether the request is
    /// mps-manager's alone (the monitor made none for it).
    fn asked_by(&self) -> std::collections::HashMap<ProcId, bool> {
        let mut m = std::collections::HashMap::new();
        for r in self.status.current().map(|s| s.evict_requests()).unwrap_or_default() {
            let manager_only = m.entry(r.id).or_insert(true);
            *manager_only &= r.by == Requester::Manager;
        }
        m
    }

    /// Every registered process of the GPU with the pod ledger it is in (`None`: the GPU's own
    /// ledger, read only while usable; once damaged, as last read: [`Self::gpu_procs`]).
    fn all_procs(&mut self) -> Vec<(Option<PodUid>, ProcSnapshot)> {
        if self.usable() {
            self.gpu_procs = self.ledger.procs();
        }
        let mut v: Vec<_> = self.gpu_procs.iter().map(|p| (None, p.clone())).collect();
        for pl in self.pods.iter() {
            v.extend(pl.ledger.procs().into_iter().map(|p| (Some(pl.pod), p)));
        }
        v
    }

    /// The ledger a process is registered in ([`OfflineProc::pod_ledger`]), if readable.
    fn ledger_of(&self, pod: Option<PodUid>) -> Option<&Ledger> {
        match pod {
            None => self.usable().then_some(&self.ledger),
            Some(u) => self.pods.get(u),
        }
    }

    /// The pod ledgers open now (for the state file and tests).
    pub fn pod_ledgers(&self) -> usize {
        self.pods.len()
    }

    /// The pod ledgers refused as they are now, by pod UID, with why (for the state file).
    pub fn refused_pod_ledgers(&self) -> std::collections::BTreeMap<String, String> {
        self.pods.refused().map(|(p, e)| (p.to_string(), e.to_string())).collect()
    }

    /// Reads the pods directory every [`POD_SCAN_EVERY_MS`], watching each pod ledger it
    /// opens.
    fn scan_pods(&mut self, now: u64) {
        if now < self.next_pod_scan_ms {
            return;
        }
        self.next_pod_scan_ms = next_on_grid(now, POD_SCAN_EVERY_MS);
        for c in self.pods.scan() {
            match c {
                PodChange::Opened(pod, path) => {
                    tracing::info!(%pod, file = %path.display(), "pod ledger opened");
                    if let Err(e) = self.watch_pod(pod, &path) {
                        tracing::warn!(%pod, file = %path.display(), error = %e, "no inotify watch on the pod ledger: its dead processes are reclaimed every {POD_SCAN_EVERY_MS} ms");
                    }
                    // Its processes may have died before the watch was set up.
                    self.pod_reclaim_due = self.pod_reclaim_due.max(1);
                }
                PodChange::Closed(pod, path) => {
                    self.unwatch_pod(pod);
                    tracing::info!(%pod, file = %path.display(), "pod ledger closed (gone or replaced)");
                }
                PodChange::Refused(pod, path, error) => {
                    self.unwatch_pod(pod);
                    tracing::error!(
                        %pod,
                        file = %path.display(),
                        %error,
                        "pod ledger refused: its processes are not read from it (their memory is still checked through NVML)"
                    );
                }
            }
        }
    }

    /// Adds pod `pod`'s ledger, just opened at `path`, to the pod ledgers' watch (made with the
    /// first).
    fn watch_pod(&mut self, pod: PodUid, path: &std::path::Path) -> Result<(), String> {
        let ino = self.pods.get(pod).ok_or("not open")?.inode().map_err(|e| e.to_string())?;
        let w = match self.pod_watch {
            Some(ref w) => w,
            None => self.pod_watch.insert(FileWatch::empty()?),
        };
        let wd = w.add(path, ino)?;
        self.pod_wds.insert(pod, wd);
        Ok(())
    }

    fn unwatch_pod(&mut self, pod: PodUid) {
        if let (Some(wd), Some(w)) = (self.pod_wds.remove(&pod), &self.pod_watch) {
            w.remove(wd);
        }
    }

    /// Makes the jobs table due at this tick's publish: a watch reported a change to a ledger
    /// (a process that started, claimed a start percentage or died), which the other pods'
    /// starting processes should see before the table's next period.
    fn jobs_due(&mut self) {
        self.next_jobs_ms = 0;
    }

    /// Reclaims the pod ledgers' dead processes: at this tick and the next when a pod
    /// ledger's watch reported a change (the close of a dying process's description is
    /// reported a moment before the kernel releases its slot lock), and every
    /// [`POD_SCAN_EVERY_MS`] whatever the watches say. Per tick otherwise: one atomic load.
    fn reclaim_pods(&mut self, now: u64) {
        if self.pod_watch.as_mut().is_some_and(|w| w.changed()) {
            self.pod_reclaim_due = 2;
            self.jobs_due();
        }
        let due = self.pod_reclaim_due > 0 || now >= self.next_pod_reclaim_ms;
        self.pod_reclaim_due = self.pod_reclaim_due.saturating_sub(1);
        if !due {
            return;
        }
        self.next_pod_reclaim_ms = next_on_grid(now, POD_SCAN_EVERY_MS);
        for pl in self.pods.iter() {
            match pl.ledger.reclaim_dead() {
                Ok(v) => {
                    for (pid, bytes) in v {
                        tracing::info!(pod = %pl.pod, pid, bytes, "reclaimed the quota of a dead process");
                    }
                }
                Err(e) => tracing::warn!(pod = %pl.pod, error = %e, "reclaim in a pod ledger failed"),
            }
        }
    }

    /// Wraps `ledger`, publishing into the status file at `status_path`; the first
    /// [`LedgerPort::reclaim`] scans at once, the first publish opens the status file.
    pub fn new(ledger: Ledger, status_path: std::path::PathBuf) -> Self {
        LedgerAdapter {
            status: node_daemon::status::StatusKeeper::new(
                status_path,
                ledger.gpu_index(),
                "health and samples are not published (node-agent admits nothing to this GPU, shims throttle as for a stale monitor)",
            ),
            gpu: ledger.gpu_index(),
            host_pids: node_daemon::procns::HostPids::default(),
            found: Default::default(),
            damage: None,
            gpu_procs: Vec::new(),
            previous: Vec::new(),
            reclaim_error_logged: false,
            next_reclaim_ms: 0,
            reclaim_every_ms: RECLAIM_EVERY_MS,
            reclaim_fallback_ms: RECLAIM_FALLBACK_MS,
            reclaim_polls: false,
            file_events: 0,
            check_seen: 0,
            reclaim_seen: 0,
            reclaim_due: 0,
            reclaim_scans: 0,
            watch: watch(&ledger),
            next_full_check_ms: 0,
            full_check_every_ms: FULL_CHECK_EVERY_MS,
            full_checks: 0,
            next_jobs_ms: 0,
            // `<ledger_dir>/gpu<N>/ledger`: the pods directory is `<ledger_dir>/pods`.
            pods: PodLedgers::new(
                ledger.path().parent().and_then(std::path::Path::parent).unwrap_or(std::path::Path::new("/")),
                ledger.gpu_index(),
            ),
            next_pod_scan_ms: 0,
            pod_watch: None,
            pod_wds: Default::default(),
            pod_reclaim_due: 0,
            next_pod_reclaim_ms: 0,
            pid: std::process::id(),
            ledger,
        }
    }

    /// The full check (an `fstat`: unlinked? shrunk? and the whole registry) when the watch
    /// reports a change to the file, when there is no watch, and every
    /// [`FULL_CHECK_EVERY_MS`] (on the grid of [`next_on_grid`]); otherwise only what needs no
    /// syscall and no pass over the registry (a caught truncation, the mapped header). A
    /// deleted or truncated file is thus still found at the next tick.
    fn check_now(&mut self, now: u64) -> Result<(), node_ledger::LedgerError> {
        self.poll_watch();
        let changed = self.watch.is_none() || self.check_seen != self.file_events;
        self.check_seen = self.file_events;
        if changed || now >= self.next_full_check_ms {
            self.next_full_check_ms = next_on_grid(now, self.full_check_every_ms);
            self.full_checks += 1;
            self.ledger.check_header()
        } else {
            self.ledger.check_mapped()
        }
    }

    /// Re-validates the mapped header at monotonic ms `now` (call every tick; the file itself
    /// is `fstat`ed and the registry checked only when its watch reports a change and every
    /// [`FULL_CHECK_EVERY_MS`]). Returns the damage, logging it once when first found; damage
    /// is sticky for the life of this monitor (a restart moves the file aside and creates a
    /// fresh one).
    pub fn check(&mut self, now: u64) -> Option<&str> {
        if self.damage.is_none() {
            if let Err(e) = self.check_now(now) {
                self.on_damage(e);
            }
        }
        self.damage.as_deref()
    }

    /// What [`Self::check`] does with a failed check: a deleted file restored and followed,
    /// anything else logged and kept as sticky damage. Out of line (and out of the per-tick
    /// code's cache lines and stack frame): it runs once in a monitor's life, if ever.
    #[cold]
    #[inline(never)]
    fn on_damage(&mut self, e: node_ledger::LedgerError) {
        if let Some(fresh) = self.restore_if_deleted(&e) {
            self.watch = watch(&fresh);
            let deleted = std::mem::replace(&mut self.ledger, fresh);
            self.previous.push(deleted);
            self.trust_previous();
            return;
        }
        tracing::error!(
            ledger = %self.ledger.path().display(),
            error = %e,
            registered = self.gpu_procs.len(),
            "ledger damaged while running: offline processes refuse new allocations; its registered processes as \
             last read stay offline work, evicted as before, while they hold their slots' locks; restart sysmonitor \
             to move it aside and create a fresh one"
        );
        self.damage = Some(e.to_string());
    }

    /// A ledger deleted while mapped: put a copy (with every group's usage) back in place
    /// before a newcomer creates an empty one, and go on with that copy. Logged once.
    fn restore_if_deleted(&self, e: &node_ledger::LedgerError) -> Option<Ledger> {
        if !matches!(e, node_ledger::LedgerError::Corrupt { field: "path", .. }) {
            return None;
        }
        let path = self.ledger.path().to_owned();
        match self.ledger.restore_deleted() {
            Ok(true) => {
                let (mode, gid) = self.ledger.access().ok()?;
                let fresh = Ledger::open_existing(&path).ok()?;
                let _ = fresh.set_access(mode, Some(gid));
                tracing::error!(ledger = %path.display(), "ledger deleted while in use: restored a copy with every group's usage; processes that used the deleted file refuse new allocations");
                Some(fresh)
            }
            Ok(false) => None,
            Err(why) => {
                tracing::error!(ledger = %path.display(), error = %why, "ledger deleted while in use: no copy restored");
                None
            }
        }
    }

    /// Tells the ledger in use which deleted ledgers it was restored from (those kept open in
    /// [`Self::previous`]): only a slot naming one of them has its owner's lock elsewhere than
    /// in the ledger itself (`Ledger::set_restored_from`).
    fn trust_previous(&mut self) {
        let inos = self.previous.iter().filter_map(|l| l.inode().ok()).collect();
        self.ledger.set_restored_from(inos);
    }

    /// Reclaim scans run so far (a pass over the registry each).
    pub fn reclaim_scans(&self) -> u64 {
        self.reclaim_scans
    }

    /// Counts a change the watch reports (one atomic load when there is none), for the full
    /// check and the reclaim scan, each of which acts on it once.
    fn poll_watch(&mut self) {
        if self.watch.as_mut().is_some_and(|w| w.changed()) {
            self.file_events += 1;
        }
    }

    /// Whether the mapping may be touched (not once damage was found; [`Self::check`] has
    /// already logged it, so callers skip quietly rather than log it again every tick).
    fn usable(&self) -> bool {
        self.damage.is_none()
    }

    /// Why the status file could not be opened at the last try, if it could not.
    pub fn status_error(&self) -> Option<&str> {
        self.status.error()
    }

    /// One dead-process reclaim pass (when [`LedgerPort::reclaim`] finds one due). Out of line
    /// so the per-tick part of `reclaim` keeps a small stack frame and few cache lines.
    #[inline(never)]
    fn reclaim_scan(&mut self, now: u64) {
        self.reclaim_scans += 1;
        let mut errors = Vec::new();
        // Each reclaimed process is logged (INFO) by node-ledger.
        if let Err(e) = self.ledger.reclaim_dead() {
            errors.push(e.to_string());
        }
        let current = &self.ledger;
        let kept = self.previous.len();
        self.previous.retain(|deleted| {
            if let Err(e) = current.reclaim_through(deleted) {
                errors.push(e.to_string());
            }
            deleted.inode().is_ok_and(|ino| current.depends_on(ino))
        });
        if self.previous.len() != kept {
            self.trust_previous();
        }
        // Liveness that no close of this file reports: keep polling while there is some.
        self.reclaim_polls = !self.previous.is_empty()
            || self.ledger.layout().procs.iter().any(|p| {
                owner_pid(p.owner.load(Acquire)) != 0 && p.liveness.load(Acquire) != LIVENESS_LOCK
            });
        let period = if self.watch.is_none() || self.reclaim_polls {
            self.reclaim_every_ms
        } else {
            self.reclaim_fallback_ms
        };
        self.next_reclaim_ms = next_on_grid(now, period);
        if errors.is_empty() {
            self.reclaim_error_logged = false;
        } else if !self.reclaim_error_logged {
            tracing::error!(errors = ?errors, "cannot reclaim dead offline processes' quota");
            self.reclaim_error_logged = true;
        }
    }
}

/// The ledger's copy of a health state.
pub fn to_ledger(s: State) -> HealthState {
    match s {
        State::Init => HealthState::Init,
        State::Healthy => HealthState::Healthy,
        State::Unhealthy => HealthState::Unhealthy,
        State::Overlimit => HealthState::Overlimit,
        State::Disabled => HealthState::Disabled,
    }
}

pub use node_ledger::jobs::offline_cap_pct;

fn permille(pct: f64) -> u32 {
    (pct * 10.0).round().clamp(0.0, 1000.0) as u32
}

impl LedgerPort for LedgerAdapter {
    fn offline_sm_cap_pct(&mut self) -> Option<f64> {
        if !self.usable() {
            return None;
        }
        let m = self.status.current()?.read_manager()?;
        let fresh = m.is_fresh(
            node_ledger::clock::now_ns(),
            crate::port::BUDGET_FRESH_MS * 1_000_000,
        );
        let budget = fresh.then(|| f64::from(m.offline_sm_budget_permille) / 10.0);
        // Processes asked to leave count as online in the occupancy (fail closed): not here either.
        let asked = self.asked_to_leave();
        let all = self.all_procs();
        // Only a slot whose owner was found holding its lock counts (`HostPids::holder`): any
        // ledger client can write any slot of its ledgers, and a slot claiming 100 % (a copy,
        // or one naming a process that holds no lock) raised the cap, so less of the reading
        // was judged online. What a process holds is at most the published budget
        // (`offline_cap_pct`).
        let procs: Vec<_> = all
            .into_iter()
            .map(|(_, p)| p)
            .filter(|p| p.start_time != 0 && !asked.contains(&ProcId::of(p)) && self.host_pids.holder(p).is_some())
            .collect();
        offline_cap_pct(budget, &node_ledger::jobs::jobs_of(&procs))
    }

    fn offline(&mut self, now: u64) -> Result<Vec<OfflineProc>, String> {
        self.scan_pods(now);
        if !self.usable() {
            // The damaged GPU ledger's registrations as last read, until their owner is known
            // gone: one found holding its slot's lock stays while it lives; one whose slot names
            // a pid nobody has goes. One not found this round (its lookup put off by the fd
            // budget or a back-off, or a process of another pid namespace started after the
            // round's walk) stays: the file is never read again, so dropped it would never come
            // back, and its work would count as online.
            let host_pids = &mut self.host_pids;
            self.gpu_procs.retain(|p| match host_pids.of_checked(p) {
                (Some(h), true) => !node_ledger::procinfo::is_dead(h, p.start_time),
                (Some(_), false) => false,
                (None, _) => true,
            });
        }
        let procs: Vec<_> = self
            .all_procs()
            .into_iter()
            // A slot whose start time is still 0 is mid-registration: not yet a process to judge.
            .filter(|(_, p)| p.start_time != 0)
            .collect();
        // The monitor's requests of processes no longer registered are withdrawn (the table
        // has one entry per registrable process). Opened here if no publish did yet: a
        // restarted monitor must find the requests its predecessor made before it judges.
        if let Some(w) = self.status.get(now) {
            w.retain_evictions(Requester::Monitor, |id| procs.iter().any(|(_, p)| ProcId::of(p) == id));
        }
        let asked = self.asked_by();
        let host_pids = &mut self.host_pids;
        let keys: std::collections::HashSet<_> = procs.iter().map(|(_, p)| node_daemon::procns::HostPids::key_of(p)).collect();
        host_pids.retain(|k| keys.contains(k));
        let found = &mut self.found;
        found.clear();
        Ok(procs
            .into_iter()
            .map(|(pod, p)| {
                let manager_only = asked.get(&ProcId::of(&p)).copied();
                let (host_pid, holder) = host_pids.of_checked(&p);
                if holder {
                    found.insert((pod, p.slot, ProcId::of(&p)));
                }
                OfflineProc {
                    slot: p.slot,
                    pod_ledger: pod,
                    pid: p.pid,
                    pid_ns: p.pid_ns,
                    host_pid,
                    start_time: p.start_time,
                    reported_bytes: p.mem_bytes,
                    group_id: p.group_id,
                    // The status file keeps the request, not its time: a restarted monitor
                    // restarts the grace period from when it finds the request. Either daemon's
                    // request: a process mps-manager asked to leave is escalated alike.
                    evict_requested_ms: manager_only.map(|_| now),
                    // mps-manager escalates its own requests after its own grace: adopted
                    // here as a backstop only (`OfflineProc::adopted_grace_ms`).
                    evict_by_manager: manager_only.unwrap_or(false),
                }
            })
            .collect())
    }

    fn mark_evicting(
        &mut self,
        p: &OfflineProc,
        reason: EvictReason,
        now_ms: u64,
    ) -> Result<(), String> {
        // No slot to write a request into (work running without the shim), and no record for
        // node-agent, which maps only ledger clients to pods: its host pid is signalled.
        if p.slot == node_daemon::evictor::NO_SLOT {
            return Ok(());
        }
        let Some(ledger) = self.ledger_of(p.pod_ledger) else {
            return Ok(()); // its ledger is damaged or gone: the process is signalled only
        };
        // Addressed to the process (pid namespace, pid, start time as its slot named it), in
        // the status file: its shim takes it, and nothing another tenant writes can ask it.
        // A newcomer that reused the slot is another process and gets nothing. Only a slot
        // still naming the process is asked (a stale identity is a bug: said).
        let id = ProcId { pid_ns: p.pid_ns, pid: p.pid, start_time: p.start_time };
        if !ledger.procs().iter().any(|q| q.slot == p.slot && ProcId::of(q) == id) {
            return Err(format!(
                "slot {} no longer holds pid {} (start time {}): no request written",
                p.slot, p.pid, p.start_time
            ));
        }
        // The pod is the one its cgroup path names, read here on the host, never the group its
        // slot claims: any ledger client writes its own slot, and node-agent evicts the pod
        // named here (a slot claiming a neighbour's group got the neighbour evicted).
        // A process of a pod ledger belongs to that pod whatever its cgroup reads (node-agent
        // mounts the file into that pod's containers only): the fallback when none is read.
        let pod = p.host_pid.and_then(|h| node_daemon::offline_pods::pod_of_live(h, p.start_time)).or(p.pod_ledger);
        let Some(w) = self.status.get(now_ms) else {
            return Err("no status file to write the request into (its error is logged): the process is only signalled".into());
        };
        // Every slot whose owner was not found holding its lock, with a host pid or not: a
        // slot naming a pid no live process has gets that pid (`HostPids::of`), and any
        // ledger client can write hundreds of them.
        let found = self.found.contains(&(p.pod_ledger, p.slot, id));
        if let Err(e) = w.request_evict_for(Requester::Monitor, id, pod, libc::SIGTERM as u32, found) {
            return Err(format!(
                "no request written for pid {} (pid namespace {}, slot {}, pod ledger {:?}): {e}",
                p.pid, p.pid_ns, p.slot, p.pod_ledger
            ));
        }
        // The durable record node-agent reports from (the request ends with the process).
        let Some(ledger) = self.ledger_of(p.pod_ledger) else {
            return Err("its ledger went while the request was written: no log record".into());
        };
        crate::evictlog::record(self.ledger.path(), ledger, p, reason, libc::SIGTERM as u32, pod)
    }

    fn record_unshimmed(
        &mut self,
        p: &OfflineProc,
        reason: EvictReason,
        pod_uid: Option<&str>,
    ) -> Result<(), String> {
        // The log lies beside the GPU's directory, not in the mapping: written whatever the
        // ledger's state.
        crate::evictlog::record_unshimmed(self.ledger.path(), self.gpu, p, reason, libc::SIGTERM as u32, pod_uid)
    }

    fn reclaim(&mut self, now: u64) {
        self.scan_pods(now);
        self.reclaim_pods(now);
        if !self.usable() {
            return;
        }
        self.poll_watch();
        if self.reclaim_seen != self.file_events {
            self.reclaim_seen = self.file_events;
            self.reclaim_due = 2;
            self.jobs_due();
        }
        let due = self.reclaim_due > 0 || now >= self.next_reclaim_ms;
        self.reclaim_due = self.reclaim_due.saturating_sub(1);
        if due {
            self.reclaim_scan(now);
        }
    }

    fn publish(&mut self, p: &Published) -> Result<(), String> {
        // Published whatever the ledger's state: the status file is not the ledger, and its
        // readers (node-agent's admission, the shims' throttles) need the verdict most then.
        let pid = self.pid;
        let Some(status) = self.status.get(p.t_ms) else {
            return Ok(()); // said when the open failed
        };
        let s = MonitorSample {
            health: to_ledger(p.state.unwrap_or(State::Init)) as u32,
            sm_active_permille: permille(p.sm_activity),
            gpu_util_permille: permille(p.gpu_util),
            sm_clock_mhz: p.sm_clock_mhz,
            sm_clock_max_mhz: p.sm_clock_max_mhz,
            sm_count: 0, // not measured by the monitor: unknown
            mem_used_bytes: p.mem_used,
            mem_total_bytes: p.mem_total,
            throttle_floor: p.throttle_floor,
        };
        status.publish_as(&s, pid);
        // The jobs, while the registry can be read: a damaged ledger's table goes stale, and
        // every reader then fails closed (a starting job takes the floor).
        if p.t_ms >= self.next_jobs_ms && self.usable() {
            self.next_jobs_ms = next_on_grid(p.t_ms, JOBS_EVERY_MS);
            // With the fresh start claims of every ledger (a pod's claims are in its own
            // ledger, which no other pod sees): a process starting in another pod leaves room
            // for them; the running splits leave them out (`JobsSnapshot::for_running`).
            use node_ledger::jobs::{jobs_of, merge, pod_job, with_claims};
            let now_ns = node_ledger::clock::now_ns();
            let ttl_ns = node_ledger::claims::DEFAULT_CLAIM_TTL_MS * 1_000_000;
            let of = |l: &Ledger| with_claims(&jobs_of(&l.procs()), &l.claims(now_ns), now_ns, ttl_ns);
            // The GPU's own ledger (offline work outside Kubernetes): a job per group. Each
            // pod ledger: the pod as one job, whatever groups its tenant made up in it.
            let mut jobs = of(&self.ledger);
            for pl in self.pods.iter() {
                let group = node_ledger::ledger::group_id_for(&node_ledger::ledger::pod_group_name(&pl.pod.to_string()));
                if let Some(j) = pod_job(group, &of(&pl.ledger)) {
                    jobs = merge(&jobs, &[j]);
                }
            }
            if let Some(status) = self.status.current() {
                status.publish_jobs(&jobs);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use node_ledger::Status;

    /// A new ledger for GPU 0 in a temporary directory (kept alive by the returned handle),
    /// its path, and the monitor's adapter over it.
    fn fresh_adapter() -> (tempfile::TempDir, std::path::PathBuf, LedgerAdapter) {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("gpu0/ledger");
        let a = LedgerAdapter::new(Ledger::open_or_create(&path, 0).unwrap(), node_ledger::config::status_path(d.path(), 0));
        (d, path, a)
    }

    #[test]
    fn publishes_and_keeps_the_budget_and_reads_registered_processes() {
        let d = tempfile::tempdir().unwrap();
        let l = Ledger::open_or_create(&d.path().join("gpu0/ledger"), 0).unwrap();
        let status = node_ledger::config::status_path(d.path(), 0);
        let manager = Status::open_or_create(&status, 0).unwrap();
        manager.publish_sm_budget(400);
        let g = l
            .group(node_ledger::ledger::group_id_for("c1"), 1 << 30)
            .unwrap();
        let h = l.register(std::process::id(), g).unwrap();
        l.try_reserve(h, 5 << 20).unwrap();
        let mut a = LedgerAdapter::new(l, status.clone());
        let floor = crate::config::OfflineThrottleConfig::default().floor();
        a.publish(&Published {
            state: Some(State::Overlimit),
            sm_activity: 97.25,
            throttle_floor: floor,
            ..Default::default()
        })
        .unwrap();
        let reader = Status::open(&status).unwrap();
        let snap = reader.read_monitor().unwrap();
        assert_eq!(snap.health(), Some(HealthState::Overlimit));
        assert_eq!(snap.sample.sm_active_permille, 973);
        assert_eq!(snap.sample.throttle_floor, floor, "the operator's throttle floor, in the status file");
        assert_eq!(reader.read_manager().unwrap().offline_sm_budget_permille, 400, "the manager's block is kept");
        let jobs = reader.read_jobs().unwrap();
        assert!(jobs.publish_ns != 0, "the jobs table is published with the first sample");
        assert_eq!(
            jobs.jobs,
            vec![node_ledger::OfflineJob { group_id: node_ledger::ledger::group_id_for("c1"), procs: 1, mps_pct: None }]
        );
        let procs = a.offline(0).unwrap();
        assert_eq!(procs.len(), 1);
        assert_eq!(procs[0].pid, std::process::id());
        assert_eq!(procs[0].reported_bytes, 5 << 20);
        assert!(procs[0].host_pid == Some(procs[0].pid) && procs[0].evict_requested_ms.is_none());
        a.mark_evicting(&procs[0], EvictReason::Overlimit, 0)
            .unwrap();
        let me = node_ledger::ProcId::own().unwrap();
        assert_eq!(reader.evict_request(me), libc::SIGTERM as u32, "asked in the status file");
        let _ = h;
        assert!(
            a.offline(0).unwrap()[0].evict_requested_ms.is_some(),
            "the request survives in the ledger"
        );
    }

    /// Slots no process here owns (registered on behalf of live processes that hold no lock,
    /// as any ledger client can write them) filling a pod ledger take at most the eviction
    /// table's entries but [`EVICT_RESERVED_FOR_FOUND`]: a real process of another ledger
    /// asked after all of them still gets its request and its eviction-log record. Before, the
    /// 256 slots filled the table.
    #[test]
    fn slots_nobody_owns_cannot_fill_the_eviction_table() {
        let (d, _path, mut a) = fresh_adapter();
        let pod = PodUid::parse("11111111-2222-4333-8444-555555555555").unwrap();
        let pl = Ledger::open_or_create(&node_ledger::pods::pod_ledger_path(d.path(), pod, 0), 0).unwrap();
        let g = pl.group(7, 1 << 30).unwrap();
        struct Kill(Vec<std::process::Child>);
        impl Drop for Kill {
            fn drop(&mut self) {
                for c in &mut self.0 {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
        }
        let mut named = Kill(Vec::new());
        for _ in 0..node_ledger::layout::MAX_PROCS {
            let c = std::process::Command::new("sleep").arg("600").spawn().unwrap();
            pl.register(c.id(), g).unwrap();
            named.0.push(c);
        }
        forged_slots_leave_the_reserve(&d, &mut a, pod, |p| p.host_pid.is_none());
    }

    /// Registers this process in the GPU's own ledger (the real process, holding its slot's
    /// lock), reads the registry, checks that `pod`'s ledger has a full registry of forged
    /// slots each as `forged` says, asks all of them to leave at an Overlimit, and checks that
    /// they took the eviction table but [`EVICT_RESERVED_FOR_FOUND`] entries and that the real
    /// process still got its request and its eviction-log record.
    fn forged_slots_leave_the_reserve(d: &tempfile::TempDir, a: &mut LedgerAdapter, pod: PodUid, forged: impl Fn(&OfflineProc) -> bool) {
        let mine = a.ledger.group(8, 1 << 30).unwrap();
        let _h = a.ledger.register(std::process::id(), mine).unwrap();
        let procs = a.offline(0).unwrap();
        let (in_pod, real): (Vec<&OfflineProc>, Vec<&OfflineProc>) = procs.iter().partition(|p| p.pod_ledger == Some(pod));
        assert_eq!((in_pod.len(), real.len()), (node_ledger::layout::MAX_PROCS, 1));
        assert!(in_pod.iter().all(|p| forged(p)), "{in_pod:?}");
        let written = in_pod.iter().filter(|p| a.mark_evicting(p, EvictReason::Overlimit, 0).is_ok()).count();
        assert_eq!(written, node_ledger::status::EVICT_ENTRIES - EVICT_RESERVED_FOR_FOUND);
        a.mark_evicting(real[0], EvictReason::Overlimit, 0).unwrap();
        let reader = Status::open(&node_ledger::config::status_path(d.path(), 0)).unwrap();
        let me = node_ledger::ProcId::own().unwrap();
        assert_eq!(reader.evict_request(me), libc::SIGTERM as u32, "the real process is asked");
        let log = std::fs::read_to_string(d.path().join("evict-log/gpu0.jsonl")).unwrap();
        assert!(log.contains(&format!("\"pid\":{}", std::process::id())), "{log}");
    }

    /// Slots naming pids no live process has, in this pid namespace (a tenant holds their
    /// locks and writes the host's pid namespace and pids past `pid_max` into them), get
    /// those pids as host pids, but their owners were not found holding their locks: they
    /// too take at most the eviction table's entries but [`EVICT_RESERVED_FOR_FOUND`], and a
    /// real process of another ledger still gets its request. Before, a host pid was taken
    /// for a found owner and the 256 slots filled the table.
    #[test]
    fn slots_naming_dead_pids_cannot_fill_the_eviction_table() {
        let (d, _path, mut a) = fresh_adapter();
        let pod = PodUid::parse("11111111-2222-4333-8444-555555555555").unwrap();
        let pl = Ledger::open_or_create(&node_ledger::pods::pod_ledger_path(d.path(), pod, 0), 0).unwrap();
        let g = pl.group(7, 1 << 30).unwrap();
        // This process holds every slot's lock, as the tenant's helper would.
        let held: Vec<_> = (0..node_ledger::layout::MAX_PROCS).map(|_| pl.register(std::process::id(), g).unwrap()).collect();
        for (i, p) in pl.layout().procs.iter().enumerate() {
            let o = p.owner.load(Acquire);
            p.owner.store(node_ledger::layout::owner_word(node_ledger::layout::owner_gen(o), 4_000_000_000 + i as u32), std::sync::atomic::Ordering::Release);
        }
        // A pid nobody has is its own host pid.
        forged_slots_leave_the_reserve(&d, &mut a, pod, |p| p.host_pid == Some(p.pid));
        drop(held);
    }

    /// A pod's ledger (`node_ledger::pods`) is read beside the GPU's own: its processes are
    /// judged, counted in the jobs table and asked to leave (naming the ledger's pod when their
    /// cgroup names none), and a pod ledger whose directory went is closed.
    #[test]
    fn pod_ledgers_are_read_beside_the_gpus_own() {
        let (d, _path, mut a) = fresh_adapter();
        let pod = PodUid::parse("11111111-2222-4333-8444-555555555555").unwrap();
        let pl = Ledger::open_or_create(&node_ledger::pods::pod_ledger_path(d.path(), pod, 0), 0).unwrap();
        // The pod's own group, as node-agent names it in the containers' XCUDA_GROUP.
        let group = node_ledger::ledger::group_id_for(&node_ledger::ledger::pod_group_name(&pod.to_string()));
        let g = pl.group(group, 1 << 30).unwrap();
        let h = pl.register(std::process::id(), g).unwrap();
        pl.try_reserve(h, 3 << 20).unwrap();
        let procs = a.offline(0).unwrap();
        assert_eq!(a.pod_ledgers(), 1);
        assert_eq!(procs.len(), 1, "{procs:?}");
        assert_eq!((procs[0].pod_ledger, procs[0].reported_bytes, procs[0].group_id), (Some(pod), 3 << 20, group));
        // A process of another group starting in the pod claimed its percentage, and the
        // tenant registered made-up groups at 100 % each: to the other pods, the pod is one
        // job still, at most the whole GPU (here uncapped: its first process has no
        // percentage).
        let starting = node_ledger::ledger::group_id_for("pod-x-next-job");
        let lock = pl.lock_claims(std::time::Duration::from_millis(100)).unwrap().unwrap();
        assert!(lock.record(starting, 15, 4242, 1, node_ledger::clock::now_ns(), 30_000_000_000));
        drop(lock);
        let made_up: Vec<_> = (0..4)
            .map(|i| {
                let g = pl.group(node_ledger::ledger::group_id_for(&format!("made-up-{i}")), 1 << 30).unwrap();
                pl.register_with_mps(std::process::id(), g, 100).unwrap()
            })
            .collect();
        a.publish(&Published { t_ms: 0, ..Default::default() }).unwrap();
        let reader = Status::open(&node_ledger::config::status_path(d.path(), 0)).unwrap();
        let table = reader.read_jobs().unwrap();
        assert_eq!(table.jobs, [node_ledger::OfflineJob { group_id: group, procs: 5, mps_pct: None }]);
        assert_eq!(table.for_running().len(), 1);
        for m in made_up {
            pl.unregister(m);
        }
        a.mark_evicting(&procs[0], EvictReason::Overlimit, 0).unwrap();
        let reqs = reader.evict_requests();
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0].id, node_ledger::ProcId::own().unwrap());
        if node_daemon::offline_pods::pod_of_live(std::process::id(), reqs[0].id.start_time).is_none() {
            assert_eq!(reqs[0].pod, Some(pod), "no pod in the cgroup path: the ledger's pod");
        }
        // The pod left: its directory is removed, the ledger closed at the next scan.
        pl.unregister(h);
        std::fs::remove_dir_all(node_ledger::pods::pod_dir(d.path(), pod)).unwrap();
        assert!(a.offline(POD_SCAN_EVERY_MS).unwrap().is_empty());
        assert_eq!(a.pod_ledgers(), 0);
        // A damaged pod ledger is refused, and said in the state file until it goes.
        let bad = PodUid::parse("11111111-2222-4333-8444-55555555555f").unwrap();
        let bad_path = node_ledger::pods::pod_ledger_path(d.path(), bad, 0);
        std::fs::create_dir_all(bad_path.parent().unwrap()).unwrap();
        std::fs::write(&bad_path, vec![0xffu8; 4096]).unwrap();
        a.offline(2 * POD_SCAN_EVERY_MS).unwrap();
        let refused = a.refused_pod_ledgers();
        assert_eq!(refused.keys().collect::<Vec<_>>(), [&bad.to_string()], "{refused:?}");
        std::fs::remove_dir_all(node_ledger::pods::pod_dir(d.path(), bad)).unwrap();
        a.offline(3 * POD_SCAN_EVERY_MS).unwrap();
        assert!(a.refused_pod_ledgers().is_empty());
    }

    /// A process of a pod ledger that dies (here: its description of the file closed, which
    /// releases its slot lock as a death does) has its quota given back at the next tick, not
    /// at the next scan of the pods directory: each open pod ledger is watched.
    #[test]
    fn a_dead_process_of_a_pod_ledger_is_reclaimed_at_the_next_tick() {
        let (d, _path, mut a) = fresh_adapter();
        let pod = PodUid::parse("11111111-2222-4333-8444-555555555556").unwrap();
        let pod_path = node_ledger::pods::pod_ledger_path(d.path(), pod, 0);
        let pl = Ledger::open_or_create(&pod_path, 0).unwrap();
        let g = pl.group(node_ledger::ledger::group_id_for("pod-y"), 1 << 30).unwrap();
        a.reclaim(0);
        assert_eq!(a.pod_ledgers(), 1);
        assert_eq!(a.pod_wds.len(), 1, "watched");
        // The process's own description of the file.
        let own = Ledger::open_existing(&pod_path).unwrap();
        let h = own.register(std::process::id(), g).unwrap();
        own.try_reserve(h, 5 << 20).unwrap();
        a.reclaim(1);
        assert_eq!(pl.group_used(g), 5 << 20, "alive: kept");
        drop(own);
        // Well before the next scan (250 ms): only the watch makes a reclaim due now.
        let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while pl.group_used(g) != 0 && std::time::Instant::now() < end {
            std::thread::sleep(std::time::Duration::from_millis(1));
            a.reclaim(2);
        }
        assert_eq!(pl.group_used(g), 0, "the dead process's quota is still held");
        assert!(pl.procs().is_empty());
        // Closed with the pod's directory: no longer watched.
        std::fs::remove_dir_all(node_ledger::pods::pod_dir(d.path(), pod)).unwrap();
        a.reclaim(POD_SCAN_EVERY_MS);
        assert_eq!((a.pod_ledgers(), a.pod_wds.len()), (0, 0));
    }

    /// A start claim recorded in a pod ledger is in the jobs table at the next tick's publish,
    /// not only at the table's next period (100 ms): the claim is announced and the pod
    /// ledger is watched.
    #[test]
    fn a_start_claim_in_a_pod_ledger_is_published_at_the_next_tick() {
        let (d, _path, mut a) = fresh_adapter();
        let pod = PodUid::parse("11111111-2222-4333-8444-555555555557").unwrap();
        let pl = Ledger::open_or_create(&node_ledger::pods::pod_ledger_path(d.path(), pod, 0), 0).unwrap();
        a.reclaim(0);
        a.publish(&Published { t_ms: 0, ..Default::default() }).unwrap();
        let reader = Status::open(&node_ledger::config::status_path(d.path(), 0)).unwrap();
        assert!(reader.read_jobs().unwrap().jobs.is_empty());
        let group = node_ledger::ledger::group_id_for("pod-z");
        let lock = pl.lock_claims(std::time::Duration::from_millis(100)).unwrap().unwrap();
        assert!(lock.record(group, 20, 4242, 1, node_ledger::clock::now_ns(), 30_000_000_000));
        drop(lock);
        // Ticks well before the table's period: only the announcement makes it due.
        let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut t = 1;
        let seen = loop {
            a.reclaim(t);
            a.publish(&Published { t_ms: t, ..Default::default() }).unwrap();
            let jobs = reader.read_jobs().unwrap().jobs;
            if !jobs.is_empty() || std::time::Instant::now() > end {
                break jobs;
            }
            t = (t + 1).min(JOBS_EVERY_MS - 1);
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        let pod_group = node_ledger::ledger::group_id_for(&node_ledger::ledger::pod_group_name(&pod.to_string()));
        assert_eq!(seen, [node_ledger::OfflineJob { group_id: pod_group, procs: 0, mps_pct: Some(20) }], "the pod's claim, as the pod's job");
    }

    /// The adapter reads the jobs' recorded percentages from the slots (a process being
    /// evicted no longer counts), not the budget once per job.
    #[test]
    fn the_adapter_sums_live_jobs_recorded_percentages() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("gpu0/ledger");
        let l = Ledger::open_or_create(&path, 0).unwrap();
        let status = node_ledger::config::status_path(d.path(), 0);
        Status::open_or_create(&status, 0).unwrap().publish_sm_budget(400);
        let (g1, g2) = (l.group(1, 1 << 30).unwrap(), l.group(2, 1 << 30).unwrap());
        let me = std::process::id();
        let (p1, p2, p3) = (Ledger::open_existing(&path).unwrap(), Ledger::open_existing(&path).unwrap(), Ledger::open_existing(&path).unwrap());
        let _h1 = p1.register_with_mps(me, g1, 25).unwrap();
        let _h1b = p3.register_with_mps(me, g1, 25).unwrap();
        // The second job is another process (requests name a process, not a slot), holding its
        // slot's lock as a shimmed process does.
        let mut child = workloads::host::spawn_holding(&path);
        let h2 = p2.register_with_mps(child.id(), g2, 15).unwrap();
        assert!(workloads::host::hold_slot_lock(child.id(), h2.slot));
        let mut a = LedgerAdapter::new(l, status.clone());
        a.publish(&Published::default()).unwrap();
        assert_eq!(a.offline_sm_cap_pct(), Some(40.0), "25 (one job, two processes) + 15");
        let job2 = a.ledger.procs().into_iter().find(|p| p.pid == child.id()).unwrap();
        Status::open_or_create(&status, 0).unwrap().request_evict(node_ledger::Requester::Manager, node_ledger::ProcId::of(&job2), None, libc::SIGTERM as u32);
        assert_eq!(a.offline_sm_cap_pct(), Some(25.0), "the job being evicted no longer counts");
        let of_job2 = |a: &mut LedgerAdapter| a.offline(0).unwrap().into_iter().find(|p| p.pid == child.id()).unwrap();
        let o = of_job2(&mut a);
        assert!(o.evict_requested_ms.is_some() && o.evict_by_manager, "the manager's request alone");
        Status::open_or_create(&status, 0).unwrap().request_evict(Requester::Monitor, node_ledger::ProcId::of(&job2), None, libc::SIGTERM as u32);
        let o = of_job2(&mut a);
        assert!(o.evict_requested_ms.is_some() && !o.evict_by_manager, "the monitor's too: its own grace");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Only slots whose owner holds their lock count toward the offline cap: a slot any ledger
    /// client wrote claiming 100 % (naming a process that holds no lock on it, or a copy of a
    /// found process's identity in another slot) raised the cap to the budget, so less of the
    /// reading was judged online and an online overload went unjudged.
    #[test]
    fn a_slot_whose_owner_holds_no_lock_adds_nothing_to_the_offline_cap() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("gpu0/ledger");
        let l = Ledger::open_or_create(&path, 0).unwrap();
        let status = node_ledger::config::status_path(d.path(), 0);
        Status::open_or_create(&status, 0).unwrap().publish_sm_budget(600);
        let (g1, g2, g3) = (l.group(1, 1 << 30).unwrap(), l.group(2, 1 << 30).unwrap(), l.group(3, 1 << 30).unwrap());
        let mut job = workloads::host::spawn_holding(&path);
        let h = l.register_with_mps(job.id(), g1, 20).unwrap();
        assert!(workloads::host::hold_slot_lock(job.id(), h.slot));
        let mut online = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let _forged = l.register_with_mps(online.id(), g2, 100).unwrap();
        // A copy of the genuine job's identity, under another group, claiming 100 %.
        let copy = l.register_with_mps(job.id(), g3, 100).unwrap();
        let mut a = LedgerAdapter::new(l, status);
        a.publish(&Published::default()).unwrap();
        let found: Vec<_> = a.offline(0).unwrap().into_iter().filter(|p| p.host_pid.is_some()).map(|p| p.slot).collect();
        assert_eq!(found, [h.slot], "only the genuine slot is found");
        assert_eq!(a.offline_sm_cap_pct(), Some(20.0), "the genuine job's 20 %, not the 60 % budget");
        assert!(copy.slot != h.slot);
        for c in [&mut job, &mut online] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A slot another ledger client wrote naming a daemon (mps-manager holds the GPU's
    /// ledger and every pod's open, and its pid and start time can be read or guessed): the
    /// monitor finds no host pid for it, so no eviction ever signals the daemon. The same
    /// process given the slot's lock, as a shimmed process holds its own, is found.
    #[test]
    fn a_forged_slot_naming_a_daemon_that_holds_the_ledger_open_gets_it_no_signal() {
        let (_d, path, mut a) = fresh_adapter();
        let mut daemon = workloads::host::spawn_holding(&path);
        let l = Ledger::open_existing(&path).unwrap();
        let g = l.group(node_ledger::ledger::group_id_for("forger"), 1 << 30).unwrap();
        let h = l.register(daemon.id(), g).unwrap();
        let p = a.offline(0).unwrap().into_iter().find(|p| p.pid == daemon.id()).unwrap();
        assert_eq!(p.host_pid, None, "a process holding the ledger open but no slot's lock is nobody's offline work");
        let mut fresh = LedgerAdapter::new(Ledger::open_existing(&path).unwrap(), node_ledger::config::status_path(_d.path(), 0));
        assert!(workloads::host::hold_slot_lock(daemon.id(), h.slot));
        let p = fresh.offline(0).unwrap().into_iter().find(|p| p.pid == daemon.id()).unwrap();
        assert_eq!(p.host_pid, Some(daemon.id()), "with its slot's lock it is the slot's owner");
        let _ = daemon.kill();
        let _ = daemon.wait();
    }

    /// A tenant's process registered under its neighbour pod's group (its slot is its own to
    /// write) and evicted: the request in the status file and the log record name the pod its
    /// cgroup path names, which node-agent evicts, not the neighbour its slot claims. A real
    /// process in a pod-shaped cgroup; needs root and a writable cgroup hierarchy (says so and
    /// passes vacuously otherwise).
    #[test]
    fn an_eviction_names_the_pod_of_the_processs_cgroup_not_the_group_its_slot_claims() {
        const TENANT: &str = "77777777-7777-4777-8777-777777777777";
        const NEIGHBOUR_GROUP: &str = "k8s-pod-88888888-8888-4888-8888-888888888888";
        let Some(cg) = workloads::host::PodCgroup::create_or_skip(TENANT) else { return };
        let (d, path, mut a) = fresh_adapter();
        let mut child = cg.spawn_ledger_holder(&path);
        let l = Ledger::open_existing(&path).unwrap();
        let g = l.group(node_ledger::ledger::group_id_for(NEIGHBOUR_GROUP), 1 << 30).unwrap();
        let h = l.register(child.id(), g).unwrap();
        assert!(workloads::host::hold_slot_lock(child.id(), h.slot));
        a.publish(&Published::default()).unwrap();
        let p = a.offline(0).unwrap().into_iter().find(|p| p.pid == child.id()).unwrap();
        assert_eq!(p.host_pid, Some(child.id()));
        let r = a.mark_evicting(&p, EvictReason::Overlimit, 0);
        let reqs = Status::open(&node_ledger::config::status_path(d.path(), 0)).unwrap().evict_requests();
        let logged = node_ledger::evictlog::read_from(d.path(), 0, None, 1 << 20).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        r.unwrap();
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0].pod, node_ledger::PodUid::parse(TENANT), "the cgroup's pod, in the request");
        let rec = logged.entries[0].record.as_ref().unwrap();
        assert_eq!(rec.pod_uid.as_deref(), Some(TENANT), "and in the log record");
        assert_eq!(rec.group_id, node_ledger::ledger::group_id_for(NEIGHBOUR_GROUP), "the slot's claim is kept beside it");
    }

    /// Follow-up 1: the request is addressed by pid namespace, pid and start time; a stale
    /// identity (the slot changed hands) is refused loudly and nobody gets a request.
    #[test]
    fn an_eviction_for_a_process_that_left_its_slot_reaches_nobody() {
        let d = tempfile::tempdir().unwrap();
        let l = Ledger::open_or_create(&d.path().join("gpu0/ledger"), 0).unwrap();
        let g = l.group(node_ledger::ledger::group_id_for("c1"), 1 << 30).unwrap();
        let h = l.register(std::process::id(), g).unwrap();
        let mut a = LedgerAdapter::new(l, node_ledger::config::status_path(d.path(), 0));
        a.publish(&Published::default()).unwrap();
        let mut stale = a.offline(0).unwrap()[0];
        stale.start_time += 1;
        assert!(a.mark_evicting(&stale, EvictReason::Overlimit, 0).is_err());
        let mut other = a.offline(0).unwrap()[0];
        other.pid += 1;
        assert!(a.mark_evicting(&other, EvictReason::Overlimit, 0).is_err());
        let r = Status::open(&node_ledger::config::status_path(d.path(), 0)).unwrap();
        assert!(r.evict_requests().is_empty(), "no request for another start time or pid");
        let _ = h;
    }

    /// Issue 8 obs. 6: the monitor itself gives back a dead process's quota (before, only a
    /// shim of the dead process's own pid namespace did), including one registered in a
    /// ledger that was deleted and restored while it ran.
    #[test]
    fn reclaims_dead_processes_also_through_a_restored_ledger() {
        let (_dir, path, mut a) = fresh_adapter();
        a.reclaim_every_ms = 0;
        a.reclaim_fallback_ms = 0;
        let g = a.ledger.group(7, 1 << 30).unwrap();
        // Two offline "processes": each its own open ledger (its own slot-lock description).
        let (p1, p2) = (Ledger::open_existing(&path).unwrap(), Ledger::open_existing(&path).unwrap());
        let h1 = p1.register(std::process::id(), g).unwrap();
        p1.try_reserve(h1, 100).unwrap();
        let h2 = p2.register(std::process::id(), g).unwrap();
        p2.try_reserve(h2, 20).unwrap();
        a.reclaim(0);
        assert_eq!(a.ledger.group_used(g), 120, "live processes keep their quota");
        drop(p1);
        a.reclaim(0);
        assert_eq!(a.ledger.group_used(g), 20, "a dead one's quota comes back on the next tick");

        std::fs::remove_file(&path).unwrap();
        assert!(a.check(0).is_none(), "deleted ledger restored");
        assert_eq!(a.ledger.group_used(g), 20);
        assert_eq!(a.previous.len(), 1, "the deleted file is kept open for its slot locks");
        a.reclaim(0);
        assert_eq!(a.ledger.group_used(g), 20, "p2 still alive in the deleted file");
        drop(p2);
        a.reclaim(0);
        assert_eq!(a.ledger.group_used(g), 0);
        assert!(a.previous.is_empty(), "nothing depends on the deleted file any more");
    }

    /// Rewrites occupied slot `slot` of `l` to name this process (its pid, start time and pid
    /// namespace) with liveness word `liveness`, as any ledger client can.
    fn forge_slot_naming_me(l: &Ledger, slot: usize, liveness: u64) {
        use std::sync::atomic::Ordering::Release;
        let p = &l.layout().procs[slot];
        let gen = node_ledger::layout::owner_gen(p.owner.load(Acquire));
        p.start_time.store(node_ledger::procinfo::own_start_time().unwrap(), Release);
        p.pid_ns.store(node_ledger::procinfo::own_pid_ns(), Release);
        p.liveness.store(liveness, Release);
        p.owner.store(node_ledger::layout::owner_word(gen, std::process::id()), Release);
    }

    /// A slot's liveness word names a deleted ledger only for the monitor that restored its
    /// copy from that ledger, and only at the slot's own range: this process, holding slot 0's
    /// lock in the deleted GPU ledger, is the restored slot 0's owner, but not that of a pod
    /// ledger's slot 0 whose word names the deleted file (a tenant's forgery: the pod ledger
    /// was never restored), nor of the copy's slot 1 naming it. Before, any word but lock or
    /// proxy named a deleted file, and the lock was looked for in its whole registry: both
    /// forgeries resolved to this process, and a forged group got it evicted.
    #[test]
    fn a_slot_names_a_deleted_ledger_only_as_its_restore_left_it() {
        let (d, path, mut a) = fresh_adapter();
        let g = a.ledger.group(7, 1 << 30).unwrap();
        let holder = Ledger::open_existing(&path).unwrap();
        let h = holder.register(std::process::id(), g).unwrap();
        assert_eq!(h.slot, 0);
        let deleted = a.ledger.inode().unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(a.check(0).is_none(), "deleted ledger restored");
        let pod = PodUid::parse("11111111-2222-4333-8444-555555555555").unwrap();
        let pl = Ledger::open_or_create(&node_ledger::pods::pod_ledger_path(d.path(), pod, 0), 0).unwrap();
        let mut stand_in = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let forged = pl.register(stand_in.id(), pl.group(8, 1 << 30).unwrap()).unwrap();
        assert_eq!(forged.slot, 0);
        forge_slot_naming_me(&pl, 0, deleted);
        let copied = a.ledger.register(stand_in.id(), g).unwrap();
        assert_eq!(copied.slot, 1);
        forge_slot_naming_me(&a.ledger, 1, deleted);
        let procs = a.offline(0).unwrap();
        let _ = stand_in.kill();
        let _ = stand_in.wait();
        let host = |pod_ledger: Option<PodUid>, slot: usize| procs.iter().find(|p| (p.pod_ledger, p.slot) == (pod_ledger, slot)).unwrap().host_pid;
        assert_eq!(host(None, 0), Some(std::process::id()), "the restored slot: its lock is in the deleted file");
        assert_eq!(host(Some(pod), 0), None, "a pod ledger's word naming the deleted file");
        assert_eq!(host(None, 1), None, "another slot of the copy: its owner's lock would be at its own range");
        drop(holder);
    }

    /// A GPU ledger damaged under the monitor (a wrong magic, a truncation: any local user may
    /// write the shared file) keeps its registered processes as last read: each is still listed
    /// with its host pid, so evicted at an Overlimit, while it lives holding its slot's lock; a
    /// dead one leaves the list; one not found this round stays listed (the file is never read
    /// again: dropped, it would be gone for good). Before, a damaged ledger listed nobody: eviction reached none
    /// of its processes until the monitor restarted, and their load counted as online.
    #[test]
    fn a_damaged_gpu_ledgers_processes_stay_offline_work_while_they_live() {
        for truncate in [false, true] {
            let (_d, path, mut a) = fresh_adapter();
            let mut child = workloads::host::spawn_holding(&path);
            let l = Ledger::open_existing(&path).unwrap();
            let g = l.group(7, 1 << 30).unwrap();
            let h = l.register(child.id(), g).unwrap();
            assert!(workloads::host::hold_slot_lock(child.id(), h.slot));
            let _mine = l.register(std::process::id(), g).unwrap();
            let me = std::process::id();
            // A live process whose owner is not found this round (it holds no lock yet: its
            // lookup backs off): kept while the ledger is damaged, not dropped for good.
            let mut unproven = workloads::host::spawn_holding(&path);
            l.register(unproven.id(), g).unwrap();
            let hosts = |a: &mut LedgerAdapter| {
                let mut v: Vec<_> = a.offline(0).unwrap().into_iter().map(|p| p.host_pid).collect();
                v.sort();
                v
            };
            let mut both = vec![Some(child.id()), Some(me), None];
            both.sort();
            assert_eq!(hosts(&mut a), both);
            if truncate {
                std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(0).unwrap();
            } else {
                a.ledger.layout().header.magic.store(0, std::sync::atomic::Ordering::Release);
            }
            assert!(a.check(FULL_CHECK_EVERY_MS).is_some(), "damage found");
            assert_eq!(hosts(&mut a), both, "still offline work (truncated: {truncate})");
            let _ = child.kill();
            let _ = child.wait();
            assert_eq!(hosts(&mut a), vec![None, Some(me)], "a dead one leaves the list (truncated: {truncate})");
            let _ = unproven.kill();
            let _ = unproven.wait();
        }
    }

    /// A deleted or truncated ledger is still found at the next check, though quiet checks
    /// no longer `fstat` the file (its inotify watch tells of the change).
    #[test]
    fn deletion_and_truncation_are_found_at_the_next_check_without_a_stat_per_tick() {
        let (_dir, path, mut a) = fresh_adapter();
        assert!(a.watch.is_some(), "the ledger is watched");
        a.full_check_every_ms = u64::MAX / 2;
        assert!(a.check(0).is_none());
        let before = a.full_checks;
        for _ in 0..100 {
            assert!(a.check(0).is_none());
        }
        // Another test's watched ledger may change meanwhile (one full check each time).
        assert!(a.full_checks - before <= 5, "{} full checks in 100 quiet ones", a.full_checks - before);
        // The periodic check is off: only the watch can tell. The signal may be taken by
        // another thread a moment after the syscall returns.
        let until = |a: &mut LedgerAdapter, what: &str, ok: &dyn Fn(&mut LedgerAdapter) -> bool| {
            let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while !ok(a) {
                assert!(std::time::Instant::now() < end, "{what} not found");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        };
        std::fs::remove_file(&path).unwrap();
        until(&mut a, "deletion", &|a| a.check(0).is_none() && !a.previous.is_empty());
        assert!(path.exists(), "restored");
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(0).unwrap();
        until(&mut a, "truncation", &|a| a.check(0).is_some());
        assert!(a.check(0).unwrap().contains("total_size"), "{:?}", a.check(0));
    }

    /// A registration whose liveness no close reports (a proxy) keeps the scan on the
    /// `RECLAIM_EVERY_MS` grid, as does a ledger without a watch; without one the fallback.
    #[test]
    fn proxies_and_an_unwatched_ledger_are_polled_on_the_reclaim_grid() {
        let (_dir, _, mut a) = fresh_adapter();
        let g = a.ledger.group(7, 1 << 30).unwrap();
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let proxy = a.ledger.register(child.id(), g).unwrap();
        a.ledger.try_reserve(proxy, 100).unwrap();
        a.reclaim(3);
        assert!(a.reclaim_polls, "a proxy registration is polled");
        assert_eq!(a.next_reclaim_ms, RECLAIM_EVERY_MS);
        child.kill().unwrap();
        child.wait().unwrap();
        a.reclaim(RECLAIM_EVERY_MS + 3);
        assert_eq!(a.ledger.group_used(g), 0, "the dead proxy's quota is back at the grid point");
        assert!(!a.reclaim_polls);
        assert_eq!(a.next_reclaim_ms, next_on_grid(RECLAIM_EVERY_MS + 3, RECLAIM_FALLBACK_MS));
        a.watch = None;
        a.reclaim(RECLAIM_FALLBACK_MS);
        assert_eq!(a.next_reclaim_ms, RECLAIM_FALLBACK_MS + RECLAIM_EVERY_MS, "no watch: polled");
    }

    #[test]
    fn periodic_jobs_fall_on_one_grid() {
        assert_eq!(next_on_grid(0, 50), 50);
        assert_eq!(next_on_grid(49, 50), 50);
        assert_eq!(next_on_grid(50, 50), 100);
        assert_eq!(next_on_grid(103, 100), 200);
        assert_eq!(next_on_grid(7, 0), 7, "period 0: every tick");
        assert_eq!(next_on_grid(u64::MAX - 1, 100), u64::MAX, "saturates");
        // Ticks 10 ms apart, one of them late: jobs of 50, 100 and 200 ms still meet in the
        // same ticks (every 200 ms all three, every 100 ms two of them).
        let (mut n50, mut n100, mut n200) = (0, 0, 0);
        let mut both = Vec::new();
        for t in (0..1000u64).map(|i| i * 10 + u64::from(i == 37) * 4) {
            let (a, b, c) = (t >= n50, t >= n100, t >= n200);
            if a {
                n50 = next_on_grid(t, 50);
            }
            if b {
                n100 = next_on_grid(t, 100);
                assert!(a, "the 100 ms job at {t} ms runs with the 50 ms one");
                both.push(t);
            }
            if c {
                n200 = next_on_grid(t, 200);
                assert!(a && b, "the 200 ms job at {t} ms runs with the others");
            }
        }
        assert_eq!(both.len(), 100);
    }

    /// The per-tick check reads only the header's cache line; the registry's own check (a
    /// pass over all 256 slots) comes with the full check, every `FULL_CHECK_EVERY_MS`: damage
    /// in a slot written through the mapping (no inotify event) is still found within that.
    #[test]
    fn registry_damage_is_found_within_the_full_check_period() {
        let (_dir, path, mut a) = fresh_adapter();
        assert!(a.watch.is_some(), "the ledger is watched");
        assert!(a.check(0).is_none());
        let p = Ledger::open_existing(&path).unwrap();
        let g = p.group(7, 1 << 30).unwrap();
        let _registered = p.register(std::process::id(), g).unwrap();
        let slot = p.procs()[0].slot;
        p.layout().procs[slot]
            .group_slot
            .store(node_ledger::layout::MAX_GROUPS as u32 + 5, std::sync::atomic::Ordering::Relaxed);
        let mut t = 0;
        loop {
            t += 10;
            assert!(t <= FULL_CHECK_EVERY_MS, "registry damage not found by {t} ms");
            let before = a.full_checks;
            let found = a.check(t).map(str::to_owned);
            if a.full_checks == before {
                // Another test's watched file may trigger a full check; a quiet one reads the
                // header only.
                assert_eq!(found, None, "a quiet check at {t} ms passes over the registry");
            } else if let Some(e) = found {
                assert!(e.contains("group_slot"), "{e}");
                break;
            }
        }
    }
}
