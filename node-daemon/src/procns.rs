//! A host pid as the ledger knows the process: its pid namespace and its pid there.
//!
//! Offline processes register in the ledger from their container, under the pid their own
//! (innermost) pid namespace gives them; NVML and the MPS control daemon name them by their
//! pid in the host's namespace, where the daemons run. `/proc/<pid>/ns/pid` (the namespace's
//! inode) and the last `NSpid:` entry of `/proc/<pid>/status` (the pid in that namespace)
//! turn the second into the first (Linux 4.1+).
//!
//! Every offline process can write every slot of the ledger, so a slot's pid is a claim: the
//! daemons take it only for a process that holds that slot's lock in the ledger file
//! ([`holds_lock`]), as every shimmed process does for its own slot, and no online service or
//! daemon does.

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

/// The most fds of one process examined for a ledger file ([`holds_open`], [`holds_lock`]), in
/// the ascending order `/proc/<pid>/fd` lists them. Each costs a `statx` (and an fdinfo read
/// for one that names the file), and a process may hold a million fds (`dup` of one): read
/// whole, one process stalled the root daemon that looked at it for seconds. A shim's ledger
/// descriptions are opened at its first reservation, at the lowest free fd, so a process busy
/// with thousands of fds is still proven; past the cap, one whose ledger fd was not among the
/// first is not (said once, with its pid), and is then no ledger client: its GPU work is
/// judged as work without the shim.
pub const MAX_FDS_EXAMINED: usize = 4096;

/// The most bytes of one fd's `/proc/<pid>/fdinfo` read: a description holding thousands of
/// locks lists each; a slot's owner holds one or two on the file.
const MAX_FDINFO_BYTES: u64 = 64 * 1024;

/// The most distinct locks on one ledger file kept for one process ([`HostPids`]'s cache of a
/// round): a genuine owner holds one per slot it registered in, the claims lock at times.
const MAX_LOCKS_KEPT: usize = 1024;

/// The most fdinfo files of one process read for one ledger file: the kernel writes each in
/// whole (a description's every lock, and the walk of the file's lock list) whatever part is
/// read, and fds that `dup` one description all list the same locks, so a process with
/// thousands of such fds cost thousands of reads within [`MAX_FDS_EXAMINED`]. A shim holds
/// its locks through the one description it opened.
const MAX_FDINFO_READS: usize = 8;

/// What a look at `pid`'s fds found of `file`: through how many of them, and whether the look
/// stopped at [`MAX_FDS_EXAMINED`] with fds left unexamined.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct FdScan {
    examined: usize,
    cut: bool,
    /// fdinfo files read ([`held_locks`]).
    fdinfo_reads: usize,
}

/// Calls `on` with the fd number of each of `pid`'s first [`MAX_FDS_EXAMINED`] fds that names
/// `file` ([`names_file`]) until it returns `true`. `None` when its fds cannot be read (gone,
/// or another user's process without `CAP_SYS_PTRACE`).
fn scan_fds(pid: u32, file: &LedgerFile, mut on: impl FnMut(&std::ffi::OsStr) -> bool) -> Option<FdScan> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    let mut scan = FdScan::default();
    for e in dir.flatten() {
        if scan.examined == MAX_FDS_EXAMINED {
            scan.cut = true;
            break;
        }
        scan.examined += 1;
        if names_file(&e.path(), file) && on(&e.file_name()) {
            break;
        }
    }
    Some(scan)
}

/// Says, once per process (by pid, the last few hundred remembered), that `pid` was not
/// proven to hold `file` because it has more fds than [`MAX_FDS_EXAMINED`].
fn say_too_many_fds(pid: u32, file: &LedgerFile) {
    static SAID: std::sync::Mutex<std::collections::VecDeque<u32>> = std::sync::Mutex::new(std::collections::VecDeque::new());
    let mut said = SAID.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if said.contains(&pid) {
        return;
    }
    if said.len() == 256 {
        said.pop_front();
    }
    said.push_back(pid);
    drop(said);
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    tracing::error!(
        pid,
        comm = comm.trim(),
        ledger_ino = file.ino,
        max_fds = MAX_FDS_EXAMINED,
        "a process has more fds than the daemons examine and none of its first ones holds the ledger: it is not \
         taken for a ledger client (not proven to own a slot, nor to hold the ledger open)"
    );
}

/// Whether process `pid` (in this process's pid namespace) holds `file` open: one of its first
/// [`MAX_FDS_EXAMINED`] fds names it (`stat` through `/proc/<pid>/fd/<n>`, so bind mounts do
/// not matter; with `AT_STATX_DONT_SYNC`, so a hung network or FUSE file system among its fds
/// cannot stall the caller), and for a deleted file that fd's link says so. `false` when its
/// fds cannot be read (gone, or another user's process without `CAP_SYS_PTRACE`), and when
/// none of the fds examined names it (said once if fds were left unexamined).
pub fn holds_open(pid: u32, file: &LedgerFile) -> bool {
    let mut open = false;
    let scan = scan_fds(pid, file, |_| {
        open = true;
        true
    });
    if !open && scan.is_some_and(|s| s.cut) {
        say_too_many_fds(pid, file);
    }
    open
}

