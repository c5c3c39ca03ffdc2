//! Test client for the shim's end-to-end tests: opens `libcuda.so.1` with `dlopen` and resolves
//! every driver function either through `dlsym` (`--resolve dlsym`) or `cuGetProcAddress_v2`
//! with flags 0 or 2 (`--resolve gpa0|gpa2`) or the older `cuGetProcAddress` (`gpa1|gpa1pt`), then runs the steps given as arguments, printing
//! one `key=value` line per result. `--hold` first: print `loaded` and wait for a line on
//! stdin before anything else (the shim's library constructor has run, no driver call yet).
//!
//! Steps: `ctx` | `primary` | `alloc N` | `pitch W H` | `managed N` | `async N` | `pool N` |
//! `vmm N` | `vmmon DEV N` | `array W H` | `array3d W H D` | `array3draced W H D W2` (cuArray3DCreate_v2
//! of W x H x D floats while "another thread" widens the caller's descriptor to W2 at the
//! emulator's next cuCtxGetCurrent, after the shim read it) | `arrayv1 W H` / `array3dv1 W H D` (the CUDA 2.0 ABI) | `mipmap W H LEVELS` | `mipmaplayered W H LAYERS LEVELS` | `free` (last) | `freeall` |
//! `meminfo` | `totalmem` | `launch|launchex|launchcoop|launchgraph|launchlegacy|launchgrid|launchgridasync|launchmulti BLOCKS CYCLES COUNT` |
//! `graphnodes NODES BLOCKS CYCLES COUNT GROW` (see the step) | `legacychecks CYCLES` | `where NAME VERSION` | `next SYMBOL`
//! (dlsym(RTLD_NEXT)) | `fork` (child sleeps 30 s, no CUDA) | `forksig MS` (fork while another
//! thread sets SIGINT's action; the child is sent SIGINT, see the step) | `nvmlmem` (NVML via dlopen) | `ready` |
//! `eventwaitnoctx BLOCKS CYCLES` (see the step) |
//! `wait` | `sleep MS` | `hang` | `closeledgerlocks` (close every fd holding a lock on the ledger file) | `churn N` (alloc + free N bytes until a call fails, then exit 2) | `destroy` | `release` (primary context of device 0) |
//! `reset` (cuDevicePrimaryCtxReset_v2 on device 0) | `setlimit LIMIT VALUE` / `getlimit LIMIT`
//! (cuCtxSetLimit / cuCtxGetLimit, LIMIT as its CUlimit number) | `env NAME` (prints `env=VALUE`) | `exit`. `destroy`, `release` and `reset`
//! forget the held allocations (the driver frees a dead context's memory).
//! `capturemem BYTES FREE COUNT PRE` (a cuMemAllocAsync captured from a stream into a graph,
//! PRE bytes then allocated with cuMemAlloc, the graph launched COUNT times; `capturememnull` the
//! same on the null stream: the per-thread default stream under `--resolve gpa2`). `capturept` (a
//! global-mode capture begun on CU_STREAM_PER_THREAD and left running; capture queries on the
//! legacy and per-thread streams). `capturebegin` (a global-mode capture begun on a new stream
//! and left running). `capturethread` (a global-mode capture ended first from
//! another thread, then from its own). `capturelaunch N BLOCKS CYCLES` (N launches recorded in
//! a capture, then one run). `capturerace N BYTES` (stream-ordered allocations racing another
//! thread's captures). `capturesig N TO_GRAPH` (a SIGTERM handler, then a capture
//! of N launches 20 ms apart, into a graph of its own when TO_GRAPH is 1, through the CUDA 10.0
//! `cuStreamBeginCapture` (no mode) when it is 2; see the step).
//! Stream-ordered pools: `poolthreshold N|max` (the release threshold of device 0's current
//! pool) | `pooltrim N` (cuMemPoolTrimTo of device 0's current pool) | `poolon DEV N` (a pool
//! created on device DEV, N bytes allocated from it) | `asyncon DEV N` (cuMemAllocAsync of N bytes on a
//! stream of a context on device DEV, the current context unchanged) | `poolattr` (device 0's current pool's
//! reserved and used bytes); `graphmemthreads N BYTES` (N threads launching graphs of their own
//! with a BYTES memory node at once); `free` of an async allocation is cuMemFreeAsync + cuCtxSynchronize,
//! `freeasync` cuMemFreeAsync alone; `sync` (cuCtxSynchronize).

use cuda_abi::*;
use e2e::client::{
    die, dlopen, init_or_die, out, spin_launch_config, spin_node_params, Contexts, Kernels, Memory,
    Resolve, SpinLoad,
};
use e2e::get;
use std::ffi::{c_void, CStr, CString};
use std::io::BufRead;
use std::os::raw::{c_int, c_uint};

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Dlsym,
    /// cuGetProcAddress_v2 with these flags.
    Gpa(u64),
    /// cuGetProcAddress (the CUDA 11.3 ABI, no symbolStatus) with these flags.
    GpaV1(u64),
}

/// The descriptor `array3draced` hands the driver, and the width "another thread" gives it.
static RACED_DESC: std::sync::atomic::AtomicPtr<CUDA_ARRAY3D_DESCRIPTOR> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
static RACED_WIDTH: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A `w` x `h` x `d` array of one float channel.
fn float_desc3d(w: usize, h: usize, d: usize) -> CUDA_ARRAY3D_DESCRIPTOR {
    CUDA_ARRAY3D_DESCRIPTOR { Width: w, Height: h, Depth: d, Format: CUarray_format::CU_AD_FORMAT_FLOAT, NumChannels: 1, Flags: 0 }
}

/// The emulator's test hook for `array3draced`: widens the caller's descriptor.
extern "C" fn widen_raced_desc() {
    let p = RACED_DESC.load(std::sync::atomic::Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: the leaked descriptor of `array3draced`, alive for the process.
        unsafe { (*p).Width = RACED_WIDTH.load(std::sync::atomic::Ordering::Acquire) };
    }
}

struct Cuda {
    lib: *mut c_void,
    mode: Mode,
    gpa: Option<PFN_cuGetProcAddress_v12000>,
    gpa1: Option<PFN_cuGetProcAddress_v11030>,
}

impl Cuda {
    fn load(mode: Mode) -> Cuda {
        let lib = dlopen("libcuda.so.1");
        let mut cu = Cuda {
            lib,
            mode,
            gpa: None,
            gpa1: None,
        };
        let p = cu.dlsym("cuGetProcAddress_v2");
        if !p.is_null() {
            // SAFETY: the exported symbol has the PFN_cuGetProcAddress_v12000 ABI.
            cu.gpa =
                Some(unsafe { std::mem::transmute::<*mut c_void, PFN_cuGetProcAddress_v12000>(p) });
        }
        let p = cu.dlsym("cuGetProcAddress");
        if !p.is_null() {
            // SAFETY: the exported symbol has the PFN_cuGetProcAddress_v11030 ABI.
            cu.gpa1 =
                Some(unsafe { std::mem::transmute::<*mut c_void, PFN_cuGetProcAddress_v11030>(p) });
        }
        cu
    }

    fn dlsym(&self, symbol: &str) -> *mut c_void {
        let s = CString::new(symbol).expect("no NUL");
        // SAFETY: dlsym on a live handle with a valid C string.
        unsafe { libc::dlsym(self.lib, s.as_ptr()) }
    }

    /// The function for API `name` at ABI `version`, resolved the way this client was told.
    fn get(&self, name: &str, version: c_int) -> *mut c_void {
        match self.mode {
            Mode::Dlsym => match resolve(name, version, 0) {
                Resolution::Found(e) => self.dlsym(e.symbol),
                _ => die(&format!("no table entry for {name}@{version}")),
            },
            Mode::Gpa(flags) => {
                let gpa = self
                    .gpa
                    .unwrap_or_else(|| die("cuGetProcAddress_v2 missing"));
                let n = CString::new(name).expect("no NUL");
                let mut p = std::ptr::null_mut();
                let mut q = CUdriverProcAddressQueryResult(99);
                // SAFETY: valid name, out-pointers to locals.
                let r = unsafe { gpa(n.as_ptr(), &mut p, version, flags, &mut q) };
                if !r.is_success() {
                    die(&format!(
                        "cuGetProcAddress_v2({name}, {version}, {flags}) = {r}"
                    ));
                }
                p
            }
            Mode::GpaV1(flags) => {
                let gpa = self.gpa1.unwrap_or_else(|| die("cuGetProcAddress missing"));
                let n = CString::new(name).expect("no NUL");
                let mut p = std::ptr::null_mut();
                // SAFETY: valid name, out-pointer to a local.
                let r = unsafe { gpa(n.as_ptr(), &mut p, version, flags) };
                if !r.is_success() {
                    die(&format!(
                        "cuGetProcAddress({name}, {version}, {flags}) = {r}"
                    ));
                }
                p
            }
        }
    }
}

impl Resolve for Cuda {
    fn resolve(&self, name: &str, version: c_int) -> *mut c_void {
        let p = self.get(name, version);
        if p.is_null() {
            die(&format!("null pointer for {name}"));
        }
        p
    }
}

/// `file(symbol)` of the object and nearest symbol holding address `p`.
fn object_of(p: *mut c_void) -> String {
    // SAFETY: Dl_info is plain data; dladdr only inspects the address.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if p.is_null() || unsafe { libc::dladdr(p, &mut info) } == 0 || info.dli_fname.is_null() {
        return "null".into();
    }
    // SAFETY: dladdr filled a NUL-terminated loader-owned string.
    let f = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned();
    let sym = if info.dli_sname.is_null() {
        "?".to_string()
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(info.dli_sname) }
            .to_string_lossy()
            .into_owned()
    };
    format!("{}({sym})", f.rsplit('/').next().unwrap_or(&f))
}

