//! The MPS servers' `server.log`, read for one thing: the clients a fatal GPU error tore down.
//!
//! After a fatal GPU error (an MPS client killed with kernels in flight: an H200 did it in 12
//! of 20 kills) the server tears its other clients down, and, NVIDIA's MPS docs say
//! (troubleshooting, "Server Recovery"), takes no new client
//! (`CUDA_ERROR_MPS_SERVER_NOT_READY`) until every client it tore down has exited. A torn-down
//! offline process that lingers (one that catches the error and retries, or is stuck) keeps
//! the online service's restarted clients out. The server names each one in its log, as the
//! H200's did: `Client {PID: <pid>} encountered a fatal GPU error ...`; mps-manager asks the
//! offline ones to leave ([`crate::manager::Manager::check`]).
//!
//! Read incrementally and bounded: complete lines appended since the last look, at most
//! [`MAX_READ`] bytes a look. What the file held when the manager first looked is history and
//! skipped (a pid in it may since belong to another process; a file that did not exist then is
//! read whole once it does); a file replaced (log rotation) or truncated to less than was read
//! is read from its start.

use std::io::{Read as _, Seek as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

/// Most bytes read in one look; the rest waits for the next.
pub const MAX_READ: u64 = 256 << 10;

/// What a line says of a client a fatal error tore down.
const FATAL: &str = "encountered a fatal GPU error";
/// Where the line names it.
const CLIENT: &str = "Client {PID: ";

/// The reader's place in `server.log`.
pub struct ServerLog {
    path: PathBuf,
    /// `(st_dev, st_ino, offset)` of the file at the last look; `None` before the first.
    at: Option<(u64, u64, u64)>,
}

impl ServerLog {
    /// A reader of `path` (`<log_dir>/server.log`).
    pub fn new(path: &Path) -> Self {
        ServerLog { path: path.to_owned(), at: None }
    }

    /// The pids of the clients the lines appended since the last look report torn down by a
    /// fatal GPU error, in order, each once. No file, one that is no regular file, or an I/O
    /// error: none (the next look tries again).
    pub fn torn_down(&mut self) -> Vec<u32> {
        let mut f = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&self.path)
        {
            Ok(f) => f,
            Err(e) => {
                // No file at the first look: the one the first server creates is all new.
                if e.kind() == std::io::ErrorKind::NotFound && self.at.is_none() {
                    self.at = Some((0, 0, 0));
                }
                return Vec::new();
            }
        };
        let Ok(m) = f.metadata() else { return Vec::new() };
        if !m.is_file() {
            return Vec::new();
        }
        let (dev, ino, len) = (m.dev(), m.ino(), m.len());
        let from = match self.at {
            None => {
                self.at = Some((dev, ino, len));
                return Vec::new();
            }
            Some((d, i, off)) if d == dev && i == ino && off <= len => off,
            Some(_) => 0,
        };
        let want = (len - from).min(MAX_READ);
        let mut buf = Vec::with_capacity(want as usize);
        if f.seek(std::io::SeekFrom::Start(from)).is_err() || (&mut f).take(want).read_to_end(&mut buf).is_err() {
            return Vec::new();
        }
        // Complete lines only; a line longer than a whole read is skipped.
        let used = match buf.iter().rposition(|&b| b == b'\n') {
            Some(i) => i + 1,
            None if want == MAX_READ => buf.len(),
            None => 0,
        };
        self.at = Some((dev, ino, from + used as u64));
        let mut out = Vec::new();
        for line in String::from_utf8_lossy(&buf[..used]).lines() {
            if let Some(pid) = fatal_client(line) {
                if !out.contains(&pid) {
                    out.push(pid);
                }
            }
        }
        out
    }
}

