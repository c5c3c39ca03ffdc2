//! The MPS manager restarted as systemd (Restart=always) and operators restart it: SIGKILLed
//! (OOM killer) in steady state or in the middle of a recovery, stopped with SIGTERM for an
//! upgrade, and started while another manager of the same GPU runs. The emulated host runs the
//! real `mps-manager` binary against the emulator's `nvidia-cuda-mps-control`. Every test
//! asserts the mechanism (which daemon, which MPS generation, which pids, which log lines),
//! never a latency.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use e2e::{artifact, register, EmuChild, EmuHost, Load};
use serde_json::Value;

const T: Duration = Duration::from_secs(20);
/// Bound for the online client's progress once the restarted manager recovered MPS (generous:
/// the machine is a noisy 2-core VM; the assertion is that progress comes, not how fast).
const PROGRESS: Duration = Duration::from_secs(15);

/// Not a test: the entry point of helper processes the tests spawn (`spawn_helper`).
#[test]
#[ignore = "helper-process entry point, run by the other tests"]
fn helper_entry() {
    e2e::helper_main();
}

/// The config of `mps_manager_emu.rs` (e2e::fast_manager_config), with `quit_on_exit` as given.
fn manager_config(quit_on_exit: bool) -> String {
    e2e::fast_manager_config(Some(quit_on_exit))
}

/// `mps-manager run` with config `mps.json` (written on the first start, kept on restarts),
/// its log appended to `mps.json.log` across restarts.
fn start_manager(n: &EmuHost, quit_on_exit: bool) -> EmuChild {
    n.start_manager("mps.json", &manager_config(quit_on_exit))
}

fn mstate(n: &EmuHost, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    n.wait_manager_state(T, "mps.json", what, pred)
}

/// The state file as written by the manager with pid `pid` (a restarted manager starts from
/// an empty state: the file of the killed one must not be taken for the new one's).
fn mstate_of(n: &EmuHost, pid: u32, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    mstate(n, what, |v| v["manager_pid"] == pid && pred(v))
}

fn wait_until(what: &str, limit: Duration, f: impl Fn() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A helper process holding `mib` MiB on MPS, registered in `ledger` as offline with them.
fn offline_on_mps(n: &EmuHost, ledger: &node_ledger::Ledger, mib: u64) -> EmuChild {
    let off = n.spawn_helper_offline("gpu-mem", &mib.to_string());
    let (dev, pid) = (n.device(), off.pid());
    wait_until("offline client on MPS", T, || {
        dev.snapshot()
            .processes
            .iter()
            .any(|p| p.pid == pid && p.mps_client)
    });
    register(ledger, pid, mib << 20);
    off
}

/// Waits until the online client completes 20 more kernels (within [`PROGRESS`]).
fn online_progresses(load: &Load, what: &str) {
    let after = load.kernels.load(Ordering::Relaxed);
    wait_until(what, PROGRESS, || {
        load.kernels.load(Ordering::Relaxed) >= after + 20
    });
}

/// The daemon a state file names, as (pid, start time).
fn daemon_of(v: &Value) -> (u64, u64) {
    (
        v["daemon_pid"].as_u64().expect("daemon_pid"),
        v["daemon_start_time"].as_u64().expect("daemon_start_time"),
    )
}

/// Occurrences of `needle` in the manager's log (all its runs: the log is appended).
fn log_count(n: &EmuHost, needle: &str) -> usize {
    n.log("mps.json").matches(needle).count()
}

/// On a panic, quits MPS on the device so a hung online `Load` can be joined (no hanging test).
struct QuitOnPanic(e2e::emu_device::Device);

impl Drop for QuitOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.mps_quit();
        }
    }
}

