//! XID events from a kernel log (`/dev/kmsg` or a log file), for hosts or drivers where NVML
//! event sets are unavailable: lines like `NVRM: Xid (PCI:0000:3b:00): 31, pid=..., ...`.

use std::io::{Read, Seek};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often the path is compared with the open file (a `stat`), for a rotated or truncated log.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Follows a log from its end, returning XID codes of new lines. A log file rotated under it
/// (renamed and created anew, logrotate's default), truncated in place (`copytruncate`), or
/// missing at start and created later is followed on: the rest of the old file is read, then
/// the new one from its beginning. Looked at once a second at most.
pub struct XidTail {
    path: PathBuf,
    file: Option<std::fs::File>,
    /// `(st_dev, st_ino)` of the open file, and whether it is a regular file (a device such as
    /// `/dev/kmsg` is never rotated or truncated).
    id: Option<(u64, u64, bool)>,
    matcher: Option<String>,
    partial: String,
    checked: Instant,
    check_every: Duration,
    /// Whether the missing file was reported (once, until it appears).
    missing_said: bool,
}

impl XidTail {
    /// Starts at the current end of `path`; `matcher`, when set, must appear in a line (e.g.
    /// `PCI:0000:3b:00` to keep only this GPU's events).
    pub fn open(path: &Path, matcher: Option<String>) -> XidTail {
        let mut t = XidTail {
            path: path.to_path_buf(),
            file: None,
            id: None,
            matcher,
            partial: String::new(),
            checked: Instant::now(),
            check_every: CHECK_EVERY,
            missing_said: false,
        };
        t.reopen(true);
        t
    }

    /// Opens the path: at its end (`at_end`: what was there before the monitor started is
    /// history) or at its beginning (a file created since: every line of it is new).
    fn reopen(&mut self, at_end: bool) {
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.path)
        {
            Ok(mut f) => {
                if at_end {
                    let _ = f.seek(std::io::SeekFrom::End(0));
                }
                self.id = f.metadata().ok().map(|m| (m.dev(), m.ino(), m.file_type().is_file()));
                self.file = Some(f);
                self.partial.clear();
                if std::mem::take(&mut self.missing_said) {
                    tracing::info!(path = %self.path.display(), "XID log found; following it");
                }
            }
            Err(e) => {
                if !std::mem::replace(&mut self.missing_said, true) {
                    tracing::warn!(path = %self.path.display(), error = %e, "cannot open the XID log; looking again every second");
                }
                self.file = None;
                self.id = None;
            }
        }
    }

    /// XID codes in lines written since the last call.
    pub fn poll(&mut self) -> Vec<u64> {
        let mut text = std::mem::take(&mut self.partial);
        self.read_into(&mut text);
        if self.checked.elapsed() >= self.check_every {
            self.checked = Instant::now();
            if self.follow() {
                // What was left of the old file's last line never ends.
                text = match text.rfind('\n') {
                    Some(i) => text[..=i].to_string(),
                    None => String::new(),
                };
                self.read_into(&mut text);
            }
        }
        let complete = text.rfind('\n').map_or(0, |i| i + 1);
        self.partial = text[complete..].to_string();
        text[..complete]
            .lines()
            .filter(|l| self.matcher.as_deref().is_none_or(|m| l.contains(m)))
            .filter_map(parse_xid_line)
            .collect()
    }

    /// Reads what the open file has past the position into `text` (at most about 1 MiB).
    fn read_into(&mut self, text: &mut String) {
        let Some(f) = &mut self.file else { return };
        let mut buf = [0u8; 8192];
        loop {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(k) => text.push_str(&String::from_utf8_lossy(&buf[..k])),
                // /dev/kmsg: EAGAIN at the end; EPIPE when records were overwritten.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(_) => break,
            }
            if text.len() > 1 << 20 {
                break;
            }
        }
    }

    /// Compares the path with the open file: a new file there (rotated, or created after a
    /// missing one) is opened from its beginning, a regular file shorter than the position
    /// (truncated in place) is read again from its beginning. Returns whether to read again.
    fn follow(&mut self) -> bool {
        let now = std::fs::metadata(&self.path).ok().map(|m| (m.dev(), m.ino(), m.len()));
        match (now, self.id) {
            // Gone (between a rename and the new file): the old file is read to its end.
            (None, _) => {
                if self.file.is_none() {
                    self.reopen(false);
                }
                false
            }
            (Some((dev, ino, _)), Some((d, i, _))) if (dev, ino) != (d, i) => {
                tracing::info!(path = %self.path.display(), "XID log rotated; following the new file");
                self.reopen(false);
                true
            }
            (Some((_, _, len)), Some((_, _, true))) => {
                let Some(f) = &mut self.file else { return false };
                let truncated = f.stream_position().is_ok_and(|pos| len < pos);
                if truncated {
                    tracing::info!(path = %self.path.display(), "XID log truncated; reading it from its beginning");
                    let _ = f.seek(std::io::SeekFrom::Start(0));
                }
                truncated
            }
            (Some(_), Some(_)) => false,
            (Some(_), None) => {
                self.reopen(false);
                self.file.is_some()
            }
        }
    }
}

