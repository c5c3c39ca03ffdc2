//! The durable record of the monitor's evictions, one append-only file per GPU:
//! `<ledger_dir>/evict-log/gpu<N>.jsonl`, one JSON line per eviction request.
//!
//! The ledger slot's `evict_signal` lasts only while the process is registered: a process that
//! exits at once on SIGTERM takes it with it, and whoever reports evictions to the cluster
//! (node-agent's Eviction API worker) would never learn of it. This log outlives the process
//! and the reader's restarts.
//!
//! One writer per file: the GPU's monitor (sysmonitor), which holds the GPU's monitor role.
//! Each record is appended with a single `write(2)` on an `O_APPEND` descriptor, so a reader
//! sees whole lines or an unfinished last line (which it leaves for the next read). Readers
//! keep their own cursor (byte offset) elsewhere. The file sits beside the `gpu<N>`
//! directories, not in them: those are mounted into offline containers, this is not.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Directory of the logs inside the ledger directory.
pub const DIR: &str = "evict-log";

/// Longest line a reader accepts; a longer one is skipped as damaged.
pub const MAX_LINE: usize = 4096;

/// One eviction request, as the monitor wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictRecord {
    /// Host GPU index.
    pub gpu: u32,
    /// Pid in the process's own pid namespace (as registered).
    pub pid: u32,
    /// The process's start time (clock ticks): with `pid`, its identity.
    pub start_time: u64,
    /// Pid-namespace inode of the process.
    pub pid_ns: u64,
    /// Ledger quota group (`group_id_for(XCUDA_GROUP)`): maps the process to its pod.
    pub group_id: u64,
    /// Signal the monitor sends (SIGTERM first).
    pub signal: u32,
    /// Why (`overlimit`, `memory`, ...).
    pub reason: String,
    /// Wall-clock time of the request, ms since the epoch.
    pub unix_ms: u64,
}

/// `<ledger_dir>/evict-log/gpu<N>.jsonl`.
pub fn log_path(ledger_dir: &Path, gpu: u32) -> PathBuf {
    ledger_dir.join(DIR).join(format!("gpu{gpu}.jsonl"))
}

/// Appends `rec` to its GPU's log (creating the directory and file, mode 0644: readable by the
/// node's agents, written only by the monitor).
pub fn append(ledger_dir: &Path, rec: &EvictRecord) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = log_path(ledger_dir, rec.gpu);
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let mut line = serde_json::to_vec(rec).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .open(&path)?;
    // One write: O_APPEND places it whole at the end.
    f.write_all(&line)
}

/// A record read back, with the offset just past its line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Offset of the record's first byte.
    pub offset: u64,
    /// Offset just past its newline (the cursor once it is handled).
    pub end: u64,
    /// The record; `None` for a damaged line (skipped, but it still moves the cursor).
    pub record: Option<EvictRecord>,
}

/// The complete lines of GPU `gpu`'s log from byte `from` on (an unfinished last line is left
/// for the next read; at most `max_bytes` are read per call). A missing log is empty. A log
/// shorter than `from` (replaced) is read from its start.
pub fn read_from(ledger_dir: &Path, gpu: u32, from: u64, max_bytes: u64) -> std::io::Result<Vec<Entry>> {
    let path = log_path(ledger_dir, gpu);
    let mut f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    let from = if from > len { 0 } else { from };
    f.seek(SeekFrom::Start(from))?;
    let mut buf = Vec::new();
    f.take(max_bytes).read_to_end(&mut buf)?;
    let mut out = Vec::new();
    let mut start = 0usize;
    while let Some(nl) = buf[start..].iter().position(|&b| b == b'\n') {
        let line = &buf[start..start + nl];
        let record = if line.len() > MAX_LINE {
            None
        } else {
            serde_json::from_slice(line).ok()
        };
        out.push(Entry {
            offset: from + start as u64,
            end: from + (start + nl + 1) as u64,
            record,
        });
        start += nl + 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(pid: u32) -> EvictRecord {
        EvictRecord {
            gpu: 1,
            pid,
            start_time: 77,
            pid_ns: 4026531836,
            group_id: 9,
            signal: 15,
            reason: "overlimit".into(),
            unix_ms: 1,
        }
    }

    #[test]
    fn appended_records_read_back_from_a_cursor_and_partial_lines_wait() {
        let d = tempfile::tempdir().unwrap();
        assert!(read_from(d.path(), 1, 0, 1 << 20).unwrap().is_empty());
        append(d.path(), &rec(10)).unwrap();
        append(d.path(), &rec(11)).unwrap();
        let all = read_from(d.path(), 1, 0, 1 << 20).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].record.as_ref().unwrap().pid, 10);
        assert_eq!(all[1].offset, all[0].end);
        let rest = read_from(d.path(), 1, all[0].end, 1 << 20).unwrap();
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].record.as_ref().unwrap().pid, 11);
        // An unfinished line (a write in progress) is not read yet; garbage is skipped.
        let p = log_path(d.path(), 1);
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"not json\n{\"gpu\":1").unwrap();
        let more = read_from(d.path(), 1, all[1].end, 1 << 20).unwrap();
        assert_eq!(more.len(), 1);
        assert_eq!(more[0].record, None);
        // A replaced (shorter) log is read from its start.
        std::fs::write(&p, b"").unwrap();
        append(d.path(), &rec(12)).unwrap();
        let again = read_from(d.path(), 1, 10_000, 1 << 20).unwrap();
        assert_eq!(again[0].record.as_ref().unwrap().pid, 12);
    }
}
