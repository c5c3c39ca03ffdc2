//! The daemons' published status of one GPU: the monitor's sample and health verdict, and
//! mps-manager's offline SM budget, in a small mapped file of its own,
//! `<ledger_dir>/status/gpu<N>` ([`crate::config::status_path`]).
//!
//! It is not in the ledger because every offline process may write the ledger (it registers
//! and reserves there), and these values decide how hard every offline process is throttled
//! and whether node-agent admits work to the GPU. The status file is the daemons' alone:
//! created `0644` by root, in a directory of its own that node-agent mounts **read-only** into
//! offline containers (beside their read-write pod ledger), so a tenant, root in its
//! container or not, can read it and never write it.
//!
//! Three blocks, one writer each: the monitor block (sysmonitor), the manager block
//! (mps-manager), and the jobs table (sysmonitor: the offline jobs it counted in every ledger
//! of the GPU, which an offline process, seeing only its own pod's ledger, splits the SM
//! budget by), each under its own sequence counter. And one eviction table per daemon
//! ([`Requester`]): the offline processes it asked to leave, each named by its pid namespace,
//! pid and start time as its ledger slot names it; a process's shim looks up its own identity
//! there ([`Status::evict_request`]) and takes the signal. Each request also names the pod the
//! daemon found in the process's cgroup path ([`PodUid`]): node-agent evicts that pod, since
//! the group a ledger slot names is the process's own word. The requests were words of the
//! ledger's process slots until layout 2 of this file: any offline container could write any
//! slot's, and one write per slot made every other offline process on the GPU leave (and
//! node-agent post the Eviction of its pod). Both writers open the file with
//! [`Status::open_or_create`]; every reader (shim, node-agent, the other daemon) can use
//! [`Status::open`], which maps the file read-only. The file is initialised in place, never
//! replaced: a container's mount and every reader's mapping name its inode. A header that no
//! longer validates reads as "never published" (stale: every reader's stale behaviour, which
//! is the strict one), and a writer re-initialises it in place.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering::*};

use memmap2::{Mmap, MmapMut, MmapOptions};

use crate::clock::now_ns;
use crate::health::HealthState;
use crate::jobs::OfflineJob;
use crate::manager::ManagerSnapshot;
use crate::monitor::{JobsSnapshot, MonitorSample, MonitorSnapshot, ThrottleFloor};

/// First 8 bytes of a status file: `XSHSTAT\0` little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"XSHSTAT\0");
/// Bumped on any change to the layout below (2: the eviction tables; 3: the pod of each
/// request; 4: the jobs table, [`JobsSnapshot`]; 5: the operator's throttle floor in the
/// monitor block, [`ThrottleFloor`]).
pub const VERSION: u32 = 5;
/// `init_state` once the header is written.
const INIT_READY: u32 = 0x5747_A7E5;
/// Mode of the status file, set explicitly whatever the creator's umask: every offline
/// process, of whatever user, reads it; only its owner (root, the daemons) writes it.
pub const FILE_MODE: u32 = 0o644;
/// Mode of the status directory (`<ledger_dir>/status`), set the same way.
pub const DIR_MODE: u32 = 0o755;

/// Checked at every read.
#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    gpu_index: AtomicU32,
    total_size: AtomicU64,
    init_state: AtomicU32,
    _pad: AtomicU32,
}

/// Written by the monitor only, under `seq` (odd = write in progress).
#[repr(C)]
struct MonitorBlock {
    seq: AtomicU64,
    /// CLOCK_MONOTONIC ns of the last publish (0 = never published).
    publish_ns: AtomicU64,
    monitor_pid: AtomicU32,
    /// `HealthState` as u32.
    health: AtomicU32,
    sm_active_permille: AtomicU32,
    gpu_util_permille: AtomicU32,
    sm_clock_mhz: AtomicU32,
    sm_clock_max_mhz: AtomicU32,
    sm_count: AtomicU32,
    /// [`ThrottleFloor::required`]: 1 = a shim may not turn its throttle off.
    floor_required: AtomicU32,
    mem_used_bytes: AtomicU64,
    mem_total_bytes: AtomicU64,
    /// [`ThrottleFloor`]'s limits, each an `f64`'s bits (0 = no limit).
    floor_max_target_load: AtomicU64,
    floor_max_rate: AtomicU64,
    floor_max_fallback_rate: AtomicU64,
}

/// Written by mps-manager only, under its own `seq`.
#[repr(C)]
struct ManagerBlock {
    seq: AtomicU64,
    publish_ns: AtomicU64,
    manager_pid: AtomicU32,
    /// Per-mille, 0..=1000.
    offline_sm_budget_permille: AtomicU32,
}

/// One eviction request. Written by its table's daemon only: `pid_signal` last (Release) when
/// an entry is filled, first (to 0) when it is withdrawn; a reader takes an entry only if
/// `pid_signal` reads the same around its reads of the other words.
#[repr(C)]
struct EvictEntry {
    /// `pid << 32 | signal`; 0 = free.
    pid_signal: AtomicU64,
    /// Pid-namespace inode of the process, as its ledger slot names it.
    pid_ns: AtomicU64,
    /// Start time (clock ticks since boot, `/proc/<pid>/stat` field 22).
    start_time: AtomicU64,
    /// The pod the requesting daemon found in the process's cgroup path ([`PodUid`], high and
    /// low 64 bits; 0 and 0 = none found): node-agent evicts this pod, never the one the
    /// process's ledger slot claims (any ledger client writes its own slot's group).
    pod_hi: AtomicU64,
    pod_lo: AtomicU64,
}

/// Entries of one eviction table: one for every process a ledger can register.
pub const EVICT_ENTRIES: usize = crate::layout::MAX_PROCS;

/// Entries of each daemon's eviction table (one table for the GPU's ledger and every pod
/// ledger) that a request for a process no pid here was found for may not take: only processes
/// found holding their slot's lock get them ([`StatusWriter::request_evict_for`]). Such a
/// slot is one no visible process owns, which any ledger client can write by the hundred:
/// without the reserve, one pod's forged slots filled a table, and the real processes of every
/// other ledger got no request.
pub const EVICT_RESERVED_FOR_FOUND: usize = EVICT_ENTRIES / 4;

/// Why [`StatusWriter::request_evict_for`] wrote no request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictRefused {
    /// No signal, no pid, or every entry of the table holds a request.
    Full,
    /// Only the entries kept for processes found holding their slot's lock
    /// ([`EVICT_RESERVED_FOR_FOUND`]) are free: `free` of them.
    KeptForFound {
        /// Free entries left in the table.
        free: usize,
    },
}

impl std::fmt::Display for EvictRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EvictRefused::Full => write!(f, "the status file's eviction table is full"),
            EvictRefused::KeptForFound { free } => write!(
                f,
                "no process here holds its slot's lock, and the {free} free entries of the eviction table are kept for processes found"
            ),
        }
    }
}

/// One daemon's eviction requests.
#[repr(C)]
struct EvictTable {
    entries: [EvictEntry; EVICT_ENTRIES],
}

/// How many entries of each table hold a request, kept by each table's writer (recounted after
/// an entry is filled or withdrawn): a reader skips a table at 0 with one load
/// instead of its 160 cache lines (the monitor reads the tables at every sample, the shims at
/// every housekeeping). Beside the manager block, in its cache line.
#[repr(C)]
struct EvictCounts {
    monitor: AtomicU32,
    manager: AtomicU32,
}

