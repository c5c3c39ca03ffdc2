//! The monitor's state file, a contract between one writer (`sysmonitor run`) and its readers
//! (`sysmonitor status`, mps-manager, cluster-matcher): its type, [`write()`] and [`read()`].

use std::collections::BTreeMap;
use std::path::Path;

use node_ledger::{GpuSample, HealthState};
use serde::{Deserialize, Serialize};

/// Why the monitor holds the GPU Disabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DisableCause {
    /// NVML failed repeatedly (driver gone, device lost).
    Nvml,
    /// A critical XID (the code).
    Xid(u64),
    /// An operator took the GPU out of service (`sysmonitor disable`).
    Operator,
}

/// The monitor's state file: what `sysmonitor run` writes when its health, evictions or
/// errors change and at least every `state_file_every_ms` (heartbeat), and
/// `sysmonitor status`, mps-manager (XID faults) and the matcher (health) read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MonitorState {
    /// GPU index.
    pub gpu: u32,
    /// Pid of the writing monitor.
    pub monitor_pid: u32,
    /// Boot the monotonic times belong to ([`crate::clock::boot_id`]).
    pub boot_id: String,
    /// Current health state.
    pub state: HealthState,
    /// Whether offline work may be placed on the GPU now.
    pub admits_offline: bool,
    /// Why the GPU is Disabled, while it is.
    pub disabled_by: Option<DisableCause>,
    /// Monotonic ms since which the GPU is Disabled, while it is (a restarted monitor keeps an
    /// XID's Disabled from then on; absent in files written before this field existed).
    #[serde(default)]
    pub disabled_since_mono_ms: Option<u64>,
    /// A critical XID (code, monotonic ms seen) reported before or during an operator's
    /// Disabled: the GPU stays Disabled by it once the operator enables it (a restarted
    /// monitor keeps it; absent in files written before this field existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid_under_operator: Option<(u64, u64)>,
    /// Disabled (NVML errors, a critical XID) while an Overlimit hold of `hold_ms` had not run
    /// out: offline work is admitted again only once the metrics have stayed calm for that hold
    /// after Disabled's own cause is over, in this run or a restarted one (absent in files
    /// written before this field existed: false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hold_interrupted: bool,
    /// Wall-clock ms of this snapshot.
    pub updated_unix_ms: u64,
    /// Monotonic ms of this snapshot.
    pub updated_mono_ms: u64,
    /// Sampling interval, ms (the configured `interval_ms`).
    pub interval_ms: u64,
    /// The interval in force at this snapshot, ms: `interval_ms` while offline work is
    /// registered or the GPU is not Healthy, the longer `idle_interval_ms` otherwise (0 in
    /// files written before this field existed).
    #[serde(default)]
    pub sampling_ms: u64,
    /// The latest sample, if one succeeded.
    pub sample: Option<GpuSample>,
    /// Current Overlimit hold, ms.
    pub hold_ms: u64,
    /// What is left of the hold while Overlimit, ms.
    pub hold_remaining_ms: Option<u64>,
    /// Monotonic ms of Overlimit entries inside the window (restored after a restart).
    pub overlimit_entries_mono_ms: Vec<u64>,
    /// The last state change: from, to, and why.
    pub last_transition: Option<(HealthState, HealthState, String)>,
    /// Evictions started, by reason ([`crate::evictor::EvictReason::as_str`]).
    pub evictions: BTreeMap<String, u64>,
    /// Evictions that needed SIGKILL.
    pub kills: u64,
    /// Evictions waiting for their process to exit.
    pub evictions_in_flight: usize,
    /// Offline processes registered in the ledger.
    pub offline_registered: usize,
    /// Samples taken since start.
    pub samples: u64,
    /// Samples that failed since start.
    pub sample_errors: u64,
    /// Host MemAvailable as a percentage of MemTotal, when checked.
    pub host_mem_available_pct: Option<f64>,
    /// Host memory PSI `some avg10`, percent, when available.
    pub host_psi_some_avg10: Option<f64>,
    /// Config files in force, base first.
    pub config_files: Vec<String>,
    /// The last config reload error, kept until a reload succeeds.
    pub config_error: Option<String>,
    /// Successful reloads since start.
    pub config_reloads: u64,
    /// Sample number of the last Overlimit entry (SIGTERM latency in sampling intervals is
    /// `last_eviction_sample` minus this).
    #[serde(default)]
    pub overlimit_entry_sample: Option<u64>,
    /// Sample number of the last eviction started.
    #[serde(default)]
    pub last_eviction_sample: Option<u64>,
    /// Sampling intervals between the last Overlimit entry and the eviction it caused.
    #[serde(default)]
    pub overlimit_eviction_lag_samples: Option<u64>,
    /// The ledger's damage, found at start (moved aside and recreated) or while running (the
    /// header no longer validates; offline processes refuse new allocations).
    #[serde(default)]
    pub ledger_error: Option<String>,
    /// Why the monitor could not open its status file (`<ledger_dir>/status/gpu<N>`) at its
    /// last try: nothing it judges reaches the shims or node-agent meanwhile.
    #[serde(default)]
    pub status_file_error: Option<String>,
    /// The evictions in flight (`evictions_in_flight` of them), with when each was requested:
    /// a restarted monitor finishes their grace periods rather than starting them again
    /// (empty in files written before this field existed).
    #[serde(default)]
    pub evictions_pending: Vec<PendingEviction>,
    /// node-agent's list of offline pods as the monitor judges by it (`None`: no list read and
    /// none refused; absent in files written before this field existed).
    #[serde(default)]
    pub offline_pods: Option<OfflinePodsState>,
    /// Pod ledgers (`node_ledger::pods`) the monitor reads beside the GPU's own.
    #[serde(default)]
    pub pod_ledgers: usize,
    /// Pod ledgers the monitor refuses as they are now (damaged, another GPU's), by pod UID,
    /// with why: their processes are not read from them (their memory is still checked
    /// through NVML).
    #[serde(default)]
    pub pod_ledgers_refused: BTreeMap<String, String>,
}