/// The manager stopped by `sig` and started again while an online and an offline client run
/// on MPS: the new manager adopts the running control daemon (same pid and start time in its
/// state file, no `-d`, MPS generation unchanged, no quit, no reset), the online client keeps
/// its context and progresses, the offline one keeps running on MPS, and the new manager
/// publishes the budget in the status file again (a sentinel written while no manager ran is
/// replaced, the status file names the new manager).
fn restart_keeps_mps_and_clients(sig: i32) {
    let n = EmuHost::node();
    let mut m1 = start_manager(&n, false);
    let v = mstate_of(&n, m1.pid(), "daemon started", |v| v["daemon_pid"].is_u64());
    let daemon = daemon_of(&v);
    let ledger = node_ledger::Ledger::open_or_create(&n.ledger_path(), 0).unwrap();
    let dev = n.device();
    let _quit = QuitOnPanic(n.device());
    let load = Load::start(&n, 0.5, 2.0);
    let mut off = offline_on_mps(&n, &ledger, 128);
    let op = off.pid();
    let budget = mstate_of(&n, m1.pid(), "both clients listed, budget published", |v| {
        v["clients"].as_u64() >= Some(2) && v["offline_budget_pct"].is_f64()
    })["offline_budget_pct"]
        .as_f64()
        .unwrap();
    let permille = (budget * 10.0).round() as u32;
    let generation = dev.snapshot().mps.generation;

    m1.signal(sig);
    let st = m1.wait_exit(T).expect("the manager stopped");
    if sig == libc::SIGTERM {
        assert_eq!(st, None, "SIGTERM: a clean exit");
    }
    // The daemon outlives its manager (systemd KillMode=process; quit_on_exit false).
    let snap = dev.snapshot();
    assert!(snap.mps.enabled, "MPS still running without its manager");
    assert_eq!(
        snap.mps.generation, generation,
        "MPS not quit or reset by the stop"
    );
    // While no manager runs: a budget no manager would publish (1000 is above max_pct).
    let status = n.status_writer();
    status.publish_sm_budget(1000);

    let m2 = start_manager(&n, false);
    let v = mstate_of(&n, m2.pid(), "the new manager's state", |v| {
        v["daemon_pid"].is_u64() && v["clients"].as_u64() >= Some(2)
    });
    assert_eq!(
        daemon_of(&v),
        daemon,
        "the running control daemon adopted: {v:#}"
    );
    assert_eq!(v["recoveries"], serde_json::json!([]), "no recovery: {v:#}");
    wait_until("the budget published by the new manager", T, || {
        status
            .read_manager()
            .is_some_and(|s| s.manager_pid == m2.pid() && s.offline_sm_budget_permille == permille)
    });
    online_progresses(&load, "online kernels after the restart");
    let snap = dev.snapshot();
    assert_eq!(snap.mps.generation, generation, "MPS was not started again");
    assert!(
        snap.processes.iter().any(|p| p.pid == op && p.mps_client),
        "the offline client is still on MPS"
    );
    assert!(off.alive(), "the offline client keeps running");
    assert_eq!(
        load.failures.load(Ordering::Relaxed),
        0,
        "the online client never lost its context"
    );
    let log = n.log("mps.json");
    assert_eq!(
        log_count(&n, "MPS control daemon started"),
        1,
        "one daemon start, by the first manager:\n{log}"
    );
    assert!(!log.contains("FULL MPS RESET") && !log.contains("MPS SERVER RESTART"), "{log}");
    assert!(!log.contains("MPS control daemon stopped"), "{log}");
    load.stop();
}

/// The OOM killer's SIGKILL of the manager in steady state, then systemd's restart.
#[test]
fn manager_sigkilled_in_steady_state_restarts_and_adopts_mps_without_disturbing_clients() {
    restart_keeps_mps_and_clients(libc::SIGKILL);
}

/// An upgrade restart (`systemctl restart`: SIGTERM) with `quit_on_exit: false`.
#[test]
fn manager_sigtermed_without_quit_on_exit_restarts_and_adopts_mps_without_disturbing_clients() {
    restart_keeps_mps_and_clients(libc::SIGTERM);
}

/// The opposite setting, for operators to know what it does: with `quit_on_exit: true` (the
/// built-in default and `systemd/examples/mps-manager.json`), SIGTERM quits MPS, so a
/// restart cuts off every client (the online one loses its context) and the new manager
/// starts a new control daemon.
#[test]
fn manager_sigtermed_with_quit_on_exit_quits_mps_and_the_next_one_starts_a_new_daemon() {
    let n = EmuHost::node();
    let mut m1 = start_manager(&n, true);
    let v = mstate_of(&n, m1.pid(), "daemon started", |v| v["daemon_pid"].is_u64());
    let daemon = daemon_of(&v);
    let dev = n.device();
    let generation = dev.snapshot().mps.generation;
    let _quit = QuitOnPanic(n.device());
    let load = Load::start(&n, 0.5, 2.0);
    mstate_of(&n, m1.pid(), "online client listed", |v| {
        v["clients"].as_u64() >= Some(1)
    });
    // node-agent reads this state file: the GPU's offline slots are ready while the daemon
    // runs, and not once the manager has quit it (an offline container would get no context).
    let ready = || node_agent::test_support::mps_ready_gpu0(n.ledger_dir(), &n.manager_state_file());
    assert_eq!(ready(), Ok(()), "the manager's daemon serves");
    m1.signal(libc::SIGTERM);
    assert_eq!(m1.wait_exit(T), Some(None), "a clean exit");
    assert!(!dev.snapshot().mps.enabled, "MPS quit with its manager");
    let left = mstate(&n, "the state the manager left", |v| v["manager_pid"] == m1.pid());
    assert!(left["daemon_pid"].is_null() && left["clients"] == 0, "no daemon left to name: {left:#}");
    let e = ready().unwrap_err();
    assert!(e.contains("no MPS control daemon"), "{e}");
    let m2 = start_manager(&n, true);
    let v = mstate_of(&n, m2.pid(), "a new daemon", |v| v["daemon_pid"].is_u64());
    assert_ne!(daemon_of(&v), daemon, "{v:#}");
    online_progresses(&load, "online kernels on the new MPS");
    assert!(dev.snapshot().mps.generation > generation);
    assert!(
        load.failures.load(Ordering::Relaxed) >= 1,
        "the online client lost its context to the quit"
    );
    assert!(
        load.relaunches.load(Ordering::Relaxed) >= 1,
        "and was served by the new MPS only once relaunched"
    );
    load.stop();
}

