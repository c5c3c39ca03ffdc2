//! One instance per GPU: an open-file-description write lock (`fcntl(F_OFD_SETLK)`) on a lock
//! file, held for the life of the returned [`File`] and released by the kernel when the process
//! dies, however it dies (SIGKILL, OOM killer), so a restart never finds a stale lock. Being the
//! description's, not the process's, the lock is not dropped when the process closes some other
//! descriptor of the same file (a classic POSIX lock is), and a second `lock` in the same
//! process is refused too. The descriptor is close-on-exec: a child the daemon spawns (an
//! eviction command, the MPS control daemon) does not keep the lock once it runs its program. A second instance gets an error naming the holder's pid, as the
//! holder wrote it into the file.

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
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &fl) } == 0 {
        let _ = f.set_len(0);
        let _ = (&f).write_all(format!("{}\n", std::process::id()).as_bytes());
        return Ok(f);
    }
    let err = std::io::Error::last_os_error();
    if !matches!(err.raw_os_error(), Some(libc::EACCES) | Some(libc::EAGAIN)) {
        return Err(format!("lock file {}: {err}", path.display()));
    }
    // The kernel names no owner of a description's lock (F_OFD_GETLK gives pid -1, and a
    // classic lock's pid is 0 across pid namespaces): the holder wrote its pid into the file.
    let holder = std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.lines().next().and_then(|l| l.trim().parse::<u32>().ok()))
        .map_or_else(|| "unknown".into(), |p| p.to_string());
    Err(format!(
        "another {what} (pid {holder}) already runs (lock {}); refusing to start a second one",
        path.display()
    ))
}

/// Whether another process holds the lock on `path` (a daemon of that GPU runs), as `F_GETLK`
/// tells without taking it: what a `status` command says of a state file whose writer is gone.
/// A missing or unreadable lock file is no holder. (A lock this process took through another
/// descriptor is seen too: description locks conflict within a process.)
pub fn held(path: &Path) -> bool {
    let Ok(f) = File::open(path) else { return false };
    // SAFETY: flock is plain data; an all-zero value is valid before the fields are set.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: valid open fd and a valid flock struct for the duration of the call.
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) == 0 && fl.l_type != libc::F_UNLCK as libc::c_short }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;

    /// POSIX locks are per process: the holder must be another process. A forked child takes
    /// the lock with raw syscalls only (async-signal-safe after fork), reports through a pipe
    /// and waits to be killed.
    /// Held by the tests that take a lock or fork: a child forked (and not exec'd) while
    /// another test holds a lock shares that lock's open file description, so the lock would
    /// outlive the other test's drop (a description lock, unlike a process's POSIX lock, is
    /// inherited through fork; an exec closes it, the descriptor being close-on-exec).
    static FORKS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn a_second_instance_is_refused_naming_the_holder_and_a_killed_holder_frees_the_lock() {
        let _one = FORKS.lock().unwrap_or_else(|p| p.into_inner());
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
            // SAFETY: plain syscalls on a valid C string, flock struct, stack buffer and pipe fd.
            unsafe {
                let fd = libc::open(c.as_ptr(), libc::O_RDWR);
                let mut fl: libc::flock = std::mem::zeroed();
                fl.l_type = libc::F_WRLCK as libc::c_short;
                fl.l_whence = libc::SEEK_SET as libc::c_short;
                let ok: u8 = if fd >= 0 && libc::fcntl(fd, libc::F_OFD_SETLK, &fl) == 0 {
                    // Its pid into the file, as `lock` writes it (digits on the stack).
                    let (mut buf, mut i, mut pid) = ([b'\n'; 12], 11, libc::getpid() as u32);
                    loop {
                        i -= 1;
                        buf[i] = b'0' + (pid % 10) as u8;
                        pid /= 10;
                        if pid == 0 {
                            break;
                        }
                    }
                    libc::ftruncate(fd, 0);
                    libc::pwrite(fd, buf[i..].as_ptr().cast(), 12 - i, 0);
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

    /// The lock belongs to its descriptor: the daemon opening and closing the same file again
    /// (a second reader of it, a metrics lock configured at the same path) keeps it, and a
    /// second `lock` in the same process is refused. A classic POSIX lock was dropped by that
    /// close and never conflicted within the process.
    #[test]
    fn closing_another_descriptor_of_the_file_keeps_the_lock() {
        let _one = FORKS.lock().unwrap_or_else(|p| p.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let mine = lock(&path, "x for GPU 0").unwrap();
        drop(File::open(&path).unwrap());
        assert!(held(&path));
        let e = lock(&path, "x for GPU 0").unwrap_err();
        assert!(e.contains(&format!("(pid {})", std::process::id())), "{e}");
        // A holder that writes more after its pid (mps-manager's pipe-directory lock adds the
        // GPU on a second line) is still named.
        std::fs::write(&path, format!("{}\ngpu 0\n", std::process::id())).unwrap();
        let e = lock(&path, "x for GPU 0").unwrap_err();
        assert!(e.contains(&format!("(pid {})", std::process::id())), "{e}");
        drop(mine);
        assert!(!held(&path));
    }
}
