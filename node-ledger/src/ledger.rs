//! Opening/validating the per-GPU ledger file, quota groups with one-step cross-process
//! check-and-reserve, and the offline-process registry with reclaim of dead processes.
//!
//! # Slot protocol (registry liveness and reclaim)
//!
//! A registry slot's liveness is a lock, not a pid: the owner holds an open-file-description
//! write lock (`fcntl(F_OFD_SETLK)`) on the slot's byte range of the ledger file
//! ([`proc_slot_offset`], [`PROC_SLOT_LEN`]) through a description of its own, opened for that
//! registration only. The kernel drops the lock when the last fd of that description closes:
//! when the owner unregisters, or dies (any signal, any pid namespace, any uid), or, after a
//! `fork`, when the owner and every child that inherited the description have died (as the
//! driver keeps the device memory of a process whose device fds a child inherited).
//!
//! 1. **Exclusion.** Whoever holds a slot's lock is the only party that may change the slot's
//!    `owner`, `liveness` or `group_slot`, or give back its `mem_bytes`. Locks are taken with
//!    the non-blocking `F_OFD_SETLK` only: the kernel grants a range to one description at a
//!    time, so two parties never work on one slot at once.
//! 2. **Register** (newcomer): for each slot, try its lock on the new description. Refused =
//!    a live owner, or someone registering or reclaiming there: next slot. Granted = any
//!    previous owner is gone (its lock is free): give back its leftover usage (step 4), write
//!    the new owner, keep the lock.
//! 3. **Reclaim** (the monitor every tick, shims on refusal and in their housekeeping, any
//!    newcomer): for each occupied slot, try its lock on a description of this reclaim pass
//!    alone (OFD locks do not exclude one another on one description, which threads and fork
//!    children share: two passes on it could both "hold" a slot).
//!    Granted = the owner is dead: give back its usage (step 4), mark the slot free, release
//!    the lock. Refused = alive (or someone else is on it): skip.
//! 4. **Give back** (only under the lock): `mem_bytes.swap(0)`, then subtract exactly that
//!    from the group, then `owner = free`. The swap makes the give-back happen once: a second
//!    party finds 0 (it can only get the lock after the first let go, and then finds the slot
//!    free anyway). A reclaimer dying between swap and subtract leaves the group over-counted
//!    (conservative), never under-counted.
//! 5. **Unregister** (the owner, holding the lock): give back, mark free, then close the
//!    description (releasing the lock). An owner whose description no longer holds the lock
//!    (the application closed its fd, or put another file there) gives back nothing and
//!    closes nothing: its slot may already be reclaimed and someone else's. Until it notices
//!    and registers again, its reservations are refused and its frees count nowhere once the
//!    slot's owner word is no longer its own ([`Ledger::owns_slot`]).
//!
//! Pids play no part in liveness, so a pid or pid-namespace inode reused by another container
//! cannot keep a dead process's usage locked, nor free a live one's. Two exceptions, marked in
//! `ProcSlot::liveness`: a registration made on behalf of another process (`register` with a
//! pid that is not the caller's: tools and tests) holds no lock and is alive while its pid
//! with its start time lives, judged only from its own pid namespace; and a copy the monitor
//! restored in place of a deleted ledger marks its occupied slots with the deleted file's
//! inode, where their owners' locks still are (see [`Ledger::reclaim_through`]); a monitor
//! restarted before those owners died can no longer test them, and their usage stays counted
//! (conservative) until the operator recreates the ledger. Only the monitor that restored the
//! copy takes such a word for a deleted file ([`Ledger::set_restored_from`]): to any other
//! reader, a restarted monitor included, the slot's owner must hold its lock in the copy,
//! which nobody does (any ledger client can write the word: it proves nothing).
//!
//! The start-claims block has a lock of its own on its own byte range, after every slot's
//! (`crate::claims`); a registering process takes it briefly to withdraw its start claim.
//!
//! # Idle-group reconciliation
//!
//! A group no process is registered in may still count usage nobody holds (a process killed
//! between its group's reservation and its slot's; a reclaimer killed between a slot's swap
//! and the group's subtraction). [`Ledger::reconcile_idle_groups`] sets such a group's usage
//! back to what its free slots count. It must never do so over a reservation of a process that
//! joined the group meanwhile: that would count less than is held, a looser limit than
//! configured for the newcomer's whole life. A compare-and-swap from a usage read earlier
//! cannot tell: a leaver giving back exactly what a newcomer reserved puts the same value
//! back (ABA). So the usage word `GroupSlot::used_bytes` carries a claim mark in its top bit
//! ([`USED_CLAIMED`]):
//!
//! 1. **Writers.** Every write of a group's usage word is a read-modify-write that writes the
//!    mark clear: a reservation, a release or give-back, a count of held memory, a group
//!    slot's (re)initialisation, a reconciler's final write or its undo, and a **join**: a
//!    registration, once its slot's owner word is published, clears its group's mark
//!    (`fetch_and`) before it returns (before its process can reserve). Readers mask the mark
//!    off ([`Ledger::group_used`]); a reservation checks the quota against the bytes alone.
//! 2. **Claim.** Only a reconciler holding the group's lock (`F_OFD_SETLK`, write, on the
//!    group slot's byte range, [`group_slot_offset`], on its own pass description, and within
//!    a process one pass at a time per handle) sets the mark: `CAS(w, bytes(w) | mark)` from
//!    the word it just read, marked or not (a mark found under the lock was left by a
//!    reconciler that died, or lost its lock, after its claim).
//! 3. **Look.** After the claim, it scans the registry again: members of the group (occupied
//!    slots naming it) and what its free slots count (`left`).
//! 4. **Write.** No member and `left < bytes`: `CAS(bytes | mark, left)`; else
//!    `CAS(bytes | mark, bytes)` (undo). Then it lets go of the lock.
//!
//! *Why the write cannot drop a live reservation.* Only the lock holder sets the mark, once
//! per group per pass, and every other write clears it: the final CAS succeeds only if no
//! one wrote the word between the claim and it. So no reservation, release, give-back or join
//! of the group happened in that interval. Anything before the claim was seen by the look: a
//! join (or a reservation, which comes after its process's join) is a release (`AcqRel` RMW)
//! on the word after the joiner's `owner` store (`Release`); every write of the word is an RMW,
//! so the claim (`AcqRel`) reads from that release sequence and the joiner's owner store
//! happens-before the look, which therefore finds its slot occupied (abort) or, if the
//! joiner left since, freed by a give-back that took everything its slot counted off the
//! usage before the claim. What the write drops is then usage no registered process counts
//! in its slot: the leftovers this is for. A reconciler killed at any point leaves at worst a
//! stale mark (the usage it read, counted in full: conservative); readers ignore it, the next
//! write of the word clears it, the next reconciler claims over it; nothing waits on it, and
//! the kernel drops the dead one's lock. Counting more is the only failure direction.
//!
//! The one assumption is the lock: a second live reconciler claiming the group at the same
//! value between another one's claim and its write could make that write succeed. A
//! reconciler checks that its description still holds the lock right before it writes (an
//! application that closes the shim's descriptors by number can take it away); the check
//! and the write are not one step.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::*};

use memmap2::MmapMut;

use crate::clock::now_ns;
use crate::layout::*;
use crate::procinfo;

/// Why a ledger could not be opened or used; always names the file.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// A system call on the file failed.
    #[error("ledger {path}: {op}: {source}")]
    Io {
        /// The ledger file.
        path: PathBuf,
        /// What was being done (`open`, `mmap`, ...).
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The file's content is not a valid ledger (or not this version's).
    #[error("ledger {path}: field `{field}`: {detail}")]
    Corrupt {
        /// The ledger file.
        path: PathBuf,
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// Every slot of a table is taken.
    #[error("ledger {path}: {what} is full ({capacity} slots)")]
    Full {
        /// The ledger file.
        path: PathBuf,
        /// The table (`process registry`, `quota-group table`).
        what: &'static str,
        /// Its number of slots.
        capacity: usize,
    },
}

/// A refused reservation: the group's quota would be exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("over quota: requested {requested} bytes, {used} of {quota} in use")]
pub struct ReserveError {
    /// Bytes asked for.
    pub requested: u64,
    /// Bytes the group already holds.
    pub used: u64,
    /// The group's quota, bytes.
    pub quota: u64,
}

/// A registered process: its registry slot and its group slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcHandle {
    /// Registry slot index.
    pub slot: usize,
    /// Group slot index.
    pub group: usize,
    /// Generation of the slot's owner word this registration wrote: the slot is still this
    /// registration's while its owner word holds this generation and a pid (a reclaim frees
    /// it, pid 0; a newcomer's registration bumps the generation).
    pub gen: u32,
}

/// A point-in-time copy of one registry slot (`Default`: a free slot 0, nothing reported).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcSnapshot {
    /// Registry slot index.
    pub slot: usize,
    /// Pid in the owner's own pid namespace.
    pub pid: u32,
    /// Start time (clock ticks since boot): with `pid` and `pid_ns`, the process's identity.
    pub start_time: u64,
    /// Pid-namespace inode of the owner.
    pub pid_ns: u64,
    /// Id of the owner's quota group (`group_id_for` its `XCUDA_GROUP`).
    pub group_id: u64,
    /// Device memory reserved, bytes.
    pub mem_bytes: u64,
    /// Kernel launches issued.
    pub launches: u64,
    /// Kernel launches that had to wait for budget.
    pub launches_delayed: u64,
    /// CLOCK_MONOTONIC ns of the last heartbeat.
    pub heartbeat_ns: u64,
    /// Synchronizing driver calls entered and returned, as the owner last published them
    /// (`ProcSlot::syncs_begun`): more entered than returned = a thread waits for the GPU.
    pub syncs: (u64, u64),
    /// MPS active-thread percentage the process started with (1..=100); 0 = none known.
    pub mps_pct: u32,
    /// The ledger file a genuine owner holds open: this ledger, or for a slot carried over
    /// from a deleted ledger ([`Ledger::restore_deleted`]) that file, taken only if the handle
    /// that read it was told it restored the file from that ledger
    /// ([`Ledger::set_restored_from`]; a slot's liveness word naming any other deleted file
    /// is a word any ledger client can write, and names this ledger). Any ledger client can
    /// write any slot, so a slot's pid alone names nobody reliably: the daemons act on the
    /// process it names only if that process holds this file open
    /// (`node_daemon::procns::HostPids`), which an online service never does.
    pub ledger_file: LedgerFile,
    /// The byte range `(start, len)` of `ledger_file` within which a genuine owner holds an
    /// `F_OFD_SETLK` write lock: its slot's own range, also for a slot carried over from a
    /// deleted ledger (the copy keeps each slot where it was). The daemons
    /// signal the process a slot names only if it holds such a lock (`/proc/<pid>/fdinfo`):
    /// holding the file open is not enough, as the daemons themselves hold every ledger open,
    /// and a slot written by another ledger client naming a daemon would otherwise have the
    /// other daemon signal it.
    pub owner_lock: (u64, u64),
}

/// A ledger file as a process holding it open shows it: `st_dev` and `st_ino` (what `stat`
/// of `/proc/<pid>/fd/<n>` gives), and whether it has been deleted (its link then ends in
/// ` (deleted)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LedgerFile {
    /// `st_dev` of the file.
    pub dev: u64,
    /// `st_ino` of the file.
    pub ino: u64,
    /// Whether the file has been deleted (a slot restored from a deleted ledger).
    pub deleted: bool,
}

impl LedgerFile {
    /// The file at `path` now (not deleted).
    pub fn of_path(path: &Path) -> io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)?;
        Ok(LedgerFile { dev: m.dev(), ino: m.ino(), deleted: false })
    }

    /// The ledger file at `path` and the damaged ones [`Ledger::open_or_recreate`] moved aside
    /// beside it (`<ledger>.damaged-*`), whose shims still hold them open.
    ///
    /// A name counts only as what the monitor itself leaves there: a regular file (a link is
    /// not followed), one name for it, owned by the caller (the monitor, which created and
    /// moved it). Holding such a file exempts a process from the unshimmed check; a tenant who
    /// can write the directory must not exempt every process by naming `/dev/null` there.
    pub fn with_damaged_copies(path: &Path) -> Vec<Self> {
        use std::os::unix::fs::MetadataExt;
        let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
            return Vec::new();
        };
        let aside = format!("{name}{DAMAGED_SUFFIX}");
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_str().is_some_and(|n| n == name || n.starts_with(&aside)))
                    // DirEntry::metadata is lstat(2): a symbolic link is judged as itself.
                    .filter_map(|e| e.metadata().ok())
                    .filter(|m| m.file_type().is_file() && m.nlink() == 1 && m.uid() == me)
                    .map(|m| LedgerFile { dev: m.dev(), ino: m.ino(), deleted: false })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// What [`Ledger::open_or_recreate`] appends to a damaged ledger's name (then the unix time).
const DAMAGED_SUFFIX: &str = ".damaged-";

/// A mapped ledger file. Hot-path operations are atomics on the mapping; registration and
/// group creation take an advisory `flock` (never on a hot path).
pub struct Ledger {
    /// Declared first: dropped (unregistered) before the mapping is unmapped.
    fault_guard: crate::sigbus::Guard,
    map: MmapMut,
    file: File,
    path: PathBuf,
    /// Per registry slot: the fd of the description holding that slot's lock for a
    /// registration made through this handle (-1 = none). Raw fds in atomics so that a fork
    /// child can read them without locks.
    slot_locks: Box<[AtomicI32]>,
    /// (st_dev, st_ino) of the mapped file, to recognise our slot-lock fds.
    dev_ino: (u64, u64),
    /// The description this process's reclaim passes take slot locks on (opened at the first
    /// pass, with the pid that opened it: a fork child opens its own), and the one pass at a
    /// time in this process: OFD locks do not exclude holders of one description from each
    /// other. Kept open, not opened per pass: closing a writable description is an
    /// `IN_CLOSE_WRITE` on the ledger, which the monitor's reclaim watch takes for a process
    /// that left (a pass per pass, for ever).
    reclaim_desc: std::sync::Mutex<Option<(u32, File)>>,
    /// Inodes of the deleted ledgers this file was restored from by this handle's owner
    /// ([`Ledger::set_restored_from`]): the only ones a slot's liveness word may name as where
    /// its owner's lock is ([`ProcSnapshot::ledger_file`]).
    restored_from: Vec<u64>,
}

impl Drop for Ledger {
    fn drop(&mut self) {
        // Closing a registration's description releases its slot lock: the slot (with its
        // usage) becomes reclaimable, as when a process dies without unregistering.
        for fd in self.slot_locks.iter() {
            let fd = fd.swap(-1, AcqRel);
            if fd >= 0 && fd_names(fd, self.dev_ino) {
                // SAFETY: `fd` came from `into_raw_fd` in `register`, was swapped out of the
                // table (closed once), and still names our file (not a number the application
                // reused after closing ours).
                unsafe { libc::close(fd) };
            }
        }
    }
}

/// Whether open fd `fd` names the file with `(st_dev, st_ino)` = `dev_ino`.
fn fd_names(fd: RawFd, dev_ino: (u64, u64)) -> bool {
    // SAFETY: `stat` is plain integers; all-zero is a valid value for fstat(2) to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat(2) writes into `st`; a closed fd is an EBADF error, not UB.
    let ok = unsafe { libc::fstat(fd, &mut st) } == 0;
    ok && (st.st_dev as u64, st.st_ino as u64) == dev_ino
}

/// Takes (`F_WRLCK`) or releases (`F_UNLCK`) registry slot `slot`'s lock on the open file
/// description behind `fd`, without blocking. `Ok(false)`: another description holds it.
fn slot_lock(fd: RawFd, slot: usize, ty: libc::c_int) -> io::Result<bool> {
    range_lock(fd, proc_slot_offset(slot), PROC_SLOT_LEN, ty)
}

/// Takes (`F_WRLCK`) or releases (`F_UNLCK`) an OFD lock on bytes `start..start + len` of the
/// file behind `fd`, without blocking. `Ok(false)`: another description holds some of them.
/// Public for tools and tests that hold a slot's lock on a process's behalf (a slot's owner is
/// the process holding its lock: `node_daemon::procns::holds_lock`).
pub fn range_lock(fd: RawFd, start: u64, len: u64, ty: libc::c_int) -> io::Result<bool> {
    // SAFETY: `flock` is plain integers; all-zero is a valid value (l_pid must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = len as libc::off_t;
    // SAFETY: fcntl(2) on a caller-owned open fd with a valid `struct flock`.
    if unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &fl) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// Whether some description other than `fd`'s holds registry slot `slot`'s lock (a test:
/// takes nothing).
fn slot_lock_held(fd: RawFd, slot: usize) -> io::Result<bool> {
    range_lock_held(fd, proc_slot_offset(slot), PROC_SLOT_LEN)
}

/// Whether some description other than `fd`'s holds a lock on some of bytes
/// `start..start + len` (a test: takes nothing).
fn range_lock_held(fd: RawFd, start: u64, len: u64) -> io::Result<bool> {
    // SAFETY: as in `slot_lock`.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = len as libc::off_t;
    // SAFETY: fcntl(2) F_OFD_GETLK on a caller-owned open fd, writing into `fl`.
    if unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut fl) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger").field("path", &self.path).finish()
    }
}

/// Holds an exclusive `flock` on the ledger file until dropped.
struct FileLock<'a>(&'a File);

