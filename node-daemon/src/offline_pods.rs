//! The offline pods on this node, as node-agent lists them for the monitors
//! (`<ledger_dir>/offline-pods.json`; node-agent is its only writer).
//!
//! A monitor sees GPU processes (NVML) and the ledger's registrations, but not which pod a
//! process belongs to nor which pods are offline work: a container whose GPU work all runs
//! without the shim registers nothing and would be judged as online load. node-agent knows the
//! pods bound to this node that ask for the offline resource; it writes their UIDs here, and the
//! monitor takes any unregistered GPU process whose cgroup names one of them
//! ([`pod_uid_from_cgroup`]) for offline work without the shim. Each pod carries the GPU memory
//! its plan gives it (`memory_quota_bytes`, the `xshare.io/memory-quota-bytes` annotation the
//! shim's quota comes from at Allocate): the monitor holds the pod's processes on its GPU to it
//! as NVML measures them, whatever quota their environment or their ledger group claims.
//!
//! ```json
//! { "xshare_offline_pods": 2, "node": "gpu-node-7", "unix_ms": 1763890000000,
//!   "pods": [ { "uid": "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b", "namespace": "train", "name": "job-0",
//!               "memory_quota_bytes": 6442450944 } ] }
//! ```
//!
//! The file lies beside the `gpu<N>` directories, outside what an offline container mounts. It
//! is written whole (temp file and rename). A reader refuses a damaged file, an unknown version,
//! a malformed UID or one over [`MAX_BYTES`] with an error naming the file, and keeps the last
//! good list ([`Watch`]): a damaged file never frees a pod from the check.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file's name in the ledger directory.
pub const FILE_NAME: &str = "offline-pods.json";
/// The format written here (`xshare_offline_pods`; 2: a pod's `memory_quota_bytes`). Version 1
/// files (no plans) are read too.
pub const VERSION: u32 = 2;
/// Largest file read (a node holds at most a few hundred pods; 110 by default).
pub const MAX_BYTES: u64 = 4 << 20;

/// `<ledger_dir>/offline-pods.json`.
pub fn path(ledger_dir: &Path) -> PathBuf {
    ledger_dir.join(FILE_NAME)
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfflinePods {
    /// [`VERSION`].
    pub xshare_offline_pods: u32,
    /// The node the pods are bound to.
    pub node: String,
    /// When node-agent read the pod list, ms since the epoch.
    pub unix_ms: u64,
    /// The pods that ask for the offline resource and have not finished.
    pub pods: Vec<OfflinePod>,
}

/// One offline pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfflinePod {
    /// `metadata.uid`, as the pod's cgroup path carries it.
    pub uid: String,
    /// `metadata.namespace` (for people reading the file and the logs).
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// GPU memory the pod's plan gives it on a GPU (`xshare.io/memory-quota-bytes`); `None`:
    /// not planned (not placed by the extender, or a version 1 file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_quota_bytes: Option<u64>,
}

impl OfflinePods {
    /// The list for `node`, read at `unix_ms`, sorted by UID (so an unchanged list writes the
    /// same bytes).
    pub fn new(node: &str, unix_ms: u64, mut pods: Vec<OfflinePod>) -> Self {
        pods.sort();
        pods.dedup();
        OfflinePods {
            xshare_offline_pods: VERSION,
            node: node.to_string(),
            unix_ms,
            pods,
        }
    }

    /// The pods' UIDs, lower-case (as [`pod_uid_from_cgroup`] gives them).
    pub fn uids(&self) -> BTreeSet<String> {
        self.pods.iter().map(|p| p.uid.to_ascii_lowercase()).collect()
    }

    fn check(&self) -> Result<(), String> {
        if !(1..=VERSION).contains(&self.xshare_offline_pods) {
            return Err(format!(
                "format version {} (this build reads 1 to {VERSION})",
                self.xshare_offline_pods
            ));
        }
        match self.pods.iter().find(|p| !is_pod_uid(&p.uid)) {
            Some(p) => Err(format!(
                "pod {}/{} has UID {:?}, which is not a pod UID",
                p.namespace, p.name, p.uid
            )),
            None => Ok(()),
        }
    }
}

