//! The emulated GPU: one device shared by every process through a mmap'd state file.
//!
//! `GPUEMU_STATE` names the file (created on first use with the profile `GPUEMU_PROFILE` =
//! `t4` | `a10` | `h100`, default `t4`). The fake `libcuda` drives it as a client
//! ([`Device::attach`], [`Device::alloc`], [`Device::launch`], ...); the fake NVML reads
//! [`Device::snapshot`]; the fake `nvidia-cuda-mps-control` calls the `mps_*` methods.
//! The model itself (SM sharing, clock, time) is in [`physics`].

pub mod error;
pub mod layout;
pub mod physics;
pub mod procinfo;
pub mod profile;
pub mod syscalls;
mod shm;

pub use error::EmuError;
pub use layout::Sample;
pub use profile::Profile;
pub use physics::GPM_REFRESH_NS;

use layout::{compute_mode, kstate, mps_conn, State, MAX_CLIENTS, STATE_SIZE};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// An MPS active-thread percentage as the emulated device keeps it, in whole percent: rounded
/// down (12.5 % gives 12, never 13: the emulator grants no more SMs than were asked for), at
/// least 1 and at most 100. The device keeps whole percents; a fraction asked for is lost on
/// the strict side.
pub fn whole_pct(pct: f64) -> u32 {
    if pct.is_nan() {
        return 1;
    }
    (pct + 1e-9).floor().clamp(1.0, 100.0) as u32
}

/// Environment variable naming the state file.
pub const ENV_STATE: &str = "GPUEMU_STATE";
/// Environment variable choosing the profile of a new state file.
pub const ENV_PROFILE: &str = "GPUEMU_PROFILE";
/// Environment variable choosing, for a new state file, what an MPS client that dies with
/// kernels in flight does to its server: `hang` (default: the server's other clients hang until
/// `terminate_client`) or `teardown` (the server tears its other clients down with a fatal GPU
/// error, as an H200 did in 12 of 20 kills; never a hang there).
pub const ENV_MPS_KILL: &str = "GPUEMU_MPS_KILL";
/// How often (at most) a process touching the state scans for dead clients.
pub const REAP_EVERY_NS: u64 = 20_000_000;
/// Window of [`Snapshot::gpu_util`] / [`Snapshot::sm_activity`].
pub const SNAPSHOT_WINDOW_NS: u64 = 100_000_000;
const BASE_ADDR: u64 = 0x7f00_0000_0000;
/// End of a device's virtual address space (48 bits; the emulated driver keeps the GPU's
/// number above it).
pub const VA_LIMIT: u64 = 1 << 48;

/// CLOCK_MONOTONIC in nanoseconds: the time base of the state file (shared by all processes).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Static facts about the emulated card.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Profile id (`t4`, `a10`, `h100`).
    pub profile_id: String,
    /// Marketing name as the driver reports it.
    pub name: String,
    /// Device UUID (random, fixed at state-file creation).
    pub uuid: [u8; 16],
    /// Device memory, bytes.
    pub total_memory: u64,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Maximum (boost) SM clock, MHz.
    pub max_sm_clock_mhz: u32,
    /// Memory clock, MHz.
    pub mem_clock_mhz: u32,
    /// Memory bus width, bits.
    pub mem_bus_width: u32,
    /// Compute capability `(major, minor)`.
    pub compute_capability: (u32, u32),
    /// Board power limit, milliwatts.
    pub power_limit_mw: u32,
    /// PCI bus number NVML reports.
    pub pci_bus: u32,
}

/// MPS control-daemon state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpsStatus {
    /// A daemon is running (started by the fake `nvidia-cuda-mps-control -d`).
    pub enabled: bool,
    /// A client died holding a context: MPS clients hang until `terminate_client` of every
    /// such dead client, or `quit`.
    pub poisoned: bool,
    /// The pid whose death poisoned the server (the oldest dead client still connected).
    pub culprit_pid: Option<u32>,
    /// Every client that died holding a context and is still connected to its server, oldest
    /// first: `(pid, uid)`.
    pub dead_clients: Vec<(u32, u32)>,
    /// Increments on every start.
    pub generation: u64,
    /// `set_default_active_thread_percentage` value.
    pub default_active_thread_pct: u32,
    /// Pid of the control daemon that started it.
    pub control_pid: u32,
    /// A client dying with kernels in flight tears the server's other clients down (see
    /// [`ENV_MPS_KILL`]) instead of hanging them.
    pub kill_teardown: bool,
    /// Fatal GPU errors handled by tearing clients down so far.
    pub fatal_errors: u32,
}

/// One process holding the device.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessInfo {
    /// Pid of the process.
    pub pid: u32,
    /// Its start time, clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
    /// Device memory it holds, bytes.
    pub used_memory: u64,
    /// Contexts it holds.
    pub contexts: u32,
    /// Of `used_memory`, what its contexts hold (not allocations): see [`Device::context_created`].
    pub context_memory: u64,
    /// Attached to the running MPS server.
    pub mps_client: bool,
    /// The process is an MPS server ([`Device::mps_server_context`]), holding its clients'
    /// shared context.
    pub mps_server: bool,
    /// Effective uid it connected to MPS with (0 when not an MPS client).
    pub uid: u32,
    /// Active-thread percentage in force (100 when not capped).
    pub active_thread_pct: u32,
    /// Its MPS connection is queued: another user's server is active (MPS serves one user at
    /// a time); `uid` is the queued user.
    pub mps_queued: bool,
    /// The control daemon handed it to its user's server and it has not yet created its
    /// context there: a client of that server all the same.
    pub mps_handed: bool,
    /// It asked the control daemon for its user's server and waits to be handed to one.
    pub mps_asking: bool,
    /// MPS runs, but this process found no control daemon at its `CUDA_MPS_PIPE_DIRECTORY`:
    /// it runs without MPS.
    pub mps_outside: bool,
    /// The running MPS server tore it down after a fatal GPU error (its CUDA calls fail with
    /// the sticky error): until it exits the server takes no new client.
    pub mps_torn_down: bool,
    /// Cumulative SM-weighted busy time of its kernels, in ns.
    pub sm_time_ns: f64,
    /// Its kernels currently queued or running.
    pub kernels: u32,
}

/// A consistent view of the device at one instant.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Static facts about the card.
    pub info: DeviceInfo,
    /// Time the state was advanced to for this view, `CLOCK_MONOTONIC` ns.
    pub timestamp_ns: u64,
    /// Device memory, bytes.
    pub memory_total: u64,
    /// Memory allocated by all clients, bytes.
    pub memory_used: u64,
    /// `memory_total - memory_used`, bytes.
    pub memory_free: u64,
    /// Current SM clock, MHz.
    pub sm_clock_mhz: u32,
    /// Fraction of the last [`SNAPSHOT_WINDOW_NS`] with at least one kernel running (0..=1).
    pub gpu_util: f64,
    /// Mean fraction of SMs busy over the same window (0..=1).
    pub sm_activity: f64,
    /// SMs wanted by running kernels right now.
    pub sm_demand: f64,
    /// SMs granted right now.
    pub sm_in_use: f64,
    /// Cumulative busy time, ns.
    pub busy_ns_total: f64,
    /// Cumulative SM-weighted busy time, ns.
    pub sm_active_ns_total: f64,
    /// Kernels holding SMs right now.
    pub running_kernels: u32,
    /// Processes holding the device.
    pub processes: Vec<ProcessInfo>,
    /// MPS control-daemon state.
    pub mps: MpsStatus,
    /// The compute mode, one of [`layout::compute_mode`].
    pub compute_mode: u32,
}

impl Snapshot {
    /// Device memory allocated by all processes, bytes: what they hold less what their
    /// contexts hold.
    pub fn memory_allocated(&self) -> u64 {
        self.memory_used - self.processes.iter().map(|p| p.context_memory).sum::<u64>().min(self.memory_used)
    }
}

/// Device counters at one instant (see [`Device::reading`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Reading {
    /// Time the state was advanced to for this reading, `CLOCK_MONOTONIC` ns.
    pub timestamp_ns: u64,
    /// Device memory, bytes.
    pub memory_total: u64,
    /// Memory allocated by all clients, bytes.
    pub memory_used: u64,
    /// Current SM clock, MHz.
    pub sm_clock_mhz: u32,
    /// Fraction of the last [`SNAPSHOT_WINDOW_NS`] with at least one kernel running (0..=1).
    pub gpu_util: f64,
    /// Mean fraction of SMs busy over the same window (0..=1).
    pub sm_activity: f64,
    /// Cumulative busy time, ns.
    pub busy_ns_total: f64,
    /// Cumulative SM-weighted busy time, ns.
    pub sm_active_ns_total: f64,
}

/// The device's live counters at one instant (see [`Device::counters`]): a [`Reading`] less
/// the utilization window, which needs the sample ring.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counters {
    /// Time the model was advanced (or extrapolated) to, `CLOCK_MONOTONIC` ns.
    pub timestamp_ns: u64,
    /// Device memory, bytes.
    pub memory_total: u64,
    /// Memory allocated by all clients, bytes.
    pub memory_used: u64,
    /// Current SM clock, MHz.
    pub sm_clock_mhz: u32,
    /// Cumulative busy time, ns.
    pub busy_ns_total: f64,
    /// Cumulative SM-weighted busy time, ns.
    pub sm_active_ns_total: f64,
}

impl Counters {
    fn of(h: &layout::Header) -> Counters {
        Counters {
            timestamp_ns: h.last_ns,
            memory_total: h.total_memory,
            memory_used: h.used_memory,
            sm_clock_mhz: h.sm_clock_mhz.round() as u32,
            busy_ns_total: h.busy_ns,
            sm_active_ns_total: h.sm_active_ns,
        }
    }
}

/// Where a kernel is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelStatus {
    /// Queued or running.
    Pending,
    /// Finished at `end_ns` (started at `start_ns`).
    Done {
        /// Time it got SMs, `CLOCK_MONOTONIC` ns.
        start_ns: u64,
        /// Time it finished, `CLOCK_MONOTONIC` ns.
        end_ns: u64,
    },
    /// Not in the table any more (collected, or its owner died).
    Gone,
}

