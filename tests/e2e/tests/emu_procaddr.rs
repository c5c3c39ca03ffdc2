//! `cuGetProcAddress_v2` of the fake driver, asked by a separate process that loaded it with
//! `dlopen`: the right ABI per (name, version, flags), NOT_FOUND and a null pointer otherwise.

use e2e::{field, EmuHost};
use std::time::Duration;

/// `(name, version, flags, expected rc, expected status, expected symbol)`.
const CASES: &[(&str, &str, &str, &str, &str, &str)] = &[
    ("cuMemAlloc", "12000", "0", "0", "0", "cuMemAlloc_v2"),
    ("cuMemAlloc", "3020", "0", "0", "0", "cuMemAlloc_v2"),
    // The 32-bit ABI of CUDA < 3.2 is not implemented: no pointer rather than a wrong one.
    ("cuMemAlloc", "3010", "0", "500", "1", "null"),
    ("cuCtxCreate", "3020", "0", "0", "0", "cuCtxCreate_v2"),
    ("cuCtxCreate", "11040", "0", "0", "0", "cuCtxCreate_v3"),
    ("cuCtxCreate", "12090", "0", "0", "0", "cuCtxCreate_v4"),
    (
        "cuDevicePrimaryCtxRelease",
        "10020",
        "0",
        "0",
        "0",
        "cuDevicePrimaryCtxRelease",
    ),
    (
        "cuDevicePrimaryCtxRelease",
        "11000",
        "0",
        "0",
        "0",
        "cuDevicePrimaryCtxRelease_v2",
    ),
    (
        "cuGetProcAddress",
        "11030",
        "0",
        "0",
        "0",
        "cuGetProcAddress",
    ),
    (
        "cuGetProcAddress",
        "12000",
        "0",
        "0",
        "0",
        "cuGetProcAddress_v2",
    ),
    ("cuLaunchKernel", "12000", "0", "0", "0", "cuLaunchKernel"),
    ("cuLaunchKernel", "12000", "1", "0", "0", "cuLaunchKernel"),
    (
        "cuLaunchKernel",
        "12000",
        "2",
        "0",
        "0",
        "cuLaunchKernel_ptsz",
    ),
    ("cuLaunchKernel", "6050", "2", "0", "0", "cuLaunchKernel"),
    (
        "cuMemcpyHtoD",
        "12000",
        "2",
        "0",
        "0",
        "cuMemcpyHtoD_v2_ptds",
    ),
    (
        "cuMemAllocAsync",
        "12000",
        "2",
        "0",
        "0",
        "cuMemAllocAsync_ptsz",
    ),
    (
        "cuEventElapsedTime",
        "12000",
        "0",
        "0",
        "0",
        "cuEventElapsedTime",
    ),
    (
        "cuEventElapsedTime",
        "12080",
        "0",
        "0",
        "0",
        "cuEventElapsedTime_v2",
    ),
    ("cuLaunchKernelEx", "11050", "0", "500", "2", "null"),
    ("cuNoSuchFunction", "12000", "0", "500", "1", "null"),
    ("", "12000", "0", "500", "1", "null"),
    ("cuMemAlloc_v2", "12000", "0", "500", "1", "null"),
    ("cuMemAlloc", "12000", "4", "1", "1", "null"),
];

#[test]
fn proc_address_answers_right_abi_per_version_and_flags() {
    let host = EmuHost::new();
    let mut steps: Vec<&str> = Vec::new();
    for (name, v, f, ..) in CASES {
        steps.extend(["procaddr", name, v, f]);
    }
    let mut c = host.client(&steps);
    c.finish(Duration::from_secs(30));
    let lines = c.lines("procaddr ");
    assert_eq!(lines.len(), CASES.len(), "{}\n{}", c.stdout(), c.stderr());
    for (l, (name, v, f, rc, status, sym)) in lines.iter().zip(CASES) {
        let got = (
            field(l, "rc").unwrap(),
            field(l, "status").unwrap(),
            field(l, "symbol").unwrap(),
        );
        assert_eq!(got, (*rc, *status, *sym), "{name}@{v} flags={f}: {l}");
    }
}
