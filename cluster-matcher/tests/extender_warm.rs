//! The server's background rounds carry the planner's warm start: each round starts from
//! the last round's pairs (`plan::Planner`), not only from the jobs' `current` GPUs.

mod plan_support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cluster_matcher::extender::Extender;
use cluster_matcher::matching::classes::Start;
use cluster_matcher::plan::{ClusterSpec, Workloads};

#[test]
fn a_background_round_warm_starts_from_the_last_rounds_pairs() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/extender");
    let cluster = ClusterSpec::load(&dir.join("cluster.json")).unwrap();
    let mut workloads = Workloads::load(&dir.join("workloads.json"), &cluster).unwrap();
    // Interchangeable GPUs and jobs, none running anywhere (`current` empty): one class
    // each, so the class solver runs and only a carried solution can warm-start it.
    let first = workloads.online[0].clone();
    for o in &mut workloads.online {
        o.profile = first.profile.clone();
        o.memory_mib = first.memory_mib;
        o.sm_activity_percent = first.sm_activity_percent;
    }
    let job = workloads.offline[0].clone();
    workloads.offline = (0..5)
        .map(|i| {
            let mut j = job.clone();
            j.name = format!("job-{i}");
            j.current = None;
            j
        })
        .collect();
    let ext = Arc::new(Extender::new(cluster, workloads, plan_support::similarity_predictor(), None));
    let first = ext.snapshot();
    assert_eq!(first.plan.stats.solver, "classes");
    assert_eq!(first.plan.stats.start, Some(Start::Cold), "round 0 has nothing to start from");
    assert_eq!(first.plan.assignments.len(), 3);
    let thread = ext.spawn_planner();
    ext.replan();
    for _ in 0..1200 {
        if ext.snapshot().round >= 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let next = ext.snapshot();
    assert!(next.round >= 1, "a background round ran");
    assert_eq!(
        next.plan.stats.start,
        Some(Start::WarmOptimal),
        "the background round started from round 0's pairs and certified them"
    );
    assert_eq!(next.plan.total_predicted, first.plan.total_predicted);
    ext.stop_planner();
    thread.join().unwrap();
}
