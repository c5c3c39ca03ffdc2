//! Graceful exit end to end: an offline client terminated by SIGTERM/SIGINT mid-training under
//! MPS never hangs its neighbour when the shim is preloaded; without the shim the emulator's
//! MPS model hangs the neighbour (the control run).

mod shim_support;

use std::time::Duration;

use e2e::{ctrl_c_trainer, field, kernel_neighbour, EmuChild, EmuHost};
use e2e::python;
use shim_support::*;

/// How long to wait for the neighbour's kernel: long when it is expected to run (a loaded
/// machine must not fail the test), short when a hang is expected (the control run).
fn patience(expect_run: bool) -> Duration {
    if expect_run {
        Duration::from_secs(20)
    } else {
        Duration::from_secs(2)
    }
}

/// A ready MPS neighbour that runs one kernel when told.
fn neighbour(host: &EmuHost) -> EmuChild {
    kernel_neighbour(host, 1)
}

/// Once a victim is gone: lets the emulator notice the death (it reaps dead clients on its
/// next state access after its reap period), then tells neighbour `b` to run its kernel.
/// Returns whether the kernel ran; if not, the hung MPS server is quit.
fn neighbour_runs_after_the_death(dev: &e2e::emu_device::Device, b: &mut EmuChild, expect_run: bool) -> bool {
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(50));
        dev.mps_status();
    }
    b.send_line("go");
    b.wait_for_line("spin=", patience(expect_run))
        .is_some_and(|l| field(&l, "spin") == Some("0"))
}

fn training_victim(host: &EmuHost, shimmed: bool) -> EmuChild {
    let args = ["ctx", "ready", "launch", "40", "1000000", "1000000"];
    let mut c = if shimmed {
        limited(host, "shim_client", 1 << 30, "victim")
    } else {
        unlimited(host, "shim_client")
    };
    let mut v = host.spawn(c.args(args));
    v.wait_for_line("ready", T).expect("victim ready");
    std::thread::sleep(Duration::from_millis(300));
    v
}

/// Sends `sig` to a training victim; returns whether the neighbour could still run a kernel.
fn neighbour_survives(shimmed: bool, sig: i32) -> (bool, String) {
    let host = EmuHost::new();
    let dev = host.device();
    host.start_mps();
    let mut victim = training_victim(&host, shimmed);
    let mut b = neighbour(&host);
    victim.signal(sig);
    let st = victim.wait_timeout(T).expect("victim exits on the signal");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        st.signal(),
        Some(sig),
        "the default action still happens: {st:?}"
    );
    let ran = neighbour_runs_after_the_death(&dev, &mut b, shimmed);
    let status = format!("{:?} victim stderr: {}", dev.mps_status(), victim.stderr());
    if !ran {
        host.quit_mps();
    }
    (ran, status)
}

#[test]
fn sigterm_under_mps_hangs_nobody_with_the_shim() {
    let (ran, st) = neighbour_survives(true, libc::SIGTERM);
    assert!(
        ran,
        "neighbour must run after the shimmed victim's SIGTERM: {st}"
    );
    assert!(st.contains("poisoned: false"), "{st}");
}

#[test]
fn sigint_under_mps_hangs_nobody_with_the_shim() {
    let (ran, st) = neighbour_survives(true, libc::SIGINT);
    assert!(
        ran,
        "neighbour must run after the shimmed victim's SIGINT: {st}"
    );
}

#[test]
fn sigterm_without_the_shim_hangs_the_neighbour() {
    let (ran, st) = neighbour_survives(false, libc::SIGTERM);
    assert!(
        !ran,
        "control: the emulator's MPS model must hang the neighbour: {st}"
    );
    assert!(st.contains("poisoned: true"), "{st}");
}

