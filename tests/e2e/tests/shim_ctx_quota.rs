//! Observation 5 (issue 8): a context that dies holding memory (cuCtxDestroy,
//! cuDevicePrimaryCtxReset, the primary context's last cuDevicePrimaryCtxRelease) takes its
//! allocations with it in the driver, so the shim gives their bytes back to the group's quota:
//! usage returns to 0 and an allocation of the full quota then succeeds.

mod shim_support;

use e2e::EmuHost;
use shim_support::*;

const Q: u64 = 64 * MIB;

fn steps_then_full_alloc(death: &[&str], name: &str) -> Vec<String> {
    let host = EmuHost::new();
    let three_q = (Q * 3 / 4).to_string();
    let q = Q.to_string();
    let (first, again) = if death == ["destroy"] {
        ("ctx", "ctx")
    } else {
        ("primary", "primary")
    };
    let mut args = vec![first, "alloc", &three_q, "alloc", "1048576"];
    args.extend_from_slice(death);
    args.extend([again, "meminfo", "alloc", &q]);
    let mut c = limited(&host, "shim_client", Q, name);
    c.args(&args);
    let lines = run(&host, &mut c);
    let allocs = rc_of(&lines, "alloc=");
    assert_eq!(
        allocs,
        vec!["0", "0", "0"],
        "{name}: the full quota fits again after the context died: {lines:?}"
    );
    let mi = lines
        .iter()
        .find(|l| l.starts_with("meminfo="))
        .expect("meminfo");
    assert_eq!(
        e2e::field(mi, "total"),
        Some(Q.to_string().as_str()),
        "{mi}"
    );
    assert_eq!(
        e2e::field(mi, "free"),
        Some(Q.to_string().as_str()),
        "{name}: nothing counted after the death: {mi}"
    );
    lines
}

#[test]
fn destroyed_context_returns_its_memory_to_the_quota() {
    steps_then_full_alloc(&["destroy"], "destroy");
}

#[test]
fn last_primary_release_returns_its_memory_to_the_quota() {
    let l = steps_then_full_alloc(&["release"], "release");
    assert_eq!(rc_of(&l, "release="), vec!["0"]);
}

#[test]
fn primary_reset_returns_its_memory_to_the_quota() {
    let l = steps_then_full_alloc(&["reset"], "reset");
    assert_eq!(rc_of(&l, "reset="), vec!["0"]);
}

/// Stream-ordered allocations belong to their pool, not to the context they were made in:
/// the driver keeps them when the context is destroyed (`cuCtxDestroy` "will not destroy
/// memory allocations by cuMemCreate(), cuMemAllocAsync() and cuMemAllocFromPoolAsync()"), so
/// the quota keeps counting them. The shim gave them back with the context's own: a second
/// full quota then fit beside memory still held.
#[test]
fn a_destroyed_context_keeps_its_stream_ordered_memory_counted() {
    let host = EmuHost::new();
    let (three_q, q) = ((Q * 3 / 4).to_string(), Q.to_string());
    let mut c = limited(&host, "shim_client", Q, "async-destroy");
    c.args(["ctx", "async", &three_q, "destroy", "ctx", "alloc", &q, "alloc", "1048576"]);
    let lines = run(&host, &mut c);
    assert_eq!(rc_of(&lines, "async="), ["0"], "{lines:?}");
    assert_eq!(rc_of(&lines, "destroy="), ["0"], "{lines:?}");
    assert_eq!(
        rc_of(&lines, "alloc="),
        ["2", "0"],
        "the stream-ordered 3/4 of the quota is still held after the destroy: a full quota is refused, a small one fits: {lines:?}"
    );
}

/// A reset does not release the primary context: retained twice around a reset and released
/// once, it is still there (the driver needs every retain released; the emulator forgot the
/// retains at the reset, so a shim's exit-time releases could look complete there and not on
/// a GPU).
#[test]
fn a_reset_primary_context_stays_retained_until_every_retain_is_released() {
    let host = EmuHost::new();
    let mut c = limited(&host, "shim_client", Q, "reset-retains");
    c.args(["primary", "reset", "primary", "release", "alloc", "1048576"]);
    let lines = run(&host, &mut c);
    assert_eq!(rc_of(&lines, "reset="), ["0"], "{lines:?}");
    assert_eq!(rc_of(&lines, "release="), ["0"], "{lines:?}");
    assert_eq!(rc_of(&lines, "alloc="), ["0"], "one retain left: the context lives: {lines:?}");
}

/// Measured in the ledger while the process lives on: the group's usage is back at 0.
#[test]
fn group_usage_is_zero_after_the_destroy_while_the_process_lives() {
    let host = EmuHost::new();
    let mut c = limited(&host, "shim_client", Q, "live");
    c.args([
        "ctx",
        "alloc",
        &(Q / 2).to_string(),
        "ready",
        "destroy",
        "ready",
        "wait",
    ]);
    let mut p = host.spawn(&mut c);
    p.wait_for_line("destroy=", T)
        .unwrap_or_else(|| panic!("{}", p.stderr()));
    let l = ledger(&host);
    let g = l
        .find_group(node_ledger::ledger::group_id_for("live"))
        .unwrap();
    assert_eq!(
        l.group_used(g),
        0,
        "stdout: {} stderr: {}",
        p.stdout(),
        p.stderr()
    );
    p.send_line("go");
    p.finish(T);
}
