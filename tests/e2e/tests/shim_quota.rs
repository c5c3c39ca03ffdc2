//! Memory quota end to end: real client processes with LD_PRELOAD=libxcuda.so on the emulator.
//! Each test has a control run without the shim that behaves differently.

mod shim_support;

use e2e::{EmuChild, EmuHost};
use shim_support::*;

const QUOTA: u64 = 64 * MIB;

/// (path, step args filling 40+ MiB, step args adding 24+ MiB more).
fn paths() -> Vec<(&'static str, Vec<String>, Vec<String>)> {
    let s = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>();
    let one = |step: &str, v: &[u64]| {
        let mut a = vec![step.to_string()];
        a.extend(s(v));
        a
    };
    vec![
        (
            "alloc",
            one("alloc", &[40 * MIB]),
            one("alloc", &[30 * MIB]),
        ),
        (
            "managed",
            one("managed", &[40 * MIB]),
            one("managed", &[30 * MIB]),
        ),
        (
            "async",
            one("async", &[40 * MIB]),
            one("async", &[30 * MIB]),
        ),
        ("pool", one("pool", &[40 * MIB]), one("pool", &[30 * MIB])),
        ("vmm", one("vmm", &[40 * MIB]), one("vmm", &[30 * MIB])),
        (
            "pitch",
            one("pitch", &[4096, 10240]),
            one("pitch", &[4096, 7680]),
        ),
        (
            "array",
            one("array", &[4096, 2560]),
            one("array", &[4096, 1920]),
        ),
        (
            "array3d",
            one("array3d", &[4096, 256, 10]),
            one("array3d", &[4096, 256, 8]),
        ),
        (
            "arrayv1",
            one("arrayv1", &[4096, 2560]),
            one("arrayv1", &[4096, 1920]),
        ),
        (
            "array3dv1",
            one("array3dv1", &[4096, 256, 10]),
            one("array3dv1", &[4096, 256, 8]),
        ),
        (
            "mipmap",
            one("mipmap", &[4096, 2048, 4]),
            one("mipmap", &[4096, 2048, 4]),
        ),
        // 1024 x 1024 floats, 10 layers, 4 levels: 53.1 MiB, every level keeping its 10 layers;
        // then 3 layers of one level, 12 MiB. Counted halving the layers (as it was) the first
        // was 45.6 MiB, and the second fitted under the 64 MiB quota with 65.1 MiB on the GPU.
        (
            "mipmaplayered",
            one("mipmaplayered", &[1024, 1024, 10, 4]),
            one("mipmaplayered", &[1024, 1024, 3, 1]),
        ),
    ]
}

/// `shim_client` of container `group` under the quota, run to completion with `steps`.
fn client(host: &EmuHost, group: &str, steps: &[&str]) -> Vec<String> {
    run(host, limited(host, "shim_client", QUOTA, group).args(steps))
}

/// A `shim_client` of container `group` holding `bytes` (ready, then hanging until killed).
fn spawn_holder(host: &EmuHost, group: &str, bytes: u64) -> EmuChild {
    let mut h = host.spawn(limited(host, "shim_client", QUOTA, group).args([
        "ctx",
        "alloc",
        &bytes.to_string(),
        "ready",
        "hang",
    ]));
    assert!(h.wait_for_line("ready", T).is_some(), "{}", h.stderr());
    h
}

/// The first `nvmlmem` line a client printed.
fn nvmlmem(lines: &[String]) -> &str {
    lines
        .iter()
        .find(|l| l.starts_with("nvmlmem"))
        .expect("nvml line")
}

#[test]
fn quota_refused_at_the_limit_on_every_alloc_path() {
    let host = EmuHost::new();
    let dev = host.device();
    for (name, fill, extra) in paths() {
        let mut args: Vec<String> = vec!["ctx".into()];
        args.extend(fill.clone());
        args.extend(extra.clone());
        args.push("freeall".into());
        args.extend(extra.clone());
        args.push("freeall".into());

        let mut c = limited(&host, "shim_client", QUOTA, name);
        c.args(&args);
        let lines = run(&host, &mut c);
        assert_refused_then_given_back(&lines, name);
        assert_eq!(
            dev.snapshot().memory_used,
            0,
            "{name}: nothing leaked on the device"
        );
        let l = ledger(&host);
        let g = group_of(&l, name);
        assert_eq!(l.group_used(g), 0, "{name}: the ledger is back at zero");

        let mut c = unlimited(&host, "shim_client");
        c.args(&args);
        let lines = run(&host, &mut c);
        assert_eq!(
            e2e::step_rc(&lines, name, 1),
            "0",
            "{name}: control run without the shim is not limited"
        );
    }
}

