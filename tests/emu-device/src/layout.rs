//! The fixed binary layout of the shared state file (one per emulated GPU).
//!
//! Every field is a plain integer or float so any process can map the file; the header carries a
//! magic, a layout version and the file size, checked on open.

/// `"GPUEMU"` + layout generation; a file that does not start with it is rejected.
pub const MAGIC: u64 = u64::from_le_bytes(*b"GPUEMU\x00\x01");
/// Bumped whenever a field moves.
pub const LAYOUT_VERSION: u32 = 15;
/// Processes that can hold the device at once.
pub const MAX_CLIENTS: usize = 64;
/// Kernels queued or running (or finished but not yet collected) at once.
pub const MAX_KERNELS: usize = 1024;
/// Utilization samples kept for NVML.
pub const RING_LEN: usize = 512;
/// MPS clients that died holding a context, remembered until `terminate_client` or `quit`.
pub const MAX_DEAD_MPS: usize = 16;
/// XID events a device keeps for NVML event sets to read (older ones are lost to a reader
/// that falls this far behind, as a real event set's queue is bounded too).
pub const XID_RING: usize = 32;

/// Kernel slot states.
pub mod kstate {
    /// Slot unused.
    pub const FREE: u32 = 0;
    /// Waiting for the previous kernel of its stream.
    pub const QUEUED: u32 = 1;
    /// Holding SMs.
    pub const RUNNING: u32 = 2;
    /// Finished; `end_ns` is valid until the slot is reused.
    pub const DONE: u32 = 3;
}

