//! Pod ledgers: one ledger file per pod and GPU, so that a pod's processes can write only their
//! own pod's usage and registrations.
//!
//! # Why
//!
//! Every offline process writes the ledger it registers in (its slot, its group's usage), with
//! plain stores as well as through this crate: a process that maps a ledger can write any word
//! of it. With one ledger per GPU shared by every offline container, a tenant could raise a
//! neighbour's `used_bytes` (its allocations refused), write a neighbour's group into its own
//! slot, or zero anything. With a file per pod, mounted into that pod's containers only, what a
//! tenant can damage is its own pod's accounting, which the monitor checks against NVML
//! (sysmonitor's `verify`) and which never loosens anyone else's limit.
//!
//! # Layout and owners
//!
//! `<ledger_dir>/pods/<pod-uid>/gpu<N>/ledger` ([`pod_ledger_path`]), the same layout as a GPU's
//! ledger. node-agent creates it when it allocates the GPU to the pod (Allocate) and removes the
//! pod's directory once the pod is gone from the node and no process is registered in it; it
//! mounts the file alone (not its directory) at the path where the shim looks for its GPU's
//! ledger, so a tenant can neither unlink nor replace it (a mount point is busy), only write it.
//! The GPU's own ledger (`<ledger_dir>/gpu<N>/ledger`) stays for offline work outside
//! Kubernetes. The daemons read every ledger of their GPU: the GPU's and each pod's
//! ([`PodLedgers`]). What a process needs of the others (the offline jobs on its GPU, to split
//! the SM budget) comes from the monitor's jobs table in the status file, which only the daemons
//! write (`crate::status`).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::ledger::Ledger;
use crate::status::PodUid;

/// Directory of the pod ledgers under the ledger directory.
pub const PODS_DIR: &str = "pods";

/// `<ledger_dir>/pods`.
pub fn pods_dir(ledger_dir: &Path) -> PathBuf {
    ledger_dir.join(PODS_DIR)
}

/// `<ledger_dir>/pods/<pod>`: everything of one pod (one ledger per GPU it was given).
pub fn pod_dir(ledger_dir: &Path, pod: PodUid) -> PathBuf {
    pods_dir(ledger_dir).join(pod.to_string())
}

/// `<ledger_dir>/pods/<pod>/gpu<N>/ledger`: pod `pod`'s ledger of GPU `gpu`.
pub fn pod_ledger_path(ledger_dir: &Path, pod: PodUid, gpu: u32) -> PathBuf {
    crate::config::ledger_path(&pod_dir(ledger_dir, pod), gpu)
}

/// One pod's ledger of the GPU, as a daemon holds it open.
pub struct PodLedger {
    /// The pod (its directory's name).
    pub pod: PodUid,
    /// The mapped ledger.
    pub ledger: Ledger,
    dev_ino: (u64, u64),
}

/// What a [`PodLedgers::scan`] changed, for the daemon's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodChange {
    /// A pod ledger opened (new, or replaced by a new file).
    Opened(PodUid, PathBuf),
    /// A pod ledger no longer read: its file is gone (the pod left), or replaced.
    Closed(PodUid, PathBuf),
    /// A pod ledger that does not open or no longer validates (damaged by its tenant, of
    /// another GPU or layout): its processes are not read from it (the monitor's NVML check
    /// still sees their memory). Said once per distinct error.
    Refused(PodUid, PathBuf, String),
}

/// A file's identity and last change: (dev, inode, size, mtime s, mtime ns).
type Stamp = (u64, u64, u64, i64, i64);

fn stamp(m: &std::fs::Metadata) -> Stamp {
    (m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec())
}

/// Every pod ledger of one GPU, kept open between scans: what the daemons read beside the
/// GPU's own ledger.
pub struct PodLedgers {
    ledger_dir: PathBuf,
    gpu: u32,
    open: BTreeMap<PodUid, PodLedger>,
    /// Each refused pod ledger's file as it was then and the error said: not opened again
    /// until the file changes (another inode, size or modification time).
    refused: BTreeMap<PodUid, (Stamp, String)>,
}

