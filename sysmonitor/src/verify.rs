//! Trust but verify: compares what offline processes report in the ledger with NVML's
//! per-process memory and flags those that under-report several checks in a row, and finds
//! offline work that reports nothing at all: GPU processes in an offline container's pid
//! namespace that run without the shim.

use std::collections::HashMap;

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
    strikes: HashMap<(usize, u32, u64), u32>,
    /// Strikes of unregistered GPU processes in offline pid namespaces, by host pid and start
    /// time.
    unregistered: HashMap<(u32, u64), u32>,
}

/// A GPU process running offline work without the shim ([`Verifier::check_unregistered`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unshimmed {
    /// The process, to evict by its host pid ([`NO_SLOT`], reporting nothing).
    pub proc_: OfflineProc,
    /// Host pid of the registered offline process whose pid namespace it shares.
    pub neighbour: u32,
    /// What NVML sees it use, bytes.
    pub nvml_bytes: u64,
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

    /// GPU processes NVML lists (`nvml`) that are no registered offline process but share the
    /// pid namespace of one: offline work in a container that runs without the shim (its
    /// environment sanitised, a static CUDA runtime): no memory quota, no launch throttle, and
    /// until now judged as online load. Returns those seen so `cfg.strikes` checks in a row.
    /// A process is registered if its host pid is a registration's, or if a registration
    /// names its pid namespace and its pid there (found or not from here); one that holds a
    /// ledger file open (`holds_ledger`: one the monitor moved aside as damaged, whose
    /// registrations it could not carry over) is a shim's, not judged. `own_ns` (the
    /// monitor's pid namespace, the host's, where online services run too) is never taken for
    /// an offline container's. `ns_of` reads a process's pid namespace (one `stat`, for every
    /// process listed); `inner_pid_of`, its pid there, and `start_of`, its start time, are
    /// read only for a process in an offline container's namespace (`None`: gone or
    /// unreadable, not judged).
    pub fn check_unregistered(
        &mut self,
        cfg: &VerifyConfig,
        offline: &[OfflineProc],
        nvml: &[ProcMem],
        own_ns: u64,
        ns_of: impl Fn(u32) -> Option<u64>,
        inner_pid_of: impl Fn(u32) -> Option<u32>,
        start_of: impl Fn(u32) -> Option<u64>,
        holds_ledger: impl Fn(u32) -> bool,
    ) -> Vec<Unshimmed> {
        let containers: Vec<(u64, u32)> = offline
            .iter()
            .filter_map(|p| {
                let h = p.host_pid?;
                let ns = ns_of(h)?;
                (ns != own_ns).then_some((ns, h))
            })
            .collect();
        let mut seen = Vec::new();
        let mut out = Vec::new();
        if !containers.is_empty() {
            let mut pids: Vec<u32> = nvml.iter().map(|m| m.pid).collect();
            pids.sort_unstable();
            pids.dedup();
            for pid in pids {
                if offline.iter().any(|p| p.host_pid == Some(pid)) {
                    continue;
                }
                let Some(ns) = ns_of(pid) else { continue };
                let Some(&(_, neighbour)) = containers.iter().find(|(n, _)| *n == ns) else {
                    continue;
                };
                let Some(ns_pid) = inner_pid_of(pid) else { continue };
                if offline.iter().any(|p| p.pid_ns == ns && p.pid == ns_pid) || holds_ledger(pid) {
                    continue;
                }
                let Some(start_time) = start_of(pid) else { continue };
                seen.push((pid, start_time));
                let s = self.unregistered.entry((pid, start_time)).or_default();
                *s += 1;
                if *s >= cfg.strikes {
                    out.push(Unshimmed {
                        proc_: OfflineProc {
                            slot: NO_SLOT,
                            pid,
                            pid_ns: own_ns,
                            host_pid: Some(pid),
                            start_time,
                            reported_bytes: 0,
                            evict_requested_ms: None,
                        },
                        neighbour,
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
            host_pid: Some(pid),
            pid,
            pid_ns: 0,
            start_time: 1,
            reported_bytes: reported,
            evict_requested_ms: None,
        }
    }

    /// A GPU process in the pid namespace of a registered offline process (a container's),
    /// with no registration of its own, is offline work without the shim: flagged after the
    /// strikes, whatever memory it holds. One in the monitor's own namespace (the host's, where
    /// online services run) or in a namespace no registered process is in is never flagged,
    /// nor is an MPS client of the host, nor the registered process itself.
    #[test]
    fn a_gpu_process_in_an_offline_containers_namespace_without_a_registration_is_flagged() {
        let cfg = VerifyConfig { strikes: 2, ..Default::default() };
        let (own, container, other) = (1000, 2000, 3000);
        // Host pids: 10 registered (container, its pid 1), 11 unshimmed (container, its pid 2),
        // 12 online (host), 13 another container with no registration, 14 host offline
        // (registered), 15 registered in the container (its pid 3) but not found from here.
        let ns_pid = |pid: u32| match pid {
            10 => Some((container, 1)),
            11 => Some((container, 2)),
            15 => Some((container, 3)),
            12 | 14 => Some((own, pid)),
            13 => Some((other, 1)),
            _ => None,
        };
        let (ns_of, inner) = (|pid| ns_pid(pid).map(|x| x.0), |pid| ns_pid(pid).map(|x| x.1));
        let in_container = |pid, host| OfflineProc { pid_ns: container, host_pid: host, ..p(pid, 0) };
        let offline = [in_container(1, Some(10)), p(14, 0), in_container(3, None)];
        let nvml: Vec<ProcMem> = [10, 11, 11, 12, 13, 14, 15]
            .iter()
            .map(|&pid| ProcMem { pid, used_bytes: MIB })
            .collect();
        let mut v = Verifier::default();
        let start = |pid: u32| Some(u64::from(pid) * 100);
        let none = |_| false;
        assert!(v.check_unregistered(&cfg, &offline, &nvml, own, ns_of, inner, start, none).is_empty(), "one strike");
        let u = v.check_unregistered(&cfg, &offline, &nvml, own, ns_of, inner, start, none);
        assert_eq!(u.len(), 1, "{u:?}");
        assert_eq!((u[0].proc_.host_pid, u[0].proc_.slot, u[0].neighbour), (Some(11), NO_SLOT, 10));
        assert_eq!((u[0].proc_.start_time, u[0].nvml_bytes), (1100, 2 * MIB));
        // Gone from NVML's list, its strikes are forgotten.
        assert!(v.check_unregistered(&cfg, &offline, &nvml[..1], own, ns_of, inner, start, none).is_empty());
        assert!(v.check_unregistered(&cfg, &offline, &nvml, own, ns_of, inner, start, none).is_empty(), "strikes start over");
        // Holding a ledger file (registered in one the monitor moved aside as damaged): a shim's.
        let mut v = Verifier::default();
        for _ in 0..3 {
            assert!(v.check_unregistered(&cfg, &offline, &nvml, own, ns_of, inner, start, |p| p == 11).is_empty());
        }
        // A host-namespace registration alone makes no namespace an offline container's.
        let mut v = Verifier::default();
        for _ in 0..3 {
            assert!(v.check_unregistered(&cfg, &offline[1..2], &nvml, own, ns_of, inner, start, none).is_empty());
        }
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
