//! Kernels of separate processes contend for the SMs of one emulated GPU (processor sharing).

use e2e::{num, EmuChild, EmuHost};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);
/// 40 kernels of 15.9 M cycles per block: 10 ms each at the T4's 1590 MHz boost clock (long
/// enough that a late start of one client on a loaded machine hardly changes the overlap).
const CYCLES: &str = "15900000";
const COUNT: &str = "40";

fn run_alone(host: &EmuHost, blocks: &str) -> f64 {
    let mut c = host.client(&["ctx", "spin", blocks, CYCLES, COUNT]);
    c.finish(T);
    let l = c.wait_for_line("spin=", T).expect("spin line");
    assert_eq!(e2e::field(&l, "spin"), Some("0"), "{l}");
    num(&l, "emulated_ms")
}

fn run_pair(host: &EmuHost, blocks: &str) -> (f64, f64) {
    let steps = ["ctx", "ready", "wait", "spin", blocks, CYCLES, COUNT];
    let mut a = host.client(&steps);
    let mut b = host.client(&steps);
    a.wait_for_line("ready", T).expect("a ready");
    b.wait_for_line("ready", T).expect("b ready");
    a.send_line("go");
    b.send_line("go");
    (result(&mut a), result(&mut b))
}

fn result(c: &mut EmuChild) -> f64 {
    c.finish(T);
    let l = c.wait_for_line("spin=", T).expect("spin line");
    assert_eq!(e2e::field(&l, "spin"), Some("0"), "{l}");
    num(&l, "emulated_ms")
}

#[test]
fn full_gpu_kernels_slow_both_clients_in_proportion() {
    let host = EmuHost::new();
    // 40 blocks = every SM of the T4: alone each kernel holds the whole GPU (clock at 80%).
    let alone = run_alone(&host, "40");
    assert!(
        (490.0..510.0).contains(&alone),
        "alone {alone} ms (40 x 10 ms / 0.8)"
    );
    let (a, b) = run_pair(&host, "40");
    let (ra, rb) = (a / alone, b / alone);
    eprintln!("contention: alone {alone:.1} ms, together {a:.1} / {b:.1} ms, slowdown {ra:.2}x / {rb:.2}x");
    // Two clients demanding 2x the SMs: each gets half, and the clock falls from 80% to 70%:
    // expected slowdown 2 * 0.8 / 0.7 = 2.29 for both (minus the edges where one runs alone).
    for r in [ra, rb] {
        assert!(
            (1.85..2.45).contains(&r),
            "slowdowns {ra:.2} / {rb:.2}, alone {alone} ms"
        );
    }
    assert!(
        (ra - rb).abs() < 0.35,
        "both slow by the same factor: {ra:.2} vs {rb:.2}"
    );
}

#[test]
fn kernels_that_fit_together_do_not_slow_each_other() {
    let host = EmuHost::new();
    // 10 blocks each: 20 of 40 SMs in use together, no contention, clock stays at boost.
    let alone = run_alone(&host, "10");
    assert!((395.0..405.0).contains(&alone), "alone {alone} ms");
    let (a, b) = run_pair(&host, "10");
    eprintln!("no contention: alone {alone:.1} ms, together {a:.1} / {b:.1} ms");
    for t in [a, b] {
        assert!(
            (t / alone - 1.0).abs() < 0.06,
            "alone {alone} ms, together {a} / {b} ms"
        );
    }
}

#[test]
fn launches_are_async_ordered_per_stream_and_concurrent_across_streams() {
    let host = EmuHost::new();
    // 10 blocks x 15.9 M cycles: 10 ms on 10 of 40 SMs; two fit side by side.
    let mut c = host.client(&["ctx", "streams", "10", CYCLES]);
    c.finish(T);
    let l = c.wait_for_line("streams ", T).expect("streams line");
    eprintln!("{l}");
    assert_eq!(e2e::field(&l, "launch_ex"), Some("0"), "{l}");
    assert_eq!(e2e::field(&l, "launch_ptsz"), Some("0"), "{l}");
    assert_eq!(
        e2e::field(&l, "query"),
        Some("600"),
        "launch returned before the kernel ended: {l}"
    );
    for k in ["par1_ms", "par2_ms"] {
        // 10 ms plus host time between the start event and the launch (serialised would be 20).
        assert!(
            (9.9..14.0).contains(&num(&l, k)),
            "{k}: concurrent streams each take 10 ms: {l}"
        );
    }
    assert!(
        (19.9..25.0).contains(&num(&l, "serial_ms")),
        "one stream serialises: {l}"
    );
}

#[test]
fn graph_launch_runs_its_kernel_nodes_in_order() {
    let host = EmuHost::new();
    let mut c = host.client(&["ctx", "graph", "10", CYCLES, "3"]);
    c.finish(T);
    let l = c.wait_for_line("graph ", T).expect("graph line");
    eprintln!("{l}");
    for k in ["build", "launch", "launch_ptsz"] {
        assert_eq!(e2e::field(&l, k), Some("0"), "{k}: {l}");
    }
    for k in ["ms", "ms_ptsz"] {
        assert!(
            (29.9..35.0).contains(&num(&l, k)),
            "{k}: three 10 ms nodes in sequence: {l}"
        );
    }
}
