//! A tenant cannot lift its throttle, or its neighbours', through the ledger. Every offline
//! process may write the ledger; the monitor's sample used to be a block of it, so a tenant
//! writing an idle, fresh sample there (at a higher rate than the monitor) made every shim on
//! the GPU read "no online load". The throttle now reads the status file, which only the
//! daemons write and containers get read-only (`node_ledger::status`). The test plays the
//! monitor (online pressure in the status file) and the tenant (an idle sample written
//! into layout v5's monitor block every millisecond), and watches a launch stay held.

mod shim_support;

use std::os::unix::fs::FileExt as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use e2e::EmuHost;
use node_ledger::{HealthState, MonitorSample};
use shim_support::*;

/// Layout v5's monitor block, as a tenant writes it: seq, publish_ns, monitor_pid, health,
/// sm_active, gpu_util, sm_clock, sm_clock_max, sm_count (byte offsets 0, 8, 16, 20, 24, 28,
/// 32, 36, 40).
fn forged_idle_sample(max_clock: u32, sm_count: u32, seq: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(48);
    b.extend_from_slice(&seq.to_le_bytes());
    b.extend_from_slice(&node_ledger::clock::now_ns().to_le_bytes());
    for w in [1u32, HealthState::Healthy as u32, 0, 0, max_clock, max_clock, sm_count, 0] {
        b.extend_from_slice(&w.to_le_bytes());
    }
    b
}

#[test]
fn an_idle_sample_forged_in_the_ledger_does_not_release_a_held_launch() {
    let host = EmuHost::new();
    let info = host.device().info();
    let ledger = ledger(&host);
    let status = status(&host);
    let pressure = Arc::new(AtomicBool::new(true));
    let stop = Arc::new(AtomicBool::new(false));
    let max = info.max_sm_clock_mhz;
    let monitor = {
        let (pressure, stop) = (pressure.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let busy = pressure.load(Ordering::Relaxed);
                status.publish(&MonitorSample {
                    sm_active_permille: if busy { 1000 } else { 0 },
                    sm_clock_mhz: if busy { max / 2 } else { max },
                    sm_clock_max_mhz: max,
                    sm_count: info.sm_count,
                    ..Default::default()
                }.with_health(HealthState::Healthy));
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let tenant = {
        let stop = stop.clone();
        let file = std::fs::OpenOptions::new().write(true).open(ledger.path()).unwrap();
        let at = node_ledger::layout::retired_range().start;
        std::thread::spawn(move || {
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                seq += 2;
                file.write_all_at(&forged_idle_sample(max, info.sm_count, seq), at).unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let sms = info.sm_count.to_string();
    let mut c = limited(&host, "shim_client", 64 * MIB, "forger");
    // Capped at 40 % of the SMs: a low clock is online pressure, and its launches are held.
    c.env("XCUDA_THROTTLE", "1").env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "40");
    c.args(["ctxon", "0", "sleep", "300", "launch", &sms, "1000", "2", "ready", "wait"]);
    let mut k = host.spawn(&mut c);
    let msg = |k: &e2e::EmuChild| format!("{}\n{}", k.stdout(), k.stderr());
    std::thread::sleep(Duration::from_millis(1200));
    assert!(k.lines("launch=").is_empty(), "the launch is held while the status file says online pressure: {}", msg(&k));
    pressure.store(false, Ordering::Relaxed);
    assert!(k.wait_for_line("ready", T).is_some(), "released once the status file says the pressure ended: {}", msg(&k));
    assert!(k.lines("launch=").iter().all(|l| e2e::field(l, "launch") == Some("0")), "{}", msg(&k));
    stop.store(true, Ordering::Relaxed);
    monitor.join().unwrap();
    tenant.join().unwrap();
    k.send_line("go");
    k.finish(T);
}
