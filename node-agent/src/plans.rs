//! The plan each offline pod was given, frozen per pod UID: what Allocate injects
//! (`XCUDA_QUOTA_BYTES`, `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, the GPU) and what the offline pod
//! list (`crate::offline_pods`) publishes for the monitors to enforce through NVML.
//!
//! The plan's annotations (`xshare.io/gpu`, `xshare.io/sm-percent`,
//! `xshare.io/memory-quota-bytes`) are the extender's, written before it binds the pod; but a
//! tenant allowed to patch its own pods (Kubernetes' built-in `edit` and `admin` roles are)
//! can rewrite them at any time, and the monitor must not hold a pod to a plan the pod chose.
//! So the first plan this agent sees for a pod is frozen: at the pod's Allocate, or earlier at
//! the first watch event that shows the pod bound here (the extender writes the plan before it
//! binds, so that is the extender's plan). Later annotation values are never followed: each
//! change is logged (WARN, naming the pod, the field, the frozen and the new value) and counted
//! (`xshare_node_agent_plan_annotation_changes_ignored_total`).
//!
//! Each frozen plan is a root-owned file `<ledger_dir>/node-agent/plans/<uid>.json` (mode
//! `0600`, directory `0700`): never mounted into a container (the MPS pipe and `/dev/shm`
//! directories may not lie there, `crate::config`), and read back by a restarted agent. A pod
//! with no record (allocated before an agent that kept none, or its record lost with `/run` at
//! a reboot) gets the plan its annotations give at this agent's first sight of it, frozen
//! then: never looser than that, and with the admission policy of `deploy/admission-policy.yaml`
//! installed, the extender's. A record is created once (a second writer finds it and takes
//! it), and removed [`crate::offline_pods::POD_LEDGER_GRACE`] after its pod left the node.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::allocate::{self, AllocError, PodPlan, ANN_GPU, ANN_MEMORY_QUOTA_BYTES, ANN_SM_PERCENT};

/// Directory of the frozen plans, under `ledger_dir`.
pub const PLANS_DIR: &str = "node-agent/plans";

/// Where the frozen plans of an agent with ledger directory `ledger_dir` lie.
pub fn plans_dir(ledger_dir: &Path) -> PathBuf {
    ledger_dir.join(PLANS_DIR)
}

/// Where a plan was frozen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// At the pod's first Allocate.
    Allocate,
    /// At the first watch event that showed the pod on this node (before its Allocate, or a
    /// pod allocated before this agent kept a record of it).
    Watch,
}

/// One pod's frozen plan (the file's JSON). A part the annotations lacked or gave malformed
/// when it was frozen is `None`, and stays so. Fields this version does not know (a later
/// node-agent's, such as `kill_grace_ms` was to an earlier one) are ignored, not taken for
/// damage: a rolled-back agent keeps the pod's frozen plan instead of freezing again from the
/// annotations as they are now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrozenPlan {
    /// The pod's UID.
    pub uid: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// `xshare.io/gpu`.
    pub gpu: Option<u32>,
    /// `xshare.io/sm-percent`, as the MPS active-thread percentage.
    pub mps_percent: Option<u32>,
    /// `xshare.io/memory-quota-bytes`.
    pub memory_quota_bytes: Option<u64>,
    /// The kubelet's SIGTERM-to-SIGKILL wait for the pod, ms ([`allocate::kill_grace_ms`];
    /// absent from plans frozen before it was recorded).
    #[serde(default)]
    pub kill_grace_ms: Option<u64>,
    /// Where it was frozen.
    pub source: Source,
    /// When, Unix ms.
    pub unix_ms: u64,
}

impl FrozenPlan {
    /// The plan `pod`'s annotations give now (each part read alone, trimmed).
    pub fn from_annotations(pod: &Pod, source: Source) -> Self {
        let ann = |k| allocate::annotation(pod, k);
        FrozenPlan {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            gpu: ann(ANN_GPU).and_then(allocate::parse_gpu),
            mps_percent: ann(ANN_SM_PERCENT).and_then(allocate::parse_sm_percent),
            memory_quota_bytes: ann(ANN_MEMORY_QUOTA_BYTES).and_then(allocate::parse_memory_quota),
            kill_grace_ms: Some(allocate::kill_grace_ms(pod)),
            source,
            unix_ms: node_daemon::clock::unix_ms(),
        }
    }

