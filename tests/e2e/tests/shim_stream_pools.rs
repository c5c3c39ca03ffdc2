//! Stream-ordered memory pools under the quota: a pool keeps the memory of freed allocations
//! (until the next synchronisation with the default release threshold, for ever with
//! `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` raised, as PyTorch's `cudaMallocAsync` backend does,
//! until `cuMemPoolTrimTo`), and a pool created on another device holds that device's memory.
//! The shim counts what the pools reserve, on the pool's GPU. Device memory is measured outside
//! the shim: the emulated NVML and device (the emulator models pools as NVIDIA documents them).
//! Before: the bytes went back to the quota at `cuMemFreeAsync` while the pool kept them, so a
//! process held its quota in the pool and as much again through `cuMemAlloc`; and a pool of
//! device 1 was counted on the current context's device.

mod shim_support;

use std::os::unix::process::CommandExt;

use e2e::nvml_sampler::NvmlSampler;
use e2e::EmuHost;
use shim_support::*;

const QUOTA: u64 = 64 * MIB;
/// About 60 % of the quota: two of them do not fit.
const SIXTY: u64 = 38 * MIB;

/// Device memory `pid` holds on `dev` by the emulated device's own count, less its contexts.
fn held_on(dev: &e2e::emu_device::Device, pid: u32) -> u64 {
    dev.snapshot().processes.iter().find(|p| p.pid == pid).map_or(0, |p| p.used_memory - p.context_memory)
}

/// What `pid` has counted in ledger `l`.
fn counted_in(l: &node_ledger::Ledger, pid: u32) -> u64 {
    l.procs().into_iter().find(|p| p.pid == pid).map_or(0, |p| p.mem_bytes)
}

/// Lets a child waiting at `wait` go on, and waits for its `n`th `ready`.
fn next_ready(k: &mut e2e::EmuChild, n: usize) {
    k.send_line("go");
    e2e::wait_until("the client's next step", T, || (k.lines("ready").len() >= n).then_some(()));
}

/// The client of the brief, run as uid 65534 as offline containers are: device 0's pool keeps
/// everything (release threshold UINT64_MAX); 60 % of the quota allocated with cuMemAllocAsync,
/// freed with cuMemFreeAsync, synchronised: the pool still holds it, so cuMemAlloc of 60 % more
/// is refused with CUDA_ERROR_OUT_OF_MEMORY; after cuMemPoolTrimTo(pool, 0) the same cuMemAlloc
/// succeeds. NVML, sampled outside the shim all along, never shows the process over its quota.
/// Old shim: the cuMemAlloc succeeded (the free had given the bytes back) and the process held
/// 76 MiB against its 64 MiB quota.
#[test]
fn a_pool_that_keeps_freed_memory_stays_counted_until_trimmed() {
    if e2e::lacks_root("run the offline client as uid 65534") {
        return;
    }
    let host = host_for_users();
    let l = ledger(&host);
    let mut sampler = NvmlSampler::start(&host, QUOTA);
    let sixty = SIXTY.to_string();
    let mut c = limited(&host, "shim_client", QUOTA, "pool-keep");
    c.uid(NOBODY).gid(NOBODY);
    c.args([
        "--hold", "ctx", "poolthreshold", "max", "async", &sixty, "free", "poolattr", "ready", "wait", "alloc", &sixty, "ready", "wait",
        "pooltrim", "0", "alloc", &sixty, "poolattr", "ready", "wait",
    ]);
    let mut k = host.spawn(&mut c);
    k.wait_for_line("loaded", T).unwrap_or_else(|| panic!("{}", k.stderr()));
    let pid = k.pid();
    sampler.watch(pid);
    k.send_line("go");
    k.wait_for_line("ready", T).unwrap_or_else(|| panic!("{}\n{}", k.stdout(), k.stderr()));
    let msg = |k: &e2e::EmuChild| format!("{}\n{}", k.stdout(), k.stderr());
    let out = |k: &e2e::EmuChild| k.stdout().lines().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(rc_of(&out(&k), "poolthreshold="), ["0"], "{}", msg(&k));
    assert_eq!(rc_of(&out(&k), "async="), ["0"], "{}", msg(&k));
    assert_eq!(rc_of(&out(&k), "free="), ["0"], "{}", msg(&k));
    assert!(k.lines("poolattr=")[0].contains(&format!("reserved={SIXTY} used=0")), "the pool keeps the freed memory: {}", msg(&k));
    assert_eq!(held_on(&host.device(), pid), SIXTY, "outside the shim: the pool holds it: {}", msg(&k));
    assert_eq!(counted_in(&l, pid), SIXTY, "the quota counts what the pool keeps: {}", msg(&k));

    next_ready(&mut k, 2);
    assert_eq!(rc_of(&out(&k), "alloc="), ["2"], "60 % kept by the pool + 60 % > the quota: {}", msg(&k));
    assert_eq!(held_on(&host.device(), pid), SIXTY, "nothing more on the device: {}", msg(&k));

    next_ready(&mut k, 3);
    assert_eq!(rc_of(&out(&k), "pooltrim="), ["0"], "{}", msg(&k));
    assert_eq!(rc_of(&out(&k), "alloc="), ["2", "0"], "after the trim the quota holds it: {}", msg(&k));
    assert!(k.lines("poolattr=")[1].contains("reserved=0 used=0"), "{}", msg(&k));
    assert_eq!(held_on(&host.device(), pid), SIXTY, "{}", msg(&k));
    assert_eq!(counted_in(&l, pid), SIXTY, "only the plain allocation is counted now: {}", msg(&k));
    k.send_line("go");
    k.finish(T);
    let seen = sampler.stop();
    assert!(seen.samples > 0, "{seen:?}");
    assert_eq!(seen.over, 0, "NVML saw the process over its quota: {seen:?}");
    assert!(seen.procs_max <= QUOTA, "{seen:?}");
}

