//! `gpuemu`: look at (or create) an emulated GPU's state file from the shell.

use emu_device::layout::compute_mode;
use emu_device::{Device, EmuError, Snapshot};
use std::process::ExitCode;

const HELP: &str = "gpuemu — inspect the emulated GPU shared by the fake libcuda / NVML / MPS control

USAGE:
    gpuemu show [--state PATH]        one-shot view: memory, SMs, clock, utilization, processes, MPS
    gpuemu watch [--state PATH] [MS]  the same every MS milliseconds (default 500) until Ctrl-C
    gpuemu profiles                   the GPU profiles a new state file can take
    gpuemu compute-mode [--state PATH] [MODE]
                                      the compute mode; with MODE (DEFAULT, EXCLUSIVE_PROCESS,
                                      PROHIBITED or 0, 3, 2) sets it, as root only, like
                                      `nvidia-smi -c MODE` (new contexts obey it at once)
    gpuemu xid [--state PATH] CODE [PID]
                                      reports XID CODE (naming PID) as the driver would, as root
                                      only: NVML event sets for nvmlEventTypeXidCriticalError
                                      deliver it (the kernel log is not written)

ENVIRONMENT:
    GPUEMU_STATE     state file of the emulated GPU (created on first use); --state overrides it
    GPUEMU_PROFILE   t4 | a10 | h100 (default t4): profile of a state file created now

