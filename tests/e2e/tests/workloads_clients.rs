//! The workload programs against the emulator: the online client's latency report, the
//! offline client's checkpoint-on-SIGTERM and clean context release (under MPS a SIGKILLed
//! client poisons the server, a SIGTERMed one does not), interference between the two, and
//! clear errors.

mod workloads_support;

use std::time::Duration;

use workloads_support::*;

fn online(host: &Host, args: &[&str]) -> serde_json::Value {
    let mut c = host.command("online");
    c.arg("--json").args(args);
    let out = run_bounded(c, "", Duration::from_secs(120));
    assert!(
        out.status.success(),
        "online failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    last_json(&out.stdout)
}

/// Sends `sig` to the offline client `p`, which must exit 0 with a summary naming `sig`; the
/// summary.
fn stop_for_summary(p: &mut Proc, sig: i32) -> serde_json::Value {
    let (st, lines) = p.stop(sig, Duration::from_secs(30));
    assert!(st.success(), "{st:?} {lines:?}");
    let fin = final_summary(&lines);
    assert_eq!(fin["signal"], sig, "{fin}");
    fin
}

#[test]
fn online_reports_latency_of_emulated_kernels() {
    let host = host("t4");
    let r = online(
        &host,
        &[
            "--duration",
            "1",
            "--rate",
            "40",
            "--kernels",
            "2",
            "--kernel-us",
            "2000",
            "--arrivals",
            "fixed",
        ],
    );
    let n = r["requests"].as_u64().unwrap();
    let (p50, p99) = (r["p50_ms"].as_f64().unwrap(), r["p99_ms"].as_f64().unwrap());
    assert!(n >= 20, "{r}");
    assert!(
        p50 >= 4.0,
        "two 2 ms kernels per request take at least 4 ms of emulated time: {r}"
    );
    assert!(p99 >= p50, "{r}");
    assert_eq!(r["device"], "Tesla T4");
}

#[test]
fn offline_checkpoints_and_releases_its_context_on_sigterm() {
    let host = host("t4");
    mps_start(&host);
    let _guard = MpsGuard(&host);
    let state = PathBuf::from(
        host.env()
            .iter()
            .find(|(k, _)| k == "GPUEMU_STATE")
            .unwrap()
            .1
            .clone(),
    );
    let dev = emu_device::Device::open(&state, emu_device::Profile::by_id("t4").unwrap()).unwrap();
    let ckpt = host.root().join("ckpt.bin");

    let mut p = offline(
        &host,
        &[
            "--state-mb",
            "4",
            "--kernel-us",
            "20000",
            "--checkpoint",
            ckpt.to_str().unwrap(),
        ],
    );
    p.wait_line("iters_per_s", Duration::from_secs(60));
    let fin = stop_for_summary(&mut p, libc::SIGTERM);
    assert_eq!(fin["checkpoint_bytes"], 4 << 20);
    assert!(fin["iterations"].as_u64().unwrap() >= 1);
    let bytes = std::fs::read(&ckpt).expect("checkpoint file");
    assert_eq!(
        bytes,
        workloads::offline::state_pattern(4 << 20),
        "checkpoint holds the state copied back from the device"
    );
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !dev.mps_status().poisoned,
        "a client that released its context leaves MPS healthy"
    );

    // The contrast: the same client killed outright dies holding its context.
    let mut k = offline(&host, &["--state-mb", "4", "--kernel-us", "20000"]);
    k.wait_line("iters_per_s", Duration::from_secs(60));
    k.stop(libc::SIGKILL, Duration::from_secs(30));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !dev.mps_status().poisoned {
        assert!(
            std::time::Instant::now() < deadline,
            "SIGKILLed client did not poison MPS"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `offline --ignore-sigterm` (the GPU check kit's stand-in for an application that ignores the
/// kubelet's SIGTERM): SIGTERM's disposition is SIG_IGN, the kernels go on through one, and
/// SIGINT still ends the run with its checkpoint.
#[test]
fn offline_ignoring_sigterm_runs_on_until_sigint() {
    let host = host("t4");
    let mut p = offline(
        &host,
        &["--ignore-sigterm", "--state-mb", "1", "--kernel-us", "5000"],
    );
    p.wait_line("iters_per_s", Duration::from_secs(60));
    let status = std::fs::read_to_string(format!("/proc/{}/status", p.pid())).unwrap();
    let ign = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
        .expect("SigIgn line");
    assert_ne!(
        ign & (1 << (libc::SIGTERM - 1)),
        0,
        "SIGTERM ignored: {status}"
    );
    assert_eq!(
        ign & (1 << (libc::SIGINT - 1)),
        0,
        "SIGINT handled: {status}"
    );
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe { libc::kill(p.pid() as i32, libc::SIGTERM) };
    for _ in 0..3 {
        p.wait_line("iters_per_s", Duration::from_secs(30));
    }
    assert!(p.child.try_wait().unwrap().is_none(), "{:?}", p.seen);
    let fin = stop_for_summary(&mut p, libc::SIGINT);
    assert_eq!(fin["checkpoint_bytes"], 1 << 20);
}

use std::path::PathBuf;

#[test]
fn offline_load_raises_online_latency() {
    let host = host("t4");
    // Full-grid online kernels long enough that CPU scheduling noise stays small beside them:
    // beside a full-grid offline client each gets about half the SMs at a lower clock.
    let args = [
        "--duration",
        "2",
        "--rate",
        "20",
        "--kernels",
        "2",
        "--kernel-us",
        "5000",
        "--blocks",
        "40",
        "--arrivals",
        "fixed",
    ];
    let alone = online(&host, &args);
    let mut off = offline(&host, &["--kernel-us", "20000", "--blocks", "80"]);
    off.wait_line("iters_per_s", Duration::from_secs(60));
    let shared = online(&host, &args);
    off.stop(libc::SIGTERM, Duration::from_secs(30));
    let (a, s) = (
        alone["p50_ms"].as_f64().unwrap(),
        shared["p50_ms"].as_f64().unwrap(),
    );
    assert!(
        s > 1.5 * a,
        "online p50 alone {a:.2} ms, beside offline {s:.2} ms"
    );
}

#[test]
fn errors_name_the_failing_call_and_result() {
    let host = host("t4");
    let mut c = host.command("online");
    c.args(["--device", "3", "--duration", "0.1"]);
    let out = run_bounded(c, "", Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("CUDA_ERROR_INVALID_DEVICE"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut c = host.command("offline");
    c.env("WORKLOADS_LIBCUDA", "/nonexistent/libcuda.so.1");
    let out = run_bounded(c, "", Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("dlopen"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut c = host.command("online");
    c.args(["--rate", "fast"]);
    let out = run_bounded(c, "", Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--rate 'fast'"));
}
