//! Harness for end-to-end tests: builds an emulated GPU host (libraries, state file, MPS pipe dir) per test.
//!
//! [`EmuHost::new`] makes a private temp dir with its own state file, a `lib/` dir whose
//! `libcuda.so.1` / `libnvidia-ml.so.1` link to the workspace's built fake libraries, a `bin/`
//! dir with `nvidia-cuda-mps-control`, and MPS pipe/log dirs. [`EmuHost::command`] returns a
//! `Command` wired to all of it; [`EmuHost::spawn`] runs it with output captured to files and
//! kills it when the handle (or the host) is dropped. Run `cargo build --workspace` first.
//! Set `E2E_KEEP=1` to keep the per-test dirs (state file, child output) for inspection, and
//! `E2E_TARGET_DIR` to take the artifacts from another `target/<profile>/` dir.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use emu_device;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// The workspace `target/<profile>/` dir holding the built artifacts, found from the running
/// test binary (`target/<profile>/deps/<test>`).
pub fn target_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("E2E_TARGET_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    dir
}

/// A built artifact, or a panic that says how to build it.
pub fn artifact(name: &str) -> PathBuf {
    let p = target_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace` (same profile as the tests) before the e2e tests",
        p.display()
    );
    p
}

/// A per-test emulated GPU host.
pub struct EmuHost {
    root: PathBuf,
    state: PathBuf,
    lib_dir: PathBuf,
    bin_dir: PathBuf,
    pipe_dir: PathBuf,
    log_dir: PathBuf,
    profile: String,
    pids: Arc<Mutex<Vec<u32>>>,
}

impl EmuHost {
    /// A host with a T4-like GPU.
    pub fn new() -> EmuHost {
        EmuHost::with_profile("t4")
    }

    /// A host with the given profile (`t4`, `a10`, `h100`).
    pub fn with_profile(profile: &str) -> EmuHost {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let root = std::env::temp_dir().join(format!(
            "gpuemu-e2e-{}-{n}-{}",
            std::process::id(),
            emu_device::now_ns() % 1_000_000
        ));
        let (lib_dir, bin_dir) = (root.join("lib"), root.join("bin"));
        let (pipe_dir, log_dir) = (root.join("mps-pipe"), root.join("mps-log"));
        for d in [&root, &lib_dir, &bin_dir, &pipe_dir, &log_dir] {
            std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
        }
        let cuda = artifact("libcuda.so");
        link(&cuda, &lib_dir.join("libcuda.so.1"));
        link(&cuda, &lib_dir.join("libcuda.so"));
        let nvml = target_dir().join("libnvidia_ml.so");
        if nvml.exists() {
            link(&nvml, &lib_dir.join("libnvidia-ml.so.1"));
            link(&nvml, &lib_dir.join("libnvidia-ml.so"));
        }
        let mps = target_dir().join("emu-mps-control");
        if mps.exists() {
            link(&mps, &bin_dir.join("nvidia-cuda-mps-control"));
        }
        EmuHost {
            state: root.join("gpu0.state"),
            root,
            lib_dir,
            bin_dir,
            pipe_dir,
            log_dir,
            profile: profile.to_string(),
            pids: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The state file (`GPUEMU_STATE`).
    pub fn state_path(&self) -> &Path {
        &self.state
    }
    /// Dir with `libcuda.so.1` and `libnvidia-ml.so.1`.
    pub fn lib_dir(&self) -> &Path {
        &self.lib_dir
    }
    /// Dir with `nvidia-cuda-mps-control`.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }
    /// `CUDA_MPS_PIPE_DIRECTORY`.
    pub fn pipe_dir(&self) -> &Path {
        &self.pipe_dir
    }
    /// `CUDA_MPS_LOG_DIRECTORY`.
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }
    /// The per-test temp dir.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The fake NVML as `libnvidia-ml.so.1` in [`EmuHost::lib_dir`], or a panic with the build hint.
    pub fn require_nvml(&self) -> PathBuf {
        artifact("libnvidia_ml.so");
        self.lib_dir.join("libnvidia-ml.so.1")
    }

    /// The fake `nvidia-cuda-mps-control` in [`EmuHost::bin_dir`], or a panic with the build hint.
    pub fn require_mps_control(&self) -> PathBuf {
        artifact("emu-mps-control");
        self.bin_dir.join("nvidia-cuda-mps-control")
    }

    /// Opens the emulated device directly (to inspect it, or drive MPS without the control binary).
    pub fn device(&self) -> emu_device::Device {
        let p = emu_device::Profile::by_id(&self.profile).unwrap_or(&emu_device::profile::T4);
        emu_device::Device::open(&self.state, p)
            .unwrap_or_else(|e| panic!("open emulated device: {e}"))
    }

    /// A command for `program` (a workspace binary name, or any path) with the host's
    /// environment: `GPUEMU_STATE`, `GPUEMU_PROFILE`, `LD_LIBRARY_PATH`, `PATH`, MPS dirs.
    pub fn command(&self, program: &str) -> Command {
        let local = target_dir().join(program);
        let prog = if !program.contains('/') && local.exists() {
            local
        } else {
            PathBuf::from(program)
        };
        let mut c = Command::new(prog);
        let ld = match std::env::var_os("LD_LIBRARY_PATH") {
            Some(old) if !old.is_empty() => {
                format!("{}:{}", self.lib_dir.display(), old.to_string_lossy())
            }
            _ => self.lib_dir.display().to_string(),
        };
        let path = match std::env::var_os("PATH") {
            Some(old) => format!("{}:{}", self.bin_dir.display(), old.to_string_lossy()),
            None => self.bin_dir.display().to_string(),
        };
        c.env("GPUEMU_STATE", &self.state)
            .env("GPUEMU_PROFILE", &self.profile)
            .env("LD_LIBRARY_PATH", ld)
            .env("PATH", path)
            .env("CUDA_MPS_PIPE_DIRECTORY", &self.pipe_dir)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.log_dir)
            .env_remove("LD_PRELOAD")
            .env_remove("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
        c
    }

    /// Starts `cmd` with stdin piped and stdout/stderr captured to files; killed on drop.
    pub fn spawn(&self, cmd: &mut Command) -> EmuChild {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let out = self.root.join(format!("child-{n}.out"));
        let err = self.root.join(format!("child-{n}.err"));
        let child = cmd
            .stdin(Stdio::piped())
            .stdout(std::fs::File::create(&out).expect("stdout file"))
            .stderr(std::fs::File::create(&err).expect("stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        self.pids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(child.id());
        EmuChild {
            child,
            out,
            err,
            stdin: None,
            status: None,
        }
        .with_stdin()
    }

    /// Spawns the e2e test client `emu-client` with the given steps.
    pub fn client(&self, steps: &[&str]) -> EmuChild {
        artifact("emu-client");
        let mut c = self.command("emu-client");
        c.args(steps);
        self.spawn(&mut c)
    }
}

impl Default for EmuHost {
    fn default() -> Self {
        EmuHost::new()
    }
}

impl Drop for EmuHost {
    fn drop(&mut self) {
        for pid in self
            .pids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            // SAFETY: plain kill(2) on a pid we spawned (a reaped pid is a harmless ESRCH).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        if std::env::var_os("E2E_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

fn link(target: &Path, at: &Path) {
    let _ = std::fs::remove_file(at);
    std::os::unix::fs::symlink(target, at)
        .unwrap_or_else(|e| panic!("symlink {} -> {}: {e}", at.display(), target.display()));
}

/// A spawned child: output in files, killed (SIGKILL) and reaped on drop.
pub struct EmuChild {
    child: Child,
    out: PathBuf,
    err: PathBuf,
    stdin: Option<ChildStdin>,
    status: Option<ExitStatus>,
}

impl EmuChild {
    fn with_stdin(mut self) -> Self {
        self.stdin = self.child.stdin.take();
        self
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything written to stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Everything written to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Sends a line to stdin (for the client's `wait` step).
    pub fn send_line(&mut self, line: &str) {
        if let Some(s) = self.stdin.as_mut() {
            let _ = writeln!(s, "{line}");
            let _ = s.flush();
        }
    }

    /// Sends a signal.
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our child's pid.
        unsafe { libc::kill(self.pid() as i32, sig) };
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) -> ExitStatus {
        let _ = self.child.kill();
        let st = self.child.wait().expect("wait");
        self.status = Some(st);
        st
    }

    /// Waits up to `limit` for exit.
    pub fn wait_timeout(&mut self, limit: Duration) -> Option<ExitStatus> {
        if let Some(s) = self.status {
            return Some(s);
        }
        let start = Instant::now();
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.status = Some(s);
                return Some(s);
            }
            if start.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits up to `limit` for a stdout line starting with `prefix`; returns it.
    pub fn wait_for_line(&mut self, prefix: &str, limit: Duration) -> Option<String> {
        let start = Instant::now();
        loop {
            if let Some(l) = self.stdout().lines().find(|l| l.starts_with(prefix)) {
                return Some(l.to_string());
            }
            if start.elapsed() >= limit || self.wait_timeout(Duration::ZERO).is_some() {
                return self
                    .stdout()
                    .lines()
                    .find(|l| l.starts_with(prefix))
                    .map(str::to_string);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// All stdout lines starting with `prefix`.
    pub fn lines(&self, prefix: &str) -> Vec<String> {
        self.stdout()
            .lines()
            .filter(|l| l.starts_with(prefix))
            .map(str::to_string)
            .collect()
    }

    /// Waits for exit (bounded) and returns stdout; panics with both streams on timeout.
    pub fn finish(&mut self, limit: Duration) -> String {
        if self.wait_timeout(limit).is_none() {
            panic!(
                "child {} did not exit within {limit:?}\nstdout:\n{}\nstderr:\n{}",
                self.pid(),
                self.stdout(),
                self.stderr()
            );
        }
        self.stdout()
    }
}

impl Drop for EmuChild {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Value of `key=` in a `k=v k=v` line.
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

/// Numeric value of `key=` in a line, panicking with the line if absent.
pub fn num(line: &str, key: &str) -> f64 {
    field(line, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no numeric {key}= in {line:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(pid: u32) -> bool {
        emu_device::procinfo::start_time(pid).is_some()
    }

    #[test]
    fn children_die_with_their_handle_and_host() {
        let host = EmuHost::new();
        let mut a = host.spawn(host.command("sleep").arg("30"));
        let b = host.spawn(host.command("sleep").arg("30"));
        let (pa, pb) = (a.pid(), b.pid());
        assert!(a.wait_timeout(Duration::from_millis(50)).is_none());
        drop(a);
        assert!(
            !running(pa),
            "dropping the handle kills and reaps the child"
        );
        std::mem::forget(b); // handle leaked: the host must still kill it
        let root = host.root().to_path_buf();
        drop(host);
        std::thread::sleep(Duration::from_millis(100));
        let st = std::fs::read_to_string(format!("/proc/{pb}/stat")).unwrap_or_default();
        assert!(
            st.is_empty() || st.contains(") Z "),
            "host drop kills remaining children: {st}"
        );
        assert!(!root.exists(), "temp dir removed");
    }

    #[test]
    fn command_wires_the_emulator_environment() {
        let host = EmuHost::new();
        let mut c = host.spawn(host.command("sh").args(["-c", "echo $GPUEMU_STATE; echo $LD_LIBRARY_PATH; echo $CUDA_MPS_PIPE_DIRECTORY; command -v nvidia-cuda-mps-control || echo none"]));
        let out = c.finish(Duration::from_secs(10));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], host.state_path().display().to_string());
        assert!(lines[1].starts_with(&host.lib_dir().display().to_string()));
        assert_eq!(lines[2], host.pipe_dir().display().to_string());
        assert!(host.lib_dir().join("libcuda.so.1").exists());
    }

    #[test]
    fn parses_fields() {
        let l = "spin=0 emulated_ms=12.5 wall_ms=13";
        assert_eq!(field(l, "spin"), Some("0"));
        assert_eq!(num(l, "emulated_ms"), 12.5);
        assert_eq!(field(l, "nope"), None);
    }
}

/// The Python that runs the Python clients: `$XSHARE_PYTHON`, else the repository's `.venv`
/// (made by `scripts/setup-test-env.sh`). Panics, saying how to get one, when it is missing.
pub fn python() -> PathBuf {
    let p = std::env::var_os("XSHARE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python"));
    assert!(p.exists(), "{} not found: run scripts/setup-test-env.sh or set XSHARE_PYTHON", p.display());
    p
}
