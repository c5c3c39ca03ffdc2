//! Process identity that survives pid reuse: pid plus start time from /proc/<pid>/stat.

/// Start time of `pid` in clock ticks since boot (field 22 of /proc/<pid>/stat), if alive.
pub fn start_time(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_start_time(&s)
}

/// Parses field 22 (`starttime`), skipping the `comm` field which may hold spaces and parens.
pub fn parse_stat_start_time(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    // After ")" come fields 3.. ; starttime is field 22, i.e. index 19 here.
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process is a zombie (field 3 `Z`): it has exited and only waits to be reaped.
pub fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rfind(')')
                .map(|i| s[i + 1..].trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// True when `pid` is alive (not a zombie) and still the process that started at `start`.
pub fn same_process(pid: u32, start: u64) -> bool {
    start_time(pid) == Some(start) && !is_zombie(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_comm_with_spaces_and_parens() {
        let stat = "1234 (a b) c)) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654 20 21";
        assert_eq!(parse_stat_start_time(stat), Some(987654));
        assert_eq!(parse_stat_start_time("garbage"), None);
    }

    #[test]
    fn own_process_is_itself_and_not_another() {
        let me = std::process::id();
        let st = start_time(me).expect("own stat readable");
        assert!(same_process(me, st));
        assert!(!same_process(me, st + 1));
    }
}