    /// A plan Allocate read whole.
    pub fn from_plan(plan: &PodPlan) -> Self {
        FrozenPlan {
            uid: plan.uid.clone(),
            namespace: plan.namespace.clone(),
            name: plan.name.clone(),
            gpu: Some(plan.gpu),
            mps_percent: Some(plan.mps_percent),
            memory_quota_bytes: Some(plan.memory_quota_bytes),
            kill_grace_ms: plan.kill_grace_ms,
            source: Source::Allocate,
            unix_ms: node_daemon::clock::unix_ms(),
        }
    }

    /// The plan Allocate gives, if every part was there; else which one was not.
    pub fn plan(&self) -> Result<PodPlan, String> {
        let missing = |k: &str| format!("no valid `{k}`");
        Ok(PodPlan {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            gpu: self.gpu.ok_or_else(|| missing(ANN_GPU))?,
            mps_percent: self.mps_percent.ok_or_else(|| missing(ANN_SM_PERCENT))?,
            memory_quota_bytes: self.memory_quota_bytes.ok_or_else(|| missing(ANN_MEMORY_QUOTA_BYTES))?,
            kill_grace_ms: self.kill_grace_ms,
        })
    }
}

/// The frozen plans of this node's pods: in memory, and one file each (see the module docs).
/// Shared by Allocate and the offline pod list; two stores over the same directory agree (a
/// miss in memory reads the file).
#[derive(Debug)]
pub struct PlanStore {
    dir: PathBuf,
    plans: Mutex<BTreeMap<String, FrozenPlan>>,
    /// The last differing annotation value reported per pod and field (one WARN per value).
    reported: Mutex<HashMap<(String, &'static str), Option<String>>>,
    ignored: AtomicU64,
    write_errors: AtomicU64,
}

impl PlanStore {
    /// The store of the agent whose ledger directory is `ledger_dir` (nothing is read yet).
    pub fn open(ledger_dir: &Path) -> Self {
        PlanStore {
            dir: plans_dir(ledger_dir),
            plans: Mutex::new(BTreeMap::new()),
            reported: Mutex::new(HashMap::new()),
            ignored: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
        }
    }

    /// The directory of the records.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Later annotation changes seen and not followed.
    pub fn ignored_changes(&self) -> u64 {
        self.ignored.load(Ordering::Relaxed)
    }