/// Entries of the jobs table: one per quota group a ledger can hold.
pub const JOB_ENTRIES: usize = crate::layout::MAX_GROUPS;

/// One offline job as the monitor counted it.
#[repr(C)]
struct JobEntry {
    group_id: AtomicU64,
    procs: AtomicU32,
    /// 1..=100; 0 = a process of the job started without one (uncapped).
    mps_pct: AtomicU32,
}

/// The offline jobs registered on the GPU, in every ledger of the GPU, as the monitor last
/// counted them ([`JobsSnapshot`]). Written by the monitor only, under its own `seq`.
#[repr(C)]
struct JobsBlock {
    seq: AtomicU64,
    /// CLOCK_MONOTONIC ns of the last publish (0 = never).
    publish_ns: AtomicU64,
    /// Entries in use (the first `count`).
    count: AtomicU32,
    /// Jobs that did not fit ([`JOB_ENTRIES`]).
    dropped: AtomicU32,
    entries: [JobEntry; JOB_ENTRIES],
}

#[repr(C)]
struct Layout {
    header: Header,
    monitor: MonitorBlock,
    manager: ManagerBlock,
    evict_counts: EvictCounts,
    monitor_evictions: EvictTable,
    manager_evictions: EvictTable,
    jobs: JobsBlock,
}

/// Size of a status file, bytes.
pub const SIZE: usize = std::mem::size_of::<Layout>();
const _: () = assert!(std::mem::size_of::<Header>() == 32);
const _: () = assert!(SIZE == 32 + 88 + 24 + 8 + 2 * 40 * EVICT_ENTRIES + 24 + 16 * JOB_ENTRIES);

/// The longest grace mps-manager may give a process it asked to leave before its SIGKILL
/// (its `evict_grace_ms` is refused above this). sysmonitor escalates a request of the
/// manager's it did not make no sooner than this after first seeing it: a backstop for a
/// manager that died, never quicker than the manager.
pub const MANAGER_MAX_EVICT_GRACE_MS: u64 = 600_000;

/// The shortest grace either daemon gives a process between its SIGTERM and its SIGKILL
/// (sysmonitor's `evictor.grace_ms`, mps-manager's `evict_grace_ms`; a shorter one is refused):
/// the SIGKILL must not follow the SIGTERM at the next tick. The shim stops launching at the
/// SIGTERM and synchronises its contexts before it exits, and under MPS a client killed with
/// kernels in flight can take its neighbours' contexts down with it; mps-manager, which looks
/// every `check_every_ms` (500 by default), ends a process's MPS work with `terminate_client`
/// before the monitor's SIGKILL only if it sees the eviction in time.
pub const MIN_EVICT_GRACE_MS: u64 = 1_000;

/// Which daemon's eviction table: each writes its own only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requester {
    /// sysmonitor (overload, under-reported memory, host memory, a GPU fault, an operator's
    /// disable).
    Monitor,
    /// mps-manager (an MPS fault's offline clients, a process outside MPS).
    Manager,
}

/// A process as its ledger slot names it (`ProcSnapshot::pid_ns`, `pid`, `start_time`): what
/// an eviction request is addressed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcId {
    /// Pid-namespace inode.
    pub pid_ns: u64,
    /// Pid in that namespace.
    pub pid: u32,
    /// Start time, clock ticks since boot.
    pub start_time: u64,
}

impl ProcId {
    /// The identity of a registered process, as its ledger snapshot names it.
    pub fn of(p: &crate::ProcSnapshot) -> ProcId {
        ProcId { pid_ns: p.pid_ns, pid: p.pid, start_time: p.start_time }
    }

    /// The calling process as its own registration names it (`Ledger::register` with its own
    /// pid), from `/proc/self`: what it looks itself up by in the eviction tables, never read
    /// back from its slot, which any ledger client can write. Two reads of `/proc`: for
    /// periodic use (a fork child gets its own).
    pub fn own() -> Option<ProcId> {
        Some(ProcId {
            pid_ns: crate::procinfo::own_pid_ns(),
            pid: std::process::id(),
            start_time: crate::procinfo::own_start_time()?,
        })
    }
}

/// A Kubernetes pod UID (`8-4-4-4-12` hex digits, RFC 4122 text), as a daemon read it in a
/// process's cgroup path. Kept as its 128 bits; the nil UID (all zeros) is not one (the
/// API server never gives it) and stands for "none" in the file.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodUid(u128);

impl PodUid {
    /// `s` as a pod UID, either case; `None` unless it has the `8-4-4-4-12` hex digit shape, or
    /// for the nil UID.
    pub fn parse(s: &str) -> Option<PodUid> {
        let groups: Vec<&str> = s.split('-').collect();
        let shaped = groups.len() == 5
            && groups.iter().zip([8, 4, 4, 4, 12]).all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()));
        if !shaped {
            return None;
        }
        let v = u128::from_str_radix(&groups.concat(), 16).ok()?;
        (v != 0).then_some(PodUid(v))
    }

    fn from_words(hi: u64, lo: u64) -> Option<PodUid> {
        let v = (u128::from(hi) << 64) | u128::from(lo);
        (v != 0).then_some(PodUid(v))
    }

    fn words(self) -> (u64, u64) {
        ((self.0 >> 64) as u64, self.0 as u64)
    }
}

impl std::fmt::Display for PodUid {
    /// Lower case, as the API server writes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let h = format!("{:032x}", self.0);
        write!(f, "{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
    }
}

impl std::fmt::Debug for PodUid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PodUid({self})")
    }
}

/// One daemon's eviction request as read from the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvictRequest {
    /// Whose table it is in.
    pub by: Requester,
    /// The process asked.
    pub id: ProcId,
    /// The signal asked for (non-zero).
    pub signal: u32,
    /// The pod the requesting daemon found in the process's cgroup path; `None` when it found
    /// none (a process in no pod's cgroup, or one it could not see).
    pub pod: Option<PodUid>,
}

/// An entry's request, if it holds a consistent one: (process, signal, pod).
fn read_entry(e: &EvictEntry) -> Option<(ProcId, u32, Option<PodUid>)> {
    let ps = e.pid_signal.load(Acquire);
    if ps == 0 {
        return None;
    }
    let (pid_ns, start_time) = (e.pid_ns.load(Relaxed), e.start_time.load(Relaxed));
    let pod = PodUid::from_words(e.pod_hi.load(Relaxed), e.pod_lo.load(Relaxed));
    fence(Acquire);
    if e.pid_signal.load(Relaxed) != ps {
        return None;
    }
    Some((ProcId { pid_ns, pid: (ps >> 32) as u32, start_time }, ps as u32, pod))
}

/// Why a status file could not be opened; always names the file.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// A system call failed.
    #[error("status file {path}: {op}: {source}")]
    Io {
        /// The status file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The content is not a (finished) status file of this version or GPU.
    #[error("status file {path}: {detail}")]
    Invalid {
        /// The status file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}

fn io_err(path: &Path, op: &'static str, source: io::Error) -> StatusError {
    StatusError::Io { path: path.to_owned(), op, source }
}

enum Mapping {
    Ro(Mmap),
    Rw(MmapMut),
}

impl Mapping {
    fn addr_len(&self) -> (usize, usize) {
        match self {
            Mapping::Ro(m) => (m.as_ptr() as usize, m.len()),
            Mapping::Rw(m) => (m.as_ptr() as usize, m.len()),
        }
    }
}

/// A mapped status file, for reading. [`StatusWriter`] adds the two daemons' publishes.
pub struct Status {
    /// Declared first: unregistered before the mapping is unmapped.
    fault_guard: crate::sigbus::Guard,
    map: Mapping,
    path: PathBuf,
    /// (st_dev, st_ino) of the mapped file.
    dev_ino: (u64, u64),
}

impl std::fmt::Debug for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Status").field("path", &self.path).finish_non_exhaustive()
    }
}

