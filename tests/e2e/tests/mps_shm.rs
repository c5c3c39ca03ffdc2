//! An MPS server keeps the shared memory its clients attach to in its `/dev/shm`; a client that
//! sees another `/dev/shm` cannot connect (`CUDA_ERROR_MPS_CONNECTION_FAILED`), which is what a
//! container with a `/dev/shm` of its own (every pod's default) meets beside a host-run MPS
//! daemon. mps-manager starts the control daemon, and so its servers, with `shm_dir` bound over
//! `/dev/shm` in a mount namespace of its own; a container given that directory at its
//! `/dev/shm` (as node-agent mounts it) connects, a process with another `/dev/shm` does not.
//!
//! The container is a mount namespace of its own (`unshare --mount`) with the directory bound
//! over `/dev/shm`, the job running as uid 65534 (root only: says so and passes vacuously
//! otherwise).

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;

use e2e::{artifact, is_root, EmuChild, EmuHost};

const T: Duration = Duration::from_secs(20);
const NOBODY: u32 = 65534;

/// The `offline` workload under the shim as uid 65534, in a mount namespace of its own with
/// `shm` bound over `/dev/shm` when given (a container), else seeing the host's `/dev/shm`.
fn offline(n: &EmuHost, shm: Option<&Path>) -> EmuChild {
    let job = n.programs_dir().join("offline");
    let mut c = match shm {
        Some(dir) => {
            let mut c = n.command("unshare");
            c.args(["--mount", "--propagation", "private", "sh", "-c"])
                .arg(r#"mount --bind "$0" /dev/shm && exec setpriv --reuid=65534 --regid=65534 --clear-groups "$@""#)
                .arg(dir)
                .arg(&job);
            c
        }
        None => {
            let mut c = n.command("offline");
            c.uid(NOBODY).gid(NOBODY);
            c
        }
    };
    c.args(["--json", "--blocks", "8", "--kernel-us", "2000", "--report-interval", "0.1", "--state-mb", "4"])
        .env("LD_PRELOAD", artifact("libxcuda.so"))
        .env("XSHARE_LEDGER_DIR", n.ledger_dir())
        .env("XCUDA_GROUP", "shm")
        .env("XCUDA_THROTTLE", "0");
    n.spawn(&mut c)
}

/// The tests' manager config with `shm_dir` = `dir` and `quit_on_exit` as given.
fn config(dir: &Path, quit_on_exit: bool) -> String {
    e2e::fast_manager_config(Some(quit_on_exit)).replace("\"shm_dir\": \"host\"", &format!("\"shm_dir\": \"{}\"", dir.display()))
}

/// The node, as root (`None`, said, otherwise).
fn root_node() -> Option<EmuHost> {
    if !is_root() {
        eprintln!("skipped: needs root (a mount namespace for the daemon and for the container)");
        return None;
    }
    Some(e2e::node_for_all_users())
}

#[test]
fn a_container_given_the_managers_shm_dir_connects_and_one_with_its_own_dev_shm_cannot() {
    let Some(n) = root_node() else { return };
    let shm = n.path("mps-shm");
    let _m = n.start_manager("mps.json", &config(&shm, true));
    let v = n.wait_manager_state(T, "mps.json", "the daemon's /dev/shm checked", |v| v["shm_dir"].is_string());
    assert_eq!(v["shm_dir"].as_str(), Some(shm.to_str().unwrap()), "{v:#}");

    // The container: MPS client of the manager's server, running.
    let mut ctr = offline(&n, Some(&shm));
    assert!(
        ctr.wait_for_line("{\"client\":\"offline\",\"t_s\"", T).is_some(),
        "the container never ran: {}",
        ctr.stderr()
    );
    let p = n.device().snapshot().processes.into_iter().find(|p| p.pid == ctr.pid());
    assert!(p.as_ref().is_some_and(|p| p.mps_client), "an MPS client: {p:?}");

    // A process seeing the host's /dev/shm reaches the daemon but cannot attach to the
    // server's shared memory: no context, said by the shim, and it never runs.
    let mut host_job = offline(&n, None);
    let st = host_job.wait_timeout(T).expect("the job without the server's /dev/shm exits");
    assert!(!st.success(), "{st:?}");
    let err = host_job.stderr();
    assert!(err.contains("CUDA_ERROR_MPS_CONNECTION_FAILED"), "{err}");
    assert!(err.contains("xcuda: the driver could not connect this process to MPS") && err.contains("/dev/shm/xshare-gpu<N>"), "the shim says why: {err}");
    assert!(host_job.lines("{\"client\":\"offline\",\"t_s\"").is_empty(), "it ran: {err}");
    ctr.kill9();
}

/// A restarted manager adopts the running control daemon (MPS keeps serving the online
/// service) and checks its `/dev/shm` again: the same `shm_dir`, recorded; a config changed to
/// another `shm_dir` meanwhile, an error naming the fix, with the daemon left running and its
/// clients connected.
#[test]
fn a_restarted_manager_checks_the_adopted_daemons_dev_shm() {
    let Some(n) = root_node() else { return };
    let shm = n.path("mps-shm");
    std::fs::write(n.path("mps.json"), config(&shm, false)).unwrap();
    let mut m = n.start_manager("mps.json", "");
    let v = n.wait_manager_state(T, "mps.json", "the daemon's /dev/shm checked", |v| v["shm_dir"].is_string());
    let daemon = v["daemon_pid"].as_u64().expect("daemon pid");
    let mut ctr = offline(&n, Some(&shm));
    assert!(ctr.wait_for_line("{\"client\":\"offline\",\"t_s\"", T).is_some(), "{}", ctr.stderr());

    // Restarted with the same config: the daemon adopted, its /dev/shm checked and recorded.
    m.signal(libc::SIGTERM);
    assert!(m.wait_timeout(T).is_some(), "the manager stops on SIGTERM");
    let mut m = n.start_manager("mps.json", "");
    let v = n.wait_manager_state(T, "mps.json", "adopted and checked", |v| v["manager_pid"] == m.pid() && v["daemon_pid"].is_u64());
    assert_eq!((v["daemon_pid"].as_u64(), v["shm_dir"].as_str()), (Some(daemon), shm.to_str()), "{v:#}");

    // Restarted with another shm_dir: the running daemon does not see it; said, left running.
    m.signal(libc::SIGTERM);
    assert!(m.wait_timeout(T).is_some());
    std::fs::write(n.path("mps.json"), config(&n.path("other-shm"), false)).unwrap();
    let m = n.start_manager("mps.json", "");
    let v = n.wait_manager_state(T, "mps.json", "adopted, /dev/shm judged", |v| v["manager_pid"] == m.pid() && v["last_error"].is_string());
    assert_eq!(v["daemon_pid"].as_u64(), Some(daemon), "the daemon left running: {v:#}");
    assert!(v["shm_dir"].is_null(), "{v:#}");
    let e = v["last_error"].as_str().unwrap();
    assert!(e.contains("other-shm") && e.contains("restart MPS"), "{e}");
    let progress = |c: &EmuChild| c.lines("{\"client\":\"offline\",\"t_s\"").len();
    let (before, start) = (progress(&ctr), std::time::Instant::now());
    while progress(&ctr) <= before {
        assert!(start.elapsed() < T && ctr.alive(), "the container keeps running: {}", ctr.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    ctr.kill9();
}