/// File header: profile, memory, MPS state, time integrals.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Header {
    /// [`MAGIC`]; checked on open.
    pub magic: u64,
    /// [`LAYOUT_VERSION`] the file was written with; checked on open.
    pub version: u32,
    /// SM clock while no kernel runs, MHz (a real card drops to it within moments of going
    /// idle, and NVML then gives `nvmlClocksEventReasonGpuIdle` as the reason).
    pub idle_sm_clock_mhz: u32,
    /// Size of the whole file, bytes (`size_of::<State>()`); checked on open.
    pub file_size: u64,
    /// Profile id (`t4`, `a10`, `h100`), NUL-padded.
    pub profile_id: [u8; 16],
    /// Marketing name as the driver reports it, NUL-padded.
    pub name: [u8; 64],
    /// Random version-4 UUID drawn when the file is created.
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
    /// Compute capability, major.
    pub cc_major: u32,
    /// Compute capability, minor.
    pub cc_minor: u32,
    /// Board power limit, milliwatts.
    pub power_limit_mw: u32,
    /// PCI bus number NVML reports.
    pub pci_bus: u32,
    /// Device memory allocated over all clients, bytes.
    pub used_memory: u64,
    /// Next free device address of the bump allocator (starts at `BASE_ADDR`).
    pub next_addr: u64,
    /// `CLOCK_MONOTONIC` time the file was created, ns.
    pub created_ns: u64,
    /// Time the model was last advanced to, ns (the state's "now").
    pub last_ns: u64,
    /// Last scan for dead clients, ns (scans at most every `REAP_EVERY_NS`).
    pub last_reap_ns: u64,
    /// Time of the newest utilization sample in `ring`, ns.
    pub last_sample_ns: u64,
    /// Last ticket handed out; kernels and MPS queue positions take the next one.
    pub ticket_counter: u64,
    /// Cumulative time with at least one kernel running, ns.
    pub busy_ns: f64,
    /// Cumulative SM-weighted busy time (ns x fraction of SMs granted).
    pub sm_active_ns: f64,
    /// Current SM clock, MHz (the idle clock while no kernel runs; under load it drops from
    /// the boost clock like a real card's).
    pub sm_clock_mhz: f64,
    /// SMs wanted by running kernels right now (before MPS caps).
    pub sm_demand: f64,
    /// SMs granted right now.
    pub sm_in_use: f64,
    /// Non-zero while an MPS control daemon runs.
    pub mps_enabled: u32,
    /// Non-zero while a dead MPS client hangs the server (see `mps_dead`).
    pub mps_poisoned: u32,
    /// Incremented on every MPS start; clients record the generation they joined.
    pub mps_generation: u64,
    /// Server default active-thread percentage (100 after each start).
    pub mps_default_pct: u32,
    /// Pid of the control daemon that started MPS (0 when stopped).
    pub mps_control_pid: u32,
    /// Non-zero: a client that dies with kernels in flight makes its MPS server tear down the
    /// server's other clients with a fatal GPU error instead of hanging them (what an H200,
    /// driver 580, did in 12 of 20 kills; set at creation by `GPUEMU_MPS_KILL=teardown`).
    pub mps_kill_teardown: u32,
    /// Fatal GPU errors the MPS server handled by tearing clients down (`mps_kill_teardown`).
    pub mps_fatal_errors: u32,
    /// The compute mode (`nvidia-smi -c`, `nvmlDeviceSetComputeMode`), one of
    /// [`compute_mode`]: DEFAULT when the file is created, as a real GPU's after a reboot.
    pub compute_mode: u32,
    /// Device and inode numbers of the running control daemon's socket
    /// (`$CUDA_MPS_PIPE_DIRECTORY/control`; 0 when none): a client reaches the daemon only
    /// through that file, whatever path it names it by (a container's bind mount).
    pub mps_sock_dev: u64,
    /// See `mps_sock_dev`.
    pub mps_sock_ino: u64,
    /// GPM snapshot: the last refresh boundary (a multiple of `physics::GPM_REFRESH_NS`,
    /// `CLOCK_MONOTONIC` ns) the model has crossed; the three fields after it hold the device's
    /// counters at that instant. One snapshot for the whole device, whoever reads it, as the
    /// driver refreshes the counters GPM samples copy on its own schedule.
    pub gpm_at_ns: u64,
    /// `busy_ns` at `gpm_at_ns`.
    pub gpm_busy_ns: f64,
    /// `sm_active_ns` at `gpm_at_ns`.
    pub gpm_sm_active_ns: f64,
    /// `sm_clock_mhz` at `gpm_at_ns`.
    pub gpm_sm_clock_mhz: f64,
    /// Index in `ring` the next sample goes to.
    pub ring_head: u32,
    /// Samples held in `ring` (at most [`RING_LEN`]).
    pub ring_count: u32,
    /// Kernel slots at or past this index are all free (scans stop here).
    pub kernel_hwm: u32,
    /// Entries of `mps_dead` in use (oldest first).
    pub mps_dead_count: u32,
    /// More clients died holding a context than `mps_dead` holds: the hang lasts until `quit`.
    pub mps_dead_overflow: u32,
    /// MPS clients that died holding a context: still connected to their server (their work
    /// hangs it) until `terminate_client` names them or MPS quits.
    pub mps_dead: [DeadMpsClient; MAX_DEAD_MPS],
    /// Seqlock sequence: odd while a process holds the state's lock (it may be writing),
    /// bumped again when it lets go. Readers that take no lock copy what they need between two
    /// equal even values of it (see `Shm::optimistic`).
    pub seq: u64,
    /// Until this time (`CLOCK_MONOTONIC` ns) the model runs on unchanged from `last_ns`: no
    /// kernel starts or finishes, no dead client is due to be released; only the time
    /// integrals grow, at the rates the header holds. Set by every lock holder as it lets go
    /// (`physics::quiet_until`); readers that take no lock extrapolate up to it, and take the
    /// lock after it.
    pub quiet_until_ns: u64,
    /// XID events reported since the file was created (the next one is entry
    /// `xid_count % XID_RING` of `xids`).
    pub xid_count: u64,
    /// The last [`XID_RING`] XID events, for NVML event sets (`nvmlEventTypeXidCriticalError`).
    pub xids: [XidEvent; XID_RING],
}

/// One XID event: what the driver logs as `NVRM: Xid (PCI:...): <code>, pid=<pid>, ...` and
/// NVML event sets deliver as `nvmlEventTypeXidCriticalError` with the code as its data.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct XidEvent {
    /// The XID code.
    pub code: u64,
    /// The process it names (0: none).
    pub pid: u32,
    /// Reserved (layout padding).
    pub _pad: u32,
    /// When it was reported (`CLOCK_MONOTONIC` ns).
    pub t_ns: u64,
}