fn dev_ino(file: &File, path: &Path) -> Result<(u64, u64), StatusError> {
    let m = file.metadata().map_err(|e| io_err(path, "stat", e))?;
    Ok((m.dev(), m.ino()))
}

impl Status {
    /// Maps the status file at `path` read-only (every reader: shim, node-agent, and each
    /// daemon for the other's block). Refused while the file is missing, short or not yet
    /// initialised by a daemon.
    pub fn open(path: &Path) -> Result<Status, StatusError> {
        let file = File::open(path).map_err(|e| io_err(path, "open", e))?;
        let len = file.metadata().map_err(|e| io_err(path, "stat", e))?.len();
        if len < SIZE as u64 {
            return Err(StatusError::Invalid {
                path: path.to_owned(),
                detail: format!("{len} bytes, a status file has {SIZE} (not initialised by sysmonitor or mps-manager yet, or damaged)"),
            });
        }
        // SAFETY: a shared read-only mapping of a file other processes write; it is only ever
        // read through atomics (`layout`), so their writes are not a data race, and a
        // truncation is caught by the SIGBUS guard registered below. Exactly SIZE bytes are
        // mapped: the file may have shrunk since its length was checked above.
        let map = unsafe { MmapOptions::new().len(SIZE).map(&file) }.map_err(|e| io_err(path, "mmap", e))?;
        let s = Status::new(Mapping::Ro(map), path, dev_ino(&file, path)?);
        if let Err(detail) = s.header_check(None) {
            return Err(StatusError::Invalid { path: path.to_owned(), detail });
        }
        Ok(s)
    }

    /// Opens the status file of GPU `gpu_index` at `path` for writing, creating it (and its
    /// directory, mode [`DIR_MODE`]) if absent, mode [`FILE_MODE`] whatever the umask. A
    /// missing, short or invalid header is (re)written in place (idempotently: the monitor and
    /// the manager may start together); the blocks of a valid file are kept.
    /// A file of another GPU is refused (two GPUs' daemons configured onto one path).
    pub fn open_or_create(path: &Path, gpu_index: u32) -> Result<StatusWriter, StatusError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io_err(dir, "create directory", e))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_MODE)).map_err(|e| io_err(dir, "chmod", e))?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(FILE_MODE)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| io_err(path, "open", e))?;
        // SAFETY: fchmod(2) on an fd owned by `file`.
        if unsafe { libc::fchmod(file.as_raw_fd(), FILE_MODE as libc::mode_t) } != 0 {
            return Err(io_err(path, "fchmod", io::Error::last_os_error()));
        }
        // No lock is taken: a reader (a tenant, through its read-only mount) may hold any
        // `flock` on the file, and a writer must never wait on one. Two writers initialising
        // together write the same header; at worst one zeroes the other's first publish,
        // which its next publish (within a period) restores.
        Self::init(&file, path, gpu_index)
    }

    fn init(file: &File, path: &Path, gpu_index: u32) -> Result<StatusWriter, StatusError> {
        let len = file.metadata().map_err(|e| io_err(path, "stat", e))?.len();
        if len < SIZE as u64 {
            // Grows with zeros: blocks never published. Never shrinks a mapped file.
            file.set_len(SIZE as u64).map_err(|e| io_err(path, "ftruncate", e))?;
        }
        // SAFETY: a shared mapping of a file other processes map; only ever accessed through
        // atomics (`layout`), so concurrent access is not a data race; a truncation is caught
        // by the SIGBUS guard registered below.
        let map = unsafe { MmapOptions::new().len(SIZE).map_mut(file) }.map_err(|e| io_err(path, "mmap", e))?;
        let s = Status::new(Mapping::Rw(map), path, dev_ino(file, path)?);
        let h = &s.layout().header;
        if h.magic.load(Acquire) == MAGIC && h.version.load(Acquire) == VERSION && h.init_state.load(Acquire) == INIT_READY {
            let g = h.gpu_index.load(Acquire);
            if g != gpu_index {
                return Err(StatusError::Invalid {
                    path: path.to_owned(),
                    detail: format!("it is GPU {g}'s, not GPU {gpu_index}'s (each GPU needs its own status file)"),
                });
            }
        }
        if s.header_check(Some(gpu_index)).is_err() {
            if h.magic.load(Relaxed) != 0 || len != 0 {
                tracing::warn!(file = %path.display(), "status file not valid: rewritten in place (readers see nothing published until the next publish)");
            }
            init(s.layout(), gpu_index);
        }
        Ok(StatusWriter(s))
    }

    fn new(map: Mapping, path: &Path, dev_ino: (u64, u64)) -> Status {
        let (addr, len) = map.addr_len();
        debug_assert_eq!(len, SIZE, "mapped with exactly SIZE bytes, whatever the file's length");
        Status { fault_guard: crate::sigbus::Guard::register(addr, len), map, path: path.to_owned(), dev_ino }
    }

    fn layout(&self) -> &Layout {
        let (addr, _) = self.map.addr_len();
        // SAFETY: the mapping is page-aligned (>= align_of::<Layout>() = 8), at least SIZE
        // bytes long (mapped with that length, whatever the file's), lives as long as the borrow, and `Layout` consists
        // only of atomic integers, for which every bit pattern is valid. A read-only mapping
        // is never stored to: only `StatusWriter`, whose mapping is read-write, stores.
        unsafe { &*(addr as *const Layout) }
    }

    /// The file this handle maps.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `Err(what is wrong)` unless the header is a finished one of this version (and of GPU
    /// `gpu`, when given). A truncated file reads as zeros here (SIGBUS guard).
    fn header_check(&self, gpu: Option<u32>) -> Result<(), String> {
        let h = &self.layout().header;
        let (magic, version) = (h.magic.load(Acquire), h.version.load(Acquire));
        if magic != MAGIC {
            return Err(format!("magic {magic:#x}, expected {MAGIC:#x}"));
        }
        if version != VERSION {
            return Err(format!("version {version}, this build reads {VERSION} (node runtime parts of different versions)"));
        }
        if h.init_state.load(Acquire) != INIT_READY || h.total_size.load(Acquire) != SIZE as u64 {
            return Err("header not finished".into());
        }
        match gpu {
            Some(g) if h.gpu_index.load(Acquire) != g => Err(format!("GPU {}, expected {g}", h.gpu_index.load(Acquire))),
            _ => Ok(()),
        }
    }

    /// Whether the header validates (three atomic loads).
    pub fn header_ok(&self) -> bool {
        !self.fault_guard.faulted() && self.header_check(None).is_ok()
    }

    /// Whether `path` still names the mapped file (a `stat`): `false` once it was deleted or
    /// replaced. For the periodic checks of writers, and of readers that see only stale data.
    pub fn is_at_path(&self) -> bool {
        std::fs::metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.dev_ino)
    }

    /// A consistent snapshot of the monitor block; `None` when the header does not validate
    /// or a writer kept the block busy (treat both as stale).
    pub fn read_monitor(&self) -> Option<MonitorSnapshot> {
        let m = &self.layout().monitor;
        self.read_consistent(&m.seq, |seq| MonitorSnapshot {
            sample: MonitorSample {
                health: m.health.load(Relaxed),
                sm_active_permille: m.sm_active_permille.load(Relaxed),
                gpu_util_permille: m.gpu_util_permille.load(Relaxed),
                sm_clock_mhz: m.sm_clock_mhz.load(Relaxed),
                sm_clock_max_mhz: m.sm_clock_max_mhz.load(Relaxed),
                sm_count: m.sm_count.load(Relaxed),
                mem_used_bytes: m.mem_used_bytes.load(Relaxed),
                mem_total_bytes: m.mem_total_bytes.load(Relaxed),
                throttle_floor: ThrottleFloor {
                    required: m.floor_required.load(Relaxed) != 0,
                    max_target_load: f64::from_bits(m.floor_max_target_load.load(Relaxed)),
                    max_rate: f64::from_bits(m.floor_max_rate.load(Relaxed)),
                    max_fallback_rate: f64::from_bits(m.floor_max_fallback_rate.load(Relaxed)),
                },
            },
            publish_ns: m.publish_ns.load(Relaxed),
            seq,
            monitor_pid: m.monitor_pid.load(Relaxed),
        })
    }

    /// `read(seq)` taken under the block's sequence counter `seq` until it reads a stable, even
    /// value around it (at most 64 tries); `None` when the header does not validate or a
    /// writer kept the block busy.
    fn read_consistent<T>(&self, seq: &AtomicU64, read: impl Fn(u64) -> T) -> Option<T> {
        if !self.header_ok() {
            return None;
        }
        for _ in 0..64 {
            let s1 = seq.load(Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let v = read(s1);
            fence(Acquire);
            if seq.load(Relaxed) == s1 {
                return Some(v);
            }
        }
        None
    }

    /// Health as last published (Init if never published, unreadable or not valid).
    pub fn health(&self) -> HealthState {
        self.read_monitor().and_then(|s| s.health()).unwrap_or(HealthState::Init)
    }

    /// A consistent snapshot of the manager block; `None` as for [`Status::read_monitor`].
    pub fn read_manager(&self) -> Option<ManagerSnapshot> {
        let m = &self.layout().manager;
        self.read_consistent(&m.seq, |seq| ManagerSnapshot {
            offline_sm_budget_permille: m.offline_sm_budget_permille.load(Relaxed).min(1000),
            publish_ns: m.publish_ns.load(Relaxed),
            manager_pid: m.manager_pid.load(Relaxed),
            seq,
        })
    }

    /// A consistent snapshot of the jobs table; `None` as for [`Status::read_monitor`].
    pub fn read_jobs(&self) -> Option<JobsSnapshot> {
        let b = &self.layout().jobs;
        self.read_consistent(&b.seq, |_| {
            let n = (b.count.load(Relaxed) as usize).min(JOB_ENTRIES);
            JobsSnapshot {
                jobs: b.entries[..n]
                    .iter()
                    .map(|e| {
                        let pct = e.mps_pct.load(Relaxed);
                        OfflineJob {
                            group_id: e.group_id.load(Relaxed),
                            procs: e.procs.load(Relaxed),
                            mps_pct: (1..=100).contains(&pct).then_some(pct),
                        }
                    })
                    .collect(),
                dropped: b.dropped.load(Relaxed),
                publish_ns: b.publish_ns.load(Relaxed),
            }
        })
    }

    fn table(&self, by: Requester) -> (&EvictTable, &AtomicU32) {
        let l = self.layout();
        match by {
            Requester::Monitor => (&l.monitor_evictions, &l.evict_counts.monitor),
            Requester::Manager => (&l.manager_evictions, &l.evict_counts.manager),
        }
    }

    /// `by`'s requests in force (none read while its count is 0).
    fn requests_of(&self, by: Requester) -> impl Iterator<Item = (ProcId, u32, Option<PodUid>)> + '_ {
        let (t, count) = self.table(by);
        let entries: &[EvictEntry] = if count.load(Acquire) == 0 { &[] } else { &t.entries };
        entries.iter().filter_map(read_entry)
    }

    /// The signal a daemon asked process `id` to take (the monitor's request first), 0 for
    /// none or while the header does not validate. Scans both tables: [`EVICT_ENTRIES`] atomic
    /// loads each, for the shim's periodic housekeeping.
    pub fn evict_request(&self, id: ProcId) -> u32 {
        if !self.header_ok() {
            return 0;
        }
        [Requester::Monitor, Requester::Manager]
            .into_iter()
            .find_map(|by| self.requests_of(by).find(|(p, _, _)| *p == id).map(|(_, sig, _)| sig))
            .unwrap_or(0)
    }

    /// Every request in force, by whom (node-agent posts their pods' Evictions; the daemons
    /// see what is pending). Empty while the header does not validate.
    pub fn evict_requests(&self) -> Vec<EvictRequest> {
        if !self.header_ok() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for by in [Requester::Monitor, Requester::Manager] {
            out.extend(self.requests_of(by).map(|(id, signal, pod)| EvictRequest { by, id, signal, pod }));
        }
        out
    }
}