/// Writes `pods` to `path` whole (temp file and rename), readable by all (0644).
pub fn write(path: &Path, pods: &OfflinePods) -> std::io::Result<()> {
    let mut v = serde_json::to_vec(pods).map_err(std::io::Error::other)?;
    v.push(b'\n');
    crate::state_file::write_atomic_mode(path, &v, 0o644)
}

/// The list at `path`: `Ok(None)` when there is no file (no node-agent has written one), an
/// error naming the file when it is damaged, of another version, holds a malformed UID or is
/// over [`MAX_BYTES`].
pub fn read(path: &Path) -> Result<Option<OfflinePods>, String> {
    use std::io::Read as _;
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut text = Vec::new();
    f.take(MAX_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if text.len() as u64 > MAX_BYTES {
        return Err(format!("{}: larger than {MAX_BYTES} bytes", path.display()));
    }
    let pods: OfflinePods = serde_json::from_slice(&text)
        .map_err(|e| format!("{}:{}: {e}", path.display(), e.line()))?;
    pods.check().map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Some(pods))
}

/// Whether `s` is written as a pod UID (`8-4-4-4-12` hex digits, not the nil UID):
/// [`node_ledger::PodUid::parse`].
pub fn is_pod_uid(s: &str) -> bool {
    node_ledger::PodUid::parse(s).is_some()
}

/// Pod UID from a `/proc/<pid>/cgroup` text: the kubelet's cgroupfs driver
/// (`/kubepods/burstable/pod<uid>/<container>`) and systemd driver
/// (`kubepods-burstable-pod<uid_with_underscores>.slice`), cgroup v1 and v2 lines alike.
pub fn pod_uid_from_cgroup(text: &str) -> Option<String> {
    for line in text.lines() {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        for comp in path.split('/') {
            let Some(i) = comp.rfind("pod") else { continue };
            let uid = comp[i + 3..].trim_end_matches(".slice").replace('_', "-");
            if is_pod_uid(&uid) {
                return Some(uid.to_ascii_lowercase());
            }
        }
    }
    None
}

/// The pod UID in the cgroup path of the process that is `pid` in this pid namespace (`None`:
/// gone, unreadable, or in no pod's cgroup).
pub fn pod_uid_of(pid: u32) -> Option<String> {
    pod_uid_from_cgroup(&std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?)
}

/// The pod in the cgroup path of the process that is `host_pid` here and started at
/// `start_time` (clock ticks), for an eviction request: `None` when it is gone, its pid now
/// names another process (checked after the read, so a pid reused meanwhile is not taken for
/// it), or it is in no pod's cgroup.
pub fn pod_of_live(host_pid: u32, start_time: u64) -> Option<node_ledger::PodUid> {
    let uid = pod_uid_of(host_pid)?;
    if !node_ledger::procinfo::is_alive(host_pid, start_time) {
        return None;
    }
    node_ledger::PodUid::parse(&uid)
}

/// What the kubelet's cgroup tree says of a pod's processes ([`pod_cgroup`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodCgroup {
    /// The pod's cgroup holds a process (cgroup v2 `cgroup.events`: `populated 1`).
    Populated,
    /// The pod's cgroup is there and holds no process, in it or below (`populated 0`).
    Empty,
    /// The kubelet's pod tree is there, the pod's cgroup is not: the kubelet removed it after
    /// its processes ended, or made it elsewhere (a layout not read here).
    Absent,
    /// No kubelet pod tree under the root (a container's own cgroup namespace, cgroup v1, a
    /// kubelet `--cgroup-root` of its own, no QoS cgroups), or the pod's cgroup cannot be read.
    Unknown,
}