impl std::fmt::Debug for PodLedgers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodLedgers").field("dir", &pods_dir(&self.ledger_dir)).field("gpu", &self.gpu).field("open", &self.open.len()).finish()
    }
}

impl PodLedgers {
    /// The pod ledgers of GPU `gpu` under `ledger_dir` (none read until [`PodLedgers::scan`]).
    pub fn new(ledger_dir: &Path, gpu: u32) -> Self {
        PodLedgers { ledger_dir: ledger_dir.to_owned(), gpu, open: BTreeMap::new(), refused: BTreeMap::new() }
    }

    /// Reads the pods directory: opens each pod ledger of this GPU not yet open, closes those
    /// whose file is gone or replaced, and refuses (closes) those whose header no longer
    /// validates or that are another GPU's. A `readdir` and a `stat` per pod, an `fstat` per
    /// open ledger: for a period of a few hundred ms, never per sample.
    pub fn scan(&mut self) -> Vec<PodChange> {
        let mut out = Vec::new();
        let mut seen = Vec::new();
        let entries = std::fs::read_dir(pods_dir(&self.ledger_dir)).into_iter().flatten().flatten();
        for e in entries {
            let Some(pod) = e.file_name().to_str().and_then(PodUid::parse) else { continue };
            let path = pod_ledger_path(&self.ledger_dir, pod, self.gpu);
            // The path itself, never through a link (the daemons create these; a link is not
            // theirs).
            let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
            if !meta.is_file() {
                continue;
            }
            seen.push(pod);
            let id = (meta.dev(), meta.ino());
            if let Some(p) = self.open.get(&pod) {
                if p.dev_ino == id {
                    match p.ledger.check_header() {
                        Ok(()) => continue,
                        Err(e) => {
                            self.open.remove(&pod);
                            self.refuse(pod, &path, stamp(&meta), e.to_string(), &mut out);
                            continue;
                        }
                    }
                }
                self.open.remove(&pod);
                out.push(PodChange::Closed(pod, path.clone()));
            }
            if self.refused.get(&pod).is_some_and(|(st, _)| *st == stamp(&meta)) {
                continue; // refused as it is: said already
            }
            match self.open_one(&path) {
                Ok(ledger) => {
                    self.refused.remove(&pod);
                    self.open.insert(pod, PodLedger { pod, ledger, dev_ino: id });
                    out.push(PodChange::Opened(pod, path));
                }
                Err(e) => self.refuse(pod, &path, stamp(&meta), e, &mut out),
            }
        }
        let gone: Vec<PodUid> = self.open.keys().filter(|p| !seen.contains(p)).copied().collect();
        for pod in gone {
            if let Some(p) = self.open.remove(&pod) {
                out.push(PodChange::Closed(pod, p.ledger.path().to_owned()));
            }
        }
        self.refused.retain(|p, _| seen.contains(p));
        out
    }

    fn open_one(&self, path: &Path) -> Result<Ledger, String> {
        let l = Ledger::open_existing(path).map_err(|e| e.to_string())?;
        let g = l.gpu_index();
        if g != self.gpu {
            return Err(format!("ledger {}: field `gpu_index`: {g}, this GPU is {}", path.display(), self.gpu));
        }
        Ok(l)
    }

    fn refuse(&mut self, pod: PodUid, path: &Path, st: Stamp, e: String, out: &mut Vec<PodChange>) {
        if self.refused.get(&pod).map(|(_, said)| said) != Some(&e) {
            out.push(PodChange::Refused(pod, path.to_owned(), e.clone()));
        }
        self.refused.insert(pod, (st, e));
    }

    /// The open pod ledgers, by pod.
    pub fn iter(&self) -> impl Iterator<Item = &PodLedger> {
        self.open.values()
    }