/// Whether process `pid` holds an `F_OFD_SETLK` write lock on `file` within the byte range
/// `lock` = `(start, len)` (its ledger slot's: [`node_ledger::ProcSnapshot::owner_lock`]), on
/// one of its fds that names `file` as [`holds_open`] judges it (among its first
/// [`MAX_FDS_EXAMINED`]). Read from `/proc/<pid>/fdinfo/<n>`, whose `lock:` lines list the
/// locks held through that open file description. What only a slot's owner has: every ledger
/// client can write a slot naming any process, and the daemons hold every ledger open
/// themselves, but nobody can make another process hold a lock.
pub fn holds_lock(pid: u32, file: &LedgerFile, lock: (u64, u64)) -> bool {
    let (held, scan) = held_locks(pid, file);
    let holds = held.iter().any(|&h| within(h, lock));
    if !holds && scan.cut {
        say_too_many_fds(pid, file);
    }
    holds
}

/// The OFD write locks, `(first, last)` byte, that process `pid` holds on `file` through its
/// fds that name it ([`holds_lock`]; at most [`MAX_LOCKS_KEPT`] distinct ones), with what the
/// look at its fds did; none when its fds cannot be read.
fn held_locks(pid: u32, file: &LedgerFile) -> (Vec<(u64, u64)>, FdScan) {
    use std::io::Read;
    let mut held = HashSet::new();
    let mut reads = 0;
    let scan = scan_fds(pid, file, |fd| {
        if reads == MAX_FDINFO_READS {
            return true;
        }
        reads += 1;
        let mut t = String::new();
        let read = std::fs::File::open(format!("/proc/{pid}/fdinfo/{}", fd.to_string_lossy()))
            .and_then(|f| f.take(MAX_FDINFO_BYTES).read_to_string(&mut t));
        if read.is_ok() {
            // A cut read ends in part of a line, whose numbers would be others: left out.
            let whole = if t.len() as u64 == MAX_FDINFO_BYTES { &t[..t.rfind('\n').map_or(0, |i| i + 1)] } else { &t[..] };
            for l in whole.lines().filter_map(|l| ofd_lock(l, file)) {
                if held.len() == MAX_LOCKS_KEPT {
                    return true;
                }
                held.insert(l);
            }
        }
        // The first description holding locks on the file is the one a shim holds all its
        // slots' locks through: the look ends there, so a busy process (its ledger fd low
        // among thousands) costs the fds up to it, not thousands. A process that keeps its
        // locks behind another description only goes unproven itself.
        !held.is_empty()
    });
    let scan = scan.map(|s| FdScan { fdinfo_reads: reads, ..s });
    (held.into_iter().collect(), scan.unwrap_or_default())
}

/// Whether a lock on bytes `first..=last` lies within `lock` = `(start, len)`.
fn within((first, last): (u64, u64), lock: (u64, u64)) -> bool {
    first >= lock.0 && last < lock.0.saturating_add(lock.1)
}

/// Whether one `lock:` line of an fdinfo file is an OFD write lock on `file` within `lock`.
#[cfg(test)]
fn ofd_lock_within(line: &str, file: &LedgerFile, lock: (u64, u64)) -> bool {
    ofd_lock(line, file).is_some_and(|held| within(held, lock))
}

/// The bytes `(first, last)` of one `lock:` line of an fdinfo file if it is an OFD write lock
/// on `file`: `lock:\t1: OFDLCK ADVISORY  WRITE -1 fe:00:10010904 4099 4099` (device
/// major:minor in hex, inode, first and last byte; `EOF` for a lock to the end, never within
/// a slot).
fn ofd_lock(line: &str, file: &LedgerFile) -> Option<(u64, u64)> {
    let rest = line.strip_prefix("lock:")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // A blocked waiter's line has `->` after the number: not a lock held.
    if f.len() < 8 || f[1] != "OFDLCK" || f[3] != "WRITE" {
        return None;
    }
    let mut id = f[5].split(':');
    let (maj, min, ino) = (id.next()?, id.next()?, id.next()?);
    let (maj, min, ino) = (u32::from_str_radix(maj, 16).ok()?, u32::from_str_radix(min, 16).ok()?, ino.parse::<u64>().ok()?);
    let (first, last) = (f[6].parse::<u64>().ok()?, f[7].parse::<u64>().ok()?);
    (libc::makedev(maj, min) == file.dev && ino == file.ino).then_some((first, last))
}

/// Whether the fd at `/proc/<pid>/fd/<n>` names `file` (see [`holds_open`]).
fn names_file(path: &std::path::Path, file: &LedgerFile) -> bool {
    use std::os::unix::ffi::OsStrExt;
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
    !file.deleted || std::fs::read_link(path).is_ok_and(|l| l.as_os_str().as_bytes().ends_with(b" (deleted)"))
}

/// A process as the ledger names it: pid namespace inode, pid there, start time.
pub type Registered = (u64, u32, u64);

/// One slot's registration: the ledger file, the slot's lock range (`(start, len)`,
/// [`node_ledger::ProcSnapshot::owner_lock`]) and the process it names. [`HostPids`] keeps
/// what it found by this, never by the identity alone: any ledger client can copy another
/// process's identity into a slot of its own, and only the holder of a slot's lock owns it.
pub type SlotKey = (LedgerFile, (u64, u64), Registered);

/// One walk of `/proc`, shared by every lookup of a round ([`HostPids::retain`] starts the
/// next): each process's pid namespace (one `stat`), and for the namespaces a lookup asks
/// about, each of their processes' pid there (its status, read once). However many slots
/// name other pid namespaces, a round costs one walk. A process that started after the walk
/// is found in a later round (its slot is backed off meanwhile).
#[derive(Debug)]
struct ProcWalk {
    by_ns: HashMap<u64, Vec<u32>>,
    /// `(pid namespace, pid there)` to host pid, for the namespaces in `read`.
    inner: HashMap<(u64, u32), u32>,
    read: HashSet<u64>,
}

