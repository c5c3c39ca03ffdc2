//! Evicts offline processes: SIGTERM (or an operator command), then SIGKILL after a grace
//! period; always by pid + start time, never an online process, never twice.

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};

use node_ledger::procinfo;
use serde::{Deserialize, Serialize};

/// How offline processes are evicted (`evictor` in sysmonitor's config).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvictorConfig {
    /// Time between SIGTERM and SIGKILL, ms.
    pub grace_ms: u64,
    /// Run this command instead of signalling (argv; `{pid}` (the process's pid in the
    /// daemon's namespace), `{start_time}` (its start time, clock ticks since boot, as
    /// `/proc/<pid>/stat` field 22 gives it), `{reason}`, `{gpu}` substituted). It runs only
    /// for a process whose pid here is known and checked against its start time at that
    /// moment; one without (another pid namespace not found from here, or gone) is asked
    /// through its ledger only, and the command runs once its pid here is found.
    pub command: Option<Vec<String>>,
    /// Only print what would be evicted.
    pub dry_run: bool,
}

/// The placeholders [`EvictorConfig::command`] substitutes.
pub const COMMAND_PLACEHOLDERS: [&str; 4] = ["{pid}", "{start_time}", "{reason}", "{gpu}"];

impl EvictorConfig {
    /// Checks [`EvictorConfig::command`]: a program, `{pid}` passed somewhere (the command
    /// must know which process to end), and no other `{word}` than the placeholders in an
    /// argument of its own (a misspelt `{starttime}` or `--pod={pod}` would reach the command
    /// literally). A script (an argument with spaces: `sh -c "... | awk '{print}'"`) and braces
    /// around anything but a bare word (`${VAR}`) are left alone. Returns what is wrong.
    pub fn check_command(&self) -> Result<(), String> {
        let Some(c) = &self.command else { return Ok(()) };
        if c.first().is_none_or(|p| p.is_empty()) {
            return Err("must name a program (or be null for signals)".into());
        }
        for a in c.iter().filter(|a| !a.contains(char::is_whitespace)) {
            let mut rest = a.as_str();
            while let Some(i) = rest.find('{') {
                let after = &rest[i + 1..];
                let word = after.split('}').next().filter(|w| after.len() > w.len());
                let bare = word.filter(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
                let dollar = rest[..i].ends_with('$');
                if let (Some(w), false) = (bare, dollar) {
                    let token = format!("{{{w}}}");
                    if !COMMAND_PLACEHOLDERS.contains(&token.as_str()) {
                        return Err(format!(
                            "unknown placeholder {token} in {a:?} (known: {})",
                            COMMAND_PLACEHOLDERS.join(" ")
                        ));
                    }
                }
                rest = after;
            }
        }
        if !c.iter().any(|a| a.contains("{pid}")) {
            return Err("never passes {pid}: the command would not know which process to end (pass {pid} and {start_time}, which lets it check that the pid is still that process)".into());
        }
        Ok(())
    }
}

impl Default for EvictorConfig {
    fn default() -> Self {
        EvictorConfig {
            grace_ms: 10_000,
            command: None,
            dry_run: false,
        }
    }
}

/// [`OfflineProc::slot`] of offline work with no registration: a GPU process in an offline
/// container's pid namespace that runs without the shim.
pub const NO_SLOT: usize = usize::MAX;

/// [`OfflineProc::key`]: (ledger, slot, pid, start time).
pub type ProcKey = (Option<node_ledger::PodUid>, usize, u32, u64);

/// An offline process registered by the shim, identified by pid + start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OfflineProc {
    /// Registry slot in its ledger ([`NO_SLOT`]: none, evicted by its host pid only).
    pub slot: usize,
    /// Its ledger: the pod ledger of this pod (`node_ledger::pods`), `None` for the GPU's own.
    pub pod_ledger: Option<node_ledger::PodUid>,
    /// Process id (in the pid namespace it registered from).
    pub pid: u32,
    /// Inode of the pid namespace it registered from (0: unknown).
    pub pid_ns: u64,
    /// Its pid in this daemon's pid namespace, what NVML and `/proc` here name it: `pid` when
    /// it registered from this namespace, else the one found for it
    /// ([`crate::procns::HostPids`]). `None` while not found, or found holding no ledger
    /// open (a slot naming a process that is no ledger client): it is then asked to exit
    /// through the ledger only (a shim acts on the request), never signalled.
    pub host_pid: Option<u32>,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
    /// GPU memory the process says it holds, bytes.
    pub reported_bytes: u64,
    /// The quota group its ledger slot names (the process's own word: its environment's
    /// `XCUDA_GROUP`); 0 with no slot.
    pub group_id: u64,
    /// Monotonic ms at which an eviction was requested, if one was (survives monitor restarts).
    pub evict_requested_ms: Option<u64>,
    /// The request in [`OfflineProc::evict_requested_ms`] is mps-manager's alone (this monitor
    /// made none): the manager escalates it itself after its own grace, so it is adopted with
    /// a grace of at least [`node_ledger::MANAGER_MAX_EVICT_GRACE_MS`] (a backstop for a dead
    /// manager, never quicker than a live one).
    pub evict_by_manager: bool,
}

impl OfflineProc {
    /// The grace an adopted request of this process gets before SIGKILL: the monitor's own
    /// (`cfg.grace_ms`), or for a request that is mps-manager's alone at least
    /// [`node_ledger::MANAGER_MAX_EVICT_GRACE_MS`], the longest the manager may give.
    pub fn adopted_grace_ms(&self, cfg: &EvictorConfig) -> u64 {
        if self.evict_by_manager {
            cfg.grace_ms.max(node_ledger::MANAGER_MAX_EVICT_GRACE_MS)
        } else {
            cfg.grace_ms
        }
    }

    /// The identity evictions are keyed by: ledger, slot, pid and start time. The ledger and
    /// slot tell apart processes of two pid namespaces that share a pid and a start time (two
    /// containers' entrypoints, pid 1 each, started in the same clock tick, each in slot 0 of
    /// its pod's ledger); signals are checked by pid + start time.
    pub fn key(&self) -> ProcKey {
        (self.pod_ledger, self.slot, self.pid, self.start_time)
    }
}

