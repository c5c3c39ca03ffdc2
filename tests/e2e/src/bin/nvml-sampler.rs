//! `nvml-sampler`: NVML of one emulated host read as a monitoring tool outside the shim reads
//! it, for the stress tools ([`e2e::nvml_sampler`] starts it). A process of its own, with the
//! host's environment: the fake NVML, like the real one, serves the one host its process was
//! started on, and `GPUEMU_STATE` is process-wide.
//!
//! Usage: `nvml-sampler LIBNVML QUOTA_BYTES CONTEXT_BYTES`. Reads `pid N` (watch process N from
//! now on) and `stop` lines on stdin; prints `nvml-sampler ready base_used=B`, then, after
//! `stop`, `nvml-sampler done samples=S procs_max=P used_max=U live_max=L over=O`, every ~2 ms:
//!
//! * `procs_max`: most the watched processes held at once by NVML's process list, less one
//!   context each (NVML counts a process's context, a quota does not);
//! * `live_max`: the same for the watched processes still alive (a killed process is listed
//!   until the emulator reaps it);
//! * `used_max`: most device memory used at once above what it was at the start, less one
//!   context per listed process (a process holding more counts as over);
//! * `over`: samples with `procs_max` or `used_max` over the quota.

use std::io::BufRead;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;

fn arg(args: &[String], i: usize, what: &str) -> String {
    args.get(i).cloned().unwrap_or_else(|| {
        eprintln!("nvml-sampler: missing {what} (usage: nvml-sampler LIBNVML QUOTA_BYTES CONTEXT_BYTES)");
        std::process::exit(2)
    })
}

fn bytes(s: &str, what: &str) -> u64 {
    s.parse().unwrap_or_else(|_| {
        eprintln!("nvml-sampler: {what} must be a byte count, not {s:?}");
        std::process::exit(2)
    })
}

/// The kernel's flag of a task whose exit has begun (`include/linux/sched.h`): it has closed,
/// or is closing, its files (the ledger's, whose close gives its quota back, among them) while
/// NVML still lists it and `/proc` does not yet call it a zombie.
const PF_EXITING: u64 = 0x4;

/// Alive (not a zombie, its exit not begun) after the process list was read, so alive while
/// it was read. A SIGKILLed process on a loaded machine can sit for milliseconds between
/// closing its files and becoming a zombie; counted alive then, its memory NVML still lists
/// was counted beside the allocation another process made with the quota its close gave back.
fn alive(pid: u32) -> bool {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // After the command's closing parenthesis: state, ppid, pgrp, session, tty, tpgid, flags.
    let mut f = s.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace();
    let state = f.next().unwrap_or("Z");
    let flags = f.nth(5).and_then(|v| v.parse::<u64>().ok()).unwrap_or(PF_EXITING);
    state != "Z" && state != "X" && flags & PF_EXITING == 0
}

/// What the processes of `list` among `watched` that pass `keep` hold, less `ctx` each.
fn held_by(list: &[ProcessInfo], watched: &[u32], ctx: u64, keep: impl Fn(u32) -> bool) -> u64 {
    list.iter()
        .filter(|p| watched.contains(&p.pid) && keep(p.pid))
        .map(|p| match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => b.saturating_sub(ctx),
            UsedGpuMemory::Unavailable => 0,
        })
        .sum()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let lib = arg(&args, 0, "LIBNVML");
    let quota = bytes(&arg(&args, 1, "QUOTA_BYTES"), "QUOTA_BYTES");
    let ctx = bytes(&arg(&args, 2, "CONTEXT_BYTES"), "CONTEXT_BYTES");
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(lib.as_ref())
        .init()
        .expect("nvmlInit against the emulator");
    let dev = nvml.device_by_index(0).expect("device 0");
    let base_used = dev.memory_info().expect("memory info").used;
    let pids = Arc::new(Mutex::new(Vec::<u32>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    {
        let (pids, stop) = (pids.clone(), stop.clone());
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                match line.strip_prefix("pid ").map(str::parse::<u32>) {
                    Some(Ok(p)) => pids.lock().unwrap_or_else(|e| e.into_inner()).push(p),
                    None if line == "stop" => break,
                    _ => {
                        // No figures then: the tool fails naming this line.
                        eprintln!("nvml-sampler: unknown command {line:?}");
                        std::process::exit(2);
                    }
                }
            }
            stop.store(true, Ordering::SeqCst);
        });
    }
    println!("nvml-sampler ready base_used={base_used}");
    let (mut samples, mut procs_max, mut used_max, mut live_max, mut over) = (0u64, 0u64, 0u64, 0u64, 0u64);
    while !stop.load(Ordering::SeqCst) {
        let watched = pids.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let list = dev.running_compute_processes().expect("process list");
        let ours = held_by(&list, &watched, ctx, |_| true);
        let live = held_by(&list, &watched, ctx, alive);
        let used = dev
            .memory_info()
            .expect("memory info")
            .used
            .saturating_sub(base_used)
            .saturating_sub(ctx * list.len() as u64);
        samples += 1;
        procs_max = procs_max.max(ours);
        used_max = used_max.max(used);
        live_max = live_max.max(live);
        if ours > quota || used > quota {
            over += 1;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    println!("nvml-sampler done samples={samples} procs_max={procs_max} used_max={used_max} live_max={live_max} over={over}");
}
