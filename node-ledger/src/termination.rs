//! A pod's deletion as node-agent saw it, for its offline processes: when the kubelet's
//! SIGKILL is due, so that the shim drains the GPU before it (xcuda-shim/README.md, "Drain
//! before the kubelet's SIGKILL").
//!
//! # Why
//!
//! The shim knows the pod's `spec.terminationGracePeriodSeconds` from its environment
//! (`XCUDA_KILL_GRACE_MS`, fixed when the container starts) and plans its drain from the
//! SIGTERM by it. A deletion may ask for a shorter grace (`kubectl delete --grace-period=5`,
//! an Eviction's `DeleteOptions`), and a `preStop` hook spends part of the grace before the
//! SIGTERM is sent: either way the SIGKILL comes before that plan, with kernels in flight, and
//! under MPS a client killed mid-kernel can take the online clients of its server down.
//! The API server records what the kubelet will do in the pod's metadata
//! (`deletionTimestamp`: the request's time plus the grace; `deletionGracePeriodSeconds`),
//! and node-agent, which watches the pods bound to its node, writes it here.
//!
//! # The file and its owner
//!
//! `<ledger_dir>/pods/<pod-uid>/termination` ([`termination_path`]): node-agent creates it
//! empty when it allocates the pod a GPU ([`create`]) and mounts it **read-only** into the
//! pod's containers (`XCUDA_TERMINATION_FILE` names it there); it writes it in place (a mount
//! names the inode) when it sees the pod's deletion ([`write`]), and it goes with the pod's
//! directory. Only node-agent writes it; the shim reads it ([`read`]) after a SIGTERM. Text,
//! four lines, the last one `end`, so a read that meets a write half done is refused, never
//! taken for a later deadline:
//!
//! ```text
//! xshare-termination 1
//! deletion_unix_ms 1796012345000
//! grace_ms 5000
//! end
//! ```

use std::fs::{File, OpenOptions, Permissions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::status::PodUid;

/// The file's name in the pod's directory.
pub const FILE_NAME: &str = "termination";
/// Its first line.
const HEADER: &str = "xshare-termination 1";
/// Mode of the file, set explicitly whatever the umask: every process of the pod, of whatever
/// user, reads it; node-agent (root) alone writes it.
pub const FILE_MODE: u32 = 0o644;
/// The kubelet never gives a container less than this between its SIGTERM and its SIGKILL
/// (`minimumGracePeriodInSeconds`, also after a `preStop` hook used up the grace).
pub const KUBELET_MIN_GRACE_MS: u64 = 2000;
/// The longest file [`read`] takes.
const MAX_LEN: u64 = 256;

/// `<ledger_dir>/pods/<pod>/termination`.
pub fn termination_path(ledger_dir: &Path, pod: PodUid) -> PathBuf {
    crate::pods::pod_dir(ledger_dir, pod).join(FILE_NAME)
}

/// A pod's deletion, from its metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Termination {
    /// `metadata.deletionTimestamp`, ms since the epoch (the API server's clock): when the
    /// grace the deletion gave ends.
    pub deletion_unix_ms: u64,
    /// `metadata.deletionGracePeriodSeconds`, ms: the kubelet's wait between the SIGTERM and
    /// the SIGKILL (less what a `preStop` hook used).
    pub grace_ms: u64,
}

impl Termination {
    /// The file's text.
    pub fn render(&self) -> String {
        format!("{HEADER}\ndeletion_unix_ms {}\ngrace_ms {}\nend\n", self.deletion_unix_ms, self.grace_ms)
    }

    /// Parses [`Termination::render`]'s text, strictly: anything else (a partial write, another
    /// version, a stray byte) is an error naming what is wrong.
    pub fn parse(text: &str) -> Result<Termination, String> {
        let mut lines = text.lines();
        if lines.next() != Some(HEADER) {
            return Err(format!("the first line is not `{HEADER}`"));
        }
        let mut field = |name: &str| -> Result<u64, String> {
            let line = lines.next().ok_or_else(|| format!("`{name}` is missing"))?;
            let v = line.strip_prefix(name).and_then(|r| r.strip_prefix(' ')).ok_or_else(|| format!("`{line}` is not `{name} <n>`"))?;
            v.parse::<u64>().map_err(|e| format!("`{name}` {v:?}: {e}"))
        };
        let t = Termination { deletion_unix_ms: field("deletion_unix_ms")?, grace_ms: field("grace_ms")? };
        match (lines.next(), lines.next(), text.ends_with('\n')) {
            (Some("end"), None, true) => Ok(t),
            _ => Err("the file does not end with the line `end` (a write in progress, or not this format)".into()),
        }
    }

    /// When the kubelet's SIGKILL is due (monotonic ns) for a process whose SIGTERM came at
    /// monotonic `term_ns`, read at monotonic `now_ns` = `now_unix_ms` on the wall clock: the
    /// earlier of the SIGTERM plus the deletion's grace and the deletion's end on this clock
    /// (a `preStop` hook spent part of the grace before the SIGTERM), and of `spec_kill_ns`
    /// (the pod's own grace, if known); never before the SIGTERM plus
    /// [`KUBELET_MIN_GRACE_MS`]. Earlier is the safe side: a drain too early costs the job
    /// its last seconds on the GPU, one too late kills it mid-kernel.
    pub fn kill_ns(&self, term_ns: u64, now_ns: u64, now_unix_ms: u64, spec_kill_ns: Option<u64>) -> u64 {
        let ms = |v: u64| v.saturating_mul(1_000_000);
        let by_grace = term_ns.saturating_add(ms(self.grace_ms));
        let by_clock = now_ns.saturating_add(ms(self.deletion_unix_ms.saturating_sub(now_unix_ms)));
        let kill = spec_kill_ns.map_or(by_grace, |s| s.min(by_grace)).min(by_clock);
        kill.max(term_ns.saturating_add(ms(KUBELET_MIN_GRACE_MS)))
    }
}