/// Why a process was evicted (also the Prometheus label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EvictReason {
    /// The GPU went Overlimit.
    Overlimit,
    /// The GPU went Disabled.
    Disabled,
    /// The host ran short of memory.
    HostMemory,
    /// The process reported less GPU memory than NVML sees it use.
    UnderReport,
    /// Its pod's processes hold more GPU memory, as NVML measures it, than the pod's plan gives
    /// it (node-agent's offline pod list), whatever quota their environment or group claims.
    OverQuota,
    /// A process of a planned pod registered under another quota group than its pod's (its
    /// allocations were charged to another pod's quota).
    ForeignGroup,
}

impl EvictReason {
    /// Every reason, in label order.
    pub const ALL: [EvictReason; 6] = [
        EvictReason::Overlimit,
        EvictReason::Disabled,
        EvictReason::HostMemory,
        EvictReason::UnderReport,
        EvictReason::OverQuota,
        EvictReason::ForeignGroup,
    ];

    /// The snake_case label.
    pub fn as_str(self) -> &'static str {
        match self {
            EvictReason::Overlimit => "overlimit",
            EvictReason::Disabled => "disabled",
            EvictReason::HostMemory => "host_memory",
            EvictReason::UnderReport => "under_report",
            EvictReason::OverQuota => "over_quota",
            EvictReason::ForeignGroup => "foreign_group",
        }
    }

    /// The code stored in a ledger slot (0 means none).
    pub fn code(self) -> u32 {
        self as u32 + 1
    }
}

/// How a signal reaches a process; real syscalls in production, recorded in tests.
pub trait Signaller {
    /// Sends `sig` to `pid` only if it is still the process that started at `start`.
    fn signal(&mut self, pid: u32, start: u64, sig: i32) -> Result<bool, String>;
    /// Whether `pid` is alive (not a zombie) and still the process that started at `start`.
    fn alive(&mut self, pid: u32, start: u64) -> bool;
    /// Whether the process is known to be gone: not [`Signaller::alive`], and not merely
    /// unknown (a `/proc` read failing for want of descriptors). A pending eviction ends only
    /// on this.
    fn gone(&mut self, pid: u32, start: u64) -> bool {
        !self.alive(pid, start)
    }
}

/// Signals through a pidfd, so a recycled pid can never be hit.
pub struct PidfdSignaller;

impl Signaller for PidfdSignaller {
    fn signal(&mut self, pid: u32, start: u64, sig: i32) -> Result<bool, String> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) } as i32;
        if fd < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ESRCH) {
                return Ok(false);
            }
            // Out of descriptors or memory: nothing is known of the pid; no plain kill(2)
            // (its check could not be made either). The caller tries again.
            if err.raw_os_error() != Some(libc::ENOSYS) {
                return Err(format!("pidfd_open({pid}): {err}"));
            }
            // Kernels without pidfd: check then kill (small reuse window remains).
            match procinfo::liveness(pid, start) {
                procinfo::Liveness::Alive => {}
                procinfo::Liveness::Gone => return Ok(false),
                procinfo::Liveness::Unknown => return Err(format!("/proc/{pid}/stat unreadable: not signalled")),
            }
            // SAFETY: plain kill(2) on a pid we just verified.
            let r = unsafe { libc::kill(pid as libc::pid_t, sig) };
            return if r == 0 {
                Ok(true)
            } else {
                Err(format!(
                    "kill({pid}, {sig}): {}",
                    std::io::Error::last_os_error()
                ))
            };
        }
        // The fd pins the process: once open, the start time check cannot race with reuse. A
        // `/proc` that cannot be read says nothing of it: an error, tried again by the caller
        // (Ok(false) would read as gone and the SIGKILL would never be sent).
        let res = match procinfo::liveness(pid, start) {
            procinfo::Liveness::Gone => Ok(false),
            procinfo::Liveness::Unknown => Err(format!("/proc/{pid}/stat unreadable: not signalled")),
            procinfo::Liveness::Alive => {
                // SAFETY: fd is the pidfd opened above; null siginfo and zero flags as documented.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_pidfd_send_signal,
                        fd,
                        sig,
                        std::ptr::null::<libc::siginfo_t>(),
                        0,
                    )
                };
                if r == 0 {
                    Ok(true)
                } else {
                    let err = std::io::Error::last_os_error();
                    if err.raw_os_error() == Some(libc::ESRCH) {
                        Ok(false)
                    } else {
                        Err(format!("pidfd_send_signal({pid}, {sig}): {err}"))
                    }
                }
            }
        };
        // SAFETY: closing the fd we own.
        unsafe { libc::close(fd) };
        res
    }

    fn alive(&mut self, pid: u32, start: u64) -> bool {
        procinfo::is_alive(pid, start)
    }

    fn gone(&mut self, pid: u32, start: u64) -> bool {
        procinfo::liveness(pid, start) == procinfo::Liveness::Gone
    }
}

#[derive(Debug)]
struct Pending {
    proc_: OfflineProc,
    reason: EvictReason,
    /// Monotonic ms the request was made (the grace runs from here).
    requested_ms: u64,
    kill_at_ms: u64,
    killed: bool,
    /// A failed SIGKILL was logged (at ERROR): the next failures of this eviction are logged
    /// at DEBUG, not at every tick; a success says it ended.
    kill_failed_said: bool,
    /// Started in a dry run: logged only, no request recorded, nothing sent. Never escalated
    /// to SIGKILL; dropped once the dry run ends ([`Evictor::tick`]), so that an eviction
    /// still called for then starts as every eviction does, with SIGTERM.
    dry: bool,
}

