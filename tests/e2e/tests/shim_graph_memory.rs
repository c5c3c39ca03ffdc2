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

/// Device memory `pid` holds by the emulated device's own count, less what its contexts hold.
fn held_by(host: &EmuHost, pid: u32) -> u64 {
    host.device().snapshot().processes.iter().find(|p| p.pid == pid).map_or(0, |p| p.used_memory - p.context_memory)
}

/// `program` running `steps` (ending in `ready wait`) under the 64 MiB quota of `group`, once it
/// is ready: the child, its stdout lines and a message with both of its streams.
fn ready(host: &EmuHost, program: &str, group: &str, steps: &[&str]) -> (e2e::EmuChild, Vec<String>, String) {
    let mut c = limited(host, program, QUOTA, group);
    c.args(steps);
    let mut k = host.spawn(&mut c);
    k.wait_for_line("ready", T).unwrap_or_else(|| panic!("{steps:?}: {}\n{}", k.stdout(), k.stderr()));
    let out: Vec<String> = k.stdout().lines().map(str::to_string).collect();
    let msg = format!("{steps:?}: {out:?}\n{}", k.stderr());
    (k, out, msg)
}

/// `ctx`, 40 MiB allocated, then `graph` (a 30 MiB graph allocation: over the 64 MiB quota) and
/// `ready wait`: `step`'s `launch` field is CUDA_ERROR_OUT_OF_MEMORY, the graph pool stays empty
/// and, outside the shim, the process holds only the plain allocation. Returns the ready child.
fn refused_at_launch(host: &EmuHost, program: &str, group: &str, graph: &[&str], step: &str, launch: &str) -> (e2e::EmuChild, Vec<String>, String) {
    let forty = (40 * MIB).to_string();
    let steps: Vec<&str> = ["ctx", "alloc", forty.as_str()].into_iter().chain(graph.iter().copied()).chain(["ready", "wait"]).collect();
    let (k, out, msg) = ready(host, program, group, &steps);
    assert_eq!(field_of(&out, step, launch), "2", "CUDA_ERROR_OUT_OF_MEMORY: {msg}");
    assert_eq!(field_of(&out, step, "pool_reserved"), "0", "{msg}");
    assert_eq!(held_by(host, k.pid()), 40 * MIB, "outside the shim: only the plain allocation: {msg}");
    (k, out, msg)
}

/// Lets a child waiting at `wait` finish.
fn done(mut k: e2e::EmuChild) {
    k.send_line("go");
    k.finish(T);
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
    let thirty = (30 * MIB).to_string();
    let (k, out, msg) = refused_at_launch(&host, "shim_client", "g1", &["graphmem", &thirty, "1", "1"], "graphmem", "launches");
    assert_eq!(field_of(&out, "graphmem", "node"), "0", "adding the node maps nothing: {msg}");
    assert!(k.stderr().contains("graph launch refused"), "said loudly: {msg}");
    done(k);
}

