//! CUDA 13 callers (driver 580): a C client built against NVIDIA's CUDA 13.0 headers resolves
//! every entry point with `cuGetProcAddress_v2(name, CUDA_VERSION=13000)`, as a CUDA 13 runtime
//! does. The emulator stands in for a 13.0 driver (`GPUEMU_CUDA_VERSION=13000`); under the shim
//! every allocation path such a caller reaches is held to the quota.
//!
//! Needs `cc` and the CUDA 13 headers (`scripts/setup-test-env.sh`), like cuda-abi's header test.

mod shim_support;

use std::path::PathBuf;
use std::process::Command;

use e2e::{step_rc as rc, EmuHost};
use shim_support::*;

const QUOTA: u64 = 64 * MIB;

/// Builds the C client against the CUDA 13 headers, once per host.
fn client(host: &EmuHost) -> PathBuf {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let headers = match std::env::var_os("CUDA13_HEADERS_DIR") {
        Some(d) => PathBuf::from(d),
        None => repo.join(".cuda-headers-13"),
    };
    assert!(
        headers.join("cuda.h").is_file() && headers.join("cudaTypedefs.h").is_file(),
        "CUDA 13 headers missing in {} — run scripts/setup-test-env.sh or set CUDA13_HEADERS_DIR",
        headers.display()
    );
    let out = host.root().join("cuda13_client");
    if !out.exists() {
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let res = Command::new(&cc)
            .args(["-std=c11", "-Wall", "-Werror", "-I"])
            .arg(&headers)
            .arg(repo.join("tests/e2e/c/cuda13_client.c"))
            .args(["-ldl", "-o"])
            .arg(&out)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
        assert!(
            res.status.success(),
            "building the CUDA 13 client:\n{}",
            String::from_utf8_lossy(&res.stderr)
        );
    }
    out
}

fn as_13(mut c: Command) -> Command {
    c.env("GPUEMU_CUDA_VERSION", "13000");
    c
}

fn lines(host: &EmuHost, c: &mut Command) -> Vec<String> {
    let mut ch = host.spawn(c);
    let out = ch.finish(T);
    let l: Vec<String> = out.lines().map(str::to_string).collect();
    assert!(
        l.iter().any(|x| x == "init=0"),
        "client did not start:\n{out}\n{}",
        ch.stderr()
    );
    l
}

fn gpa_line<'a>(lines: &'a [String], name: &str) -> &'a str {
    lines
        .iter()
        .find(|l| l.starts_with("gpa ") && e2e::field(l, "name") == Some(name))
        .unwrap_or_else(|| panic!("no gpa line for {name} in {lines:?}"))
}

#[test]
fn the_emulator_answers_cuda_13_callers_as_driver_580_would() {
    let host = EmuHost::new();
    let exe = client(&host);
    let exe = exe.to_str().unwrap();
    let steps = [
        "version",
        "gpa",
        "cuCtxSynchronize",
        "gpa",
        "cuCtxGetDevice",
        "gpa",
        "cuCtxCreate",
        "ctx",
        "sync",
        "mpool",
        "4194304",
        "freeall",
        "destroy",
    ];

    let l = lines(&host, as_13(host.command(exe)).args(steps));
    assert_eq!(e2e::field(&l[1], "driver"), Some("13000"), "{l:?}");
    assert_eq!(
        e2e::field(gpa_line(&l, "cuCtxSynchronize"), "sym"),
        Some("cuCtxSynchronize_v2"),
        "{l:?}"
    );
    assert_eq!(
        e2e::field(gpa_line(&l, "cuCtxGetDevice"), "sym"),
        Some("cuCtxGetDevice_v2"),
        "{l:?}"
    );
    assert_eq!(
        e2e::field(gpa_line(&l, "cuCtxCreate"), "sym"),
        Some("cuCtxCreate_v4"),
        "{l:?}"
    );
    assert_eq!(rc(&l, "ctx", 0), "0", "{l:?}");
    assert_eq!(rc(&l, "sync", 0), "0", "cuCtxSynchronize_v2(ctx): {l:?}");
    assert_eq!(
        rc(&l, "mpool", 0),
        "0",
        "managed pools exist in 13.0: {l:?}"
    );
    assert_eq!(rc(&l, "destroy", 0), "0", "{l:?}");

    // The default emulator is a 12.9 driver: it has no 13.0 ABI to hand out, whatever is asked.
    let l = lines(
        &host,
        host.command(exe).args([
            "version",
            "gpa",
            "cuCtxSynchronize",
            "ctx",
            "mpool",
            "4194304",
        ]),
    );
    assert_eq!(e2e::field(&l[1], "driver"), Some("12090"), "{l:?}");
    assert_eq!(
        e2e::field(gpa_line(&l, "cuCtxSynchronize"), "sym"),
        Some("cuCtxSynchronize"),
        "{l:?}"
    );
    assert_eq!(
        rc(&l, "mpool", 0),
        "1",
        "a 12.9 driver refuses managed pools (INVALID_VALUE): {l:?}"
    );

    // A driver version the emulator does not model fails loudly instead of becoming another:
    // not even cuInit resolves.
    let mut c = host.command(exe);
    c.env("GPUEMU_CUDA_VERSION", "13010").arg("version");
    let mut ch = host.spawn(&mut c);
    let out = ch.finish(T);
    assert!(out.contains("gpa_failed name=cuInit rc=1"), "{out}");
    assert!(
        ch.stderr().contains("GPUEMU_CUDA_VERSION"),
        "{}",
        ch.stderr()
    );
}