/// The XID code of an `NVRM: Xid (...): <code>, ...` line.
pub fn parse_xid_line(line: &str) -> Option<u64> {
    let rest = &line[line.find("NVRM: Xid")? + "NVRM: Xid".len()..];
    let after = match rest.find("):") {
        Some(i) => &rest[i + 2..],
        None => rest.trim_start().strip_prefix(':')?,
    };
    after
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn parses_driver_lines() {
        assert_eq!(
            parse_xid_line(
                "[ 12.3] NVRM: Xid (PCI:0000:3b:00): 31, pid=77, name=python, Ch 00000010"
            ),
            Some(31)
        );
        assert_eq!(
            parse_xid_line(
                "6,1234,5678,-;NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."
            ),
            Some(79)
        );
        assert_eq!(parse_xid_line("NVRM: GPU at PCI:0000:01:00: GPU-abc"), None);
        assert_eq!(parse_xid_line("NVRM: Xid (PCI:0000:01:00): garbage"), None);
    }

    #[test]
    fn follows_new_lines_only_and_filters() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("kern.log");
        std::fs::write(&p, "NVRM: Xid (PCI:0000:01:00): 13, old\n").unwrap();
        let mut t = XidTail::open(&p, Some("PCI:0000:01:00".into()));
        assert!(t.poll().is_empty(), "history before start is ignored");
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        write!(f, "NVRM: Xid (PCI:0000:01:00): 31, pid=1\nNVRM: Xid (PCI:0000:02:00): 79, other gpu\nNVRM: Xid (PCI:0000:01:00): 4").unwrap();
        assert_eq!(t.poll(), vec![31]);
        writeln!(f, "8, half line completed").unwrap();
        assert_eq!(t.poll(), vec![48]);
    }

    /// Rotated (renamed, a new file created: logrotate's default), truncated in place
    /// (`copytruncate`), or missing at start: the XIDs written afterwards are all seen. Before,
    /// the monitor read the old file for ever (or nothing), and missed every later XID.
    #[test]
    fn a_rotated_truncated_or_late_log_is_followed() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("kern.log");
        let append = |line: &str| {
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&p).unwrap();
            writeln!(f, "{line}").unwrap();
        };
        append("NVRM: Xid (PCI:0000:01:00): 13, old");
        let mut t = XidTail::open(&p, None);
        t.check_every = Duration::ZERO;
        assert!(t.poll().is_empty());
        // Rotated: a last line in the old file, then lines in the new one.
        append("NVRM: Xid (PCI:0000:01:00): 31, last of the old file");
        std::fs::rename(&p, d.path().join("kern.log.1")).unwrap();
        append("NVRM: Xid (PCI:0000:01:00): 48, first of the new file");
        assert_eq!(t.poll(), vec![31, 48]);
        append("NVRM: Xid (PCI:0000:01:00): 79, next");
        assert_eq!(t.poll(), vec![79]);
        // Truncated in place, then written again.
        std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(0).unwrap();
        append("NVRM: Xid (PCI:0000:01:00): 62, after truncation");
        assert_eq!(t.poll(), vec![62]);
        // Missing at start, created later.
        let q = d.path().join("late.log");
        let mut late = XidTail::open(&q, None);
        late.check_every = Duration::ZERO;
        assert!(late.poll().is_empty());
        std::fs::write(&q, "NVRM: Xid (PCI:0000:01:00): 64, once there\n").unwrap();
        assert_eq!(late.poll(), vec![64]);
    }
}