/// `cuMemCreate` on a device the process does not have is refused with the driver's own
/// `CUDA_ERROR_INVALID_VALUE` (control run without the shim), not the quota's
/// `CUDA_ERROR_OUT_OF_MEMORY` (what the shim said before: the 0-byte quota of an unknown
/// ordinal); ordinal 4294967295 is -1 to the driver; one on device 0 is counted as before.
#[test]
fn vmm_memory_on_a_device_that_does_not_exist_is_an_invalid_value() {
    let host = EmuHost::new();
    let steps = [
        "ctx",
        "vmmon",
        "7",
        "2097152",
        "vmmon",
        "4294967295",
        "2097152",
        "vmmon",
        "0",
        "2097152",
    ];
    let rcs = |lines: &[String]| -> Vec<String> {
        (0..3).map(|k| e2e::step_rc(lines, "vmmon", k)).collect()
    };
    let without = run(&host, unlimited(&host, "shim_client").args(steps));
    assert_eq!(rcs(&without), ["1", "1", "0"], "the driver: {without:?}");
    let with = run(
        &host,
        limited(&host, "shim_client", QUOTA, "vmmon").args(steps),
    );
    assert_eq!(
        rcs(&with),
        rcs(&without),
        "the shim answers as the driver does: {with:?}"
    );
}

#[test]
fn meminfo_and_total_mem_show_the_quota() {
    let host = EmuHost::new();
    let device_total = host.device().info().total_memory;
    let mut c = limited(&host, "shim_client", QUOTA, "view");
    c.args([
        "ctx",
        "totalmem",
        "meminfo",
        "alloc",
        &(40 * MIB).to_string(),
        "meminfo",
        "alloc",
        &(24 * MIB).to_string(),
        "meminfo",
    ]);
    let lines = run(&host, &mut c);
    let l = |p: &str, n: usize| {
        lines
            .iter()
            .filter(|l| l.starts_with(p))
            .nth(n)
            .unwrap()
            .clone()
    };
    assert_eq!(e2e::num(&l("totalmem=", 0), "total") as u64, QUOTA);
    assert_eq!(e2e::num(&l("meminfo=", 0), "total") as u64, QUOTA);
    assert_eq!(e2e::num(&l("meminfo=", 0), "free") as u64, QUOTA);
    assert_eq!(e2e::num(&l("meminfo=", 1), "free") as u64, QUOTA - 40 * MIB);
    assert_eq!(
        e2e::num(&l("meminfo=", 2), "free") as u64,
        0,
        "full quota: free is 0, not negative"
    );

    let mut c = unlimited(&host, "shim_client");
    c.args(["ctx", "totalmem"]);
    let lines = run(&host, &mut c);
    assert_eq!(
        e2e::num(&lines[1], "total") as u64,
        device_total,
        "control run sees the whole device"
    );
}

#[test]
fn nvml_memory_queries_show_the_quota() {
    let host = EmuHost::new();
    let device_total = host.device().info().total_memory;
    let lines = client(&host, "nvml", &["ctx", "alloc", &(40 * MIB).to_string(), "nvmlmem"]);
    let l = nvmlmem(&lines);
    assert_eq!(e2e::num(l, "total") as u64, QUOTA, "{l}");
    assert_eq!(e2e::num(l, "used") as u64, 40 * MIB, "{l}");
    assert_eq!(e2e::num(l, "free") as u64, QUOTA - 40 * MIB, "{l}");
    assert_eq!(e2e::num(l, "total_v2") as u64, QUOTA, "{l}");
    assert_eq!(e2e::num(l, "free_v2") as u64, QUOTA - 40 * MIB, "{l}");

    let lines = run(
        &host,
        unlimited(&host, "shim_client").args(["ctx", "nvmlmem"]),
    );
    let l = nvmlmem(&lines);
    assert_eq!(e2e::num(l, "total") as u64, device_total, "control: {l}");
}

