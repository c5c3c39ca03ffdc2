//! A damaged ledger (issue 8, observation 3) neither crash-loops the monitor nor kills it: a
//! restarted monitor moves the damaged file aside and creates a fresh one; a running monitor
//! reports the damage once (log and state file) and keeps monitoring.

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e::{monitor_state as state, EmuHost};
use node_ledger::layout::{HEADER_SIZE, LAYOUT_SIZE};

const T: Duration = Duration::from_secs(20);
const CONFIG: &str =
    r#"{ "interval_ms": 10, "state_file_every_ms": 10, "host_memory": { "enabled": false } }"#;

fn error_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("ERROR")).collect()
}

fn aside(ledger: &Path) -> Vec<PathBuf> {
    let name = ledger.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::read_dir(ledger.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("{name}.damaged-"))
        })
        .collect()
}

fn junk(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A valid ledger's bytes with `f` applied.
fn valid_then(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let host = EmuHost::node();
    let p = host.path("l");
    drop(node_ledger::Ledger::open_or_create(&p, 0).unwrap());
    let mut b = std::fs::read(&p).unwrap();
    f(&mut b);
    b
}

#[test]
fn a_restarted_monitor_moves_a_damaged_ledger_aside_and_keeps_monitoring() {
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("random bytes", junk(LAYOUT_SIZE, 7), "magic"),
        ("wrong magic", valid_then(|b| b[0] ^= 0xff), "magic"),
        ("wrong version", valid_then(|b| b[8] = 99), "layout_version"),
        (
            "wrong size",
            valid_then(|b| b.truncate(LAYOUT_SIZE - 64)),
            "total_size",
        ),
        ("too short", junk(HEADER_SIZE / 2, 3), "total_size"),
    ];
    for (what, bytes, field) in cases {
        let n = EmuHost::node();
        let lp = n.ledger_path();
        std::fs::create_dir_all(lp.parent().unwrap()).unwrap();
        std::fs::write(&lp, &bytes).unwrap();
        let mut m = n.start_monitor("mon.json", CONFIG);
        let v = n.wait_state(T, "healthy", |v| state(v) == "healthy");
        assert!(
            m.alive(),
            "{what}: the monitor exited: {}",
            n.log("mon.json")
        );
        let moved = aside(&lp);
        assert_eq!(
            moved.len(),
            1,
            "{what}: the damaged file is kept aside: {moved:?}"
        );
        assert_eq!(
            std::fs::read(&moved[0]).unwrap(),
            bytes,
            "{what}: kept as it was"
        );
        node_ledger::Ledger::open_existing(&lp)
            .unwrap_or_else(|e| panic!("{what}: the fresh ledger does not validate: {e}"));
        let log = n.log("mon.json");
        let errs = error_lines(&log);
        assert_eq!(errs.len(), 1, "{what}: exactly one error line: {log}");
        assert!(
            errs[0].contains(&*lp.to_string_lossy()) && errs[0].contains(field),
            "{what}: the error names the file and the field `{field}`: {}",
            errs[0]
        );
        assert!(
            v["ledger_error"]
                .as_str()
                .is_some_and(|e| e.contains(field)),
            "{what}: the state file reports it: {v:#}"
        );
    }
}

fn poke(path: &Path, offset: u64, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(bytes).unwrap();
}

