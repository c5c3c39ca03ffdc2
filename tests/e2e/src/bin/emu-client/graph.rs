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
