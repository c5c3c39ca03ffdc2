//! Process-local driver state over the shared emulated device: contexts (per-thread stacks),
//! modules, streams, events, allocations and memory contents. Safe Rust; `api` is the C surface.

use crate::memstore::MemStore;
use crate::ptx;
use cuda_abi::{CUgraphInstantiateResult, CUgraphInstantiate_flags, CUmemAllocationHandleType, CUresult};
use emu_device::{Client, Device, EmuError, KernelStatus, Launch};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::raw::c_int;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Result of a driver operation.
pub type R<T = ()> = Result<T, CUresult>;

/// The CUDA version this fake driver emulates by default (an r575 driver, CUDA 12.9).
pub const DRIVER_VERSION: i32 = 12090;
/// The CUDA 13.0 driver (r580) the emulator can stand in for instead.
pub const DRIVER_VERSION_13: i32 = 13000;
/// Names the emulated driver's CUDA version: unset or `12090` = CUDA 12.9, `13000` = CUDA 13.0.
pub const DRIVER_VERSION_ENV: &str = "GPUEMU_CUDA_VERSION";

/// The CUDA version this fake driver is (`cuDriverGetVersion`, the newest ABI `cuGetProcAddress`
/// hands out, which 13.0-only behaviour is allowed). Any other value of `GPUEMU_CUDA_VERSION`
/// fails every call that asks (`CUDA_ERROR_INVALID_VALUE`, said once on stderr): a test meaning
/// to emulate a driver we do not model must not silently get another.
pub fn driver_version() -> R<i32> {
    static V: OnceLock<Result<i32, String>> = OnceLock::new();
    let v = V.get_or_init(|| match std::env::var(DRIVER_VERSION_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(DRIVER_VERSION),
        Ok(s) => match s.trim().parse::<i32>() {
            Ok(v @ (DRIVER_VERSION | DRIVER_VERSION_13)) => Ok(v),
            _ => Err(s),
        },
        Err(std::env::VarError::NotUnicode(s)) => Err(s.to_string_lossy().into_owned()),
    });
    match v {
        Ok(v) => Ok(*v),
        Err(s) => {
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                eprintln!("gpuemu: {DRIVER_VERSION_ENV}={s:?} is not an emulated driver (12090 or 13000)");
            }
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        }
    }
}
/// Cycles per block charged to kernels other than `spin` (whose work we cannot know).
pub const DEFAULT_CYCLES: u64 = 2_000;
/// VMM allocation granularity.
pub const GRANULARITY: u64 = 2 << 20;
/// Name of the kernel whose `u64` parameter is its cycle count.
pub const SPIN: &str = "spin";

const CU_STREAM_LEGACY: u64 = 1;
const CU_STREAM_PER_THREAD: u64 = 2;
/// `CU_STREAM_CAPTURE_MODE_RELAXED` (cuda.h): a capture any thread may end.
const CU_STREAM_CAPTURE_MODE_RELAXED: u32 = 2;
/// `CUstream_flags`: `CU_STREAM_NON_BLOCKING`.
const CU_STREAM_NON_BLOCKING: u32 = 1;

/// One GPU this process sees: the emulated device and our registration on it.
pub struct Gpu {
    /// The emulated device.
    pub dev: Device,
    /// This process's registration on it.
    pub client: Client,
    /// Its position on the emulated host (`GPUEMU_STATE`'s list): the physical GPU.
    pub phys: usize,
}

/// The initialised driver of this process: the visible GPUs (index = `CUdevice` ordinal, in
/// the order `CUDA_VISIBLE_DEVICES` lists them), and local state.
pub struct Driver {
    /// The visible GPUs, by ordinal.
    pub gpus: Vec<Gpu>,
    /// The process that called `cuInit`; a forked child may not use its driver state.
    pid: u32,
    inner: Mutex<Inner>,
}

static DRIVER: OnceLock<R<Driver>> = OnceLock::new();

thread_local! {
    static STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

#[derive(Default)]
struct Ctx {
    /// Ordinal of the device the context was created on.
    ord: usize,
    flags: u32,
    primary: bool,
    default_last: u64,
    pending: Vec<u64>,
    /// `cuCtxSetLimit` values and the device memory they hold beyond a new context's.
    limits: CtxLimits,
}

/// The `cuCtxSetLimit` limits the emulator models, and the device memory raising them
/// committed beyond what a new context holds (its 1 KiB stack per resident thread is part of
/// the context's own memory; the default heap and printf FIFO are within its per-process part).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtxLimits {
    /// `CU_LIMIT_STACK_SIZE`, bytes per thread.
    pub stack: u64,
    /// `CU_LIMIT_PRINTF_FIFO_SIZE`, bytes.
    pub printf_fifo: u64,
    /// `CU_LIMIT_MALLOC_HEAP_SIZE`, bytes.
    pub malloc_heap: u64,
    /// Device memory committed for the limits above their defaults.
    pub committed: u64,
}

/// A new context's per-thread stack (CUDA C Programming Guide: 1 KiB), printf FIFO (1 MiB)
/// and device malloc heap (8 MiB).
pub const DEFAULT_STACK: u64 = 1024;
/// See [`DEFAULT_STACK`].
pub const DEFAULT_PRINTF_FIFO: u64 = 1 << 20;
/// See [`DEFAULT_STACK`].
pub const DEFAULT_MALLOC_HEAP: u64 = 8 << 20;
/// Local memory a thread may have: 512 KiB on every compute capability since 2.0 (CUDA C
/// Programming Guide, "Technical Specifications per Compute Capability"). A larger stack is
/// refused here (a real driver may clamp it instead: the stricter answer).
pub const MAX_STACK: u64 = 512 << 10;

impl Default for CtxLimits {
    fn default() -> Self {
        Self { stack: DEFAULT_STACK, printf_fifo: DEFAULT_PRINTF_FIFO, malloc_heap: DEFAULT_MALLOC_HEAP, committed: 0 }
    }
}

impl CtxLimits {
    /// Device memory these limits hold beyond a new context's, with `threads` resident
    /// threads on the device (the driver reserves the stack for every one of them).
    pub fn extra_bytes(&self, threads: u64) -> u64 {
        self.stack.saturating_sub(DEFAULT_STACK).saturating_mul(threads)
            .saturating_add(self.printf_fifo.saturating_sub(DEFAULT_PRINTF_FIFO))
            .saturating_add(self.malloc_heap.saturating_sub(DEFAULT_MALLOC_HEAP))
    }
}

struct Stream {
    ctx: u64,
    /// Created without `CU_STREAM_NON_BLOCKING`: synchronises with the legacy default stream
    /// (so its capture makes the legacy stream unusable).
    blocking: bool,
    last: u64,
    /// The capture in progress on this stream (`cuStreamBeginCapture`), if any.
    capture: Option<Capture>,
}

/// A stream capture in progress: the graph its work is recorded into instead of run.
#[derive(Clone, Copy, Debug)]
struct Capture {
    graph: u64,
    /// `CUstreamCaptureMode` (0 global, 1 thread-local, 2 relaxed).
    mode: u32,
    /// The thread that began it (thread-local mode restricts that thread only).
    thread: std::thread::ThreadId,
    /// A prohibited call invalidated it: `cuStreamEndCapture` fails.
    invalidated: bool,
    /// The capture made its graph (`cuStreamBeginCapture`), which goes when the capture fails;
    /// false: the caller's (`cuStreamBeginCaptureToGraph`), which stays the caller's.
    owned: bool,
}

#[derive(Clone, Copy)]
enum Mark {
    Ticket(u64),
    Time(u64),
}

struct Alloc {
    size: u64,
    /// What the device was charged for it: `size`, or with `GPUEMU_INJECT=alloc-granule-2m`
    /// (a driver backing allocations with whole 2 MiB pages) `size` rounded up to 2 MiB.
    charged: u64,
    ctx: u64,
    ord: usize,
    /// The memory pool of a stream-ordered allocation (its bytes go back there when freed).
    pool: Option<u64>,
}

/// A VMM handle (`cuMemCreate`, or `cuMemImportFromShareableHandle`): its physical
/// allocation lives on while it is referenced or mapped.
struct Phys {
    /// The physical allocation ([`Inner::vmm_allocs`]) it names.
    alloc: u64,
    /// References to the handle: its `cuMemCreate` (or import) and each
    /// `cuMemRetainAllocationHandle`, less each `cuMemRelease`.
    refs: u32,
    maps: u32,
}

/// The physical memory of a `cuMemCreate`, named by one handle or more (imports). cuda.h
/// (`cuMemExportToShareableHandle`): "Once all shareable handles are closed and the allocation
/// is released, the allocated memory referenced will be released back to the OS".
struct VmmAlloc {
    ord: usize,
    size: u64,
    /// `CUmemAllocationProp::requestedHandleTypes` of its `cuMemCreate`.
    types: u32,
    /// Live handle records ([`Phys`]) naming it.
    handles: u32,
    /// Each exported socket pair whose caller's end is still open (in any process:
    /// [`watch_exported`]): the emulator's end, and (st_dev, st_ino) of the caller's. It lives
    /// while one is.
    exported: Vec<(c_int, (u64, u64))>,
}

struct Mapping {
    size: u64,
    handle: u64,
}

#[derive(Default)]
struct Inner {
    next: u64,
    ctxs: HashMap<u64, Ctx>,
    /// Per ordinal: the primary context, its retain count and flags.
    primary: HashMap<usize, Primary>,
    modules: HashMap<u64, (u64, Vec<ptx::Entry>)>,
    funcs: HashMap<u64, (u64, ptx::Entry)>,
    /// Per function: what the execution-control API of CUDA 2.0 set on it
    /// (`cuFuncSetBlockShape`, `cuFuncSetSharedSize`, `cuParamSet*`), read by `cuLaunch*Grid*`.
    legacy: HashMap<u64, LegacyLaunch>,
    streams: HashMap<u64, Stream>,
    events: HashMap<u64, Option<Mark>>,
    allocs: BTreeMap<u64, Alloc>,
    phys: HashMap<u64, Phys>,
    vmm_allocs: HashMap<u64, VmmAlloc>,
    reservations: BTreeMap<u64, u64>,
    mappings: BTreeMap<u64, Mapping>,
    arrays: HashMap<u64, (usize, u64)>,
    /// Stream-ordered memory pools ([`crate::pools`]).
    pools: crate::pools::Pools,
    /// Kernel nodes of each graph, (node handle, node), in the order added.
    graphs: HashMap<u64, Vec<(u64, GraphNode)>>,
    /// Kernel nodes of each exec: (handle of the graph node it was instantiated from, the
    /// node as the exec runs it: `cuGraphExecKernelNodeSetParams` / `cuGraphExecUpdate` change it).
    execs: HashMap<u64, Vec<(u64, GraphNode)>>,
    /// Memory nodes' handles: node -> (graph, `CUgraphNodeType` value); stale once the graph is gone.
    mem_nodes: HashMap<u64, (u64, u32)>,
    /// Memory nodes of each graph (and of each instantiation: exec -> (graph, nodes)).
    graph_mem: HashMap<u64, Vec<MemNode>>,
    exec_mem: HashMap<u64, (u64, Vec<MemNode>)>,
    /// Execs instantiated with `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`.
    exec_auto_free: HashSet<u64>,
    /// Per ordinal: the graph memory pool (CUDA keeps physical memory reserved for graphs
    /// across launches until `cuDeviceGraphMemTrim`).
    graph_pools: HashMap<usize, GraphPool>,
    /// Graph allocations alive after their graph's launch (not freed in the graph): address ->
    /// (ordinal, size); freed with cuMemFree/cuMemFreeAsync back into the pool.
    graph_live: BTreeMap<u64, (usize, u64)>,
    mem: MemStore,
    /// Captures on per-thread default streams: (thread, context) -> its capture.
    pt_captures: HashMap<(std::thread::ThreadId, u64), Capture>,
}

/// A graph memory node.
#[derive(Clone, Copy, Debug)]
enum MemNode {
    /// `cuGraphAddMemAllocNode`: `size` bytes at the fixed address `addr` on ordinal `ord`.
    Alloc { addr: u64, size: u64, ord: usize },
    /// `cuGraphAddMemFreeNode` of `addr`.
    Free { addr: u64 },
}

/// One device's graph memory pool in this process.
#[derive(Default, Clone, Copy, Debug)]
struct GraphPool {
    /// Physical memory held for graphs (committed on the device).
    reserved: u64,
    /// Of which in use by allocations (during a launch, or alive after it).
    used: u64,
    reserved_high: u64,
    used_high: u64,
}

#[derive(Default)]
struct Primary {
    ctx: Option<u64>,
    refs: u32,
    flags: u32,
}

/// A kernel node of a graph, with its launch parameters captured when it was added.
#[derive(Clone, Copy)]
pub struct GraphNode {
    /// Function handle (from `cuModuleGetFunction`).
    pub f: u64,
    /// Grid size in blocks, x/y/z.
    pub grid: [u32; 3],
    /// Block size in threads, x/y/z.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes.
    pub shared_mem: u32,
    /// Cycles per block of a `spin` kernel (its parameter); `None` runs [`DEFAULT_CYCLES`].
    pub cycles: Option<u64>,
}

