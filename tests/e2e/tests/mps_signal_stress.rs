//! Stress tool (issue 8, "Done means"): randomized SIGTERM / SIGINT of C (`shim_client`) and
//! Python (cuda-bindings trainer, `KeyboardInterrupt` path included) offline clients under MPS,
//! each at a random moment of its life (loading, CUDA init, context creation, allocation,
//! launching kernels, or idle), beside a long-lived online neighbour on the same MPS server
//! (the emulated control daemon running). Counts hung neighbours: runs after which the
//! neighbour could not complete a kernel, because the offline client died with its context
//! live (the emulator's MPS model hangs the server then, as real MPS does).
//!
//! Not a timed test, `#[ignore]`d; the figure goes in the notes:
//! `XSHARE_STRESS_RUNS=1000 cargo test -p e2e --test mps_signal_stress -- --ignored --nocapture`
//! (`XSHARE_STRESS_SEED` replays a mix; `XSHARE_STRESS_SIGKILL=1` is the control run: SIGKILL,
//! which no process can handle, so the tool must count hung neighbours there;
//! `XSHARE_STRESS_ONLY=c|python` and `XSHARE_STRESS_WINDOW_US` narrow the mix).
//!
//! On a client that does not exit or a neighbour that hangs, the tool prints everything needed
//! to diagnose it without a re-run (before killing anything): seed, run index, moment, the
//! process's and each thread's state, wchan, kernel stack where readable and signal masks
//! (`SigPnd`/`SigBlk`/`SigIgn`/`SigCgt`: a signal lost to SIG_IGN shows there), its stdout
//! and stderr, the emulator's MPS status and the MPS control daemon's log.

mod shim_support;

use std::fmt::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use e2e::{python, spawn_kernel_neighbour, EmuHost};
use shim_support::*;

#[derive(Default, Debug)]
struct Tally {
    runs: usize,
    python: usize,
    sigint: usize,
    before_ready: usize,
    /// Signalled while holding an MPS context (checked on the device just before).
    with_context: usize,
    keyboard_interrupt: usize,
    python_exit_codes: usize,
    hung_neighbours: usize,
    poisoned: usize,
    client_hung: usize,
    /// Python clients whose first Ctrl-C CPython itself swallowed at start-up (signalled again).
    resignalled: usize,
}

/// What CPython prints when it reports a KeyboardInterrupt and carries on: landing while it
/// checks `sys.path[0]` at start-up (Modules/main.c, `pymain_get_importer`) or inside a callback
/// whose exceptions it only reports (an import's module-lock weakref callback: "Exception
/// ignored in: <function _get_module_lock.<locals>.cb ...>"), or while `site` runs a `.pth`
/// file's import line, where the KeyboardInterrupt can come out as another exception (a
/// `RuntimeError` from `__set_name__`) that `site` reports ("Error processing line ... of
/// ....pth", "Remainder of file ignored") and skips (seed 1796014563807817655 run 950, SIGINT
/// at 41 ms). That Ctrl-C is lost with or without the shim; the script then runs on. Each entry
/// is what stderr must all contain.
const CPYTHON_SWALLOWED: [&[&str]; 3] = [
    &["Failed checking if argv[0] is an import path entry"],
    &["Exception ignored in"],
    &["KeyboardInterrupt", "Remainder of file ignored"],
];

/// `/proc/<pid>/<name>` trimmed, or why it could not be read.
fn proc_file(pid: u32, name: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/{name}"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_else(|e| format!("<{name}: {e}>"))
}

/// The state, signal masks, wchan and kernel stack of `pid` and of each of its threads.
fn proc_report(pid: u32) -> String {
    let mut r = String::new();
    let status = proc_file(pid, "status");
    let keep = ["Name:", "State:", "Threads:", "SigQ:", "SigPnd:", "ShdPnd:", "SigBlk:", "SigIgn:", "SigCgt:"];
    let lines: Vec<&str> = status.lines().filter(|l| keep.iter().any(|k| l.starts_with(k))).collect();
    let _ = writeln!(r, "process {pid}: {}", if lines.is_empty() { status.clone() } else { lines.join(" | ") });
    let _ = writeln!(r, "  cmdline: {}", proc_file(pid, "cmdline").replace('\0', " "));
    let mut tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    tids.sort_unstable();
    for tid in tids {
        let t = format!("task/{tid}");
        let st = proc_file(pid, &format!("{t}/status"));
        let pick = |k: &str| st.lines().find(|l| l.starts_with(k)).map_or("?", |l| l[k.len()..].trim());
        let _ = writeln!(
            r,
            "  thread {tid} {:?}: state {} wchan {} SigPnd {} SigBlk {} syscall {}",
            proc_file(pid, &format!("{t}/comm")),
            pick("State:"),
            proc_file(pid, &format!("{t}/wchan")),
            pick("SigPnd:"),
            pick("SigBlk:"),
            proc_file(pid, &format!("{t}/syscall")),
        );
        let stack = proc_file(pid, &format!("{t}/stack"));
        for l in stack.lines() {
            let _ = writeln!(r, "    {l}");
        }
    }
    r
}

