//! A real third-party driver client, NVIDIA's `cuda-bindings` from PyPI, runs unmodified
//! against the emulator's `libcuda.so.1`: init, alloc, copy, PTX module load (our spin
//! kernel), launch, sync, free. Interpreter: `$XSHARE_PYTHON`, default `<repo>/.venv/bin/python`
//! (installed by scripts/setup-test-env.sh).

mod workloads_support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use e2e::python;
use workloads_support::*;

#[test]
fn cuda_bindings_round_trip_against_the_emulator() {
    let py = python();
    assert!(
        py.exists(),
        "{} not found: run scripts/setup-test-env.sh (or set XSHARE_PYTHON to a python with cuda-bindings)",
        py.display()
    );
    let host = host("a10");
    let ptx = host.root().join("spin.ptx");
    std::fs::write(&ptx, workloads::ptx::SPIN_PTX.to_bytes()).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/cuda_roundtrip.py");
    let mut c = Command::new(&py);
    c.arg(&script).arg(&ptx);
    for (k, v) in host.env() {
        c.env(k, v);
    }
    let out = run_bounded(c, "", Duration::from_secs(120));
    assert!(
        out.status.success(),
        "cuda-bindings round trip failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let r = last_json(&out.stdout);
    assert_eq!(r["devices"], 1);
    assert_eq!(r["name"], "NVIDIA A10");
    assert_eq!(r["sms"], 72);
    assert_eq!(r["roundtrip_equal"], true, "{r}");
    assert!(
        r["used_during"].as_u64().unwrap() >= r["copied"].as_u64().unwrap(),
        "{r}"
    );
}