impl Inner {
    fn handle(&mut self) -> u64 {
        self.next += 1;
        0x1000 + self.next * 0x100
    }
}

fn dev_err(e: EmuError) -> CUresult {
    e.to_curesult()
}

/// The initialised driver, or why not.
pub fn drv() -> R<&'static Driver> {
    match DRIVER.get() {
        None => Err(CUresult::CUDA_ERROR_NOT_INITIALIZED),
        Some(Ok(d)) if d.pid == std::process::id() => Ok(d),
        // Like a real driver, a forked child inherits no usable CUDA state.
        Some(Ok(_)) => Err(CUresult::CUDA_ERROR_NOT_INITIALIZED),
        Some(Err(e)) => Err(*e),
    }
}

extern "C" fn release_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(Ok(d)) = DRIVER.get().filter(|d| matches!(d, Ok(d) if d.pid == std::process::id())) {
            for g in &d.gpus {
                g.dev.detach(&g.client);
            }
        }
    });
}

/// Bits of a kernel ticket above the device's own counter: the ordinal it was launched on.
const TICKET_ORD_SHIFT: u32 = 56;
/// Bits of a device address above the device's own: the physical GPU (each emulated device
/// hands out addresses from the same base; a process seeing several must never get one twice).
const ADDR_PHYS_SHIFT: u32 = 48;

/// The GPUs `CUDA_VISIBLE_DEVICES` makes visible, as positions in the host's list of `n`
/// (whose UUIDs are `uuids`), in ordinal order. As the real driver does (CUDA C Programming
/// Guide, "CUDA Environment Variables"; MPS docs, "CUDA_VISIBLE_DEVICES"): unset = every GPU in
/// host order; entries are indices or UUIDs (`GPU-...`, a unique prefix is enough), separated
/// by commas; the first invalid entry (unknown index or UUID, an ambiguous prefix, a GPU named
/// twice, `-1`, anything else) ends the list, and only the entries before it are visible.
pub fn visible_devices(env: Option<&str>, uuids: &[String]) -> Vec<usize> {
    let Some(env) = env else { return (0..uuids.len()).collect() };
    let mut out = Vec::new();
    for item in env.split(',') {
        let item = item.trim();
        let found = if item.starts_with("GPU-") {
            let m: Vec<usize> = (0..uuids.len()).filter(|&i| uuids[i].starts_with(item)).collect();
            (m.len() == 1).then(|| m[0])
        } else if !item.is_empty() && item.bytes().all(|b| b.is_ascii_digit()) {
            item.parse::<usize>().ok().filter(|&i| i < uuids.len())
        } else {
            None
        };
        match found {
            Some(i) if !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

/// `cuInit`: opens the devices named by `GPUEMU_STATE` that `CUDA_VISIBLE_DEVICES` makes
/// visible and registers this process on each (none visible: `CUDA_ERROR_NO_DEVICE`).
pub fn init(flags: u32) -> R {
    if flags != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let r = DRIVER.get_or_init(|| {
        let open = Device::open_all_from_env().and_then(|devs| {
            let uuids: Vec<String> = devs.iter().map(|d| uuid_text(&d.info().uuid)).collect();
            let visible = visible_devices(std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(), &uuids);
            let mut devs: Vec<Option<Device>> = devs.into_iter().map(Some).collect();
            let mut gpus = Vec::new();
            for phys in visible {
                let dev = devs[phys].take().expect("visible_devices names each GPU once");
                let client = dev.attach()?;
                gpus.push(Gpu { dev, client, phys });
            }
            Ok(gpus)
        });
        match open {
            Ok(gpus) if gpus.is_empty() => Err(CUresult::CUDA_ERROR_NO_DEVICE),
            Ok(gpus) => {
                // SAFETY: registering a plain extern "C" fn with no captured state.
                unsafe { libc::atexit(release_at_exit) };
                Ok(Driver { gpus, pid: std::process::id(), inner: Mutex::new(Inner::default()) })
            }
            Err(e) => {
                eprintln!("gpuemu libcuda: no emulated GPU: {e}");
                Err(CUresult::CUDA_ERROR_NO_DEVICE)
            }
        }
    });
    let d = r.as_ref().map_err(|e| *e)?;
    if d.pid != std::process::id() {
        // A forked child: no usable CUDA state (drv() says so), nothing to connect.
        return Ok(());
    }
    // The MPS connection is attempted when CUDA is initialised: queued (blocking) while another
    // user's server is active.
    for g in &d.gpus {
        mps_wait_turn(|| g.dev.mps_admit(&g.client))?;
        if g.dev.runs_outside_mps(&g.client) {
            // Real CUDA says nothing; a client silently outside MPS is what the emulator's
            // users would otherwise have to find out.
            eprintln!(
                "gpuemu libcuda: pid {}: no MPS control daemon at {}: this process runs without MPS",
                std::process::id(),
                emu_device::mps_pipe_dir_from_env().display()
            );
        }
    }
    Ok(())
}

/// An MPS connection attempt as a real client makes it: blocks while the control daemon
/// queues it or has not yet handed it to its server ([`emu_device::mps_wait`]); each kind of
/// wait is said once on stderr (a silent hang is what the emulator's users would otherwise
/// see), and so is a failed connection.
fn mps_wait_turn(look: impl FnMut() -> Result<(), EmuError>) -> R {
    let pid = std::process::id();
    emu_device::mps_wait(emu_device::MPS_CONNECT_LIMIT, look, |e| {
        if matches!(e, EmuError::MpsUserQueued { .. }) {
            eprintln!("gpuemu libcuda: pid {pid}: {e}");
        }
    })
    .map_err(|e| {
        if matches!(e, EmuError::MpsConnectionFailed(_)) {
            eprintln!("gpuemu libcuda: pid {pid}: {e}");
        }
        dev_err(e)
    })
}

impl Driver {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The MPS gate of the GPU at ordinal `ord`.
    fn gate_on(&self, ord: usize) -> R {
        let g = &self.gpus[ord];
        g.dev.gate(&g.client).map_err(dev_err)
    }

    /// The MPS gate of the calling thread's current context's GPU.
    fn gate(&self) -> R {
        self.gate_on(current_ord()?)
    }

    /// The GPU at ordinal `ord` (valid: ordinals are only ever checked ones).
    fn gpu(&self, ord: usize) -> &Gpu {
        &self.gpus[ord]
    }

    /// A kernel ticket's status (the ticket names its GPU).
    fn kernel_status(&self, t: u64) -> KernelStatus {
        let (ord, t) = split_ticket(t);
        match self.gpus.get(ord) {
            Some(g) => g.dev.kernel_status(t),
            None => KernelStatus::Gone,
        }
    }

    fn collect(&self, t: u64) {
        let (ord, t) = split_ticket(t);
        if let Some(g) = self.gpus.get(ord) {
            g.dev.collect(t);
        }
    }
}

fn split_ticket(t: u64) -> (usize, u64) {
    ((t >> TICKET_ORD_SHIFT) as usize, t & ((1 << TICKET_ORD_SHIFT) - 1))
}

/// NVML's / nvidia-smi's text of a UUID (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
pub fn uuid_text(b: &[u8; 16]) -> String {
    let mut s = String::from("GPU-");
    for (i, x) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// `CUDA_ERROR_INVALID_DEVICE` unless `dev` is a visible device's ordinal.
pub fn check_device(dev: i32) -> R {
    gpu(dev).map(|_| ())
}

/// The visible GPU at ordinal `dev`.
pub fn gpu(dev: i32) -> R<&'static Gpu> {
    let d = drv()?;
    usize::try_from(dev).ok().and_then(|i| d.gpus.get(i)).ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
}

/// Number of visible GPUs.
pub fn device_count() -> R<usize> {
    Ok(drv()?.gpus.len())
}

/// The ordinal of the current context's device.
pub fn current_ord() -> R<usize> {
    let d = drv()?;
    let c = current_raw().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    d.lock().ctxs.get(&c).map(|c| c.ord).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)
}

/// The ordinal of context `ctx`'s device.
pub fn ctx_ord(ctx: u64) -> R<usize> {
    drv()?.lock().ctxs.get(&ctx).map(|c| c.ord).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)
}

// ---- contexts ----

fn current_raw() -> Option<u64> {
    STACK.with(|s| s.borrow().last().copied())
}

/// The current context, validated.
pub fn current() -> R<u64> {
    let d = drv()?;
    let c = current_raw().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    if d.lock().ctxs.contains_key(&c) { Ok(c) } else { Err(CUresult::CUDA_ERROR_INVALID_CONTEXT) }
}

fn env_pct() -> Option<u32> {
    let v = std::env::var("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").ok()?;
    let p: f64 = v.trim().parse().ok()?;
    Some(emu_device::whole_pct(p))
}

fn new_ctx(d: &Driver, ord: usize, flags: u32, primary: bool) -> R<u64> {
    let gp = d.gpu(ord);
    mps_wait_turn(|| gp.dev.context_created(&gp.client, env_pct()))?;
    let mut g = d.lock();
    let h = g.handle();
    g.ctxs.insert(h, Ctx { ord, flags, primary, ..Default::default() });
    Ok(h)
}

/// `cuCtxCreate`: a new context, pushed on this thread's stack.
pub fn ctx_create(flags: u32, dev: i32) -> R<u64> {
    check_device(dev)?;
    let d = drv()?;
    let h = new_ctx(d, dev as usize, flags, false)?;
    STACK.with(|s| s.borrow_mut().push(h));
    Ok(h)
}

fn destroy_ctx(d: &Driver, g: &mut Inner, ctx: u64) {
    let Some(c) = g.ctxs.remove(&ctx) else { return };
    let freed: Vec<(u64, u64, u64)> = g.allocs.iter().filter(|(_, a)| a.ctx == ctx).map(|(k, a)| (*k, a.size, a.charged)).collect();
    let gp = d.gpu(c.ord);
    gp.dev.free(&gp.client, c.limits.committed);
    for (addr, size, charged) in freed {
        g.allocs.remove(&addr);
        g.mem.discard(addr, size);
        gp.dev.free(&gp.client, charged);
    }
    // Captures in progress on the context's streams (its per-thread default streams included)
    // end with it, their graphs with them.
    let dead: Vec<u64> = g
        .streams
        .values()
        .filter(|s| s.ctx == ctx)
        .filter_map(|s| s.capture.filter(|c| c.owned).map(|c| c.graph))
        .chain(g.pt_captures.iter().filter(|((_, c), cap)| *c == ctx && cap.owned).map(|(_, cap)| cap.graph))
        .collect();
    g.pt_captures.retain(|(_, c), _| *c != ctx);
    for graph in dead {
        g.graphs.remove(&graph);
        g.graph_mem.remove(&graph);
    }
    g.streams.retain(|_, s| s.ctx != ctx);
    let mods: Vec<u64> = g.modules.iter().filter(|(_, m)| m.0 == ctx).map(|(k, _)| *k).collect();
    for m in mods {
        g.modules.remove(&m);
        g.funcs.retain(|_, f| f.0 != m);
    }
    for t in c.pending {
        d.collect(t);
    }
    if let Some(p) = g.primary.get_mut(&c.ord).filter(|p| p.ctx == Some(ctx)) {
        p.ctx = None;
        p.refs = 0;
    }
    STACK.with(|s| s.borrow_mut().retain(|&x| x != ctx));
    gp.dev.context_destroyed(&gp.client);
}

/// `cuCtxDestroy`: releases the context and everything allocated in it.
pub fn ctx_destroy(ctx: u64) -> R {
    let d = drv()?;
    let mut g = d.lock();
    match g.ctxs.get(&ctx) {
        None => return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT),
        // The primary context is released with cuDevicePrimaryCtxRelease, never destroyed.
        Some(c) if c.primary => return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT),
        Some(_) => {}
    }
    destroy_ctx(d, &mut g, ctx);
    Ok(())
}

/// `cuCtxPushCurrent`.
pub fn ctx_push(ctx: u64) -> R {
    let d = drv()?;
    if !d.lock().ctxs.contains_key(&ctx) {
        return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    STACK.with(|s| s.borrow_mut().push(ctx));
    Ok(())
}

/// `cuCtxPopCurrent`: the popped context.
pub fn ctx_pop() -> R<u64> {
    drv()?;
    STACK.with(|s| s.borrow_mut().pop()).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)
}

/// `cuCtxSetCurrent`: replaces the top of this thread's stack (null pops it).
pub fn ctx_set_current(ctx: u64) -> R {
    let d = drv()?;
    if ctx == 0 {
        STACK.with(|s| s.borrow_mut().pop());
        return Ok(());
    }
    if !d.lock().ctxs.contains_key(&ctx) {
        return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        s.pop();
        s.push(ctx);
    });
    Ok(())
}

/// `cuCtxGetCurrent`: the top of this thread's stack, 0 if none.
pub fn ctx_get_current() -> R<u64> {
    drv()?;
    Ok(current_raw().unwrap_or(0))
}

/// `cuCtxGetFlags` of the current context.
pub fn ctx_flags() -> R<u32> {
    let c = current()?;
    Ok(drv()?.lock().ctxs.get(&c).map_or(0, |c| c.flags))
}

