//! The fixed binary layout of the shared state file (one per emulated GPU).
//!
//! Every field is a plain integer or float so any process can map the file; the header carries a
//! magic, a layout version and the file size, checked on open.

/// `"GPUEMU"` + layout generation; a file that does not start with it is rejected.
pub const MAGIC: u64 = u64::from_le_bytes(*b"GPUEMU\x00\x01");
/// Bumped whenever a field moves.
pub const LAYOUT_VERSION: u32 = 4;
/// Processes that can hold the device at once.
pub const MAX_CLIENTS: usize = 64;
/// Kernels queued or running (or finished but not yet collected) at once.
pub const MAX_KERNELS: usize = 1024;
/// Utilization samples kept for NVML.
pub const RING_LEN: usize = 512;
/// MPS clients that died holding a context, remembered until `terminate_client` or `quit`.
pub const MAX_DEAD_MPS: usize = 16;

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
    pub magic: u64,
    pub version: u32,
    pub _pad0: u32,
    pub file_size: u64,
    pub profile_id: [u8; 16],
    pub name: [u8; 64],
    pub uuid: [u8; 16],
    pub total_memory: u64,
    pub sm_count: u32,
    pub max_sm_clock_mhz: u32,
    pub mem_clock_mhz: u32,
    pub mem_bus_width: u32,
    pub cc_major: u32,
    pub cc_minor: u32,
    pub power_limit_mw: u32,
    pub pci_bus: u32,
    pub used_memory: u64,
    pub next_addr: u64,
    pub created_ns: u64,
    pub last_ns: u64,
    pub last_reap_ns: u64,
    pub last_sample_ns: u64,
    pub ticket_counter: u64,
    pub busy_ns: f64,
    pub sm_active_ns: f64,
    pub sm_clock_mhz: f64,
    pub sm_demand: f64,
    pub sm_in_use: f64,
    pub mps_enabled: u32,
    pub mps_poisoned: u32,
    pub mps_generation: u64,
    pub mps_default_pct: u32,
    pub mps_control_pid: u32,
    pub ring_head: u32,
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
}

/// An MPS client that died holding a context.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct DeadMpsClient {
    pub pid: u32,
    /// Effective uid it connected with (selects its server).
    pub uid: u32,
}

/// One process using the device.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ClientSlot {
    pub used: u32,
    pub pid: u32,
    pub start_time: u64,
    pub mem_used: u64,
    pub contexts: u32,
    /// MPS active-thread percentage set for this client (0 = the server default).
    pub pct: u32,
    /// MPS server generation the client connected to (0 = not an MPS client).
    pub mps_gen: u64,
    /// Set when the MPS server the client was attached to went away.
    pub terminated: u32,
    /// Effective uid the process connected to MPS with (its server is that user's).
    pub uid: u32,
    /// SM-weighted busy time of this client's kernels (ns x fraction of SMs).
    pub sm_time_ns: f64,
    /// Queue position (a ticket, lower is earlier) of an MPS connection the control daemon
    /// holds back because another user's server is active; 0 = not queued. `uid` is the
    /// queued user.
    pub mps_wait: u64,
}

/// One kernel launch.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct KernelSlot {
    pub state: u32,
    pub client: u32,
    pub ticket: u64,
    /// Ticket of the previous kernel on the same stream (0 = none).
    pub dep_ticket: u64,
    /// SMs wanted: min(blocks, SM count).
    pub demand: f64,
    /// SM-cycles still to execute.
    pub work_left: f64,
    pub work_total: f64,
    pub enq_ns: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    /// SMs currently granted.
    pub share: f64,
}

/// One utilization sample (cumulative integrals at `t_ns`).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq)]
pub struct Sample {
    pub t_ns: u64,
    pub busy_ns: f64,
    pub sm_active_ns: f64,
    pub sm_clock_mhz: f64,
}

/// The whole mapped file.
#[repr(C)]
pub struct State {
    pub header: Header,
    pub clients: [ClientSlot; MAX_CLIENTS],
    pub kernels: [KernelSlot; MAX_KERNELS],
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