/// A memory allocation node added with the generic `cuGraphAddNode` (CUDA 12.2/12.3,
/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC`) is counted like one of `cuGraphAddMemAllocNode`: 40 MiB +
/// 30 MiB > 64 MiB, so the launch is refused and nothing is mapped (the device, read outside
/// the shim, never holds more than the quota); within the quota the pool is counted in the
/// ledger. Before cuGraphAddNode was hooked the exec's footprint was 0: the launch mapped the
/// 30 MiB past the quota (launches=0).
#[test]
fn a_memory_node_added_with_cu_graph_add_node_is_counted() {
    let host = EmuHost::new();
    let mib = |n: u64| (n * MIB).to_string();
    let (k, out, msg) = refused_at_launch(&host, "shim_client", "gn1", &["graphmemnode", &mib(30), "1", "1"], "graphmemnode", "launches");
    assert_eq!(field_of(&out, "graphmemnode", "node"), "0", "the node itself is added: {msg}");
    assert!(held_by(&host, k.pid()) <= QUOTA, "{msg}");
    done(k);

    let l = ledger(&host);
    let (k, out, msg) = ready(&host, "shim_client", "gn2", &["ctx", "graphmemnode", &mib(30), "1", "2", "ready", "wait"]);
    assert_eq!(field_of(&out, "graphmemnode", "launches"), "0,0", "{msg}");
    assert_eq!(field_of(&out, "graphmemnode", "pool_reserved"), mib(30), "{msg}");
    let counted = l.procs().into_iter().find(|p| p.pid == k.pid()).map_or(0, |p| p.mem_bytes);
    assert_eq!(counted, 30 * MIB, "the node's pool counted in the ledger: {msg}");
    assert_eq!(held_by(&host, k.pid()), 30 * MIB, "outside the shim: {msg}");
    done(k);
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

/// `cuGraphInstantiateWithParams` is counted like `cuGraphInstantiateWithFlags`: 40 MiB
/// allocated + a 30 MiB graph allocation > 64 MiB, so the launch is refused and nothing is
/// mapped. Before the interception the shim never saw the exec's memory nodes and the launch
/// mapped 30 MiB past the quota (launches=0).
#[test]
fn an_exec_instantiated_with_params_is_counted_at_launch() {
    let host = EmuHost::new();
    let thirty = (30 * MIB).to_string();
    let (k, out, msg) = refused_at_launch(&host, "shim_client", "g3", &["graphmemp", &thirty, "1", "1", "0"], "graphmemp", "launches");
    assert_eq!(field_of(&out, "graphmemp", "inst"), "0", "{msg}");
    done(k);
}

/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` maps the graph's memory at instantiation, before any
/// launch: over the quota the instantiation itself fails with CUDA_ERROR_OUT_OF_MEMORY
/// (`result_out` = CUDA_GRAPH_INSTANTIATE_ERROR) and nothing is mapped; within it the upload is
/// counted once and the launches reuse it. Before: the upload mapped 30 MiB past the quota.
#[test]
fn an_upload_at_instantiation_is_counted_or_refused() {
    let host = EmuHost::new();
    let l = ledger(&host);
    let mib = |n: u64| (n * MIB).to_string();
    // The instantiation itself is refused (`inst`, nothing launched).
    let (k, out, msg) = refused_at_launch(&host, "shim_client", "g4", &["graphmemp", &mib(30), "1", "0", "2"], "graphmemp", "inst");
    assert_eq!(field_of(&out, "graphmemp", "result_out"), "1", "CUDA_GRAPH_INSTANTIATE_ERROR: {msg}");
    done(k);

    let (k, out, msg) = ready(&host, "shim_client", "g5", &["ctx", "graphmemp", &mib(30), "1", "2", "2", "ready", "wait"]);
    let pid = k.pid();
    assert_eq!((field_of(&out, "graphmemp", "inst"), field_of(&out, "graphmemp", "result_out")), ("0".into(), "0".into()), "{msg}");
    assert_eq!(field_of(&out, "graphmemp", "launches"), "0,0", "{msg}");
    assert_eq!(field_of(&out, "graphmemp", "pool_reserved"), mib(30), "{msg}");
    let me = l.procs().into_iter().find(|p| p.pid == pid).map_or(0, |p| p.mem_bytes);
    assert_eq!(me, 30 * MIB, "the uploaded pool, counted once: {msg}");
    done(k);
}

/// The emulated driver refuses the instantiations cuda.h says the real one refuses (no shim):
/// a device-launch graph with memory nodes, AUTO_FREE_ON_LAUNCH with DEVICE_LAUNCH, unknown
/// flag bits.
#[test]
fn the_emulator_refuses_instantiations_the_driver_refuses() {
    let host = EmuHost::new();
    for (flags, result_out) in [("4", "3"), ("5", "1"), ("16", "1")] {
        let mut c = unlimited(&host, "shim_client");
        c.args(["ctx", "graphmemp", &MIB.to_string(), "1", "0", flags]);
        let out = run(&host, &mut c);
        assert_eq!(field_of(&out, "graphmemp", "inst"), "1", "flags {flags}: CUDA_ERROR_INVALID_VALUE: {out:?}");
        assert_eq!(field_of(&out, "graphmemp", "result_out"), result_out, "flags {flags}: {out:?}");
    }
}

