//! XID events from a kernel log (`/dev/kmsg` or a log file), for hosts or drivers where NVML
//! event sets are unavailable: lines like `NVRM: Xid (PCI:0000:3b:00): 31, pid=..., ...`.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Follows a log from its end, returning XID codes of new lines.
pub struct XidTail {
    path: PathBuf,
    file: Option<std::fs::File>,
    matcher: Option<String>,
    partial: String,
}

impl XidTail {
    /// Starts at the current end of `path`; `matcher`, when set, must appear in a line (e.g.
    /// `PCI:0000:3b:00` to keep only this GPU's events).
    pub fn open(path: &Path, matcher: Option<String>) -> XidTail {
        let mut t = XidTail {
            path: path.to_path_buf(),
            file: None,
            matcher,
            partial: String::new(),
        };
        t.reopen();
        t
    }

    fn reopen(&mut self) {
        use std::io::Seek;
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.path)
        {
            Ok(mut f) => {
                let _ = f.seek(std::io::SeekFrom::End(0));
                self.file = Some(f);
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot open the XID log");
                self.file = None;
            }
        }
    }

    /// XID codes in lines written since the last call.
    pub fn poll(&mut self) -> Vec<u64> {
        let Some(f) = &mut self.file else {
            return Vec::new();
        };
        let mut buf = [0u8; 8192];
        let mut text = std::mem::take(&mut self.partial);
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
        let complete = text.rfind('\n').map_or(0, |i| i + 1);
        self.partial = text[complete..].to_string();
        text[..complete]
            .lines()
            .filter(|l| self.matcher.as_deref().is_none_or(|m| l.contains(m)))
            .filter_map(parse_xid_line)
            .collect()
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
}