    /// The file of pod `uid`'s record; `None` for a UID that is not one (kept in memory only).
    fn file(&self, uid: &str) -> Option<PathBuf> {
        node_ledger::PodUid::parse(uid).map(|u| self.dir.join(format!("{u}.json")))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, FrozenPlan>> {
        // A poisoned lock (a panic elsewhere) stops nothing here: the state is plain data.
        self.plans.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Pod `uid`'s frozen plan, from memory or its file (a damaged file reads as none, logged).
    pub fn get(&self, uid: &str) -> Option<FrozenPlan> {
        let mut plans = self.lock();
        self.get_locked(&mut plans, uid)
    }

    fn get_locked(&self, plans: &mut BTreeMap<String, FrozenPlan>, uid: &str) -> Option<FrozenPlan> {
        if let Some(p) = plans.get(uid) {
            return Some(p.clone());
        }
        let file = self.file(uid)?;
        let text = std::fs::read_to_string(&file).ok()?;
        match serde_json::from_str::<FrozenPlan>(&text) {
            Ok(p) if node_ledger::PodUid::parse(&p.uid) == node_ledger::PodUid::parse(uid) => {
                plans.insert(p.uid.clone(), p.clone());
                Some(p)
            }
            Ok(p) => {
                tracing::error!(file = %file.display(), uid = %p.uid, "frozen plan file names another pod: ignored");
                None
            }
            Err(e) => {
                tracing::error!(file = %file.display(), error = %e, "damaged frozen plan file: ignored");
                None
            }
        }
    }

    /// Freezes `plan` unless its pod has one already; returns the pod's frozen plan and, when
    /// its file could not be written, why (the plan is kept in memory anyway).
    pub fn freeze(&self, plan: FrozenPlan) -> (FrozenPlan, Option<String>) {
        let mut plans = self.lock();
        if let Some(p) = self.get_locked(&mut plans, &plan.uid) {
            return (p, None);
        }
        let (plan, err) = match self.file(&plan.uid).map(|f| self.write_new(&f, &plan)) {
            // Another store froze the pod first: its plan.
            Some(Ok(Some(theirs))) => (theirs, None),
            Some(Err(e)) => (plan, Some(e)),
            Some(Ok(None)) | None => (plan, None),
        };
        if let Some(e) = &err {
            self.write_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(pod = %format!("{}/{}", plan.namespace, plan.name), dir = %self.dir.display(), error = %e,
                "cannot record the pod's frozen plan: kept in memory only");
        } else {
            tracing::info!(pod = %format!("{}/{}", plan.namespace, plan.name), uid = %plan.uid, source = ?plan.source,
                gpu = ?plan.gpu, mps_percent = ?plan.mps_percent, quota = ?plan.memory_quota_bytes, "plan frozen");
        }
        plans.insert(plan.uid.clone(), plan.clone());
        (plan, err)
    }

    /// Writes `plan` as `file`, root-only, unless a valid record is there already: then that
    /// record (`Some`).
    fn write_new(&self, file: &Path, plan: &FrozenPlan) -> Result<Option<FrozenPlan>, String> {
        let ctx = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
        std::fs::create_dir_all(&self.dir).map_err(|e| ctx("creating", &self.dir, e))?;
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| ctx("chmod", &self.dir, e))?;
        let tmp = file.with_extension(format!("tmp.{}", std::process::id()));
        let bytes = serde_json::to_vec(plan).map_err(|e| e.to_string())?;
        let written = (|| {
            let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(ctx("writing", &tmp, e));
        }
        // A link fails where a record is: never over a valid one (another store froze the pod
        // first); over a damaged one.
        let r = match std::fs::hard_link(&tmp, file) {
            Ok(()) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let theirs = std::fs::read_to_string(file).ok().and_then(|t| serde_json::from_str::<FrozenPlan>(&t).ok());
                match theirs {
                    Some(p) if p.uid == plan.uid => Ok(Some(p)),
                    _ => std::fs::rename(&tmp, file).map(|()| None).map_err(|e| ctx("renaming into", file, e)),
                }
            }
            Err(e) => Err(ctx("linking", file, e)),
        };
        let _ = std::fs::remove_file(&tmp);
        r
    }

    /// Pod `pod`'s plan for its container's Allocate: the frozen one when there is one (later
    /// annotation changes noted, not followed; refused when it is incomplete), else its
    /// annotations' (each must be there and well formed), frozen now. A plan that cannot be
    /// recorded is refused.
    pub fn for_allocate(&self, pod: &Pod) -> Result<PodPlan, AllocError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let frozen = match self.get(&uid) {
            Some(f) => f,
            None => {
                let plan = allocate::pod_plan(pod)?;
                let (f, err) = self.freeze(FrozenPlan::from_plan(&plan));
                if let Some(why) = err {
                    self.lock().remove(&uid);
                    return Err(AllocError::PlanRecord { ns: plan.namespace, name: plan.name, why });
                }
                f
            }
        };
        self.note_changes(pod, &frozen);
        frozen.plan().map_err(|why| AllocError::Unplanned { ns: frozen.namespace.clone(), name: frozen.name.clone(), why })
    }

    /// Pod `pod`'s plan memory for the offline pod list: the frozen plan's, else its
    /// annotation's as read now, frozen now (first sight).
    pub fn memory_quota_bytes(&self, pod: &Pod) -> Option<u64> {
        let uid = pod.metadata.uid.as_deref()?;
        let frozen = match self.get(uid) {
            Some(f) => f,
            None => self.freeze(FrozenPlan::from_annotations(pod, Source::Watch)).0,
        };
        self.note_changes(pod, &frozen);
        frozen.memory_quota_bytes
    }

