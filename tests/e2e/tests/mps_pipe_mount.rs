//! The MPS pipe directory as node-agent's Allocate gives it to an offline container. Read-write
//! (NVIDIA's device plugin's way; `inject.mps_pipe_read_only: false`, no longer the default), a
//! tenant that is root in its container can unlink the control daemon's `control` socket and
//! put one of its own there: later MPS clients of the GPU and mps-manager's commands would reach
//! the tenant's process. With `inject.mps_pipe_read_only` it cannot, and its own MPS clients
//! still reach MPS. Needs root (mount namespaces).

use std::time::{Duration, Instant};

use e2e::EmuHost;

#[test]
#[ignore = "helper-process entry point, run by the other tests"]
fn helper_entry() {
    e2e::helper_main();
}

/// The Allocate mounts under the ledger directory (container paths = host paths), made as a
/// container runtime makes them (parents first, read-only ones remounted read-only), then what a
/// root tenant tries in the pipe directory, each attempt's exit status printed as `name=rc`.
fn tenant_script(n: &EmuHost, read_only_pipe: bool) -> String {
    let mut cfg = node_agent::config::AgentConfig { ledger_dir: n.ledger_dir().to_path_buf(), ..Default::default() };
    cfg.inject.ledger_container_dir = n.ledger_dir().to_path_buf();
    cfg.inject.mps_pipe_read_only = read_only_pipe;
    let (env, mounts) = node_agent::allocate::static_edits(&cfg, 0);
    assert_eq!(env["CUDA_MPS_PIPE_DIRECTORY"], n.pipe_dir().display().to_string());
    let mut script = e2e::allocate_mounts_script(mounts.iter().map(|m| (m.host_path.as_str(), m.container_path.as_str(), m.read_only)), n.ledger_dir());
    let pipe = n.pipe_dir().display().to_string();
    script += &format!(
        "cd '{pipe}' || exit 92\n\
         test -S control; echo socket_seen=$?\n\
         touch planted 2>/dev/null; echo create=$?\n\
         mv control control.theirs 2>/dev/null; echo rename=$?\n\
         rm -f control 2>/dev/null; echo unlink=$?\n\
         exec \"$@\"\n"
    );
    script
}

fn rc(text: &str, k: &str) -> String {
    text.lines().find_map(|l| l.strip_prefix(&format!("{k}="))).unwrap_or("?").to_string()
}

/// Runs [`tenant_script`] in a mount namespace of its own, then, in there, an emulated MPS
/// client holding a context (`gpu-mem`); returns whether it became an MPS client, and the
/// script's output.
fn tenant_then_client(n: &EmuHost, read_only_pipe: bool) -> (bool, String) {
    let script = tenant_script(n, read_only_pipe);
    let exe = std::env::current_exe().unwrap();
    let mut c = n.node_command("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c", &script, "sh"])
        .arg(exe)
        .args(["--exact", "helper_entry", "--ignored", "--nocapture", "--test-threads=1"])
        .env("NODE_TEST_HELPER", "gpu-mem")
        .env("NODE_TEST_ARG", "16");
    let mut child = n.spawn(&mut c);
    let dev = n.device();
    let pid = child.pid();
    let end = Instant::now() + Duration::from_secs(20);
    let mut on_mps = false;
    while Instant::now() < end && child.alive() {
        // Once its context exists (it then allocates): on MPS or on a context of its own.
        if let Some(p) = dev.snapshot().processes.iter().find(|p| p.pid == pid && p.contexts > 0 && p.used_memory > p.context_memory) {
            on_mps = p.mps_client;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.signal(libc::SIGKILL);
    let _ = child.wait_exit(Duration::from_secs(10));
    (on_mps, child.stdout() + &child.stderr())
}

#[test]
fn a_root_tenant_cannot_replace_the_mps_control_socket_through_a_read_only_pipe_mount() {
    if e2e::lacks_root("make mount namespaces") {
        return;
    }
    let n = EmuHost::node();
    let _status = n.status_writer();
    n.start_mps();
    let control = n.pipe_dir().join("control");
    let id = |p: &std::path::Path| std::fs::metadata(p).ok().map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    let before = id(&control).expect("the control daemon's socket");

    let (on_mps, text) = tenant_then_client(&n, true);
    assert_eq!(rc(&text, "socket_seen"), "0", "{text}");
    for k in ["create", "rename", "unlink"] {
        assert_ne!(rc(&text, k), "0", "{k} in a read-only pipe directory: {text}");
    }
    assert!(on_mps, "the tenant's client reached MPS through the read-only mount: {text}");
    assert_eq!(id(&control), Some(before), "the daemon's socket is the one it bound");
    assert!(!n.pipe_dir().join("planted").exists());

    // Read-write (the default): the same tenant takes the socket away from every later client.
    let (_, text) = tenant_then_client(&n, false);
    assert_eq!(rc(&text, "rename"), "0", "{text}");
    assert_ne!(id(&control), Some(before), "read-write, the tenant moved the daemon's socket away");
    // Put it back, so that the host's teardown reaches the daemon.
    std::fs::rename(n.pipe_dir().join("control.theirs"), &control).unwrap();
}