#[test]
fn cuda_13_callers_get_the_shims_entry_points() {
    let host = EmuHost::new();
    let exe = client(&host);
    let names = [
        "cuMemAlloc",
        "cuMemAllocAsync",
        "cuMemAllocFromPoolAsync",
        "cuMemCreate",
        "cuMemAllocManaged",
        "cuMemAllocPitch",
        "cuArrayCreate",
        "cuMemFree",
        "cuMemGetInfo",
        "cuCtxCreate",
        "cuCtxDestroy",
        "cuDevicePrimaryCtxRelease",
        "cuDevicePrimaryCtxReset",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
        "cuGraphLaunch",
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
    ];
    let mut steps: Vec<&str> = Vec::new();
    for n in &names {
        steps.extend(["gpa", n]);
    }
    steps.extend(["gpa", "cuStreamQuery"]);
    let l = lines(
        &host,
        as_13(limited(&host, exe.to_str().unwrap(), QUOTA, "c13gpa")).args(&steps),
    );
    for n in names {
        let g = gpa_line(&l, n);
        assert!(
            e2e::field(g, "lib").unwrap().starts_with("libxcuda"),
            "{n} at CUDA 13000 must be the shim's: {g}"
        );
    }
    let g = gpa_line(&l, "cuStreamQuery");
    assert!(
        e2e::field(g, "lib").unwrap().starts_with("libcuda"),
        "not hooked: the driver's own: {g}"
    );
    assert_eq!(
        e2e::field(gpa_line(&l, "cuCtxCreate"), "sym"),
        Some("cuCtxCreate_v4"),
        "{l:?}"
    );
    // CUDA 13.0's cuCtxSynchronize takes a context.
    assert_eq!(
        e2e::field(gpa_line(&l, "cuCtxSynchronize"), "sym"),
        Some("cuCtxSynchronize_v2"),
        "{l:?}"
    );

    // A request newer than the checked headers still gets the shim's hook when the driver answers
    // with the very ABI the table knows (the emulated 13.0 driver resolves 13010 as 13.0).
    let l = lines(
        &host,
        as_13(limited(&host, exe.to_str().unwrap(), QUOTA, "c13gpa")).args([
            "--version",
            "13010",
            "gpa",
            "cuMemAlloc",
            "ctx",
            "alloc",
            "50000000",
            "alloc",
            "30000000",
        ]),
    );
    assert!(
        e2e::field(gpa_line(&l, "cuMemAlloc"), "lib")
            .unwrap()
            .starts_with("libxcuda"),
        "{l:?}"
    );
    assert_eq!(rc(&l, "alloc", 1), "2", "quota at cudaVersion 13010: {l:?}");
}