    /// Pod `pod`'s ledger, if open.
    pub fn get(&self, pod: PodUid) -> Option<&Ledger> {
        self.open.get(&pod).map(|p| &p.ledger)
    }

    /// The pod ledgers refused as they are now (damaged, another GPU's), by pod, with why.
    pub fn refused(&self) -> impl Iterator<Item = (PodUid, &str)> {
        self.refused.iter().map(|(p, (_, e))| (*p, e.as_str()))
    }

    /// How many pod ledgers are open.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether no pod ledger is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid(n: u8) -> PodUid {
        PodUid::parse(&format!("{n:08x}-0000-4000-8000-000000000000")).unwrap()
    }

    #[test]
    fn a_scan_opens_new_pod_ledgers_and_closes_gone_replaced_damaged_and_foreign_ones() {
        let d = tempfile::tempdir().unwrap();
        let mut set = PodLedgers::new(d.path(), 1);
        assert!(set.scan().is_empty(), "no pods directory: nothing");
        let (a, b) = (uid(1), uid(2));
        let la = Ledger::open_or_create(&pod_ledger_path(d.path(), a, 1), 1).unwrap();
        let _lb = Ledger::open_or_create(&pod_ledger_path(d.path(), b, 1), 1).unwrap();
        // Another GPU's ledger of pod A, a stray name and a link are not this GPU's pods.
        let _other = Ledger::open_or_create(&pod_ledger_path(d.path(), a, 0), 0).unwrap();
        std::fs::create_dir_all(pods_dir(d.path()).join("not-a-uid/gpu1")).unwrap();
        std::fs::create_dir_all(pod_dir(d.path(), uid(3)).join("gpu1")).unwrap();
        std::os::unix::fs::symlink(la.path(), pod_ledger_path(d.path(), uid(3), 1)).unwrap();
        let ch = set.scan();
        assert_eq!(ch.len(), 2, "{ch:?}");
        assert!(ch.iter().all(|c| matches!(c, PodChange::Opened(..))));
        assert_eq!(set.len(), 2);
        assert!(set.scan().is_empty(), "nothing changed");
        // A process registered in pod A's ledger is seen through the set.
        let g = la.group(7, 1 << 20).unwrap();
        let _h = la.register(std::process::id(), g).unwrap();
        assert_eq!(set.get(a).unwrap().procs().len(), 1);
        // Pod B's directory removed (the pod left): closed.
        std::fs::remove_dir_all(pod_dir(d.path(), b)).unwrap();
        assert_eq!(set.scan(), vec![PodChange::Closed(b, pod_ledger_path(d.path(), b, 1))]);
        // Pod A's ledger damaged by its tenant: refused, said once; its processes not read.
        std::fs::OpenOptions::new().write(true).open(la.path()).unwrap().set_len(100).unwrap();
        let ch = set.scan();
        assert!(matches!(&ch[..], [PodChange::Refused(p, _, e)] if *p == a && e.contains("total_size")), "{ch:?}");
        assert!(set.scan().is_empty(), "said once");
        assert!(set.get(a).is_none());
        // Replaced by a sound file (another inode): opened again.
        std::fs::remove_file(pod_ledger_path(d.path(), a, 1)).unwrap();
        let _la2 = Ledger::open_or_create(&pod_ledger_path(d.path(), a, 1), 1).unwrap();
        assert!(matches!(&set.scan()[..], [PodChange::Opened(p, _)] if *p == a));
        // Another GPU's ledger at this GPU's path: refused.
        std::fs::remove_file(pod_ledger_path(d.path(), a, 1)).unwrap();
        std::fs::copy(pod_ledger_path(d.path(), a, 0), pod_ledger_path(d.path(), a, 1)).unwrap();
        let ch = set.scan();
        assert!(ch.iter().any(|c| matches!(c, PodChange::Refused(p, _, e) if *p == a && e.contains("gpu_index"))), "{ch:?}");
    }
}