/// nvmlMemory_t / nvmlMemory_v2_t as laid out in nvml.h.
#[repr(C)]
#[derive(Default)]
struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}
#[repr(C)]
#[derive(Default)]
struct NvmlMemoryV2 {
    version: u32,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

/// Device 0's memory through NVML (v1 and v2), loaded like monitoring tools do.
fn nvml_memory() -> (u64, u64, u64, u64, u64, u64) {
    let lib = dlopen("libnvidia-ml.so.1");
    let sym = |n: &str| {
        let c = CString::new(n).expect("no NUL");
        // SAFETY: dlsym on a live handle.
        let p = unsafe { libc::dlsym(lib, c.as_ptr()) };
        if p.is_null() {
            die(&format!("{n} missing"));
        }
        p
    };
    type Init = unsafe extern "C" fn() -> u32;
    type ByIndex = unsafe extern "C" fn(u32, *mut *mut c_void) -> u32;
    type Mem = unsafe extern "C" fn(*mut c_void, *mut NvmlMemory) -> u32;
    type Mem2 = unsafe extern "C" fn(*mut c_void, *mut NvmlMemoryV2) -> u32;
    // SAFETY: the symbols have these C types per nvml.h; out-pointers are locals.
    unsafe {
        let init: Init = std::mem::transmute(sym("nvmlInit_v2"));
        let by_index: ByIndex = std::mem::transmute(sym("nvmlDeviceGetHandleByIndex_v2"));
        let mem: Mem = std::mem::transmute(sym("nvmlDeviceGetMemoryInfo"));
        let mem2: Mem2 = std::mem::transmute(sym("nvmlDeviceGetMemoryInfo_v2"));
        if init() != 0 {
            die("nvmlInit_v2");
        }
        let mut dev = std::ptr::null_mut();
        if by_index(0, &mut dev) != 0 {
            die("nvmlDeviceGetHandleByIndex_v2");
        }
        let mut m = NvmlMemory::default();
        let r1 = mem(dev, &mut m);
        let mut m2 = NvmlMemoryV2 {
            version: (std::mem::size_of::<NvmlMemoryV2>() as u32) | (2 << 24),
            ..Default::default()
        };
        let r2 = mem2(dev, &mut m2);
        if r1 != 0 || r2 != 0 {
            die(&format!("nvmlDeviceGetMemoryInfo {r1} / _v2 {r2}"));
        }
        (m.total, m.free, m.used, m2.total, m2.free, m2.used)
    }
}

enum Held {
    Dev(CUdeviceptr),
    Async(CUdeviceptr),
    Vmm(CUmemGenericAllocationHandle),
    Array(CUarray),
    Mip(CUmipmappedArray),
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut mode = Mode::Gpa(0);
    if args.first().map(String::as_str) == Some("--hold") {
        // Loaded (library constructors ran, `main` runs) with no driver call made yet.
        out("loaded".into());
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
        args.remove(0);
    }
    if args.first().map(String::as_str) == Some("--resolve") {
        mode = match args.get(1).map(String::as_str) {
            Some("dlsym") => Mode::Dlsym,
            Some("gpa0") => Mode::Gpa(0),
            Some("gpa2") => Mode::Gpa(2),
            Some("gpa1") => Mode::GpaV1(0),
            Some("gpa1pt") => Mode::GpaV1(2),
            _ => die("--resolve dlsym|gpa0|gpa2|gpa1|gpa1pt"),
        };
        args.drain(..2);
    }
    let cu = Cuda::load(mode);
    let Contexts { init, create: ctx_create, destroy: ctx_destroy, retain, release: primary_release, set_current, sync } =
        Contexts::resolve(&cu);
    let Memory { alloc: mem_alloc, free: mem_free, info: mem_info } = Memory::resolve(&cu);
    let kernels = Kernels::resolve(&cu);
    let launch = kernels.launch;
    let device_count = get!(cu, "cuDeviceGetCount", PFN_cuDeviceGetCount_v2000, 2000);
    let device_uuid = get!(cu, "cuDeviceGetUuid", PFN_cuDeviceGetUuid_v9020, 9020);
    let primary_reset = get!(cu, "cuDevicePrimaryCtxReset", PFN_cuDevicePrimaryCtxReset_v11000, 11000);
    let pitch = get!(cu, "cuMemAllocPitch", PFN_cuMemAllocPitch_v3020, 3020);
    let managed = get!(cu, "cuMemAllocManaged", PFN_cuMemAllocManaged_v6000, 6000);
    let alloc_async = get!(cu, "cuMemAllocAsync", PFN_cuMemAllocAsync_v11020, 11020);
    let free_async = get!(cu, "cuMemFreeAsync", PFN_cuMemFreeAsync_v11020, 11020);
    let pool_create = get!(cu, "cuMemPoolCreate", PFN_cuMemPoolCreate_v11020, 11020);
    let pool_alloc = get!(
        cu,
        "cuMemAllocFromPoolAsync",
        PFN_cuMemAllocFromPoolAsync_v11020,
        11020
    );
    let pool_current = get!(cu, "cuDeviceGetMemPool", PFN_cuDeviceGetMemPool_v11020, 11020);
    let pool_set_attr = get!(cu, "cuMemPoolSetAttribute", PFN_cuMemPoolSetAttribute_v11020, 11020);
    let pool_get_attr = get!(cu, "cuMemPoolGetAttribute", PFN_cuMemPoolGetAttribute_v11020, 11020);
    let pool_trim = get!(cu, "cuMemPoolTrimTo", PFN_cuMemPoolTrimTo_v11020, 11020);
    // A pinned pool on device ordinal `dev`: the driver's answer and the pool.
    let new_pool = |dev: c_int| {
        // SAFETY: CUmemPoolProps is plain data; all zeroes is its documented default.
        let mut props: CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type_ = CUmemLocationType(1);
        props.location.id = dev;
        let mut on: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: the driver's entry point, live locals for its properties and out-pointer.
        (unsafe { pool_create(&mut on, &props) }, on)
    };
    // Device 0's current pool (its default one unless set).
    let current_pool = || {
        let mut p: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: the driver's entry point, an out-pointer to a local.
        let r = unsafe { pool_current(&mut p, 0) };
        if !r.is_success() {
            die(&format!("cuDeviceGetMemPool {r}"));
        }
        p
    };
    let mem_create = get!(cu, "cuMemCreate", PFN_cuMemCreate_v10020, 10020);
    let mem_release = get!(cu, "cuMemRelease", PFN_cuMemRelease_v10020, 10020);
    let addr_reserve = get!(cu, "cuMemAddressReserve", PFN_cuMemAddressReserve_v10020, 10020);
    let mem_map = get!(cu, "cuMemMap", PFN_cuMemMap_v10020, 10020);
    let mem_export = get!(cu, "cuMemExportToShareableHandle", PFN_cuMemExportToShareableHandle_v10020, 10020);
    let mem_import = get!(cu, "cuMemImportFromShareableHandle", PFN_cuMemImportFromShareableHandle_v10020, 10020);
    let array_create = get!(cu, "cuArrayCreate", PFN_cuArrayCreate_v3020, 3020);
    let array3d_create = get!(cu, "cuArray3DCreate", PFN_cuArray3DCreate_v3020, 3020);
    // The CUDA 2.0 ABI (32-bit sizes): the unversioned symbols, or cudaVersion 2000.
    let array_create_v1 = get!(cu, "cuArrayCreate", PFN_cuArrayCreate_v2000, 2000);
    let array3d_create_v1 = get!(cu, "cuArray3DCreate", PFN_cuArray3DCreate_v2000, 2000);
    let array_destroy = get!(cu, "cuArrayDestroy", PFN_cuArrayDestroy_v2000, 2000);
    let mip_create = get!(
        cu,
        "cuMipmappedArrayCreate",
        PFN_cuMipmappedArrayCreate_v5000,
        5000
    );
    // A mipmapped float array (W x H x DEPTH with FLAGS, LEVELS levels), held on success.
    let mipmapped =
        |held: &mut Vec<Held>, w: usize, h: usize, depth: usize, flags: c_uint, levels: usize| {
            let desc = CUDA_ARRAY3D_DESCRIPTOR {
                Width: w,
                Height: h,
                Depth: depth,
                Format: CUarray_format::CU_AD_FORMAT_FLOAT,
                NumChannels: 1,
                Flags: flags,
            };
            let mut m: CUmipmappedArray = std::ptr::null_mut();
            // SAFETY: the driver's own entry point, called with live locals for its descriptor
            // and out-pointer.
            let r = unsafe { mip_create(&mut m, &desc, levels as c_uint) };
            if r.is_success() {
                held.push(Held::Mip(m));
            }
            r
        };
    let mip_destroy = get!(
        cu,
        "cuMipmappedArrayDestroy",
        PFN_cuMipmappedArrayDestroy_v5000,
        5000
    );
    let total_mem = get!(cu, "cuDeviceTotalMem", PFN_cuDeviceTotalMem_v3020, 3020);
    let launch_ex = get!(cu, "cuLaunchKernelEx", PFN_cuLaunchKernelEx_v11060, 11060);
    let launch_coop = get!(
        cu,
        "cuLaunchCooperativeKernel",
        PFN_cuLaunchCooperativeKernel_v9000,
        9000
    );
    // CUDA 2.0's execution control (deprecated, still exported) and the multi-device launch.
    let func_block_shape = get!(cu, "cuFuncSetBlockShape", PFN_cuFuncSetBlockShape_v2000, 2000);
    let param_set_size = get!(cu, "cuParamSetSize", PFN_cuParamSetSize_v2000, 2000);
    let param_setv = get!(cu, "cuParamSetv", PFN_cuParamSetv_v2000, 2000);
    let launch_legacy = get!(cu, "cuLaunch", PFN_cuLaunch_v2000, 2000);
    let launch_grid = get!(cu, "cuLaunchGrid", PFN_cuLaunchGrid_v2000, 2000);
    let launch_grid_async = get!(cu, "cuLaunchGridAsync", PFN_cuLaunchGridAsync_v2000, 2000);
    let launch_multi = get!(cu, "cuLaunchCooperativeKernelMultiDevice", PFN_cuLaunchCooperativeKernelMultiDevice_v9000, 9000);
    let graph_create = get!(cu, "cuGraphCreate", PFN_cuGraphCreate_v10000, 10000);
    let graph_add_kernel = get!(
        cu,
        "cuGraphAddKernelNode",
        PFN_cuGraphAddKernelNode_v12000,
        12000
    );
    let graph_instantiate = get!(
        cu,
        "cuGraphInstantiateWithFlags",
        PFN_cuGraphInstantiateWithFlags_v11040,
        11040
    );
    let graph_launch = get!(cu, "cuGraphLaunch", PFN_cuGraphLaunch_v10000, 10000);
    let graph_exec_kernel_set = get!(cu, "cuGraphExecKernelNodeSetParams", PFN_cuGraphExecKernelNodeSetParams_v12000, 12000);
    let graph_add_alloc = get!(cu, "cuGraphAddMemAllocNode", PFN_cuGraphAddMemAllocNode_v11040, 11040);
    let graph_add_node = get!(cu, "cuGraphAddNode", PFN_cuGraphAddNode_v12030, 12030);
    let graph_add_free = get!(cu, "cuGraphAddMemFreeNode", PFN_cuGraphAddMemFreeNode_v11040, 11040);
    let graph_trim = get!(cu, "cuDeviceGraphMemTrim", PFN_cuDeviceGraphMemTrim_v11040, 11040);
    let graph_attr = get!(cu, "cuDeviceGetGraphMemAttribute", PFN_cuDeviceGetGraphMemAttribute_v11040, 11040);
    let graph_exec_destroy = get!(cu, "cuGraphExecDestroy", PFN_cuGraphExecDestroy_v10000, 10000);
    let set_limit = get!(cu, "cuCtxSetLimit", PFN_cuCtxSetLimit_v3010, 3010);
    let get_limit = get!(cu, "cuCtxGetLimit", PFN_cuCtxGetLimit_v3010, 3010);
    let stream_create = get!(cu, "cuStreamCreate", PFN_cuStreamCreate_v2000, 2000);
    let stream_sync = get!(cu, "cuStreamSynchronize", PFN_cuStreamSynchronize_v2000, 2000);
    let capture_begin = get!(cu, "cuStreamBeginCapture", PFN_cuStreamBeginCapture_v10010, 10010);
    let capture_begin_legacy = get!(cu, "cuStreamBeginCapture", PFN_cuStreamBeginCapture_v10000, 10000);
    let capture_end = get!(cu, "cuStreamEndCapture", PFN_cuStreamEndCapture_v10000, 10000);
    let capture_to_graph = get!(cu, "cuStreamBeginCaptureToGraph", PFN_cuStreamBeginCaptureToGraph_v12030, 12030);
    let is_capturing = get!(cu, "cuStreamIsCapturing", PFN_cuStreamIsCapturing_v10000, 10000);
    let event_create = get!(cu, "cuEventCreate", PFN_cuEventCreate_v2000, 2000);
    let event_record = get!(cu, "cuEventRecord", PFN_cuEventRecord_v2000, 2000);
    let event_sync = get!(cu, "cuEventSynchronize", PFN_cuEventSynchronize_v2000, 2000);

