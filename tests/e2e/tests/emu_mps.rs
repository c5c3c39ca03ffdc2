//! MPS on the emulated GPU, through its control daemon: active-thread percentages cap a
//! client's SM share, and a client that dies holding a context hangs its neighbours until MPS
//! is reset.

use e2e::{field, num, EmuHost};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);
const CYCLES: &str = "15900000";

fn spin_ms(host: &EmuHost, pct_env: Option<&str>) -> f64 {
    let mut cmd = host.command("emu-client");
    cmd.args(["ctx", "spin", "40", CYCLES, "10"]);
    if let Some(p) = pct_env {
        cmd.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", p);
    }
    let mut c = host.spawn(&mut cmd);
    c.finish(T);
    let l = c.wait_for_line("spin=", T).expect("spin line");
    assert_eq!(field(&l, "spin"), Some("0"), "{l}");
    num(&l, "emulated_ms")
}

#[test]
fn active_thread_percentage_caps_a_client() {
    let host = EmuHost::new();
    // MPS off: the percentage means nothing.
    let free = spin_ms(&host, None);
    let ignored = spin_ms(&host, Some("25"));
    assert!(
        (ignored / free - 1.0).abs() < 0.05,
        "MPS off: {free} vs {ignored} ms"
    );

    host.start_mps();
    let full = spin_ms(&host, None);
    assert!(
        (full / free - 1.0).abs() < 0.05,
        "default 100%: {free} vs {full} ms"
    );
    // 25% of 40 SMs = 10 SMs at full boost (occupancy 25%) vs 40 SMs at 80% clock: 3.2x.
    let quarter = spin_ms(&host, Some("25"));
    let r = quarter / full;
    eprintln!("mps: uncapped {full:.1} ms, 25% cap {quarter:.1} ms ({r:.2}x)");
    assert!(
        (3.0..3.4).contains(&r),
        "25% cap: {full} -> {quarter} ms ({r:.2}x)"
    );

    // The server's percentage applies to clients connecting later without their own.
    let spid = host.mps_servers()[0];
    host.mps_control(None, &format!("set_active_thread_percentage {spid} 50\n"));
    let half = spin_ms(&host, None);
    let r = half / full;
    eprintln!("mps: default 50% {half:.1} ms ({r:.2}x)");
    assert!(
        (1.5..1.7).contains(&r),
        "50% default: {full} -> {half} ms ({r:.2}x)"
    );
}

/// Real MPS fixes a client's active-thread percentage when it connects: a server default set
/// while the client runs reaches only clients that connect later (the device has no per-client
/// setter at all, as MPS has no command for one).
#[test]
fn a_running_clients_percentage_never_changes() {
    let host = EmuHost::new();
    let dev = host.device();
    host.start_mps();
    host.mps_control(None, "set_default_active_thread_percentage 20\n");
    let mut c = host.client(&["ctx", "ready", "wait", "spin", "40", CYCLES, "10"]);
    c.wait_for_line("ready", T).expect("ready");
    let pct_of = |pid: u32| {
        dev.snapshot()
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .unwrap()
            .active_thread_pct
    };
    assert_eq!(pct_of(c.pid()), 20, "fixed at connection");
    let spid = host.mps_servers()[0];
    host.mps_control(None, &format!("set_active_thread_percentage {spid} 100\n"));
    assert_eq!(dev.default_active_thread_pct(), 100, "later clients get 100");
    assert_eq!(pct_of(c.pid()), 20, "a running client keeps its limit");
    c.send_line("go");
    c.finish(T);
    let ms = num(
        &c.wait_for_line("spin=0", T).expect("spin ok"),
        "emulated_ms",
    );
    // 8 SMs at boost: 40 blocks x 10 ms / 8 = 50 ms per kernel, 10 kernels.
    assert!((480.0..520.0).contains(&ms), "{ms} ms");
}

