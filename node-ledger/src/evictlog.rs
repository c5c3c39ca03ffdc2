//! The durable record of the monitor's evictions, one append-only log per GPU:
//! `<ledger_dir>/evict-log/gpu<N>.jsonl`, one JSON line per eviction request, rotated by size.
//!
//! A request in the status file's eviction tables lasts only while the process is registered
//! (the daemons withdraw the requests of processes gone): a process that
//! exits at once on SIGTERM takes it with it, and whoever reports evictions to the cluster
//! (node-agent's Eviction API worker) would never learn of it. This log outlives the process
//! and the reader's restarts.
//!
//! One writer per file: the GPU's monitor (sysmonitor), which holds the GPU's monitor role.
//! Each record is appended with a single `write(2)` on an `O_APPEND` descriptor, so a reader
//! sees whole lines or an unfinished last line (which it leaves for the next read). The file
//! sits beside the `gpu<N>` directories, not in them: those are mounted into offline
//! containers, this is not.
//!
//! **Generations and rotation.** Every log file starts with a header line naming its
//! generation (`{"xshare_evict_log":1,"generation":G}`). Before an append would take the live
//! file past [`Rotation::max_bytes`], the writer renames it to `gpu<N>.<G>.jsonl` (a rename
//! keeps the inode, so a reader holding it open still reads it whole), deletes the rotated
//! generations older than the last [`Rotation::keep`], and installs a fresh live file of
//! generation `G+1` (written aside, then renamed in, so it never appears without its header).
//! Rotated files are never written again.
//!
//! **Readers** keep their own cursor elsewhere: a [`Pos`] (generation, byte offset in that
//! generation's file). [`read_from`] finds the generation wherever it is now (live or rotated),
//! finishes it, and goes on through the newer ones, so a rotation between two reads loses and
//! repeats nothing, and a cursor saved to disk survives a reader's restart. Everything that
//! would make a cursor meaningless fails loudly with a [`LogError`] naming the file instead of
//! silently re-reading or skipping: a file shorter than the cursor (truncated or replaced), a
//! generation deleted before it was read (the reader fell more than `keep` files behind), a
//! cursor ahead of the newest generation, a missing or damaged header.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Directory of the logs inside the ledger directory.
pub const DIR: &str = "evict-log";

/// Longest line a reader accepts; a longer one is skipped as damaged.
pub const MAX_LINE: usize = 4096;

/// Default size bound of the live file before it is rotated: 1 MiB (about 4,000 records).
pub const DEFAULT_MAX_BYTES: u64 = 1 << 20;
/// Smallest accepted [`Rotation::max_bytes`]: 16 KiB (a few longest lines).
pub const MIN_MAX_BYTES: u64 = 16 << 10;
/// Largest accepted [`Rotation::max_bytes`]: 1 GiB.
pub const MAX_MAX_BYTES: u64 = 1 << 30;
/// Default number of rotated generations kept besides the live file.
pub const DEFAULT_KEEP: u32 = 4;
/// Largest accepted [`Rotation::keep`].
pub const MAX_KEEP: u32 = 1000;

/// How the writer bounds the log: at most `max_bytes` per file, `keep` rotated files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Rotation {
    /// Size bound of one file, bytes ([`MIN_MAX_BYTES`]..=[`MAX_MAX_BYTES`]).
    pub max_bytes: u64,
    /// Rotated generations kept besides the live file (1..=[`MAX_KEEP`]).
    pub keep: u32,
}

impl Default for Rotation {
    fn default() -> Self {
        Rotation {
            max_bytes: DEFAULT_MAX_BYTES,
            keep: DEFAULT_KEEP,
        }
    }
}

impl Rotation {
    /// Range checks; `Err((field, message))` with the field relative to this section.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if !(MIN_MAX_BYTES..=MAX_MAX_BYTES).contains(&self.max_bytes) {
            return Err((
                "max_bytes".into(),
                format!(
                    "must be within {MIN_MAX_BYTES}..={MAX_MAX_BYTES} bytes, got {}",
                    self.max_bytes
                ),
            ));
        }
        if !(1..=MAX_KEEP).contains(&self.keep) {
            return Err((
                "keep".into(),
                format!("must be within 1..={MAX_KEEP}, got {}", self.keep),
            ));
        }
        Ok(())
    }
}

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
    /// The process's pod, when the monitor found it by the process's cgroup (work running
    /// without the shim has no ledger group to map it by). Absent in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
}