/// With the default release threshold (0) a pool keeps freed memory until the next
/// synchronisation: the shim counts it until then (cuMemAlloc of 60 % more is refused after
/// cuMemFreeAsync alone) and gives it back after it (the same cuMemAlloc succeeds at once: a
/// refusal settles the count first; no permanent over-count). Old shim: the first cuMemAlloc
/// succeeded while the pool still held the freed 60 % (76 MiB on the device).
#[test]
fn with_the_default_threshold_freed_memory_is_given_back_after_a_synchronize() {
    let host = EmuHost::new();
    let l = ledger(&host);
    let sixty = SIXTY.to_string();
    let mut c = limited(&host, "shim_client", QUOTA, "pool-sync");
    c.args(["ctx", "async", &sixty, "freeasync", "poolattr", "alloc", &sixty, "ready", "wait", "sync", "alloc", &sixty, "poolattr", "ready", "wait"]);
    let mut k = host.spawn(&mut c);
    k.wait_for_line("ready", T).unwrap_or_else(|| panic!("{}\n{}", k.stdout(), k.stderr()));
    let pid = k.pid();
    let msg = |k: &e2e::EmuChild| format!("{}\n{}", k.stdout(), k.stderr());
    let out = |k: &e2e::EmuChild| k.stdout().lines().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(rc_of(&out(&k), "freeasync="), ["0"], "{}", msg(&k));
    assert!(k.lines("poolattr=")[0].contains(&format!("reserved={SIXTY} used=0")), "kept until a synchronisation: {}", msg(&k));
    assert_eq!(rc_of(&out(&k), "alloc="), ["2"], "the pool still holds 60 %: {}", msg(&k));
    assert_eq!(held_on(&host.device(), pid), SIXTY, "{}", msg(&k));
    next_ready(&mut k, 2);
    assert_eq!(rc_of(&out(&k), "sync="), ["0"], "{}", msg(&k));
    assert_eq!(rc_of(&out(&k), "alloc="), ["2", "0"], "released at the synchronisation, given back: {}", msg(&k));
    assert!(k.lines("poolattr=")[1].contains("reserved=0 used=0"), "{}", msg(&k));
    assert_eq!(held_on(&host.device(), pid), SIXTY, "{}", msg(&k));
    assert_eq!(counted_in(&l, pid), SIXTY, "no over-count left: {}", msg(&k));
    k.send_line("go");
    k.finish(T);
}