/// An MPS client that died holding a context.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct DeadMpsClient {
    /// Pid of the dead client.
    pub pid: u32,
    /// Effective uid it connected with (selects its server).
    pub uid: u32,
}

/// One process using the device.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ClientSlot {
    /// Non-zero when the slot is taken.
    pub used: u32,
    /// Pid of the process.
    pub pid: u32,
    /// Its start time (clock ticks since boot): with `pid`, names the process across pid reuse.
    pub start_time: u64,
    /// Device memory it holds, bytes.
    pub mem_used: u64,
    /// Contexts it holds.
    pub contexts: u32,
    /// Of `mem_used`, the per-process part its first context took ([`crate::profile::CONTEXT_BASE_BYTES`],
    /// or 0 when it connected to MPS, whose server holds that part): given back with its last
    /// context.
    pub ctx_base: u64,
    /// MPS active-thread percentage fixed when the client connected, for its life (0 = not
    /// connected: the server default).
    pub pct: u32,
    /// MPS server generation the client connected to (0 = not an MPS client).
    pub mps_gen: u64,
    /// Set when the MPS server the client was attached to went away or terminated it (1), or
    /// tore it down after a fatal GPU error (2: its calls then fail with
    /// `CUDA_ERROR_ILLEGAL_ADDRESS`, the sticky error an H200 gave the torn-down client).
    pub terminated: u32,
    /// Effective uid the process connected to MPS with (its server is that user's).
    pub uid: u32,
    /// SM-weighted busy time of this client's kernels (ns x fraction of SMs).
    pub sm_time_ns: f64,
    /// Queue position (a ticket, lower is earlier) of an MPS connection the control daemon
    /// holds back because another user's server is active; 0 = not queued. `uid` is the
    /// queued user.
    pub mps_wait: u64,
    /// Non-zero for an MPS server process (the emulated `nvidia-cuda-mps-server`): it holds
    /// the shared context its clients run in, and is no MPS client itself.
    pub mps_server: u32,
    /// Where the process's MPS connection through the control daemon stands, one of
    /// [`mps_conn`]: a client connects only to a server the daemon handed it to, once that
    /// server holds its context (nvidia-cuda-mps-control(1)).
    pub mps_conn: u32,
    /// Pid of the MPS server the control daemon handed this client to (with
    /// [`mps_conn::HANDED`]).
    pub mps_server_pid: u32,
    /// For an MPS server: the device and inode numbers of the `/dev/shm` it sees (its mount
    /// namespace's), where a real server keeps the shared memory its clients attach to; 0 when
    /// it has none.
    pub shm_dev: u64,
    /// See [`ClientSlot::shm_dev`].
    pub shm_ino: u64,
}

/// [`ClientSlot::mps_conn`] values.
pub mod mps_conn {
    /// No connection asked for (MPS off, or not yet initialised).
    pub const NONE: u32 = 0;
    /// The client asked the control daemon for its user's server and waits for it (`uid` is
    /// the user).
    pub const ASKED: u32 = 1;
    /// The daemon handed the client to a running server (`mps_server_pid`).
    pub const HANDED: u32 = 2;
    /// The daemon could not serve the client (its server failed to start): the connection
    /// failed, for the process's life, as a failed `cuInit` stays failed.
    pub const REFUSED: u32 = 3;
    /// The process found no control daemon at its `CUDA_MPS_PIPE_DIRECTORY`: it runs without
    /// MPS, for its life ("If the connection attempt fails, the program continues to run as
    /// it normally would without MPS", nvidia-cuda-mps-control(1)).
    pub const OUTSIDE: u32 = 4;
    /// The daemon handed the client to its server, but the client could not attach to the
    /// shared memory the server keeps in its `/dev/shm` (it sees another one): the connection
    /// failed, for the process's life, as [`REFUSED`].
    pub const SHM_REFUSED: u32 = 5;
}

