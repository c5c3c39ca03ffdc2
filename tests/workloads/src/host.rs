//! The one emulated-host harness of the workspace, used by every end-to-end test, benchmark
//! and demo: the host a client or daemon runs on, either the real one (system driver) or an
//! emulated GPU host laid out in a scratch directory.
//!
//! An emulated host has, under its own directory: a `lib/` dir whose `libcuda.so.1` and
//! `libnvidia-ml.so.1` link to the workspace's built fake libraries, a `bin/` dir with the fake
//! `nvidia-cuda-mps-control`, the device state file (`gpu0.state`), MPS pipe and log dirs, and
//! a ledger dir (`run/`) for the node daemons. [`Host::command`] gives a `Command` wired to all
//! of it; [`Host::spawn`] runs it with output captured to files and kills it when the handle
//! (or the host) is dropped; [`Host::start_monitor`] / [`Host::start_manager`] start the node
//! daemons on it; [`Load`] puts GPU load on it from the calling process. Dropping the host kills
//! every process it spawned and removes its directory (`E2E_KEEP=1` keeps it for inspection).
//!
//! The host never builds anything: it takes the artifacts cargo already built, from the
//! `target/<profile>/` dir of the running test, bench or example ([`target_dir`],
//! `E2E_TARGET_DIR` to take them from elsewhere), and panics naming the missing file and the
//! build command otherwise.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use emu_device::{Device, EmuError, Launch, Profile};

/// State file variable of the emulator (`emu-device`).
pub const ENV_STATE: &str = "GPUEMU_STATE";
/// Profile variable of the emulator (`emu-device`): `t4`, `a10`, `h100`.
pub const ENV_PROFILE: &str = "GPUEMU_PROFILE";
/// Ledger directory variable of the node daemons and the shim.
pub const ENV_LEDGER_DIR: &str = "XSHARE_LEDGER_DIR";

static SEQ: AtomicU32 = AtomicU32::new(0);

/// The workspace `target/<profile>/` dir holding the built artifacts, found from the running
/// executable (`target/<profile>/deps/<test>`, `target/<profile>/examples/<example>` or
/// `target/<profile>/<bin>`), or `E2E_TARGET_DIR` when set.
pub fn target_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("E2E_TARGET_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir
        .file_name()
        .is_some_and(|n| n == "deps" || n == "examples")
    {
        dir.pop();
    }
    dir
}

