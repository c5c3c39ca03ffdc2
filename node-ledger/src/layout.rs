//! The ledger file's fixed binary layout (`#[repr(C)]`, all atomics) and its header constants.
//!
//! Every field is an atomic integer, so any bit pattern in the file is a valid value: a corrupt or
//! hostile file can produce wrong numbers but never undefined behaviour. Units are in field names.

use std::sync::atomic::{AtomicU32, AtomicU64};

/// First 8 bytes of every ledger file: `XSHLEDG\0` little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"XSHLEDG\0");
/// Bumped on any change to the structs below.
pub const LAYOUT_VERSION: u32 = 2;
/// Process registry slots per GPU.
pub const MAX_PROCS: usize = 256;
/// Quota groups (containers) per GPU.
pub const MAX_GROUPS: usize = 64;
/// `Header::init_state` value once the creator has finished initialising the file.
pub const INIT_READY: u32 = 0x5EAD_1E55;

/// Validated on open: magic, layout version, header size, total size.
#[repr(C)]
pub struct Header {
    pub magic: AtomicU64,
    pub layout_version: AtomicU32,
    pub header_size: AtomicU32,
    pub total_size: AtomicU64,
    pub gpu_index: AtomicU32,
    pub max_procs: AtomicU32,
    pub max_groups: AtomicU32,
    pub init_state: AtomicU32,
}

/// Fields only the monitor writes, guarded by a sequence counter (odd = write in progress).
#[repr(C)]
pub struct MonitorBlock {
    /// Seqlock counter; even when stable. Bumped twice per publish.
    pub seq: AtomicU64,
    /// CLOCK_MONOTONIC ns of the last publish (0 = never published).
    pub publish_ns: AtomicU64,
    /// Pid of the publishing monitor (its own pid namespace).
    pub monitor_pid: AtomicU32,
    /// `HealthState` as u32.
    pub health: AtomicU32,
    /// SM activity U_SM in per-mille (0..=1000).
    pub sm_active_permille: AtomicU32,
    /// GPU utilisation in per-mille.
    pub gpu_util_permille: AtomicU32,
    /// Current SM clock C_SM in MHz.
    pub sm_clock_mhz: AtomicU32,
    /// Highest SM clock C_H in MHz.
    pub sm_clock_max_mhz: AtomicU32,
    /// Number of SMs on the device.
    pub sm_count: AtomicU32,
    _pad: AtomicU32,
    /// Device memory in use (all processes), bytes.
    pub mem_used_bytes: AtomicU64,
    /// Device memory total, bytes.
    pub mem_total_bytes: AtomicU64,
    /// Memory quota for offline groups set by the monitor, bytes (0 = use the shim's config).
    pub mem_quota_bytes: AtomicU64,
    /// Bumped to ask every registered offline process to exit.
    pub evict_all_epoch: AtomicU64,
    pub _reserved: [AtomicU64; 8],
}

/// Fields only the MPS manager writes (dynamic SM allocation), guarded by their own seqlock.
/// Reach them through `Ledger::publish_sm_budget` / `Ledger::read_manager`.
#[repr(C)]
pub struct ManagerBlock {
    /// Seqlock counter; even when stable. Bumped twice per publish.
    pub(crate) seq: AtomicU64,
    /// CLOCK_MONOTONIC ns of the last publish (0 = never published).
    pub(crate) publish_ns: AtomicU64,
    /// Pid of the publishing manager (its own pid namespace).
    pub(crate) manager_pid: AtomicU32,
    /// SM share the offline side may use, per-mille (0..=1000).
    pub(crate) offline_sm_budget_permille: AtomicU32,
}

/// One quota group (one container); claimed by CAS on `id` from 0.
#[repr(C)]
pub struct GroupSlot {
    /// Group id (non-zero hash of the container id); 0 = free.
    pub id: AtomicU64,
    /// Quota in bytes.
    pub quota_bytes: AtomicU64,
    /// Bytes reserved by the group's processes; changed only by CAS/fetch ops.
    pub used_bytes: AtomicU64,
    /// Reservations refused for lack of quota.
    pub refusals: AtomicU64,
}

/// One registered offline process.
#[repr(C)]
pub struct ProcSlot {
    /// `generation << 32 | pid`; pid 0 = free, pid `u32::MAX` = being reclaimed.
    pub owner: AtomicU64,
    /// Start time from /proc/<pid>/stat (clock ticks since boot); 0 until registration completes.
    pub start_time: AtomicU64,
    /// Pid-namespace inode of the owner.
    pub pid_ns: AtomicU64,
    /// Index of the owner's group slot.
    pub group_slot: AtomicU32,
    /// Per-process eviction request (signal number, 0 = none); written by the monitor.
    pub evict_signal: AtomicU32,
    /// Device memory this process has reserved, bytes.
    pub mem_bytes: AtomicU64,
    /// Kernel launches issued.
    pub launches: AtomicU64,
    /// Kernel launches that had to wait for budget.
    pub launches_delayed: AtomicU64,
    /// CLOCK_MONOTONIC ns of the last heartbeat.
    pub heartbeat_ns: AtomicU64,
}

/// The whole file.
#[repr(C)]
pub struct Layout {
    pub header: Header,
    pub monitor: MonitorBlock,
    pub(crate) manager: ManagerBlock,
    pub groups: [GroupSlot; MAX_GROUPS],
    pub procs: [ProcSlot; MAX_PROCS],
}

/// Size of the file in bytes.
pub const LAYOUT_SIZE: usize = std::mem::size_of::<Layout>();
/// Size of the header in bytes.
pub const HEADER_SIZE: usize = std::mem::size_of::<Header>();

const _: () = assert!(HEADER_SIZE == 40);
const _: () = assert!(std::mem::size_of::<ProcSlot>() == 64);
const _: () = assert!(std::mem::size_of::<GroupSlot>() == 32);
const _: () = assert!(std::mem::align_of::<Layout>() == 8);
const _: () = assert!(std::mem::size_of::<ManagerBlock>() == 24);

/// Pid field of an `owner` word.
pub fn owner_pid(owner: u64) -> u32 {
    owner as u32
}

/// Generation field of an `owner` word.
pub fn owner_gen(owner: u64) -> u32 {
    (owner >> 32) as u32
}

/// Packs an `owner` word.
pub fn owner_word(gen: u32, pid: u32) -> u64 {
    (u64::from(gen) << 32) | u64::from(pid)
}

/// Pid marker of a slot being reclaimed.
pub const PID_RECLAIMING: u32 = u32::MAX;