#[test]
fn application_handler_still_checkpoints_and_nobody_hangs() {
    let host = EmuHost::new();
    let dev = host.device();
    host.start_mps();
    let ckpt = host.root().join("ckpt.bin");
    let mut c = limited(&host, "offline", 1 << 30, "trainer");
    c.args([
        "--kernel-us",
        "5000",
        "--state-mb",
        "4",
        "--report-interval",
        "0.1",
        "--json",
        "--checkpoint",
    ])
    .arg(&ckpt);
    let mut trainer = host.spawn(&mut c);
    assert!(
        trainer.wait_for_line("{", T).is_some(),
        "trainer progress: {}",
        trainer.stderr()
    );
    let mut b = neighbour(&host);
    trainer.signal(libc::SIGTERM);
    let st = trainer.wait_timeout(T).expect("trainer exits");
    assert!(
        st.success(),
        "the application's own handler ran and it exited cleanly: {st:?} {}",
        trainer.stderr()
    );
    let out = trainer.stdout();
    let fin = out
        .lines()
        .find(|l| l.contains("\"final\":true"))
        .unwrap_or_else(|| panic!("summary: {out}"));
    assert!(
        fin.contains(&format!("\"signal\":{}", libc::SIGTERM)),
        "{fin}"
    );
    assert_eq!(
        std::fs::metadata(&ckpt).expect("checkpoint written").len(),
        4 << 20
    );
    b.send_line("go");
    let l = b
        .wait_for_line("spin=", patience(true))
        .expect("neighbour runs");
    assert_eq!(field(&l, "spin"), Some("0"));
    assert!(!dev.mps_status().poisoned);
}

/// An unmodified Python trainer ([`ctrl_c_trainer`]) holding a primary context, stopped with
/// Ctrl-C: Python's own SIGINT handling (KeyboardInterrupt, then re-killing itself with SIGINT)
/// runs, and with the shim the context is released before the process is gone.
fn python_ctrl_c(shimmed: bool) -> (bool, String) {
    let host = EmuHost::new();
    let dev = host.device();
    host.start_mps();
    let py = python();
    assert!(
        py.exists(),
        "{} not found: run scripts/setup-test-env.sh or set XSHARE_PYTHON",
        py.display()
    );
    let mut c = if shimmed {
        limited(&host, py.to_str().unwrap(), 1 << 30, "py")
    } else {
        unlimited(&host, py.to_str().unwrap())
    };
    c.arg(ctrl_c_trainer());
    let mut trainer = host.spawn(&mut c);
    trainer
        .wait_for_line("ready", T)
        .unwrap_or_else(|| panic!("python trainer: {}", trainer.stderr()));
    let mut b = neighbour(&host);
    trainer.signal(libc::SIGINT);
    trainer.wait_timeout(T).expect("python exits on Ctrl-C");
    let ran = neighbour_runs_after_the_death(&dev, &mut b, shimmed);
    let status = format!(
        "{:?}; python stderr: {}",
        dev.mps_status(),
        trainer.stderr()
    );
    if !ran {
        host.quit_mps();
    }
    (ran, status)
}

#[test]
fn python_trainer_stopped_with_ctrl_c_hangs_nobody_with_the_shim() {
    let (ran, st) = python_ctrl_c(true);
    assert!(ran, "neighbour must run: {st}");
    assert!(
        st.contains("KeyboardInterrupt"),
        "Python's own handler ran: {st}"
    );
    let (ran, st) = python_ctrl_c(false);
    assert!(
        !ran,
        "control without the shim: the dead Python client hangs MPS: {st}"
    );
}

#[test]
fn sigterm_with_a_hung_mps_server_still_ends_the_process() {
    let host = EmuHost::new();
    let dev = host.device();
    host.start_mps();
    let cfg = host.root().join("xcuda.json");
    std::fs::write(&cfg, r#"{"exit": {"release_timeout_ms": 300}}"#).unwrap();
    let mut c = limited(&host, "shim_client", 1 << 30, "hung");
    c.env("XCUDA_CONFIG", &cfg)
        .args(["ctx", "ready", "wait", "launch", "1", "1000", "1", "ready"]);
    let mut shimmed = host.spawn(&mut c);
    shimmed.wait_for_line("ready", T).expect("ready");
    // Another client dies holding a context: the MPS server hangs every client.
    let mut culprit = host.client(&["ctx", "ready", "hang"]);
    culprit.wait_for_line("ready", T).expect("culprit ready");
    culprit.kill9();
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(50));
        dev.mps_status();
    }
    assert!(dev.mps_status().poisoned);
    shimmed.send_line("go");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        shimmed.lines("launch=").is_empty(),
        "the shimmed client is stuck in the hung server"
    );
    shimmed.signal(libc::SIGTERM);
    let st = shimmed.wait_timeout(T).unwrap_or_else(|| {
        panic!(
            "a hung driver must not keep the process alive: {}",
            shimmed.stderr()
        )
    });
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(libc::SIGTERM));
    assert!(
        shimmed.stderr().contains("gave up waiting"),
        "{}",
        shimmed.stderr()
    );
    host.quit_mps();
}