    /// Logs (WARN, once per value) and counts each plan annotation of `pod` that differs from
    /// its frozen plan.
    fn note_changes(&self, pod: &Pod, frozen: &FrozenPlan) {
        let now = FrozenPlan::from_annotations(pod, frozen.source);
        let fields: [(&'static str, Option<String>, Option<String>); 3] = [
            (ANN_GPU, frozen.gpu.map(|v| v.to_string()), now.gpu.map(|v| v.to_string())),
            (ANN_SM_PERCENT, frozen.mps_percent.map(|v| v.to_string()), now.mps_percent.map(|v| v.to_string())),
            (ANN_MEMORY_QUOTA_BYTES, frozen.memory_quota_bytes.map(|v| v.to_string()), now.memory_quota_bytes.map(|v| v.to_string())),
        ];
        let mut reported = self.reported.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (field, was, is) in fields {
            let key = (frozen.uid.clone(), field);
            if was == is {
                reported.remove(&key);
                continue;
            }
            let raw = allocate::annotation(pod, field).map(str::to_string);
            if reported.get(&key) == Some(&raw) {
                continue;
            }
            self.ignored.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(pod = %format!("{}/{}", frozen.namespace, frozen.name), uid = %frozen.uid, field,
                frozen = ?was, annotation = ?raw,
                "a plan annotation changed after the pod's plan was frozen: not followed (only the extender's ServiceAccount should write it: deploy/admission-policy.yaml)");
            reported.insert(key, raw);
        }
    }

    /// Removes the records of pods for which `keep` is false, once older than `grace` (a pod
    /// may be allocated before the watch has seen it bound here); returns how many.
    pub fn forget_gone(&self, keep: &dyn Fn(&str) -> bool, grace: Duration) -> usize {
        let now = node_daemon::clock::unix_ms();
        let old = |p: &FrozenPlan| now.saturating_sub(p.unix_ms) >= grace.as_millis() as u64;
        let mut plans = self.lock();
        // Every record on disk too (another store's, or one from before a restart).
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let name = e.file_name();
                let Some(uid) = name.to_str().and_then(|n| n.strip_suffix(".json")) else { continue };
                if !keep(uid) {
                    self.get_locked(&mut plans, uid);
                }
            }
        }
        let gone: Vec<String> = plans.values().filter(|p| !keep(&p.uid) && old(p)).map(|p| p.uid.clone()).collect();
        for uid in &gone {
            plans.remove(uid);
            if let Some(f) = self.file(uid) {
                match std::fs::remove_file(&f) {
                    Ok(()) => tracing::debug!(uid = %uid, file = %f.display(), "frozen plan of a pod gone from this node removed"),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => tracing::warn!(uid = %uid, file = %f.display(), error = %e, "cannot remove a gone pod's frozen plan"),
                }
            }
        }
        let mut reported = self.reported.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        reported.retain(|(u, _), _| !gone.contains(u));
        gone.len()
    }

