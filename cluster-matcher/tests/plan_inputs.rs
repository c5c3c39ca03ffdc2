//! Input checks of `workloads.json` against the cluster: clear errors naming workload and field.

mod plan_support;

use std::path::Path;

use cluster_matcher::plan::{GpuRef, Workloads};
use plan_support::*;

#[test]
fn online_work_larger_than_its_gpu_is_refused() {
    let spec = cluster(&[("n0", "V100", 2, 32_768)]);
    let w = Workloads {
        online: vec![online("big", "n0", 1, 40_000, 30.0, 10.0)],
        offline: vec![],
    };
    let err = w.check(Path::new("w.json"), &spec).unwrap_err().to_string();
    assert!(
        err.contains("online[0].memory_mib") && err.contains("`big`") && err.contains("32768"),
        "{err}"
    );
    let mut unpinned = online("big", "n0", 1, 40_000, 30.0, 10.0);
    unpinned.at = None;
    let mut with_cells = spec.clone();
    with_cells.cells = Some("cells.json".into());
    let err = Workloads {
        online: vec![unpinned],
        offline: vec![],
    }
    .check(Path::new("w.json"), &with_cells)
    .unwrap_err()
    .to_string();
    assert!(err.contains("more than any GPU"), "{err}");
    let ok = Workloads {
        online: vec![online("fits", "n0", 1, 32_768, 30.0, 10.0)],
        offline: vec![],
    };
    ok.check(Path::new("w.json"), &spec).unwrap();
}

#[test]
fn two_offline_jobs_current_on_one_gpu_need_max_offline_per_gpu_two() {
    let mut spec = cluster(&[("n0", "V100", 2, 32_768)]);
    let at = GpuRef {
        node: "n0".into(),
        gpu: 0,
    };
    let mut a = offline("a", 4_000, 10.0);
    a.current = Some(at.clone());
    let mut b = offline("b", 4_000, 10.0);
    b.current = Some(at);
    let w = Workloads {
        online: vec![online("on", "n0", 0, 8_000, 30.0, 10.0)],
        offline: vec![a, b],
    };
    let err = w.check(Path::new("w.json"), &spec).unwrap_err().to_string();
    assert!(
        err.contains("offline[1].current")
            && err.contains("`b`")
            && err.contains("max_offline_per_gpu = 1"),
        "{err}"
    );
    spec.max_offline_per_gpu = 2;
    w.check(Path::new("w.json"), &spec).unwrap();
}

/// `scheduler_refusal_ttl_s`: 300 s when absent, 0 (never remembered) accepted, more than a
/// day refused with the key named.
#[test]
fn scheduler_refusal_ttl_defaults_to_five_minutes_and_is_bounded() {
    use cluster_matcher::plan::ClusterSpec;
    let parse = |extra: &str| -> ClusterSpec { serde_json::from_str(&format!("{{\"nodes\": []{extra}}}")).unwrap() };
    let p = Path::new("cluster.json");
    let default = parse("");
    assert_eq!(default.scheduler_refusal_ttl_s, 300);
    default.check(p).unwrap();
    parse(", \"scheduler_refusal_ttl_s\": 0").check(p).unwrap();
    parse(", \"scheduler_refusal_ttl_s\": 86400").check(p).unwrap();
    let err = parse(", \"scheduler_refusal_ttl_s\": 86401").check(p).unwrap_err().to_string();
    assert!(err.contains("scheduler_refusal_ttl_s") && err.contains("0..=86400"), "{err}");
}
