//! A graph launch is priced by the kernel nodes it runs (xcuda-shim's `graphcost`), not a flat
//! `graph_launch_waves`. Each case is one shimmed client with its throttle in the open-loop
//! fallback (no monitor data: 50 waves/s) and a bucket of 10 waves, which starts full: a launch
//! is delayed exactly when its price is above what the bucket holds. The ledger's counters of
//! the client say which launches were delayed: counts, no timings.
//!
//! A graph of 20 one-wave kernels costs 20 waves (delayed, as 20 one-wave kernel launches are);
//! one of 5 costs 5 (not delayed). Before, both cost the flat 8 waves: neither was delayed, and
//! the 20-kernel graph escaped the throttle by its size. An exec whose 5 nodes are set to grids
//! 4 times bigger (`cuGraphExecKernelNodeSetParams`) costs 20 waves from then on, also when
//! two threads race to change it.

mod shim_support;

use e2e::EmuHost;
use shim_support::*;

/// The `(launches, launches delayed)` of a shimmed client running `steps` (then `sleep 600`
/// so that its housekeeping tick reports them), with its stdout.
fn counted(host: &EmuHost, group: &str, steps: &[&str]) -> (u64, u64, Vec<String>) {
    counted_with(host, group, "", steps)
}

/// [`counted`] with `memory` as the config's memory section (fault injection).
fn counted_with(host: &EmuHost, group: &str, memory: &str, steps: &[&str]) -> (u64, u64, Vec<String>) {
    let cfg = host.root().join(format!("xcuda-{group}.json"));
    let memory = if memory.is_empty() { String::new() } else { format!(r#", "memory": {memory}"#) };
    std::fs::write(&cfg, format!(r#"{{"throttle": {{"burst": 10.0, "graph_launch_waves": 8.0}}{memory}}}"#)).unwrap();
    let mut c = limited(host, "shim_client", 1 << 30, group);
    c.env("XCUDA_CONFIG", &cfg).env("XCUDA_THROTTLE", "1").env("XCUDA_FALLBACK_RATE", "50");
    c.arg("ctx").args(steps).args(["sleep", "600", "ready", "wait"]);
    let mut k = host.spawn(&mut c);
    k.wait_for_line("ready", T).unwrap_or_else(|| panic!("{group}: {}", k.stderr()));
    let me = ledger(host).procs().into_iter().find(|p| p.pid == k.pid()).expect("registered");
    k.send_line("go");
    let out = k.finish(T);
    (me.launches, me.launches_delayed, out.lines().map(str::to_string).collect())
}

#[test]
fn a_graph_launch_costs_its_kernels_waves() {
    let host = EmuHost::new();
    let sms = host.device().info().sm_count.to_string();
    // The same work as 20 kernel launches of one wave each: over the bucket.
    let (n, kernels_delayed, _) = counted(&host, "kernels", &["launch", &sms, "1000", "20"]);
    assert!(n >= 20 && kernels_delayed > 0, "20 one-wave launches against a 10-wave bucket: {n} launches, {kernels_delayed} delayed");
    // One launch of a graph of 20 one-wave kernels: 20 waves, delayed like them.
    let (n, big, lines) = counted(&host, "graph20", &["graphnodes", "20", &sms, "1000", "1", "1"]);
    assert_eq!(rc_of(&lines, "graphnodes="), ["0"], "{lines:?}");
    assert!(n >= 1, "the graph launch counted: {n}");
    assert_eq!(big, 1, "a 20-wave graph launch against a 10-wave bucket waits (it cost the flat 8 waves before)");
    // A graph of 5: 5 waves, within the bucket.
    let (n, small, lines) = counted(&host, "graph5", &["graphnodes", "5", &sms, "1000", "1", "1"]);
    assert_eq!(rc_of(&lines, "graphnodes="), ["0"], "{lines:?}");
    assert_eq!((n, small), (1, 0), "a 5-wave graph launch fits the full bucket");
}

#[test]
fn an_exec_whose_kernels_grow_costs_their_new_waves() {
    let host = EmuHost::new();
    let sms = host.device().info().sm_count.to_string();
    // 5 one-wave nodes (not delayed), then each set to 4 waves: the next launch costs 20.
    let (n, delayed, lines) = counted(&host, "grow", &["graphnodes", "5", &sms, "1000", "1", "4"]);
    assert_eq!(e2e::field(lines.iter().find(|l| l.starts_with("graphnodes=")).expect("printed"), "grown"), Some("0"), "{lines:?}");
    assert_eq!(n, 2, "two graph launches");
    assert_eq!(delayed, 1, "the launch after the nodes grew to 20 waves waits (it kept the 5-wave price before)");
}

/// Two threads change one exec's node (which CUDA forbids; a tenant may do it anyway): the
/// first sets a one-wave grid and is held between the driver's answer and its record
/// (`memory.test_graph_change_pause_ms`), the second sets 20 waves meanwhile. The driver ends
/// with 20 waves, and so must the price: the launch waits for the bucket. Without the change
/// lock the first thread's late record priced the exec at one wave (not delayed).
#[test]
fn racing_changes_of_one_exec_leave_the_price_of_the_grid_it_runs() {
    let host = EmuHost::new();
    let sms = host.device().info().sm_count;
    let (big, small) = ((20 * sms).to_string(), sms.to_string());
    let (n, delayed, lines) = counted_with(&host, "race", r#"{"test_graph_change_pause_ms": 600}"#, &["graphrace", &small, &big, "1000"]);
    assert_eq!(rc_of(&lines, "graphrace="), ["0"], "{lines:?}");
    assert_eq!((n, delayed), (1, 1), "the launch of a 20-wave exec waits for a 10-wave bucket");
}

/// Launches recorded into a capture run nothing and cost nothing: 20 one-wave kernels captured
/// (global mode, the capturing thread's own) and then one run for real against the 10-wave
/// bucket: the real one is the only launch counted and is not delayed. Before, each captured
/// launch took its wave from the bucket, and the real launch after the capture waited for
/// that debt (a warm-up capturing thousands of kernels stalled the next real launch seconds).
#[test]
fn captured_launches_leave_no_debt() {
    let host = EmuHost::new();
    let sms = host.device().info().sm_count.to_string();
    let (n, delayed, lines) = counted(&host, "captured", &["capturelaunch", "20", &sms, "1000"]);
    let line = lines.iter().find(|l| l.starts_with("capturelaunch")).expect("printed");
    assert_eq!(line, "capturelaunch end=0 launch=0", "{lines:?}");
    assert_eq!((n, delayed), (1, 0), "only the real launch is counted, and it fits the full bucket");
}