/// Two emulated T4s open to every user, a ledger for each, and a shimmed client (64 MiB quota
/// per GPU, group `group`) as uid 65534 seeing both with device 0's context current, running
/// `steps` then `ready`, `wait`: the running client, both devices and both ledgers.
fn on_two_gpus(host: &EmuHost, group: &str, steps: &[&str]) -> (e2e::EmuChild, [e2e::emu_device::Device; 2], [node_ledger::Ledger; 2]) {
    let states = [host.state_path().to_path_buf(), host.root().join("gpu1.state")];
    let devs = states.clone().map(|p| e2e::emu_device::Device::open(&p, &e2e::emu_device::profile::T4).expect("open emulated GPU"));
    e2e::chmod(&states[1], 0o666);
    let uuids = devs.each_ref().map(|d| uuid_text(&d.info().uuid));
    let ledgers = [0, 1].map(|gpu| node_ledger::Ledger::open_or_create(&node_ledger::config::ledger_path(&ledger_dir(host), gpu), gpu).expect("ledger"));
    let mut c = limited(host, "shim_client", QUOTA, group);
    c.env("GPUEMU_STATE", format!("{}:{}", states[0].display(), states[1].display()))
        .env("CUDA_VISIBLE_DEVICES", "0,1")
        .env("XSHARE_GPUS", format!("0={},1={}", uuids[0], uuids[1]))
        .uid(NOBODY)
        .gid(NOBODY);
    c.args(["ctxon", "0"]).args(steps).args(["ready", "wait"]);
    let mut k = host.spawn(&mut c);
    k.wait_for_line("ready", T).unwrap_or_else(|| panic!("{}\n{}", k.stdout(), k.stderr()));
    (k, devs, ledgers)
}

/// A pool created on device 1 holds device 1's memory: an allocation from it, made with the
/// current context on device 0, is counted in GPU 1's quota (its ledger), not GPU 0's; GPU 0's
/// quota stays whole for a plain allocation there. Old shim: counted on device 0, so the
/// 40 MiB plain allocation on device 0 was refused (40 + 40 > 64) while GPU 1's ledger showed
/// nothing.
#[test]
fn an_allocation_from_a_pool_of_device_1_counts_on_gpu_1() {
    if e2e::lacks_root("run the offline client as uid 65534") {
        return;
    }
    let host = host_for_users();
    let forty = (40 * MIB).to_string();
    let (mut k, devs, ledgers) = on_two_gpus(&host, "pool-dev1", &["poolon", "1", &forty, "alloc", &forty]);
    let pid = k.pid();
    let msg = format!("{}\n{}", k.stdout(), k.stderr());
    let out: Vec<String> = k.stdout().lines().map(str::to_string).collect();
    assert_eq!(rc_of(&out, "poolon="), ["0"], "{msg}");
    assert_eq!(held_on(&devs[1], pid), 40 * MIB, "outside the shim: the pool's memory is on GPU 1: {msg}");
    assert_eq!(counted_in(&ledgers[1], pid), 40 * MIB, "counted in GPU 1's ledger: {msg}");
    assert_eq!(rc_of(&out, "alloc="), ["0"], "GPU 0's quota is whole: {msg}");
    assert_eq!(counted_in(&ledgers[0], pid), 40 * MIB, "GPU 0 counts only its plain allocation: {msg}");
    assert_eq!(held_on(&devs[0], pid), 40 * MIB, "{msg}");
    k.send_line("go");
    k.finish(T);
}

