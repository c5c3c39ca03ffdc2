//! GPM (GPU performance monitoring, Hopper+) samples and metrics: a sample is the device's
//! cumulative counters at one instant; metrics are rates between two samples.

#![allow(non_upper_case_globals)]

use std::ffi::CStr;

use nvml_wrapper_sys::bindings::*;

use crate::metrics::{ratio, Point};
use crate::state::{shared, NvmlResult, Shared};

/// A new, unfilled sample; returns its handle value (never 0).
pub fn alloc() -> NvmlResult<usize> {
    let mut g = shared();
    let sh = g.as_mut().ok_or(nvmlReturn_enum_NVML_ERROR_UNINITIALIZED)?;
    let id = sh.next_gpm;
    sh.next_gpm += 1;
    sh.gpm.push((id, None));
    Ok(id)
}

/// Frees a sample; INVALID_ARGUMENT for a handle that is not live.
pub fn free(id: usize) -> NvmlResult<()> {
    let mut g = shared();
    let sh = g.as_mut().ok_or(nvmlReturn_enum_NVML_ERROR_UNINITIALIZED)?;
    let i = sh
        .gpm
        .iter()
        .position(|(k, _)| *k == id)
        .ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
    sh.gpm.swap_remove(i);
    Ok(())
}

/// Stores device `dev`'s counters `p` in sample `id` (the caller holds the shared state).
pub fn fill_in(sh: &mut Shared, id: usize, dev: u32, p: Point) -> NvmlResult<()> {
    let slot = sh
        .gpm
        .iter_mut()
        .find(|(k, _)| *k == id)
        .ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
    slot.1 = Some((dev, p));
    Ok(())
}

struct Info {
    short: &'static CStr,
    long: &'static CStr,
    unit: &'static CStr,
}

/// Value (0..=100) of `metric` between `a` and `b`. The emulator has no warp model, so SM
/// occupancy is reported equal to SM utilization.
fn metric(id: nvmlGpmMetricId_t, a: &Point, b: &Point) -> Option<(f64, Info)> {
    let pct = |f: fn(&Point) -> u64| ratio(a, b, f).unwrap_or(0.0) * 100.0;
    Some(match id {
        nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL => (
            pct(|p| p.busy_ns),
            Info {
                short: c"gr_util",
                long: c"Graphics/compute engine utilization",
                unit: c"%",
            },
        ),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL => (
            pct(|p| p.sm_active_ns),
            Info {
                short: c"sm_util",
                long: c"Percentage of SMs that were busy",
                unit: c"%",
            },
        ),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY => (
            pct(|p| p.sm_active_ns),
            Info {
                short: c"sm_occupancy",
                long: c"Percentage of warps occupied vs theoretical maximum",
                unit: c"%",
            },
        ),
        _ => return None,
    })
}

/// Fills `req.metrics[..numMetrics]` from its two samples.
pub fn metrics_get(req: &mut nvmlGpmMetricsGet_t) -> NvmlResult<()> {
    let n = req.numMetrics as usize;
    if n > req.metrics.len() {
        return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
    }
    let (a, b) = {
        let g = shared();
        let sh = g.as_ref().ok_or(nvmlReturn_enum_NVML_ERROR_UNINITIALIZED)?;
        let get = |s: nvmlGpmSample_t| {
            sh.gpm
                .iter()
                .find(|(k, _)| *k == s as usize)
                .and_then(|(_, v)| *v)
                .ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
        };
        (get(req.sample1)?, get(req.sample2)?)
    };
    if a.0 != b.0 {
        return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
    }
    let (a, b) = if a.1.now_ns <= b.1.now_ns {
        (a.1, b.1)
    } else {
        (b.1, a.1)
    };
    for m in &mut req.metrics[..n] {
        match metric(m.metricId, &a, &b) {
            Some((v, info)) => {
                m.nvmlReturn = nvmlReturn_enum_NVML_SUCCESS;
                m.value = v;
                m.metricInfo.shortName = info.short.as_ptr().cast_mut();
                m.metricInfo.longName = info.long.as_ptr().cast_mut();
                m.metricInfo.unit = info.unit.as_ptr().cast_mut();
            }
            None => {
                m.nvmlReturn = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
                m.value = 0.0;
            }
        }
    }
    Ok(())
}
