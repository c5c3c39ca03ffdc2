//! Process identity that survives pid reuse: pid + start time (clock ticks since boot, from
//! `/proc/<pid>/stat` field 22).

/// Start time of `pid`, or `None` if it does not exist (or is a zombie).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat)
}

/// Parses the start time out of a `/proc/<pid>/stat` line; zombies and dead tasks count as gone.
pub fn parse_stat(stat: &str) -> Option<u64> {
    // The command name (field 2) is parenthesised and may contain spaces or ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" || state == "x" {
        return None;
    }
    // `rest` starts at field 3 (state); start time is field 22.
    fields.nth(22 - 4)?.parse().ok()
}

/// True if the process that was `pid` with `start` is still running. When `/proc/<pid>/stat`
/// cannot be read for another reason than absence (e.g. `hidepid`), existence is checked with
/// `kill(pid, 0)` instead, so an unreadable live process is never taken for dead.
pub fn alive(pid: u32, start: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => parse_stat(&stat) == Some(start),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(_) => {
            // SAFETY: signal 0 only checks for existence and permission.
            let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
            r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
        }
    }
}

/// This process's (pid, start time), the pid as `/proc` names it (the first field of
/// `/proc/self/stat`): a process in a pid namespace of its own (a container) is known to the
/// real driver and NVML by its pid in the host's namespace, never by `getpid()`'s, and the
/// emulated device records it so whenever the host's `/proc` is mounted (as for
/// `unshare --pid --fork` without `--mount-proc`).
pub fn me() -> (u32, u64) {
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        let pid = stat.split(' ').next().and_then(|p| p.parse().ok());
        if let (Some(pid), Some(st)) = (pid, parse_stat(&stat)) {
            return (pid, st);
        }
    }
    let pid = std::process::id();
    (pid, start_time(pid).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_odd_names_and_zombies() {
        let line = "1234 (we ird) name)) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654 20 21";
        assert_eq!(parse_stat(line), Some(987654));
        let z = "1234 (x) Z 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654 20";
        assert_eq!(parse_stat(z), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn me_is_alive() {
        let (pid, st) = me();
        assert_eq!(pid, std::process::id(), "the test's own namespace");
        assert!(st > 0);
        assert!(alive(pid, st));
        assert!(!alive(pid, st + 1));
    }
}
