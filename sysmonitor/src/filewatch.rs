//! Noticing changes to an open file's inode (unlink, truncation, rename, chmod) without a
//! syscall per look: an inotify watch on the file, set up for signal-driven I/O (`O_ASYNC`,
//! `SIGIO`), whose handler only bumps a counter. A look is then one atomic load; the inotify
//! queue is read only after a signal came.
//!
//! The monitor uses it for its ledger: it must notice a deleted ledger within one tick (and
//! put a copy back before a newcomer creates an empty one), which before meant an `fstat` at
//! every tick, for an event that practically never happens.
//!
//! At most one signal per look, however many events come: the handler also takes `O_ASYNC`
//! off every watch, and a watch is armed again only by a look that finds its queue empty. A
//! writer of a watched file (the ledgers are open to every offline process) that touches it in
//! a loop therefore costs the monitor one non-blocking `read` per look and no signal storm:
//! before, every queued event sent a `SIGIO` that woke the daemon's sleep, and such a loop
//! took a monitor from 0.6 % to 48 % of a core. While events keep coming every look reports a
//! change; the caller's work per look is bounded by its own.
//!
//! The handler disarms before it counts, so a look on another thread that re-arms a watch
//! between the two cannot be left armed but deaf (see `HANDLER_STEPS`); threads that never
//! look block `SIGIO` ([`block_sigio_in_this_thread`]).
//!
//! The counter is process-wide: an event on any watched file makes every [`FileWatch`] look at
//! its own queue once (one `read`; a watch whose queue is empty reports no change).
//! Where the watch cannot be set up (`SIGIO` already handled by someone else, inotify limits
//! reached) [`FileWatch::new`] fails and the caller keeps checking at every look. Code that
//! installs its own `SIGIO` handler later would take the signals away unnoticed: the monitor
//! also runs its full check every 100 ms whatever the watch says, which bounds what is missed.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering::*};
use std::sync::Mutex;

/// `SIGIO`s received since the handler was installed.
static EVENTS: AtomicU64 = AtomicU64::new(0);
/// Whether our handler is installed (set once, under the mutex).
static INSTALLED: Mutex<bool> = Mutex::new(false);
/// The inotify descriptors of the live watches (-1: a free entry), which the handler disarms.
static WATCH_FDS: [AtomicI32; MAX_WATCHES] = [const { AtomicI32::new(-1) }; MAX_WATCHES];
/// Handlers running now: a watch's descriptor is closed only once none is (see `Drop`).
static IN_HANDLER: AtomicU32 = AtomicU32::new(0);
/// How many watches (inotify instances) one process may have.
const MAX_WATCHES: usize = 8;

extern "C" fn on_sigio(_sig: libc::c_int) {
    // Atomics and fcntl(2) only: async-signal-safe, allocates nothing, takes no lock.
    IN_HANDLER.fetch_add(1, SeqCst);
    for step in HANDLER_STEPS {
        step();
    }
    IN_HANDLER.fetch_sub(1, SeqCst);
}

/// What the handler does, in order (a seam: the tests run a watch's re-arming between the
/// steps, as a look on another thread than the handler's can). Disarm first, count second:
/// counted first, a look that ran in between (seeing the count, reading the queue empty,
/// arming) had its `O_ASYNC` taken off by the late disarm with nothing left to tell it so,
/// and the watch was deaf (armed, count seen) until another watch's signal. Counted last,
/// every arm before the disarm is followed by a count it has not seen, so the next look reads.
const HANDLER_STEPS: [fn(); 2] = [disarm_all, count_event];

/// Takes `O_ASYNC` off every watch: no more signals until a look finds its queue empty and
/// arms it again.
fn disarm_all() {
    for w in &WATCH_FDS {
        let fd = w.load(SeqCst);
        if fd >= 0 {
            // SAFETY: fcntl(2) on a descriptor a live watch owns (Drop waits for handlers
            // before closing it); F_SETFL changes only the status flags.
            unsafe { libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK) };
        }
    }
}