fn init(l: &Layout, gpu_index: u32) {
    let h = &l.header;
    h.init_state.store(0, Release);
    let m = &l.monitor;
    for w in [&m.seq, &m.publish_ns, &m.mem_used_bytes, &m.mem_total_bytes, &m.floor_max_target_load, &m.floor_max_rate, &m.floor_max_fallback_rate, &l.manager.seq, &l.manager.publish_ns] {
        w.store(0, Relaxed);
    }
    for w in [&m.monitor_pid, &m.health, &m.sm_active_permille, &m.gpu_util_permille, &m.sm_clock_mhz, &m.sm_clock_max_mhz, &m.sm_count, &m.floor_required, &l.manager.manager_pid, &l.manager.offline_sm_budget_permille] {
        w.store(0, Relaxed);
    }
    for e in l.monitor_evictions.entries.iter().chain(&l.manager_evictions.entries) {
        e.pid_signal.store(0, Relaxed);
        e.pod_hi.store(0, Relaxed);
        e.pod_lo.store(0, Relaxed);
    }
    l.evict_counts.monitor.store(0, Relaxed);
    l.evict_counts.manager.store(0, Relaxed);
    for w in [&l.jobs.seq, &l.jobs.publish_ns] {
        w.store(0, Relaxed);
    }
    l.jobs.count.store(0, Relaxed);
    l.jobs.dropped.store(0, Relaxed);
    h.version.store(VERSION, Relaxed);
    h.gpu_index.store(gpu_index, Relaxed);
    h.total_size.store(SIZE as u64, Relaxed);
    h.magic.store(MAGIC, Relaxed);
    h.init_state.store(INIT_READY, Release);
}

/// A status file opened for writing by one of its two writers: the monitor publishes the
/// monitor block and its eviction table, mps-manager the manager block and its own table;
/// neither writes the other's.
pub struct StatusWriter(Status);

impl std::ops::Deref for StatusWriter {
    type Target = Status;
    fn deref(&self) -> &Status {
        &self.0
    }
}

impl std::fmt::Debug for StatusWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Bumps `seq` to odd (write in progress) and returns the value that ends the write. Wraps:
/// a file found with any counter (damaged, then kept because its header validated) never
/// panics a writer.
fn begin(seq: &AtomicU64) -> u64 {
    let s = seq.load(Relaxed);
    let start = s.wrapping_add(if s & 1 == 0 { 1 } else { 2 });
    seq.store(start, Relaxed);
    fence(Release);
    start.wrapping_add(1)
}