The state file is what every emulated process shares: point GPUEMU_STATE of the workload, the
fake NVML and the fake nvidia-cuda-mps-control at the same file to put them on one GPU.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut state: Option<String> = None;
    let mut rest = Vec::new();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "-h" | "--help" | "help" => {
                println!("{HELP}");
                return ExitCode::SUCCESS;
            }
            "--state" => {
                i += 1;
                match args.get(i) {
                    Some(p) => state = Some(p.clone()),
                    None => return usage("--state needs a path"),
                }
            }
            a => rest.push(a.to_string()),
        }
        i += 1;
    }
    match rest.first().map(String::as_str) {
        Some("profiles") => {
            for p in emu_device::profile::ALL {
                println!(
                    "{:<5} {:<24} {:>6} MiB  {:>3} SMs  {} MHz  cc {}.{}",
                    p.id,
                    p.name,
                    p.total_memory >> 20,
                    p.sm_count,
                    p.max_sm_clock_mhz,
                    p.compute_capability.0,
                    p.compute_capability.1
                );
            }
            ExitCode::SUCCESS
        }
        Some("show") => match open(state) {
            Ok(d) => {
                print!("{}", render(&d.snapshot()));
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        Some("watch") => {
            let ms: u64 = match rest.get(1).map(|s| s.parse()) {
                None => 500,
                Some(Ok(v)) if v > 0 => v,
                _ => return usage("watch takes a period in milliseconds (> 0)"),
            };
            match open(state) {
                Ok(d) => loop {
                    print!("\x1b[2J\x1b[H{}", render(&d.snapshot()));
                    std::thread::sleep(std::time::Duration::from_millis(ms));
                },
                Err(e) => fail(&e),
            }
        }
        Some("compute-mode") => {
            let wanted = match rest.get(1).map(|m| parse_mode(m)) {
                None => None,
                Some(Some(m)) => Some(m),
                Some(None) => return usage("compute-mode takes DEFAULT, EXCLUSIVE_PROCESS, PROHIBITED (or 0, 3, 2)"),
            };
            let d = match open(state) {
                Ok(d) => d,
                Err(e) => return fail(&e),
            };
            if let Some(m) = wanted {
                if let Err(e) = d.set_compute_mode(m) {
                    return fail(&e);
                }
            }
            println!("{}", compute_mode::name(d.compute_mode()));
            ExitCode::SUCCESS
        }
        Some("xid") => {
            let code = match rest.get(1).map(|c| c.parse::<u64>()) {
                Some(Ok(c)) => c,
                _ => return usage("xid takes a code (and optionally the pid it names)"),
            };
            let pid = match rest.get(2).map(|p| p.parse::<u32>()) {
                None => 0,
                Some(Ok(p)) => p,
                Some(Err(_)) => return usage("xid: the pid must be a number"),
            };
            let d = match open(state) {
                Ok(d) => d,
                Err(e) => return fail(&e),
            };
            match d.report_xid(code, pid) {
                Ok(()) => {
                    println!("xid {code} reported ({} since the state file was made)", d.xid_count());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        Some(other) => usage(&format!("unknown command {other:?}")),
        None => usage("no command given"),
    }
}

/// A compute mode as `nvidia-smi -c` takes it: a name (any case) or its number.
fn parse_mode(m: &str) -> Option<u32> {
    match m.to_ascii_uppercase().as_str() {
        "DEFAULT" | "0" => Some(compute_mode::DEFAULT),
        "EXCLUSIVE_THREAD" | "1" => Some(compute_mode::EXCLUSIVE_THREAD),
        "PROHIBITED" | "2" => Some(compute_mode::PROHIBITED),
        "EXCLUSIVE_PROCESS" | "3" => Some(compute_mode::EXCLUSIVE_PROCESS),
        _ => None,
    }
}

fn open(state: Option<String>) -> Result<Device, EmuError> {
    if let Some(p) = state {
        // Single-threaded at this point, so changing our own environment is race-free.
        std::env::set_var(emu_device::ENV_STATE, p);
    }
    Device::open_from_env()
}

fn usage(why: &str) -> ExitCode {
    eprintln!("gpuemu: {why}\n\n{HELP}");
    ExitCode::from(2)
}

fn fail(e: &EmuError) -> ExitCode {
    eprintln!("gpuemu: {e}");
    ExitCode::from(1)
}

/// Human-readable view of a snapshot.
pub fn render(s: &Snapshot) -> String {
    let mib = |b: u64| b >> 20;
    let mut out = format!(
        "{} ({}): {} SMs, SM clock {}/{} MHz\nmemory: {} / {} MiB used\nutilization (last 100 ms): gpu {:.0}%, sm activity {:.0}%; now {:.1} of {} SMs granted, {:.1} wanted, {} kernels running\n",
        s.info.name,
        s.info.profile_id,
        s.info.sm_count,
        s.sm_clock_mhz,
        s.info.max_sm_clock_mhz,
        mib(s.memory_used),
        mib(s.memory_total),
        s.gpu_util * 100.0,
        s.sm_activity * 100.0,
        s.sm_in_use,
        s.info.sm_count,
        s.sm_demand,
        s.running_kernels,
    );
    out += &format!("compute mode: {}\n", compute_mode::name(s.compute_mode));
    let m = &s.mps;
    out += &format!(
        "mps: {}{}, default active thread {}%, generation {}, a kill mid-kernel {}{}\n",
        if m.enabled { "running" } else { "off" },
        if m.poisoned { format!(", POISONED by pid {}", m.culprit_pid.unwrap_or(0)) } else { String::new() },
        m.default_active_thread_pct,
        m.generation,
        if m.kill_teardown { "tears the server's clients down" } else { "hangs the server" },
        if m.fatal_errors > 0 { format!(" ({} fatal GPU errors)", m.fatal_errors) } else { String::new() },
    );
    out += "processes:\n";
    if s.processes.is_empty() {
        out += "    (none)\n";
    }
    for p in &s.processes {
        out += &format!(
            "    pid {:>7}  {:>7} MiB  {} ctx  {} kernels  {}{}%\n",
            p.pid,
            mib(p.used_memory),
            p.contexts,
            p.kernels,
            if p.mps_server {
                "mps server (its clients' shared context), "
            } else if p.mps_client {
                "mps client, "
            } else if p.mps_queued {
                "mps: queued behind another user's server, "
            } else if p.mps_asking {
                "mps: waiting for the daemon to hand it to its server, "
            } else if p.mps_outside {
                "outside MPS (no control daemon at its CUDA_MPS_PIPE_DIRECTORY), "
            } else if p.mps_handed {
                "mps: handed to its server, no context yet, "
            } else {
                ""
            },
            p.active_thread_pct
        );
    }
    out
}
