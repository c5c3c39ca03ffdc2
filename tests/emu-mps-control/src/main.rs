//! Fake `nvidia-cuda-mps-control`: `-d`/`-f` run the control daemon on the emulated device,
//! no argument is the client that sends stdin commands to it and prints the replies.

mod daemon;
mod device;
mod log;
mod protocol;
mod server;

use std::ffi::OsString;
use std::io::{BufRead, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use daemon::Daemon;
use protocol::Command;

const HELP: &str = "\
nvidia-cuda-mps-control (emulated): the MPS control daemon and its client, driving the
project's emulated GPU instead of a real one.

USAGE:
  nvidia-cuda-mps-control -d      start the control daemon in the background
  nvidia-cuda-mps-control -f      start the control daemon in the foreground
  nvidia-cuda-mps-control         client: read commands from stdin, print the replies
  nvidia-cuda-mps-control -h      this text

COMMANDS (one per line on stdin, e.g. `echo get_server_list | nvidia-cuda-mps-control`):
  get_server_list                                  pids of the MPS servers
  start_server -uid <uid>                          start a server for a user
  get_client_list <server pid>                     pids of a server's clients
  get_device_client_list [<server pid>]            '<device> <client pid>' lines
  set_default_active_thread_percentage <p>         for servers started later (echoes p)
  get_default_active_thread_percentage
  set_active_thread_percentage <server pid> <p>    clients connecting later; running
                                                   clients keep the limit fixed at start
  get_active_thread_percentage <pid>
  set_default_device_pinned_mem_limit <dev> <v>    v like 2G, 512M
  get_default_device_pinned_mem_limit <dev>
  set_device_pinned_mem_limit <server pid> <dev> <v>
  terminate_client <server pid> <client pid>       fail that client's GPU work
  quit [-t <s>]                                    stop servers and daemon, reset MPS

ENVIRONMENT:
  CUDA_MPS_PIPE_DIRECTORY   control socket, pid file       [default: /tmp/nvidia-mps]
  CUDA_MPS_LOG_DIRECTORY    control.log                    [default: /var/log/nvidia-mps]
  plus the emulator's device state variables (see the emu-device crate).";

const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
const MAX_LINE: u64 = 4096;

static TERM: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: libc::c_int) {
    TERM.store(true, Ordering::SeqCst);
}

fn pipe_dir() -> PathBuf {
    absolute(
        std::env::var_os("CUDA_MPS_PIPE_DIRECTORY")
            .map_or_else(|| "/tmp/nvidia-mps".into(), PathBuf::from),
    )
}

fn log_dir() -> PathBuf {
    absolute(
        std::env::var_os("CUDA_MPS_LOG_DIRECTORY")
            .map_or_else(|| "/var/log/nvidia-mps".into(), PathBuf::from),
    )
}

