//! Benchmark of the real `sysmonitor` process against the GPU emulator:
//! 1. CPU use of the monitor at 10 ms and 1 ms sampling (utime+stime from /proc/<pid>/stat over
//!    a fixed window, as % of one core; the idle-system `sleep` baseline is measured alongside);
//! 2. Overlimit -> SIGTERM latency: from the monitor's Overlimit decision (its own entry time)
//!    and from the start of the online burst, to the SIGTERM arriving in the offline process.
//!
//! Run: `cargo build --release -p emu-cuda -p emu-nvml -p sysmonitor && cargo bench -p
//! sysmonitor --bench monitor` (add `-- --secs 10 --rounds 20` to change the window and the
//! number of latency rounds). The emulated host (`workloads::host::Host`) takes the built
//! fakes and the monitor from `target/release/`; it builds nothing itself.

use std::time::{Duration, Instant};

use workloads::host::{helper_main, register, Host, Load};

fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as f64 }
}

/// utime + stime of `pid` in seconds.
fn cpu_secs(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &s[s.rfind(')').unwrap() + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are indices 11 and 12 after the comm field.
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / clk_tck()
}

fn mono_ns() -> u64 {
    emu_device::now_ns()
}

fn config(interval_ms: u64) -> String {
    format!(
        r#"{{"interval_ms": {interval_ms}, "state_file_every_ms": 100, "host_memory": {{"enabled": false}},
  "machine": {{
    "gpu_util":    {{ "healthy": 97, "unhealthy": 98, "overlimit": 99, "enabled": false }},
    "sm_activity": {{ "healthy": 30, "unhealthy": 60, "overlimit": 80 }},
    "sm_clock":    {{ "healthy": 3, "unhealthy": 2, "overlimit": 1, "direction": "below", "enabled": false }},
    "overlimit_sustain_ms": 0, "hold_base_ms": 50, "hold_factor": 1.0, "hold_max_ms": 50 }},
  "evictor": {{ "grace_ms": 5000 }} }}"#
    )
}

fn cpu_use(interval_ms: u64, secs: f64) -> (f64, u64) {
    let n = Host::node();
    let m = n.start_monitor("mon.json", &config(interval_ms));
    n.wait_state(Duration::from_secs(20), "healthy", |v| {
        v["state"] == "healthy"
    });
    std::thread::sleep(Duration::from_millis(500));
    let pid = m.pid();
    let before = n.wait_state(Duration::from_secs(5), "state", |_| true)["samples"]
        .as_u64()
        .unwrap_or(0);
    let (c0, t0) = (cpu_secs(pid), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(secs));
    let (c1, t1) = (cpu_secs(pid), Instant::now());
    let after = n.wait_state(Duration::from_secs(5), "state", |_| true)["samples"]
        .as_u64()
        .unwrap_or(0);
    (
        (c1 - c0) / (t1 - t0).as_secs_f64() * 100.0,
        after.saturating_sub(before),
    )
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    // `cargo bench` passes `--bench`; a helper re-exec passes the helper role.
    if std::env::var("NODE_TEST_HELPER").is_ok() {
        helper_main();
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str, d: f64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let secs = opt("--secs", 5.0);
    let rounds = opt("--rounds", 10.0) as usize;

    println!("sysmonitor benchmark on the GPU emulator (h100 profile, fake NVML with GPM)");
    println!("-- CPU use of the monitor process over {secs} s --");
    let (base_cpu, _) = {
        // Baseline: the same measurement applied to an idle `sleep` process.
        let mut c = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let (c0, t0) = (cpu_secs(c.id()), Instant::now());
        std::thread::sleep(Duration::from_secs_f64(secs.min(2.0)));
        let r = (cpu_secs(c.id()) - c0) / t0.elapsed().as_secs_f64() * 100.0;
        let _ = c.kill();
        let _ = c.wait();
        (r, 0)
    };
    let (cpu10, n10) = cpu_use(10, secs);
    let (cpu1, n1) = cpu_use(1, secs);
    println!("  baseline idle process      {base_cpu:6.2} % of a core");
    println!(
        "  interval 10 ms             {cpu10:6.2} % of a core  ({n10} samples, {:.0}/s)",
        n10 as f64 / secs
    );
    println!(
        "  interval  1 ms             {cpu1:6.2} % of a core  ({n1} samples, {:.0}/s)",
        n1 as f64 / secs
    );
    println!(
        "  ratio 1 ms / 10 ms         {:6.2} x",
        cpu1 / cpu10.max(1e-9)
    );
    println!(
        "  per sample                 {:6.1} us CPU at 10 ms, {:.1} us at 1 ms",
        cpu10 / 100.0 * secs / n10.max(1) as f64 * 1e6,
        cpu1 / 100.0 * secs / n1.max(1) as f64 * 1e6
    );
    println!(
        "  target <= 1 % at 10 ms:    {}",
        if cpu10 <= 1.0 { "met" } else { "NOT met" }
    );

    if rounds == 0 {
        return;
    }
    println!("-- Overlimit -> SIGTERM latency, interval 10 ms, {rounds} rounds --");
    let n = Host::node();
    let _mon = n.start_monitor("mon.json", &config(10));
    let t = Duration::from_secs(20);
    n.wait_state(t, "healthy", |v| v["state"] == "healthy");
    let ledger = node_ledger::Ledger::open_existing(&n.ledger_path()).unwrap();
    let (mut from_decision, mut from_burst) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let mut victim = n.spawn_sh("exec sleep 60");
        let vpid = victim.pid();
        register(&ledger, vpid, 0);
        let burst = mono_ns();
        let load = Load::start(&n, 1.0, 2.0);
        let _ = victim.wait_exit(t).expect("victim not evicted");
        // Exit observed here (polled every 5 ms) is the upper bound; the monitor's recorded
        // entry time is the decision time.
        let end = mono_ns();
        let v = n.wait_state(t, "entry recorded", |v| {
            v["overlimit_entries_mono_ms"]
                .as_array()
                .is_some_and(|a| a.len() > r)
        });
        let entry_ms = v["overlimit_entries_mono_ms"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .as_u64()
            .unwrap();
        from_decision.push((end / 1_000_000).saturating_sub(entry_ms) as f64);
        from_burst.push((end - burst) as f64 / 1e6);
        load.stop();
        n.wait_state(t, "healthy", |v| v["state"] == "healthy");
    }
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (d_avg, b_avg) = (avg(&from_decision), avg(&from_burst));
    println!("  Overlimit decision -> offline exited on SIGTERM: mean {d_avg:.1} ms, p50 {:.1} ms, max {:.1} ms (ms clock resolution)", percentile(&mut from_decision, 0.5), percentile(&mut from_decision, 1.0));
    println!("  online burst start -> offline exited on SIGTERM: mean {b_avg:.1} ms, p50 {:.1} ms, max {:.1} ms", percentile(&mut from_burst, 0.5), percentile(&mut from_burst, 1.0));
    println!(
        "  in sampling intervals (10 ms): decision->exit {:.2}, burst->exit {:.2}",
        d_avg / 10.0,
        b_avg / 10.0
    );
}