/// A process's registration on the device (returned by [`Device::attach`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Client {
    slot: u32,
    pid: u32,
    start_time: u64,
}

impl Client {
    /// The registered process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }
}

/// What to launch.
#[derive(Clone, Copy, Debug)]
pub struct Launch {
    /// Total thread blocks (gridDim.x * y * z).
    pub blocks: u64,
    /// Clock cycles each block runs.
    pub cycles_per_block: u64,
    /// Ticket of the previous kernel on the same stream (0 = none): stream order.
    pub after: u64,
}

/// An open emulated device.
pub struct Device {
    shm: shm::Shm,
    /// The `CUDA_MPS_PIPE_DIRECTORY` this handle's process connects through, when not its
    /// environment's ([`Device::set_mps_pipe_dir`]).
    mps_pipe: std::sync::Mutex<Option<PathBuf>>,
}

/// The MPS pipe directory a process connects through: `CUDA_MPS_PIPE_DIRECTORY`, else
/// `/tmp/nvidia-mps` (NVIDIA's default); relative paths are taken from the working directory.
pub fn mps_pipe_dir_from_env() -> PathBuf {
    let p = std::env::var_os("CUDA_MPS_PIPE_DIRECTORY")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/tmp/nvidia-mps"), PathBuf::from);
    if p.is_absolute() {
        p
    } else {
        std::env::current_dir().map(|d| d.join(&p)).unwrap_or(p)
    }
}