/// The offline pod list in force ([`MonitorState::offline_pods`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfflinePodsState {
    /// The file read.
    pub path: String,
    /// Pods in the list in force (the last good one).
    pub pods: usize,
    /// Why the file's current content is not in force (damaged, removed), if it is not.
    pub error: Option<String>,
}

/// One eviction in flight, as the state file records it ([`MonitorState::evictions_pending`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingEviction {
    /// Pid of the process (in the pid namespace it registered from).
    pub pid: u32,
    /// Inode of the pid namespace it registered from: with `pid` and `start_time`, the process
    /// as its ledger slot names it. Two containers' processes can share a pid and a start time
    /// (pid 1 each, started in the same clock tick); readers match all three (absent in files
    /// written before this field existed: such an entry is matched only where its pid and start
    /// time name one registration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_ns: Option<u64>,
    /// Its start time (clock ticks since boot): with `pid`, the process.
    pub start_time: u64,
    /// Monotonic ms of the request (SIGTERM or ledger request): the grace runs from here.
    pub requested_mono_ms: u64,
    /// Monotonic ms at which the monitor sends SIGKILL if the process still runs (absent in
    /// files written before this field existed). mps-manager ends the process's MPS work
    /// with `terminate_client` before then: a SIGKILL with kernels in flight can make the MPS
    /// server tear down a neighbour (seen on an H200), `terminate_client` does not.
    #[serde(default)]
    pub kill_at_mono_ms: Option<u64>,
}

