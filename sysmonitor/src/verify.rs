//! Trust but verify: compares what offline processes report in the ledger with NVML's
//! per-process memory and flags those that under-report several checks in a row, and finds
//! offline work that reports nothing at all: GPU processes that run without the shim in an
//! offline container's pid namespace, or in an offline pod's cgroup (the pods node-agent lists,
//! `node_daemon::offline_pods`) when none of the pod's processes registered; and holds each
//! planned offline pod to the GPU memory its plan gives it, as NVML measures its processes.

use std::collections::{BTreeSet, HashMap};

use node_daemon::evictor::NO_SLOT;

use crate::config::VerifyConfig;
use crate::port::OfflineProc;
use crate::sampler::ProcMem;

/// A process caught under-reporting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Liar {
    /// The process caught.
    pub proc_: OfflineProc,
    /// What NVML sees it use, bytes.
    pub nvml_bytes: u64,
}

/// Strike counts per process identity.
#[derive(Debug, Default)]
pub struct Verifier {
    strikes: HashMap<node_daemon::evictor::ProcKey, u32>,
    /// Strikes of unregistered GPU processes in offline pid namespaces, by host pid and start
    /// time.
    unregistered: HashMap<(u32, u64), u32>,
    /// Strikes of offline pods over their plan, by pod UID.
    over_plan: HashMap<String, u32>,
}

/// What [`Verifier::check_plans`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanCheck {
    /// Pods over their plan.
    pub over: Vec<OverPlan>,
    /// Processes of planned pods registered under another quota group than their pod's
    /// (`node_ledger::ledger::pod_group_name`): their allocations were charged to another
    /// pod's quota, which that pod then lacked. The pod (UID) their cgroup names with each.
    pub foreign: Vec<(OfflineProc, String)>,
    /// The processes judged with their planned pod ([`OfflineProc::key`]): the per-process
    /// check of reported memory ([`Verifier::check`]) leaves them to the plan.
    pub judged: Vec<node_daemon::evictor::ProcKey>,
}

/// An offline pod whose registered processes on this GPU hold more GPU memory than its plan
/// gives it ([`Verifier::check_plans`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverPlan {
    /// The pod (UID, as its processes' cgroup paths name it).
    pub pod: String,
    /// What its plan gives it on a GPU, bytes.
    pub quota_bytes: u64,
    /// What NVML sees its processes here use together, bytes.
    pub nvml_bytes: u64,
    /// The most they may hold: the plan, each process's context, the tolerance.
    pub allowed_bytes: u64,
    /// Its registered processes here (each is evicted).
    pub procs: Vec<OfflineProc>,
}

/// A GPU process running offline work without the shim ([`Verifier::check_unregistered`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unshimmed {
    /// The process, to evict by its host pid ([`NO_SLOT`], reporting nothing).
    pub proc_: OfflineProc,
    /// How it was known for offline work.
    pub found: Found,
    /// What NVML sees it use, bytes.
    pub nvml_bytes: u64,
}

/// How an unregistered GPU process was known for offline work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// It shares the pid namespace of this registered offline process (host pid).
    Neighbour(u32),
    /// Its cgroup names this offline pod (UID).
    Pod(String),
}

/// A ledger file an unregistered GPU process holds open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// The GPU's live ledger: a shim's fork child holds it (inherited) until its first
    /// reservation registers it, and so can anyone who opens the file.
    Live,
    /// One the monitor moved aside as damaged: a shim registered there, whose registration the
    /// monitor could not carry over.
    Aside,
}

/// What the unshimmed-work check reads of a GPU process by its pid here (the monitor: `/proc`;
/// tests: a table). `None`: gone or unreadable, not judged.
pub trait ProcProbe {
    /// Its pid namespace (one `stat`; asked of every unregistered process listed).
    fn pid_ns(&mut self, pid: u32) -> Option<u64>;
    /// Its start time (clock ticks since boot).
    fn start_time(&mut self, pid: u32) -> Option<u64>;
    /// Which ledger file it holds open, if any.
    fn ledger_held(&mut self, pid: u32) -> Option<Held>;
    /// Its parent's pid here.
    fn parent(&mut self, pid: u32) -> Option<u32>;
    /// The pod its cgroup names (asked only while node-agent lists offline pods, of a process
    /// in no registered offline container's namespace).
    fn pod_uid(&mut self, pid: u32) -> Option<String>;
}