/// [`Header::compute_mode`] values: `nvmlComputeMode_t` and `CUcomputemode` (NVIDIA's `nvml.h`
/// and `cuda.h` give both the same numbers).
pub mod compute_mode {
    /// Several contexts of several processes at once.
    pub const DEFAULT: u32 = 0;
    /// Compute-exclusive-thread: support removed from the driver (NVML refuses to set it).
    pub const EXCLUSIVE_THREAD: u32 = 1;
    /// No context can be created (`CUDA_ERROR_UNKNOWN`, cuda.h on `cuCtxCreate`).
    pub const PROHIBITED: u32 = 2;
    /// One context on the device, of one process, at a time ("only one CUDA context may be
    /// created on the device across all processes", CUDA programming guide); a second is
    /// refused with `CUDA_ERROR_DEVICE_UNAVAILABLE`. Under MPS the restriction applies to the
    /// server, which holds the one context its clients share, not to the clients (NVIDIA's MPS
    /// docs).
    pub const EXCLUSIVE_PROCESS: u32 = 3;

    /// The name `nvidia-smi -q` gives a mode.
    pub fn name(mode: u32) -> &'static str {
        match mode {
            DEFAULT => "Default",
            EXCLUSIVE_THREAD => "Exclusive_Thread",
            PROHIBITED => "Prohibited",
            EXCLUSIVE_PROCESS => "Exclusive_Process",
            _ => "Unknown",
        }
    }
}

/// One kernel launch.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct KernelSlot {
    /// One of the [`kstate`] values.
    pub state: u32,
    /// Index into `clients` of the launching process.
    pub client: u32,
    /// Launch order (from `ticket_counter`); also names the kernel to its owner.
    pub ticket: u64,
    /// Ticket of the previous kernel on the same stream (0 = none).
    pub dep_ticket: u64,
    /// SMs wanted: min(blocks, SM count).
    pub demand: f64,
    /// SM-cycles still to execute.
    pub work_left: f64,
    /// SM-cycles the kernel needs in all.
    pub work_total: f64,
    /// Launch time, ns.
    pub enq_ns: u64,
    /// Time it got SMs, ns (valid once running).
    pub start_ns: u64,
    /// Finish time, ns (valid once done).
    pub end_ns: u64,
    /// SMs currently granted.
    pub share: f64,
}

/// One utilization sample (cumulative integrals at `t_ns`).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq)]
pub struct Sample {
    /// Time of the sample, ns.
    pub t_ns: u64,
    /// `Header::busy_ns` at that time.
    pub busy_ns: f64,
    /// `Header::sm_active_ns` at that time.
    pub sm_active_ns: f64,
    /// SM clock at that time, MHz.
    pub sm_clock_mhz: f64,
}

/// The whole mapped file.
#[repr(C)]
pub struct State {
    /// Profile, memory, MPS state and time integrals.
    pub header: Header,
    /// Processes using the device.
    pub clients: [ClientSlot; MAX_CLIENTS],
    /// Kernel table (see `Header::kernel_hwm`).
    pub kernels: [KernelSlot; MAX_KERNELS],
    /// Utilization samples, a ring (see `Header::ring_head`).
    pub ring: [Sample; RING_LEN],
}

impl State {
    /// The kernel slots that may be in use (below the high-water mark).
    pub fn live(&self) -> &[KernelSlot] {
        &self.kernels[..(self.header.kernel_hwm as usize).min(MAX_KERNELS)]
    }

    /// Mutable [`State::live`].
    pub fn live_mut(&mut self) -> &mut [KernelSlot] {
        let n = (self.header.kernel_hwm as usize).min(MAX_KERNELS);
        &mut self.kernels[..n]
    }

    /// Lowers the high-water mark past trailing free slots.
    pub fn shrink_live(&mut self) {
        let mut n = (self.header.kernel_hwm as usize).min(MAX_KERNELS);
        while n > 0 && self.kernels[n - 1].state == kstate::FREE {
            n -= 1;
        }
        self.header.kernel_hwm = n as u32;
    }
}

/// Size of the state file in bytes.
pub const STATE_SIZE: usize = std::mem::size_of::<State>();

/// Copies `s` into a fixed NUL-padded byte field.
pub fn put_str(dst: &mut [u8], s: &str) {
    dst.fill(0);
    let n = s.len().min(dst.len() - 1);
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// Reads a NUL-padded byte field.
pub fn get_str(src: &[u8]) -> String {
    let end = src.iter().position(|&b| b == 0).unwrap_or(src.len());
    String::from_utf8_lossy(&src[..end]).into_owned()
}