/// One eviction event, for logs and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// SIGTERM sent (or, for another pid namespace, the ledger request made).
    Term {
        /// Process evicted.
        pid: u32,
        /// Why.
        reason: EvictReason,
    },
    /// The operator's eviction command started.
    Command {
        /// Process evicted.
        pid: u32,
        /// Why.
        reason: EvictReason,
    },
    /// SIGKILL sent after the grace period.
    Kill {
        /// Process killed.
        pid: u32,
        /// Why it was evicted.
        reason: EvictReason,
    },
    /// A request found in the ledger from an earlier monitor run was resumed, not repeated.
    Resumed {
        /// Process whose eviction was resumed.
        pid: u32,
    },
    /// An evicted process is gone; its eviction is over.
    Gone {
        /// Process that exited.
        pid: u32,
    },
}

/// Tracks evictions in flight and counts them by reason.
pub struct Evictor<S: Signaller> {
    sig: S,
    pending: HashMap<ProcKey, Pending>,
    counts: BTreeMap<EvictReason, u64>,
    kills: u64,
    commands: Vec<Child>,
    gpu: u32,
}

impl<S: Signaller> Evictor<S> {
    /// An evictor signalling through `sig` for GPU `gpu` (substituted for `{gpu}` in commands).
    pub fn new(sig: S, gpu: u32) -> Self {
        Evictor {
            sig,
            pending: HashMap::new(),
            counts: BTreeMap::new(),
            kills: 0,
            commands: Vec::new(),
            gpu,
        }
    }

    /// Evictions started, by reason.
    pub fn counts(&self) -> &BTreeMap<EvictReason, u64> {
        &self.counts
    }

    /// The signaller (tests inspect what was sent).
    pub fn signaller(&self) -> &S {
        &self.sig
    }

    /// Evictions that needed SIGKILL.
    pub fn kills(&self) -> u64 {
        self.kills
    }