impl ProcWalk {
    fn new() -> Self {
        let mut by_ns: HashMap<u64, Vec<u32>> = HashMap::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(host) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(ns) = pid_ns(host) {
                by_ns.entry(ns).or_default().push(host);
            }
        }
        ProcWalk { by_ns, inner: HashMap::new(), read: HashSet::new() }
    }

    /// [`find_host_pid`] from this walk (the start time read now).
    fn find(&mut self, pid_ns: u64, pid: u32, start_time: u64) -> Option<u32> {
        if self.read.insert(pid_ns) {
            for &h in self.by_ns.get(&pid_ns).into_iter().flatten() {
                let status = std::fs::read_to_string(format!("/proc/{h}/status"));
                if let Some(inner) = status.ok().as_deref().and_then(innermost_pid) {
                    self.inner.insert((pid_ns, inner), h);
                }
            }
        }
        let h = *self.inner.get(&(pid_ns, pid))?;
        (node_ledger::procinfo::start_time(h) == Some(start_time)).then_some(h)
    }
}

/// The window of [`FDS_PER_LEDGER_WINDOW`].
const BUDGET_WINDOW: Duration = Duration::from_secs(1);

/// Fds that the lock checks of one ledger file's slots ([`HostPids`]) may examine per
/// second (a look at a process's fds begun within it finishes: at most
/// [`MAX_FDS_EXAMINED`] more), whatever processes the slots name: a process is looked at once a round
/// whatever number of slots name it, but slots naming ever other processes, each with
/// [`MAX_FDS_EXAMINED`] fds, cost that much each. A lookup past it is put off (no back-off)
/// to the next window: only the slots of that ledger wait (a pod's own ledger: that tenant's),
/// and processes already found are not looked at again.
pub const FDS_PER_LEDGER_WINDOW: usize = 4 * MAX_FDS_EXAMINED;

/// How often a refused registration or a put-off lookup is said at most (with how many were
/// not said since): any ledger client can write ever new slots.
const SAY_EVERY: Duration = Duration::from_secs(10);

/// A process's OFD write locks on a ledger file, and whether fds of it were left unexamined.
type HeldLocks = (Vec<(u64, u64)>, bool);

/// How a registration's process was resolved ([`HostPids::get`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// Found, holding the slot's lock: its host pid.
    Holder(u32),
    /// A pid of this namespace no live process has (dead before it was seen here).
    Gone(u32),
}

/// Host pids of registered processes: [`find_host_pid`] (the pid itself in this namespace,
/// with its start time checked), kept only for a process that holds its slot's lock in its
/// ledger file ([`holds_lock`]). Any ledger client can write any slot, and a slot's pid and
/// start time are all it says of its owner; a process that holds no such lock (an online
/// service, or a daemon, which holds every ledger open but no slot's lock) is nobody's
/// offline process, whatever a slot says: without a host pid it is never signalled, never
/// terminated on MPS and never counted as offline work. Everything is kept by slot
/// ([`SlotKey`]: ledger file, slot's lock range, identity), so a copy of a process's identity
/// in another slot or another ledger is checked for its own lock (it fails), and a copy that
/// fails does not hold back the genuine slot. Each is found once and kept while it is asked
/// for; one not found, or found not holding the slot's lock, is looked for again after a
/// back-off (1 s doubling to 64 s). The back-off is a slot's: slots naming ever new
/// processes of other pid namespaces would each cost a `/proc` walk, so lookups share one
/// walk per round (`ProcWalk`; [`HostPids::retain`] starts a round), and a process's locks
/// on a ledger file are read once per round too. However many slots a tenant writes, a
/// round costs the daemon one walk and one read of each named process's fds, each of at most
/// [`MAX_FDS_EXAMINED`] fds, and the lookups of one ledger file's slots start no new look once
/// they examined [`FDS_PER_LEDGER_WINDOW`] fds in the current second (put off to the next).
#[derive(Debug)]
pub struct HostPids {
    own_ns: u64,
    found: HashMap<SlotKey, u32>,
    missed: HashMap<SlotKey, (Instant, Duration)>,
    /// Registrations already reported as naming a process that holds no lock on their slot.
    refused: HashSet<SlotKey>,
    /// This round's walk of `/proc`, once a lookup needed one.
    walk: Option<ProcWalk>,
    /// This round's OFD write locks (first, last byte) of a process on a ledger file, and
    /// whether fds of it were left unexamined ([`MAX_FDS_EXAMINED`]).
    locks: HashMap<(u32, LedgerFile), HeldLocks>,
    /// Per ledger file: when its current [`BUDGET_WINDOW`] began, and the fds examined in it
    /// for lookups of its slots.
    budget: HashMap<LedgerFile, (Instant, usize)>,
    /// Fds that lookups of one ledger file's slots may examine per [`BUDGET_WINDOW`]
    /// ([`FDS_PER_LEDGER_WINDOW`]; smaller in tests).
    fd_budget: usize,
    /// When a lookup was last put off for a spent budget, said (rate-limited).
    deferred_said: Option<Instant>,
    /// When a refused registration was last said, and those not said since.
    refused_said: Option<Instant>,
    refused_unsaid: u64,
    /// Walks of `/proc` made so far (tests).
    walks: u64,
}

impl Default for HostPids {
    fn default() -> Self {
        HostPids {
            own_ns: node_ledger::procinfo::own_pid_ns(),
            found: HashMap::new(),
            missed: HashMap::new(),
            refused: HashSet::new(),
            walk: None,
            locks: HashMap::new(),
            budget: HashMap::new(),
            fd_budget: FDS_PER_LEDGER_WINDOW,
            deferred_said: None,
            refused_said: None,
            refused_unsaid: 0,
            walks: 0,
        }
    }
}