/// Longest wait for the ledger's group lock ([`Ledger::group`]): it is held for microseconds,
/// and any ledger client (a hostile tenant too) can take it, so a holder that keeps it this
/// long is refused rather than waited for (which would hang every new offline process of the
/// GPU in its CUDA initialisation).
pub const GROUP_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl<'a> FileLock<'a> {
    fn take(file: &'a File, path: &Path) -> Result<Self, LedgerError> {
        let deadline = std::time::Instant::now() + GROUP_LOCK_WAIT;
        loop {
            // SAFETY: the fd is owned by `file`, open for the lifetime of the guard.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(Self(file));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                io::ErrorKind::WouldBlock => {
                    return Err(io_err(path, "flock (the group lock stayed held by another process for 2 s)", e));
                }
                _ => return Err(io_err(path, "flock", e)),
            }
        }
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        // SAFETY: same fd as locked in `take`, still open.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

pub(crate) fn io_err(path: &Path, op: &'static str, source: io::Error) -> LedgerError {
    LedgerError::Io {
        path: path.to_owned(),
        op,
        source,
    }
}

fn corrupt(path: &Path, field: &'static str, detail: String) -> LedgerError {
    LedgerError::Corrupt {
        path: path.to_owned(),
        field,
        detail,
    }
}

/// Mode of a newly created ledger file, set explicitly whatever the creator's umask: offline
/// processes run as arbitrary non-root users and every one of them must reach the ledger.
/// Operators who put offline containers in one group narrow it with [`Ledger::set_access`].
pub const DEFAULT_FILE_MODE: u32 = 0o666;

fn set_mode(file: &File, path: &Path, mode: u32) -> Result<(), LedgerError> {
    // SAFETY: fchmod(2) on an fd owned by `file`, open for the duration of the call.
    if unsafe { libc::fchmod(file.as_raw_fd(), mode as libc::mode_t) } != 0 {
        return Err(io_err(path, "fchmod", io::Error::last_os_error()));
    }
    Ok(())
}

/// The quota group of a Kubernetes pod's processes (`XCUDA_GROUP`, set by node-agent's
/// Allocate): all containers of the pod share the pod's planned quota, and the daemons check a
/// registration of a pod's process against it.
pub fn pod_group_name(pod_uid: &str) -> String {
    format!("k8s-pod-{pod_uid}")
}

/// Stable non-zero group id for a container name (FNV-1a 64).
pub fn group_id_for(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.max(1)
}