impl StatusWriter {
    /// Publishes a monitor sample stamped with the current time. Only the monitor calls it.
    pub fn publish(&self, s: &MonitorSample) {
        self.write_monitor(s, now_ns(), std::process::id());
    }

    /// [`StatusWriter::publish`] by a caller that passes its own pid (the monitor, which
    /// publishes at every sample: one `getpid(2)` fewer each time).
    pub fn publish_as(&self, s: &MonitorSample, pid: u32) {
        self.write_monitor(s, now_ns(), pid);
    }

    /// Publishes a sample with an explicit timestamp (tests simulate a stale monitor with it).
    pub fn publish_at(&self, s: &MonitorSample, publish_ns: u64) {
        self.write_monitor(s, publish_ns, std::process::id());
    }

    fn write_monitor(&self, s: &MonitorSample, publish_ns: u64, pid: u32) {
        let m = &self.layout().monitor;
        let end = begin(&m.seq);
        m.monitor_pid.store(pid, Relaxed);
        m.health.store(s.health, Relaxed);
        m.sm_active_permille.store(s.sm_active_permille, Relaxed);
        m.gpu_util_permille.store(s.gpu_util_permille, Relaxed);
        m.sm_clock_mhz.store(s.sm_clock_mhz, Relaxed);
        m.sm_clock_max_mhz.store(s.sm_clock_max_mhz, Relaxed);
        m.sm_count.store(s.sm_count, Relaxed);
        m.mem_used_bytes.store(s.mem_used_bytes, Relaxed);
        m.mem_total_bytes.store(s.mem_total_bytes, Relaxed);
        let f = &s.throttle_floor;
        m.floor_required.store(u32::from(f.required), Relaxed);
        m.floor_max_target_load.store(f.max_target_load.to_bits(), Relaxed);
        m.floor_max_rate.store(f.max_rate.to_bits(), Relaxed);
        m.floor_max_fallback_rate.store(f.max_fallback_rate.to_bits(), Relaxed);
        m.publish_ns.store(publish_ns, Relaxed);
        m.seq.store(end, Release);
    }

    /// Publishes the offline jobs registered on the GPU (every ledger of it), stamped with the
    /// current time. Only the monitor calls it, at every sample.
    pub fn publish_jobs(&self, jobs: &[OfflineJob]) {
        self.publish_jobs_at(jobs, now_ns());
    }

    /// As [`StatusWriter::publish_jobs`] with an explicit timestamp (tests).
    pub fn publish_jobs_at(&self, jobs: &[OfflineJob], publish_ns: u64) {
        let b = &self.layout().jobs;
        let end = begin(&b.seq);
        let n = jobs.len().min(JOB_ENTRIES);
        for (e, j) in b.entries.iter().zip(&jobs[..n]) {
            e.group_id.store(j.group_id, Relaxed);
            e.procs.store(j.procs, Relaxed);
            e.mps_pct.store(j.mps_pct.unwrap_or(0), Relaxed);
        }
        b.count.store(n as u32, Relaxed);
        b.dropped.store((jobs.len() - n) as u32, Relaxed);
        b.publish_ns.store(publish_ns, Relaxed);
        b.seq.store(end, Release);
    }

    /// Publishes the offline SM budget (per-mille, clamped to 1000) stamped with the current
    /// time. Only the MPS manager of this GPU calls it.
    pub fn publish_sm_budget(&self, permille: u32) {
        self.publish_sm_budget_at(permille, now_ns());
    }

    /// As [`StatusWriter::publish_sm_budget`] with an explicit timestamp (tests).
    pub fn publish_sm_budget_at(&self, permille: u32, publish_ns: u64) {
        let m = &self.layout().manager;
        let end = begin(&m.seq);
        m.manager_pid.store(std::process::id(), Relaxed);
        m.offline_sm_budget_permille.store(permille.min(1000), Relaxed);
        m.publish_ns.store(publish_ns, Relaxed);
        m.seq.store(end, Release);
    }

    /// Asks process `id` to take `signal` (non-zero), in `by`'s table, naming `pod`, the pod the
    /// daemon found in the process's cgroup path (node-agent evicts that pod): its entry is
    /// updated (signal only: a process stays in its pod), or a free one filled. `false` when
    /// the table is full (every entry holds a request of a process still registered: more than
    /// [`EVICT_ENTRIES`]). Only `by`'s daemon calls it.
    pub fn request_evict(&self, by: Requester, id: ProcId, pod: Option<PodUid>, signal: u32) -> bool {
        if signal == 0 || id.pid == 0 {
            return false;
        }
        let (t, count) = self.table(by);
        let ps = (u64::from(id.pid) << 32) | u64::from(signal);
        let mine = t.entries.iter().find(|e| read_entry(e).is_some_and(|(p, _, _)| p == id));
        let Some(e) = mine.or_else(|| t.entries.iter().find(|e| e.pid_signal.load(Relaxed) == 0)) else {
            return false;
        };
        if mine.is_none() {
            let (hi, lo) = pod.map_or((0, 0), PodUid::words);
            e.pid_ns.store(id.pid_ns, Relaxed);
            e.start_time.store(id.start_time, Relaxed);
            e.pod_hi.store(hi, Relaxed);
            e.pod_lo.store(lo, Relaxed);
        }
        e.pid_signal.store(ps, Release);
        // Recounted whole (requests are rare): a count left behind by a writer that died
        // between an entry and its count is mended by its successor's next request.
        let n = t.entries.iter().filter(|e| e.pid_signal.load(Relaxed) != 0).count();
        count.store(n as u32, Release);
        true
    }

    /// [`StatusWriter::request_evict`], with the reserve: `found` says whether the requesting
    /// daemon found the process holding its slot's lock. One not found (the slot's word is all
    /// there is of it) gets a new entry only while more than [`EVICT_RESERVED_FOR_FOUND`] are
    /// free; its entry, if it has one, is updated.
    pub fn request_evict_for(&self, by: Requester, id: ProcId, pod: Option<PodUid>, signal: u32, found: bool) -> Result<(), EvictRefused> {
        if !found {
            let (t, _) = self.table(by);
            let held = t.entries.iter().any(|e| read_entry(e).is_some_and(|(p, _, _)| p == id));
            let free = t.entries.iter().filter(|e| e.pid_signal.load(Relaxed) == 0).count();
            if !held && free <= EVICT_RESERVED_FOR_FOUND {
                return Err(EvictRefused::KeptForFound { free });
            }
        }
        self.request_evict(by, id, pod, signal).then_some(()).ok_or(EvictRefused::Full)
    }

    /// Withdraws `by`'s requests of the processes `keep` no longer wants asked (gone from the
    /// ledger, or a request taken back); returns how many.
    pub fn retain_evictions(&self, by: Requester, mut keep: impl FnMut(ProcId) -> bool) -> usize {
        let (t, count) = self.table(by);
        if count.load(Relaxed) == 0 {
            return 0;
        }
        let (mut n, mut left) = (0, 0);
        for e in &t.entries {
            if let Some((p, _, _)) = read_entry(e) {
                if keep(p) {
                    left += 1;
                } else {
                    e.pid_signal.store(0, Release);
                    n += 1;
                }
            }
        }
        // Recounted whole: also mends a count a damaged file left wrong.
        count.store(left, Release);
        n
    }

