//! Process identity that survives pid reuse: pid + start time (`/proc/<pid>/stat` field 22) + pid namespace.

use std::fs;

/// Start time of `pid` in clock ticks since boot, or `None` if the process does not exist.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

/// This process's start time, from `/proc/self/stat`: right whatever pid namespace `/proc`
/// was mounted for (in a pid namespace of its own under the host's `/proc`,
/// `/proc/<getpid()>` would be another process).
pub fn own_start_time() -> Option<u64> {
    parse_start_time(&fs::read_to_string("/proc/self/stat").ok()?)
}

/// Parses field 22 (starttime) from a `/proc/<pid>/stat` line; the comm field may hold spaces and ')'.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields after comm start at field 3 (state); starttime is field 22 => index 19 here.
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

/// Parent pid of `pid` (field 4 of `/proc/<pid>/stat`, in the reader's pid namespace), or
/// `None` if the process does not exist.
pub fn parent_pid(pid: u32) -> Option<u32> {
    parse_parent_pid(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Parses field 4 (ppid) from a `/proc/<pid>/stat` line; the comm field may hold spaces and ')'.
pub fn parse_parent_pid(stat: &str) -> Option<u32> {
    stat[stat.rfind(')')? + 1..].split_whitespace().nth(1)?.parse().ok()
}

/// Inode of this process's pid namespace (0 if unreadable); pids are only comparable within one.
pub fn own_pid_ns() -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self/ns/pid")
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// What `/proc` says of the process `pid` started at `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// It runs (not a zombie), with that start time.
    Alive,
    /// No such process: none with that pid, a zombie, or another process (start time).
    Gone,
    /// `/proc` could not be read for another reason (out of descriptors or memory:
    /// EMFILE/ENFILE/ENOMEM; EACCES): neither is known.
    Unknown,
}

/// [`Liveness`] of the process `pid` started at `start`.
pub fn liveness(pid: u32, start: u64) -> Liveness {
    liveness_from(fs::read_to_string(format!("/proc/{pid}/stat")), start)
}

/// Whether the process `pid` started at `start` is still alive (a zombie counts as dead): only
/// when `/proc` says so, [`Liveness::Alive`]. This is the check that a pid still names the same
/// process before it is signalled, so an unreadable `/proc` is no: callers that end a pending
/// eviction or free a quota on a death use [`liveness`] and keep them on
/// [`Liveness::Unknown`].
pub fn is_alive(pid: u32, start: u64) -> bool {
    liveness(pid, start) == Liveness::Alive
}

/// Whether the process `pid` started at `start` is known to be gone ([`Liveness::Gone`]): the
/// check before deciding a process died (freeing its slot or quota, ending an eviction,
/// recovering from its death). An unreadable `/proc` is no death.
pub fn is_dead(pid: u32, start: u64) -> bool {
    liveness(pid, start) == Liveness::Gone
}

/// [`liveness`] from the result of reading the process's `stat`.
fn liveness_from(stat: std::io::Result<String>, start: u64) -> Liveness {
    match stat {
        Ok(stat) if !exited(&stat) && parse_start_time(&stat) == Some(start) => Liveness::Alive,
        Ok(_) => Liveness::Gone,
        Err(e) if missing(&e) => Liveness::Gone,
        Err(_) => Liveness::Unknown,
    }
}

/// Whether a failed read of `/proc/<pid>/...` means the process is not there: no such entry,
/// or it went away between the open and the read (ESRCH).
fn missing(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// Whether a `/proc/<pid>/stat` line is that of a process that has exited (zombie or dead).
fn exited(stat: &str) -> bool {
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .is_some_and(|s| s == "Z" || s == "X")
}

/// Whether no live process has pid `pid` (none, or a zombie): for a pid known without its
/// start time, such as one an MPS server lists.
/// A read that fails for another reason than the process missing says it is there, as in
/// [`is_alive`].
pub fn is_gone(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => exited(&stat),
        Err(e) => missing(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_comm_with_spaces_and_parens() {
        let line = "1234 (a b) c)) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654 20 21";
        assert_eq!(parse_start_time(line), Some(987654));
        assert_eq!(parse_start_time("garbage"), None);
        assert_eq!(parse_start_time("1 (x) S 1 2"), None);
        assert_eq!(parse_parent_pid(line), Some(1));
        assert_eq!(parse_parent_pid("7 (a) b) R 42 7 7"), Some(42));
        assert_eq!(parse_parent_pid("garbage"), None);
        assert_eq!(parent_pid(std::process::id()), Some(std::os::unix::process::parent_id()));
    }

    #[test]
    fn own_process_is_alive_and_wrong_start_is_not() {
        let pid = std::process::id();
        let st = start_time(pid).expect("own stat");
        assert_eq!(own_start_time(), Some(st));
        assert!(is_alive(pid, st));
        assert!(!is_alive(pid, st + 1));
        assert!(!is_alive(u32::MAX - 1, st));
    }

    /// A read of `/proc` that fails for want of descriptors or memory is no death (taken as
    /// one, an eviction was dropped before its SIGKILL) and no life either (taken as one, a
    /// SIGKILL could reach whatever process has the pid since).
    #[test]
    fn a_proc_read_that_fails_for_another_reason_than_absence_is_unknown() {
        let err = |code| Err(std::io::Error::from_raw_os_error(code));
        for code in [libc::EMFILE, libc::ENFILE, libc::ENOMEM, libc::EACCES] {
            assert_eq!(liveness_from(err(code), 1), Liveness::Unknown, "errno {code}");
        }
        assert_eq!(liveness_from(err(libc::ENOENT), 1), Liveness::Gone);
        assert_eq!(liveness_from(err(libc::ESRCH), 1), Liveness::Gone);
        let me = std::process::id();
        let st = start_time(me).unwrap();
        assert_eq!(liveness(me, st), Liveness::Alive);
        assert_eq!(liveness(me, st + 1), Liveness::Gone, "another process with the pid");
    }

    #[test]
    fn a_zombie_or_a_reaped_pid_is_gone_a_live_one_is_not() {
        assert!(!is_gone(std::process::id()));
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        assert!(!is_gone(pid));
        child.kill().unwrap();
        // Killed, not yet waited for: a zombie.
        while !fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| exited(&s)) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(is_gone(pid), "a zombie");
        child.wait().unwrap();
        assert!(is_gone(pid), "reaped");
    }
}