impl Ledger {
    /// Opens the ledger at `path`, creating and initialising it (and its directory) if absent.
    ///
    /// A new ledger is initialised completely in a temp file beside it and linked into place
    /// only if the path is still free, so an existing file is always a finished ledger: an
    /// empty or short one is damage (truncation), never "new" (re-initialising it in place
    /// would hand every group a fresh 0 usage while its processes still hold memory).
    pub fn open_or_create(path: &Path, gpu_index: u32) -> Result<Self, LedgerError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io_err(dir, "create directory", e))?;
        }
        let open = || OpenOptions::new().read(true).write(true).open(path);
        let file = match open() {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Self::create_fresh(path, gpu_index, Place::IfAbsent)?;
                open().map_err(|e| io_err(path, "open", e))?
            }
            Err(e) => return Err(io_err(path, "open", e)),
        };
        Self::from_file(file, path, Some(gpu_index))
    }

    /// Opens an existing ledger; never creates or repairs it.
    pub fn open_existing(path: &Path) -> Result<Self, LedgerError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| io_err(path, "open", e))?;
        Self::from_file(file, path, None)
    }

    fn from_file(file: File, path: &Path, gpu: Option<u32>) -> Result<Self, LedgerError> {
        let len = file.metadata().map_err(|e| io_err(path, "stat", e))?.len();
        if len < HEADER_SIZE as u64 {
            return Err(corrupt(
                path,
                "total_size",
                format!("file is {len} bytes, shorter than the {HEADER_SIZE}-byte header"),
            ));
        }
        // A ledger of another layout version (another build of the node runtime) says so,
        // before its size (which differs too) is judged.
        let mut head = [0u8; 12];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut head, 0)
            .map_err(|e| io_err(path, "read header", e))?;
        let (magic, version) = (
            u64::from_le_bytes(head[..8].try_into().expect("8 bytes")),
            u32::from_le_bytes(head[8..].try_into().expect("4 bytes")),
        );
        if magic == MAGIC && version != LAYOUT_VERSION {
            return Err(corrupt(
                path,
                "layout_version",
                format!(
                    "found {version}, this build reads {LAYOUT_VERSION}: the ledger was made by \
                     another version of the node runtime (shim, sysmonitor and mps-manager must \
                     be upgraded together)"
                ),
            ));
        }
        if len < LAYOUT_SIZE as u64 {
            return Err(corrupt(
                path,
                "total_size",
                format!("file is {len} bytes, layout v{LAYOUT_VERSION} needs {LAYOUT_SIZE}"),
            ));
        }
        let dev_ino = {
            use std::os::unix::fs::MetadataExt;
            let m = file.metadata().map_err(|e| io_err(path, "stat", e))?;
            (m.dev(), m.ino())
        };
        let map = map(&file, path)?;
        let fault_guard = crate::sigbus::Guard::register(map.as_ptr() as usize, map.len());
        if !fault_guard.protected() {
            // Unprotected, a truncation of this file (any of its writers can truncate it)
            // would kill this process with SIGBUS: refused instead, loudly, by the caller.
            return Err(io_err(
                path,
                "map",
                io::Error::other("every SIGBUS guard slot of this process is taken (too many ledgers mapped at once)"),
            ));
        }
        let valid = validate(layout_of(&map), path, gpu);
        if fault_guard.faulted() {
            return Err(corrupt(
                path,
                "total_size",
                "file shrank while being opened (its mapped end read as zeros)".into(),
            ));
        }
        valid?;
        Ok(Self {
            fault_guard,
            map,
            file,
            path: path.to_owned(),
            slot_locks: (0..MAX_PROCS).map(|_| AtomicI32::new(-1)).collect(),
            dev_ino,
            reclaim_desc: std::sync::Mutex::new(None),
            restored_from: Vec::new(),
        })
    }

    /// Sets the ledger file's group (when given) and then its mode, explicitly (never through
    /// a umask). The monitor calls this with its configured access on every start, so an
    /// existing file gets the configured access too.
    pub fn set_access(&self, mode: u32, gid: Option<u32>) -> Result<(), LedgerError> {
        if let Some(g) = gid {
            // SAFETY: fchown(2) on an fd owned by `self.file`; uid -1 leaves the owner as is.
            if unsafe { libc::fchown(self.file.as_raw_fd(), u32::MAX, g) } != 0 {
                return Err(io_err(&self.path, "fchown", io::Error::last_os_error()));
            }
        }
        set_mode(&self.file, &self.path, mode)
    }

    /// The ledger file's permission bits and group, as the kernel reports them.
    pub fn access(&self) -> Result<(u32, u32), LedgerError> {
        use std::os::unix::fs::MetadataExt;
        let m = self.file.metadata().map_err(|e| io_err(&self.path, "stat", e))?;
        Ok((m.mode() & 0o7777, m.gid()))
    }

    /// The file this ledger maps.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This handle's own open file description (the claims lock is taken on it; reclaims
    /// take their slot locks on descriptions of their own).
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// The mapped layout (all atomics).
    pub fn layout(&self) -> &Layout {
        layout_of(&self.map)
    }

    /// GPU index recorded in the header.
    pub fn gpu_index(&self) -> u32 {
        self.layout().header.gpu_index.load(Relaxed)
    }

    /// The slot of group `id`, if it exists; changes nothing (for readers: the monitor's
    /// reports, tools and tests; [`Ledger::group`] is for the processes of the group).
    pub fn find_group(&self, id: u64) -> Option<usize> {
        let id = id.max(1);
        self.layout().groups.iter().position(|g| g.id.load(Acquire) == id)
    }

    /// Finds the group `id` or creates it with `quota_bytes`; returns its slot. A group that
    /// exists keeps its quota unless the caller's is lower (the tighter configuration wins:
    /// a process never holds the group to a looser limit than its own), or the group is empty
    /// (no bytes held, no process slot naming it): then it takes the caller's quota, so a
    /// container restarted with a new quota gets it, lower or higher. With every slot taken,
    /// an unused group's slot is taken over (no registration, no bytes, no fresh start claim).
    pub fn group(&self, id: u64, quota_bytes: u64) -> Result<usize, LedgerError> {
        let id = id.max(1);
        let _lock = FileLock::take(&self.file, &self.path)?;
        let l = self.layout();
        let groups = &l.groups;
        if let Some(i) = groups.iter().position(|g| g.id.load(Acquire) == id) {
            let g = &groups[i];
            let have = g.quota_bytes.load(Relaxed);
            // A slot whose owner died but was not reclaimed yet still names the group: it
            // counts as a member (only tightening then), never as a reason to loosen.
            let members = l.procs.iter().any(|p| {
                owner_pid(p.owner.load(Acquire)) != 0 && p.group_slot.load(Relaxed) as usize == i
            });
            let empty = !members && g.used_bytes.load(Acquire) & USED_BYTES == 0;
            if quota_bytes < have || (empty && quota_bytes != have) {
                g.quota_bytes.store(quota_bytes, Relaxed);
            }
            return Ok(i);
        }
        let take = |i: usize| {
            let g = &groups[i];
            g.quota_bytes.store(quota_bytes, Relaxed);
            // A read-modify-write, as every write of the word (module doc, "Idle-group
            // reconciliation"): a reconciliation of the slot's previous group fails.
            g.used_bytes.swap(0, AcqRel);
            g.refusals.store(0, Relaxed);
            g.id.store(id, Release);
            Ok(i)
        };
        if let Some(i) = groups.iter().position(|g| g.id.load(Acquire) == 0) {
            return take(i);
        }
        // The table is full of groups, most of them long gone: a group is never freed when
        // its last process leaves (a container restarting must find its quota), so without
        // this a GPU's ledger refused every new group after 64 since it was made. An unused
        // group's slot is taken over: no registration names it (a dead one's slot not yet
        // reclaimed still does: those are reclaimed first), it holds no bytes and no fresh
        // start claim names it (a process starting in it holds one until it registers).
        // A process that looked the group up and registers after the takeover finds another
        // group's id in its slot: `xcuda-shim` checks the slot's group once registered, and
        // looks it up again (a second takeover is a zero quota: fail closed).
        let recyclable = |i: usize| {
            let g = &groups[i];
            let gid = g.id.load(Acquire);
            let now = crate::clock::now_ns();
            let ttl = crate::claims::DEFAULT_CLAIM_TTL_MS * 1_000_000;
            g.used_bytes.load(Acquire) & USED_BYTES == 0
                && !l.procs.iter().any(|p| {
                    owner_pid(p.owner.load(Acquire)) != 0 && p.group_slot.load(Relaxed) as usize == i
                })
                && !self.claims(now).iter().any(|c| c.group_id == gid && c.is_fresh(now, ttl))
        };
        if let Some(i) = (0..MAX_GROUPS).find(|&i| recyclable(i)) {
            return take(i);
        }
        self.reclaim_dead()?;
        if let Some(i) = (0..MAX_GROUPS).find(|&i| recyclable(i)) {
            return take(i);
        }
        Err(LedgerError::Full {
            path: self.path.clone(),
            what: "quota-group table",
            capacity: MAX_GROUPS,
        })
    }

    /// The part of [`Ledger::check_header`] that needs no syscall and touches only the
    /// header's cache line: no truncation caught by a faulting access, and the header fields
    /// validated on open (magic, version, sizes, the damaged mark). The registry's own check
    /// (every occupied slot names a group in range: a pass over all [`MAX_PROCS`] slots, one
    /// cache line each) is left to [`Ledger::check_header`]. For a caller that runs this at
    /// every (10 ms) tick and the full check when it learns of changes to the file itself
    /// (unlink, truncation) another way, and periodically (the monitor: an inotify watch and
    /// every 100 ms, see sysmonitor's `ledger` module).
    pub fn check_mapped(&self) -> Result<(), LedgerError> {
        // Anything wrong gets the full check's diagnosis (a truncation caught while reading the
        // header reads as zeros: it is reported as the truncation, not as a bad magic).
        if self.fault_guard.faulted() {
            return self.check_header();
        }
        validate_header_fields(self.layout(), &self.path, None).or_else(|_| self.check_header())
    }

    /// Re-checks, while mapped, that the file is still this ledger: its length (a truncated
    /// file would fault on access) and the header fields validated on open. Cheap (one
    /// `fstat` and a few atomic loads): for periodic checks, never the hot path.
    pub fn check_header(&self) -> Result<(), LedgerError> {
        if self.fault_guard.faulted() {
            return Err(corrupt(
                &self.path,
                "total_size",
                "file truncated while mapped (access faulted; now reading zeros)".into(),
            ));
        }
        let meta = self
            .file
            .metadata()
            .map_err(|e| io_err(&self.path, "stat", e))?;
        if std::os::unix::fs::MetadataExt::nlink(&meta) == 0 {
            return Err(corrupt(
                &self.path,
                "path",
                "file deleted while mapped: newcomers would open a different ledger".into(),
            ));
        }
        let len = meta.len();
        if len < LAYOUT_SIZE as u64 {
            return Err(corrupt(
                &self.path,
                "total_size",
                format!("file shrank to {len} bytes while mapped, layout needs {LAYOUT_SIZE}"),
            ));
        }
        validate_header(self.layout(), &self.path, None)
    }

    /// For the monitor, when its ledger was deleted while mapped: puts a copy of the mapping
    /// (groups with their usage, registrations) back at the path, only if the name is still
    /// free. The copy's occupied slots name this file's inode as where their owners' locks are:
    /// keep this `Ledger` open and call [`Ledger::reclaim_through`] on the copy to free them as
    /// their owners die. The copy over-counts what live processes free later (they have stopped using the
    /// deleted file) until they die and are reclaimed: conservative, never a fresh 0 usage.
    /// Returns whether a copy was linked into place.
    pub fn restore_deleted(&self) -> Result<bool, LedgerError> {
        let ino = self.inode()?;
        let mode = std::os::unix::fs::MetadataExt::mode(
            &self.file.metadata().map_err(|e| io_err(&self.path, "stat", e))?,
        );
        let shrunk = std::cell::Cell::new(None);
        let linked = build_beside(&self.path, mode & 0o7777, Place::IfAbsent, |m| {
            const _: () = assert!(LAYOUT_SIZE.is_multiple_of(8));
            // SAFETY: both mappings are page-aligned and LAYOUT_SIZE long, and hold only
            // atomics (see `layout_of`); viewing them as AtomicU64 words is sound.
            let (from, to) = unsafe {
                (
                    std::slice::from_raw_parts(self.map.as_ptr() as *const AtomicU64, LAYOUT_SIZE / 8),
                    std::slice::from_raw_parts(m.as_ptr() as *const AtomicU64, LAYOUT_SIZE / 8),
                )
            };
            for (f, t) in from.iter().zip(to) {
                t.store(f.load(Acquire), Relaxed);
            }
            // A truncation of the deleted file (through a descriptor a shim still holds) while
            // or before we copied reads as zeros from there on: registrations past that point
            // would vanish from the copy, their processes' load then read as online work. The
            // copy still takes the path (left free, the next shim would create a fresh ledger
            // the monitor never reads), marked damaged: no process opens it, every offline
            // process refuses new allocations until the monitor's restart moves it aside.
            let len = self.file.metadata().map(|m| m.len()).unwrap_or(0);
            if self.fault_guard.faulted() || len < LAYOUT_SIZE as u64 {
                layout_of(m).header.init_state.store(INIT_DAMAGED, Release);
                shrunk.set(Some(len));
                return Ok(());
            }
            // The owners' slot locks stay in the deleted file: say so in the copy, so that
            // nobody takes those slots for free ones (see `reclaim_through`).
            for p in &layout_of(m).procs {
                if owner_pid(p.owner.load(Relaxed)) != 0 && p.liveness.load(Relaxed) == LIVENESS_LOCK {
                    p.liveness.store(ino, Relaxed);
                }
            }
            Ok(())
        })?;
        match shrunk.get() {
            Some(len) if linked => Err(corrupt(
                &self.path,
                "total_size",
                format!(
                    "deleted ledger shrank to {len} bytes while it was copied: the copy put in its place is marked damaged \
                     (offline processes refuse new allocations until sysmonitor restarts)"
                ),
            )),
            Some(len) => Err(corrupt(
                &self.path,
                "total_size",
                format!("deleted ledger shrank to {len} bytes while it was copied; another file took its path first: not restored"),
            )),
            None => Ok(linked),
        }
    }

    /// Hot-path check (a few atomic loads, no syscall): the header still reads as this
    /// ledger's and no truncation was caught. [`Ledger::check_header`] says what is wrong.
    #[inline]
    pub fn header_intact(&self) -> bool {
        let h = &self.layout().header;
        !self.fault_guard.faulted()
            && h.magic.load(Relaxed) == MAGIC
            && h.layout_version.load(Relaxed) == LAYOUT_VERSION
            && h.init_state.load(Acquire) == INIT_READY
    }

    /// Marks the file damaged in its header (see [`INIT_DAMAGED`]), so that no process opens
    /// it again and the monitor reports it. For a body found overwritten while the header
    /// still validates; never call it on a file that has shrunk (the write would fault).
    pub fn mark_damaged(&self) {
        self.layout().header.init_state.store(INIT_DAMAGED, Release);
    }

    /// Checks that registered process `h` still owns its registry slot as process `pid` and
    /// that its group slot still holds `group_id`. Either gone means the ledger's body was
    /// overwritten (zeroed, replaced): the group's usage can no longer be trusted.
    ///
    /// First, that this handle still holds the registration's slot lock: an fd the application
    /// closed (or reused) loses it, and then the slot may be reclaimed and taken while this
    /// process still holds memory. That is this process's trouble, not damage to the ledger:
    /// reported as field `slot_lock` (the caller stops counting in the ledger and refuses new
    /// reservations; do not mark the ledger damaged for it).
    pub fn check_registration(&self, h: ProcHandle, pid: u32, group_id: u64) -> Result<(), LedgerError> {
        self.check_slot_lock(h)?;
        self.check_owner(h, pid, group_id)
    }

    /// The first half of [`Ledger::check_registration`]: this handle still holds registration
    /// `h`'s slot lock (error field `slot_lock`).
    pub fn check_slot_lock(&self, h: ProcHandle) -> Result<(), LedgerError> {
        if !self.holds_slot_lock(h) {
            return Err(corrupt(
                &self.path,
                "slot_lock",
                format!(
                    "this process's lock on registry slot {} is gone (its fd was closed or \
                     reused, by the application?): its usage may be given back while it still \
                     holds memory",
                    h.slot
                ),
            ));
        }
        Ok(())
    }

    /// The second half of [`Ledger::check_registration`]: registry slot `h.slot` is still owned
    /// by `pid` and group slot `h.group` still holds `group_id` (error fields `groups.id`,
    /// `procs.owner`: the ledger was overwritten, unless this process unregistered `h` itself).
    pub fn check_owner(&self, h: ProcHandle, pid: u32, group_id: u64) -> Result<(), LedgerError> {
        let l = self.layout();
        let gid = l.groups.get(h.group).map_or(0, |g| g.id.load(Acquire));
        if gid != group_id {
            return Err(corrupt(
                &self.path,
                "groups.id",
                format!(
                    "group slot {} holds id {gid:#x}, not this process's group {group_id:#x}: \
                     the ledger was overwritten",
                    h.group
                ),
            ));
        }
        let owner = l.procs.get(h.slot).map_or(0, |p| owner_pid(p.owner.load(Acquire)));
        if owner != pid {
            return Err(corrupt(
                &self.path,
                "procs.owner",
                format!(
                    "registry slot {} is owned by pid {owner}, not this process ({pid}): \
                     the ledger was overwritten",
                    h.slot
                ),
            ));
        }
        Ok(())
    }

    /// Group id held by group slot `group` (0 = free or out of range).
    pub fn group_id(&self, group: usize) -> u64 {
        self.layout().groups.get(group).map_or(0, |g| g.id.load(Acquire))
    }

    /// Sets the quota of group slot `group` (operators, tests).
    pub fn set_group_quota(&self, group: usize, quota_bytes: u64) {
        if let Some(g) = self.layout().groups.get(group) {
            g.quota_bytes.store(quota_bytes, Relaxed);
        }
    }

    /// Quota of a group (0 for a slot out of range).
    pub fn group_quota(&self, group: usize) -> u64 {
        self.layout().groups.get(group).map_or(0, |g| g.quota_bytes.load(Relaxed))
    }

    /// Bytes currently reserved by a group (without the reconciliation's claim mark).
    pub fn group_used(&self, group: usize) -> u64 {
        self.layout()
            .groups
            .get(group)
            .map_or(0, |g| g.used_bytes.load(Acquire) & USED_BYTES)
    }

    /// Check-and-reserve in one CAS on the group's counter: either `bytes` are added without
    /// passing the quota, or nothing changes. Safe across threads and processes. The write
    /// clears the reconciliation's claim mark (module doc, "Idle-group reconciliation").
    pub fn try_reserve_group(&self, group: usize, bytes: u64) -> Result<(), ReserveError> {
        let quota = self.group_quota(group);
        let Some(g) = self.layout().groups.get(group) else {
            return Err(ReserveError {
                requested: bytes,
                used: 0,
                quota: 0,
            });
        };
        let mut cur = g.used_bytes.load(Relaxed);
        loop {
            let have = cur & USED_BYTES;
            let new = match have.checked_add(bytes) {
                Some(n) if n <= quota && n <= USED_BYTES => n,
                _ => {
                    g.refusals.fetch_add(1, Relaxed);
                    return Err(ReserveError {
                        requested: bytes,
                        used: have,
                        quota,
                    });
                }
            };
            match g
                .used_bytes
                .compare_exchange_weak(cur, new, AcqRel, Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Gives `bytes` back to a group (saturating: never underflows).
    pub fn release_group(&self, group: usize, bytes: u64) {
        if let Some(g) = self.layout().groups.get(group) {
            release_used(&g.used_bytes, bytes);
        }
    }

    /// Whether registry slot `h.slot` is still registration `h`'s: its owner word holds `h`'s
    /// generation and a pid (one load). A slot reclaimed after its owner lost its slot lock (the
    /// application closed the fd) is free, or a newcomer's: not `h`'s any more.
    pub fn owns_slot(&self, h: ProcHandle) -> bool {
        self.layout().procs.get(h.slot).is_some_and(|p| {
            let o = p.owner.load(Acquire);
            owner_pid(o) != 0 && owner_gen(o) == h.gen
        })
    }

    /// Reserves for a registered process: group first (the atomic step), then its own slot.
    /// Refused, nothing counted, if the slot is no longer `h`'s ([`Ledger::owns_slot`]): the
    /// bytes would land in a free slot nobody gives back, or in a newcomer's (another group's
    /// usage then); the caller registers again.
    pub fn try_reserve(&self, h: ProcHandle, bytes: u64) -> Result<(), ReserveError> {
        if !self.owns_slot(h) {
            return Err(ReserveError { requested: bytes, used: self.group_used(h.group), quota: self.group_quota(h.group) });
        }
        self.try_reserve_group(h.group, bytes)?;
        if let Some(p) = self.layout().procs.get(h.slot) {
            p.mem_bytes.fetch_add(bytes, Relaxed);
        }
        Ok(())
    }

    /// Counts `bytes` that registered process `h` already holds (device memory the driver gave
    /// it), past the group's quota if need be: the group then refuses reservations until frees
    /// bring it back under. For a process that registers again after losing its slot lock
    /// (the shim's `Quota::check_ledger`), never for new allocations.
    pub fn count_held(&self, h: ProcHandle, bytes: u64) {
        if let Some(g) = self.layout().groups.get(h.group) {
            let _ = g.used_bytes.fetch_update(AcqRel, Relaxed, |v| Some((v & USED_BYTES).saturating_add(bytes).min(USED_BYTES)));
        }
        if let Some(p) = self.layout().procs.get(h.slot) {
            p.mem_bytes.fetch_add(bytes, Relaxed);
        }
    }

    /// Releases for a registered process: its slot first, then the group, so a crash between
    /// the two can only leave the group over-counted (conservative), never under-counted. The
    /// group gets back only what the slot still counted: a slot a reclaimer emptied (its owner
    /// lost its slot lock, and the reclaim gave its bytes back to the group already) has
    /// nothing more to give, and a free then must not take other processes' usage off the
    /// group (the shim moves to a new slot at its next check). A slot no longer `h`'s
    /// ([`Ledger::owns_slot`]: reclaimed, perhaps taken by a newcomer) gives nothing: its
    /// reclaim gave `h`'s usage back already, and what it counts now is someone else's.
    pub fn release(&self, h: ProcHandle, bytes: u64) {
        if !self.owns_slot(h) {
            return;
        }
        let taken = match self.layout().procs.get(h.slot) {
            Some(p) => saturating_sub(&p.mem_bytes, bytes),
            None => bytes,
        };
        self.release_group(h.group, taken);
    }

    /// Registers process `pid` (as this pid namespace names it) in group slot `group`.
    ///
    /// For the calling process (`pid` = its own) the slot is held by a lock on a description
    /// opened for this registration (module doc, "Slot protocol"), released by
    /// [`Ledger::unregister`], by dropping this `Ledger`, or by the kernel when the process
    /// dies. For another process (tools, tests) no lock is held: the slot is alive while `pid`
    /// with its current start time lives, judged only from this pid namespace.
    pub fn register(&self, pid: u32, group: usize) -> Result<ProcHandle, LedgerError> {
        self.register_with_mps(pid, group, 0)
    }

    /// [`Ledger::register`], recording in the new slot the MPS active-thread percentage
    /// `mps_pct` (1..=100; 0 or anything else = none known) the process started with
    /// ([`ProcSlot::mps_pct`]). The registering process is the slot's only writer: the value
    /// is stored before the slot's owner is published and never changes afterwards.
    pub fn register_with_mps(&self, pid: u32, group: usize, mps_pct: u32) -> Result<ProcHandle, LedgerError> {
        let mps_pct = if (1..=100).contains(&mps_pct) { mps_pct } else { 0 };
        if group >= MAX_GROUPS {
            return Err(corrupt(
                &self.path,
                "group_slot",
                format!("{group} out of range"),
            ));
        }
        let proxy = pid != std::process::id();
        let start = if proxy { procinfo::start_time(pid) } else { procinfo::own_start_time() };
        let start = start.ok_or_else(|| {
            corrupt(
                &self.path,
                "pid",
                format!("process {pid} has no /proc entry"),
            )
        })?;
        let lock = self.new_description()?;
        let own_ns = procinfo::own_pid_ns();
        // Dead neighbours' quota back first (a newcomer may need it at once), on the new
        // registration's own description (never on one a fork child shares with its parent).
        self.reclaim_on(&lock)?;
        for (i, p) in self.layout().procs.iter().enumerate() {
            if !self.take_slot_lock(&lock, i, p)? {
                continue;
            }
            // Slot `i` is ours alone until we let go of its lock.
            let o = p.owner.load(Acquire);
            if owner_pid(o) != 0 {
                let bytes = self.give_back(p, o);
                tracing::info!(ledger = %self.path.display(), pid = owner_pid(o), bytes, "reclaimed a dead process's slot");
            } else {
                // A free slot counts nothing, unless a reservation of an owner that had lost it
                // landed there after its reclaim: that goes back to its group now (zeroed
                // below, it stayed in the group for good).
                let left = p.mem_bytes.swap(0, AcqRel);
                if left > 0 {
                    self.release_group(p.group_slot.load(Relaxed) as usize, left);
                    tracing::warn!(ledger = %self.path.display(), slot = i, bytes = left, "gave back bytes a free slot still counted");
                }
            }
            let o = p.owner.load(Acquire);
            p.start_time.store(0, Relaxed);
            p.pid_ns.store(own_ns, Relaxed);
            p.group_slot.store(group as u32, Relaxed);
            p.mem_bytes.store(0, Relaxed);
            p.launches.store(0, Relaxed);
            p.launches_delayed.store(0, Relaxed);
            p.syncs_begun.store(0, Relaxed);
            p.syncs_ended.store(0, Relaxed);
            p.heartbeat_ns.store(now_ns(), Relaxed);
            p.mps_pct.store(mps_pct, Relaxed);
            p.liveness.store(if proxy { LIVENESS_PROXY } else { LIVENESS_LOCK }, Relaxed);
            p.owner.store(owner_word(owner_gen(o).wrapping_add(1), pid), Release);
            p.start_time.store(start, Release);
            // The join (module doc, "Idle-group reconciliation"): published above, it is seen
            // by any reconciliation of the group that claims it after this, and one that
            // claimed it before cannot set its usage back any more.
            self.layout().groups[group].used_bytes.fetch_and(USED_BYTES, AcqRel);
            if proxy {
                let _ = slot_lock(lock.as_raw_fd(), i, libc::F_UNLCK);
            } else {
                self.slot_locks[i].store(lock.into_raw_fd(), Release);
                // This process's start claim has done its work: its slot says what it holds
                // from now on (published above, so one of the two is always there).
                let _ = self.withdraw_claim(self.group_id(group), pid, own_ns, crate::claims::WITHDRAW_WAIT);
            }
            return Ok(ProcHandle { slot: i, group, gen: owner_gen(o).wrapping_add(1) });
        }
        Err(LedgerError::Full {
            path: self.path.clone(),
            what: "process registry",
            capacity: MAX_PROCS,
        })
    }

    /// A new open file description of this ledger's file (slot locks of one registration).
    fn new_description(&self) -> Result<File, LedgerError> {
        use std::os::unix::fs::MetadataExt;
        // /proc/self/fd names the very file we mapped, even if its path was replaced since.
        let via_proc = OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", self.file.as_raw_fd()));
        let f = match via_proc {
            Ok(f) => f,
            Err(_) => OpenOptions::new()
                .read(true)
                .write(true)
                .open(&self.path)
                .map_err(|e| io_err(&self.path, "open for a slot lock", e))?,
        };
        let (a, b) = (
            self.file.metadata().map_err(|e| io_err(&self.path, "stat", e))?,
            f.metadata().map_err(|e| io_err(&self.path, "stat", e))?,
        );
        if (a.dev(), a.ino()) != (b.dev(), b.ino()) {
            return Err(corrupt(
                &self.path,
                "path",
                "the path now names another file than the mapped ledger".into(),
            ));
        }
        Ok(f)
    }

    /// Tries to take slot `i`'s lock on `desc` for registration or reclaim. `Ok(true)`: the
    /// lock is held and the slot may be taken over (free, or its owner is gone). Never takes a
    /// slot whose owner's lock lies in a deleted ledger, or a live proxy registration.
    fn take_slot_lock(&self, desc: &File, i: usize, p: &ProcSlot) -> Result<bool, LedgerError> {
        let liveness = p.liveness.load(Acquire);
        if liveness != LIVENESS_LOCK && liveness != LIVENESS_PROXY {
            return Ok(false);
        }
        let got = slot_lock(desc.as_raw_fd(), i, libc::F_WRLCK)
            .map_err(|e| io_err(&self.path, "fcntl(F_OFD_SETLK)", e))?;
        if !got {
            return Ok(false);
        }
        if !fd_names(desc.as_raw_fd(), self.dev_ino) {
            // The application closed the pass's fd and opened another file under its number:
            // a lock "taken" there says nothing of the slot's owner (every live process would
            // be reclaimed, its usage given back). Let go of it; the next pass opens its own.
            let _ = slot_lock(desc.as_raw_fd(), i, libc::F_UNLCK);
            return Err(LedgerError::Io {
                path: self.path.clone(),
                op: "reclaim pass",
                source: io::Error::other("the pass's descriptor no longer names the ledger (an fd the application closed and reused)"),
            });
        }
        // Under the lock: re-read what may have changed before we got it.
        let o = p.owner.load(Acquire);
        let keep = match p.liveness.load(Acquire) {
            LIVENESS_LOCK => true,
            LIVENESS_PROXY => {
                // Taken only from an owner known dead: a `/proc` that cannot be read (out of
                // descriptors, `hidepid`) leaves a live proxy registration and its usage alone.
                owner_pid(o) == 0
                    || (p.pid_ns.load(Relaxed) == procinfo::own_pid_ns()
                        && procinfo::is_dead(owner_pid(o), p.start_time.load(Acquire)))
            }
            _ => false,
        };
        if !keep {
            let _ = slot_lock(desc.as_raw_fd(), i, libc::F_UNLCK);
        }
        Ok(keep)
    }

    /// Unregisters a process, giving back whatever it still holds. Only through the `Ledger`
    /// that registered it: that is where its slot lock is.
    pub fn unregister(&self, h: ProcHandle) {
        let Some(p) = self.layout().procs.get(h.slot) else {
            return;
        };
        let fd = self.slot_locks[h.slot].swap(-1, AcqRel);
        let proxy = p.liveness.load(Acquire) == LIVENESS_PROXY;
        if fd < 0 && !proxy {
            return;
        }
        // Only under our own lock (slot protocol, step 1). A lock lost meanwhile (the
        // application closed or replaced its fd) let a reclaimer give the slot's usage back and
        // a newcomer take the slot: what it holds now is not ours to give back.
        let held = if fd >= 0 {
            self.desc_holds_slot(fd, h.slot)
        } else {
            (0..100).any(|_| self.slot_lock_self(h.slot) || {
                std::thread::sleep(std::time::Duration::from_millis(1));
                false
            })
        };
        if held {
            let o = p.owner.load(Acquire);
            if owner_pid(o) != 0 {
                self.give_back(p, o);
            }
            if fd < 0 {
                let _ = slot_lock(self.file.as_raw_fd(), h.slot, libc::F_UNLCK);
            }
        }
        if fd >= 0 && held {
            // SAFETY: swapped out of the table above (closed exactly once) and still our
            // description (it holds the lock), not a number the application reused.
            unsafe { libc::close(fd) };
        }
    }

    /// Whether this handle still holds registration `h`'s slot lock (its fd is open, names
    /// this ledger's file and its description holds the lock). Always true for a registration
    /// made on behalf of another process.
    pub fn holds_slot_lock(&self, h: ProcHandle) -> bool {
        let Some(p) = self.layout().procs.get(h.slot) else {
            return false;
        };
        if p.liveness.load(Acquire) == LIVENESS_PROXY {
            return true;
        }
        let fd = self.slot_locks[h.slot].load(Acquire);
        fd >= 0 && self.desc_holds_slot(fd, h.slot)
    }

    /// Whether the description behind `fd` holds registry slot `slot`'s lock: `fd` names this
    /// ledger's file, no description but `fd`'s holds the lock (asked through `fd`), and one
    /// other than this handle's own does (asked through it). An fd the application closed, or
    /// reused for another file or for another description of this one, fails. Two `fcntl`
    /// calls and an `fstat`: never on a hot path.
    fn desc_holds_slot(&self, fd: RawFd, slot: usize) -> bool {
        self.desc_holds_range(fd, proc_slot_offset(slot), PROC_SLOT_LEN)
    }

    /// [`Ledger::desc_holds_slot`] for any byte range (`fd` is not this handle's own
    /// description).
    fn desc_holds_range(&self, fd: RawFd, start: u64, len: u64) -> bool {
        fd_names(fd, self.dev_ino)
            && range_lock_held(fd, start, len).is_ok_and(|other| !other)
            && range_lock_held(self.file.as_raw_fd(), start, len).unwrap_or(false)
    }

    /// The fd of this process's reclaim pass description, once a pass opened it (tests that
    /// play an application closing it).
    #[doc(hidden)]
    pub fn reclaim_pass_fd(&self) -> Option<RawFd> {
        let g = self.reclaim_desc.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().map(|(_, f)| f.as_raw_fd())
    }

    /// The fd holding registration `h`'s slot lock (tests that play an application closing it).
    #[doc(hidden)]
    pub fn slot_lock_fd(&self, h: ProcHandle) -> Option<RawFd> {
        let fd = self.slot_locks.get(h.slot)?.load(Acquire);
        (fd >= 0).then_some(fd)
    }

    /// Takes slot `slot`'s lock on this handle's own description (proxy unregistration).
    fn slot_lock_self(&self, slot: usize) -> bool {
        slot_lock(self.file.as_raw_fd(), slot, libc::F_WRLCK).unwrap_or(false)
    }
    /// Records a heartbeat for a registered process.
    pub fn heartbeat(&self, h: ProcHandle) {
        if let Some(p) = self.layout().procs.get(h.slot) {
            p.heartbeat_ns.store(now_ns(), Relaxed);
        }
    }

    /// Counts a launch (and whether it waited) for a registered process.
    pub fn count_launches(&self, h: ProcHandle, launches: u64, delayed: u64) {
        if let Some(p) = self.layout().procs.get(h.slot) {
            p.launches.fetch_add(launches, Relaxed);
            if delayed > 0 {
                p.launches_delayed.fetch_add(delayed, Relaxed);
            }
        }
    }

    /// Publishes a registered process's synchronizing calls on this GPU, entered and returned
    /// (totals since it registered: [`ProcSnapshot::syncs`]; a reader that sees more returned
    /// than entered, a publication half read, reads none waiting).
    pub fn set_syncs(&self, h: ProcHandle, begun: u64, ended: u64) {
        if let Some(p) = self.layout().procs.get(h.slot) {
            p.syncs_ended.store(ended, Relaxed);
            p.syncs_begun.store(begun, Release);
        }
    }

    /// Gives back the usage of every registered process that has died, in any pid namespace
    /// (its slot lock is free; module doc, "Slot protocol"). Returns `(pid, bytes)` reclaimed
    /// (the pid as the dead process's namespace named it). A few `fcntl` calls per occupied
    /// slot: for the monitor's tick and shims' slow paths, never an allocation's hot path.
    ///
    /// Each pass takes the slot locks on a description opened for it: OFD locks do not exclude
    /// one another on one description, which this handle's threads (a shim's controller and
    /// its application threads refused a reservation) and a fork child share. Two passes on one
    /// description could both "hold" a dead slot's lock, the first one's unlock release the
    /// second's, and the second, stalled, then give back and free a newcomer's slot.
    ///
    /// A pass also sets the usage of each group no registration names back to what its slots
    /// count ([`Ledger::reconcile_idle_groups`]).
    pub fn reclaim_dead(&self) -> Result<Vec<(u32, u64)>, LedgerError> {
        if !self.layout().procs.iter().any(|p| owner_pid(p.owner.load(Acquire)) != 0) {
            self.reconcile_idle_groups();
            return Ok(Vec::new());
        }
        // One pass at a time: a pass running on another thread (or a lock held by a thread
        // that forked, in a fork child) reclaims what there is; this one is skipped.
        let Some(mut pass) = self.reclaim_pass() else {
            return Ok(Vec::new());
        };
        let desc = self.pass_description(&mut pass)?;
        let out = self.reclaim_on(desc)?;
        self.reconcile_on(desc);
        Ok(out)
    }

    /// The right to run a reclaim or reconciliation pass through this handle (one at a time),
    /// with the description it takes its locks on; `None` while another thread runs one.
    fn reclaim_pass(&self) -> Option<std::sync::MutexGuard<'_, Option<(u32, File)>>> {
        match self.reclaim_desc.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The pass description of this process (a fork child opens its own), opened at its first
    /// pass.
    fn pass_description<'a>(&self, pass: &'a mut Option<(u32, File)>) -> Result<&'a File, LedgerError> {
        let pid = std::process::id();
        if pass.as_ref().is_some_and(|(p, f)| *p == pid && !fd_names(f.as_raw_fd(), self.dev_ino)) {
            // Its fd number was closed by the application and names another file now, which
            // is the application's to close: forgotten, not dropped.
            if let Some((_, f)) = pass.take() {
                std::mem::forget(f);
            }
        }
        if pass.as_ref().is_none_or(|(p, _)| *p != pid) {
            *pass = Some((pid, self.new_description()?));
        }
        Ok(&pass.as_ref().expect("set above").1)
    }

    /// Sets the usage of every group that no registration names (no occupied slot) back to
    /// what its free slots count (nothing, but for a stale reservation that landed on one after
    /// its reclaim, which the slot's next owner gives back). Usage with nobody behind it is
    /// left by a process killed between its group's reservation and its slot's, or a reclaimer
    /// killed between a slot's swap and the group's subtraction: it counted for the group's
    /// whole life (a pod's quota shrunk by it, an unused group never taken over). Returns
    /// `(group id, bytes dropped)`, each logged.
    ///
    /// Never over a reservation made meanwhile: protocol and proof in the module doc,
    /// "Idle-group reconciliation" (claim mark, group lock, a second look, then the write).
    /// A few atomic loads when no group qualifies; an `fcntl` or two per group that does. A
    /// group another pass is reconciling (its lock held) is left to that pass, as is every
    /// group while another thread of this process runs a pass through this handle.
    pub fn reconcile_idle_groups(&self) -> Vec<(u64, u64)> {
        let l = self.layout();
        if l.groups.iter().all(|g| g.used_bytes.load(Relaxed) & USED_BYTES == 0) {
            return Vec::new();
        }
        let Some(mut pass) = self.reclaim_pass() else {
            return Vec::new();
        };
        match self.pass_description(&mut pass) {
            Ok(desc) => self.reconcile_on(desc),
            Err(e) => {
                tracing::warn!(error = %e, "idle-group reconciliation skipped");
                Vec::new()
            }
        }
    }

    /// Members (a bit per group) and what free slots count per group, as the registry reads now.
    fn idle_scan(&self) -> (u64, [u64; MAX_GROUPS]) {
        const _: () = assert!(MAX_GROUPS <= 64, "one bit per group");
        let (mut members, mut left) = (0u64, [0u64; MAX_GROUPS]);
        for p in self.layout().procs.iter() {
            let occupied = owner_pid(p.owner.load(Acquire)) != 0;
            let g = p.group_slot.load(Relaxed) as usize;
            if g >= MAX_GROUPS {
                continue;
            }
            if occupied {
                members |= 1 << g;
            } else {
                left[g] = left[g].saturating_add(p.mem_bytes.load(Acquire));
            }
        }
        (members, left)
    }

    /// [`Ledger::reconcile_idle_groups`] with the group locks taken on `desc`, the pass
    /// description (the caller holds [`Ledger::reclaim_pass`]).
    fn reconcile_on(&self, desc: &File) -> Vec<(u64, u64)> {
        let l = self.layout();
        // A first look, writing nothing: which groups may need it.
        let used: [u64; MAX_GROUPS] = std::array::from_fn(|i| l.groups[i].used_bytes.load(Acquire) & USED_BYTES);
        #[cfg(test)]
        reconcile_hook::at(reconcile_hook::Point::UsageRead);
        if used.iter().all(|&u| u == 0) {
            return Vec::new();
        }
        let (members, left) = self.idle_scan();
        #[cfg(test)]
        reconcile_hook::at(reconcile_hook::Point::Scanned);
        let fd = desc.as_raw_fd();
        // Claims: the group's lock, then the mark, from the word as it is now.
        let mut claimed: [Option<u64>; MAX_GROUPS] = [None; MAX_GROUPS];
        for (i, g) in l.groups.iter().enumerate() {
            if members & (1 << i) != 0 || used[i] <= left[i] || g.id.load(Acquire) == 0 {
                continue;
            }
            if !range_lock(fd, group_slot_offset(i), GROUP_SLOT_LEN, libc::F_WRLCK).unwrap_or(false) {
                continue; // another pass is on it (or the description is gone)
            }
            let cur = g.used_bytes.load(Acquire);
            let bytes = cur & USED_BYTES;
            if bytes > left[i] && g.used_bytes.compare_exchange(cur, bytes | USED_CLAIMED, AcqRel, Relaxed).is_ok() {
                claimed[i] = Some(bytes);
            } else {
                let _ = range_lock(fd, group_slot_offset(i), GROUP_SLOT_LEN, libc::F_UNLCK);
            }
        }
        if claimed.iter().all(Option::is_none) {
            return Vec::new();
        }
        // The second look, after the claims: what the writes go by.
        let (members, left) = self.idle_scan();
        #[cfg(test)]
        reconcile_hook::at(reconcile_hook::Point::BeforeWrite);
        let mut out = Vec::new();
        for (i, g) in l.groups.iter().enumerate() {
            let Some(bytes) = claimed[i] else { continue };
            let id = g.id.load(Acquire);
            let (start, len) = (group_slot_offset(i), GROUP_SLOT_LEN);
            let idle = members & (1 << i) == 0 && bytes > left[i] && id != 0;
            // Only while the lock is still ours (an application may have closed the pass
            // description's fd): else undo.
            let to = if idle && self.desc_holds_range(fd, start, len) { left[i] } else { bytes };
            let set = g.used_bytes.compare_exchange(bytes | USED_CLAIMED, to, AcqRel, Relaxed).is_ok();
            let _ = range_lock(fd, start, len, libc::F_UNLCK);
            if set && to < bytes {
                tracing::warn!(ledger = %self.path.display(), group = id, bytes = bytes - to, "a group no process is registered in still counted usage: set back to what its slots count");
                out.push((id, bytes - to));
            }
        }
        out
    }

    /// [`Ledger::reclaim_dead`] with the slot locks taken on `desc`, a description of this
    /// pass alone.
    fn reclaim_on(&self, desc: &File) -> Result<Vec<(u32, u64)>, LedgerError> {
        let mut out = Vec::new();
        for (i, p) in self.layout().procs.iter().enumerate() {
            if owner_pid(p.owner.load(Acquire)) == 0 {
                continue;
            }
            if !self.take_slot_lock(desc, i, p)? {
                continue;
            }
            let o = p.owner.load(Acquire);
            if owner_pid(o) != 0 {
                let bytes = self.give_back(p, o);
                tracing::info!(ledger = %self.path.display(), pid = owner_pid(o), bytes, "reclaimed dead process");
                out.push((owner_pid(o), bytes));
            }
            let _ = slot_lock(desc.as_raw_fd(), i, libc::F_UNLCK);
        }
        Ok(out)
    }

    /// For the monitor that restored this ledger in place of `deleted` (see
    /// [`Ledger::restore_deleted`]): frees the slots whose owners' locks were in `deleted` and
    /// are free there now (the owner died). Returns `(pid, bytes)` reclaimed.
    pub fn reclaim_through(&self, deleted: &Ledger) -> Result<Vec<(u32, u64)>, LedgerError> {
        let ino = deleted.inode()?;
        let mut out = Vec::new();
        for (i, p) in self.layout().procs.iter().enumerate() {
            if p.liveness.load(Acquire) != ino || owner_pid(p.owner.load(Acquire)) == 0 {
                continue;
            }
            let free_there = slot_lock(deleted.file.as_raw_fd(), i, libc::F_WRLCK)
                .map_err(|e| io_err(&deleted.path, "fcntl(F_OFD_SETLK)", e))?;
            if !free_there {
                continue;
            }
            if slot_lock(self.file.as_raw_fd(), i, libc::F_WRLCK)
                .map_err(|e| io_err(&self.path, "fcntl(F_OFD_SETLK)", e))?
            {
                let o = p.owner.load(Acquire);
                if p.liveness.load(Acquire) == ino && owner_pid(o) != 0 {
                    let bytes = self.give_back(p, o);
                    p.liveness.store(LIVENESS_LOCK, Release);
                    tracing::info!(ledger = %self.path.display(), pid = owner_pid(o), bytes, "reclaimed a dead process of the deleted ledger");
                    out.push((owner_pid(o), bytes));
                }
                let _ = slot_lock(self.file.as_raw_fd(), i, libc::F_UNLCK);
            }
            let _ = slot_lock(deleted.file.as_raw_fd(), i, libc::F_UNLCK);
        }
        Ok(out)
    }

    /// Tells [`Ledger::procs`] that this file was restored from the deleted ledgers with inodes
    /// `inos` (the monitor's, [`Ledger::restore_deleted`], those it keeps open): a slot whose
    /// liveness word names one of them has its owner's lock there. Any other value is no
    /// restore's: a ledger client wrote it (a slot naming a process that holds a lock in some
    /// deleted ledger got that process signalled for the slot's word).
    pub fn set_restored_from(&mut self, inos: Vec<u64>) {
        self.restored_from = inos;
    }

    /// Whether some occupied slot still has its owner's lock in the file with inode `ino`.
    pub fn depends_on(&self, ino: u64) -> bool {
        self.layout()
            .procs
            .iter()
            .any(|p| p.liveness.load(Acquire) == ino && owner_pid(p.owner.load(Acquire)) != 0)
    }

    /// The mapped file, as a process holding it open shows it (never deleted: a ledger
    /// handle names the file it mapped, whatever became of its path since).
    pub fn file_id(&self) -> LedgerFile {
        LedgerFile { dev: self.dev_ino.0, ino: self.dev_ino.1, deleted: false }
    }

    /// Inode number of the mapped file.
    pub fn inode(&self) -> Result<u64, LedgerError> {
        use std::os::unix::fs::MetadataExt;
        Ok(self.file.metadata().map_err(|e| io_err(&self.path, "stat", e))?.ino())
    }

    /// Tells the daemons' watches of the file (inotify, `IN_ATTRIB`) that something they
    /// publish from it changed, by setting the file's times to now (`futimens`): stores
    /// through the mapping raise no event. Best effort: without it (a read-only mount, no
    /// write permission) the daemons see the change at their next periodic read.
    pub fn announce(&self) {
        // SAFETY: futimens(2) on this handle's own open descriptor; a null `times` means now.
        unsafe { libc::futimens(self.file.as_raw_fd(), std::ptr::null()) };
    }

    /// Whether registry slot `slot`'s lock is held by some description other than this
    /// handle's (its owner is alive, or someone is registering or reclaiming there).
    pub fn slot_locked(&self, slot: usize) -> Result<bool, LedgerError> {
        slot_lock_held(self.file.as_raw_fd(), slot).map_err(|e| io_err(&self.path, "fcntl(F_OFD_GETLK)", e))
    }

    /// Step 4 of the slot protocol; the caller holds slot `p`'s lock.
    fn give_back(&self, p: &ProcSlot, o: u64) -> u64 {
        let bytes = p.mem_bytes.swap(0, AcqRel);
        let group = p.group_slot.load(Relaxed) as usize;
        self.release_group(group, bytes);
        p.start_time.store(0, Relaxed);
        p.owner.store(owner_word(owner_gen(o), 0), Release);
        bytes
    }

    /// Copies of all occupied registry slots.
    pub fn procs(&self) -> Vec<ProcSnapshot> {
        let l = self.layout();
        l.procs
            .iter()
            .enumerate()
            .filter_map(|(slot, p)| {
                let pid = owner_pid(p.owner.load(Acquire));
                if pid == 0 {
                    return None;
                }
                let group = p.group_slot.load(Relaxed) as usize;
                let (dev, ino) = self.dev_ino;
                let ledger_file = match p.liveness.load(Acquire) {
                    // The deleted ledger lay in this one's directory: same file system.
                    deleted if self.restored_from.contains(&deleted) => LedgerFile { dev, ino: deleted, deleted: true },
                    // Lock, proxy, or a value no restore of this handle's owner wrote (any
                    // ledger client can write any slot's word): its owner holds the slot's
                    // lock in this file or is nobody.
                    _ => LedgerFile { dev, ino, deleted: false },
                };
                Some(ProcSnapshot {
                    slot,
                    pid,
                    start_time: p.start_time.load(Acquire),
                    pid_ns: p.pid_ns.load(Relaxed),
                    group_id: l.groups.get(group).map_or(0, |g| g.id.load(Relaxed)),
                    mem_bytes: p.mem_bytes.load(Relaxed),
                    launches: p.launches.load(Relaxed),
                    launches_delayed: p.launches_delayed.load(Relaxed),
                    heartbeat_ns: p.heartbeat_ns.load(Relaxed),
                    syncs: (p.syncs_begun.load(Relaxed), p.syncs_ended.load(Relaxed)),
                    // A hostile file's out-of-range value reads as none known (fail closed).
                    mps_pct: Some(p.mps_pct.load(Relaxed)).filter(|v| *v <= 100).unwrap_or(0),
                    // A restored copy keeps every slot where it was (`restore_deleted`).
                    owner_lock: (crate::layout::proc_slot_offset(slot), crate::layout::PROC_SLOT_LEN),
                    ledger_file,
                })
            })
            .collect()
    }
}