/// When a round SIGKILLs the manager.
#[derive(Debug, Clone, Copy)]
enum Kill {
    /// Together with the offline client.
    WithClient,
    /// This many µs after the manager logged the fault.
    AfterFault(u64),
    /// As soon as the control daemon handled `terminate_client` of the dead client.
    AtTerminate,
}

/// The OOM killer's SIGKILL of the manager in the middle of a recovery: an offline client
/// dies holding its context (MPS hangs, as real MPS does, until `terminate_client`), the
/// manager is SIGKILLed at a moment varied per round ([`Kill`]: with the client, µs to ms after
/// its fault line, or between `terminate_client` and its bookkeeping of it), and started again. Each round: the online client progresses again, the dead client is gone from the
/// server, MPS was never reset (same generation, same control daemon, no FULL MPS RESET nor MPS SERVER RESTART), the
/// new manager writes its state file and logs at most the one fault it took over.
#[test]
fn manager_sigkilled_during_a_recovery_restarts_and_finishes_it_without_a_reset() {
    let n = EmuHost::node();
    // The manager's control program: the emulator's, whose reply to `terminate_client` comes
    // 300 ms after the control daemon did it (a loaded machine; under the 1 s command timeout)
    // and is announced by the file `terminated`, so that a round can SIGKILL the manager in
    // the window between the termination and the manager's bookkeeping of it.
    let real = artifact("emu-mps-control");
    let mark = n.path("terminated");
    let slow = n.path("slow-mps-control");
    std::fs::write(
        &slow,
        format!(
            "#!/bin/sh\n[ \"$1\" = -d ] && exec '{real}' \"$@\"\ncmd=$(cat)\n\
             printf '%s\\n' \"$cmd\" | '{real}' \"$@\"\nrc=$?\n\
             case \"$cmd\" in terminate_client*) touch '{mark}'; sleep 0.3;; esac\nexit $rc\n",
            real = real.display(),
            mark = mark.display()
        ),
    )
    .unwrap();
    e2e::chmod(&slow, 0o755);
    std::fs::write(
        n.path("mps.json"),
        manager_config(false).replace(&real.display().to_string(), &slow.display().to_string()),
    )
    .unwrap();
    let mut manager = start_manager(&n, false);
    let v = mstate_of(&n, manager.pid(), "daemon started", |v| {
        v["daemon_pid"].is_u64()
    });
    let daemon = daemon_of(&v);
    let ledger = node_ledger::Ledger::open_or_create(&n.ledger_path(), 0).unwrap();
    let dev = n.device();
    let generation = dev.snapshot().mps.generation;
    let _quit = QuitOnPanic(n.device());
    let load = Load::start(&n, 0.5, 2.0);
    // When the manager is SIGKILLed: with the offline client (before it could see the death),
    // some µs after it logged the fault, or as soon as the control daemon logged the
    // `terminate_client` of the dead client (after the command, before the manager reclaimed
    // the registration: the next manager finds a dead client no server lists).
    let rounds = [
        Kill::WithClient,
        Kill::AfterFault(0),
        Kill::AfterFault(500),
        Kill::AtTerminate,
        Kill::AfterFault(2_000),
        Kill::AfterFault(5_000),
        Kill::AtTerminate,
        Kill::AfterFault(15_000),
        Kill::AfterFault(40_000),
    ];
    for (round, delay) in rounds.into_iter().enumerate() {
        let mut off = offline_on_mps(&n, &ledger, 64);
        let op = off.pid();
        let mp = manager.pid();
        mstate_of(&n, mp, "offline client listed on its server", |v| {
            v["clients"].as_u64() >= Some(2)
        });
        let server = mstate_of(&n, mp, "the offline client's server", |v| {
            v["servers"].as_array().is_some_and(|s| !s.is_empty())
        })["servers"][0]
            .as_u64()
            .unwrap();
        let faults_before = log_count(&n, "MPS fault detected");
        let _ = std::fs::remove_file(&mark);
        off.signal(libc::SIGKILL);
        let _ = off.wait_exit(T);
        match delay {
            Kill::WithClient => {}
            Kill::AfterFault(us) => {
                wait_until("the manager logs the fault", T, || {
                    log_count(&n, "MPS fault detected") > faults_before
                });
                std::thread::sleep(Duration::from_micros(us));
            }
            Kill::AtTerminate => {
                wait_until("the control daemon did terminate_client", T, || {
                    mark.exists()
                });
                let line = format!("TerminateClient {{ server: {server}, client: {op} }}");
                let control_log = n.log_dir().join("control.log");
                let l = std::fs::read_to_string(&control_log).unwrap_or_default();
                assert!(l.contains(&line), "{line} not in the control log:\n{l}");
            }
        }
        manager.signal(libc::SIGKILL);
        let _ = manager.wait_exit(T);
        let log_before = n.log("mps.json").len();
        manager = start_manager(&n, false);
        let mp = manager.pid();
        let what = format!("round {round} (killed {delay:?})");
        mstate_of(&n, mp, &format!("{what}: the new manager's state"), |v| {
            v["daemon_pid"].is_u64()
        });
        wait_until(&format!("{what}: MPS no longer hung"), PROGRESS, || {
            let m = dev.snapshot().mps;
            !m.poisoned && m.dead_clients.is_empty()
        });
        online_progresses(&load, &format!("{what}: online kernels after the restart"));
        // A few checks later (the state file is written after every check).
        let v = mstate_of(&n, mp, &format!("{what}: the state file updated"), |v| {
            v["updated_unix_ms"].as_u64().is_some()
        });
        let t = v["updated_unix_ms"].as_u64().unwrap();
        let v = mstate_of(
            &n,
            mp,
            &format!("{what}: the state file updated again"),
            |v| v["updated_unix_ms"].as_u64() > Some(t + 300),
        );
        let snap = dev.snapshot();
        assert!(
            !snap.processes.iter().any(|p| p.pid == op && p.mps_client),
            "{what}: the dead client is gone from the server"
        );
        assert_eq!(snap.mps.generation, generation, "{what}: MPS never reset");
        assert_eq!(
            daemon_of(&v),
            daemon,
            "{what}: the same control daemon: {v:#}"
        );
        let log = n.log("mps.json");
        let new_log = &log[log_before..];
        assert!(!log.contains("FULL MPS RESET") && !log.contains("MPS SERVER RESTART"), "{what}:\n{log}");
        let errors = new_log.lines().filter(|l| l.contains(" ERROR ")).count();
        assert!(
            errors <= 1,
            "{what}: at most the fault the new manager took over, got {errors} ERROR lines:\n{new_log}"
        );
        if errors == 1 {
            // The new manager finished the recovery: by terminate_client, named in its state.
            let r = v["recoveries"].as_array().and_then(|r| r.last()).cloned();
            assert!(
                r.as_ref()
                    .is_some_and(|r| r["fault"]["client_died"]["pid"] == op
                        && r["outcome"]
                            .as_str()
                            .unwrap_or("")
                            .contains("terminate_client")),
                "{what}: {v:#}"
            );
        }
        eprintln!(
            "{what}: recovered by {}",
            if errors == 1 {
                "the new manager"
            } else {
                "the killed manager"
            }
        );
    }
    assert_eq!(
        load.failures.load(Ordering::Relaxed),
        0,
        "the online client never lost its context"
    );
    load.stop();
}