    /// Evictions waiting for their process to exit.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// The evictions in flight: the process, the monotonic ms its request was made (for the
    /// state file, from which a restarted monitor finishes their grace periods) and the one
    /// at which it is SIGKILLed if it still runs (`None` when no SIGKILL will come: another pid
    /// namespace, or already sent).
    pub fn pending(&self) -> impl Iterator<Item = (&OfflineProc, u64, Option<u64>)> + '_ {
        self.pending.values().map(|p| {
            let kill = (p.proc_.host_pid.is_some() && !p.killed).then_some(p.kill_at_ms);
            (&p.proc_, p.requested_ms, kill)
        })
    }

    /// Whether an eviction of `p` (by pid + start time) is in flight.
    pub fn is_pending(&self, p: &OfflineProc) -> bool {
        self.pending.contains_key(&p.key())
    }

    /// Adopts eviction requests recorded in the ledger by an earlier run: their grace period
    /// continues from the recorded time and no second SIGTERM is sent.
    /// A request that is mps-manager's alone ([`OfflineProc::evict_by_manager`]) gets
    /// [`OfflineProc::adopted_grace_ms`].
    pub fn adopt(&mut self, cfg: &EvictorConfig, procs: &[OfflineProc], out: &mut Vec<Event>) {
        for p in procs {
            if let Some(t) = p.evict_requested_ms {
                if self.pending.contains_key(&p.key()) {
                    continue;
                }
                self.pending.insert(
                    p.key(),
                    Pending {
                        proc_: *p,
                        reason: EvictReason::Overlimit,
                        requested_ms: t,
                        kill_at_ms: t.saturating_add(p.adopted_grace_ms(cfg)),
                        killed: false,
                        kill_failed_said: false,
                        dry: false,
                    },
                );
                out.push(Event::Resumed { pid: p.pid });
            }
        }
    }

    /// Takes on, while running, the eviction requests in the status file that no eviction in
    /// flight here stands for (`procs` with [`OfflineProc::evict_requested_ms`] set: mps-manager
    /// asked them to leave, or a request outlived the eviction that made it): as
    /// [`Evictor::adopt`] does at start-up, with the grace counted from the request's time,
    /// which is when it was first seen, and no second SIGTERM. Without it a process that
    /// ignored the manager's SIGTERM was never SIGKILLed once the manager was gone: every
    /// later eviction refuses a process that has a request. A process whose pid here is known
    /// and no longer alive is left alone (its registration is about to go). Returns the
    /// processes taken on.
    pub fn adopt_requests(&mut self, cfg: &EvictorConfig, procs: &[OfflineProc], out: &mut Vec<Event>) -> Vec<OfflineProc> {
        let new: Vec<OfflineProc> = procs
            .iter()
            .filter(|p| p.evict_requested_ms.is_some() && !self.pending.contains_key(&p.key()))
            .filter(|p| p.host_pid.is_none_or(|h| self.sig.alive(h, p.start_time)))
            .copied()
            .collect();
        self.adopt(cfg, &new, out);
        new
    }

    /// Starts evicting `p` unless an eviction is already in flight. Returns true if started.
    pub fn evict(
        &mut self,
        cfg: &EvictorConfig,
        now_ms: u64,
        p: &OfflineProc,
        reason: EvictReason,
        why: &str,
        out: &mut Vec<Event>,
    ) -> bool {
        self.evict_recorded(cfg, now_ms, p, reason, why, out, || {})
    }

    /// [`Evictor::evict`], calling `record` once the eviction is started and before anything
    /// reaches the process (never in a dry run): the monitor writes its durable request there
    /// (the ledger slot, which the shim in the process also acts on, and the eviction log), so
    /// that a monitor killed in between leaves a request its successor resumes, never a
    /// SIGTERM it knows nothing of and sends again.
    #[allow(clippy::too_many_arguments)]
    pub fn evict_recorded(
        &mut self,
        cfg: &EvictorConfig,
        now_ms: u64,
        p: &OfflineProc,
        reason: EvictReason,
        why: &str,
        out: &mut Vec<Event>,
        record: impl FnOnce(),
    ) -> bool {
        if let Some(e) = self.pending.get_mut(&p.key()) {
            // In flight already, e.g. mps-manager's request taken on with the manager's longest
            // grace ([`OfflineProc::adopted_grace_ms`]): this eviction is the monitor's own, and
            // its process is SIGKILLed no later than the monitor's grace from now (no second
            // SIGTERM: one was sent). Its request is recorded as the monitor's, so that a
            // restarted monitor also gives it the monitor's grace.
            let by = now_ms.saturating_add(cfg.grace_ms);
            if e.dry || e.killed || cfg.dry_run || e.kill_at_ms <= by {
                return false;
            }
            tracing::warn!(
                pid = p.pid,
                reason = reason.as_str(),
                why,
                grace_ms = cfg.grace_ms,
                was_due_in_ms = e.kill_at_ms.saturating_sub(now_ms),
                "evicting offline process already asked to leave: SIGKILL after the monitor's grace if it stays"
            );
            (e.reason, e.requested_ms, e.kill_at_ms) = (reason, now_ms, by);
            *self.counts.entry(reason).or_default() += 1;
            record();
            return true;
        }
        if p.evict_requested_ms.is_some() {
            return false;
        }
        if p.host_pid.is_some_and(|h| h <= 1 || h == std::process::id()) {
            tracing::error!(
                pid = p.pid,
                host_pid = p.host_pid,
                "refusing to evict a system or own pid found in the ledger"
            );
            return false;
        }
        *self.counts.entry(reason).or_default() += 1;
        self.pending.insert(
            p.key(),
            Pending {
                proc_: *p,
                reason,
                requested_ms: now_ms,
                kill_at_ms: now_ms.saturating_add(cfg.grace_ms),
                killed: false,
                kill_failed_said: false,
                dry: cfg.dry_run,
            },
        );
        if cfg.dry_run {
            tracing::warn!(
                pid = p.pid,
                reason = reason.as_str(),
                why,
                "dry run: would evict"
            );
            return true;
        }
        record();
        match &cfg.command {
            Some(argv) => {
                if self.run_command(argv, p, reason, why) {
                    out.push(Event::Command { pid: p.pid, reason });
                } else {
                    out.push(Event::Term { pid: p.pid, reason });
                }
            }
            None => {
                let Some(host) = p.host_pid else {
                    tracing::warn!(
                        pid = p.pid,
                        reason = reason.as_str(),
                        why,
                        "evicting offline process of another pid namespace not found from here (ledger request only)"
                    );
                    out.push(Event::Term { pid: p.pid, reason });
                    return true;
                };
                match self.sig.signal(host, p.start_time, libc::SIGTERM) {
                    Ok(true) => {}
                    Ok(false) => tracing::info!(pid = p.pid, host_pid = host, "offline process already gone"),
                    Err(err) => tracing::error!(pid = p.pid, host_pid = host, error = %err, "SIGTERM failed"),
                }
                tracing::warn!(
                    pid = p.pid,
                    host_pid = host,
                    start_time = p.start_time,
                    reason = reason.as_str(),
                    why,
                    grace_ms = cfg.grace_ms,
                    "evicting offline process (SIGTERM)"
                );
                out.push(Event::Term { pid: p.pid, reason });
            }
        }
        true
    }

    /// Runs the operator's eviction command for `p`, only with a verified pid here: its host
    /// pid, still the process that started at its start time. A ledger pid never reaches the
    /// command (any ledger client can write a slot, and a pid of another namespace names
    /// another process here), nor a pid whose process is gone (it may be reused). Returns
    /// whether the command was started.
    fn run_command(&mut self, argv: &[String], p: &OfflineProc, reason: EvictReason, why: &str) -> bool {
        let Some(host) = p.host_pid.filter(|&h| h > 1 && h != std::process::id() && self.sig.alive(h, p.start_time)) else {
            tracing::warn!(
                pid = p.pid,
                host_pid = p.host_pid,
                start_time = p.start_time,
                reason = reason.as_str(),
                why,
                "eviction command NOT run: no pid here verified by its start time for this process \
                 (another pid namespace not found from here, or gone); asked through its ledger only, \
                 the command runs once its pid here is found"
            );
            return false;
        };
        let sub = |a: &String| {
            a.replace("{pid}", &host.to_string())
                .replace("{start_time}", &p.start_time.to_string())
                .replace("{reason}", reason.as_str())
                .replace("{gpu}", &self.gpu.to_string())
        };
        let args: Vec<String> = argv.iter().map(sub).collect();
        match Command::new(&args[0]).args(&args[1..]).stdin(Stdio::null()).spawn() {
            Ok(c) => self.commands.push(c),
            Err(err) => {
                tracing::error!(pid = p.pid, command = %args[0], error = %err, "eviction command failed to start; SIGKILL follows after grace")
            }
        }
        tracing::warn!(pid = p.pid, host_pid = host, start_time = p.start_time, reason = reason.as_str(), why, command = ?args, "evicting offline process (command)");
        true
    }

    /// Brings the evictions in flight up to date with the registrations of the moment
    /// (`procs`: every registered offline process, as the last read of the ledgers gave them).
    ///
    /// - An eviction of a process no pid here was known for ([`OfflineProc::host_pid`]
    ///   `None`: asked through its ledger only) is over once its registration is gone: it
    ///   left, or it died and its slot was reclaimed. [`Evictor::tick`] cannot see that (it
    ///   has no pid to look at), and an entry left behind would count in flight for ever.
    /// - One whose pid here has been found since is signalled now (SIGTERM, or the operator's
    ///   command, with that pid; nothing in a dry run), its grace counted from now: without it
    ///   the process could only ever be asked through its ledger.
    pub fn retain_registered(&mut self, cfg: &EvictorConfig, now_ms: u64, procs: &[OfflineProc], out: &mut Vec<Event>) {
        let mut gone = Vec::new();
        let mut commands = Vec::new();
        for (k, p) in self.pending.iter_mut() {
            if p.proc_.host_pid.is_some() {
                continue;
            }
            let Some(now) = procs.iter().find(|q| q.key() == *k) else {
                gone.push(*k);
                continue;
            };
            let Some(host) = now.host_pid else { continue };
            p.proc_.host_pid = Some(host);
            if p.dry || cfg.dry_run {
                continue;
            }
            p.kill_at_ms = now_ms.saturating_add(cfg.grace_ms);
            if let Some(argv) = &cfg.command {
                commands.push((*k, argv.clone()));
                continue;
            }
            match self.sig.signal(host, p.proc_.start_time, libc::SIGTERM) {
                Ok(true) => {}
                Ok(false) => tracing::info!(pid = p.proc_.pid, host_pid = host, "offline process already gone"),
                Err(err) => tracing::error!(pid = p.proc_.pid, host_pid = host, error = %err, "SIGTERM failed"),
            }
            tracing::warn!(
                pid = p.proc_.pid,
                host_pid = host,
                start_time = p.proc_.start_time,
                reason = p.reason.as_str(),
                grace_ms = cfg.grace_ms,
                "evicting offline process (SIGTERM): its pid here is found now (it was asked through its ledger only)"
            );
            out.push(Event::Term { pid: p.proc_.pid, reason: p.reason });
        }
        for (k, argv) in commands {
            let (p, reason) = (self.pending[&k].proc_, self.pending[&k].reason);
            if self.run_command(&argv, &p, reason, "its pid here is found now (it was asked through its ledger only)") {
                out.push(Event::Command { pid: p.pid, reason });
            }
        }
        for k in gone {
            self.pending.remove(&k);
            out.push(Event::Gone { pid: k.2 });
        }
    }

    /// Waits for the eviction commands that have exited (no syscall while none runs). Call it
    /// at every tick, evictions in flight or not: a command may outlive the eviction it ran
    /// for, and one not waited for stays a zombie. Returns how many still run.
    pub fn reap_commands(&mut self) -> usize {
        if !self.commands.is_empty() {
            self.commands.retain_mut(|c| match c.try_wait() {
                Ok(Some(status)) => {
                    tracing::info!(command_pid = c.id(), %status, "eviction command exited");
                    false
                }
                Ok(None) => true,
                Err(e) => {
                    tracing::warn!(command_pid = c.id(), error = %e, "cannot wait for an eviction command; trying again at the next tick");
                    true
                }
            });
        }
        self.commands.len()
    }

    /// Escalates to SIGKILL past the grace period and forgets processes that are gone.
    ///
    /// Evictions a dry run only logged are dropped once the dry run is over (a reload with
    /// `dry_run: false`): their processes were never asked to leave, and the SIGKILL their
    /// grace would call for would be the first and only signal they get (under MPS a SIGKILL
    /// can hang the online neighbours' contexts). One still called for is started anew, with
    /// SIGTERM, by the next judgement that calls for it.
    pub fn tick(&mut self, cfg: &EvictorConfig, now_ms: u64, out: &mut Vec<Event>) {
        self.reap_commands();
        if !cfg.dry_run {
            let before = self.pending.len();
            self.pending.retain(|_, p| !p.dry);
            if self.pending.len() < before {
                tracing::info!(
                    dropped = before - self.pending.len(),
                    "dry run over: evictions it only logged are dropped; one still called for starts with SIGTERM"
                );
            }
        }
        let mut gone = Vec::new();
        for (k, p) in self.pending.iter_mut() {
            let Some(host) = p.proc_.host_pid else {
                continue;
            };
            if self.sig.gone(host, p.proc_.start_time) {
                gone.push(*k);
                continue;
            }
            if !p.killed && now_ms >= p.kill_at_ms && !cfg.dry_run {
                p.killed = true;
                match self
                    .sig
                    .signal(host, p.proc_.start_time, libc::SIGKILL)
                {
                    Ok(true) => {
                        self.kills += 1;
                        tracing::warn!(
                            pid = p.proc_.pid,
                            reason = p.reason.as_str(),
                            grace_ms = cfg.grace_ms,
                            retried = p.kill_failed_said,
                            "grace period over: SIGKILL"
                        );
                        out.push(Event::Kill {
                            pid: p.proc_.pid,
                            reason: p.reason,
                        });
                    }
                    Ok(false) => {}
                    Err(err) => {
                        // Tried again at the next tick (out of descriptors now, not later);
                        // said once, not at every tick.
                        p.killed = false;
                        if std::mem::replace(&mut p.kill_failed_said, true) {
                            tracing::debug!(pid = p.proc_.pid, error = %err, "SIGKILL failed again");
                        } else {
                            tracing::error!(pid = p.proc_.pid, error = %err, "SIGKILL failed; trying again at every tick until it is sent");
                        }
                    }
                }
            }
        }
        for k in gone {
            self.pending.remove(&k);
            out.push(Event::Gone { pid: k.2 });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A misspelt placeholder reached the command literally and `check-config` said ok.
    #[test]
    fn an_eviction_command_names_known_placeholders_and_the_pid() {
        let check = |argv: &[&str]| EvictorConfig { command: Some(argv.iter().map(|a| a.to_string()).collect()), ..Default::default() }.check_command();
        assert_eq!(check(&["/bin/evict", "{pid}", "{start_time}", "{reason}", "--gpu={gpu}"]), Ok(()));
        assert_eq!(check(&["sh", "-c", "echo {pid} | awk '{print $1}'; { true; }; echo ${HOME} ${x_y}"]), Ok(()));
        assert_eq!(check(&["sh", "-c", "kill {pid}; jq '{name}' f | awk '{print}'"]), Ok(()), "a script is its own language");
        for (argv, want) in [
            (&["/bin/evict", "{pid}", "{starttime}"][..], "{starttime}"),
            (&["/bin/evict", "--pod={pod}", "{pid}"][..], "{pod}"),
            (&["/bin/evict", "{reason}"][..], "never passes {pid}"),
            (&[][..], "must name a program"),
            (&[""][..], "must name a program"),
        ] {
            let e = check(argv).unwrap_err();
            assert!(e.contains(want), "{argv:?}: {e}");
        }
        assert_eq!(EvictorConfig::default().check_command(), Ok(()));
    }

    #[derive(Default)]
    struct Rec {
        sent: Vec<(u32, i32)>,
        dead: Vec<u32>,
    }
    impl Signaller for Rec {
        fn signal(&mut self, pid: u32, _s: u64, sig: i32) -> Result<bool, String> {
            self.sent.push((pid, sig));
            Ok(!self.dead.contains(&pid))
        }
        fn alive(&mut self, pid: u32, _s: u64) -> bool {
            !self.dead.contains(&pid)
        }
    }

    fn p(pid: u32) -> OfflineProc {
        OfflineProc {
            pid_ns: 0,
            slot: 0,
            pod_ledger: None,
            host_pid: Some(pid),
            pid,
            start_time: 100 + pid as u64,
            reported_bytes: 0,
            group_id: 0,
            evict_requested_ms: None,
            evict_by_manager: false,
        }
    }

    fn cfg() -> EvictorConfig {
        EvictorConfig {
            grace_ms: 50,
            ..Default::default()
        }
    }

    #[test]
    fn term_then_kill_after_grace_once() {
        let mut ev = Evictor::new(Rec::default(), 0);
        let mut out = vec![];
        assert!(ev.evict(&cfg(), 0, &p(10), EvictReason::Overlimit, "x", &mut out));
        assert!(
            !ev.evict(&cfg(), 1, &p(10), EvictReason::Overlimit, "x", &mut out),
            "second request is a no-op"
        );
        ev.tick(&cfg(), 49, &mut out);
        assert_eq!(ev.sig.sent, vec![(10, libc::SIGTERM)]);
        ev.tick(&cfg(), 50, &mut out);
        ev.tick(&cfg(), 60, &mut out);
        assert_eq!(ev.sig.sent, vec![(10, libc::SIGTERM), (10, libc::SIGKILL)]);
        assert_eq!(ev.counts()[&EvictReason::Overlimit], 1);
        assert_eq!(ev.kills(), 1);
        ev.sig.dead.push(10);
        ev.tick(&cfg(), 70, &mut out);
        assert_eq!(ev.in_flight(), 0);
        assert_eq!(out.last(), Some(&Event::Gone { pid: 10 }));
    }

    /// The daemon out of descriptors: `/proc` unreadable (neither alive nor gone) and the
    /// SIGKILL's pidfd not opened. The eviction was dropped as if the process had exited, its
    /// SIGKILL never sent; it stays pending now and the SIGKILL is sent once descriptors free.
    #[test]
    fn an_unreadable_proc_and_a_failed_sigkill_keep_the_eviction_until_the_kill_lands() {
        #[derive(Default)]
        struct OutOfFds {
            sent: Vec<(u32, i32)>,
            fds_left: bool,
        }
        impl Signaller for OutOfFds {
            fn signal(&mut self, pid: u32, _s: u64, sig: i32) -> Result<bool, String> {
                if sig == libc::SIGKILL && !self.fds_left {
                    return Err("pidfd_open: Too many open files".into());
                }
                self.sent.push((pid, sig));
                Ok(true)
            }
            fn alive(&mut self, _pid: u32, _s: u64) -> bool {
                self.fds_left
            }
            fn gone(&mut self, _pid: u32, _s: u64) -> bool {
                false
            }
        }
        let mut ev = Evictor::new(OutOfFds::default(), 0);
        let mut out = vec![];
        assert!(ev.evict(&cfg(), 0, &p(10), EvictReason::Overlimit, "x", &mut out));
        ev.tick(&cfg(), 60, &mut out);
        ev.tick(&cfg(), 70, &mut out);
        assert_eq!(ev.in_flight(), 1, "kept while nothing is known: {out:?}");
        assert_eq!(ev.kills(), 0);
        ev.sig.fds_left = true;
        ev.tick(&cfg(), 80, &mut out);
        assert_eq!(ev.sig.sent, vec![(10, libc::SIGTERM), (10, libc::SIGKILL)]);
        assert_eq!(ev.kills(), 1);
    }

    /// A container's process (its ledger pid 1, pid 4242 here) is signalled by the pid it has
    /// here; one whose pid here is unknown is asked through the ledger only, never signalled
    /// (its ledger pid would name another process here).
    #[test]
    fn another_namespaces_process_is_signalled_by_its_pid_here_or_not_at_all() {
        let mut ev = Evictor::new(Rec::default(), 0);
        let mut out = vec![];
        let container = OfflineProc { host_pid: Some(4242), ..p(1) };
        assert!(ev.evict(&cfg(), 0, &container, EvictReason::Overlimit, "x", &mut out), "pid 1 of its namespace");
        ev.tick(&cfg(), 50, &mut out);
        assert_eq!(ev.sig.sent, vec![(4242, libc::SIGTERM), (4242, libc::SIGKILL)]);
        let unseen = OfflineProc { host_pid: None, ..p(7) };
        assert!(ev.evict(&cfg(), 100, &unseen, EvictReason::Overlimit, "x", &mut out));
        ev.tick(&cfg(), 200, &mut out);
        assert_eq!(ev.sig.sent.len(), 2, "nothing sent to pid 7 here: {:?}", ev.sig.sent);
        assert!(ev.pending().any(|(q, _, kill)| q.pid == 7 && kill.is_none()));
    }

    /// Two containers' entrypoints, each pid 1 of its namespace, started in the same clock
    /// tick: two slots, two evictions.
    #[test]
    fn same_pid_and_start_time_in_two_slots_are_two_processes() {
        let mut ev = Evictor::new(Rec::default(), 0);
        let mut out = vec![];
        let a = OfflineProc { slot: 3, host_pid: Some(5001), ..p(1) };
        let b = OfflineProc { slot: 4, host_pid: Some(5002), ..p(1) };
        assert!(ev.evict(&cfg(), 0, &a, EvictReason::Overlimit, "x", &mut out));
        assert!(ev.evict(&cfg(), 0, &b, EvictReason::Overlimit, "x", &mut out), "not taken for the first");
        assert_eq!(ev.sig.sent, vec![(5001, libc::SIGTERM), (5002, libc::SIGTERM)]);
    }

    /// A dry run's eviction was never signalled: when the dry run ends (a reload) it is
    /// dropped, not SIGKILLed at the end of a grace no SIGTERM began; one still called for
    /// then starts with SIGTERM.
    #[test]
    fn an_eviction_a_dry_run_only_logged_is_never_killed_once_the_dry_run_ends() {
        let mut ev = Evictor::new(Rec::default(), 0);
        let mut out = vec![];
        let dry = EvictorConfig { dry_run: true, ..cfg() };
        assert!(ev.evict(&dry, 0, &p(20), EvictReason::Overlimit, "x", &mut out));
        ev.tick(&dry, 100, &mut out);
        assert!(ev.sig.sent.is_empty(), "a dry run sends nothing");
        ev.tick(&cfg(), 200, &mut out);
        assert!(ev.sig.sent.is_empty(), "no SIGKILL without a SIGTERM: {:?}", ev.sig.sent);
        assert_eq!(ev.in_flight(), 0, "the dry run's eviction is dropped");
        assert!(ev.evict(&cfg(), 300, &p(20), EvictReason::Overlimit, "x", &mut out), "started anew");
        ev.tick(&cfg(), 360, &mut out);
        assert_eq!(ev.sig.sent, vec![(20, libc::SIGTERM), (20, libc::SIGKILL)]);
    }

    /// An eviction asked through the ledger only (no pid here) is over when its registration
    /// is gone, and one whose pid here is found later is signalled then.
    #[test]
    fn an_eviction_without_a_pid_here_ends_with_its_registration_or_is_signalled_once_found() {
        let mut ev = Evictor::new(Rec::default(), 0);
        let mut out = vec![];
        let unseen = OfflineProc { host_pid: None, ..p(7) };
        assert!(ev.evict(&cfg(), 0, &unseen, EvictReason::Overlimit, "x", &mut out));
        ev.retain_registered(&cfg(), 10, &[unseen], &mut out);
        ev.tick(&cfg(), 100, &mut out);
        assert_eq!(ev.in_flight(), 1, "still registered: still in flight");
        ev.retain_registered(&cfg(), 110, &[], &mut out);
        assert_eq!(ev.in_flight(), 0, "its registration is gone: over");
        assert_eq!(out.last(), Some(&Event::Gone { pid: 7 }));
        assert!(ev.sig.sent.is_empty());

        let later = OfflineProc { host_pid: None, ..p(8) };
        assert!(ev.evict(&cfg(), 200, &later, EvictReason::Overlimit, "x", &mut out));
        ev.retain_registered(&cfg(), 300, &[OfflineProc { host_pid: Some(4343), ..later }], &mut out);
        assert_eq!(ev.sig.sent, vec![(4343, libc::SIGTERM)], "signalled once found");
        ev.tick(&cfg(), 349, &mut out);
        assert_eq!(ev.sig.sent.len(), 1, "its grace runs from when it was signalled");
        ev.tick(&cfg(), 350, &mut out);
        assert_eq!(ev.sig.sent, vec![(4343, libc::SIGTERM), (4343, libc::SIGKILL)]);
    }

    #[test]
    fn a_process_that_exits_in_grace_is_not_killed() {
        let mut ev = Evictor::new(Rec::default(), 0);
        let mut out = vec![];
        ev.evict(&cfg(), 0, &p(11), EvictReason::HostMemory, "x", &mut out);
        ev.sig.dead.push(11);
        ev.tick(&cfg(), 100, &mut out);
        assert_eq!(ev.sig.sent, vec![(11, libc::SIGTERM)]);
    }

    #[test]
    fn requests_from_an_earlier_run_are_resumed_not_repeated() {
        let mut ev = Evictor::new(Rec::default(), 0);
        let mut out = vec![];
        let old = OfflineProc {
            evict_requested_ms: Some(1000),
            ..p(12)
        };
        ev.adopt(&cfg(), &[old, p(13)], &mut out);
        assert_eq!(out, vec![Event::Resumed { pid: 12 }]);
        assert!(!ev.evict(&cfg(), 1010, &old, EvictReason::Overlimit, "x", &mut out));
        ev.tick(&cfg(), 1040, &mut out);
        assert!(ev.sig.sent.is_empty(), "no SIGTERM twice, no early SIGKILL");
        ev.tick(&cfg(), 1050, &mut out);
        assert_eq!(ev.sig.sent, vec![(12, libc::SIGKILL)]);
        assert!(
            ev.counts().is_empty(),
            "a resumed eviction is not counted again"
        );
    }

    /// A request of mps-manager's taken on with the manager's longest grace (10 min), then the
    /// monitor's own eviction (Overlimit, Disabled) of that process: SIGKILL after the
    /// monitor's grace from its eviction, not the manager's. Before, the eviction was refused
    /// (a request was in flight) and a process ignoring SIGTERM stayed 10 min.
    #[test]
    fn the_monitors_own_eviction_of_a_process_the_manager_asked_to_leave_keeps_its_grace() {
        let mut ev = Evictor::new(Rec::default(), 0);
        let mut out = vec![];
        let asked = OfflineProc { evict_requested_ms: Some(1000), evict_by_manager: true, ..p(17) };
        ev.adopt(&cfg(), &[asked], &mut out);
        let long = node_ledger::MANAGER_MAX_EVICT_GRACE_MS;
        assert!(ev.pending().any(|(q, _, kill)| q.pid == 17 && kill == Some(1000 + long)));
        let recorded = std::cell::Cell::new(false);
        assert!(ev.evict_recorded(&cfg(), 2000, &asked, EvictReason::Disabled, "x", &mut out, || recorded.set(true)));
        assert!(recorded.get(), "the monitor's request is recorded");
        assert!(ev.pending().any(|(q, at, kill)| q.pid == 17 && at == 2000 && kill == Some(2050)));
        ev.tick(&cfg(), 2049, &mut out);
        assert!(ev.sig.sent.is_empty(), "no second SIGTERM, no SIGKILL inside the grace");
        ev.tick(&cfg(), 2050, &mut out);
        assert_eq!(ev.sig.sent, vec![(17, libc::SIGKILL)], "the monitor's grace from its eviction");
        assert_eq!(out.last(), Some(&Event::Kill { pid: 17, reason: EvictReason::Disabled }));
        assert!(!ev.evict(&cfg(), 2060, &asked, EvictReason::Overlimit, "x", &mut out), "killed already");
    }

    #[test]
    fn dry_run_signals_nothing() {
        let c = EvictorConfig {
            dry_run: true,
            ..cfg()
        };
        let mut ev = Evictor::new(Rec::default(), 0);
        let mut out = vec![];
        ev.evict(&c, 0, &p(14), EvictReason::Overlimit, "x", &mut out);
        ev.tick(&c, 1000, &mut out);
        assert!(ev.sig.sent.is_empty());
    }

    /// The durable request is recorded before the SIGTERM leaves (a monitor killed in between
    /// leaves a request its successor resumes, not a SIGTERM it sends again), and not at all in
    /// a dry run: the shim in the process acts on the ledger's request by itself.
    #[test]
    fn the_request_is_recorded_before_the_sigterm_and_never_in_a_dry_run() {
        use std::cell::RefCell;
        use std::rc::Rc;
        struct Log(Rc<RefCell<Vec<String>>>);
        impl Signaller for Log {
            fn signal(&mut self, pid: u32, _s: u64, sig: i32) -> Result<bool, String> {
                self.0.borrow_mut().push(format!("signal {sig} to {pid}"));
                Ok(true)
            }
            fn alive(&mut self, _pid: u32, _s: u64) -> bool {
                true
            }
        }
        let log = Rc::new(RefCell::new(Vec::new()));
        let mut ev = Evictor::new(Log(log.clone()), 0);
        let mut out = vec![];
        let record = |pid: u32| {
            let log = log.clone();
            move || log.borrow_mut().push(format!("recorded {pid}"))
        };
        assert!(ev.evict_recorded(
            &cfg(),
            0,
            &p(15),
            EvictReason::Overlimit,
            "x",
            &mut out,
            record(15)
        ));
        assert_eq!(
            *log.borrow(),
            [
                "recorded 15".to_string(),
                format!("signal {} to 15", libc::SIGTERM)
            ]
        );
        let dry = EvictorConfig {
            dry_run: true,
            ..cfg()
        };
        assert!(ev.evict_recorded(
            &dry,
            0,
            &p(16),
            EvictReason::Overlimit,
            "x",
            &mut out,
            record(16)
        ));
        ev.tick(&dry, 1000, &mut out);
        assert_eq!(
            log.borrow().len(),
            2,
            "a dry run records no request for the shim to act on: {:?}",
            log.borrow()
        );
    }

    #[test]
    fn never_signals_init_or_itself() {
        let mut ev = Evictor::new(Rec::default(), 0);
        let mut out = vec![];
        assert!(!ev.evict(&cfg(), 0, &p(1), EvictReason::Overlimit, "x", &mut out));
        assert!(!ev.evict(
            &cfg(),
            0,
            &p(std::process::id()),
            EvictReason::Overlimit,
            "x",
            &mut out
        ));
        assert!(ev.sig.sent.is_empty());
    }

    #[test]
    fn real_pidfd_signal_reaches_a_child_and_spares_a_reused_identity() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let st = procinfo::start_time(pid).unwrap();
        let mut s = PidfdSignaller;
        assert_eq!(
            s.signal(pid, st + 1, libc::SIGTERM),
            Ok(false),
            "wrong start time: not the same process"
        );
        assert!(s.alive(pid, st));
        assert_eq!(s.signal(pid, st, libc::SIGTERM), Ok(true));
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
    }

    #[test]
    fn eviction_command_replaces_signals() {
        let d = tempfile::tempdir().unwrap();
        let marker = d.path().join("m");
        let c = EvictorConfig {
            command: Some(vec![
                "sh".into(),
                "-c".into(),
                format!("echo {{pid}} {{start_time}} {{reason}} {{gpu}} > {}", marker.display()),
            ]),
            ..cfg()
        };
        let mut ev = Evictor::new(Rec::default(), 3);
        let mut out = vec![];
        ev.evict(&c, 0, &p(15), EvictReason::UnderReport, "x", &mut out);
        for _ in 0..200 {
            if std::fs::read_to_string(&marker).is_ok_and(|s| s.ends_with('\n')) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(
            std::fs::read_to_string(&marker).unwrap(),
            "15 115 under_report 3\n"
        );
        assert!(ev.sig.sent.is_empty());
    }

    /// The eviction command never gets a pid that is not verified here: a ledger pid (any
    /// ledger client can write a slot; pid 1 of a container is init here), or a pid whose
    /// process no longer has the registered start time. Once the pid here is found, the
    /// command runs with it.
    #[test]
    fn the_eviction_command_never_gets_an_unverified_pid() {
        let d = tempfile::tempdir().unwrap();
        let marker = d.path().join("m");
        let c = EvictorConfig {
            command: Some(vec!["sh".into(), "-c".into(), format!("echo {{pid}} >> {}", marker.display())]),
            ..cfg()
        };
        let mut ev = Evictor::new(Rec::default(), 0);
        let mut out = vec![];
        let unseen = OfflineProc { host_pid: None, ..p(1) };
        assert!(ev.evict(&c, 0, &unseen, EvictReason::Overlimit, "x", &mut out), "asked through its ledger");
        ev.sig.dead.push(21);
        assert!(ev.evict(&c, 0, &p(21), EvictReason::Overlimit, "x", &mut out));
        for ch in &mut ev.commands {
            ch.wait().unwrap();
        }
        assert!(!marker.exists(), "command ran with {:?}", std::fs::read_to_string(&marker));
        assert!(ev.commands.is_empty());
        assert_eq!(out, vec![Event::Term { pid: 1, reason: EvictReason::Overlimit }, Event::Term { pid: 21, reason: EvictReason::Overlimit }]);

        ev.retain_registered(&c, 10, &[OfflineProc { host_pid: Some(4242), ..unseen }], &mut out);
        for ch in &mut ev.commands {
            ch.wait().unwrap();
        }
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), "4242\n", "run with its pid here once found");
        assert!(ev.sig.sent.is_empty());
    }
}
