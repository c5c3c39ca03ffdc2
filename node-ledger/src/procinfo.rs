//! Process identity that survives pid reuse: pid + start time (`/proc/<pid>/stat` field 22) + pid namespace.

use std::fs;

/// Start time of `pid` in clock ticks since boot, or `None` if the process does not exist.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

/// Parses field 22 (starttime) from a `/proc/<pid>/stat` line; the comm field may hold spaces and ')'.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields after comm start at field 3 (state); starttime is field 22 => index 19 here.
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

/// Inode of this process's pid namespace (0 if unreadable); pids are only comparable within one.
pub fn own_pid_ns() -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self/ns/pid")
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// Whether the process `pid` started at `start` is still alive (a zombie counts as dead).
pub fn is_alive(pid: u32, start: u64) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let zombie = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .is_some_and(|s| s == "Z" || s == "X");
    !zombie && parse_start_time(&stat) == Some(start)
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
    }

    #[test]
    fn own_process_is_alive_and_wrong_start_is_not() {
        let pid = std::process::id();
        let st = start_time(pid).expect("own stat");
        assert!(is_alive(pid, st));
        assert!(!is_alive(pid, st + 1));
        assert!(!is_alive(u32::MAX - 1, st));
    }
}