/// An application that exits on the first driver call failing after the signal helper's release
/// (a C client's `exit(2)`) still ends by the signal, as it would without the shim: the exit
/// path takes the signal's default action once the release is done. The helper's re-raise is
/// delayed (test hook) so the application's exit always comes first; without the exit path's
/// check the process ends with status 2 (seen in the 1000-run signal stress).
#[test]
fn an_exit_racing_the_signal_helper_still_ends_by_the_signal() {
    use std::os::unix::process::ExitStatusExt;
    let host = EmuHost::new();
    let cfg = host.root().join("xcuda-raise-delay.json");
    std::fs::write(&cfg, r#"{"exit": {"test_raise_delay_ms": 2000}}"#).unwrap();
    let mut c = limited(&host, "shim_client", 1 << 30, "racer");
    c.env("XCUDA_CONFIG", &cfg)
        .args(["primary", "ready", "churn", "1048576"]);
    let mut v = host.spawn(&mut c);
    v.wait_for_line("ready", T).expect("client ready");
    std::thread::sleep(Duration::from_millis(100));
    v.signal(libc::SIGTERM);
    let st = v.wait_timeout(T).expect("client exits");
    let out = v.stdout();
    assert!(
        out.contains("fatal=churn"),
        "the application saw a failed call and exited first: {out} {}",
        v.stderr()
    );
    assert_eq!(
        st.signal(),
        Some(libc::SIGTERM),
        "ended by the signal, not the application's status: {st:?} {}",
        v.stderr()
    );
}

/// An application that handles SIGTERM itself and is capturing a graph when the signal comes
/// (a trainer at a `torch.cuda.graph` warm-up), run as an offline container runs it: the
/// shim's synchronisation waits for the capture to end instead of breaking it (CUDA forbids
/// synchronising a context while a stream of it captures: the call is refused and the capture
/// invalidated), and the launches recorded into the capture pass the frozen throttle, so the
/// capture ends, its graph runs and the application's handler runs. Before, the capture ended
/// with `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` (901).
#[test]
fn a_sigterm_during_a_graph_capture_leaves_the_capture_whole() {
    let host = host_for_users();
    let _ledger = ledger(&host);
    // A capture of its own graph, one into a graph made first (cuStreamBeginCaptureToGraph),
    // and one begun through the CUDA 10.0 entry point (`cuStreamBeginCapture`, no mode).
    for to_graph in ["0", "1", "2"] {
        let mut c = limited(&host, "shim_client", 1 << 30, "capturer");
        as_nobody(&mut c).args(["primary", "capturesig", "30", to_graph]);
        let mut v = host.spawn(&mut c);
        v.wait_for_line("capturing", T).unwrap_or_else(|| panic!("{} {}", v.stdout(), v.stderr()));
        std::thread::sleep(Duration::from_millis(100));
        v.signal(libc::SIGTERM);
        let line = v.wait_for_line("capturesig", T).unwrap_or_else(|| panic!("{} {}", v.stdout(), v.stderr()));
        assert_eq!(line, "capturesig end=0 launch=0 handled=1", "to graph: {to_graph}; {}", v.stderr());
        let st = v.wait_timeout(T).expect("client exits");
        assert!(st.success(), "{st:?} {}", v.stderr());
    }
}

/// A capture its context's destruction ended (`cuCtxDestroy` mid-capture: the driver drops the
/// capture, no `cuStreamEndCapture` comes) is no longer counted: a SIGTERM then releases at
/// once. Before, the release's synchronisation waited `exit.capture_wait_ms` for a capture
/// that no longer existed, said at WARN (read here; no time is measured).
#[test]
fn a_capture_that_ended_with_its_context_is_not_waited_for() {
    use std::os::unix::process::ExitStatusExt;
    let host = host_for_users();
    let _ledger = ledger(&host);
    let mut c = limited(&host, "shim_client", 1 << 30, "capturer");
    as_nobody(&mut c).args(["ctx", "capturebegin", "destroy", "ready", "hang"]);
    let mut v = host.spawn(&mut c);
    v.wait_for_line("ready", T).unwrap_or_else(|| panic!("{} {}", v.stdout(), v.stderr()));
    assert!(v.stdout().contains("capturebegin=0"), "{}", v.stdout());
    v.signal(libc::SIGTERM);
    let st = v.wait_timeout(T).expect("client exits");
    assert_eq!(st.signal(), Some(libc::SIGTERM), "{}", v.stderr());
    let err = v.stderr();
    assert!(err.contains("stream captures ended with their context"), "{err}");
    assert!(!err.contains("a stream capture is still in progress"), "{err}");
}

/// The drain before the kubelet's SIGKILL, and its way back when no kill comes: a shimmed
/// trainer that ignores SIGTERM, told a 1.5 s grace with a 1 s margin (`XCUDA_KILL_GRACE_MS`,
/// `XCUDA_DRAIN_BEFORE_KILL_MS`), stops launching once drained (at most the iteration in
/// flight then completes), and 10 s after the kill it expected resumes (the SIGTERM was not the
/// kubelet's). Then the pod is deleted for real: the drain arms again (it stayed armed after
/// the resume, and the deletion was ignored: a mid-kernel SIGKILL). Counts of iterations and
/// log lines, never times: the freeze holds however slow the machine.
#[test]
fn a_drained_trainer_stops_launching_and_resumes_when_no_kill_comes() {
    let host = EmuHost::new();
    let (mut trainer, file) = trainer_with_termination_file(&host, "1500", &["--ignore-sigterm"]);
    let wait_log = |t: &EmuChild, what: &str, n: usize| {
        let end = std::time::Instant::now() + Duration::from_secs(60);
        while t.stderr().matches(what).count() < n {
            assert!(std::time::Instant::now() < end, "no {n} `{what}` in the shim's log: {}", t.stderr());
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    trainer.signal(libc::SIGTERM);
    wait_log(&trainer, "GPU drained", 1);
    let at_drain = iterations(&trainer);
    std::thread::sleep(Duration::from_millis(1500));
    let later = iterations(&trainer);
    assert!(trainer.alive(), "SIGTERM ignored: {}", trainer.stderr());
    assert!(later <= at_drain + 1, "launches stopped once drained: {at_drain} -> {later} iterations");
    wait_log(&trainer, "the expected SIGKILL did not come: launches resume", 1);
    let end = std::time::Instant::now() + Duration::from_secs(60);
    while iterations(&trainer) <= later + 1 {
        assert!(std::time::Instant::now() < end, "iterations again after the resume: {}", trainer.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    // The kubelet's deletion, later: drained again, by it.
    write_deletion(&file, 3000, 3000);
    wait_log(&trainer, "GPU drained", 2);
    assert!(trainer.alive(), "{}", trainer.stderr());
    trainer.signal(libc::SIGKILL);
    assert!(trainer.wait_timeout(T).is_some(), "killed");
}

/// The most iterations `t` has reported.
fn iterations(t: &EmuChild) -> u64 {
    t.lines("{").iter().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).filter_map(|v| v["iterations"].as_u64()).max().unwrap_or(0)
}

/// A shimmed trainer of a pod whose termination file (`XCUDA_TERMINATION_FILE`, created empty
/// as Allocate makes it) is returned beside it, told a grace of `grace_ms` with a 1 s margin,
/// making progress; `extra` are its further arguments.
fn trainer_with_termination_file(host: &EmuHost, grace_ms: &str, extra: &[&str]) -> (EmuChild, std::path::PathBuf) {
    let file = host.path("termination");
    node_ledger::termination::create(&file).unwrap();
    let mut c = limited(host, "offline", 1 << 30, "trainer");
    c.env("XCUDA_KILL_GRACE_MS", grace_ms).env("XCUDA_DRAIN_BEFORE_KILL_MS", "1000").env("XCUDA_TERMINATION_FILE", &file);
    c.args(["--kernel-us", "5000", "--state-mb", "1", "--report-interval", "0.1", "--json"]).args(extra);
    let mut trainer = host.spawn(&mut c);
    assert!(trainer.wait_for_line("{", T).is_some(), "trainer progress: {}", trainer.stderr());
    (trainer, file)
}

/// Writes, as node-agent does, a deletion ending `in_ms` from now with a grace of `grace_ms`.
fn write_deletion(file: &std::path::Path, in_ms: u64, grace_ms: u64) {
    let unix_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let t = node_ledger::termination::Termination { deletion_unix_ms: unix_ms + in_ms, grace_ms };
    assert!(node_ledger::termination::write(file, &t).unwrap());
}

/// Waits (a minute at most) until `trainer` says its GPU was drained, then SIGKILLs it as the
/// kubelet would; returns its log.
fn drained_then_killed(trainer: &mut EmuChild, what: &str) -> String {
    e2e::wait_until(what, Duration::from_secs(60), || trainer.stderr().contains("GPU drained").then_some(()));
    let log = trainer.stderr();
    assert!(trainer.alive(), "{log}");
    trainer.signal(libc::SIGKILL);
    assert!(trainer.wait_timeout(T).is_some(), "killed");
    log
}

/// A deletion with a shorter grace than the pod's (`kubectl delete --grace-period=3`): the
/// trainer, told a 10-minute grace (`XCUDA_KILL_GRACE_MS`), ignores its SIGTERM; node-agent
/// then writes the deletion into the pod's termination file (`XCUDA_TERMINATION_FILE`, written
/// here as node-agent writes it, a moment after the SIGTERM as its watch would), and the shim
/// drains by it, before the 3 s kill, instead of 10 minutes on. Without the file's reading no
/// drain comes within the test's minute.
#[test]
fn a_shortened_deletion_grace_brings_the_drain_forward() {
    let host = EmuHost::new();
    let (mut trainer, file) = trainer_with_termination_file(&host, "600000", &["--ignore-sigterm"]);
    trainer.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    write_deletion(&file, 2700, 3000);
    let log = drained_then_killed(&mut trainer, "the drain by the termination file");
    assert!(log.contains("the pod is being deleted or evicted"), "the reading is said: {log}");
}

/// A process that no SIGTERM reaches (behind a PID 1 that does not forward it, or under
/// another `STOPSIGNAL`) still drains before the kubelet's SIGKILL: node-agent writes the pod's
/// deletion into its termination file and the shim's housekeeping sees it. Without that watch
/// nothing arms the drain: no `GPU drained` within the test's minute.
#[test]
fn a_deletion_seen_in_the_termination_file_drains_without_a_sigterm() {
    let host = EmuHost::new();
    let (mut trainer, file) = trainer_with_termination_file(&host, "30000", &[]);
    std::thread::sleep(Duration::from_millis(600));
    assert!(!trainer.stderr().contains("GPU drained"), "no deletion yet, no drain: {}", trainer.stderr());
    write_deletion(&file, 3000, 3000);
    let log = drained_then_killed(&mut trainer, "the drain by the deletion alone");
    assert!(log.contains("armed_by=\"the pod's termination file\"") || log.contains("armed_by=the pod's termination file"), "armed by the file: {log}");
}

/// A deletion that gives more time than the pod's spec (`kubectl drain --grace-period=8` of a
/// pod with a 3 s spec grace): the kubelet kills by the deletion's grace, so the shim drains by
/// it, not 3 s after the SIGTERM, and once a deletion is recorded it never takes the kill's
/// lateness for a wrong guess: launches stay stopped past the expected kill and its 10 s.
/// Before, the spec's earlier kill drained at once and launches resumed 10 s later, before the
/// kubelet's SIGKILL. Counts and log lines, with seconds of slack on each side.
#[test]
fn a_deletion_grace_longer_than_the_specs_is_drained_by_and_never_resumed() {
    let host = EmuHost::new();
    let (mut trainer, file) = trainer_with_termination_file(&host, "3000", &["--ignore-sigterm"]);
    write_deletion(&file, 8000, 8000);
    trainer.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(4000));
    assert!(!trainer.stderr().contains("GPU drained"), "drained by the spec's 3 s, not the deletion's 8 s: {}", trainer.stderr());
    e2e::wait_until("the drain by the deletion", Duration::from_secs(60), || trainer.stderr().contains("GPU drained").then_some(()));
    let at_drain = iterations(&trainer);
    // Past the expected kill (8 s) and the 10 s after it that a guess from the spec waits.
    std::thread::sleep(Duration::from_millis(12_000));
    let log = trainer.stderr();
    assert!(!log.contains("launches resume"), "a recorded deletion's kill is certain: {log}");
    assert!(iterations(&trainer) <= at_drain + 1, "launches stay stopped: {log}");
    assert!(trainer.alive(), "{log}");
    trainer.signal(libc::SIGKILL);
    assert!(trainer.wait_timeout(T).is_some(), "killed");
}