/// Device and inode numbers of the file at `p` (following links), or `None`.
fn file_id(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// The `/dev/shm` this process sees (its mount namespace's), as device and inode numbers: a
/// real MPS server keeps the shared memory its clients attach to there, so a client must see
/// the same directory (a container gets the server's mounted at its `/dev/shm`, as NVIDIA's
/// device plugin does, or shares the host's IPC and `/dev/shm`).
pub fn dev_shm_id() -> Option<(u64, u64)> {
    file_id(Path::new("/dev/shm"))
}

pub(crate) fn init_state(st: &mut State, p: &Profile, now: u64) {
    // SAFETY: State is plain integers/floats; all-zero is valid, then we fill the header.
    unsafe { std::ptr::write_bytes(st as *mut State, 0, 1) };
    let h = &mut st.header;
    h.magic = layout::MAGIC;
    h.version = layout::LAYOUT_VERSION;
    h.file_size = STATE_SIZE as u64;
    layout::put_str(&mut h.profile_id, p.id);
    layout::put_str(&mut h.name, p.name);
    let seed = now ^ u64::from(std::process::id()).rotate_left(32);
    h.uuid[..8].copy_from_slice(&seed.to_le_bytes());
    h.uuid[8..].copy_from_slice(&(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes());
    h.uuid[6] = (h.uuid[6] & 0x0f) | 0x40;
    h.uuid[8] = (h.uuid[8] & 0x3f) | 0x80;
    h.mps_kill_teardown = u32::from(std::env::var(ENV_MPS_KILL).is_ok_and(|v| v.trim() == "teardown"));
    h.total_memory = p.total_memory;
    h.sm_count = p.sm_count;
    h.max_sm_clock_mhz = p.max_sm_clock_mhz;
    h.mem_clock_mhz = p.mem_clock_mhz;
    h.mem_bus_width = p.mem_bus_width;
    h.cc_major = p.compute_capability.0;
    h.cc_minor = p.compute_capability.1;
    h.power_limit_mw = p.power_limit_mw;
    h.pci_bus = 0x3b;
    h.next_addr = BASE_ADDR;
    h.created_ns = now;
    h.last_ns = now;
    h.last_sample_ns = now;
    h.idle_sm_clock_mhz = p.idle_sm_clock_mhz;
    h.sm_clock_mhz = f64::from(p.idle_sm_clock_mhz);
    h.mps_default_pct = 100;
    // Nothing ran before the file existed: the snapshot of the period it was created in is
    // all zero.
    h.gpm_at_ns = now - now % physics::GPM_REFRESH_NS;
    h.gpm_sm_clock_mhz = h.sm_clock_mhz;
}

/// The counters of the lock-free view `v` extrapolated to `t` (no earlier than its `last_ns`,
/// no later than its `quiet_until_ns`: only the time integrals grow, at the planned rates),
/// reading only the header fields they need.
fn view_counters_at(v: &shm::View<'_>, t: u64) -> Counters {
    use layout::Header as H;
    use std::mem::offset_of;
    let (timestamp_ns, busy_ns_total, sm_active_ns_total) = physics::extrapolated(
        v.header_word(offset_of!(H, last_ns)),
        v.header_f64(offset_of!(H, busy_ns)),
        v.header_f64(offset_of!(H, sm_active_ns)),
        v.header_f64(offset_of!(H, sm_in_use)),
        v.header_u32(offset_of!(H, sm_count)),
        t,
    );
    Counters {
        timestamp_ns,
        memory_total: v.header_word(offset_of!(H, total_memory)),
        memory_used: v.header_word(offset_of!(H, used_memory)),
        sm_clock_mhz: v.header_f64(offset_of!(H, sm_clock_mhz)).round() as u32,
        busy_ns_total,
        sm_active_ns_total,
    }
}

/// What every lock holder does as it lets go of a state it may have changed: works out until
/// when readers that take no lock may extrapolate it ([`layout::Header::quiet_until_ns`]): the
/// next kernel start or finish, or the next scan for dead clients while any client is
/// registered.
pub(crate) fn settle(st: &mut State) {
    let reap_at = if st.clients.iter().any(|c| c.used != 0) {
        st.header.last_reap_ns.saturating_add(REAP_EVERY_NS - 1)
    } else {
        u64::MAX
    };
    st.header.quiet_until_ns = physics::quiet_until(st, reap_at);
}

/// The header brought to `now` by a reader that holds no lock, or `None` when the model would
/// change at or before `now` in another way than its integrals growing (a kernel starting or
/// finishing, dead clients due to be released): then the lock is needed, to advance it.
fn quiet_header(v: &shm::View<'_>, now: u64) -> Option<layout::Header> {
    let mut h = v.header();
    if now > h.quiet_until_ns {
        return None;
    }
    physics::extrapolate(&mut h, now);
    Some(h)
}

/// The state files `GPUEMU_STATE` names: one, or several separated by `:` (GPU 0 first).
pub fn state_paths_from_env() -> Result<Vec<PathBuf>, EmuError> {
    let v = std::env::var_os(ENV_STATE).filter(|p| !p.is_empty()).ok_or(EmuError::NoStatePath)?;
    let v = v.to_string_lossy().into_owned();
    let paths: Vec<PathBuf> = v.split(':').map(PathBuf::from).collect();
    for (i, p) in paths.iter().enumerate() {
        if p.as_os_str().is_empty() || paths[..i].contains(p) {
            return Err(EmuError::BadStateList(v));
        }
    }
    Ok(paths)
}

fn align_up(v: u64, a: u64) -> u64 {
    let a = a.max(1);
    v.div_ceil(a) * a
}

impl Device {
    /// Opens the device named by `GPUEMU_STATE` (profile of a new file from `GPUEMU_PROFILE`);
    /// on a multi-GPU emulated host (see [`Device::open_all_from_env`]) that is GPU 0.
    pub fn open_from_env() -> Result<Device, EmuError> {
        let path = state_paths_from_env()?.swap_remove(0);
        let profile = match std::env::var(ENV_PROFILE) {
            Ok(id) if !id.trim().is_empty() => Profile::by_id(&id).ok_or(EmuError::BadProfile(id))?,
            _ => &profile::T4,
        };
        Device::open(&path, profile)
    }

    /// Opens every GPU of the emulated host: `GPUEMU_STATE` is one state file, or several
    /// separated by `:` (the host's GPUs in their physical/NVML order, 0, 1, ...), all created
    /// with the profile `GPUEMU_PROFILE`. An empty entry or a file named twice is an error:
    /// one physical GPU is never two.
    pub fn open_all_from_env() -> Result<Vec<Device>, EmuError> {
        let paths = state_paths_from_env()?;
        let profile = match std::env::var(ENV_PROFILE) {
            Ok(id) if !id.trim().is_empty() => Profile::by_id(&id).ok_or(EmuError::BadProfile(id))?,
            _ => &profile::T4,
        };
        paths.iter().map(|p| Device::open(p, profile)).collect()
    }

    /// Opens (or creates with `profile`) the state file at `path`.
    pub fn open(path: &Path, profile: &Profile) -> Result<Device, EmuError> {
        Ok(Device { shm: shm::Shm::open(path, profile, now_ns())?, mps_pipe: std::sync::Mutex::new(None) })
    }

    /// The state file.
    pub fn path(&self) -> PathBuf {
        self.shm.path().to_path_buf()
    }

    /// Locks the state and brings it up to now: advances the model and, at most every
    /// [`REAP_EVERY_NS`], releases clients whose process has died.
    fn locked(&self) -> shm::Guard<'_> {
        let mut g = self.shm.lock();
        let now = now_ns();
        physics::advance(&mut g, now);
        if now >= g.header.last_reap_ns + REAP_EVERY_NS {
            let since = g.header.last_reap_ns;
            g.header.last_reap_ns = now;
            reap_dead(&mut g, since, now);
        }
        g
    }

    /// Static card facts.
    pub fn info(&self) -> DeviceInfo {
        info_of(&self.shm.lock())
    }

    /// Everything NVML and the tests want to see, at one instant.
    pub fn snapshot(&self) -> Snapshot {
        let g = self.locked();
        let h = &g.header;
        let (gpu_util, sm_activity) = physics::utilization(&g, SNAPSHOT_WINDOW_NS);
        let processes = (0..MAX_CLIENTS)
            .filter(|&c| g.clients[c].used != 0)
            .map(|c| {
                let cl = &g.clients[c];
                ProcessInfo {
                    pid: cl.pid,
                    start_time: cl.start_time,
                    used_memory: cl.mem_used,
                    contexts: cl.contexts,
                    context_memory: (cl.ctx_base + u64::from(cl.contexts) * local_bytes(h)).min(cl.mem_used),
                    mps_client: h.mps_enabled != 0 && cl.mps_gen == h.mps_generation && cl.mps_gen != 0,
                    mps_server: cl.mps_server != 0,
                    uid: cl.uid,
                    active_thread_pct: physics::client_pct(&g, c),
                    mps_queued: h.mps_enabled != 0 && cl.mps_wait != 0,
                    mps_handed: h.mps_enabled != 0 && handed_not_connected(h, cl),
                    mps_asking: h.mps_enabled != 0 && cl.mps_conn == mps_conn::ASKED,
                    mps_outside: h.mps_enabled != 0 && cl.mps_conn == mps_conn::OUTSIDE,
                    mps_torn_down: cl.terminated == 2 && cl.mps_gen == h.mps_generation && cl.mps_gen != 0,
                    sm_time_ns: cl.sm_time_ns,
                    kernels: g
                        .live()
                        .iter()
                        .filter(|k| k.client as usize == c && (k.state == kstate::QUEUED || k.state == kstate::RUNNING))
                        .count() as u32,
                }
            })
            .collect();
        Snapshot {
            info: info_of(&g),
            timestamp_ns: h.last_ns,
            memory_total: h.total_memory,
            memory_used: h.used_memory,
            memory_free: h.total_memory.saturating_sub(h.used_memory),
            sm_clock_mhz: h.sm_clock_mhz.round() as u32,
            gpu_util,
            sm_activity,
            sm_demand: h.sm_demand,
            sm_in_use: h.sm_in_use,
            busy_ns_total: h.busy_ns,
            sm_active_ns_total: h.sm_active_ns,
            running_kernels: g.live().iter().filter(|k| k.state == kstate::RUNNING).count() as u32,
            processes,
            mps: mps_of(&g),
            compute_mode: h.compute_mode,
        }
    }

    /// The counters NVML's frequent queries answer from (memory, SM clock, cumulative busy and
    /// SM-active time, utilization over [`SNAPSHOT_WINDOW_NS`]), at one instant, the state
    /// advanced to now. Unlike [`Device::snapshot`] it lists no processes and allocates
    /// nothing: a monitor asks for this at every sample. Taken without the lock while the model
    /// runs on unchanged and no utilization sample is due (what a locked reading would see,
    /// exactly: see [`Device::counters`]); else under the lock.
    pub fn reading(&self) -> Reading {
        let now = now_ns();
        let quick = self.shm.optimistic(|v| {
            let h = quiet_header(v, now)?;
            if physics::sample_due(&h, now) {
                return None;
            }
            Some(reading_of(&h, |i| v.sample(i)))
        });
        quick.unwrap_or_else(|| self.reading_locked())
    }

    /// [`Device::reading`] always under the lock (the model advanced and stored): what the
    /// lock-free path must agree with.
    pub fn reading_locked(&self) -> Reading {
        let g = self.locked();
        reading_of(&g.header, |i| g.ring[i])
    }

    /// Memory, SM clock and the cumulative busy and SM-active time now: what a GPM sample
    /// holds. Read without any lock or system call while the model runs on unchanged (no
    /// kernel starts or finishes, no dead client is due to be released,
    /// [`layout::Header::quiet_until_ns`]): then the time integrals only grow at the rates
    /// the last lock holder planned, and are extrapolated with the arithmetic a locked advance
    /// uses. Otherwise the lock is taken and the model advanced as by any other call.
    pub fn counters(&self) -> Counters {
        use layout::Header as H;
        use std::mem::offset_of;
        let now = now_ns();
        // The nine header fields it needs, not the whole header: a monitor asks at every sample.
        let quick = self.shm.optimistic(|v| {
            if now > v.header_word(offset_of!(H, quiet_until_ns)) {
                return None;
            }
            Some(view_counters_at(v, now))
        });
        quick.unwrap_or_else(|| self.counters_locked())
    }

    /// The SM clock now, MHz ([`Counters::sm_clock_mhz`], two words read while nothing is due).
    pub fn sm_clock_mhz(&self) -> u32 {
        use layout::Header as H;
        use std::mem::offset_of;
        let now = now_ns();
        let quick = self.shm.optimistic(|v| {
            (now <= v.header_word(offset_of!(H, quiet_until_ns))).then(|| v.header_f64(offset_of!(H, sm_clock_mhz)).round() as u32)
        });
        quick.unwrap_or_else(|| self.counters_locked().sm_clock_mhz)
    }

    /// Why the SM clock is below the boost clock now, as NVML's clock event reasons
    /// (`nvmlDeviceGetCurrentClocksEventReasons`): `GpuIdle` (nothing runs: the idle clock),
    /// `SwPowerCap` (load pulled the clock down, the model's only other cause), or none.
    pub fn clock_event_reasons(&self) -> u64 {
        /// `nvmlClocksEventReasonGpuIdle`, `nvmlClocksEventReasonSwPowerCap` (nvml.h).
        const GPU_IDLE: u64 = 0x1;
        const SW_POWER_CAP: u64 = 0x4;
        use layout::Header as H;
        use std::mem::offset_of;
        let reasons = |demand: f64, clock: f64, max: u32| {
            if demand <= 0.0 {
                GPU_IDLE
            } else if clock.round() < f64::from(max) {
                SW_POWER_CAP
            } else {
                0
            }
        };
        // A monitor asks at every sample while the clock is low: lock-free while the model
        // runs on unchanged, as `sm_clock_mhz` is read.
        let now = now_ns();
        let quick = self.shm.optimistic(|v| {
            (now <= v.header_word(offset_of!(H, quiet_until_ns))).then(|| {
                reasons(
                    v.header_f64(offset_of!(H, sm_demand)),
                    v.header_f64(offset_of!(H, sm_clock_mhz)),
                    v.header_u32(offset_of!(H, max_sm_clock_mhz)),
                )
            })
        });
        quick.unwrap_or_else(|| {
            let g = self.locked();
            reasons(g.header.sm_demand, g.header.sm_clock_mhz, g.header.max_sm_clock_mhz)
        })
    }

    /// [`Device::counters`] always under the lock.
    pub fn counters_locked(&self) -> Counters {
        Counters::of(&self.locked().header)
    }

    /// What a GPM sample copies now: the device's counters at the last refresh boundary
    /// ([`physics::GPM_REFRESH_NS`]), the same for every process that asks within one period;
    /// `timestamp_ns` is that boundary. Lock-free while the model runs on unchanged (the value
    /// at a boundary not crossed yet under the lock is extrapolated to it, with the arithmetic
    /// the next locked advance records it with); else under the lock.
    pub fn gpm_counters(&self) -> Counters {
        use layout::Header as H;
        use std::mem::offset_of;
        let now = now_ns();
        let b = physics::gpm_boundary(now);
        let quick = self.shm.optimistic(|v| {
            if now > v.header_word(offset_of!(H, quiet_until_ns)) {
                return None;
            }
            if v.header_word(offset_of!(H, gpm_at_ns)) == b {
                return Some(Counters {
                    timestamp_ns: b,
                    memory_total: v.header_word(offset_of!(H, total_memory)),
                    memory_used: v.header_word(offset_of!(H, used_memory)),
                    sm_clock_mhz: v.header_f64(offset_of!(H, gpm_sm_clock_mhz)).round() as u32,
                    busy_ns_total: v.header_f64(offset_of!(H, gpm_busy_ns)),
                    sm_active_ns_total: v.header_f64(offset_of!(H, gpm_sm_active_ns)),
                });
            }
            if v.header_word(offset_of!(H, last_ns)) > b {
                return None;
            }
            Some(view_counters_at(v, b))
        });
        quick.unwrap_or_else(|| self.gpm_counters_locked())
    }

    /// [`Device::gpm_counters`] always under the lock (the model advanced to now, which records
    /// the snapshot of every boundary it crosses).
    pub fn gpm_counters_locked(&self) -> Counters {
        let g = self.locked();
        let h = &g.header;
        Counters {
            timestamp_ns: h.gpm_at_ns,
            memory_total: h.total_memory,
            memory_used: h.used_memory,
            sm_clock_mhz: h.gpm_sm_clock_mhz.round() as u32,
            busy_ns_total: h.gpm_busy_ns,
            sm_active_ns_total: h.gpm_sm_active_ns,
        }
    }

    /// `(total, used)` device memory now, as NVML's memory query reports it: live (the last
    /// allocation or free that completed), read without locking the state unless dead clients
    /// are due to be released ([`REAP_EVERY_NS`]) or a kernel starts or finishes, so a dead
    /// process's memory is given back as soon as with any other query.
    pub fn memory(&self) -> (u64, u64) {
        use std::mem::offset_of;
        let now = now_ns();
        // Three words of the header, not all of it: NVML asks at every sample.
        let quick = self.shm.optimistic(|v| {
            let q = v.header_word(offset_of!(layout::Header, quiet_until_ns));
            (now <= q).then(|| {
                (v.header_word(offset_of!(layout::Header, total_memory)), v.header_word(offset_of!(layout::Header, used_memory)))
            })
        });
        quick.unwrap_or_else(|| {
            let c = self.counters_locked();
            (c.memory_total, c.memory_used)
        })
    }

    /// `(pid, device memory used)` of every process holding a context now, in slot order:
    /// what NVML lists as running compute processes (the list [`Device::snapshot`] has, without
    /// the rest of the snapshot).
    pub fn compute_processes(&self) -> Vec<(u32, u64)> {
        let now = now_ns();
        // Contexts and memory change only under the lock; releasing dead clients is the one
        // change time brings, and the horizon says when that is due.
        let quick = self.shm.optimistic(|v| {
            if now > v.header().quiet_until_ns {
                return None;
            }
            Some((0..MAX_CLIENTS).map(|i| v.client(i)).filter(|c| c.used != 0 && c.contexts > 0).map(|c| (c.pid, c.mem_used)).collect())
        });
        quick.unwrap_or_else(|| {
            let g = self.locked();
            g.clients.iter().filter(|c| c.used != 0 && c.contexts > 0).map(|c| (c.pid, c.mem_used)).collect()
        })
    }

    /// The utilization samples newer than `after_ns`, with the one before them (the start of
    /// the first interval), oldest first: what NVML's sample queries need, without copying the
    /// whole ring. Read without the lock while no sample is due (then a locked read would
    /// leave the ring as it is: nothing else writes it).
    pub fn samples_after(&self, after_ns: u64) -> Vec<Sample> {
        let now = now_ns();
        let quick = self.shm.optimistic(|v| {
            let h = v.header();
            if physics::sample_due(&h, now) {
                return None;
            }
            Some(samples_after_of(&h, |i| v.sample(i), after_ns))
        });
        quick.unwrap_or_else(|| {
            let g = self.locked();
            samples_after_of(&g.header, |i| g.ring[i], after_ns)
        })
    }

    /// GPU utilization and SM activity (0..=1) over about the last `window`.
    pub fn utilization(&self, window: Duration) -> (f64, f64) {
        physics::utilization(&self.locked(), window.as_nanos() as u64)
    }

    /// The utilization samples kept (cumulative integrals, oldest first; time base [`now_ns`]).
    pub fn samples(&self) -> Vec<Sample> {
        physics::samples(&self.locked())
    }

    // ---- MPS control (fake nvidia-cuda-mps-control) ----

    /// MPS state.
    pub fn mps_status(&self) -> MpsStatus {
        mps_of(&self.locked())
    }

    /// MPS is on: the control daemon `control_pid` listens on `control_socket`
    /// (`$CUDA_MPS_PIPE_DIRECTORY/control`), through which alone clients reach it (idempotent
    /// while that daemon runs; a daemon replacing one that died without `quit` starts afresh:
    /// the dead one's clients lost their servers); the default percentage resets to 100.
    pub fn mps_start(&self, control_pid: u32, control_socket: &Path) -> MpsStatus {
        let sock = file_id(control_socket).unwrap_or((0, 0));
        let mut g = self.locked();
        let prev = g.header.mps_control_pid;
        if g.header.mps_enabled != 0 && prev != control_pid && procinfo::start_time(prev).is_none() {
            // The daemon that turned MPS on died without `quit` (SIGKILLed, as mps-manager
            // replaces a hung one): its servers went with it, and their clients lost them.
            quit_mps(&mut g);
        }
        if g.header.mps_enabled == 0 {
            let h = &mut g.header;
            h.mps_enabled = 1;
            (h.mps_sock_dev, h.mps_sock_ino) = sock;
            clear_dead(h);
            h.mps_generation += 1;
            h.mps_default_pct = 100;
            h.mps_control_pid = control_pid;
        }
        mps_of(&g)
    }

    /// Stops the MPS server: clears a poisoned state; clients attached to it lose their contexts
    /// (their calls fail with `CUDA_ERROR_MPS_CLIENT_TERMINATED`).
    pub fn mps_quit(&self) -> MpsStatus {
        let mut g = self.locked();
        quit_mps(&mut g);
        mps_of(&g)
    }

    /// What an MPS client dying with kernels in flight does from now on: tear the server's
    /// other clients down (`true`, what an H200 did) or hang them until `terminate_client`
    /// (`false`, the default). See [`ENV_MPS_KILL`].
    pub fn set_mps_kill_teardown(&self, on: bool) {
        self.locked().header.mps_kill_teardown = u32::from(on);
    }

    /// `terminate_client`: ends all outstanding GPU work of one MPS client of the running
    /// server. A live client's later calls fail with `CUDA_ERROR_MPS_CLIENT_TERMINATED`; the
    /// server and its other clients carry on (NVIDIA MPS docs, "terminate_client", CUDA 11+).
    /// Naming a client whose death left the server hung drops that client's work; once every
    /// such dead client is terminated the neighbours progress again.
    pub fn mps_terminate_client(&self, pid: u32) -> Result<(), EmuError> {
        let mut g = self.locked();
        if g.header.mps_enabled == 0 {
            return Err(EmuError::NoSuchClient(pid));
        }
        let generation = g.header.mps_generation;
        let now = g.header.last_ns;
        if remove_dead(&mut g.header, pid) {
            physics::compute_shares(&mut g);
            return Ok(());
        }
        let slot = (0..MAX_CLIENTS).find(|&c| {
            let cl = g.clients[c];
            cl.used != 0 && cl.pid == pid && cl.mps_gen == generation && cl.mps_gen != 0 && cl.contexts > 0
        });
        let Some(c) = slot else {
            return Err(EmuError::NoSuchClient(pid));
        };
        g.clients[c].terminated = 1;
        drop_kernels(&mut g, c as u32, now);
        physics::compute_shares(&mut g);
        Ok(())
    }

    /// Sets the server-wide default active-thread percentage (1..=100): the limit of clients
    /// that connect afterwards. A connected client keeps the limit it connected with (real MPS
    /// never changes a running client's percentage).
    pub fn set_default_active_thread_pct(&self, pct: u32) -> Result<(), EmuError> {
        check_pct(pct)?;
        let mut g = self.locked();
        if g.header.mps_enabled == 0 {
            return Err(EmuError::InvalidValue("MPS is not running".into()));
        }
        g.header.mps_default_pct = pct;
        physics::compute_shares(&mut g);
        Ok(())
    }

    /// The server-wide default active-thread percentage.
    pub fn default_active_thread_pct(&self) -> u32 {
        self.locked().header.mps_default_pct
    }

    /// The compute mode, one of [`layout::compute_mode`].
    pub fn compute_mode(&self) -> u32 {
        self.locked().header.compute_mode
    }

    /// Reports XID `code` naming process `pid` (0: none), as the driver does on a GPU error:
    /// NVML event sets registered for `nvmlEventTypeXidCriticalError` deliver it. Root only
    /// ([`EmuError::NoPermission`]): on a real host XIDs come from the kernel driver, never
    /// from a tenant (for tests and `gpuemu xid`).
    pub fn report_xid(&self, code: u64, pid: u32) -> Result<(), EmuError> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(EmuError::NoPermission("reporting an XID".into()));
        }
        push_xid(&mut self.locked().header, code, pid, now_ns());
        Ok(())
    }

    /// XID events reported since `after` of them were (`after`: a count this returned before,
    /// or 0): the count now and the events still held, oldest first (older ones are lost).
    pub fn xids_after(&self, after: u64) -> (u64, Vec<layout::XidEvent>) {
        let g = self.locked();
        let n = g.header.xid_count;
        let from = after.max(n.saturating_sub(layout::XID_RING as u64));
        (n, (from..n).map(|i| g.header.xids[(i % layout::XID_RING as u64) as usize]).collect())
    }

    /// XID events reported since the file was created.
    pub fn xid_count(&self) -> u64 {
        self.locked().header.xid_count
    }

    /// Sets the compute mode as `nvmlDeviceSetComputeMode` (`nvidia-smi -c`) does: root only
    /// ([`EmuError::NoPermission`]); EXCLUSIVE_THREAD is refused (its support was removed),
    /// an unknown mode is invalid. It takes effect at once for the contexts created from then
    /// on; contexts that exist stay.
    pub fn set_compute_mode(&self, mode: u32) -> Result<(), EmuError> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(EmuError::NoPermission("setting the compute mode".into()));
        }
        match mode {
            compute_mode::DEFAULT | compute_mode::PROHIBITED | compute_mode::EXCLUSIVE_PROCESS => {}
            compute_mode::EXCLUSIVE_THREAD => {
                return Err(EmuError::NotSupported("the EXCLUSIVE_THREAD compute mode".into()))
            }
            m => return Err(EmuError::InvalidValue(format!("compute mode {m}"))),
        }
        self.locked().header.compute_mode = mode;
        Ok(())
    }

    // ---- Client side (fake libcuda) ----

    /// Registers the calling process (idempotent).
    pub fn attach(&self) -> Result<Client, EmuError> {
        let (pid, start_time) = procinfo::me();
        let mut g = self.locked();
        if let Some(c) = (0..MAX_CLIENTS).find(|&c| g.clients[c].used != 0 && g.clients[c].pid == pid) {
            if g.clients[c].start_time == start_time {
                return Ok(Client { slot: c as u32, pid, start_time });
            }
            let now = g.header.last_ns;
            release_client(&mut g, c, now);
        }
        let c = (0..MAX_CLIENTS).find(|&c| g.clients[c].used == 0).ok_or(EmuError::TooManyClients)?;
        g.clients[c] = layout::ClientSlot { used: 1, pid, start_time, ..Default::default() };
        Ok(Client { slot: c as u32, pid, start_time })
    }

    fn slot_ok(g: &State, c: &Client) -> bool {
        let s = &g.clients[c.slot as usize % MAX_CLIENTS];
        s.used != 0 && s.pid == c.pid && s.start_time == c.start_time
    }

    /// This handle's process connects to MPS through `dir` instead of its environment's
    /// `CUDA_MPS_PIPE_DIRECTORY` (an in-process stand-in for a client of another process's
    /// environment).
    pub fn set_mps_pipe_dir(&self, dir: &Path) {
        *self.mps_pipe.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir.to_path_buf());
    }

    /// The control socket this process would connect through, as device and inode numbers
    /// (`None` when there is no such file).
    fn my_control_socket(&self) -> Option<(u64, u64)> {
        let dir = self.mps_pipe.lock().unwrap_or_else(|e| e.into_inner()).clone();
        file_id(&dir.unwrap_or_else(mps_pipe_dir_from_env).join("control"))
    }

    /// A context was created: joins the running MPS server (refused while it is poisoned) and
    /// applies `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` from the client's environment if given.
    ///
    /// The context takes device memory, as a real one does: its local-memory reservation
    /// ([`profile::context_local_bytes`]) and, for a process's first context outside MPS, the
    /// per-process part ([`profile::CONTEXT_BASE_BYTES`]). NVML counts it in the process's
    /// memory and in the device's; without that much free the context is refused
    /// ([`EmuError::OutOfMemory`], `CUDA_ERROR_OUT_OF_MEMORY` from the driver).
    pub fn context_created(&self, c: &Client, env_pct: Option<u32>) -> Result<(), EmuError> {
        let mut g = self.locked();
        if !Self::slot_ok(&g, c) {
            return Err(EmuError::NoSuchClient(c.pid));
        }
        let on_mps = reaches_mps(&mut g, c.slot as usize, || self.my_control_socket());
        if !on_mps {
            // A context of its own (outside MPS, or MPS off): the compute mode rules it.
            compute_mode_allows(&g)?;
        }
        let h = g.header;
        let (local, base) = context_bytes(&h, &g.clients[c.slot as usize]);
        let free = h.total_memory.saturating_sub(h.used_memory);
        if local + base > free {
            return Err(EmuError::OutOfMemory { requested: local + base, free });
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        let me = c.slot as usize;
        let cl = &mut g.clients[me];
        // Real MPS: a client the server terminated (`terminate_client`, the server's exit, a
        // fatal error) must be relaunched to use CUDA again ("the process must be terminated
        // and relaunched", CUDA_ERROR_MPS_CLIENT_TERMINATED): destroying its contexts and
        // creating new ones does not reconnect it.
        if cl.terminated != 0 {
            return Err(if cl.terminated == 2 { EmuError::MpsFatalError } else { EmuError::MpsClientTerminated });
        }
        if on_mps {
            if h.mps_poisoned != 0 {
                return Err(EmuError::MpsServerNotReady);
            }
            // A process already connected keeps its connection for further contexts.
            let connected = cl.mps_gen == h.mps_generation && cl.contexts > 0;
            if !connected {
                // NVIDIA's MPS docs (troubleshooting, "Server Recovery"): after a fatal GPU
                // error the server waits for every client it tore down to exit, and refuses
                // new clients (CUDA_ERROR_MPS_SERVER_NOT_READY) until they have.
                if recovering_from_fatal(&g) {
                    return Err(EmuError::MpsServerNotReady);
                }
                mps_join(&mut g, me, euid)?;
            }
            // NVIDIA's MPS docs count client CUDA *contexts* per device (48 on Volta and
            // later, which may belong to fewer processes): a further context of a process
            // already connected counts too (the stricter reading of the man page's "clients").
            let limit = profile::mps_max_clients((h.cc_major, h.cc_minor));
            if mps_contexts(&g) >= limit {
                return Err(EmuError::MpsMaxClients { limit });
            }
            let cl = &mut g.clients[me];
            cl.mps_wait = 0;
            // Real MPS: the driver connects to the control daemon, which hands the client to its
            // user's server, before the context exists; the emulated daemon lists the client
            // on that server from the device's record, so the uid is recorded here, with the
            // context, and never looked up later (the process may be gone by then).
            cl.mps_gen = h.mps_generation;
            cl.uid = euid;
            if !connected {
                // Real MPS fixes a client's limit when it connects, for its life: the server's
                // percentage (the daemon keeps the device's default equal to it), further
                // constrained by the client's own CUDA_MPS_ACTIVE_THREAD_PERCENTAGE ("will only
                // further constrain the limit set by the control daemon", NVIDIA's MPS docs).
                let server = h.mps_default_pct.clamp(1, 100);
                cl.pct = env_pct.filter(|p| (1..=100).contains(p)).map_or(server, |p| p.min(server));
            }
        }
        let cl = &mut g.clients[me];
        cl.mps_wait = 0;
        cl.contexts += 1;
        cl.ctx_base += base;
        cl.mem_used += local + base;
        g.header.used_memory += local + base;
        Ok(())
    }

    /// [`Device::context_created`] as a client's driver makes it: first waits, as a real MPS
    /// client does, while its connection is queued or the control daemon has not yet handed it
    /// to its server ([`mps_wait`], [`MPS_CONNECT_LIMIT`]). For in-process loads and helpers
    /// that stand in for a CUDA program without the fake libcuda.
    pub fn create_context(&self, c: &Client, env_pct: Option<u32>) -> Result<(), EmuError> {
        mps_wait(MPS_CONNECT_LIMIT, || self.context_created(c, env_pct), |_| {})
    }

    /// An MPS server process (the emulated `nvidia-cuda-mps-server`) created the context its
    /// clients share: it holds a whole context's memory, the per-process part its clients do
    /// not take ([`profile::CONTEXT_BASE_BYTES`]) and local memory, for as long as it runs, and
    /// NVML lists it as a process, as on a real GPU (NVIDIA's MPS docs: the server "owns the
    /// CUDA context on the GPU"). Refused with [`EmuError::OutOfMemory`] without that much
    /// free. It is no MPS client: its death hangs nobody (its clients fail instead).
    pub fn mps_server_context(&self, c: &Client) -> Result<(), EmuError> {
        let mut g = self.locked();
        if !Self::slot_ok(&g, c) {
            return Err(EmuError::NoSuchClient(c.pid));
        }
        // The exclusive-mode restrictions apply to the server, not to its clients (NVIDIA's
        // MPS docs): it cannot start while another process holds the device in
        // EXCLUSIVE_PROCESS mode, nor at all in PROHIBITED mode.
        compute_mode_allows(&g)?;
        let h = g.header;
        let cl = &mut g.clients[c.slot as usize];
        let need = local_bytes(&h) + if cl.contexts == 0 { profile::CONTEXT_BASE_BYTES } else { 0 };
        let free = h.total_memory.saturating_sub(h.used_memory);
        if need > free {
            return Err(EmuError::OutOfMemory { requested: need, free });
        }
        if cl.contexts == 0 {
            cl.ctx_base = profile::CONTEXT_BASE_BYTES;
        }
        cl.mps_server = 1;
        cl.mps_gen = 0;
        // Where its clients' shared memory lives: the /dev/shm this server sees.
        (cl.shm_dev, cl.shm_ino) = dev_shm_id().unwrap_or((0, 0));
        // SAFETY: geteuid has no preconditions and cannot fail.
        cl.uid = unsafe { libc::geteuid() };
        cl.contexts += 1;
        cl.mem_used += need;
        g.header.used_memory += need;
        Ok(())
    }

    /// The MPS connection a process attempts when CUDA is initialised (`cuInit`): `Ok` when
    /// MPS is off, the process is already connected, or the running server is its user's;
    /// [`EmuError::MpsUserQueued`] while the control daemon queues it behind another user's
    /// server (the caller looks again; the queue position is kept). Joining the server itself
    /// happens with the first context ([`Device::context_created`]), which looks again.
    pub fn mps_admit(&self, c: &Client) -> Result<(), EmuError> {
        let mut g = self.locked();
        if !Self::slot_ok(&g, c) {
            return Err(EmuError::NoSuchClient(c.pid));
        }
        let me = c.slot as usize;
        let on_mps = reaches_mps(&mut g, me, || self.my_control_socket());
        let h = g.header;
        let cl = g.clients[me];
        if !on_mps || (cl.mps_gen == h.mps_generation && cl.contexts > 0) {
            return Ok(());
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        mps_join(&mut g, me, unsafe { libc::geteuid() })
    }

    /// The control daemon's view of connections: `(pid, uid)` of every client that asked for
    /// its user's server and waits to be handed to one.
    pub fn mps_requests(&self) -> Vec<(u32, u32)> {
        let g = self.locked();
        g.clients
            .iter()
            .filter(|c| c.used != 0 && c.mps_conn == mps_conn::ASKED)
            .map(|c| (c.pid, c.uid))
            .collect()
    }

    /// The control daemon hands the waiting client `client_pid` to the server process
    /// `server_pid`: `Ok(true)` once done, `Ok(false)` while that server has not yet created
    /// its context (it is starting: the client keeps waiting). Refused when the client is not
    /// waiting, or the server serves another user (real MPS connects a client only to its own
    /// user's server).
    pub fn mps_hand_over(&self, client_pid: u32, server_pid: u32) -> Result<bool, EmuError> {
        let mut g = self.locked();
        let me = (0..MAX_CLIENTS)
            .find(|&c| g.clients[c].used != 0 && g.clients[c].pid == client_pid && g.clients[c].mps_conn == mps_conn::ASKED)
            .ok_or(EmuError::NoSuchClient(client_pid))?;
        let uid = g.clients[me].uid;
        if let Some(server) = g.clients.iter().find(|s| s.used != 0 && s.pid == server_pid && s.mps_server != 0) {
            if server.uid != uid {
                return Err(EmuError::InvalidValue(format!(
                    "server {server_pid} runs as uid {}, client {client_pid} is uid {uid}: MPS connects a client to its own user's server",
                    server.uid
                )));
            }
        }
        if !server_ready(&g, server_pid, uid) {
            return Ok(false);
        }
        let cl = &mut g.clients[me];
        cl.mps_conn = mps_conn::HANDED;
        cl.mps_server_pid = server_pid;
        Ok(true)
    }

    /// The control daemon could not serve the waiting client `client_pid` (its server failed
    /// to start): the client's connection fails (`CUDA_ERROR_MPS_CONNECTION_FAILED`), for its
    /// life. A client not waiting is left as it is.
    pub fn mps_refuse(&self, client_pid: u32) {
        let mut g = self.locked();
        for c in g.clients.iter_mut() {
            if c.used != 0 && c.pid == client_pid && c.mps_conn == mps_conn::ASKED {
                c.mps_conn = mps_conn::REFUSED;
            }
        }
    }

    /// A context was destroyed (or the process released it at exit): its memory is given
    /// back, and with the process's last context the per-process part.
    pub fn context_destroyed(&self, c: &Client) {
        let mut g = self.locked();
        if Self::slot_ok(&g, c) {
            let local = local_bytes(&g.header);
            let cl = &mut g.clients[c.slot as usize];
            if cl.contexts == 0 {
                return;
            }
            cl.contexts -= 1;
            let mut back = local;
            if cl.contexts == 0 {
                back += cl.ctx_base;
                cl.ctx_base = 0;
            }
            let back = back.min(cl.mem_used);
            cl.mem_used -= back;
            g.header.used_memory = g.header.used_memory.saturating_sub(back);
        }
    }

    /// MPS runs but this client found no control daemon at its `CUDA_MPS_PIPE_DIRECTORY`: it
    /// runs without MPS (see [`Device::mps_admit`]).
    pub fn runs_outside_mps(&self, c: &Client) -> bool {
        let g = self.locked();
        Self::slot_ok(&g, c) && g.header.mps_enabled != 0 && g.clients[c.slot as usize].mps_conn == mps_conn::OUTSIDE
    }

    /// Live contexts this client holds according to the device.
    pub fn contexts(&self, c: &Client) -> u32 {
        let g = self.locked();
        if Self::slot_ok(&g, c) { g.clients[c.slot as usize].contexts } else { 0 }
    }

    /// The MPS gate every GPU-touching call passes: fails once the client's MPS server is gone
    /// and blocks (the hang a real MPS server shows) while the server is poisoned.
    pub fn gate(&self, c: &Client) -> Result<(), EmuError> {
        loop {
            {
                let g = self.locked();
                gate_state(&g, c)?;
                if !poisoned_for(&g, c) {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Free and total device memory as the driver reports it (live, lock-free while nothing
    /// is due: see [`Device::counters`]).
    pub fn mem_info(&self) -> (u64, u64) {
        let c = self.counters();
        (c.memory_total.saturating_sub(c.memory_used), c.memory_total)
    }

    /// Commits `bytes` of device memory to the client and returns a fresh device address.
    pub fn alloc(&self, c: &Client, bytes: u64, align: u64) -> Result<u64, EmuError> {
        let mut g = self.locked();
        gate_state(&g, c)?;
        if bytes == 0 {
            return Err(EmuError::InvalidValue("allocation of 0 bytes".into()));
        }
        let free = g.header.total_memory.saturating_sub(g.header.used_memory);
        if bytes > free {
            return Err(EmuError::OutOfMemory { requested: bytes, free });
        }
        g.header.used_memory += bytes;
        g.clients[c.slot as usize].mem_used += bytes;
        Ok(bump(&mut g, bytes, align.max(512)))
    }

    /// Commits `bytes` without handing out an address (physical memory of `cuMemCreate`, arrays).
    pub fn commit(&self, c: &Client, bytes: u64) -> Result<(), EmuError> {
        let mut g = self.locked();
        gate_state(&g, c)?;
        let free = g.header.total_memory.saturating_sub(g.header.used_memory);
        if bytes > free {
            return Err(EmuError::OutOfMemory { requested: bytes, free });
        }
        g.header.used_memory += bytes;
        g.clients[c.slot as usize].mem_used += bytes;
        Ok(())
    }

    /// Gives back `bytes` committed by this client.
    pub fn free(&self, c: &Client, bytes: u64) {
        let mut g = self.locked();
        if !Self::slot_ok(&g, c) {
            return;
        }
        let cl = &mut g.clients[c.slot as usize];
        let b = bytes.min(cl.mem_used);
        cl.mem_used -= b;
        g.header.used_memory = g.header.used_memory.saturating_sub(b);
    }

    /// Reserves a device virtual address range (no memory committed).
    pub fn reserve_address(&self, size: u64, align: u64) -> Option<u64> {
        let mut g = self.locked();
        // The device's address space ends at VA_LIMIT (above it the emulated driver keeps which
        // GPU an address belongs to): a range past it is refused, as a real driver refuses a
        // reservation larger than its virtual address space (CUDA_ERROR_OUT_OF_MEMORY).
        let align = align.max(2 << 20);
        let start = g.header.next_addr.checked_next_multiple_of(align)?;
        let end = start.checked_add(size.max(1))?;
        if end > VA_LIMIT {
            return None;
        }
        Some(bump(&mut g, size.max(1), align))
    }

    /// Enqueues a kernel; returns its ticket. Waits for a free kernel slot if the table is full.
    pub fn launch(&self, c: &Client, l: Launch) -> Result<u64, EmuError> {
        loop {
            {
                let mut g = self.locked();
                gate_state(&g, c)?;
                if !poisoned_for(&g, c) {
                    if let Some(i) = free_kernel_slot(&mut g) {
                        let sms = u64::from(g.header.sm_count.max(1));
                        let blocks = l.blocks.max(1);
                        let work = blocks as f64 * l.cycles_per_block.max(1) as f64;
                        g.header.ticket_counter += 1;
                        let ticket = g.header.ticket_counter;
                        let now = g.header.last_ns;
                        g.kernels[i] = layout::KernelSlot {
                            state: kstate::QUEUED,
                            client: c.slot,
                            ticket,
                            dep_ticket: l.after,
                            demand: blocks.min(sms) as f64,
                            work_left: work,
                            work_total: work,
                            enq_ns: now,
                            ..Default::default()
                        };
                        physics::advance(&mut g, now);
                        return Ok(ticket);
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Where the kernel `ticket` is.
    pub fn kernel_status(&self, ticket: u64) -> KernelStatus {
        status_of(&self.locked(), ticket)
    }

    /// Blocks until kernel `ticket` has finished (emulated time); returns its end time.
    /// Blocks indefinitely while the client's MPS server is poisoned; fails once it is gone.
    pub fn wait(&self, c: &Client, ticket: u64) -> Result<u64, EmuError> {
        loop {
            let pause = {
                let g = self.locked();
                gate_state(&g, c)?;
                match status_of(&g, ticket) {
                    KernelStatus::Done { end_ns, .. } => return Ok(end_ns),
                    KernelStatus::Gone => return Ok(g.header.last_ns),
                    KernelStatus::Pending => predicted_wait(&g, ticket),
                }
            };
            std::thread::sleep(pause);
        }
    }

    /// Frees the slot of a finished kernel whose completion the owner has observed.
    pub fn collect(&self, ticket: u64) {
        let mut g = self.shm.lock();
        if let Some(k) = g.live_mut().iter_mut().find(|k| k.ticket == ticket && k.state == kstate::DONE) {
            *k = layout::KernelSlot::default();
        }
        g.shrink_live();
    }

    /// Clean exit of the calling process: drops its contexts and memory (what a real driver does
    /// at process teardown), so its later disappearance harms no one.
    pub fn detach(&self, c: &Client) {
        let mut g = self.locked();
        if Self::slot_ok(&g, c) {
            let now = g.header.last_ns;
            release_client(&mut g, c.slot as usize, now);
        }
    }
}

fn reading_of(h: &layout::Header, at: impl Fn(usize) -> Sample + Copy) -> Reading {
    let (gpu_util, sm_activity) = physics::utilization_of(h, at, SNAPSHOT_WINDOW_NS);
    let c = Counters::of(h);
    Reading {
        timestamp_ns: c.timestamp_ns,
        memory_total: c.memory_total,
        memory_used: c.memory_used,
        sm_clock_mhz: c.sm_clock_mhz,
        gpu_util,
        sm_activity,
        busy_ns_total: c.busy_ns_total,
        sm_active_ns_total: c.sm_active_ns_total,
    }
}

fn samples_after_of(h: &layout::Header, at: impl Fn(usize) -> Sample, after_ns: u64) -> Vec<Sample> {
    // Only the entries returned are read (from a lock-free view each read is a copy): back from
    // the newest while newer than `after_ns`, then the one before them.
    let n = (h.ring_count as usize).min(layout::RING_LEN);
    let head = h.ring_head as usize % layout::RING_LEN;
    let idx = |i: usize| (head + layout::RING_LEN - n + i) % layout::RING_LEN; // i-th oldest
    let mut k = n;
    while k > 0 && at(idx(k - 1)).t_ns > after_ns {
        k -= 1;
    }
    (k.saturating_sub(1)..n).map(|i| at(idx(i))).collect()
}

fn check_pct(pct: u32) -> Result<(), EmuError> {
    if (1..=100).contains(&pct) {
        Ok(())
    } else {
        Err(EmuError::InvalidValue(format!("active thread percentage {pct} is outside 1..=100")))
    }
}

fn bump(st: &mut State, bytes: u64, align: u64) -> u64 {
    let addr = align_up(st.header.next_addr, align);
    st.header.next_addr = align_up(addr + bytes, 512);
    addr
}

fn gate_state(st: &State, c: &Client) -> Result<(), EmuError> {
    let s = &st.clients[c.slot as usize % MAX_CLIENTS];
    if s.used == 0 || s.pid != c.pid || s.start_time != c.start_time {
        return Err(EmuError::NoSuchClient(c.pid));
    }
    match s.terminated {
        0 => Ok(()),
        2 => Err(EmuError::MpsFatalError),
        _ => Err(EmuError::MpsClientTerminated),
    }
}

fn poisoned_for(st: &State, c: &Client) -> bool {
    let s = &st.clients[c.slot as usize % MAX_CLIENTS];
    st.header.mps_enabled != 0 && st.header.mps_poisoned != 0 && s.mps_gen == st.header.mps_generation && s.mps_gen != 0
}

fn status_of(st: &State, ticket: u64) -> KernelStatus {
    match st.live().iter().find(|k| k.ticket == ticket && k.state != kstate::FREE) {
        Some(k) if k.state == kstate::DONE => KernelStatus::Done { start_ns: k.start_ns, end_ns: k.end_ns },
        Some(_) => KernelStatus::Pending,
        None => KernelStatus::Gone,
    }
}

/// How long to sleep before looking at `ticket` again: the predicted time until it completes at
/// the current rates (walking back through the queued kernels ahead of it on its stream),
/// clamped to 20 µs ..= 2 ms so that changes in sharing are noticed.
fn predicted_wait(st: &State, ticket: u64) -> Duration {
    let rate = st.header.sm_clock_mhz / 1000.0;
    let mut total = 0.0;
    let mut t = ticket;
    for _ in 0..64 {
        let Some(k) = st.live().iter().find(|k| k.ticket == t && k.state != kstate::FREE) else { break };
        match k.state {
            kstate::RUNNING if k.share > 0.0 && rate > 0.0 => {
                total += k.work_left / (k.share * rate);
                break;
            }
            kstate::QUEUED if k.demand > 0.0 && rate > 0.0 => {
                total += k.work_total / (k.demand * rate);
                t = k.dep_ticket;
            }
            _ => {
                total += 1_000_000.0;
                break;
            }
        }
    }
    Duration::from_nanos(total.clamp(20_000.0, 2_000_000.0) as u64)
}

fn free_kernel_slot(st: &mut State) -> Option<usize> {
    if let Some(i) = st.kernels.iter().position(|k| k.state == kstate::FREE) {
        st.header.kernel_hwm = st.header.kernel_hwm.max(i as u32 + 1);
        return Some(i);
    }
    // Full: reuse the oldest finished kernel nobody collected.
    let i = (0..st.kernels.len()).filter(|&i| st.kernels[i].state == kstate::DONE).min_by_key(|&i| st.kernels[i].end_ns)?;
    st.kernels[i] = layout::KernelSlot::default();
    Some(i)
}

fn drop_kernels(st: &mut State, client: u32, now: u64) {
    for k in st.live_mut().iter_mut() {
        if k.client == client && k.state != kstate::FREE {
            if k.state == kstate::DONE {
                *k = layout::KernelSlot::default();
            } else {
                k.state = kstate::DONE;
                k.end_ns = now;
                k.share = 0.0;
            }
        }
    }
}

fn release_client(st: &mut State, c: usize, now: u64) {
    let cl = st.clients[c];
    st.header.used_memory = st.header.used_memory.saturating_sub(cl.mem_used);
    drop_kernels(st, c as u32, now);
    for k in st.live_mut().iter_mut().filter(|k| k.client == c as u32 && k.state == kstate::DONE) {
        *k = layout::KernelSlot::default();
    }
    st.shrink_live();
    st.clients[c] = layout::ClientSlot::default();
    physics::compute_shares(st);
}

/// Device memory each context holds for local memory on the device with header `h`.
fn local_bytes(h: &layout::Header) -> u64 {
    profile::context_local_bytes(h.sm_count, (h.cc_major, h.cc_minor))
}

/// `(local, per-process)` device memory a new context of client `cl` takes on the device
/// with header `h`: the per-process part only with its first context, and not under MPS
/// (the server holds it).
fn context_bytes(h: &layout::Header, cl: &layout::ClientSlot) -> (u64, u64) {
    let local = local_bytes(h);
    let on_mps = h.mps_enabled != 0 && cl.mps_conn != mps_conn::OUTSIDE;
    let base = if cl.contexts == 0 && !on_mps { profile::CONTEXT_BASE_BYTES } else { 0 };
    (local, base)
}

/// Releases every client whose process is gone (it was alive at the last scan, `since`); one
/// that died holding a context attached to the running MPS server poisons it, or in teardown
/// mode, if it had a kernel in flight at any time since that scan (when it died is not known:
/// the stricter reading), tears the server's other clients down.
fn reap_dead(st: &mut State, since: u64, now: u64) {
    for c in 0..MAX_CLIENTS {
        let cl = st.clients[c];
        if cl.used == 0 || procinfo::alive(cl.pid, cl.start_time) {
            continue;
        }
        let h = &st.header;
        let on_server = cl.contexts > 0 && cl.terminated == 0 && h.mps_enabled != 0 && cl.mps_gen == h.mps_generation && cl.mps_gen != 0;
        if on_server && h.mps_kill_teardown != 0 {
            let in_flight = st.live().iter().any(|k| {
                k.client == c as u32 && k.state != kstate::FREE && (k.state != kstate::DONE || k.end_ns >= since)
            });
            // The server drops the dead client at once (no hang); with its kernels still in
            // flight, the fault tears every other client of the server down.
            if in_flight {
                tear_down_others(st, c, now);
            }
        } else if on_server {
            push_dead(&mut st.header, cl.pid, cl.uid);
        }
        release_client(st, c, now);
    }
}

/// Whether the running MPS server is recovering from a fatal GPU error: a client it tore down
/// ([`tear_down_others`]) has not exited yet. (A torn-down client that destroys its contexts
/// still counts: MPS waits for the process.)
fn recovering_from_fatal(st: &State) -> bool {
    let generation = st.header.mps_generation;
    st.clients.iter().any(|c| c.used != 0 && c.terminated == 2 && c.mps_gen == generation && c.mps_gen != 0)
}

/// XID 31, "GPU memory page fault" (an MMU fault): what NVML reported on the H200 for each
/// client the MPS server tore down after a client died with kernels in flight.
pub const XID_MMU_FAULT: u64 = 31;

/// The MPS server's handling of a fatal GPU error after client `dead` died with kernels in
/// flight: every other live client of the server gets the sticky error and loses its work.
fn tear_down_others(st: &mut State, dead: usize, now: u64) {
    let generation = st.header.mps_generation;
    let mut any = false;
    for c in 0..MAX_CLIENTS {
        let cl = st.clients[c];
        if c != dead && cl.used != 0 && cl.mps_gen == generation && cl.contexts > 0 && cl.terminated == 0 {
            st.clients[c].terminated = 2;
            drop_kernels(st, c as u32, now);
            // What the H200 reported with the server's "encountered a fatal GPU error": XID 31
            // (an MMU fault) naming the torn-down client.
            push_xid(&mut st.header, XID_MMU_FAULT, cl.pid, now);
            any = true;
        }
    }
    if any {
        st.header.mps_fatal_errors = st.header.mps_fatal_errors.saturating_add(1);
    }
}

/// Whether a process may create a context of its own (outside MPS, or as an MPS server) under
/// the device's compute mode: never in PROHIBITED mode; in EXCLUSIVE_PROCESS mode only while no
/// process holds one ([`own_context_holder`]; the asking process included: one context on the
/// device in all).
fn compute_mode_allows(st: &State) -> Result<(), EmuError> {
    match st.header.compute_mode {
        compute_mode::PROHIBITED => Err(EmuError::ComputeProhibited),
        compute_mode::EXCLUSIVE_PROCESS => match own_context_holder(st) {
            Some(holder) => Err(EmuError::DeviceUnavailable { holder }),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

/// A live process holding a context of its own on the device: one outside MPS, or an MPS
/// server (MPS clients run in their server's context). A dead holder's context went with it,
/// whether or not its slot was reaped yet.
fn own_context_holder(st: &State) -> Option<u32> {
    st.clients
        .iter()
        .find(|c| {
            c.used != 0
                && c.contexts > 0
                && (c.mps_server != 0 || c.mps_gen == 0)
                && procinfo::alive(c.pid, c.start_time)
        })
        .map(|c| c.pid)
}

fn info_of(st: &State) -> DeviceInfo {
    let h = &st.header;
    DeviceInfo {
        profile_id: layout::get_str(&h.profile_id),
        name: layout::get_str(&h.name),
        uuid: h.uuid,
        total_memory: h.total_memory,
        sm_count: h.sm_count,
        max_sm_clock_mhz: h.max_sm_clock_mhz,
        mem_clock_mhz: h.mem_clock_mhz,
        mem_bus_width: h.mem_bus_width,
        compute_capability: (h.cc_major, h.cc_minor),
        power_limit_mw: h.power_limit_mw,
        pci_bus: h.pci_bus,
    }
}

/// Remembers a client that died holding a context: it stays connected to its server, which
/// hangs, until `terminate_client` or `quit`.
/// Records XID `code` of process `pid` in the device's XID ring.
fn push_xid(h: &mut layout::Header, code: u64, pid: u32, now: u64) {
    let at = (h.xid_count % layout::XID_RING as u64) as usize;
    h.xids[at] = layout::XidEvent { code, pid, _pad: 0, t_ns: now };
    h.xid_count += 1;
}

fn push_dead(h: &mut layout::Header, pid: u32, uid: u32) {
    let n = (h.mps_dead_count as usize).min(layout::MAX_DEAD_MPS);
    if n < layout::MAX_DEAD_MPS {
        h.mps_dead[n] = layout::DeadMpsClient { pid, uid };
        h.mps_dead_count = n as u32 + 1;
    } else {
        // Not remembered, so never terminable: the hang lasts until `quit` (never laxer).
        h.mps_dead_overflow = 1;
    }
    h.mps_poisoned = 1;
}

/// `terminate_client` of a dead client: true if `pid` was one.
fn remove_dead(h: &mut layout::Header, pid: u32) -> bool {
    let n = (h.mps_dead_count as usize).min(layout::MAX_DEAD_MPS);
    let Some(i) = h.mps_dead[..n].iter().position(|d| d.pid == pid) else { return false };
    h.mps_dead.copy_within(i + 1..n, i);
    h.mps_dead[n - 1] = layout::DeadMpsClient::default();
    h.mps_dead_count = n as u32 - 1;
    h.mps_poisoned = u32::from(h.mps_dead_count > 0 || h.mps_dead_overflow != 0);
    true
}

fn clear_dead(h: &mut layout::Header) {
    h.mps_poisoned = 0;
    h.mps_dead_count = 0;
    h.mps_dead_overflow = 0;
    h.mps_dead = Default::default();
}

/// Client contexts on the running MPS server: those of live connected clients (slot `me`'s
/// included when it is connected already), and one for each client that died holding its
/// context (still its server's until terminated).
fn mps_contexts(st: &State) -> u32 {
    let h = &st.header;
    let live: u32 = st
        .clients
        .iter()
        .filter(|cl| {
            cl.used != 0 && cl.mps_gen == h.mps_generation && cl.mps_gen != 0 && cl.contexts > 0 && cl.terminated == 0
        })
        .map(|cl| cl.contexts)
        .fold(0, u32::saturating_add);
    live.saturating_add((h.mps_dead_count as usize).min(layout::MAX_DEAD_MPS) as u32)
}

/// One user at a time (NVIDIA's nvidia-cuda-mps-control(1): a client of a user other than the
/// running server's is queued; the server shuts down once all its clients are done and a
/// server for the queued user starts): the uid this client of `uid` waits for, if any. It
/// waits while clients of another user are connected to the running server (live with a
/// context, or dead and still connected), or while a client of another user was queued before
/// it (first come, first served, so neither side starves the other).
/// MPS stops (see [`Device::mps_quit`]): the running generation's clients lose their
/// contexts, connections asked for or handed over are void, the hang of dead clients ends.
fn quit_mps(g: &mut State) {
    if g.header.mps_enabled == 0 {
        return;
    }
    let generation = g.header.mps_generation;
    let now = g.header.last_ns;
    for c in 0..MAX_CLIENTS {
        let cl = g.clients[c];
        // A queued connection waited for a server that is gone: it queues afresh; a
        // connection asked for or handed over is to a daemon and server that are gone.
        g.clients[c].mps_wait = 0;
        if !matches!(cl.mps_conn, mps_conn::REFUSED | mps_conn::SHM_REFUSED | mps_conn::OUTSIDE) {
            g.clients[c].mps_conn = mps_conn::NONE;
            g.clients[c].mps_server_pid = 0;
        }
        if cl.used != 0 && cl.mps_gen == generation && cl.contexts > 0 {
            g.clients[c].terminated = 1;
            drop_kernels(g, c as u32, now);
        }
    }
    let h = &mut g.header;
    h.mps_enabled = 0;
    clear_dead(h);
    h.mps_control_pid = 0;
    (h.mps_sock_dev, h.mps_sock_ino) = (0, 0);
    physics::compute_shares(g);
}

/// How long a client waits for the control daemon to hand it to a ready MPS server before its
/// connection fails (a real client blocks; the bound turns a daemon that never answers, or a
/// test that turned MPS on without one, into an error instead of a hang).
pub const MPS_CONNECT_LIMIT: Duration = Duration::from_secs(30);

/// Runs `look` (an MPS connection attempt: [`Device::mps_admit`] or
/// [`Device::context_created`]) until it is neither [`EmuError::MpsUserQueued`] nor
/// [`EmuError::MpsConnecting`], as a real client's connection blocks while the control daemon
/// queues it behind another user's server and until the daemon tells it its server is ready
/// (nvidia-cuda-mps-control(1)). `note` hears the first answer of each kind of wait (the fake
/// libcuda says it on stderr). Waiting for a server longer than `limit` fails with
/// [`EmuError::MpsConnectionFailed`].
pub fn mps_wait<T>(
    limit: Duration,
    mut look: impl FnMut() -> Result<T, EmuError>,
    mut note: impl FnMut(&EmuError),
) -> Result<T, EmuError> {
    let (mut said_queued, mut said_connecting) = (false, false);
    let mut connecting_since: Option<std::time::Instant> = None;
    loop {
        match look() {
            Err(e @ EmuError::MpsUserQueued { .. }) => {
                if !std::mem::replace(&mut said_queued, true) {
                    note(&e);
                }
                connecting_since = None;
            }
            Err(e @ EmuError::MpsConnecting { .. }) => {
                if !std::mem::replace(&mut said_connecting, true) {
                    note(&e);
                }
                let since = *connecting_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > limit {
                    return Err(EmuError::MpsConnectionFailed(format!(
                        "no MPS server after {} s ({e})",
                        limit.as_secs()
                    )));
                }
            }
            r => return r,
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The live MPS server process `pid` holds its context and serves `uid`.
fn server_ready(st: &State, pid: u32, uid: u32) -> bool {
    pid != 0
        && st
            .clients
            .iter()
            .any(|s| s.used != 0 && s.pid == pid && s.mps_server != 0 && s.contexts > 0 && s.uid == uid)
}

/// Client `me`'s connection through the control daemon, as nvidia-cuda-mps-control(1) has it:
/// the driver asks the daemon for its user's server; the daemon starts one if none runs and
/// tells the client once it is ready; only then does the client connect. `Ok` once the daemon
/// has handed the client to a ready server of its user; otherwise the request is (re)filed
/// and [`EmuError::MpsConnecting`] says to look again. A refused connection, or a daemon
/// that is gone, fails ([`EmuError::MpsConnectionFailed`]).
fn mps_connection(st: &mut State, me: usize, euid: u32) -> Result<(), EmuError> {
    let cl = st.clients[me];
    match cl.mps_conn {
        mps_conn::REFUSED => {
            return Err(EmuError::MpsConnectionFailed(
                "the control daemon could not start an MPS server for this client".into(),
            ))
        }
        mps_conn::SHM_REFUSED => {
            return Err(EmuError::MpsConnectionFailed(
                "this process could not attach to its MPS server's shared memory (another /dev/shm)".into(),
            ))
        }
        mps_conn::HANDED if cl.uid == euid && server_ready(st, cl.mps_server_pid, euid) => {
            return attach_shared_memory(st, me);
        }
        _ => {}
    }
    let control_pid = st.header.mps_control_pid;
    if procinfo::start_time(control_pid).is_none() {
        return Err(EmuError::MpsConnectionFailed(format!("the MPS control daemon (pid {control_pid}) is gone")));
    }
    let cl = &mut st.clients[me];
    cl.mps_conn = mps_conn::ASKED;
    cl.uid = euid;
    cl.mps_server_pid = 0;
    Err(EmuError::MpsConnecting { control_pid })
}

/// Client `me`, handed to its ready server, attaches to the shared memory the server keeps in
/// its `/dev/shm`: it can only where its own `/dev/shm` is the same directory. Otherwise the
/// connection fails (`CUDA_ERROR_MPS_CONNECTION_FAILED`) for the process's life, as real MPS
/// fails a container given a `/dev/shm` of its own (NVIDIA's k8s device plugin mounts the MPS
/// daemon's shm directory into every client container for that reason).
fn attach_shared_memory(st: &mut State, me: usize) -> Result<(), EmuError> {
    let spid = st.clients[me].mps_server_pid;
    let Some(server) = st.clients.iter().find(|s| s.used != 0 && s.pid == spid && s.mps_server != 0) else {
        return Ok(());
    };
    let theirs = (server.shm_dev, server.shm_ino);
    let mine = dev_shm_id().unwrap_or((0, 0));
    if theirs == mine {
        return Ok(());
    }
    st.clients[me].mps_conn = mps_conn::SHM_REFUSED;
    Err(EmuError::MpsConnectionFailed(format!(
        "MPS server {spid} keeps its clients' shared memory in a /dev/shm this process does not see \
         (server: device {} inode {}, here: device {} inode {}); give the client the server's \
         /dev/shm (mps-manager's shm_dir mounted at /dev/shm)",
        theirs.0, theirs.1, mine.0, mine.1
    )))
}

/// Whether client `me` is a client of the running MPS control daemon. Decided at its first
/// look (CUDA's initialisation, or its first context for an in-process client) and kept while
/// the process lives, as real CUDA connects when it initialises: it is when the control socket
/// at its `CUDA_MPS_PIPE_DIRECTORY` (`mine`, device and inode numbers, looked up only when the
/// question is open) is the running daemon's; otherwise, or when no daemon runs then, it runs
/// without MPS ([`mps_conn::OUTSIDE`]) for its life, even once MPS starts, as
/// nvidia-cuda-mps-control(1) says of a failed connection attempt.
fn reaches_mps(st: &mut State, me: usize, mine: impl FnOnce() -> Option<(u64, u64)>) -> bool {
    let h = st.header;
    let cl = &mut st.clients[me];
    if h.mps_enabled == 0 {
        // Never connected (a client of a server since gone is terminated instead): it looked
        // for a control daemon and found none.
        if cl.mps_conn == mps_conn::NONE && cl.mps_gen == 0 {
            cl.mps_conn = mps_conn::OUTSIDE;
        }
        return false;
    }
    match cl.mps_conn {
        mps_conn::OUTSIDE => false,
        mps_conn::NONE => {
            if cl.mps_gen == h.mps_generation && cl.contexts > 0 {
                return true;
            }
            let reaches = h.mps_sock_ino != 0 && mine() == Some((h.mps_sock_dev, h.mps_sock_ino));
            if !reaches {
                cl.mps_conn = mps_conn::OUTSIDE;
            }
            reaches
        }
        _ => true,
    }
}

/// A not yet connected client `me` of uid `euid` joins MPS: queued (a ticket, kept) while
/// another user's server is active ([`EmuError::MpsUserQueued`]), then connected through the
/// control daemon ([`mps_connection`]).
fn mps_join(g: &mut State, me: usize, euid: u32) -> Result<(), EmuError> {
    if let Some(server_uid) = mps_queue_ahead(g, me, euid) {
        if g.clients[me].mps_wait == 0 {
            g.header.ticket_counter += 1;
            g.clients[me].mps_wait = g.header.ticket_counter;
            g.clients[me].uid = euid;
        }
        return Err(EmuError::MpsUserQueued { server_uid, uid: euid });
    }
    g.clients[me].mps_wait = 0;
    mps_connection(g, me, euid)
}

/// The daemon handed the client to its server and the client has not yet created its context
/// there: a client of that server all the same (the daemon lists it; another user waits).
fn handed_not_connected(h: &layout::Header, cl: &layout::ClientSlot) -> bool {
    cl.mps_conn == mps_conn::HANDED && cl.mps_gen != h.mps_generation
}

fn mps_queue_ahead(st: &State, me: usize, uid: u32) -> Option<u32> {
    let h = &st.header;
    let dead = &h.mps_dead[..(h.mps_dead_count as usize).min(layout::MAX_DEAD_MPS)];
    if let Some(d) = dead.iter().find(|d| d.uid != uid) {
        return Some(d.uid);
    }
    let mine = st.clients[me].mps_wait;
    let mut ahead = None;
    for (i, cl) in st.clients.iter().enumerate() {
        if i == me || cl.used == 0 || cl.uid == uid {
            continue;
        }
        if (cl.mps_gen == h.mps_generation && cl.mps_gen != 0 && cl.contexts > 0 && cl.terminated == 0)
            || cl.mps_conn == mps_conn::ASKED
            || handed_not_connected(h, cl)
        {
            return Some(cl.uid);
        }
        if cl.mps_wait != 0 && (mine == 0 || cl.mps_wait < mine) {
            ahead = Some(cl.uid);
        }
    }
    ahead
}

fn mps_of(st: &State) -> MpsStatus {
    let h = &st.header;
    let dead = &h.mps_dead[..(h.mps_dead_count as usize).min(layout::MAX_DEAD_MPS)];
    MpsStatus {
        enabled: h.mps_enabled != 0,
        poisoned: h.mps_poisoned != 0,
        culprit_pid: dead.first().map(|d| d.pid),
        dead_clients: dead.iter().map(|d| (d.pid, d.uid)).collect(),
        generation: h.mps_generation,
        default_active_thread_pct: h.mps_default_pct,
        control_pid: h.mps_control_pid,
        kill_teardown: h.mps_kill_teardown != 0,
        fatal_errors: h.mps_fatal_errors,
    }
}

#[cfg(test)]
mod tests;