#[test]
fn two_processes_of_one_container_share_one_quota() {
    let host = EmuHost::new();
    let mut a = host.spawn(limited(&host, "shim_client", QUOTA, "ctr-a").args([
        "ctx",
        "alloc",
        &(40 * MIB).to_string(),
        "ready",
        "wait",
        "freeall",
        "ready",
        "wait",
    ]));
    assert!(a.wait_for_line("ready", T).is_some(), "{}", a.stderr());
    assert_eq!(a.lines("alloc=")[0], format!("alloc=0 bytes={}", 40 * MIB));

    let over = client(
        &host,
        "ctr-a",
        &["ctx", "alloc", &(30 * MIB).to_string(), "alloc", &(24 * MIB).to_string()],
    );
    assert_eq!(
        rc_of(&over, "alloc="),
        ["2", "0"],
        "same container: 40 + 30 > 64 refused, 40 + 24 fits"
    );

    let other = client(&host, "ctr-b", &["ctx", "alloc", &(60 * MIB).to_string()]);
    assert_eq!(
        rc_of(&other, "alloc="),
        ["0"],
        "another container has its own quota"
    );

    a.send_line("free");
    let deadline = std::time::Instant::now() + T;
    while a.lines("ready").len() < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let after = client(&host, "ctr-a", &["ctx", "alloc", &(60 * MIB).to_string()]);
    assert_eq!(
        rc_of(&after, "alloc="),
        ["0"],
        "quota given back by the neighbour's free"
    );
    a.send_line("go");
    a.finish(T);
}

#[test]
fn kill_minus_9_of_a_holder_gives_its_memory_back() {
    let host = EmuHost::new();
    let mut holder = spawn_holder(&host, "ctr", 50 * MIB);
    let l = ledger(&host);
    let g = group_of(&l, "ctr");
    assert_eq!(l.group_used(g), 50 * MIB);
    holder.kill9();

    // The next process of the container finds the dead holder's usage and reclaims it.
    let lines = client(&host, "ctr", &["ctx", "alloc", &(50 * MIB).to_string(), "freeall"]);
    assert_eq!(rc_of(&lines, "alloc="), ["0"], "{lines:?}");
    assert_eq!(l.group_used(g), 0);
    assert!(
        l.procs().is_empty(),
        "dead and exited processes left the registry: {:?}",
        l.procs()
    );
}

#[test]
fn a_live_neighbour_reclaims_a_killed_holder_without_any_new_process() {
    let host = EmuHost::new();
    let mut holder = spawn_holder(&host, "ctr", 50 * MIB);
    let mut neighbour = spawn_holder(&host, "ctr", 10 * MIB);
    let l = ledger(&host);
    let g = group_of(&l, "ctr");
    assert_eq!(l.group_used(g), 60 * MIB);
    holder.kill9();
    // The neighbour's housekeeping notices the death (pid + start time) and gives the memory back.
    let start = std::time::Instant::now();
    while l.group_used(g) != 10 * MIB && start.elapsed() < T {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        l.group_used(g),
        10 * MIB,
        "only the live neighbour's usage remains"
    );
    assert!(l.procs().iter().all(|p| p.pid != holder.pid()));
    neighbour.kill9();
}

#[test]
fn dlsym_and_proc_address_clients_are_both_intercepted() {
    let host = EmuHost::new();
    for (mode, launch_sym) in [
        ("dlsym", "cuLaunchKernel"),
        ("gpa0", "cuLaunchKernel"),
        ("gpa2", "cuLaunchKernel_ptsz"),
        ("gpa1", "cuLaunchKernel"),
        ("gpa1pt", "cuLaunchKernel_ptsz"),
    ] {
        let lines = run(
            &host,
            limited(&host, "shim_client", QUOTA, mode).args([
                "--resolve",
                mode,
                "ctx",
                "alloc",
                &(40 * MIB).to_string(),
                "async",
                &(30 * MIB).to_string(),
                "where",
                "cuLaunchKernel",
                "12000",
                "where",
                "cuMemAlloc",
                "3020",
                "next",
                "cuInit",
                "launch",
                "8",
                "1000",
                "3",
            ]),
        );
        assert_eq!(rc_of(&lines, "alloc="), ["0"], "{mode}");
        assert_eq!(
            rc_of(&lines, "async="),
            ["2"],
            "{mode}: over quota through the async path"
        );
        let wh: Vec<_> = lines.iter().filter(|l| l.starts_with("where")).collect();
        assert!(
            wh[0].ends_with(&format!("object=libxcuda.so({launch_sym})")),
            "{mode}: {}",
            wh[0]
        );
        assert!(
            wh[1].ends_with("object=libxcuda.so(cuMemAlloc_v2)"),
            "{mode}: {}",
            wh[1]
        );
        // RTLD_NEXT from the executable finds the next object after it in lookup order: the
        // preloaded shim. (Resolving relative to the shim itself would find nothing.)
        assert!(
            lines.iter().any(|l| l == "next object=libxcuda.so(cuInit)"),
            "{mode}: {lines:?}"
        );
        assert_eq!(
            rc_of(&lines, "launch="),
            ["0"],
            "{mode}: launches go through"
        );
    }
    let lines = run(
        &host,
        unlimited(&host, "shim_client").args([
            "--resolve",
            "gpa2",
            "ctx",
            "where",
            "cuLaunchKernel",
            "12000",
        ]),
    );
    assert!(
        lines
            .iter()
            .any(|l| l.ends_with("object=libcuda.so.1(cuLaunchKernel_ptsz)")),
        "control: {lines:?}"
    );
}

