//! XID events from a kernel log (`/dev/kmsg` or a log file), for hosts or drivers where NVML
//! event sets are unavailable: lines like `NVRM: Xid (PCI:0000:3b:00): 31, pid=..., ...`.
//!
//! Anyone can put text into a kernel log: the kernel's own `segfault at ... in <file>` message
//! names a file the crashing process chose, and a process may write to `/dev/kmsg` or log to
//! syslog under any tag. So a line counts only when the driver's text opens its message, not
//! anywhere in it, and the GPU named between the parentheses is compared whole with
//! `xid_log_match`. `/dev/kmsg` (a character device) is read as kernel records
//! (`prio,seq,ts,flags;message`) and only kernel-facility records count (facility 0; the kernel
//! gives what user space writes there facility 1 or more): it is the one source no
//! unprivileged process can forge. A plain log file (syslog's `kern.log`, a `journalctl -k`
//! export, `dmesg` output) has no facility to check: its lines must have the shape of a kernel
//! line, but a process that logs to syslog with the tag `kernel` can still write one.

use std::io::{Read, Seek};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
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
    /// Whether the open file is a character device (`/dev/kmsg`): its lines are kernel records.
    kmsg: bool,
    matcher: Option<String>,
    partial: String,
    checked: Instant,
    check_every: Duration,
    /// Whether the missing file was reported (once, until it appears).
    missing_said: bool,
}

impl XidTail {
    /// Starts at the current end of `path`; `matcher`, when set, is the GPU's PCI address an
    /// XID line must name (e.g. `PCI:0000:3b:00` to keep only this GPU's events; see
    /// [`pci_matches`]).
    pub fn open(path: &Path, matcher: Option<String>) -> XidTail {
        let mut t = XidTail {
            path: path.to_path_buf(),
            file: None,
            id: None,
            kmsg: false,
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
                let meta = f.metadata().ok();
                self.id = meta
                    .as_ref()
                    .map(|m| (m.dev(), m.ino(), m.file_type().is_file()));
                self.kmsg = meta.is_some_and(|m| m.file_type().is_char_device());
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
        let (kmsg, matcher) = (self.kmsg, self.matcher.as_deref());
        text[..complete]
            .lines()
            .filter_map(|l| {
                let xid = if kmsg {
                    parse_kmsg_record(l)
                } else {
                    parse_log_line(l)
                }?;
                matcher
                    .is_none_or(|m| pci_matches(xid.pci, m))
                    .then_some(xid.code)
            })
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
        let now = std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.dev(), m.ino(), m.len()));
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
                let Some(f) = &mut self.file else {
                    return false;
                };
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

/// The driver's text that opens an XID message.
const XID_PREFIX: &str = "NVRM: Xid (";

/// One XID the driver reported: the GPU between the parentheses and the code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Xid<'a> {
    /// The GPU as the driver names it, e.g. `PCI:0000:3b:00`.
    pub pci: &'a str,
    /// The XID code.
    pub code: u64,
}

/// The XID of a `/dev/kmsg` record (`prio,seq,ts,flags[,...];message`): only a kernel-facility
/// record (prio below 8; the kernel gives records user space writes facility 1 or more) whose
/// message is the driver's (see [`parse_xid_message`]).
pub fn parse_kmsg_record(record: &str) -> Option<Xid<'_>> {
    let (header, message) = record.split_once(';')?;
    let prio: u32 = header.split(',').next()?.parse().ok()?;
    if prio >= 8 {
        return None;
    }
    parse_xid_message(message)
}

