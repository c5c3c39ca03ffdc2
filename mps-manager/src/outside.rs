//! Offline processes doing GPU work outside MPS.
//!
//! CUDA looks for the MPS control daemon once, when it initialises
//! (nvidia-cuda-mps-control(1)): a process that found none (it started before MPS did, or in
//! another `CUDA_MPS_PIPE_DIRECTORY`) runs without MPS for its life. Such an offline job
//! time-slices the GPU with the MPS server that runs the online service, and no MPS
//! active-thread limit applies to it: the offline SM budget does not reach it.
//!
//! A registered offline process is outside MPS when its kernel launches advance (the shim
//! counts them in its ledger slot) while no MPS server lists it, on consecutive complete looks
//! spanning `outside_mps_after_ms`. Identities are compared as the ledger records them (pid
//! namespace and pid there), so a container's process is matched to the host pid MPS lists.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::{Deserialize, Serialize};

/// What the manager does with an offline process found outside MPS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OutsideAction {
    /// SIGTERM (the monitor's SIGKILL-after-grace rules apply), restart requested: restarted,
    /// it finds the control daemon and runs under MPS with the budget.
    #[default]
    Evict,
    /// An ERROR line and a count in the state file; the process keeps running.
    Report,
}

/// A registered offline process, as the ledger shows it, judged by [`Outside::look`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Inode of the pid namespace it registered from.
    pub pid_ns: u64,
    /// Its pid there.
    pub pid: u32,
    /// Its start time.
    pub start_time: u64,
    /// Kernel launches it has issued.
    pub launches: u64,
}

type Key = (u64, u32, u64);

fn key(c: &Candidate) -> Key {
    (c.pid_ns, c.pid, c.start_time)
}

/// A process unlisted on every complete look since `since_ms`.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// The first look of the run (ms).
    since_ms: u64,
    /// Its launches then.
    launches: u64,
    /// Complete looks in the run.
    looks: u32,
}

/// The clients MPS lists, as the ledger names processes.
#[derive(Debug, Default)]
pub struct Listed {
    /// `(pid namespace inode, pid there)` of each listed client whose namespace was read.
    pub known: HashSet<(u64, u32)>,
    /// Some listed client's namespace could not be read: only processes of the manager's own
    /// namespace (whose pids are the listed ones) can be judged.
    pub unknown: bool,
}

/// Tracks registered offline processes across looks; reports each found outside MPS once.
#[derive(Debug, Default)]
pub struct Outside {
    seen: BTreeMap<Key, Seen>,
    reported: BTreeSet<Key>,
}

impl Outside {
    /// One complete look (every server's client list read): `candidates` are the live
    /// registered offline processes the manager has not evicted or terminated itself. Returns
    /// those found outside MPS, each once in its life: unlisted on every look of a run of at
    /// least two complete looks over at least `after_ms`, having launched kernels during it
    /// (the shim adds its count to the ledger a few times a second, so two close looks may
    /// see the same count).
    pub fn look(
        &mut self,
        now_ms: u64,
        after_ms: u64,
        own_ns: u64,
        listed: &Listed,
        candidates: &[Candidate],
    ) -> Vec<Candidate> {
        let mut out = Vec::new();
        for c in candidates {
            let k = key(c);
            let on_mps = listed.known.contains(&(c.pid_ns, c.pid));
            let judged = c.pid_ns == own_ns || !listed.unknown;
            if on_mps || !judged {
                self.seen.remove(&k);
                continue;
            }
            let s = self.seen.entry(k).or_insert(Seen { since_ms: now_ms, launches: c.launches, looks: 0 });
            s.looks += 1;
            let (over, worked) = (now_ms.saturating_sub(s.since_ms) >= after_ms, c.launches > s.launches);
            if s.looks >= 2 && over && worked && self.reported.insert(k) {
                out.push(*c);
            }
        }
        let live: BTreeSet<Key> = candidates.iter().map(key).collect();
        self.seen.retain(|k, _| live.contains(k));
        self.reported.retain(|k| live.contains(k));
        out
    }

