//! The daemons' clocks: monotonic milliseconds on the ledger's time base (CLOCK_MONOTONIC,
//! shared by every process on the host), wall-clock milliseconds for state files, and the
//! boot id that says which monotonic clock a stored time belongs to.

/// Monotonic milliseconds (CLOCK_MONOTONIC, the ledger's time base in ms).
pub fn mono_ms() -> u64 {
    node_ledger::clock::now_ns() / 1_000_000
}

/// Sleeps until monotonic ms `deadline_ms` (the [`mono_ms`] clock) with one
/// `clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`: no clock read to compute a relative
/// time, no drift when the caller was late, and a deadline already past costs just the call.
/// Returns `false` when a signal handler ran before the deadline (the call is never
/// restarted after a handler, whatever `SA_RESTART` says), so that a loop can look at the
/// flags its handlers set at once and go back to sleep until the same deadline; `true` once
/// the deadline is reached.
pub fn sleep_until_ms(deadline_ms: u64) -> bool {
    let ts = libc::timespec {
        tv_sec: (deadline_ms / 1000).min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: ((deadline_ms % 1000) * 1_000_000) as libc::c_long,
    };
    // SAFETY: plain syscall wrapper with a valid timespec; no remainder is asked for (it is
    // not used with TIMER_ABSTIME).
    let r = unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &ts,
            std::ptr::null_mut(),
        )
    };
    // clock_nanosleep returns the error number itself (not -1 and errno).
    r != libc::EINTR
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
    fn sleep_until_wakes_at_the_deadline_not_before() {
        let start = mono_ms();
        assert!(sleep_until_ms(start + 20));
        assert!(mono_ms() >= start + 20, "woke at {} ms for {}", mono_ms(), start + 20);
        let t = std::time::Instant::now();
        assert!(sleep_until_ms(start), "a deadline already past returns at once");
        assert!(sleep_until_ms(0));
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
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
