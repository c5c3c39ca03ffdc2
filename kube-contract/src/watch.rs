//! How both sides watch the API server: kube-runtime's watcher, with the error handling it
//! lacks, in one loop (the cluster side's pod and node watches, the node agent's watch of its
//! node's pods).
//!
//! Each watch lists, then watches from the list's `resourceVersion` (with bookmarks where the
//! caller asks, so a reconnect resumes from the latest bookmark, not from an expired version).
//! On top of kube-runtime's watcher, which relists itself after a `410 Gone` ERROR event inside
//! a watch stream:
//! - `410 Gone` answered to the watch *request* itself (the resume version expired before the
//!   watch started; kube-runtime would retry the same expired version forever): a fresh
//!   watcher, which relists.
//! - `429 Too Many Requests` (API Priority and Fairness) or 5xx with `retryAfterSeconds`: wait
//!   that long before the next request (kube-runtime would retry at once), at most the
//!   caller's longest backoff.
//! - Anything else: exponential backoff from [`MIN_BACKOFF`], reset by the next event.

use std::time::Duration;

use futures::StreamExt;
use kube::runtime::watcher;
use kube::Api;

/// The first wait after an error (doubled at each error in a row, up to the caller's longest).
pub const MIN_BACKOFF: Duration = Duration::from_millis(200);

/// What to do after a watch error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorPlan {
    /// Start a fresh watcher (relist) instead of resuming.
    pub restart: bool,
    /// Wait this long first.
    pub delay: Duration,
    /// The delay is the server's Retry-After.
    pub server_asked: bool,
}

/// Decides how to go on after `e` (see the module docs); `backoff` is the current
/// exponential delay, `max` the longest wait.
pub fn plan_after_error(e: &watcher::Error, backoff: Duration, max: Duration) -> ErrorPlan {
    let status = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(&**s),
        watcher::Error::WatchError(s) => Some(&**s),
        _ => None,
    };
    let code = status.map_or(0, |s| s.code);
    let retry_after = status
        .and_then(|s| s.details.as_ref())
        .map(|d| d.retry_after_seconds)
        .filter(|s| *s > 0)
        .map(u64::from);
    if code == 410 {
        // Relist at once, as client-go's reflector does: the version is gone for good.
        return ErrorPlan {
            restart: true,
            delay: Duration::ZERO,
            server_asked: false,
        };
    }
    match retry_after {
        Some(s) => ErrorPlan {
            restart: false,
            delay: Duration::from_secs(s).min(max.max(MIN_BACKOFF)),
            server_asked: true,
        },
        None => ErrorPlan {
            restart: false,
            delay: backoff.min(max),
            server_asked: false,
        },
    }
}

/// What a watch loop tells its owner, as it happens.
#[derive(Debug)]
pub enum Seen<'a, K> {
    /// An event of the watch (`Init` starts a list, `InitDone` ends it).
    Event(&'a watcher::Event<K>),
    /// An error, and what the loop does next (logged at WARN by the loop).
    Error(&'a watcher::Error, &'a ErrorPlan),
}

/// Watches `api` with `cfg` for good (stop it by dropping or aborting its task), calling `seen`
/// with every event and error; `what` names the watch in the log, `max_backoff` caps every wait.
pub async fn run<K>(
    api: Api<K>,
    cfg: watcher::Config,
    what: &'static str,
    max_backoff: Duration,
    mut seen: impl FnMut(Seen<'_, K>),
) where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut backoff = MIN_BACKOFF;
    loop {
        // A fresh watcher starts with a list.
        let mut stream = std::pin::pin!(watcher(api.clone(), cfg.clone()));
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => {
                    backoff = MIN_BACKOFF;
                    seen(Seen::Event(&event));
                }
                Err(e) => {
                    let p = plan_after_error(&e, backoff, max_backoff);
                    tracing::warn!(watch = what, error = %e, restart = p.restart, delay_ms = p.delay.as_millis() as u64, "watch error");
                    seen(Seen::Error(&e, &p));
                    if !p.server_asked && !p.restart {
                        backoff = (backoff * 2).min(max_backoff.max(MIN_BACKOFF));
                    }
                    tokio::time::sleep(p.delay).await;
                    if p.restart {
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api_error(code: u16, retry_after_s: u32) -> watcher::Error {
        let mut s = Status::failure("test", "Test").with_code(code);
        if retry_after_s > 0 {
            s.details = Some(serde_json::from_value(serde_json::json!({ "retryAfterSeconds": retry_after_s })).unwrap());
        }
        watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(s)))
    }

    #[test]
    fn gone_relists_at_once_retry_after_is_honoured_and_capped_else_backoff() {
        let (b, max) = (Duration::from_millis(800), Duration::from_secs(30));
        let p = plan_after_error(&api_error(410, 0), b, max);
        assert_eq!(p, ErrorPlan { restart: true, delay: Duration::ZERO, server_asked: false });
        let p = plan_after_error(&api_error(429, 7), b, max);
        assert_eq!(p, ErrorPlan { restart: false, delay: Duration::from_secs(7), server_asked: true });
        let p = plan_after_error(&api_error(503, 3600), b, max);
        assert_eq!(p.delay, max, "a server's Retry-After waits at most the longest backoff");
        let p = plan_after_error(&api_error(500, 0), b, max);
        assert_eq!(p, ErrorPlan { restart: false, delay: b, server_asked: false });
        let p = plan_after_error(&api_error(500, 0), Duration::from_secs(60), max);
        assert_eq!(p.delay, max);
        let p = plan_after_error(&watcher::Error::WatchError(Box::new(Status::failure("gone", "Expired").with_code(410))), b, max);
        assert!(p.restart, "a 410 ERROR event relists too");
    }
}