/// The first line of every log file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    xshare_evict_log: u32,
    generation: u64,
    /// Final length of the previous generation's file (absent for the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prev_len: Option<u64>,
}

/// A file's header, read back.
struct HeaderInfo {
    generation: u64,
    len: u64,
    prev_len: Option<u64>,
}

/// A place in the log: a generation and a byte offset in that generation's file (0: its
/// start, before the header). Ordered by generation, then offset.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Pos {
    /// Generation of the file.
    pub generation: u64,
    /// Byte offset in it.
    pub offset: u64,
}

/// `<ledger_dir>/evict-log/gpu<N>.jsonl`: the live file.
pub fn log_path(ledger_dir: &Path, gpu: u32) -> PathBuf {
    ledger_dir.join(DIR).join(format!("gpu{gpu}.jsonl"))
}

/// `<ledger_dir>/evict-log/gpu<N>.<G>.jsonl`: generation `G` once rotated.
pub fn generation_path(ledger_dir: &Path, gpu: u32, generation: u64) -> PathBuf {
    ledger_dir
        .join(DIR)
        .join(format!("gpu{gpu}.{generation}.jsonl"))
}

/// The rotated generations of GPU `gpu`'s log present now, oldest first.
pub fn rotated_generations(ledger_dir: &Path, gpu: u32) -> std::io::Result<Vec<u64>> {
    let prefix = format!("gpu{gpu}.");
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(ledger_dir.join(DIR)) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for e in rd {
        let name = e?.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(g) = name
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix(".jsonl"))
        else {
            continue;
        };
        if let Ok(g) = g.parse::<u64>() {
            out.push(g);
        }
    }
    out.sort_unstable();
    Ok(out)
}

fn header_line(generation: u64, prev_len: Option<u64>) -> Vec<u8> {
    let mut h = serde_json::to_vec(&Header {
        xshare_evict_log: 1,
        generation,
        prev_len,
    })
    .expect("header serializes");
    h.push(b'\n');
    h
}

/// Reads and checks the header of an open log file.
fn read_header(f: &std::fs::File, path: &Path) -> Result<HeaderInfo, LogError> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 128];
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(LogError::io(path, e)),
        }
    }
    let bad = |detail: String| LogError::BadHeader {
        path: path.to_owned(),
        detail,
    };
    let nl = buf[..n]
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| bad(format!("no header line in its first {n} bytes")))?;
    let h: Header = serde_json::from_slice(&buf[..nl]).map_err(|e| bad(e.to_string()))?;
    if h.xshare_evict_log != 1 {
        return Err(bad(format!(
            "format version {} (this build reads 1)",
            h.xshare_evict_log
        )));
    }
    Ok(HeaderInfo {
        generation: h.generation,
        len: nl as u64 + 1,
        prev_len: h.prev_len,
    })
}

