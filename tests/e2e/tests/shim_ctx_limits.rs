//! Context limits that hold device memory count against the quota (`xcuda-shim/src/limits.rs`).
//! `cuCtxSetLimit(CU_LIMIT_STACK_SIZE, ...)` makes the driver reserve the stack for every
//! resident thread (1 KiB more is 40 MiB on a T4, 264 MiB on an H100). The malloc heap and the
//! printf FIFO are buffers of their size. No allocation call carries any of this memory. Without
//! the shim counting it, a process holds it past its quota. The control run below, without the
//! shim, shows that the emulator lets it. The offline process runs as `nobody`, as in a
//! container; its device memory is read outside it, from the emulated device (what NVML
//! reports).

mod shim_support;

use std::os::unix::process::CommandExt;

use e2e::EmuHost;
use shim_support::*;

const STACK: &str = "0";
const PRINTF_FIFO: &str = "1";
const MALLOC_HEAP: &str = "2";
const PENDING_LAUNCHES: &str = "4";
/// `CUDA_ERROR_OUT_OF_MEMORY`.
const OOM: &str = "2";

fn host(profile: &str) -> EmuHost {
    let host = EmuHost::with_profile(profile);
    host.open_to_all_users();
    let empty = host.root().join("xcuda-empty.json");
    std::fs::write(&empty, "{}").unwrap();
    e2e::chmod(&empty, 0o644);
    // The ledger as the monitor (root) creates it; the offline process only opens it.
    drop(ledger(&host));
    host
}

#[test]
fn a_raised_stack_heap_or_fifo_is_counted_against_the_quota_on_every_profile() {
    for profile in ["t4", "a10", "h100"] {
        let host = host(profile);
        // 1 KiB of stack for every thread the GPU holds resident.
        let l = host.gpu_profile().context_local_bytes();
        let quota = 3 * l;
        let half = (l * 3 / 2).to_string();
        let heap = ((8 << 20) + l * 7 / 5).to_string();
        let fifo = ((1 << 20) + l / 5).to_string();
        let steps = [
            "ctx",
            "setlimit", STACK, "3072", // 2 KiB more per thread: 2 l, within the quota
            "getlimit", STACK,
            "alloc", &half, // 2 l + 1.5 l > 3 l: refused
            "ready", "wait",
            "setlimit", STACK, "1024", // back to the default: 2 l given back
            "alloc", &half,
            "setlimit", STACK, "3072", // 1.5 l + 2 l > 3 l: refused, the limit unchanged
            "getlimit", STACK,
            "setlimit", MALLOC_HEAP, &heap, // 1.4 l more: 2.9 l in all
            "setlimit", PRINTF_FIFO, &fifo, // 0.2 l more: refused
            "setlimit", PENDING_LAUNCHES, "4096", // memory NVIDIA does not size: refused
            "destroy", // the context's end gives its limits back
            "ctx", "meminfo",
        ];
        let mut cmd = limited(&host, "shim_client", quota, "limits");
        cmd.args(steps).uid(NOBODY).gid(NOBODY);
        let mut c = host.spawn(&mut cmd);
        c.wait_for_line("ready", T).unwrap_or_else(|| panic!("{profile}: client not ready: {}", c.stderr()));
        let held = host.device().snapshot().memory_used;
        assert_eq!(
            held,
            host.context_bytes() + 2 * l,
            "{profile}: the driver holds the raised stack for every resident thread (read outside the process)"
        );
        assert!(held <= host.context_bytes() + quota, "{profile}: never past the quota: {held}");
        c.send_line("go");
        let out = c.finish(T);
        let lines: Vec<String> = out.lines().map(str::to_string).collect();
        let set = rc_of(&lines, "setlimit=");
        assert_eq!(set, ["0", "0", OOM, "0", OOM, OOM], "{profile}: stack, stack back, stack refused, heap, fifo refused, pending launches refused: {lines:?}\n{}", c.stderr());
        assert_eq!(rc_of(&lines, "alloc="), [OOM, "0"], "{profile}: the stack's memory leaves no room, then is given back: {lines:?}");
        let gets: Vec<&str> = lines.iter().filter(|l| l.starts_with("getlimit=")).map(|l| e2e::field(l, "value").unwrap()).collect();
        assert_eq!(gets, ["3072", "1024"], "{profile}: a refused raise leaves the limit as it was: {lines:?}");
        let mi = lines.iter().find(|l| l.starts_with("meminfo=")).expect("meminfo");
        assert_eq!(e2e::field(mi, "free"), Some(quota.to_string().as_str()), "{profile}: nothing counted once the context is gone: {mi}");

        // Control: without the shim the same raise and allocation both succeed.
        let mut cmd = unlimited(&host, "shim_client");
        cmd.args(["ctx", "setlimit", STACK, "3072", "alloc", &half]).uid(NOBODY).gid(NOBODY);
        let lines = run(&host, &mut cmd);
        assert_eq!(rc_of(&lines, "setlimit="), ["0"], "{profile}: control: {lines:?}");
        assert_eq!(rc_of(&lines, "alloc="), ["0"], "{profile}: control: the emulator lets the stack past any quota: {lines:?}");
    }
}

/// The emulated driver, as cuda.h documents `cuCtxSetLimit`: a raised stack takes device memory
/// at once and does not fit a full device; the device-runtime sync depth is refused from
/// compute capability 9.0 on.
#[test]
fn the_emulator_reserves_a_raised_stack_and_refuses_one_that_does_not_fit() {
    let host = host("h100");
    let total = host.device().info().total_memory;
    let l = host.gpu_profile().context_local_bytes();
    let too_big = (1024 + (total / l + 1) * 1024).min(512 << 10).to_string();
    let lines = run(
        &host,
        unlimited(&host, "shim_client").args(["ctx", "setlimit", STACK, &too_big, "getlimit", STACK, "setlimit", "3", "4", "setlimit", STACK, "2048", "meminfo"]),
    );
    assert_eq!(rc_of(&lines, "setlimit="), [OOM, "215", "0"], "does not fit; CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH unsupported on 9.0; fits: {lines:?}");
    let get = lines.iter().find(|l| l.starts_with("getlimit=")).unwrap();
    assert_eq!(e2e::field(get, "value"), Some("1024"), "a refused raise leaves the stack as it was: {get}");
    let mi = lines.iter().find(|l| l.starts_with("meminfo=")).expect("meminfo");
    assert_eq!(
        e2e::field(mi, "free"),
        Some((total - host.context_bytes() - l).to_string().as_str()),
        "the context and 1 KiB more stack for every resident thread: {mi}"
    );
}