impl MonitorState {
    /// A state with every field set (GPU 0 Disabled by XID 79 after 10 samples, two
    /// evictions), for tests of the writers and readers (feature `test-support`).
    #[cfg(any(test, feature = "test-support"))]
    pub fn example() -> MonitorState {
        MonitorState {
            gpu: 0,
            monitor_pid: 1,
            boot_id: "b".into(),
            state: HealthState::Disabled,
            admits_offline: false,
            disabled_by: Some(DisableCause::Xid(79)),
            disabled_since_mono_ms: Some(4),
            xid_under_operator: None,
            hold_interrupted: false,
            updated_unix_ms: 1000,
            updated_mono_ms: 5,
            interval_ms: 10,
            sampling_ms: 10,
            sample: Some(GpuSample {
                gpu_util: 99.0,
                ..Default::default()
            }),
            hold_ms: 200,
            hold_remaining_ms: None,
            overlimit_entries_mono_ms: vec![1, 2],
            last_transition: Some((HealthState::Healthy, HealthState::Disabled, "xid 79".into())),
            evictions: [("disabled".to_string(), 2)].into_iter().collect(),
            kills: 0,
            evictions_in_flight: 0,
            offline_registered: 1,
            samples: 10,
            sample_errors: 0,
            host_mem_available_pct: Some(50.0),
            host_psi_some_avg10: None,
            config_files: vec!["/etc/x.json".into()],
            config_error: None,
            config_reloads: 0,
            overlimit_entry_sample: None,
            last_eviction_sample: None,
            overlimit_eviction_lag_samples: None,
            ledger_error: None,
            status_file_error: None,
            evictions_pending: Vec::new(),
            offline_pods: None,
            pod_ledgers: 0,
            pod_ledgers_refused: BTreeMap::new(),
        }
    }
}

/// Writes the state file (atomically). Only `sysmonitor run` calls it: one writer per GPU.
pub fn write(path: &Path, s: &MonitorState) -> std::io::Result<()> {
    crate::state_file::write_json(path, s)
}

/// Reads a state file; the error names the file and, for bad JSON, the line.
pub fn read(path: &Path) -> Result<MonitorState, String> {
    crate::state_file::read_json(path)
}

/// [`read()`] of GPU `gpu`'s state file: a file another GPU's monitor wrote (a `state_file`
/// path shared by two GPUs' configs) is an error naming both, never read as this GPU's.
pub fn read_for(path: &Path, gpu: u32) -> Result<MonitorState, String> {
    let s = read(path)?;
    if s.gpu != gpu {
        return Err(format!(
            "{}: the state of GPU {}'s monitor (pid {}), not GPU {gpu}'s: every GPU's monitor \
             needs its own state_file (put {{gpu}} in it)",
            path.display(),
            s.gpu,
            s.monitor_pid
        ));
    }
    Ok(s)
}

/// The critical XID GPU `gpu`'s state file reports, if the monitor currently holds the GPU
/// Disabled by one (a missing or unreadable file, or another GPU's, reports none).
pub fn disabling_xid(path: &Path, gpu: u32) -> Option<u64> {
    read_for(path, gpu).ok()?.disabling_xid()
}

impl MonitorState {
    /// The critical XID the GPU is Disabled by, if any.
    pub fn disabling_xid(&self) -> Option<u64> {
        match self.disabled_by? {
            DisableCause::Xid(c) => Some(c),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state file shared by two GPUs' monitors is read as neither's: the error names the
    /// GPU and pid that wrote it and the fix.
    #[test]
    fn another_gpus_state_file_is_an_error_naming_its_writer() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.json");
        write(&p, &MonitorState { gpu: 1, monitor_pid: 77, ..MonitorState::example() }).unwrap();
        assert_eq!(read_for(&p, 1).unwrap().gpu, 1);
        let e = read_for(&p, 0).unwrap_err();
        assert!(e.contains("GPU 1's monitor (pid 77), not GPU 0's") && e.contains("{gpu}"), "{e}");
    }

    fn state(disabled_by: Option<DisableCause>) -> MonitorState {
        MonitorState {
            disabled_by,
            ..MonitorState::example()
        }
    }

    #[test]
    fn round_trips_with_lowercase_state_and_reports_the_xid() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.json");
        let s = state(Some(DisableCause::Xid(79)));
        write(&p, &s).unwrap();
        assert_eq!(read(&p).unwrap(), s);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        // What cluster-matcher's reader (plan::health::StateFile) takes from the file.
        assert_eq!(v["state"], "disabled", "readers match the lowercase name");
        assert_eq!(v["updated_unix_ms"], 1000);
        assert_eq!(v["gpu"], 0);
        assert_eq!(v["admits_offline"], false);
        assert_eq!(disabling_xid(&p, 0), Some(79));
        assert_eq!(disabling_xid(&p, 1), None, "GPU 0's file says nothing of GPU 1");
        write(&p, &state(Some(DisableCause::Operator))).unwrap();
        assert_eq!(disabling_xid(&p, 0), None);
        assert_eq!(disabling_xid(&d.path().join("missing"), 0), None);
    }
}