/// Installs a fresh live file of generation `generation` (header written aside, then renamed
/// in); `prev_len`: the previous generation's final length.
fn create_live(
    ledger_dir: &Path,
    gpu: u32,
    generation: u64,
    prev_len: Option<u64>,
) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = log_path(ledger_dir, gpu);
    let tmp = path.with_extension(format!("jsonl.new.{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o644)
        .open(&tmp)?;
    f.write_all(&header_line(generation, prev_len))?;
    drop(f);
    std::fs::rename(&tmp, &path)
}

fn open_append(path: &Path) -> std::io::Result<Option<std::fs::File>> {
    match std::fs::OpenOptions::new()
        .append(true)
        .read(true)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Appends `rec` to its GPU's log with the default [`Rotation`].
pub fn append(ledger_dir: &Path, rec: &EvictRecord) -> std::io::Result<()> {
    append_with(ledger_dir, rec, &Rotation::default())
}

/// Appends `rec` to its GPU's log (creating the directory and files, mode 0644: readable by
/// the node's agents, written only by the monitor), rotating first when the line would take
/// the live file past `rot.max_bytes`. Only the GPU's single writer may call this.
pub fn append_with(ledger_dir: &Path, rec: &EvictRecord, rot: &Rotation) -> std::io::Result<()> {
    let path = log_path(ledger_dir, rec.gpu);
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let mut line = serde_json::to_vec(rec).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let mut f = match open_append(&path)? {
        Some(f) => f,
        None => {
            // First record, or a crash between rotation's two renames: the next generation.
            let newest = rotated_generations(ledger_dir, rec.gpu)?.last().copied();
            let prev_len = match newest {
                Some(g) => Some(std::fs::metadata(generation_path(ledger_dir, rec.gpu, g))?.len()),
                None => None,
            };
            create_live(ledger_dir, rec.gpu, newest.map_or(0, |g| g + 1), prev_len)?;
            open_append(&path)?.ok_or_else(|| std::io::Error::other("live log vanished"))?
        }
    };
    let h = read_header(&f, &path)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    let (generation, header_len) = (h.generation, h.len);
    let mut len = f.metadata()?.len();
    if len > header_len && len + line.len() as u64 > rot.max_bytes {
        std::fs::rename(&path, generation_path(ledger_dir, rec.gpu, generation))?;
        for g in rotated_generations(ledger_dir, rec.gpu)? {
            if g + u64::from(rot.keep) <= generation {
                std::fs::remove_file(generation_path(ledger_dir, rec.gpu, g))?;
            }
        }
        create_live(ledger_dir, rec.gpu, generation + 1, Some(len))?;
        f = open_append(&path)?.ok_or_else(|| std::io::Error::other("live log vanished"))?;
        len = f.metadata()?.len();
    }
    let mut last = [0u8; 1];
    if len > 0 {
        use std::os::unix::fs::FileExt;
        f.read_exact_at(&mut last, len - 1)?;
    }
    if len > 0 && last[0] != b'\n' {
        // An earlier write cut short (ENOSPC, crash): end that line, so it stays one damaged
        // line and does not swallow this record.
        line.insert(0, b'\n');
    }
    // One write: O_APPEND places it whole at the end.
    f.write_all(&line)
}

/// Why a log could not be read from a cursor. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The file is shorter than the cursor: truncated or replaced by someone else.
    #[error("eviction log {path} is {len} bytes, shorter than the cursor's offset {offset}: truncated or replaced (move the cursor file aside to re-read the log from its oldest generation)")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Its length now.
        len: u64,
        /// The cursor's offset in it.
        offset: u64,
    },
    /// The cursor's generation was deleted by rotation (or by hand) before it was read.
    #[error("eviction log generation {generation} ({path}) is gone before it was read: records were lost (raise evict_log.keep/max_bytes; move the cursor file aside to go on from the oldest generation)")]
    Lost {
        /// The missing file.
        path: PathBuf,
        /// Its generation.
        generation: u64,
    },
    /// The cursor names a generation newer than the newest file.
    #[error("eviction log cursor {pos:?} is ahead of the newest generation {newest} ({path}): the log was replaced or the cursor is damaged")]
    Ahead {
        /// The live file.
        path: PathBuf,
        /// The cursor.
        pos: Pos,
        /// The newest generation present.
        newest: u64,
    },
    /// The cursor points inside a file's header line.
    #[error(
        "eviction log cursor {pos:?} points inside the header of {path}: the cursor is damaged"
    )]
    BadCursor {
        /// The file.
        path: PathBuf,
        /// The cursor.
        pos: Pos,
    },
    /// A file's header line is missing or damaged, or names another generation than its name.
    #[error("eviction log {path}: bad header: {detail}")]
    BadHeader {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// Reading failed.
    #[error("eviction log {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

impl LogError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        LogError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

/// A record read back, with where its line starts and ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Where the record's line starts.
    pub start: Pos,
    /// Just past its newline (the cursor once it is handled).
    pub end: Pos,
    /// The record; `None` for a damaged line (skipped, but it still moves the cursor; the
    /// reader reports it).
    pub record: Option<EvictRecord>,
}