/// The legacy 5-argument `cuGraphInstantiate` (CUDA 10.0) and `cuGraphInstantiate_v2` (11.0),
/// exported and through `cuGetProcAddress("cuGraphInstantiate", version)`, and the name's CUDA
/// 12.0 meaning (cuGraphInstantiateWithFlags): each exec is counted at launch like the others —
/// 40 MiB allocated + a 30 MiB graph allocation > 64 MiB, so the launch is refused with
/// CUDA_ERROR_OUT_OF_MEMORY and nothing is mapped. Before the hooks the shim never saw these
/// execs' memory nodes: the launch mapped 30 MiB past the quota (graphlegacy=0).
#[test]
fn an_exec_instantiated_through_the_legacy_name_is_counted_at_launch() {
    let host = EmuHost::new();
    let thirty = (30 * MIB).to_string();
    for (i, how) in ["dlsym", "dlsym_v2", "10000", "11000", "12000", "13000"].into_iter().enumerate() {
        let graph = ["graphlegacy", thirty.as_str(), how];
        let (k, out, msg) = refused_at_launch(&host, "emu-client", &format!("gl{i}"), &graph, "graphlegacy", "graphlegacy");
        assert_eq!(field_of(&out, "graphlegacy", "inst"), "0", "{how}: {msg}");
        done(k);
    }
}

/// `cuGetProcAddress("cuGraphInstantiate", v)` on the emulated driver answers as cuda.h says a
/// real one does — `cuGraphInstantiate` below 11.0, `cuGraphInstantiate_v2` below 12.0,
/// `cuGraphInstantiateWithFlags` from 12.0 — on a 12.9 and on a 13.0 driver alike (the 13.0
/// headers still declare both 5-argument ABIs), and without the shim the legacy instantiation
/// maps the graph's memory at launch (the control run).
#[test]
fn the_emulator_answers_the_legacy_name_by_version() {
    let host = EmuHost::new();
    for driver in ["12090", "13000"] {
        let mut c = unlimited(&host, "emu-client");
        c.env("GPUEMU_CUDA_VERSION", driver);
        for v in ["10000", "10020", "11000", "11080", "12000", "13000"] {
            c.args(["procaddr", "cuGraphInstantiate", v, "0"]);
        }
        c.args(["ctx", "graphlegacy", &(30 * MIB).to_string(), "11000"]);
        let out = run(&host, &mut c);
        let syms: Vec<&str> = out.iter().filter(|l| l.starts_with("procaddr ")).map(|l| e2e::field(l, "symbol").unwrap_or("?")).collect();
        let flags = "cuGraphInstantiateWithFlags";
        let want = ["cuGraphInstantiate", "cuGraphInstantiate", "cuGraphInstantiate_v2", "cuGraphInstantiate_v2", flags, flags];
        assert_eq!(syms, want, "driver {driver}: {out:?}");
        assert_eq!(field_of(&out, "graphlegacy", "graphlegacy"), "0", "driver {driver}: {out:?}");
        assert_eq!(field_of(&out, "graphlegacy", "pool_reserved"), (30 * MIB).to_string(), "driver {driver}: {out:?}");
        // A second instantiation of a graph with memory nodes is refused (CUDA_ERROR_INVALID_VALUE)
        // and said in the caller's log buffer.
        assert_eq!(field_of(&out, "graphlegacy", "again"), "1", "driver {driver}: {out:?}");
        assert_ne!(field_of(&out, "graphlegacy", "log"), "0", "driver {driver}: {out:?}");
    }
}

/// A graph from stream capture, as PyTorch's CUDA graphs with the `cudaMallocAsync` backend make
/// them: the captured `cuMemAllocAsync` is a memory node the shim never saw added with
/// `cuGraphAddMemAllocNode`. Its bytes are recorded for the capture's graph at the captured
/// allocation (`cuStreamGetCaptureInfo`: nothing is allocated then, nothing counted), so the
/// launch is sized and refused before anything is mapped. Here a 30 MiB graph is captured, then
/// 40 MiB allocated, then the graph launched under the 64 MiB quota. Before: the launch mapped
/// the 30 MiB past the quota (70 MiB held) and the settle counted it afterwards, as far as the
/// quota allowed.
#[test]
fn a_captured_graph_launch_over_quota_is_refused_before_anything_is_mapped() {
    let host = EmuHost::new();
    let (thirty, forty) = ((30 * MIB).to_string(), (40 * MIB).to_string());
    let (k, out, msg) = ready(&host, "shim_client", "cap1", &["ctx", "capturemem", &thirty, "1", "1", &forty, "ready", "wait"]);
    assert_eq!(field_of(&out, "capturemem", "alloc"), "0", "the captured allocation maps nothing: {msg}");
    assert_eq!(field_of(&out, "capturemem", "end"), "0", "{msg}");
    assert_eq!(field_of(&out, "capturemem", "pre"), "0", "the capture counted nothing: 40 MiB fit: {msg}");
    assert_eq!(field_of(&out, "capturemem", "launches"), "2", "CUDA_ERROR_OUT_OF_MEMORY: {msg}");
    assert_eq!(field_of(&out, "capturemem", "pool_reserved"), "0", "{msg}");
    assert_eq!(held_by(&host, k.pid()), 40 * MIB, "outside the shim: only the plain allocation: {msg}");
    assert!(k.stderr().contains("graph launch refused"), "said loudly: {msg}");
    done(k);
}