    /// The file as the writers need it: `Ok(None)` while the mapping is sound and `path`
    /// still names it; else the file reopened (re-created, or its header rewritten, in place)
    /// for the caller to use from now on. A `stat`: call it about once a second, not per
    /// publish.
    pub fn reopened_if_needed(&self, gpu_index: u32) -> Result<Option<StatusWriter>, StatusError> {
        if self.header_ok() && self.is_at_path() {
            return Ok(None);
        }
        Status::open_or_create(&self.path, gpu_index).map(Some)
    }
}

/// A reader's status file, opened when first there and reopened when it goes away: a shim may
/// start before its GPU's daemons made the file, and a file deleted and re-created by a daemon
/// is a new inode. Owned by the one thread that reads it (the shim's controller): reads cost
/// atomic loads; a failed open, or a stale file, is looked at again at most every
/// [`RETRY_NS`] (an `open` or a `stat`).
#[derive(Debug)]
pub struct StatusReader {
    path: PathBuf,
    status: Option<Status>,
    next_look_ns: u64,
}

/// How often a [`StatusReader`] with no file, or a stale one, looks at the path again.
pub const RETRY_NS: u64 = 1_000_000_000;

impl StatusReader {
    /// A reader of the status file at `path` (opened at the first [`StatusReader::get`]).
    pub fn new(path: PathBuf) -> Self {
        StatusReader { path, status: None, next_look_ns: 0 }
    }

    /// The status file at `now_ns` if it can be read: opened now if it never was, or reopened
    /// if `stale` (the caller found its data stale) and the path names another file than the
    /// mapped one; each at most every [`RETRY_NS`].
    pub fn get(&mut self, now_ns: u64, stale: bool) -> Option<&Status> {
        if now_ns >= self.next_look_ns && (self.status.is_none() || stale) {
            self.next_look_ns = now_ns.saturating_add(RETRY_NS);
            if !self.status.as_ref().is_some_and(Status::is_at_path) {
                if let Ok(s) = Status::open(&self.path) {
                    self.status = Some(s);
                }
            }
        }
        self.status.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = crate::config::status_path(d.path(), 0);
        (d, p)
    }

    #[test]
    fn both_blocks_round_trip_with_one_writer_each() {
        let (_d, p) = dir();
        let w = Status::open_or_create(&p, 0).unwrap();
        let r = Status::open(&p).unwrap();
        let s = r.read_monitor().unwrap();
        assert_eq!(s.publish_ns, 0, "never published");
        assert!(!s.is_fresh(now_ns(), u64::MAX));
        assert_eq!(r.health(), HealthState::Init);
        w.publish(&MonitorSample { sm_active_permille: 973, ..Default::default() }.with_health(HealthState::Overlimit));
        let s = r.read_monitor().unwrap();
        assert_eq!((s.health(), s.sample.sm_active_permille, s.monitor_pid), (Some(HealthState::Overlimit), 973, std::process::id()));
        assert!(s.is_fresh(now_ns(), 1_000_000_000));
        let mgr = Status::open_or_create(&p, 0).unwrap();
        mgr.publish_sm_budget(400);
        assert_eq!(r.read_manager().unwrap().offline_sm_budget_permille, 400);
        mgr.publish_sm_budget_at(5000, 1);
        let m = r.read_manager().unwrap();
        assert_eq!(m.offline_sm_budget_permille, 1000, "clamped");
        assert!(!m.is_fresh(10_000_000_000, 1_000_000_000));
        // The manager's publish leaves the monitor block alone, and a second writer's open
        // keeps what was published.
        assert_eq!(r.read_monitor().unwrap().sample.sm_active_permille, 973);
    }

    /// The operator's throttle floor travels with the sample, under its sequence counter; a
    /// sample published without one (a test harness's `..Default::default()`) reads as no
    /// floor, and limits that are not positive finite numbers read as no limit.
    #[test]
    fn the_throttle_floor_round_trips_with_the_sample_and_default_means_none() {
        let (_d, p) = dir();
        let w = Status::open_or_create(&p, 0).unwrap();
        let r = Status::open(&p).unwrap();
        assert!(r.read_monitor().unwrap().sample.throttle_floor.is_none(), "never published: no floor");
        let floor = ThrottleFloor { required: true, max_target_load: 0.8, max_rate: 100_000.0, max_fallback_rate: 50.0 };
        w.publish(&MonitorSample { sm_clock_mhz: 1400, throttle_floor: floor, ..Default::default() });
        let s = r.read_monitor().unwrap();
        assert_eq!((s.sample.throttle_floor, s.sample.sm_clock_mhz), (floor, 1400));
        let f = s.sample.throttle_floor;
        assert_eq!((f.target_load_limit(), f.rate_limit(), f.fallback_rate_limit()), (Some(0.8), Some(100_000.0), Some(50.0)));
        assert!(!f.is_none());
        w.publish(&MonitorSample { sm_clock_mhz: 1500, ..Default::default() });
        let s = r.read_monitor().unwrap();
        assert!(s.sample.throttle_floor.is_none(), "a sample without a floor: {s:?}");
        let odd = ThrottleFloor { required: false, max_target_load: f64::NAN, max_rate: -1.0, max_fallback_rate: f64::INFINITY };
        w.publish(&MonitorSample { throttle_floor: odd, ..Default::default() });
        assert!(r.read_monitor().unwrap().sample.throttle_floor.is_none(), "nonsense limits limit nothing");
    }

    #[test]
    fn the_jobs_table_round_trips_and_jobs_that_do_not_fit_read_as_one_uncapped_job() {
        let (_d, p) = dir();
        let w = Status::open_or_create(&p, 0).unwrap();
        let r = Status::open(&p).unwrap();
        let never = r.read_jobs().unwrap();
        assert!(never.jobs.is_empty() && !never.is_fresh(now_ns(), u64::MAX), "never published: {never:?}");
        let jobs = [
            OfflineJob { group_id: 7, procs: 2, mps_pct: Some(20) },
            OfflineJob { group_id: 9, procs: 1, mps_pct: None },
        ];
        w.publish_jobs(&jobs);
        let got = r.read_jobs().unwrap();
        assert_eq!(got.jobs, jobs.to_vec());
        assert!(got.is_fresh(now_ns(), 1_000_000_000));
        assert_eq!(got.for_start(), jobs.to_vec(), "all fitted: nothing added");
        // Fewer jobs later: the table shrinks (no job of the earlier publish lingers).
        w.publish_jobs(&jobs[..1]);
        assert_eq!(r.read_jobs().unwrap().jobs, jobs[..1].to_vec());
        // More jobs than entries: the rest stand as one uncapped job, the tightest reading.
        let many: Vec<_> = (1..=JOB_ENTRIES as u64 + 3).map(|g| OfflineJob { group_id: g, procs: 1, mps_pct: Some(1) }).collect();
        w.publish_jobs(&many);
        let got = r.read_jobs().unwrap();
        assert_eq!((got.jobs.len(), got.dropped), (JOB_ENTRIES, 3));
        let split = got.for_start();
        assert_eq!(split.last(), Some(&OfflineJob { group_id: 0, procs: 3, mps_pct: None }));
        assert_eq!(crate::jobs::start_share(0.4, &split, 1_000), 0.0, "a newcomer gets the floor");
        // The other blocks are untouched by it.
        assert_eq!(r.read_monitor().unwrap().publish_ns, 0);
    }

