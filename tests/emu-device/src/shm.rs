//! Opening, creating, validating and locking the mmap'd state file.
//!
//! Locking is `flock(LOCK_EX)` on the file plus an in-process mutex (flock does not exclude
//! threads sharing one descriptor). flock is released by the kernel when a holder dies, even by
//! `kill -9`, so a dead process can never wedge the device; a robust pthread mutex would need
//! owner-died recovery code for the same guarantee (and its owner tids clash across pid
//! namespaces).
//!
//! Readers that only look may skip both locks ([`Shm::optimistic`]): a seqlock. Every lock
//! holder makes `Header::seq` odd when it takes the lock and even again when it lets go, so a
//! reader that finds the same even value before and after copying what it needs knows no one
//! wrote in between; otherwise it copies again, and after a few tries takes the lock. A holder
//! killed inside leaves the sequence odd: the next one to take the lock moves it on (readers
//! only ever compare it for equality).

use crate::error::EmuError;
use crate::layout::{ClientSlot, Header, Sample, State, LAYOUT_VERSION, MAGIC, MAX_CLIENTS, RING_LEN, STATE_SIZE};
use crate::profile::Profile;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Copies a lock-free reader makes before it takes the lock instead.
const OPTIMISTIC_TRIES: u32 = 16;

/// A mapped state file.
pub struct Shm {
    path: PathBuf,
    file: File,
    map: *mut State,
    lock: Mutex<()>,
}

// SAFETY: the mapping is only dereferenced under `lock` + flock, which serialise all access;
// lock-free readers (`optimistic`) only copy from it with volatile loads and keep a copy only
// when the seqlock says no writer came by.
unsafe impl Send for Shm {}
// SAFETY: as above.
unsafe impl Sync for Shm {}

