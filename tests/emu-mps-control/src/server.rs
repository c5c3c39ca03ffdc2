//! The emulated `nvidia-cuda-mps-server`: a real process (so its pid is real and it can crash
//! or be killed) that lives as long as its control daemon.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use emu_device::Device;

/// Hidden argument that runs this binary as a server.
pub const FLAG: &str = "--emu-server";

/// Set by SIGTERM (how the daemon stops a server): the context is given back before exit.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: libc::c_int) {
    // Async-signal-safe: one atomic store.
    STOP.store(true, Ordering::SeqCst);
}

/// Names the process `nvidia-cuda-mps-server`, creates the context its clients share on the
/// emulated device (it holds that memory, and NVML lists it, as a real server does), and
/// waits until the daemon goes away; then gives the context back.
///
/// Like the real server, it runs as the user it serves: a root daemon starts it as `uid`, so
/// `/proc/<pid>/status` shows whose server it is. A server that cannot create its context
/// (no device, or not enough free memory) exits with an error, as a real one fails to start;
/// the daemon then fails its clients.
pub fn run(uid: &str) -> ExitCode {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"nvidia-cuda-mps".as_ptr()) };
    let held = Device::open_from_env().and_then(|d| {
        let c = d.attach()?;
        match d.mps_server_context(&c) {
            Ok(()) => Ok((d, c)),
            Err(e) => {
                d.detach(&c);
                Err(e)
            }
        }
    });
    let (dev, client) = match held {
        Ok(h) => h,
        Err(e) => {
            eprintln!("nvidia-cuda-mps-server (user {uid}): cannot create the shared context: {e}");
            return ExitCode::FAILURE;
        }
    };
    // SAFETY: the handler only stores to an atomic; the cast is how signal(2) takes one.
    unsafe { libc::signal(libc::SIGTERM, on_term as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    // SAFETY: as above.
    while unsafe { libc::getppid() } == parent && !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(10));
    }
    dev.context_destroyed(&client);
    dev.detach(&client);
    ExitCode::SUCCESS
}
