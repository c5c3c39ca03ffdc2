//! MPS serves one user at a time, through the emulated control daemon and libcuda, as
//! nvidia-cuda-mps-control(1) describes it: a client of a user other than the running
//! server's is queued (its CUDA initialisation blocks) until that server's clients are done;
//! then the server exits and one for the queued user starts, running as that user.

use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use e2e::{field, lacks_root, EmuHost};

const T: Duration = Duration::from_secs(60);
const NOBODY: u32 = 65534;

/// `(pid, effective uid)` of each MPS server.
fn servers(host: &EmuHost) -> Vec<(u32, u32)> {
    host.mps_control(None, "get_server_list\n")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .map(|pid: u32| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            let uid = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|u| u.parse().ok())
                .unwrap();
            (pid, uid)
        })
        .collect()
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_client_of_another_user_waits_until_the_servers_clients_are_done() {
    if lacks_root("run a client as uid 65534") {
        return;
    }
    let host = EmuHost::new();
    let dev = host.device();
    host.open_to_all_users();
    host.mps_control(Some("-d"), "");

    // Root's client holds a context: the server is root's.
    let mut a = host.client(&[
        "ctx", "ready", "wait", "spin", "1", "1000", "1", "ready", "wait",
    ]);
    assert!(a.wait_for_line("ready", T).is_some(), "{}", a.stderr());
    wait_until("root's server", || servers(&host).len() == 1);
    assert_eq!(servers(&host)[0].1, 0);

    // nobody's client is queued: CUDA initialisation blocks.
    let mut b = host.spawn(
        host.command("emu-client")
            .uid(NOBODY)
            .gid(NOBODY)
            .args(["ctx", "spin", "1", "1000", "1", "ready", "wait"]),
    );
    wait_until("nobody's client queued", || {
        dev.snapshot()
            .processes
            .iter()
            .any(|p| p.pid == b.pid() && p.mps_queued && p.uid == NOBODY)
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        b.stdout().lines().all(|l| !l.starts_with("ctx=")),
        "a client of another user got a context beside root's: {}",
        b.stdout()
    );
    assert!(b.wait_timeout(Duration::ZERO).is_none(), "{}", b.stderr());
    assert!(b.stderr().contains("one user at a time"), "{}", b.stderr());
    let listed = servers(&host);
    assert_eq!(listed.len(), 1, "one server at a time: {listed:?}");
    assert_eq!(listed[0].1, 0);

    // Root's client keeps working meanwhile.
    a.send_line("go");
    let l = a.wait_for_line("spin=", T).expect("root's client runs");
    assert_eq!(field(&l, "spin"), Some("0"), "{l}");

    // Root's client is done: nobody's server replaces root's, and nobody's client runs.
    a.send_line("go");
    a.finish(T);
    let l = b.wait_for_line("spin=", T).expect("queued client served");
    assert_eq!(field(&l, "spin"), Some("0"), "{l}");
    assert_eq!(b.lines("ctx=")[0], "ctx=0");
    let listed = servers(&host);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].1, NOBODY, "the new server runs as the queued user");
    b.send_line("go");
    b.finish(T);
    host.mps_control(None, "quit\n");
}
