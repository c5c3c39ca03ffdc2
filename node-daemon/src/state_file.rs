//! State files: JSON written whole through a temp file and a rename, so a reader never sees
//! half a file.

use std::io::Write as _;
use std::path::Path;

use crate::errlog::{ErrorRun, Say};

/// Writes `bytes` to `path` through a temp file beside it and a rename, so readers never see
/// half a file (and a crash mid-write leaves the previous file in place). The file is made
/// readable by all, writable by the owner (0644), whatever the umask.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_mode(path, bytes, 0o644)
}

/// [`write_atomic`] with the file's mode `mode`, set on the temp file before the rename: no
/// reader ever sees the file with other permissions.
///
/// The temp file is a fresh name (pid and a counter) created exclusively and never through a
/// symbolic link: a name someone else placed in the directory fails the write instead of
/// being followed or truncated.
pub fn write_atomic_mode(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().map_or("state".into(), |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{name}.tmp.{}.{}", std::process::id(), SEQ.fetch_add(1, Relaxed)));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Serializes `value` as one line of JSON and writes it with [`write_atomic`].
pub fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let mut v = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    v.push(b'\n');
    write_atomic(path, &v)
}

/// Serializes `value` as indented JSON and writes it with [`write_atomic`].
pub fn write_json_pretty<T: serde::Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let mut v = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
    v.push(b'\n');
    write_atomic(path, &v)
}

/// Logs the `result` of a daemon's periodic write of its state file at `path` through `run`
/// ([`crate::errlog`]): a run of failed writes (a read-only or full directory) at its start,
/// on a changed error, once a minute (WARN, naming `readers`, who then see the last file
/// written) and at its end (INFO), not at every try.
pub fn log_write(run: &mut ErrorRun, now_ms: u64, path: &Path, result: std::io::Result<()>, readers: &str) {
    match result {
        Err(e) => {
            if let Say::Failed { errors, for_ms } = run.failed(now_ms, &e.to_string()) {
                tracing::warn!(
                    path = %path.display(), error = %e, errors, for_ms,
                    "cannot write the state file: {readers} see the last one written"
                );
            }
        }
        Ok(()) => {
            if let Say::Recovered { errors, for_ms } = run.ok(now_ms) {
                tracing::info!(path = %path.display(), errors, for_ms, "the state file is written again");
            }
        }
    }
}

/// Reads a JSON state file; the error names the file (and the line of a parse error).
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, String> {
    let t = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&t).map_err(|e| format!("{}:{}: {e}", path.display(), e.line()))
}

/// [`read_json`] of a file that may not exist yet: `Ok(None)` when there is none (a daemon's
/// first start on this boot), `Err` naming the file when it is there but cannot be read or
/// parsed (damaged, written by an incompatible version, a dangling link). A daemon resuming
/// from it says the latter loudly: what the earlier run left in flight is lost.
pub fn read_json_if_present<T: serde::de::DeserializeOwned>(
    path: &Path,
) -> Result<Option<T>, String> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        _ => read_json(path).map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_whole_and_leaves_no_temp_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.json");
        write_json(&p, &vec![1, 2, 3]).unwrap();
        write_json_pretty(&p, &vec![4]).unwrap();
        assert_eq!(read_json::<Vec<u32>>(&p).unwrap(), vec![4]);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    /// The mode is the one asked for whatever the umask (a unit's `UMask=0077` made the
    /// offline-pods list unreadable to the shims' readers until a chmod after the rename), and
    /// the temp file is a fresh name: a link left in the directory is not followed.
    #[test]
    fn the_file_has_its_mode_from_the_start_and_no_planted_link_is_followed() {
        use std::os::unix::fs::PermissionsExt as _;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.json");
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        // The name the previous version wrote through.
        std::os::unix::fs::symlink(&victim, p.with_extension(format!("tmp.{}", std::process::id()))).unwrap();
        // SAFETY: umask(2) only changes this process's file-creation mask; restored below.
        let old = unsafe { libc::umask(0o077) };
        let r = write_atomic(&p, b"1\n");
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        r.unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o644);
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        write_atomic_mode(&p, b"2\n", 0o600).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_missing_file_is_none_a_damaged_one_an_error_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.json");
        assert_eq!(read_json_if_present::<u32>(&p), Ok(None));
        write_json(&p, &5u32).unwrap();
        assert_eq!(read_json_if_present::<u32>(&p), Ok(Some(5)));
        for bad in [&b"{"[..], b"", b"\x00\x00"] {
            std::fs::write(&p, bad).unwrap();
            let e = read_json_if_present::<u32>(&p).unwrap_err();
            assert!(e.contains("s.json"), "{e}");
        }
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink(d.path().join("nowhere"), &p).unwrap();
        assert!(
            read_json_if_present::<u32>(&p).is_err(),
            "a dangling link is not a first start"
        );
    }

    #[test]
    fn a_failed_write_keeps_the_previous_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.json");
        write_json(&p, &1u32).unwrap();
        // A value that cannot be written (a map with non-string keys): the file stays.
        let bad: std::collections::BTreeMap<Vec<u8>, u32> = [(vec![1], 1)].into();
        assert!(write_json(&p, &bad).is_err());
        assert_eq!(read_json::<u32>(&p).unwrap(), 1);
        // The rename fails (the name is a directory with something in it): no temp file left.
        let q = d.path().join("q.json");
        std::fs::create_dir_all(q.join("x")).unwrap();
        assert!(write_json(&q, &2u32).is_err());
        let mut names: Vec<_> = std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        assert_eq!(names, ["q.json", "s.json"]);
    }

    #[test]
    fn read_errors_name_the_file_and_line() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.json");
        std::fs::write(&p, "{\n  \"a\": oops\n}").unwrap();
        let e = read_json::<serde_json::Value>(&p).unwrap_err();
        assert!(e.starts_with(&format!("{}:2:", p.display())), "{e}");
        let e = read_json::<u32>(&d.path().join("missing")).unwrap_err();
        assert!(e.contains("missing"), "{e}");
    }
}
