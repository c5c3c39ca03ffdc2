//! The process's shim state, built once on the first driver call: config, one quota
//! (ledger-backed when possible) and one throttle per GPU the process sees, context registry;
//! plus the controller thread that feeds each throttle from its GPU's ledger, heartbeats and
//! reclaims dead neighbours.
//!
//! Several GPUs: each `CUdevice` ordinal is mapped once, at init, to its physical GPU (the
//! driver's UUID of the ordinal, looked up in `XSHARE_GPUS`), and so to that GPU's ledger; the
//! hooks then index a fixed array by ordinal.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cuda_abi::CUdevice;
use node_ledger::{ledger::group_id_for, Ledger};

use crate::config::Config;
use crate::exit::Contexts;
use crate::poolcount::PoolCount;
use crate::quota::Quota;
use crate::throttle::{Pid, Sample, Throttle};

/// One GPU as this process sees it: its quota and throttle.
pub struct Gpu {
    /// The group's quota on this physical GPU.
    pub quota: Quota,
    /// The launch throttle fed by this GPU's load.
    pub throttle: Throttle,
    /// Device memory as the driver reports it (0 if unknown).
    pub device_total: u64,
    /// Host GPU index (whose ledger counts it); `None`: unmapped, so no quota (fail closed).
    pub host_index: Option<u32>,
    /// The driver's UUID of this device (`GPU-...`; empty if unknown).
    pub uuid: String,
    /// This device's graph memory pool as counted in the quota ([`crate::graphmem`]).
    pub graph: PoolCount,
    /// This device's stream-ordered memory pools as counted in the quota
    /// ([`crate::streampool`]).
    pub stream_pools: PoolCount,
    /// Synchronizing calls on this device, entered and returned: published to its ledger by
    /// the controller, for mps-manager to tell a client waiting on a hung GPU from an idle one.
    pub syncs: Syncs,
}

/// Synchronizing driver calls of this process on one GPU (`cuCtxSynchronize`,
/// `cuStreamSynchronize`, `cuEventSynchronize`): entered and returned, so that while more have
/// been entered than returned a thread waits for the GPU (`node_ledger::layout::ProcSlot`'s
/// `syncs_begun`).
#[derive(Default)]
pub struct Syncs {
    /// Calls entered.
    pub begun: std::sync::atomic::AtomicU64,
    /// Calls returned.
    pub ended: std::sync::atomic::AtomicU64,
}

impl Syncs {
    /// Runs the synchronizing call `call`, counted. Two relaxed increments around a call that
    /// waits for the GPU.
    #[inline]
    pub fn around(&self, call: impl FnOnce() -> cuda_abi::CUresult) -> cuda_abi::CUresult {
        self.begun.fetch_add(1, Relaxed);
        let rc = call();
        self.ended.fetch_add(1, Relaxed);
        rc
    }

    /// In a fork child: the forking thread alone survived, so no call of the parent's other
    /// threads is in progress here.
    pub fn after_fork_child(&self) {
        self.ended.store(self.begun.load(Relaxed), Relaxed);
    }
}

impl Gpu {
    /// A GPU with a process-local quota of `limit` bytes and the default throttle (unit tests).
    #[cfg(test)]
    pub(crate) fn for_test(limit: u64) -> Self {
        Self::new(Quota::local(limit), Throttle::new(&crate::config::ThrottleConfig::default(), 1), 0, Some(0), String::new())
    }

    fn new(quota: Quota, throttle: Throttle, device_total: u64, host_index: Option<u32>, uuid: String) -> Self {
        Self {
            quota,
            throttle,
            device_total,
            host_index,
            uuid,
            graph: PoolCount::new("graph memory pool (an exec the shim could not size)"),
            stream_pools: PoolCount::new("stream-ordered memory pools (a pool grew beyond an allocation's size)"),
            syncs: Syncs::default(),
        }
    }
}

/// Everything the hooks use.
pub struct State {
    /// Index = `CUdevice` ordinal in this process (never empty).
    pub gpus: Box<[Gpu]>,
    /// Contexts to release before the process dies.
    pub contexts: Contexts,
    /// Answers for an ordinal outside `gpus`: no quota, minimum launch rate.
    unmapped: Gpu,
    /// Graph memory nodes' sizes per graph and exec.
    pub graph_mem: crate::graphmem::GraphMem,
    /// The throttle price of each graph exec (see `graphcost`).
    pub graph_cost: crate::graphcost::GraphCost,
    /// The stream-ordered pools this process allocated from, and its allocations' pools.
    pub stream_pools: crate::streampool::StreamPools,
}

impl State {
    /// The GPU of ordinal `dev` (one index into a fixed array; an ordinal the driver does not
    /// have gets a GPU with no quota).
    #[inline]
    pub fn gpu(&self, dev: CUdevice) -> &Gpu {
        usize::try_from(dev).ok().and_then(|i| self.gpus.get(i)).unwrap_or(&self.unmapped)
    }

    /// The GPU of the calling thread's current context. One GPU: no lookup at all. Several:
    /// the driver's `cuCtxGetDevice` (a thread-local read in the driver), then [`State::gpu`].
    /// Without a current context the driver refuses the operation anyway: ordinal 0.
    #[inline]
    pub fn current(&self) -> &Gpu {
        if self.gpus.len() == 1 {
            return &self.gpus[0];
        }
        self.gpu(self.current_ordinal() as CUdevice)
    }

    /// The ordinal of the calling thread's current context's device (0 with one GPU, without
    /// asking the driver; 0 without a current context).
    #[inline]
    pub fn current_ordinal(&self) -> usize {
        if self.gpus.len() == 1 {
            return 0;
        }
        current_device().map_or(0, |dev| usize::try_from(dev).unwrap_or(usize::MAX))
    }

