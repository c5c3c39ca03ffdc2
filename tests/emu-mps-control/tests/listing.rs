//! The emulated control daemon as a real process: a client connects only through it, and a
//! client that dies holding its context is on its server's client list whatever the daemon
//! was doing when it died.
//!
//! Real MPS connects a client to its user's server through the control daemon before the
//! client's CUDA context exists (nvidia-cuda-mps-control(1), DESCRIPTION): a client waits
//! while the daemon does not answer, and a client that held a context is always listed by
//! `get_client_list` until it is cleaned up or terminated.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use emu_device::Device;

const HELPER: &str = "EMU_MPS_LISTING_HELPER";

/// Not a test: body of the client process the test spawns (opens the device from the
/// environment, creates a context once the daemon has handed it to its server, as the fake
/// libcuda does, says `ready`, sleeps until killed).
#[test]
#[ignore = "helper-process entry point, run by the other tests"]
fn helper_client() {
    if std::env::var_os(HELPER).is_none() {
        return;
    }
    let dev = Device::open_from_env().unwrap();
    let c = dev.attach().unwrap();
    dev.create_context(&c, None).unwrap();
    println!("ready");
    std::io::stdout().flush().unwrap();
    loop {
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("emu-mps-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
    fn envs(&self) -> Vec<(&'static str, PathBuf)> {
        vec![
            ("GPUEMU_STATE", self.0.join("gpu0.state")),
            ("CUDA_MPS_PIPE_DIRECTORY", self.0.join("pipe")),
            ("CUDA_MPS_LOG_DIRECTORY", self.0.join("log")),
        ]
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn ctl(s: &Scratch, line: &str) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_emu-mps-control"))
        .envs(s.envs())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(format!("{line}\n").as_bytes())
        .unwrap();
    let out = c.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn signal(c: &Child, sig: i32) {
    // SAFETY: kill(2) on a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(c.id() as i32, sig) }, 0);
}

/// Starts a helper client; returns it and its stdout.
fn spawn_helper(s: &Scratch) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_client",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER, "1")
        .envs(s.envs())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(c.stdout.take().unwrap());
    (c, out)
}

/// Reads the helper's stdout until `ready`; panics if it ends first.
fn wait_ready(out: &mut impl BufRead) {
    let mut line = String::new();
    while !line.contains("ready") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "helper exited before ready");
    }
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        signal(&self.0, libc::SIGCONT);
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The client connects through the running daemon and creates its context; the daemon is
/// then stopped, and the client dies (SIGKILLed, reaped, its /proc entry gone) meanwhile. A
/// second client started while the daemon is stopped cannot connect (nobody hands it to a
/// server) until the daemon runs again. Then the dead client is on its server's list and
/// `terminate_client` clears the hang.
#[test]
fn a_client_connects_only_through_the_daemon_and_one_that_died_meanwhile_is_listed() {
    let s = Scratch::new("listing");
    let daemon = Daemon(
        Command::new(env!("CARGO_BIN_EXE_emu-mps-control"))
            .arg("-f")
            .envs(s.envs())
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let dev = Device::open(
        &s.0.join("gpu0.state"),
        emu_device::Profile::by_id("t4").unwrap(),
    )
    .unwrap();
    wait_until("MPS on", || {
        dev.mps_status().enabled && Path::new(&s.0.join("pipe/control")).exists()
    });
    assert_eq!(ctl(&s, "get_server_list"), "", "no client, no server yet");

    let (mut client, mut out) = spawn_helper(&s);
    wait_ready(&mut out);
    signal(&daemon.0, libc::SIGSTOP);
    // A client arriving now waits: nobody hands it to a server while the daemon is stopped.
    let (mut late, late_out) = spawn_helper(&s);
    let late_ready = std::thread::spawn(move || {
        let mut out = late_out;
        wait_ready(&mut out);
    });
    std::thread::sleep(Duration::from_millis(400));
    assert!(!late_ready.is_finished(), "a client connected while the daemon was stopped");
    let pid = client.id();
    client.kill().unwrap();
    client.wait().unwrap();
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "client reaped"
    );
    wait_until("death noticed", || dev.mps_status().poisoned);
    signal(&daemon.0, libc::SIGCONT);
    // The hung server refuses the late client (CUDA_ERROR_MPS_SERVER_NOT_READY): it exits.
    let st = late.wait().unwrap();
    assert!(!st.success(), "the late client cannot join a hung server");
    assert!(late_ready.join().is_err(), "the late client never said ready");

    let servers = ctl(&s, "get_server_list");
    let server: u32 = servers
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("a server for the dead client's user, got {servers:?}"));
    let listed = ctl(&s, &format!("get_client_list {server}"));
    assert!(
        listed.lines().any(|l| l.trim() == pid.to_string()),
        "dead client {pid} listed on server {server}: {listed:?}"
    );
    assert_eq!(ctl(&s, &format!("terminate_client {server} {pid}")), "");
    assert!(
        !dev.mps_status().poisoned,
        "terminate_client cleared the hang"
    );
    assert_eq!(ctl(&s, &format!("get_client_list {server}")), "");
    ctl(&s, "quit");
}
