//! The emulated `nvidia-cuda-mps-server`: a real process (so its pid is real and it can crash
//! or be killed) that lives as long as its control daemon.

use std::process::ExitCode;
use std::time::Duration;

/// Hidden argument that runs this binary as a server.
pub const FLAG: &str = "--emu-server";

/// Names the process `nvidia-cuda-mps-server` and waits until the daemon goes away.
///
/// Like the real server, it runs as the user it serves: a root daemon starts it as `uid`, so
/// `/proc/<pid>/status` shows whose server it is.
pub fn run(uid: &str) -> ExitCode {
    let _ = uid;
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"nvidia-cuda-mps".as_ptr()) };
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    // SAFETY: as above.
    while unsafe { libc::getppid() } == parent {
        std::thread::sleep(Duration::from_millis(100));
    }
    ExitCode::SUCCESS
}