/// A second `mps-manager run` for a GPU whose manager runs: it must not become a second owner
/// of the control daemon (two owners recover the same fault twice, one's reset cutting off
/// what the other saved). It exits with an error naming the running manager's pid; the first
/// one keeps its daemon; once the first is SIGKILLed, the lock is free (the kernel drops it)
/// and a new manager starts and adopts the daemon.
#[test]
fn a_second_manager_for_the_same_gpu_is_refused_naming_the_running_one() {
    let n = EmuHost::node();
    let mut m1 = start_manager(&n, false);
    let v = mstate_of(&n, m1.pid(), "daemon started", |v| v["daemon_pid"].is_u64());
    let daemon = daemon_of(&v);
    let mut m2 = n.start_manager("mps-second.json", &manager_config(false));
    let st = m2.wait_timeout(T);
    let log2 = n.log("mps-second.json");
    assert!(
        st.is_some(),
        "a second manager runs beside manager {} for the same GPU:\n{log2}",
        m1.pid()
    );
    assert_eq!(st.unwrap().code(), Some(1), "{log2}");
    assert!(
        log2.contains(&format!(
            "another mps-manager for GPU 0 (pid {}) already runs",
            m1.pid()
        )) && log2.contains("mps-manager.lock"),
        "{log2}"
    );
    assert!(m1.alive());
    let v = mstate_of(&n, m1.pid(), "the first manager still writes", |_| true);
    assert_eq!(daemon_of(&v), daemon);

    m1.signal(libc::SIGKILL);
    let _ = m1.wait_exit(T);
    let m3 = start_manager(&n, false);
    let v = mstate_of(&n, m3.pid(), "the next manager runs", |v| {
        v["daemon_pid"].is_u64()
    });
    assert_eq!(daemon_of(&v), daemon, "the daemon adopted: {v:#}");
}

