//! Hostile arguments to the fake driver get error codes, never a crash, and leave it working.

use e2e::{field, EmuHost};
use std::time::Duration;

const EXPECTED: &[(&str, &str)] = &[
    ("alloc-null-out", "1"),
    ("alloc-zero", "1"),
    ("free-unknown", "1"),
    ("htod-unknown", "1"),
    ("dtoh-past-end", "1"),
    ("double-free-first", "0"),
    ("double-free-second", "1"),
    ("load-garbage", "200"),
    ("load-null", "1"),
    ("getfn-bad-module", "400"),
    ("launch-bad-function", "400"),
    ("sync-bad-stream", "400"),
    ("destroy-bad-ctx", "201"),
    ("errname-unknown", "1"),
    ("meminfo-null", "1"),
    ("device-7", "101"),
    ("elapsed-unrecorded", "400"),
    ("procaddr-null-name", "1"),
    ("memcreate-null-prop", "1"),
    ("hostalloc-unknown-flag", "1"),
    ("hostalloc-documented-flags", "0"),
    ("reserve-past-address-space", "2"),
    ("array3d-past-3d-limit", "1"),
    ("array3d-depth-without-height", "1"),
    ("cubemap-not-square", "1"),
    ("array1d-past-limit", "1"),
    ("array3d-at-limit", "0"),
    ("alloc-after", "0"),
    ("free-after", "0"),
];

#[test]
fn hostile_arguments_get_errors_and_the_driver_keeps_working() {
    let host = EmuHost::new();
    let mut c = host.client(&["ctx", "hostile", "meminfo"]);
    let status = c
        .wait_timeout(Duration::from_secs(30))
        .expect("client exits");
    assert!(
        status.success(),
        "client died: {status:?}\n{}\n{}",
        c.stdout(),
        c.stderr()
    );
    let lines = c.lines("hostile ");
    assert_eq!(lines.len(), EXPECTED.len(), "{}", c.stdout());
    for (l, (case, rc)) in lines.iter().zip(EXPECTED) {
        assert_eq!(
            (field(l, "case").unwrap(), field(l, "rc").unwrap()),
            (*case, *rc),
            "{l}"
        );
    }
    assert_eq!(host.device().snapshot().memory_used, 0);
}

#[test]
fn forked_child_cannot_use_the_parents_driver_state() {
    let host = EmuHost::new();
    let mut c = host.client(&["ctx", "fork"]);
    c.finish(Duration::from_secs(30));
    assert_eq!(
        c.lines("forked-child"),
        vec!["forked-child meminfo=3".to_string()],
        "CUDA_ERROR_NOT_INITIALIZED"
    );
    assert_eq!(
        c.lines("fork-parent"),
        vec!["fork-parent meminfo=0".to_string()]
    );
}
