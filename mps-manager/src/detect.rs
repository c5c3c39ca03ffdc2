//! Recognises MPS failure patterns (MuxFlow §4.2 "other errors") from periodic observations,
//! and rate-limits the recoveries they trigger.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

/// A failure that calls for recovery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// The control daemon process is gone.
    DaemonDead,
    /// The control daemon did not answer a command in time.
    DaemonHang {
        /// The command that got no answer.
        command: String,
    },
    /// An MPS server that had clients disappeared.
    ServerCrash {
        /// Pid of the server that disappeared.
        server: u32,
    },
    /// Clients are connected, the GPU is idle (no SM activity) and an offline process has
    /// waited for the GPU all along: a synchronizing call entered, none returned and no kernel
    /// launched by that process. An idle client, one that calls nothing, is not stuck.
    ClientsStuck {
        /// How long nothing has progressed, ms.
        for_ms: u64,
        /// The offline processes that waited all that time (pids as the manager sees them).
        #[serde(default)]
        pids: Vec<u32>,
    },
    /// The monitor reported a critical XID (a fault of the GPU itself, e.g. 48, double-bit ECC;
    /// not an application XID such as 31, which MPS handles by tearing down that client).
    Xid {
        /// The XID code.
        code: u64,
    },
    /// A client died holding its context (killed), which hangs every other client of its MPS
    /// server until it is terminated: a registered offline process gone without unregistering,
    /// or a pid an MPS server still lists whose process is gone (seen in two observations in a
    /// row). The second is what the manager sees when the monitor reclaimed the dead process's
    /// ledger registration first.
    ClientDied {
        /// Pid of the dead client.
        pid: u32,
    },
}

impl Fault {
    /// Short snake_case name of the fault's kind (state file counts, logs).
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::DaemonDead => "daemon_dead",
            Fault::DaemonHang { .. } => "daemon_hang",
            Fault::ServerCrash { .. } => "server_crash",
            Fault::ClientsStuck { .. } => "clients_stuck",
            Fault::Xid { .. } => "xid",
            Fault::ClientDied { .. } => "client_died",
        }
    }

    /// Whether recovering from it needs a new control daemon (`quit`, and a kill where it does
    /// not answer): the daemon itself is dead or hung, or the GPU reported a fault of its own.
    /// Otherwise the daemon is sound and ending its servers (`shutdown_server -f`) recovers:
    /// it keeps the pipe, so a client relaunched meanwhile reaches MPS, never the bare GPU.
    pub fn needs_new_daemon(&self) -> bool {
        matches!(self, Fault::DaemonDead | Fault::DaemonHang { .. } | Fault::Xid { .. })
    }
}

/// One look at MPS and the ledger.
#[derive(Debug, Clone, Default)]
pub struct Observation {
    /// Whether the control daemon process is running.
    pub daemon_alive: bool,
    /// `None` when `get_server_list` timed out.
    pub servers: Option<Vec<u32>>,
    /// Clients per server, for the servers that answered.
    pub clients: BTreeMap<u32, Vec<u32>>,
    /// Registered offline processes with a thread in a synchronizing driver call (more entered
    /// than returned, `node_ledger::ProcSnapshot::syncs`), found here holding their slot's lock
    /// and listed by an MPS server as its client. A slot's counts are its writer's word (pod
    /// ledgers are tenant-writable): each process's wait is judged by its own counts alone,
    /// never by another slot's.
    pub offline_waiting: Vec<Waiting>,
    /// Offline processes registered in the ledger.
    pub offline_registered: usize,
    /// Total SM activity published by the monitor, percent.
    pub sm_activity_pct: f64,
    /// Critical XID the monitor reports (Disabled by XID), if any.
    pub xid: Option<u64>,
    /// Offline processes still registered in the ledger whose process is gone.
    pub dead_offline: Vec<u32>,
    /// Clients an MPS server lists whose process is gone (no such pid, or a zombie).
    pub dead_listed: Vec<u32>,
    /// Servers of the previous look whose process still runs (same pid and start time).
    pub servers_alive: Vec<u32>,
}

/// An offline process waiting for the GPU, as one observation saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    /// Its pid, as the manager sees it.
    pub pid: u32,
    /// Its start time (with the pid, the process).
    pub start_time: u64,
    /// Its synchronizing calls returned so far: unchanged between observations, none returned.
    pub ended: u64,
    /// Its kernel launches so far (the shim's count in its slot): unchanged between
    /// observations, it launched nothing.
    pub launches: u64,
}

