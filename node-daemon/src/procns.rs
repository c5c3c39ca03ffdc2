//! A host pid as the ledger knows the process: its pid namespace and its pid there.
//!
//! Offline processes register in the ledger from their container, under the pid their own
//! (innermost) pid namespace gives them; NVML and the MPS control daemon name them by their
//! pid in the host's namespace, where the daemons run. `/proc/<pid>/ns/pid` (the namespace's
//! inode) and the last `NSpid:` entry of `/proc/<pid>/status` (the pid in that namespace)
//! turn the second into the first (Linux 4.1+).
//!
//! Every offline process can write every slot of the ledger, so a slot's pid is a claim: the
//! daemons take it only for a process that holds the ledger file open ([`holds_open`]), as
//! every shimmed process does and no online service does.

use std::collections::{HashMap, HashSet};

use node_ledger::LedgerFile;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

/// `pid` (in this process's pid namespace) as the process sees itself: `(pid namespace inode,
/// pid in it)`, what its ledger registration records as `pid_ns` and `pid`. `None` when the
/// process is gone or its namespace cannot be read (another user's process, without
/// `CAP_SYS_PTRACE`).
pub fn ns_pid(pid: u32) -> Option<(u64, u32)> {
    let ns = pid_ns(pid)?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some((ns, innermost_pid(&status)?))
}

/// Inode of `pid`'s pid namespace (one `stat`); `None` when it is gone or unreadable.
pub fn pid_ns(pid: u32) -> Option<u64> {
    Some(std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?.ino())
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
        if self::pid_ns(host)? != pid_ns {
            return None;
        }
        let status = std::fs::read_to_string(format!("/proc/{host}/status")).ok()?;
        (innermost_pid(&status)? == pid && node_ledger::procinfo::start_time(host)? == start_time).then_some(host)
    })
}

/// Whether process `pid` (in this process's pid namespace) holds `file` open: one of its fds
/// names it (`stat` through `/proc/<pid>/fd/<n>`, so bind mounts do not matter; with
/// `AT_STATX_DONT_SYNC`, so a hung network or FUSE file system among its fds cannot stall the
/// caller), and for a deleted file that fd's link says so. `false` when its fds cannot be read
/// (gone, or another user's process without `CAP_SYS_PTRACE`).
pub fn holds_open(pid: u32, file: &LedgerFile) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    dir.flatten().any(|e| {
        let path = e.path();
        let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
            return false;
        };
        // SAFETY: statx(2) on a NUL-terminated path we own (absolute, so AT_FDCWD is not
        // used), writing into a zeroed plain-data struct of the size libc declares.
        let mut stx: libc::statx = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), libc::AT_STATX_DONT_SYNC, libc::STATX_INO, &mut stx) };
        if r != 0 || stx.stx_ino != file.ino || libc::makedev(stx.stx_dev_major, stx.stx_dev_minor) != file.dev {
            return false;
        }
        !file.deleted || std::fs::read_link(&path).is_ok_and(|l| l.as_os_str().as_bytes().ends_with(b" (deleted)"))
    })
}

/// A process as the ledger names it: pid namespace inode, pid there, start time.
pub type Registered = (u64, u32, u64);

/// Host pids of registered processes: [`find_host_pid`] (the pid itself in this namespace,
/// with its start time checked), kept only for a process that holds its slot's ledger file
/// open ([`holds_open`]). Any ledger client can write any slot, and a slot's pid and start
/// time are all it says of its owner; a process that holds no ledger file (an online service)
/// is nobody's offline process, whatever a slot says: without a host pid it is never
/// signalled, never terminated on MPS and never counted as offline work. Each is found once
/// and kept while it is asked for; one not found, or found not holding the file, is looked
/// for again after a back-off (1 s doubling to 64 s), so a process the daemon cannot see
/// costs it a `/proc` walk a minute at most.
#[derive(Debug)]
pub struct HostPids {
    own_ns: u64,
    found: HashMap<Registered, u32>,
    missed: HashMap<Registered, (Instant, Duration)>,
    /// Registrations already reported as naming a process that holds no ledger file.
    refused: HashSet<Registered>,
}

impl Default for HostPids {
    fn default() -> Self {
        HostPids {
            own_ns: node_ledger::procinfo::own_pid_ns(),
            found: HashMap::new(),
            missed: HashMap::new(),
            refused: HashSet::new(),
        }
    }
}