/// Waits until the device has noticed that `pid` is gone.
fn wait_reaped(dev: &e2e::emu_device::Device, pid: u32) {
    let deadline = std::time::Instant::now() + T;
    while dev.snapshot().processes.iter().any(|p| p.pid == pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "death of {pid} never noticed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Starts a neighbour that has a context and waits for the go to launch one small kernel.
fn neighbour(host: &EmuHost) -> e2e::EmuChild {
    let mut b = host.client(&["ctx", "ready", "wait", "spin", "1", "1000", "1", "ready"]);
    b.wait_for_line("ready", T).expect("neighbour ready");
    b
}

#[test]
fn client_killed_with_live_context_hangs_neighbour_until_mps_quit() {
    let host = EmuHost::new();
    let dev = host.device();
    host.start_mps();
    let mut victim = host.client(&["ctx", "spin", "40", "1000000", "1", "ready", "hang"]);
    victim.wait_for_line("ready", T).expect("victim ready");
    // The neighbour, after its first spin, waits again, then makes a new context and spins.
    let mut b = host.client(&[
        "ctx", "ready", "wait", "spin", "1", "1000", "1", "ready", "wait", "destroy", "ctx", "spin", "1", "1000", "1",
    ]);
    b.wait_for_line("ready", T).expect("neighbour ready");

    victim.kill9();
    // Death is noticed by whichever process next touches the device (within REAP_EVERY_NS).
    let deadline = std::time::Instant::now() + T;
    while !dev.mps_status().poisoned {
        assert!(
            std::time::Instant::now() < deadline,
            "death of a context holder never noticed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    b.send_line("go");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        b.lines("spin=").is_empty(),
        "neighbour must hang while MPS is poisoned: {}",
        b.stdout()
    );
    assert!(b.wait_timeout(Duration::ZERO).is_none());
    let st = dev.mps_status();
    assert!(
        st.poisoned && st.culprit_pid == Some(victim.pid()),
        "{st:?}"
    );

    // A new client cannot join the hung server.
    let mut late = host.client(&["ctx"]);
    late.finish(T);
    assert_eq!(
        late.lines("ctx=")[0],
        "ctx=807",
        "CUDA_ERROR_MPS_SERVER_NOT_READY"
    );

    // quit releases the neighbour, whose context died with the server.
    host.quit_mps();
    let l = b
        .wait_for_line("spin=", T)
        .expect("neighbour released after quit");
    assert_eq!(
        field(&l, "spin"),
        Some("810"),
        "CUDA_ERROR_MPS_CLIENT_TERMINATED: {l}"
    );

    // A restarted server serves new clients normally; the terminated neighbour stays
    // terminated until it is relaunched (NVIDIA: "the process must be terminated and
    // relaunched"), whatever contexts it destroys and creates.
    host.start_mps();
    b.send_line("go");
    b.finish(T);
    assert_eq!(b.lines("ctx=")[1], "ctx=810", "{}", b.stdout());
    assert_ne!(field(&b.lines("spin=")[1], "spin"), Some("0"), "{}", b.stdout());
    let mut fresh = host.client(&["ctx", "spin", "1", "1000", "1"]);
    fresh.finish(T);
    assert_eq!(field(&fresh.lines("spin=")[0], "spin"), Some("0"));
}

#[test]
fn client_that_released_its_context_harms_no_one() {
    let host = EmuHost::new();
    let dev = host.device();
    host.start_mps();
    let mut polite = host.client(&[
        "ctx", "spin", "40", "1000000", "1", "destroy", "ready", "hang",
    ]);
    polite.wait_for_line("ready", T).expect("ready");
    assert_eq!(polite.lines("destroy=")[0], "destroy=0");
    let mut b = neighbour(&host);
    polite.kill9();
    wait_reaped(&dev, polite.pid());
    assert!(!dev.mps_status().poisoned);
    b.send_line("go");
    let l = b.wait_for_line("spin=", T).expect("neighbour runs");
    assert_eq!(field(&l, "spin"), Some("0"), "{l}");
    b.finish(T);
    assert!(!dev.mps_status().poisoned);
}

#[test]
fn client_killed_without_mps_harms_no_one() {
    let host = EmuHost::new();
    let mut victim = host.client(&["ctx", "ready", "hang"]);
    victim.wait_for_line("ready", T).expect("ready");
    let mut b = neighbour(&host);
    victim.kill9();
    wait_reaped(&host.device(), victim.pid());
    b.send_line("go");
    let l = b.wait_for_line("spin=", T).expect("neighbour runs");
    assert_eq!(field(&l, "spin"), Some("0"), "{l}");
    b.finish(T);
}

#[test]
fn sigterm_with_default_action_poisons_but_normal_exit_does_not() {
    let host = EmuHost::new();
    let dev = host.device();
    host.start_mps();
    // exit() without destroying the context: the driver's exit handler releases it, like a real
    // driver's process teardown.
    let mut tidy = host.client(&["ctx", "alloc", "1048576", "exit"]);
    tidy.finish(T);
    wait_reaped(&dev, tidy.pid());
    assert!(
        !dev.mps_status().poisoned,
        "normal exit must not poison MPS"
    );

    // SIGTERM with no handler kills the process with its context live: exactly what the shim's
    // graceful exit exists to prevent.
    let mut victim = host.client(&["ctx", "ready", "hang"]);
    victim.wait_for_line("ready", T).expect("ready");
    victim.signal(libc::SIGTERM);
    victim.finish(T);
    let deadline = std::time::Instant::now() + T;
    while !dev.mps_status().poisoned {
        assert!(
            std::time::Instant::now() < deadline,
            "SIGTERM-killed context holder never poisoned MPS"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A client whose `CUDA_MPS_PIPE_DIRECTORY` holds no control daemon runs without MPS (real
/// CUDA goes on without it when the connection attempt fails): it asks no daemon, gets no MPS
/// limit, and the fake libcuda says so; the same client in the daemon's directory is capped.
#[test]
fn a_client_in_another_pipe_directory_runs_without_mps() {
    let host = EmuHost::new();
    let dev = host.device();
    host.start_mps();
    host.mps_control(None, "set_default_active_thread_percentage 25\n");
    let capped = spin_ms(&host, None);
    let elsewhere = host.root().join("no-daemon-here");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let mut c = host.client(&["ctx", "ready", "wait", "spin", "40", CYCLES, "10"]);
    c.wait_for_line("ready", T).expect("ready");
    let on = dev.snapshot().processes.into_iter().find(|p| p.pid == c.pid()).unwrap();
    assert!(on.mps_client && !on.mps_outside, "{on:?}");
    c.send_line("go");
    c.finish(T);
    let mut cmd = host.command("emu-client");
    cmd.args(["ctx", "ready", "wait", "spin", "40", CYCLES, "10"])
        .env("CUDA_MPS_PIPE_DIRECTORY", &elsewhere);
    let mut out = host.spawn(&mut cmd);
    out.wait_for_line("ready", T).expect("ready");
    let p = dev.snapshot().processes.into_iter().find(|p| p.pid == out.pid()).unwrap();
    assert!(p.mps_outside && !p.mps_client && p.active_thread_pct == 100, "{p:?}");
    out.send_line("go");
    out.finish(T);
    let l = out.wait_for_line("spin=", T).expect("spin line");
    assert_eq!(field(&l, "spin"), Some("0"), "{l}");
    let free = num(&l, "emulated_ms");
    assert!(free < capped * 0.5, "outside MPS, uncapped: {free} ms vs {capped} ms capped at 25 %");
    assert!(out.stderr().contains("runs without MPS"), "{}", out.stderr());
}