    /// A look that could not see every server's clients (MPS did not answer, or a fault is
    /// being handled): every run starts again.
    pub fn interrupted(&mut self) {
        self.seen.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: u64 = 4026531836;
    const CONTAINER: u64 = 4026532999;

    fn cand(pid_ns: u64, pid: u32, launches: u64) -> Candidate {
        Candidate { pid_ns, pid, start_time: 1000 + pid as u64, launches }
    }

    fn listed(ids: &[(u64, u32)], unknown: bool) -> Listed {
        Listed { known: ids.iter().copied().collect(), unknown }
    }

    /// Runs looks every 500 ms with launches advancing by 10 each; returns the look (1-based)
    /// at which `c` is reported, if any.
    fn reported_at(t: &mut Outside, l: &Listed, c: Candidate, looks: u32) -> Option<u32> {
        (0..looks).find_map(|i| {
            let c = Candidate { launches: c.launches + 10 * i as u64, ..c };
            (!t.look(i as u64 * 500, 2000, NS, l, &[c]).is_empty()).then_some(i + 1)
        })
    }

    #[test]
    fn working_unlisted_over_the_window_is_reported_once() {
        let mut t = Outside::default();
        // Outside from the first look (t=0) to t=2000.
        assert_eq!(reported_at(&mut t, &listed(&[], false), cand(NS, 7, 1), 10), Some(5));
        let more = cand(NS, 7, 1000);
        assert!(t.look(9000, 2000, NS, &listed(&[], false), &[more]).is_empty(), "once");
    }

    #[test]
    fn a_listed_client_is_on_mps_whatever_it_launches() {
        let mut t = Outside::default();
        assert_eq!(reported_at(&mut t, &listed(&[(NS, 7)], false), cand(NS, 7, 1), 20), None);
    }

    #[test]
    fn an_idle_process_is_not_judged_until_it_launches() {
        let mut t = Outside::default();
        let l = listed(&[], false);
        for i in 0..20 {
            assert!(t.look(i * 500, 2000, NS, &l, &[cand(NS, 7, 5)]).is_empty());
        }
        assert_eq!(t.look(10_000, 2000, NS, &l, &[cand(NS, 7, 6)]).len(), 1, "outside all along");
    }

    #[test]
    fn counts_flushed_between_looks_are_enough() {
        // Looks every 100 ms, the count changing every 250 ms: most looks see no change.
        let mut t = Outside::default();
        let l = listed(&[], false);
        let found = (0..30u64).find(|i| {
            let c = cand(NS, 7, 1 + (i * 100 / 250) * 50);
            !t.look(i * 100, 500, NS, &l, &[c]).is_empty()
        });
        assert_eq!(found, Some(5), "at t=500 ms, the count having moved at t=250");
    }

    #[test]
    fn a_container_process_is_matched_by_its_namespace_and_pid() {
        let mut t = Outside::default();
        // Listed under its container pid: on MPS. The same pid in another namespace is not it.
        let on = listed(&[(CONTAINER, 7)], false);
        assert_eq!(reported_at(&mut t, &on, cand(CONTAINER, 7, 1), 20), None);
        let mut t = Outside::default();
        assert_eq!(reported_at(&mut t, &listed(&[(NS, 7)], false), cand(CONTAINER, 7, 1), 20), Some(5));
    }

    #[test]
    fn an_unreadable_listed_client_leaves_other_namespaces_unjudged() {
        let mut t = Outside::default();
        assert_eq!(reported_at(&mut t, &listed(&[], true), cand(CONTAINER, 7, 1), 20), None);
        let mut t = Outside::default();
        assert_eq!(reported_at(&mut t, &listed(&[], true), cand(NS, 7, 1), 20), Some(5));
    }

    #[test]
    fn one_listed_look_or_an_interrupted_one_starts_the_window_again() {
        let mut t = Outside::default();
        let none = listed(&[], false);
        let on = listed(&[(NS, 7)], false);
        let mut n = 1;
        let mut look = |t: &mut Outside, at: u64, l: &Listed| {
            n += 10;
            t.look(at, 2000, NS, l, &[cand(NS, 7, n)])
        };
        for at in [0, 500, 1000, 1500] {
            assert!(look(&mut t, at, &none).is_empty());
        }
        assert!(look(&mut t, 2000, &on).is_empty(), "listed once: the window restarts");
        for at in [2500, 3000, 3500, 4000] {
            assert!(look(&mut t, at, &none).is_empty(), "{at}");
        }
        t.interrupted();
        for at in [4500, 5000, 5500, 6000] {
            assert!(look(&mut t, at, &none).is_empty(), "{at}");
        }
        assert_eq!(look(&mut t, 6500, &none).len(), 1);
    }

    #[test]
    fn a_process_that_left_the_ledger_is_forgotten() {
        let mut t = Outside::default();
        assert_eq!(reported_at(&mut t, &listed(&[], false), cand(NS, 7, 1), 10), Some(5));
        assert!(t.look(9000, 2000, NS, &listed(&[], false), &[]).is_empty());
        assert!(t.seen.is_empty() && t.reported.is_empty());
    }
}