    #[test]
    fn an_eviction_request_reaches_only_the_process_it_names_and_each_daemon_writes_its_own_table() {
        let (d, p) = dir();
        let mon = Status::open_or_create(&p, 0).unwrap();
        let mgr = Status::open_or_create(&p, 0).unwrap();
        let r = Status::open(&p).unwrap();
        let l = crate::Ledger::open_or_create(&crate::config::ledger_path(d.path(), 0), 0).unwrap();
        let g = l.group(1, 1 << 30).unwrap();
        let h = l.register(std::process::id(), g).unwrap();
        let me = ProcId::own().unwrap();
        assert_eq!(r.evict_request(me), 0);
        let pod = PodUid::parse("0F1E2D3C-4B5A-6978-8A9B-0C1D2E3F4A5B");
        assert!(mon.request_evict(Requester::Monitor, me, pod, 15));
        assert_eq!(r.evict_request(me), 15);
        for other in [
            ProcId { start_time: me.start_time + 1, ..me },
            ProcId { pid: me.pid + 1, ..me },
            ProcId { pid_ns: me.pid_ns + 1, ..me },
        ] {
            assert_eq!(r.evict_request(other), 0, "{other:?}");
        }
        // The same process asked again (SIGKILL after the grace): one entry, the new signal.
        // The same process asked again (SIGKILL after the grace): one entry, the new signal,
        // the pod it was first found in.
        assert!(mon.request_evict(Requester::Monitor, me, None, 9));
        assert_eq!(r.evict_requests(), vec![EvictRequest { by: Requester::Monitor, id: me, signal: 9, pod }]);
        // The manager's table is its own: withdrawing the monitor's leaves it.
        let other = ProcId { pid: 4242, pid_ns: 7, start_time: 99 };
        assert!(mgr.request_evict(Requester::Manager, other, None, 15));
        assert_eq!(mon.retain_evictions(Requester::Monitor, |_| false), 1);
        assert_eq!(r.evict_request(me), 0);
        assert_eq!(r.evict_requests(), vec![EvictRequest { by: Requester::Manager, id: other, signal: 15, pod: None }]);
        assert!(!mon.request_evict(Requester::Monitor, me, None, 0), "no signal is no request");
        // A full table refuses, and a withdrawn entry is reused (its pod with it: none now).
        for pid in 1..=EVICT_ENTRIES as u32 {
            assert!(mon.request_evict(Requester::Monitor, ProcId { pid, pid_ns: 1, start_time: 1 }, pod, 15));
        }
        assert!(!mon.request_evict(Requester::Monitor, me, None, 15));
        mon.retain_evictions(Requester::Monitor, |p| p.pid != 3);
        assert!(mon.request_evict(Requester::Monitor, me, None, 15));
        assert_eq!(r.evict_request(me), 15);
        assert_eq!(r.evict_requests().iter().find(|q| q.id == me).unwrap().pod, None);
        // A count lost (a writer killed between an entry and its count): hidden until the
        // next request recounts.
        mon.layout().evict_counts.monitor.store(0, Relaxed);
        assert_eq!(r.evict_request(me), 0);
        assert!(mon.request_evict(Requester::Monitor, me, None, 15));
        assert_eq!(r.evict_request(me), 15);
        assert_eq!(mon.layout().evict_counts.monitor.load(Relaxed) as usize, EVICT_ENTRIES);
        // A process no pid was found for takes no entry of the reserve; its own is updated, and
        // one found takes the reserve.
        mon.retain_evictions(Requester::Monitor, |_| false);
        let unfound = |pid: u32| ProcId { pid, pid_ns: 2, start_time: 1 };
        let room = EVICT_ENTRIES - EVICT_RESERVED_FOR_FOUND;
        for pid in 1..=room as u32 {
            assert_eq!(mon.request_evict_for(Requester::Monitor, unfound(pid), None, 15, false), Ok(()));
        }
        let kept = Err(EvictRefused::KeptForFound { free: EVICT_RESERVED_FOR_FOUND });
        assert_eq!(mon.request_evict_for(Requester::Monitor, unfound(room as u32 + 1), None, 15, false), kept);
        assert_eq!(mon.request_evict_for(Requester::Monitor, unfound(1), None, 9, false), Ok(()), "its entry updated");
        assert_eq!(r.evict_request(unfound(1)), 9);
        for pid in 0..EVICT_RESERVED_FOR_FOUND as u32 {
            let found = ProcId { pid: 10_000 + pid, pid_ns: 3, start_time: 1 };
            assert_eq!(mon.request_evict_for(Requester::Monitor, found, None, 15, true), Ok(()));
        }
        assert_eq!(mon.request_evict_for(Requester::Monitor, me, None, 15, true), Err(EvictRefused::Full));
        assert_eq!(mon.request_evict_for(Requester::Monitor, unfound(room as u32 + 1), None, 15, false), Err(EvictRefused::KeptForFound { free: 0 }));
        assert_eq!(mon.request_evict_for(Requester::Monitor, unfound(2), None, 9, false), Ok(()), "a full table still updates its entry");
        assert!(mon.request_evict_for(Requester::Monitor, unfound(1), None, 0, false).is_err(), "no signal is no request");
        // A damaged header: no request reads (the writer rewrites it, empty).
        std::os::unix::fs::FileExt::write_all_at(&std::fs::OpenOptions::new().write(true).open(&p).unwrap(), &[0; 8], 0).unwrap();
        assert_eq!(r.evict_request(me), 0);
        assert!(r.evict_requests().is_empty());
        l.unregister(h);
    }