/// Threads device `ord` holds resident (SMs x threads per SM): the stack is reserved for each.
fn resident_threads(d: &Driver, ord: usize) -> u64 {
    let info = d.gpu(ord).dev.info();
    u64::from(info.sm_count) * u64::from(emu_device::profile::max_threads_per_sm(info.compute_capability))
}

/// `cuCtxSetLimit` on the current context. As cuda.h documents it:
/// - `CU_LIMIT_STACK_SIZE` "will take effect immediately": the driver reserves the stack for
///   every resident thread, so raising it commits `(stack - 1 KiB) x threads` of device memory
///   (refused with `CUDA_ERROR_OUT_OF_MEMORY` when it does not fit, the limit unchanged);
/// - `CU_LIMIT_PRINTF_FIFO_SIZE` and `CU_LIMIT_MALLOC_HEAP_SIZE` commit their size beyond the
///   default at once (the stricter reading: a real driver may map the heap at the first launch
///   that uses it, and refuses a change after such a launch, which the emulator cannot see);
/// - `CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH` "is only applicable to devices of compute capability
///   < 9.0" (`CUDA_ERROR_UNSUPPORTED_LIMIT` from 9.0 on); it and
///   `CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT` "require the driver to reserve large amounts of
///   device memory", an amount NVIDIA does not state: the emulator does not model them and
///   refuses them (`CUDA_ERROR_NOT_SUPPORTED`), as it does the L2 hints;
/// - `CU_LIMIT_SHMEM_SIZE` and `CU_LIMIT_CIG_ENABLED` "can only be queried, cannot be set"
///   (`CUDA_ERROR_INVALID_VALUE`).
pub fn ctx_set_limit(limit: u32, value: u64) -> R {
    use cuda_abi::CUlimit as L;
    let d = drv()?;
    let ctx = current()?;
    let ord = ctx_ord(ctx)?;
    let cc = d.gpu(ord).dev.info().compute_capability;
    let mut g = d.lock();
    let old = g.ctxs.get(&ctx).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?.limits;
    let mut new = old;
    match limit {
        x if x == L::CU_LIMIT_STACK_SIZE.0 => {
            if value > MAX_STACK {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            new.stack = value;
        }
        x if x == L::CU_LIMIT_PRINTF_FIFO_SIZE.0 => new.printf_fifo = value,
        x if x == L::CU_LIMIT_MALLOC_HEAP_SIZE.0 => new.malloc_heap = value,
        x if x == L::CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH.0 && cc.0 >= 9 => return Err(CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT),
        x if x == L::CU_LIMIT_SHMEM_SIZE.0 || x == L::CU_LIMIT_CIG_ENABLED.0 => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        x if x < L::CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED.0 + 1 => return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED),
        _ => return Err(CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT),
    }
    let want = new.extra_bytes(resident_threads(d, ord));
    let gp = d.gpu(ord);
    if want > old.committed {
        gp.dev.commit(&gp.client, want - old.committed).map_err(dev_err)?;
    } else {
        gp.dev.free(&gp.client, old.committed - want);
    }
    new.committed = want;
    if let Some(c) = g.ctxs.get_mut(&ctx) {
        c.limits = new;
    }
    Ok(())
}

/// `cuCtxGetLimit` of the current context (the limits [`ctx_set_limit`] models, the
/// device-runtime defaults "two levels of grids" and "2048 launches", `CU_LIMIT_CIG_ENABLED` 0:
/// no emulated context is a CIG context; the others `CUDA_ERROR_UNSUPPORTED_LIMIT`).
pub fn ctx_get_limit(limit: u32) -> R<u64> {
    use cuda_abi::CUlimit as L;
    let d = drv()?;
    let ctx = current()?;
    let ord = ctx_ord(ctx)?;
    let cc = d.gpu(ord).dev.info().compute_capability;
    let l = d.lock().ctxs.get(&ctx).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?.limits;
    Ok(match limit {
        x if x == L::CU_LIMIT_STACK_SIZE.0 => l.stack,
        x if x == L::CU_LIMIT_PRINTF_FIFO_SIZE.0 => l.printf_fifo,
        x if x == L::CU_LIMIT_MALLOC_HEAP_SIZE.0 => l.malloc_heap,
        x if x == L::CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH.0 && cc.0 < 9 => 2,
        x if x == L::CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT.0 => 2048,
        x if x == L::CU_LIMIT_CIG_ENABLED.0 => 0,
        _ => return Err(CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT),
    })
}

/// `cuCtxGetApiVersion` (3020 for every context).
pub fn ctx_api_version(ctx: u64) -> R<u32> {
    let d = drv()?;
    let c = if ctx == 0 { current()? } else { ctx };
    if d.lock().ctxs.contains_key(&c) { Ok(3020) } else { Err(CUresult::CUDA_ERROR_INVALID_CONTEXT) }
}

/// `cuDevicePrimaryCtxRetain`: creates the device's primary context on first retain.
pub fn primary_retain(dev: i32) -> R<u64> {
    check_device(dev)?;
    let ord = dev as usize;
    let d = drv()?;
    let existing = d.lock().primary.get(&ord).and_then(|p| p.ctx);
    let h = match existing {
        Some(h) => h,
        None => {
            let flags = d.lock().primary.get(&ord).map_or(0, |p| p.flags);
            let h = new_ctx(d, ord, flags, true)?;
            let mut g = d.lock();
            let p = g.primary.entry(ord).or_default();
            match p.ctx {
                Some(other) => {
                    // Another thread won the race: keep its context.
                    g.ctxs.remove(&h);
                    drop(g);
                    let gp = d.gpu(ord);
                    gp.dev.context_destroyed(&gp.client);
                    other
                }
                None => {
                    p.ctx = Some(h);
                    h
                }
            }
        }
    };
    d.lock().primary.entry(ord).or_default().refs += 1;
    Ok(h)
}

/// `cuDevicePrimaryCtxRelease`: destroys it when the last reference goes. A release after a
/// reset (the context already destroyed, its retains still counted) only drops a retain.
pub fn primary_release(dev: i32) -> R {
    check_device(dev)?;
    let d = drv()?;
    let mut g = d.lock();
    let p = g.primary.entry(dev as usize).or_default();
    if p.refs == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    p.refs -= 1;
    if let (0, Some(h)) = (p.refs, p.ctx) {
        destroy_ctx(d, &mut g, h);
    }
    Ok(())
}

/// `cuDevicePrimaryCtxReset`: destroys its allocations and state whatever the count, but
/// "Resetting the primary context does not release it, an application that has retained the
/// primary context should explicitly release its usage" (CUDA driver API): the retains stay
/// counted, and the next retain makes it anew.
pub fn primary_reset(dev: i32) -> R {
    check_device(dev)?;
    let d = drv()?;
    let mut g = d.lock();
    if let Some((h, refs)) = g.primary.get(&(dev as usize)).and_then(|p| Some((p.ctx?, p.refs))) {
        destroy_ctx(d, &mut g, h);
        if let Some(p) = g.primary.get_mut(&(dev as usize)) {
            p.refs = refs;
        }
    }
    Ok(())
}

/// `cuDevicePrimaryCtxSetFlags`.
pub fn primary_set_flags(dev: i32, flags: u32) -> R {
    check_device(dev)?;
    let d = drv()?;
    let mut g = d.lock();
    let p = g.primary.entry(dev as usize).or_default();
    p.flags = flags;
    if let Some(h) = p.ctx {
        if let Some(c) = g.ctxs.get_mut(&h) {
            c.flags = flags;
        }
    }
    Ok(())
}

/// `cuDevicePrimaryCtxGetState`: (flags, active).
pub fn primary_state(dev: i32) -> R<(u32, bool)> {
    check_device(dev)?;
    let g = drv()?.lock();
    Ok(g.primary.get(&(dev as usize)).map_or((0, false), |p| (p.flags, p.ctx.is_some())))
}

// ---- streams, kernels, events ----

#[derive(Clone, Copy)]
enum StreamRef {
    Default(u64),
    Stream(u64),
}

fn stream_ref(g: &Inner, ctx: u64, h: u64) -> R<StreamRef> {
    if h == 0 || h == CU_STREAM_LEGACY {
        legacy_usable(g, ctx)?;
        return Ok(StreamRef::Default(ctx));
    }
    if h == CU_STREAM_PER_THREAD {
        return Ok(StreamRef::Default(ctx));
    }
    // A stream belongs to the context it was created in: another context's stream is an
    // invalid handle for a kernel launch, a synchronize or a query there (the CUDA programming
    // guide: "A kernel launch will fail if it is issued to a stream that is not associated to
    // the current device"); stream-ordered allocations and frees take any context's stream
    // ([`stream_ctx`]).
    match g.streams.get(&h) {
        Some(s) if s.ctx == ctx => Ok(StreamRef::Stream(h)),
        _ => Err(CUresult::CUDA_ERROR_INVALID_HANDLE),
    }
}

/// The legacy default stream of context `ctx` is unusable while a blocking stream of it
/// captures, the per-thread default stream included, until that capture ends (cuda.h,
/// `cuStreamIsCapturing`: "When a blocking stream is capturing, the legacy stream is in an
/// unusable state until the blocking stream capture is terminated"):
/// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`.
fn legacy_usable(g: &Inner, ctx: u64) -> R {
    let blocked = g.streams.values().any(|s| s.ctx == ctx && s.blocking && s.capture.is_some())
        || g.pt_captures.keys().any(|(_, c)| *c == ctx);
    if blocked { Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) } else { Ok(()) }
}

/// A stream a stream-ordered allocation or free may name: any context's ([`stream_ctx`]), the
/// legacy default stream only while it is usable (`legacy_usable`).
pub fn check_stream_ordered(h: u64) -> R {
    let ctx = stream_ctx(h)?;
    if h == 0 || h == CU_STREAM_LEGACY {
        legacy_usable(&drv()?.lock(), ctx)?;
    }
    Ok(())
}

/// A synchronous call on stream `h` (a `_ptds` copy or memset on the per-thread default
/// stream): refused, and the capture invalidated, while `h` captures.
pub fn sync_call_on(h: u64) -> R {
    capture_forbids(Forbid::OnStream(h))
}

fn last_of(g: &Inner, s: StreamRef) -> u64 {
    match s {
        StreamRef::Default(c) => g.ctxs.get(&c).map_or(0, |c| c.default_last),
        StreamRef::Stream(h) => g.streams.get(&h).map_or(0, |s| s.last),
    }
}

fn set_last(g: &mut Inner, s: StreamRef, t: u64) {
    match s {
        StreamRef::Default(c) => {
            if let Some(c) = g.ctxs.get_mut(&c) {
                c.default_last = t;
            }
        }
        StreamRef::Stream(h) => {
            if let Some(s) = g.streams.get_mut(&h) {
                s.last = t;
            }
        }
    }
}

/// `cuStreamCreate` in the current context.
pub fn stream_create(flags: u32) -> R<u64> {
    let ctx = current()?;
    let d = drv()?;
    let mut g = d.lock();
    let h = g.handle();
    g.streams.insert(h, Stream { ctx, blocking: flags & CU_STREAM_NON_BLOCKING == 0, last: 0, capture: None });
    Ok(h)
}

/// The context a stream belongs to (`cuStreamGetCtx`, `cuStreamGetDevice`, and the calls that
/// name a stream of any context): a created stream's own context, whichever is current; the
/// default-stream handles (null, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`) name the current
/// context's. A destroyed stream, or one of a destroyed context, is an invalid handle.
pub fn stream_ctx(h: u64) -> R<u64> {
    if h == 0 || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD {
        return current();
    }
    let g = drv()?.lock();
    match g.streams.get(&h) {
        Some(s) if g.ctxs.contains_key(&s.ctx) => Ok(s.ctx),
        _ => Err(CUresult::CUDA_ERROR_INVALID_HANDLE),
    }
}

/// The device ordinal of stream `h` ([`stream_ctx`]'s context's device).
pub fn stream_ord(h: u64) -> R<usize> {
    ctx_ord(stream_ctx(h)?)
}

