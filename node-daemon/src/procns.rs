//! A host pid as the ledger knows the process: its pid namespace and its pid there.
//!
//! Offline processes register in the ledger from their container, under the pid their own
//! (innermost) pid namespace gives them; NVML and the MPS control daemon name them by their
//! pid in the host's namespace, where the daemons run. `/proc/<pid>/ns/pid` (the namespace's
//! inode) and the last `NSpid:` entry of `/proc/<pid>/status` (the pid in that namespace)
//! turn the second into the first (Linux 4.1+).

use std::os::unix::fs::MetadataExt;

/// `pid` (in this process's pid namespace) as the process sees itself: `(pid namespace inode,
/// pid in it)`, what its ledger registration records as `pid_ns` and `pid`. `None` when the
/// process is gone or its namespace cannot be read (another user's process, without
/// `CAP_SYS_PTRACE`).
pub fn ns_pid(pid: u32) -> Option<(u64, u32)> {
    let ns = std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?.ino();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some((ns, innermost_pid(&status)?))
}

/// The last pid of the `NSpid:` line of a `/proc/<pid>/status` text: the pid in the
/// process's own pid namespace.
pub fn innermost_pid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn innermost_pid_is_the_last_nspid_entry() {
        let status = "Name:\tpython3\nTgid:\t4242\nPid:\t4242\nNSpid:\t4242\t17\nPPid:\t1\n";
        assert_eq!(innermost_pid(status), Some(17));
        assert_eq!(innermost_pid("Name:\tx\nNSpid:\t99\n"), Some(99));
        assert_eq!(innermost_pid("Name:\tx\n"), None, "a kernel without NSpid");
        assert_eq!(innermost_pid("NSpid:\t\n"), None);
        assert_eq!(innermost_pid("NSpid:\tx\n"), None);
    }

    #[test]
    fn this_process_is_itself_in_its_own_namespace() {
        let me = std::process::id();
        assert_eq!(ns_pid(me), Some((node_ledger::procinfo::own_pid_ns(), me)));
        assert_eq!(ns_pid(u32::MAX), None);
    }
}