/// The C program `src` built as `name` in the host's directory, linked against the emulator's
/// libraries with `libs` (`-l:libcuda.so.1` ...).
fn compile_c(host: &EmuHost, name: &str, src: &str, libs: &[&str]) -> std::path::PathBuf {
    let c = host.root().join(format!("{name}.c"));
    let exe = host.root().join(name);
    std::fs::write(&c, src).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = std::process::Command::new(&cc)
        .arg("-o")
        .arg(&exe)
        .arg(&c)
        .arg(format!("-L{}", host.lib_dir().display()))
        .args(libs)
        .status()
        .unwrap_or_else(|e| panic!("{cc} (the C compiler rustc links with) is needed: {e}"));
    assert!(st.success(), "compiling {name} failed");
    exe
}

/// A C program linked with `-lcuda` (no dlopen, no cuGetProcAddress): the shim's exported
/// symbols are what it binds to.
const LINKED_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
typedef void *CUcontext;
CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *dev, int ordinal);
CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev);
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n);
CUresult cuMemFree_v2(CUdeviceptr p);
int main(int argc, char **argv) {
    CUdevice dev; CUcontext ctx; CUdeviceptr a = 0, b = 0;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev)) return 3;
    printf("alloc=%d\n", cuMemAlloc_v2(&a, strtoull(argv[1], 0, 10)));
    printf("alloc=%d\n", cuMemAlloc_v2(&b, strtoull(argv[2], 0, 10)));
    if (a) cuMemFree_v2(a);
    if (b) cuMemFree_v2(b);
    return 0;
}
"#;

#[test]
fn a_program_linked_with_lcuda_is_limited_through_exported_symbols() {
    let host = EmuHost::new();
    let exe = compile_c(&host, "linked", LINKED_C, &["-l:libcuda.so.1"]);
    let (a, b) = ((40 * MIB).to_string(), (30 * MIB).to_string());
    let lines = run(
        &host,
        limited(&host, exe.to_str().unwrap(), QUOTA, "linked").args([&a, &b]),
    );
    assert_eq!(rc_of(&lines, "alloc="), ["0", "2"], "{lines:?}");
    let lines = run(
        &host,
        unlimited(&host, exe.to_str().unwrap()).args([&a, &b]),
    );
    assert_eq!(rc_of(&lines, "alloc="), ["0", "0"], "control: {lines:?}");
}

/// A tenant's thread widens an array descriptor after the shim has read (and counted) it and
/// before the driver reads it (the emulator's test hook runs "the other thread" at the shim's
/// next `cuCtxGetCurrent`, inside that window). The driver is given the shim's copy, so the
/// array made is the array counted. Before, the driver read the caller's descriptor again:
/// a 256 MiB array was made, 4 MiB of it counted, under a 64 MiB quota (a 2D array through
/// `cuArray3DCreate_v2`, depth 0).
#[test]
fn a_descriptor_changed_after_the_shims_read_is_not_what_the_driver_makes() {
    let host = host_for_users();
    let dev = host.device();
    // The ledger as the monitor makes it (its mode open to the container's users), before the
    // client: as offline containers run, not root.
    let l = ledger(&host);
    let mut c = limited(&host, "shim_client", QUOTA, "raced");
    as_nobody(&mut c).args(["ctx", "array3draced", "1024", "1024", "0", "65536", "ready", "hang"]);
    let mut h = host.spawn(&mut c);
    let line = h.wait_for_line("array3draced", T).unwrap_or_else(|| panic!("{} {}", h.stdout(), h.stderr()));
    assert_eq!(line, "array3draced=0 width_now=65536", "the caller's descriptor was widened meanwhile");
    assert!(h.wait_for_line("ready", T).is_some(), "{}", h.stderr());
    let counted = l.group_used(group_of(&l, "raced"));
    assert_eq!(counted, 4 * MIB, "1024 x 1024 floats counted");
    let snap = dev.snapshot();
    let p = snap.processes.iter().find(|p| p.pid == h.pid()).expect("the client on the GPU");
    assert_eq!(p.used_memory - p.context_memory, counted, "what the driver made is what was counted");
    h.kill9();
}

