//! VMM memory stays in the quota while a mapping holds it. NVIDIA's own idiom (the
//! `vectorAddMMAP` sample) is cuMemCreate -> cuMemMap -> cuMemRelease straight away: the driver
//! frees the memory only at the last cuMemUnmap. The shim gave the bytes back at the release,
//! so create + map + release could be repeated without limit.
//!
//! The test runs itself again as a child with the shim (`libxcuda.so`) preloaded over the
//! emulated driver (`libcuda.so` of tests/emu-cuda, on an emulated GPU of its own), the driver
//! reached through `cuGetProcAddress_v2` as the CUDA runtime does. Needs
//! `cargo build --workspace` first (the emulator's libcuda).

use std::ffi::{c_int, c_void, CString};
use std::path::PathBuf;
use std::process::Command;

use cuda_abi::*;

const MIB: usize = 1 << 20;
const QUOTA: usize = 64 * MIB;
const HALF: usize = QUOTA / 2;
const CHILD: &str = "XCUDA_TEST_VMM_CHILD";

/// `target/<profile>/` of this test binary (`target/<profile>/deps/<test>`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("exe dir");
    deps.parent().expect("target dir").to_path_buf()
}

fn artifact(name: &str) -> PathBuf {
    let p = target_dir().join(name);
    assert!(p.exists(), "{} is missing: run `cargo build --workspace` (same profile) first", p.display());
    p
}

/// Runs test `name` again as a child with the shim preloaded over the emulated driver (quota
/// [`QUOTA`]); its stdout and the message to fail with. `None` in that child, which runs `child`
/// instead.
fn in_child(name: &str, child: unsafe fn()) -> Option<(String, String)> {
    if std::env::var_os(CHILD).is_some() {
        // SAFETY: run once, in the child, with the emulated driver on the library path.
        unsafe { child() };
        return None;
    }
    // The shim cargo built for this very test run (in deps/, next to this binary; the copy in
    // target/<profile>/ is only refreshed by `cargo build`).
    let shim = std::env::current_exe().unwrap().with_file_name("libxcuda.so");
    assert!(shim.exists(), "{} is missing", shim.display());
    let emu = artifact("libcuda.so");
    let root = tempfile::tempdir().expect("temp dir");
    let lib = root.path().join("lib");
    let ledger = root.path().join("run");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::create_dir_all(&ledger).unwrap();
    std::os::unix::fs::symlink(&emu, lib.join("libcuda.so.1")).unwrap();
    let config = root.path().join("xcuda.json");
    std::fs::write(&config, "{}").unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("GPUEMU_STATE", root.path().join("gpu0.state"))
        .env("GPUEMU_PROFILE", "t4")
        .env("LD_LIBRARY_PATH", &lib)
        .env("LD_PRELOAD", &shim)
        .env("XSHARE_LEDGER_DIR", &ledger)
        .env("XCUDA_CONFIG", &config)
        .env("XCUDA_QUOTA_BYTES", QUOTA.to_string())
        .env("XCUDA_GROUP", "vmm")
        .env("XCUDA_THROTTLE", "0")
        .env("XCUDA_LOG", "info")
        .env_remove("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let msg = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child failed: {msg}");
    Some((stdout, msg))
}

/// The results a child printed for `step` (`step=rc` lines), in order.
fn rcs(stdout: &str, step: &str) -> Vec<String> {
    // The harness prints its own `test ... ` before the first line.
    let lines = stdout.lines().filter_map(|l| l.rsplit(' ').next());
    lines.filter_map(|l| l.strip_prefix(&format!("{step}="))).map(str::to_string).collect()
}

/// create + map + release of Q/2 three times under quota Q: the third is refused with
/// CUDA_ERROR_OUT_OF_MEMORY (2). Unmapping a released handle gives its bytes back; a handle
/// unmapped first gives them back at its release.
#[test]
fn vmm_memory_stays_counted_while_mapped() {
    let Some((stdout, msg)) = in_child("vmm_memory_stays_counted_while_mapped", child) else { return };
    let rc = |step: &str| rcs(&stdout, step);
    assert_eq!(rc("create"), ["0", "0", "2", "0", "2", "0", "0", "0", "2"], "{msg}");
    assert_eq!(rc("map"), ["0", "0", "0", "0"], "{msg}");
    assert_eq!(rc("release"), ["0", "0", "0", "0", "0", "0"], "{msg}");
    assert_eq!(rc("unmap"), ["0", "0", "0"], "{msg}");
    assert_eq!(rc("map_misaligned"), ["1"], "CUDA_ERROR_INVALID_VALUE: {msg}");
    assert_eq!(rc("unmap_part"), ["1"], "CUDA_ERROR_INVALID_VALUE: {msg}");
}

