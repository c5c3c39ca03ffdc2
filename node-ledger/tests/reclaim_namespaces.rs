//! Issue 8 observation 6: a dead container's quota is reclaimed whatever happens to its pid
//! namespace. A real process in its own pid namespace, as uid 65534 (an offline user), registers
//! and reserves, is SIGKILLed with its whole namespace, and another process of the host's
//! namespace reclaims its usage; meanwhile a fresh namespace is started (it may be given the
//! dead namespace's inode number, as in the observation). Needs root for `unshare` and to switch
//! users; says so and passes vacuously otherwise.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use node_ledger::ledger::group_id_for;
use node_ledger::Ledger;

const CHILD_ENV: &str = "NODE_LEDGER_NS_CHILD";
const BYTES: u64 = 3000 << 20;

/// The registrant (run by the test below through this same test binary): registers itself in
/// group "ns-ctr", reserves `BYTES`, says so, and sleeps until killed.
#[test]
fn child_registers_and_waits() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let l = Ledger::open_existing(path.as_ref()).expect("child: open ledger");
    let g = l
        .group(group_id_for("ns-ctr"), 1 << 40)
        .expect("child: group");
    let h = l.register(std::process::id(), g).expect("child: register");
    l.try_reserve(h, BYTES).expect("child: reserve");
    // SAFETY: getuid(2) has no preconditions.
    println!("ready pid={} uid={}", std::process::id(), unsafe {
        libc::getuid()
    });
    std::thread::sleep(Duration::from_secs(600));
}

fn is_root() -> bool {
    // SAFETY: getuid(2) has no preconditions.
    unsafe { libc::getuid() == 0 }
}

#[test]
fn a_killed_namespaced_non_root_process_is_reclaimed_from_the_host_namespace() {
    if !is_root() {
        eprintln!("skipped: needs root for unshare and to run the registrant as uid 65534");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = d.path().join("gpu0/ledger");
    let monitor = Ledger::open_or_create(&path, 0).unwrap();
    let g = monitor.group(group_id_for("ns-ctr"), 1 << 40).unwrap();
    let mut child = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "--mount-proc"])
        .args([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_registers_and_waits",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn unshare");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !line.contains("ready") {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 || Instant::now() > deadline {
            panic!("registrant never got ready");
        }
    }
    assert!(line.contains("uid=65534"), "{line}");
    assert_eq!(monitor.group_used(g), BYTES);
    let slot = monitor
        .procs()
        .into_iter()
        .find(|p| p.mem_bytes == BYTES)
        .expect("registered");
    assert_ne!(
        slot.pid_ns,
        node_ledger::procinfo::own_pid_ns(),
        "the registrant ran in its own pid namespace"
    );
    assert!(monitor.reclaim_dead().unwrap().is_empty(), "alive: kept");

    // The container dies: its init (the registrant, pid 1 there) is SIGKILLed, and the kernel
    // takes the namespace down with it. (unshare's --kill-child would not reach it: setpriv's
    // change of uid clears the parent-death signal.)
    let init = children_of(child.id());
    assert_eq!(init.len(), 1, "unshare's one child: {init:?}");
    // SAFETY: kill(2) on the pid of a process this test started (through unshare).
    assert_eq!(unsafe { libc::kill(init[0] as i32, libc::SIGKILL) }, 0);
    child.wait().unwrap();
    // Another container starts at once (its namespace may reuse the dead one's inode).
    let mut other = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "sleep", "30"])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut reclaimed = Vec::new();
    while reclaimed.is_empty() && Instant::now() < deadline {
        reclaimed = monitor.reclaim_dead().unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    other.kill().unwrap();
    other.wait().unwrap();
    assert_eq!(
        reclaimed.iter().map(|r| r.1).sum::<u64>(),
        BYTES,
        "{reclaimed:?}"
    );
    assert_eq!(monitor.group_used(g), 0);
    assert!(monitor.procs().is_empty());
}

/// Pids of `pid`'s children (its main thread's, as /proc lists them).
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect()
}