/// Whether pod `uid` has a process left, as its cgroup under `root` (the host's cgroup v2
/// mount, `/sys/fs/cgroup`) says: the kubelet's pod cgroup of either driver and any QoS
/// class, as [`pod_uid_from_cgroup`] reads them (systemd:
/// `kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_with_underscores>.slice`, and
/// `kubepods.slice/kubepods-pod<..>.slice` for Guaranteed; cgroupfs:
/// `kubepods/<qos>/pod<uid>`, `kubepods/pod<uid>`). A few `stat`s and one small read.
pub fn pod_cgroup(root: &Path, uid: node_ledger::PodUid) -> PodCgroup {
    let dashed = uid.to_string();
    let under = dashed.replace('-', "_");
    let systemd = root.join("kubepods.slice");
    let cgroupfs = root.join("kubepods");
    let mut candidates = Vec::new();
    if systemd.is_dir() {
        candidates.push(systemd.join(format!("kubepods-pod{under}.slice")));
        for qos in ["burstable", "besteffort"] {
            candidates.push(systemd.join(format!("kubepods-{qos}.slice")).join(format!("kubepods-{qos}-pod{under}.slice")));
        }
    }
    if cgroupfs.is_dir() {
        candidates.push(cgroupfs.join(format!("pod{dashed}")));
        for qos in ["burstable", "besteffort"] {
            candidates.push(cgroupfs.join(qos).join(format!("pod{dashed}")));
        }
    }
    if candidates.is_empty() {
        return PodCgroup::Unknown;
    }
    let Some(dir) = candidates.into_iter().find(|d| d.is_dir()) else { return PodCgroup::Absent };
    let Ok(events) = std::fs::read_to_string(dir.join("cgroup.events")) else { return PodCgroup::Unknown };
    match events.lines().find_map(|l| l.strip_prefix("populated ")).map(str::trim) {
        Some("0") => PodCgroup::Empty,
        Some("1") => PodCgroup::Populated,
        _ => PodCgroup::Unknown,
    }
}

/// What [`Watch::refresh`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A new list is in force.
    Read {
        /// Pods in it.
        pods: usize,
    },
    /// The file went away: the last good list stays in force.
    Gone,
    /// The file cannot be used: the last good list stays in force.
    Refused(String),
}

/// A reader that re-reads the file only when it changed (device, inode, size, mtime), and keeps
/// the last good list when the file is damaged or removed.
#[derive(Debug)]
pub struct Watch {
    path: PathBuf,
    seen: Option<(u64, u64, u64, i64, i64)>,
    uids: BTreeSet<String>,
    pods: Vec<OfflinePod>,
    read_once: bool,
    error: Option<String>,
}

impl Watch {
    /// A watch of `path`; nothing read yet.
    pub fn new(path: PathBuf) -> Self {
        Watch {
            path,
            seen: None,
            uids: BTreeSet::new(),
            pods: Vec::new(),
            read_once: false,
            error: None,
        }
    }

    /// The file watched.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The UIDs of the list in force (empty until a list was read).
    pub fn uids(&self) -> &BTreeSet<String> {
        &self.uids
    }

    /// The pod of UID `uid` in the list in force.
    pub fn pod(&self, uid: &str) -> Option<&OfflinePod> {
        self.pods.iter().find(|p| p.uid.eq_ignore_ascii_case(uid))
    }

    /// The GPU memory the plan of pod `uid` gives it, in the list in force.
    pub fn plan(&self, uid: &str) -> Option<u64> {
        self.pod(uid)?.memory_quota_bytes
    }

    /// Whether any pod of the list in force has a plan (else no process needs its pod read for
    /// the plan check).
    pub fn any_plan(&self) -> bool {
        self.pods.iter().any(|p| p.memory_quota_bytes.is_some())
    }

    /// Why the file's current content is not in force (refused, removed), if it is not.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Whether a list was ever read.
    pub fn has_list(&self) -> bool {
        self.read_once
    }