impl HostPids {
    /// The slot key of registration `p` ([`SlotKey`]).
    pub fn key_of(p: &node_ledger::ProcSnapshot) -> SlotKey {
        (p.ledger_file, p.owner_lock, (p.pid_ns, p.pid, p.start_time))
    }

    /// The host pid of the process registration `p` names, if that process holds its slot's
    /// lock ([`node_ledger::ProcSnapshot::owner_lock`] in
    /// [`node_ledger::ProcSnapshot::ledger_file`]); `None` while no such process is found
    /// (see [`HostPids`]). A pid of this namespace that no live process has is its own host
    /// pid (a registered process that died before it was found); one a live process with
    /// another start time has now is not (that process is someone else).
    pub fn of(&mut self, p: &node_ledger::ProcSnapshot) -> Option<u32> {
        self.of_checked(p).0
    }

    /// [`HostPids::of`] with whether its owner was found holding the slot's lock (`true`
    /// only where [`HostPids::holder`] would answer the same pid): a slot naming a pid no
    /// live process has gets that pid (`Some(pid), false`), and proves nothing about who
    /// wrote it (any ledger client can write one).
    pub fn of_checked(&mut self, p: &node_ledger::ProcSnapshot) -> (Option<u32>, bool) {
        match self.resolve(Self::key_of(p)) {
            Some(Owner::Holder(h)) => (Some(h), true),
            Some(Owner::Gone(h)) => (Some(h), false),
            None => (None, false),
        }
    }

    /// [`HostPids::of`] for a slot whose owner was found holding its lock only: `None` for a
    /// pid no live process has too, which [`HostPids::of`] takes for its own. What may count a
    /// slot's word (its MPS percentage) for a running process: a slot no process holds the
    /// lock of was written by any ledger client.
    pub fn holder(&mut self, p: &node_ledger::ProcSnapshot) -> Option<u32> {
        match self.resolve(Self::key_of(p)) {
            Some(Owner::Holder(h)) => Some(h),
            _ => None,
        }
    }

    /// [`HostPids::of`] for the registration `r` whose owner holds a lock within `lock` =
    /// `(start, len)` of `file`.
    pub fn get(&mut self, r: Registered, file: &LedgerFile, lock: (u64, u64)) -> Option<u32> {
        match self.resolve((*file, lock, r))? {
            Owner::Holder(h) | Owner::Gone(h) => Some(h),
        }
    }

    fn resolve(&mut self, key: SlotKey) -> Option<Owner> {
        let (file, lock, (pid_ns, pid, start_time)) = key;
        if let Some(&h) = self.found.get(&key) {
            return Some(Owner::Holder(h));
        }
        let now = Instant::now();
        if let Some(&(at, wait)) = self.missed.get(&key) {
            if now < at + wait {
                return None;
            }
        }
        if pid_ns == self.own_ns && node_ledger::procinfo::is_gone(pid) {
            // Dead before it was ever seen here (or a slot naming a pid nobody has): no live
            // process has this pid, so what is done to it reaches nobody else (MPS may still
            // list a dead client by it). Not kept: the pid may be reused.
            return Some(Owner::Gone(pid));
        }
        if !self.budget_left(&file, now) {
            // Put off (no back-off, no walk of `/proc`) to the file's next window.
            return None;
        }
        let host = if pid_ns == self.own_ns {
            (node_ledger::procinfo::start_time(pid) == Some(start_time)).then_some(pid)
        } else {
            self.walk().find(pid_ns, pid, start_time)
        };
        let holds = match host {
            // `None`: this ledger's budget of fd looks is spent, looked at in a later window.
            Some(h) => self.holds_lock(h, &file, lock)?,
            None => false,
        };
        match host {
            Some(h) if holds => {
                self.missed.remove(&key);
                self.found.insert(key, h);
                Some(Owner::Holder(h))
            }
            _ => {
                if let Some(h) = host {
                    if self.refused.insert(key) {
                        self.say_refused(pid, pid_ns, h, &file, lock);
                    }
                }
                let wait = self.missed.get(&key).map_or(Duration::from_secs(1), |&(_, w)| (w * 2).min(Duration::from_secs(64)));
                self.missed.insert(key, (now, wait));
                None
            }
        }
    }

    /// This round's walk of `/proc`, made now if there is none ([`ProcWalk`]).
    fn walk(&mut self) -> &mut ProcWalk {
        if self.walk.is_none() {
            self.walks += 1;
        }
        self.walk.get_or_insert_with(ProcWalk::new)
    }

    /// [`holds_lock`], from the locks `pid` holds on `file` as read once this round; `None`
    /// when they are not read yet and `file`'s budget of fd looks ([`FDS_PER_LEDGER_WINDOW`])
    /// is spent.
    fn holds_lock(&mut self, pid: u32, file: &LedgerFile, lock: (u64, u64)) -> Option<bool> {
        if !self.locks.contains_key(&(pid, *file)) {
            if !self.budget_left(file, Instant::now()) {
                return None;
            }
            let (held, scan) = held_locks(pid, file);
            if let Some((_, spent)) = self.budget.get_mut(file) {
                *spent += scan.examined;
            }
            self.locks.insert((pid, *file), (held, scan.cut));
        }
        let (held, cut) = &self.locks[&(pid, *file)];
        let holds = held.iter().any(|&h| within(h, lock));
        if !holds && *cut {
            say_too_many_fds(pid, file);
        }
        Some(holds)
    }