impl Verifier {
    /// Checks every registered offline process against NVML's figures; returns those whose
    /// strikes reached the limit.
    pub fn check(
        &mut self,
        cfg: &VerifyConfig,
        offline: &[OfflineProc],
        nvml: &[ProcMem],
    ) -> Vec<Liar> {
        // Both from a checked config (ranges validated); saturating all the same.
        let tol = cfg
            .tolerance_mib
            .saturating_add(cfg.context_mib)
            .saturating_mul(1024 * 1024);
        let mut seen = Vec::with_capacity(offline.len());
        let mut liars = Vec::new();
        for p in offline {
            // NVML names processes by their pid here: one whose pid here is not known (another
            // pid namespace, not found) is not judged, never compared with whatever process
            // has its ledger pid here.
            let Some(host) = p.host_pid else { continue };
            seen.push(p.key());
            let used: u64 = nvml
                .iter()
                .filter(|m| m.pid == host)
                .map(|m| m.used_bytes)
                .sum();
            let s = self.strikes.entry(p.key()).or_default();
            if used > p.reported_bytes.saturating_add(tol) {
                *s += 1;
                if *s >= cfg.strikes {
                    liars.push(Liar {
                        proc_: *p,
                        nvml_bytes: used,
                    });
                }
            } else {
                *s = 0;
            }
        }
        self.strikes.retain(|k, _| seen.contains(k));
        liars
    }

    /// Holds each offline pod with a plan (`plan(uid)`: the bytes node-agent's list gives it) to
    /// it: NVML's bytes for the pod's registered processes that NVML lists here may together
    /// exceed the plan by `cfg.context_mib` a process (the contexts the shim's quota leaves
    /// out) and `cfg.tolerance_mib` once; over that `cfg.strikes` checks in a row, the pod is
    /// returned.
    /// A process's pod is the one its cgroup path names (`probe`: its pid namespace, then its
    /// cgroup, which the probe reads once per process), never the ledger group its slot claims
    /// nor the quota its environment gave the shim: both are the tenant's to write, so a pod
    /// that set `XCUDA_QUOTA_BYTES` higher, or registered under another pod's group, still
    /// holds only what it was planned. A process not found from here is not judged. A
    /// planned pod's process registered under another group than its pod's is returned in
    /// [`PlanCheck::foreign`] at once: the group is fixed at registration.
    pub fn check_plans(
        &mut self,
        cfg: &VerifyConfig,
        offline: &[OfflineProc],
        nvml: &[ProcMem],
        plan: impl Fn(&str) -> Option<u64>,
        probe: &mut impl ProcProbe,
    ) -> PlanCheck {
        let mut found = PlanCheck::default();
        let mut pods: HashMap<String, (u64, Vec<OfflineProc>)> = HashMap::new();
        for p in offline {
            let Some(host) = p.host_pid else { continue };
            // Only processes NVML lists here hold memory (and a context) here: the others are
            // neither summed nor looked up.
            if !nvml.iter().any(|m| m.pid == host) || probe.pid_ns(host).is_none() {
                continue;
            }
            let Some(uid) = probe.pod_uid(host) else { continue };
            if plan(&uid).is_none() {
                continue;
            }
            // In a pod ledger, the ledger names the pod (node-agent mounts it into that pod
            // alone; the group inside is the pod's own affair); in the GPU's ledger, the group.
            let foreign = match p.pod_ledger {
                Some(ledger_pod) => node_ledger::PodUid::parse(&uid) != Some(ledger_pod),
                None => p.group_id != node_ledger::ledger::group_id_for(&node_ledger::ledger::pod_group_name(&uid)),
            };
            if foreign {
                found.foreign.push((*p, uid.clone()));
            }
            found.judged.push(p.key());
            let used: u64 = nvml.iter().filter(|m| m.pid == host).map(|m| m.used_bytes).sum();
            let e = pods.entry(uid).or_default();
            e.0 = e.0.saturating_add(used);
            e.1.push(*p);
        }
        let out = &mut found.over;
        for (uid, (used, procs)) in pods.iter() {
            let quota = plan(uid).unwrap_or(u64::MAX);
            let slack = cfg.context_mib.saturating_mul(procs.len() as u64).saturating_add(cfg.tolerance_mib);
            let allowed = quota.saturating_add(slack.saturating_mul(1024 * 1024));
            let s = self.over_plan.entry(uid.clone()).or_default();
            if *used > allowed {
                *s += 1;
                if *s >= cfg.strikes {
                    out.push(OverPlan {
                        pod: uid.clone(),
                        quota_bytes: quota,
                        nvml_bytes: *used,
                        allowed_bytes: allowed,
                        procs: procs.clone(),
                    });
                }
            } else {
                *s = 0;
            }
        }
        self.over_plan.retain(|k, _| pods.contains_key(k));
        out.sort_by(|a, b| a.pod.cmp(&b.pod));
        found
    }

