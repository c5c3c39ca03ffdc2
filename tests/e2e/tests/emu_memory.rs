//! Memory on one emulated GPU, seen by separate processes through `cuMemGetInfo`.

use e2e::{num, EmuHost};
use std::time::Duration;

const T: Duration = Duration::from_secs(30);
const GIB: u64 = 1 << 30;

#[test]
fn two_processes_see_each_others_usage_and_oom_at_capacity() {
    let host = EmuHost::new();
    let total = emu_device_total(&host);
    // Every process's context holds device memory too, as a real one does.
    let ctx = host.context_bytes();
    // A takes 4 GiB and holds it.
    let mut a = host.client(&[
        "ctx",
        "alloc",
        &(4 * GIB).to_string(),
        "ready",
        "wait",
        "free",
        "meminfo",
        "ready",
        "wait",
    ]);
    let line = a.wait_for_line("alloc=", T).expect("a alloc");
    assert_eq!(line, "alloc=0");
    a.wait_for_line("ready", T).expect("a ready");

    // B sees A's 4 GiB as used, then takes 6 GiB itself.
    let mut b = host.client(&[
        "ctx",
        "meminfo",
        "alloc",
        &(6 * GIB).to_string(),
        "meminfo",
        "ready",
        "wait",
        "meminfo",
    ]);
    b.wait_for_line("ready", T).expect("b ready");
    let infos = b.lines("meminfo=");
    assert_eq!(num(&infos[0], "total") as u64, total);
    assert_eq!(
        num(&infos[0], "free") as u64,
        total - 4 * GIB - 2 * ctx,
        "B sees A's allocation (and both contexts)"
    );
    assert_eq!(num(&infos[1], "free") as u64, total - 10 * GIB - 2 * ctx);

    // A sees B's usage after freeing its own.
    a.send_line("go");
    let a_info = a.wait_for_line("meminfo=", T).expect("a meminfo");
    assert_eq!(
        num(&a_info, "free") as u64,
        total - 6 * GIB - 2 * ctx,
        "A sees B's allocation"
    );

    // The card is 15 GiB: 6 GiB held by B and three contexts (906 MiB), so 10 GiB more is
    // out of memory, 8 GiB is not.
    let mut c = host.client(&[
        "ctx",
        "alloc",
        &(10 * GIB).to_string(),
        "alloc",
        &(8 * GIB).to_string(),
    ]);
    c.finish(T);
    let allocs = c.lines("alloc=");
    assert_eq!(
        allocs[0], "alloc=2",
        "CUDA_ERROR_OUT_OF_MEMORY past capacity"
    );
    assert_eq!(allocs[1], "alloc=0", "what fits still fits");

    // B exits normally: its memory comes back.
    b.send_line("go");
    b.finish(T);
    a.send_line("go");
    a.finish(T);
    let snap = host.device().snapshot();
    assert_eq!(snap.memory_allocated(), 0, "{snap:?}");
}

#[test]
fn killed_process_memory_is_reclaimed() {
    let host = EmuHost::new();
    let mut a = host.client(&["ctx", "alloc", &(8 * GIB).to_string(), "ready", "hang"]);
    a.wait_for_line("ready", T).expect("ready");
    assert_eq!(
        host.device().snapshot().memory_used,
        8 * GIB + host.context_bytes()
    );
    a.kill9();
    let dev = host.device();
    let deadline = std::time::Instant::now() + T;
    while dev.snapshot().memory_used != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "dead client's memory never reclaimed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn emu_device_total(host: &EmuHost) -> u64 {
    host.device().info().total_memory
}