/// `cuMemRetainAllocationHandle` takes a reference the driver keeps the memory for ("The
/// returned handle must be released with corresponding number of calls to cuMemRelease"):
/// after NVIDIA's idiom, a retain, the unmap and a new mapping of the retained handle, the
/// memory is still held, so a create of Q/2 fits once, not twice. Without the retain counted,
/// the unmap gave the bytes back and the new mapping was in no count: 96 MiB under a 64 MiB
/// quota.
#[test]
fn a_retained_vmm_handle_stays_counted_until_released_again() {
    let Some((stdout, msg)) = in_child("a_retained_vmm_handle_stays_counted_until_released_again", retain_child) else { return };
    let rc = |step: &str| rcs(&stdout, step);
    assert_eq!(rc("retain"), ["0"], "{msg}");
    assert_eq!(rc("same_handle"), ["1"], "the handle value used to map the memory: {msg}");
    assert_eq!(rc("map"), ["0", "0"], "{msg}");
    assert_eq!(rc("unmap"), ["0", "0"], "{msg}");
    assert_eq!(rc("release"), ["0", "0"], "{msg}");
    assert_eq!(rc("create"), ["0", "0", "2", "0"], "the retained memory stays counted until its last release and unmap: {msg}");
}

/// A driver function through the shim's `cuGetProcAddress_v2`.
unsafe fn proc_of<T>(gpa: PFN_cuGetProcAddress_v12000, name: &str, version: c_int) -> T {
    let n = CString::new(name).unwrap();
    let mut p: *mut c_void = std::ptr::null_mut();
    let mut found = CUdriverProcAddressQueryResult(0);
    // SAFETY: valid name, out-pointers to locals.
    let rc = unsafe { gpa(n.as_ptr(), &mut p, version, 0, &mut found) };
    assert!(rc == CUresult::CUDA_SUCCESS && !p.is_null(), "resolve {name}: {rc:?}");
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: the driver's `name` at `version` has the C type T (cuda-abi's table).
    unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) }
}

/// The driver through the shim, a context on device 0, and allocation properties for it.
struct Driver {
    create: PFN_cuMemCreate_v10020,
    release: PFN_cuMemRelease_v10020,
    reserve: PFN_cuMemAddressReserve_v10020,
    map: PFN_cuMemMap_v10020,
    unmap: PFN_cuMemUnmap_v10020,
    retain: PFN_cuMemRetainAllocationHandle_v11000,
    prop: CUmemAllocationProp,
}

impl Driver {
    /// Resolves through `cuGetProcAddress_v2`, initialises, makes a context on device 0.
    unsafe fn open() -> Driver {
        // SAFETY: the body calls the driver with locals as out-parameters.
        unsafe {
            let lib = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW);
            assert!(!lib.is_null(), "dlopen libcuda.so.1");
            let gpa = libc::dlsym(lib, c"cuGetProcAddress_v2".as_ptr());
            assert!(!gpa.is_null());
            let gpa = std::mem::transmute::<*mut c_void, PFN_cuGetProcAddress_v12000>(gpa);
            let init: PFN_cuInit_v2000 = proc_of(gpa, "cuInit", 12000);
            let device_get: PFN_cuDeviceGet_v2000 = proc_of(gpa, "cuDeviceGet", 12000);
            let ctx_create: PFN_cuCtxCreate_v3020 = proc_of(gpa, "cuCtxCreate", 3020);
            assert_eq!(init(0), CUresult::CUDA_SUCCESS);
            let mut dev: CUdevice = 0;
            assert_eq!(device_get(&mut dev, 0), CUresult::CUDA_SUCCESS);
            let mut ctx: CUcontext = std::ptr::null_mut();
            assert_eq!(ctx_create(&mut ctx, 0, dev), CUresult::CUDA_SUCCESS);
            let mut prop: CUmemAllocationProp = std::mem::zeroed();
            prop.type_ = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = dev;
            Driver {
                create: proc_of(gpa, "cuMemCreate", 12000),
                release: proc_of(gpa, "cuMemRelease", 12000),
                reserve: proc_of(gpa, "cuMemAddressReserve", 12000),
                map: proc_of(gpa, "cuMemMap", 12000),
                unmap: proc_of(gpa, "cuMemUnmap", 12000),
                retain: proc_of(gpa, "cuMemRetainAllocationHandle", 12000),
                prop,
            }
        }
    }

    /// A Q/2 handle (`create=rc` printed), if the driver and the quota allow it.
    unsafe fn new_handle(&self) -> Option<CUmemGenericAllocationHandle> {
        let mut h: CUmemGenericAllocationHandle = 0;
        // SAFETY: out-parameter and properties are locals.
        let rc = unsafe { (self.create)(&mut h, HALF, &self.prop, 0) };
        say("create", rc);
        (rc == CUresult::CUDA_SUCCESS).then_some(h)
    }

    /// A fresh Q/2 virtual range.
    unsafe fn range(&self) -> CUdeviceptr {
        let mut va: CUdeviceptr = 0;
        // SAFETY: out-parameter is a local.
        assert_eq!(unsafe { (self.reserve)(&mut va, HALF, 0, 0, 0) }, CUresult::CUDA_SUCCESS);
        va
    }
}

