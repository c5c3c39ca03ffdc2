//! A ledger damaged under running shimmed processes (issue 8, observation 3): they notice on
//! their controller tick, refuse new allocations (frees still work) with one error line, and
//! a zeroed body never lets a newcomer re-create the group with a fresh 0 usage.

mod shim_support;

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use e2e::{EmuChild, EmuHost};
use node_ledger::layout::{HEADER_SIZE, LAYOUT_SIZE};
use shim_support::*;

const QUOTA: u64 = 64 * MIB;
const REFUSAL: &str = "refusing new device allocations";

fn poke(path: &Path, offset: u64, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(bytes).unwrap();
}

fn ledger_file(host: &EmuHost) -> std::path::PathBuf {
    node_ledger::config::ledger_path(&ledger_dir(host), 0)
}

fn wait_stderr(c: &EmuChild, what: &str) {
    let end = Instant::now() + T;
    while !c.stderr().contains(what) {
        assert!(Instant::now() < end, "no `{what}` in stderr:\n{}", c.stderr());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A process holding 40 MiB of a 64 MiB quota, then (after `go`) allocating 1 MiB and freeing its last allocation.
fn holder(host: &EmuHost) -> EmuChild {
    let big = (40 * MIB).to_string();
    let small = MIB.to_string();
    let mut a = host.spawn(limited(host, "shim_client", QUOTA, "ctr").args([
        "ctx", "alloc", &big, "ready", "wait", "alloc", &small, "free",
    ]));
    assert!(a.wait_for_line("ready", T).is_some(), "{}", a.stderr());
    assert_eq!(rc_of(&a.lines("alloc="), "alloc="), ["0"], "{}", a.stderr());
    a
}

fn damage_then_check(damage: impl FnOnce(&Path), field: &str) {
    let host = EmuHost::new();
    let l = ledger(&host);
    let mut a = holder(&host);
    damage(&ledger_file(&host));
    wait_stderr(&a, REFUSAL);
    a.send_line("go");
    let out = a.finish(T);
    let lines: Vec<String> = out.lines().map(str::to_string).collect();
    assert_eq!(
        rc_of(&lines, "alloc="),
        ["0", "2"],
        "{field}: the next allocation is refused: {out}\n{}",
        a.stderr()
    );
    assert_eq!(
        rc_of(&lines, "free="),
        ["0"],
        "{field}: frees still work: {out}"
    );
    let errs: Vec<String> = a
        .stderr()
        .lines()
        .filter(|l| l.contains(REFUSAL))
        .map(str::to_string)
        .collect();
    assert_eq!(errs.len(), 1, "{field}: one error line: {}", a.stderr());
    assert!(errs[0].contains(field), "{field}: named: {}", errs[0]);
    drop(l);
}

#[test]
fn a_header_overwritten_under_a_running_process_stops_its_allocations() {
    damage_then_check(|p| poke(p, 0, b"NOTLEDGR"), "magic");
    damage_then_check(|p| poke(p, 8, &[9, 0, 0, 0]), "layout_version");
}

#[test]
fn a_zeroed_body_stops_the_holder_and_is_never_a_fresh_quota_for_a_newcomer() {
    let host = EmuHost::new();
    let _l = ledger(&host);
    let mut a = holder(&host);
    // Everything after the header zeroed: the group (40 MiB used) and the registry are gone.
    poke(
        &ledger_file(&host),
        HEADER_SIZE as u64,
        &vec![0u8; LAYOUT_SIZE - HEADER_SIZE],
    );
    wait_stderr(&a, REFUSAL);
    assert!(a.stderr().contains("groups.id"), "{}", a.stderr());
    // A newcomer of the same container must not get the whole quota again.
    let b = run(
        &host,
        limited(&host, "shim_client", QUOTA, "ctr").args(["ctx", "alloc", &(40 * MIB).to_string()]),
    );
    assert_eq!(rc_of(&b, "alloc="), ["2"], "80 MiB held against a 64 MiB quota: {b:?}");
    a.send_line("go");
    let out = a.finish(T);
    let lines: Vec<String> = out.lines().map(str::to_string).collect();
    assert_eq!(rc_of(&lines, "alloc="), ["0", "2"], "{out}");
}

#[test]
fn a_truncated_ledger_does_not_kill_a_process_holding_memory() {
    let host = EmuHost::new();
    let _l = ledger(&host);
    let big = (40 * MIB).to_string();
    let small = MIB.to_string();
    // Allocates right after the truncation, racing its own controller's check: the hot path
    // may touch the truncated mapping first (SIGBUS without the handler).
    let mut a = host.spawn(limited(&host, "shim_client", QUOTA, "ctr").args([
        "ctx", "alloc", &big, "ready", "wait", "alloc", &small, "alloc", &small, "wait", "alloc",
        &small, "free",
    ]));
    assert!(a.wait_for_line("ready", T).is_some(), "{}", a.stderr());
    std::fs::OpenOptions::new()
        .write(true)
        .open(ledger_file(&host))
        .unwrap()
        .set_len(0)
        .unwrap();
    a.send_line("go");
    wait_stderr(&a, REFUSAL);
    a.send_line("go");
    let out = a.finish(T);
    let st = a.wait_timeout(Duration::ZERO).unwrap();
    assert!(st.success(), "the process died: {st:?}\n{out}\n{}", a.stderr());
    let lines: Vec<String> = out.lines().map(str::to_string).collect();
    let rcs = rc_of(&lines, "alloc=");
    assert_eq!(rcs.first().map(String::as_str), Some("0"), "{out}");
    assert!(rcs[1..].iter().all(|r| r == "2"), "nothing more is granted: {out}");
    assert_eq!(rc_of(&lines, "free="), ["0"], "frees still work: {out}");
    assert_eq!(
        a.stderr().lines().filter(|l| l.contains(REFUSAL)).count(),
        1,
        "{}",
        a.stderr()
    );
}