#[test]
fn a_cuda_13_caller_is_refused_past_the_quota_on_every_allocation_path() {
    let host = EmuHost::new();
    let exe = client(&host);
    let exe = exe.to_str().unwrap();
    let (fill, extra) = ((40 * MIB).to_string(), (30 * MIB).to_string());
    // mpool: managed-memory pools, an allocation path CUDA 13.0 added.
    for path in ["alloc", "async", "pool", "mpool", "vmm"] {
        let group = format!("c13{path}");
        let args = [
            "ctx", path, &fill, path, &extra, "freeall", path, &extra, "freeall", "destroy",
        ];
        let l = lines(&host, as_13(limited(&host, exe, QUOTA, &group)).args(args));
        assert_refused_then_given_back(&l, path);
        assert_eq!(rc(&l, "destroy", 0), "0", "{l:?}");
        let ledger = ledger(&host);
        let g = group_of(&ledger, &group);
        assert_eq!(
            ledger.group_used(g),
            0,
            "{path}: the ledger is back at zero"
        );

        // Control: the same CUDA 13 caller without the shim is not limited.
        let l = lines(&host, as_13(unlimited(&host, exe)).args(args));
        assert_eq!(
            rc(&l, path, 1),
            "0",
            "{path}: control run without the shim: {l:?}"
        );
    }
    assert_eq!(
        host.device().snapshot().memory_used,
        0,
        "nothing leaked on the device"
    );
}

#[test]
fn context_destroy_and_primary_reset_through_cuda_13_entries_give_the_quota_back() {
    let host = EmuHost::new();
    let exe = client(&host);
    let exe = exe.to_str().unwrap();
    let fill = (40 * MIB).to_string();
    // cuCtxCreate_v4 + cuCtxDestroy_v2 (at 13000), the primary context's Retain / Reset_v2 /
    // Release_v2: the driver frees the context's memory, the quota follows.
    for (group, args) in [
        (
            "c13destroy",
            vec![
                "ctx", "alloc", &fill, "destroy", "ctx", "alloc", &fill, "destroy",
            ],
        ),
        (
            "c13reset",
            vec![
                "primary", "alloc", &fill, "preset", "primary", "alloc", &fill, "prelease",
            ],
        ),
    ] {
        let l = lines(&host, as_13(limited(&host, exe, QUOTA, group)).args(&args));
        assert_eq!(rc(&l, "alloc", 0), "0", "{group}: {l:?}");
        assert_eq!(
            rc(&l, "alloc", 1),
            "0",
            "{group}: the first 40 MiB went back with its context: {l:?}"
        );
        let ledger = ledger(&host);
        let g = group_of(&ledger, group);
        assert_eq!(
            ledger.group_used(g),
            0,
            "{group}: the ledger is back at zero"
        );
    }
    assert_eq!(
        host.device().snapshot().memory_used,
        0,
        "nothing leaked on the device"
    );
}

#[test]
fn launches_through_cuda_13_entries_pass_the_shims_launch_gate() {
    let host = EmuHost::new();
    let exe = client(&host);
    let ptx = host.root().join("spin.ptx");
    std::fs::write(&ptx, workloads::ptx::SPIN_PTX.to_bytes()).unwrap();
    let n = 20u64;
    let mut c = as_13(limited(&host, exe.to_str().unwrap(), QUOTA, "c13launch"));
    c.args([
        "ctx",
        "launch",
        ptx.to_str().unwrap(),
        &n.to_string(),
        "hold",
    ]);
    let mut ch = host.spawn(&mut c);
    assert!(
        ch.wait_for_line("hold", T).is_some(),
        "{}\n{}",
        ch.stdout(),
        ch.stderr()
    );
    assert!(ch.stdout().contains("launch=0"), "{}", ch.stdout());
    // The shim publishes its launch counter to the ledger from its control loop: wait for it
    // (a mechanism, no timing asserted: the deadline only bounds a hang).
    let deadline = std::time::Instant::now() + T;
    let counted = loop {
        let mine = ledger(&host)
            .procs()
            .into_iter()
            .find(|p| p.pid == ch.pid());
        let seen = mine.map_or(0, |p| p.launches);
        if seen >= 3 * n || std::time::Instant::now() > deadline {
            break seen;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(
        counted,
        3 * n,
        "cuLaunchKernel, cuLaunchKernelEx and cuLaunchCooperativeKernel at 13000 all gated"
    );
}
