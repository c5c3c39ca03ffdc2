//! What the monitor tells the outside: the JSON state file (its type and I/O live in
//! `node_daemon::monitor_state`, shared with its readers), Prometheus text, and the
//! `sysmonitor status` table.

use std::fmt::Write as _;

use node_daemon::monitor_state::MonitorState;

use crate::health::State;

/// Prometheus text exposition (format 0.0.4).
pub fn prometheus(s: &MonitorState) -> String {
    let mut o = String::with_capacity(2048);
    let g = s.gpu;
    let mut metric = |name: &str, help: &str, kind: &str, rows: &[(String, f64)]| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in rows {
            let _ = writeln!(o, "{name}{{gpu=\"{g}\"{labels}}} {v}");
        }
    };
    let states = [
        State::Init,
        State::Healthy,
        State::Unhealthy,
        State::Overlimit,
        State::Disabled,
    ];
    let rows: Vec<_> = states
        .iter()
        .map(|st| {
            (
                format!(",state=\"{}\"", st.as_str()),
                (s.state == *st) as u8 as f64,
            )
        })
        .collect();
    metric(
        "xshare_gpu_health_state",
        "1 for the current health state of the GPU",
        "gauge",
        &rows,
    );
    metric(
        "xshare_gpu_admits_offline",
        "1 when offline work may be placed on this GPU",
        "gauge",
        &[(String::new(), s.admits_offline as u8 as f64)],
    );
    if let Some(x) = &s.sample {
        let src = x.sm_source.map(|v| v.as_str()).unwrap_or("none");
        metric(
            "xshare_gpu_utilization_percent",
            "GPU utilization",
            "gauge",
            &[(String::new(), x.gpu_util)],
        );
        metric(
            "xshare_gpu_sm_activity_percent",
            "SM activity and its source",
            "gauge",
            &[(format!(",source=\"{src}\""), x.sm_activity)],
        );
        metric(
            "xshare_gpu_sm_clock_mhz",
            "SM clock",
            "gauge",
            &[(String::new(), x.sm_clock_mhz as f64)],
        );
        metric(
            "xshare_gpu_sm_clock_max_mhz",
            "Maximum SM clock",
            "gauge",
            &[(String::new(), x.sm_clock_max_mhz as f64)],
        );
        metric(
            "xshare_gpu_memory_used_bytes",
            "GPU memory used",
            "gauge",
            &[(String::new(), x.mem_used as f64)],
        );
        metric(
            "xshare_gpu_memory_total_bytes",
            "GPU memory total",
            "gauge",
            &[(String::new(), x.mem_total as f64)],
        );
        if let Some(p) = x.power_mw {
            metric(
                "xshare_gpu_power_watts",
                "Board power",
                "gauge",
                &[(String::new(), p as f64 / 1000.0)],
            );
        }
        if let Some(t) = x.temp_c {
            metric(
                "xshare_gpu_temperature_celsius",
                "GPU temperature",
                "gauge",
                &[(String::new(), t as f64)],
            );
        }
    }
    let ev: Vec<_> = node_daemon::evictor::EvictReason::ALL
        .iter()
        .map(|r| {
            (
                format!(",reason=\"{}\"", r.as_str()),
                *s.evictions.get(r.as_str()).unwrap_or(&0) as f64,
            )
        })
        .collect();
    metric(
        "xshare_evictions_total",
        "Offline processes evicted, by reason",
        "counter",
        &ev,
    );
    metric(
        "xshare_offline_processes",
        "Offline processes registered in this GPU's ledgers (its own and the pod ledgers)",
        "gauge",
        &[(String::new(), s.offline_registered as f64)],
    );
    metric(
        "xshare_pod_ledgers",
        "Pod ledgers of this GPU: open (read) and refused (damaged or another GPU's: their processes are not read)",
        "gauge",
        &[
            (",state=\"open\"".to_string(), s.pod_ledgers as f64),
            (",state=\"refused\"".to_string(), s.pod_ledgers_refused.len() as f64),
        ],
    );
    metric(
        "xshare_eviction_kills_total",
        "Evictions that needed SIGKILL after the grace period",
        "counter",
        &[(String::new(), s.kills as f64)],
    );
    metric(
        "xshare_overlimit_entries_window",
        "Overlimit entries inside the hold window",
        "gauge",
        &[(String::new(), s.overlimit_entries_mono_ms.len() as f64)],
    );
    metric(
        "xshare_overlimit_hold_seconds",
        "Hold of the current or last Overlimit stay",
        "gauge",
        &[(String::new(), s.hold_ms as f64 / 1000.0)],
    );
    metric(
        "xshare_samples_total",
        "GPU samples taken",
        "counter",
        &[(String::new(), s.samples as f64)],
    );
    metric(
        "xshare_sampling_interval_seconds",
        "Sampling interval in force: interval_ms with offline work registered, idle_interval_ms without",
        "gauge",
        &[(String::new(), s.sampling_ms as f64 / 1000.0)],
    );
    metric(
        "xshare_sample_errors_total",
        "GPU samples that failed",
        "counter",
        &[(String::new(), s.sample_errors as f64)],
    );
    metric(
        "xshare_config_error",
        "1 while the last config reload failed (old config kept)",
        "gauge",
        &[(String::new(), s.config_error.is_some() as u8 as f64)],
    );
    if let Some(a) = s.host_mem_available_pct {
        metric(
            "xshare_host_memory_available_percent",
            "Host MemAvailable / MemTotal",
            "gauge",
            &[(String::new(), a)],
        );
    }
    if let Some(p) = s.host_psi_some_avg10 {
        metric(
            "xshare_host_memory_psi_some_avg10",
            "Host memory PSI some avg10",
            "gauge",
            &[(String::new(), p)],
        );
    }
    o
}

