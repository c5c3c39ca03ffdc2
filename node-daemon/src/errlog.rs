//! Rate limit for the log lines of a periodic operation that keeps failing: NVML gone (a driver
//! reload, a GPU off the bus, a wrong `gpu_index`) fails every sample, an unwritable state
//! directory (read-only, full) every state-file write. One line when a run of failures starts,
//! one when its error changes, a reminder every [`REMIND_MS`] and one when the operation works
//! again, instead of a line at every try (a hundred a second at 10 ms sampling).

/// How often a run of failures is logged again at most while its error stays the same, ms.
pub const REMIND_MS: u64 = 60_000;

/// What to log about one try, decided by [`ErrorRun`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Say {
    /// Nothing.
    Quiet,
    /// A failure: the first of a run, one whose error differs from the last logged, or a
    /// reminder; with the failures of the run so far and how long it has lasted, ms.
    Failed {
        /// Failures in the run, this one included.
        errors: u64,
        /// Since the run's first failure, ms.
        for_ms: u64,
    },
    /// The first success after a run of `errors` failures that lasted `for_ms`.
    Recovered {
        /// Failures in the run.
        errors: u64,
        /// From the run's first failure to this success, ms.
        for_ms: u64,
    },
}

/// The current run of failures of one operation (see the module text).
#[derive(Debug, Default)]
pub struct ErrorRun {
    /// When the run began, its failures, the error last logged, when the next reminder is due.
    run: Option<(u64, u64, String, u64)>,
}

impl ErrorRun {
    /// A failure with `error` at `now_ms` (monotonic).
    pub fn failed(&mut self, now_ms: u64, error: &str) -> Say {
        let reminder = now_ms.saturating_add(REMIND_MS);
        match &mut self.run {
            None => {
                self.run = Some((now_ms, 1, error.to_string(), reminder));
                Say::Failed { errors: 1, for_ms: 0 }
            }
            Some((since, n, logged, next)) => {
                *n += 1;
                if logged.as_str() == error && now_ms < *next {
                    return Say::Quiet;
                }
                if logged.as_str() != error {
                    *logged = error.to_string();
                }
                *next = reminder;
                Say::Failed { errors: *n, for_ms: now_ms.saturating_sub(*since) }
            }
        }
    }

    /// A success at `now_ms`: ends the run, if one was going.
    pub fn ok(&mut self, now_ms: u64) -> Say {
        match self.run.take() {
            None => Say::Quiet,
            Some((since, n, ..)) => Say::Recovered { errors: n, for_ms: now_ms.saturating_sub(since) },
        }
    }

    /// Whether a run of failures is going on.
    pub fn failing(&self) -> bool {
        self.run.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Failing at every 10 ms try for 2.5 minutes: a line when the run starts, one when its
    /// error changes, a reminder a minute, and one when it works again, each with the failures
    /// so far; the next run starts afresh.
    #[test]
    fn a_run_of_failures_is_logged_at_its_start_changes_each_minute_and_end() {
        use Say::{Failed, Quiet, Recovered};
        let mut l = ErrorRun::default();
        let mut lines = Vec::new();
        for i in 0..15_000u64 {
            let e = if i < 100 { "NVML unavailable: driver not loaded" } else { "NVML unavailable: GPU is lost" };
            let out = l.failed(i * 10, e);
            if out != Quiet {
                lines.push((i * 10, out));
            }
        }
        assert_eq!(
            lines,
            vec![
                (0, Failed { errors: 1, for_ms: 0 }),
                (1000, Failed { errors: 101, for_ms: 1000 }),
                (61_000, Failed { errors: 6101, for_ms: 61_000 }),
                (121_000, Failed { errors: 12_101, for_ms: 121_000 }),
            ]
        );
        assert!(l.failing());
        assert_eq!(l.ok(150_000), Recovered { errors: 15_000, for_ms: 150_000 });
        assert!(!l.failing());
        assert_eq!(l.ok(150_010), Quiet);
        assert_eq!(l.failed(150_020, "x"), Failed { errors: 1, for_ms: 0 });
    }
}