/// Exclusive access to the state; unlocks on drop.
pub struct Guard<'a> {
    shm: &'a Shm,
    _inproc: MutexGuard<'a, ()>,
    /// Handed out mutably: the horizon of lock-free readers is worked out again on drop.
    dirty: bool,
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
        self.dirty = true;
        // SAFETY: as in `deref`; the locks make this the only live reference.
        unsafe { &mut *self.shm.map }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if self.dirty {
            // SAFETY: as in `deref_mut`: we still hold both locks.
            crate::settle(unsafe { &mut *self.shm.map });
        }
        let seq = self.shm.seq();
        // Whatever was written is visible before the even value that tells readers so.
        seq.store(seq.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
        // SAFETY: plain syscall on a descriptor we own.
        unsafe { libc::flock(self.shm.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// The state as a reader that holds no lock sees it: copies of parts of it, each possibly
/// torn by a concurrent writer; only [`Shm::optimistic`] hands one out, and throws away what
/// was read from it when a writer came by.
pub struct View<'a> {
    map: *const State,
    _shm: std::marker::PhantomData<&'a Shm>,
}

/// Plain data of whole 8-byte words that any bit pattern is a valid value of.
///
/// # Safety
/// Implementors are `repr(C)`, 8-aligned, a whole number of words long, and made only of
/// integers and floats.
unsafe trait Words: Copy {}
// SAFETY: all three are repr(C) structs of u64/u32/f64/u8 fields (and arrays of such), 8-aligned
// and of a size that is a multiple of 8 (checked at compile time in `copy_words`).
unsafe impl Words for Header {}
// SAFETY: as above.
unsafe impl Words for Sample {}
// SAFETY: as above.
unsafe impl Words for ClientSlot {}

/// Copies `*src` word by word with volatile loads: no reference to memory other processes write
/// is formed, and it is one load per word (a volatile copy of a whole struct becomes a byte
/// loop).
///
/// # Safety
/// `src` is valid for reads of `T` for the duration of the call.
unsafe fn copy_words<T: Words>(src: *const T) -> T {
    const { assert!(std::mem::size_of::<T>().is_multiple_of(8) && std::mem::align_of::<T>() == 8) };
    let mut out = std::mem::MaybeUninit::<T>::uninit();
    let (src, dst) = (src.cast::<u64>(), out.as_mut_ptr().cast::<u64>());
    for i in 0..std::mem::size_of::<T>() / 8 {
        // SAFETY: both in bounds of a `T` (whole words, checked above), both 8-aligned.
        unsafe { dst.add(i).write(src.add(i).read_volatile()) };
    }
    // SAFETY: every word written; any bit pattern is a valid `T` (`Words`).
    unsafe { out.assume_init() }
}

impl View<'_> {
    /// A copy of the header.
    pub fn header(&self) -> Header {
        // SAFETY: the map is valid for the life of the `Shm` this view borrows. A copy torn by
        // a writer is still a value (`Words`), which the caller throws away.
        unsafe { copy_words(std::ptr::addr_of!((*self.map).header)) }
    }

    /// The `u64` header field at byte `offset` (`std::mem::offset_of!(Header, field)`).
    pub fn header_word(&self, offset: usize) -> u64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= std::mem::size_of::<Header>(), "header word at {offset}");
        // SAFETY: the map is valid for the life of the `Shm` this view borrows; `offset` names
        // an aligned word inside the header (checked above); read with one volatile load.
        unsafe { std::ptr::addr_of!((*self.map).header).cast::<u8>().add(offset).cast::<u64>().read_volatile() }
    }

    /// The `f64` header field at byte `offset`.
    pub fn header_f64(&self, offset: usize) -> f64 {
        f64::from_bits(self.header_word(offset))
    }

    /// The `u32` header field at byte `offset`.
    pub fn header_u32(&self, offset: usize) -> u32 {
        assert!(offset.is_multiple_of(4) && offset + 4 <= std::mem::size_of::<Header>(), "header u32 at {offset}");
        // SAFETY: as in `header_word`, for an aligned u32 inside the header.
        unsafe { std::ptr::addr_of!((*self.map).header).cast::<u8>().add(offset).cast::<u32>().read_volatile() }
    }

    /// A copy of ring entry `i` (taken modulo the ring's length).
    pub fn sample(&self, i: usize) -> Sample {
        // SAFETY: as in `header`; the index is in bounds.
        unsafe { copy_words(std::ptr::addr_of!((*self.map).ring[i % RING_LEN])) }
    }

    /// A copy of client slot `i` (taken modulo the number of slots).
    pub fn client(&self, i: usize) -> ClientSlot {
        // SAFETY: as in `header`; the index is in bounds.
        unsafe { copy_words(std::ptr::addr_of!((*self.map).clients[i % MAX_CLIENTS])) }
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
        // Odd: a writer is in. One that died inside left it odd already: move it on anyway,
        // so that a reader that began before cannot match it.
        let seq = self.seq();
        let s = seq.load(Ordering::Relaxed);
        seq.store(if s.is_multiple_of(2) { s.wrapping_add(1) } else { s.wrapping_add(2) }, Ordering::Relaxed);
        // The odd value is visible before anything written after it.
        fence(Ordering::Release);
        Guard { shm: self, _inproc: g, dirty: false }
    }

    /// The seqlock sequence in the mapping (`Header::seq`).
    fn seq(&self) -> &AtomicU64 {
        // SAFETY: the map is valid for the life of `Shm`; `seq` is an aligned u64 in the header
        // (the header is 8-aligned and every field before it keeps that alignment), only ever
        // accessed atomically, by every process.
        unsafe { AtomicU64::from_ptr(std::ptr::addr_of!((*self.map).header.seq).cast_mut()) }
    }

    /// Reads the state without taking the locks: `f` looks at a [`View`] and either answers
    /// (`Some`) or says the lock is needed after all (`None`, returned as is). An answer is
    /// returned only if no lock holder came by while `f` read (the sequence was even and the
    /// same before and after); otherwise `f` runs again, up to a few times, then this gives
    /// `None` (the caller takes the lock: a writer that keeps the lock long, or died in it,
    /// never starves a reader).
    pub fn optimistic<T>(&self, f: impl FnMut(&View<'_>) -> Option<T>) -> Option<T> {
        self.optimistic_checked(true, f)
    }

    /// [`Shm::optimistic`]; with `check` false, without looking at the sequence (what a
    /// reader without the retry would see: the tests show it sees torn values).
    pub(crate) fn optimistic_checked<T>(&self, check: bool, mut f: impl FnMut(&View<'_>) -> Option<T>) -> Option<T> {
        let seq = self.seq();
        let view = View { map: self.map, _shm: std::marker::PhantomData };
        for _ in 0..OPTIMISTIC_TRIES {
            let s1 = seq.load(Ordering::Acquire);
            if check && !s1.is_multiple_of(2) {
                std::hint::spin_loop();
                continue;
            }
            let r = f(&view);
            // Everything `f` read is read before the sequence is looked at again.
            fence(Ordering::Acquire);
            if !check || seq.load(Ordering::Relaxed) == s1 {
                return r;
            }
        }
        None
    }

    /// The mapping itself (tests that play a writer killed mid-way).
    #[cfg(test)]
    pub(crate) fn map_ptr(&self) -> *mut State {
        self.map
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
