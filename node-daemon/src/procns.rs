//! A host pid as the ledger knows the process: its pid namespace and its pid there.
//!
//! Offline processes register in the ledger from their container, under the pid their own
//! (innermost) pid namespace gives them; NVML and the MPS control daemon name them by their
//! pid in the host's namespace, where the daemons run. `/proc/<pid>/ns/pid` (the namespace's
//! inode) and the last `NSpid:` entry of `/proc/<pid>/status` (the pid in that namespace)
//! turn the second into the first (Linux 4.1+).

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

/// `pid` (in this process's pid namespace) as the process sees itself: `(pid namespace inode,
/// pid in it)`, what its ledger registration records as `pid_ns` and `pid`. `None` when the
/// process is gone or its namespace cannot be read (another user's process, without
/// `CAP_SYS_PTRACE`).
pub fn ns_pid(pid: u32) -> Option<(u64, u32)> {
    let ns = std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?.ino();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some((ns, innermost_pid(&status)?))
}

/// The last pid of the `NSpid:` line of a `/proc/<pid>/status` text: the pid in the
/// process's own pid namespace.
pub fn innermost_pid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// The pid, in this process's pid namespace, of the process that is `pid` in the pid namespace
/// whose inode is `pid_ns` and started at `start_time` (clock ticks since boot): `pid` itself
/// in this namespace, else found by a walk of `/proc` (one `stat` per process, the status and
/// stat of those in that namespace). `None` when no such process is visible from here.
pub fn find_host_pid(pid_ns: u64, pid: u32, start_time: u64) -> Option<u32> {
    let own = node_ledger::procinfo::own_pid_ns();
    if pid_ns == own {
        return (node_ledger::procinfo::start_time(pid) == Some(start_time)).then_some(pid);
    }
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let host: u32 = e.file_name().to_str()?.parse().ok()?;
        let ns = std::fs::metadata(format!("/proc/{host}/ns/pid")).ok()?.ino();
        if ns != pid_ns {
            return None;
        }
        let status = std::fs::read_to_string(format!("/proc/{host}/status")).ok()?;
        (innermost_pid(&status)? == pid && node_ledger::procinfo::start_time(host)? == start_time).then_some(host)
    })
}

/// A process as the ledger names it: pid namespace inode, pid there, start time.
pub type Registered = (u64, u32, u64);

/// Host pids of registered processes ([`find_host_pid`]), each found once and kept while it is
/// asked for; one not found is looked for again after a back-off (1 s doubling to 64 s), so a
/// process the daemon cannot see costs it a `/proc` walk a minute at most.
#[derive(Debug)]
pub struct HostPids {
    own_ns: u64,
    found: HashMap<Registered, u32>,
    missed: HashMap<Registered, (Instant, Duration)>,
}

impl Default for HostPids {
    fn default() -> Self {
        HostPids { own_ns: node_ledger::procinfo::own_pid_ns(), found: HashMap::new(), missed: HashMap::new() }
    }
}

impl HostPids {
    /// The host pid of `(pid_ns, pid, start_time)`: `pid` in this namespace (no lookup), else
    /// the one found, `None` while it is not (see [`HostPids`]).
    pub fn get(&mut self, r: Registered) -> Option<u32> {
        let (pid_ns, pid, start_time) = r;
        if pid_ns == self.own_ns {
            return Some(pid);
        }
        if let Some(&h) = self.found.get(&r) {
            return Some(h);
        }
        let now = Instant::now();
        if let Some(&(at, wait)) = self.missed.get(&r) {
            if now < at + wait {
                return None;
            }
        }
        match find_host_pid(pid_ns, pid, start_time) {
            Some(h) => {
                self.missed.remove(&r);
                self.found.insert(r, h);
                Some(h)
            }
            None => {
                let wait = self.missed.get(&r).map_or(Duration::from_secs(1), |&(_, w)| (w * 2).min(Duration::from_secs(64)));
                self.missed.insert(r, (now, wait));
                None
            }
        }
    }

    /// Forgets every process but those `keep` names (call with the registrations of the moment).
    pub fn retain(&mut self, keep: impl Fn(&Registered) -> bool) {
        self.found.retain(|r, _| keep(r));
        self.missed.retain(|r, _| keep(r));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn innermost_pid_is_the_last_nspid_entry() {
        let status = "Name:\tpython3\nTgid:\t4242\nPid:\t4242\nNSpid:\t4242\t17\nPPid:\t1\n";
        assert_eq!(innermost_pid(status), Some(17));
        assert_eq!(innermost_pid("Name:\tx\nNSpid:\t99\n"), Some(99));
        assert_eq!(innermost_pid("Name:\tx\n"), None, "a kernel without NSpid");
        assert_eq!(innermost_pid("NSpid:\t\n"), None);
        assert_eq!(innermost_pid("NSpid:\tx\n"), None);
    }

    /// A child in a new pid namespace (`unshare --pid --fork`, root only; said and skipped
    /// otherwise) is found from here by its namespace, its pid there and its start time.
    #[test]
    fn a_process_of_another_pid_namespace_is_found_by_its_namespace_and_pid() {
        let child = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "sleep", "30"])
            .spawn();
        let Ok(mut child) = child else {
            eprintln!("no unshare: skipped");
            return;
        };
        // The sleep is the unshare process's child, pid 1 of the new namespace.
        let deadline = Instant::now() + Duration::from_secs(5);
        let host = loop {
            let kids = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id())).unwrap_or_default();
            if let Some(h) = kids.split_whitespace().next().and_then(|k| k.parse::<u32>().ok()) {
                break Some(h);
            }
            if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let Some(host) = host else {
            let _ = child.kill();
            eprintln!("unshare --pid refused (not root?): skipped");
            return;
        };
        let (ns, inner) = ns_pid(host).expect("readable");
        assert_eq!(inner, 1, "the first process of its namespace");
        assert_ne!(ns, node_ledger::procinfo::own_pid_ns());
        let st = node_ledger::procinfo::start_time(host).unwrap();
        assert_eq!(find_host_pid(ns, 1, st), Some(host));
        assert_eq!(find_host_pid(ns, 1, st + 1), None, "another start time is another process");
        let mut h = HostPids::default();
        assert_eq!(h.get((ns, 1, st)), Some(host));
        assert_eq!(h.get((ns, 2, st)), None);
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn this_process_is_itself_in_its_own_namespace() {
        let me = std::process::id();
        assert_eq!(ns_pid(me), Some((node_ledger::procinfo::own_pid_ns(), me)));
        assert_eq!(ns_pid(u32::MAX), None);
        let st = node_ledger::procinfo::start_time(me).unwrap();
        assert_eq!(find_host_pid(node_ledger::procinfo::own_pid_ns(), me, st), Some(me));
        assert_eq!(HostPids::default().get((node_ledger::procinfo::own_pid_ns(), me, st)), Some(me));
    }
}