/// A damaged ledger that [`Ledger::open_or_recreate`] moved aside before creating a fresh one.
#[derive(Debug)]
pub struct Recreated {
    /// Where the damaged file now lies (`<ledger>.damaged-<unix-ts>`).
    pub moved_to: PathBuf,
    /// Why it was judged damaged (names the file and the field).
    pub error: LedgerError,
}

impl Ledger {
    /// Like [`Ledger::open_or_create`], but a file that fails validation (wrong magic, version,
    /// size, gpu, too short) is renamed aside to `<ledger>.damaged-<unix-ts>` and replaced,
    /// atomically, by a freshly initialised one (temp file in the same directory, initialised,
    /// mode set, renamed over). For the monitor: a damaged ledger must not crash-loop it.
    /// I/O errors (permissions, disk) are returned as they are.
    pub fn open_or_recreate(
        path: &Path,
        gpu_index: u32,
    ) -> Result<(Self, Option<Recreated>), LedgerError> {
        let error = match Self::open_or_create(path, gpu_index) {
            Ok(l) => return Ok((l, None)),
            Err(e @ LedgerError::Corrupt { .. }) => e,
            Err(e) => return Err(e),
        };
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut moved_to = PathBuf::from(format!("{}{DAMAGED_SUFFIX}{ts}", path.display()));
        let mut n = 1;
        while moved_to.exists() {
            moved_to = PathBuf::from(format!("{}{DAMAGED_SUFFIX}{ts}.{n}", path.display()));
            n += 1;
        }
        Self::create_fresh(path, gpu_index, Place::Replace { aside: &moved_to })?;
        let l = Self::open_existing(path)?;
        Ok((l, Some(Recreated { moved_to, error })))
    }