/// What one [`read_from`] call found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// The complete lines read, in log order.
    pub entries: Vec<Entry>,
    /// Where reading stopped: the cursor once every entry is handled (it may lie past the last
    /// entry's end, in a newer generation).
    pub end: Pos,
}

fn parse_lines(buf: &[u8], generation: u64, base: u64, out: &mut Vec<Entry>) -> usize {
    let mut start = 0usize;
    while let Some(nl) = buf[start..].iter().position(|&b| b == b'\n') {
        let line = &buf[start..start + nl];
        let record = if line.len() > MAX_LINE {
            None
        } else {
            serde_json::from_slice(line).ok()
        };
        out.push(Entry {
            start: Pos {
                generation,
                offset: base + start as u64,
            },
            end: Pos {
                generation,
                offset: base + (start + nl + 1) as u64,
            },
            record,
        });
        start += nl + 1;
    }
    start
}

/// The complete lines of GPU `gpu`'s log from `from` on (`None`: from the oldest generation
/// present, for a reader with no cursor yet), across rotations, reading at most about
/// `max_bytes`. An unfinished last line of the live file is left for the next read; one at
/// the end of a rotated file (a write cut short) is returned as a damaged entry. A missing
/// log is empty.
pub fn read_from(
    ledger_dir: &Path,
    gpu: u32,
    from: Option<Pos>,
    max_bytes: u64,
) -> Result<Batch, LogError> {
    let live_path = log_path(ledger_dir, gpu);
    // The live file first, then the rotated ones: a rotation in between shows the same file
    // under both names, never neither.
    let live = match std::fs::File::open(&live_path) {
        Ok(f) => {
            let h = read_header(&f, &live_path)?;
            Some((f, h.generation, h.len, h.prev_len))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(LogError::io(&live_path, e)),
    };
    let rotated =
        rotated_generations(ledger_dir, gpu).map_err(|e| LogError::io(&ledger_dir.join(DIR), e))?;
    let mut pos = match from {
        Some(p) => p,
        None => match (rotated.first(), &live) {
            (Some(&g), _) => Pos {
                generation: g,
                offset: 0,
            },
            (None, Some((_, g, _, _))) => Pos {
                generation: *g,
                offset: 0,
            },
            (None, None) => return Ok(Batch::default()),
        },
    };
    let mut batch = Batch::default();
    let mut budget = max_bytes;
    loop {
        let is_live = live
            .as_ref()
            .is_some_and(|(_, g, _, _)| *g == pos.generation);
        let (path, owned);
        let (f, header_len) = if is_live {
            let (f, _, h, _) = live.as_ref().expect("checked");
            path = live_path.clone();
            (f, *h)
        } else {
            if let Some((_, g, _, _)) = &live {
                if pos.generation > *g {
                    return Err(LogError::Ahead {
                        path: live_path,
                        pos,
                        newest: *g,
                    });
                }
            }
            path = generation_path(ledger_dir, gpu, pos.generation);
            owned = match std::fs::File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let newest_rotated = rotated.last().copied();
                    let waiting = live.is_none()
                        && pos.offset == 0
                        && newest_rotated.is_none_or(|n| pos.generation > n);
                    if waiting {
                        // Not written yet (or the writer is between rotation's two renames).
                        break;
                    }
                    if live.is_none() && newest_rotated.is_none_or(|n| pos.generation > n + 1) {
                        return Err(LogError::Ahead {
                            path: live_path,
                            pos,
                            newest: newest_rotated.unwrap_or(0),
                        });
                    }
                    // Deleted by rotation: nothing lost if the cursor was at its end, as the
                    // next generation's header says.
                    let next = pos.generation + 1;
                    let next_prev_len = match &live {
                        Some((_, g, _, p)) if *g == next => *p,
                        _ => std::fs::File::open(generation_path(ledger_dir, gpu, next))
                            .ok()
                            .and_then(|f| read_header(&f, &path).ok())
                            .and_then(|h| h.prev_len),
                    };
                    if pos.offset > 0 && next_prev_len == Some(pos.offset) {
                        pos = Pos {
                            generation: next,
                            offset: 0,
                        };
                        continue;
                    }
                    return Err(LogError::Lost {
                        path,
                        generation: pos.generation,
                    });
                }
                Err(e) => return Err(LogError::io(&path, e)),
            };
            let hi = read_header(&owned, &path)?;
            let (g, h) = (hi.generation, hi.len);
            if g != pos.generation {
                return Err(LogError::BadHeader {
                    path,
                    detail: format!("names generation {g}, its file name {}", pos.generation),
                });
            }
            (&owned, h)
        };
        if pos.offset == 0 {
            pos.offset = header_len;
        } else if pos.offset < header_len {
            return Err(LogError::BadCursor { path, pos });
        }
        let len = f.metadata().map_err(|e| LogError::io(&path, e))?.len();
        if pos.offset > len {
            return Err(LogError::Truncated {
                path,
                len,
                offset: pos.offset,
            });
        }
        let remaining = len - pos.offset;
        let want = remaining.min(budget.max(MAX_LINE as u64 + 1));
        let mut buf = Vec::with_capacity(want as usize);
        let mut rf = f;
        rf.seek(SeekFrom::Start(pos.offset))
            .map_err(|e| LogError::io(&path, e))?;
        rf.take(want)
            .read_to_end(&mut buf)
            .map_err(|e| LogError::io(&path, e))?;
        let mut used = parse_lines(&buf, pos.generation, pos.offset, &mut batch.entries);
        if used == 0 && buf.len() > MAX_LINE {
            // A line too long to be a record: skip it whole (to its newline) as damage.
            let past = next_newline(rf, pos.offset, len).map_err(|e| LogError::io(&path, e))?;
            // A rotated file never grows again: no newline means damage to its end.
            if let Some(past) = past.or((!is_live).then_some(len)) {
                batch.entries.push(Entry {
                    start: pos,
                    end: Pos {
                        generation: pos.generation,
                        offset: past,
                    },
                    record: None,
                });
                used = (past - pos.offset) as usize;
            }
        }
        let read_to = pos.offset + buf.len() as u64;
        pos.offset += used as u64;
        budget = budget.saturating_sub(buf.len() as u64);
        if is_live || (read_to < len && pos.offset < len) {
            // The live file's unfinished line waits; a file cut short by the budget goes on
            // at the next call.
            break;
        }
        if pos.offset < len {
            // A rotated file never grows again: its unfinished last line is damage.
            batch.entries.push(Entry {
                start: pos,
                end: Pos {
                    generation: pos.generation,
                    offset: len,
                },
                record: None,
            });
        }
        pos = Pos {
            generation: pos.generation + 1,
            offset: 0,
        };
        if budget == 0 {
            break;
        }
    }
    batch.end = pos;
    Ok(batch)
}

