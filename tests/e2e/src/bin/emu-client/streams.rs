//! The `streams` step: launches are asynchronous per stream, ordered within a stream and
//! concurrent across streams; reached through cuLaunchKernelEx and the per-thread
//! (`flags=2`) cuLaunchKernel_ptsz.

use super::Cuda;
use cuda_abi::*;
use e2e::client::{spin_launch_config, Events};
use std::ffi::c_void;

/// Runs the scenario with kernels of `blocks` x `cycles`; returns a `k=v` result line.
///
/// # Safety
/// `cu` must be initialised with a current context; `spin` is the loaded spin kernel.
pub unsafe fn run(cu: &Cuda, spin: CUfunction, blocks: u32, mut cycles: u64) -> String {
    // SAFETY: functions resolved at their PFN's version (ptsz with flags=2); pointers are locals.
    unsafe {
        let screate = get!(cu, "cuStreamCreate", PFN_cuStreamCreate_v2000, 2000);
        let squery = get!(cu, "cuStreamQuery", PFN_cuStreamQuery_v2000, 2000);
        let ssync = get!(
            cu,
            "cuStreamSynchronize",
            PFN_cuStreamSynchronize_v2000,
            2000
        );
        let Events {
            create: ecreate,
            record: erecord,
            elapsed,
        } = Events::resolve(cu);
        let launch_ex = get!(cu, "cuLaunchKernelEx", PFN_cuLaunchKernelEx_v11060, 11060);
        let p = cu
            .proc(
                "cuLaunchKernel",
                12000,
                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
            )
            .expect("cuLaunchKernel ptsz");
        let launch_ptsz = std::mem::transmute::<*mut c_void, PFN_cuLaunchKernel_v7000_ptsz>(p);

        let (mut s1, mut s2): (CUstream, CUstream) = (std::ptr::null_mut(), std::ptr::null_mut());
        screate(&mut s1, 0);
        screate(&mut s2, 0);
        let mut ev = [std::ptr::null_mut::<CUevent_st>(); 6];
        for e in ev.iter_mut() {
            ecreate(e, 0);
        }
        let mut params = [(&mut cycles as *mut u64).cast::<c_void>()];
        let cfg = |s: CUstream| spin_launch_config(blocks, s);
        // One kernel on each stream: concurrent.
        erecord(ev[0], s1);
        erecord(ev[2], s2);
        let c1 = cfg(s1);
        let r1 = launch_ex(&c1, spin, params.as_mut_ptr(), std::ptr::null_mut());
        let r2 = launch_ptsz(
            spin,
            blocks,
            1,
            1,
            32,
            1,
            1,
            0,
            s2,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        );
        let query = squery(s1);
        erecord(ev[1], s1);
        erecord(ev[3], s2);
        ssync(s1);
        ssync(s2);
        // Two kernels on one stream: serialised.
        erecord(ev[4], s1);
        launch_ex(&c1, spin, params.as_mut_ptr(), std::ptr::null_mut());
        launch_ex(&c1, spin, params.as_mut_ptr(), std::ptr::null_mut());
        erecord(ev[5], s1);
        ssync(s1);
        let ms = |a: CUevent, b: CUevent| {
            let mut v = 0f32;
            let r = elapsed(&mut v, a, b);
            if r.is_success() {
                v
            } else {
                -1.0
            }
        };
        format!(
            "streams launch_ex={} launch_ptsz={} query={} par1_ms={:.3} par2_ms={:.3} serial_ms={:.3}",
            r1.0,
            r2.0,
            query.0,
            ms(ev[0], ev[1]),
            ms(ev[2], ev[3]),
            ms(ev[4], ev[5])
        )
    }
}
