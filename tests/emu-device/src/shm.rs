//! Opening, creating, validating and locking the mmap'd state file.
//!
//! Locking is `flock(LOCK_EX)` on the file plus an in-process mutex (flock does not exclude
//! threads sharing one descriptor). flock is released by the kernel when a holder dies, even by
//! `kill -9`, so a dead process can never wedge the device; a robust pthread mutex would need
//! owner-died recovery code for the same guarantee.

use crate::error::EmuError;
use crate::layout::{State, LAYOUT_VERSION, MAGIC, STATE_SIZE};
use crate::profile::Profile;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// A mapped state file.
pub struct Shm {
    path: PathBuf,
    file: File,
    map: *mut State,
    lock: Mutex<()>,
}

// SAFETY: the mapping is only dereferenced under `lock` + flock, which serialise all access.
unsafe impl Send for Shm {}
// SAFETY: as above.
unsafe impl Sync for Shm {}

/// Exclusive access to the state; unlocks on drop.
pub struct Guard<'a> {
    shm: &'a Shm,
    _inproc: MutexGuard<'a, ()>,
}

impl std::ops::Deref for Guard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        // SAFETY: the map is valid for the life of `Shm` and we hold both locks.
        unsafe { &*self.shm.map }
    }
}

impl std::ops::DerefMut for Guard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        // SAFETY: as in `deref`; the locks make this the only live reference.
        unsafe { &mut *self.shm.map }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        // SAFETY: plain syscall on a descriptor we own.
        unsafe { libc::flock(self.shm.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

fn io<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> EmuError + 'a {
    move |source| EmuError::Io { path: path.to_path_buf(), op, source }
}

impl Shm {
    /// Opens `path`, creating and initialising it with `profile` if it is new or empty.
    pub fn open(path: &Path, profile: &Profile, now_ns: u64) -> Result<Shm, EmuError> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() && !dir.exists() {
                std::fs::create_dir_all(dir).map_err(io(dir, "create directory"))?;
            }
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(path)
            .map_err(io(path, "open"))?;
        let fd = file.as_raw_fd();
        // SAFETY: plain syscall on our descriptor.
        if unsafe { libc::flock(fd, libc::LOCK_EX) } != 0 {
            return Err(io(path, "lock")(std::io::Error::last_os_error()));
        }
        let result = Self::map_locked(path, &file, profile, now_ns);
        // SAFETY: plain syscall on our descriptor.
        unsafe { libc::flock(fd, libc::LOCK_UN) };
        let map = result?;
        Ok(Shm { path: path.to_path_buf(), file, map, lock: Mutex::new(()) })
    }

    fn map_locked(path: &Path, file: &File, profile: &Profile, now_ns: u64) -> Result<*mut State, EmuError> {
        let len = file.metadata().map_err(io(path, "stat"))?.len();
        let fresh = len == 0;
        if fresh {
            file.set_len(STATE_SIZE as u64).map_err(io(path, "resize"))?;
        } else if len != STATE_SIZE as u64 {
            return Err(EmuError::Corrupt {
                path: path.to_path_buf(),
                detail: format!("size is {len} bytes, expected {STATE_SIZE} (layout v{LAYOUT_VERSION})"),
            });
        }
        // SAFETY: mapping a regular file we opened read-write, of exactly STATE_SIZE bytes.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STATE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io(path, "mmap")(std::io::Error::last_os_error()));
        }
        let map = p.cast::<State>();
        // SAFETY: the mapping is STATE_SIZE bytes, page-aligned, and we hold the file lock.
        let st = unsafe { &mut *map };
        if fresh {
            crate::init_state(st, profile, now_ns);
        } else if st.header.magic != MAGIC || st.header.version != LAYOUT_VERSION || st.header.file_size != STATE_SIZE as u64 {
            let detail = format!(
                "bad header (magic {:#x}, layout v{}, size field {}); expected magic {MAGIC:#x}, v{LAYOUT_VERSION}, {STATE_SIZE}",
                st.header.magic, st.header.version, st.header.file_size
            );
            // SAFETY: unmapping what we just mapped.
            unsafe { libc::munmap(p, STATE_SIZE) };
            return Err(EmuError::Corrupt { path: path.to_path_buf(), detail });
        }
        Ok(map)
    }

    /// Takes both locks.
    pub fn lock(&self) -> Guard<'_> {
        let g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: plain syscall; EINTR is retried.
        while unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                break;
            }
        }
        Guard { shm: self, _inproc: g }
    }

    /// Reads the `u64` header field at `offset` (`std::mem::offset_of!(Header, field)`) without
    /// taking the locks: the value some writer last stored (a whole one: aligned 8-byte stores
    /// and loads are atomic on the machines the emulator runs on). For single fields whose
    /// every update is one store under the locks.
    pub fn peek_u64(&self, offset: usize) -> u64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= std::mem::size_of::<crate::layout::Header>());
        // SAFETY: the map is valid for the life of `Shm` and the header starts it; `offset`
        // names an aligned u64 inside the header (checked above). No reference to the shared
        // state is formed: the field is loaded atomically through a raw pointer.
        unsafe {
            let p = self.map.cast::<u8>().add(std::mem::offset_of!(State, header) + offset);
            std::sync::atomic::AtomicU64::from_ptr(p.cast::<u64>()).load(std::sync::atomic::Ordering::Acquire)
        }
    }

    /// Path of the state file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping once; no Guard can outlive `self`.
        unsafe { libc::munmap(self.map.cast(), STATE_SIZE) };
    }
}
