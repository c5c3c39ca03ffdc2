//! The daemons' clocks: monotonic milliseconds on the ledger's time base (CLOCK_MONOTONIC,
//! shared by every process on the host), wall-clock milliseconds for state files, and the
//! boot id that says which monotonic clock a stored time belongs to.

/// Monotonic milliseconds (CLOCK_MONOTONIC, the ledger's time base in ms).
pub fn mono_ms() -> u64 {
    node_ledger::clock::now_ns() / 1_000_000
}

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before 1970).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`; empty if unreadable), so monotonic
/// times kept in a file are only trusted within the boot that wrote them.
pub fn boot_id() -> String {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mono_ms_is_the_ledger_clock_in_ms() {
        let a = node_ledger::clock::now_ns() / 1_000_000;
        let m = mono_ms();
        let b = node_ledger::clock::now_ns() / 1_000_000;
        assert!(a <= m && m <= b, "{a} <= {m} <= {b}");
    }

    #[test]
    fn boot_id_is_stable() {
        assert_eq!(boot_id(), boot_id());
        assert!(
            !boot_id().is_empty(),
            "Linux has /proc/sys/kernel/random/boot_id"
        );
    }
}
