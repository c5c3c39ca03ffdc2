//! The `graph` step: a graph of spin kernel nodes, instantiated and launched (plain and
//! per-thread `cuGraphLaunch_ptsz`), timed with events.

use super::Cuda;
use cuda_abi::*;
use e2e::client::{spin_node_params, Events};
use std::ffi::c_void;

/// Builds a graph of `nodes` spin kernels and launches it twice; returns a `k=v` line.
///
/// # Safety
/// `cu` must be initialised with a current context; `spin` is the loaded spin kernel.
pub unsafe fn run(cu: &Cuda, spin: CUfunction, blocks: u32, mut cycles: u64, nodes: u32) -> String {
    // SAFETY: functions resolved at their PFN's version (ptsz with flags=2); pointers are locals.
    unsafe {
        let create = get!(cu, "cuGraphCreate", PFN_cuGraphCreate_v10000, 10000);
        let add = get!(
            cu,
            "cuGraphAddKernelNode",
            PFN_cuGraphAddKernelNode_v12000,
            12000
        );
        let inst = get!(
            cu,
            "cuGraphInstantiateWithFlags",
            PFN_cuGraphInstantiateWithFlags_v11040,
            11040
        );
        let launch = get!(cu, "cuGraphLaunch", PFN_cuGraphLaunch_v10000, 10000);
        let p = cu
            .proc(
                "cuGraphLaunch",
                12000,
                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
            )
            .expect("cuGraphLaunch ptsz");
        let launch_ptsz = std::mem::transmute::<*mut c_void, PFN_cuGraphLaunch_v10000_ptsz>(p);
        let exec_destroy = get!(
            cu,
            "cuGraphExecDestroy",
            PFN_cuGraphExecDestroy_v10000,
            10000
        );
        let destroy = get!(cu, "cuGraphDestroy", PFN_cuGraphDestroy_v10000, 10000);
        let sync = get!(cu, "cuCtxSynchronize", PFN_cuCtxSynchronize_v2000, 2000);
        let Events {
            create: ecreate,
            record: erecord,
            elapsed,
        } = Events::resolve(cu);

        let mut g: CUgraph = std::ptr::null_mut();
        let mut rc = create(&mut g, 0);
        let mut params = [(&mut cycles as *mut u64).cast::<c_void>()];
        let mut prev: CUgraphNode = std::ptr::null_mut();
        for i in 0..nodes {
            let np = spin_node_params(spin, blocks, params.as_mut_ptr());
            let mut node: CUgraphNode = std::ptr::null_mut();
            let (deps, n) = if i == 0 {
                (std::ptr::null(), 0)
            } else {
                (&prev as *const CUgraphNode, 1)
            };
            if rc.is_success() {
                rc = add(&mut node, g, deps, n, &np);
            }
            prev = node;
        }
        let mut exec: CUgraphExec = std::ptr::null_mut();
        if rc.is_success() {
            rc = inst(&mut exec, g, 0);
        }
        let mut ev = [std::ptr::null_mut::<CUevent_st>(); 4];
        for e in ev.iter_mut() {
            ecreate(e, 0);
        }
        let timed = |use_ptsz: bool, a: CUevent, b: CUevent| -> (u32, f32) {
            erecord(a, std::ptr::null_mut());
            let r = if use_ptsz {
                launch_ptsz(exec, std::ptr::null_mut())
            } else {
                launch(exec, std::ptr::null_mut())
            };
            erecord(b, std::ptr::null_mut());
            sync();
            let mut ms = 0f32;
            elapsed(&mut ms, a, b);
            (r.0, ms)
        };
        let (r1, ms1) = if rc.is_success() {
            timed(false, ev[0], ev[1])
        } else {
            (rc.0, 0.0)
        };
        let (r2, ms2) = if rc.is_success() {
            timed(true, ev[2], ev[3])
        } else {
            (rc.0, 0.0)
        };
        exec_destroy(exec);
        destroy(g);
        format!(
            "graph build={} launch={r1} launch_ptsz={r2} ms={ms1:.3} ms_ptsz={ms2:.3}",
            rc.0
        )
    }
}

