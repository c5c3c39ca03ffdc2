//! The main job's driver: `host-demo` runs its phases on an emulated host and prints the table:
//! the online p99 rises beside the unrestrained offline client, and the static MPS share
//! slows the offline client.

mod workloads_support;

use std::process::Command;
use std::time::Duration;

use workloads_support::*;

#[test]
fn host_demo_prints_every_phase() {
    require_built();
    let mut c = Command::new(bin_dir().join("host-demo"));
    c.args(["--duration", "1.5", "--profile", "t4"]);
    let out = run_bounded(c, "", Duration::from_secs(180));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no row {name}: {text}"))
            .to_string()
    };
    let shared = row("online + offline (no control)");
    let cols: Vec<&str> = shared.split_whitespace().collect();
    let ratio: f64 = cols[cols.len() - 3]
        .parse()
        .unwrap_or_else(|_| panic!("p99 ratio column: {shared}"));
    let offline: f64 = cols[cols.len() - 1]
        .parse()
        .unwrap_or_else(|_| panic!("offline column: {shared}"));
    assert!(ratio > 1.0, "{text}");
    assert!(offline > 0.0, "{text}");
    row("online alone");
    let alone: f64 = row("offline alone")
        .split_whitespace()
        .last()
        .unwrap()
        .parse()
        .expect("offline alone it/s");
    assert!(alone > 0.0, "{text}");
    let mps = row("online + offline (MPS, 25% SMs)");
    let offline_capped: f64 = mps
        .split_whitespace()
        .last()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("offline column: {mps}"));
    assert!(
        offline_capped < offline,
        "the MPS share slows the offline client: {text}"
    );
    // The product's own phase ran (its figures belong to scripts/bench-muxflow.sh).
    row("online + offline (xshare node)");
}