/// Detection thresholds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DetectConfig {
    /// Connected clients with no progress for this long count as stuck; 0 disables.
    pub stuck_after_ms: u64,
    /// SM activity below this (percent) counts as "no progress".
    pub idle_sm_pct: f64,
}

impl Default for DetectConfig {
    fn default() -> Self {
        DetectConfig {
            stuck_after_ms: 10_000,
            idle_sm_pct: 1.0,
        }
    }
}

/// Memory between observations.
#[derive(Debug, Default)]
pub struct Detector {
    last_clients: BTreeMap<u32, usize>,
    /// Since when (ms) the GPU has been idle with clients connected.
    stalled_since: Option<u64>,
    /// Offline processes waiting for the GPU: (pid, start time) → ((syncs returned, launches),
    /// waiting with none returned and nothing launched since when, ms).
    waiting: BTreeMap<(u32, u64), ((u64, u64), u64)>,
    xid_reported: Option<u64>,
    /// The last observation's [`Observation::dead_listed`]: a listing can lag a clean exit
    /// by a moment, so a dead listed client is a fault only when seen twice in a row.
    dead_listed: Vec<u32>,
    /// Servers with clients missing from the last listing while their process still ran.
    unlisted_alive: Vec<u32>,
}

impl Detector {
    /// Forget everything (after a recovery the world starts afresh).
    pub fn reset(&mut self) {
        let xid = self.xid_reported;
        *self = Detector::default();
        self.xid_reported = xid;
    }

    /// Whether the last observation saw a dead client still listed that a second look will
    /// confirm as [`Fault::ClientDied`] (worth looking again soon).
    pub fn awaits_confirmation(&self) -> bool {
        !self.dead_listed.is_empty()
    }

    /// Takes one observation at `now_ms`; returns the faults it reveals (each reported once).
    pub fn observe(&mut self, cfg: &DetectConfig, now_ms: u64, o: &Observation) -> Vec<Fault> {
        let mut f = Vec::new();
        match o.xid {
            Some(code) if self.xid_reported != Some(code) => {
                self.xid_reported = Some(code);
                f.push(Fault::Xid { code });
            }
            None => self.xid_reported = None,
            _ => {}
        }
        for &pid in &o.dead_offline {
            f.push(Fault::ClientDied { pid });
        }
        for &pid in &o.dead_listed {
            if self.dead_listed.contains(&pid) && !o.dead_offline.contains(&pid) {
                f.push(Fault::ClientDied { pid });
            }
        }
        self.dead_listed = o.dead_listed.clone();
        if !o.daemon_alive {
            f.push(Fault::DaemonDead);
            return f;
        }
        let Some(servers) = &o.servers else {
            f.push(Fault::DaemonHang {
                command: "get_server_list".into(),
            });
            return f;
        };
        // A server with clients missing from the listing has crashed when its process is gone.
        // One whose process still runs was missed by the listing: the real control daemon can
        // accept a connection and close it unanswered while it finishes another command (seen on
        // an H200 right after a `terminate_client`; the empty reply had meant a full reset).
        // Missing twice in a row while alive, it counts as gone from MPS all the same.
        let mut unlisted_alive = Vec::new();
        let mut kept = BTreeMap::new();
        for (&s, &n) in &self.last_clients {
            if n == 0 || servers.contains(&s) {
                continue;
            }
            if o.servers_alive.contains(&s) && !self.unlisted_alive.contains(&s) {
                unlisted_alive.push(s);
                kept.insert(s, n);
            } else {
                f.push(Fault::ServerCrash { server: s });
            }
        }
        self.unlisted_alive = unlisted_alive;
        self.last_clients = servers
            .iter()
            .map(|s| (*s, o.clients.get(s).map_or(0, |c| c.len())))
            .collect();
        self.last_clients.extend(kept);

        let connected: usize = o.clients.values().map(|c| c.len()).sum();
        // SM activity is the monitor's reading; launch counts are each slot's writer's word, so
        // a process's launches speak for that process alone. Before, one sum over every slot
        // was the GPU's progress: a tenant raising its own slot's count at every check (or a
        // slot nobody holds) kept a hung client from ever being stuck.
        let progressing = o.sm_activity_pct >= cfg.idle_sm_pct;
        // Each waiting process since when it has waited with none of its calls returning and
        // no kernel launched.
        self.waiting = o
            .offline_waiting
            .iter()
            .map(|w| {
                let counts = (w.ended, w.launches);
                let since = match self.waiting.get(&(w.pid, w.start_time)) {
                    Some(&(last, since)) if last == counts => since,
                    _ => now_ms,
                };
                ((w.pid, w.start_time), (counts, since))
            })
            .collect();
        if cfg.stuck_after_ms > 0 && connected > 0 && o.offline_registered > 0 && !progressing {
            let since = *self.stalled_since.get_or_insert(now_ms);
            let hung: Vec<u32> = self
                .waiting
                .iter()
                .filter(|(_, &(_, w))| now_ms.saturating_sub(w) >= cfg.stuck_after_ms)
                .map(|(&(pid, _), _)| pid)
                .collect();
            if now_ms.saturating_sub(since) >= cfg.stuck_after_ms && !hung.is_empty() {
                f.push(Fault::ClientsStuck {
                    for_ms: now_ms - since,
                    pids: hung,
                });
                self.stalled_since = None;
            }
        } else {
            self.stalled_since = None;
        }
        f
    }
}