    // SAFETY (all calls below): functions resolved above with their PFN types; arguments are
    // locals or values the driver returned.
    unsafe {
        init_or_die(init);
        let mut ctx: CUcontext = std::ptr::null_mut();
        let mut held: Vec<Held> = Vec::new();
        let mut spin_fn: CUfunction = std::ptr::null_mut();
        let mut pool: CUmemoryPool = std::ptr::null_mut();
        let stream: CUstream = std::ptr::null_mut();
        let mut i = 0;
        let num = |k: usize, i: usize| -> usize {
            args.get(i + k)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| die(&format!("{} needs numeric argument {k}", args[i])))
        };
        let free_one = |h: Held| -> CUresult {
            match h {
                Held::Dev(p) => mem_free(p),
                Held::Async(p) => {
                    let r = free_async(p, stream);
                    if r.is_success() {
                        sync()
                    } else {
                        r
                    }
                }
                Held::Vmm(h) => mem_release(h),
                Held::Array(a) => array_destroy(a),
                Held::Mip(m) => mip_destroy(m),
            }
        };
        // A graph of NODES kernel nodes (`p` each), one after another, instantiated: the first
        // failure (or success), the nodes, the exec.
        let spin_chain = |nodes: usize, p: &CUDA_KERNEL_NODE_PARAMS| -> (CUresult, Vec<CUgraphNode>, CUgraphExec) {
            let mut g: CUgraph = std::ptr::null_mut();
            let mut r = graph_create(&mut g, 0);
            let mut handles: Vec<CUgraphNode> = Vec::new();
            let mut prev: CUgraphNode = std::ptr::null_mut();
            for _ in 0..nodes {
                if !r.is_success() {
                    break;
                }
                let mut node: CUgraphNode = std::ptr::null_mut();
                let deps = if prev.is_null() { 0 } else { 1 };
                r = graph_add_kernel(&mut node, g, &prev, deps, p);
                handles.push(node);
                prev = node;
            }
            let mut exec: CUgraphExec = std::ptr::null_mut();
            if r.is_success() {
                r = graph_instantiate(&mut exec, g, 0);
            }
            (r, handles, exec)
        };
        while i < args.len() {
            let step = args[i].clone();
            match step.as_str() {
                "ctx" => out(format!("ctx={}", ctx_create(&mut ctx, 0, 0).0)),
                // Multi-GPU: a context on device ordinal N, made current (held allocations
                // stay with the context they were made in).
                "ctxon" => {
                    let d = num(1, i) as CUdevice;
                    i += 1;
                    out(format!("ctxon={} dev={d}", ctx_create(&mut ctx, 0, d).0));
                    // Modules belong to a context: load the kernel again in this one.
                    spin_fn = std::ptr::null_mut();
                }
                // Graph memory: a graph with one BYTES alloc node on device 0 (freed in the
                // graph when FREE is 1), instantiated, launched COUNT times; prints the node's
                // and each launch's result and the driver's pool figures. `graphmemp` takes a
                // fourth argument, FLAGS, and instantiates with cuGraphInstantiateWithParams
                // (FLAGS 2 = CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD, into the client's stream) and
                // prints `inst=` (its result) and `result_out=`.
                // `graphmemnode BYTES FREE COUNT`: `graphmem` with the alloc node added by the
                // generic cuGraphAddNode (CUDA 12.3 ABI, CU_GRAPH_NODE_TYPE_MEM_ALLOC).
                "graphmem" | "graphmemp" | "graphmemnode" => {
                    let (bytes, free_in_graph, count) = (num(1, i), num(2, i) == 1, num(3, i));
                    let with_params = step == "graphmemp";
                    let flags = if with_params { num(4, i) as u64 } else { 0 };
                    i += if with_params { 4 } else { 3 };
                    let mut g: CUgraph = std::ptr::null_mut();
                    let mut r = graph_create(&mut g, 0);
                    let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = std::mem::zeroed();
                    p.poolProps.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
                    p.poolProps.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
                    p.bytesize = bytes;
                    let mut node: CUgraphNode = std::ptr::null_mut();
                    if r.is_success() && step == "graphmemnode" {
                        let mut np: CUgraphNodeParams = std::mem::zeroed();
                        np.type_ = CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC;
                        np.u.alloc = p;
                        r = graph_add_node(&mut node, g, std::ptr::null(), std::ptr::null(), 0, &mut np);
                        p.dptr = np.u.alloc.dptr;
                    } else if r.is_success() {
                        r = graph_add_alloc(&mut node, g, std::ptr::null(), 0, &mut p);
                    }
                    let node_rc = r.0;
                    if r.is_success() && free_in_graph {
                        let mut fnode: CUgraphNode = std::ptr::null_mut();
                        r = graph_add_free(&mut fnode, g, &node, 1, p.dptr);
                    }
                    let mut exec: CUgraphExec = std::ptr::null_mut();
                    let mut extra = String::new();
                    if r.is_success() && with_params {
                        let inst = get!(cu, "cuGraphInstantiateWithParams", PFN_cuGraphInstantiateWithParams_v12000, 12000);
                        let mut ip = CUDA_GRAPH_INSTANTIATE_PARAMS {
                            flags,
                            hUploadStream: stream,
                            hErrNode_out: std::ptr::null_mut(),
                            result_out: CUgraphInstantiateResult(99),
                        };
                        r = inst(&mut exec, g, &mut ip);
                        extra = format!(" inst={} result_out={}", r.0, ip.result_out.0);
                        let _ = sync();
                    } else if r.is_success() {
                        r = graph_instantiate(&mut exec, g, 0);
                    }
                    let mut rcs = Vec::new();
                    for _ in 0..count {
                        if r.is_success() || !rcs.is_empty() {
                            let l = graph_launch(exec, stream);
                            rcs.push(l.0.to_string());
                            let _ = sync();
                        }
                    }
                    if !exec.is_null() {
                        graph_exec_destroy(exec);
                    }
                    if !free_in_graph && p.dptr != 0 {
                        held.push(Held::Dev(p.dptr));
                    }
                    let (mut used, mut reserved) = (0u64, 0u64);
                    graph_attr(0, CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, (&mut used as *mut u64).cast());
                    graph_attr(0, CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, (&mut reserved as *mut u64).cast());
                    out(format!(
                        "{step}={} node={node_rc} launches={} pool_used={used} pool_reserved={reserved}{extra}",
                        rcs.first().cloned().unwrap_or_else(|| r.0.to_string()),
                        rcs.join(",")
                    ));
                }
                // `graphmemthreads N BYTES`: N threads, each with a graph of its own holding one
                // BYTES alloc node on device 0 (not freed in the graph: held after), instantiated
                // and launched on a stream of its own, all launches at once (a barrier). Prints
                // each launch's result (thread order) and the driver's pool figures.
                "graphmemthreads" => {
                    let (n, bytes) = (num(1, i), num(2, i));
                    i += 2;
                    let barrier = &std::sync::Barrier::new(n);
                    let c = ctx as usize;
                    let results: Vec<(CUresult, CUdeviceptr)> = std::thread::scope(|sc| {
                        let threads: Vec<_> = (0..n)
                            .map(|_| {
                                sc.spawn(move || {
                                    // (Inside the unsafe block above; every pointer is a local of this thread.)
                                    {
                                        let mut r = set_current(c as CUcontext);
                                        let mut g: CUgraph = std::ptr::null_mut();
                                        if r.is_success() {
                                            r = graph_create(&mut g, 0);
                                        }
                                        let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = std::mem::zeroed();
                                        p.poolProps.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
                                        p.poolProps.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
                                        p.bytesize = bytes;
                                        let mut node: CUgraphNode = std::ptr::null_mut();
                                        if r.is_success() {
                                            r = graph_add_alloc(&mut node, g, std::ptr::null(), 0, &mut p);
                                        }
                                        let mut exec: CUgraphExec = std::ptr::null_mut();
                                        if r.is_success() {
                                            r = graph_instantiate(&mut exec, g, 0);
                                        }
                                        let mut s: CUstream = std::ptr::null_mut();
                                        if r.is_success() {
                                            r = stream_create(&mut s, 1);
                                        }
                                        barrier.wait();
                                        if r.is_success() {
                                            r = graph_launch(exec, s);
                                        }
                                        if r.is_success() {
                                            let _ = stream_sync(s);
                                        }
                                        (r, if r.is_success() { p.dptr } else { 0 })
                                    }
                                })
                            })
                            .collect();
                        threads.into_iter().map(|t| t.join().expect("launch thread")).collect()
                    });
                    held.extend(results.iter().filter(|(_, p)| *p != 0).map(|(_, p)| Held::Dev(*p)));
                    let (mut used, mut reserved) = (0u64, 0u64);
                    graph_attr(0, CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, (&mut used as *mut u64).cast());
                    graph_attr(0, CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, (&mut reserved as *mut u64).cast());
                    let rcs: Vec<String> = results.iter().map(|(r, _)| r.0.to_string()).collect();
                    out(format!("graphmemthreads={} launches={} pool_used={used} pool_reserved={reserved}", rcs.len(), rcs.join(",")));
                }
                // Stream capture, as PyTorch's CUDA graphs with `cudaMallocAsync` make them: on
                // a stream of its own, BYTES allocated with cuMemAllocAsync (freed in the graph
                // when FREE is 1), captured in global mode; the graph instantiated, PRE bytes
                // allocated with cuMemAlloc (0: none), and the graph launched COUNT times. Prints the alloc's, the capture's and each launch's result and the
                // driver's graph pool figures.
                // `capturememnull`: the same on the null stream (with `--resolve gpa2`, whose
                // `_ptsz` entries make it the per-thread default stream, which may capture).
                "capturemem" | "capturememnull" => {
                    let (bytes, free_in_graph, count, pre) = (num(1, i), num(2, i) == 1, num(3, i), num(4, i));
                    i += 4;
                    let mut s: CUstream = std::ptr::null_mut();
                    let mut r = if step == "capturememnull" { CUresult::CUDA_SUCCESS } else { stream_create(&mut s, 1) };
                    if r.is_success() {
                        r = capture_begin(s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL);
                    }
                    let mut p: CUdeviceptr = 0;
                    let alloc_rc = if r.is_success() { alloc_async(&mut p, bytes, s) } else { r };
                    if alloc_rc.is_success() && free_in_graph {
                        free_async(p, s);
                    }
                    let mut g: CUgraph = std::ptr::null_mut();
                    let end_rc = if r.is_success() { capture_end(s, &mut g) } else { r };
                    let mut exec: CUgraphExec = std::ptr::null_mut();
                    let mut r = if end_rc.is_success() && alloc_rc.is_success() { graph_instantiate(&mut exec, g, 0) } else { alloc_rc };
                    // PRE bytes allocated between the capture and the launches (0: none).
                    let mut pre_rc = CUresult::CUDA_SUCCESS;
                    if pre > 0 {
                        let mut q: CUdeviceptr = 0;
                        pre_rc = mem_alloc(&mut q, pre);
                        if pre_rc.is_success() {
                            held.push(Held::Dev(q));
                        }
                    }
                    let mut rcs = Vec::new();
                    for _ in 0..count {
                        if r.is_success() || !rcs.is_empty() {
                            r = graph_launch(exec, s);
                            rcs.push(r.0.to_string());
                            let _ = stream_sync(s);
                        }
                    }
                    if !exec.is_null() {
                        graph_exec_destroy(exec);
                    }
                    if !free_in_graph && p != 0 && !rcs.is_empty() {
                        held.push(Held::Dev(p));
                    }
                    let (mut used, mut reserved) = (0u64, 0u64);
                    graph_attr(0, CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, (&mut used as *mut u64).cast());
                    graph_attr(0, CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, (&mut reserved as *mut u64).cast());
                    out(format!(
                        "capturemem={} alloc={} pre={} end={} launches={} pool_used={used} pool_reserved={reserved}",
                        rcs.first().cloned().unwrap_or_else(|| r.0.to_string()),
                        alloc_rc.0,
                        pre_rc.0,
                        end_rc.0,
                        rcs.join(",")
                    ));
                }
                // A global-mode capture broken by a synchronous cuMemAlloc (prohibited then).
                "capturebreak" => {
                    let mut s: CUstream = std::ptr::null_mut();
                    let _ = stream_create(&mut s, 1);
                    let b = capture_begin(s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL);
                    let mut p: CUdeviceptr = 0;
                    let a = mem_alloc(&mut p, 1 << 20);
                    let mut g: CUgraph = std::ptr::null_mut();
                    let e = capture_end(s, &mut g);
                    out(format!("capturebreak={} alloc={} end={} graph_null={}", b.0, a.0, e.0, u8::from(g.is_null())));
                }
                // A global-mode capture begun on the per-thread default stream
                // (CU_STREAM_PER_THREAD) and left running; prints the begin's result, the
                // capture query's on the legacy stream and on the per-thread one, and the
                // per-thread stream's status.
                "capturept" => {
                    let (pt, legacy) = (0x2 as CUstream, 0x1 as CUstream);
                    let b = capture_begin(pt, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL);
                    let mut st = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
                    let q = is_capturing(legacy, &mut st);
                    let mut pst = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
                    let p = is_capturing(pt, &mut pst);
                    out(format!("capturept={} legacy={} pt={} pt_status={}", b.0, q.0, p.0, pst.0));
                }
                // An application that handles SIGTERM itself (its handler counts) and captures
                // a graph when the signal comes, as a trainer does at a `torch.cuda.graph`
                // warm-up: a global-mode capture on a stream of its own, N spin launches 20 ms
                // apart in it (`capturing` printed once it began), then the graph instantiated,
                // launched and synchronised. TO_GRAPH 1: the capture recorded into a graph made
                // first (cuStreamBeginCaptureToGraph); 2: begun through the CUDA 10.0 entry
                // point, which has no mode. Prints `capturesig end=RC launch=RC handled=H`.
                "capturesig" => {
                    let (n, how) = (num(1, i), num(2, i));
                    i += 2;
                    static HANDLED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
                    extern "C" fn on_term(_: c_int) {
                        HANDLED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    // An async-signal-safe handler (one atomic add), inside the steps' unsafe block.
                    libc::signal(libc::SIGTERM, on_term as extern "C" fn(c_int) as libc::sighandler_t);
                    if spin_fn.is_null() {
                        spin_fn = kernels.load_spin().unwrap_or_else(|_| die("loading the spin kernel"));
                    }
                    let mut s: CUstream = std::ptr::null_mut();
                    let r = stream_create(&mut s, 1);
                    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
                    let r = if !r.is_success() {
                        r
                    } else if how == 2 {
                        capture_begin_legacy(s)
                    } else if how == 1 {
                        let mut into: CUgraph = std::ptr::null_mut();
                        let r = graph_create(&mut into, 0);
                        if r.is_success() { capture_to_graph(s, into, std::ptr::null(), std::ptr::null(), 0, mode) } else { r }
                    } else {
                        capture_begin(s, mode)
                    };
                    if !r.is_success() {
                        die(&format!("capture begin {r}"));
                    }
                    out("capturing".to_string());
                    let mut cycles = 1000u64;
                    for _ in 0..n {
                        let mut params = [(&mut cycles as *mut u64).cast::<c_void>()];
                        let r = launch(spin_fn, 1, 1, 1, 32, 1, 1, 0, s, params.as_mut_ptr(), std::ptr::null_mut());
                        if !r.is_success() {
                            out(format!("capturedlaunch={}", r.0));
                            break;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                    let mut g: CUgraph = std::ptr::null_mut();
                    let end = capture_end(s, &mut g);
                    let mut exec: CUgraphExec = std::ptr::null_mut();
                    let mut l = if end.is_success() { graph_instantiate(&mut exec, g, 0) } else { end };
                    if l.is_success() {
                        l = graph_launch(exec, s);
                    }
                    if l.is_success() {
                        l = stream_sync(s);
                    }
                    out(format!("capturesig end={} launch={} handled={}", end.0, l.0, HANDLED.load(std::sync::atomic::Ordering::SeqCst)));
                }
                // A global-mode capture on a stream of its own with N spin launches of BLOCKS
                // blocks of CYCLES in it, ended, then one such launch run for real on that
                // stream and synchronised. Prints `capturelaunch end=RC launch=RC`.
                "capturelaunch" => {
                    let (n, blocks, cycles) = (num(1, i), num(2, i) as c_uint, num(3, i));
                    i += 3;
                    if spin_fn.is_null() {
                        spin_fn = kernels.load_spin().unwrap_or_else(|_| die("loading the spin kernel"));
                    }
                    let mut s: CUstream = std::ptr::null_mut();
                    let r = stream_create(&mut s, 1);
                    let r = if r.is_success() { capture_begin(s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL) } else { r };
                    if !r.is_success() {
                        die(&format!("capture begin {r}"));
                    }
                    let mut c = cycles as u64;
                    for _ in 0..n {
                        let mut params = [(&mut c as *mut u64).cast::<c_void>()];
                        let r = launch(spin_fn, blocks, 1, 1, 32, 1, 1, 0, s, params.as_mut_ptr(), std::ptr::null_mut());
                        if !r.is_success() {
                            die(&format!("captured launch {r}"));
                        }
                    }
                    let mut g: CUgraph = std::ptr::null_mut();
                    let end = capture_end(s, &mut g);
                    let mut params = [(&mut c as *mut u64).cast::<c_void>()];
                    let mut l = launch(spin_fn, blocks, 1, 1, 32, 1, 1, 0, s, params.as_mut_ptr(), std::ptr::null_mut());
                    if l.is_success() {
                        l = stream_sync(s);
                    }
                    out(format!("capturelaunch end={} launch={}", end.0, l.0));
                }
                // N stream-ordered allocations of BYTES on a stream another thread keeps
                // beginning and ending relaxed-mode captures on (each open about 100 us), never
                // freed: each is a memory node of that thread's capture, or, when the capture
                // ended just before, memory. Prints `capturerace ok=N oom=N other=N`.
                "capturerace" => {
                    let (n, bytes) = (num(1, i), num(2, i));
                    i += 2;
                    let mut s: CUstream = std::ptr::null_mut();
                    let r = stream_create(&mut s, 1);
                    if !r.is_success() {
                        die(&format!("stream {r}"));
                    }
                    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
                    let (sv, cv, stop2) = (s as usize, ctx as usize, stop.clone());
                    // The driver's entry points (inside the steps' unsafe block), with a stream
                    // and context that outlive the thread (joined here).
                    let toggler = std::thread::spawn(move || {
                        set_current(cv as CUcontext);
                        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                            if capture_begin(sv as CUstream, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).is_success() {
                                std::thread::sleep(std::time::Duration::from_micros(100));
                                let mut g: CUgraph = std::ptr::null_mut();
                                let _ = capture_end(sv as CUstream, &mut g);
                            }
                        }
                    });
                    let (mut ok, mut oom, mut other) = (0, 0, 0);
                    for _ in 0..n {
                        let mut p: CUdeviceptr = 0;
                        match alloc_async(&mut p, bytes, s) {
                            r if r.is_success() => ok += 1,
                            CUresult::CUDA_ERROR_OUT_OF_MEMORY => oom += 1,
                            _ => other += 1,
                        }
                    }
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    toggler.join().unwrap_or_else(|_| die("toggler"));
                    let _ = stream_sync(s);
                    out(format!("capturerace ok={ok} oom={oom} other={other}"));
                }
                // A global-mode capture on a stream of its own, ended first from another thread
                // (with the same context current there), then from the thread that began it.
                // Prints `capturethread=RC own=RC` (RC: the other thread's end).
                "capturethread" => {
                    let mut s: CUstream = std::ptr::null_mut();
                    let r = stream_create(&mut s, 1);
                    let r = if r.is_success() { capture_begin(s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL) } else { r };
                    if !r.is_success() {
                        die(&format!("capture begin {r}"));
                    }
                    let (sv, cv) = (s as usize, ctx as usize);
                    // The driver's entry points (inside the steps' unsafe block), with a stream
                    // and context that outlive the thread (joined here).
                    let other = std::thread::spawn(move || {
                        let _ = set_current(cv as CUcontext);
                        let mut g: CUgraph = std::ptr::null_mut();
                        capture_end(sv as CUstream, &mut g)
                    })
                    .join()
                    .unwrap_or_else(|_| die("the ending thread panicked"));
                    let mut g: CUgraph = std::ptr::null_mut();
                    let own = capture_end(s, &mut g);
                    out(format!("capturethread={} own={}", other.0, own.0));
                }
                // A global-mode capture begun on a new stream of the current context and left
                // running. Prints `capturebegin=RC`.
                "capturebegin" => {
                    let mut s: CUstream = std::ptr::null_mut();
                    let r = stream_create(&mut s, 1);
                    let r = if r.is_success() { capture_begin(s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL) } else { r };
                    out(format!("capturebegin={}", r.0));
                }
                "graphtrim" => out(format!("graphtrim={}", graph_trim(0).0)),
                "setlimit" => {
                    let (l, v) = (CUlimit(num(1, i) as u32), num(2, i));
                    i += 2;
                    out(format!("setlimit={}", set_limit(l, v).0));
                }
                "getlimit" => {
                    let l = CUlimit(num(1, i) as u32);
                    i += 1;
                    let mut v = 0usize;
                    let r = get_limit(&mut v, l);
                    out(format!("getlimit={} value={v}", r.0));
                }
                "poolthreshold" => {
                    let mut v: u64 = match args.get(i + 1).map(String::as_str) {
                        Some("max") => u64::MAX,
                        _ => num(1, i) as u64,
                    };
                    i += 1;
                    let r = pool_set_attr(current_pool(), CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, (&mut v as *mut u64).cast());
                    out(format!("poolthreshold={}", r.0));
                }
                "pooltrim" => {
                    let keep = num(1, i);
                    i += 1;
                    out(format!("pooltrim={}", pool_trim(current_pool(), keep).0));
                }
                "poolattr" => {
                    let (mut reserved, mut used) = (0u64, 0u64);
                    let p = current_pool();
                    let r1 = pool_get_attr(p, CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, (&mut reserved as *mut u64).cast());
                    let r2 = pool_get_attr(p, CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT, (&mut used as *mut u64).cast());
                    out(format!("poolattr={} reserved={reserved} used={used}", if r1.is_success() { r2.0 } else { r1.0 }));
                }
                // A stream created in a context of device DEV (the current context put back
                // at once), N bytes allocated on it with cuMemAllocAsync: from the current
                // pool of the stream's device, not the current context's.
                "asyncon" => {
                    let (dev, n) = (num(1, i), num(2, i));
                    i += 2;
                    let mut other: CUcontext = std::ptr::null_mut();
                    let mut r = ctx_create(&mut other, 0, dev as CUdevice);
                    let mut s: CUstream = std::ptr::null_mut();
                    if r.is_success() {
                        r = stream_create(&mut s, 1);
                    }
                    let back = set_current(ctx);
                    let mut p: CUdeviceptr = 0;
                    if r.is_success() && back.is_success() {
                        r = alloc_async(&mut p, n, s);
                    }
                    if r.is_success() {
                        held.push(Held::Async(p));
                    }
                    out(format!("asyncon={} dev={dev} bytes={n}", if back.is_success() { r.0 } else { back.0 }));
                }
                "poolon" => {
                    let (dev, n) = (num(1, i), num(2, i));
                    i += 2;
                    let (mut r, on) = new_pool(dev as c_int);
                    let mut p: CUdeviceptr = 0;
                    if r.is_success() {
                        r = pool_alloc(&mut p, n, on, stream);
                    }
                    if r.is_success() {
                        held.push(Held::Async(p));
                    }
                    out(format!("poolon={} dev={dev} bytes={n}", r.0));
                }
                "devices" => {
                    let mut n: c_int = 0;
                    let r = device_count(&mut n);
                    let mut uuids = Vec::new();
                    for d in 0..n {
                        let mut u: CUuuid = std::mem::zeroed();
                        device_uuid(&mut u, d);
                        let b: Vec<String> = u.bytes.iter().map(|x| format!("{:02x}", *x)).collect();
                        uuids.push(b.concat());
                    }
                    out(format!("devices={} n={n} uuids={}", r.0, uuids.join(",")));
                }
                "primary" => {
                    let mut r = retain(&mut ctx, 0);
                    if r.is_success() {
                        r = set_current(ctx);
                    }
                    out(format!("primary={}", r.0));
                }
                "destroy" => {
                    // The driver frees the context's allocations with it.
                    held.clear();
                    out(format!("destroy={}", ctx_destroy(ctx).0))
                }
                "release" => {
                    held.clear();
                    out(format!("release={}", primary_release(0).0))
                }
                "reset" => {
                    held.clear();
                    out(format!("reset={}", primary_reset(0).0))
                }
                // `vmmon DEV N`: cuMemCreate of N bytes on device ordinal DEV (which may not
                // exist), held on success.
                "vmmon" => {
                    let (dev, n) = (num(1, i), num(2, i));
                    i += 2;
                    let mut prop: CUmemAllocationProp = std::mem::zeroed();
                    prop.type_ = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
                    prop.location.type_ = CUmemLocationType(1);
                    prop.location.id = dev as i32;
                    let mut h: CUmemGenericAllocationHandle = 0;
                    let r = mem_create(&mut h, n, &prop, 0);
                    if r.is_success() {
                        held.push(Held::Vmm(h));
                    }
                    out(format!("{step}={} dev={dev}", r.0));
                }
                // `vmmshare N COUNT MODE`: COUNT times, cuMemCreate of N bytes exportable to a
                // POSIX fd, cuMemExportToShareableHandle to an fd, then by MODE: `import`
                // (cuMemImportFromShareableHandle of the fd, cuMemRelease of the created
                // handle, cuMemMap of the imported one into a new range, the fd closed), `keep`
                // (the same, the created handle kept), `fd` (cuMemRelease of the created handle,
                // the fd kept open, nothing mapped), `close` (as `fd`, the fd closed), `plain` (as `import`, created without the
                // fd handle type, which the driver refuses to export). What is made stays until exit; a failed
                // round undoes its own. Prints `vmmshare=RC at=STAGE i=ROUND` per round.
                "vmmshare" => {
                    let (n, count) = (num(1, i), num(2, i));
                    let mode = args.get(i + 3).cloned().unwrap_or_else(|| die("vmmshare N COUNT import|keep|fd|close|plain"));
                    i += 3;
                    let mut prop: CUmemAllocationProp = std::mem::zeroed();
                    prop.type_ = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
                    if mode != "plain" {
                        prop.requestedHandleTypes = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
                    }
                    prop.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
                    for round in 0..count {
                        let (mut h1, mut h2, mut fd, mut va): (CUmemGenericAllocationHandle, CUmemGenericAllocationHandle, c_int, CUdeviceptr) = (0, 0, -1, 0);
                        let mut stage = "create";
                        let mut r = mem_create(&mut h1, n, &prop, 0);
                        let created = r.is_success();
                        if r.is_success() {
                            stage = "export";
                            r = mem_export((&mut fd as *mut c_int).cast(), h1, CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
                        }
                        if r.is_success() && !matches!(mode.as_str(), "fd" | "close") {
                            stage = "import";
                            r = mem_import(&mut h2, fd as usize as *mut c_void, CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
                            if r.is_success() {
                                stage = "reserve";
                                r = addr_reserve(&mut va, n, 0, 0, 0);
                            }
                            if r.is_success() {
                                stage = "map";
                                r = mem_map(va, n, 0, h2, 0);
                            }
                        }
                        // The created handle goes (`import`, `fd`) or stays (`keep`, until exit).
                        if created && (mode != "keep" || !r.is_success()) {
                            let rel = mem_release(h1);
                            if r.is_success() && !rel.is_success() {
                                (stage, r) = ("release", rel);
                            }
                        }
                        if h2 != 0 {
                            // Mapped, the mapping holds the memory; otherwise this round is undone.
                            mem_release(h2);
                        }
                        if fd >= 0 && (mode != "fd" || !r.is_success()) {
                            libc::close(fd);
                        }
                        out(format!("vmmshare={} at={stage} i={round}", r.0));
                    }
                }
                "alloc" | "managed" | "async" | "pool" | "vmm" => {
                    let n = num(1, i);
                    i += 1;
                    let mut p: CUdeviceptr = 0;
                    let r = match step.as_str() {
                        "alloc" => mem_alloc(&mut p, n),
                        "managed" => managed(&mut p, n, 1),
                        "async" => alloc_async(&mut p, n, stream),
                        "pool" => {
                            if pool.is_null() {
                                let r;
                                (r, pool) = new_pool(0);
                                if !r.is_success() {
                                    die(&format!("cuMemPoolCreate {r}"));
                                }
                            }
                            pool_alloc(&mut p, n, pool, stream)
                        }
                        _ => {
                            let mut prop: CUmemAllocationProp = std::mem::zeroed();
                            prop.type_ = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
                            prop.location.type_ = CUmemLocationType(1);
                            let mut h: CUmemGenericAllocationHandle = 0;
                            let r = mem_create(&mut h, n, &prop, 0);
                            if r.is_success() {
                                held.push(Held::Vmm(h));
                            }
                            out(format!("{step}={} bytes={n}", r.0));
                            i += 1;
                            continue;
                        }
                    };
                    if r.is_success() {
                        held.push(if matches!(step.as_str(), "async" | "pool") {
                            Held::Async(p)
                        } else {
                            Held::Dev(p)
                        });
                    }
                    out(format!("{step}={} bytes={n}", r.0));
                }
                "pitch" => {
                    let (w, h) = (num(1, i), num(2, i));
                    i += 2;
                    let (mut p, mut pp) = (0, 0usize);
                    let r = pitch(&mut p, &mut pp, w, h, 4);
                    if r.is_success() {
                        held.push(Held::Dev(p));
                    }
                    out(format!("pitch={} pitch_bytes={pp}", r.0));
                }
                "mipmaplayered" => {
                    // width height layers levels: a layered mipmapped array (every level keeps
                    // all its layers).
                    let (w, h, layers, levels) = (num(1, i), num(2, i), num(3, i), num(4, i));
                    i += 4;
                    let r = mipmapped(&mut held, w, h, layers, CUDA_ARRAY3D_LAYERED, levels);
                    out(format!("{step}={}", r.0));
                }
                // `array`/`array3d` through the CUDA 2.0 ABI.
                "arrayv1" | "array3dv1" => {
                    let (w, h) = (num(1, i) as c_uint, num(2, i) as c_uint);
                    let mut a: CUarray = std::ptr::null_mut();
                    let r = if step == "arrayv1" {
                        i += 2;
                        let desc = CUDA_ARRAY_DESCRIPTOR_v1 { Width: w, Height: h, Format: CUarray_format::CU_AD_FORMAT_FLOAT, NumChannels: 1 };
                        array_create_v1(&mut a, &desc)
                    } else {
                        let d = num(3, i) as c_uint;
                        i += 3;
                        let desc = CUDA_ARRAY3D_DESCRIPTOR_v1 {
                            Width: w,
                            Height: h,
                            Depth: d,
                            Format: CUarray_format::CU_AD_FORMAT_FLOAT,
                            NumChannels: 1,
                            Flags: 0,
                        };
                        array3d_create_v1(&mut a, &desc)
                    };
                    if r.is_success() {
                        held.push(Held::Array(a));
                    }
                    out(format!("{step}={}", r.0));
                }
                "array3draced" => {
                    let (w, h, d, w2) = (num(1, i), num(2, i), num(3, i), num(4, i));
                    i += 4;
                    let desc = Box::leak(Box::new(float_desc3d(w, h, d)));
                    RACED_DESC.store(desc as *mut CUDA_ARRAY3D_DESCRIPTOR, std::sync::atomic::Ordering::Release);
                    RACED_WIDTH.store(w2, std::sync::atomic::Ordering::Release);
                    let arm = cu.dlsym("gpuemu_test_on_next_ctx_get_current");
                    if arm.is_null() {
                        die("the driver is not the emulator (no gpuemu_test_on_next_ctx_get_current)");
                    }
                    // SAFETY: the emulator's exported test hook has this ABI.
                    let arm = std::mem::transmute::<*mut c_void, extern "C" fn(Option<extern "C" fn()>)>(arm);
                    arm(Some(widen_raced_desc));
                    let mut a: CUarray = std::ptr::null_mut();
                    let r = array3d_create(&mut a, desc);
                    arm(None);
                    if r.is_success() {
                        held.push(Held::Array(a));
                    }
                    out(format!("{step}={} width_now={}", r.0, desc.Width));
                }
                "array" | "array3d" | "mipmap" => {
                    let (w, h) = (num(1, i), num(2, i));
                    let d = if step == "array" { 0 } else { num(3, i) };
                    let r = if step == "array" {
                        i += 2;
                        let desc = CUDA_ARRAY_DESCRIPTOR {
                            Width: w,
                            Height: h,
                            Format: CUarray_format::CU_AD_FORMAT_FLOAT,
                            NumChannels: 1,
                        };
                        let mut a: CUarray = std::ptr::null_mut();
                        let r = array_create(&mut a, &desc);
                        if r.is_success() {
                            held.push(Held::Array(a));
                        }
                        r
                    } else if step == "array3d" {
                        i += 3;
                        let desc = float_desc3d(w, h, d);
                        let mut a: CUarray = std::ptr::null_mut();
                        let r = array3d_create(&mut a, &desc);
                        if r.is_success() {
                            held.push(Held::Array(a));
                        }
                        r
                    } else {
                        i += 3;
                        mipmapped(&mut held, w, h, 0, 0, d)
                    };
                    out(format!("{step}={}", r.0));
                }
                "free" => {
                    let r = held
                        .pop()
                        .map_or(CUresult::CUDA_ERROR_INVALID_VALUE, free_one);
                    out(format!("free={}", r.0));
                }
                // The last held allocation freed with cuMemFreeAsync alone (no synchronize).
                "freeasync" => {
                    let r = match held.pop() {
                        Some(Held::Async(p)) => free_async(p, stream),
                        Some(h) => free_one(h),
                        None => CUresult::CUDA_ERROR_INVALID_VALUE,
                    };
                    out(format!("freeasync={}", r.0));
                }
                "sync" => out(format!("sync={}", sync().0)),
                "freeall" => {
                    let mut worst = 0;
                    while let Some(h) = held.pop() {
                        let r = free_one(h);
                        if !r.is_success() {
                            worst = r.0;
                        }
                    }
                    out(format!("freeall={worst}"));
                }
                "meminfo" => {
                    let (mut f, mut t) = (0usize, 0usize);
                    let r = mem_info(&mut f, &mut t);
                    out(format!("meminfo={} free={f} total={t}", r.0));
                }
                "totalmem" => {
                    let mut t = 0usize;
                    let r = total_mem(&mut t, 0);
                    out(format!("totalmem={} total={t}", r.0));
                }
                // CUDA 2.0's execution control on a freshly loaded `spin` (8-byte parameter
                // CYCLES): `legacychecks CYCLES` prints `noshape=` (cuLaunchGrid before any
                // cuFuncSetBlockShape), `grid=` (once shape and parameters are set),
                // `afterkernel=` (cuLaunchGrid again after a cuLaunchKernel of the function,
                // which invalidates them) and `negative=` (a grid width of -1).
                "legacychecks" => {
                    let mut cycles = num(1, i) as u64;
                    i += 1;
                    let f = kernels.load_spin().unwrap_or_else(|_| die("loading the spin kernel"));
                    let set_params = |cycles: &mut u64| {
                        let r = param_setv(f, 0, (cycles as *mut u64).cast(), 8);
                        if r.is_success() { param_set_size(f, 8) } else { r }
                    };
                    let r = set_params(&mut cycles);
                    let noshape = if r.is_success() { launch_grid(f, 1, 1) } else { r };
                    let r = func_block_shape(f, 32, 1, 1);
                    let grid = if r.is_success() { launch_grid(f, 1, 1) } else { r };
                    let mut params = [(&mut cycles as *mut u64).cast::<c_void>()];
                    let r = launch(f, 1, 1, 1, 32, 1, 1, 0, stream, params.as_mut_ptr(), std::ptr::null_mut());
                    let afterkernel = if r.is_success() { launch_grid(f, 1, 1) } else { r };
                    let r = set_params(&mut cycles);
                    let r = if r.is_success() { func_block_shape(f, 32, 1, 1) } else { r };
                    let negative = if r.is_success() { launch_grid(f, -1, 1) } else { r };
                    let _ = sync();
                    out(format!("legacychecks noshape={} grid={} afterkernel={} negative={}", noshape.0, grid.0, afterkernel.0, negative.0));
                }
                "launch" | "launchex" | "launchcoop" | "launchgraph" | "launchlegacy" | "launchgrid" | "launchgridasync" | "launchmulti" => {
                    let (blocks, mut cycles, count) =
                        (num(1, i) as c_uint, num(2, i) as u64, num(3, i));
                    i += 3;
                    if spin_fn.is_null() {
                        spin_fn = match kernels.load_spin() {
                            Ok(f) => f,
                            Err(SpinLoad::Module(r)) => die(&format!("cuModuleLoadData {r}")),
                            Err(SpinLoad::Function(_)) => die("cuModuleGetFunction"),
                        };
                    }
                    let mut params = [(&mut cycles as *mut u64).cast::<c_void>()];
                    let wall = std::time::Instant::now();
                    let mut r = CUresult::CUDA_SUCCESS;
                    let config = spin_launch_config(blocks, stream);
                    // `launchgraph`: one graph holding one spin kernel node, launched COUNT times.
                    let mut exec: CUgraphExec = std::ptr::null_mut();
                    if step == "launchgraph" {
                        (r, _, exec) = spin_chain(1, &spin_node_params(spin_fn, blocks, params.as_mut_ptr()));
                        if !r.is_success() {
                            die(&format!("graph build {r}"));
                        }
                    }
                    // The CUDA 2.0 steps: block shape and parameter set on the function first
                    // (`launchlegacy`: cuLaunch, one block; `launchgrid`: cuLaunchGrid of 1 x
                    // BLOCKS; `launchgridasync`: cuLaunchGridAsync of BLOCKS x 1 on a stream of
                    // its own). `launchmulti`: cuLaunchCooperativeKernelMultiDevice, one entry
                    // (BLOCKS blocks) on a stream of its own of the current context.
                    let mut own: CUstream = std::ptr::null_mut();
                    if matches!(step.as_str(), "launchlegacy" | "launchgrid" | "launchgridasync") {
                        r = func_block_shape(spin_fn, 32, 1, 1);
                        if r.is_success() {
                            r = param_setv(spin_fn, 0, (&mut cycles as *mut u64).cast(), 8);
                        }
                        if r.is_success() {
                            r = param_set_size(spin_fn, 8);
                        }
                        if !r.is_success() {
                            die(&format!("legacy set-up {r}"));
                        }
                    }
                    if matches!(step.as_str(), "launchgridasync" | "launchmulti") {
                        r = stream_create(&mut own, 0);
                        if !r.is_success() {
                            die(&format!("cuStreamCreate {r}"));
                        }
                    }
                    let mut multi = CUDA_LAUNCH_PARAMS_v1 {
                        function: spin_fn,
                        gridDimX: blocks,
                        gridDimY: 1,
                        gridDimZ: 1,
                        blockDimX: 32,
                        blockDimY: 1,
                        blockDimZ: 1,
                        sharedMemBytes: 0,
                        hStream: own,
                        kernelParams: params.as_mut_ptr(),
                    };
                    for _ in 0..count {
                        r = match step.as_str() {
                            "launchgraph" => graph_launch(exec, stream),
                            "launchlegacy" => launch_legacy(spin_fn),
                            "launchgrid" => launch_grid(spin_fn, 1, blocks as c_int),
                            "launchgridasync" => launch_grid_async(spin_fn, blocks as c_int, 1, own),
                            "launchmulti" => launch_multi(&mut multi, 1, 0),
                            "launch" => launch(
                                spin_fn,
                                blocks,
                                1,
                                1,
                                32,
                                1,
                                1,
                                0,
                                stream,
                                params.as_mut_ptr(),
                                std::ptr::null_mut(),
                            ),
                            "launchex" => launch_ex(
                                &config,
                                spin_fn,
                                params.as_mut_ptr(),
                                std::ptr::null_mut(),
                            ),
                            _ => launch_coop(
                                spin_fn,
                                blocks,
                                1,
                                1,
                                32,
                                1,
                                1,
                                0,
                                stream,
                                params.as_mut_ptr(),
                            ),
                        };
                        if !r.is_success() {
                            break;
                        }
                    }
                    if r.is_success() && !own.is_null() {
                        r = stream_sync(own);
                    }
                    if r.is_success() {
                        r = sync();
                    }
                    out(format!(
                        "{step}={} wall_ms={:.3}",
                        r.0,
                        wall.elapsed().as_secs_f64() * 1e3
                    ));
                }
                // One graph of NODES spin kernel nodes (BLOCKS x CYCLES each), launched COUNT
                // times; with GROW > 1, then (after a second for the bucket to fill again) every
                // node's grid in the exec set to BLOCKS * GROW (cuGraphExecKernelNodeSetParams)
                // and the graph launched once more. Prints `graphnodes=RC grown=RC`.
                "graphnodes" => {
                    let (nodes, blocks, mut cycles, count, grow) = (num(1, i), num(2, i) as c_uint, num(3, i) as u64, num(4, i), num(5, i) as c_uint);
                    i += 5;
                    if spin_fn.is_null() {
                        spin_fn = kernels.load_spin().unwrap_or_else(|_| die("loading the spin kernel"));
                    }
                    let mut params = [(&mut cycles as *mut u64).cast::<c_void>()];
                    let (mut r, handles, exec) = spin_chain(nodes, &spin_node_params(spin_fn, blocks, params.as_mut_ptr()));
                    for _ in 0..count {
                        if r.is_success() {
                            r = graph_launch(exec, stream);
                        }
                    }
                    if r.is_success() {
                        r = sync();
                    }
                    let mut grown = CUresult::CUDA_SUCCESS;
                    if r.is_success() && grow > 1 {
                        std::thread::sleep(std::time::Duration::from_millis(1000));
                        let bigger = spin_node_params(spin_fn, blocks * grow, params.as_mut_ptr());
                        for n in &handles {
                            if grown.is_success() {
                                grown = graph_exec_kernel_set(exec, *n, &bigger);
                            }
                        }
                        if grown.is_success() {
                            grown = graph_launch(exec, stream);
                        }
                        if grown.is_success() {
                            grown = sync();
                        }
                    }
                    out(format!("graphnodes={} grown={}", r.0, grown.0));
                }
                // One spin kernel node (SMALL blocks x CYCLES) in a graph, instantiated; then two
                // threads set the node's grid in the exec (cuGraphExecKernelNodeSetParams): the
                // first to SMALL, the second, 200 ms later, to BIG. After a second for the bucket
                // to fill, the exec is launched once (it runs BIG). Prints `graphrace=RC`.
                "graphrace" => {
                    let (small, big, mut cycles) = (num(1, i) as c_uint, num(2, i) as c_uint, num(3, i) as u64);
                    i += 3;
                    if spin_fn.is_null() {
                        spin_fn = kernels.load_spin().unwrap_or_else(|_| die("loading the spin kernel"));
                    }
                    let mut params = [(&mut cycles as *mut u64).cast::<c_void>()];
                    let (mut r, nodes, exec) = spin_chain(1, &spin_node_params(spin_fn, small, params.as_mut_ptr()));
                    if r.is_success() {
                        let (c, e, n, f, pp) = (ctx as usize, exec as usize, nodes[0] as usize, spin_fn as usize, params.as_mut_ptr() as usize);
                        let set = move |blocks: c_uint| {
                            // (Inside the unsafe block above; the handles are this process's, the
                            // parameters outlive both threads: scoped.)
                            let r = set_current(c as CUcontext);
                            let p = spin_node_params(f as CUfunction, blocks, pp as *mut *mut c_void);
                            if r.is_success() { graph_exec_kernel_set(e as CUgraphExec, n as CUgraphNode, &p) } else { r }
                        };
                        // The second thread starts once the first is about to call (200 ms
                        // on): the first's change is the one the shim pauses.
                        let calling = &std::sync::atomic::AtomicBool::new(false);
                        let (a, b) = std::thread::scope(|sc| {
                            let a = sc.spawn(move || {
                                calling.store(true, std::sync::atomic::Ordering::Release);
                                set(small)
                            });
                            while !calling.load(std::sync::atomic::Ordering::Acquire) {
                                std::thread::yield_now();
                            }
                            std::thread::sleep(std::time::Duration::from_millis(200));
                            let b = sc.spawn(move || set(big));
                            (a.join().unwrap(), b.join().unwrap())
                        });
                        r = if a.is_success() { b } else { a };
                    }
                    if r.is_success() {
                        std::thread::sleep(std::time::Duration::from_millis(1000));
                        r = graph_launch(exec, stream);
                    }
                    if r.is_success() {
                        r = sync();
                    }
                    out(format!("graphrace={}", r.0));
                }
                // A spin kernel (BLOCKS x CYCLES) on the current context's stream, an event
                // recorded after it, and cuEventSynchronize of that event from a new thread,
                // which has no current context: prints `eventwaiting` before the wait and
                // `eventwait=RC` once it returned.
                "eventwaitnoctx" => {
                    let (blocks, mut cycles) = (num(1, i) as c_uint, num(2, i) as u64);
                    i += 2;
                    if spin_fn.is_null() {
                        spin_fn = kernels.load_spin().unwrap_or_else(|_| die("loading the spin kernel"));
                    }
                    let mut params = [(&mut cycles as *mut u64).cast::<c_void>()];
                    let r = launch(spin_fn, blocks, 1, 1, 32, 1, 1, 0, stream, params.as_mut_ptr(), std::ptr::null_mut());
                    if !r.is_success() {
                        die(&format!("launch {r}"));
                    }
                    let mut ev: CUevent = std::ptr::null_mut();
                    let r = event_create(&mut ev, 0);
                    let r = if r.is_success() { event_record(ev, stream) } else { r };
                    if !r.is_success() {
                        die(&format!("event {r}"));
                    }
                    let ev = ev as usize;
                    // The driver's entry point (inside the steps' unsafe block), with the event
                    // created above, which outlives the thread (joined here).
                    let waiter = std::thread::spawn(move || event_sync(ev as CUevent));
                    out("eventwaiting".to_string());
                    let r = waiter.join().unwrap_or_else(|_| die("the waiting thread panicked"));
                    out(format!("eventwait={}", r.0));
                }
                "where" => {
                    let name = args
                        .get(i + 1)
                        .cloned()
                        .unwrap_or_else(|| die("where NAME VERSION"));
                    let v = num(2, i) as c_int;
                    i += 2;
                    out(format!(
                        "where name={name} object={}",
                        object_of(cu.get(&name, v))
                    ));
                }
                "next" => {
                    let name = CString::new(
                        args.get(i + 1)
                            .cloned()
                            .unwrap_or_else(|| die("next SYMBOL")),
                    )
                    .expect("no NUL");
                    i += 1;
                    // SAFETY: RTLD_NEXT lookup with a valid C string.
                    let p = libc::dlsym(libc::RTLD_NEXT, name.as_ptr());
                    out(format!("next object={}", object_of(p)));
                }
                "nvmlmem" => {
                    let (t1, f1, u1, t2, f2, u2) = nvml_memory();
                    out(format!("nvmlmem total={t1} free={f1} used={u1} total_v2={t2} free_v2={f2} used_v2={u2}"));
                }
                "fork" => {
                    let pid = libc::fork();
                    if pid == 0 {
                        out(format!("child pid={}", libc::getpid()));
                        std::thread::sleep(std::time::Duration::from_secs(30));
                        libc::_exit(0);
                    }
                    out(format!("forked child={pid}"));
                }
                // `forksig MS`: a second thread sets SIGINT's action (through the shim's
                // `sigaction`) while this thread, MS ms later, forks; the child idles and is
                // sent SIGINT at once. Prints `forksig=exit:N|signal:N|hung` for how the child
                // ended (its SIGINT handler exits 42; `hung`: still alive after 10 s, killed; the child
                // gives up by itself after 20 s with status 3).
                "forksig" => {
                    use std::sync::atomic::{AtomicBool, Ordering};
                    static STARTED: AtomicBool = AtomicBool::new(false);
                    extern "C" fn app_handler(_: c_int) {
                        // SAFETY: _exit is async-signal-safe.
                        unsafe { libc::_exit(42) }
                    }
                    let wait = num(1, i) as u64;
                    i += 1;
                    let setter = std::thread::spawn(|| {
                        // SAFETY: a zeroed sigaction with our handler and an empty mask.
                        {
                            let mut a: libc::sigaction = std::mem::zeroed();
                            a.sa_sigaction = app_handler as extern "C" fn(c_int) as libc::sighandler_t;
                            libc::sigemptyset(&mut a.sa_mask);
                            STARTED.store(true, Ordering::SeqCst);
                            libc::sigaction(libc::SIGINT, &a, std::ptr::null_mut())
                        }
                    });
                    while !STARTED.load(Ordering::SeqCst) {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(wait));
                    let pid = libc::fork();
                    if pid == 0 {
                        // Bounded, so a child whose SIGINT was lost does not outlive the test
                        // when its parent is gone.
                        for _ in 0..20 {
                            libc::sleep(1);
                        }
                        libc::_exit(3);
                    }
                    libc::kill(pid, libc::SIGINT);
                    let start = std::time::Instant::now();
                    let mut status: c_int = 0;
                    let mut ended = 0;
                    while start.elapsed() < std::time::Duration::from_secs(10) {
                        ended = libc::waitpid(pid, &mut status, libc::WNOHANG);
                        if ended != 0 {
                            break;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    let how = if ended == 0 {
                        libc::kill(pid, libc::SIGKILL);
                        libc::waitpid(pid, &mut status, 0);
                        "hung".to_string()
                    } else if libc::WIFSIGNALED(status) {
                        format!("signal:{}", libc::WTERMSIG(status))
                    } else {
                        format!("exit:{}", libc::WEXITSTATUS(status))
                    };
                    let rc = setter.join().unwrap_or(-1);
                    out(format!("forksig={how} sigaction={rc}"));
                }
                "ready" => out("ready".into()),
                // What a careless application does to the shim's slot lock (a dup2 over its fd,
                // a close by number): close every descriptor naming a file called `ledger` that
                // holds a lock (its fdinfo lists one; the mapping's own descriptor holds none);
                // prints how many.
                "closeledgerlocks" => {
                    let mut n = 0;
                    for e in std::fs::read_dir("/proc/self/fd").into_iter().flatten().flatten() {
                        let Ok(fd) = e.file_name().to_string_lossy().parse::<c_int>() else { continue };
                        let names_ledger = std::fs::read_link(e.path()).is_ok_and(|t| t.file_name().is_some_and(|f| f == "ledger"));
                        let locks = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).is_ok_and(|i| i.contains("lock:"));
                        if names_ledger && locks && libc::close(fd) == 0 {
                            n += 1;
                        }
                    }
                    out(format!("closeledgerlocks={n}"));
                }
                "env" => {
                    let name = args.get(i + 1).cloned().unwrap_or_else(|| die("env needs a variable name"));
                    i += 1;
                    out(format!("env={}", std::env::var(&name).unwrap_or_default()));
                }
                "wait" => {
                    let mut line = String::new();
                    let _ = std::io::stdin().lock().read_line(&mut line);
                }
                "sleep" => {
                    std::thread::sleep(std::time::Duration::from_millis(num(1, i) as u64));
                    i += 1;
                }
                "churn" => {
                    // An application that reacts to a driver error by exiting (status 2):
                    // allocate and free N bytes until a call fails.
                    let n = num(1, i);
                    loop {
                        let mut p: CUdeviceptr = 0;
                        let r = mem_alloc(&mut p, n);
                        if !r.is_success() {
                            die(&format!("churn alloc {}", r.0));
                        }
                        let r = free_one(Held::Dev(p));
                        if !r.is_success() {
                            die(&format!("churn free {}", r.0));
                        }
                    }
                }
                "hang" => loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                },
                "exit" => std::process::exit(0),
                other => die(&format!("unknown step {other:?}")),
            }
            i += 1;
        }
    }
}