    /// One `stat` of the file; reads it when it changed. `None`: nothing changed.
    pub fn refresh(&mut self) -> Option<Change> {
        let key = match std::fs::metadata(&self.path) {
            Ok(m) => Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                let key = Some((0, 0, 0, 0, i64::from(e.raw_os_error().unwrap_or(-1))));
                if key == self.seen {
                    return None;
                }
                self.seen = key;
                let e = format!("{}: {e}", self.path.display());
                self.error = Some(e.clone());
                return Some(Change::Refused(e));
            }
        };
        if key == self.seen {
            return None;
        }
        self.seen = key;
        if key.is_none() {
            return self.gone();
        }
        match read(&self.path) {
            Ok(Some(p)) => {
                self.uids = p.uids();
                self.pods = p.pods;
                self.read_once = true;
                self.error = None;
                Some(Change::Read { pods: self.uids.len() })
            }
            // Removed between the stat and the read.
            Ok(None) => {
                self.seen = None;
                self.gone()
            }
            Err(e) => {
                self.error = Some(e.clone());
                Some(Change::Refused(e))
            }
        }
    }

    fn gone(&mut self) -> Option<Change> {
        if !self.read_once {
            self.error = None;
            return None;
        }
        self.error = Some(format!("{}: removed", self.path.display()));
        Some(Change::Gone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b";
    const B: &str = "11111111-2222-3333-4444-555555555555";

    fn pod(uid: &str) -> OfflinePod {
        OfflinePod {
            memory_quota_bytes: None,
            uid: uid.into(),
            namespace: "train".into(),
            name: format!("job-{}", &uid[..4]),
        }
    }

    #[test]
    fn cgroup_paths_of_both_drivers_and_both_cgroup_versions() {
        let sd = "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice/cri-containerd-abc.scope\n";
        assert_eq!(pod_uid_from_cgroup(sd).as_deref(), Some(A));
        let fs = "12:memory:/kubepods/burstable/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/0123abcd\n";
        assert_eq!(pod_uid_from_cgroup(fs).as_deref(), Some(A));
        let guaranteed = "0::/kubepods/pod0F1E2D3C-4B5A-6978-8A9B-0C1D2E3F4A5B/ctr\n";
        assert_eq!(pod_uid_from_cgroup(guaranteed).as_deref(), Some(A));
        assert_eq!(pod_uid_from_cgroup("0::/user.slice/user-1000.slice/session-2.scope\n"), None);
        assert_eq!(pod_uid_from_cgroup("0::/kubepods/podnotauid/x\n"), None);
        assert_eq!(pod_uid_from_cgroup("0::/kubepods/pod0f1e2d3c4b5a69788a9b0c1d2e3f4a5b0000/x\n"), None);
        assert_eq!(pod_uid_from_cgroup(""), None);
    }

    /// A pod's cgroup of either driver and any QoS class is found and its `populated` read;
    /// a tree without the kubelet's pods (a container's own cgroup namespace) says nothing,
    /// one with them but not the pod's says it is absent; no `cgroup.events` (v1): unknown.
    #[test]
    fn a_pods_cgroup_of_either_driver_says_whether_a_process_is_left() {
        let uid = node_ledger::PodUid::parse(A).unwrap();
        let d = tempfile::tempdir().unwrap();
        assert_eq!(pod_cgroup(d.path(), uid), PodCgroup::Unknown, "no kubelet pod tree here");
        let events = |dir: &Path, populated: &str| {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join("cgroup.events"), format!("populated {populated}\nfrozen 0\n")).unwrap();
        };
        let sd = d.path().join("kubepods.slice");
        std::fs::create_dir_all(sd.join("kubepods-burstable.slice")).unwrap();
        assert_eq!(pod_cgroup(d.path(), uid), PodCgroup::Absent);
        let pod = sd.join("kubepods-besteffort.slice/kubepods-besteffort-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice");
        events(&pod, "1");
        assert_eq!(pod_cgroup(d.path(), uid), PodCgroup::Populated);
        events(&pod, "0");
        assert_eq!(pod_cgroup(d.path(), uid), PodCgroup::Empty);
        std::fs::remove_file(pod.join("cgroup.events")).unwrap();
        assert_eq!(pod_cgroup(d.path(), uid), PodCgroup::Unknown, "cgroup v1: no populated file");
        let other = node_ledger::PodUid::parse(B).unwrap();
        assert_eq!(pod_cgroup(d.path(), other), PodCgroup::Absent);
        let d = tempfile::tempdir().unwrap();
        events(&d.path().join(format!("kubepods/pod{A}")), "1");
        assert_eq!(pod_cgroup(d.path(), uid), PodCgroup::Populated, "cgroupfs, Guaranteed");
        events(&d.path().join(format!("kubepods/burstable/pod{B}")), "0");
        assert_eq!(pod_cgroup(d.path(), other), PodCgroup::Empty, "cgroupfs, Burstable");
    }

    #[test]
    fn written_lists_read_back_and_sort_the_same() {
        let d = tempfile::tempdir().unwrap();
        let p = path(d.path());
        let a = OfflinePods::new("n", 5, vec![pod(B), pod(A), pod(A)]);
        write(&p, &a).unwrap();
        let back = read(&p).unwrap().unwrap();
        assert_eq!(back, a);
        assert_eq!(back.pods.len(), 2);
        assert_eq!(back.uids().into_iter().collect::<Vec<_>>(), vec![A.to_string(), B.to_string()]);
        let upper = OfflinePods::new("n", 5, vec![pod(&A.to_ascii_uppercase())]);
        assert!(upper.uids().contains(A), "compared as the cgroup path gives it");
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o644);
        assert_eq!(read(&d.path().join("none")).unwrap(), None);
    }

    /// A pod's planned memory travels with it; a version 1 file (written before plans) reads
    /// with none.
    #[test]
    fn plans_round_trip_and_version_1_files_read_without_them() {
        let d = tempfile::tempdir().unwrap();
        let p = path(d.path());
        let planned = OfflinePod { memory_quota_bytes: Some(6 << 30), ..pod(A) };
        let list = OfflinePods::new("n", 1, vec![planned.clone(), pod(B)]);
        write(&p, &list).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains("\"memory_quota_bytes\":6442450944") && text.matches("memory_quota_bytes").count() == 1, "{text}");
        assert_eq!(read(&p).unwrap().unwrap().pods, vec![planned, pod(B)]);
        let v1 = format!(r#"{{"xshare_offline_pods":1,"node":"n","unix_ms":1,"pods":[{{"uid":"{A}","namespace":"t","name":"j"}}]}}"#);
        std::fs::write(&p, v1).unwrap();
        assert_eq!(read(&p).unwrap().unwrap().pods[0].memory_quota_bytes, None);
    }

    #[test]
    fn damaged_other_version_bad_uid_and_oversized_files_are_refused_naming_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = path(d.path());
        let good = serde_json::to_string(&OfflinePods::new("n", 1, vec![pod(A)])).unwrap();
        let cases = [
            ("{".to_string(), "EOF"),
            (good.replace("\"xshare_offline_pods\":2", "\"xshare_offline_pods\":3"), "version 3"),
            (good.replace("\"xshare_offline_pods\":2", "\"xshare_offline_pods\":0"), "version 0"),
            (good.replace(A, "../../etc"), "not a pod UID"),
            (good.replace("\"pods\"", "\"extra\":1,\"pods\""), "unknown field"),
            (" ".repeat(MAX_BYTES as usize + 1), "larger than"),
        ];
        for (text, want) in cases {
            std::fs::write(&p, text).unwrap();
            let e = read(&p).unwrap_err();
            assert!(e.contains(FILE_NAME) && e.contains(want), "{e} (wanted {want})");
        }
    }

    /// The watch re-reads a changed file only, and keeps the last good list in force when the
    /// file is damaged or removed: a damaged list never frees a pod from the check.
    #[test]
    fn the_watch_keeps_the_last_good_list_through_damage_and_removal() {
        let d = tempfile::tempdir().unwrap();
        let p = path(d.path());
        let mut w = Watch::new(p.clone());
        assert_eq!(w.refresh(), None, "no file, nothing read: nothing to say");
        assert!(!w.has_list());
        write(&p, &OfflinePods::new("n", 1, vec![pod(A)])).unwrap();
        assert_eq!(w.refresh(), Some(Change::Read { pods: 1 }));
        assert_eq!(w.pod(A).map(|p| p.namespace.as_str()), Some("train"));
        assert_eq!(w.refresh(), None, "unchanged: not read again");
        std::fs::write(&p, "{ damaged").unwrap();
        assert!(matches!(w.refresh(), Some(Change::Refused(e)) if e.contains(FILE_NAME)));
        assert!(w.uids().contains(A), "the last good list stays in force");
        assert!(w.error().is_some_and(|e| e.contains(FILE_NAME)));
        std::fs::remove_file(&p).unwrap();
        assert_eq!(w.refresh(), Some(Change::Gone));
        assert!(w.uids().contains(A));
        assert!(w.error().is_some_and(|e| e.ends_with("removed")));
        write(&p, &OfflinePods::new("n", 2, vec![pod(B)])).unwrap();
        assert_eq!(w.refresh(), Some(Change::Read { pods: 1 }));
        assert_eq!(w.error(), None);
        assert_eq!(w.uids().iter().collect::<Vec<_>>(), vec![B]);
        write(&p, &OfflinePods::new("n", 3, vec![])).unwrap();
        assert_eq!(w.refresh(), Some(Change::Read { pods: 0 }));
        assert!(w.uids().is_empty(), "an empty list read whole is in force");
    }
}

