//! Shared helpers for the plan and extender tests: a hand-built predictor with known weights
//! and small clusters.
#![allow(dead_code)]

use std::collections::BTreeMap;

use cluster_matcher::plan::{ClusterSpec, GpuRef, NodeSpec, OfflineJob, OnlineWorkload};
use cluster_matcher::predictor::mlp::Layer;
use cluster_matcher::predictor::{GpuModel, JobProfile, SpeedPredictor, INPUT_WIDTH};

/// A predictor whose `v100` model outputs `exp(-|ln iso_off - ln iso_on|)`: jobs with similar
/// isolated speeds pair best. Exact, so tests can compute the optimum themselves.
pub fn similarity_predictor() -> SpeedPredictor {
    let mut w1 = vec![vec![0.0f32; INPUT_WIDTH]; 2];
    w1[0][0] = 1.0;
    w1[0][6] = -1.0;
    w1[1][0] = -1.0;
    w1[1][6] = 1.0;
    let model = GpuModel {
        mean: vec![0.0; INPUT_WIDTH],
        std: vec![1.0; INPUT_WIDTH],
        layers: vec![
            Layer { w: w1, b: vec![0.0, 0.0] },
            Layer { w: vec![vec![-1.0, -1.0]], b: vec![0.0] },
        ],
    };
    model.validate("similarity").unwrap();
    SpeedPredictor { models: [("v100".to_string(), model.into())].into() }
}

/// The weight [`similarity_predictor`] gives a pair of isolated speeds.
pub fn similarity(off: f64, on: f64) -> f64 {
    (-(off.ln() - on.ln()).abs()).exp()
}

pub fn profile(iso: f64) -> JobProfile {
    JobProfile {
        name: format!("iso{iso}"),
        batch_size: None,
        isolated: [("v100".to_string(), iso)].into(),
        isolated_2gpu: BTreeMap::new(),
    }
}

pub fn cluster(nodes: &[(&str, &str, u32, u64)]) -> ClusterSpec {
    ClusterSpec {
        round_period_s: 60,
        state_dir: None,
        stale_after_s: 30,
        min_offline_sm_percent: 10.0,
        memory_headroom_mib: 0,
        max_offline_memory_fraction: 1.0,
        unprofiled_weight: 0.3,
        max_offline_per_gpu: 1,
        policy: Default::default(),
        scheduler_refusal_ttl_s: 300,
        nodes: nodes
            .iter()
            .map(|(name, ty, gpus, mem)| NodeSpec {
                name: name.to_string(),
                gpu_type: ty.to_string(),
                gpus: *gpus,
                gpu_memory_mib: *mem,
                predictor_gpu_type: Some("v100".into()),
            })
            .collect(),
        tenants: BTreeMap::new(),
        cells: None,
        cells_state: None,
    }
}

pub fn online(name: &str, node: &str, gpu: u32, mem: u64, sm: f64, iso: f64) -> OnlineWorkload {
    OnlineWorkload {
        group: None,
        name: name.into(),
        tenant: "svc".into(),
        at: Some(GpuRef { node: node.into(), gpu }),
        gpu_type: None,
        memory_mib: mem,
        sm_activity_percent: sm,
        profile: Some(profile(iso)),
    }
}

pub fn offline(name: &str, mem: u64, iso: f64) -> OfflineJob {
    OfflineJob {
        name: name.into(),
        tenant: "batch".into(),
        memory_mib: mem,
        gpu_types: vec![],
        profile: Some(profile(iso)),
        current: None,
        held_memory_quota_mib: None,
        allowed_nodes: None,
        feedback: Default::default(),
    }
}
