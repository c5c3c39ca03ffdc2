//! Operating the binary (issue 8 obs. 9): one instance per GPU, quiet on a closed pipe,
//! plain-text logs when stderr is not a terminal.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_sysmonitor")
}

struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Dir {
        let d = Dir(tempfile::tempdir().unwrap());
        std::fs::write(
            d.cfg(),
            r#"{ "interval_ms": 20, "state_file_every_ms": 20, "host_memory": { "enabled": false } }"#,
        )
        .unwrap();
        d
    }
    fn cfg(&self) -> PathBuf {
        self.0.path().join("sysmonitor.json")
    }
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.args(args)
            .arg("--config")
            .arg(self.cfg())
            .env("XSHARE_LEDGER_DIR", self.0.path().join("run"))
            // No NVML here: the monitor runs (Disabled, retrying), which is all these tests need.
            .env("LD_LIBRARY_PATH", self.0.path())
            .env_remove("RUST_LOG");
        c
    }
    fn state_file(&self) -> PathBuf {
        self.0.path().join("run/daemons/gpu0/state.json")
    }
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(p: &Path) {
    let end = Instant::now() + Duration::from_secs(30);
    while !p.exists() {
        assert!(Instant::now() < end, "{} never appeared", p.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `c` with stdout a pipe whose reading end is already closed (`| head` that has quit).
fn with_closed_stdout(mut c: Command) -> Output {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills two fds we then own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fresh fds owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(r);
    c.stdout(Stdio::from(w))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

/// Runs `c` to completion, failing the test (not hanging) if it is still running after `t`.
fn output_within(mut c: Command, t: Duration) -> Output {
    let child = c
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut r = Running(child);
    let end = Instant::now() + t;
    while r.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < end, "still running after {t:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut err = Vec::new();
    r.0.stderr.take().unwrap().read_to_end(&mut err).unwrap();
    Output {
        status: r.0.wait().unwrap(),
        stdout: Vec::new(),
        stderr: err,
    }
}

#[test]
fn second_run_for_the_same_gpu_exits_naming_the_holder_and_logs_are_plain_text() {
    let d = Dir::new();
    let mut first = Running(
        d.cmd(&["run"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    wait_for(&d.state_file());
    let second = output_within(d.cmd(&["run"]), Duration::from_secs(10));
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "second instance must fail: {err}");
    assert!(
        err.contains(&format!("pid {}", first.0.id())),
        "names the holder pid {}: {err}",
        first.0.id()
    );
    assert!(first.0.try_wait().unwrap().is_none(), "first keeps running");
    let status = |d: &Dir| {
        let o = d.cmd(&["status"]).output().unwrap();
        (String::from_utf8_lossy(&o.stdout).into_owned(), o.status.code())
    };
    let (s, code) = status(&d);
    assert!(s.contains(&format!("(monitor pid {}, updated", first.0.id())), "{s}");
    assert_eq!(code, Some(0), "the monitor runs");

    // SIGTERM the first and read its log: no ANSI escape when stderr is a pipe.
    // SAFETY: kill(2) on our own live child.
    unsafe { libc::kill(first.0.id() as i32, libc::SIGTERM) };
    let mut log = String::new();
    first
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(log.contains("sysmonitor running"), "{log}");
    let _ = first.0.wait();
    let (s, code) = status(&d);
    assert!(s.contains("is not running: its state as it left it"), "{s}");
    // A script or probe sees it too: exit 3, as `systemctl status` says of a stopped unit.
    assert_eq!(code, Some(3), "{s}");
    // No NVML here: every sample fails, with the same error. A run of failures is logged when
    // it starts (and changes, and once a minute), not at every 20 ms sample.
    let failed = log.matches("GPU sample failed").count();
    assert!((1..=2).contains(&failed), "{failed} 'GPU sample failed' lines: {log}");
    assert!(
        !log.contains('\x1b'),
        "ANSI colour codes in a non-tty log: {log:?}"
    );

    // Once the holder is gone the lock is free again.
    let mut again = Running(
        d.cmd(&["run"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        again.0.try_wait().unwrap().is_none(),
        "restart after the holder died"
    );
}

/// One config for two GPUs: a `state_file` without `{gpu}` would have both monitors overwrite
/// one file (and mps-manager, node-agent and the matcher read the wrong GPU's state): the
/// second monitor is refused, naming the holder and the fix; with `{gpu}` both run, each with
/// its own file.
#[test]
fn two_gpus_monitors_never_share_a_state_file() {
    let d = Dir::new();
    let shared = d.0.path().join("var/state.json");
    std::fs::write(
        d.cfg(),
        format!(r#"{{ "interval_ms": 20, "host_memory": {{ "enabled": false }}, "state_file": "{}" }}"#, shared.display()),
    )
    .unwrap();
    let first = Running(d.cmd(&["run", "--gpu", "0"]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap());
    wait_for(&shared);
    let second = output_within(d.cmd(&["run", "--gpu", "1"]), Duration::from_secs(10));
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "second GPU's monitor on the same state file must fail: {err}");
    assert!(err.contains(&format!("pid {}", first.0.id())) && err.contains("{gpu}"), "{err}");
    // `status` of GPU 1 does not show GPU 0's state as its own.
    let st = d.cmd(&["status", "--gpu", "1"]).output().unwrap();
    let text = String::from_utf8_lossy(&st.stderr);
    assert!(!st.status.success() && text.contains("GPU 0's monitor"), "{text}");
    drop(first);

    let tmpl = d.0.path().join("var/gpu{gpu}.json");
    std::fs::write(
        d.cfg(),
        format!(r#"{{ "interval_ms": 20, "host_memory": {{ "enabled": false }}, "state_file": "{}" }}"#, tmpl.display()),
    )
    .unwrap();
    let mut both: Vec<Running> = ["0", "1"]
        .iter()
        .map(|g| Running(d.cmd(&["run", "--gpu", g]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap()))
        .collect();
    for g in 0..2 {
        wait_for(&d.0.path().join(format!("var/gpu{g}.json")));
    }
    for r in &mut both {
        assert!(r.0.try_wait().unwrap().is_none(), "each GPU's monitor keeps running");
    }
}

#[test]
fn check_config_and_status_into_a_closed_pipe_exit_quietly() {
    let d = Dir::new();
    let out = with_closed_stdout(d.cmd(&["check-config"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.status.success(), "{:?} {err}", out.status);

    let _mon = Running(
        d.cmd(&["run"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for(&d.state_file());
    for args in [&["status"][..], &["status", "--json"][..]] {
        let out = with_closed_stdout(d.cmd(args));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(out.status.success(), "{args:?}: {:?} {err}", out.status);
    }
}

/// `disable` for a GPU no monitor has run for said only "No such file or directory"; for one
/// whose monitor is down it said the GPU "will be Disabled at the monitor's next report" and
/// nothing of there being none, nor that /run does not outlive a reboot.
#[test]
fn disable_says_when_no_monitor_runs_or_has_run_for_the_gpu() {
    let d = Dir::new();
    let out = d.cmd(&["disable", "--gpu", "7"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("no monitor has run for GPU 7"), "{err}");

    let mon = Running(d.cmd(&["run"]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap());
    wait_for(&d.state_file());
    let out = d.cmd(&["disable"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains("warning"), "{err}");
    drop(mon);
    let out = d.cmd(&["enable"]).output().unwrap();
    assert!(out.status.success());
    let out = d.cmd(&["disable"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains("warning: no monitor runs for GPU 0") && err.contains("reboot"), "{err}");
}