    /// Creates a fresh, fully initialised ledger beside `path` and puts it in place.
    fn create_fresh(path: &Path, gpu_index: u32, place: Place<'_>) -> Result<(), LedgerError> {
        build_beside(path, DEFAULT_FILE_MODE, place, |m| {
            init_layout(layout_of(m), gpu_index);
            Ok(())
        })
        .map(|_| ())
    }
}

/// Builds a whole ledger file in a temporary file beside `path` (`fill` writes the mapping),
/// gives it `mode` and puts it in place; whether it was put there (`IfAbsent`: another
/// process may have linked its own first, and then that one is the ledger).
fn build_beside(
    path: &Path,
    mode: u32,
    place: Place<'_>,
    fill: impl FnOnce(&MmapMut) -> Result<(), LedgerError>,
) -> Result<bool, LedgerError> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map_or("ledger".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.new-{}-{}", std::process::id(), SEQ.fetch_add(1, Relaxed)));
    let _ = std::fs::remove_file(&tmp);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| io_err(&tmp, "create", e))?;
    let made = (|| {
        file.set_len(LAYOUT_SIZE as u64).map_err(|e| io_err(&tmp, "set_len", e))?;
        let m = map(&file, &tmp)?;
        fill(&m)?;
        m.flush().map_err(|e| io_err(&tmp, "msync", e))?;
        set_mode(&file, &tmp, mode)?;
        match place {
            Place::Replace { aside } => {
                std::fs::rename(path, aside).map_err(|e| io_err(path, "rename aside", e))?;
                std::fs::rename(&tmp, path).map_err(|e| io_err(path, "rename into place", e))?;
                Ok(true)
            }
            Place::IfAbsent => match std::fs::hard_link(&tmp, path) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(io_err(path, "link into place", e)),
            },
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    made
}

/// How [`build_beside`] puts the new file in place.
#[derive(Clone, Copy)]
enum Place<'a> {
    /// Only if nothing is at the path yet (link(2) refuses an existing name).
    IfAbsent,
    /// Move the current file to `aside`, then rename the new one over the path.
    Replace { aside: &'a Path },
}

/// Takes `bytes` off a group's usage word `w`, stopping at 0, in one compare-and-swap that
/// writes the reconciliation's claim mark clear (module doc, "Idle-group reconciliation");
/// returns what was taken. Nothing is written for 0 bytes (nothing given back).
fn release_used(w: &AtomicU64, bytes: u64) -> u64 {
    if bytes == 0 {
        return 0;
    }
    let mut cur = w.load(Relaxed);
    loop {
        let have = cur & USED_BYTES;
        let take = have.min(bytes);
        match w.compare_exchange_weak(cur, have - take, AcqRel, Relaxed) {
            Ok(_) => return take,
            Err(actual) => cur = actual,
        }
    }
}

/// Subtracts without ever leaving the counter wrapped: one locked op when the books are right,
/// a correcting add when they are not (a corrupt or foreign writer). For a slot's counter
/// (a group's usage word goes through [`release_used`]).
/// Takes `bytes` off `a`, stopping at 0; returns what was taken (`min(bytes, a)`).
fn saturating_sub(a: &AtomicU64, bytes: u64) -> u64 {
    let prev = a.fetch_sub(bytes, AcqRel);
    if prev < bytes {
        a.fetch_add(bytes - prev, AcqRel);
        return prev;
    }
    bytes
}

/// Maps exactly [`LAYOUT_SIZE`] bytes of `file`, whatever its length is now: a length checked
/// before mapping proves nothing (any ledger client, a tenant too, can truncate the file in
/// between), and a part past the end of the file reads as zeros once the caller's SIGBUS
/// guard is registered, which the header check then refuses.
fn map(file: &File, path: &Path) -> Result<MmapMut, LedgerError> {
    // SAFETY: the mapping is shared with other processes by design; we only ever access it
    // through atomics (see `layout_of`), so concurrent external writes are not a data race.
    unsafe { memmap2::MmapOptions::new().len(LAYOUT_SIZE).map_mut(file) }.map_err(|e| io_err(path, "mmap", e))
}

fn layout_of(map: &MmapMut) -> &Layout {
    debug_assert_eq!(map.len(), LAYOUT_SIZE, "`map` maps exactly the layout");
    // SAFETY: the mapping is page-aligned (>= align_of::<Layout>() = 8), LAYOUT_SIZE bytes
    // long (every mapping comes from `map`), lives as long as the borrow, and `Layout` consists
    // only of atomic integers, for which every bit pattern is valid and shared mutation is sound.
    unsafe { &*(map.as_ptr() as *const Layout) }
}

fn init_layout(l: &Layout, gpu_index: u32) {
    let h = &l.header;
    h.layout_version.store(LAYOUT_VERSION, Relaxed);
    h.header_size.store(HEADER_SIZE as u32, Relaxed);
    h.total_size.store(LAYOUT_SIZE as u64, Relaxed);
    h.gpu_index.store(gpu_index, Relaxed);
    h.max_procs.store(MAX_PROCS as u32, Relaxed);
    h.max_groups.store(MAX_GROUPS as u32, Relaxed);
    h.magic.store(MAGIC, Relaxed);
    h.init_state.store(INIT_READY, Release);
}

fn validate(l: &Layout, path: &Path, gpu: Option<u32>) -> Result<(), LedgerError> {
    validate_header(l, path, gpu)?;
    for (i, p) in l.procs.iter().enumerate() {
        let g = p.group_slot.load(Relaxed) as usize;
        if owner_pid(p.owner.load(Relaxed)) != 0 && g >= MAX_GROUPS {
            return Err(corrupt(path, "procs.group_slot", format!("slot {i} names group {g}")));
        }
    }
    Ok(())
}

fn validate_header(l: &Layout, path: &Path, gpu: Option<u32>) -> Result<(), LedgerError> {
    validate_header_fields(l, path, gpu)?;
    validate_registry(l, path)
}

/// The header's own fields (one cache line).
fn validate_header_fields(l: &Layout, path: &Path, gpu: Option<u32>) -> Result<(), LedgerError> {
    let h = &l.header;
    let magic = h.magic.load(Relaxed);
    if magic != MAGIC {
        return Err(corrupt(
            path,
            "magic",
            format!("found {magic:#018x}, expected {MAGIC:#018x}: not an xshare ledger"),
        ));
    }
    let v = h.layout_version.load(Relaxed);
    if v != LAYOUT_VERSION {
        return Err(corrupt(
            path,
            "layout_version",
            format!("found {v}, this build reads {LAYOUT_VERSION}"),
        ));
    }
    let hs = h.header_size.load(Relaxed);
    if hs as usize != HEADER_SIZE {
        return Err(corrupt(
            path,
            "header_size",
            format!("found {hs}, expected {HEADER_SIZE}"),
        ));
    }
    let ts = h.total_size.load(Relaxed);
    if ts != LAYOUT_SIZE as u64 {
        return Err(corrupt(
            path,
            "total_size",
            format!("found {ts}, expected {LAYOUT_SIZE}"),
        ));
    }
    let (mp, mg) = (h.max_procs.load(Relaxed), h.max_groups.load(Relaxed));
    if mp as usize != MAX_PROCS {
        return Err(corrupt(
            path,
            "max_procs",
            format!("found {mp}, expected {MAX_PROCS}"),
        ));
    }
    if mg as usize != MAX_GROUPS {
        return Err(corrupt(
            path,
            "max_groups",
            format!("found {mg}, expected {MAX_GROUPS}"),
        ));
    }
    if h.init_state.load(Acquire) == INIT_DAMAGED {
        return Err(corrupt(
            path,
            "init_state",
            "marked damaged by an offline process whose quota group or registry slot was \
             overwritten"
                .into(),
        ));
    }
    if h.init_state.load(Acquire) != INIT_READY {
        return Err(corrupt(
            path,
            "init_state",
            "initialisation never completed".into(),
        ));
    }
    if let Some(want) = gpu {
        let have = h.gpu_index.load(Relaxed);
        if have != want {
            return Err(corrupt(
                path,
                "gpu_index",
                format!("file belongs to GPU {have}, opened for GPU {want}"),
            ));
        }
    }
    Ok(())
}

/// Every occupied registry slot names a group in range (a pass over all slots).
fn validate_registry(l: &Layout, path: &Path) -> Result<(), LedgerError> {
    for (i, p) in l.procs.iter().enumerate() {
        let g = p.group_slot.load(Relaxed) as usize;
        if owner_pid(p.owner.load(Relaxed)) != 0 && g >= MAX_GROUPS {
            return Err(corrupt(
                path,
                "procs.group_slot",
                format!("slot {i} names group {g}"),
            ));
        }
    }
    Ok(())
}

/// Test hook: code run on the reconciling thread at named points of
/// [`Ledger::reconcile_idle_groups`], to play other processes' steps between its own.
#[cfg(test)]
pub(crate) mod reconcile_hook {
    use std::cell::RefCell;

    /// Where in a reconciliation the hook runs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Point {
        /// Every group's usage has been read; no registry slot looked at yet.
        UsageRead,
        /// The registry has been looked at once (members, what free slots count); nothing
        /// written yet.
        Scanned,
        /// Right before the write that sets a group's usage back.
        BeforeWrite,
    }

    type Hook = Box<dyn FnMut(Point)>;

    thread_local! {
        static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
    }

    /// Runs `f` at every point of this thread's reconciliations until the guard drops.
    pub(crate) fn set(f: impl FnMut(Point) + 'static) -> Guard {
        HOOK.with(|h| *h.borrow_mut() = Some(Box::new(f)));
        Guard
    }

    /// Clears this thread's hook when dropped.
    pub(crate) struct Guard;

    impl Drop for Guard {
        fn drop(&mut self) {
            HOOK.with(|h| *h.borrow_mut() = None);
        }
    }

    /// Runs this thread's hook, if any (taken out while it runs: it may reconcile itself).
    pub(crate) fn at(p: Point) {
        let Some(mut f) = HOOK.with(|h| h.borrow_mut().take()) else { return };
        f(p);
        HOOK.with(|h| {
            let mut h = h.borrow_mut();
            if h.is_none() {
                *h = Some(f);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::{Seek, SeekFrom, Write};
    use std::sync::Arc;

    fn fresh() -> (tempfile::TempDir, Ledger) {
        let d = tempfile::tempdir().unwrap();
        let l = Ledger::open_or_create(&d.path().join("gpu0/ledger"), 0).unwrap();
        (d, l)
    }

    fn poke(path: &Path, offset: u64, bytes: &[u8]) {
        let mut f = OpenOptions::new().write(true).open(path).unwrap();
        f.seek(SeekFrom::Start(offset)).unwrap();
        f.write_all(bytes).unwrap();
    }

    fn corrupt_field(e: LedgerError) -> &'static str {
        match e {
            LedgerError::Corrupt { field, .. } => field,
            other => panic!("expected Corrupt, got {other}"),
        }
    }

    #[test]
    fn a_new_ledger_is_reachable_whatever_the_umask() {
        let d = tempfile::tempdir().unwrap();
        // SAFETY: umask(2) only changes this process's file-creation mask.
        let old = unsafe { libc::umask(0o077) };
        let l = Ledger::open_or_create(&d.path().join("gpu0/ledger"), 0);
        // SAFETY: as above, restoring the previous mask.
        unsafe { libc::umask(old) };
        let l = l.unwrap();
        assert_eq!(l.access().unwrap().0, DEFAULT_FILE_MODE);
        l.set_access(0o660, None).unwrap();
        assert_eq!(l.access().unwrap().0, 0o660);
    }

    /// The ledger and the damaged copies moved aside beside it, nothing else in the directory.
    #[test]
    fn ledger_files_are_the_ledger_and_its_damaged_copies() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        for f in ["ledger", "ledger.damaged-1795000000", "state.json", "ledger-other"] {
            std::fs::write(d.path().join(f), b"x").unwrap();
        }
        let mut got: Vec<u64> = LedgerFile::with_damaged_copies(&d.path().join("ledger")).iter().map(|f| f.ino).collect();
        got.sort_unstable();
        let mut want: Vec<u64> = ["ledger", "ledger.damaged-1795000000"]
            .iter()
            .map(|f| std::fs::metadata(d.path().join(f)).unwrap().ino())
            .collect();
        want.sort_unstable();
        assert_eq!(got, want);
        assert!(LedgerFile::with_damaged_copies(&d.path().join("nope/ledger")).is_empty());
    }

    /// Names a tenant who can write the directory might leave there: a link to a file every
    /// process holds (`/dev/null`), a second name of another file. Neither is a copy the
    /// monitor moved aside; counted, holding them would exempt any process from the check for
    /// unshimmed GPU work.
    #[test]
    fn a_link_named_like_a_damaged_copy_is_no_copy() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("ledger"), b"x").unwrap();
        std::os::unix::fs::symlink("/dev/null", d.path().join("ledger.damaged-1")).unwrap();
        std::fs::write(d.path().join("other"), b"x").unwrap();
        std::fs::hard_link(d.path().join("other"), d.path().join("ledger.damaged-2")).unwrap();
        let got: Vec<u64> = LedgerFile::with_damaged_copies(&d.path().join("ledger")).iter().map(|f| f.ino).collect();
        assert_eq!(got, vec![std::fs::metadata(d.path().join("ledger")).unwrap().ino()]);
    }

    /// A deleted ledger truncated (through a descriptor a shim still holds) before the monitor
    /// copies it reads as zeros past the end: a copy would lose every registration there, and
    /// those processes' load would read as online work. The copy put in place is marked
    /// damaged, so that the path is neither left to a fresh ledger nor trusted.
    #[test]
    fn a_deleted_ledger_shrunk_before_its_copy_is_not_restored() {
        let (_d, l) = fresh();
        if !l.fault_guard.protected() {
            return;
        }
        let g = l.group(1, 1000).unwrap();
        let holder = Ledger::open_existing(l.path()).unwrap();
        let h = holder.register(std::process::id(), g).unwrap();
        holder.try_reserve(h, 250).unwrap();
        let keep = OpenOptions::new().write(true).open(l.path()).unwrap();
        std::fs::remove_file(l.path()).unwrap();
        keep.set_len(4096).unwrap();
        let e = l.restore_deleted().unwrap_err();
        assert!(matches!(e, LedgerError::Corrupt { field: "total_size", .. }), "{e}");
        // The path is taken (left free, the next shim would create a fresh ledger nobody
        // reads), by a copy no process opens.
        let Err(again) = Ledger::open_existing(l.path()) else { panic!("a damaged copy is refused") };
        assert!(matches!(again, LedgerError::Corrupt { .. }), "{again}");
        assert!(Ledger::open_or_create(l.path(), 0).is_err(), "and never replaced by a fresh one");
    }

    #[test]
    fn an_open_racing_a_truncation_fails_and_never_panics() {
        let (_d, l) = fresh();
        let path = l.path().to_owned();
        drop(l);
        let panicked = crate::panic_opening_while_shrinking(&path, LAYOUT_SIZE as u64, 3000, || {
            let _ = Ledger::open_existing(&path);
        });
        assert_eq!(panicked, None, "a daemon scanning a tenant's ledger would have died");
    }

    /// Review: the application closed this process's slot-lock fd; another process of the
    /// group reclaimed the slot (lock free), took it and reserved 700. This process's exit
    /// (unregister) gave back the newcomer's slot and bytes: the group showed 0 while 700 were
    /// held, and admitted another 1000 past its quota of 1000.
    #[test]
    fn unregister_after_losing_the_slot_lock_leaves_the_newcomer_alone() {
        // No child may hold a copy of our slot-lock fd while we lose it.
        let _spawn = crate::SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let (_d, a) = fresh();
        let g = a.group(5, 1000).unwrap();
        let ha = a.register(std::process::id(), g).unwrap();
        a.try_reserve(ha, 300).unwrap();
        assert!(a.holds_slot_lock(ha));
        // The application dup2s another description of the ledger file over our slot-lock fd
        // (closing ours: the lock goes): the number is open, names the file, holds no lock.
        let n = lose_slot_lock(&a, ha);
        assert!(!a.holds_slot_lock(ha));
        let b = Ledger::open_existing(a.path()).unwrap();
        let hb = b.register(std::process::id(), g).unwrap();
        assert_eq!((hb.slot, b.group_used(g)), (ha.slot, 0), "the slot was reclaimed and taken");
        b.try_reserve(hb, 700).unwrap();
        a.unregister(ha);
        assert_eq!(b.group_used(g), 700, "B's bytes stay counted");
        // SAFETY: the application's own fd, which unregister left open.
        assert_eq!(unsafe { libc::close(n) }, 0, "not closed by unregister: not ours");
        b.check_registration(hb, std::process::id(), 5).unwrap();
        let c = Ledger::open_existing(a.path()).unwrap();
        let hc = c.register(std::process::id(), g).unwrap();
        assert!(c.try_reserve(hc, 1000).is_err(), "the group stays within its quota");
    }

    /// What a careless application does to registration `h`'s slot lock: dup2s another
    /// description of the ledger file over its fd, which closes ours (the lock goes) and leaves
    /// the number open, naming the file, holding no lock. Returns that number (the
    /// application's to close).
    fn lose_slot_lock(l: &Ledger, h: ProcHandle) -> i32 {
        let n = l.slot_lock_fd(h).unwrap();
        let other = File::open(l.path()).unwrap();
        // SAFETY: dup2 onto the registration's own slot-lock fd; `other` is closed on return,
        // `n` stays open on the same file.
        assert_eq!(unsafe { libc::dup2(other.as_raw_fd(), n) }, n);
        n
    }

    /// Review: a free made after the slot lock was lost and the slot reclaimed (before the
    /// shim's next check moves it to a new slot) took its bytes off the group again, eating
    /// the usage of the group's other processes (group 300 held by B read 0, so 1000 more
    /// fitted under a quota of 1000).
    #[test]
    fn a_free_on_a_reclaimed_slot_gives_the_group_nothing_more() {
        let _spawn = crate::SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let (_d, a) = fresh();
        let g = a.group(5, 1000).unwrap();
        let b = Ledger::open_existing(a.path()).unwrap();
        let hb = b.register(std::process::id(), g).unwrap();
        b.try_reserve(hb, 300).unwrap();
        let ha = a.register(std::process::id(), g).unwrap();
        a.try_reserve(ha, 600).unwrap();
        // A's slot-lock fd is replaced (the lock goes), and a reclaimer gives its 600 back.
        let n = lose_slot_lock(&a, ha);
        let r = Ledger::open_existing(a.path()).unwrap();
        assert_eq!(r.reclaim_dead().unwrap(), vec![(std::process::id(), 600)]);
        assert_eq!(r.group_used(g), 300);
        // A frees 500 of what it holds before it notices.
        a.release(ha, 500);
        assert_eq!(r.group_used(g), 300, "B's 300 stay counted");
        b.release(hb, 300);
        assert_eq!(r.group_used(g), 0);
        // SAFETY: the application's own fd.
        unsafe { libc::close(n) };
    }

    /// Review: after the slot lock was lost, the slot reclaimed and taken by a newcomer of
    /// another group, a reservation and a free of the old owner landed on the newcomer's slot:
    /// its 200 went into the newcomer's count (given back to the newcomer's group when it
    /// leaves: that group under-counted) and its free took the newcomer's bytes off. A slot
    /// no longer the handle's now takes neither.
    #[test]
    fn a_stale_handle_neither_reserves_nor_frees_on_a_newcomers_slot() {
        let _spawn = crate::SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let (_d, a) = fresh();
        let (ga, gb) = (a.group(5, 1000).unwrap(), a.group(6, 1000).unwrap());
        let ha = a.register(std::process::id(), ga).unwrap();
        a.try_reserve(ha, 300).unwrap();
        assert!(a.owns_slot(ha));
        let n = lose_slot_lock(&a, ha);
        let b = Ledger::open_existing(a.path()).unwrap();
        let hb = b.register(std::process::id(), gb).unwrap();
        assert_eq!((hb.slot, b.group_used(ga)), (ha.slot, 0), "reclaimed and taken by group 6");
        b.try_reserve(hb, 400).unwrap();
        assert!(!a.owns_slot(ha) && b.owns_slot(hb));
        assert!(a.try_reserve(ha, 200).is_err(), "not A's slot any more");
        a.release(ha, 100);
        assert_eq!((b.group_used(ga), b.group_used(gb)), (0, 400));
        b.unregister(hb);
        assert_eq!(b.group_used(gb), 0, "group 6 got back exactly its own 400");
        // SAFETY: the application's own fd.
        unsafe { libc::close(n) };
    }

    /// A free slot that still counts bytes (a stale owner's reservation landed there after its
    /// reclaim, in the instant between its check of the owner and its adds) gives them back to
    /// its group when a newcomer takes it; before, the newcomer zeroed them and the group kept
    /// them for good.
    #[test]
    fn a_newcomer_gives_back_what_a_free_slot_still_counts() {
        let _spawn = crate::SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let (_d, l) = fresh();
        let g = l.group(5, 1000).unwrap();
        let h = l.register(std::process::id(), g).unwrap();
        l.unregister(h);
        // The stale reservation's two adds, after the slot was freed.
        l.try_reserve_group(g, 250).unwrap();
        l.layout().procs[h.slot].mem_bytes.store(250, Relaxed);
        let h2 = l.register(std::process::id(), g).unwrap();
        assert_eq!(h2.slot, h.slot);
        assert_eq!(l.group_used(g), 0, "the free slot's 250 went back to the group");
        l.unregister(h2);
    }

    /// Review: a group's usage was never checked against its slots: a process killed between
    /// its group's reservation and its slot's, or a reclaimer killed between a slot's swap and
    /// the group's subtraction, left it counted for the group's life (here 700 of a quota of
    /// 1000 with nobody registered: a 400 reservation refused for good). One reclaim pass sets
    /// a group nobody is registered in back to what its slots count, and leaves a group with a
    /// member alone.
    #[test]
    fn a_reclaim_sets_an_idle_groups_leftover_usage_back() {
        let _spawn = crate::SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let (_d, l) = fresh();
        let (idle, busy) = (l.group(5, 1000).unwrap(), l.group(6, 1000).unwrap());
        let h = l.register(std::process::id(), busy).unwrap();
        l.try_reserve(h, 100).unwrap();
        // Usage nobody holds: a reservation whose slot add never came, in each group.
        l.try_reserve_group(idle, 700).unwrap();
        l.try_reserve_group(busy, 50).unwrap();
        assert_eq!(l.reclaim_dead().unwrap(), vec![], "nobody died");
        assert_eq!(l.group_used(idle), 0, "set back to what its slots count");
        assert_eq!(l.group_used(busy), 150, "a group with a member is left alone (conservative)");
        let m = l.register(std::process::id(), idle).unwrap();
        l.try_reserve(m, 400).unwrap();
        l.unregister(m);
        l.unregister(h);
        assert_eq!(l.reconcile_idle_groups(), vec![(6, 50)], "said, and only once the group is idle");
        assert_eq!((l.group_used(idle), l.group_used(busy)), (0, 0));
        assert_eq!(l.reconcile_idle_groups(), vec![], "nothing more to do");
    }

    /// Review (session 12, left open then): the idle-group reconciliation read a group's usage,
    /// looked at the registry, and set the usage back with one compare-and-swap from the value
    /// read. A process leaving the group after the read (giving back its 200) and a newcomer
    /// registering into a slot already looked at, then reserving 200, put the usage back at the
    /// value read: the swap went through and set it to what the free slots count, 0, while the
    /// newcomer held 200 (the group then admitted 200 past its quota for the newcomer's life).
    /// Played here step by step from the reconciling thread, the newcomer coming after the
    /// first look at the registry and right before the write. The newcomer's 200 must survive
    /// (the leftover 300 with it, conservative, until a pass finds the group idle again).
    #[test]
    fn a_newcomer_reserving_what_a_leaver_gave_back_during_a_reconcile_keeps_its_reservation() {
        let _spawn = crate::SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        for when in [reconcile_hook::Point::Scanned, reconcile_hook::Point::BeforeWrite] {
            let (_d, l) = fresh();
            let g = l.group(5, 1000).unwrap();
            let me = std::process::id();
            let leaver = Ledger::open_existing(l.path()).unwrap();
            let hl = leaver.register(me, g).unwrap();
            leaver.try_reserve(hl, 200).unwrap();
            // 300 nobody holds: a reservation whose slot add never came.
            l.try_reserve_group(g, 300).unwrap();
            assert_eq!(l.group_used(g), 500);
            let newcomer = Arc::new(Ledger::open_existing(l.path()).unwrap());
            let hn = Arc::new(std::sync::Mutex::new(None));
            let hook = {
                let (newcomer, hn) = (newcomer.clone(), hn.clone());
                let mut leaver = Some((leaver, hl));
                reconcile_hook::set(move |p| {
                    if p == reconcile_hook::Point::UsageRead {
                        if let Some((leaver, hl)) = leaver.take() {
                            leaver.unregister(hl);
                        }
                    }
                    let mut hn = hn.lock().unwrap();
                    if p == when && hn.is_none() {
                        let h = newcomer.register(me, g).unwrap();
                        assert_eq!(h.slot, hl.slot, "into the slot the leaver left, already looked at");
                        newcomer.try_reserve(h, 200).unwrap();
                        *hn = Some(h);
                    }
                })
            };
            let dropped = l.reconcile_idle_groups();
            drop(hook);
            let hn = hn.lock().unwrap().expect("the newcomer registered");
            assert!(
                l.group_used(g) >= 200,
                "the newcomer's live 200 was dropped from the group's usage ({when:?}): {} counted",
                l.group_used(g)
            );
            assert_eq!((dropped, l.group_used(g)), (vec![], 500), "its 200 and the leftover 300 ({when:?})");
            assert_eq!(l.reconcile_idle_groups(), vec![], "a group with a member is left alone");
            newcomer.unregister(hn);
            assert_eq!(l.reconcile_idle_groups(), vec![(5, 300)], "the leftover goes once the group is idle");
            assert_eq!(l.group_used(g), 0);
        }
    }

    /// Two reconcilers (two processes: two handles) on one group: the second leaves a group the
    /// first holds claimed (its lock), which counts its whole usage meanwhile; the first one's
    /// write then goes through.
    #[test]
    fn a_second_reconciler_leaves_a_group_another_one_is_reconciling() {
        let _spawn = crate::SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let (_d, l) = fresh();
        let g = l.group(5, 1000).unwrap();
        l.try_reserve_group(g, 300).unwrap();
        let other = Arc::new(Ledger::open_existing(l.path()).unwrap());
        let seen = Arc::new(std::sync::Mutex::new(None));
        let hook = {
            let (other, seen) = (other.clone(), seen.clone());
            reconcile_hook::set(move |p| {
                if p == reconcile_hook::Point::BeforeWrite {
                    let raw = other.layout().groups[g].used_bytes.load(SeqCst);
                    // The hook is out while it runs: this pass runs plain.
                    let second = other.reconcile_idle_groups();
                    *seen.lock().unwrap() = Some((raw & USED_CLAIMED != 0, other.group_used(g), second));
                }
            })
        };
        let first = l.reconcile_idle_groups();
        drop(hook);
        assert_eq!(
            seen.lock().unwrap().take(),
            Some((true, 300, vec![])),
            "claimed, counted in full, left alone by the second reconciler"
        );
        assert_eq!(first, vec![(5, 300)]);
        assert_eq!(l.layout().groups[g].used_bytes.load(SeqCst), 0, "mark gone with the write");
    }

    /// A reconciler killed after its claim leaves the mark in the usage word: the usage counts
    /// in full (reservations are judged by the bytes alone), the next write of the word of any
    /// kind (reservation, release, count of held memory, a join) clears it, and the next
    /// reconciler claims over it.
    #[test]
    fn a_dead_reconcilers_mark_counts_in_full_and_goes_at_the_next_write() {
        let _spawn = crate::SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let (_d, l) = fresh();
        let g = l.group(5, 1000).unwrap();
        let w = &l.layout().groups[g].used_bytes;
        let dead_claim = |bytes: u64| w.store(bytes | USED_CLAIMED, SeqCst);
        dead_claim(300);
        assert_eq!(l.group_used(g), 300);
        assert_eq!(l.try_reserve_group(g, 800), Err(ReserveError { requested: 800, used: 300, quota: 1000 }));
        assert_eq!(w.load(SeqCst), 300 | USED_CLAIMED, "a refusal writes nothing");
        l.try_reserve_group(g, 700).unwrap();
        assert_eq!(w.load(SeqCst), 1000, "a reservation clears it");
        dead_claim(1000);
        l.release_group(g, 700);
        assert_eq!(w.load(SeqCst), 300, "a release clears it");
        dead_claim(300);
        let h = l.register(std::process::id(), g).unwrap();
        assert_eq!(w.load(SeqCst), 300, "a join clears it");
        dead_claim(300);
        l.count_held(h, 100);
        assert_eq!(w.load(SeqCst), 400, "a count of held memory clears it");
        l.release(h, 100);
        l.unregister(h);
        dead_claim(300);
        assert_eq!(l.reconcile_idle_groups(), vec![(5, 300)], "claimed over the dead one's mark");
        assert_eq!(w.load(SeqCst), 0);
        // Full words: a reservation never reaches the mark's bit, whatever the quota.
        l.set_group_quota(g, u64::MAX);
        dead_claim(USED_BYTES - 5);
        assert!(l.try_reserve_group(g, 6).is_err());
        l.try_reserve_group(g, 5).unwrap();
        assert_eq!(w.load(SeqCst), USED_BYTES);
        let h = l.register(std::process::id(), g).unwrap();
        l.count_held(h, 10);
        assert_eq!(w.load(SeqCst), USED_BYTES, "saturates below the mark");
        l.unregister(h);
    }

    /// The idle-group reconciliation under real concurrency: workers join the group, reserve,
    /// release and leave; a third of them die instead of leaving; usage nobody holds is added
    /// now and then (a reservation whose slot add never came); two reconcilers (two handles:
    /// two processes) run passes whose steps are spread out by the hook. What the workers hold
    /// at any instant (counted after a reservation went through, uncounted before its release)
    /// never passes the quota: a live reservation dropped from the group's usage would let
    /// the others reserve past it. At the end every leftover is dropped and nothing more.
    #[test]
    fn reconciling_while_processes_come_and_go_never_drops_a_live_reservation() {
        use std::sync::atomic::{AtomicBool, AtomicU64};
        const QUOTA: u64 = 600;
        let _spawn = crate::SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let (_d, l) = fresh();
        let path = l.path().to_owned();
        let g = l.group(7, QUOTA).unwrap();
        let (held, max, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (injected, dropped) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        // xorshift: no clock, no shared state.
        fn next(x: &mut u64) -> u64 {
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            *x
        }
        fn dawdle(x: &mut u64) {
            match next(x) % 4 {
                0 => {}
                1 => std::thread::yield_now(),
                2 => (0..next(x) % 2000).for_each(|_| std::hint::spin_loop()),
                _ => std::thread::sleep(std::time::Duration::from_micros(next(x) % 100)),
            }
        }
        let reconcilers: Vec<_> = (0..2u64)
            .map(|k| {
                let (path, stop, dropped) = (path.clone(), stop.clone(), dropped.clone());
                std::thread::spawn(move || {
                    let r = Ledger::open_existing(&path).unwrap();
                    let mut seed = 0x9E37_79B9_7F4A_7C15 ^ (k + 1);
                    let _hook = reconcile_hook::set(move |_| dawdle(&mut seed));
                    while !stop.load(Relaxed) {
                        let got: u64 = r.reconcile_idle_groups().iter().map(|&(_, b)| b).sum();
                        dropped.fetch_add(got, Relaxed);
                        std::thread::yield_now();
                    }
                })
            })
            .collect();
        let injector = {
            let (path, stop, injected) = (path.clone(), stop.clone(), injected.clone());
            std::thread::spawn(move || {
                let o = Ledger::open_existing(&path).unwrap();
                let mut seed = 0xD1B5_4A32_D192_ED03_u64;
                while !stop.load(Relaxed) {
                    if o.try_reserve_group(g, 20).is_ok() {
                        injected.fetch_add(20, Relaxed);
                    }
                    for _ in 0..50 {
                        dawdle(&mut seed);
                    }
                }
            })
        };
        let workers: Vec<_> = (0..3u64)
            .map(|k| {
                let (path, held, max) = (path.clone(), held.clone(), max.clone());
                std::thread::spawn(move || {
                    let mut seed = 0x2545_F491_4F6C_DD1D ^ (k + 7);
                    for round in 0..1000 {
                        let p = Ledger::open_existing(&path).unwrap();
                        let h = p.register(std::process::id(), g).unwrap();
                        let mut mine = 0;
                        for _ in 0..1 + next(&mut seed) % 3 {
                            // Sizes repeat, as allocations do: a usage going back to a
                            // value read before is common.
                            let b = 100 * (1 + next(&mut seed) % 2);
                            if p.try_reserve(h, b).is_ok() {
                                mine += b;
                                let now = held.fetch_add(b, SeqCst) + b;
                                max.fetch_max(now, SeqCst);
                            }
                            dawdle(&mut seed);
                        }
                        held.fetch_sub(mine, SeqCst);
                        if round % 3 == 0 {
                            drop(p); // dies: a reclaim gives its usage back
                        } else {
                            p.release(h, mine);
                            p.unregister(h);
                        }
                        dawdle(&mut seed);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Relaxed);
        injector.join().unwrap();
        for r in reconcilers {
            r.join().unwrap();
        }
        let max = max.load(SeqCst);
        assert!(max <= QUOTA, "the workers held {max} at once under a quota of {QUOTA}: a live reservation was dropped");
        l.reclaim_dead().unwrap();
        let (injected, dropped) = (injected.load(Relaxed), dropped.load(Relaxed));
        assert_eq!(l.group_used(g), 0, "every leftover dropped once the group is idle");
        assert!(dropped <= injected, "dropped {dropped}, only {injected} was nobody's");
    }

    /// Review: a reclaim pass took its slot locks on the handle's own description, which the
    /// shim's threads (controller, refused reservations) and a fork child share; OFD locks do
    /// not exclude one another on one description, so a second pass "took" a dead slot's lock
    /// another pass held, and stalled, could give back and free a newcomer's slot. Here the
    /// first pass is played by a lock on that shared description: the second must leave the
    /// slot alone.
    #[test]
    fn a_reclaim_never_takes_a_slot_another_pass_on_the_shared_description_holds() {
        let _spawn = crate::SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let (_d, l) = fresh();
        let g = l.group(5, 1000).unwrap();
        let dead = Ledger::open_existing(l.path()).unwrap();
        let h = dead.register(std::process::id(), g).unwrap();
        dead.try_reserve(h, 300).unwrap();
        drop(dead); // its slot lock goes: a dead registration
        let (start, len) = (proc_slot_offset(h.slot), PROC_SLOT_LEN);
        assert!(range_lock(l.raw_fd(), start, len, libc::F_WRLCK).unwrap(), "the first pass holds the slot");
        assert_eq!(l.reclaim_dead().unwrap(), vec![], "a second pass leaves it to the first");
        assert_eq!(l.group_used(g), 300);
        assert!(range_lock(l.raw_fd(), start, len, libc::F_UNLCK).unwrap());
        assert_eq!(l.reclaim_dead().unwrap(), vec![(std::process::id(), 300)]);
        assert_eq!(l.group_used(g), 0);
    }

    #[test]
    fn creates_then_reopens_with_same_state() {
        let (_d, l) = fresh();
        let g = l.group(group_id_for("c1"), 1000).unwrap();
        l.try_reserve_group(g, 300).unwrap();
        let again = Ledger::open_existing(l.path()).unwrap();
        assert_eq!(again.group(group_id_for("c1"), 5000).unwrap(), g);
        assert_eq!(again.group_used(g), 300);
        assert_eq!(again.group_quota(g), 1000, "a looser quota never replaces a group's while it holds bytes");
        assert_eq!(again.gpu_index(), 0);
    }

    #[test]
    fn the_tighter_group_quota_wins_and_an_empty_group_takes_the_new_one() {
        let (_d, l) = fresh();
        let id = group_id_for("c1");
        let g = l.group(id, 1000).unwrap();
        let h = l.register(std::process::id(), g).unwrap();
        // A member with nothing allocated still holds the group: a looser quota is refused,
        // a tighter one applies to every member at once.
        assert_eq!(l.group(id, 4000).unwrap(), g);
        assert_eq!(l.group_quota(g), 1000);
        assert_eq!(l.group(id, 600).unwrap(), g);
        assert_eq!(l.group_quota(g), 600);
        l.try_reserve_group(g, 500).unwrap();
        assert!(l.try_reserve_group(g, 200).is_err(), "600 bytes, not 1000");
        // Bytes held without a member slot (a process between its reservation and its slot's
        // reclaim) keep the group too.
        l.unregister(h);
        assert_eq!(l.group(id, 4000).unwrap(), g);
        assert_eq!(l.group_quota(g), 600);
        // A reader's lookup changes nothing.
        assert_eq!(l.find_group(id), Some(g));
        assert_eq!(l.find_group(group_id_for("nobody")), None);
        assert_eq!(l.group_quota(g), 600);
        // Empty (nothing held, nobody registered): the next process's quota, higher or lower.
        l.release_group(g, 500);
        assert_eq!(l.group(id, 4000).unwrap(), g);
        assert_eq!(l.group_quota(g), 4000);
        assert_eq!(l.group(id, 300).unwrap(), g);
        assert_eq!(l.group_quota(g), 300);
    }

    #[test]
    fn corrupt_headers_are_named_errors() {
        let (_d, l) = fresh();
        let p = l.path().to_owned();
        drop(l);
        poke(&p, 0, b"NOTLEDGR");
        let e = Ledger::open_existing(&p).unwrap_err();
        assert!(e.to_string().contains(&*p.to_string_lossy()), "{e}");
        assert_eq!(corrupt_field(e), "magic");

        poke(&p, 0, &MAGIC.to_le_bytes());
        poke(&p, 8, &99u32.to_le_bytes());
        assert_eq!(
            corrupt_field(Ledger::open_existing(&p).unwrap_err()),
            "layout_version"
        );
        poke(&p, 8, &LAYOUT_VERSION.to_le_bytes());
        assert!(Ledger::open_existing(&p).is_ok());
        assert_eq!(
            corrupt_field(Ledger::open_or_create(&p, 1).unwrap_err()),
            "gpu_index"
        );

        OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(100)
            .unwrap();
        assert_eq!(
            corrupt_field(Ledger::open_existing(&p).unwrap_err()),
            "total_size"
        );
        OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(3)
            .unwrap();
        assert_eq!(
            corrupt_field(Ledger::open_or_create(&p, 0).unwrap_err()),
            "total_size"
        );
    }

    #[test]
    fn foreign_file_of_right_size_is_rejected() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("ledger");
        std::fs::write(&p, vec![0xAB; LAYOUT_SIZE]).unwrap();
        assert_eq!(
            corrupt_field(Ledger::open_existing(&p).unwrap_err()),
            "magic"
        );
    }

    #[test]
    fn reserve_refuses_past_quota_and_changes_nothing() {
        let (_d, l) = fresh();
        let g = l.group(7, 1000).unwrap();
        l.try_reserve_group(g, 600).unwrap();
        let e = l.try_reserve_group(g, 401).unwrap_err();
        assert_eq!(
            e,
            ReserveError {
                requested: 401,
                used: 600,
                quota: 1000
            }
        );
        assert_eq!(l.group_used(g), 600);
        l.try_reserve_group(g, 400).unwrap();
        assert!(
            l.try_reserve_group(g, u64::MAX).is_err(),
            "overflow refused"
        );
        l.release_group(g, 1000);
        l.release_group(g, 5);
        assert_eq!(l.group_used(g), 0, "never underflows");
    }

    /// Layout v5's monitor block had two words read as a quota cap for every group and an
    /// evict-all epoch, written by nothing but writable by any tenant, and its monitor and
    /// manager blocks held what the daemons publish. Every byte of them written now (as a
    /// tenant writes the file) changes no group's quota, no reservation and no header.
    #[test]
    fn a_tenants_write_of_the_retired_blocks_shrinks_no_quota() {
        use std::os::unix::fs::FileExt as _;
        let (d, l) = fresh();
        let g = l.group(7, 1000).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(d.path().join("gpu0/ledger")).unwrap();
        let r = crate::layout::retired_range();
        for off in r.clone().step_by(8) {
            f.write_all_at(&1u64.to_le_bytes(), off).unwrap();
        }
        assert_eq!(l.group_quota(g), 1000);
        assert!(l.try_reserve_group(g, 1000).is_ok());
        assert!(l.check_header().is_ok());
    }

    /// Any ledger client can take the group lock; one that keeps it gets later registrations
    /// refused with an error naming the file after [`GROUP_LOCK_WAIT`], not hung.
    #[test]
    fn a_group_lock_held_for_good_is_refused_not_waited_for() {
        let (_d, l) = fresh();
        let holder = File::open(l.path()).unwrap();
        // SAFETY: flock(2) on an fd owned by `holder`.
        assert_eq!(unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
        let e = l.group(9, 100).unwrap_err().to_string();
        assert!(e.contains("group lock stayed held") && e.contains(&*l.path().to_string_lossy()), "{e}");
        drop(holder);
        assert!(l.group(9, 100).is_ok());
    }

    #[test]
    fn processes_of_one_group_share_its_quota() {
        let (_d, l) = fresh();
        let g = l.group(group_id_for("ctr"), 100).unwrap();
        let me = std::process::id();
        let a = l.register(me, g).unwrap();
        let b = l.register(me, g).unwrap();
        assert_ne!(a.slot, b.slot);
        l.try_reserve(a, 60).unwrap();
        assert!(l.try_reserve(b, 50).is_err());
        l.try_reserve(b, 40).unwrap();
        let snaps = l.procs();
        assert_eq!(snaps.iter().map(|s| s.mem_bytes).sum::<u64>(), 100);
        l.unregister(a);
        assert_eq!(l.group_used(g), 40);
        l.release(b, 40);
        l.unregister(b);
        assert_eq!(l.group_used(g), 0);
        assert!(l.procs().is_empty());
    }

    #[test]
    fn dead_process_usage_is_reclaimed() {
        let (_d, l) = fresh();
        let g = l.group(1, 1 << 20).unwrap();
        let mut child = {
            let _spawn = crate::SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
            std::process::Command::new("sleep").arg("30").spawn().unwrap()
        };
        let h = l.register(child.id(), g).unwrap();
        l.try_reserve(h, 4096).unwrap();
        assert!(l.reclaim_dead().unwrap().is_empty(), "live process kept");
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(l.reclaim_dead().unwrap(), vec![(child.id(), 4096)]);
        assert_eq!(l.group_used(g), 0);
        assert!(l.procs().is_empty());
    }

    /// A GPU's ledger outlives many containers: after 64 groups since it was made, a new one
    /// takes over an unused group's slot, never one that a process, a byte or a start claim
    /// still holds. Bytes no process holds are set back by the reclaim a full table runs
    /// ([`Ledger::reconcile_idle_groups`]): that group is then taken over too.
    #[test]
    fn a_full_group_table_takes_over_an_unused_group_never_a_held_one() {
        let d = tempfile::tempdir().unwrap();
        let l = Ledger::open_or_create(&d.path().join("gpu0/ledger"), 0).unwrap();
        let me = std::process::id();
        // Held: a registered process (group 1), bytes without a process (group 2), a fresh
        // start claim (group 3).
        let held = l.register(me, l.group(1, 1 << 30).unwrap()).unwrap();
        let g2 = l.group(2, 1 << 30).unwrap();
        l.try_reserve_group(g2, 4096).unwrap();
        let g3 = l.group(3, 1 << 30).unwrap();
        let now = crate::clock::now_ns();
        {
            let lock = l.lock_claims(std::time::Duration::from_secs(1)).unwrap().unwrap();
            assert!(lock.record(3, 20, me, 0, now, crate::claims::DEFAULT_CLAIM_TTL_MS * 1_000_000));
        }
        // 200 containers in turn, each allocating and leaving.
        for c in 100..300u64 {
            let g = l.group(c, 1 << 20).unwrap_or_else(|e| panic!("container {c}: {e}"));
            let h = l.register(me, g).unwrap();
            l.try_reserve(h, 1 << 10).unwrap();
            l.release(h, 1 << 10);
            l.unregister(h);
        }
        assert_eq!(l.group_id(held.group), 1, "a registered process's group kept");
        assert_eq!((l.group_id(g2), l.group_used(g2)), (2, 4096), "a group holding bytes kept");
        assert_eq!(l.group_id(g3), 3, "a group with a fresh start claim kept");
        // With every group held, the table is full, and says so.
        let hs: Vec<_> = (1000..1000 + MAX_GROUPS as u64)
            .filter_map(|c| {
                let g = l.group(c, 1 << 20).ok()?;
                l.register(me, g).ok()
            })
            .collect();
        assert_eq!(hs.len(), MAX_GROUPS - 2, "all but the registered process's and the start claim's");
        assert_ne!(l.group_id(g2), 2, "the bytes nobody held were set back, and the group taken over");
        let e = l.group(5000, 1 << 20).unwrap_err();
        assert!(matches!(e, LedgerError::Full { .. }), "{e}");
    }

    #[test]
    fn proxy_registration_with_a_reused_pid_is_not_trusted() {
        let (_d, l) = fresh();
        let g = l.group(1, 1000).unwrap();
        let mut child = { let _spawn = crate::SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner()); std::process::Command::new("sleep").arg("30").spawn().unwrap() };
        let h = l.register(child.id(), g).unwrap();
        l.try_reserve(h, 10).unwrap();
        assert!(l.reclaim_dead().unwrap().is_empty(), "live proxy kept");
        // Same pid, different start time: the slot's owner is a previous process that died.
        let p = &l.layout().procs[h.slot];
        p.start_time.store(p.start_time.load(Relaxed) + 1, Relaxed);
        assert_eq!(l.reclaim_dead().unwrap(), vec![(child.id(), 10)]);
        assert_eq!(l.group_used(g), 0);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// An application that closes the fd of the shim's reclaim pass and opens another file
    /// under its number: a pass no longer takes slot locks there (granted on any other file,
    /// every live process was "dead" and its usage given back: the quota wide open); it opens
    /// a description of its own and leaves the application's file open. (A reuse between that
    /// check and a lock fails the pass loudly: `take_slot_lock`.)
    #[test]
    fn a_reclaim_pass_whose_fd_the_application_reused_reclaims_nobody() {
        let (d, monitor) = fresh();
        let g = monitor.group(1, 1000).unwrap();
        let holder = Ledger::open_existing(monitor.path()).unwrap();
        let h = holder.register(std::process::id(), g).unwrap();
        holder.try_reserve(h, 300).unwrap();
        let shim = Ledger::open_existing(monitor.path()).unwrap();
        let other = shim.register(std::process::id(), g).unwrap();
        assert!(shim.reclaim_dead().unwrap().is_empty(), "both alive");
        let fd = shim.reclaim_pass_fd().expect("opened by the pass");
        let theirs = File::create(d.path().join("the application's")).unwrap();
        // SAFETY: dup2 onto a descriptor of this test's own ledger handle, as an application
        // closing and reusing it would; the handle's File is forgotten by the code under test.
        assert_eq!(unsafe { libc::dup2(theirs.as_raw_fd(), fd) }, fd);
        assert!(shim.reclaim_dead().unwrap().is_empty(), "a pass takes no lock on the application's file: both alive");
        assert_eq!(monitor.group_used(g), 300, "the live holder's usage kept");
        let m = std::os::unix::fs::MetadataExt::ino(&theirs.metadata().unwrap());
        let dev = std::os::unix::fs::MetadataExt::dev(&theirs.metadata().unwrap());
        assert!(fd_names(fd, (dev, m)), "the application's fd left open, still naming its file");
        assert_ne!(shim.reclaim_pass_fd(), Some(fd), "the pass opened a description of its own");
        assert_eq!(monitor.group_used(g), 300);
        shim.unregister(other);
    }

    /// Observation 6: liveness is the slot lock, whatever the pid fields say. A holder whose
    /// pid, start time and pid-namespace inode now all name a live process (another container
    /// got the same namespace inode and pid) is reclaimed once its lock is gone; a live holder
    /// whose pid fields say "dead" is kept.
    #[test]
    fn liveness_is_the_slot_lock_not_the_pid() {
        let (_d, monitor) = fresh();
        let g = monitor.group(1, 1000).unwrap();
        let holder = Ledger::open_existing(monitor.path()).unwrap();
        let h = holder.register(std::process::id(), g).unwrap();
        holder.try_reserve(h, 300).unwrap();
        let p = &monitor.layout().procs[h.slot];
        // The pid fields of a process that is gone (as the old, pid-based reclaim judged it).
        p.start_time.store(1, Relaxed);
        p.owner.store(owner_word(owner_gen(p.owner.load(Relaxed)), u32::MAX - 7), Relaxed);
        assert!(monitor.slot_locked(h.slot).unwrap());
        assert!(monitor.reclaim_dead().unwrap().is_empty(), "a held lock is a live owner");
        assert_eq!(monitor.group_used(g), 300);
        // Now the collision: the fields name a live process of this very namespace (this test
        // process), and the holder dies (its descriptions close).
        let me = std::process::id();
        p.owner.store(owner_word(owner_gen(p.owner.load(Relaxed)), me), Relaxed);
        p.start_time.store(procinfo::start_time(me).unwrap(), Relaxed);
        p.pid_ns.store(procinfo::own_pid_ns(), Relaxed);
        drop(holder);
        assert!(!monitor.slot_locked(h.slot).unwrap());
        assert_eq!(monitor.reclaim_dead().unwrap(), vec![(me, 300)]);
        assert_eq!(monitor.group_used(g), 0);
        assert!(monitor.procs().is_empty());
    }

    /// A newcomer that finds a dead owner's slot gives its usage back exactly once, and a
    /// reclaimer never takes a slot a newcomer holds.
    #[test]
    fn newcomer_takes_over_a_dead_slot_and_gives_its_usage_back_once() {
        let (_d, l) = fresh();
        let g = l.group(1, 1000).unwrap();
        let dead = Ledger::open_existing(l.path()).unwrap();
        let h = dead.register(std::process::id(), g).unwrap();
        dead.try_reserve(h, 400).unwrap();
        drop(dead);
        let newcomer = Ledger::open_existing(l.path()).unwrap();
        let n = newcomer.register(std::process::id(), g).unwrap();
        assert_eq!(n.slot, h.slot, "the first slot whose lock is free");
        assert_eq!(l.group_used(g), 0, "the dead owner's 400 given back once");
        newcomer.try_reserve(n, 100).unwrap();
        assert!(l.reclaim_dead().unwrap().is_empty());
        assert_eq!(l.group_used(g), 100);
        newcomer.unregister(n);
        assert_eq!(l.group_used(g), 0);
        assert!(!l.slot_locked(n.slot).unwrap(), "unregister lets go of the lock");
    }

    /// The interleavings of the slot protocol, stepped by hand: a reclaimer in the middle of
    /// giving a dead slot back (holding its lock) and a newcomer registering meanwhile; then a
    /// newcomer in the middle of taking a slot over and a reclaimer scanning meanwhile.
    #[test]
    fn newcomer_and_reclaimer_exclude_each_other_slot_by_slot() {
        let (_d, monitor) = fresh();
        let g = monitor.group(1, 1000).unwrap();
        let dead = Ledger::open_existing(monitor.path()).unwrap();
        let h = dead.register(std::process::id(), g).unwrap();
        dead.try_reserve(h, 400).unwrap();
        drop(dead);
        // 1. The monitor has taken the dead slot's lock (about to give it back).
        assert!(slot_lock(monitor.file.as_raw_fd(), h.slot, libc::F_WRLCK).unwrap());
        let newcomer = Ledger::open_existing(monitor.path()).unwrap();
        let n = newcomer.register(std::process::id(), g).unwrap();
        assert_ne!(n.slot, h.slot, "a slot being reclaimed is not taken");
        assert_eq!(monitor.group_used(g), 400, "nor given back a second time by the newcomer");
        let p = &monitor.layout().procs[h.slot];
        assert_eq!(monitor.give_back(p, p.owner.load(Acquire)), 400);
        slot_lock(monitor.file.as_raw_fd(), h.slot, libc::F_UNLCK).unwrap();
        assert_eq!(monitor.group_used(g), 0);
        assert!(monitor.reclaim_dead().unwrap().is_empty(), "nothing left to give back");
        assert_eq!(monitor.group_used(g), 0);

        // 2. Another owner dies; a newcomer holds its slot's lock (taking it over): the
        //    monitor's scan leaves the slot alone, the newcomer gives the usage back once.
        let dead = Ledger::open_existing(monitor.path()).unwrap();
        let d2 = dead.register(std::process::id(), g).unwrap();
        dead.try_reserve(d2, 300).unwrap();
        newcomer.try_reserve(n, 50).unwrap();
        drop(dead);
        let taker = newcomer.new_description().unwrap();
        assert!(newcomer.take_slot_lock(&taker, d2.slot, &newcomer.layout().procs[d2.slot]).unwrap());
        assert!(monitor.reclaim_dead().unwrap().is_empty(), "a slot being taken over is skipped");
        assert_eq!(monitor.group_used(g), 350);
        let p = &newcomer.layout().procs[d2.slot];
        assert_eq!(newcomer.give_back(p, p.owner.load(Acquire)), 300);
        drop(taker);
        assert!(monitor.reclaim_dead().unwrap().is_empty());
        assert_eq!(monitor.group_used(g), 50, "only the live newcomer's 50 left");
        newcomer.unregister(n);
        assert_eq!(monitor.group_used(g), 0);
    }

    #[test]
    fn a_slot_lock_fd_closed_by_the_application_is_reported_as_this_processs_trouble() {
        let (_d, l) = fresh();
        let g = l.group(group_id_for("c"), 1000).unwrap();
        let p = Ledger::open_existing(l.path()).unwrap();
        let h = p.register(std::process::id(), g).unwrap();
        p.check_registration(h, std::process::id(), group_id_for("c")).unwrap();
        let fd = p.slot_lock_fd(h).unwrap();
        assert!(l.slot_locked(h.slot).unwrap());
        // The application closes the fd and opens another file at that number (dup2 does both
        // at once, so no other thread of the test runner can take the number in between).
        let other = tempfile::tempfile().unwrap();
        // SAFETY: dup2(2) onto an fd number this test owns (the lock fd it is playing with).
        assert_eq!(unsafe { libc::dup2(other.as_raw_fd(), fd) }, fd);
        assert!(!l.slot_locked(h.slot).unwrap(), "closing the fd dropped the lock");
        assert!(!p.holds_slot_lock(h));
        let e = p.check_registration(h, std::process::id(), group_id_for("c")).unwrap_err();
        assert!(matches!(e, LedgerError::Corrupt { field: "slot_lock", .. }), "{e}");
        p.unregister(h);
        drop(p);
        // SAFETY: F_GETFD only reads the fd's flags.
        assert!(unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0, "the application's fd was left open");
        // SAFETY: this test's own duplicate, closed once.
        unsafe { libc::close(fd) };
    }

    #[test]
    fn a_restored_copy_frees_slots_only_through_the_deleted_file() {
        let (_d, l) = fresh();
        let g = l.group(1, 1000).unwrap();
        let holder = Ledger::open_existing(l.path()).unwrap();
        let h = holder.register(std::process::id(), g).unwrap();
        holder.try_reserve(h, 250).unwrap();
        std::fs::remove_file(l.path()).unwrap();
        assert!(l.restore_deleted().unwrap());
        let copy = Ledger::open_existing(l.path()).unwrap();
        assert_eq!(copy.group_used(g), 250);
        // Only a handle told of the restore reads the slot's word as the deleted file.
        let range = (proc_slot_offset(h.slot), PROC_SLOT_LEN);
        let slot = |l: &Ledger| l.procs().into_iter().find(|p| p.slot == h.slot).map(|p| (p.ledger_file, p.owner_lock));
        assert_eq!(slot(&copy), Some((copy.file_id(), range)), "a word no restore of this handle's owner wrote");
        let mut restorer = Ledger::open_existing(l.path()).unwrap();
        restorer.set_restored_from(vec![l.inode().unwrap()]);
        assert_eq!(slot(&restorer), Some((LedgerFile { deleted: true, ..l.file_id() }, range)), "its own range there");
        // Nobody on the copy may take or reclaim the slot: its lock is in the deleted file.
        assert!(copy.reclaim_dead().unwrap().is_empty());
        let newcomer = Ledger::open_existing(l.path()).unwrap();
        let n = newcomer.register(std::process::id(), g).unwrap();
        assert_ne!(n.slot, h.slot);
        assert!(copy.reclaim_through(&l).unwrap().is_empty(), "owner alive in the deleted file");
        assert!(copy.depends_on(l.inode().unwrap()));
        drop(holder);
        assert_eq!(copy.reclaim_through(&l).unwrap(), vec![(std::process::id(), 250)]);
        assert_eq!(copy.group_used(g), 0);
        assert!(!copy.depends_on(l.inode().unwrap()));
        newcomer.unregister(n);
    }

    #[test]
    fn a_ledger_of_another_layout_version_is_refused_naming_both() {
        let (_d, l) = fresh();
        let p = l.path().to_owned();
        drop(l);
        // As a v2 build left it: its header, and v2's size (64-byte slots, 8 more monitor words).
        poke(&p, 8, &(LAYOUT_VERSION - 1).to_le_bytes());
        let v2_size = LAYOUT_SIZE - MAX_PROCS * 8 + 64;
        OpenOptions::new().write(true).open(&p).unwrap().set_len(v2_size as u64).unwrap();
        let e = Ledger::open_existing(&p).unwrap_err().to_string();
        assert!(
            e.contains("layout_version") && e.contains(&format!("found {}", LAYOUT_VERSION - 1)) && e.contains(&p.to_string_lossy().to_string()),
            "{e}"
        );
    }

    /// Layout v7 only gave a group's usage word its claim mark: a v6 file has this build's
    /// size and must still be refused for its version (a v6 shim would take a marked usage
    /// for one past every quota, and never clear the mark).
    #[test]
    fn a_ledger_of_the_previous_version_and_the_same_size_is_refused() {
        let (_d, l) = fresh();
        let p = l.path().to_owned();
        drop(l);
        poke(&p, 8, &6u32.to_le_bytes());
        assert_eq!(std::fs::metadata(&p).unwrap().len(), LAYOUT_SIZE as u64);
        let e = Ledger::open_existing(&p).unwrap_err().to_string();
        assert!(e.contains("layout_version") && e.contains("found 6, this build reads 7"), "{e}");
    }

    #[test]
    fn counters_and_the_identity_a_registration_is_addressed_by() {
        let (_d, l) = fresh();
        let g = l.group(3, 100).unwrap();
        let me = std::process::id();
        let h = l.register(me, g).unwrap();
        let p = l.procs()[0].clone();
        assert_eq!(crate::status::ProcId::own(), Some(crate::status::ProcId::of(&p)), "a process names itself as its registration does");
        l.count_launches(h, 10, 3);
        let before = l.procs()[0].heartbeat_ns;
        std::thread::sleep(std::time::Duration::from_millis(2));
        l.heartbeat(h);
        l.set_syncs(h, 7, 6);
        let p = &l.procs()[0];
        assert_eq!((p.launches, p.launches_delayed), (10, 3));
        assert_eq!(p.syncs, (7, 6), "one thread waits for the GPU");
        assert!(p.heartbeat_ns > before);
        // The next owner of the slot starts with no syncs of its predecessor's.
        l.unregister(h);
        l.register(me, g).unwrap();
        assert_eq!(l.procs()[0].syncs, (0, 0));
    }

    #[derive(Debug, Clone)]
    enum RegOp {
        Register(usize),
        Reserve(usize, u64),
        Release(usize, u64),
        Die(usize),
        Unregister(usize),
    }

    fn reg_op() -> impl Strategy<Value = RegOp> {
        prop_oneof![
            (0usize..3).prop_map(RegOp::Register),
            (0usize..8, 1u64..400).prop_map(|(i, b)| RegOp::Reserve(i, b)),
            (0usize..8, 1u64..400).prop_map(|(i, b)| RegOp::Release(i, b)),
            (0usize..8).prop_map(RegOp::Die),
            (0usize..8).prop_map(RegOp::Unregister),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any file content either opens (then every operation stays in bounds) or is refused
        /// with an error naming the file; never a panic.
        #[test]
        fn arbitrary_files_never_panic(
            len in prop_oneof![Just(LAYOUT_SIZE), 0usize..LAYOUT_SIZE + 64],
            fill in any::<u8>(),
            pokes in proptest::collection::vec((0usize..LAYOUT_SIZE, any::<u64>()), 0..16),
            keep_header in any::<bool>(),
        ) {
            let (d, l) = fresh();
            let p = d.path().join("x");
            let mut bytes = vec![fill; len];
            if keep_header && len >= HEADER_SIZE {
                let good = std::fs::read(l.path()).unwrap();
                bytes[..HEADER_SIZE].copy_from_slice(&good[..HEADER_SIZE]);
            }
            for (off, v) in pokes {
                if off + 8 <= bytes.len() && (off >= HEADER_SIZE || !keep_header) {
                    bytes[off..off + 8].copy_from_slice(&v.to_le_bytes());
                }
            }
            std::fs::write(&p, &bytes).unwrap();
            match Ledger::open_existing(&p) {
                Ok(o) => {
                    let _ = o.procs();
                    let _ = o.reclaim_dead();
                    for g in 0..MAX_GROUPS { let _ = o.try_reserve_group(g, 1); o.release_group(g, 1); }
                    let now = now_ns();
                    for c in o.claims(now) {
                        prop_assert!(c.claim_ns <= now && c.mps_pct.is_none_or(|p| (1..=100).contains(&p)));
                    }
                    if let Some(k) = o.lock_claims(std::time::Duration::ZERO).unwrap() {
                        let _ = crate::jobs::start_share(0.4, &k.start_jobs(now, 1 << 40), 7);
                        let _ = k.record(7, 10, 1, 0, now, 1 << 40);
                    }
                }
                Err(e) => prop_assert!(e.to_string().contains(&*p.to_string_lossy())),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// Any sequence of registrations, reservations, releases, deaths (the process's
        /// descriptions close: its `Ledger` is dropped without unregistering), reclaims by the
        /// monitor and unregistrations keeps each group's counter equal to the sum of its live
        /// processes' usage (once reclaimed), within quota, and back at zero at the end.
        #[test]
        fn registry_books_always_balance(ops in proptest::collection::vec(reg_op(), 1..80)) {
            // No child may be forked meanwhile: it would hold our slot locks until its exec.
            let _spawn = crate::SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
            let (_d, l) = fresh();
            let groups: Vec<usize> = (0..3).map(|i| l.group(100 + i as u64, 1000).unwrap()).collect();
            let mut live: Vec<(Ledger, ProcHandle, u64)> = Vec::new();
            let mut dead_unreclaimed: Vec<(usize, u64)> = Vec::new();
            let me = std::process::id();
            for op in ops {
                match op {
                    RegOp::Register(g) => {
                        let p = Ledger::open_existing(l.path()).unwrap();
                        let h = p.register(me, groups[g]).unwrap();
                        // A newcomer gives back every dead slot first.
                        dead_unreclaimed.clear();
                        live.push((p, h, 0));
                    }
                    RegOp::Reserve(i, b) => if let Some((p, h, held)) = { let n = live.len().max(1); live.get_mut(i % n) } {
                        if p.try_reserve(*h, b).is_ok() { *held += b; }
                    },
                    RegOp::Release(i, b) => if let Some((p, h, held)) = { let n = live.len().max(1); live.get_mut(i % n) } {
                        let b = b.min(*held);
                        p.release(*h, b);
                        *held -= b;
                    },
                    RegOp::Die(i) => if !live.is_empty() {
                        let (p, h, held) = live.remove(i % live.len());
                        drop(p);
                        dead_unreclaimed.push((h.slot, held));
                        if i % 2 == 0 {
                            l.reclaim_dead().unwrap();
                            dead_unreclaimed.clear();
                        }
                    },
                    RegOp::Unregister(i) => if !live.is_empty() {
                        let (p, h, _) = live.remove(i % live.len());
                        p.unregister(h);
                    },
                }
                for &g in &groups {
                    let want: u64 = live.iter().filter(|(_, h, _)| h.group == g).map(|(_, _, b)| b).sum();
                    let dead: u64 = dead_unreclaimed.iter().filter(|&&(s, _)| l.layout().procs[s].group_slot.load(Relaxed) as usize == g).map(|&(_, b)| b).sum();
                    prop_assert_eq!(l.group_used(g), want + dead);
                    prop_assert!(want + dead <= 1000);
                }
            }
            for (p, h, _) in live { p.unregister(h); }
            l.reclaim_dead().unwrap();
            for &g in &groups { prop_assert_eq!(l.group_used(g), 0); }
            prop_assert!(l.procs().is_empty());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(12))]
        /// The slot protocol under real concurrency: processes (each its own `Ledger`, so its
        /// own descriptions) register, reserve, release, and die or unregister, while a monitor
        /// and a shim-like neighbour reclaim without pause. A sentinel holds `S` bytes
        /// throughout: a double give-back would take the group below `S` (caught while running
        /// and at the end), a lost give-back would leave it above. Never past the quota.
        #[test]
        fn newcomers_and_reclaimers_racing_never_double_free_or_lose_usage(
            plans in proptest::collection::vec(proptest::collection::vec((1u64..500, any::<bool>()), 1..12), 2..6),
        ) {
            const S: u64 = 1000;
            const QUOTA: u64 = 1 << 40;
            // No child may be forked meanwhile: it would hold our slot locks until its exec.
            let _spawn = crate::SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
            let (_d, l) = fresh();
            let l = Arc::new(l);
            let g = l.group(9, QUOTA).unwrap();
            let sentinel = Ledger::open_existing(l.path()).unwrap();
            let hs = sentinel.register(std::process::id(), g).unwrap();
            sentinel.try_reserve(hs, S).unwrap();
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let reclaimers: Vec<_> = (0..2).map(|_| {
                let (l, stop) = (l.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut min = u64::MAX;
                    let other = Ledger::open_existing(l.path()).unwrap();
                    while !stop.load(Relaxed) {
                        other.reclaim_dead().unwrap();
                        l.reclaim_dead().unwrap();
                        min = min.min(l.group_used(g));
                    }
                    min
                })
            }).collect();
            let workers: Vec<_> = plans.into_iter().map(|plan| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for (bytes, die) in plan {
                        let p = Ledger::open_existing(l.path()).unwrap();
                        let h = p.register(std::process::id(), g).unwrap();
                        p.try_reserve(h, bytes).unwrap();
                        p.try_reserve(h, bytes).unwrap();
                        p.release(h, bytes);
                        if die { drop(p) } else { p.unregister(h) }
                    }
                })
            }).collect();
            for w in workers { w.join().unwrap(); }
            stop.store(true, Relaxed);
            for r in reclaimers { prop_assert!(r.join().unwrap() >= S, "usage went below the sentinel's"); }
            l.reclaim_dead().unwrap();
            prop_assert_eq!(l.group_used(g), S);
            prop_assert_eq!(l.procs().len(), 1);
            sentinel.unregister(hs);
            prop_assert_eq!(l.group_used(g), 0);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Random reserve/release interleavings across threads never pass the quota and end at zero.
        #[test]
        fn concurrent_reserve_release_respects_quota(
            quota in 1u64..10_000,
            plans in proptest::collection::vec(proptest::collection::vec(1u64..3_000, 1..60), 2..6),
        ) {
            let (_d, l) = fresh();
            let l = Arc::new(l);
            let g = l.group(9, quota).unwrap();
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let watcher = {
                let (l, stop) = (l.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut max = 0;
                    while !stop.load(Relaxed) { max = max.max(l.group_used(g)); }
                    max
                })
            };
            let workers: Vec<_> = plans.into_iter().map(|plan| {
                let l = l.clone();
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for (i, b) in plan.into_iter().enumerate() {
                        if l.try_reserve_group(g, b).is_ok() { held.push(b); }
                        if i % 3 == 2 { if let Some(x) = held.pop() { l.release_group(g, x); } }
                        assert!(l.group_used(g) <= quota);
                    }
                    for x in held { l.release_group(g, x); }
                })
            }).collect();
            for w in workers { w.join().unwrap(); }
            stop.store(true, Relaxed);
            let max = watcher.join().unwrap();
            prop_assert!(max <= quota);
            prop_assert_eq!(l.group_used(g), 0);
        }
    }
}
