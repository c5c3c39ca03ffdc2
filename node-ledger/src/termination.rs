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
//! names the inode) when it sees the pod's deletion (`write`), and it goes with the pod's
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

    /// When the kubelet's SIGKILL is due (monotonic ns) by this reading, made at monotonic
    /// `seen_ns` = `seen_unix_ms` on the wall clock, for a process whose grace runs from
    /// monotonic `from_ns` (its SIGTERM, or when it first saw a deletion): the kubelet kills by
    /// the deletion's grace whatever the pod's spec says (`deletionGracePeriodSeconds` comes
    /// first in its choice), counted from when it saw the deletion, at or before its SIGTERM (a
    /// `preStop` hook spends part of the grace before the SIGTERM): so the grace from `from_ns`,
    /// or the deletion's end on this clock when that comes first; never before `from_ns` plus
    /// [`KUBELET_MIN_GRACE_MS`]. A second, shorter deletion keeps the first request's time in
    /// `deletionTimestamp` while the kubelet counts the new grace from when it sees it: both
    /// readings then say earlier than the kill comes. A reader that drains by the earliest
    /// reading must therefore not take a kill that did not come by then for a wrong guess:
    /// with a deletion recorded, the kill is certain.
    ///
    /// The floor counts from the earlier of `from_ns` and the termination's start by this
    /// reading (its end less its grace, on this clock): a process that saw the file before any
    /// SIGTERM (`from_ns` its reading) may see it well after the kubelet began (an eviction
    /// reaches the file through the extender and node-agent), and the kubelet's SIGTERM, from
    /// which its 2 s count, comes at or after that start.
    pub fn kill_ns(&self, seen_ns: u64, seen_unix_ms: u64, from_ns: u64) -> u64 {
        let ms = |v: u64| v.saturating_mul(1_000_000);
        let by_grace = from_ns.saturating_add(ms(self.grace_ms));
        let by_clock = seen_ns.saturating_add(ms(self.deletion_unix_ms.saturating_sub(seen_unix_ms)));
        let start_ns = seen_ns.saturating_sub(ms(seen_unix_ms.saturating_sub(self.deletion_unix_ms.saturating_sub(self.grace_ms))));
        by_grace.min(by_clock).max(from_ns.min(start_ns).saturating_add(ms(KUBELET_MIN_GRACE_MS)))
    }
}

/// Creates the file at `path` empty if it does not exist (mode [`FILE_MODE`]), keeping what an
/// existing one says (the pod's next container).
pub fn create(path: &Path) -> io::Result<()> {
    // Never through a link, and only a regular file: the creator is root.
    let f = OpenOptions::new().write(true).create(true).truncate(false).mode(FILE_MODE).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path)?;
    regular(&f, path)?;
    f.set_permissions(Permissions::from_mode(FILE_MODE))
}

/// An error unless `f` (opened at `path` without blocking) is a regular file: a FIFO or a
/// device there would block its reader.
fn regular(f: &File, path: &Path) -> io::Result<()> {
    if f.metadata()?.is_file() {
        Ok(())
    } else {
        Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not a regular file", path.display())))
    }
}

/// Writes `t` into the existing file at `path`, in place; returns whether it changed. A file
/// that does not exist is left so (the pod was allocated by a node-agent that made none, or
/// elsewhere: no container reads one).
pub fn write(path: &Path, t: &Termination) -> io::Result<bool> {
    let mut f = match OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    regular(&f, path)?;
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
    let f = match OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    regular(&f, path).map_err(|e| e.to_string())?;
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

    /// The SIGKILL's time is the deletion's grace from the SIGTERM, or its end on the clock
    /// when that comes first, never before the kubelet's 2 s floor.
    #[test]
    fn the_kill_is_the_deletions_and_never_inside_the_kubelets_floor() {
        let s = 1_000_000_000u64;
        let (from, seen, seen_unix) = (100 * s, 101 * s, 1_796_012_341_000u64);
        // Read a second after the SIGTERM: its grace from the SIGTERM (105 s), its end on the
        // wall clock 4 s after the reading (105 s).
        assert_eq!(T.kill_ns(seen, seen_unix, from), 105 * s);
        // Read late (node-agent's watch lagged 4 s): still the grace from the SIGTERM.
        assert_eq!(T.kill_ns(105 * s, seen_unix + 4000, from), 105 * s);
        // The API server's clock behind the node's (its end 7 s after the reading): the grace.
        assert_eq!(T.kill_ns(seen, seen_unix - 3000, from), 105 * s);
        // A preStop hook spent part of the grace before the SIGTERM (read 1.5 s into it).
        assert_eq!(T.kill_ns(seen, seen_unix + 1500, from), 103 * s + s / 2);
        // A deadline already past (a second, shorter deletion): at once (its start, 61 s before
        // the reading, puts the floor long past).
        assert_eq!(T.kill_ns(seen, seen_unix + 60_000, from), 101 * s);
        // A grace of 0 ending after the reading: the floor from the SIGTERM.
        let zero = Termination { grace_ms: 0, ..T };
        assert_eq!(zero.kill_ns(seen, seen_unix, from), 102 * s);
        // An eviction (grace 0) the process read 1.5 s after the kubelet began, before any
        // SIGTERM (`from` is the reading): the floor from the kubelet's start, not the reading.
        let evicted = Termination { deletion_unix_ms: seen_unix - 1500, grace_ms: 0 };
        assert_eq!(evicted.kill_ns(seen, seen_unix, seen), seen + s / 2);
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
        // Never made through a link, nor over something that is not a regular file.
        let link = d.path().join("link");
        std::os::unix::fs::symlink(d.path().join("elsewhere"), &link).unwrap();
        assert!(create(&link).is_err() && !d.path().join("elsewhere").exists());
        assert!(create(d.path()).is_err(), "a directory");
        // A FIFO in its place: refused at once, never a blocked reader or writer.
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path of this test's own directory.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        assert!(read(&fifo).is_err() && write(&fifo, &T).is_err());
        std::fs::write(&p, "xshare-termination 1\ndeletion_unix_ms 1\n").unwrap();
        assert!(read(&p).unwrap_err().contains(FILE_NAME));
    }
}
