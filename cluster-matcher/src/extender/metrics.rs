//! `GET /metrics`: Prometheus text exposition (format 0.0.4).
//!
//! GPU series from each node's heartbeat (the node agent's NVML samples), exported only while
//! the heartbeat is fresh, labelled as dcgm-exporter labels its own (`gpu`, `UUID`, `device`,
//! `modelName`, `Hostname`, and one series per pod on the GPU with `pod`, `namespace`, both
//! empty for a GPU no xshare pod uses): `xshare_gpu_sm_activity_ratio`,
//! `xshare_gpu_memory_used_bytes`, `xshare_gpu_memory_free_bytes`. The SM activity is the
//! monitor's (GPM's spatial SM activity on Hopper and later, the utilization rate before): it is
//! neither dcgm-exporter's `DCGM_FI_DEV_GPU_UTIL` nor its `DCGM_FI_PROF_SM_ACTIVE` everywhere, so
//! it is exported under neither name. Memory is the same quantity as dcgm-exporter's, and with
//! [`super::Extender::with_dcgm_metrics`] (`serve --dcgm-metrics`, for a cluster without
//! dcgm-exporter) also goes out under its names ([`DCGM_FAMILIES`]); by default not, since
//! beside dcgm-exporter each GPU would have two series of one name.
//!
//! `xshare_*` series: the plan (round, its duration, jobs placed and waiting, breaks, GPUs
//! skipped), each GPU's health state as the planner sees it (`xshare_planner_gpu_health_state`:
//! stale, missing and unreadable heartbeats included; not sysmonitor's own
//! `xshare_gpu_health_state`), evictions seen through the Eviction API, and the watches' own
//! counters.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use kube_contract::heartbeat::Freshness;
use kube_contract::pod as contract;

use super::Extender;
use crate::plan::{GpuHealth, GpuRef};

/// Content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every metric family this endpoint can export (the Grafana dashboard's test checks its
/// panels against this list).
pub const FAMILIES: &[&str] = &[
    "xshare_gpu_sm_activity_ratio",
    "xshare_gpu_memory_used_bytes",
    "xshare_gpu_memory_free_bytes",
    "xshare_plan_round",
    "xshare_plan_round_duration_seconds",
    "xshare_plan_placed_jobs",
    "xshare_plan_waiting_jobs",
    "xshare_plan_breaks",
    "xshare_plan_skipped_gpus",
    "xshare_extender_bind_lock_refusals_total",
    "xshare_extender_bind_lock_takeovers_total",
    "xshare_extender_bind_refusals_total",
    "xshare_extender_scheduler_refusals_total",
    "xshare_planner_gpu_health_state",
    "xshare_gpu_offline_sm_budget_ratio",
    "xshare_gpu_heartbeat_age_seconds",
    "xshare_offline_evictions_total",
    "xshare_watch_lists_total",
    "xshare_watch_errors_total",
    "xshare_watch_retry_after_waits_total",
    "xshare_watch_gone_restarts_total",
    "xshare_kubelet_evictions_annotated_total",
    "xshare_kubelet_eviction_annotation_errors_total",
    "xshare_kubelet_evictions_skipped_total",
];

/// The families [`super::Extender::with_dcgm_metrics`] adds: dcgm-exporter's names for the
/// same memory figures, in its unit (MiB).
pub const DCGM_FAMILIES: &[&str] = &["DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"];

/// Health states exported by `xshare_planner_gpu_health_state` (one series each, value 1 for the
/// current one).
pub const HEALTH_STATES: &[&str] = &[
    "Init",
    "Healthy",
    "Unhealthy",
    "Overlimit",
    "Disabled",
    "Missing",
    "Stale",
    "Unreadable",
];

fn health_state(h: &GpuHealth) -> &'static str {
    match h {
        GpuHealth::Init => "Init",
        GpuHealth::Healthy => "Healthy",
        GpuHealth::Unhealthy => "Unhealthy",
        GpuHealth::Overlimit => "Overlimit",
        GpuHealth::Disabled => "Disabled",
        GpuHealth::Missing => "Missing",
        GpuHealth::Stale { .. } | GpuHealth::FromFuture { .. } => "Stale",
        GpuHealth::Unreadable { .. } => "Unreadable",
    }
}

/// Escapes a label value (backslash, double quote, newline).
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
    format!("{{{}}}", inner.join(","))
}

struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }
    fn sample(&mut self, name: &str, labels: &str, value: f64) {
        let _ = writeln!(self.0, "{name}{labels} {value}");
    }
}

