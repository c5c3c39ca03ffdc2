//! Shared harness for the node runtime's emulator tests: an emulated GPU host in a temp dir
//! (device state file, fake NVML on LD_LIBRARY_PATH, ledger directory), real daemon processes,
//! in-test GPU load through the emulated device, and helper processes.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use emu_device::{Device, Launch, Profile};

/// The cargo target directory holding the binaries (…/target/debug).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

static BUILD: Once = Once::new();

/// Builds the emulator pieces these tests run (fake NVML, fake MPS control) and the daemons.
pub fn ensure_built() {
    BUILD.call_once(|| {
        let mut args = vec![
            "build",
            "-q",
            "-p",
            "emu-nvml",
            "-p",
            "emu-mps-control",
            "-p",
            "sysmonitor",
            "-p",
            "mps-manager",
        ];
        // Benchmarks run from target/release: build the same profile as the caller.
        if target_dir().ends_with("release") {
            args.push("--release");
        }
        let st = Command::new(env!("CARGO"))
            .args(&args)
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
            .status()
            .expect("cargo build");
        assert!(st.success(), "building the emulator failed");
    });
}

/// One emulated GPU host.
pub struct EmuNode {
    pub dir: tempfile::TempDir,
    pub state: PathBuf,
    pub ledger_dir: PathBuf,
    pub children: Vec<Child>,
}

