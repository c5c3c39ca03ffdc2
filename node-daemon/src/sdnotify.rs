//! systemd notification protocol (sd_notify): one datagram to `$NOTIFY_SOCKET`.

use std::os::unix::net::UnixDatagram;

/// A connection to systemd's notify socket, if the service runs under `Type=notify`.
pub struct Notifier {
    sock: Option<(UnixDatagram, String)>,
    /// Watchdog period from `$WATCHDOG_USEC`, if systemd asked for keep-alives.
    pub watchdog_usec: Option<u64>,
}

impl Notifier {
    /// Connects to `$NOTIFY_SOCKET` if set; reads `$WATCHDOG_USEC` (when `$WATCHDOG_PID` is unset or this process).
    pub fn from_env() -> Notifier {
        let path = std::env::var("NOTIFY_SOCKET")
            .ok()
            .filter(|p| !p.is_empty());
        let sock = path.and_then(|p| UnixDatagram::unbound().ok().map(|s| (s, p)));
        let watchdog_usec = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&v| v > 0);
        let pid_ok = std::env::var("WATCHDOG_PID")
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .is_none_or(|p| p == std::process::id());
        Notifier {
            sock,
            watchdog_usec: if pid_ok { watchdog_usec } else { None },
        }
    }

    /// Sends `state` (e.g. `READY=1`); a missing socket is not an error.
    pub fn notify(&self, state: &str) {
        let Some((s, path)) = &self.sock else { return };
        let r = if let Some(abs) = path.strip_prefix('@') {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(abs.as_bytes())
                .and_then(|a| s.send_to_addr(state.as_bytes(), &a))
        } else {
            s.send_to(state.as_bytes(), path)
        };
        if let Err(e) = r {
            tracing::warn!(socket = %path, error = %e, "sd_notify failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_ready_to_the_socket() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("notify");
        let rx = UnixDatagram::bind(&p).unwrap();
        let n = Notifier {
            sock: Some((UnixDatagram::unbound().unwrap(), p.to_string_lossy().into())),
            watchdog_usec: None,
        };
        n.notify("READY=1\nSTATUS=ok");
        let mut buf = [0u8; 64];
        let k = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..k], b"READY=1\nSTATUS=ok");
    }
}
