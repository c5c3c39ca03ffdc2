//! One instance per GPU: a POSIX write lock (`fcntl(F_SETLK)`) on a lock file, held for the
//! life of the returned [`File`] and released by the kernel when the process dies, however it
//! dies (SIGKILL, OOM killer), so a restart never finds a stale lock. A second instance gets an
//! error naming the holder's pid (from `F_GETLK`, as the kernel sees it: 0 when the holder is
//! in another pid namespace).

use std::fs::File;
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Takes the write lock on `path` (created with its directory if missing) and writes this
/// process's pid into it (for operators; the lock, not the text, is what counts). `what` names
/// the daemon and what it owns in the error, e.g. `"mps-manager for GPU 0"`.
pub fn lock(path: &Path, what: &str) -> Result<File, String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| format!("lock file {}: {e}", path.display()))?;
    // SAFETY: flock is plain data; an all-zero value is valid before the fields are set.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: valid open fd and a valid flock struct for the duration of the call.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &fl) } == 0 {
        let _ = f.set_len(0);
        let _ = (&f).write_all(format!("{}\n", std::process::id()).as_bytes());
        return Ok(f);
    }
    let err = std::io::Error::last_os_error();
    if !matches!(err.raw_os_error(), Some(libc::EACCES) | Some(libc::EAGAIN)) {
        return Err(format!("lock file {}: {err}", path.display()));
    }
    // SAFETY: as above; F_GETLK fills `fl` with the conflicting lock and its owner.
    let holder = if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETLK, &mut fl) } == 0
        && fl.l_type != libc::F_UNLCK as libc::c_short
    {
        fl.l_pid.to_string()
    } else {
        "unknown".into()
    };
    Err(format!(
        "another {what} (pid {holder}) already runs (lock {}); refusing to start a second one",
        path.display()
    ))
}

/// Whether another process holds the lock on `path` (a daemon of that GPU runs), as `F_GETLK`
/// tells without taking it: what a `status` command says of a state file whose writer is gone.
/// A missing or unreadable lock file is no holder. (The caller's own lock is not seen: POSIX
/// locks never conflict with their owner.)
pub fn held(path: &Path) -> bool {
    let Ok(f) = File::open(path) else { return false };
    // SAFETY: flock is plain data; an all-zero value is valid before the fields are set.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: valid open fd and a valid flock struct for the duration of the call.
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETLK, &mut fl) == 0 && fl.l_type != libc::F_UNLCK as libc::c_short }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;

    /// POSIX locks are per process: the holder must be another process. A forked child takes
    /// the lock with raw syscalls only (async-signal-safe after fork), reports through a pipe
    /// and waits to be killed.
    #[test]
    fn a_second_instance_is_refused_naming_the_holder_and_a_killed_holder_frees_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/x.lock");
        let mine = lock(&path, "x for GPU 0").unwrap();
        drop(mine); // closing the fd releases the lock
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        let mut fds = [0i32; 2];
        // SAFETY: a valid 2-int array for pipe(2).
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only makes raw syscalls (open, fcntl, write, pause, _exit).
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            // SAFETY: plain syscalls on a valid C string, flock struct and pipe fd.
            unsafe {
                let fd = libc::open(c.as_ptr(), libc::O_RDWR);
                let mut fl: libc::flock = std::mem::zeroed();
                fl.l_type = libc::F_WRLCK as libc::c_short;
                fl.l_whence = libc::SEEK_SET as libc::c_short;
                let ok: u8 = if fd >= 0 && libc::fcntl(fd, libc::F_SETLK, &fl) == 0 {
                    1
                } else {
                    0
                };
                libc::write(fds[1], (&ok as *const u8).cast(), 1);
                loop {
                    libc::pause();
                }
            }
        }
        let mut ok = 0u8;
        // SAFETY: reading one byte from our pipe into a valid buffer.
        let n = unsafe { libc::read(fds[0], (&mut ok as *mut u8).cast(), 1) };
        assert_eq!((n, ok), (1, 1), "child took the lock");
        assert!(held(&path), "the child's lock is seen");
        let e = lock(&path, "x for GPU 0").unwrap_err();
        // SAFETY: kill/waitpid on our own child.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        assert!(
            e.contains(&format!("another x for GPU 0 (pid {child}) already runs"))
                && e.contains("x.lock"),
            "{e}"
        );
        assert!(!held(&path), "a killed holder holds nothing");
        assert!(!held(&dir.path().join("missing.lock")));
        let again = lock(&path, "x for GPU 0").expect("lock free once its holder is killed");
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
        drop(again);
    }
}
