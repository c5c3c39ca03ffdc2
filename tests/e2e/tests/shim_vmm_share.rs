//! VMM memory shared through a POSIX file descriptor (cuMemExportToShareableHandle /
//! cuMemImportFromShareableHandle) stays in the quota. The hostile loop of one process:
//! cuMemCreate (counted) -> export -> import -> cuMemRelease of the created handle (the shim
//! gave its bytes back: nothing mapped it) -> cuMemMap of the imported one (a handle the shim
//! did not know: uncounted). The driver keeps the memory for the imported handle, and for an
//! open exported fd alone, so repeating it filled the GPU with the ledger at 0. The control
//! runs without the shim (`the_emulated_driver_keeps_...`) go past the quota.

mod shim_support;

use e2e::{EmuChild, EmuHost};
use shim_support::*;

const QUOTA: u64 = 64 * MIB;
const N: u64 = 16 * MIB;
const ROUNDS: usize = 8;

/// Runs `vmmshare N ROUNDS mode` in `c` (a `shim_client` command), holds it at `ready`, and
/// returns each round's result and the device memory NVML lists for the process (its
/// context's own memory taken off): the first reading at most `expect`, or the last one after
/// [`T`]. The emulated driver frees an allocation whose exported fds were all closed from a
/// watcher thread, a moment after the close, so a reading may be higher than it will be, never
/// lower: the first reading is already a bound, later ones only wait for the watcher.
fn share_loop(host: &EmuHost, c: &mut std::process::Command, n: u64, mode: &str, expect: u64) -> (Vec<String>, u64) {
    let mut p: EmuChild = host.spawn(c.args(["ctx", "vmmshare", &n.to_string(), &ROUNDS.to_string(), mode, "ready", "wait"]));
    assert!(p.wait_for_line("ready", T).is_some(), "{}\n{}", p.stdout(), p.stderr());
    assert!(p.stderr().lines().all(|l| !l.contains("ERROR")), "{}", p.stderr());
    let pid = p.pid();
    let dev = host.device();
    let deadline = std::time::Instant::now() + T;
    let used = loop {
        let b = dev.compute_processes().into_iter().find(|&(q, _)| q == pid).map_or(0, |(_, b)| b);
        let used = b.saturating_sub(host.context_bytes());
        if used <= expect || std::time::Instant::now() > deadline {
            break used;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let rounds = p.lines("vmmshare=");
    p.send_line("go");
    p.finish(T);
    (rounds, used)
}

/// A host whose ledger non-root processes can use (made as the monitor makes it: a root
/// service with UMask=0022).
fn users_host() -> EmuHost {
    let host = host_for_users();
    // SAFETY: umask(2) only changes this test process's file-creation mask (every test here
    // sets the same).
    unsafe { libc::umask(0o022) };
    ledger(&host);
    host
}

fn rc_at(rounds: &[String]) -> Vec<(String, String)> {
    rounds.iter().map(|l| (e2e::field(l, "vmmshare").unwrap_or("?").to_string(), e2e::field(l, "at").unwrap_or("?").to_string())).collect()
}

/// The single-process loop as the hostile review wrote it, as `nobody`: refused once the
/// quota is reached, and the process never holds more than the quota on the GPU. Each round
/// counts twice (the exported handle until exit, the imported handle's mapping while mapped:
/// The single-process loop as the hostile review wrote it, as `nobody`: refused once the
/// quota is reached, and the process never holds more than the quota on the GPU. Each round
/// counts twice (the exported handle until exit, the imported handle's mapping while mapped:
/// the documented over-count), so two rounds of a quarter of the quota fit.
#[test]
fn an_export_import_loop_is_refused_at_the_quota() {
    let host = users_host();
    let (rounds, used) = share_loop(&host, as_nobody(&mut limited(&host, "shim_client", QUOTA, "share")), N, "import", 2 * N);
    let got = rc_at(&rounds);
    assert_eq!(got.len(), ROUNDS, "{rounds:?}");
    assert!(got[..2].iter().all(|(rc, _)| rc == "0"), "two rounds fit: {rounds:?}");
    assert!(got[2..].iter().all(|(rc, _)| rc == "2"), "then CUDA_ERROR_OUT_OF_MEMORY: {rounds:?}");
    assert!(used <= QUOTA, "the process holds {used} B on the GPU, quota {QUOTA}: {rounds:?}");
    assert_eq!(used, 2 * N, "{rounds:?}");
}

/// The mapping of a handle the shim did not create is counted for its size while mapped,
/// and refused with CUDA_ERROR_OUT_OF_MEMORY, nothing left mapped, past the quota: with the
/// created handle kept, a round of 20 MiB counts 40, so the second round's map is refused.
#[test]
fn a_mapping_of_an_imported_handle_is_counted_and_refused_past_the_quota() {
    let host = users_host();
    let (rounds, used) = share_loop(&host, as_nobody(&mut limited(&host, "shim_client", QUOTA, "keep")), 20 * MIB, "keep", 20 * MIB);
    let got = rc_at(&rounds);
    assert_eq!(got[0], ("0".into(), "map".into()), "{rounds:?}");
    assert_eq!(got[1], ("2".into(), "map".into()), "the import's mapping is past the quota: {rounds:?}");
    assert!(got[2..].iter().all(|(rc, at)| rc == "2" && at == "create"), "{rounds:?}");
    assert_eq!(used, 20 * MIB, "the refused round left nothing on the GPU: {rounds:?}");
}

/// An exported handle released unmapped: the open fd keeps the memory ("Once all shareable
/// handles are closed and the allocation is released, the allocated memory referenced will be
/// The mapping of a handle the shim did not create is counted for its size while mapped,
/// and refused with CUDA_ERROR_OUT_OF_MEMORY, nothing left mapped, past the quota: with the
/// An exported handle released unmapped, as `nobody`: the open fd keeps the memory ("Once all
/// shareable handles are closed and the allocation is released, the allocated memory
/// referenced will be released"), so its bytes stay counted (until exit: the shim cannot see
/// the fd's copies). Without that, every round's create fitted and the GPU filled.
#[test]
fn an_exported_handle_stays_counted_after_its_release() {
    let host = users_host();
    let (rounds, used) = share_loop(&host, as_nobody(&mut limited(&host, "shim_client", QUOTA, "fd")), N, "fd", 4 * N);
    let got = rc_at(&rounds);
    assert!(got[..4].iter().all(|(rc, _)| rc == "0"), "four rounds fit: {rounds:?}");
    assert!(got[4..].iter().all(|(rc, at)| rc == "2" && at == "create"), "then cuMemCreate is refused: {rounds:?}");
    assert_eq!(used, 4 * N, "{rounds:?}");
}

/// Control runs without the shim: the emulated driver keeps shared memory for every holder
/// (an imported handle's mapping, an open exported fd), so the loops go past the quota.
#[test]
fn the_emulated_driver_keeps_shared_memory_while_a_handle_or_fd_holds_it() {
    let host = EmuHost::new();
    for mode in ["import", "fd", "keep"] {
        let (rounds, used) = share_loop(&host, &mut unlimited(&host, "shim_client"), N, mode, ROUNDS as u64 * N);
        assert!(rc_at(&rounds).iter().all(|(rc, _)| rc == "0"), "{mode}: {rounds:?}");
        assert_eq!(used, ROUNDS as u64 * N, "{mode}: every round's memory is held");
        assert_eq!(host.device().snapshot().memory_allocated(), 0, "{mode}: all given back at exit");
    }
}

/// An exported allocation released unmapped goes once its last fd is closed (no driver call
/// after the close), as a real driver frees it then.
#[test]
fn the_emulated_driver_frees_shared_memory_at_the_last_close() {
    let host = EmuHost::new();
    let (rounds, used) = share_loop(&host, &mut unlimited(&host, "shim_client"), N, "close", 0);
    assert!(rc_at(&rounds).iter().all(|(rc, _)| rc == "0"), "{rounds:?}");
    assert_eq!(used, 0, "released and its fd closed: nothing held");
}

/// The emulated driver, like a real one, exports only a handle created with the fd type in
/// `requestedHandleTypes`.
#[test]
fn export_needs_the_handle_type_requested_at_create() {
    let host = EmuHost::new();
    let (rounds, used) = share_loop(&host, &mut unlimited(&host, "shim_client"), N, "plain", 0);
    assert!(rc_at(&rounds).iter().all(|(rc, at)| rc == "1" && at == "export"), "CUDA_ERROR_INVALID_VALUE: {rounds:?}");
    assert_eq!(used, 0, "each refused round released its handle");
}