    /// Whether the lookups of `file`'s slots may still examine fds in its current window
    /// ([`FDS_PER_LEDGER_WINDOW`]), starting a new window at `now` if the last one ended; said
    /// (at most once per [`SAY_EVERY`]) when they may not.
    fn budget_left(&mut self, file: &LedgerFile, now: Instant) -> bool {
        let (start, spent) = self.budget.entry(*file).or_insert((now, 0));
        if now >= *start + BUDGET_WINDOW {
            (*start, *spent) = (now, 0);
        }
        if *spent < self.fd_budget {
            return true;
        }
        if self.deferred_said.is_none_or(|at| now >= at + SAY_EVERY) {
            self.deferred_said = Some(now);
            tracing::warn!(
                ledger_ino = file.ino,
                fds_per_window = self.fd_budget,
                "the lock checks of a ledger's slots examined as many fds as they may this second: its \
                 slots not yet found are looked at later (slots naming ever other processes with many fds)"
            );
        }
        false
    }

    /// Says that a slot names a process (`host` here) holding no lock on it; at most once per
    /// [`SAY_EVERY`], with how many were not said since.
    fn say_refused(&mut self, pid: u32, pid_ns: u64, host: u32, file: &LedgerFile, lock: (u64, u64)) {
        let now = Instant::now();
        if self.refused_said.is_some_and(|at| now < at + SAY_EVERY) {
            self.refused_unsaid += 1;
            return;
        }
        self.refused_said = Some(now);
        let comm = std::fs::read_to_string(format!("/proc/{host}/comm")).unwrap_or_default();
        tracing::warn!(
            pid,
            pid_ns,
            host_pid = host,
            comm = comm.trim(),
            ledger_ino = file.ino,
            lock_start = lock.0,
            not_said_since = std::mem::take(&mut self.refused_unsaid),
            "a ledger slot names a process that holds no lock on that slot: it is not \
             treated as offline work and is never signalled (a slot written by another \
             ledger client, or a process that closed its ledger files)"
        );
    }

    /// Forgets every slot but those `keep` names (call with the registrations of the moment,
    /// once per round of lookups), and starts a round: the next lookup that needs a `/proc`
    /// walk makes a fresh one, and processes' locks are read again.
    pub fn retain(&mut self, keep: impl Fn(&SlotKey) -> bool) {
        self.found.retain(|k, _| keep(k));
        self.missed.retain(|k, _| keep(k));
        self.refused.retain(|k| keep(k));
        self.walk = None;
        self.locks.clear();
        self.budget.retain(|_, (start, _)| start.elapsed() < BUDGET_WINDOW);
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
        // The sleep holds the file open (fd 9) with a slot's lock, as a ledger client does.
        let mut cmd = std::process::Command::new("unshare");
        cmd.args(["--pid", "--fork", "sh", "-c", "exec sleep 30"]);
        let child = with_slot_lock(cmd, &path, SLOT).spawn();
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
        assert_eq!(h.get((ns, 1, st), &other, SLOT), None, "it holds another file than the ledger");
        let mut h = HostPids::default();
        assert_eq!(h.get((ns, 1, st), &file, SLOT), Some(host));
        assert_eq!(h.get((ns, 2, st), &file, SLOT), None);
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
        assert_eq!(HostPids::default().get((ns, me, st), &file, SLOT), None, "not holding it yet");
        let held = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        assert_eq!(HostPids::default().get((ns, me, st), &file, SLOT), None, "open, but no slot's lock");
        lock(&held, SLOT);
        assert_eq!(HostPids::default().get((ns, me, st), &file, SLOT), Some(me));
        assert_eq!(HostPids::default().get((ns, me, st + 1), &file, SLOT), None, "another start time");
        drop(held);
    }

    /// A slot's lock range in the stand-in ledger (any bytes will do: the check is by range).
    const SLOT: (u64, u64) = (4096, 64);

    /// Takes an OFD write lock on `range` of `f`'s open file description.
    fn lock(f: &std::fs::File, range: (u64, u64)) {
        use std::os::fd::AsRawFd;
        assert!(node_ledger::ledger::range_lock(f.as_raw_fd(), range.0, range.1, libc::F_WRLCK).unwrap());
    }

