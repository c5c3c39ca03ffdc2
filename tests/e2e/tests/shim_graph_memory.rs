//! Graph memory nodes under the quota (issue 8, "Beyond today's surface"): memory a graph's
//! `cuGraphAddMemAllocNode` allocates is mapped when the graph is launched, from the device's
//! graph pool, which keeps it for later launches until `cuDeviceGraphMemTrim`. The shim counts
//! that pool against the group's quota and refuses a launch that would exceed it with
//! CUDA_ERROR_OUT_OF_MEMORY (nothing mapped). Device memory is checked outside the shim on the
//! emulated device (what NVML reports). Before: graph memory was not counted at all.

mod shim_support;

use e2e::EmuHost;
use shim_support::*;

const QUOTA: u64 = 64 * MIB;

fn field_of(lines: &[String], step: &str, key: &str) -> String {
    let l = lines.iter().find(|l| l.starts_with(&format!("{step}="))).unwrap_or_else(|| panic!("no {step} in {lines:?}"));
    e2e::field(l, key).unwrap_or_else(|| panic!("no {key} in {l}")).to_string()
}

fn held_by(host: &EmuHost, pid: u32) -> u64 {
    host.device().snapshot().processes.iter().find(|p| p.pid == pid).map_or(0, |p| p.used_memory)
}

/// Control run: without the shim the emulated driver maps a 100 MiB graph allocation.
#[test]
fn without_the_shim_graph_memory_is_not_limited() {
    let host = EmuHost::new();
    let mut c = unlimited(&host, "shim_client");
    c.args(["ctx", "graphmem", &(100 * MIB).to_string(), "1", "2"]);
    let out = run(&host, &mut c);
    assert_eq!(field_of(&out, "graphmem", "launches"), "0,0", "{out:?}");
    assert_eq!(field_of(&out, "graphmem", "pool_reserved"), (100 * MIB).to_string(), "one pool reservation reused by the second launch: {out:?}");
}

/// 40 MiB allocated + a 30 MiB graph allocation > 64 MiB: the launch is refused with
/// CUDA_ERROR_OUT_OF_MEMORY and nothing of it is mapped. Old shim: launched (0).
#[test]
fn a_graph_launch_over_quota_is_refused_before_anything_is_mapped() {
    let host = EmuHost::new();
    let mut c = limited(&host, "shim_client", QUOTA, "g1");
    c.args(["ctx", "alloc", &(40 * MIB).to_string(), "graphmem", &(30 * MIB).to_string(), "1", "1", "ready", "wait"]);
    let mut k = host.spawn(&mut c);
    k.wait_for_line("ready", T).unwrap_or_else(|| panic!("{}\n{}", k.stdout(), k.stderr()));
    let out: Vec<String> = k.stdout().lines().map(str::to_string).collect();
    let msg = format!("{out:?}\n{}", k.stderr());
    assert_eq!(field_of(&out, "graphmem", "node"), "0", "adding the node maps nothing: {msg}");
    assert_eq!(field_of(&out, "graphmem", "launches"), "2", "CUDA_ERROR_OUT_OF_MEMORY: {msg}");
    assert_eq!(field_of(&out, "graphmem", "pool_reserved"), "0", "{msg}");
    assert_eq!(held_by(&host, k.pid()), 40 * MIB, "outside the shim: only the plain allocation: {msg}");
    assert!(k.stderr().contains("graph launch refused"), "said loudly: {msg}");
    k.send_line("go");
    k.finish(T);
}

/// The pool is counted once however often the graph runs (the driver reuses it), keeps counting
/// after the launches (the driver keeps it), and is given back by cuDeviceGraphMemTrim.
#[test]
fn the_graph_pool_is_counted_once_and_given_back_on_trim() {
    let host = EmuHost::new();
    let l = ledger(&host);
    let mib = |n: u64| (n * MIB).to_string();
    let mut c = limited(&host, "shim_client", QUOTA, "g2");
    c.args(["ctx", "graphmem", &mib(30), "1", "3", "alloc", &mib(40), "ready", "wait", "graphtrim", "alloc", &mib(40), "ready", "wait"]);
    let mut k = host.spawn(&mut c);
    k.wait_for_line("ready", T).unwrap_or_else(|| panic!("{}\n{}", k.stdout(), k.stderr()));
    let pid = k.pid();
    let me = |l: &node_ledger::Ledger| l.procs().into_iter().find(|p| p.pid == pid).map_or(0, |p| p.mem_bytes);
    let msg = |k: &e2e::EmuChild| format!("{}\n{}", k.stdout(), k.stderr());
    let out: Vec<String> = k.stdout().lines().map(str::to_string).collect();
    assert_eq!(field_of(&out, "graphmem", "launches"), "0,0,0", "{}", msg(&k));
    assert_eq!(field_of(&out, "graphmem", "pool_reserved"), mib(30), "{}", msg(&k));
    assert_eq!(me(&l), 30 * MIB, "the pool, once, not once per launch: {}", msg(&k));
    assert_eq!(rc_of(&out, "alloc="), ["2"], "30 MiB kept by the pool + 40 > 64: {}", msg(&k));
    assert_eq!(held_by(&host, pid), 30 * MIB, "outside the shim: the pool's 30 MiB: {}", msg(&k));
    k.send_line("go");
    let deadline = std::time::Instant::now() + T;
    while k.lines("ready").len() < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out: Vec<String> = k.stdout().lines().map(str::to_string).collect();
    assert_eq!(rc_of(&out, "graphtrim="), ["0"], "{}", msg(&k));
    assert_eq!(rc_of(&out, "alloc="), ["2", "0"], "after the trim the quota is free again: {}", msg(&k));
    assert_eq!(me(&l), 40 * MIB, "{}", msg(&k));
    assert_eq!(held_by(&host, pid), 40 * MIB, "{}", msg(&k));
    k.send_line("go");
    k.finish(T);
}