fn absolute(p: PathBuf) -> PathBuf {
    if p.is_absolute() {
        p
    } else {
        std::env::current_dir().map(|d| d.join(&p)).unwrap_or(p)
    }
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap_or("?")).collect();
    match args.as_slice() {
        [] => client(),
        ["-d"] => run_daemon(true),
        ["-f"] => run_daemon(false),
        ["-h"] | ["--help"] => {
            println!("{HELP}");
            ExitCode::SUCCESS
        }
        ["-v"] => {
            println!("emu-mps-control {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        [server::FLAG, uid] => server::run(uid),
        _ => {
            eprintln!("nvidia-cuda-mps-control: unknown arguments {args:?} (see -h)");
            ExitCode::from(2)
        }
    }
}

/// Client mode: one connection per stdin command, replies printed as they come.
fn client() -> ExitCode {
    let sock = pipe_dir().join("control");
    if UnixStream::connect(&sock).is_err() {
        println!("Cannot find MPS control daemon process");
        return ExitCode::FAILURE;
    }
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        match send(&sock, &line) {
            Ok(reply) => {
                if !reply.is_empty() {
                    println!("{}", reply.trim_end_matches('\n'));
                }
            }
            Err(e) => {
                println!("Cannot find MPS control daemon process");
                eprintln!("nvidia-cuda-mps-control: {}: {e}", sock.display());
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

fn send(sock: &Path, line: &str) -> std::io::Result<String> {
    let mut s = UnixStream::connect(sock)?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    s.write_all(line.trim().as_bytes())?;
    s.write_all(b"\n")?;
    s.shutdown(std::net::Shutdown::Write)?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

fn run_daemon(background: bool) -> ExitCode {
    match daemon_main(background) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvidia-cuda-mps-control: {e}");
            ExitCode::FAILURE
        }
    }
}

fn daemon_main(background: bool) -> Result<(), String> {
    let (pipe, logs) = (pipe_dir(), log_dir());
    std::fs::create_dir_all(&pipe)
        .map_err(|e| format!("creating pipe directory {}: {e}", pipe.display()))?;
    let sock = pipe.join("control");
    if UnixStream::connect(&sock).is_ok() {
        return Err("An instance of this daemon is already running".into());
    }
    let device = device::EmuLink::open(&sock)?;
    let log = log::ControlLog::open(&logs)
        .map_err(|e| format!("opening {}/control.log: {e}", logs.display()))?;
    let _ = std::fs::remove_file(&sock);
    let listener =
        UnixListener::bind(&sock).map_err(|e| format!("binding {}: {e}", sock.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("locating own executable: {e}"))?;
    let server_log = log::ControlLog::open_server(&logs)
        .map_err(|e| format!("opening {}/server.log: {e}", logs.display()))?;
    let mut d = Daemon::new(device, log, vec![exe.into(), server::FLAG.into()]).with_server_log(server_log);
    let ready = if background {
        let fd = daemonize()?;
        d.refresh_log_pids();
        Some(fd)
    } else {
        None
    };
    // Named as the real daemon's process is (`nvidia-cuda-mps-control`, cut to 15 bytes):
    // mps-manager signals a pid its pid file names only when it is an MPS process.
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"nvidia-cuda-mps".as_ptr()) };
    if let Err(e) = std::fs::write(pipe.join(PID_FILE), format!("{}\n", std::process::id())) {
        d.log().line(&format!("Cannot write pid file: {e}"));
        return Err(format!("writing pid file: {e}"));
    }
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores an atomic (async-signal-safe).
        unsafe {
            libc::signal(
                sig,
                on_term as extern "C" fn(libc::c_int) as libc::sighandler_t,
            )
        };
    }
    d.log().line(&format!(
        "Starting control daemon using socket {}",
        sock.display()
    ));
    d.log().line(&format!(
        "To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={}",
        pipe.display()
    ));
    if let Err(e) = d.start() {
        d.log()
            .line(&format!("Cannot turn MPS on in the device: {e}"));
        return Err(format!("cannot turn MPS on in the emulated device: {e}"));
    }
    if let Some(fd) = ready {
        // The parent of `-d` exits 0 only now: socket, pid file and MPS mode are all in place.
        let _ = std::fs::File::from(fd).write_all(b"1");
    }
    serve(&mut d, &listener, &sock);
    let _ = std::fs::remove_file(&sock);
    let _ = std::fs::remove_file(pipe.join(PID_FILE));
    Ok(())
}

/// Accept loop: one command per connection; device polled every 20 ms.
///
/// Emulator behaviour: when the control socket disappears (its pipe directory was removed, as
/// when a test's scratch host is deleted) nobody can reach the daemon any more, so it shuts
/// down like on `quit` instead of lingering.
fn serve<D: daemon::DeviceLink>(d: &mut Daemon<D>, listener: &UnixListener, sock: &Path) {
    let _ = listener.set_nonblocking(true);
    let mut last_poll = Instant::now() - Duration::from_secs(1);
    let mut last_sock_check = Instant::now();
    loop {
        if TERM.load(Ordering::SeqCst) {
            d.log().line("Received termination signal");
            d.shutdown(0);
            return;
        }
        if last_sock_check.elapsed() >= Duration::from_millis(500) {
            last_sock_check = Instant::now();
            if !sock.exists() {
                d.log().line(&format!(
                    "Control socket {} is gone; exiting",
                    sock.display()
                ));
                d.shutdown(0);
                return;
            }
        }
        if last_poll.elapsed() >= Duration::from_millis(20) {
            d.poll();
            last_poll = Instant::now();
        }
        match listener.accept() {
            Ok((conn, _)) => {
                if handle_conn(d, conn) {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => {
                d.log().line(&format!("accept failed: {e}"));
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Serves one connection; true when the daemon must exit.
fn handle_conn<D: daemon::DeviceLink>(d: &mut Daemon<D>, mut conn: UnixStream) -> bool {
    d.log().line("Accepting connection...");
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
    let mut line = String::new();
    if let Err(e) = std::io::BufReader::new((&mut conn).take(MAX_LINE)).read_line(&mut line) {
        d.log()
            .line(&format!("User did not send valid command: {e}"));
        return false;
    }
    let reply = match Command::parse(&line) {
        Ok(Some(cmd)) => d.command(cmd),
        Ok(None) => daemon::Reply::default(),
        Err(e) => daemon::Reply {
            text: e.to_string(),
            quit: false,
        },
    };
    if !reply.text.is_empty() {
        let _ = conn.write_all(reply.text.as_bytes());
        let _ = conn.write_all(b"\n");
    }
    reply.quit
}

/// Daemonisation: fork, new session, stdio to /dev/null. The parent waits on a pipe until the
/// child reports it is ready (returned write end) and exits 0, or exits 1 if the child dies
/// first, so `nvidia-cuda-mps-control -d` returning 0 means the daemon answers commands.
fn daemonize() -> Result<std::os::fd::OwnedFd, String> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: pipe2(2) writes two descriptors into the array; CLOEXEC keeps them out of the
    // server processes the daemon spawns.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: called before any thread is started, so the child is a complete copy.
    match unsafe { libc::fork() } {
        -1 => return Err(format!("fork: {}", std::io::Error::last_os_error())),
        0 => drop(rd),
        _ => {
            drop(wr);
            let mut byte = [0u8; 1];
            let ok = matches!(std::fs::File::from(rd).read(&mut byte), Ok(1));
            if !ok {
                eprintln!("nvidia-cuda-mps-control: the daemon failed to start (see control.log in CUDA_MPS_LOG_DIRECTORY)");
            }
            // SAFETY: _exit ends the parent without running the child's share of destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) }
        }
    }
    // SAFETY: plain syscalls on our own process; the path literal is NUL-terminated.
    unsafe {
        libc::setsid();
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            libc::dup2(null, 2);
            if null > 2 {
                libc::close(null);
            }
        }
        libc::chdir(c"/".as_ptr());
    }
    Ok(wr)
}