/// The same on the per-thread default stream, as a program built with per-thread default
/// streams captures it (every entry resolved with `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`:
/// `cuStreamBeginCapture_v2_ptsz` and `cuMemAllocAsync_ptsz` on the null stream). The shim must
/// ask the capture query about `CU_STREAM_PER_THREAD`: asked about the null stream (the legacy
/// one, never capturing) it took the captured allocation for a pool allocation that never
/// grew its pool, recorded nothing for the graph, and the launch mapped 30 MiB past the quota.
#[test]
fn a_graph_captured_on_the_per_thread_stream_is_sized_before_its_launch() {
    let host = EmuHost::new();
    let (thirty, forty) = ((30 * MIB).to_string(), (40 * MIB).to_string());
    let (k, out, msg) = ready(&host, "shim_client", "cap-pt", &["--resolve", "gpa2", "ctx", "capturememnull", &thirty, "1", "1", &forty, "ready", "wait"]);
    assert_eq!(field_of(&out, "capturemem", "alloc"), "0", "captured on the per-thread stream: {msg}");
    assert_eq!(field_of(&out, "capturemem", "end"), "0", "{msg}");
    assert_eq!(field_of(&out, "capturemem", "pre"), "0", "{msg}");
    assert_eq!(field_of(&out, "capturemem", "launches"), "2", "CUDA_ERROR_OUT_OF_MEMORY: {msg}");
    assert_eq!(held_by(&host, k.pid()), 40 * MIB, "outside the shim: only the plain allocation: {msg}");
    done(k);
}

/// Within the quota a captured graph launches, its pool counted once (as a built graph's), and
/// a plain allocation the pool leaves no room for is refused while the pool keeps its memory.
#[test]
fn a_captured_graph_is_counted_at_launch_like_a_built_one() {
    let host = EmuHost::new();
    let forty = (40 * MIB).to_string();
    let (k, out, msg) = ready(&host, "shim_client", "cap2", &["ctx", "capturemem", &forty, "1", "2", "0", "alloc", &forty, "ready", "wait"]);
    assert_eq!(field_of(&out, "capturemem", "launches"), "0,0", "{msg}");
    assert_eq!(field_of(&out, "capturemem", "pool_reserved"), (40 * MIB).to_string(), "{msg}");
    assert_eq!(rc_of(&out, "alloc="), ["2"], "the graph pool holds 40 of the 64 MiB: {msg}");
    assert_eq!(held_by(&host, k.pid()), 40 * MIB, "outside the shim: the graph pool alone: {msg}");
    done(k);
}

/// The emulator captures as the driver does: a synchronize of a capturing stream, or a
/// synchronous allocation during a global-mode capture, is refused and invalidates the capture
/// (`cuStreamEndCapture`: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED).
#[test]
fn the_emulator_invalidates_a_capture_a_prohibited_call_breaks() {
    let host = EmuHost::new();
    let mut c = unlimited(&host, "shim_client");
    c.args(["ctx", "capturebreak"]);
    let out = run(&host, &mut c);
    assert_eq!(field_of(&out, "capturebreak", "alloc"), "900", "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: {out:?}");
    assert_eq!(field_of(&out, "capturebreak", "end"), "901", "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: {out:?}");
    assert_eq!(field_of(&out, "capturebreak", "graph_null"), "1", "{out:?}");
}