/// The XID of a plain kernel-log line: the driver's message alone (as the tests and
/// `dmesg --notime` write it), after a `[  12.345678] ` timestamp (`dmesg`), or after a syslog
/// or journal header that ends in `kernel: ` with no `: ` before it (`Nov 27 10:00:00 host
/// kernel: ...`; a user process's own tag, `app[7]: kernel: ...`, does not pass). A line
/// may open with the `<N>` priority `/proc/kmsg` and `dmesg --raw` give each record
/// (`<4>NVRM: Xid ...`, `<4>[  12.3] NVRM: Xid ...`): only a kernel-facility one (N below 8;
/// what user space writes to `/dev/kmsg` has facility 1 or more) passes.
pub fn parse_log_line(line: &str) -> Option<Xid<'_>> {
    let mut rest = line;
    if let Some(tagged) = rest.strip_prefix('<') {
        let (prio, message) = tagged.split_once('>')?;
        if prio.is_empty() || !prio.chars().all(|c| c.is_ascii_digit()) || prio.parse::<u32>().map_or(true, |p| p >= 8) {
            return None;
        }
        rest = message;
        if let Some(stamped) = rest.strip_prefix('[') {
            rest = stamped.split_once("] ")?.1;
        }
        return parse_xid_message(rest);
    }
    if !rest.starts_with(XID_PREFIX) && !rest.starts_with('[') {
        let (header, message) = rest.split_once("kernel: ")?;
        if header.contains(": ") || !(header.is_empty() || header.ends_with(' ')) {
            return None;
        }
        rest = message;
    }
    if let Some(stamped) = rest.strip_prefix('[') {
        rest = stamped.split_once("] ")?.1;
    }
    parse_xid_message(rest)
}

/// The XID of a driver message, which must open with `NVRM: Xid (<gpu>): <code>` (anything
/// else, the same text further into a message included, is not the driver's XID report).
pub fn parse_xid_message(message: &str) -> Option<Xid<'_>> {
    let rest = message.strip_prefix(XID_PREFIX)?;
    let (pci, after) = rest.split_once("): ")?;
    if pci.is_empty()
        || !pci
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == ':' || c == '.')
    {
        return None;
    }
    let digits = after.split(|c: char| !c.is_ascii_digit()).next()?;
    Some(Xid {
        pci,
        code: digits.parse().ok()?,
    })
}

/// Whether the driver's GPU name `pci` (`PCI:0000:3b:00`, or `0000:3b:00` from older drivers)
/// is the address `matcher` (`xid_log_match`, in any form [`parse_pci`] takes, e.g. NVML's
/// `00000000:3B:00.0`): domain, bus and device compared as numbers; the function, which the
/// driver's line does not name, is not compared. A name that is no such address is compared
/// whole, the letters' case aside.
pub fn pci_matches(pci: &str, matcher: &str) -> bool {
    match (parse_pci(pci), parse_pci(matcher)) {
        (Some(a), Some(b)) => a.0 == b.0,
        _ => bare_pci(pci).eq_ignore_ascii_case(bare_pci(matcher)),
    }
}

/// A GPU's address without its `PCI:` tag (any case).
fn bare_pci(s: &str) -> &str {
    match s.get(..4) {
        Some(tag) if tag.eq_ignore_ascii_case("PCI:") => &s[4..],
        _ => s,
    }
}

/// A PCI bus address, hex, any case: an optional `PCI:` tag, a domain of 4 to 8 digits (the
/// driver's XID lines write 4, `nvidia-smi` and NVML 8), 2 of bus, 2 of device, and an optional
/// `.F` function (`PCI:0000:3b:00`, `00000000:3B:00.0`). Returns ((domain, bus, device),
/// function); `None` for anything else.
pub fn parse_pci(s: &str) -> Option<((u32, u8, u8), Option<u8>)> {
    let rest = bare_pci(s);
    let (addr, func) = match rest.split_once('.') {
        Some((a, f)) => (a, Some(f)),
        None => (rest, None),
    };
    let hex = |t: &str, lens: std::ops::RangeInclusive<usize>| {
        (lens.contains(&t.len()) && t.chars().all(|c| c.is_ascii_hexdigit())).then(|| u32::from_str_radix(t, 16).ok()).flatten()
    };
    let mut parts = addr.split(':');
    let (d, b, v) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let func = match func {
        Some(f) => Some(u8::try_from(hex(f, 1..=1)?).ok().filter(|&f| f < 8)?),
        None => None,
    };
    let bus = u8::try_from(hex(b, 2..=2)?).ok()?;
    let dev = u8::try_from(hex(v, 2..=2)?).ok().filter(|&v| v < 32)?;
    Some(((hex(d, 4..=8)?, bus, dev), func))
}