/// Tells every watch to look at its queue (see [`HANDLER_STEPS`] for why it comes last).
fn count_event() {
    EVENTS.fetch_add(1, SeqCst);
}

/// Blocks `SIGIO` in the calling thread, so that the watches' signals are taken by the thread
/// that looks (the main loop), where the handler cannot run between a look's steps. For
/// threads a daemon spawns beside its loop (the metrics server); `HANDLER_STEPS` keeps the
/// watches right wherever the signal lands, this keeps it off threads that never look.
pub fn block_sigio_in_this_thread() {
    // SAFETY: sigset and pthread_sigmask(3) on local, initialised sets.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGIO);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Installs the `SIGIO` handler unless another one is in place (then `false`: a handler we do
/// not know might mean something else by it; the default action, termination, we replace).
fn install() -> bool {
    let mut done = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
    if *done {
        return true;
    }
    // SAFETY: sigaction(2) with valid structs; an all-zero sigaction is SIG_DFL, empty mask.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGIO, std::ptr::null(), &mut old) != 0
            || old.sa_sigaction != libc::SIG_DFL
        {
            return false;
        }
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_sigio as extern "C" fn(libc::c_int) as usize;
        // Interrupted syscalls restart: the signal must change nothing but the counter.
        act.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        if libc::sigaction(libc::SIGIO, &act, std::ptr::null_mut()) != 0 {
            return false;
        }
    }
    *done = true;
    true
}

/// A watch on one file's inode (see the module doc).
#[derive(Debug)]
pub struct FileWatch {
    fd: OwnedFd,
    seen: u64,
    /// Its entry in [`WATCH_FDS`].
    entry: usize,
    /// Whether `O_ASYNC` is on (a signal tells of the next event); off, each look reads.
    armed: bool,
}

impl Drop for FileWatch {
    fn drop(&mut self) {
        WATCH_FDS[self.entry].store(-1, SeqCst);
        // A handler that read the descriptor before the store must be done with it before
        // the number can be closed and reused for another file.
        while IN_HANDLER.load(SeqCst) != 0 {
            std::hint::spin_loop();
        }
    }
}

/// What the watch reports about: changes to the inode, and the close of a description opened
/// for writing (for the ledger: a registered process's slot lock is released with it).
const MASK: u32 = libc::IN_ATTRIB
    | libc::IN_MODIFY
    | libc::IN_MOVE_SELF
    | libc::IN_DELETE_SELF
    | libc::IN_CLOSE_WRITE;

impl FileWatch {
    /// Watches the inode now at `path`, which must be `inode` (the file the caller has open;
    /// otherwise the watch would be on another file, and this fails).
    pub fn new(path: &Path, inode: u64) -> Result<FileWatch, String> {
        let w = FileWatch::empty()?;
        w.add(path, inode)?;
        Ok(w)
    }

    /// A watch of no file yet: files are added with [`FileWatch::add`] (one inotify instance
    /// for many files: instances are limited per user, watches far less).
    pub fn empty() -> Result<FileWatch, String> {
        if !install() {
            return Err("SIGIO already has a handler in this process".into());
        }
        // SAFETY: plain syscall; the fd is owned right below.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if raw < 0 {
            return Err(format!("inotify_init1: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: fcntl(2) on our own descriptor with plain integer arguments.
        if unsafe { libc::fcntl(raw, libc::F_SETOWN, libc::getpid()) } != 0 {
            return Err(format!("F_SETOWN: {}", std::io::Error::last_os_error()));
        }
        let entry = WATCH_FDS
            .iter()
            .position(|w| w.compare_exchange(-1, raw, SeqCst, SeqCst).is_ok())
            .ok_or_else(|| format!("more than {MAX_WATCHES} inotify watches in this process"))?;
        let mut w = FileWatch { fd, seen: 0, entry, armed: false };
        w.arm()?;
        Ok(w)
    }

    /// Turns `O_ASYNC` on: the next event raises a signal. The count is taken before: a
    /// handler that disarms after it also counts after it (see [`HANDLER_STEPS`]).
    fn arm(&mut self) -> Result<(), String> {
        self.seen = EVENTS.load(SeqCst);
        // SAFETY: fcntl(2) on our own descriptor; F_SETFL changes only the status flags.
        if unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_SETFL, libc::O_ASYNC | libc::O_NONBLOCK) } != 0 {
            return Err(format!("O_ASYNC: {}", std::io::Error::last_os_error()));
        }
        self.armed = true;
        Ok(())
    }