    #[test]
    fn pod_uids_parse_in_either_case_print_in_lower_case_and_refuse_other_shapes() {
        let u = PodUid::parse("0F1E2D3C-4b5a-6978-8A9B-0c1d2e3f4a5b").unwrap();
        assert_eq!(u.to_string(), "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b");
        assert_eq!(PodUid::parse(&u.to_string()), Some(u));
        let (hi, lo) = u.words();
        assert_eq!(PodUid::from_words(hi, lo), Some(u));
        assert_eq!(PodUid::parse("00000000-0000-0000-0000-000000000001").unwrap().to_string(), "00000000-0000-0000-0000-000000000001");
        for bad in [
            "",
            "00000000-0000-0000-0000-000000000000",
            "0f1e2d3c4b5a69788a9b0c1d2e3f4a5b",
            "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5",
            "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5bb",
            "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5g",
            "+f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b",
            "0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b",
        ] {
            assert_eq!(PodUid::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_file_is_world_readable_and_only_its_owner_writes_whatever_the_umask() {
        let (_d, p) = dir();
        // SAFETY: umask(2) only changes this process's file-creation mask.
        let old = unsafe { libc::umask(0o077) };
        let w = Status::open_or_create(&p, 0);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        drop(w.unwrap());
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777, FILE_MODE);
        assert_eq!(std::fs::metadata(p.parent().unwrap()).unwrap().permissions().mode() & 0o7777, DIR_MODE);
    }

    #[test]
    fn readers_refuse_a_missing_or_unfinished_file_and_a_writer_rewrites_a_damaged_one_in_place() {
        let (_d, p) = dir();
        assert!(matches!(Status::open(&p), Err(StatusError::Io { .. })));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"").unwrap();
        let e = Status::open(&p).unwrap_err().to_string();
        assert!(e.contains("status file") && e.contains("0 bytes"), "{e}");
        let w = Status::open_or_create(&p, 0).unwrap();
        let ino = std::fs::metadata(&p).unwrap().ino();
        w.publish(&MonitorSample::default().with_health(HealthState::Healthy));
        let r = Status::open(&p).unwrap();
        assert_eq!(r.health(), HealthState::Healthy);
        // Damaged header: every reader sees nothing published (stale), not the old values.
        std::os::unix::fs::FileExt::write_all_at(&std::fs::OpenOptions::new().write(true).open(&p).unwrap(), &[0xff; 8], 0).unwrap();
        assert!(r.read_monitor().is_none() && r.read_manager().is_none());
        assert_eq!(r.health(), HealthState::Init);
        assert!(Status::open(&p).unwrap_err().to_string().contains("magic"));
        let w2 = w.reopened_if_needed(0).unwrap().expect("header rewritten");
        assert_eq!(std::fs::metadata(&p).unwrap().ino(), ino, "in place: readers' mappings stay valid");
        assert_eq!(r.read_monitor().unwrap().publish_ns, 0);
        w2.publish(&MonitorSample::default().with_health(HealthState::Healthy));
        assert_eq!(r.health(), HealthState::Healthy, "the old reader sees the new publish");
        assert!(w2.reopened_if_needed(0).unwrap().is_none());
    }

    /// A tenant can open the file read-only through its mount and hold a `flock` on it: a
    /// writer (the monitor at its start) never waits on one.
    #[test]
    fn a_readers_flock_never_blocks_a_writer() {
        let (_d, p) = dir();
        drop(Status::open_or_create(&p, 0).unwrap());
        let held = File::open(&p).unwrap();
        // SAFETY: flock(2) on an fd owned by `held`.
        assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
        std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(3).unwrap();
        let w = Status::open_or_create(&p, 0).unwrap();
        w.publish(&MonitorSample::default().with_health(HealthState::Healthy));
        assert_eq!(Status::open(&p).unwrap().health(), HealthState::Healthy);
    }

    /// A valid header over blocks of all ones (the largest sequence counter): the writers'
    /// publishes wrap it, never panic (found by the proptest below).
    #[test]
    fn a_sequence_counter_at_its_largest_wraps() {
        let (_d, p) = dir();
        drop(Status::open_or_create(&p, 0).unwrap());
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[32..].fill(0xff);
        std::fs::write(&p, &bytes).unwrap();
        let w = Status::open_or_create(&p, 0).unwrap();
        w.publish(&MonitorSample::default().with_health(HealthState::Healthy));
        w.publish_sm_budget(300);
        assert_eq!(w.health(), HealthState::Healthy);
        assert_eq!(w.read_manager().unwrap().offline_sm_budget_permille, 300);
    }

    #[test]
    fn another_gpus_file_is_refused_by_a_writer() {
        let (_d, p) = dir();
        drop(Status::open_or_create(&p, 3).unwrap());
        let e = Status::open_or_create(&p, 0).unwrap_err().to_string();
        assert!(e.contains("GPU 3"), "{e}");
    }

    #[test]
    fn a_truncated_file_reads_as_never_published_and_kills_nobody() {
        let (_d, p) = dir();
        let w = Status::open_or_create(&p, 0).unwrap();
        w.publish(&MonitorSample::default().with_health(HealthState::Healthy));
        let r = Status::open(&p).unwrap();
        std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(0).unwrap();
        assert!(r.read_monitor().is_none(), "SIGBUS caught, zeros read");
        assert!(!w.header_ok());
        let w2 = w.reopened_if_needed(0).unwrap().expect("re-initialised");
        w2.publish(&MonitorSample::default().with_health(HealthState::Healthy));
        assert_eq!(Status::open(&p).unwrap().health(), HealthState::Healthy);
    }

    #[test]
    fn an_open_racing_a_truncation_fails_and_never_panics() {
        let (_d, p) = dir();
        drop(Status::open_or_create(&p, 0).unwrap());
        let panicked = crate::panic_opening_while_shrinking(&p, SIZE as u64, 3000, || {
            let _ = Status::open(&p);
            let _ = Status::open_or_create(&p, 0);
        });
        assert_eq!(panicked, None);
    }

    #[test]
    fn a_reader_opens_a_late_file_and_follows_a_recreated_one_when_stale() {
        let (_d, p) = dir();
        let mut r = StatusReader::new(p.clone());
        assert!(r.get(1, true).is_none());
        let w = Status::open_or_create(&p, 0).unwrap();
        assert!(r.get(2, true).is_none(), "looked at again only after RETRY_NS");
        w.publish(&MonitorSample::default().with_health(HealthState::Healthy));
        assert_eq!(r.get(2 + RETRY_NS, true).expect("opened").health(), HealthState::Healthy);
        std::fs::remove_file(&p).unwrap();
        let w2 = Status::open_or_create(&p, 0).unwrap();
        w2.publish(&MonitorSample::default().with_health(HealthState::Overlimit));
        assert_eq!(r.get(3 + 2 * RETRY_NS, false).unwrap().health(), HealthState::Healthy, "fresh data: not looked at");
        assert_eq!(r.get(4 + 3 * RETRY_NS, true).unwrap().health(), HealthState::Overlimit, "stale: the new file");
    }

    #[test]
    fn seqlock_readers_never_see_torn_samples() {
        let (_d, p) = dir();
        let w = Status::open_or_create(&p, 0).unwrap();
        let r = Status::open(&p).unwrap();
        let writer = std::thread::spawn(move || {
            for k in 1..20_000u32 {
                w.publish(&MonitorSample { health: k, sm_active_permille: k, sm_clock_mhz: k, mem_used_bytes: u64::from(k), ..Default::default() });
            }
        });
        let mut seen = 0;
        while !writer.is_finished() {
            if let Some(s) = r.read_monitor() {
                let k = s.sample.health;
                assert_eq!((s.sample.sm_active_permille, s.sample.sm_clock_mhz, s.sample.mem_used_bytes), (k, k, u64::from(k)));
                seen += 1;
            }
        }
        writer.join().unwrap();
        assert!(seen > 0);
        let last = r.read_monitor().unwrap();
        assert_eq!(last.sample.health, 19_999);
        assert!(last.is_fresh(now_ns(), 1_000_000_000));
        assert!(!last.is_fresh(now_ns() + 2_000_000_000, 1_000_000_000));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Any file content either opens (then reads are in bounds and never panic) or is
        /// refused with an error naming the file; a writer's open makes any of them valid.
        #[test]
        fn arbitrary_files_open_or_are_refused_by_name(
            len in 0usize..SIZE + 64,
            fill in proptest::prelude::any::<u8>(),
            keep_header in proptest::prelude::any::<bool>(),
        ) {
            let (_d, p) = dir();
            drop(Status::open_or_create(&p, 0).unwrap());
            let good = std::fs::read(&p).unwrap();
            let mut bytes = vec![fill; len];
            if keep_header && len >= 32 {
                bytes[..32].copy_from_slice(&good[..32]);
            }
            std::fs::write(&p, &bytes).unwrap();
            match Status::open(&p) {
                Ok(r) => {
                    let _ = (r.read_monitor(), r.read_manager(), r.health());
                }
                Err(e) => proptest::prop_assert!(e.to_string().contains(&*p.to_string_lossy())),
            }
            let w = Status::open_or_create(&p, 0).unwrap();
            w.publish(&MonitorSample::default().with_health(HealthState::Healthy));
            proptest::prop_assert_eq!(Status::open(&p).unwrap().health(), HealthState::Healthy);
        }
    }
}
