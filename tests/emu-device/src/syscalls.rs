//! Counting this thread's system calls, for the emulator's cost benchmarks: what a fake-driver
//! call costs in kernel entries is the figure that does not move with the machine's load.
//!
//! A `raw_syscalls:sys_enter` tracepoint counter (`perf_event_open`) on the calling thread;
//! unavailable (`None`) where the kernel or its settings refuse one, e.g. without tracefs or
//! with `perf_event_paranoid` above what the caller may use.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `struct perf_event_attr` as of `PERF_ATTR_SIZE_VER0` (64 bytes): the fields a counting
/// tracepoint event needs; the kernel accepts the older size.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

const PERF_TYPE_TRACEPOINT: u32 = 2;

/// System calls made by the calling thread since [`SyscallCounter::open`].
pub struct SyscallCounter {
    fd: OwnedFd,
}

impl SyscallCounter {
    /// A counter of the calling thread's system calls, or `None` where the kernel offers none.
    pub fn open() -> Option<SyscallCounter> {
        let id = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
            .iter()
            .find_map(|d| std::fs::read_to_string(format!("{d}/events/raw_syscalls/sys_enter/id")).ok())?
            .trim()
            .parse::<u64>()
            .ok()?;
        let attr = PerfEventAttr {
            type_: PERF_TYPE_TRACEPOINT,
            size: std::mem::size_of::<PerfEventAttr>() as u32,
            config: id,
            ..Default::default()
        };
        // SAFETY: perf_event_open reads `attr` (a valid, sized struct) and returns a new
        // descriptor or -1; pid 0 / cpu -1 = this thread on any CPU, no group, no flags.
        let fd = unsafe {
            libc::syscall(libc::SYS_perf_event_open, &attr as *const PerfEventAttr, 0, -1, -1, 0)
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: a fresh descriptor the kernel just handed us, owned from here on.
        Some(SyscallCounter { fd: unsafe { OwnedFd::from_raw_fd(fd as i32) } })
    }

    /// The count so far. The `read` that takes it is itself counted: two back-to-back calls
    /// differ by one.
    pub fn get(&self) -> u64 {
        let mut v = 0u64;
        // SAFETY: reading 8 bytes into a local u64 from our own descriptor.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if n == 8 {
            v
        } else {
            0
        }
    }

    /// System calls `f` makes, over `n` runs, per run (the counter's own reads left out).
    pub fn per_call(&self, n: u32, mut f: impl FnMut()) -> f64 {
        let a = self.get();
        for _ in 0..n {
            f();
        }
        let b = self.get();
        b.saturating_sub(a).saturating_sub(1) as f64 / f64::from(n.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where a counter can be had, it sees exactly the system calls made.
    #[test]
    fn counts_getpid_calls() {
        let Some(c) = SyscallCounter::open() else {
            eprintln!("no syscall tracepoint counter here; skipped");
            return;
        };
        // SAFETY: getppid has no preconditions (getpid may be cached by libc; getppid is not).
        let per = c.per_call(1000, || unsafe {
            std::hint::black_box(libc::getppid());
        });
        assert_eq!(per, 1.0);
    }
}