#[test]
fn a_running_monitor_reports_a_damaged_header_once_and_keeps_running() {
    // A version this build never reads (7 was "wrong" until it became the current one).
    let other_version = (node_ledger::layout::LAYOUT_VERSION + 1).to_le_bytes();
    for (what, offset, bytes) in [
        ("wrong magic", 0u64, &b"NOTLEDGR"[..]),
        ("wrong version", 8, &other_version[..]),
    ] {
        let n = EmuHost::node();
        let mut m = n.start_monitor("mon.json", CONFIG);
        n.wait_state(T, "healthy", |v| state(v) == "healthy");
        poke(&n.ledger_path(), offset, bytes);
        let v = n.wait_state(T, "ledger_error", |v| v["ledger_error"].is_string());
        // Some more ticks: the error must not repeat.
        let samples = v["samples"].as_u64().unwrap();
        n.wait_state(T, "more samples", |v| {
            v["samples"].as_u64().unwrap() > samples + 20
        });
        assert!(m.alive(), "{what}: the monitor died: {}", n.log("mon.json"));
        let log = n.log("mon.json");
        assert_eq!(error_lines(&log).len(), 1, "{what}: one error line: {log}");
        assert!(
            aside(&n.ledger_path()).is_empty(),
            "{what}: a running monitor leaves the file in place"
        );
    }
}

#[test]
fn a_running_monitor_survives_truncation_and_a_restart_recreates_the_ledger() {
    let n = EmuHost::node();
    let mut m = n.start_monitor("mon.json", CONFIG);
    n.wait_state(T, "healthy", |v| state(v) == "healthy");
    std::fs::OpenOptions::new()
        .write(true)
        .open(n.ledger_path())
        .unwrap()
        .set_len(0)
        .unwrap();
    let v = n.wait_state(T, "ledger_error", |v| v["ledger_error"].is_string());
    assert!(
        v["ledger_error"].as_str().unwrap().contains("total_size"),
        "{v:#}"
    );
    let samples = v["samples"].as_u64().unwrap();
    n.wait_state(T, "more samples", |v| {
        v["samples"].as_u64().unwrap() > samples + 20
    });
    assert!(m.alive(), "the monitor died: {}", n.log("mon.json"));
    assert_eq!(
        error_lines(&n.log("mon.json")).len(),
        1,
        "{}",
        n.log("mon.json")
    );
    // Restarted (Restart=always): the emptied file is moved aside and a fresh one created.
    m.signal(libc::SIGTERM);
    assert!(m.wait_exit(T).is_some(), "the monitor did not stop");
    let m2 = n.start_monitor("mon.json", CONFIG);
    n.wait_state(T, "healthy again", |v| {
        state(v) == "healthy"
            && v["monitor_pid"] == m2.pid()
            && v["ledger_error"]
                .as_str()
                .is_some_and(|e| e.contains("moved to"))
    });
    assert_eq!(
        aside(&n.ledger_path()).len(),
        1,
        "the emptied file is kept aside"
    );
    node_ledger::Ledger::open_existing(&n.ledger_path()).unwrap();
}

#[test]
fn a_ledger_deleted_under_the_monitor_comes_back_with_its_usage() {
    let n = EmuHost::node();
    let mut m = n.start_monitor("mon.json", CONFIG);
    n.wait_state(T, "healthy", |v| state(v) == "healthy");
    let holder = n.spawn_sh_offline("exec sleep 60");
    let l = node_ledger::Ledger::open_existing(&n.ledger_path()).unwrap();
    let h = e2e::register(&l, holder.pid(), 40 << 20);
    std::fs::remove_file(n.ledger_path()).unwrap();
    let end = std::time::Instant::now() + T;
    while !n.ledger_path().exists() {
        assert!(
            std::time::Instant::now() < end,
            "never restored: {}",
            n.log("mon.json")
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // What a newcomer of that group opens: the usage is still counted, never a fresh 0.
    let again = node_ledger::Ledger::open_or_create(&n.ledger_path(), 0).unwrap();
    assert_eq!(again.group_used(h.group), 40 << 20);
    assert_eq!(
        again.procs().len(),
        1,
        "the holder's registration came along"
    );
    assert!(m.alive());
    // The monitor logs the restore just after putting the file in place: wait for the line.
    let end = std::time::Instant::now() + T;
    while error_lines(&n.log("mon.json")).is_empty() && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        error_lines(&n.log("mon.json")).len(),
        1,
        "{}",
        n.log("mon.json")
    );
}
