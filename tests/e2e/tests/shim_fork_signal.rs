//! A child forked while another thread is inside the shim's `sigaction` must get its
//! application's SIGINT/SIGTERM actions back: the shim's handler only wakes the exit helper
//! thread, which does not survive fork. The fork hook used to restore them only if it could
//! `try_lock` the recorded actions; when another thread held that lock at the moment of fork,
//! the child kept the shim's handler with no helper behind it and every SIGINT/SIGTERM sent to
//! it was lost (it never ended). `exit.test_sigaction_hold_ms` holds the lock in that window
//! every time.

mod shim_support;

use e2e::EmuHost;
use shim_support::*;

/// How long the shim holds the lock inside the client thread's `sigaction`.
const HOLD_MS: u64 = 3000;

#[test]
fn child_forked_while_sigaction_holds_the_lock_ends_on_sigint() {
    let host = EmuHost::new();
    let cfg = host.root().join("xcuda-sigaction-hold.json");
    std::fs::write(&cfg, format!(r#"{{"exit": {{"test_sigaction_hold_ms": {HOLD_MS}}}}}"#)).unwrap();
    let mut c = limited(&host, "shim_client", 1 << 30, "forksig");
    // The fork lands 500 ms into the 3 s hold.
    c.env("XCUDA_CONFIG", &cfg).args(["ctx", "forksig", "500"]);
    let mut child = host.spawn(&mut c);
    let out = child.finish(T);
    let err = child.stderr();
    assert!(err.contains("test hold of the application's signal actions"), "the hold never happened:\n{out}\n{err}");
    // The shim's handler in the child writes to the exit helper's pipe, which the child
    // shares with its parent: the parent's helper took the child's SIGINT as its own and ran
    // the application's handler (exit 42) in the parent.
    let line = out.lines().find(|l| l.starts_with("forksig=")).unwrap_or_else(|| panic!("the client died before reporting on its child (the child's SIGINT reached the parent?):\n{out}\n{err}"));
    let how = e2e::field(line, "forksig").unwrap_or("?");
    eprintln!("{line}");
    // Ended by its application's handler (exit 42: the fork waited for the sigaction in
    // progress) or by SIGINT's default action (the fork came first): either way not lost.
    assert!(how == "exit:42" || how == "signal:2", "SIGINT sent to a child forked during the hold was lost ({how}):\n{out}\n{err}");
    assert_eq!(e2e::field(line, "sigaction"), Some("0"), "{line}");
}