/// Everything about a stuck process and the MPS around it, for the tool's output.
fn diagnose(host: &EmuHost, dev: &e2e::emu_device::Device, who: &str, child: &e2e::EmuChild) -> String {
    let mut r = format!("---- {who} ----\n{}", proc_report(child.pid()));
    let _ = writeln!(r, "  stdout:\n{}", child.stdout());
    let _ = writeln!(r, "  stderr:\n{}", child.stderr());
    let _ = writeln!(r, "  emulator MPS status: {:?}", dev.mps_status());
    let mut logs: Vec<_> = std::fs::read_dir(host.log_dir())
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    logs.sort();
    for p in logs {
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| format!("<{e}>"));
        // The tail: the daemon's log grows with every client of the run.
        let tail: Vec<&str> = text.lines().rev().take(60).collect();
        let _ = writeln!(r, "  {} (last {} lines):", p.display(), tail.len());
        for l in tail.into_iter().rev() {
            let _ = writeln!(r, "    {l}");
        }
    }
    r
}

/// A fresh MPS neighbour for the runs from `i` on; panics with a diagnosis if it never gets
/// ready.
fn neighbour(host: &EmuHost, dev: &e2e::emu_device::Device, runs: usize, seed: u64, i: usize) -> e2e::EmuChild {
    let started = Instant::now();
    let mut b = spawn_kernel_neighbour(host, runs);
    if b.wait_for_line("ready", e2e::T).is_none() {
        panic!(
            "run {i} (seed {seed}): neighbour not ready after {:?}\n{}",
            started.elapsed(),
            diagnose(host, dev, "neighbour", &b)
        );
    }
    b
}

