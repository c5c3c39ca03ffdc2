//! The ledger file's fixed binary layout (`#[repr(C)]`, all atomics) and its header constants.
//!
//! Every field is an atomic integer, so any bit pattern in the file is a valid value: a corrupt or
//! hostile file can produce wrong numbers but never undefined behaviour. Units are in field names.

use std::sync::atomic::{AtomicU32, AtomicU64};

/// First 8 bytes of every ledger file: `XSHLEDG\0` little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"XSHLEDG\0");
/// Bumped on any change to the structs below (v3: a slot's liveness is its lock, see
/// `ProcSlot`; `liveness` added, the monitor block's unused `_reserved` words dropped; v4:
/// `ProcSlot::mps_pct`, the MPS active-thread percentage each offline process started with;
/// v5: the start-claims block, [`ClaimsBlock`]; v6: `ProcSlot::syncs_begun` / `syncs_ended`,
/// whether an offline process waits on the GPU; v7: the top bit of `GroupSlot::used_bytes` is
/// the claim mark of the idle-group reconciliation, [`USED_CLAIMED`], which every other writer
/// of the word clears). A process built for another version refuses the file
/// (`layout_version` error).
pub const LAYOUT_VERSION: u32 = 7;
/// Process registry slots per GPU.
pub const MAX_PROCS: usize = 256;
/// Quota groups (containers) per GPU.
pub const MAX_GROUPS: usize = 64;
/// Start-claim entries per GPU ([`ClaimsBlock`]): one per quota group is enough.
pub const MAX_CLAIMS: usize = MAX_GROUPS;
/// `Header::init_state` value once the creator has finished initialising the file.
pub const INIT_READY: u32 = 0x5EAD_1E55;
/// `Header::init_state` value written by a process that found the ledger's body overwritten
/// (its group or registry slot gone): every later open and header check refuses the file.
pub const INIT_DAMAGED: u32 = 0xDA3A_6ED0;

/// Validated on open: magic, layout version, header size, total size.
#[repr(C)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: AtomicU64,
    /// [`LAYOUT_VERSION`] of the writer that created the file.
    pub layout_version: AtomicU32,
    /// [`HEADER_SIZE`] as the creator laid it out, bytes.
    pub header_size: AtomicU32,
    /// Size of the whole file ([`LAYOUT_SIZE`]), bytes.
    pub total_size: AtomicU64,
    /// Host GPU index the ledger belongs to.
    pub gpu_index: AtomicU32,
    /// Registry slots in the file ([`MAX_PROCS`]).
    pub max_procs: AtomicU32,
    /// Group slots in the file ([`MAX_GROUPS`]).
    pub max_groups: AtomicU32,
    /// [`INIT_READY`] once initialised, [`INIT_DAMAGED`] once found overwritten; else in creation.
    pub init_state: AtomicU32,
}

/// Where layout v5 had the monitor's published sample and health (80 bytes) and mps-manager's
/// offline SM budget (24 bytes). Every offline process may write the ledger, so a tenant could
/// forge the throttle input of every other offline process and the health node-agent admits
/// by: they are in the daemons' status file now (`crate::status`), which containers get
/// read-only. Nothing reads or writes these bytes; they stay so that every later field keeps
/// the offset v5 gave it (drop them at a layout version that moves fields anyway; v6 and v7
/// did not).
#[repr(C)]
pub struct RetiredBlocks {
    _words: [AtomicU64; 13],
}

/// One quota group (one container); claimed by CAS on `id` from 0.
#[repr(C)]
pub struct GroupSlot {
    /// Group id (non-zero hash of the container id); 0 = free.
    pub id: AtomicU64,
    /// Quota in bytes.
    pub quota_bytes: AtomicU64,
    /// Bytes reserved by the group's processes (bits 0..63, [`USED_BYTES`]), and the claim
    /// mark of an idle-group reconciliation in progress (bit 63, [`USED_CLAIMED`]); changed
    /// only by atomic read-modify-write operations, and every one but a reconciler's claim
    /// writes the mark clear (protocol: `ledger.rs`, "Idle-group reconciliation"). Read the
    /// usage through `Ledger::group_used`, never the raw word.
    pub used_bytes: AtomicU64,
    /// Reservations refused for lack of quota.
    pub refusals: AtomicU64,
}

