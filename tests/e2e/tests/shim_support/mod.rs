//! Helpers shared by the shim's end-to-end tests: a limited (LD_PRELOAD=libxcuda.so) command
//! on an emulated host, and the host's ledger.
#![allow(dead_code, unused_imports)]

use std::path::PathBuf;
use std::process::Command;

use e2e::EmuHost;
pub use e2e::{MIB, T};

/// uid and gid of `nobody`, the non-root user offline processes run as in the tests.
pub const NOBODY: u32 = 65534;

/// The built shim.
pub fn shim() -> PathBuf {
    e2e::artifact("libxcuda.so")
}

/// The host's ledger directory (the one its node daemons use, [`EmuHost::ledger_dir`]).
pub fn ledger_dir(host: &EmuHost) -> PathBuf {
    host.ledger_dir().to_path_buf()
}

/// Opens (creating if needed) GPU 0's ledger of the host.
pub fn ledger(host: &EmuHost) -> node_ledger::Ledger {
    node_ledger::Ledger::open_or_create(&node_ledger::config::ledger_path(&ledger_dir(host), 0), 0)
        .expect("ledger")
}

/// Opens (creating if needed) GPU 0's status file of the host for writing: the test publishes
/// there as the monitor or mps-manager would.
pub fn status(host: &EmuHost) -> node_ledger::StatusWriter {
    node_ledger::Status::open_or_create(&node_ledger::config::status_path(&ledger_dir(host), 0), 0).expect("status file")
}

/// `c` run as uid/gid 65534 ([`NOBODY`]), as offline containers run (std drops the
/// supplementary groups when root switches uid).
pub fn as_nobody(c: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    c.uid(NOBODY).gid(NOBODY)
}

/// A host whose device, libraries and ledger directory non-root users can reach, as
/// /dev/nvidia* and the driver are on a GPU host, with the empty `xcuda.json` of [`limited`]
/// readable by them.
pub fn host_for_users() -> EmuHost {
    let host = EmuHost::new();
    host.open_to_all_users();
    std::fs::write(host.root().join("xcuda-empty.json"), "{}").unwrap();
    e2e::chmod(&host.root().join("xcuda-empty.json"), 0o644);
    host
}

/// The slot in `l` of container `name`'s group (made with a 1-byte quota if it has none).
pub fn group_of(l: &node_ledger::Ledger, name: &str) -> usize {
    l.find_group(node_ledger::ledger::group_id_for(name))
        .unwrap_or_else(|| panic!("no quota group {name} in the ledger"))
}

/// Asserts what a `STEP fill STEP extra freeall STEP extra` run under the quota printed: the
/// first allocation of `step` fits, the second is refused with CUDA_ERROR_OUT_OF_MEMORY (2),
/// the one after freeing fits again.
pub fn assert_refused_then_given_back(lines: &[String], step: &str) {
    assert_eq!(
        e2e::step_rc(lines, step, 0),
        "0",
        "{step}: first allocation fits: {lines:?}"
    );
    assert_eq!(
        e2e::step_rc(lines, step, 1),
        "2",
        "{step}: past the quota => CUDA_ERROR_OUT_OF_MEMORY: {lines:?}"
    );
    assert_eq!(
        e2e::step_rc(lines, step, 2),
        "0",
        "{step}: freeing gives the quota back: {lines:?}"
    );
}

/// `program` with the shim preloaded, a quota of `quota` bytes for container `group`.
pub fn limited(host: &EmuHost, program: &str, quota: u64, group: &str) -> Command {
    // An empty config file: a named file that is missing is a config error (fails closed).
    let empty = host.root().join("xcuda-empty.json");
    if !empty.exists() {
        std::fs::write(&empty, "{}").expect("write empty xcuda.json");
    }
    let mut c = host.command(program);
    c.env("LD_PRELOAD", shim())
        .env("XSHARE_LEDGER_DIR", ledger_dir(host))
        .env("XCUDA_CONFIG", empty)
        .env("XCUDA_QUOTA_BYTES", quota.to_string())
        .env("XCUDA_GROUP", group)
        .env("XCUDA_LOG", "info");
    c
}