/// The offset just past the first newline at or after `from` (before `len`), if any.
fn next_newline(f: &std::fs::File, from: u64, len: u64) -> std::io::Result<Option<u64>> {
    use std::os::unix::fs::FileExt;
    let mut at = from;
    let mut buf = vec![0u8; 64 << 10];
    while at < len {
        let n = f.read_at(&mut buf, at)?;
        if n == 0 {
            break;
        }
        if let Some(i) = buf[..n].iter().position(|&b| b == b'\n') {
            return Ok(Some(at + i as u64 + 1));
        }
        at += n as u64;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A record written before `pod_uid` existed still reads (as `None`); one without a pod is
    /// written as before, one with a pod carries it.
    #[test]
    fn pod_uid_is_optional_both_ways() {
        let old = r#"{"gpu":1,"pid":7,"start_time":9,"pid_ns":3,"group_id":0,"signal":15,"reason":"under_report","unix_ms":1}"#;
        let r: EvictRecord = serde_json::from_str(old).unwrap();
        assert_eq!(r.pod_uid, None);
        assert_eq!(serde_json::to_string(&r).unwrap(), old);
        let with = EvictRecord { pod_uid: Some("0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b".into()), ..r };
        let text = serde_json::to_string(&with).unwrap();
        assert!(text.ends_with(r#""pod_uid":"0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"}"#), "{text}");
        assert_eq!(serde_json::from_str::<EvictRecord>(&text).unwrap(), with);
    }

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
            pod_uid: None,
        }
    }

    fn small(max_bytes: u64, keep: u32) -> Rotation {
        Rotation { max_bytes, keep }
    }

    fn pids(b: &Batch) -> Vec<u32> {
        b.entries
            .iter()
            .map(|e| e.record.as_ref().map_or(0, |r| r.pid))
            .collect()
    }

    #[test]
    fn appended_records_read_back_from_a_cursor_and_partial_lines_wait() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            read_from(d.path(), 1, None, 1 << 20).unwrap(),
            Batch::default()
        );
        append(d.path(), &rec(10)).unwrap();
        append(d.path(), &rec(11)).unwrap();
        let all = read_from(d.path(), 1, None, 1 << 20).unwrap();
        assert_eq!(pids(&all), [10, 11]);
        assert_eq!(all.entries[1].start, all.entries[0].end);
        assert_eq!(all.end, all.entries[1].end);
        let rest = read_from(d.path(), 1, Some(all.entries[0].end), 1 << 20).unwrap();
        assert_eq!(pids(&rest), [11]);
        // An unfinished line (a write in progress) is not read yet; garbage is a damaged entry.
        let p = log_path(d.path(), 1);
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"not json\n{\"gpu\":1").unwrap();
        let more = read_from(d.path(), 1, Some(all.end), 1 << 20).unwrap();
        assert_eq!(more.entries.len(), 1);
        assert_eq!(more.entries[0].record, None);
        assert_eq!(more.end, more.entries[0].end);
    }

    #[test]
    fn rotation_bounds_the_files_and_keeps_the_last_generations() {
        let d = tempfile::tempdir().unwrap();
        let rot = small(1000, 2);
        for pid in 0..200 {
            append_with(d.path(), &rec(pid), &rot).unwrap();
        }
        let gens = rotated_generations(d.path(), 1).unwrap();
        assert_eq!(gens.len(), 2, "{gens:?}");
        let live = log_path(d.path(), 1);
        for p in gens
            .iter()
            .map(|&g| generation_path(d.path(), 1, g))
            .chain([live.clone()])
        {
            let len = std::fs::metadata(&p).unwrap().len();
            assert!(len <= 1000, "{} is {len} bytes", p.display());
        }
        let f = std::fs::File::open(&live).unwrap();
        assert_eq!(read_header(&f, &live).unwrap().generation, gens[1] + 1);
        // A reader with no cursor starts at the oldest kept generation and reads to the end.
        let b = read_from(d.path(), 1, None, 1 << 20).unwrap();
        assert_eq!(*pids(&b).last().unwrap(), 199);
        assert!(pids(&b).windows(2).all(|w| w[1] == w[0] + 1));
    }

    #[test]
    fn rotation_config_is_range_checked() {
        assert!(Rotation::default().validate().is_ok());
        assert_eq!(small(100, 4).validate().unwrap_err().0, "max_bytes");
        assert_eq!(
            small(MAX_MAX_BYTES + 1, 4).validate().unwrap_err().0,
            "max_bytes"
        );
        assert_eq!(small(MIN_MAX_BYTES, 0).validate().unwrap_err().0, "keep");
        let r: Result<Rotation, _> = serde_json::from_str(r#"{"max_bytes": 20000, "kep": 2}"#);
        assert!(r.is_err(), "unknown fields are refused");
    }

    /// A cursor that cannot mean what it says fails loudly, naming the file; nothing is
    /// re-read from the start or skipped.
    #[test]
    fn damaged_or_truncated_logs_and_cursors_fail_loudly() {
        let d = tempfile::tempdir().unwrap();
        let rot = small(600, 1);
        for pid in 0..3 {
            append_with(d.path(), &rec(pid), &rot).unwrap();
        }
        let b = read_from(d.path(), 1, None, 1 << 20).unwrap();
        assert_eq!(pids(&b), [0, 1, 2]);
        let live = log_path(d.path(), 1);
        // Truncated under the cursor (header kept).
        let text = std::fs::read(&live).unwrap();
        let end = b.end;
        std::fs::write(&live, &text[..text.len() - 10]).unwrap();
        let e = read_from(d.path(), 1, Some(end), 1 << 20).unwrap_err();
        assert!(matches!(e, LogError::Truncated { .. }), "{e}");
        assert!(e.to_string().contains("gpu1.jsonl"), "{e}");
        std::fs::write(&live, &text).unwrap();
        // A cursor inside the header, or ahead of the newest generation.
        let e = read_from(
            d.path(),
            1,
            Some(Pos {
                generation: end.generation,
                offset: 3,
            }),
            1 << 20,
        )
        .unwrap_err();
        assert!(matches!(e, LogError::BadCursor { .. }), "{e}");
        let e = read_from(
            d.path(),
            1,
            Some(Pos {
                generation: end.generation + 5,
                offset: 0,
            }),
            1 << 20,
        )
        .unwrap_err();
        assert!(matches!(e, LogError::Ahead { .. }), "{e}");
        // A fully read generation rotated away is not a loss (the next header gives its length).
        let live_gen = || {
            read_header(&std::fs::File::open(&live).unwrap(), &live)
                .unwrap()
                .generation
        };
        let g0 = end.generation;
        let (mut cur, mut pid, mut got) = (end, 3, Vec::new());
        loop {
            let b = read_from(d.path(), 1, Some(cur), 1 << 20).unwrap();
            got.extend(pids(&b));
            cur = b.end;
            append_with(d.path(), &rec(pid), &rot).unwrap();
            pid += 1;
            if live_gen() != g0 {
                break;
            }
        }
        assert_eq!(
            cur.generation, g0,
            "the cursor is at the end of a generation now rotated"
        );
        while rotated_generations(d.path(), 1).unwrap().contains(&g0) {
            append_with(d.path(), &rec(pid), &rot).unwrap();
            pid += 1;
        }
        let b2 = read_from(d.path(), 1, Some(cur), 1 << 20).unwrap();
        got.extend(pids(&b2));
        assert_eq!(got, (3..pid).collect::<Vec<_>>());
        // The reader falls behind by more than `keep` generations: its generation is gone with
        // records it never read.
        let unread = b2.entries[0].start;
        for p in pid..pid + 30 {
            append_with(d.path(), &rec(p), &rot).unwrap();
        }
        let e = read_from(d.path(), 1, Some(unread), 1 << 20).unwrap_err();
        assert!(matches!(e, LogError::Lost { .. }), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("gpu1.{}.jsonl", unread.generation)),
            "{e}"
        );
        // A damaged header: the reader and the writer both refuse (no silent fresh start).
        std::fs::write(&live, b"garbage\n").unwrap();
        let e = read_from(d.path(), 1, None, 1 << 20).unwrap_err();
        assert!(matches!(e, LogError::BadHeader { .. }), "{e}");
        assert!(append_with(d.path(), &rec(99), &rot).is_err());
    }

    #[test]
    fn a_cut_short_last_line_is_damage_and_reading_goes_on() {
        let d = tempfile::tempdir().unwrap();
        let rot = small(400, 10);
        append_with(d.path(), &rec(1), &rot).unwrap();
        // A write cut short (ENOSPC, crash): the next record is not swallowed by it.
        let live = log_path(d.path(), 1);
        let cut = |p: &Path| {
            let mut f = std::fs::OpenOptions::new().append(true).open(p).unwrap();
            f.write_all(b"{\"gpu\":1,\"pi").unwrap();
        };
        cut(&live);
        append_with(d.path(), &rec(2), &rot).unwrap();
        // Cut short again, then the writer dies between rotation's two renames: the rotated
        // generation ends with an unfinished line.
        cut(&live);
        std::fs::rename(&live, generation_path(d.path(), 1, 0)).unwrap();
        for pid in 3..5 {
            append_with(d.path(), &rec(pid), &rot).unwrap();
        }
        let b = read_from(d.path(), 1, None, 1 << 20).unwrap();
        assert_eq!(pids(&b), [1, 0, 2, 0, 3, 4]);
        assert_eq!(b.entries[3].end.generation, 0);
        assert_eq!(b.entries[4].start.generation, 1);
        // An overlong line is skipped whole, even with a small budget.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&live)
            .unwrap();
        f.write_all(&vec![b'x'; 3 * MAX_LINE]).unwrap();
        f.write_all(b"\n").unwrap();
        drop(f);
        append_with(d.path(), &rec(5), &small(1 << 20, 10)).unwrap();
        let c = read_from(d.path(), 1, Some(b.end), 100).unwrap();
        assert_eq!(pids(&c), [0]);
        let c = read_from(d.path(), 1, Some(c.end), 1 << 20).unwrap();
        assert_eq!(pids(&c), [5]);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Append(u8),
        Read { budget: u16, take: u8 },
        Restart,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u8..6).prop_map(Op::Append),
            (1u16..2000, 0u8..8).prop_map(|(budget, take)| Op::Read { budget, take }),
            Just(Op::Restart),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Appends (rotating often) interleaved with reads that handle only part of what they
        /// got, and reader restarts (the cursor through its JSON form): every record is
        /// delivered exactly once, in order.
        #[test]
        fn every_record_is_delivered_exactly_once_across_rotations_and_restarts(
            ops in proptest::collection::vec(op(), 1..80),
            max_bytes in 300u64..1500,
        ) {
            let d = tempfile::tempdir().unwrap();
            let rot = small(max_bytes, MAX_KEEP);
            let mut next_pid = 1u32;
            let mut cursor: Option<Pos> = None;
            let mut got = Vec::new();
            let read = |cursor: &mut Option<Pos>, budget: u64, take: usize, got: &mut Vec<u32>| {
                let b = read_from(d.path(), 1, *cursor, budget).unwrap();
                let n = take.min(b.entries.len());
                got.extend(b.entries[..n].iter().map(|e| e.record.as_ref().unwrap().pid));
                if n == b.entries.len() {
                    *cursor = Some(b.end);
                } else if n > 0 {
                    *cursor = Some(b.entries[n - 1].end);
                }
            };
            for o in ops {
                match o {
                    Op::Append(k) => {
                        for _ in 0..k {
                            append_with(d.path(), &rec(next_pid), &rot).unwrap();
                            next_pid += 1;
                        }
                    }
                    Op::Read { budget, take } => {
                        read(&mut cursor, u64::from(budget), usize::from(take), &mut got)
                    }
                    Op::Restart => {
                        let saved = serde_json::to_string(&cursor).unwrap();
                        cursor = serde_json::from_str(&saved).unwrap();
                    }
                }
            }
            for _ in 0..10_000 {
                let before = got.len();
                read(&mut cursor, 1 << 20, usize::MAX, &mut got);
                if got.len() == before {
                    break;
                }
            }
            let want: Vec<u32> = (1..next_pid).collect();
            prop_assert_eq!(got, want);
        }
    }

    /// A writer rotating while a reader reads, really concurrently: nothing lost or repeated.
    #[test]
    fn concurrent_writer_and_reader_see_each_record_once() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_owned();
        const N: u32 = 3000;
        let w = std::thread::spawn(move || {
            let rot = small(900, MAX_KEEP);
            for pid in 1..=N {
                append_with(&dir, &rec(pid), &rot).unwrap();
            }
        });
        let mut cursor = None;
        let mut got = Vec::new();
        let t0 = std::time::Instant::now();
        while got.len() < N as usize {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(120),
                "stuck at {}",
                got.len()
            );
            let b = read_from(d.path(), 1, cursor, 700).unwrap();
            got.extend(b.entries.iter().map(|e| e.record.as_ref().unwrap().pid));
            cursor = Some(b.end);
        }
        w.join().unwrap();
        let b = read_from(d.path(), 1, cursor, 1 << 20).unwrap();
        assert!(b.entries.is_empty());
        assert_eq!(got, (1..=N).collect::<Vec<_>>());
        assert!(rotated_generations(d.path(), 1).unwrap().len() > 10);
    }
}
