//! Harness for end-to-end tests: the workspace's one emulated GPU host,
//! [`workloads::host::Host`] (here also named [`EmuHost`]), plus parsing helpers.
//!
//! [`EmuHost::new`] makes a private temp dir with its own state file, a `lib/` dir whose
//! `libcuda.so.1` / `libnvidia-ml.so.1` link to the workspace's built fake libraries, a `bin/`
//! dir with `nvidia-cuda-mps-control`, MPS pipe/log dirs and a ledger dir. [`EmuHost::command`]
//! returns a `Command` wired to all of it; [`EmuHost::spawn`] runs it with output captured to
//! files and kills it when the handle (or the host) is dropped; [`EmuHost::start_monitor`] and
//! [`EmuHost::start_manager`] run the node daemons on it. Run
//! `cargo build --workspace --all-targets` first: nothing here builds.
//! Set `E2E_KEEP=1` to keep the per-test dirs (state file, child output) for inspection, and
//! `E2E_TARGET_DIR` to take the artifacts from another `target/<profile>/` dir.

use std::path::PathBuf;
use std::time::Duration;

pub mod client;
pub mod nvml_sampler;

pub use emu_device;
pub use workloads::host::{
    artifact, chmod, forge_slot, helper_main, hold_ledger, is_root, lacks_root, manager_compute_mode, monitor_state, register, target_dir,
    wait_json, EmuChild, Host, Load, PodCgroup,
};

/// The emulated host of the e2e tests: the same type as [`workloads::host::Host`].
pub type EmuHost = Host;

/// Generous bound for any single child.
pub const T: Duration = Duration::from_secs(60);

/// Polls `f` every 20 ms until it answers, panicking after `limit` with `what` it waited for.
pub fn wait_until<V>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<V>) -> V {
    let end = std::time::Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(std::time::Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
/// One MiB.
pub const MIB: u64 = 1 << 20;

/// The Python trainer the Ctrl-C tests stop (`python/ctrl_c_trainer.py`): NVIDIA
/// cuda-bindings, a primary context and 1 MiB held, `ready`, then idle until interrupted.
pub fn ctrl_c_trainer() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/ctrl_c_trainer.py")
}

/// An MPS neighbour on `host` (an `emu-client`): a context, `ready`, then one small kernel per
/// line it reads, `runs` times. Returns once it is ready.
pub fn kernel_neighbour(host: &EmuHost, runs: usize) -> EmuChild {
    let mut b = spawn_kernel_neighbour(host, runs);
    b.wait_for_line("ready", T).expect("neighbour ready");
    b
}

/// The neighbour of [`kernel_neighbour`], spawned but not yet waited for (to diagnose one
/// that never gets ready).
pub fn spawn_kernel_neighbour(host: &EmuHost, runs: usize) -> EmuChild {
    let mut steps = vec!["ctx", "ready"];
    for _ in 0..runs {
        steps.extend(["wait", "spin", "1", "1000", "1"]);
    }
    host.client(&steps)
}

/// Value of `key=` in a `k=v k=v` line.
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

/// `name` from the environment parsed as `T`, or `default` when unset or unparsable (the
/// knobs of the stress tools).
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A stress tool's seed: `name` from the environment, else one from the clock; printed as
/// `name=seed` so a run can be replayed.
pub fn seed_from_env(name: &str) -> u64 {
    let seed = env_or(name, 0u64);
    let seed = if seed != 0 {
        seed
    } else {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1
    };
    eprintln!("{name}={seed}");
    seed
}

/// The result code of the `nth` line (from 0) a client printed for `step` (`STEP=RC ...`),
/// panicking with all the lines if there is no such line.
pub fn step_rc(lines: &[String], step: &str, nth: usize) -> String {
    let key = format!("{step}=");
    lines
        .iter()
        .filter(|l| l.starts_with(&key))
        .nth(nth)
        .map(|l| field(l, step).unwrap().to_string())
        .unwrap_or_else(|| panic!("no {step} #{nth} in {lines:?}"))
}

/// A xorshift64 generator: the stress tools' reproducible randomness (no dependency).
#[derive(Clone, Debug)]
pub struct XorShift(pub u64);

impl XorShift {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Numeric value of `key=` in a line, panicking with the line if absent.
pub fn num(line: &str, key: &str) -> f64 {
    field(line, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no numeric {key}= in {line:?}"))
}

/// An emulated node whose device, ledger and MPS directories every user may use (offline jobs
/// run as uid 65534 when the tests run as root), with its ledger created as the node daemons
/// create it; no daemon is started.
pub fn node_for_all_users() -> EmuHost {
    let n = EmuHost::node();
    n.open_to_all_users();
    for d in [n.ledger_dir().to_path_buf(), n.ledger_dir().join("gpu0")] {
        std::fs::create_dir_all(&d).unwrap();
        chmod(&d, 0o755);
    }
    node_ledger::Ledger::open_or_create(&n.ledger_path(), 0).expect("ledger");
    n
}

/// An mps-manager config for the emulated host: the emulated control program, fast periods
/// and no rate limit on resets (tests make several faults in a few seconds); `quit_on_exit`
/// as given, or the built-in default when `None`.
pub fn fast_manager_config(quit_on_exit: Option<bool>) -> String {
    let quit = quit_on_exit.map_or(String::new(), |q| format!("\n  \"quit_on_exit\": {q},"));
    format!(
        r#"{{
  "control_bin": "{}",
  "command_timeout_ms": 1000,
  "period_ms": 50,
  "check_every_ms": 100,
  "evict_grace_ms": 1000,{quit}
  "compute_mode": "{mode}",
  "shm_dir": "host",
  "budget": {{ "headroom_pct": 10, "min_pct": 10, "max_pct": 90, "min_step_pct": 5, "smoothing": 1.0, "unsafe_pct": 10 }},
  "detect": {{ "stuck_after_ms": 0 }},
  "recovery": {{ "min_interval_ms": 0, "max_per_hour": 20 }}
}}
"#,
        artifact("emu-mps-control").display(),
        mode = manager_compute_mode()
    )
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

/// A shell script making node-agent's Allocate `mounts` (host path, container path,
/// read-only) that lie under `under` (the ledger
/// directory, where the tests give the container paths equal to the host paths) as a container
/// runtime makes them: bind mounts, parents before children, a missing mount point made first
/// (a directory for a directory, an empty file for a file: the pod's termination file), the
/// read-only ones remounted read-only; run it in a mount namespace of its own
/// (`unshare -m --propagation private`). Exits 89 when a mount point cannot be made, 90/91 when
/// a mount fails.
pub fn allocate_mounts_script<'a>(mounts: impl IntoIterator<Item = (&'a str, &'a str, bool)>, under: &std::path::Path) -> String {
    let under = under.to_string_lossy();
    let mut ours: Vec<_> = mounts.into_iter().filter(|(_, ctr, _)| ctr.starts_with(under.as_ref())).collect();
    ours.sort_by_key(|(_, ctr, _)| ctr.matches('/').count());
    let mut script = String::from("set -u\n");
    for (host, ctr, ro) in ours {
        script += &format!("[ -e '{ctr}' ] || {{ if [ -d '{host}' ]; then mkdir -p '{ctr}'; else touch '{ctr}'; fi; }} || exit 89\n");
        script += &format!("mount --bind '{host}' '{ctr}' || exit 90\n");
        if ro {
            script += &format!("mount -o remount,bind,ro '{ctr}' || exit 91\n");
        }
    }
    script
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