impl HostPids {
    /// The host pid of `(pid_ns, pid, start_time)`, whose slot's owner holds `file` open
    /// ([`node_ledger::ProcSnapshot::ledger_file`]); `None` while no such process is found
    /// (see [`HostPids`]). A pid of this namespace that no live process has is its own host
    /// pid (a registered process that died before it was found); one a live process with
    /// another start time has now is not (that process is someone else).
    pub fn get(&mut self, r: Registered, file: &LedgerFile) -> Option<u32> {
        let (pid_ns, pid, start_time) = r;
        if let Some(&h) = self.found.get(&r) {
            return Some(h);
        }
        let now = Instant::now();
        if let Some(&(at, wait)) = self.missed.get(&r) {
            if now < at + wait {
                return None;
            }
        }
        if pid_ns == self.own_ns && node_ledger::procinfo::is_gone(pid) {
            // Dead before it was ever seen here (or a slot naming a pid nobody has): no live
            // process has this pid, so what is done to it reaches nobody else (MPS may still
            // list a dead client by it). Not kept: the pid may be reused.
            return Some(pid);
        }
        let host = if pid_ns == self.own_ns {
            (node_ledger::procinfo::start_time(pid) == Some(start_time)).then_some(pid)
        } else {
            find_host_pid(pid_ns, pid, start_time)
        };
        match host {
            Some(h) if holds_open(h, file) => {
                self.missed.remove(&r);
                self.found.insert(r, h);
                Some(h)
            }
            _ => {
                if let Some(h) = host {
                    if self.refused.insert(r) {
                        let comm = std::fs::read_to_string(format!("/proc/{h}/comm")).unwrap_or_default();
                        tracing::warn!(
                            pid,
                            pid_ns,
                            host_pid = h,
                            comm = comm.trim(),
                            ledger_ino = file.ino,
                            "a ledger slot names a process that holds no ledger file open: it is not \
                             treated as offline work and is never signalled (a slot written by another \
                             ledger client, or a process that closed its ledger files)"
                        );
                    }
                }
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
        self.refused.retain(|r| keep(r));
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
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = ledger_file(&dir);
        // The sleep holds the file open (fd 9), as a ledger client does.
        let child = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "sh", "-c", "exec sleep 30 9<>\"$0\""])
            .arg(&path)
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
        assert!(wait_holding(host, &file), "the stand-in never held the file");
        let (ns, inner) = ns_pid(host).expect("readable");
        assert_eq!(inner, 1, "the first process of its namespace");
        assert_ne!(ns, node_ledger::procinfo::own_pid_ns());
        let st = node_ledger::procinfo::start_time(host).unwrap();
        assert_eq!(find_host_pid(ns, 1, st), Some(host));
        assert_eq!(find_host_pid(ns, 1, st + 1), None, "another start time is another process");
        let mut h = HostPids::default();
        let other = LedgerFile { ino: file.ino + 1, ..file };
        assert_eq!(h.get((ns, 1, st), &other), None, "it holds another file than the ledger");
        let mut h = HostPids::default();
        assert_eq!(h.get((ns, 1, st), &file), Some(host));
        assert_eq!(h.get((ns, 2, st), &file), None);
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
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = ledger_file(&dir);
        let ns = node_ledger::procinfo::own_pid_ns();
        assert_eq!(HostPids::default().get((ns, me, st), &file), None, "not holding it yet");
        let held = std::fs::File::open(&path).unwrap();
        assert_eq!(HostPids::default().get((ns, me, st), &file), Some(me));
        assert_eq!(HostPids::default().get((ns, me, st + 1), &file), None, "another start time");
        drop(held);
    }

    /// A file to play the ledger: its path and identity.
    fn ledger_file(dir: &tempfile::TempDir) -> (std::path::PathBuf, LedgerFile) {
        let path = dir.path().join("ledger");
        std::fs::write(&path, b"x").unwrap();
        let file = LedgerFile::of_path(&path).unwrap();
        (path, file)
    }

    /// Waits until `pid`'s fds name `file` (a spawned shell opens it before it execs).
    fn wait_holding(pid: u32, file: &LedgerFile) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if holds_open(pid, file) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// A slot naming a live process of this namespace by its exact pid and start time (what a
    /// ledger client can read of a neighbour it sees, and write into any slot) gets no host pid
    /// while that process holds no ledger file: an online service is never anybody's offline
    /// process. The same process holding the file is found.
    #[test]
    fn a_process_holding_no_ledger_file_is_nobodys_offline_process() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = ledger_file(&dir);
        let ns = node_ledger::procinfo::own_pid_ns();
        let mut online = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let mut offline = std::process::Command::new("sh")
            .args(["-c", "exec sleep 30 9<>\"$0\""])
            .arg(&path)
            .spawn()
            .unwrap();
        let (on, off) = (online.id(), offline.id());
        assert!(wait_holding(off, &file), "the offline stand-in never held the file");
        let st_on = node_ledger::procinfo::start_time(on).unwrap();
        let st_off = node_ledger::procinfo::start_time(off).unwrap();
        let mut h = HostPids::default();
        assert_eq!(h.get((ns, on, st_on), &file), None, "a forged slot naming the online process");
        assert_eq!(h.get((ns, on, st_on), &file), None, "asked again within the back-off");
        assert_eq!(h.get((ns, off, st_off), &file), Some(off));
        assert!(!holds_open(on, &file));
        assert_eq!(h.get((ns, on, st_on + 1), &file), None, "its pid under another start time");
        // A dead registration of this namespace keeps its pid (MPS may list a dead client);
        // one refused before stays refused until its back-off ends.
        let _ = online.kill();
        let _ = online.wait();
        assert_eq!(h.get((ns, on, st_on), &file), None, "refused a moment ago: backed off");
        let mut fresh = HostPids::default();
        assert_eq!(fresh.get((ns, on, st_on), &file), Some(on), "dead and reaped: nobody has its pid");
        assert_eq!(fresh.get((ns, on, st_on), &file), Some(on), "not kept, looked at again");
        // A deleted ledger is held only as deleted: the flag must match what the fd's link says.
        assert!(!holds_open(off, &LedgerFile { deleted: true, ..file }), "not deleted yet");
        std::fs::remove_file(&path).unwrap();
        assert!(holds_open(off, &LedgerFile { deleted: true, ..file }));
        for c in [&mut online, &mut offline] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
