//! Helpers shared by the `nvml_*`, `mps_*`, `workloads_*` and `python_*` end-to-end tests:
//! an emulated host (the `workloads::host::Host` layout over the built emulator), client
//! processes that are always stopped, and JSON parsing of the clients' output.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

pub use workloads::host::Host;

/// `target/<profile>/`, where cargo put the emulator libraries and the client binaries.
pub fn bin_dir() -> PathBuf {
    workloads::host::target_dir()
}

/// The monitor's config of the node-runtime tests (`node_runtime`, `k8s_loop`): SM activity
/// judged alone (Healthy < 50 %, Overlimit from 90 % held 200 ms), a hold of `hold_ms`, 10 s
/// eviction grace, verification off.
pub fn node_monitor_config(hold_ms: u64) -> String {
    format!(
        r#"{{
  "interval_ms": 10, "state_file_every_ms": 10, "host_memory": {{ "enabled": false }},
  "machine": {{
    "gpu_util":    {{ "healthy": 97, "unhealthy": 98, "overlimit": 99, "enabled": false }},
    "sm_activity": {{ "healthy": 50, "unhealthy": 70, "overlimit": 90 }},
    "sm_clock":    {{ "healthy": 3, "unhealthy": 2, "overlimit": 1, "direction": "below", "enabled": false }},
    "overlimit_sustain_ms": 200, "hold_base_ms": {hold_ms}, "hold_max_ms": 60000
  }},
  "evictor": {{ "grace_ms": 10000 }},
  "verify": {{ "enabled": false }}
}}"#
    )
}

/// Fails with a clear message when a needed artifact has not been built.
pub fn require_built() {
    for f in [
        "libcuda.so",
        "libnvidia_ml.so",
        "emu-mps-control",
        "online",
        "offline",
    ] {
        assert!(
            bin_dir().join(f).exists(),
            "{} is not built: run `cargo build --workspace --all-targets` first (scripts/test.sh does)",
            bin_dir().join(f).display()
        );
    }
}

/// A fresh emulated host with one GPU of `profile`.
pub fn host(profile: &str) -> Host {
    require_built();
    let scratch = std::env::temp_dir();
    Host::emulated(bin_dir(), profile, &scratch).expect("emulated host")
}

/// A child whose stdout lines arrive on a channel; SIGKILLed on drop if still running.
pub struct Proc {
    pub child: Child,
    pub lines: Receiver<String>,
    pub seen: Vec<String>,
}

impl Proc {
    /// Spawns `cmd` with piped stdout (stderr inherited for diagnostics).
    pub fn spawn(mut cmd: Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn client");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Proc {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (bounded) for a line containing `needle`.
    pub fn wait_line(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.contains(needle) {
                        return l;
                    }
                }
                Err(_) => panic!(
                    "no line containing {needle:?} within {timeout:?}; saw {:?}",
                    self.seen
                ),
            }
        }
    }

    /// Sends `sig` and waits (bounded) for exit; returns the status and all remaining lines.
    pub fn stop(&mut self, sig: i32, timeout: Duration) -> (std::process::ExitStatus, Vec<String>) {
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, sig) };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                std::thread::sleep(Duration::from_millis(50));
                self.seen.extend(self.lines.try_iter());
                return (st, self.seen.clone());
            }
            assert!(
                Instant::now() < deadline,
                "process {} did not exit within {timeout:?} of signal {sig}",
                self.child.id()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs a command to completion with a time bound; panics on timeout.
pub fn run_bounded(mut cmd: Command, stdin: &str, timeout: Duration) -> Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    {
        let mut i = child.stdin.take().expect("stdin");
        let _ = i.write_all(stdin.as_bytes());
    }
    let deadline = Instant::now() + timeout;
    while matches!(child.try_wait(), Ok(None)) {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("command {cmd:?} did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("output")
}

/// The last line of `out` parsed as JSON.
pub fn last_json(out: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(out);
    let line = text.lines().last().unwrap_or_else(|| panic!("no output"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

/// Parses one JSON line.
pub fn json(line: &str) -> serde_json::Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

/// The offline client's summary (its last `"final":true` line) among `lines`, parsed.
pub fn final_summary(lines: &[String]) -> serde_json::Value {
    json(lines.iter().rev().find(|l| l.contains("\"final\":true")).unwrap_or_else(|| panic!("no offline summary in {lines:?}")))
}

/// Sends `commands` to the host's `nvidia-cuda-mps-control` client; returns stdout.
pub fn mps(host: &Host, commands: &str) -> String {
    let out = run_bounded(
        host.tool("nvidia-cuda-mps-control"),
        commands,
        Duration::from_secs(30),
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Starts the MPS control daemon on `host` (returns once its socket accepts commands).
pub fn mps_start(host: &Host) {
    let mut c = host.tool("nvidia-cuda-mps-control");
    c.arg("-d");
    let out = run_bounded(c, "", Duration::from_secs(30));
    assert!(
        out.status.success(),
        "mps-control -d failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Stops the daemon if it is running (for test cleanup).
pub struct MpsGuard<'a>(pub &'a Host);

impl Drop for MpsGuard<'_> {
    fn drop(&mut self) {
        let _ = run_bounded(
            self.0.tool("nvidia-cuda-mps-control"),
            "quit\n",
            Duration::from_secs(30),
        );
    }
}

/// An `offline` client on `host` printing JSON progress every 0.2 s.
pub fn offline(host: &Host, extra: &[&str]) -> Proc {
    let mut c = host.command("offline");
    c.args(["--json", "--report-interval", "0.2"]).args(extra);
    Proc::spawn(c)
}