/// A capture not begun in relaxed mode must be ended from the thread that began it (cuda.h,
/// `cuStreamBeginCapture`): from another one the emulator refuses with
/// CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD and the capture goes on, as the driver does (the
/// shim counts a capture as over only when its end succeeded or found it invalidated).
#[test]
fn the_emulator_refuses_to_end_a_capture_from_another_thread() {
    let host = EmuHost::new();
    let mut c = unlimited(&host, "shim_client");
    c.args(["ctx", "capturethread"]);
    let out = run(&host, &mut c);
    assert_eq!(field_of(&out, "capturethread", "capturethread"), "908", "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: {out:?}");
    assert_eq!(field_of(&out, "capturethread", "own"), "0", "the capture went on: {out:?}");
}

/// The per-thread default stream captures (only the legacy stream may not), and while it does
/// the legacy stream is unusable: its capture query answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
/// (cuda.h, `cuStreamIsCapturing`: "When a blocking stream is capturing, the legacy stream is
/// in an unusable state until the blocking stream capture is terminated"). A context destroyed
/// mid-capture takes the capture with it: a synchronous allocation in a new context is then no
/// "potentially unsafe" call under a global-mode capture (before, every later cuMemAlloc of
/// the process was refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED).
#[test]
fn the_emulator_captures_the_per_thread_stream_until_its_context_ends() {
    let host = EmuHost::new();
    let mut c = unlimited(&host, "shim_client");
    c.args(["ctx", "capturept", "destroy", "ctx", "alloc", "1048576"]);
    let out = run(&host, &mut c);
    assert_eq!(field_of(&out, "capturept", "capturept"), "0", "{out:?}");
    assert_eq!(field_of(&out, "capturept", "legacy"), "906", "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: {out:?}");
    assert_eq!(field_of(&out, "capturept", "pt"), "0", "{out:?}");
    assert_eq!(field_of(&out, "capturept", "pt_status"), "1", "CU_STREAM_CAPTURE_STATUS_ACTIVE: {out:?}");
    assert_eq!(rc_of(&out, "destroy="), ["0"], "{out:?}");
    assert_eq!(rc_of(&out, "alloc="), ["0"], "the capture ended with its context: {out:?}");
}

/// Review finding: launches of different execs on several threads at once each read the empty
/// pool from the driver before any of them reserved; the first reserved its 64 MiB and the
/// others, finding the count covered what their figures asked for, reserved nothing, so all of
/// them mapped (192 MiB under a 100 MiB quota, outside the shim). The launches in flight now
/// count against each other: one fits, the others are refused with CUDA_ERROR_OUT_OF_MEMORY.
/// `memory.test_graph_launch_pause_ms` holds each launch between its read of the pool and its
/// reservation, so all of them read the pool before any reserves.
#[test]
fn graph_launches_on_several_threads_at_once_stay_within_the_quota() {
    let host = EmuHost::new();
    let l = ledger(&host);
    let quota = 100 * MIB;
    let cfg = host.root().join("xcuda-graph-launch-pause.json");
    std::fs::write(&cfg, r#"{"memory": {"test_graph_launch_pause_ms": 300}}"#).unwrap();
    let mut c = limited(&host, "shim_client", quota, "gt1");
    c.env("XCUDA_CONFIG", &cfg).args(["ctx", "graphmemthreads", "3", &(64 * MIB).to_string(), "ready", "wait"]);
    let mut k = host.spawn(&mut c);
    k.wait_for_line("ready", T).unwrap_or_else(|| panic!("{}\n{}", k.stdout(), k.stderr()));
    let out: Vec<String> = k.stdout().lines().map(str::to_string).collect();
    let msg = format!("{out:?}\n{}", k.stderr());
    let held = held_by(&host, k.pid());
    assert!(held <= quota, "outside the shim the process holds {} MiB of graph memory under a 100 MiB quota: {msg}", held / MIB);
    let mut launches: Vec<String> = field_of(&out, "graphmemthreads", "launches").split(',').map(str::to_string).collect();
    launches.sort();
    assert_eq!(launches, ["0", "2", "2"], "one fits, the others CUDA_ERROR_OUT_OF_MEMORY: {msg}");
    assert_eq!(field_of(&out, "graphmemthreads", "pool_reserved"), (64 * MIB).to_string(), "{msg}");
    let counted = l.procs().into_iter().find(|p| p.pid == k.pid()).map_or(0, |p| p.mem_bytes);
    assert_eq!(counted, 64 * MIB, "the pool counted in the ledger: {msg}");
    done(k);
}