    /// Adds the inode now at `path`, which must be `inode`, to this watch. Returns its watch
    /// descriptor, for [`FileWatch::remove`].
    pub fn add(&self, path: &Path, inode: u64) -> Result<i32, String> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| format!("{}: NUL in path", path.display()))?;
        // SAFETY: valid fd and NUL-terminated path for the duration of the call.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), MASK) };
        if wd < 0 {
            return Err(format!(
                "inotify_add_watch {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            ));
        }
        // The watch is on whatever `path` named when it was added: make sure that is our file.
        let now = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if std::os::unix::fs::MetadataExt::ino(&now) != inode {
            self.remove(wd);
            return Err(format!("{} was replaced while being watched", path.display()));
        }
        Ok(wd)
    }

    /// Stops watching the file [`FileWatch::add`] gave `wd` for (nothing if that watch is
    /// gone already: the kernel drops it with its inode).
    pub fn remove(&self, wd: i32) {
        // SAFETY: inotify_rm_watch(2) on our own descriptor; a stale `wd` only fails (EINVAL).
        unsafe { libc::inotify_rm_watch(self.fd.as_raw_fd(), wd) };
    }

    /// Whether a watched file may have changed since the last call: one atomic load when
    /// nothing happened. After a signal (any watch's: the handler disarms them all), or while
    /// disarmed, one `read` of the queue: events read are a change; an empty queue arms the
    /// watch again and is read once more (an event queued just before raised no signal).
    /// What is read is dropped (the caller checks the file itself); a queue longer than one
    /// read is read on at the next look, each look reporting a change, and one the kernel let
    /// overflow loses only events that say the same.
    pub fn changed(&mut self) -> bool {
        if self.armed {
            if EVENTS.load(SeqCst) == self.seen {
                return false;
            }
            self.armed = false;
        }
        if self.read_some() {
            return true;
        }
        if let Err(e) = self.arm() {
            tracing::warn!(error = %e, "cannot arm the inotify watch again: looking at its queue at every look");
            return false;
        }
        self.read_some()
    }

    /// Whether the `SIGIO` handler disarmed this watch or it was never armed again: each look
    /// then reads its queue (for tests).
    pub fn armed(&self) -> bool {
        self.armed
    }

    /// One non-blocking read of the queue, whose events are dropped: whether there were any.
    /// Out of line: its 4 KiB buffer inlined into the callers gave them a frame whose stack
    /// probe touched an extra page at every tick.
    #[cold]
    #[inline(never)]
    fn read_some(&mut self) -> bool {
        let mut buf = [0u8; 4096];
        // SAFETY: reading into a local buffer of the length passed, from our own descriptor.
        unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) > 0 }
    }

    /// Reads and drops the pending events.
    #[cfg(test)]
    fn drain(&mut self) {
        while self.read_some() {}
    }
}