    /// The ordinal of the device `stream` (a `CUstream`'s value) belongs to: a stream-ordered
    /// allocation without a pool named comes from "the memory pool current to the stream's
    /// device" (cuda.h, `cuMemAllocAsync`), and the stream may be another context's. One
    /// GPU: 0, without asking. The default-stream handles (null, `CU_STREAM_LEGACY`,
    /// `CU_STREAM_PER_THREAD`): the current context's device. Else `cuStreamGetDevice` (CUDA
    /// 12.8), or on an older driver the stream's context (`cuStreamGetCtx`) made current for a
    /// moment to ask its device. `Err`: the driver's refusal (an invalid stream), passed on to
    /// the caller without allocating: never counted on a guessed device.
    pub fn stream_ordinal(&self, stream: u64) -> Result<usize, cuda_abi::CUresult> {
        use cuda_abi::CUresult as R;
        if self.gpus.len() == 1 {
            return Ok(0);
        }
        if stream <= 2 {
            return Ok(self.current_ordinal());
        }
        let ordinal = |dev: CUdevice| usize::try_from(dev).map_err(|_| R::CUDA_ERROR_INVALID_DEVICE);
        // Only passed to the driver, which checks it.
        let stream = stream as cuda_abi::CUstream;
        let mut dev: CUdevice = 0;
        if !crate::real::driver(crate::interpose::Sym::cuStreamGetDevice).is_null() {
            return match call_real!(cuStreamGetDevice: cuda_abi::PFN_cuStreamGetDevice_v12080, stream, &mut dev) {
                R::CUDA_SUCCESS => ordinal(dev),
                rc => Err(rc),
            };
        }
        device_via_context(
            || {
                let mut ctx: cuda_abi::CUcontext = std::ptr::null_mut();
                let rc = call_real!(cuStreamGetCtx: cuda_abi::PFN_cuStreamGetCtx_v9020, stream, &mut ctx);
                (rc == R::CUDA_SUCCESS).then_some(ctx).ok_or(rc)
            },
            |ctx| call_real!(cuCtxPushCurrent_v2: cuda_abi::PFN_cuCtxPushCurrent_v4000, ctx),
            current_device,
            pop_current,
        )
        .and_then(ordinal)
    }

    /// The ordinal of the calling thread's current context's device, if it has one (one GPU:
    /// 0, without asking).
    pub fn known_current_ordinal(&self) -> Option<usize> {
        if self.gpus.len() == 1 {
            return Some(0);
        }
        current_device().ok().and_then(|d| usize::try_from(d).ok())
    }

    /// The ordinal of context `ctx`'s device (null: the calling thread's current context), if
    /// the driver says. One GPU: 0, without asking; several: the context pushed for a moment
    /// and its device asked.
    pub fn ctx_ordinal(&self, ctx: cuda_abi::CUcontext) -> Option<usize> {
        if self.gpus.len() == 1 || ctx.is_null() {
            return self.known_current_ordinal();
        }
        device_via_context(
            || Ok(ctx),
            |ctx| call_real!(cuCtxPushCurrent_v2: cuda_abi::PFN_cuCtxPushCurrent_v4000, ctx),
            current_device,
            pop_current,
        )
        .ok()
        .and_then(|d| usize::try_from(d).ok())
    }

    /// Every GPU's quota.
    pub fn quotas(&self) -> impl Iterator<Item = &Quota> {
        self.gpus.iter().map(|g| &g.quota)
    }

    /// Every GPU's throttle.
    pub fn throttles(&self) -> impl Iterator<Item = &Throttle> {
        self.gpus.iter().map(|g| &g.throttle)
    }

    /// Forgets an allocation on whichever GPU counted it (keys of one kind are unique in the
    /// process: one address space, one handle space); its bytes go back to that GPU's quota.
    pub fn untrack(&self, kind: crate::quota::Kind, key: u64) -> Option<u64> {
        self.quotas().find_map(|q| q.untrack(kind, key))
    }

    /// Before `cuMemMap` of VMM handle `h`: the quota that counts `h`, with the mapping counted
    /// ahead ([`Quota::vmm_map_begin`]); `None` if no quota counts it.
    pub fn vmm_map_begin(&self, h: u64) -> Option<&Quota> {
        self.quotas().find(|q| q.vmm_map_begin(h))
    }

    /// Before `cuMemUnmap(addr, size)`: takes out the recorded mappings the range covers,
    /// those of handles the shim counts (quota, address, size, handle) and those of imported
    /// handles (quota, address, bytes counted). One mapping of either kind that starts at
    /// `addr` and covers the range (PyTorch's expandable segments unmap page by page) is the
    /// only one that can start in it (mappings never overlap): one lookup per GPU in each
    /// table, decided before anything is taken out. Otherwise every recorded mapping that
    /// starts in the range, not only those end to end from `addr`: a mapping the shim does not
    /// know (made before it saw its handle) may lie among them, and the known ones after it
    /// must not stay counted (the tables are scanned).
    #[allow(clippy::type_complexity)]
    pub fn unmap_take(&self, addr: u64, size: u64) -> (Vec<(&Quota, u64, u64, u64)>, Vec<(&Quota, u64, u64)>) {
        if let Some(q) = self.exact_mapping(addr, size) {
            return (q.vmm_unmap_take(addr).map(|(len, h)| vec![(q, addr, len, h)]).unwrap_or_default(), Vec::new());
        }
        if let Some(q) = self.exact_import(addr, size) {
            let taken = q.take(crate::quota::Kind::VmmImportMap, addr).map(|(bytes, _)| vec![(q, addr, bytes)]);
            return (Vec::new(), taken.unwrap_or_default());
        }
        let end = addr.saturating_add(size);
        let mut taken = Vec::new();
        let mut imports = Vec::new();
        for q in self.quotas() {
            for at in q.vmm_mapping_starts().into_iter().filter(|a| (addr..end).contains(a)) {
                if let Some((len, h)) = q.vmm_unmap_take(at) {
                    taken.push((q, at, len, h));
                }
            }
            for at in q.import_mapping_starts().into_iter().filter(|a| (addr..end).contains(a)) {
                if let Some((bytes, _)) = q.take(crate::quota::Kind::VmmImportMap, at) {
                    imports.push((q, at, bytes));
                }
            }
        }
        (taken, imports)
    }

    /// Before `cuMemRelease(h)`: the quota that counts `h`, with `h` marked released
    /// ([`Quota::vmm_release_begin`]) and its word; `None` if no quota counts it.
    pub fn vmm_release_begin(&self, h: u64) -> Option<(&Quota, crate::quota::ReleaseMark)> {
        self.quotas().find_map(|q| q.vmm_release_begin(h).map(|m| (q, m)))
    }

    /// Before `cuMemExportToShareableHandle(h)`: the quota that counts `h`, with `h` marked
    /// exported, and whether it was already ([`Quota::vmm_export_begin`]).
    pub fn vmm_export_begin(&self, h: u64) -> Option<(&Quota, bool)> {
        self.quotas().find_map(|q| q.vmm_export_begin(h).map(|was| (q, was)))
    }

