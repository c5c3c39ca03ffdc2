//! Observation 4 (issue 8): Python's Ctrl-C path, repeated. After `KeyboardInterrupt` CPython
//! re-raises SIGINT itself (exit_sigint) while the shim's exit-time release may be running;
//! the signal path must then wait for that release, never kill the process with its context
//! still live. Under the emulator's MPS model a client dying with a live context poisons the
//! server (the hang a real MPS server shows), so per run we assert: the emulator saw the
//! context released before the process was gone (not poisoned) and a long-lived neighbour
//! MPS client keeps completing kernels.
//!
//! `repeated_python_ctrl_c_never_hangs_the_neighbour` runs 20 iterations; the `#[ignore]`d
//! stress variant runs `XSHARE_STRESS_RUNS` (default 1000) and prints the figure.

mod shim_support;

use std::time::{Duration, Instant};

use e2e::{kernel_neighbour, EmuHost};
use e2e::python;
use shim_support::*;

/// How a Ctrl-C run failed.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// The emulator's MPS server was poisoned: the trainer died with its context live.
    Poisoned(String),
    /// The neighbour did not complete its kernel.
    NeighbourHung(String),
}

/// Runs `runs` Ctrl-C iterations on one MPS server with one neighbour; stops at the first
/// failure. Returns (clean runs, first failure).
fn ctrl_c_runs(runs: usize, pause_ms: u64) -> (usize, Option<Outcome>) {
    signal_runs(runs, pause_ms, |_| (true, libc::SIGINT))
}

/// Runs `runs` iterations; `pick(i)` says whether run `i` is the Python trainer (else the C
/// `shim_client`) and which signal it gets.
fn signal_runs(
    runs: usize,
    pause_ms: u64,
    pick: impl Fn(usize) -> (bool, i32),
) -> (usize, Option<Outcome>) {
    let host = EmuHost::new();
    let dev = host.device();
    host.start_mps();
    let py = python();
    let mut b = kernel_neighbour(&host, runs);
    let cfg = host.root().join("xcuda-pause.json");
    std::fs::write(
        &cfg,
        format!(r#"{{"exit": {{"test_release_pause_ms": {pause_ms}}}}}"#),
    )
    .unwrap();
    for i in 0..runs {
        let (is_py, sig) = pick(i);
        let mut c = offline_victim(
            &host,
            is_py.then_some(py.as_path()),
            &["ctx", "alloc", "1048576", "launch", "1", "1000", "1", "ready", "hang"],
        );
        // Fault injection (pause_ms > 0): each context release takes that much longer, so the
        // exit path and the signal path overlap on every run instead of on ~1 run in 100.
        c.env("XCUDA_CONFIG", &cfg);
        let mut trainer = host.spawn(&mut c);
        if trainer.wait_for_line("ready", T).is_none() {
            panic!(
                "run {i} (python: {is_py}, signal {sig}): client never ready; exited: {:?}; {:?}; pid {}; stdout: {}; stderr: {}",
                trainer.wait_timeout(Duration::ZERO),
                dev.mps_status(),
                trainer.pid(),
                trainer.stdout(),
                trainer.stderr()
            );
        }
        trainer.signal(sig);
        let st = trainer
            .wait_timeout(T)
            .unwrap_or_else(|| panic!("python exits on Ctrl-C: {}", trainer.stderr()));
        use std::os::unix::process::ExitStatusExt;
        let err = trainer.stderr();
        if is_py && sig == libc::SIGINT {
            assert!(
                err.contains("KeyboardInterrupt"),
                "Python's own handler ran: {err}"
            );
            // CPython re-kills itself with SIGINT; the process ends by that signal or, when the
            // exit path got there first, with Python's own 130.
            assert!(
                st.signal() == Some(libc::SIGINT) || st.code() == Some(130),
                "{st:?} {err}"
            );
        } else {
            assert_eq!(st.signal(), Some(sig), "default action kept: {err}");
        }
        // Let the emulator reap the dead client (it does on state access after its reap period).
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(20));
            dev.mps_status();
        }
        let s = dev.mps_status();
        if s.poisoned {
            host.quit_mps();
            return (
                i,
                Some(Outcome::Poisoned(format!(
                    "run {i}: {s:?}; python stderr: {err}"
                ))),
            );
        }
        b.send_line("go");
        let start = Instant::now();
        while b.lines("spin=").len() < i + 1 {
            if start.elapsed() > Duration::from_secs(20) {
                host.quit_mps();
                return (
                    i,
                    Some(Outcome::NeighbourHung(format!(
                        "run {i}: {:?}; python stderr: {err}",
                        dev.mps_status()
                    ))),
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            b.lines("spin=")
                .iter()
                .all(|l| e2e::field(l, "spin") == Some("0")),
            "{}",
            b.stdout()
        );
    }
    (runs, None)
}

#[test]
fn repeated_python_ctrl_c_never_hangs_the_neighbour() {
    let (clean, fail) = ctrl_c_runs(20, 100);
    assert_eq!(fail, None, "after {clean} clean runs");
}

/// Stress figure for the issue, no fault injection unless `XSHARE_STRESS_PAUSE_MS` is set:
/// `XSHARE_STRESS_RUNS=1000 cargo test -p e2e --test shim_ctrl_c_repeat -- --ignored --nocapture`.
#[test]
#[ignore]
fn stress_python_ctrl_c() {
    let runs = std::env::var("XSHARE_STRESS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let pause = std::env::var("XSHARE_STRESS_PAUSE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let t = Instant::now();
    let (clean, fail) = ctrl_c_runs(runs, pause);
    eprintln!(
        "python ctrl-c stress: {clean}/{runs} clean in {:?}; first failure: {fail:?}",
        t.elapsed()
    );
    assert_eq!(fail, None);
}

/// The issue's mixed figure: randomized SIGTERM/SIGINT of C (`shim_client`) and Python
/// (cuda-bindings, KeyboardInterrupt path included) offline clients under MPS.
/// `XSHARE_STRESS_RUNS=1000 cargo test -p e2e --test shim_ctrl_c_repeat stress_mixed -- --ignored --nocapture`.
#[test]
#[ignore]
fn stress_mixed_sigterm_sigint_c_and_python() {
    let runs = std::env::var("XSHARE_STRESS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let seed = std::process::id() as u64;
    let pick = move |i: usize| {
        // splitmix64: a different but reproducible (seed printed) mix each run.
        let mut z = seed.wrapping_add((i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (
            z & 1 == 0,
            if z & 2 == 0 {
                libc::SIGINT
            } else {
                libc::SIGTERM
            },
        )
    };
    let t = Instant::now();
    let (clean, fail) = signal_runs(runs, 0, pick);
    eprintln!(
        "mixed C/Python SIGTERM/SIGINT stress (seed {seed}): {clean}/{runs} clean in {:?}; first failure: {fail:?}",
        t.elapsed()
    );
    assert_eq!(fail, None);
}

/// Every kind once, in the normal test run.
#[test]
fn c_and_python_sigterm_sigint_each_release_before_exit() {
    let kinds = [
        (true, libc::SIGINT),
        (true, libc::SIGTERM),
        (false, libc::SIGINT),
        (false, libc::SIGTERM),
    ];
    let (clean, fail) = signal_runs(kinds.len(), 100, |i| kinds[i]);
    assert_eq!(fail, None, "after {clean} clean runs");
}
