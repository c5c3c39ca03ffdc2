//! Cost of the emulated device's operations (what every fake-driver call pays), reported per op
//! and as a ratio to a baseline measured in the same run: one `getpid` syscall; and system calls
//! per op where the kernel lets a process count its own (`emu_device::syscalls`).
//! The reads NVML answers from come twice: as called (lock-free while the model runs on
//! unchanged) and always under the lock (`*_locked`: what every read cost before).
//! Run: `cargo bench -p emu-device --bench ops`.

use emu_device::syscalls::SyscallCounter;
use emu_device::{now_ns, profile, Device, Launch};
use std::time::Instant;

static COUNTER: std::sync::OnceLock<Option<SyscallCounter>> = std::sync::OnceLock::new();

/// (ns per op, system calls per op).
fn per_op(n: u32, mut f: impl FnMut()) -> (f64, Option<f64>) {
    // `OPS_SCALE=100` runs a hundredth of each row (under valgrind, say).
    let n = (n / std::env::var("OPS_SCALE").ok().and_then(|v| v.parse().ok()).unwrap_or(1u32).max(1)).max(10);
    for _ in 0..n / 10 {
        f();
    }
    let c = COUNTER.get_or_init(SyscallCounter::open).as_ref();
    let s0 = c.map(|c| c.get());
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    let ns = t.elapsed().as_nanos() as f64 / f64::from(n);
    let sys = c.zip(s0).map(|(c, s0)| c.get().saturating_sub(s0).saturating_sub(1) as f64 / f64::from(n));
    (ns, sys)
}

fn main() {
    let path = std::env::temp_dir().join(format!("emu-device-bench-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let dev = Device::open(&path, &profile::T4).expect("open");
    let c = dev.attach().expect("attach");
    // SAFETY: getpid has no preconditions.
    let (base, _) = per_op(200_000, || unsafe {
        std::hint::black_box(libc::getpid());
    });
    let rows = [
        ("mem_info (cuMemGetInfo)", per_op(50_000, || {
            std::hint::black_box(dev.mem_info());
        })),
        ("alloc + free pair", per_op(50_000, || {
            dev.alloc(&c, 4096, 0).expect("alloc");
            dev.free(&c, 4096);
        })),
        ("launch + wait + collect (1-cycle kernel)", per_op(20_000, || {
            let t = dev.launch(&c, Launch { blocks: 1, cycles_per_block: 1, after: 0 }).expect("launch");
            dev.wait(&c, t).expect("wait");
            dev.collect(t);
        })),
        ("snapshot", per_op(20_000, || {
            std::hint::black_box(dev.snapshot());
        })),
        ("counters (GPM sample, SM clock, memory)", per_op(200_000, || {
            std::hint::black_box(dev.counters());
        })),
        ("counters_locked", per_op(50_000, || {
            std::hint::black_box(dev.counters_locked());
        })),
        ("memory", per_op(200_000, || {
            std::hint::black_box(dev.memory());
        })),
        ("reading (+ utilization window)", per_op(200_000, || {
            std::hint::black_box(dev.reading());
        })),
        ("reading_locked", per_op(50_000, || {
            std::hint::black_box(dev.reading_locked());
        })),
        ("samples_after (now - 20 ms)", per_op(100_000, || {
            std::hint::black_box(dev.samples_after(now_ns() - 20_000_000));
        })),
        ("compute_processes", per_op(100_000, || {
            std::hint::black_box(dev.compute_processes());
        })),
    ];
    println!("baseline getpid: {base:.0} ns (one attached client, idle device: the reads take the lock when a scan for dead clients (every 20 ms) or a utilization sample (every 5 ms) is due)");
    let sys = |s: Option<f64>| s.map_or("n/a".to_string(), |v| format!("{v:.3}"));
    for (name, (ns, s)) in rows {
        println!("{name:<45} {ns:>9.0} ns  {:>7.1}x getpid  {:>7} syscalls/op", ns / base, sys(s));
    }
    let _ = std::fs::remove_file(&path);
}