/// The pid a `server.log` line reports torn down by a fatal GPU error, if it is such a line.
pub fn fatal_client(line: &str) -> Option<u32> {
    if !line.contains(FATAL) {
        return None;
    }
    let rest = &line[line.find(CLIENT)? + CLIENT.len()..];
    let digits = &rest[..rest.find('}')?];
    digits.trim().parse().ok().filter(|&p| p > 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn a_fatal_error_line_names_its_client() {
        let l = "[2026-11-27 14:02:11.123 Server 4242] Client {PID: 5150} encountered a fatal GPU error. The following client process have a sticky error set: 5150";
        assert_eq!(fatal_client(l), Some(5150));
        for other in [
            "[2026-11-27 14:02:11.123 Server 4242] Server failed to recevie command with status 806, assuming client {PID: 77} exit",
            "[2026-11-27 14:02:11.123 Server 4242] Client {PID: 1} encountered a fatal GPU error",
            "Client {PID: x} encountered a fatal GPU error",
            "encountered a fatal GPU error",
        ] {
            assert_eq!(fatal_client(other), None, "{other}");
        }
    }

    /// History is skipped; appended lines are read once, a partial line when it completes; a
    /// rotated (replaced) or truncated file from its start; a link is not followed.
    #[test]
    fn reads_what_is_appended_once_and_follows_rotation() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("server.log");
        let line = |pid: u32| format!("[t Server 1] Client {{PID: {pid}}} encountered a fatal GPU error. x\n");
        std::fs::write(&p, line(100)).unwrap();
        let mut r = ServerLog::new(&p);
        assert!(r.torn_down().is_empty(), "history skipped");
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(line(200).as_bytes()).unwrap();
        f.write_all(b"[t Server 1] Client {PID: 300} encountered a fat").unwrap();
        assert_eq!(r.torn_down(), vec![200]);
        assert!(r.torn_down().is_empty(), "read once");
        f.write_all(b"al GPU error.\n").unwrap();
        f.write_all(line(200).as_bytes()).unwrap();
        assert_eq!(r.torn_down(), vec![300, 200]);
        // Rotated: a new file at the path.
        std::fs::rename(&p, d.path().join("server.log.1")).unwrap();
        std::fs::write(&p, line(400)).unwrap();
        assert_eq!(r.torn_down(), vec![400]);
        // Truncated in place (to less than was read: the only truncation a reader can tell).
        std::fs::OpenOptions::new().write(true).truncate(true).open(&p).unwrap().write_all(line(50).as_bytes()).unwrap();
        assert_eq!(r.torn_down(), vec![50]);
        // A link in its place is not followed.
        std::fs::remove_file(&p).unwrap();
        let elsewhere = d.path().join("elsewhere");
        std::fs::write(&elsewhere, line(600).repeat(2)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &p).unwrap();
        assert!(r.torn_down().is_empty());
    }

    /// No file at the first look: the file the first server creates later is read whole.
    #[test]
    fn a_file_created_after_the_first_look_is_read_whole() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("server.log");
        let mut r = ServerLog::new(&p);
        assert!(r.torn_down().is_empty());
        std::fs::write(&p, "[t Server 1] Client {PID: 900} encountered a fatal GPU error.\n").unwrap();
        assert_eq!(r.torn_down(), vec![900]);
    }

    /// A look reads at most MAX_READ bytes; the rest comes at the next.
    #[test]
    fn a_look_is_bounded() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("server.log");
        std::fs::write(&p, "").unwrap();
        let mut r = ServerLog::new(&p);
        r.torn_down();
        let filler = format!("[t Server 1] {}\n", "x".repeat(1000));
        let mut text = filler.repeat((MAX_READ / 1000) as usize + 10);
        text.push_str("[t Server 1] Client {PID: 700} encountered a fatal GPU error.\n");
        std::fs::write(&p, &text).unwrap();
        let mut seen = Vec::new();
        let mut looks = 0;
        while seen.is_empty() && looks < 10 {
            seen = r.torn_down();
            looks += 1;
        }
        assert_eq!((seen, looks), (vec![700], 2));
    }
}