#[test]
#[ignore = "stress tool; run by hand"]
fn stress_random_sigterm_sigint_c_and_python_under_mps() {
    let runs: usize = e2e::env_or("XSHARE_STRESS_RUNS", 1000);
    let seed = e2e::seed_from_env("XSHARE_STRESS_SEED");
    // Control run: SIGKILL instead (no release possible), to see the tool count hangs.
    let control_kill = std::env::var_os("XSHARE_STRESS_SIGKILL").is_some();
    // Narrowing knobs: one kind of client (`c` | `python`), and the moment window in µs.
    let only = std::env::var("XSHARE_STRESS_ONLY").ok();
    let window_us: Option<u64> = std::env::var("XSHARE_STRESS_WINDOW_US")
        .ok()
        .and_then(|v| v.parse().ok());
    let mut rng = e2e::XorShift(seed);
    let host = EmuHost::new();
    let dev = host.device();
    host.mps_control(Some("-d"), "");
    let py = python();
    let mut b = neighbour(&host, &dev, runs, seed, 0);
    let mut done_by_b = 0;
    let mut tally = Tally::default();
    let started = Instant::now();
    for i in 0..runs {
        let is_py = match only.as_deref() {
            Some("c") => false,
            Some("python") => true,
            _ => rng.next_u64().is_multiple_of(2),
        };
        let sig = if control_kill {
            libc::SIGKILL
        } else if rng.next_u64().is_multiple_of(2) {
            libc::SIGINT
        } else {
            libc::SIGTERM
        };
        // A random moment: Python takes a few hundred ms to reach `ready` (interpreter,
        // cuda-bindings import, cuInit, primary context, cuMemAlloc), the C client a few ms
        // before it launches 200 kernels; the window covers all of that and some idle time.
        let window_us = window_us.unwrap_or(if is_py { 900_000 } else { 60_000 });
        let delay = Duration::from_micros(rng.next_u64() % window_us);
        let mut c = offline_victim(
            &host,
            is_py.then_some(py.as_path()),
            &["ctx", "alloc", "1048576", "ready", "launch", "4", "100000", "200", "hang"],
        );
        let mut client = host.spawn(&mut c);
        std::thread::sleep(delay);
        let ready = !client.lines("ready").is_empty();
        let pid = client.pid();
        let with_context = dev
            .snapshot()
            .processes
            .iter()
            .any(|p| p.pid == pid && p.mps_client && p.contexts > 0);
        client.signal(sig);
        let signalled = Instant::now();
        tally.with_context += usize::from(with_context);
        tally.runs += 1;
        tally.python += usize::from(is_py);
        tally.sigint += usize::from(sig == libc::SIGINT);
        tally.before_ready += usize::from(!ready);
        let mut st = client.wait_timeout(Duration::from_secs(5));
        if st.is_none() && is_py && CPYTHON_SWALLOWED.iter().any(|all| all.iter().all(|m| client.stderr().contains(m))) {
            // CPython lost this Ctrl-C itself: press it again once the script runs, as a user
            // would (seed 1795441176492600853 run 77, SIGINT at 93 ms; seed
            // 1795441877926939867 run 444, SIGINT at 57 ms).
            tally.resignalled += 1;
            let _ = client.wait_for_line("ready", T);
            client.signal(sig);
        }
        if st.is_none() {
            st = client.wait_timeout(T);
        }
        let Some(st) = st else {
            tally.client_hung += 1;
            eprintln!(
                "run {i} (seed {seed}): client (python {is_py}, signal {sig}, {delay:?}, ready {ready}, with context {with_context}) did not exit within {:?} of the signal\n{}\n---- neighbour ----\n{}",
                signalled.elapsed(),
                diagnose(&host, &dev, "client", &client),
                proc_report(b.pid()),
            );
            client.kill9();
            // SIGKILL of a process holding an MPS context hangs the server (as on real MPS):
            // start over with a fresh server and neighbour, as after a hung neighbour.
            host.mps_control(None, "quit\n");
            host.mps_control(Some("-d"), "");
            b = neighbour(&host, &dev, runs - i, seed, i);
            done_by_b = 0;
            continue;
        };
        let err = client.stderr();
        if err.contains("KeyboardInterrupt") {
            tally.keyboard_interrupt += 1;
        }
        // Whatever the moment, the process ends by the signal (default action kept) or, on
        // Python's KeyboardInterrupt path, with CPython's own exit (re-raised SIGINT, 130, or
        // 1 when the interrupt lands while the interpreter is still starting up).
        let by_signal = st.signal() == Some(sig);
        let python_exit = is_py && sig == libc::SIGINT && err.contains("KeyboardInterrupt");
        assert!(
            by_signal || python_exit,
            "run {i} (seed {seed}, python {is_py}, signal {sig}, {delay:?}): {st:?} after {:?}\n{err}",
            signalled.elapsed()
        );
        if !by_signal {
            tally.python_exit_codes += 1;
        }
        // Let the emulator notice the death (it reaps on state access every 20 ms).
        for _ in 0..6 {
            std::thread::sleep(Duration::from_millis(10));
            dev.mps_status();
        }
        let poisoned = dev.mps_status().poisoned;
        b.send_line("go");
        let t = Instant::now();
        let mut hung = false;
        while b.lines("spin=").len() <= done_by_b {
            if t.elapsed() > Duration::from_secs(5) {
                hung = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if poisoned || hung {
            tally.poisoned += usize::from(poisoned);
            tally.hung_neighbours += 1;
            eprintln!(
                "run {i} (seed {seed}): neighbour hung (python {is_py}, signal {sig}, {delay:?}, ready {ready}, with context {with_context}, poisoned {poisoned}); client stderr:\n{err}\n{}",
                diagnose(&host, &dev, "neighbour", &b)
            );
            // Reset MPS and carry on counting with a fresh neighbour.
            host.mps_control(None, "quit\n");
            host.mps_control(Some("-d"), "");
            b = neighbour(&host, &dev, runs - i, seed, i);
            done_by_b = 0;
            continue;
        }
        done_by_b += 1;
        if i % 50 == 49 {
            eprintln!("{} runs, {:?}: {tally:?}", i + 1, started.elapsed());
        }
    }
    eprintln!(
        "randomized SIGTERM/SIGINT of C and Python offline clients under MPS (seed {seed}): {} runs in {:?}; {tally:?}",
        tally.runs,
        started.elapsed()
    );
    host.mps_control(None, "quit\n");
    assert_eq!(tally.hung_neighbours, 0, "seed {seed}: {tally:?}");
    assert_eq!(tally.client_hung, 0, "seed {seed}: {tally:?}");
}
