//! Backoff of a request a loop repeats after errors (a node agent's pod list, its heartbeat):
//! exponential from a first delay up to a cap, the server's `retryAfterSeconds` when its
//! `Status` gives one (API Priority and Fairness' 429, a PodDisruptionBudget's; kube-rs exposes
//! the body, not the `Retry-After` header), capped too; an error is said once until another
//! one, or a success, comes. Time is the caller's (any instant type), so the rule is tested
//! without a clock.

use std::ops::Add;
use std::time::Duration;

/// The server's wait from a failed request's `Status` (`details.retryAfterSeconds`, > 0).
pub fn retry_after(e: &kube::Error) -> Option<Duration> {
    match e {
        kube::Error::Api(s) => s
            .details
            .as_ref()
            .map(|d| d.retry_after_seconds)
            .filter(|s| *s > 0)
            .map(|s| Duration::from_secs(u64::from(s))),
        _ => None,
    }
}

/// What [`Backoff::failed`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// No request before this long.
    pub delay: Duration,
    /// The delay is the server's.
    pub server_asked: bool,
    /// A new error (not the one said last): say it.
    pub say: bool,
}

/// The backoff state of one repeated request; `T` is the caller's instant.
#[derive(Debug, Clone)]
pub struct Backoff<T> {
    first: Duration,
    max: Duration,
    next_delay: Duration,
    not_before: Option<T>,
    said: Option<String>,
}

impl<T: Copy + Ord + Add<Duration, Output = T>> Backoff<T> {
    /// Delays from `first`, doubling, at most `max` (also the cap on a server's wait).
    pub fn new(first: Duration, max: Duration) -> Self {
        let max = max.max(first);
        Self { first, max, next_delay: first, not_before: None, said: None }
    }

    /// Whether the request may go at `now`.
    pub fn ready(&self, now: T) -> bool {
        self.not_before.is_none_or(|t| now >= t)
    }

    /// The request failed at `now` with `error` (its text decides whether it is new); the
    /// server asked for `retry_after`, if it did.
    pub fn failed(&mut self, now: T, error: &str, retry_after: Option<Duration>) -> Failure {
        let (delay, server_asked) = match retry_after {
            Some(d) => (d.min(self.max), true),
            None => {
                let d = self.next_delay;
                self.next_delay = (d * 2).min(self.max);
                (d, false)
            }
        };
        self.not_before = Some(now + delay);
        let say = self.said.as_deref() != Some(error);
        if say {
            self.said = Some(error.to_string());
        }
        Failure { delay, server_asked, say }
    }

    /// The request succeeded: the next error waits `first` again. Returns whether an error
    /// had been said (so the caller can say it recovered).
    pub fn succeeded(&mut self) -> bool {
        self.next_delay = self.first;
        self.not_before = None;
        self.said.take().is_some()
    }

    /// No request before `t` (a pace between successful requests).
    pub fn hold_until(&mut self, t: T) {
        self.not_before = Some(self.not_before.map_or(t, |n| n.max(t)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Milliseconds as the instant: no clock.
    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn errors_back_off_doubling_to_the_cap_the_server_s_wait_wins_and_each_error_is_said_once() {
        let mut b: Backoff<Duration> = Backoff::new(ms(200), ms(1000));
        assert!(b.ready(ms(0)));
        let f = b.failed(ms(0), "500 etcd timeout", None);
        assert_eq!(f, Failure { delay: ms(200), server_asked: false, say: true });
        assert!(!b.ready(ms(199)) && b.ready(ms(200)));
        assert_eq!(b.failed(ms(200), "500 etcd timeout", None), Failure { delay: ms(400), server_asked: false, say: false });
        assert_eq!(b.failed(ms(600), "500 etcd timeout", None).delay, ms(800));
        assert_eq!(b.failed(ms(1400), "500 etcd timeout", None).delay, ms(1000), "capped");
        // A 429 with the server's wait: that wait (capped), and said, being another error.
        let f = b.failed(ms(2400), "429 too many requests", Some(Duration::from_secs(600)));
        assert_eq!(f, Failure { delay: ms(1000), server_asked: true, say: true });
        assert!(!b.ready(ms(3399)) && b.ready(ms(3400)));
        let f = b.failed(ms(3400), "429 too many requests", Some(ms(300)));
        assert_eq!((f.delay, f.say), (ms(300), false));
        // A success resets the delay and reports that an error had been said.
        assert!(b.succeeded());
        assert!(!b.succeeded());
        assert!(b.ready(ms(3400)));
        assert_eq!(b.failed(ms(4000), "500 etcd timeout", None), Failure { delay: ms(200), server_asked: false, say: true });
        // A pace between successes.
        b.succeeded();
        b.hold_until(ms(9000));
        assert!(!b.ready(ms(8999)) && b.ready(ms(9000)));
    }

    #[test]
    fn the_server_s_wait_is_read_from_the_status_details() {
        let mut s = kube::core::Status::failure("too many requests", "TooManyRequests").with_code(429);
        assert_eq!(retry_after(&kube::Error::Api(Box::new(s.clone()))), None);
        s.details = Some(serde_json::from_value(serde_json::json!({"retryAfterSeconds": 7})).unwrap());
        assert_eq!(retry_after(&kube::Error::Api(Box::new(s.clone()))), Some(Duration::from_secs(7)));
        s.details = Some(serde_json::from_value(serde_json::json!({"retryAfterSeconds": 0})).unwrap());
        assert_eq!(retry_after(&kube::Error::Api(Box::new(s))), None);
    }
}
