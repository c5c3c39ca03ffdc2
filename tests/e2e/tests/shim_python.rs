//! Real third-party clients, unmodified, under the shim: NVIDIA's `cuda-bindings` and
//! numba-cuda allocating past the quota get CUDA_ERROR_OUT_OF_MEMORY. Interpreter:
//! `$XSHARE_PYTHON`, default `<repo>/.venv/bin/python` (scripts/setup-test-env.sh).

mod shim_support;


use e2e::EmuHost;
use e2e::python;
use shim_support::*;

const QUOTA: u64 = 64 * MIB;

const CUDA_BINDINGS: &str = r#"
import json, sys
from cuda.bindings import driver as cu
q = int(sys.argv[1])
assert cu.cuInit(0)[0] == 0
dev = cu.cuDeviceGet(0)[1]
ctx = cu.cuDevicePrimaryCtxRetain(dev)[1]
cu.cuCtxSetCurrent(ctx)
e1, p1 = cu.cuMemAlloc(q * 5 // 8)
e2, p2 = cu.cuMemAlloc(q // 2)
e3, free, total = cu.cuMemGetInfo()
e4, tot = cu.cuDeviceTotalMem(dev)
print(json.dumps({"first": int(e1), "second": int(e2), "free": free, "total": total, "device_total": tot}))
cu.cuMemFree(p1)
cu.cuDevicePrimaryCtxRelease(dev)
"#;

const NUMBA: &str = r#"
import json, sys
import numpy as np
from numba import cuda
q = int(sys.argv[1])
out = {}
a = cuda.to_device(np.zeros(q * 5 // 8, dtype=np.uint8))
out["first"] = 0
try:
    b = cuda.to_device(np.zeros(q // 2, dtype=np.uint8))
    out["second"] = 0
except Exception as e:
    out["second"] = int(getattr(e, "code", -1))
    out["error"] = type(e).__name__
print(json.dumps(out))
"#;

fn run_py(host: &EmuHost, script: &str, shimmed: bool, group: &str) -> serde_json::Value {
    let mut c = if shimmed {
        limited(host, python().to_str().unwrap(), QUOTA, group)
    } else {
        unlimited(host, python().to_str().unwrap())
    };
    c.env("NUMBA_CUDA_DRIVER", host.lib_dir().join("libcuda.so.1"));
    c.args(["-c", script, &QUOTA.to_string()]);
    let mut child = host.spawn(&mut c);
    let out = child.finish(T);
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no result; stdout:\n{out}\nstderr:\n{}", child.stderr()));
    serde_json::from_str(line).expect("json")
}

#[test]
fn cuda_bindings_past_the_quota_gets_out_of_memory() {
    let host = EmuHost::new();
    let v = run_py(&host, CUDA_BINDINGS, true, "py");
    assert_eq!(v["first"], 0, "{v}");
    assert_eq!(
        v["second"], 2,
        "CUDA_ERROR_OUT_OF_MEMORY through cuda-bindings: {v}"
    );
    assert_eq!(v["total"], QUOTA, "{v}");
    assert_eq!(v["device_total"], QUOTA, "{v}");
    let control = run_py(&host, CUDA_BINDINGS, false, "py");
    assert_eq!(
        control["second"], 0,
        "control run without the shim: {control}"
    );
}

#[test]
fn numba_to_device_past_the_quota_gets_out_of_memory() {
    let host = EmuHost::new();
    let v = run_py(&host, NUMBA, true, "numba");
    assert_eq!(v["first"], 0, "{v}");
    assert_eq!(
        v["second"], 2,
        "CUDA_ERROR_OUT_OF_MEMORY through numba: {v}"
    );
    let control = run_py(&host, NUMBA, false, "numba");
    assert_eq!(
        control["second"], 0,
        "control run without the shim: {control}"
    );
}