/// The `graphlegacy BYTES HOW` step: a graph with one BYTES alloc node on device 0 instantiated
/// through the name `cuGraphInstantiate`, then launched once. HOW: `dlsym` / `dlsym_v2` (the
/// exported 5-argument `cuGraphInstantiate` / `cuGraphInstantiate_v2`) or a CUDA version for
/// `cuGetProcAddress_v2("cuGraphInstantiate", HOW)` (the 5-argument ABI below 12000,
/// `cuGraphInstantiateWithFlags`'s from 12000). Returns a `k=v` line of the results and the
/// driver's graph-pool reservation.
///
/// # Safety
/// `cu` must be initialised with a current context.
pub unsafe fn legacy_mem(cu: &Cuda, bytes: usize, how: &str) -> String {
    // SAFETY: functions resolved at their PFN's version, or exported under the 5-argument ABI
    // (`dlsym` of a table symbol); pointers are locals.
    unsafe {
        let create = get!(cu, "cuGraphCreate", PFN_cuGraphCreate_v10000, 10000);
        let add = get!(cu, "cuGraphAddMemAllocNode", PFN_cuGraphAddMemAllocNode_v11040, 11040);
        let launch = get!(cu, "cuGraphLaunch", PFN_cuGraphLaunch_v10000, 10000);
        let sync = get!(cu, "cuCtxSynchronize", PFN_cuCtxSynchronize_v2000, 2000);
        let attr = get!(cu, "cuDeviceGetGraphMemAttribute", PFN_cuDeviceGetGraphMemAttribute_v11040, 11040);
        let mut g: CUgraph = std::ptr::null_mut();
        let mut rc = create(&mut g, 0);
        let mut p = CUDA_MEM_ALLOC_NODE_PARAMS::pinned_on_device(0, bytes);
        let mut node: CUgraphNode = std::ptr::null_mut();
        if rc.is_success() {
            rc = add(&mut node, g, std::ptr::null(), 0, &mut p);
        }
        let mut err_node: CUgraphNode = std::ptr::null_mut();
        let mut log = [0 as std::ffi::c_char; 256];
        let five = |p: *mut c_void| std::mem::transmute::<*mut c_void, PFN_cuGraphInstantiate_v11000>(p);
        let mut instantiate = |exec: &mut CUgraphExec| match how {
            "dlsym" | "dlsym_v2" => {
                let name = if how == "dlsym" { c"cuGraphInstantiate" } else { c"cuGraphInstantiate_v2" };
                let f = libc::dlsym(cu.lib, name.as_ptr());
                if f.is_null() {
                    crate::die(&format!("{name:?} not exported"));
                }
                five(f)(exec, g, &mut err_node, log.as_mut_ptr(), log.len())
            }
            v => {
                let v: std::ffi::c_int = v.parse().unwrap_or_else(|_| crate::die("graphlegacy BYTES dlsym|dlsym_v2|VERSION"));
                match cu.proc("cuGraphInstantiate", v, 0) {
                    Ok(f) if v >= 12000 => std::mem::transmute::<*mut c_void, PFN_cuGraphInstantiateWithFlags_v11040>(f)(exec, g, 0),
                    Ok(f) => five(f)(exec, g, &mut err_node, log.as_mut_ptr(), log.len()),
                    Err((r, _)) => r,
                }
            }
        };
        let mut exec: CUgraphExec = std::ptr::null_mut();
        let inst = if rc.is_success() { instantiate(&mut exec) } else { rc };
        let launched = if inst.is_success() { launch(exec, std::ptr::null_mut()) } else { inst };
        let _ = sync();
        // A graph with memory nodes has one instantiation at a time: the driver refuses a second.
        let mut second: CUgraphExec = std::ptr::null_mut();
        let again = if inst.is_success() { instantiate(&mut second) } else { inst };
        let log_len = log.iter().position(|c| *c == 0).unwrap_or(log.len());
        let mut reserved = 0u64;
        attr(0, CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, (&mut reserved as *mut u64).cast());
        format!("graphlegacy={} node={} inst={} again={} log={log_len} pool_reserved={reserved}", launched.0, rc.0, inst.0, again.0)
    }
}