/// A shimmed offline client with a 1 GiB quota, to be stopped by a signal: the Python Ctrl-C
/// trainer ([`e2e::ctrl_c_trainer`], group `py`) run by `python` when given, else `shim_client`
/// running `c_steps` (group `c`).
pub fn offline_victim(host: &EmuHost, python: Option<&std::path::Path>, c_steps: &[&str]) -> Command {
    match python {
        Some(py) => {
            let mut c = limited(host, py.to_str().unwrap(), 1 << 30, "py");
            c.arg(e2e::ctrl_c_trainer());
            c
        }
        None => {
            let mut c = limited(host, "shim_client", 1 << 30, "c");
            c.args(c_steps);
            c
        }
    }
}

/// Same without the shim (the control run): identical environment minus LD_PRELOAD.
pub fn unlimited(host: &EmuHost, program: &str) -> Command {
    host.command(program)
}

/// The `key=` value of the first stdout line starting with `prefix`.
pub fn rc_of(lines: &[String], prefix: &str) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l.starts_with(prefix))
        .map(|l| {
            e2e::field(l, prefix.trim_end_matches('='))
                .unwrap_or("?")
                .to_string()
        })
        .collect()
}

/// Runs `cmd` to completion and returns its stdout lines.
pub fn run(host: &EmuHost, cmd: &mut Command) -> Vec<String> {
    let mut c = host.spawn(cmd);
    let out = c.finish(T);
    assert!(
        !out.contains("fatal="),
        "client failed:\n{out}\n{}",
        c.stderr()
    );
    out.lines().map(str::to_string).collect()
}

/// `inner` (a [`limited`] command) run as a container of offline pod `pod` on GPU 0, as
/// node-agent's Allocate describes it: the pod's own ledger, made as Allocate makes it, mounted
/// alone where the shim looks for GPU 0's ledger, in a mount namespace of the container's own
/// (and, with `own_pid_ns`, a pid namespace whose init is the client); the client runs as `uid`
/// when given, and the shim is preloaded into it alone (not into `unshare`, `sh` or `setpriv`,
/// which run before the mount). Returns the command and the pod ledger's host path. Needs root.
pub fn in_pod(host: &EmuHost, pod: node_ledger::PodUid, uid: Option<u32>, own_pid_ns: bool, inner: &Command) -> (Command, PathBuf) {
    let mut cfg = node_agent::config::AgentConfig { ledger_dir: host.ledger_dir().to_path_buf(), ..Default::default() };
    cfg.inject.ledger_container_dir = host.ledger_dir().to_path_buf();
    let path = node_agent::allocate::create_pod_ledger(&cfg, 0, pod).expect("the pod's ledger");
    let m = node_agent::allocate::pod_ledger_mount(&cfg, 0, pod);
    let script = e2e::allocate_mounts_script([(m.host_path.as_str(), m.container_path.as_str(), m.read_only)], host.ledger_dir());
    let user = uid.map_or(String::new(), |u| format!("setpriv --reuid={u} --regid={u} --clear-groups "));
    let script = format!("{script}exec {user}env LD_PRELOAD='{}' \"$@\"\n", shim().display());
    let mut c = Command::new("unshare");
    if own_pid_ns {
        c.args(["--pid", "--fork"]);
    }
    c.args(["-m", "--propagation", "private", "sh", "-c", &script, "sh"]).arg(inner.get_program()).args(inner.get_args());
    c.env_clear();
    for (k, v) in inner.get_envs() {
        if let (Some(v), false) = (v, k == "LD_PRELOAD") {
            c.env(k, v);
        }
    }
    (c, path)
}

/// Builds the C program `source` as `<host root>/<name>` with `cc` (`$CC`), `-std=gnu11 -Wall
/// -Werror` plus `flags`, linked with `-ldl` (clients reach the driver through `dlopen`, as the
/// CUDA runtime does); runnable by every user.
pub fn build_c(host: &EmuHost, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let src = host.root().join(format!("{name}.c"));
    let bin = host.root().join(name);
    std::fs::write(&src, source).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let res = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-Werror"])
        .args(flags)
        .arg(&src)
        .args(["-ldl", "-o"])
        .arg(&bin)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(res.status.success(), "building {name}:\n{}", String::from_utf8_lossy(&res.stderr));
    e2e::chmod(&bin, 0o755);
    bin
}