/// The exposition of `ext`'s state now.
pub fn render(ext: &Extender) -> String {
    let snap = ext.snapshot();
    let plan = &snap.plan;
    let mut o = Out(String::new());
    o.family("xshare_plan_round", "gauge", "Number of the latest plan round.");
    o.sample("xshare_plan_round", "", snap.round as f64);
    o.family(
        "xshare_plan_round_duration_seconds",
        "gauge",
        "Wall time the latest plan round took.",
    );
    o.sample("xshare_plan_round_duration_seconds", "", snap.plan_seconds);
    o.family(
        "xshare_plan_placed_jobs",
        "gauge",
        "Offline jobs the latest plan places.",
    );
    o.sample("xshare_plan_placed_jobs", "", plan.assignments.len() as f64);
    o.family(
        "xshare_plan_waiting_jobs",
        "gauge",
        "Offline jobs the latest plan leaves waiting.",
    );
    o.sample("xshare_plan_waiting_jobs", "", plan.unplaced.len() as f64);
    o.family(
        "xshare_plan_breaks",
        "gauge",
        "Running offline jobs the latest plan moves or stops.",
    );
    o.sample("xshare_plan_breaks", "", plan.breaks.len() as f64);
    o.family(
        "xshare_plan_skipped_gpus",
        "gauge",
        "Online GPUs the latest plan keeps offline work off (health, rules).",
    );
    o.sample("xshare_plan_skipped_gpus", "", plan.skipped_gpus.len() as f64);
    let (refusals, takeovers) = ext.api().map_or((0, 0), |a| a.bind_lock_counts());
    o.family(
        "xshare_extender_bind_lock_refusals_total",
        "counter",
        "Binds refused because another offline pod's bind held the node until its Allocate.",
    );
    o.sample("xshare_extender_bind_lock_refusals_total", "", refusals as f64);
    o.family(
        "xshare_extender_bind_lock_takeovers_total",
        "counter",
        "Node bind locks taken over: expired, unreadable, or whose pod no longer waits for Allocate.",
    );
    o.sample("xshare_extender_bind_lock_takeovers_total", "", takeovers as f64);
    let (gpu_full, job_has_pod) = ext.guard_refusal_counts();
    o.family(
        "xshare_extender_bind_refusals_total",
        "counter",
        "Binds refused below the plan: the GPU already holds max_offline_per_gpu live offline pods, or the job already has a live bound pod.",
    );
    o.sample("xshare_extender_bind_refusals_total", &labels(&[("reason", "gpu_full")]), gpu_full as f64);
    o.sample("xshare_extender_bind_refusals_total", &labels(&[("reason", "job_has_pod")]), job_has_pod as f64);
    o.family(
        "xshare_extender_scheduler_refusals_total",
        "counter",
        "Planned nodes kube-scheduler's own filters (resources, taints, node selector, affinity) left out of a filter call for the job's pod: (job, node) pairs, each counted again only after scheduler_refusal_ttl_s (with 0, at every such call).",
    );
    o.sample("xshare_extender_scheduler_refusals_total", "", ext.scheduler_refusal_count() as f64);

    let Some(w) = ext.watched_inputs() else { return o.0 };
    let cs = w.view.snapshot();
    let cluster = cs.cluster_spec(&w.base);

    // Pods by the GPU they use: (namespace, name).
    let mut pods_on: BTreeMap<GpuRef, Vec<(String, String)>> = BTreeMap::new();
    for p in &cs.pods {
        let m = &p.metadata;
        if !matches!(crate::watch::planned_role(p, &cs.settings.online_gpu_resources), Ok(Some(_))) {
            continue;
        }
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
        if matches!(phase, "Succeeded" | "Failed") {
            continue;
        }
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        let gpu = m
            .annotations
            .as_ref()
            .and_then(|a| a.get(contract::ANN_GPU))
            .and_then(|g| g.parse::<u32>().ok());
        if let (Some(node), Some(gpu)) = (node, gpu) {
            pods_on.entry(GpuRef { node, gpu }).or_default().push((
                m.namespace.clone().unwrap_or_default(),
                m.name.clone().unwrap_or_default(),
            ));
        }
    }

    let mut health_lines = Vec::new();
    let mut gpu_series: BTreeMap<&str, Vec<(String, f64)>> = BTreeMap::new();
    let mut budget = Vec::new();
    let mut age = Vec::new();
    for node in &cluster.nodes {
        let hb = cs.heartbeat(&node.name).ok();
        let fresh = hb
            .as_ref()
            .map(|h| h.freshness(cs.now_unix_ms, cs.settings.stale_after, cs.settings.max_clock_skew));
        if let (Some(h), Some(f)) = (&hb, fresh) {
            let age_s = match f {
                Freshness::Fresh { age_ms } | Freshness::Stale { age_ms } => age_ms as f64 / 1000.0,
                Freshness::FromFuture { ahead_ms } => -(ahead_ms as f64) / 1000.0,
            };
            age.push((labels(&[("Hostname", &h.node)]), age_s));
        }
        for gpu in 0..node.gpus {
            let at = GpuRef {
                node: node.name.clone(),
                gpu,
            };
            let report = hb.as_ref().and_then(|h| h.gpu(gpu));
            let uuid = report.map_or("", |r| r.uuid.as_str());
            let model = report.map_or(node.gpu_type.as_str(), |r| r.model.as_str());
            let index = gpu.to_string();
            let device = format!("nvidia{gpu}");
            let base = [
                ("gpu", index.as_str()),
                ("UUID", uuid),
                ("device", device.as_str()),
                ("modelName", model),
                ("Hostname", node.name.as_str()),
            ];
            let state = health_state(&cs.health(&at));
            for s in HEALTH_STATES {
                let mut l = base.to_vec();
                l.push(("state", s));
                health_lines.push((labels(&l), if *s == state { 1.0 } else { 0.0 }));
            }
            let Some(r) = report.filter(|_| fresh.is_some_and(Freshness::is_fresh)) else {
                continue;
            };
            budget.push((labels(&base), f64::from(r.offline_sm_budget_permille) / 1000.0));
            let owners = pods_on
                .get(&at)
                .cloned()
                .unwrap_or_else(|| vec![(String::new(), String::new())]);
            for (ns, pod) in owners {
                let mut l = base.to_vec();
                l.push(("pod", pod.as_str()));
                l.push(("namespace", ns.as_str()));
                let l = labels(&l);
                let used = r.memory_used_bytes;
                let free = r.memory_total_bytes.saturating_sub(r.memory_used_bytes);
                let mut put = |name: &'static str, v: f64| gpu_series.entry(name).or_default().push((l.clone(), v));
                put("xshare_gpu_sm_activity_ratio", f64::from(r.sm_activity_permille) / 1000.0);
                put("xshare_gpu_memory_used_bytes", used as f64);
                put("xshare_gpu_memory_free_bytes", free as f64);
                if ext.dcgm_metrics() {
                    put("DCGM_FI_DEV_FB_USED", (used >> 20) as f64);
                    put("DCGM_FI_DEV_FB_FREE", (free >> 20) as f64);
                }
            }
        }
    }
    let gpu_help = [
        ("xshare_gpu_sm_activity_ratio", "SM activity over the node monitor's last window, 0..1 (GPM's spatial SM activity on Hopper and later, the utilization rate before), from the node heartbeat."),
        ("xshare_gpu_memory_used_bytes", "Device memory in use by all processes, from the node heartbeat."),
        ("xshare_gpu_memory_free_bytes", "Device memory not in use, from the node heartbeat."),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB), from the node heartbeat (xshare, --dcgm-metrics)."),
        ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB), from the node heartbeat (xshare, --dcgm-metrics)."),
    ];
    for (name, help) in gpu_help {
        if name.starts_with("DCGM_") && !ext.dcgm_metrics() {
            continue;
        }
        o.family(name, "gauge", help);
        for (l, v) in gpu_series.get(name).into_iter().flatten() {
            o.sample(name, l, *v);
        }
    }
    o.family(
        "xshare_planner_gpu_health_state",
        "gauge",
        "1 for the GPU's health state as the planner sees it, 0 for the others.",
    );
    for (l, v) in &health_lines {
        o.sample("xshare_planner_gpu_health_state", l, *v);
    }
    o.family(
        "xshare_gpu_offline_sm_budget_ratio",
        "gauge",
        "Share of the GPU's SMs the node grants offline work.",
    );
    for (l, v) in &budget {
        o.sample("xshare_gpu_offline_sm_budget_ratio", l, *v);
    }
    o.family(
        "xshare_gpu_heartbeat_age_seconds",
        "gauge",
        "Age of the node's GPU heartbeat (negative: dated ahead).",
    );
    for (l, v) in &age {
        o.sample("xshare_gpu_heartbeat_age_seconds", l, *v);
    }
    o.family(
        "xshare_offline_evictions_total",
        "counter",
        "Offline pods seen evicted through the Eviction API.",
    );
    o.sample("xshare_offline_evictions_total", "", w.evictions_seen() as f64);
    let st = &w.view.stats;
    for (name, v, help) in [
        (
            "xshare_watch_lists_total",
            &st.lists,
            "Lists the pod and node watches made (first and relists).",
        ),
        ("xshare_watch_errors_total", &st.errors, "Errors the watches met."),
        (
            "xshare_watch_retry_after_waits_total",
            &st.retry_after_waits,
            "Waits a server's Retry-After asked for.",
        ),
        (
            "xshare_watch_gone_restarts_total",
            &st.gone_restarts,
            "Watches started afresh after 410 Gone.",
        ),
        (
            "xshare_kubelet_evictions_annotated_total",
            &st.kubelet_evictions_annotated,
            "Kubelet evictions of offline pods written onto them for their node agents.",
        ),
        (
            "xshare_kubelet_eviction_annotation_errors_total",
            &st.kubelet_eviction_errors,
            "Failed writes of a kubelet eviction onto its pod.",
        ),
        (
            "xshare_kubelet_evictions_skipped_total",
            &st.kubelet_evictions_skipped,
            "Kubelet evictions not written onto a pod (not an offline pod of the watch, another node's, finished, written, stale).",
        ),
    ] {
        o.family(name, "counter", help);
        o.sample(name, "", v.load(Ordering::Relaxed) as f64);
    }
    o.0
}