/// `SIGIO`s this process received from its watches so far.
pub fn signals() -> u64 {
    EVENTS.load(SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_changed(w: &mut FileWatch) -> bool {
        // The signal is sent inside the syscall that changed the file; it may be taken by
        // another thread of the test process a moment later.
        let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::time::Instant::now() < end {
            if w.changed() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        false
    }

    /// Unlink, truncation and chmod of the watched file are reported; a quiet file is not
    /// (on a quiet file the look costs no syscall, see the module doc).
    #[test]
    fn reports_unlink_truncation_and_chmod_of_the_file() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(4096).unwrap();
        let ino = std::os::unix::fs::MetadataExt::ino(&f.metadata().unwrap());
        assert!(FileWatch::new(&p, ino + 1).is_err(), "another inode is refused");
        let mut w = FileWatch::new(&p, ino).unwrap();
        // Another test's watched file may change meanwhile: then one spurious report, no more.
        let _ = w.changed();
        f.set_len(100).unwrap();
        assert!(wait_changed(&mut w), "truncation");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(wait_changed(&mut w), "chmod");
        std::fs::remove_file(&p).unwrap();
        assert!(wait_changed(&mut w), "unlink");
    }

    /// One watch of several files: a change to any is reported; a removed file's no longer.
    #[test]
    fn one_watch_reports_each_of_its_files_until_removed() {
        let d = tempfile::tempdir().unwrap();
        let files: Vec<_> = ["a", "b"]
            .iter()
            .map(|n| {
                let p = d.path().join(n);
                let f = std::fs::File::create(&p).unwrap();
                let ino = std::os::unix::fs::MetadataExt::ino(&f.metadata().unwrap());
                (p, f, ino)
            })
            .collect();
        let mut w = FileWatch::empty().unwrap();
        assert!(w.add(&files[0].0, files[0].2 + 1).is_err(), "another inode is refused");
        let wds: Vec<i32> = files.iter().map(|(p, _, ino)| w.add(p, *ino).unwrap()).collect();
        let _ = w.changed();
        files[1].1.set_len(10).unwrap();
        assert!(wait_changed(&mut w), "b");
        files[0].1.set_len(10).unwrap();
        assert!(wait_changed(&mut w), "a");
        w.remove(wds[0]);
        // The process-wide counter may move with another test's file: the queue is what says
        // (emptied of the removal's own IN_IGNORED first).
        w.drain();
        let mut buf = [0u8; 4096];
        files[0].1.set_len(20).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        // SAFETY: reading into a local buffer from the watch's own descriptor.
        let n = unsafe { libc::read(w.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        assert!(n <= 0, "a removed file's change is queued ({n} bytes)");
    }

    /// Whether `w` can miss an event: armed, with the count it saw, but `O_ASYNC` off (no
    /// signal will come and no look will read).
    fn deaf(w: &FileWatch) -> bool {
        // SAFETY: F_GETFL on the watch's own descriptor.
        let flags = unsafe { libc::fcntl(w.fd.as_raw_fd(), libc::F_GETFL) };
        w.armed && EVENTS.load(SeqCst) == w.seen && flags & libc::O_ASYNC == 0
    }

    /// The handler may run on another thread than the look: a look that re-arms the watch
    /// between any two of the handler's steps leaves it able to hear the next event. Before,
    /// the handler counted before it disarmed, and a re-arm in between was undone by the late
    /// disarm: the watch stayed deaf until another watch's signal.
    #[test]
    fn a_rearm_between_the_handlers_steps_leaves_the_watch_hearing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let f = std::fs::File::create(&p).unwrap();
        let ino = std::os::unix::fs::MetadataExt::ino(&f.metadata().unwrap());
        let mut w = FileWatch::new(&p, ino).unwrap();
        for split in 0..=HANDLER_STEPS.len() {
            w.drain();
            w.arm().unwrap();
            // A signal whose handler runs the first `split` steps, then a look on the main
            // thread re-arms (the queue is empty), then the handler finishes.
            for step in &HANDLER_STEPS[..split] {
                step();
            }
            w.drain();
            w.arm().unwrap();
            for step in &HANDLER_STEPS[split..] {
                step();
            }
            assert!(!deaf(&w), "re-armed after {split} of the handler's steps: deaf");
            f.set_len(split as u64 + 1).unwrap();
            assert!(wait_changed(&mut w), "re-armed after {split} of the handler's steps: change unseen");
        }
    }
}
