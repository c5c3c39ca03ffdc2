//! Cost of the emulated device's operations (what every fake-driver call pays), reported per op
//! and as a ratio to a baseline measured in the same run: one `getpid` syscall.
//! Run: `cargo bench -p emu-device --bench ops`.

use emu_device::{profile, Device, Launch};
use std::time::Instant;

fn per_op(n: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..n / 10 {
        f();
    }
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

fn main() {
    let path = std::env::temp_dir().join(format!("emu-device-bench-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let dev = Device::open(&path, &profile::T4).expect("open");
    let c = dev.attach().expect("attach");
    // SAFETY: getpid has no preconditions.
    let base = per_op(200_000, || unsafe {
        std::hint::black_box(libc::getpid());
    });
    let rows = [
        ("mem_info (lock + advance)", per_op(50_000, || {
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
    ];
    println!("baseline getpid: {base:.0} ns");
    for (name, ns) in rows {
        println!("{name:<45} {ns:>9.0} ns  {:>7.1}x getpid", ns / base);
    }
    let _ = std::fs::remove_file(&path);
}