impl EmuNode {
    pub fn new() -> EmuNode {
        ensure_built();
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::os::unix::fs::symlink(
            target_dir().join("libnvidia_ml.so"),
            lib.join("libnvidia-ml.so.1"),
        )
        .unwrap();
        let state = dir.path().join("gpu0.state");
        let ledger_dir = dir.path().join("run");
        // Create the device now so every process sees the same profile.
        Device::open(&state, &emu_device::profile::H100).unwrap();
        EmuNode {
            dir,
            state,
            ledger_dir,
            children: Vec::new(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Environment every process on this host gets.
    pub fn envs(&self) -> Vec<(&'static str, std::ffi::OsString)> {
        vec![
            ("GPUEMU_STATE", self.state.clone().into()),
            ("GPUEMU_PROFILE", "h100".into()),
            ("LD_LIBRARY_PATH", self.dir.path().join("lib").into()),
            ("XSHARE_LEDGER_DIR", self.ledger_dir.clone().into()),
            ("RUST_LOG", "info".into()),
        ]
    }

    pub fn device(&self) -> Device {
        Device::open(&self.state, &emu_device::profile::H100).unwrap()
    }

    pub fn ledger_path(&self) -> PathBuf {
        self.ledger_dir.join("gpu0").join("ledger")
    }

    pub fn state_file(&self) -> PathBuf {
        self.ledger_dir.join("gpu0").join("state.json")
    }

    /// Starts `sysmonitor run` with `config` (JSON text written to `name`), stderr to `name.log`.
    pub fn start_monitor(&mut self, name: &str, config: &str) -> usize {
        let cfg = self.path(name);
        if !cfg.exists() {
            std::fs::write(&cfg, config).unwrap();
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(&format!("{name}.log")))
            .unwrap();
        let c = Command::new(target_dir().join("sysmonitor"))
            .args(["run", "--config"])
            .arg(&cfg)
            .envs(self.envs())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children.push(c);
        self.children.len() - 1
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(&format!("{name}.log"))).unwrap_or_default()
    }

    /// Spawns a helper process (shell script) and keeps it for cleanup.
    pub fn spawn_sh(&mut self, script: &str) -> usize {
        let c = Command::new("sh")
            .arg("-c")
            .arg(script)
            .envs(self.envs())
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        self.children.push(c);
        self.children.len() - 1
    }

    /// Spawns this test binary again as a helper running `role` (see `helper_main`).
    pub fn spawn_helper(&mut self, role: &str, arg: &str) -> usize {
        let c = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "helper_entry",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("NODE_TEST_HELPER", role)
            .env("NODE_TEST_ARG", arg)
            .envs(self.envs())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        self.children.push(c);
        self.children.len() - 1
    }

    pub fn pid(&self, i: usize) -> u32 {
        self.children[i].id()
    }

    /// Waits up to `limit` for child `i` to exit; returns the signal that ended it, if any.
    pub fn wait_exit(&mut self, i: usize, limit: Duration) -> Option<Option<i32>> {
        use std::os::unix::process::ExitStatusExt;
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Some(st) = self.children[i].try_wait().unwrap() {
                return Some(st.signal());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    pub fn alive(&mut self, i: usize) -> bool {
        self.children[i].try_wait().unwrap().is_none()
    }

    pub fn signal(&self, i: usize, sig: i32) {
        // SAFETY: signalling our own child, still unreaped so its pid cannot be reused.
        unsafe { libc::kill(self.children[i].id() as i32, sig) };
    }

    /// Polls the monitor's state file until `pred` holds (or panics after `limit`).
    pub fn wait_state(
        &self,
        limit: Duration,
        what: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let end = Instant::now() + limit;
        let mut last = serde_json::Value::Null;
        while Instant::now() < end {
            if let Ok(t) = std::fs::read_to_string(self.state_file()) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&t) {
                    if pred(&v) {
                        return v;
                    }
                    last = v;
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("timed out waiting for {what}; last state file: {last:#}");
    }
}

impl Drop for EmuNode {
    fn drop(&mut self) {
        for c in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Registers `pid` in the ledger as an offline process reporting `bytes`.
pub fn register(ledger: &node_ledger::Ledger, pid: u32, bytes: u64) -> node_ledger::ProcHandle {
    let g = ledger
        .group(node_ledger::ledger::group_id_for("offline-test"), 64 << 30)
        .unwrap();
    let h = ledger.register(pid, g).unwrap();
    if bytes > 0 {
        ledger.try_reserve(h, bytes).unwrap();
    }
    h
}

/// GPU load from this process through the emulated device: back-to-back kernels that fill
/// `sm_frac` of the SMs, until stopped.
pub struct Load {
    stop: Arc<AtomicBool>,
    pub kernels: Arc<std::sync::atomic::AtomicU64>,
    pub failures: Arc<std::sync::atomic::AtomicU64>,
    th: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    pub fn start(state: &Path, sm_frac: f64, kernel_ms: f64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let kernels = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let failures = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (s, k, f) = (stop.clone(), kernels.clone(), failures.clone());
        let state = state.to_path_buf();
        let th = std::thread::spawn(move || {
            let dev = Device::open(&state, &emu_device::profile::H100).unwrap();
            let p: &Profile = &emu_device::profile::H100;
            let c = dev.attach().unwrap();
            dev.context_created(&c, None).unwrap();
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
                    Err(_) => {
                        // Like a serving process: on a lost MPS client context, make a new one.
                        f.fetch_add(1, Ordering::Relaxed);
                        dev.context_destroyed(&c);
                        let _ = dev.context_created(&c, None);
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
            th: Some(th),
        }
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.th.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.th.take() {
            let _ = t.join();
        }
    }
}

/// Body of a helper process (when `NODE_TEST_HELPER` is set): `gpu-mem` attaches to the
/// emulated device, allocates `NODE_TEST_ARG` MiB and sleeps until killed.
pub fn helper_main() {
    let Ok(role) = std::env::var("NODE_TEST_HELPER") else {
        return;
    };
    let arg: u64 = std::env::var("NODE_TEST_ARG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    match role.as_str() {
        "gpu-mem" => {
            let dev = Device::open_from_env().unwrap();
            let c = dev.attach().unwrap();
            dev.context_created(&c, None).unwrap();
            dev.alloc(&c, arg << 20, 512).unwrap();
            loop {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        other => panic!("unknown helper role {other}"),
    }
}