/// One registered offline process.
///
/// Liveness is not in the slot: the owner holds an open-file-description lock
/// (`F_OFD_SETLK`, write) on the slot's byte range of the ledger file for as long as it is
/// registered, and the kernel drops that lock when the owner dies, in whatever pid namespace
/// it ran. Whoever holds the slot's lock is the only one who may change `owner` or give back
/// `mem_bytes` (protocol: `ledger.rs`, "Slot protocol").
#[repr(C)]
pub struct ProcSlot {
    /// `generation << 32 | pid`; pid 0 = free. The pid is the owner's in its own namespace
    /// (for signalling and reports only, never for liveness).
    pub owner: AtomicU64,
    /// Start time from `/proc/<pid>/stat` (clock ticks since boot); 0 until registration completes.
    /// With `pid` and `pid_ns`, names the process for eviction signals.
    pub start_time: AtomicU64,
    /// Pid-namespace inode of the owner: its pid may be signalled only from that namespace.
    pub pid_ns: AtomicU64,
    /// How the owner's liveness is known: [`LIVENESS_LOCK`] (0) = the owner holds this slot's
    /// lock in this file; [`LIVENESS_PROXY`] = registered on behalf of `pid` by another process
    /// (tools, tests): no lock is held, and the owner counts as alive while `pid` with
    /// `start_time` lives in `pid_ns` (judged only from that namespace); any other value = the
    /// inode number of a deleted ledger whose slot lock the owner still holds (set in the copy
    /// the monitor puts in its place): only that monitor, which keeps the deleted file open to
    /// test the lock there, may free the slot, and only that monitor's handle takes the value
    /// for a deleted file (`Ledger::set_restored_from`): to every other reader, as any value
    /// no restore wrote, it names this file.
    pub liveness: AtomicU64,
    /// Index of the owner's group slot.
    pub group_slot: AtomicU32,
    /// Unused since status-file layout 2 (was the per-process eviction request, which any
    /// ledger client could write into any slot; the daemons' requests are in the status file
    /// now, `crate::status`). Kept so that layout-5 files stay valid; nothing reads it.
    pub retired_evict_signal: AtomicU32,
    /// Device memory this process has reserved, bytes.
    pub mem_bytes: AtomicU64,
    /// Kernel launches issued.
    pub launches: AtomicU64,
    /// Kernel launches that had to wait for budget.
    pub launches_delayed: AtomicU64,
    /// CLOCK_MONOTONIC ns of the last heartbeat.
    pub heartbeat_ns: AtomicU64,
    /// The MPS active-thread percentage (1..=100) the owner started with, as MPS fixed it at
    /// client start (its `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, set by the shim from the SM
    /// budget or by the user); 0 = none known (not capped by MPS). Written by the owner when it
    /// registers, before its `owner` word is published, and never changed afterwards.
    pub mps_pct: AtomicU32,
    _pad: AtomicU32,
    /// Synchronizing driver calls (`cuCtxSynchronize`, `cuStreamSynchronize`,
    /// `cuEventSynchronize`) the owner has entered on this GPU, and those that have returned:
    /// while `syncs_begun > syncs_ended` a thread of the owner waits for the GPU. Written by the
    /// owner alone (its controller publishes its counts; zeroed at registration); mps-manager
    /// tells a hung client (waiting, nothing returning, the GPU idle) from an idle one by them.
    pub syncs_begun: AtomicU64,
    /// See [`ProcSlot::syncs_begun`].
    pub syncs_ended: AtomicU64,
}

/// One start claim: the MPS percentage an offline job (quota group) took at library load, before
/// any of its processes registered (`crate::claims`). Written only under the claims lock, by
/// the claiming process: `group_id` last when an entry is (re)filled, so an entry torn by a
/// writer's death reads as free, or as a claim with an unknown (read: uncapped) percentage.
#[repr(C)]
pub struct ClaimSlot {
    /// Group id (`group_id_for` its `XCUDA_GROUP`); 0 = free.
    pub(crate) group_id: AtomicU64,
    /// CLOCK_MONOTONIC ns of the latest claim of this group.
    pub(crate) claim_ns: AtomicU64,
    /// Pid-namespace inode of the latest claimer (reports; its withdrawal at registration).
    pub(crate) pid_ns: AtomicU64,
    /// Pid of the latest claimer in its own namespace (reports; its withdrawal at registration).
    pub(crate) pid: AtomicU32,
    /// The MPS active-thread percentage claimed (1..=100; anything else reads as uncapped).
    pub(crate) mps_pct: AtomicU32,
}

/// The start claims (layout v5). Reached only through `Ledger::lock_claims` (read-write, under
/// the claims lock: an `F_OFD_SETLK` write lock on this block's own byte range,
/// [`claims_offset`] / [`CLAIMS_LEN`], which lies after every registry slot's range) and
/// `Ledger::claims` (reports). Nothing but a starting process's MPS percentage reads it: the
/// monitor's and the manager's judgements use registered slots only.
#[repr(C)]
pub struct ClaimsBlock {
    pub(crate) entries: [ClaimSlot; MAX_CLAIMS],
}