/// A built artifact of [`target_dir`], or a panic that says how to build it.
pub fn artifact(name: &str) -> PathBuf {
    let p = target_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace --all-targets` (same profile as the tests, \
         `--release` for benchmarks) first",
        p.display()
    );
    p
}

/// Whether this process runs as root (tests that switch users need it).
pub fn is_root() -> bool {
    // SAFETY: getuid(2) has no preconditions.
    unsafe { libc::getuid() == 0 }
}

/// The `compute_mode` an emulated host's mps-manager is configured with: `exclusive_process`,
/// the product's default, when this runs as root (as the manager does on a node); `leave`
/// otherwise: setting the compute mode is root only (`nvmlDeviceSetComputeMode`, the emulated
/// one too), and a manager told to set it and unable to does not start.
pub fn manager_compute_mode() -> &'static str {
    if is_root() {
        "exclusive_process"
    } else {
        "leave"
    }
}

/// True, after saying the test is skipped (and that it needs root `to`, when given), when this
/// process is not root: `if lacks_root("run a client as uid 65534") { return; }`.
pub fn lacks_root(to: &str) -> bool {
    if is_root() {
        return false;
    }
    if to.is_empty() {
        eprintln!("skipped: needs root");
    } else {
        eprintln!("skipped: needs root to {to}");
    }
    true
}

/// Sets the mode bits of `p`, panicking with the path on failure.
pub fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

/// The emulated host's layout (absent on a real host).
struct Emu {
    state: PathBuf,
    lib_dir: PathBuf,
    tools_dir: PathBuf,
    pipe_dir: PathBuf,
    log_dir: PathBuf,
    ledger_dir: PathBuf,
    profile: String,
}

/// Where clients and daemons run: the real machine, or one emulated GPU host.
pub struct Host {
    bin_dir: PathBuf,
    root: Option<PathBuf>,
    emu: Option<Emu>,
    env: Vec<(String, OsString)>,
    label: String,
    pids: Arc<Mutex<Vec<u32>>>,
}

fn link(src: &Path, dst: &Path) -> Result<(), String> {
    if !src.exists() {
        return Err(format!(
            "{} is missing: run `cargo build --workspace --all-targets` first (scripts/demo.sh does)",
            src.display()
        ));
    }
    let _ = std::fs::remove_file(dst);
    std::os::unix::fs::symlink(src, dst)
        .map_err(|e| format!("linking {} -> {}: {e}", dst.display(), src.display()))
}

fn prepend(dir: &Path, var: &str) -> OsString {
    let mut v = OsString::from(dir.as_os_str());
    if let Some(old) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

impl Host {
    /// The machine's own driver and tools; programs are taken from `bin_dir`.
    pub fn real(bin_dir: PathBuf) -> Self {
        Host {
            bin_dir,
            root: None,
            emu: None,
            env: Vec::new(),
            label: "real GPU".into(),
            pids: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// An emulated host with one `profile` GPU under a fresh directory in `scratch`, its
    /// programs and fake libraries taken from `bin_dir`. Every fake (libcuda, NVML, MPS control)
    /// must be built.
    pub fn emulated(bin_dir: PathBuf, profile: &str, scratch: &Path) -> Result<Self, String> {
        Host::layout(bin_dir, profile, scratch, true)
    }

    /// A test host with a T4-like GPU over the built fakes of [`target_dir`].
    pub fn new() -> Host {
        Host::with_profile("t4")
    }

    /// A test host with the given profile (`t4`, `a10`, `h100`) over the built fakes of
    /// [`target_dir`] (libcuda must be built; NVML and MPS control are linked when built, see
    /// [`Host::require_nvml`] and [`Host::require_mps_control`]).
    pub fn with_profile(profile: &str) -> Host {
        artifact("libcuda.so");
        Host::layout(target_dir(), profile, &std::env::temp_dir(), false)
            .unwrap_or_else(|e| panic!("emulated host: {e}"))
    }

    /// A host for the node runtime's tests: an H100 whose device state exists from the start
    /// (every process sees the same profile), with the fake NVML the monitor needs.
    pub fn node() -> Host {
        let h = Host::with_profile("h100");
        h.require_nvml();
        h.device();
        h
    }

    fn layout(
        bin_dir: PathBuf,
        profile: &str,
        scratch: &Path,
        strict: bool,
    ) -> Result<Host, String> {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let root = scratch.join(format!(
            "emu-host-{}-{n}-{}",
            std::process::id(),
            crate::now_tag() % 1_000_000_000
        ));
        let emu = Emu {
            state: root.join("gpu0.state"),
            lib_dir: root.join("lib"),
            tools_dir: root.join("bin"),
            // Where mps-manager keeps GPU 0's MPS directories by default (systemd/README.md):
            // the pipe directory in `<ledger_dir>/gpu0/` (a client reaches the daemon only
            // through it), the logs in `<ledger_dir>/daemons/gpu0/`, out of tenants' reach.
            pipe_dir: root.join("run/gpu0/mps-pipe"),
            log_dir: root.join("run/daemons/gpu0/mps-log"),
            ledger_dir: root.join("run"),
            profile: profile.to_string(),
        };
        for d in [
            &root,
            &emu.lib_dir,
            &emu.tools_dir,
            &emu.pipe_dir,
            &emu.log_dir,
        ] {
            std::fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
        }
        let fakes = [
            ("libcuda.so", &emu.lib_dir, ["libcuda.so.1", "libcuda.so"]),
            (
                "libnvidia_ml.so",
                &emu.lib_dir,
                ["libnvidia-ml.so.1", "libnvidia-ml.so"],
            ),
            (
                "emu-mps-control",
                &emu.tools_dir,
                ["nvidia-cuda-mps-control", "nvidia-cuda-mps-control"],
            ),
        ];
        for (built, dir, names) in fakes {
            let src = bin_dir.join(built);
            if strict || src.exists() {
                for name in names {
                    link(&src, &dir.join(name))?;
                }
            }
        }
        let env = vec![
            (ENV_STATE.to_string(), emu.state.clone().into_os_string()),
            (ENV_PROFILE.to_string(), OsString::from(profile)),
            (
                "LD_LIBRARY_PATH".to_string(),
                prepend(&emu.lib_dir, "LD_LIBRARY_PATH"),
            ),
            ("PATH".to_string(), prepend(&emu.tools_dir, "PATH")),
            (
                "CUDA_MPS_PIPE_DIRECTORY".to_string(),
                emu.pipe_dir.clone().into_os_string(),
            ),
            (
                "CUDA_MPS_LOG_DIRECTORY".to_string(),
                emu.log_dir.clone().into_os_string(),
            ),
        ];
        Ok(Host {
            bin_dir,
            root: Some(root),
            emu: Some(emu),
            env,
            label: format!("emulated {profile}"),
            pids: Arc::new(Mutex::new(Vec::new())),
        })
    }

    fn emu(&self) -> &Emu {
        self.emu
            .as_ref()
            .expect("a real host has no emulated device, libraries or scratch dir")
    }

    /// What the host is, for reports (`emulated h100`, `real GPU`).
    pub fn label(&self) -> &str {
        &self.label
    }
    /// Directory the host's programs are taken from (`target/<profile>/` for tests).
    pub fn programs_dir(&self) -> &Path {
        &self.bin_dir
    }
    /// The emulated host's directory, `None` on a real host.
    pub fn scratch(&self) -> Option<&Path> {
        self.root.as_deref()
    }
    /// The emulated host's directory (panics on a real host).
    pub fn root(&self) -> &Path {
        self.scratch().expect("a real host has no scratch dir")
    }
    /// `root()/name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.root().join(name)
    }
    /// The device state file (`GPUEMU_STATE`).
    pub fn state_path(&self) -> &Path {
        &self.emu().state
    }
    /// The emulated GPU's profile id.
    pub fn profile(&self) -> &str {
        &self.emu().profile
    }
    /// Dir with `libcuda.so.1` and `libnvidia-ml.so.1`.
    pub fn lib_dir(&self) -> &Path {
        &self.emu().lib_dir
    }
    /// Dir with `nvidia-cuda-mps-control` (first on the children's `PATH`).
    pub fn bin_dir(&self) -> &Path {
        &self.emu().tools_dir
    }
    /// `CUDA_MPS_PIPE_DIRECTORY`.
    pub fn pipe_dir(&self) -> &Path {
        &self.emu().pipe_dir
    }
    /// `CUDA_MPS_LOG_DIRECTORY`.
    pub fn log_dir(&self) -> &Path {
        &self.emu().log_dir
    }
    /// The node daemons' ledger dir (`XSHARE_LEDGER_DIR` of [`Host::node_command`]).
    pub fn ledger_dir(&self) -> &Path {
        &self.emu().ledger_dir
    }
    /// GPU 0's ledger file.
    pub fn ledger_path(&self) -> PathBuf {
        node_ledger::config::ledger_path(self.ledger_dir(), 0)
    }
    /// GPU 0's status file (what the monitor and mps-manager publish).
    pub fn status_path(&self) -> PathBuf {
        node_ledger::config::status_path(self.ledger_dir(), 0)
    }
    /// GPU 0's status file opened for writing, as the monitor and mps-manager open it: for a
    /// test that publishes samples or a budget in their place.
    pub fn status_writer(&self) -> node_ledger::StatusWriter {
        node_ledger::Status::open_or_create(&self.status_path(), 0).expect("status file")
    }
    /// The monitor's state file for GPU 0.
    pub fn monitor_state_file(&self) -> PathBuf {
        node_ledger::config::daemon_dir(self.ledger_dir(), 0).join("state.json")
    }
    /// The MPS manager's state file for GPU 0.
    pub fn manager_state_file(&self) -> PathBuf {
        node_ledger::config::daemon_dir(self.ledger_dir(), 0).join("mps-manager.json")
    }
    /// The environment children get (name, value).
    pub fn env(&self) -> &[(String, OsString)] {
        &self.env
    }

    /// The fake NVML as `libnvidia-ml.so.1` in [`Host::lib_dir`], or a panic with the build hint.
    pub fn require_nvml(&self) -> PathBuf {
        artifact("libnvidia_ml.so");
        self.lib_dir().join("libnvidia-ml.so.1")
    }

    /// The fake `nvidia-cuda-mps-control` in [`Host::bin_dir`], or a panic with the build hint.
    pub fn require_mps_control(&self) -> PathBuf {
        artifact("emu-mps-control");
        self.bin_dir().join("nvidia-cuda-mps-control")
    }

    /// The emulated GPU's profile (T4 when the id names none).
    pub fn gpu_profile(&self) -> &'static Profile {
        Profile::by_id(self.profile()).unwrap_or(&emu_device::profile::T4)
    }

    /// Device memory one process's context holds on the emulated GPU outside MPS, as NVML
    /// counts it (a real context's: T4 302 MiB, H100 526 MiB; see [`Profile::context_bytes`]).
    pub fn context_bytes(&self) -> u64 {
        self.gpu_profile().context_bytes()
    }

    /// Opens the emulated device directly (to inspect it, drive MPS without the control
    /// binary, or create its state file).
    pub fn device(&self) -> Device {
        Device::open(self.state_path(), self.gpu_profile())
            .unwrap_or_else(|e| panic!("open emulated device: {e}"))
    }

    /// Makes the host's device, libraries and tools reachable for non-root users, as
    /// `/dev/nvidia*` and the driver are on a GPU host (creates the device state file).
    pub fn open_to_all_users(&self) {
        self.device();
        for d in [self.root(), self.lib_dir(), self.bin_dir()] {
            chmod(d, 0o755);
        }
        chmod(self.state_path(), 0o666);
    }

    /// A command for `program` with the host's environment. A bare name of a built program
    /// is taken from [`Host::programs_dir`], anything else as given (found on the host's
    /// `PATH`). On an emulated host: `GPUEMU_STATE`, `GPUEMU_PROFILE`, `LD_LIBRARY_PATH`,
    /// `PATH`, the MPS dirs, and no inherited `LD_PRELOAD` or MPS thread percentage.
    pub fn command(&self, program: &str) -> Command {
        let local = self.bin_dir.join(program);
        let prog = if !program.contains('/') && local.exists() {
            local
        } else {
            PathBuf::from(program)
        };
        let mut c = Command::new(prog);
        if self.emu.is_some() {
            c.env_remove("LD_PRELOAD")
                .env_remove("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
        }
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// A command for a tool found on the host's `PATH` (e.g. `nvidia-cuda-mps-control`).
    pub fn tool(&self, name: &str) -> Command {
        let mut c = Command::new(name);
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// [`Host::command`] for a node daemon or its CLI: also `XSHARE_LEDGER_DIR` (the host's
    /// ledger dir) and `RUST_LOG=info`.
    pub fn node_command(&self, program: &str) -> Command {
        let mut c = self.command(program);
        c.env(ENV_LEDGER_DIR, self.ledger_dir())
            .env("RUST_LOG", "info");
        c
    }

    /// Runs the host's `nvidia-cuda-mps-control` (the emulated one) with `arg` (e.g. `-d`) or
    /// with one command on stdin; returns its stdout, panicking if it fails.
    pub fn mps_control(&self, arg: Option<&str>, stdin: &str) -> String {
        let bin = self.require_mps_control();
        let mut c = self.command(bin.to_str().expect("utf-8 path"));
        if let Some(a) = arg {
            c.arg(a);
        }
        let mut ch = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn nvidia-cuda-mps-control: {e}"));
        let _ = ch.stdin.take().expect("stdin").write_all(stdin.as_bytes());
        let out = ch.wait_with_output().expect("wait nvidia-cuda-mps-control");
        assert!(out.status.success(), "nvidia-cuda-mps-control {arg:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts the host's MPS control daemon (`nvidia-cuda-mps-control -d`); returns once it
    /// answers commands. Clients then connect through it, as on a real host: each waits until
    /// the daemon has started its user's server and handed it over.
    pub fn start_mps(&self) {
        self.mps_control(Some("-d"), "");
    }

    /// `quit`: the daemon stops its servers (their clients lose their contexts) and exits;
    /// MPS is off on the device until [`Host::start_mps`] again.
    pub fn quit_mps(&self) {
        self.mps_control(None, "quit\n");
    }

    /// Pids of the running MPS servers (`get_server_list`).
    pub fn mps_servers(&self) -> Vec<u32> {
        self.mps_control(None, "get_server_list\n")
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    fn track(&self, pid: u32) {
        self.pids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(pid);
    }

    /// Starts `cmd` with stdin piped and stdout/stderr captured to files; killed on drop.
    pub fn spawn(&self, cmd: &mut Command) -> EmuChild {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let out = self.path(&format!("child-{n}.out"));
        let err = self.path(&format!("child-{n}.err"));
        self.spawn_to(cmd, out, err, false)
    }

    fn spawn_to(&self, cmd: &mut Command, out: PathBuf, err: PathBuf, append: bool) -> EmuChild {
        let open = |p: &Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .append(append)
                .truncate(!append)
                .open(p)
                .unwrap_or_else(|e| panic!("output file {}: {e}", p.display()))
        };
        // As a shell starts a foreground job: SIGINT and SIGQUIT at their default action even
        // when this process was started with them ignored (a background job of a
        // non-interactive shell, `cmd &`, inherits SIG_IGN for both, and exec keeps an ignored
        // signal ignored). The tests send SIGINT as a user's Ctrl-C; an inherited SIG_IGN
        // would make Python keep it ignored and every such client look hung.
        // SAFETY: the closure runs in the forked child before exec and only calls signal(2),
        // which is async-signal-safe.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                libc::signal(libc::SIGQUIT, libc::SIG_DFL);
                Ok(())
            });
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(open(&out))
            .stderr(open(&err))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        self.track(child.id());
        let stdin = child.stdin.take();
        EmuChild {
            child,
            out,
            err,
            stdin,
            status: None,
        }
    }

    /// Spawns the e2e test client `emu-client` with the given steps.
    pub fn client(&self, steps: &[&str]) -> EmuChild {
        artifact("emu-client");
        let mut c = self.command("emu-client");
        c.args(steps);
        self.spawn(&mut c)
    }

    /// Spawns `sh -c script` with the host's environment; killed on drop.
    pub fn spawn_sh(&self, script: &str) -> EmuChild {
        let mut c = self.node_command("sh");
        c.arg("-c").arg(script);
        self.spawn(&mut c)
    }

    /// `EmuHost::spawn_sh` for a process to [`register`] as offline work: it holds GPU 0's
    /// ledger open ([`hold_ledger`]), as a shimmed offline process does.
    pub fn spawn_sh_offline(&self, script: &str) -> EmuChild {
        let mut c = self.node_command("sh");
        c.arg("-c").arg(script);
        hold_ledger(&mut c, &self.ledger_path());
        self.spawn(&mut c)
    }

    /// Spawns the running test binary again as a helper process running `role` with `arg`
    /// (see [`helper_main`]; the test binary has an `#[ignore]`d `helper_entry` test calling
    /// it, a `harness = false` bench calls it first thing in `main`).
    pub fn spawn_helper(&self, role: &str, arg: &str) -> EmuChild {
        let mut c = self.helper_command(role, arg);
        self.spawn(&mut c)
    }

    /// `EmuHost::spawn_helper` for a process to [`register`] as offline work: it holds GPU
    /// 0's ledger open ([`hold_ledger`]), as a shimmed offline process does.
    pub fn spawn_helper_offline(&self, role: &str, arg: &str) -> EmuChild {
        let mut c = self.helper_command(role, arg);
        hold_ledger(&mut c, &self.ledger_path());
        self.spawn(&mut c)
    }

    fn helper_command(&self, role: &str, arg: &str) -> Command {
        let mut c = self.node_command(
            std::env::current_exe()
                .expect("current_exe")
                .to_str()
                .expect("utf-8 path"),
        );
        c.args([
            "--exact",
            "helper_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV_HELPER, role)
        .env(ENV_HELPER_ARG, arg);
        c
    }

    /// Starts node daemon `program` (`sysmonitor`, `mps-manager`) with `run --config <name>`,
    /// the config file `root()/name` written from `config` unless it exists; stderr (the log)
    /// appended to `root()/name.log` (see [`Host::log`]).
    pub fn start_daemon(&self, program: &str, name: &str, config: &str) -> EmuChild {
        artifact(program);
        let cfg = self.path(name);
        if !cfg.exists() {
            std::fs::write(&cfg, config).unwrap_or_else(|e| panic!("write {}: {e}", cfg.display()));
        }
        let mut c = self.node_command(program);
        c.args(["run", "--config"]).arg(&cfg);
        self.spawn_to(
            &mut c,
            self.path(&format!("{name}.out")),
            self.path(&format!("{name}.log")),
            true,
        )
    }

    /// Starts `sysmonitor run` with `config` (JSON text written to `root()/name` unless it
    /// exists), its log in `root()/name.log`.
    pub fn start_monitor(&self, name: &str, config: &str) -> EmuChild {
        self.start_daemon("sysmonitor", name, config)
    }

    /// Starts `mps-manager run` with `config` (JSON text written to `root()/name` unless it
    /// exists), its log in `root()/name.log`.
    pub fn start_manager(&self, name: &str, config: &str) -> EmuChild {
        self.start_daemon("mps-manager", name, config)
    }

    /// The log of the daemon started with config `name`.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(&format!("{name}.log"))).unwrap_or_default()
    }

    /// Polls the log of the daemon started with config `name` until `pred` holds; panics after
    /// `limit` with the log.
    pub fn wait_log(
        &self,
        limit: Duration,
        what: &str,
        name: &str,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let end = Instant::now() + limit;
        loop {
            let l = self.log(name);
            if pred(&l) {
                return l;
            }
            assert!(
                Instant::now() < end,
                "timed out waiting for {what} in {name}.log:\n{l}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls the monitor's state file until `pred` holds (or panics after `limit`).
    pub fn wait_state(
        &self,
        limit: Duration,
        what: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        wait_json(&self.monitor_state_file(), limit, pred).unwrap_or_else(|last| {
            panic!("timed out waiting for {what}; last state file: {last:#}")
        })
    }

    /// Polls the MPS manager's state file until `pred` holds; panics after `limit` with the
    /// last state and the log of the manager started with config `name`.
    pub fn wait_manager_state(
        &self,
        limit: Duration,
        name: &str,
        what: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        wait_json(&self.manager_state_file(), limit, pred).unwrap_or_else(|last| {
            panic!(
                "timed out waiting for {what}; manager state: {last:#}\nlog:\n{}",
                self.log(name)
            )
        })
    }
}

/// The health state (`healthy`, `overlimit`, ...) in the monitor's state file JSON (`""` if
/// absent).
pub fn monitor_state(v: &serde_json::Value) -> &str {
    v["state"].as_str().unwrap_or("")
}

/// Polls the JSON file `path` every 5 ms until `pred` holds: the value, or (after `limit`)
/// the last value read (`Null` if none).
pub fn wait_json(
    path: &Path,
    limit: Duration,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> Result<serde_json::Value, serde_json::Value> {
    let end = Instant::now() + limit;
    let mut last = serde_json::Value::Null;
    loop {
        if let Some(v) = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        {
            if pred(&v) {
                return Ok(v);
            }
            last = v;
        }
        if Instant::now() >= end {
            return Err(last);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl Default for Host {
    fn default() -> Self {
        Host::new()
    }
}

impl Drop for Host {
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
        if let Some(r) = &self.root {
            if std::env::var_os("E2E_KEEP").is_none() {
                let _ = std::fs::remove_dir_all(r);
            }
        }
    }
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

    /// Sends a signal (to a child not yet reaped, so never to a reused pid).
    pub fn signal(&self, sig: i32) {
        if self.status.is_none() {
            // SAFETY: plain kill(2) on our child's pid, not reaped yet.
            unsafe { libc::kill(self.pid() as i32, sig) };
        }
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) -> ExitStatus {
        if let Some(s) = self.status {
            return s;
        }
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
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits up to `limit` for exit: `Some(signal that ended it, if any)`, `None` if still
    /// running.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<Option<i32>> {
        use std::os::unix::process::ExitStatusExt;
        self.wait_timeout(limit).map(|s| s.signal())
    }

    /// Whether the child is still running.
    pub fn alive(&mut self) -> bool {
        self.wait_timeout(Duration::ZERO).is_none()
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

/// Writes a slot as a hostile ledger client can: registers the calling process (which holds
/// the slot's lock, so no reclaim frees the slot) and rewrites the slot to name `pid` with
/// `start_time`, reporting `bytes`. Any process that can open the ledger can do this; the
/// daemons must never act on such a slot against a process that holds no ledger open.
pub fn forge_slot(ledger: &node_ledger::Ledger, pid: u32, start_time: u64, bytes: u64) -> node_ledger::ProcHandle {
    use std::sync::atomic::Ordering::SeqCst;
    let h = register(ledger, std::process::id(), bytes);
    let slot = &ledger.layout().procs[h.slot];
    let gen = node_ledger::layout::owner_gen(slot.owner.load(SeqCst));
    slot.start_time.store(start_time, SeqCst);
    slot.owner.store(node_ledger::layout::owner_word(gen, pid), SeqCst);
    h
}

/// The fd under which [`hold_ledger`] gives a child the ledger.
pub const HELD_LEDGER_FD: i32 = 200;

/// A pod's cgroup as the kubelet's cgroupfs driver lays it out
/// (`.../kubepods/besteffort/pod<uid>`), made under a directory of this test's own in a
/// writable cgroup hierarchy (cgroup v2 where mounted, else v1's `pids`): a process moved in
/// ([`PodCgroup::add`]) shows the pod in `/proc/<pid>/cgroup` as on a Kubernetes node, which is
/// how the daemons tell a process's pod. Removed on drop, its processes moved back to the
/// hierarchy's root first. Needs root.
pub struct PodCgroup {
    root: PathBuf,
    base: PathBuf,
    dir: PathBuf,
}

impl PodCgroup {
    /// The cgroup of pod `uid`; an error says why none could be made.
    pub fn create(uid: &str) -> Result<Self, String> {
        let root = cgroup_root().ok_or("no cgroup v2 or v1 `pids` hierarchy mounted")?;
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let base = root.join(format!("xshare-test-{}-{n}", std::process::id()));
        let dir = base.join("kubepods").join("besteffort").join(format!("pod{uid}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        Ok(PodCgroup { root, base, dir })
    }

    /// Moves process `pid` into the pod's cgroup.
    pub fn add(&self, pid: u32) -> Result<(), String> {
        let procs = self.dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string()).map_err(|e| format!("write {pid} to {}: {e}", procs.display()))
    }

    /// [`PodCgroup::create`] for a test that needs one: `None` (the test says it skips, and
    /// why) when none can be made (not root, no writable hierarchy).
    pub fn create_or_skip(uid: &str) -> Option<Self> {
        match Self::create(uid) {
            Ok(cg) => Some(cg),
            Err(e) => {
                eprintln!("skipped: needs root and a writable cgroup hierarchy ({e})");
                None
            }
        }
    }

    /// A `sleep 600` in the pod's cgroup holding the ledger at `ledger` open ([`hold_ledger`]),
    /// as a shimmed offline process of the pod does: a process to [`register`] on its behalf.
    pub fn spawn_ledger_holder(&self, ledger: &Path) -> std::process::Child {
        let mut child = spawn_holding(ledger);
        if let Err(e) = self.add(child.id()) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{e}");
        }
        child
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        let left = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in left.split_whitespace() {
            let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
        }
        let mut d = self.dir.clone();
        while d.starts_with(&self.base) {
            let _ = std::fs::remove_dir(&d);
            if !d.pop() {
                break;
            }
        }
    }
}

/// The mount point of the cgroup v2 hierarchy, else of v1's `pids` controller.
fn cgroup_root() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mounts: Vec<(String, String, String)> = info
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let point = pre.split_whitespace().nth(4)?.to_string();
            let mut post = post.split_whitespace();
            let fstype = post.next()?.to_string();
            let opts = post.nth(1).unwrap_or("").to_string();
            Some((point, fstype, opts))
        })
        .collect();
    let v2 = mounts.iter().find(|(_, t, _)| t == "cgroup2");
    let v1 = mounts.iter().find(|(_, t, o)| t == "cgroup" && o.split(',').any(|x| x == "pids"));
    v2.or(v1).map(|(p, _, _)| PathBuf::from(p))
}

/// Makes the process `cmd` starts hold the file `ledger` open (as fd [`HELD_LEDGER_FD`],
/// inherited across exec), as a shimmed offline process holds its ledger: the daemons take a
/// registration for offline work only when the process it names holds its slot's lock in the
/// ledger (`node_daemon::procns::HostPids`), so a process [`register`]ed on its behalf must
/// hold the file for [`register`] to give it that lock ([`hold_slot_lock`]). Panics
/// when the file cannot be opened (no ledger yet: start the monitor, or create it, first).
pub fn hold_ledger(cmd: &mut Command, ledger: &Path) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    // Read-write, as the shim opens it: a write lock needs a description open for writing.
    let f = std::fs::OpenOptions::new().read(true).write(true).open(ledger).unwrap_or_else(|e| panic!("open {} to hold it: {e}", ledger.display()));
    // SAFETY: the closure runs in the forked child before exec and only calls dup2(2), which
    // is async-signal-safe; `f` (moved in) keeps the source fd open until the Command drops.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(f.as_raw_fd(), HELD_LEDGER_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A `sleep 600` holding the file `ledger` open ([`hold_ledger`]) and no lock in it, as a
/// daemon holds every ledger of its GPU.
pub fn spawn_holding(ledger: &Path) -> std::process::Child {
    let mut cmd = Command::new("sleep");
    cmd.arg("600");
    hold_ledger(&mut cmd, ledger);
    cmd.spawn().unwrap_or_else(|e| panic!("spawn sleep: {e}"))
}

/// Registers `pid` in `ledger` as an offline process (group `offline-test`, 64 GiB quota)
/// reporting `bytes`, on its behalf: the daemons take it for offline work only if `pid`
/// holds its slot's lock, which it gets here ([`hold_slot_lock`]) when it holds the ledger
/// open (spawn it with `EmuHost::spawn_sh_offline`, `EmuHost::spawn_helper_offline` or
/// [`hold_ledger`]).
pub fn register(ledger: &node_ledger::Ledger, pid: u32, bytes: u64) -> node_ledger::ProcHandle {
    let g = ledger
        .group(node_ledger::ledger::group_id_for("offline-test"), 64 << 30)
        .expect("ledger group");
    let h = ledger.register(pid, g).expect("ledger register");
    hold_slot_lock(pid, h.slot);
    if bytes > 0 {
        ledger.try_reserve(h, bytes).expect("ledger reserve");
    }
    h
}

/// Makes process `pid`, which holds its ledger open as fd [`HELD_LEDGER_FD`] ([`hold_ledger`]),
/// hold registry slot `slot`'s lock, as a shimmed process holds its own slot's: the lock is
/// taken on that process's own open file description, reached with `pidfd_getfd(2)` (root,
/// or the process's parent under the default ptrace scope). Whether it now holds it (`false`:
/// it holds no ledger as that fd, or the lock is someone else's).
pub fn hold_slot_lock(pid: u32, slot: usize) -> bool {
    // SAFETY: pidfd_open(2) with no flags; the result is checked before use.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) } as i32;
    if pidfd < 0 {
        return false;
    }
    // SAFETY: pidfd_getfd(2) on the pidfd just opened, for a target fd number, no flags.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, HELD_LEDGER_FD, 0) } as i32;
    // SAFETY: closing the pidfd we own.
    unsafe { libc::close(pidfd) };
    if fd < 0 {
        return false;
    }
    // On our duplicate of the process's fd: the same description, so the lock is the
    // process's and outlives this fd.
    let ok = node_ledger::ledger::range_lock(
        fd,
        node_ledger::layout::proc_slot_offset(slot),
        node_ledger::layout::PROC_SLOT_LEN,
        libc::F_WRLCK,
    )
    .unwrap_or(false);
    // SAFETY: closing our duplicate; the description (and its lock) stays with the process.
    unsafe { libc::close(fd) };
    ok
}

/// GPU load from this process through the emulated device: back-to-back kernels that fill
/// `sm_frac` of the SMs, until stopped. Like a serving process under a supervisor, it is
/// relaunched (a new registration with the device, as a new process gets) when MPS terminates
/// it (`CUDA_ERROR_MPS_CLIENT_TERMINATED` or a fatal error: real MPS lets such a process use
/// CUDA again only after a relaunch), and makes a new context after any other failure.
pub struct Load {
    stop: Arc<AtomicBool>,
    /// Kernels completed.
    pub kernels: Arc<AtomicU64>,
    /// Failed launches or waits (a lost context).
    pub failures: Arc<AtomicU64>,
    /// Relaunches: the failures that terminated the client, which a real online service pays
    /// for with a process restart.
    pub relaunches: Arc<AtomicU64>,
    th: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    /// Starts the load on the device of `host` with kernels of `kernel_ms` at full clock.
    pub fn start(host: &Host, sm_frac: f64, kernel_ms: f64) -> Load {
        Load::on(host.state_path(), host.profile(), host.pipe_dir(), sm_frac, kernel_ms)
    }

    /// Starts the load on the device state file `state` of profile `profile`, reaching MPS
    /// (when it runs) through the pipe directory `pipe`.
    pub fn on(state: &Path, profile: &str, pipe: &Path, sm_frac: f64, kernel_ms: f64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let kernels = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(AtomicU64::new(0));
        let relaunches = Arc::new(AtomicU64::new(0));
        let (s, k, f, r) = (stop.clone(), kernels.clone(), failures.clone(), relaunches.clone());
        let state = state.to_path_buf();
        let pipe = pipe.to_path_buf();
        let p: &'static Profile = Profile::by_id(profile).unwrap_or(&emu_device::profile::H100);
        let th = std::thread::spawn(move || {
            let dev = Device::open(&state, p).expect("open emulated device");
            dev.set_mps_pipe_dir(&pipe);
            let mut c = dev.attach().expect("attach");
            dev.create_context(&c, None).expect("context");
            let blocks = ((p.sm_count as f64) * sm_frac).max(1.0) as u64;
            let cycles = (p.max_sm_clock_mhz as f64 * 1000.0 * kernel_ms) as u64;
            while !s.load(Ordering::Relaxed) {
                match dev
                    .launch(
                        &c,
                        Launch {
                            blocks,
                            cycles_per_block: cycles,
                            after: 0,
                        },
                    )
                    .and_then(|t| dev.wait(&c, t))
                {
                    Ok(_) => {
                        k.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        f.fetch_add(1, Ordering::Relaxed);
                        dev.context_destroyed(&c);
                        if matches!(e, EmuError::MpsClientTerminated | EmuError::MpsFatalError | EmuError::NoSuchClient(_)) {
                            r.fetch_add(1, Ordering::Relaxed);
                            dev.detach(&c);
                            match dev.attach() {
                                Ok(n) => c = n,
                                Err(_) => {
                                    std::thread::sleep(Duration::from_millis(5));
                                    continue;
                                }
                            }
                        }
                        let _ = dev.create_context(&c, None);
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            }
            dev.context_destroyed(&c);
            dev.detach(&c);
        });
        Load {
            stop,
            kernels,
            failures,
            relaunches,
            th: Some(th),
        }
    }

    /// Stops the load and joins its thread.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.th.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Variable naming a helper process's role (see [`Host::spawn_helper`]).
pub const ENV_HELPER: &str = "NODE_TEST_HELPER";
/// Variable holding a helper process's argument.
pub const ENV_HELPER_ARG: &str = "NODE_TEST_ARG";

/// Body of a helper process (when `NODE_TEST_HELPER` is set; returns at once otherwise):
/// `gpu-mem` attaches to the emulated device, allocates `NODE_TEST_ARG` MiB and sleeps until
/// killed; `gpu-mem-stubborn` does the same ignoring SIGTERM (a job that does not stop when
/// evicted, which only SIGKILL ends), with kernels back to back (one always in flight, as a
/// training job's); `gpu-mem-registered` registers itself in GPU 0's ledger first, reporting
/// what it then allocates (a shimmed offline process, as far as the daemons can tell).
pub fn helper_main() {
    let Ok(role) = std::env::var(ENV_HELPER) else {
        return;
    };
    let arg: u64 = std::env::var(ENV_HELPER_ARG)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    match role.as_str() {
        "gpu-mem" | "gpu-mem-stubborn" => {
            if role == "gpu-mem-stubborn" {
                // SAFETY: SIG_IGN for SIGTERM, set before any other thread exists.
                unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
            }
            let dev = Device::open_from_env().expect("open emulated device");
            let c = dev.attach().expect("attach");
            dev.create_context(&c, None).expect("context");
            dev.alloc(&c, arg << 20, 512).expect("alloc");
            if role == "gpu-mem-stubborn" {
                // A few SMs for about half a second per kernel, back to back, until its MPS
                // work is terminated (then it waits for the SIGKILL like a hung job).
                let l = emu_device::Launch { blocks: 4, cycles_per_block: 500_000_000, after: 0 };
                while let Ok(t) = dev.launch(&c, l) {
                    if dev.wait(&c, t).is_err() {
                        break;
                    }
                }
            }
            loop {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        "gpu-mem-registered" => {
            // As a shimmed process: registered (from its own pid namespace, holding the ledger
            // open) before it makes a context, reporting what it allocates.
            let dir = std::env::var_os(ENV_LEDGER_DIR).expect("XSHARE_LEDGER_DIR");
            let ledger = node_ledger::Ledger::open_existing(&node_ledger::config::ledger_path(Path::new(&dir), 0))
                .expect("the monitor's ledger");
            let _h = register(&ledger, std::process::id(), arg << 20);
            let dev = Device::open_from_env().expect("open emulated device");
            let c = dev.attach().expect("attach");
            dev.create_context(&c, None).expect("context");
            dev.alloc(&c, arg << 20, 512).expect("alloc");
            loop {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        other => panic!("unknown helper role {other}"),
    }
}
