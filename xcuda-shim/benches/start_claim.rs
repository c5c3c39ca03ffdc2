//! What the start claim adds to the shim's library constructor, which every process of an
//! offline container runs at load: `cargo bench -p xcuda-shim --bench start_claim`.
//!
//! Per call, best of 7 rounds, with 8 registered processes and 8 fresh claims of other jobs in
//! the ledger: the constructor's ledger work before the claim (open the ledger, read the fresh
//! budget and the registered jobs, compute the share, close) and with it
//! (`claim_start_percentage`: the same plus lock, claims read, record, unlock, and the pid
//! namespace's `stat`). Then, when `strace` is on the PATH, the system calls a preloaded
//! `sh -c true` makes from the ledger's open to its close. Printed, not asserted.

use std::hint::black_box;
use std::time::{Duration, Instant};

use node_ledger::{clock::now_ns, Ledger};
use xcuda::budget::{claim_start_percentage, fresh_budget, start_share};
use xcuda::config::Config;

fn best_us(rounds: usize, n: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / n as f64);
    }
    best * 1e6
}

fn main() {
    let d = tempfile::tempdir().unwrap();
    let cfg = Config {
        ledger_dir: d.path().to_owned(),
        group: "bench-job".into(),
        ..Default::default()
    };
    let path = cfg.ledger().ledger_path();
    let l = Ledger::open_or_create(&path, 0).unwrap();
    let spath = cfg.ledger().status_path();
    let manager = node_ledger::Status::open_or_create(&spath, 0).unwrap();
    let holders: Vec<(Ledger, node_ledger::ProcHandle)> = (0..8u64)
        .map(|i| {
            let h = Ledger::open_existing(&path).unwrap();
            let g = h.group(1 + i, 1 << 30).unwrap();
            let r = h.register_with_mps(std::process::id(), g, 3).unwrap();
            (h, r)
        })
        .collect();
    {
        let lock = l.lock_claims(Duration::ZERO).unwrap().unwrap();
        for i in 0..8u64 {
            assert!(lock.record(100 + i, 2, 1, 0, now_ns(), u64::MAX / 2));
        }
    }
    let group = node_ledger::ledger::group_id_for(&cfg.group);
    let stale_ns = cfg.throttle.stale_after_ms * 1_000_000;
    let before = || {
        let l = Ledger::open_existing(&path).unwrap();
        let status = node_ledger::Status::open(&spath).unwrap();
        let now = now_ns();
        let b = fresh_budget(&status, now, stale_ns).unwrap();
        black_box(start_share(b, &l.offline_jobs(), group));
    };
    let with_claim = || {
        let p = claim_start_percentage(&cfg, None, now_ns(), node_ledger::claims::CLAIM_LOCK_WAIT);
        assert!(p.pct.is_some() && p.trouble.is_none(), "{p:?}");
        black_box(p);
    };
    let (mut b, mut c) = (f64::MAX, f64::MAX);
    for _ in 0..3 {
        manager.publish_sm_budget_at(400, now_ns());
        b = b.min(best_us(7, 2000, before));
        manager.publish_sm_budget_at(400, now_ns());
        c = c.min(best_us(7, 2000, with_claim));
    }
    println!(
        "constructor ledger work, 8 registered + 8 claims: before {b:.2} us, with the claim {c:.2} us (+{:.2} us, {:.2}x)",
        c - b,
        c / b
    );

    // The system calls, as a real process makes them at load.
    println!(
        "of which: the pid namespace's stat {:.2} us, claims lock + unlock {:.2} us",
        best_us(7, 2000, || {
            black_box(node_ledger::procinfo::own_pid_ns());
        }),
        best_us(7, 2000, || {
            black_box(l.lock_claims(Duration::ZERO).unwrap());
        })
    );
    // The system calls, as a real process makes them at load: the shim built beside the bench
    // (target/<profile>/libxcuda.so: `cargo build -p xcuda-shim` makes target/debug's; the
    // system calls are the same in any profile).
    let target = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.parent()?.to_owned()));
    let shim = ["release", "debug"]
        .iter()
        .filter_map(|p| Some(target.as_ref()?.join(p).join("libxcuda.so")))
        .find(|s| s.exists());
    let Some(shim) = shim else {
        println!("(no libxcuda.so built: syscall trace skipped)");
        return;
    };
    println!("traced: {}", shim.display());
    let out = d.path().join("strace.out");
    let empty = d.path().join("xcuda.json");
    std::fs::write(&empty, "{}").unwrap();
    manager.publish_sm_budget_at(400, now_ns());
    let ran = std::process::Command::new("strace")
        .args(["-f", "-o"])
        .arg(&out)
        .args(["sh", "-c", "true"])
        .env("LD_PRELOAD", &shim)
        .env("XSHARE_LEDGER_DIR", d.path())
        .env("XCUDA_CONFIG", &empty)
        .env("XCUDA_GROUP", "bench-traced")
        .env_remove("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        .status();
    if !ran.is_ok_and(|s| s.success()) {
        println!("(strace not available: syscall trace skipped)");
        return;
    }
    let trace = std::fs::read_to_string(&out).unwrap_or_default();
    let lines: Vec<&str> = trace.lines().collect();
    let ledger = path.to_string_lossy();
    let Some(open) = lines
        .iter()
        .position(|l| l.contains(&*ledger) && l.contains("openat"))
    else {
        println!("(the traced process never opened the ledger)");
        return;
    };
    let fd = lines[open]
        .rsplit('=')
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    let close = lines[open..]
        .iter()
        .position(|l| l.contains(&format!("close({fd})")))
        .map_or(lines.len(), |i| open + i + 1);
    println!(
        "system calls of the constructor from the ledger's open to its close ({} calls):",
        close - open
    );
    for l in &lines[open..close] {
        println!("  {}", l.split_once(' ').map_or(*l, |(_, rest)| rest));
    }
    println!(
        "  claims lock taken and released: {} fcntl(F_OFD_SETLK) calls",
        lines[open..close]
            .iter()
            .filter(|l| l.contains("F_OFD_SETLK"))
            .count()
    );
    drop(holders);
}