/// Creates the file at `path` empty if it does not exist (mode [`FILE_MODE`]), keeping what an
/// existing one says (the pod's next container).
pub fn create(path: &Path) -> io::Result<()> {
    let f = OpenOptions::new().write(true).create(true).truncate(false).mode(FILE_MODE).open(path)?;
    f.set_permissions(Permissions::from_mode(FILE_MODE))
}

/// Writes `t` into the existing file at `path`, in place; returns whether it changed. A file
/// that does not exist is left so (the pod was allocated by a node-agent that made none, or
/// elsewhere: no container reads one).
pub fn write(path: &Path, t: &Termination) -> io::Result<bool> {
    let mut f = match OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOFOLLOW).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let text = t.render();
    let mut old = String::new();
    let _ = (&f).take(MAX_LEN).read_to_string(&mut old);
    if old == text {
        return Ok(false);
    }
    f.set_len(0)?;
    f.seek(SeekFrom::Start(0))?;
    f.write_all(text.as_bytes())?;
    Ok(true)
}

/// Reads the file at `path`: `Ok(None)` when it is empty (no deletion seen) or absent, an error
/// naming the file when it does not parse (a write in progress: read again later). A rewrite
/// (a second deletion) truncates before it writes, so a reader may meet an empty file or a
/// prefix of the new text between two readings, never old and new digits mixed: a reader keeps
/// its last reading over an empty one (the shim's only ever moves the kill earlier).
pub fn read(path: &Path) -> Result<Option<Termination>, String> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut text = String::new();
    f.take(MAX_LEN).read_to_string(&mut text).map_err(|e| format!("{}: {e}", path.display()))?;
    if text.is_empty() {
        return Ok(None);
    }
    Termination::parse(&text).map(Some).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Termination = Termination { deletion_unix_ms: 1_796_012_345_000, grace_ms: 5000 };

    #[test]
    fn the_text_round_trips_and_every_prefix_of_it_is_refused() {
        let text = T.render();
        assert_eq!(Termination::parse(&text), Ok(T));
        for n in 0..text.len() {
            assert!(Termination::parse(&text[..n]).is_err(), "a write cut at {n} bytes was taken: {:?}", &text[..n]);
        }
        for bad in [
            text.replace("xshare-termination 1", "xshare-termination 2"),
            text.replace("5000", "-5"),
            text.replace("5000", "5000 "),
            format!("{text}x\n"),
            text.replace("grace_ms", "grace"),
        ] {
            assert!(Termination::parse(&bad).is_err(), "{bad:?}");
        }
    }

    /// The SIGKILL's time is the earliest reading, never before the kubelet's 2 s floor.
    #[test]
    fn the_kill_is_the_earliest_reading_and_never_inside_the_kubelets_floor() {
        let s = 1_000_000_000u64;
        let (term, now, now_unix) = (100 * s, 101 * s, 1_796_012_341_000u64);
        // The deletion's grace from the SIGTERM (105 s) against its end on the wall clock
        // (4 s after now: 105 s too) and a longer spec grace (130 s).
        assert_eq!(T.kill_ns(term, now, now_unix, Some(130 * s)), 105 * s);
        // A preStop hook spent part of the grace before the SIGTERM
        // (the SIGTERM came 1.5 s into the grace): the end on the wall clock comes first.
        assert_eq!(T.kill_ns(term, now, now_unix + 1500, Some(130 * s)), 103 * s + s / 2);
        // A spec grace shorter than the deletion's (the file is older than a new deletion).
        assert_eq!(T.kill_ns(term, now, now_unix, Some(103 * s)), 103 * s);
        // A deadline already past, or a grace of 0: the kubelet's 2 s floor.
        assert_eq!(T.kill_ns(term, now, now_unix + 60_000, None), 102 * s);
        let zero = Termination { grace_ms: 0, ..T };
        assert_eq!(zero.kill_ns(term, now, now_unix, None), 102 * s);
    }

    /// node-agent's write keeps the inode (a container's mount names it), changes nothing when
    /// the reading is the same, leaves an absent file absent, and the file is read back.
    #[test]
    fn writes_in_place_and_reads_back() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(FILE_NAME);
        assert_eq!(read(&p), Ok(None));
        assert!(!write(&p, &T).unwrap(), "no file, nothing written");
        assert!(!p.exists());
        create(&p).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, FILE_MODE);
        assert_eq!(read(&p), Ok(None), "empty: no deletion yet");
        let ino = std::fs::metadata(&p).unwrap().ino();
        assert!(write(&p, &T).unwrap());
        assert!(!write(&p, &T).unwrap(), "the same reading is not written again");
        let shorter = Termination { deletion_unix_ms: T.deletion_unix_ms - 3000, grace_ms: 2000 };
        assert!(write(&p, &shorter).unwrap());
        assert_eq!(read(&p), Ok(Some(shorter)));
        assert_eq!(std::fs::metadata(&p).unwrap().ino(), ino, "written in place");
        create(&p).unwrap();
        assert_eq!(read(&p), Ok(Some(shorter)), "a second create keeps the reading");
        std::fs::write(&p, "xshare-termination 1\ndeletion_unix_ms 1\n").unwrap();
        assert!(read(&p).unwrap_err().contains(FILE_NAME));
    }
}