/// Human-readable table for `sysmonitor status`.
/// `running`: whether the monitor that wrote `s` still runs (else the heading says so).
pub fn status_table(s: &MonitorState, now_unix_ms: u64, running: bool) -> String {
    let mut o = String::new();
    let age = now_unix_ms.saturating_sub(s.updated_unix_ms);
    let row = |o: &mut String, k: &str, v: String| {
        let _ = writeln!(o, "  {k:<22} {v}");
    };
    let gpu = format!("GPU {}", s.gpu);
    let _ = writeln!(o, "{}", node_daemon::cli::status_heading(&gpu, "monitor", s.monitor_pid, running, age));
    let mut st = s.state.as_str().to_uppercase();
    if let Some(d) = s.disabled_by {
        st.push_str(&format!(" by {d:?}"));
    }
    row(&mut o, "state", st);
    row(
        &mut o,
        "admits offline",
        if s.admits_offline {
            "yes".into()
        } else {
            "no".into()
        },
    );
    if let Some(r) = s.hold_remaining_ms {
        row(
            &mut o,
            "overlimit hold left",
            format!("{r} ms of {} ms", s.hold_ms),
        );
    }
    row(
        &mut o,
        "overlimit entries (2h)",
        s.overlimit_entries_mono_ms.len().to_string(),
    );
    if let Some((a, b, why)) = &s.last_transition {
        row(
            &mut o,
            "last transition",
            format!("{} -> {}: {why}", a.as_str(), b.as_str()),
        );
    }
    if let Some(x) = &s.sample {
        row(&mut o, "gpu util", format!("{:.1} %", x.gpu_util));
        row(
            &mut o,
            "sm activity",
            format!(
                "{:.1} % (source: {})",
                x.sm_activity,
                x.sm_source.map(|v| v.as_str()).unwrap_or("none")
            ),
        );
        row(
            &mut o,
            "sm clock",
            format!("{} / {} MHz", x.sm_clock_mhz, x.sm_clock_max_mhz),
        );
        row(
            &mut o,
            "memory",
            format!("{} / {} MiB", x.mem_used >> 20, x.mem_total >> 20),
        );
        if let Some(p) = x.power_mw {
            row(&mut o, "power", format!("{:.1} W", p as f64 / 1000.0));
        }
        if let Some(t) = x.temp_c {
            row(&mut o, "temperature", format!("{t} C"));
        }
    }
    row(
        &mut o,
        "offline registered",
        format!("{} (in the GPU's ledger and {} pod ledgers)", s.offline_registered, s.pod_ledgers),
    );
    for (pod, why) in &s.pod_ledgers_refused {
        row(&mut o, "pod ledger REFUSED", format!("pod {pod}: {why} (its processes are not read from it)"));
    }
    row(
        &mut o,
        "offline pod list",
        match &s.offline_pods {
            None => "none read (node-agent writes it): work without the shim is found only beside a registered process".into(),
            Some(p) => match &p.error {
                None => format!("{} pods ({})", p.pods, p.path),
                Some(e) => format!("ERROR {e}; the last good list ({} pods) in force", p.pods),
            },
        },
    );
    let ev: Vec<String> = s
        .evictions
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    row(
        &mut o,
        "evictions",
        if ev.is_empty() {
            "none".into()
        } else {
            ev.join(" ")
        },
    );
    row(&mut o, "sigkills", s.kills.to_string());
    row(
        &mut o,
        "samples / errors",
        if s.sampling_ms > s.interval_ms {
            format!(
                "{} / {} at {} ms (idle: no offline work, {} ms while there is)",
                s.samples, s.sample_errors, s.sampling_ms, s.interval_ms
            )
        } else {
            format!(
                "{} / {} at {} ms",
                s.samples, s.sample_errors, s.interval_ms
            )
        },
    );
    if let Some(a) = s.host_mem_available_pct {
        let psi = s
            .host_psi_some_avg10
            .map(|p| format!(", PSI some avg10 {p:.1} %"))
            .unwrap_or_default();
        row(&mut o, "host memory", format!("{a:.1} % available{psi}"));
    }
    row(&mut o, "config", s.config_files.join(" + "));
    if let Some(e) = &s.config_error {
        row(
            &mut o,
            "CONFIG ERROR",
            format!("{e} (previous config still in force)"),
        );
    }
    if let Some(e) = &s.ledger_error {
        row(&mut o, "LEDGER ERROR", e.clone());
    }
    if let Some(e) = &s.status_file_error {
        row(&mut o, "STATUS FILE ERROR", format!("{e} (nothing published: node-agent admits no work, shims throttle as for a stale monitor)"));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::{GpuSample, SmSource};

    /// GPU 0 Overlimit (GPM SM activity 97 %), two evictions, a config error.
    fn snap() -> MonitorState {
        MonitorState {
            state: State::Overlimit,
            disabled_by: None,
            sample: Some(GpuSample {
                gpu_util: 99.0,
                sm_activity: 97.0,
                sm_source: Some(SmSource::Gpm),
                ..Default::default()
            }),
            hold_remaining_ms: Some(150),
            last_transition: Some((State::Healthy, State::Overlimit, "gpu_util".into())),
            evictions: [("overlimit".to_string(), 2)].into_iter().collect(),
            config_error: Some("bad".into()),
            overlimit_entry_sample: Some(3),
            last_eviction_sample: Some(3),
            overlimit_eviction_lag_samples: Some(0),
            ..MonitorState::example()
        }
    }

    #[test]
    fn prometheus_has_one_hot_state_and_labelled_counters() {
        let t = prometheus(&snap());
        assert!(t.contains("xshare_gpu_health_state{gpu=\"0\",state=\"overlimit\"} 1\n"));
        assert!(t.contains("xshare_gpu_health_state{gpu=\"0\",state=\"healthy\"} 0\n"));
        assert!(t.contains("xshare_evictions_total{gpu=\"0\",reason=\"overlimit\"} 2\n"));
        assert!(t.contains("xshare_gpu_sm_activity_percent{gpu=\"0\",source=\"gpm\"} 97\n"));
        assert!(t.contains("xshare_sampling_interval_seconds{gpu=\"0\"} 0.01\n"), "{t}");
        for line in t.lines().filter(|l| !l.starts_with('#')) {
            let v = line.rsplit(' ').next().unwrap();
            assert!(v.parse::<f64>().is_ok(), "bad sample line {line}");
        }
        let pods = MonitorState {
            offline_registered: 3,
            pod_ledgers: 2,
            pod_ledgers_refused: [("0000000a-0000-4000-8000-00000000000a".to_string(), "bad magic".to_string())].into(),
            ..snap()
        };
        let t = prometheus(&pods);
        assert!(t.contains("xshare_offline_processes{gpu=\"0\"} 3\n"), "{t}");
        assert!(t.contains("xshare_pod_ledgers{gpu=\"0\",state=\"open\"} 2\n"), "{t}");
        assert!(t.contains("xshare_pod_ledgers{gpu=\"0\",state=\"refused\"} 1\n"), "{t}");
        let t = status_table(&pods, 1100, true);
        assert!(t.lines().any(|l| l.contains("pod ledger REFUSED") && l.contains("pod 0000000a-0000-4000-8000-00000000000a: bad magic")), "{t}");
    }

    #[test]
    fn status_table_shows_state_hold_and_config_error() {
        let t = status_table(&snap(), 1100, true);
        assert!(t.contains("OVERLIMIT"));
        assert!(t.contains("150 ms of 200 ms"));
        assert!(t.contains("CONFIG ERROR"));
        assert!(!t.contains("STATUS FILE ERROR") && !t.contains("LEDGER ERROR"));
        let broken = MonitorState { status_file_error: Some("status file /run/xshare/status/gpu0: open: Permission denied".into()), ..snap() };
        assert!(status_table(&broken, 1100, true).lines().any(|l| l.contains("STATUS FILE ERROR") && l.contains("status/gpu0: open: Permission denied")), "{}", status_table(&broken, 1100, true));
        assert!(t.contains("source: gpm"));
        assert!(t.contains("10 / 0 at 10 ms"), "{t}");
        let idle = MonitorState {
            sampling_ms: 100,
            ..snap()
        };
        let t = status_table(&idle, 1100, false);
        assert!(t.contains("is not running: its state as it left it"), "{t}");
        assert!(
            t.contains("at 100 ms (idle: no offline work, 10 ms while there is)"),
            "{t}"
        );
    }

    /// The offline pod list the monitor judges by: none read, in force, or refused with the
    /// last good one in force.
    #[test]
    fn status_table_shows_the_offline_pod_list() {
        use node_daemon::monitor_state::OfflinePodsState;
        let t = status_table(&snap(), 1100, true);
        assert!(t.lines().any(|l| l.trim_start().starts_with("offline pod list") && l.contains("none read (node-agent writes it)")), "{t}");
        let list = |error: Option<&str>| MonitorState {
            offline_pods: Some(OfflinePodsState { path: "/run/xshare/offline-pods.json".into(), pods: 3, error: error.map(str::to_string) }),
            ..snap()
        };
        let t = status_table(&list(None), 1100, true);
        assert!(t.contains("3 pods (/run/xshare/offline-pods.json)"), "{t}");
        let t = status_table(&list(Some("/run/xshare/offline-pods.json:1: EOF")), 1100, true);
        assert!(t.contains("ERROR /run/xshare/offline-pods.json:1: EOF; the last good list (3 pods) in force"), "{t}");
    }
}