/// Whether `matcher` is a PCI address, for `xid_log_match`: the driver's form in XID lines
/// (`PCI:0000:3b:00`) or NVML's / `nvidia-smi`'s (`00000000:3B:00.0`); see [`parse_pci`].
pub fn valid_match(matcher: &str) -> bool {
    parse_pci(matcher).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn parses_driver_lines() {
        let code = |l| parse_log_line(l).map(|x| x.code);
        assert_eq!(
            parse_log_line(
                "[ 12.3] NVRM: Xid (PCI:0000:3b:00): 31, pid=77, name=python, Ch 00000010"
            ),
            Some(Xid {
                pci: "PCI:0000:3b:00",
                code: 31
            })
        );
        assert_eq!(
            code("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."),
            Some(79)
        );
        assert_eq!(
            code("Nov 27 10:00:00 host kernel: [ 12.3] NVRM: Xid (PCI:0000:01:00): 48, pid=1"),
            Some(48)
        );
        assert_eq!(
            code("2026-11-27T10:00:00.1+00:00 host kernel: NVRM: Xid (PCI:0000:01:00): 64, x"),
            Some(64)
        );
        assert_eq!(
            parse_kmsg_record(
                "4,1234,5678,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
            ),
            Some(Xid {
                pci: "PCI:0000:3b:00",
                code: 79
            })
        );
        assert_eq!(code("NVRM: GPU at PCI:0000:01:00: GPU-abc"), None);
        assert_eq!(code("NVRM: Xid (PCI:0000:01:00): garbage"), None);
        assert!(pci_matches("PCI:0000:3B:00", "0000:3b:00"));
        assert!(pci_matches("0000:3b:00", "PCI:0000:3b:00"));
        assert!(!pci_matches("PCI:0000:3b:00", "3b:00"));
        assert!(!pci_matches("PCI:0000:3b:00x", "PCI:0000:3b:00"));
        assert!(valid_match("PCI:0000:3b:00") && valid_match("0000:3B:00"));
        assert!(!pci_matches("PCI:0000:3b:00", "0000:3c:00"));
        assert!(!valid_match("3b:00") && !valid_match(""));
    }

    /// A user chooses the file name the kernel's segfault message prints, and may write to
    /// `/dev/kmsg` (facility 1 or more) or log to syslog under a tag of its own: none of it is a
    /// driver XID. Before, any line containing `NVRM: Xid` and the match text counted, and a
    /// crashing process in a file named `NVRM: Xid (PCI:0000:3b:00): 79, forged` disabled the
    /// GPU.
    #[test]
    fn forged_xid_lines_are_not_xids() {
        let segv = "seg[13821]: segfault at 0 ip 0000 sp 0000 error 14 in \
                    NVRM: Xid (PCI:0000:3b:00): 79, forged[55d0+1000]";
        assert_eq!(parse_log_line(segv), None);
        assert_eq!(parse_kmsg_record(&format!("6,901,5678,-;{segv}")), None);
        assert_eq!(
            parse_log_line(&format!("Nov 27 10:00:00 host kernel: [ 9.1] {segv}")),
            None
        );
        let named = "seg[1]: segfault at 0 in kernel: NVRM: Xid (PCI:0000:3b:00): 79[55d0+1000]";
        assert_eq!(parse_log_line(named), None);
        // Written to /dev/kmsg by user space: facility 1 (prio 8..15) or more.
        let user =
            "12,902,5679,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.";
        assert_eq!(parse_kmsg_record(user), None);
        assert_eq!(
            parse_kmsg_record("NVRM: Xid (PCI:0000:3b:00): 79, no record header"),
            None
        );
        assert_eq!(
            parse_log_line("Nov 27 10:00:00 host app[7]: kernel: NVRM: Xid (PCI:0000:3b:00): 79"),
            None
        );
        assert_eq!(
            parse_log_line("Nov 27 10:00:00 host xkernel: NVRM: Xid (PCI:0000:3b:00): 79"),
            None
        );
        // The match names the GPU between the parentheses, whole.
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("kern.log");
        std::fs::write(&p, "").unwrap();
        let mut t = XidTail::open(&p, Some("PCI:0000:3b:00".into()));
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        writeln!(f, "{segv}\nNVRM: Xid (PCI:0000:3b:001): 79, another\nNVRM: Xid (PCI:0000:3b:00): 48, real").unwrap();
        assert_eq!(t.poll(), vec![48]);
        // Read as /dev/kmsg records (what a character device gets): user records do not count.
        t.kmsg = true;
        writeln!(
            f,
            "{user}\n6,903,5680,-;{segv}\n3,904,5681,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=2"
        )
        .unwrap();
        assert_eq!(t.poll(), vec![79]);
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
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)
                .unwrap();
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
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(0)
            .unwrap();
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

    /// `xid_log_match` as operators copy it from `nvidia-smi` / NVML (8-digit domain, function,
    /// upper case) matches the driver's real XID line, which writes a 4-digit domain and no
    /// function; before, such a match was refused at load and the monitor did not start.
    #[test]
    fn nvml_bus_ids_match_the_drivers_lines() {
        let line = "[ 12.3] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.";
        let xid = parse_log_line(line).unwrap();
        for m in ["00000000:3B:00.0", "PCI:00000000:3b:00.0", "pci:0000:3B:00", "0000:3b:00.0", "PCI:0000:3b:00"] {
            assert!(valid_match(m), "{m}");
            assert!(pci_matches(xid.pci, m), "{m}");
        }
        for m in ["00000000:3C:00.0", "00000001:3B:00.0", "0000:3b:01"] {
            assert!(valid_match(m) && !pci_matches(xid.pci, m), "{m}");
        }
        for bad in ["3b:00", "3B:00.0", "000:3b:00", "000000000:3b:00", "0000:3b:00.8", "0000:3b:00.", "0000:3b:20",
            "0000:3b:0", "0000:3b:00:0", "GPU-abc", "NVRM", "", "PCI:", "0000:3g:00"] {
            assert!(!valid_match(bad), "{bad}");
        }
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("kern.log");
        std::fs::write(&p, "").unwrap();
        let mut t = XidTail::open(&p, Some("00000000:3B:00.0".into()));
        std::fs::write(&p, format!("{line}\nNVRM: Xid (PCI:0000:3c:00): 48, other gpu\n")).unwrap();
        assert_eq!(t.poll(), vec![79]);
    }

    /// `/proc/kmsg` and `dmesg --raw` open each record with its `<N>` priority: a kernel one
    /// (N below 8) is read, one user space wrote (facility 1 or more: N of 8 or more) is not.
    #[test]
    fn kernel_priority_prefixes_are_read_and_user_ones_refused() {
        let code = |l: &str| parse_log_line(l).map(|x| x.code);
        assert_eq!(code("<4>NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."), Some(79));
        assert_eq!(code("<0>[   12.345678] NVRM: Xid (PCI:0000:3b:00): 48, x"), Some(48));
        assert_eq!(code("<7>NVRM: Xid (PCI:0000:3b:00): 13, x"), Some(13));
        for bad in ["<8>NVRM: Xid (PCI:0000:3b:00): 79, x", "<12>NVRM: Xid (PCI:0000:3b:00): 79, x", "<14>[ 1.0] NVRM: Xid (PCI:0000:3b:00): 79",
            "<>NVRM: Xid (PCI:0000:3b:00): 79", "<x>NVRM: Xid (PCI:0000:3b:00): 79", "<4>app: NVRM: Xid (PCI:0000:3b:00): 79",
            "<4 NVRM: Xid (PCI:0000:3b:00): 79"] {
            assert_eq!(code(bad), None, "{bad}");
        }
    }
}