/// Allows at most `max_per_hour` recoveries, at least `min_interval_ms` apart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateConfig {
    /// Shortest time between two recoveries, ms.
    pub min_interval_ms: u64,
    /// Most recoveries in any hour.
    pub max_per_hour: usize,
}

impl Default for RateConfig {
    fn default() -> Self {
        RateConfig {
            min_interval_ms: 30_000,
            max_per_hour: 6,
        }
    }
}

/// Recoveries of the last hour, for [`RateConfig`]'s limits.
#[derive(Debug, Default)]
pub struct RateLimiter {
    history: VecDeque<u64>,
}

impl RateLimiter {
    /// Whether a recovery may start at `now_ms`; records it if so.
    pub fn allow(&mut self, cfg: &RateConfig, now_ms: u64) -> Result<(), String> {
        while self
            .history
            .front()
            .is_some_and(|&t| now_ms.saturating_sub(t) >= 3_600_000)
        {
            self.history.pop_front();
        }
        if let Some(why) = self.refusal(cfg, now_ms) {
            return Err(why);
        }
        self.history.push_back(now_ms);
        Ok(())
    }

    /// Whether [`RateLimiter::allow`] at `now_ms` would let a recovery start (nothing recorded).
    pub fn would_allow(&self, cfg: &RateConfig, now_ms: u64) -> bool {
        self.refusal(cfg, now_ms).is_none()
    }