    /// The handle of the recorded mapping that holds `addr` (any address in it), with the
    /// quota that counts it (not a hot path: the mapping tables are scanned).
    pub fn vmm_handle_at(&self, addr: u64) -> Option<(&Quota, u64)> {
        // A mapping's start (what applications pass): one lookup per GPU, no scan.
        if let Some(found) = self.quotas().find_map(|q| q.vmm_mapping_at(addr).map(|(_, h)| (q, h))) {
            return Some(found);
        }
        self.quotas().find_map(|q| q.vmm_handle_at(addr).map(|h| (q, h)))
    }

    /// The quota with a recorded mapping of a handle it counts that starts at `addr` and
    /// covers `size` bytes (one lookup per GPU).
    fn exact_mapping(&self, addr: u64, size: u64) -> Option<&Quota> {
        self.quotas().find(|q| q.vmm_mapping_at(addr).is_some_and(|(len, _)| len >= size))
    }

    /// The quota with a recorded mapping of an imported handle that starts at `addr` and covers
    /// `size` bytes.
    fn exact_import(&self, addr: u64, size: u64) -> Option<&Quota> {
        self.quotas().find(|q| q.tracked(crate::quota::Kind::VmmImportMap, addr).is_some_and(|len| len >= size))
    }

    /// Context `ctx` is gone: gives back what it held, on every GPU (it held memory on one).
    pub fn release_context(&self, ctx: u64) -> u64 {
        self.quotas().map(|q| q.release_context(ctx)).sum()
    }
}

static CONFIG: OnceLock<Config> = OnceLock::new();
static STATE: OnceLock<State> = OnceLock::new();
static CONTROLLER_ALIVE: AtomicBool = AtomicBool::new(false);

static DISPATCH: OnceLock<tracing::Dispatch> = OnceLock::new();

/// The config, loaded (file + env) and logged once.
pub fn config() -> &'static Config {
    CONFIG.get_or_init(|| {
        let (cfg, errs) = Config::load(&|k| std::env::var(k).ok());
        let _ = DISPATCH.set(our_dispatch(&cfg.log));
        if let Some(d) = DISPATCH.get() {
            tracing::dispatcher::with_default(d, || {
                for e in errs {
                    tracing::error!("xcuda: config error: {e}; failing closed: device allocations refused, launches at the minimum rate");
                }
            });
        }
        cfg
    })
}

/// Our own subscriber (stderr, level from config). It is never installed as the process's
/// global default: the host application keeps its own logging.
pub(crate) fn our_dispatch(level: &str) -> tracing::Dispatch {
    use tracing_subscriber::filter::LevelFilter;
    let lvl = level.parse::<LevelFilter>().unwrap_or(LevelFilter::WARN);
    tracing::Dispatch::new(
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(lvl)
            .with_target(false)
            // Plain text into files, pipes and the journal; colour only on a terminal.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .finish(),
    )
}

fn dispatch() -> &'static tracing::Dispatch {
    if let Some(d) = DISPATCH.get() {
        return d;
    }
    config();
    DISPATCH.get_or_init(|| our_dispatch("warn"))
}

/// Runs `f` with the shim's logger (on application threads; never on a hot path).
pub fn logged<R>(f: impl FnOnce() -> R) -> R {
    tracing::dispatcher::with_default(dispatch(), f)
}

/// Makes the shim's logger the default of the calling (shim-owned) thread.
pub fn log_on_this_thread() -> tracing::dispatcher::DefaultGuard {
    tracing::dispatcher::set_default(dispatch())
}

/// The state, if already built (async-signal-safe: one atomic load).
#[inline]
pub fn get() -> Option<&'static State> {
    STATE.get()
}

/// The state, built on first use.
#[inline]
pub fn state() -> &'static State {
    STATE.get_or_init(|| logged(build))
}

macro_rules! call_real {
    ($sym:ident : $pfn:ty, $($arg:expr),*) => {{
        let p = $crate::real::driver($crate::interpose::Sym::$sym);
        if p.is_null() {
            cuda_abi::CUresult::CUDA_ERROR_NOT_FOUND
        } else {
            // SAFETY: p is the real driver's implementation of this symbol, whose C type is
            // $pfn per cuda-abi's table; the arguments are valid for it.
            unsafe { std::mem::transmute::<*mut std::ffi::c_void, $pfn>(p)($($arg),*) }
        }
    }};
}
pub(crate) use call_real;

/// The device of a stream's context on a driver without `cuStreamGetDevice`: the context
/// (`get_ctx`) is pushed, its device asked, and popped again whatever the answer (the caller's
/// current context is never left changed). The first refusal is the result.
fn device_via_context(
    get_ctx: impl FnOnce() -> Result<cuda_abi::CUcontext, cuda_abi::CUresult>,
    push: impl FnOnce(cuda_abi::CUcontext) -> cuda_abi::CUresult,
    get_device: impl FnOnce() -> Result<CUdevice, cuda_abi::CUresult>,
    pop: impl FnOnce(),
) -> Result<CUdevice, cuda_abi::CUresult> {
    let ctx = get_ctx()?;
    match push(ctx) {
        cuda_abi::CUresult::CUDA_SUCCESS => {}
        rc => return Err(rc),
    }
    let dev = get_device();
    pop();
    dev
}

/// The device of the calling thread's current context, as the driver says.
fn current_device() -> Result<CUdevice, cuda_abi::CUresult> {
    let mut dev: CUdevice = 0;
    match call_real!(cuCtxGetDevice: cuda_abi::PFN_cuCtxGetDevice_v2000, &mut dev) {
        cuda_abi::CUresult::CUDA_SUCCESS => Ok(dev),
        rc => Err(rc),
    }
}

/// Pops the context [`device_via_context`] pushed.
fn pop_current() {
    let mut popped: cuda_abi::CUcontext = std::ptr::null_mut();
    let _ = call_real!(cuCtxPopCurrent_v2: cuda_abi::PFN_cuCtxPopCurrent_v4000, &mut popped);
}

/// What the driver says about one ordinal.
struct Facts {
    total: u64,
    sms: u32,
    uuid: String,
}

