//! Trust but verify: compares what offline processes report in the ledger with NVML's
//! per-process memory and flags those that under-report several checks in a row.

use std::collections::HashMap;

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
            start_time: 1,
            reported_bytes: reported,
            evict_requested_ms: None,
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
