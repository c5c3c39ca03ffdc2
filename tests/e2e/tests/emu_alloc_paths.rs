//! Every allocation path of the driver commits device memory on the emulated GPU: visible to
//! other processes, refused past capacity, given back by its free path.

use e2e::{field, num, EmuHost};
use std::time::Duration;

const T: Duration = Duration::from_secs(30);
const MIB: u64 = 1 << 20;

#[test]
fn every_alloc_path_is_accounted_refused_at_capacity_and_freed() {
    let host = EmuHost::new();
    let dev = host.device();
    let total = dev.info().total_memory;
    // Each process's context holds device memory too, as a real one does (both A's and B's
    // while B asks).
    let ctx = host.context_bytes();
    for kind in [
        "plain", "pitch", "managed", "async", "pool", "vmm", "array", "array3d", "mipmap",
    ] {
        let size = (64 * MIB).to_string();
        let mut a = host.client(&[
            "ctx",
            "alloc-path",
            kind,
            &size,
            "ready",
            "wait",
            "free-all",
            "ready",
            "wait",
        ]);
        a.wait_for_line("ready", T)
            .unwrap_or_else(|| panic!("{kind}: {}", a.stdout()));
        assert_eq!(a.lines("path=")[0], format!("path={kind} rc=0"), "{kind}");

        // Another process sees it through cuMemGetInfo.
        let mut b = host.client(&[
            "ctx",
            "meminfo",
            "alloc-path",
            kind,
            &(16u64 << 30).to_string(),
        ]);
        b.finish(T);
        let info = &b.lines("meminfo=")[0];
        assert_eq!(
            num(info, "free") as u64,
            total - 64 * MIB - 2 * ctx,
            "{kind}: {info}"
        );
        assert_eq!(
            b.lines("path=")[0],
            format!("path={kind} rc=2"),
            "{kind}: OOM past capacity"
        );
        assert_eq!(
            dev.snapshot().memory_allocated(),
            64 * MIB,
            "{kind}: a refused allocation commits nothing"
        );

        a.send_line("go");
        let freed = a.wait_for_line("freed=", T).expect("freed");
        assert_eq!(field(&freed, "rc"), Some("0"), "{kind}: {freed}");
        a.wait_for_line("ready", T);
        assert_eq!(
            dev.snapshot().memory_allocated(),
            0,
            "{kind}: free path gives it back"
        );
        a.send_line("go");
        a.finish(T);
    }
}