/// NVML's text of a UUID: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn uuid_text(b: &[u8; 16]) -> String {
    let mut s = String::with_capacity(40);
    s.push_str("GPU-");
    for (i, x) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// Every ordinal the driver has (after `CUDA_VISIBLE_DEVICES`), with its memory, SMs and UUID.
fn device_facts() -> Vec<Facts> {
    use cuda_abi::*;
    let _ = call_real!(cuInit: PFN_cuInit_v2000, 0);
    let mut n: c_int = 0;
    if call_real!(cuDeviceGetCount: PFN_cuDeviceGetCount_v2000, &mut n) != CUresult::CUDA_SUCCESS {
        return Vec::new();
    }
    (0..n.clamp(0, crate::exit::MAX_DEVICES as c_int))
        .map(|ord| {
            let mut dev: CUdevice = 0;
            if call_real!(cuDeviceGet: PFN_cuDeviceGet_v2000, &mut dev, ord) != CUresult::CUDA_SUCCESS {
                return Facts { total: 0, sms: 1, uuid: String::new() };
            }
            let mut total: usize = 0;
            let total = match call_real!(cuDeviceTotalMem_v2: PFN_cuDeviceTotalMem_v3020, &mut total, dev) {
                CUresult::CUDA_SUCCESS => total as u64,
                _ => 0,
            };
            let mut sms: c_int = 0;
            let attr = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
            let sms = match call_real!(cuDeviceGetAttribute: PFN_cuDeviceGetAttribute_v2000, &mut sms, attr, dev) {
                CUresult::CUDA_SUCCESS if sms > 0 => sms as u32,
                _ => 1,
            };
            let mut u = CUuuid { bytes: [0; 16] };
            let uuid = match call_real!(cuDeviceGetUuid: PFN_cuDeviceGetUuid_v9020, &mut u, dev) {
                CUresult::CUDA_SUCCESS => uuid_text(&u.bytes),
                _ => String::new(),
            };
            Facts { total, sms, uuid }
        })
        .collect()
}

/// Which host GPU (ledger) counts ordinal `ord` of `n`, whose UUID is `uuid`: the `XSHARE_GPUS`
/// entry of that UUID; without `XSHARE_GPUS`, `gpu_index` when the process sees one GPU. Else
/// `Err(why)`: that GPU gets no quota.
pub fn host_index_of(cfg: &Config, ord: usize, n: usize, uuid: &str) -> Result<u32, String> {
    if !cfg.gpus.is_empty() {
        return cfg
            .gpus
            .iter()
            .find(|g| !uuid.is_empty() && g.uuid.eq_ignore_ascii_case(uuid))
            .map(|g| g.index)
            .ok_or_else(|| {
                format!("device {ord} ({uuid:?}) is not in {}: no quota on it", node_ledger::config::ENV_GPUS)
            });
    }
    if n <= 1 {
        return Ok(cfg.gpu_index);
    }
    Err(format!(
        "{n} devices visible but {} does not say which host GPU each is (one GPU index, {}, cannot \
         name them): no quota on device {ord} ({uuid:?})",
        node_ledger::config::ENV_GPUS,
        node_ledger::config::ENV_GPU_INDEX
    ))
}

fn build_gpu(cfg: &Config, ord: usize, n: usize, f: &Facts) -> Gpu {
    let limit = match cfg.memory.quota_bytes {
        Some(b) => b,
        None => (f.total as f64 * cfg.memory.quota_fraction) as u64,
    };
    if f.total == 0 && cfg.memory.quota_bytes.is_none() {
        tracing::error!(device = ord, "xcuda: device memory unknown and no quota_bytes configured: quota is 0");
    }
    let host = host_index_of(cfg, ord, n, &f.uuid);
    // Without the group's ledger this process cannot know what the rest of its container
    // holds, so it fails closed: alone against 0 bytes (never the whole quota for itself, and
    // it must not set a group's quota). The same for a GPU that no ledger can be named for.
    // (A config error was reported where it was found and fails closed the same way.)
    let opened = match (&host, cfg.failed_closed) {
        (_, true) => Err(None),
        (Err(e), false) => Err(Some(e.clone())),
        (Ok(h), false) => open_ledger(cfg, *h, limit).map_err(Some),
    };
    let quota = match opened {
        Ok(q) => q,
        Err(e) => {
            if let Some(e) = e {
                tracing::error!(device = ord, "xcuda: {e}; refusing device allocations on it (the group's quota cannot be checked without its ledger: check the ledger's mode and group, and XSHARE_GPUS)");
            }
            Quota::local(0)
        }
    };
    let quota = quota.owned_by(crate::exit::current_context);
    quota.set_test_check_pause_ms(cfg.memory.test_ledger_check_pause_ms);
    tracing::info!(device = ord, uuid = %f.uuid, host_gpu = ?host.as_ref().ok(), quota_bytes = quota.limit(), device_bytes = f.total, sms = f.sms, group = %cfg.group, "xcuda active");
    let throttle = Throttle::new(&cfg.throttle, f.sms);
    if let Ok(h) = host {
        floor_at_start(cfg, ord, h, &throttle);
    }
    Gpu::new(quota, throttle, f.total, host.ok(), f.uuid.clone())
}

fn build() -> State {
    let cfg = config();
    let mut facts = device_facts();
    if facts.is_empty() {
        // No device answered: one slot, as a single-GPU process (the driver refuses its calls).
        facts.push(Facts { total: 0, sms: 1, uuid: String::new() });
    }
    let n = facts.len();
    let gpus: Box<[Gpu]> = facts.iter().enumerate().map(|(ord, f)| build_gpu(cfg, ord, n, f)).collect();
    let unmapped = Gpu::new(Quota::local(0), Throttle::new(&cfg.clone().fail_closed().throttle, 1), 0, None, String::new());
    let st = State { gpus, contexts: Contexts::new(), unmapped, graph_mem: Default::default(), graph_cost: Default::default(), stream_pools: Default::default() };
    crate::exit::install_process_hooks(cfg);
    start_controller_when_ready();
    st
}