    /// Prometheus text: annotation changes not followed, records that could not be written.
    pub fn metrics(&self, node: &str) -> String {
        format!(
            "# HELP xshare_node_agent_plan_annotation_changes_ignored_total Plan annotations of a pod changed after its plan was frozen (not followed: alert on it)\n\
             # TYPE xshare_node_agent_plan_annotation_changes_ignored_total counter\n\
             xshare_node_agent_plan_annotation_changes_ignored_total{{node=\"{node}\"}} {}\n\
             # HELP xshare_node_agent_plan_record_errors_total Frozen plans that could not be written to their file\n\
             # TYPE xshare_node_agent_plan_record_errors_total counter\n\
             xshare_node_agent_plan_record_errors_total{{node=\"{node}\"}} {}\n",
            self.ignored.load(Ordering::Relaxed),
            self.write_errors.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f1e2d3c-4b5a-4978-8a9b-0c1d2e3f4a5b";

    fn pod(ann: &[(&str, &str)]) -> Pod {
        let ann: serde_json::Map<String, serde_json::Value> = ann.iter().map(|(k, v)| (k.to_string(), (*v).into())).collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "train", "namespace": "ml", "uid": UID, "annotations": ann},
            "spec": {"nodeName": "n1", "containers": []},
        }))
        .unwrap()
    }

    fn planned(quota: &str) -> Pod {
        pod(&[(ANN_GPU, "1"), (ANN_SM_PERCENT, "35.5"), (ANN_MEMORY_QUOTA_BYTES, quota)])
    }

    /// The first plan seen is kept: a raised or removed memory annotation changes neither
    /// what the list publishes nor what a later Allocate gives; each change is counted once;
    /// a restarted agent (a new store over the same directory) keeps the plan.
    #[test]
    fn the_first_plan_is_frozen_and_later_annotations_are_counted_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let s = PlanStore::open(d.path());
        assert_eq!(s.memory_quota_bytes(&planned(" 2147483648 ")), Some(2 << 30), "trimmed as Allocate trims");
        assert_eq!(s.memory_quota_bytes(&planned("85899345920")), Some(2 << 30));
        assert_eq!(s.memory_quota_bytes(&planned("85899345920")), Some(2 << 30));
        assert_eq!(s.ignored_changes(), 1, "one WARN per value");
        assert_eq!(s.memory_quota_bytes(&pod(&[(ANN_GPU, "1"), (ANN_SM_PERCENT, "35.5")])), Some(2 << 30));
        assert_eq!(s.ignored_changes(), 2);
        let p = s.for_allocate(&pod(&[(ANN_GPU, "0"), (ANN_SM_PERCENT, "100"), (ANN_MEMORY_QUOTA_BYTES, "85899345920")])).unwrap();
        assert_eq!((p.gpu, p.mps_percent, p.memory_quota_bytes), (1, 36, 2 << 30));
        assert!(s.metrics("n1").contains("xshare_node_agent_plan_annotation_changes_ignored_total{node=\"n1\"} 5"), "{}", s.metrics("n1"));
        // Restart: the record on disk, root-only.
        let file = s.dir().join(format!("{UID}.json"));
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(s.dir()).unwrap().permissions().mode() & 0o777, 0o700);
        let again = PlanStore::open(d.path());
        assert_eq!(again.memory_quota_bytes(&planned("85899345920")), Some(2 << 30));
        assert_eq!(again.get(UID).unwrap().source, Source::Watch);
    }

    /// A record written by a later node-agent (a field this one does not know) is the pod's
    /// frozen plan still, not a damaged file frozen again from today's annotations.
    #[test]
    fn a_later_agents_record_keeps_its_frozen_plan() {
        let d = tempfile::tempdir().unwrap();
        let s = PlanStore::open(d.path());
        assert_eq!(s.memory_quota_bytes(&planned("2147483648")), Some(2 << 30));
        let file = s.dir().join(format!("{UID}.json"));
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        v["a_later_field"] = serde_json::json!({"any": 1});
        std::fs::write(&file, v.to_string()).unwrap();
        let again = PlanStore::open(d.path());
        assert_eq!(again.memory_quota_bytes(&planned("85899345920")), Some(2 << 30), "the frozen quota, not the raised annotation");
        assert_eq!(again.ignored_changes(), 1);
    }

    /// Allocate freezes what it allocated; a pod first seen with no plan stays unplanned and
    /// its Allocate is refused once annotations appear.
    #[test]
    fn allocate_freezes_its_plan_and_a_pod_first_seen_unplanned_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let s = PlanStore::open(d.path());
        let p = s.for_allocate(&planned("1073741824")).unwrap();
        assert_eq!(p.memory_quota_bytes, 1 << 30);
        assert_eq!(s.get(UID).unwrap().source, Source::Allocate);
        assert_eq!(s.memory_quota_bytes(&planned("85899345920")), Some(1 << 30));

        let d = tempfile::tempdir().unwrap();
        let s = PlanStore::open(d.path());
        assert_eq!(s.memory_quota_bytes(&pod(&[])), None);
        let e = s.for_allocate(&planned("85899345920")).unwrap_err();
        assert!(matches!(e, AllocError::Unplanned { .. }) && e.to_string().contains("ml/train"), "{e}");
        // A pod with no plan and no record: the annotation's error, nothing frozen.
        let d = tempfile::tempdir().unwrap();
        let s = PlanStore::open(d.path());
        assert!(matches!(s.for_allocate(&pod(&[])), Err(AllocError::BadAnnotation { .. })));
        assert!(s.get(UID).is_none());
    }

    /// A plan that cannot be written refuses Allocate (naming the directory) and is not kept.
    #[test]
    fn an_unwritable_record_refuses_allocate() {
        let d = tempfile::tempdir().unwrap();
        // `node-agent` is a file: the plans directory cannot be made.
        std::fs::write(d.path().join("node-agent"), b"").unwrap();
        let s = PlanStore::open(d.path());
        let e = s.for_allocate(&planned("1073741824")).unwrap_err().to_string();
        assert!(e.contains("cannot record") && e.contains("node-agent"), "{e}");
        assert!(s.get(UID).is_none());
    }

    /// Records of pods gone from the node go after the grace, from memory and disk.
    #[test]
    fn gone_pods_records_are_removed_after_the_grace() {
        let d = tempfile::tempdir().unwrap();
        let s = PlanStore::open(d.path());
        s.for_allocate(&planned("1073741824")).unwrap();
        assert_eq!(s.forget_gone(&|_| false, Duration::from_secs(3600)), 0);
        assert_eq!(s.forget_gone(&|u| u == UID, Duration::ZERO), 0);
        let other = PlanStore::open(d.path());
        assert_eq!(other.forget_gone(&|_| false, Duration::ZERO), 1, "a record on disk only");
        assert!(!s.dir().join(format!("{UID}.json")).exists());
    }
}