/// The whole file.
#[repr(C)]
pub struct Layout {
    /// Identity and sizes, checked on open.
    pub header: Header,
    /// Layout v5's monitor and manager blocks, no longer used.
    pub retired: RetiredBlocks,
    /// Quota groups (one per container or pod).
    pub groups: [GroupSlot; MAX_GROUPS],
    /// The process registry.
    pub procs: [ProcSlot; MAX_PROCS],
    /// Start claims (`crate::claims`).
    pub(crate) claims: ClaimsBlock,
}

/// Size of the file in bytes.
pub const LAYOUT_SIZE: usize = std::mem::size_of::<Layout>();
/// Size of the header in bytes.
pub const HEADER_SIZE: usize = std::mem::size_of::<Header>();

const _: () = assert!(HEADER_SIZE == 40);
const _: () = assert!(std::mem::size_of::<ProcSlot>() == 96);
const _: () = assert!(std::mem::size_of::<GroupSlot>() == 32);
const _: () = assert!(std::mem::align_of::<Layout>() == 8);
// The retired blocks keep every later field where layout v5 put it.
const _: () = assert!(std::mem::offset_of!(Layout, groups) == HEADER_SIZE + 80 + 24);
const _: () = assert!(std::mem::size_of::<ClaimSlot>() == 32);
// The claims lock's range never meets a registry slot's lock range.
const _: () = assert!(std::mem::offset_of!(Layout, claims) >= std::mem::offset_of!(Layout, procs) + MAX_PROCS * std::mem::size_of::<ProcSlot>());

/// [`GroupSlot::used_bytes`]: the claim mark, set only by a reconciler holding the group's
/// lock ([`group_slot_offset`]) and cleared by every other write of the word.
pub const USED_CLAIMED: u64 = 1 << 63;
/// [`GroupSlot::used_bytes`]: the bytes; a reservation never takes them past this.
pub const USED_BYTES: u64 = !USED_CLAIMED;

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

/// [`ProcSlot::liveness`]: the owner holds the slot's lock in this file.
pub const LIVENESS_LOCK: u64 = 0;
/// [`ProcSlot::liveness`]: registered on behalf of another process; alive while its pid lives.
pub const LIVENESS_PROXY: u64 = u64::MAX;

/// Byte offset of registry slot `slot` in the file: its lock range starts here.
pub fn proc_slot_offset(slot: usize) -> u64 {
    (std::mem::offset_of!(Layout, procs) + slot * std::mem::size_of::<ProcSlot>()) as u64
}

/// Byte offset of group slot `group` in the file: the range of the lock a reconciler holds
/// while it may set the group's usage back ([`GROUP_SLOT_LEN`] bytes, before every registry
/// slot's range).
pub fn group_slot_offset(group: usize) -> u64 {
    (std::mem::offset_of!(Layout, groups) + group * std::mem::size_of::<GroupSlot>()) as u64
}

/// Length of a group slot's lock range.
pub const GROUP_SLOT_LEN: u64 = std::mem::size_of::<GroupSlot>() as u64;

// A reconciler's group lock never meets a registry slot's lock range (what the daemons take
// for an owner's) nor the claims lock's.
const _: () = assert!(std::mem::offset_of!(Layout, groups) + MAX_GROUPS * std::mem::size_of::<GroupSlot>() <= std::mem::offset_of!(Layout, procs));

/// Length of a registry slot's lock range.
pub const PROC_SLOT_LEN: u64 = std::mem::size_of::<ProcSlot>() as u64;

/// `(start, len)` of the whole registry: the range within which every slot's lock lies (what
/// a registered process of the ledger, whichever its slot, holds a lock in).
pub fn registry_lock_range() -> (u64, u64) {
    (proc_slot_offset(0), PROC_SLOT_LEN * MAX_PROCS as u64)
}

/// Byte offset of the start-claims block: the claims lock's range starts here.
pub fn claims_offset() -> u64 {
    std::mem::offset_of!(Layout, claims) as u64
}

/// Byte range in the file of [`RetiredBlocks`] (tests write it as a tenant could).
pub fn retired_range() -> std::ops::Range<u64> {
    let a = std::mem::offset_of!(Layout, retired) as u64;
    a..a + std::mem::size_of::<RetiredBlocks>() as u64
}

/// Length of the claims lock's range (the whole claims block).
pub const CLAIMS_LEN: u64 = std::mem::size_of::<ClaimsBlock>() as u64;