/// Called while the state is being built: the thread waits for it to be published.
fn start_controller_when_ready() {
    if CONTROLLER_ALIVE.swap(true, AcqRel) {
        return;
    }
    let spawned = crate::exit::spawn_shim_thread("xcuda-ctl", || {
        let _log = log_on_this_thread();
        let st = loop {
            if let Some(st) = get() {
                break st;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        run_controller(st);
    });
    if let Err(e) = spawned {
        CONTROLLER_ALIVE.store(false, Release);
        tracing::error!("xcuda: cannot start controller thread: {e}; waiters refill at the fallback rate");
    }
}

fn open_ledger(cfg: &Config, host_index: u32, limit: u64) -> Result<Quota, String> {
    let path = cfg.ledger_of(host_index).ledger_path();
    let ledger = Ledger::open_or_create(&path, host_index).map_err(|e| e.to_string())?;
    // The MPS percentage this process started with (fixed by MPS for its life), in its own
    // slot: the other offline jobs' shares and the monitor's judgement read it there.
    let pct = crate::budget::own_mps_pct(&|k| std::env::var(k).ok()).unwrap_or(0);
    let h = crate::quota::register_in_group(&ledger, group_id_for(&cfg.group), limit, pct)?;
    let have = ledger.group_quota(h.group);
    if have != limit {
        // The ledger never lets a member loosen a group (node_ledger::Ledger::group): `have` is
        // the tighter of this configuration and the group's live members', or the monitor's cap.
        tracing::info!(group = %cfg.group, have, configured = limit, "group quota differs from this process's configuration: the tighter one applies");
    }
    Ok(Quota::with_ledger(ledger, h))
}

/// Whether the controller thread is running (waiters refill themselves when it is not).
pub fn controller_alive() -> bool {
    CONTROLLER_ALIVE.load(Acquire)
}

/// Starts the controller thread if it is not running (first launch wait, after fork).
pub fn ensure_controller() {
    let Some(st) = get() else { return };
    if CONTROLLER_ALIVE.swap(true, AcqRel) {
        return;
    }
    let spawned = crate::exit::spawn_shim_thread("xcuda-ctl", move || {
        let _log = log_on_this_thread();
        run_controller(st);
    });
    if let Err(e) = spawned {
        CONTROLLER_ALIVE.store(false, Release);
        tracing::error!("xcuda: cannot start controller thread: {e}; waiters refill at the fallback rate");
    }
}

/// The controller thread's body: a panic in it is caught, logged and ends the thread as
/// "not running", so that launches waiting for a refill refill themselves at the fallback rate
/// instead of waiting for a controller that is gone.
fn run_controller(st: &'static State) {
    if std::panic::catch_unwind(|| controller(st, config())).is_err() {
        CONTROLLER_ALIVE.store(false, Release);
        tracing::error!("xcuda: the throttle's controller thread panicked; waiters refill at the fallback rate");
    }
}

/// Marks the controller as gone (fork child: threads do not survive fork).
pub fn controller_lost() {
    CONTROLLER_ALIVE.store(false, Release);
}

/// What the controller keeps per GPU between ticks.
struct Loop {
    pid: Pid,
    last_stale: Option<bool>,
    last_target: f64,
    reported: (u64, u64),
    /// This process's job's part of the offline SM budget (fraction of it, 0..=1), from the
    /// jobs registered on the GPU; refreshed with the housekeeping (see [`job_part`]).
    job_part: f64,
    /// The GPU's status file (the monitor's sample, the manager's budget), which the daemons
    /// alone write; `None` for an unmapped device (no host index: no throttle input).
    status: Option<node_ledger::StatusReader>,
    /// This process as its registration names it ([`node_ledger::ProcId::own`]): what the
    /// daemons' eviction requests are addressed to. Looked up again when the pid changes.
    me: Option<node_ledger::ProcId>,
}

/// What counter `now` advanced since `reported`, which moves up to it. The launch counter is a
/// plain load + store on the hot path (no locked read-modify-write), so under launches from
/// several threads it can step back: that reads as nothing new (never an underflow, which
/// panicked the controller in debug builds and wrapped the ledger's count in release ones).
fn since(now: u64, reported: &mut u64) -> u64 {
    let d = now.saturating_sub(*reported);
    *reported = (*reported).max(now);
    d
}

/// This process's job's part of GPU `g`'s offline SM budget: [`crate::budget::job_share`] of
/// a budget of 1 over the jobs on the GPU: those registered in its own ledger together with the
/// monitor's table of every ledger of the GPU (a pod's ledger shows its own jobs only), when
/// that table is fresh (within `stale_ns`, see [`crate::budget::fresh_jobs`]). 1 without a
/// ledger.
fn job_part(g: &Gpu, status: Option<&node_ledger::Status>, now_ns: u64, stale_ns: u64) -> f64 {
    let Some((l, h)) = g.quota.ledger() else { return 1.0 };
    let own = g.throttle.own_cap().map(|f| (f * 100.0).round() as u32);
    let group = h.map_or(0, |h| l.group_id(h.group));
    let mut jobs = l.offline_jobs();
    if let Some(table) = status.and_then(|s| crate::budget::fresh_jobs(s, now_ns, stale_ns, false)) {
        jobs = node_ledger::jobs::merge(&jobs, &table);
    }
    crate::budget::job_share(1.0, &jobs, group, own).clamp(0.0, 1.0)
}

/// Monitor data older than this are stale for GPU `g`'s throttle, ns: its control law's
/// (the process's own `throttle.stale_after_ms`, or a floor's held law's, [`Throttle::law`]).
fn stale_ns_of(g: &Gpu) -> u64 {
    g.throttle.law().stale_after_ms.saturating_mul(1_000_000)
}

fn controller(st: &'static State, cfg: &'static Config) {
    let tc = &cfg.throttle;
    let stale_ns = tc.stale_after_ms.saturating_mul(1_000_000);
    let mut loops: Vec<Loop> = st
        .gpus
        .iter()
        .map(|g| Loop {
            pid: Pid::new(tc),
            last_stale: None,
            last_target: tc.target_load,
            reported: (0, 0),
            // Its own ledger's view until the first housekeeping adds the monitor's table.
            job_part: job_part(g, None, 0, stale_ns),
            status: g.host_index.map(|i| node_ledger::StatusReader::new(cfg.ledger_of(i).status_path())),
            me: None,
        })
        .collect();
    let mut last = Instant::now();
    let mut last_house = Instant::now();
    while CONTROLLER_ALIVE.load(Acquire) {
        // The quickest law of the GPUs' (an operator's floor may hold one to a shorter period).
        let period_ms = st.gpus.iter().map(|g| g.throttle.law().period_ms).min().unwrap_or(tc.period_ms);
        std::thread::sleep(Duration::from_millis(period_ms.max(1)));
        let now = Instant::now();
        let dt = now.duration_since(last).as_secs_f64();
        last = now;
        let house = now.duration_since(last_house) >= Duration::from_millis(250);
        if house {
            last_house = now;
            crate::exit::watch_termination_file();
        }
        for (ord, (g, lp)) in st.gpus.iter().zip(loops.iter_mut()).enumerate() {
            tick(ord, g, lp, dt);
            crate::graphmem::tick(st, g, ord as CUdevice);
            crate::streampool::tick(st, g, ord as CUdevice);
            if house && !housekeeping(g, lp, stale_ns_of(g)) {
                return;
            }
        }
    }
}

/// One control step of GPU `g`'s throttle from its own status file's monitor sample and budget.
fn tick(ord: usize, g: &Gpu, lp: &mut Loop, dt: f64) {
    if let Some(e) = g.quota.check_ledger() {
        tracing::error!(device = ord, "xcuda: {e}; refusing new device allocations (frees still work) until this process restarts on a sound ledger");
    }
    let now_ns = node_ledger::clock::now_ns();
    // A status file not there yet, or stale and perhaps replaced, is looked at again (at most
    // once a second).
    let status = lp.status.as_mut().and_then(|r| r.get(now_ns, lp.last_stale.unwrap_or(true)));
    let snap = status.and_then(|st| st.read_monitor());
    // The operator's floor first: this tick's decision is made within it (and, a floor
    // requiring a throttle holding the control law, with the law's staleness).
    if let Some(f) = snap.and_then(|s| floor_in(&s, now_ns, stale_ns_of(g))) {
        hold_to_floor(ord, &g.throttle, &f);
    }
    let stale_ns = stale_ns_of(g);
    let sample = snap.filter(|s| s.is_fresh(now_ns, stale_ns)).map(|s| Sample {
        u_sm: f64::from(s.sample.sm_active_permille) / 1000.0,
        c_sm: f64::from(s.sample.sm_clock_mhz),
        c_h: f64::from(s.sample.sm_clock_max_mhz),
    });
    // The offline side's budget, of which this job has its part (the other jobs on the GPU
    // theirs): read here, on the periodic tick, never per launch.
    let budget = status.and_then(|st| crate::budget::fresh_budget(st, now_ns, stale_ns));
    let d = g.throttle.control_with_part(&mut lp.pid, sample, budget, lp.job_part, dt);
    g.throttle.refill(dt);
    if lp.last_stale != Some(d.stale) {
        tracing::info!(device = ord, stale = d.stale, rate = d.rate, "xcuda throttle input changed");
        lp.last_stale = Some(d.stale);
    }
    let target = g.throttle.target();
    if (target - lp.last_target).abs() > 1e-3 {
        tracing::info!(device = ord, target, budget = ?budget, job_part = lp.job_part, rate = d.rate, "xcuda throttle target changed");
        lp.last_target = target;
    }
}

/// The operator's floor for offline throttles in monitor snapshot `s`, if `s` is fresh: as
/// fresh as the throttle wants its samples (`stale_ns`, the process's own
/// `throttle.stale_after_ms`), or as the shipped setting wants them, whichever is looser, so
/// that a process cannot hide the floor by calling every sample stale. `None` without one.
fn floor_in(s: &node_ledger::MonitorSnapshot, now_ns: u64, stale_ns: u64) -> Option<node_ledger::ThrottleFloor> {
    let shipped_ns = crate::config::ThrottleConfig::default().stale_after_ms * 1_000_000;
    let f = s.sample.throttle_floor;
    (s.is_fresh(now_ns, stale_ns.max(shipped_ns)) && !f.is_none()).then_some(f)
}

/// Whether a floor has overridden this process's own throttle configuration yet (said once,
/// at WARN; later tightenings at INFO).
static FLOOR_SAID: AtomicBool = AtomicBool::new(false);

/// Holds `throttle` (of device `ord`) to the operator's floor `f`: a process may tighten its
/// throttle, never loosen it past the floor, whatever its own configuration says
/// (`XCUDA_THROTTLE`, `XCUDA_TARGET_LOAD`, `XCUDA_FALLBACK_RATE`, `XCUDA_CONFIG`), its control
/// law held to the shipped one when the floor requires a throttle. What was tightened stays so ([`xshare_control::Throttle::tighten`]), also once the monitor goes
/// quiet. Says so when the floor overrides the process's own settings.
fn hold_to_floor(ord: usize, throttle: &Throttle, f: &node_ledger::ThrottleFloor) {
    let own = throttle.config();
    let t = throttle.tighten(f.required, f.target_load_limit(), f.rate_limit(), f.fallback_rate_limit());
    if !t.any() {
        return;
    }
    let what = if t.turned_on {
        "xcuda: throttle turned on by the operator's floor (XCUDA_THROTTLE=0 / throttle.enabled: false ignored)"
    } else if t.law {
        "xcuda: throttle's control law held to the shipped one by the operator's floor (this process's looser XCUDA_CONFIG throttle settings ignored: bucket depth, online-pressure hold, clock weights, gains, period, staleness)"
    } else {
        "xcuda: throttle held to the operator's floor (this process's looser XCUDA_TARGET_LOAD / XCUDA_FALLBACK_RATE / XCUDA_CONFIG settings ignored)"
    };
    let law_held = t.law;
    let (target_load, max_rate, fallback_rate) = (throttle.target_load(), throttle.max_rate(), throttle.fallback_rate());
    if FLOOR_SAID.swap(true, Relaxed) {
        tracing::info!(device = ord, turned_on = t.turned_on, law_held, target_load, max_rate, fallback_rate, "{what}");
    } else {
        tracing::warn!(
            device = ord,
            turned_on = t.turned_on,
            law_held,
            target_load,
            own_target_load = own.target_load,
            max_rate,
            own_max_rate = own.max_rate,
            fallback_rate,
            own_fallback_rate = own.fallback_rate,
            "{what}"
        );
    }
}

/// Holds a new throttle of host GPU `host` to the floor in its status file, if one is
/// published and fresh, before the process's first launch (the controller's first tick comes
/// a period later).
fn floor_at_start(cfg: &Config, ord: usize, host: u32, throttle: &Throttle) {
    let Ok(st) = node_ledger::Status::open(&cfg.ledger_of(host).status_path()) else { return };
    let stale_ns = cfg.throttle.stale_after_ms.saturating_mul(1_000_000);
    if let Some(f) = st.read_monitor().and_then(|s| floor_in(&s, node_ledger::clock::now_ns(), stale_ns)) {
        hold_to_floor(ord, throttle, &f);
    }
}

/// Heartbeat, launch counts, dead-neighbour reclaim and eviction requests in GPU `g`'s ledger;
/// `false` once the process has been asked to leave (the controller stops).
fn housekeeping(g: &Gpu, lp: &mut Loop, stale_ns: u64) -> bool {
    let now_ns = node_ledger::clock::now_ns();
    let status = lp.status.as_mut().and_then(|r| r.get(now_ns, false));
    lp.job_part = job_part(g, status, now_ns, stale_ns);
    let Some((l, Some(h))) = g.quota.ledger() else { return true };
    l.heartbeat(h);
    let (n, d) = (g.throttle.launches.load(Relaxed), g.throttle.delayed.load(Relaxed));
    l.count_launches(h, since(n, &mut lp.reported.0), since(d, &mut lp.reported.1));
    // Ended read first: never more returned than entered in what is published.
    let ended = g.syncs.ended.load(Relaxed);
    l.set_syncs(h, g.syncs.begun.load(Relaxed), ended);
    if let Ok(v) = l.reclaim_dead() {
        for (pid, bytes) in v {
            tracing::info!(pid, bytes, "xcuda: reclaimed quota of a dead process");
        }
    }
    // Only a daemon's request addressed to this process (its pid namespace, pid and start
    // time as it registered them, kept here) says it must leave: in the status file, which
    // the daemons alone write. Nothing in the ledger, which every offline container can
    // write, asks a process to leave.
    let pid = std::process::id();
    if lp.me.is_none_or(|m| m.pid != pid) {
        // At the first look, and in a fork child (its own pid and start time).
        lp.me = node_ledger::ProcId::own();
    }
    let now_ns = node_ledger::clock::now_ns();
    let status = lp.status.as_mut().and_then(|r| r.get(now_ns, false));
    let sig = status.zip(lp.me).map_or(0, |(s, me)| s.evict_request(me));
    if sig != 0 {
        let sig = sig as c_int;
        tracing::warn!(sig, host_gpu = ?g.host_index, "xcuda: a node daemon asked this process to leave");
        // SAFETY: raising a signal at ourselves; the graceful-exit path handles it.
        unsafe { libc::kill(libc::getpid(), sig) };
        CONTROLLER_ALIVE.store(false, Release);
        return false;
    }
    true
}


#[cfg(test)]
mod tests {
    use super::*;

    fn cfg_with(gpus: &str) -> Config {
        let mut c = Config::default();
        assert!(c.apply_env(&|k| (k == "XSHARE_GPUS").then(|| gpus.to_string())).is_empty());
        c
    }

    /// Unmaps find their mappings on any GPU: a whole mapping (of a counted or an imported
    /// handle) by its start, with no table scanned (the common case: PyTorch unmaps page by
    /// page; before, every unmap scanned every GPU's 65,536-slot tables), a range over several
    /// mappings, or a range that starts at no mapping, by the scan; a retain finds the handle
    /// at a mapping's start or inside it.
    #[test]
    fn unmaps_and_retains_find_their_mappings_on_any_gpu() {
        use crate::quota::Kind;
        const PAGE: u64 = 20 << 20;
        let st = State {
            gpus: vec![Gpu::for_test(1 << 40), Gpu::for_test(1 << 40)].into_boxed_slice(),
            contexts: crate::exit::Contexts::new(),
            unmapped: Gpu::for_test(0),
            graph_mem: Default::default(),
            graph_cost: Default::default(),
            stream_pools: Default::default(),
        };
        let base = 0x7f00_0000_0000u64;
        let q = &st.gpus[1].quota;
        for i in 0..4u64 {
            let h = 0x1000 + i * 16;
            assert!(q.try_reserve(PAGE) && q.track(Kind::Vmm, h, PAGE));
            assert!(q.vmm_map_begin(h) && q.vmm_mapped(base + i * PAGE, PAGE, h));
        }
        assert!(std::ptr::eq(st.vmm_handle_at(base).unwrap().0, q));
        assert_eq!(st.vmm_handle_at(base + PAGE + 5).map(|(_, h)| h), Some(0x1010), "inside a mapping");
        crate::ptrmap::SCANS.with(|n| n.set(0));
        let (one, none) = st.unmap_take(base, PAGE);
        assert_eq!(one.iter().map(|t| (t.1, t.2, t.3)).collect::<Vec<_>>(), [(base, PAGE, 0x1000)]);
        assert!(none.is_empty());
        assert_eq!(crate::ptrmap::SCANS.with(|n| n.get()), 0, "a whole mapping: no table scanned");
        let (two, _) = st.unmap_take(base + PAGE, 2 * PAGE);
        assert_eq!(two.iter().map(|t| t.1).collect::<std::collections::BTreeSet<_>>(), [base + PAGE, base + 2 * PAGE].into());
        assert!(crate::ptrmap::SCANS.with(|n| n.get()) > 0, "a range over several: scanned");
        assert!(st.unmap_take(base, PAGE).0.is_empty(), "taken already");
        let (last, _) = st.unmap_take(base + 3 * PAGE - 4096, 2 * PAGE);
        assert_eq!(last.iter().map(|t| t.1).collect::<Vec<_>>(), [base + 3 * PAGE], "a range starting at no mapping: the scan");
        // An imported mapping, whole: found by its start, no scan either.
        let imp = base + 8 * PAGE;
        assert!(q.try_reserve(PAGE) && q.track(Kind::VmmImportMap, imp, PAGE));
        crate::ptrmap::SCANS.with(|n| n.set(0));
        let (vmm, imports) = st.unmap_take(imp, PAGE);
        assert!(vmm.is_empty());
        assert_eq!(imports.iter().map(|t| (t.1, t.2)).collect::<Vec<_>>(), [(imp, PAGE)]);
        assert_eq!(crate::ptrmap::SCANS.with(|n| n.get()), 0);
    }

    /// A launch counter that stepped back (a lost update between two launching threads) reads
    /// as nothing new, and what it counts afterwards is counted from the highest value seen:
    /// never an underflow (a panic of the controller thread in debug builds).
    #[test]
    fn a_counter_that_steps_back_counts_nothing_new() {
        let mut reported = 0;
        assert_eq!(since(10, &mut reported), 10);
        assert_eq!(since(6, &mut reported), 0, "stepped back");
        assert_eq!(reported, 10);
        assert_eq!(since(9, &mut reported), 0);
        assert_eq!(since(13, &mut reported), 3);
        assert_eq!(since(u64::MAX, &mut reported), u64::MAX - 13);
    }

    /// Before CUDA 12.8 (no `cuStreamGetDevice`) a stream's device is its context's: pushed,
    /// asked, popped, and popped even when the device query fails; a stream the driver cannot
    /// name is refused with the driver's answer, nothing pushed.
    #[test]
    fn a_streams_device_through_its_context_always_pops_what_it_pushed() {
        use cuda_abi::CUresult as R;
        use std::cell::Cell;
        let other = 0x51 as cuda_abi::CUcontext;
        let depth = Cell::new(0i32);
        let push = |c: cuda_abi::CUcontext| {
            assert_eq!(c, other, "the stream's own context is pushed");
            depth.set(depth.get() + 1);
            R::CUDA_SUCCESS
        };
        let pop = || depth.set(depth.get() - 1);
        assert_eq!(device_via_context(|| Ok(other), push, || Ok(1), pop), Ok(1));
        assert_eq!(depth.get(), 0);
        assert_eq!(device_via_context(|| Ok(other), push, || Err(R::CUDA_ERROR_INVALID_CONTEXT), pop), Err(R::CUDA_ERROR_INVALID_CONTEXT));
        assert_eq!(depth.get(), 0, "popped after a failed device query");
        let pushed = Cell::new(false);
        assert_eq!(
            device_via_context(|| Err(R::CUDA_ERROR_INVALID_HANDLE), |_| { pushed.set(true); R::CUDA_SUCCESS }, || Ok(0), || unreachable!()),
            Err(R::CUDA_ERROR_INVALID_HANDLE)
        );
        assert!(!pushed.get(), "an unknown stream: nothing pushed");
        assert_eq!(device_via_context(|| Ok(other), |_| R::CUDA_ERROR_INVALID_CONTEXT, || unreachable!(), || unreachable!()), Err(R::CUDA_ERROR_INVALID_CONTEXT));
    }

    const U0: &str = "GPU-00000000-0000-4000-8000-000000000000";
    const U1: &str = "GPU-11111111-1111-4111-8111-111111111111";

    /// Multi-GPU: each ordinal's ledger is the host GPU of its UUID, whatever the ordinal order
    /// (`CUDA_VISIBLE_DEVICES=1,0`: ordinal 0 is host GPU 1). Today's shim used one ledger
    /// (`XSHARE_GPU_INDEX`) for every device.
    #[test]
    fn each_ordinal_maps_to_the_host_gpu_of_its_uuid() {
        let c = cfg_with(&format!("0={U0},1={U1}"));
        assert_eq!(host_index_of(&c, 0, 2, &U1.to_lowercase()), Ok(1));
        assert_eq!(host_index_of(&c, 1, 2, &U0.to_uppercase()), Ok(0));
        let e = host_index_of(&c, 1, 2, "GPU-22222222-2222-4222-8222-222222222222").unwrap_err();
        assert!(e.contains("XSHARE_GPUS") && e.contains("no quota"), "{e}");
        assert!(host_index_of(&c, 0, 1, "").is_err(), "no UUID from the driver: unmapped");
    }

    #[test]
    fn without_a_map_one_gpu_uses_gpu_index_and_several_fail_closed() {
        let c = Config { gpu_index: 3, ..Config::default() };
        assert_eq!(host_index_of(&c, 0, 1, U0), Ok(3), "single GPU: unchanged behaviour");
        let e = host_index_of(&c, 0, 2, U0).unwrap_err();
        assert!(e.contains("2 devices visible"), "{e}");
    }

    #[test]
    fn a_bad_map_is_a_config_error() {
        let mut c = Config::default();
        let errs = c.apply_env(&|k| (k == "XSHARE_GPUS").then(|| "0=GPU-x".to_string()));
        assert_eq!(errs.len(), 1);
        assert!(errs[0].to_string().contains("XSHARE_GPUS"), "{}", errs[0]);
    }

    #[test]
    fn uuid_text_matches_nvml() {
        let mut b = [0u8; 16];
        b[0] = 0xab;
        b[15] = 0x01;
        assert_eq!(uuid_text(&b), "GPU-ab000000-0000-0000-0000-000000000001");
    }

    /// The floor is taken from a snapshot fresh by the shipped rule even when the process
    /// calls every sample stale (its own `stale_after_ms`: the tenant's to set), never from a
    /// stale one or a sample without one; held to it, a throttle the process turned off is on.
    /// Fails with the process's own freshness rule alone (first assertion).
    #[test]
    fn a_process_cannot_hide_the_floor_by_calling_every_sample_stale() {
        let floor = node_ledger::ThrottleFloor { required: true, max_target_load: 0.8, max_rate: 1e5, max_fallback_rate: 50.0 };
        let now = 100_000_000_000;
        let snap = |age_ns: u64, f| node_ledger::MonitorSnapshot {
            sample: node_ledger::MonitorSample { throttle_floor: f, ..Default::default() },
            publish_ns: now - age_ns,
            seq: 2,
            monitor_pid: 1,
        };
        assert_eq!(floor_in(&snap(10_000_000, floor), now, 1_000_000), Some(floor), "own stale_after_ms 1");
        assert_eq!(floor_in(&snap(10_000_000_000, floor), now, 500_000_000), None, "a stale snapshot");
        assert_eq!(floor_in(&snap(0, Default::default()), now, 500_000_000), None, "no floor published");
        let own = crate::config::ThrottleConfig { enabled: false, ..Default::default() };
        let t = Throttle::new(&own, 10);
        assert!(!t.enabled());
        hold_to_floor(0, &t, &floor);
        assert!(t.enabled(), "turned on by the floor");
    }

    #[test]
    fn logging_never_installs_a_global_subscriber() {
        super::logged(|| tracing::warn!("xcuda test line"));
        drop(super::log_on_this_thread());
        // An application initialising its own logging afterwards must still be able to.
        assert!(
            tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::default()).is_ok(),
            "the host application's logging is left alone"
        );
    }
}