    /// GPU processes NVML lists (`nvml`) that are no registered offline process but are offline
    /// work: they share the pid namespace of a registered offline process (a container's), or
    /// their cgroup names one of `offline_pods` (node-agent's list; this finds a pod none of
    /// whose processes registered, and a pod sharing the host's pid namespace). Such work runs
    /// without the shim (its environment sanitised, a static CUDA runtime): no memory quota,
    /// no launch throttle, and until now judged as online load. Returns those seen so
    /// `cfg.strikes` checks in a row.
    ///
    /// A process is registered only if a registration's owner is that very process: the
    /// registration's host pid is the process's (found only for the holder of the slot's lock,
    /// `node_daemon::procns::HostPids`) and its start time is the process's. A slot that merely
    /// names the process's pid namespace and pid there, with no lock held (a proxy
    /// registration, which only tools and tests make, or one any ledger client wrote), is no
    /// pass: every ledger client can write any slot and read its neighbours' start times, but
    /// none can make another process hold a lock. One that holds a damaged
    /// ledger the monitor moved aside is a shim's, not judged; one that holds the live ledger
    /// is a shim's only while its parent is a registered process (a fork child before its first
    /// reservation): holding the file open is no pass, anyone in the container can open it.
    /// `own_ns` (the monitor's pid namespace, the host's, where online services run too) is
    /// never taken for an offline container's. The probe
    /// reads every listed unregistered process's pid namespace, its cgroup only while
    /// `offline_pods` is not empty, and the rest only for a process found offline.
    pub fn check_unregistered(
        &mut self,
        cfg: &VerifyConfig,
        offline: &[OfflineProc],
        nvml: &[ProcMem],
        own_ns: u64,
        offline_pods: &BTreeSet<String>,
        probe: &mut impl ProcProbe,
    ) -> Vec<Unshimmed> {
        let containers: Vec<(u64, u32)> = offline
            .iter()
            .filter_map(|p| {
                let h = p.host_pid?;
                let ns = probe.pid_ns(h)?;
                (ns != own_ns).then_some((ns, h))
            })
            .collect();
        let mut seen = Vec::new();
        let mut out = Vec::new();
        if !containers.is_empty() || !offline_pods.is_empty() {
            let mut pids: Vec<u32> = nvml.iter().map(|m| m.pid).collect();
            pids.sort_unstable();
            pids.dedup();
            for pid in pids {
                // Read only of a process some registration resolved to (an online process
                // costs one `stat`), and once.
                let mut start = None;
                if offline.iter().any(|p| p.host_pid == Some(pid)) {
                    start = probe.start_time(pid);
                    let Some(st) = start else { continue };
                    if offline.iter().any(|p| p.host_pid == Some(pid) && p.start_time == st) {
                        continue;
                    }
                }
                let Some(ns) = probe.pid_ns(pid) else { continue };
                let found = match containers.iter().find(|(n, _)| *n == ns) {
                    Some(&(_, neighbour)) => Found::Neighbour(neighbour),
                    None if offline_pods.is_empty() => continue,
                    None => match probe.pod_uid(pid) {
                        Some(uid) if offline_pods.contains(&uid) => Found::Pod(uid),
                        _ => continue,
                    },
                };
                match probe.ledger_held(pid) {
                    Some(Held::Aside) => continue,
                    Some(Held::Live) => {
                        let parent = probe.parent(pid);
                        if parent.is_some_and(|pp| offline.iter().any(|p| p.host_pid == Some(pp))) {
                            continue;
                        }
                    }
                    None => {}
                }
                let Some(start_time) = start.or_else(|| probe.start_time(pid)) else { continue };
                seen.push((pid, start_time));
                let s = self.unregistered.entry((pid, start_time)).or_default();
                *s += 1;
                if *s >= cfg.strikes {
                    out.push(Unshimmed {
                        proc_: OfflineProc {
                            slot: NO_SLOT,
                            pod_ledger: None,
                            pid,
                            pid_ns: own_ns,
                            host_pid: Some(pid),
                            start_time,
                            reported_bytes: 0,
                            group_id: 0,
                            evict_requested_ms: None,
                            evict_by_manager: false,
                        },
                        found,
                        nvml_bytes: nvml.iter().filter(|m| m.pid == pid).map(|m| m.used_bytes).sum(),
                    });
                }
            }
        }
        self.unregistered.retain(|k, _| seen.contains(k));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn p(pid: u32, reported: u64) -> OfflineProc {
        OfflineProc {
            slot: 0,
            pod_ledger: None,
            host_pid: Some(pid),
            pid,
            pid_ns: 0,
            start_time: 1,
            reported_bytes: reported,
            group_id: 0,
            evict_requested_ms: None,
            evict_by_manager: false,
        }
    }

    /// A probe over a table: host pid -> (pid namespace, pid there, pod UID), start time
    /// `pid * 100`; `holding` hold a ledger file, `parents` have a parent. Counts the cgroup
    /// reads.
    struct Table {
        procs: HashMap<u32, (u64, u32, Option<&'static str>)>,
        holding: Vec<(u32, Held)>,
        parents: Vec<(u32, u32)>,
        cgroup_reads: Vec<u32>,
    }

    impl Table {
        fn new(rows: &[(u32, u64, u32, Option<&'static str>)]) -> Self {
            Table {
                procs: rows.iter().map(|&(h, ns, inner, pod)| (h, (ns, inner, pod))).collect(),
                holding: Vec::new(),
                parents: Vec::new(),
                cgroup_reads: Vec::new(),
            }
        }
    }

    impl ProcProbe for Table {
        fn pid_ns(&mut self, pid: u32) -> Option<u64> {
            self.procs.get(&pid).map(|r| r.0)
        }
        fn start_time(&mut self, pid: u32) -> Option<u64> {
            self.procs.contains_key(&pid).then_some(u64::from(pid) * 100)
        }
        fn ledger_held(&mut self, pid: u32) -> Option<Held> {
            self.holding.iter().find(|h| h.0 == pid).map(|h| h.1)
        }
        fn parent(&mut self, pid: u32) -> Option<u32> {
            self.parents.iter().find(|p| p.0 == pid).map(|p| p.1)
        }
        fn pod_uid(&mut self, pid: u32) -> Option<String> {
            self.cgroup_reads.push(pid);
            self.procs.get(&pid)?.2.map(str::to_string)
        }
    }

    /// A registration resolved to its owner: host pid `pid` (the slot lock's holder), with the
    /// start time [`Table`] gives that process.
    fn held(pid: u32) -> OfflineProc {
        OfflineProc { start_time: u64::from(pid) * 100, ..p(pid, 0) }
    }

    fn listed(pids: &[u32]) -> Vec<ProcMem> {
        pids.iter().map(|&pid| ProcMem { pid, used_bytes: MIB }).collect()
    }

    const OFFLINE_POD: &str = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b";
    const ONLINE_POD: &str = "11111111-2222-3333-4444-555555555555";

    /// `nvml`'s processes, each holding 1 MiB (everyone within any plan).
    fn within_all(nvml: &[ProcMem]) -> Vec<ProcMem> {
        nvml.iter().map(|m| ProcMem { pid: m.pid, used_bytes: MIB }).collect()
    }

    /// A pod's registered processes here are held together to its plan, by the pod their
    /// cgroups name: a pod over `plan + context per process + tolerance` for the strikes is
    /// flagged with all its processes; one within it, one with no plan and a process not found
    /// from here are not; a process's own ledger group or quota plays no part (the
    /// `OfflineProc` carries neither).
    #[test]
    fn a_pod_over_its_plan_is_flagged_with_its_processes_by_the_pod_their_cgroups_name() {
        let cfg = VerifyConfig { strikes: 2, context_mib: 100, tolerance_mib: 10, ..Default::default() };
        const SMALL: &str = "22222222-2222-4222-8222-222222222222";
        const UNPLANNED: &str = "33333333-3333-4333-8333-333333333333";
        // Host pids 10, 11: pod OFFLINE_POD (plan 1000 MiB); 12: SMALL (plan 1000 MiB); 13:
        // UNPLANNED; 14: in no pod; 15: OFFLINE_POD, registered but not found from here; 16:
        // OFFLINE_POD, registered, not on the GPU (no context: no allowance for one).
        let mut t = Table::new(&[
            (10, 1, 10, Some(OFFLINE_POD)),
            (11, 1, 11, Some(OFFLINE_POD)),
            (12, 1, 12, Some(SMALL)),
            (13, 1, 13, Some(UNPLANNED)),
            (14, 1, 14, None),
            (16, 1, 16, Some(OFFLINE_POD)),
        ]);
        let own = |pid, pod: &str| OfflineProc { group_id: node_ledger::ledger::group_id_for(&node_ledger::ledger::pod_group_name(pod)), ..p(pid, 0) };
        let offline = [
            own(10, OFFLINE_POD),
            own(11, OFFLINE_POD),
            own(12, SMALL),
            p(13, 0),
            p(14, 0),
            OfflineProc { host_pid: None, ..p(15, 0) },
            own(16, OFFLINE_POD),
        ];
        let plan = |uid: &str| [OFFLINE_POD, SMALL].contains(&uid).then_some(1000 * MIB);
        // OFFLINE_POD: 600 + 611 MiB = 1211 > 1000 + 2 x 100 + 10; SMALL: 1110 = its allowance.
        let nvml = vec![
            ProcMem { pid: 10, used_bytes: 600 * MIB },
            ProcMem { pid: 11, used_bytes: 611 * MIB },
            ProcMem { pid: 12, used_bytes: 1110 * MIB },
            ProcMem { pid: 13, used_bytes: 50_000 * MIB },
            ProcMem { pid: 14, used_bytes: 50_000 * MIB },
            ProcMem { pid: 15, used_bytes: 50_000 * MIB },
        ];
        let mut v = Verifier::default();
        let first = v.check_plans(&cfg, &offline, &nvml, plan, &mut t);
        assert!(first.over.is_empty() && first.foreign.is_empty(), "one strike");
        let judged: Vec<u32> = first.judged.iter().map(|k| k.2).collect();
        assert_eq!(judged.len(), 3, "{judged:?}");
        assert!([10, 11, 12].iter().all(|p| judged.contains(p)), "the planned pods' processes on the GPU, left to the plan: {judged:?}");
        let over = v.check_plans(&cfg, &offline, &nvml, plan, &mut t).over;
        assert_eq!(over.len(), 1, "{over:?}");
        assert_eq!((over[0].pod.as_str(), over[0].quota_bytes, over[0].nvml_bytes, over[0].allowed_bytes), (OFFLINE_POD, 1000 * MIB, 1211 * MIB, 1210 * MIB));
        assert_eq!(over[0].procs.iter().map(|p| p.pid).collect::<Vec<_>>(), [10, 11]);
        // Back within the plan: the strikes start over.
        let within = vec![ProcMem { pid: 10, used_bytes: 600 * MIB }, ProcMem { pid: 11, used_bytes: 610 * MIB }];
        assert!(v.check_plans(&cfg, &offline, &within, plan, &mut t).over.is_empty());
        assert!(v.check_plans(&cfg, &offline, &nvml, plan, &mut t).over.is_empty(), "strikes start over");
        // A process of a planned pod registered under another group (SMALL's process under
        // OFFLINE_POD's, within its plan) is found at once; one of an unplanned pod is not.
        let mut borrowed = offline;
        borrowed[2] = own(12, OFFLINE_POD);
        borrowed[3] = own(13, OFFLINE_POD);
        let found = Verifier::default().check_plans(&cfg, &borrowed, &within_all(&nvml), plan, &mut t);
        assert_eq!(found.foreign.iter().map(|(q, pod)| (q.pid, pod.as_str())).collect::<Vec<_>>(), [(12, SMALL)]);
        assert!(found.over.is_empty());
        // In a pod ledger the ledger names the pod, whatever group its processes wrote: SMALL's
        // process in SMALL's ledger is its own (any group), one in OFFLINE_POD's ledger is not.
        let small = node_ledger::PodUid::parse(SMALL).unwrap();
        let offline_pod = node_ledger::PodUid::parse(OFFLINE_POD).unwrap();
        let mut in_ledgers = borrowed;
        in_ledgers[2] = OfflineProc { pod_ledger: Some(small), ..own(12, OFFLINE_POD) };
        in_ledgers[0] = OfflineProc { pod_ledger: Some(small), ..own(10, OFFLINE_POD) };
        in_ledgers[1] = OfflineProc { pod_ledger: Some(offline_pod), ..p(11, 0) };
        let found = Verifier::default().check_plans(&cfg, &in_ledgers, &within_all(&nvml), plan, &mut t);
        assert_eq!(found.foreign.iter().map(|(q, pod)| (q.pid, pod.as_str())).collect::<Vec<_>>(), [(10, OFFLINE_POD)]);
        // A process not found from here, or not on the GPU, is never looked up.
        assert!(t.cgroup_reads.contains(&10) && !t.cgroup_reads.contains(&15) && !t.cgroup_reads.contains(&16));
    }

    /// A GPU process in the pid namespace of a registered offline process (a container's),
    /// with no registration of its own, is offline work without the shim: flagged after the
    /// strikes, whatever memory it holds. One in the monitor's own namespace (the host's, where
    /// online services run) or in a namespace no registered process is in is never flagged,
    /// nor is an MPS client of the host, nor the registered process itself. A slot that names
    /// a process's namespace and pid there but resolved to no host pid (no lock holder), or to
    /// its host pid with another start time (a pid since reused), is not its registration.
    #[test]
    fn a_gpu_process_in_an_offline_containers_namespace_without_a_registration_is_flagged() {
        let cfg = VerifyConfig { strikes: 2, ..Default::default() };
        let (own, container, other) = (1000, 2000, 3000);
        // Host pids: 10 registered (container, its pid 1), 11 unshimmed (container, its pid 2),
        // 12 online (host), 13 another container with no registration, 14 host offline
        // (registered), 15 named by a slot in the container (its pid 3) that resolved to no
        // host pid (a proxy slot, or one any ledger client wrote): unshimmed too.
        let mut t = Table::new(&[
            (10, container, 1, None),
            (11, container, 2, None),
            (15, container, 3, None),
            (12, own, 12, None),
            (14, own, 14, None),
            (13, other, 1, None),
        ]);
        // Resolved to `host` with its start time; unresolved, 15's start time (a slot can say
        // anything).
        let in_container = |pid, host: Option<u32>| OfflineProc {
            pid_ns: container,
            host_pid: host,
            start_time: host.map_or(1500, |h| u64::from(h) * 100),
            ..p(pid, 0)
        };
        let offline = [in_container(1, Some(10)), held(14), in_container(3, None)];
        let nvml = listed(&[10, 11, 11, 12, 13, 14, 15]);
        let no_pods = BTreeSet::new();
        let mut v = Verifier::default();
        assert!(v.check_unregistered(&cfg, &offline, &nvml, own, &no_pods, &mut t).is_empty(), "one strike");
        let u = v.check_unregistered(&cfg, &offline, &nvml, own, &no_pods, &mut t);
        assert_eq!(u.len(), 2, "{u:?}");
        assert_eq!((u[0].proc_.host_pid, u[0].proc_.slot, &u[0].found), (Some(11), NO_SLOT, &Found::Neighbour(10)));
        assert_eq!((u[0].proc_.start_time, u[0].nvml_bytes), (1100, 2 * MIB));
        assert_eq!((u[1].proc_.host_pid, u[1].proc_.start_time), (Some(15), 1500), "a slot with its start time but no lock holder");
        // Gone from NVML's list, its strikes are forgotten.
        assert!(v.check_unregistered(&cfg, &offline, &nvml[..1], own, &no_pods, &mut t).is_empty());
        assert!(v.check_unregistered(&cfg, &offline, &nvml, own, &no_pods, &mut t).is_empty(), "strikes start over");
        // A registration resolved to host pid 10 with another start time is an earlier
        // process's (the pid since reused): it excuses nothing.
        let reused = [OfflineProc { start_time: 999, ..offline[0] }, in_container(2, Some(11))];
        let mut v = Verifier::default();
        v.check_unregistered(&cfg, &reused, &nvml, own, &no_pods, &mut t);
        let u = v.check_unregistered(&cfg, &reused, &nvml, own, &no_pods, &mut t);
        assert_eq!(u.iter().map(|x| x.proc_.pid).collect::<Vec<_>>(), [10, 15]);
        assert!(t.cgroup_reads.is_empty(), "no offline pod listed: no cgroup read");
        // 15 gone from the GPU from here on.
        let nvml = listed(&[10, 11, 11, 12, 13, 14]);
        // Holding a ledger the monitor moved aside as damaged (registered there): a shim's.
        let mut v = Verifier::default();
        t.holding = vec![(11, Held::Aside)];
        for _ in 0..3 {
            assert!(v.check_unregistered(&cfg, &offline, &nvml, own, &no_pods, &mut t).is_empty());
        }
        // Holding the live ledger: a shim's fork child if its parent is registered (10)...
        t.holding = vec![(11, Held::Live)];
        t.parents = vec![(11, 10)];
        for _ in 0..3 {
            assert!(v.check_unregistered(&cfg, &offline, &nvml, own, &no_pods, &mut t).is_empty());
        }
        // ... else no pass: anyone in the container can open the file.
        t.parents = vec![(11, 12)];
        v.check_unregistered(&cfg, &offline, &nvml, own, &no_pods, &mut t);
        let u = v.check_unregistered(&cfg, &offline, &nvml, own, &no_pods, &mut t);
        assert_eq!(u.iter().map(|x| x.proc_.pid).collect::<Vec<_>>(), [11]);
        t.parents.clear();
        t.holding.clear();
        // A host-namespace registration alone makes no namespace an offline container's.
        let mut v = Verifier::default();
        for _ in 0..3 {
            assert!(v.check_unregistered(&cfg, &offline[1..2], &nvml, own, &no_pods, &mut t).is_empty());
        }
    }

    /// With node-agent's list of offline pods, a GPU process whose cgroup names one of them is
    /// offline work even when no process of its pod registered (the whole container runs
    /// without the shim), in a container's pid namespace or in the host's (`hostPID`). One in an
    /// online pod, in no pod, registered (a registration resolved to its host pid, with its
    /// start time) or holding a damaged ledger is never flagged. A slot that names its
    /// namespace and pid there, even with its start time, but resolved to no host pid (no
    /// process holds that slot's lock: a proxy slot, or one any ledger client wrote) is no
    /// registration: before, such a slot exempted unshimmed work from this check.
    #[test]
    fn a_gpu_process_in_a_listed_offline_pod_is_flagged_with_no_registration_anywhere() {
        let cfg = VerifyConfig { strikes: 2, ..Default::default() };
        let (own, ctr_a, ctr_b, ctr_c) = (1000, 2000, 3000, 4000);
        // 20: offline pod, own container, unshimmed. 21: offline pod with hostPID, unshimmed.
        // 22: online pod. 23: host process in no pod. 24: offline pod, named by a slot by its
        // namespace, pid and start time that no process holds the lock of (no host pid).
        // 25: offline pod, holds a damaged ledger. 26: offline pod, registered (host pid found).
        let mut t = Table::new(&[
            (20, ctr_a, 1, Some(OFFLINE_POD)),
            (21, own, 21, Some(OFFLINE_POD)),
            (22, ctr_b, 1, Some(ONLINE_POD)),
            (23, own, 23, None),
            (24, ctr_c, 7, Some(OFFLINE_POD)),
            (25, ctr_c, 8, Some(OFFLINE_POD)),
            (26, ctr_c, 9, Some(OFFLINE_POD)),
        ]);
        t.holding = vec![(25, Held::Aside)];
        let unlocked_slot = OfflineProc { pid_ns: ctr_c, host_pid: None, start_time: 2400, ..p(7, 0) };
        let registered = OfflineProc { pid_ns: ctr_c, pid: 9, ..held(26) };
        let offline = [unlocked_slot, registered];
        let nvml = listed(&[20, 21, 22, 23, 24, 25, 26]);
        let pods: BTreeSet<String> = [OFFLINE_POD.to_string()].into();
        let mut v = Verifier::default();
        assert!(v.check_unregistered(&cfg, &offline, &nvml, own, &pods, &mut t).is_empty(), "one strike");
        let mut u = v.check_unregistered(&cfg, &offline, &nvml, own, &pods, &mut t);
        u.sort_by_key(|x| x.proc_.pid);
        let got: Vec<(u32, u64, &Found)> = u.iter().map(|x| (x.proc_.pid, x.proc_.start_time, &x.found)).collect();
        let pod = Found::Pod(OFFLINE_POD.to_string());
        assert_eq!(got, vec![(20, 2000, &pod), (21, 2100, &pod), (24, 2400, &Found::Neighbour(26))]);
        assert!(u.iter().all(|x| x.proc_.slot == NO_SLOT && x.proc_.pid_ns == own));
        // With no registration at all on the GPU the same holds, and 26 is unshimmed too.
        let mut v = Verifier::default();
        v.check_unregistered(&cfg, &[], &nvml, own, &pods, &mut t);
        assert_eq!(v.check_unregistered(&cfg, &[], &nvml, own, &pods, &mut t).len(), 4, "20, 21, 24 and 26");
        // The list emptied (the pods finished): nothing is judged by cgroup, strikes forgotten.
        let mut v = Verifier::default();
        t.cgroup_reads.clear();
        for _ in 0..3 {
            assert!(v.check_unregistered(&cfg, &[], &nvml, own, &BTreeSet::new(), &mut t).is_empty());
        }
        assert!(t.cgroup_reads.is_empty());
    }

    #[test]
    fn under_reporter_is_flagged_after_strikes_honest_one_never() {
        let cfg = VerifyConfig {
            tolerance_mib: 10,
            context_mib: 0,
            strikes: 2,
            ..Default::default()
        };
        let mut v = Verifier::default();
        let offline = [p(1, 100 * MIB), p(2, 100 * MIB)];
        let nvml = [
            ProcMem {
                pid: 1,
                used_bytes: 500 * MIB,
            },
            ProcMem {
                pid: 2,
                used_bytes: 105 * MIB,
            },
        ];
        assert!(v.check(&cfg, &offline, &nvml).is_empty());
        let l = v.check(&cfg, &offline, &nvml);
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].proc_.pid, 1);
        assert_eq!(l[0].nvml_bytes, 500 * MIB);
    }

    /// A container's process (ledger pid 1) is judged by what NVML shows for its pid here
    /// (4242), never by a host process that has its ledger pid; one whose pid here is unknown
    /// is not judged at all.
    #[test]
    fn processes_are_matched_to_nvml_by_their_pid_here() {
        let cfg = VerifyConfig { tolerance_mib: 10, context_mib: 0, strikes: 1, ..Default::default() };
        let nvml = [ProcMem { pid: 1, used_bytes: 900 * MIB }, ProcMem { pid: 4242, used_bytes: 500 * MIB }];
        let mut v = Verifier::default();
        let honest_host_pid_1 = OfflineProc { host_pid: Some(4243), ..p(1, 0) };
        assert!(v.check(&cfg, &[honest_host_pid_1], &nvml).is_empty(), "not the host's pid 1");
        let liar = OfflineProc { host_pid: Some(4242), ..p(1, 100 * MIB) };
        let l = v.check(&cfg, &[liar], &nvml);
        assert_eq!((l.len(), l[0].nvml_bytes), (1, 500 * MIB));
        let unknown = OfflineProc { host_pid: None, ..p(1, 0) };
        assert!(v.check(&cfg, &[unknown], &nvml).is_empty());
    }

    #[test]
    fn a_context_s_own_memory_is_not_under_reporting() {
        // What a real driver charges a process that holds a context and 64 MiB (H200, driver
        // 580): 582 MiB. Without the context allowance it was evicted at once.
        let cfg = VerifyConfig {
            strikes: 1,
            ..Default::default()
        };
        let mut v = Verifier::default();
        let nvml = |mib: u64| {
            [ProcMem {
                pid: 1,
                used_bytes: mib * MIB,
            }]
        };
        assert!(v.check(&cfg, &[p(1, 64 * MIB)], &nvml(582)).is_empty());
        // Beyond the context allowance and the tolerance it is caught.
        let over = 64 + cfg.context_mib + cfg.tolerance_mib + 1;
        assert_eq!(v.check(&cfg, &[p(1, 64 * MIB)], &nvml(over)).len(), 1);
    }

    #[test]
    fn an_honest_check_resets_strikes() {
        let cfg = VerifyConfig {
            tolerance_mib: 0,
            context_mib: 0,
            strikes: 2,
            ..Default::default()
        };
        let mut v = Verifier::default();
        let offline = [p(1, 10)];
        assert!(v
            .check(
                &cfg,
                &offline,
                &[ProcMem {
                    pid: 1,
                    used_bytes: 20
                }]
            )
            .is_empty());
        assert!(v
            .check(
                &cfg,
                &offline,
                &[ProcMem {
                    pid: 1,
                    used_bytes: 10
                }]
            )
            .is_empty());
        assert!(v
            .check(
                &cfg,
                &offline,
                &[ProcMem {
                    pid: 1,
                    used_bytes: 20
                }]
            )
            .is_empty());
    }
}