    /// Why a recovery may not start at `now_ms`, if it may not.
    fn refusal(&self, cfg: &RateConfig, now_ms: u64) -> Option<String> {
        if let Some(&last) = self.history.back() {
            if now_ms.saturating_sub(last) < cfg.min_interval_ms {
                return Some(format!(
                    "last recovery {} ms ago (min_interval_ms {})",
                    now_ms - last,
                    cfg.min_interval_ms
                ));
            }
        }
        let in_hour = self.history.iter().filter(|&&t| now_ms.saturating_sub(t) < 3_600_000).count();
        (in_hour >= cfg.max_per_hour)
            .then(|| format!("{in_hour} recoveries in the last hour (max_per_hour {})", cfg.max_per_hour))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(servers: &[(u32, &[u32])]) -> Observation {
        Observation {
            daemon_alive: true,
            servers: Some(servers.iter().map(|s| s.0).collect()),
            clients: servers.iter().map(|(s, c)| (*s, c.to_vec())).collect(),
            offline_registered: 1,
            sm_activity_pct: 50.0,
            ..Default::default()
        }
    }

    #[test]
    fn dead_daemon_and_hang() {
        let mut d = Detector::default();
        let c = DetectConfig::default();
        assert_eq!(
            d.observe(&c, 0, &Observation::default()),
            vec![Fault::DaemonDead]
        );
        let o = Observation {
            daemon_alive: true,
            servers: None,
            ..Default::default()
        };
        assert!(matches!(
            d.observe(&c, 0, &o)[..],
            [Fault::DaemonHang { .. }]
        ));
    }

    #[test]
    fn server_with_clients_vanishing_is_a_crash_idle_one_is_not() {
        let mut d = Detector::default();
        let c = DetectConfig::default();
        assert!(d
            .observe(&c, 0, &obs(&[(10, &[1, 2]), (11, &[])]))
            .is_empty());
        assert_eq!(
            d.observe(&c, 1, &obs(&[])),
            vec![Fault::ServerCrash { server: 10 }]
        );
    }

    /// A listing that misses a server whose process still runs (the control daemon closed the
    /// connection unanswered) is no crash; the server listed again, nothing happened. Missing
    /// on two looks in a row, it is one.
    #[test]
    fn a_server_missing_from_one_listing_while_alive_is_no_crash() {
        let mut d = Detector::default();
        let c = DetectConfig::default();
        assert!(d.observe(&c, 0, &obs(&[(10, &[1, 2])])).is_empty());
        let mut missed = obs(&[]);
        missed.servers_alive = vec![10];
        assert!(d.observe(&c, 1, &missed).is_empty(), "alive: a missed listing");
        assert!(d.observe(&c, 2, &obs(&[(10, &[1, 2])])).is_empty());
        assert!(d.observe(&c, 3, &missed).is_empty());
        assert_eq!(
            d.observe(&c, 4, &missed),
            vec![Fault::ServerCrash { server: 10 }],
            "missing on the second look in a row"
        );
    }

    /// A detector that calls 100 ms of waiting stuck, and a look at server 10 with `clients`
    /// on an idle GPU.
    fn quiet(clients: &[u32]) -> (Detector, DetectConfig, Observation) {
        let c = DetectConfig {
            stuck_after_ms: 100,
            idle_sm_pct: 1.0,
        };
        let mut o = obs(&[(10, clients)]);
        o.sm_activity_pct = 0.0;
        (Detector::default(), c, o)
    }

    #[test]
    fn stuck_needs_connected_clients_no_launches_and_idle_sm_for_long_enough() {
        let (mut d, c, mut o) = quiet(&[1]);
        o.offline_waiting = vec![Waiting { pid: 1, start_time: 9, ended: 3, launches: 5 }];
        assert!(d.observe(&c, 0, &o).is_empty());
        assert!(d.observe(&c, 50, &o).is_empty());
        o.offline_waiting[0].launches = 6; // its own launch: progress, the timer starts again
        assert!(d.observe(&c, 60, &o).is_empty());
        assert!(d.observe(&c, 100, &o).is_empty());
        assert!(d.observe(&c, 150, &o).is_empty());
        assert_eq!(
            d.observe(&c, 160, &o),
            vec![Fault::ClientsStuck { for_ms: 160, pids: vec![1] }],
            "idle since 0, its wait since 60"
        );
        let mut busy = o.clone();
        busy.sm_activity_pct = 40.0;
        assert!(d.observe(&c, 400, &busy).is_empty());
        assert!(d.observe(&c, 450, &o).is_empty(), "SM activity starts the idle time again");
        assert!(d.observe(&c, 500, &o).is_empty());
        assert!(!d.observe(&c, 550, &o).is_empty());
    }

    /// A slot's launch count is its writer's word: a waiting process's progress is its own
    /// launches and returns alone. Another waiting process whose count rises at every look (a
    /// tenant writing its own slot) does not hide the first one's hang. Before, the launches of
    /// every slot were summed into one GPU-wide progress.
    #[test]
    fn a_waiting_processs_progress_is_its_own_counts_not_anothers() {
        let (mut d, c, mut o) = quiet(&[1, 2]);
        let mut faults = Vec::new();
        for (i, t) in (0..=200).step_by(50).enumerate() {
            o.offline_waiting = vec![
                Waiting { pid: 1, start_time: 9, ended: 3, launches: 5 },
                Waiting { pid: 2, start_time: 9, ended: 0, launches: i as u64 },
            ];
            faults.extend(d.observe(&c, t, &o));
        }
        assert_eq!(faults, vec![Fault::ClientsStuck { for_ms: 100, pids: vec![1] }], "pid 2 launches: not stuck");
    }

    /// An offline job that calls nothing on the GPU (a checkpoint being written, a quiet night)
    /// is idle, not stuck: with no synchronizing call waiting, nothing is a fault however long
    /// the GPU is idle. Before, 10 s of that terminated the job, and its relaunch idling as well
    /// ended the MPS servers, the online client's context with them.
    #[test]
    fn an_idle_client_is_not_stuck_only_one_waiting_with_nothing_returning() {
        let (mut d, c, mut o) = quiet(&[1, 2]);
        for t in (0..=1000).step_by(50) {
            assert!(d.observe(&c, t, &o).is_empty(), "idle at {t} ms");
        }
        // Syncs that keep returning are progress of a kind: nobody has waited all along.
        for (i, t) in (1050..=1500).step_by(50).enumerate() {
            o.offline_waiting = vec![Waiting { pid: 2, start_time: 9, ended: i as u64, launches: 5 }];
            assert!(d.observe(&c, t, &o).is_empty(), "returning at {t} ms");
        }
        // Process 2's call now waits with none returning: stuck once it has for 100 ms.
        assert!(d.observe(&c, 1550, &o).is_empty());
        assert_eq!(
            d.observe(&c, 1600, &o),
            vec![Fault::ClientsStuck { for_ms: 1600, pids: vec![2] }]
        );
        // Another process (same pid, another start time) starts its wait afresh.
        o.offline_waiting[0].start_time = 10;
        assert!(d.observe(&c, 1650, &o).is_empty());
    }

    #[test]
    fn unclean_offline_death_is_a_fault() {
        let mut d = Detector::default();
        let mut o = obs(&[(10, &[1])]);
        o.dead_offline = vec![77];
        assert_eq!(
            d.observe(&DetectConfig::default(), 0, &o),
            vec![Fault::ClientDied { pid: 77 }]
        );
    }

    /// The monitor may reclaim a killed offline process's registration before the manager
    /// looks: the server still listing a dead pid is then the only trace of the hang.
    #[test]
    fn a_dead_client_an_mps_server_keeps_listing_is_a_fault_on_the_second_look() {
        let mut d = Detector::default();
        let c = DetectConfig::default();
        let mut o = obs(&[(10, &[1, 77])]);
        o.dead_listed = vec![77];
        assert!(!d.awaits_confirmation());
        assert!(d.observe(&c, 0, &o).is_empty(), "once: the listing may lag a clean exit");
        assert!(d.awaits_confirmation(), "a second look is due soon");
        assert_eq!(d.observe(&c, 100, &o), vec![Fault::ClientDied { pid: 77 }]);
        o.dead_offline = vec![77];
        assert_eq!(
            d.observe(&c, 200, &o),
            vec![Fault::ClientDied { pid: 77 }],
            "named once when the ledger also has it"
        );
        let gone = obs(&[(10, &[1])]);
        assert!(d.observe(&c, 300, &gone).is_empty());
        assert!(!d.awaits_confirmation());
        let mut back = obs(&[(10, &[1, 78])]);
        back.dead_listed = vec![78];
        assert!(d.observe(&c, 400, &back).is_empty(), "a new dead pid needs its own two looks");
    }

    #[test]
    fn xid_reported_once_per_episode() {
        let mut d = Detector::default();
        let c = DetectConfig::default();
        let mut o = obs(&[]);
        o.xid = Some(31);
        assert_eq!(d.observe(&c, 0, &o), vec![Fault::Xid { code: 31 }]);
        assert!(d.observe(&c, 1, &o).is_empty());
        o.xid = None;
        d.observe(&c, 2, &o);
        o.xid = Some(31);
        assert_eq!(d.observe(&c, 3, &o), vec![Fault::Xid { code: 31 }]);
    }

    #[test]
    fn rate_limit_spacing_and_hourly_cap() {
        let c = RateConfig {
            min_interval_ms: 100,
            max_per_hour: 2,
        };
        let mut r = RateLimiter::default();
        assert!(r.allow(&c, 0).is_ok());
        assert!(!r.would_allow(&c, 50));
        assert!(r.allow(&c, 50).unwrap_err().contains("min_interval_ms"));
        assert!(r.would_allow(&c, 100) && r.would_allow(&c, 100), "asking records nothing");
        assert!(r.allow(&c, 100).is_ok());
        assert!(!r.would_allow(&c, 1000));
        assert!(r.allow(&c, 1000).unwrap_err().contains("max_per_hour"));
        assert!(r.would_allow(&c, 3_600_001));
        assert!(r.allow(&c, 3_600_001).is_ok());
    }
}
