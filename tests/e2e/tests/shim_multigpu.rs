//! Multi-GPU offline containers (issue 8, "Beyond today's surface"): one process sees two GPUs
//! of an emulated host through `CUDA_VISIBLE_DEVICES` (by index, reordered, or by UUID). The
//! shim keeps one quota and one throttle per PHYSICAL GPU, each in that GPU's ledger
//! (`XSHARE_GPUS` maps UUIDs to host GPU indices); device memory is checked outside the shim
//! through NVML, per GPU and per process. Before: one quota (GPU 0's ledger) and one throttle
//! (GPU 0's load) for every device the process saw.

mod shim_support;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use e2e::EmuHost;
use node_ledger::MonitorSample;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;
use shim_support::*;

const QUOTA: u64 = 64 * MIB;

/// The host's two GPUs: state files (GPU 0, GPU 1) and their UUIDs as NVML prints them.
struct TwoGpus {
    states: [PathBuf; 2],
    uuids: [String; 2],
}

fn uuid_text(b: &[u8; 16]) -> String {
    let hex: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
    let h = hex.concat();
    format!("GPU-{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

fn two_gpus(host: &EmuHost) -> TwoGpus {
    let states = [host.state_path().to_path_buf(), host.root().join("gpu1.state")];
    let uuids = states.clone().map(|p| {
        let d = e2e::emu_device::Device::open(&p, &e2e::emu_device::profile::T4).expect("open emulated GPU");
        uuid_text(&d.info().uuid)
    });
    assert_ne!(uuids[0], uuids[1], "two physical GPUs");
    TwoGpus { states, uuids }
}

impl TwoGpus {
    fn state_env(&self) -> String {
        format!("{}:{}", self.states[0].display(), self.states[1].display())
    }

    fn gpus_env(&self) -> String {
        format!("0={},1={}", self.uuids[0], self.uuids[1])
    }

    fn ledger(&self, host: &EmuHost, gpu: u32) -> node_ledger::Ledger {
        let p = node_ledger::config::ledger_path(&ledger_dir(host), gpu);
        node_ledger::Ledger::open_or_create(&p, gpu).expect("ledger")
    }

    fn status(&self, host: &EmuHost, gpu: u32) -> node_ledger::StatusWriter {
        let p = node_ledger::config::status_path(&ledger_dir(host), gpu);
        node_ledger::Status::open_or_create(&p, gpu).expect("status file")
    }

    /// `shim_client` under the shim on the 2-GPU host, seeing `visible`.
    fn client(&self, host: &EmuHost, visible: &str, group: &str) -> Command {
        let mut c = limited(host, "shim_client", QUOTA, group);
        c.env("GPUEMU_STATE", self.state_env())
            .env("CUDA_VISIBLE_DEVICES", visible)
            .env("XSHARE_GPUS", self.gpus_env());
        c
    }
}

fn nvml(host: &EmuHost, g: &TwoGpus) -> Nvml {
    // The fake NVML reads the host from the environment at its first init (once per process:
    // this file's only NVML user is the test below).
    std::env::set_var("GPUEMU_STATE", g.state_env());
    std::env::set_var("GPUEMU_PROFILE", "t4");
    Nvml::builder().lib_path(host.require_nvml().as_os_str()).init().expect("nvmlInit against the emulator")
}

/// Bytes process `pid` holds on host GPU `gpu`, as NVML reports them.
fn nvml_used(nvml: &Nvml, gpu: u32, pid: u32) -> u64 {
    let d = nvml.device_by_index(gpu).expect("NVML device");
    let procs = d.running_compute_processes().expect("process list");
    match procs.iter().find(|p| p.pid == pid).map(|p| &p.used_gpu_memory) {
        Some(UsedGpuMemory::Used(b)) => *b,
        None => 0,
        other => panic!("GPU {gpu}: pid {pid}: {other:?}"),
    }
}

fn rcs(lines: &[String], step: &str) -> Vec<String> {
    rc_of(lines, &format!("{step}="))
}

/// Allocations on each visible device are counted against that physical GPU's quota, whatever
/// `CUDA_VISIBLE_DEVICES` says: reordered indices (`1,0`: ordinal 0 is host GPU 1) and UUIDs.
/// Checked three ways: the driver's answers, each GPU's ledger, and NVML's per-GPU
/// per-process memory (outside the shim). Old shim: both devices counted in GPU 0's ledger,
/// so the second 40 MiB (on the other GPU) was refused.
#[test]
fn each_visible_gpu_has_its_own_quota_whatever_the_visible_order() {
    let host = EmuHost::new();
    let g = two_gpus(&host);
    let nvml = nvml(&host, &g);
    assert_eq!(nvml.device_count().unwrap(), 2, "NVML sees the whole host");
    let by_uuid = format!("{},{}", g.uuids[1], g.uuids[0]);
    let by_prefix = format!("{},{}", &g.uuids[1][..12], &g.uuids[0][..12]);
    for (n, visible) in ["1,0", by_uuid.as_str(), by_prefix.as_str()].into_iter().enumerate() {
        let group = format!("mg{n}");
        // Ordinal 0 = host GPU 1, ordinal 1 = host GPU 0.
        let mut c = g.client(&host, visible, &group);
        c.args([
            "devices", "ctxon", "0", "alloc", &(40 * MIB).to_string(), "ctxon", "1", "alloc", &(40 * MIB).to_string(),
            "alloc", &(30 * MIB).to_string(), "ctxon", "0", "alloc", &(30 * MIB).to_string(), "alloc", &(20 * MIB).to_string(),
            "ready", "wait",
        ]);
        let mut k = host.spawn(&mut c);
        k.wait_for_line("ready", T).unwrap_or_else(|| panic!("{visible}: {}\n{}", k.stdout(), k.stderr()));
        let out: Vec<String> = k.stdout().lines().map(str::to_string).collect();
        let msg = format!("CUDA_VISIBLE_DEVICES={visible}\n{}\n{}", k.stdout(), k.stderr());
        let dev_line = k.lines("devices=").first().cloned().unwrap_or_default();
        let want_uuids = format!("uuids={},{}", g.uuids[1][4..].replace('-', ""), g.uuids[0][4..].replace('-', ""));
        assert!(dev_line.contains("n=2") && dev_line.contains(&want_uuids), "ordinals renumbered in listed order: {msg}");
        assert_eq!(rcs(&out, "ctxon"), ["0", "0", "0"], "{msg}");
        // GPU 1: 40 ok; GPU 0: 40 ok, +30 refused (70 > 64); GPU 1 again: +30 refused, +20 ok.
        assert_eq!(rcs(&out, "alloc"), ["0", "0", "2", "2", "0"], "CUDA_ERROR_OUT_OF_MEMORY per physical GPU: {msg}");
        let pid = k.pid();
        // NVML counts the contexts too: one on host GPU 0, two on host GPU 1 (`ctxon 0` twice).
        let t4 = &e2e::emu_device::profile::T4;
        let ctx = |n: u64| t4.context_bytes() + (n - 1) * t4.context_local_bytes();
        for (gpu, want, contexts) in [(0u32, 40 * MIB, 1), (1, 60 * MIB, 2)] {
            assert_eq!(nvml_used(&nvml, gpu, pid), want + ctx(contexts), "NVML, host GPU {gpu}: {msg}");
            let l = g.ledger(&host, gpu);
            let me = l.procs().into_iter().find(|p| p.pid == pid).unwrap_or_else(|| panic!("registered in GPU {gpu}'s ledger: {msg}"));
            assert_eq!(me.mem_bytes, want, "ledger of host GPU {gpu}: {msg}");
        }
        k.send_line("go");
        k.finish(T);
    }
}

/// Without `XSHARE_GPUS` a process that sees two GPUs cannot know which ledger each is: it
/// fails closed on both (allocations refused, one clear error), never one quota for both.
#[test]
fn two_gpus_without_a_map_fail_closed_loudly() {
    let host = EmuHost::new();
    let g = two_gpus(&host);
    let mut c = g.client(&host, "0,1", "nomap");
    c.env_remove("XSHARE_GPUS");
    c.args(["ctxon", "0", "alloc", &MIB.to_string(), "ctxon", "1", "alloc", &MIB.to_string()]);
    let out = run(&host, &mut c);
    assert_eq!(rcs(&out, "alloc"), ["2", "2"], "{out:?}");
}

/// Each GPU's throttle reads that GPU's load from that GPU's ledger. The test plays the
/// monitor: host GPU 1 is under online pressure (SM clock pulled down: launches held), host
/// GPU 0 is idle. With `CUDA_VISIBLE_DEVICES=1,0` a launch on ordinal 1 (host GPU 0) goes
/// straight through while one on ordinal 0 (host GPU 1) waits until GPU 1's pressure ends.
/// Launches and delays are counted in each GPU's own ledger. Old shim: one throttle reading
/// GPU 0's ledger, so the launch on host GPU 1 never waited.
#[test]
fn each_gpu_is_throttled_by_its_own_load() {
    let host = EmuHost::new();
    let g = two_gpus(&host);
    let info = host.device().info();
    let (l0, l1) = (Arc::new(g.ledger(&host, 0)), Arc::new(g.ledger(&host, 1)));
    let (s0, s1) = (Arc::new(g.status(&host, 0)), Arc::new(g.status(&host, 1)));
    let pressure = Arc::new(AtomicBool::new(true));
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (l0, l1, pressure, stop) = (s0.clone(), s1.clone(), pressure.clone(), stop.clone());
        let max = info.max_sm_clock_mhz;
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let s = |clock: u32, act: u32| MonitorSample {
                    health: node_ledger::HealthState::Healthy as u32,
                    sm_active_permille: act,
                    sm_clock_mhz: clock,
                    sm_clock_max_mhz: max,
                    sm_count: info.sm_count,
                    ..Default::default()
                };
                l0.publish(&s(max, 0));
                let busy = pressure.load(Ordering::Relaxed);
                l1.publish(&if busy { s(max / 2, 1000) } else { s(max, 0) });
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let sms = info.sm_count.to_string();
    let mut c = g.client(&host, "1,0", "thr");
    // A process capped at 40 % of the SMs (MPS, fixed at its start) cannot pull the clock
    // down alone: a low clock is online pressure, and its launches are held.
    c.env("XCUDA_THROTTLE", "1").env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "40");
    // Two one-wave kernels fit the bucket's burst (4 waves): only a hold makes them wait.
    c.args(["ctxon", "1", "sleep", "300", "launch", &sms, "1000", "2", "ctxon", "0", "launch", &sms, "1000", "2", "ready", "wait"]);
    let mut k = host.spawn(&mut c);
    k.wait_for_line("launch=", T).unwrap_or_else(|| panic!("{}\n{}", k.stdout(), k.stderr()));
    let pid = k.pid();
    let procs = |l: &node_ledger::Ledger| l.procs().into_iter().find(|p| p.pid == pid);
    // The housekeeping tick (250 ms) reports launch counts to each ledger.
    let deadline = std::time::Instant::now() + T;
    while procs(&l0).is_none_or(|p| p.launches < 2) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let msg = |k: &e2e::EmuChild| format!("{}\n{}", k.stdout(), k.stderr());
    let p0 = procs(&l0).unwrap_or_else(|| panic!("registered in GPU 0's ledger: {}", msg(&k)));
    assert_eq!((p0.launches, p0.launches_delayed), (2, 0), "idle GPU 0: through at once: {}", msg(&k));
    // GPU 1 stays under pressure: its launch is held (never printed while the hold lasts).
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(k.lines("launch=").len(), 1, "the launch on host GPU 1 is held by GPU 1's load: {}", msg(&k));
    assert!(procs(&l1).is_some(), "registered in GPU 1's ledger: {}", msg(&k));
    pressure.store(false, Ordering::Relaxed);
    if k.wait_for_line("ready", T).is_none() {
        panic!("released once GPU 1's pressure ends: {}", msg(&k));
    }
    let launches = k.lines("launch=");
    assert!(launches.iter().all(|l| e2e::field(l, "launch") == Some("0")), "{}", msg(&k));
    while procs(&l1).is_none_or(|p| p.launches < 2) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let p1 = procs(&l1).expect("GPU 1's slot");
    assert!(p1.launches == 2 && p1.launches_delayed > 0, "held launches counted on GPU 1: {p1:?}: {}", msg(&k));
    let p0 = procs(&l0).expect("GPU 0's slot");
    assert_eq!((p0.launches, p0.launches_delayed), (2, 0), "GPU 0's counters untouched by GPU 1's launches");
    stop.store(true, Ordering::Relaxed);
    monitor.join().unwrap();
    k.send_line("go");
    k.finish(T);
}

/// A synchronizing call is counted on the GPU it waits for, and never on a guessed one: an
/// event wait from a thread with no current context (the driver names no GPU for it) is left
/// uncounted. Before bd788e7 it was counted on GPU 0 (the ordinal taken when cuCtxGetDevice
/// fails): a wait on GPU 1's work showed as a client waiting on idle GPU 0, which mps-manager
/// takes for a hung MPS there. A cuCtxSynchronize on GPU 1's context afterwards is counted on
/// GPU 1: the counters are published at all.
#[test]
fn a_wait_whose_gpu_the_driver_does_not_name_is_counted_on_no_gpu() {
    let host = EmuHost::new();
    let g = two_gpus(&host);
    let (l0, l1) = (g.ledger(&host, 0), g.ledger(&host, 1));
    let mut c = g.client(&host, "0,1", "ev");
    // About two seconds of GPU 1's work (80 blocks of 1.5e9 cycles on a 40-SM T4), waited for
    // from a new thread.
    c.args(["ctxon", "0", "ctxon", "1", "eventwaitnoctx", "80", "1500000000", "sync", "ready", "wait"]);
    let mut k = host.spawn(&mut c);
    let msg = |k: &e2e::EmuChild| format!("{}\n{}", k.stdout(), k.stderr());
    k.wait_for_line("eventwaiting", T).unwrap_or_else(|| panic!("no wait: {}", msg(&k)));
    let pid = k.pid();
    let slot = |l: &node_ledger::Ledger| l.procs().into_iter().find(|p| p.pid == pid);
    // Two heartbeats of GPU 0's slot while the wait lasts: the counters were published twice
    // since it began.
    let first = slot(&l0).unwrap_or_else(|| panic!("registered in GPU 0's ledger: {}", msg(&k))).heartbeat_ns;
    let mut beats = 0;
    let mut last = first;
    let deadline = std::time::Instant::now() + T;
    while beats < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        let p = slot(&l0).expect("GPU 0's slot");
        assert_eq!(p.syncs, (0, 0), "nothing counted on GPU 0 for a wait it was never asked about: {p:?}: {}", msg(&k));
        if p.heartbeat_ns != last {
            (beats, last) = (beats + 1, p.heartbeat_ns);
        }
    }
    assert!(k.lines("eventwait=").is_empty(), "the wait outlasted two heartbeats (longer kernel needed): {}", msg(&k));
    assert_eq!(slot(&l1).map(|p| p.syncs), Some((0, 0)), "nor on GPU 1: the driver named no GPU: {}", msg(&k));
    k.wait_for_line("ready", T).unwrap_or_else(|| panic!("{}", msg(&k)));
    assert_eq!(rcs(&k.lines("eventwait="), "eventwait"), ["0"], "{}", msg(&k));
    let deadline = std::time::Instant::now() + T;
    while slot(&l1).is_none_or(|p| p.syncs != (1, 1)) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(slot(&l1).map(|p| p.syncs), Some((1, 1)), "cuCtxSynchronize on GPU 1's context counted there: {}", msg(&k));
    assert_eq!(slot(&l0).map(|p| p.syncs), Some((0, 0)), "{}", msg(&k));
    k.send_line("go");
    k.finish(T);
}