/// `cuStreamDestroy` (queued work still completes).
pub fn stream_destroy(h: u64) -> R {
    let d = drv()?;
    let mut g = d.lock();
    g.streams.remove(&h).map(|_| ()).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

/// What a launch needs to know about a function.
pub struct FuncInfo {
    /// The function is the emulator's `spin` kernel (its parameter sets the work).
    pub is_spin: bool,
    /// Parameters the PTX `.entry` declares.
    pub params: usize,
}

/// Looks a function handle up.
pub fn func_info(f: u64) -> R<FuncInfo> {
    let g = drv()?.lock();
    let (_, e) = g.funcs.get(&f).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    Ok(FuncInfo { is_spin: e.name == SPIN, params: e.params })
}

/// `cuFuncGetAttribute` (fixed, plausible values).
pub fn func_attribute(f: u64, attrib: u32) -> R<i32> {
    func_info(f)?;
    Ok(match attrib {
        0 => 1024, // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
        4 => 16,   // CU_FUNC_ATTRIBUTE_NUM_REGS
        5 => 75,   // CU_FUNC_ATTRIBUTE_PTX_VERSION
        6 => 75,   // CU_FUNC_ATTRIBUTE_BINARY_VERSION
        _ if attrib <= 10 => 0,
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    })
}

/// Largest parameter block of the CUDA 2.0 execution-control API (`cuParamSetSize`), bytes:
/// the 4 KiB kernel-parameter limit (stricter than drivers that take more).
pub const LEGACY_PARAM_MAX: usize = 4096;

/// A function's launch state set through the CUDA 2.0 execution-control API.
#[derive(Clone, Default)]
pub struct LegacyLaunch {
    /// `cuFuncSetBlockShape` (none: a `cuLaunch*` is refused, cuda.h: "must be set ... prior").
    pub block: Option<[u32; 3]>,
    /// `cuFuncSetSharedSize`.
    pub shared_mem: u32,
    /// `cuParamSetSize` (none: never set).
    pub param_size: Option<usize>,
    /// Bytes written by `cuParamSet{i,f,v}`, at their offsets.
    pub params: Vec<u8>,
}

/// Changes function `f`'s CUDA 2.0 launch state (`cuFuncSetBlockShape`, `cuParamSet*`): the
/// function must exist (`CUDA_ERROR_INVALID_HANDLE`) and a context be current.
pub fn legacy_update(f: u64, change: impl FnOnce(&mut LegacyLaunch) -> R) -> R {
    current()?;
    let mut g = drv()?.lock();
    if !g.funcs.contains_key(&f) {
        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    let mut state = g.legacy.get(&f).cloned().unwrap_or_default();
    change(&mut state)?;
    g.legacy.insert(f, state);
    Ok(())
}

/// Function `f`'s CUDA 2.0 launch state (default when nothing was set).
pub fn legacy_state(f: u64) -> R<LegacyLaunch> {
    let g = drv()?.lock();
    if !g.funcs.contains_key(&f) {
        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    Ok(g.legacy.get(&f).cloned().unwrap_or_default())
}

/// A launch through `cuLaunchKernel` (and the later APIs) "invalidates the function's block
/// shape, dynamic shared memory size, and parameter information" (cuda.h, `cuLaunch`): a
/// `cuLaunch*` after it without setting them again is refused (the driver's behaviour is
/// undefined).
pub fn legacy_forget(f: u64) {
    if let Ok(d) = drv() {
        d.lock().legacy.remove(&f);
    }
}

/// The context function `f` belongs to (its module's).
pub fn func_ctx(f: u64) -> R<u64> {
    let g = drv()?.lock();
    g.funcs.get(&f).and_then(|(m, _)| g.modules.get(m)).map(|(c, _)| *c).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

/// A validated launch request.
pub struct LaunchReq {
    /// Function handle (from `cuModuleGetFunction`); must belong to the current context.
    pub f: u64,
    /// Grid size in blocks, x/y/z (none may be 0).
    pub grid: [u32; 3],
    /// Block size in threads, x/y/z (at most 1024 threads, z at most 64).
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes (at most 48 KiB).
    pub shared_mem: u32,
    /// Stream handle (0 = the context's default stream).
    pub stream: u64,
    /// Cycles per block of a `spin` kernel (its parameter); `None` runs [`DEFAULT_CYCLES`].
    pub cycles: Option<u64>,
    /// `cuLaunchCooperativeKernel`: refused when the grid exceeds 16 blocks per SM.
    pub cooperative: bool,
}

/// `cuLaunchKernel` and friends: enqueue on the stream (asynchronous).
pub fn launch(req: LaunchReq) -> R {
    let d = drv()?;
    let ctx = current()?;
    if req.grid.contains(&0) || req.block.contains(&0) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let threads: u64 = req.block.iter().map(|&b| u64::from(b)).product();
    if threads > 1024 || req.block[2] > 64 || req.shared_mem > 48 * 1024 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let blocks: u64 = req.grid.iter().map(|&g| u64::from(g)).product();
    let ord = ctx_ord(ctx)?;
    let gp = d.gpu(ord);
    if req.cooperative && blocks > u64::from(gp.dev.info().sm_count) * 16 {
        return Err(CUresult::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
    }
    let (sref, after) = {
        let g = d.lock();
        // A function belongs to its module's context (cuModuleLoad is per context): launching
        // it in another context (another device's, say) is an invalid handle.
        let owner = g.funcs.get(&req.f).and_then(|(m, _)| g.modules.get(m)).map(|(c, _)| *c);
        if owner != Some(ctx) {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        let s = stream_ref(&g, ctx, req.stream)?;
        if let Some(c) = capture_of(&g, req.stream) {
            // Captured, not run: a kernel node of the capture's graph.
            drop(g);
            let node = GraphNode { f: req.f, grid: req.grid, block: req.block, shared_mem: req.shared_mem, cycles: req.cycles };
            return graph_add_kernel(c.graph, node).map(|_| ());
        }
        (s, last_of(&g, s))
    };
    let l = Launch { blocks, cycles_per_block: req.cycles.unwrap_or(DEFAULT_CYCLES), after };
    let t = gp.dev.launch(&gp.client, Launch { after: split_ticket(l.after).1, ..l }).map_err(dev_err)?;
    let t = t | ((ord as u64) << TICKET_ORD_SHIFT);
    let mut g = d.lock();
    set_last(&mut g, sref, t);
    let stale = if let Some(c) = g.ctxs.get_mut(&ctx) {
        c.pending.push(t);
        c.pending.len() > 256
    } else {
        false
    };
    if stale {
        collect_pending(d, &mut g, ctx);
    }
    Ok(())
}

fn pinned(g: &Inner) -> HashSet<u64> {
    g.events.values().filter_map(|m| if let Some(Mark::Ticket(t)) = m { Some(*t) } else { None }).collect()
}

fn collect_pending(d: &Driver, g: &mut Inner, ctx: u64) {
    let keep = pinned(g);
    let lasts: HashSet<u64> = g.streams.values().map(|s| s.last).chain(g.ctxs.values().map(|c| c.default_last)).collect();
    let Some(c) = g.ctxs.get_mut(&ctx) else { return };
    c.pending.retain(|&t| match d.kernel_status(t) {
        KernelStatus::Pending => true,
        KernelStatus::Gone => false,
        KernelStatus::Done { .. } => {
            if keep.contains(&t) || lasts.contains(&t) {
                return true;
            }
            d.collect(t);
            false
        }
    });
}

fn wait_ticket(d: &Driver, t: u64) -> R<u64> {
    if t == 0 {
        d.gate()?;
        return Ok(emu_device::now_ns());
    }
    let (ord, t) = split_ticket(t);
    let gp = d.gpus.get(ord).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    gp.dev.wait(&gp.client, t).map_err(dev_err)
}

/// The driver and the ticket of the last kernel queued on stream `h` of the current context.
fn last_on_stream(h: u64) -> R<(&'static Driver, u64)> {
    let d = drv()?;
    let ctx = current()?;
    let g = d.lock();
    let s = stream_ref(&g, ctx, h)?;
    Ok((d, last_of(&g, s)))
}

/// `cuStreamSynchronize`: waits for the stream's last kernel (emulated completion). On a
/// capturing stream it is prohibited ("potentially unsafe"): refused, and the capture is
/// invalidated.
pub fn stream_sync(h: u64) -> R {
    capture_forbids(Forbid::OnStream(h))?;
    let d = stream_wait(h)?;
    pools_after_sync(d);
    Ok(())
}

/// Waits for the stream's last kernel, without what a synchronize call does besides (an async
/// copy's wait is no `cuStreamSynchronize`: pools keep their reserve).
fn stream_wait(h: u64) -> R<&'static Driver> {
    let (d, last) = last_on_stream(h)?;
    wait_ticket(d, last)?;
    Ok(d)
}

/// `CUDA_SUCCESS` if the stream is idle, `CUDA_ERROR_NOT_READY` otherwise.
pub fn stream_query(h: u64) -> R {
    let (d, last) = last_on_stream(h)?;
    d.gate()?;
    match d.kernel_status(last) {
        KernelStatus::Pending => Err(CUresult::CUDA_ERROR_NOT_READY),
        _ => Ok(()),
    }
}

/// Waits for everything queued in the current context.
pub fn ctx_sync() -> R {
    ctx_sync_of(0)
}

/// `cuCtxSynchronize_v2` (CUDA 13.0): waits for everything queued in `ctx` (0: the current one).
pub fn ctx_sync_of(ctx: u64) -> R {
    capture_forbids(Forbid::Everything)?;
    ctx_wait(ctx)?;
    pools_after_sync(drv()?);
    Ok(())
}

/// Waits for everything queued in `ctx` (0: the current one), without what a synchronize call
/// does besides (a synchronous copy's wait: pools keep their reserve).
fn ctx_wait(ctx: u64) -> R {
    let d = drv()?;
    let ctx = if ctx == 0 { current()? } else { ctx };
    if !d.lock().ctxs.contains_key(&ctx) {
        return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    let lasts: Vec<u64> = {
        let g = d.lock();
        let mut v: Vec<u64> = g.streams.values().filter(|s| s.ctx == ctx).map(|s| s.last).collect();
        v.push(g.ctxs.get(&ctx).map_or(0, |c| c.default_last));
        v
    };
    d.gate()?;
    for t in lasts.into_iter().filter(|&t| t != 0) {
        wait_ticket(d, t)?;
    }
    let mut g = d.lock();
    collect_pending(d, &mut g, ctx);
    Ok(())
}

// ---- stream capture ----

/// The calling thread's per-thread default stream in its current context, when `h` names it
/// (`CU_STREAM_PER_THREAD`; the API layer passes a `_ptsz` entry's null stream as that).
fn per_thread_key(h: u64) -> Option<(std::thread::ThreadId, u64)> {
    if h != CU_STREAM_PER_THREAD {
        return None;
    }
    current_raw().map(|c| (std::thread::current().id(), c))
}

/// The capture in progress on stream `h`, if any (the legacy default stream never captures;
/// the per-thread one can).
fn capture_of(g: &Inner, h: u64) -> Option<Capture> {
    match per_thread_key(h) {
        Some(k) => g.pt_captures.get(&k).copied(),
        None => g.streams.get(&h).and_then(|s| s.capture),
    }
}

/// What a call may collide with: the captures [`capture_forbids`] checks.
#[derive(Clone, Copy)]
enum Forbid {
    /// A call on this stream (a synchronize, a copy the emulator does not capture).
    OnStream(u64),
    /// A "potentially unsafe API call" (a synchronous allocation): prohibited by captures in
    /// global mode (any thread) and thread-local mode (the capturing thread).
    Unsafe,
    /// A synchronize of every stream (`cuCtxSynchronize`): it would wait on the capturing ones.
    Everything,
}

/// Refuses a call a capture prohibits, invalidating the captures it breaks (cuda.h,
/// `cuStreamBeginCapture`: in global mode "potentially unsafe API calls" are prohibited in every
/// thread, in thread-local mode in the capturing thread, in relaxed mode never; a synchronize
/// of a capturing stream is never legal). `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`.
fn capture_forbids(call: Forbid) -> R {
    let d = drv()?;
    let me = std::thread::current().id();
    let on_pt = match call {
        Forbid::OnStream(x) => per_thread_key(x),
        _ => None,
    };
    let mut g = d.lock();
    let mut refused = false;
    let hits = |c: &Capture, on_this: bool| match call {
        Forbid::OnStream(_) => on_this,
        Forbid::Unsafe => c.mode == 0 || (c.mode == 1 && c.thread == me),
        Forbid::Everything => true,
    };
    for (h, s) in g.streams.iter_mut() {
        let Some(c) = s.capture.as_mut() else { continue };
        if hits(c, matches!(call, Forbid::OnStream(x) if x == *h)) {
            c.invalidated = true;
            refused = true;
        }
    }
    for (k, c) in g.pt_captures.iter_mut() {
        if hits(c, on_pt == Some(*k)) {
            c.invalidated = true;
            refused = true;
        }
    }
    if refused { Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) } else { Ok(()) }
}

/// `cuStreamBeginCapture_v2`: work queued on stream `h` is recorded into a new graph from now
/// on. The legacy default stream is refused (cuda.h: "Capture may not be initiated if `stream`
/// is CU_STREAM_LEGACY"; the null stream of a plain entry is the legacy one), as is a stream
/// already capturing. The per-thread default stream (`CU_STREAM_PER_THREAD`, or a `_ptsz`
/// entry's null stream) captures, one capture per thread and context.
pub fn capture_begin(h: u64, mode: u32) -> R {
    capture_begin_into(h, mode, None)
}

/// `cuStreamBeginCaptureToGraph` (CUDA 12.3): as [`capture_begin`], the work recorded into the
/// caller's existing `graph` (which must exist: else `CUDA_ERROR_INVALID_VALUE`), which stays
/// the caller's however the capture ends (the emulator's graphs keep no edges: the
/// dependencies given are not checked).
pub fn capture_begin_to_graph(h: u64, graph: u64, mode: u32) -> R {
    if !drv()?.lock().graphs.contains_key(&graph) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    capture_begin_into(h, mode, Some(graph))
}

fn capture_begin_into(h: u64, mode: u32, into: Option<u64>) -> R {
    let ctx = current()?;
    if mode > 2 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if h == 0 || h == CU_STREAM_LEGACY {
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    let me = std::thread::current().id();
    let owned = into.is_none();
    let graph = match into {
        Some(g) => g,
        None => graph_create()?,
    };
    let d = drv()?;
    let mut g = d.lock();
    let drop_made = |g: &mut Inner| {
        if owned {
            g.graphs.remove(&graph);
        }
    };
    let cap = Capture { graph, mode, thread: me, invalidated: false, owned };
    if h == CU_STREAM_PER_THREAD {
        if g.pt_captures.contains_key(&(me, ctx)) {
            drop_made(&mut g);
            return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
        }
        g.pt_captures.insert((me, ctx), cap);
        return Ok(());
    }
    let busy = match g.streams.get(&h) {
        Some(s) if s.ctx == ctx => s.capture.is_some(),
        _ => {
            drop_made(&mut g);
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
    };
    if busy {
        drop_made(&mut g);
        return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
    }
    if let Some(s) = g.streams.get_mut(&h) {
        s.capture = Some(cap);
    }
    Ok(())
}

/// `cuStreamEndCapture`: the graph of the capture on `h` (the caller owns it). A capture a
/// prohibited call invalidated ends with `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`, its graph
/// gone; a stream not capturing is `CUDA_ERROR_ILLEGAL_STATE`; a capture not begun in relaxed
/// mode, ended from another thread than the one that began it, is refused with
/// `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD` and goes on (cuda.h, `cuStreamBeginCapture`: "If
/// mode is not CU_STREAM_CAPTURE_MODE_RELAXED, cuStreamEndCapture must be called on this
/// stream from the same thread").
pub fn capture_end(h: u64) -> R<u64> {
    let ctx = current()?;
    let d = drv()?;
    let mut g = d.lock();
    let c = if h == CU_STREAM_PER_THREAD {
        g.pt_captures.remove(&(std::thread::current().id(), ctx)).ok_or(CUresult::CUDA_ERROR_ILLEGAL_STATE)?
    } else {
        match g.streams.get_mut(&h) {
            Some(s) if s.ctx == ctx => {
                let c = s.capture.ok_or(CUresult::CUDA_ERROR_ILLEGAL_STATE)?;
                if c.mode != CU_STREAM_CAPTURE_MODE_RELAXED && c.thread != std::thread::current().id() {
                    return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
                }
                s.capture = None;
                c
            }
            _ => return Err(CUresult::CUDA_ERROR_INVALID_HANDLE),
        }
    };
    if c.invalidated {
        drop(g);
        if c.owned {
            let _ = graph_destroy(c.graph);
        }
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }
    Ok(c.graph)
}

/// `cuStreamIsCapturing` / `cuStreamGetCaptureInfo_v2`: (status, capture id, graph) of stream
/// `h` (status `CU_STREAM_CAPTURE_STATUS_NONE` 0, `ACTIVE` 1, `INVALIDATED` 2; id and graph 0
/// when none). The capture id is its graph's handle (unique while it runs).
pub fn capture_info(h: u64) -> R<(u32, u64, u64)> {
    let ctx = current()?;
    let g = drv()?.lock();
    stream_ref(&g, ctx, h)?;
    Ok(match capture_of(&g, h) {
        None => (0, 0, 0),
        Some(c) if c.invalidated => (2, c.graph, c.graph),
        Some(c) => (1, c.graph, c.graph),
    })
}

/// The graph stream `h` is capturing into, if it is (work on it is recorded, not run).
pub fn capturing_into(h: u64) -> R<Option<u64>> {
    Ok(capture_of(&drv()?.lock(), h).map(|c| c.graph))
}

/// The device ordinal a stream-ordered allocation on `stream` from `pool` uses: the pool's
/// device, else the stream's ("the allocation comes from the memory pool current to the
/// stream's device", cuda.h, `cuMemAllocAsync`).
pub fn async_alloc_ord(pool: Option<u64>, stream: u64) -> R<usize> {
    match pool {
        Some(p) => drv()?.lock().pools.ord_of(p),
        None => stream_ord(stream),
    }
}

/// `cuEventCreate`.
pub fn event_create(_flags: u32) -> R<u64> {
    current()?;
    let d = drv()?;
    let mut g = d.lock();
    let h = g.handle();
    g.events.insert(h, None);
    Ok(h)
}

/// `cuEventDestroy`.
pub fn event_destroy(h: u64) -> R {
    let mut g = drv()?.lock();
    g.events.remove(&h).map(|_| ()).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

/// `cuEventRecord`: completes when the stream's current last kernel does.
pub fn event_record(ev: u64, stream: u64) -> R {
    let d = drv()?;
    let ctx = current()?;
    d.gate()?;
    let mut g = d.lock();
    if !g.events.contains_key(&ev) {
        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    let s = stream_ref(&g, ctx, stream)?;
    let last = last_of(&g, s);
    let mark = match d.kernel_status(last) {
        KernelStatus::Pending => Mark::Ticket(last),
        KernelStatus::Done { end_ns, .. } => Mark::Time(end_ns.max(emu_device::now_ns())),
        KernelStatus::Gone => Mark::Time(emu_device::now_ns()),
    };
    g.events.insert(ev, Some(mark));
    Ok(())
}

/// Resolves an event to its time if it has completed (`Ok(None)` if still pending).
fn event_time(d: &Driver, ev: u64, block: bool) -> R<Option<u64>> {
    let mark = {
        let g = d.lock();
        g.events.get(&ev).copied().ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?
    };
    let t = match mark {
        None => return Ok(Some(0)),
        Some(Mark::Time(t)) => t,
        Some(Mark::Ticket(k)) => {
            let end = match d.kernel_status(k) {
                KernelStatus::Done { end_ns, .. } => end_ns,
                KernelStatus::Gone => emu_device::now_ns(),
                KernelStatus::Pending if block => wait_ticket(d, k)?,
                KernelStatus::Pending => return Ok(None),
            };
            d.lock().events.insert(ev, Some(Mark::Time(end)));
            end
        }
    };
    Ok(Some(t))
}

/// `cuEventSynchronize`.
pub fn event_sync(ev: u64) -> R {
    let d = drv()?;
    event_time(d, ev, true)?;
    pools_after_sync(d);
    Ok(())
}

/// `cuEventQuery`: `CUDA_ERROR_NOT_READY` while pending.
pub fn event_query(ev: u64) -> R {
    let d = drv()?;
    match event_time(d, ev, false)? {
        Some(_) => Ok(()),
        None => Err(CUresult::CUDA_ERROR_NOT_READY),
    }
}

/// Milliseconds between two completed events.
pub fn event_elapsed(start: u64, end: u64) -> R<f32> {
    let d = drv()?;
    let recorded = |e: u64| -> R<bool> {
        let g = d.lock();
        Ok(g.events.get(&e).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?.is_some())
    };
    if !recorded(start)? || !recorded(end)? {
        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    let a = event_time(d, start, false)?.ok_or(CUresult::CUDA_ERROR_NOT_READY)?;
    let b = event_time(d, end, false)?.ok_or(CUresult::CUDA_ERROR_NOT_READY)?;
    Ok(((b as f64 - a as f64) / 1e6) as f32)
}

/// `cuStreamWaitEvent`, simplified: the host waits for the event.
pub fn stream_wait_event(stream: u64, ev: u64) -> R {
    let d = drv()?;
    let ctx = current()?;
    stream_ref(&d.lock(), ctx, stream)?;
    event_time(d, ev, true)?;
    Ok(())
}

// ---- graphs (kernel nodes only, run in the order they were added) ----

/// `cuGraphCreate`.
pub fn graph_create() -> R<u64> {
    current()?;
    let mut g = drv()?.lock();
    let h = g.handle();
    g.graphs.insert(h, Vec::new());
    Ok(h)
}

/// `cuGraphAddKernelNode`: appends a kernel node; returns the node handle.
pub fn graph_add_kernel(graph: u64, node: GraphNode) -> R<u64> {
    let mut g = drv()?.lock();
    if !g.funcs.contains_key(&node.f) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let h = g.handle();
    g.graphs.get_mut(&graph).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?.push((h, node));
    Ok(h)
}

/// `cuGraphGetNodes`: `graph`'s node handles (kernel nodes, then memory nodes, each in the
/// order added); `CUDA_ERROR_INVALID_VALUE` for an unknown graph.
pub fn graph_nodes(graph: u64) -> R<Vec<u64>> {
    let g = drv()?.lock();
    let kernels = g.graphs.get(&graph).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let mut mem: Vec<u64> = g.mem_nodes.iter().filter(|(_, (gr, _))| *gr == graph).map(|(n, _)| *n).collect();
    mem.sort_unstable();
    Ok(kernels.iter().map(|(n, _)| *n).chain(mem).collect())
}

/// The kernel node `node` of a live graph, if it is one.
fn kernel_node_of(g: &Inner, node: u64) -> Option<GraphNode> {
    g.graphs.values().flatten().find(|(n, _)| *n == node).map(|(_, k)| *k)
}

/// `cuGraphNodeGetType`: the `CUgraphNodeType` value of `node` (kernel, memory allocation or
/// memory free: the emulator's node types); `CUDA_ERROR_INVALID_VALUE` for a node of no live graph.
pub fn graph_node_type(node: u64) -> R<u32> {
    let g = drv()?.lock();
    if kernel_node_of(&g, node).is_some() {
        return Ok(cuda_abi::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL.0);
    }
    match g.mem_nodes.get(&node) {
        Some((graph, ty)) if g.graphs.contains_key(graph) => Ok(*ty),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuGraphKernelNodeGetParams[_v2]`: the parameters of kernel node `node` in its graph (never
/// changed by an exec's updates); `CUDA_ERROR_INVALID_VALUE` for anything else.
pub fn graph_kernel_node(node: u64) -> R<GraphNode> {
    kernel_node_of(&drv()?.lock(), node).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// `cuGraphExecKernelNodeSetParams[_v2]`: kernel node `node` (of the graph `exec` was
/// instantiated from, still in it) runs as `new` in `exec`'s later launches; the graph node is
/// unchanged. `CUDA_ERROR_INVALID_VALUE` for an unknown exec, a node not of its graph, or one
/// removed with its graph (stricter than cuda.h, which only says it must not have been removed).
pub fn graph_exec_kernel_set(exec: u64, node: u64, new: GraphNode) -> R {
    let mut g = drv()?.lock();
    if kernel_node_of(&g, node).is_none() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let nodes = g.execs.get_mut(&exec).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let slot = nodes.iter_mut().find(|(n, _)| *n == node).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    slot.1 = new;
    Ok(())
}

/// Why [`graph_exec_update`] refused: the call's result, the `CUgraphExecUpdateResult`, the
/// node of the new graph it refused (0: none).
pub type UpdateRefusal = (CUresult, cuda_abi::CUgraphExecUpdateResult, u64);

/// `cuGraphExecUpdate[_v2]`: `exec`'s kernel nodes take the parameters of `graph`'s, paired in
/// order (the emulator's graphs are chains); the exec keeps its node handles (those of the graph
/// it was instantiated from). Refused as cuda.h says: unknown handles (`CUDA_ERROR_INVALID_VALUE`,
/// `CU_GRAPH_EXEC_UPDATE_ERROR`), another node count (`CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE`,
/// `TOPOLOGY_CHANGED`, no error node); memory nodes on either side are refused
/// (`NOT_SUPPORTED`: stricter than a driver, which pairs them when unchanged).
pub fn graph_exec_update(exec: u64, graph: u64) -> Result<(), UpdateRefusal> {
    use cuda_abi::CUgraphExecUpdateResult as U;
    let invalid = (CUresult::CUDA_ERROR_INVALID_VALUE, U::CU_GRAPH_EXEC_UPDATE_ERROR, 0);
    let failed = |why, node| (CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, why, node);
    let mut g = drv().map_err(|e| (e, U::CU_GRAPH_EXEC_UPDATE_ERROR, 0))?.lock();
    let new = g.graphs.get(&graph).ok_or(invalid)?.clone();
    let old = g.execs.get(&exec).ok_or(invalid)?;
    if g.exec_mem.contains_key(&exec) || g.mem_nodes.values().any(|(gr, _)| *gr == graph) {
        return Err(failed(U::CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED, 0));
    }
    if old.len() != new.len() {
        return Err(failed(U::CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, 0));
    }
    let updated = old.iter().zip(&new).map(|((h, _), (_, k))| (*h, *k)).collect();
    g.execs.insert(exec, updated);
    Ok(())
}

/// `CUDA_GRAPH_INSTANTIATE_FLAG_*` (cuda.h `CUgraphInstantiate_flags`).
const FLAG_AUTO_FREE: u64 = CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH.0 as u64;
const FLAG_UPLOAD: u64 = CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD.0 as u64;
const FLAG_DEVICE_LAUNCH: u64 = CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH.0 as u64;
const FLAG_NODE_PRIORITY: u64 = CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY.0 as u64;

/// `cuGraphInstantiateWithFlags` (`with_params` false) / `cuGraphInstantiateWithParams`: a
/// snapshot of the graph's nodes. Refused as cuda.h documents, with the reason
/// `cuGraphInstantiateWithParams` reports in `result_out`: unknown flag bits,
/// `FLAG_UPLOAD` outside `cuGraphInstantiateWithParams`, `FLAG_AUTO_FREE_ON_LAUNCH` with
/// `FLAG_DEVICE_LAUNCH`, a device-launch graph that is empty or holds memory nodes (only
/// kernel, memcpy, memset and child-graph nodes may be launched from the device), a second
/// instantiation of a graph with memory nodes. The upload itself is the caller's
/// ([`graph_upload`]).
pub fn graph_instantiate(graph: u64, flags: u64, with_params: bool) -> Result<u64, (CUresult, CUgraphInstantiateResult)> {
    let err = |r| (CUresult::CUDA_ERROR_INVALID_VALUE, r);
    let invalid = err(CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_ERROR);
    let known = FLAG_AUTO_FREE | FLAG_DEVICE_LAUNCH | FLAG_NODE_PRIORITY | if with_params { FLAG_UPLOAD } else { 0 };
    if flags & !known != 0 || (flags & FLAG_AUTO_FREE != 0 && flags & FLAG_DEVICE_LAUNCH != 0) {
        return Err(invalid);
    }
    let mut g = drv().map_err(|e| (e, CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_ERROR))?.lock();
    let nodes = g.graphs.get(&graph).ok_or(invalid)?.clone();
    let mem = g.graph_mem.get(&graph).cloned().unwrap_or_default();
    if flags & FLAG_DEVICE_LAUNCH != 0 {
        if !mem.is_empty() {
            return Err(err(CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED));
        }
        if nodes.is_empty() {
            return Err(err(CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE));
        }
    }
    // A graph with memory nodes may have one instantiation at a time (cuGraphAddMemAllocNode).
    if !mem.is_empty() && g.exec_mem.values().any(|(gr, _)| *gr == graph) {
        return Err(invalid);
    }
    let h = g.handle();
    g.execs.insert(h, nodes);
    if !mem.is_empty() {
        g.exec_mem.insert(h, (graph, mem));
    }
    if flags & FLAG_AUTO_FREE != 0 {
        g.exec_auto_free.insert(h);
    }
    Ok(h)
}

/// `cuGraphUpload` (and `FLAG_UPLOAD`): maps the graph memory `exec` needs ahead of its launch:
/// the device's graph pool grows (committing device memory) to hold the exec's allocations;
/// over the device's memory: `CUDA_ERROR_OUT_OF_MEMORY`, nothing mapped.
pub fn graph_upload(exec: u64) -> R {
    let d = drv()?;
    let mut g = d.lock();
    if !g.execs.contains_key(&exec) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let Some((_, nodes)) = g.exec_mem.get(&exec).cloned() else { return Ok(()) };
    let mut need: HashMap<usize, u64> = HashMap::new();
    for n in &nodes {
        if let MemNode::Alloc { addr, size, ord } = *n {
            if !g.graph_live.contains_key(&addr) {
                *need.entry(ord).or_default() += size;
            }
        }
    }
    grow_pools(d, &mut g, &need)
}

/// Grows each ordinal's graph pool until its unused part covers `need` bytes (all or nothing).
fn grow_pools(d: &Driver, g: &mut Inner, need: &HashMap<usize, u64>) -> R {
    let mut grown: Vec<(usize, u64)> = Vec::new();
    for (&ord, &bytes) in need {
        let pool = g.graph_pools.entry(ord).or_default();
        let short = bytes.saturating_sub(pool.reserved - pool.used);
        if short > 0 {
            let gp = d.gpu(ord);
            if let Err(e) = gp.dev.commit(&gp.client, short) {
                for (o, b) in grown {
                    let gp = d.gpu(o);
                    gp.dev.free(&gp.client, b);
                    g.graph_pools.entry(o).or_default().reserved -= b;
                }
                return Err(dev_err(e));
            }
            let pool = g.graph_pools.entry(ord).or_default();
            pool.reserved += short;
            pool.reserved_high = pool.reserved_high.max(pool.reserved);
            grown.push((ord, short));
        }
    }
    Ok(())
}

/// `cuGraphLaunch`: enqueues every node on `stream`, in order.
pub fn graph_launch(exec: u64, stream: u64) -> R {
    let d = drv()?;
    let nodes = d.lock().execs.get(&exec).cloned().ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    graph_mem_launch(d, exec)?;
    for (_, n) in nodes {
        launch(LaunchReq { f: n.f, grid: n.grid, block: n.block, shared_mem: n.shared_mem, stream, cycles: n.cycles, cooperative: false })?;
    }
    Ok(())
}

/// `cuGraphExecDestroy`.
pub fn graph_exec_destroy(exec: u64) -> R {
    let mut g = drv()?.lock();
    g.exec_mem.remove(&exec);
    g.exec_auto_free.remove(&exec);
    g.execs.remove(&exec).map(|_| ()).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// `cuGraphDestroy`.
pub fn graph_destroy(graph: u64) -> R {
    let mut g = drv()?.lock();
    g.graph_mem.remove(&graph);
    g.graphs.remove(&graph).map(|_| ()).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

// ---- graph memory nodes ----

/// `cuGraphAddMemAllocNode`: a node allocating `size` bytes on ordinal `ord`; returns (node,
/// address). The address is fixed now, for the graph's lifetime; physical memory is mapped
/// from the device's graph pool when the graph is launched.
pub fn graph_add_mem_alloc(graph: u64, size: u64, ord: i32) -> R<(u64, u64)> {
    check_device(ord).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if size == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let d = drv()?;
    let ord = ord as usize;
    let mut g = d.lock();
    if !g.graphs.contains_key(&graph) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let gp = d.gpu(ord);
    let addr = gp.dev.reserve_address(size, 512).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)? | ((gp.phys as u64) << ADDR_PHYS_SHIFT);
    g.graph_mem.entry(graph).or_default().push(MemNode::Alloc { addr, size, ord });
    let node = g.handle();
    g.mem_nodes.insert(node, (graph, cuda_abi::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC.0));
    Ok((node, addr))
}

/// `cuGraphAddMemFreeNode`: frees an allocation of the same graph, once
/// (`CUDA_ERROR_INVALID_VALUE` otherwise; freeing another graph's allocation is not emulated).
pub fn graph_add_mem_free(graph: u64, addr: u64) -> R<u64> {
    let d = drv()?;
    let mut g = d.lock();
    if !g.graphs.contains_key(&graph) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let nodes = g.graph_mem.entry(graph).or_default();
    let allocated = nodes.iter().any(|n| matches!(n, MemNode::Alloc { addr: a, .. } if *a == addr));
    let freed = nodes.iter().any(|n| matches!(n, MemNode::Free { addr: a } if *a == addr));
    if !allocated || freed {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    nodes.push(MemNode::Free { addr });
    let node = g.handle();
    g.mem_nodes.insert(node, (graph, cuda_abi::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE.0));
    Ok(node)
}

/// Maps the graph memory an exec needs before its launch: each alloc node's bytes come from the
/// device's graph pool, which grows (committing device memory) only when what it holds unused
/// does not cover them; over the device's memory: `CUDA_ERROR_OUT_OF_MEMORY`, nothing launched.
/// Allocations freed in the graph go back to the pool after the launch; the others stay alive
/// (as allocations the application frees with cuMemFree / cuMemFreeAsync).
fn graph_mem_launch(d: &Driver, exec: u64) -> R {
    let mut g = d.lock();
    let Some((_, nodes)) = g.exec_mem.get(&exec).cloned() else { return Ok(()) };
    let mut need: HashMap<usize, u64> = HashMap::new();
    let auto_free = g.exec_auto_free.contains(&exec);
    for n in &nodes {
        if let MemNode::Alloc { addr, size, ord } = *n {
            // An allocation still alive from the previous launch: the real driver refuses
            // to launch over it, unless the exec frees it itself (AUTO_FREE_ON_LAUNCH).
            if g.graph_live.contains_key(&addr) {
                if !auto_free {
                    return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                }
                graph_mem_free(&mut g, addr);
            }
            *need.entry(ord).or_default() += size;
        }
    }
    grow_pools(d, &mut g, &need)?;
    for (&ord, &bytes) in &need {
        let pool = g.graph_pools.entry(ord).or_default();
        pool.used += bytes;
        pool.used_high = pool.used_high.max(pool.used);
    }
    for n in &nodes {
        if let MemNode::Alloc { addr, size, ord } = *n {
            let freed = nodes.iter().any(|f| matches!(f, MemNode::Free { addr: a } if *a == addr));
            if freed {
                g.graph_pools.entry(ord).or_default().used -= size;
            } else {
                g.graph_live.insert(addr, (ord, size));
            }
        }
    }
    Ok(())
}

/// A cuMemFree / cuMemFreeAsync of a live graph allocation: back into its pool.
fn graph_mem_free(g: &mut Inner, addr: u64) -> bool {
    let Some((ord, size)) = g.graph_live.remove(&addr) else { return false };
    g.mem.discard(addr, size);
    let pool = g.graph_pools.entry(ord).or_default();
    pool.used = pool.used.saturating_sub(size);
    true
}

/// `cuDeviceGraphMemTrim`: gives the pool's unused physical memory back to the device.
pub fn graph_mem_trim(dev: i32) -> R {
    check_device(dev)?;
    let d = drv()?;
    let mut g = d.lock();
    let pool = g.graph_pools.entry(dev as usize).or_default();
    let spare = pool.reserved - pool.used;
    pool.reserved -= spare;
    if spare > 0 {
        let gp = d.gpu(dev as usize);
        gp.dev.free(&gp.client, spare);
    }
    Ok(())
}

/// `cuDeviceGetGraphMemAttribute`: 0 used, 1 used high, 2 reserved, 3 reserved high (bytes).
pub fn graph_mem_attribute(dev: i32, attr: u32) -> R<u64> {
    check_device(dev)?;
    let g = drv()?.lock();
    let p = g.graph_pools.get(&(dev as usize)).copied().unwrap_or_default();
    match attr {
        0 => Ok(p.used),
        1 => Ok(p.used_high),
        2 => Ok(p.reserved),
        3 => Ok(p.reserved_high),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuDeviceSetGraphMemAttribute`: only the high watermarks, and only reset to 0.
pub fn graph_mem_set_attribute(dev: i32, attr: u32, value: u64) -> R {
    check_device(dev)?;
    if value != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = drv()?.lock();
    let p = g.graph_pools.entry(dev as usize).or_default();
    match attr {
        1 => p.used_high = 0,
        3 => p.reserved_high = 0,
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
    Ok(())
}

// ---- modules ----

/// `cuModuleLoadData(Ex)`: PTX text with its `.entry` names.
pub fn module_load(text: &str) -> R<u64> {
    let ctx = current()?;
    let entries = ptx::parse(text).map_err(|e| match e {
        ptx::PtxError::NotPtx => CUresult::CUDA_ERROR_INVALID_IMAGE,
        ptx::PtxError::Malformed(_) => CUresult::CUDA_ERROR_INVALID_PTX,
    })?;
    let mut g = drv()?.lock();
    let h = g.handle();
    g.modules.insert(h, (ctx, entries));
    Ok(h)
}

/// `cuModuleUnload` (its functions go with it).
pub fn module_unload(m: u64) -> R {
    let mut g = drv()?.lock();
    g.modules.remove(&m).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    g.funcs.retain(|_, f| f.0 != m);
    Ok(())
}

/// `cuModuleGetFunction`: `CUDA_ERROR_NOT_FOUND` for a name the module lacks.
pub fn module_get_function(m: u64, name: &str) -> R<u64> {
    let mut g = drv()?.lock();
    let (_, entries) = g.modules.get(&m).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    let e = entries.iter().find(|e| e.name == name).cloned().ok_or(CUresult::CUDA_ERROR_NOT_FOUND)?;
    if let Some((h, _)) = g.funcs.iter().find(|(_, f)| f.0 == m && f.1.name == name) {
        return Ok(*h);
    }
    let h = g.handle();
    g.funcs.insert(h, (m, e));
    Ok(h)
}

// ---- memory ----

/// `cuMemGetInfo`: (free, total) of the shared device.
pub fn mem_info() -> R<(u64, u64)> {
    let ord = current_ord()?;
    let d = drv()?;
    d.gate_on(ord)?;
    Ok(d.gpu(ord).dev.mem_info())
}

/// `cuDeviceTotalMem`.
pub fn total_mem(dev: i32) -> R<u64> {
    Ok(gpu(dev)?.dev.info().total_memory)
}

/// Commits `size` bytes in the current context and returns the device address.
pub fn mem_alloc(size: u64) -> R<u64> {
    mem_alloc_in(size, true)
}

/// A stream-ordered allocation: from `pool` (`cuMemAllocFromPoolAsync`: "The allocation comes
/// from the specified memory pool", which "may be from a device different than that of the
/// specified hStream"), else from the current pool of the stream's device (`cuMemAllocAsync`:
/// "The allocation comes from the memory pool current to the stream's device"; the stream may
/// be another context's, as the CUDA programming guide allows for a stream-ordered copy but
/// not for a kernel launch). The pool's unused reserve is
/// reused when it covers the size, else the pool grows by the shortfall, committed on the
/// pool's device (`CUDA_ERROR_OUT_OF_MEMORY` when the device is full). The allocation belongs
/// to its pool, not to the context, and outlives it (`cuCtxDestroy`: "will not destroy memory
/// allocations by cuMemCreate(), cuMemAllocAsync() and cuMemAllocFromPoolAsync()"); a free
/// returns it to the pool.
pub fn mem_alloc_async(size: u64, pool: Option<u64>, stream: u64) -> R<u64> {
    current()?;
    if size == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let d = drv()?;
    // Without a pool named, the current pool of the stream's device, which need not be the
    // current context's.
    let cur = stream_ord(stream)?;
    if pool.is_none() && inject_pool_swap() {
        // Another thread of the application made a new pool current just before this call.
        let fresh = pool_create(1, true, cur as i32)?;
        device_set_pool(cur as i32, fresh)?;
    }
    let mut g = d.lock();
    let pool = match pool {
        Some(p) => p,
        None => {
            let fresh = g.handle();
            g.pools.current_of(cur, || fresh)
        }
    };
    let (ord, grow) = g.pools.growth(pool, size)?;
    d.gate_on(ord)?;
    let gp = d.gpu(ord);
    let addr = gp.dev.reserve_address(size, 512).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)? | ((gp.phys as u64) << ADDR_PHYS_SHIFT);
    if grow > 0 {
        gp.dev.commit(&gp.client, grow).map_err(dev_err)?;
    }
    g.pools.allocated(pool, size, grow);
    g.allocs.insert(addr, Alloc { size, charged: size, ctx: NO_CTX, ord, pool: Some(pool) });
    Ok(addr)
}

/// Fault injection for tests (`GPUEMU_INJECT=pool-swap`, read once): every `cuMemAllocAsync`
/// finds a new pool made current on the stream's device just before it allocates, as if
/// another thread of the application had called `cuMemPoolCreate` and `cuDeviceSetMemPool`
/// between an interposer's look at the current pool and the driver's allocation (a race a
/// test cannot otherwise time). Any other value of `GPUEMU_INJECT` is ignored.
fn inject_pool_swap() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("GPUEMU_INJECT").is_ok_and(|v| v.split(',').any(|x| x.trim() == "pool-swap")))
}

/// Fault injection for tests (`GPUEMU_INJECT=alloc-granule-2m`, read once): `cuMemAlloc` charges
/// the device whole 2 MiB pages, as a driver backing each allocation with large pages would
/// (what NVML then shows exceeds the bytes asked for). Not known of real drivers: the GPU check
/// kit's `small-allocs` row measures it; this lets its FAIL path be tested.
fn alloc_charge(size: u64) -> u64 {
    static ON: OnceLock<bool> = OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("GPUEMU_INJECT").is_ok_and(|v| v.split(',').any(|x| x.trim() == "alloc-granule-2m")));
    if on {
        size.div_ceil(2 << 20).saturating_mul(2 << 20)
    } else {
        size
    }
}

/// Context of an allocation that belongs to no context (stream-ordered).
const NO_CTX: u64 = 0;

fn mem_alloc_in(size: u64, ctx_owned: bool) -> R<u64> {
    let ctx = current()?;
    if ctx_owned {
        // A synchronous allocation is a "potentially unsafe API" during a capture in global
        // mode (any thread) or thread-local mode (the capturing thread).
        capture_forbids(Forbid::Unsafe)?;
    }
    if size == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let d = drv()?;
    let ord = ctx_ord(ctx)?;
    d.gate_on(ord)?;
    let gp = d.gpu(ord);
    let charged = alloc_charge(size);
    let addr = gp.dev.alloc(&gp.client, charged, 512).map_err(dev_err)? | ((gp.phys as u64) << ADDR_PHYS_SHIFT);
    let ctx = if ctx_owned { ctx } else { NO_CTX };
    d.lock().allocs.insert(addr, Alloc { size, charged, ctx, ord, pool: None });
    Ok(addr)
}

/// Gives device memory pools released back to the devices.
fn give_back(d: &Driver, released: impl IntoIterator<Item = crate::pools::Release>) {
    for (ord, bytes) in released {
        let gp = d.gpu(ord);
        gp.dev.free(&gp.client, bytes);
    }
}

/// After a stream, event or context synchronisation: every pool releases its reserve above
/// max(used, release threshold) (see [`crate::pools::Pools::release_at_sync`]).
fn pools_after_sync(d: &Driver) {
    let released = d.lock().pools.release_at_sync();
    give_back(d, released);
}

/// `cuMemAllocPitch`: rows padded to 512 bytes; (address, pitch).
pub fn mem_alloc_pitch(width: u64, height: u64, elem: u32) -> R<(u64, u64)> {
    if !matches!(elem, 4 | 8 | 16) || width == 0 || height == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let pitch = width.div_ceil(512) * 512;
    let size = pitch.checked_mul(height).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    Ok((mem_alloc(size)?, pitch))
}

/// Frees an allocation made by `mem_alloc`; unknown pointers are `CUDA_ERROR_INVALID_VALUE`.
pub fn mem_free(addr: u64) -> R {
    let d = drv()?;
    if addr == 0 {
        return Ok(());
    }
    let mut g = d.lock();
    if graph_mem_free(&mut g, addr) {
        return Ok(());
    }
    let a = g.allocs.remove(&addr).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    g.mem.discard(addr, a.size);
    if let Some(pool) = a.pool {
        // Back into its pool, which keeps the memory reserved (a destroyed pool's last free
        // releases it).
        let released = g.pools.freed(pool, a.size);
        drop(g);
        give_back(d, released);
        return Ok(());
    }
    let gp = d.gpu(a.ord);
    gp.dev.free(&gp.client, a.charged);
    Ok(())
}

/// `cuMemGetAddressRange`: (base, size) of the allocation holding `addr`.
pub fn mem_range(addr: u64) -> R<(u64, u64)> {
    let g = drv()?.lock();
    if let Some((b, a)) = g.allocs.range(..=addr).next_back() {
        if addr < b + a.size {
            return Ok((*b, a.size));
        }
    }
    if let Some((b, m)) = g.mappings.range(..=addr).next_back() {
        if addr < b + m.size {
            return Ok((*b, m.size));
        }
    }
    Err(CUresult::CUDA_ERROR_NOT_FOUND)
}

fn check_range(g: &Inner, addr: u64, len: u64) -> R {
    let within = |b: u64, size: u64| addr >= b && addr.checked_add(len).is_some_and(|e| e <= b + size);
    let in_alloc = g.allocs.range(..=addr).next_back().is_some_and(|(b, a)| within(*b, a.size));
    let in_map = g.mappings.range(..=addr).next_back().is_some_and(|(b, m)| within(*b, m.size));
    let in_graph = g.graph_live.range(..=addr).next_back().is_some_and(|(b, (_, size))| within(*b, *size));
    if in_alloc || in_map || in_graph { Ok(()) } else { Err(CUresult::CUDA_ERROR_INVALID_VALUE) }
}

/// Pointer attribute query: (owning context, is device memory).
pub fn pointer_owner(addr: u64) -> R<u64> {
    let g = drv()?.lock();
    g.allocs
        .range(..=addr)
        .next_back()
        .filter(|(b, a)| addr < *b + a.size)
        .map(|(_, a)| a.ctx)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// Checks that `[addr, addr + len)` lies inside one allocation or mapping of this process.
pub fn check_device_range(addr: u64, len: u64) -> R {
    check_range(&drv()?.lock(), addr, len)
}

/// Runs `op` on device memory once every `(addr, len)` of `ranges` is checked: after the
/// context's queued work when `sync`, else only through the gate (an async copy whose stream
/// was synchronised already).
fn on_memory(sync: bool, ranges: &[(u64, u64)], op: impl FnOnce(&mut Inner)) -> R {
    let d = drv()?;
    if sync { ctx_wait(0)? } else { d.gate()? }
    let mut g = d.lock();
    for &(addr, len) in ranges {
        check_range(&g, addr, len)?;
    }
    op(&mut g);
    Ok(())
}

/// Host-to-device copy (after the context's work when `sync`).
pub fn memcpy_htod(dst: u64, src: &[u8], sync: bool) -> R {
    on_memory(sync, &[(dst, src.len() as u64)], |g| g.mem.write(dst, src))
}

/// Device-to-host copy, after the context's queued work.
pub fn memcpy_dtoh(dst: &mut [u8], src: u64) -> R {
    on_memory(true, &[(src, dst.len() as u64)], |g| g.mem.read(src, dst))
}

/// Device-to-device copy, after the context's queued work.
pub fn memcpy_dtod(dst: u64, src: u64, len: u64) -> R {
    on_memory(true, &[(src, len), (dst, len)], |g| g.mem.copy(dst, src, len))
}

/// `cuMemsetD8`, after the context's queued work.
pub fn memset_d8(dst: u64, v: u8, n: u64) -> R {
    on_memory(true, &[(dst, n)], |g| g.mem.fill(dst, n, v))
}

/// Synchronises `stream` before an async copy (copies themselves are instantaneous). A copy
/// on a capturing stream is not captured by the emulator: refused
/// (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`), the capture invalidated (stricter than a driver).
pub fn sync_for_async(stream: u64) -> R {
    capture_forbids(Forbid::OnStream(stream))?;
    stream_wait(stream).map(|_| ())
}

/// `cuMemPoolCreate`: an empty pool backed by `device`'s memory.
pub fn pool_create(alloc_type: u32, location_is_device: bool, device: i32) -> R<u64> {
    current()?;
    // PINNED on this device; MANAGED pools are new in CUDA 13.0; host-located pools (13.0) are
    // not emulated (refused, stricter than the driver).
    let type_ok = alloc_type == 1 || (alloc_type == 2 && driver_version()? >= DRIVER_VERSION_13);
    if !type_ok || !location_is_device || check_device(device).is_err() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = drv()?.lock();
    let h = g.handle();
    g.pools.create(h, device as usize);
    Ok(h)
}

/// `cuMemPoolDestroy` (see [`crate::pools::Pools::destroy`]).
pub fn pool_destroy(p: u64) -> R {
    let d = drv()?;
    let released = d.lock().pools.destroy(p)?;
    give_back(d, released);
    Ok(())
}

/// `cuMemPoolTrimTo` (see [`crate::pools::Pools::trim_to`]).
pub fn pool_trim_to(p: u64, keep: u64) -> R {
    let d = drv()?;
    let released = d.lock().pools.trim_to(p, keep)?;
    give_back(d, released);
    Ok(())
}

/// `cuMemPoolGetAttribute`: an `int` attribute's value as `u64`.
pub fn pool_attribute(p: u64, attr: u32) -> R<u64> {
    drv()?.lock().pools.get_attribute(p, attr)
}

/// `cuMemPoolSetAttribute` (an `int` attribute's value as `u64`).
pub fn pool_set_attribute(p: u64, attr: u32, value: u64) -> R {
    drv()?.lock().pools.set_attribute(p, attr, value)
}

/// `cuDeviceGetDefaultMemPool`: "The default mempool of a device contains device memory from
/// that device."
pub fn device_default_pool(dev: i32) -> R<u64> {
    check_device(dev)?;
    let mut g = drv()?.lock();
    let fresh = g.handle();
    Ok(g.pools.default_of(dev as usize, || fresh))
}

/// `cuDeviceGetMemPool`: the pool `cuMemAllocAsync` allocates from on `dev`.
pub fn device_pool(dev: i32) -> R<u64> {
    check_device(dev)?;
    let mut g = drv()?.lock();
    let fresh = g.handle();
    Ok(g.pools.current_of(dev as usize, || fresh))
}

/// `cuDeviceSetMemPool`: "The memory pool must be local to the specified device."
pub fn device_set_pool(dev: i32, p: u64) -> R {
    check_device(dev).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
    drv()?.lock().pools.set_current(dev as usize, p)
}

/// Validates a stream handle in the current context.
pub fn check_stream(stream: u64) -> R {
    let ctx = current()?;
    stream_ref(&drv()?.lock(), ctx, stream).map(|_| ())
}

// ---- arrays ----

/// Array / mipmapped array of `bytes`: committed on the device.
pub fn array_create(bytes: u64) -> R<u64> {
    let ord = current_ord()?;
    if bytes == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let d = drv()?;
    d.gate_on(ord)?;
    let gp = d.gpu(ord);
    gp.dev.commit(&gp.client, bytes).map_err(dev_err)?;
    let mut g = d.lock();
    let h = g.handle();
    g.arrays.insert(h, (ord, bytes));
    Ok(h)
}

/// Destroys an array and gives its memory back.
pub fn array_destroy(h: u64) -> R {
    let d = drv()?;
    let (ord, bytes) = d.lock().arrays.remove(&h).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    let gp = d.gpu(ord);
    gp.dev.free(&gp.client, bytes);
    Ok(())
}

// ---- virtual memory management ----

/// `cuMemCreate`: commits physical memory (size a multiple of the granularity).
pub fn vmm_create(size: u64, location_is_device: bool, device: i32, types: u32) -> R<u64> {
    current()?;
    if size == 0 || !size.is_multiple_of(GRANULARITY) || !location_is_device || check_device(device).is_err() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // Only the POSIX file descriptor is a shareable handle type on the emulated (Linux) GPU.
    if types & !VMM_POSIX_FD != 0 {
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    // The physical memory lives on the GPU the properties name, not the current context's.
    let ord = device as usize;
    let d = drv()?;
    d.gate_on(ord)?;
    let gp = d.gpu(ord);
    gp.dev.commit(&gp.client, size).map_err(dev_err)?;
    let mut g = d.lock();
    let h = g.handle();
    g.vmm_allocs.insert(h, VmmAlloc { ord, size, types, handles: 1, exported: Vec::new() });
    g.phys.insert(h, Phys { alloc: h, refs: 1, maps: 0 });
    Ok(h)
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
const VMM_POSIX_FD: u32 = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0;

/// Handle `h` is gone once unreferenced and unmapped; its allocation once no handle and no
/// exported descriptor holds it.
fn maybe_drop_phys(d: &Driver, g: &mut Inner, h: u64) {
    if let Some(p) = g.phys.get(&h) {
        if p.refs == 0 && p.maps == 0 {
            let alloc = p.alloc;
            g.phys.remove(&h);
            if let Some(a) = g.vmm_allocs.get_mut(&alloc) {
                a.handles -= 1;
            }
            maybe_drop_alloc(d, g, alloc);
        }
    }
}

fn maybe_drop_alloc(d: &Driver, g: &mut Inner, alloc: u64) {
    let Some(a) = g.vmm_allocs.get(&alloc) else { return };
    if a.handles > 0 || !a.exported.is_empty() {
        return;
    }
    let (ord, size) = (a.ord, a.size);
    g.vmm_allocs.remove(&alloc);
    let gp = d.gpu(ord);
    gp.dev.free(&gp.client, size);
}

/// (st_dev, st_ino) of open descriptor `fd`.
fn file_id(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: fstat writes into the zeroed stat we pass.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// The emulator's ends of the exported socket pairs: (its end, the caller's end's id).
static EXPORTED_PEERS: Mutex<Vec<(c_int, (u64, u64))>> = Mutex::new(Vec::new());

/// Watches the emulator's ends of the exported socket pairs: once every copy of the caller's
/// end is closed (in this process or any it was passed to) its peer hangs up, and the
/// allocation goes if nothing else holds it, as a real driver frees it when "all shareable
/// handles are closed and the allocation is released".
fn watch_exported() {
    loop {
        let peers: Vec<(c_int, (u64, u64))> = EXPORTED_PEERS.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut fds: Vec<libc::pollfd> = peers.iter().map(|&(fd, _)| libc::pollfd { fd, events: 0, revents: 0 }).collect();
        // SAFETY: polling our own descriptors; 50 ms, then new exports are picked up.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 50) };
        let hung: Vec<(c_int, (u64, u64))> = peers.into_iter().zip(&fds).filter(|(_, p)| p.revents & libc::POLLHUP != 0).map(|(x, _)| x).collect();
        if hung.is_empty() {
            continue;
        }
        EXPORTED_PEERS.lock().unwrap_or_else(|e| e.into_inner()).retain(|x| !hung.contains(x));
        let Ok(d) = drv() else { return };
        let mut g = d.lock();
        for (fd, id) in hung {
            // SAFETY: our own end, no longer watched.
            unsafe { libc::close(fd) };
            let Some(alloc) = g.vmm_allocs.iter_mut().find(|(_, a)| a.exported.contains(&(fd, id))).map(|(k, a)| {
                a.exported.retain(|x| *x != (fd, id));
                *k
            }) else { continue };
            maybe_drop_alloc(d, &mut g, alloc);
        }
    }
}

/// `cuMemExportToShareableHandle` to a POSIX file descriptor: one end of a socket pair whose
/// other end the emulator keeps and watches (`watch_exported`).
/// Only for a handle whose `cuMemCreate` asked for that type in `requestedHandleTypes`
/// ("Device supports exporting memory to a posix file descriptor with
/// ::cuMemExportToShareableHandle, if requested via ::cuMemCreate").
pub fn vmm_export(h: u64, handle_type: u32, flags: u64) -> R<c_int> {
    let d = drv()?;
    let mut g = d.lock();
    let p = g.phys.get(&h).filter(|p| p.refs > 0).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let alloc = p.alloc;
    if flags != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if handle_type != VMM_POSIX_FD {
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    let a = g.vmm_allocs.get(&alloc).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if a.types & VMM_POSIX_FD == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut pair: [c_int; 2] = [-1; 2];
    // SAFETY: socketpair writes two descriptors into our array.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, pair.as_mut_ptr()) } != 0 {
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    let [fd, peer] = pair;
    let Some(id) = file_id(fd) else {
        // SAFETY: our own descriptors.
        unsafe { (libc::close(fd), libc::close(peer)) };
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    };
    EXPORTED_PEERS.lock().unwrap_or_else(|e| e.into_inner()).push((peer, id));
    static WATCHER: std::sync::Once = std::sync::Once::new();
    WATCHER.call_once(|| {
        std::thread::Builder::new().name("emu-vmm-export".into()).spawn(watch_exported).expect("spawn the export watcher");
    });
    if let Some(a) = g.vmm_allocs.get_mut(&alloc) {
        a.exported.push((peer, id));
    }
    Ok(fd)
}

/// `cuMemImportFromShareableHandle` of a POSIX file descriptor: a new handle of the allocation
/// the descriptor names (one more holder of its memory). A descriptor exported by another
/// process is refused with `CUDA_ERROR_NOT_SUPPORTED` ("If the current process cannot support
/// the memory described by this shareable handle"): each process's emulated driver keeps its
/// own VMM tables.
pub fn vmm_import(fd: c_int, handle_type: u32) -> R<u64> {
    let d = drv()?;
    let mut g = d.lock();
    if handle_type != VMM_POSIX_FD {
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    let id = file_id(fd).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let Some(alloc) = g.vmm_allocs.iter().find(|(_, a)| a.exported.iter().any(|&(_, x)| x == id)).map(|(k, _)| *k) else {
        // SAFETY: fstat writes into the zeroed stat we pass.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let socket = unsafe { libc::fstat(fd, &mut st) } == 0 && st.st_mode & libc::S_IFMT == libc::S_IFSOCK;
        return Err(if socket { CUresult::CUDA_ERROR_NOT_SUPPORTED } else { CUresult::CUDA_ERROR_INVALID_VALUE });
    };
    let h = g.handle();
    if let Some(a) = g.vmm_allocs.get_mut(&alloc) {
        a.handles += 1;
    }
    g.phys.insert(h, Phys { alloc, refs: 1, maps: 0 });
    Ok(h)
}

/// `cuMemGetAllocationPropertiesFromHandle`: (requestedHandleTypes, device ordinal).
pub fn vmm_properties(h: u64) -> R<(u32, i32)> {
    let g = drv()?.lock();
    let p = g.phys.get(&h).filter(|p| p.refs > 0).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let a = g.vmm_allocs.get(&p.alloc).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    Ok((a.types, a.ord as i32))
}

/// `cuMemRelease`: one reference fewer; memory goes back once none is left and it is also
/// unmapped.
pub fn vmm_release(h: u64) -> R {
    let d = drv()?;
    let mut g = d.lock();
    match g.phys.get_mut(&h) {
        Some(p) if p.refs > 0 => p.refs -= 1,
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
    maybe_drop_phys(d, &mut g, h);
    Ok(())
}

/// `cuMemRetainAllocationHandle`: the handle of the mapping that holds `addr` (any address in
/// it), one reference more. cuda.h: "The handle is guaranteed to be the same handle value used
/// to map the memory. If the address requested is not mapped, the function will fail. The
/// returned handle must be released with corresponding number of calls to cuMemRelease."
pub fn vmm_retain(addr: u64) -> R<u64> {
    let mut g = drv()?.lock();
    let h = g
        .mappings
        .range(..=addr)
        .next_back()
        .filter(|(b, m)| addr < *b + m.size)
        .map(|(_, m)| m.handle)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let p = g.phys.get_mut(&h).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    p.refs += 1;
    Ok(h)
}

/// `cuMemAddressReserve`: a fresh virtual range, nothing committed.
pub fn vmm_reserve(size: u64, align: u64) -> R<u64> {
    drv()?;
    if size == 0 || !size.is_multiple_of(GRANULARITY) || (align != 0 && !align.is_power_of_two()) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let d = drv()?;
    // Virtual ranges come from GPU 0's address space (unified addressing: one per process).
    let gp = d.gpu(0);
    let addr = gp.dev.reserve_address(size, align.max(GRANULARITY)).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?
        | ((gp.phys as u64) << ADDR_PHYS_SHIFT);
    d.lock().reservations.insert(addr, size);
    Ok(addr)
}

/// `cuMemAddressFree` of an unmapped reservation.
pub fn vmm_address_free(addr: u64, size: u64) -> R {
    let mut g = drv()?.lock();
    match g.reservations.get(&addr) {
        Some(&s) if s == size => {
            if g.mappings.range(addr..addr + size).next().is_some() {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            g.reservations.remove(&addr);
            Ok(())
        }
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuMemMap` a handle into a reserved range. "Both ptr, size, and offset must be a multiple of
/// the value given via cuMemGetAllocationGranularity with the
/// CU_MEM_ALLOC_GRANULARITY_MINIMUM flag" (CUDA driver API, cuMemMap): anything else is
/// `CUDA_ERROR_INVALID_VALUE`.
pub fn vmm_map(addr: u64, size: u64, offset: u64, h: u64) -> R {
    let d = drv()?;
    let mut g = d.lock();
    if [addr, size, offset].iter().any(|v| !v.is_multiple_of(GRANULARITY)) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let in_res = g.reservations.range(..=addr).next_back().is_some_and(|(b, s)| addr.checked_add(size).is_some_and(|e| e <= b + s));
    let p = g.phys.get(&h).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    let alloc_size = g.vmm_allocs.get(&p.alloc).map_or(0, |a| a.size);
    if !in_res || size == 0 || offset.checked_add(size).is_none_or(|e| e > alloc_size) || p.refs == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if g.mappings.range(..addr + size).next_back().is_some_and(|(b, m)| b + m.size > addr) {
        return Err(CUresult::CUDA_ERROR_ALREADY_MAPPED);
    }
    g.mappings.insert(addr, Mapping { size, handle: h });
    if let Some(p) = g.phys.get_mut(&h) {
        p.maps += 1;
    }
    Ok(())
}

/// `cuMemUnmap` every mapping in the range. "The range must be the entire contiguous address
/// range that was mapped to. In other words, cuMemUnmap cannot unmap a sub-range of an
/// address range mapped by cuMemCreate / cuMemMap" (CUDA driver API): a range that starts or
/// ends inside a mapping, or holds none, is `CUDA_ERROR_INVALID_VALUE` and unmaps nothing.
pub fn vmm_unmap(addr: u64, size: u64) -> R {
    let d = drv()?;
    let mut g = d.lock();
    let end = addr.checked_add(size).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let keys: Vec<u64> = g.mappings.range(addr..end).map(|(k, _)| *k).collect();
    let starts_inside = g.mappings.range(..addr).next_back().is_some_and(|(b, m)| b + m.size > addr);
    let ends_inside = keys.last().is_some_and(|k| k + g.mappings[k].size > end);
    if keys.is_empty() || starts_inside || ends_inside {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    for k in keys {
        if let Some(m) = g.mappings.remove(&k) {
            g.mem.discard(k, m.size);
            if let Some(p) = g.phys.get_mut(&m.handle) {
                p.maps = p.maps.saturating_sub(1);
            }
            maybe_drop_phys(d, &mut g, m.handle);
        }
    }
    Ok(())
}

/// `cuMemSetAccess`: the range must be mapped.
pub fn vmm_set_access(addr: u64, size: u64) -> R {
    let g = drv()?.lock();
    check_range(&g, addr, size)
}

#[cfg(test)]
mod visible_tests {
    use super::visible_devices;

    fn host() -> Vec<String> {
        ["GPU-aaaa1111-0000", "GPU-bbbb2222-0000", "GPU-bbbb3333-0000"].map(String::from).to_vec()
    }

    #[test]
    fn visible_devices_renumber_in_listed_order_and_stop_at_the_first_invalid_entry() {
        let h = host();
        assert_eq!(visible_devices(None, &h), vec![0, 1, 2], "unset: every GPU in host order");
        assert_eq!(visible_devices(Some("1,0"), &h), vec![1, 0], "ordinal 0 is host GPU 1");
        assert_eq!(visible_devices(Some("2"), &h), vec![2]);
        assert_eq!(visible_devices(Some("0,5,1"), &h), vec![0], "an invalid index truncates the list");
        assert_eq!(visible_devices(Some("0,-1,1"), &h), vec![0]);
        assert_eq!(visible_devices(Some("-1"), &h), Vec::<usize>::new());
        assert_eq!(visible_devices(Some(""), &h), Vec::<usize>::new(), "set but empty: no device");
        assert_eq!(visible_devices(Some("1,1"), &h), vec![1], "a GPU named twice ends the list");
        assert_eq!(visible_devices(Some("GPU-bbbb3333-0000,GPU-aaaa"), &h), vec![2, 0], "UUIDs and unique prefixes");
        assert_eq!(visible_devices(Some("GPU-bbbb,0"), &h), Vec::<usize>::new(), "an ambiguous prefix is invalid");
        assert_eq!(visible_devices(Some("GPU-ffff,0"), &h), Vec::<usize>::new(), "unknown UUID");
        assert_eq!(visible_devices(Some("0,GPU-aaaa1111-0000"), &h), vec![0], "index and UUID of one GPU");
    }
}