/// Stream-ordered allocations on a stream another thread keeps capturing (relaxed mode, each
/// capture open ~100 us), as offline containers run (uid 65534): an allocation the shim saw
/// inside the capture may reach the driver just after the capture ended, and is then memory.
/// Such an allocation is counted both as the capture's node and as memory, so what the
/// process holds on the GPU, measured outside the shim, stays within its quota. Before, it was
/// taken for a node and not counted: the emulated T4 filled (1 GiB quota, 15 GiB held).
#[test]
fn allocations_racing_another_threads_capture_stay_within_the_quota() {
    let host = host_for_users();
    let dev = host.device();
    let l = ledger(&host);
    let quota = 256 * MIB;
    let mut c = limited(&host, "shim_client", quota, "capturerace");
    as_nobody(&mut c).args(["ctx", "capturerace", "100000", &(16 * MIB).to_string(), "ready", "hang"]);
    let mut h = host.spawn(&mut c);
    let line = h.wait_for_line("capturerace", T).unwrap_or_else(|| panic!("{} {}", h.stdout(), h.stderr()));
    assert!(h.wait_for_line("ready", T).is_some(), "{}", h.stderr());
    let ok = e2e::num(&line, "ok") as u64;
    assert!(ok > 0, "some allocations went through: {line}");
    let snap = dev.snapshot();
    let p = snap.processes.iter().find(|p| p.pid == h.pid()).expect("the client on the GPU");
    let held = p.used_memory - p.context_memory;
    assert!(held <= quota, "{} MiB held on the GPU against a {} MiB quota ({line})", held / MIB, quota / MIB);
    assert!(l.group_used(group_of(&l, "capturerace")) <= quota);
    h.kill9();
}

/// A program that asks NVML for a GPU's memory before any CUDA call (vLLM's NVML platform, a
/// "pick the freest GPU" helper), then forks, and whose child initialises CUDA.
const NVML_THEN_FORK_C: &str = r#"
#include <stdio.h>
#include <unistd.h>
#include <sys/wait.h>
typedef int CUresult;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
CUresult cuInit(unsigned int flags);
CUresult cuDeviceGetCount(int *count);
int nvmlInit_v2(void);
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device);
int nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory);
int main(void) {
    void *dev = 0; nvmlMemory_t m = {0};
    if (nvmlInit_v2() || nvmlDeviceGetHandleByIndex_v2(0, &dev)) return 3;
    printf("nvml=%d\n", nvmlDeviceGetMemoryInfo(dev, &m));
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int n = -1, rc = cuInit(0);
        if (rc == 0) rc = cuDeviceGetCount(&n);
        printf("child=%d count=%d\n", rc, n);
        fflush(stdout);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return 0;
}
"#;

/// NVML's memory query answers without initialising CUDA in the process: a child forked after
/// it initialises CUDA itself. Before, the shim's NVML hook built its state for the quota view
/// (`cuInit`, registration, threads) and the child's `cuInit` failed with
/// `CUDA_ERROR_NOT_INITIALIZED` (3), as CUDA does in the child of an initialised parent.
#[test]
fn an_nvml_memory_query_does_not_initialise_cuda_for_a_forked_child() {
    let host = host_for_users();
    let _l = ledger(&host);
    let exe = compile_c(&host, "nvmlfork", NVML_THEN_FORK_C, &["-l:libcuda.so.1", "-l:libnvidia-ml.so.1"]);
    let mut c = limited(&host, exe.to_str().unwrap(), QUOTA, "nvmlfork");
    let lines = run(&host, as_nobody(&mut c));
    assert_eq!(rc_of(&lines, "nvml="), ["0"], "{lines:?}");
    assert_eq!(rc_of(&lines, "child="), ["0"], "the child's cuInit: {lines:?}");
}