/// The pipe directory is in offline containers' mounts: a tenant can remove the control
/// daemon's pid file, and a clock stepped forward after MPS started makes the file look older
/// than its daemon. Either way a restarted manager must find the running daemon (the one
/// holding the control socket) and adopt it: `-d` would refuse ("already running") and the
/// manager would exit at every start, leaving the online service on an unmanaged daemon.
#[test]
fn a_restarted_manager_adopts_the_daemon_whose_pid_file_was_removed_or_looks_too_old() {
    let n = EmuHost::node();
    let mut m = start_manager(&n, false);
    let v = mstate_of(&n, m.pid(), "daemon started", |v| v["daemon_pid"].is_u64());
    let daemon = daemon_of(&v);
    let generation = n.device().snapshot().mps.generation;
    let pid_file = n.pipe_dir().join("nvidia-cuda-mps-control.pid");
    for damage in ["removed", "older than its daemon"] {
        m.signal(libc::SIGKILL);
        let _ = m.wait_exit(T);
        if damage == "removed" {
            std::fs::remove_file(&pid_file).unwrap();
        } else {
            std::fs::write(&pid_file, format!("{}\n", daemon.0)).unwrap();
            let old = std::time::SystemTime::now() - Duration::from_secs(3600);
            std::fs::File::options().write(true).open(&pid_file).unwrap().set_modified(old).unwrap();
        }
        m = start_manager(&n, false);
        let v = mstate_of(&n, m.pid(), &format!("pid file {damage}: the new manager's daemon"), |v| {
            v["daemon_pid"].is_u64()
        });
        assert_eq!(daemon_of(&v), daemon, "pid file {damage}: the running daemon adopted: {v:#}");
        assert!(m.alive(), "pid file {damage}: the manager runs:\n{}", n.log("mps.json"));
        assert_eq!(n.device().snapshot().mps.generation, generation, "pid file {damage}: MPS not restarted");
    }
    assert_eq!(log_count(&n, "MPS control daemon started"), 1, "{}", n.log("mps.json"));
}

/// Two GPUs configured with one `pipe_dir` (a config without `{gpu}`) would share one control
/// daemon, serving one GPU, each manager taking it for its own: the second manager (GPU 1, on
/// GPU 0's pipe directory) exits with an error naming the directory and both GPUs, and the
/// first keeps its daemon.
#[test]
fn a_manager_for_another_gpu_on_the_same_pipe_dir_is_refused() {
    let n = EmuHost::node();
    let mut m1 = start_manager(&n, false);
    let v = mstate_of(&n, m1.pid(), "daemon started", |v| v["daemon_pid"].is_u64());
    let daemon = daemon_of(&v);
    let same_pipe = manager_config(false).replacen(
        '{',
        &format!("{{\n  \"gpu_index\": 1,\n  \"pipe_dir\": \"{}\",", n.pipe_dir().display()),
        1,
    );
    let mut m2 = n.start_manager("mps-gpu1.json", &same_pipe);
    let st = m2.wait_timeout(T);
    let log2 = n.log("mps-gpu1.json");
    assert_eq!(st.and_then(|s| s.code()), Some(1), "GPU 1's manager runs on GPU 0's pipe_dir:\n{log2}");
    assert!(
        log2.contains(&format!("pipe_dir {} of GPU 1", n.pipe_dir().display()))
            && log2.contains("mps-manager for GPU 0")
            && log2.contains(&format!("pid {}", m1.pid())),
        "{log2}"
    );
    assert!(m1.alive());
    let v = mstate_of(&n, m1.pid(), "the first manager still writes", |_| true);
    assert_eq!(daemon_of(&v), daemon);
}