    /// `cmd` made to start holding `path` as fd 9 with a write lock on `range`, as a ledger
    /// client holds its slot.
    fn with_slot_lock(mut cmd: std::process::Command, path: &std::path::Path, range: (u64, u64)) -> std::process::Command {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
        lock(&f, range);
        // SAFETY: the closure runs in the forked child before exec and only calls dup2(2),
        // async-signal-safe; `f` (moved in) keeps the description open until the spawn.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(f.as_raw_fd(), 9) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }

    /// `cmd` made to start holding `path` as fd `at` with a write lock on `range`, and
    /// `/dev/null` as every fd of `nulls` (its fd limit raised to fit them).
    fn with_fds(mut cmd: std::process::Command, path: &std::path::Path, range: (u64, u64), at: i32, nulls: std::ops::Range<i32>) -> std::process::Command {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
        lock(&f, range);
        let null = std::fs::File::open("/dev/null").unwrap();
        let want = (nulls.end.max(at) + 16) as libc::rlim_t;
        // SAFETY: the closure runs in the forked child before exec and only calls getrlimit(2),
        // setrlimit(2) and dup2(2), async-signal-safe, on a zeroed plain-data struct and on
        // fds that `f` and `null` (moved in) keep open until the spawn.
        unsafe {
            cmd.pre_exec(move || {
                let mut lim: libc::rlimit = std::mem::zeroed();
                if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < want {
                    lim.rlim_cur = want.min(lim.rlim_max);
                    libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
                }
                for n in nulls.clone() {
                    if libc::dup2(null.as_raw_fd(), n) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if libc::dup2(f.as_raw_fd(), at) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }

    /// Whether the hard fd limit lets this test's children hold `n` fds (said when not).
    fn fds_fit(n: usize) -> bool {
        // SAFETY: an all-zero rlimit is a valid plain-data value.
        let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: getrlimit(2) writing into that struct, which we own.
        let fit = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 && lim.rlim_max as usize >= n + 64;
        if !fit {
            eprintln!("the hard fd limit is below {n}: skipped");
        }
        fit
    }

    /// A process with more fds than [`MAX_FDS_EXAMINED`] holding its slot's lock on a low fd
    /// (a busy process: its shim registered early) is proven; one whose ledger fd lies past
    /// the first [`MAX_FDS_EXAMINED`] is not, and the look at it stops there. Before, every
    /// fd was examined: a tenant's process with a million fds, named by slots, stalled the
    /// daemon for seconds at each lookup.
    #[test]
    fn fds_past_the_first_examined_ones_are_not_looked_at() {
        let n = MAX_FDS_EXAMINED as i32;
        if !fds_fit(MAX_FDS_EXAMINED + 200) {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = ledger_file(&dir);
        let mut busy = with_fds(sleep30(), &path, SLOT, 9, 10..n + 100).spawn().unwrap();
        let theirs = (SLOT.0 + SLOT.1, SLOT.1);
        let mut hidden = with_fds(sleep30(), &path, theirs, n + 100, 10..n + 100).spawn().unwrap();
        let (b, h) = (busy.id(), hidden.id());
        assert!(wait_holding(b, &file), "the busy stand-in never held the file");
        let (held, scan) = held_locks(b, &file);
        assert_eq!(held, vec![(SLOT.0, SLOT.0 + SLOT.1 - 1)]);
        assert!(!scan.cut && scan.examined < 64, "the look ends at its ledger fd: {scan:?}");
        assert!(holds_lock(b, &file, SLOT), "a busy process is proven by its first fds");
        // The hidden one's ledger fd is its last: wait until its exec is done.
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_to_string(format!("/proc/{h}/comm")).unwrap_or_default().trim() != "sleep" && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(std::fs::symlink_metadata(format!("/proc/{h}/fd/{}", n + 100)).is_ok(), "the stand-in holds its ledger fd");
        let (held, scan) = held_locks(h, &file);
        assert!(held.is_empty() && scan.cut && scan.examined == MAX_FDS_EXAMINED, "{held:?} {scan:?}");
        assert!(!holds_lock(h, &file, theirs), "its lock lies past the fds examined");
        assert!(!holds_open(h, &file));
        let ns = node_ledger::procinfo::own_pid_ns();
        let st = node_ledger::procinfo::start_time(h).unwrap();
        assert_eq!(HostPids::default().get((ns, h, st), &file, theirs), None, "not proven");
        for c in [&mut busy, &mut hidden] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A process whose one ledger description is `dup`ed to 64 fds: each fd's fdinfo lists the
    /// same locks, and at most [`MAX_FDINFO_READS`] are read whatever is asked of them (a lock
    /// it does not hold here). Before, every one was read: a tenant's dups cost the daemons an
    /// fdinfo read each (the kernel writes each whole) within the fds examined.
    #[test]
    fn dups_of_one_description_cost_a_bounded_number_of_fdinfo_reads() {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = ledger_file(&dir);
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        lock(&f, SLOT);
        let mut cmd = sleep30();
        // SAFETY: the closure runs in the forked child before exec and only calls dup2(2),
        // async-signal-safe, on the fd `f` (moved in) keeps open until the spawn.
        unsafe {
            cmd.pre_exec(move || {
                for n in 9..73 {
                    if libc::dup2(f.as_raw_fd(), n) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut c = cmd.spawn().unwrap();
        let pid = c.id();
        assert!(wait_holding(pid, &file), "the stand-in never held the file");
        let (held, scan) = held_locks(pid, &file);
        assert_eq!(held, vec![(SLOT.0, SLOT.0 + SLOT.1 - 1)], "its lock is seen");
        assert!(scan.fdinfo_reads >= 1 && scan.fdinfo_reads <= MAX_FDINFO_READS, "{scan:?}");
        assert!(holds_lock(pid, &file, SLOT));
        assert!(!holds_lock(pid, &file, (SLOT.0 + SLOT.1, SLOT.1)), "a lock it does not hold");
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Slots of one ledger naming ever other processes: once the lookups of that ledger's slots
    /// examined [`FDS_PER_LEDGER_WINDOW`] fds (here 1), its next slot is put off, with no
    /// back-off, to the next window; another ledger's slots are not held back, nor is a
    /// process already found.
    #[test]
    fn a_ledger_whose_slots_cost_its_fd_budget_waits_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = ledger_file(&dir);
        let (other, pod_file) = pod_ledger_file(&dir);
        let ns = node_ledger::procinfo::own_pid_ns();
        let second = (SLOT.0 + SLOT.1, SLOT.1);
        let mut kids = [
            with_slot_lock(sleep30(), &path, SLOT).spawn().unwrap(),
            with_slot_lock(sleep30(), &path, second).spawn().unwrap(),
            with_slot_lock(sleep30(), &other, SLOT).spawn().unwrap(),
        ];
        let ids: Vec<_> = kids.iter().map(|c| c.id()).collect();
        for (&k, f) in ids.iter().zip([&file, &file, &pod_file]) {
            assert!(wait_holding(k, f));
        }
        let id = |k: u32| (ns, k, node_ledger::procinfo::start_time(k).unwrap());
        let mut h = HostPids { fd_budget: 1, ..HostPids::default() };
        assert_eq!(h.get(id(ids[0]), &file, SLOT), Some(ids[0]), "the first lookup of the window");
        assert_eq!(h.get(id(ids[1]), &file, second), None, "the ledger's budget is spent");
        assert_eq!(h.get(id(ids[2]), &pod_file, SLOT), Some(ids[2]), "another ledger's slots are not held back");
        h.retain(|_| true);
        assert_eq!(h.get(id(ids[0]), &file, SLOT), Some(ids[0]), "found: not looked at again");
        // The next window (what a second's wait would bring).
        h.budget.clear();
        assert_eq!(h.get(id(ids[1]), &file, second), Some(ids[1]), "put off, not backed off");
        for c in &mut kids {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `sleep 30`, to be made to hold a file.
    fn sleep30() -> std::process::Command {
        let mut c = std::process::Command::new("sleep");
        c.arg("30");
        c
    }

    /// A second file to play a pod's ledger: its path and identity.
    fn pod_ledger_file(dir: &tempfile::TempDir) -> (std::path::PathBuf, LedgerFile) {
        let path = dir.path().join("pod-ledger");
        std::fs::write(&path, b"x").unwrap();
        let file = LedgerFile::of_path(&path).unwrap();
        (path, file)
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
        let mut sleep = std::process::Command::new("sleep");
        sleep.arg("30");
        let mut offline = with_slot_lock(sleep, &path, SLOT).spawn().unwrap();
        let (on, off) = (online.id(), offline.id());
        assert!(wait_holding(off, &file), "the offline stand-in never held the file");
        let st_on = node_ledger::procinfo::start_time(on).unwrap();
        let st_off = node_ledger::procinfo::start_time(off).unwrap();
        let mut h = HostPids::default();
        assert_eq!(h.get((ns, on, st_on), &file, SLOT), None, "a forged slot naming the online process");
        assert_eq!(h.get((ns, on, st_on), &file, SLOT), None, "asked again within the back-off");
        assert_eq!(h.get((ns, off, st_off), &file, (SLOT.0 + SLOT.1, 64)), None, "its lock is on another slot");
        let mut h = HostPids::default();
        assert_eq!(h.get((ns, off, st_off), &file, SLOT), Some(off));
        assert!(!holds_open(on, &file));
        assert_eq!(h.get((ns, on, st_on + 1), &file, SLOT), None, "its pid under another start time");
        // A dead registration of this namespace keeps its pid (MPS may list a dead client);
        // one refused before stays refused until its back-off ends.
        let _ = online.kill();
        let _ = online.wait();
        let mut fresh = HostPids::default();
        assert_eq!(fresh.get((ns, on, st_on), &file, SLOT), Some(on), "dead and reaped: nobody has its pid");
        assert_eq!(fresh.get((ns, on, st_on), &file, SLOT), Some(on), "not kept, looked at again");
        // A deleted ledger is held only as deleted: the flag must match what the fd's link says.
        assert!(!holds_open(off, &LedgerFile { deleted: true, ..file }), "not deleted yet");
        std::fs::remove_file(&path).unwrap();
        assert!(holds_open(off, &LedgerFile { deleted: true, ..file }));
        for c in [&mut online, &mut offline] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A tenant copies a found offline process's identity (pid namespace, pid, start time: what
    /// it can read of a neighbour) into another slot, or into a slot of its own pod's ledger:
    /// the copy is checked for its own slot's lock and gets no host pid, however long the
    /// genuine slot has been found. Before, what was found was kept by the identity alone, so
    /// the copy got the victim's host pid unchecked (the monitor signalled the victim for the
    /// copy's word, node-agent evicted the victim's pod for a request about the copy).
    #[test]
    fn a_copy_of_a_found_process_in_another_slot_or_ledger_gets_no_host_pid() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = ledger_file(&dir);
        let (_other, pod_file) = pod_ledger_file(&dir);
        let ns = node_ledger::procinfo::own_pid_ns();
        let mut sleep = std::process::Command::new("sleep");
        sleep.arg("30");
        let mut victim = with_slot_lock(sleep, &path, SLOT).spawn().unwrap();
        let v = victim.id();
        assert!(wait_holding(v, &file));
        let id = (ns, v, node_ledger::procinfo::start_time(v).unwrap());
        let mut h = HostPids::default();
        assert_eq!(h.get(id, &file, SLOT), Some(v), "the genuine slot");
        assert_eq!(h.get(id, &file, (SLOT.0 + SLOT.1, SLOT.1)), None, "a copy in another slot of its ledger");
        assert_eq!(h.get(id, &pod_file, SLOT), None, "a copy in another ledger, same range");
        assert_eq!(h.get(id, &file, SLOT), Some(v), "the genuine slot still");
        let _ = victim.kill();
        let _ = victim.wait();
    }

    /// A tenant writes a copy of its own identity into a lower slot than its genuine one
    /// (looked up first): the copy fails its lock check and is backed off, and the genuine
    /// slot is still found, at once. Before, the back-off was kept by identity, so the genuine
    /// slot got no host pid for as long as the copy was rewritten: never verified, never
    /// signalled.
    #[test]
    fn a_copy_failing_its_lock_check_does_not_hold_back_the_genuine_slot() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = ledger_file(&dir);
        let ns = node_ledger::procinfo::own_pid_ns();
        let genuine = (SLOT.0 + SLOT.1, SLOT.1);
        let mut sleep = std::process::Command::new("sleep");
        sleep.arg("30");
        let mut tenant = with_slot_lock(sleep, &path, genuine).spawn().unwrap();
        let t = tenant.id();
        assert!(wait_holding(t, &file));
        let id = (ns, t, node_ledger::procinfo::start_time(t).unwrap());
        let mut h = HostPids::default();
        assert_eq!(h.get(id, &file, SLOT), None, "the copy in the lower slot");
        assert_eq!(h.get(id, &file, genuine), Some(t), "the genuine slot, during the copy's back-off");
        assert_eq!(h.get(id, &file, SLOT), None, "the copy, still");
        let _ = tenant.kill();
        let _ = tenant.wait();
    }

    /// [`HostPids::holder`] answers for a process found holding its slot's lock only: a pid of
    /// this namespace that no live process has is its own host pid for [`HostPids::of`] (MPS
    /// may list a dead client by it), but nobody's running work.
    #[test]
    fn a_holder_is_a_process_found_holding_its_slots_lock() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = ledger_file(&dir);
        let mut sleep = std::process::Command::new("sleep");
        sleep.arg("30");
        let mut job = with_slot_lock(sleep, &path, SLOT).spawn().unwrap();
        let j = job.id();
        assert!(wait_holding(j, &file));
        let slot = |pid: u32, start_time: u64| node_ledger::ProcSnapshot {
            slot: 0,
            pid,
            start_time,
            pid_ns: node_ledger::procinfo::own_pid_ns(),
            group_id: 1,
            mps_pct: 100,
            ledger_file: file,
            owner_lock: SLOT,
            ..Default::default()
        };
        let genuine = slot(j, node_ledger::procinfo::start_time(j).unwrap());
        let mut h = HostPids::default();
        assert_eq!((h.of(&genuine), h.holder(&genuine)), (Some(j), Some(j)));
        assert_eq!(h.of_checked(&genuine), (Some(j), true));
        let _ = job.kill();
        let _ = job.wait();
        let dead = slot(j, 1);
        assert_eq!((h.of(&dead), h.holder(&dead)), (Some(j), None), "a pid nobody has");
        assert_eq!(h.of_checked(&dead), (Some(j), false), "a pid nobody has: not found holding the lock");
    }

    /// Slots naming processes of other pid namespaces, each a fresh one (so no back-off
    /// applies), share one walk of `/proc` a round: 256 of them cost one walk, where each used
    /// to cost its own and a tenant rewriting its slots could stall the monitor's tick; the
    /// next round (after `retain`) walks again.
    #[test]
    fn lookups_in_other_pid_namespaces_share_one_walk_of_proc_a_round() {
        let dir = tempfile::tempdir().unwrap();
        let (_path, file) = ledger_file(&dir);
        let own = node_ledger::procinfo::own_pid_ns();
        let mut h = HostPids::default();
        for i in 0..256u64 {
            let (ns, slot) = (own.wrapping_sub(1 + i), (SLOT.0 + i * SLOT.1, SLOT.1));
            assert_eq!(h.get((ns, 1 + i as u32, 1), &file, slot), None);
        }
        assert_eq!(h.walks, 1, "one walk for the round's 256 slots");
        h.retain(|_| true);
        assert_eq!(h.get((own.wrapping_sub(1000), 1, 1), &file, SLOT), None);
        assert_eq!(h.walks, 2, "a walk in the next round");
    }

    /// A daemon holds every ledger open (mps-manager maps the GPU's and every pod's): a slot
    /// another ledger client wrote naming it gets no host pid, so the monitor never signals
    /// it. Only a process holding that slot's lock is the slot's owner.
    #[test]
    fn a_process_holding_the_ledger_open_without_the_slots_lock_is_nobodys_offline_process() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = ledger_file(&dir);
        let ns = node_ledger::procinfo::own_pid_ns();
        let mut daemon = std::process::Command::new("sh")
            .args(["-c", "exec sleep 30 9<>\"$0\""])
            .arg(&path)
            .spawn()
            .unwrap();
        let d = daemon.id();
        assert!(wait_holding(d, &file));
        let st = node_ledger::procinfo::start_time(d).unwrap();
        assert_eq!(HostPids::default().get((ns, d, st), &file, SLOT), None, "holds it open, no slot's lock");
        let _ = daemon.kill();
        let _ = daemon.wait();
    }

    #[test]
    fn fdinfo_lock_lines_are_read_by_device_inode_and_range() {
        let file = LedgerFile { dev: libc::makedev(0xfe, 0), ino: 10010904, deleted: false };
        let l = "lock:\t1: OFDLCK ADVISORY  WRITE -1 fe:00:10010904 4099 4099";
        assert!(ofd_lock_within(l, &file, (4096, 64)));
        assert!(!ofd_lock_within(l, &file, (4100, 64)), "before the range");
        assert!(!ofd_lock_within(l, &file, (4000, 99)), "past the range's end");
        assert!(!ofd_lock_within(l, &LedgerFile { ino: 1, ..file }, (4096, 64)), "another file");
        assert!(!ofd_lock_within(&l.replace("WRITE", "READ "), &file, (4096, 64)));
        assert!(!ofd_lock_within(&l.replace("OFDLCK", "POSIX "), &file, (4096, 64)), "a process-owned lock");
        assert!(!ofd_lock_within("lock:\t1: -> OFDLCK ADVISORY  WRITE -1 fe:00:10010904 4099 4099", &file, (4096, 64)), "a waiter");
        assert!(!ofd_lock_within("lock:\t1: OFDLCK ADVISORY  WRITE -1 fe:00:10010904 4099 EOF", &file, (4096, 64)), "to the end");
        assert!(!ofd_lock_within("pos:\t0", &file, (4096, 64)));
    }
}