fn say(step: &str, rc: CUresult) {
    println!("{step}={}", rc.0);
}

/// The child: the steps under the quota, one `step=rc` line each.
unsafe fn child() {
    // SAFETY: the whole body calls the driver with locals as out-parameters.
    unsafe {
        let d = Driver::open();
        let Driver { release, map, unmap, .. } = d;
        // NVIDIA's idiom, three times over: the third create does not fit.
        let mut mapped = Vec::new();
        for _ in 0..3 {
            let Some(h) = d.new_handle() else { continue };
            let va = d.range();
            say("map", map(va, HALF, 0, h, 0));
            say("release", release(h));
            mapped.push(va);
        }
        // The last unmap of a released handle gives its bytes back: a create fits again.
        say("unmap", unmap(mapped[0], HALF));
        let h = d.new_handle().expect("fits after the unmap");
        // Mapped and unmapped before its release: given back at the release.
        let va = d.range();
        say("map", map(va, HALF, 0, h, 0));
        say("unmap", unmap(va, HALF));
        assert!(d.new_handle().is_none(), "unmapped but not released: still counted");
        say("release", release(h));
        // Quota: the second mapping and now this one: both fit.
        let h = d.new_handle().expect("fits after the release");
        say("release", release(h));
        let last = d.new_handle().expect("an unmapped handle goes back at its release");
        say("release", release(last));
        // What the driver refuses changes no count: a mapping not on the allocation
        // granularity, and an unmap of part of a mapping ("cuMemUnmap cannot unmap a
        // sub-range"; the emulator refuses both as the driver does).
        let h = d.new_handle().expect("half the quota is free again");
        let va = d.range();
        say("map_misaligned", map(va + 4096, HALF - (2 << 20), 0, h, 0));
        say("map", map(va, HALF, 0, h, 0));
        say("unmap_part", unmap(va, HALF / 2));
        assert!(d.new_handle().is_none(), "a refused partial unmap leaves the mapping counted");
        say("unmap", unmap(va, HALF));
        say("release", release(h));
    }
}

/// The retain child: NVIDIA's idiom, a retain, the unmap, a new mapping of the retained
/// handle; two creates of Q/2 (the second refused); the retained reference released and
/// unmapped; a create fits again.
unsafe fn retain_child() {
    // SAFETY: the whole body calls the driver with locals as out-parameters.
    unsafe {
        let d = Driver::open();
        let Driver { release, map, unmap, retain, .. } = d;
        let h = d.new_handle().expect("half the quota");
        let va = d.range();
        say("map", map(va, HALF, 0, h, 0));
        say("release", release(h));
        let mut r: CUmemGenericAllocationHandle = 0;
        // Any address in the mapping.
        say("retain", retain(&mut r, (va + 4096) as *mut c_void));
        println!("same_handle={}", u8::from(r == h));
        say("unmap", unmap(va, HALF));
        let va2 = d.range();
        say("map", map(va2, HALF, 0, r, 0));
        let other = d.new_handle().expect("the other half");
        assert!(d.new_handle().is_none(), "the retained memory is still held");
        say("release", release(r));
        say("unmap", unmap(va2, HALF));
        let again = d.new_handle().expect("given back at the last release and unmap");
        let _ = (release(other), release(again));
    }
}