/// cuMemAllocAsync takes its memory from "the memory pool current to the stream's device"
/// (cuda.h), and the stream may belong to a context of another GPU than the current one. The
/// client, as uid 65534 with device 0's context current, allocates 40 MiB twice on a stream of
/// device 1: the first is counted in GPU 1's quota (its ledger; NVML-side, GPU 1 holds it), the
/// second is refused (40 + 40 > 64), and GPU 0's quota stays whole for a plain 40 MiB there.
/// Old shim: both went into device 0's current pool slot, whose pool never grew, so neither was
/// counted anywhere: GPU 1 held 80 MiB against its 64 MiB quota.
#[test]
fn an_allocation_on_a_stream_of_device_1_counts_on_gpu_1() {
    if e2e::lacks_root("run the offline client as uid 65534") {
        return;
    }
    let host = host_for_users();
    let forty = (40 * MIB).to_string();
    let (mut k, devs, ledgers) = on_two_gpus(&host, "stream-dev1", &["asyncon", "1", &forty, "asyncon", "1", &forty, "alloc", &forty]);
    let pid = k.pid();
    let msg = format!("{}\n{}", k.stdout(), k.stderr());
    let out: Vec<String> = k.stdout().lines().map(str::to_string).collect();
    assert_eq!(rc_of(&out, "asyncon="), ["0", "2"], "the second 40 MiB on GPU 1 is over its quota: CUDA_ERROR_OUT_OF_MEMORY: {msg}");
    assert_eq!(held_on(&devs[1], pid), 40 * MIB, "outside the shim: GPU 1 holds the first allocation only: {msg}");
    assert_eq!(counted_in(&ledgers[1], pid), 40 * MIB, "counted in GPU 1's ledger: {msg}");
    assert_eq!(rc_of(&out, "alloc="), ["0"], "GPU 0's quota is whole: {msg}");
    assert_eq!(counted_in(&ledgers[0], pid), 40 * MIB, "GPU 0 counts only its plain allocation: {msg}");
    k.send_line("go");
    k.finish(T);
}

/// The pool a cuMemAllocAsync takes its memory from is the one the shim counted, even when
/// another thread makes another pool current between the shim's look at the current pool and
/// the driver's allocation: the emulator injects exactly that race (`GPUEMU_INJECT=pool-swap`:
/// a fresh pool made current just before each allocation). The client, as uid 65534, allocates
/// 40 MiB twice under a 64 MiB quota: the second is refused, and the device holds 40 MiB.
/// Before, the shim counted the pool it had looked at (which never grew) and let the driver
/// take the memory from the current one: both succeeded, 80 MiB held, nothing counted.
#[test]
fn a_pool_made_current_during_the_call_is_not_the_one_allocated_from() {
    if e2e::lacks_root("run the offline client as uid 65534") {
        return;
    }
    let host = host_for_users();
    let l = ledger(&host);
    let forty = (40 * MIB).to_string();
    let mut c = limited(&host, "shim_client", QUOTA, "pool-swap");
    c.env("GPUEMU_INJECT", "pool-swap").uid(NOBODY).gid(NOBODY);
    c.args(["ctx", "async", &forty, "async", &forty, "ready", "wait"]);
    let mut k = host.spawn(&mut c);
    k.wait_for_line("ready", T).unwrap_or_else(|| panic!("{}\n{}", k.stdout(), k.stderr()));
    let pid = k.pid();
    let msg = format!("{}\n{}", k.stdout(), k.stderr());
    let out: Vec<String> = k.stdout().lines().map(str::to_string).collect();
    assert_eq!(rc_of(&out, "async="), ["0", "2"], "the second 40 MiB is over the quota: CUDA_ERROR_OUT_OF_MEMORY: {msg}");
    assert_eq!(held_on(&host.device(), pid), 40 * MIB, "outside the shim: {msg}");
    assert_eq!(counted_in(&l, pid), 40 * MIB, "{msg}");
    k.send_line("go");
    k.finish(T);
}

/// The shim tracks 64 pools per process: an allocation from a 65th is refused, never counted
/// per allocation (what that pool kept after a free would escape the quota: a tenant could make
/// 64 small pools, then keep its whole quota in a 65th and allocate it again).
#[test]
fn an_allocation_from_a_pool_past_the_shims_table_is_refused() {
    let host = EmuHost::new();
    let mut steps = vec!["ctx".to_string()];
    for _ in 0..65 {
        steps.extend(["poolon".into(), "0".into(), MIB.to_string()]);
    }
    let mut c = limited(&host, "shim_client", QUOTA * 4, "pool-table");
    c.args(&steps);
    let out = run(&host, &mut c);
    let rcs = rc_of(&out, "poolon=");
    assert_eq!(rcs.len(), 65, "{out:?}");
    assert!(rcs[..64].iter().all(|r| r == "0"), "64 pools fit: {rcs:?}");
    assert_eq!(rcs[64], "2", "the 65th pool's allocation: CUDA_ERROR_OUT_OF_MEMORY: {out:?}");
}

/// NVML's text of a UUID: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
fn uuid_text(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}
