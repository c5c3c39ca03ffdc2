//! Client of `nvidia-cuda-mps-control`: starts the control daemon (`-d`) with per-GPU pipe and
//! log directories, sends stdin commands with a timeout, parses the replies.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Pid file the control daemon writes into its pipe directory.
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";

/// The pipe directory of an MPS process started without `CUDA_MPS_PIPE_DIRECTORY` (NVIDIA's
/// default).
pub const DEFAULT_PIPE_DIR: &str = "/tmp/nvidia-mps";

/// Seconds a process may appear to have started after its pid file was written before it is
/// taken for a recycled pid: `btime` in `/proc/stat` has 1 s resolution and moves with clock
/// adjustments.
pub const PID_FILE_SLACK_S: f64 = 2.0;

/// A control daemon process as pid + start time (clock ticks since boot), so that a signal
/// meant for it can never reach a process that got its pid later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DaemonId {
    /// Process id.
    pub pid: u32,
    /// `/proc/<pid>/stat` field 22.
    pub start_time: u64,
}

/// Start of a process in Unix seconds, from its start time in clock ticks since boot and the
/// boot time in `/proc/stat`.
fn started_unix(start_ticks: u64) -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let btime: f64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| btime + start_ticks as f64 / hz as f64)
}

/// What went wrong talking to MPS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MpsError {
    /// The control program did not answer within the timeout (daemon hang).
    Timeout {
        /// The command sent.
        command: String,
        /// How long it waited, ms.
        after_ms: u64,
    },
    /// No control daemon is listening.
    NoDaemon,
    /// The program could not be started.
    Spawn(String),
    /// The daemon answered with an error text.
    Rejected {
        /// The command sent.
        command: String,
        /// The daemon's reply.
        reply: String,
    },
}

impl std::fmt::Display for MpsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MpsError::Timeout { command, after_ms } => write!(
                f,
                "MPS control did not answer `{command}` within {after_ms} ms"
            ),
            MpsError::NoDaemon => write!(f, "no MPS control daemon is running"),
            MpsError::Spawn(e) => write!(f, "cannot run the MPS control program: {e}"),
            MpsError::Rejected { command, reply } => {
                write!(f, "MPS control rejected `{command}`: {reply}")
            }
        }
    }
}

/// How to reach one GPU's MPS control daemon.
#[derive(Debug, Clone)]
pub struct MpsControl {
    /// The control program (`nvidia-cuda-mps-control`).
    pub bin: PathBuf,
    /// `CUDA_MPS_PIPE_DIRECTORY` of the daemon.
    pub pipe_dir: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY` of the daemon.
    pub log_dir: PathBuf,
    /// Value for `CUDA_VISIBLE_DEVICES` of the daemon (the GPU it serves).
    pub visible_devices: String,
    /// Longest wait for one command's answer (a longer one is a daemon hang).
    pub timeout: Duration,
    /// The directory the daemon gets as its `/dev/shm` (`None`: the host's), see
    /// [`crate::config::Config::shm_dir`].
    pub shm_dir: Option<PathBuf>,
}

/// The value of `name` in the environment process `pid` started with (`/proc/<pid>/environ`;
/// root reads any process's), if set.
pub fn daemon_env(pid: u32, name: &str) -> Option<std::ffi::OsString> {
    use std::os::unix::ffi::OsStrExt;
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0).find_map(|kv| {
        let v = kv.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
        Some(std::ffi::OsStr::from_bytes(v).to_os_string())
    })
}

/// Device and inode numbers of `p` (what tells two paths to one directory apart from two).
fn file_id(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// Makes `dir` ready to be a `/dev/shm`: mode 1777, owned by root (the manager), as `/dev/shm`
/// is (the MPS server runs as its clients' user and creates its shared memory there). A
/// directory that is not there is created so (its parents as `create_dir_all` makes them); one
/// that is there is taken only when it is already such a directory, never changed: the manager,
/// root, would otherwise make whatever directory `shm_dir` names (a typo: `/`, `/var/lib`)
/// world-writable. A symbolic link or another kind of file is refused.
fn prepare_shm_dir(dir: &Path) -> Result<(), MpsError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
    let err = |why: String| MpsError::Spawn(format!("shm_dir {}: {why}", dir.display()));
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| err(e.to_string()))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {
            // Set through the directory just made (no link followed): mode 1777 as /dev/shm's.
            let f = std::fs::File::options()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
                .open(dir)
                .map_err(|e| err(e.to_string()))?;
            return f
                .set_permissions(std::fs::Permissions::from_mode(0o1777))
                .map_err(|e| err(format!("chmod 1777: {e}")));
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(err(e.to_string())),
    }
    let m = std::fs::symlink_metadata(dir).map_err(|e| err(e.to_string()))?;
    let mode = m.mode() & 0o7777;
    // SAFETY: geteuid has no preconditions.
    let owner = unsafe { libc::geteuid() };
    if !m.file_type().is_dir() || m.uid() != owner || mode != 0o1777 {
        let what = if m.file_type().is_symlink() {
            "a symbolic link".to_string()
        } else if !m.file_type().is_dir() {
            "not a directory".to_string()
        } else {
            format!("a directory of uid {} with mode {mode:o}", m.uid())
        };
        return Err(err(format!(
            "is {what}: an existing shm_dir must be a root-owned directory of mode 1777 (as /dev/shm \
             is); it is never changed into one (a typo could make a system directory world-writable): \
             name a directory that does not exist yet (the manager creates it) or fix this one"
        )));
    }
    Ok(())
}

/// In the forked child, before exec: a mount namespace of its own (a slave of the host's),
/// with `dir` bound over `/dev/shm`. Async-signal-safe: only the `unshare` and `mount` system calls, on strings
/// made before the fork.
fn private_dev_shm(dir: &std::ffi::CStr) -> std::io::Result<()> {
    const DEV_SHM: &std::ffi::CStr = c"/dev/shm";
    const ROOT: &std::ffi::CStr = c"/";
    // SAFETY: plain system calls on NUL-terminated strings that live across them; they touch
    // only the calling (child) process's namespaces.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Slave, not private: nothing done here propagates back to the host's mounts, while the
        // host's unmounts (a pod's volumes torn down later) still reach this namespace, so the
        // long-lived daemon never holds a copy of a mount the host has let go (a private copy
        // would keep its filesystem busy).
        if libc::mount(std::ptr::null(), ROOT.as_ptr(), std::ptr::null(), libc::MS_REC | libc::MS_SLAVE, std::ptr::null()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::mount(dir.as_ptr(), DEV_SHM.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

impl MpsControl {
    fn cmd(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.env("CUDA_MPS_PIPE_DIRECTORY", &self.pipe_dir)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.log_dir)
            .env("CUDA_VISIBLE_DEVICES", &self.visible_devices);
        c
    }

    /// Starts `nvidia-cuda-mps-control -d` and waits for its pid file; returns the daemon pid.
    pub fn start_daemon(&self) -> Result<u32, MpsError> {
        for d in [&self.pipe_dir, &self.log_dir] {
            std::fs::create_dir_all(d)
                .map_err(|e| MpsError::Spawn(format!("{}: {e}", d.display())))?;
        }
        // A daemon that answers on the control socket is never started over (`-d` refuses, and
        // the manager would exit at every start) nor has its pid file removed: it is found
        // without the file ([`MpsControl::daemon_identity`]) or refused naming why.
        if self.control_socket_answers() {
            return self.daemon_identity().map(|d| d.pid).ok_or_else(|| {
                MpsError::Spawn(format!(
                    "a control daemon answers on {} but none of this pipe directory's MPS processes \
                     could be told to be it (pid file {} names {}; no live {DAEMON_COMM} process of \
                     this pid namespace started for this pipe directory holds the socket): not \
                     adopted, not started again; stop it (`echo quit | nvidia-cuda-mps-control` with \
                     CUDA_MPS_PIPE_DIRECTORY={}) once its clients allow",
                    self.pipe_dir.join("control").display(),
                    self.pipe_dir.join(PID_FILE).display(),
                    self.pid_file_pid().map_or("no process".into(), |p| format!("pid {p}")),
                    self.pipe_dir.display()
                ))
            });
        }
        let _ = std::fs::remove_file(self.pipe_dir.join(PID_FILE));
        let mut cmd = self.cmd();
        if let Some(dir) = &self.shm_dir {
            prepare_shm_dir(dir)?;
            use std::os::unix::ffi::OsStrExt;
            use std::os::unix::process::CommandExt;
            let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
                .map_err(|_| MpsError::Spawn(format!("shm_dir {} has a NUL byte", dir.display())))?;
            // SAFETY: the closure runs in the forked child before exec and makes system calls
            // only (`private_dev_shm`), on a string allocated before the fork.
            unsafe { cmd.pre_exec(move || private_dev_shm(&c)) };
        }
        let mut child = cmd
            .arg("-d")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| match &self.shm_dir {
                // EPERM from unshare/mount in the child.
                Some(d) if e.kind() == std::io::ErrorKind::PermissionDenied => MpsError::Spawn(format!(
                    "{}: giving the control daemon {} as its /dev/shm needs root (a mount namespace of its own): {e}; \
                     shm_dir = \"host\" keeps the host's /dev/shm",
                    self.bin.display(),
                    d.display()
                )),
                _ => MpsError::Spawn(format!("{}: {e}", self.bin.display())),
            })?;
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                if !st.success() {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = e.read_to_string(&mut err);
                    }
                    return Err(MpsError::Spawn(format!(
                        "`{} -d` exited with {st}: {}",
                        self.bin.display(),
                        err.trim()
                    )));
                }
                break;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(MpsError::Timeout {
                    command: "-d".into(),
                    after_ms: self.timeout.as_millis() as u64,
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        while Instant::now() < deadline {
            if let Some(pid) = self.daemon_pid() {
                return Ok(pid);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // A live MPS process its pid file names that was started for another pipe directory
        // (a control program that does not pass CUDA_MPS_PIPE_DIRECTORY on): say that.
        if let Some(pid) = self.pid_file_pid().filter(|&p| is_mps_process(p) && !self.serves_pipe_dir(p)) {
            return Err(MpsError::Spawn(format!(
                "control daemon {pid} (from {}) was started with CUDA_MPS_PIPE_DIRECTORY={} (unset: {DEFAULT_PIPE_DIR}), \
                 not this pipe_dir: not taken for its MPS control daemon (does control_bin {} pass the \
                 environment on?)",
                self.pipe_dir.join(PID_FILE).display(),
                daemon_env(pid, "CUDA_MPS_PIPE_DIRECTORY").map_or("(unset)".into(), |v| v.to_string_lossy().into_owned()),
                self.bin.display()
            )));
        }
        // A live daemon its pid file names, but not named as NVIDIA's: say that, not a timeout.
        if let Some(pid) = self.pid_file_pid().filter(|&p| !is_mps_process(p)) {
            if let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) {
                return Err(MpsError::Spawn(format!(
                    "control daemon {pid} (from {}) is named `{}`, not `{DAEMON_COMM}` as NVIDIA's MPS \
                     processes are: not taken for the MPS control daemon (is control_bin {} \
                     nvidia-cuda-mps-control?)",
                    self.pipe_dir.join(PID_FILE).display(),
                    comm.trim_end(),
                    self.bin.display()
                )));
            }
        }
        Err(MpsError::Timeout {
            command: "-d (pid file)".into(),
            after_ms: self.timeout.as_millis() as u64,
        })
    }

    /// Whether the control daemon `pid` sees [`MpsControl::shm_dir`] (or the host's `/dev/shm`
    /// when none) as its `/dev/shm`, judged by device and inode numbers through
    /// `/proc/<pid>/root` (its mount namespace): `Err` says what it sees instead. Its MPS
    /// servers inherit its mounts, so its clients must be given that directory.
    pub fn check_daemon_shm(&self, pid: u32) -> Result<(), String> {
        let want_path = self.shm_dir.clone().unwrap_or_else(|| PathBuf::from("/dev/shm"));
        let want = file_id(&want_path);
        let theirs = file_id(&PathBuf::from(format!("/proc/{pid}/root/dev/shm")));
        match (want, theirs) {
            (Some(w), Some(t)) if w == t => Ok(()),
            (_, None) => Err(format!("cannot look at the /dev/shm of MPS control daemon {pid} (/proc/{pid}/root)")),
            _ => Err(format!(
                "MPS control daemon {pid} does not see {} as its /dev/shm: MPS clients given {0} there \
                 cannot attach to its servers' shared memory (CUDA_ERROR_MPS_CONNECTION_FAILED); it was \
                 started with another shm_dir: restart MPS (`echo quit | nvidia-cuda-mps-control` with \
                 CUDA_MPS_PIPE_DIRECTORY={}) once its clients allow",
                want_path.display(),
                self.pipe_dir.display()
            )),
        }
    }

    /// Device and inode numbers of the control daemon's socket (`pipe_dir/control`), if a
    /// socket is there.
    pub fn control_socket_id(&self) -> Option<(u64, u64)> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let m = std::fs::symlink_metadata(self.pipe_dir.join("control")).ok()?;
        m.file_type().is_socket().then(|| (m.dev(), m.ino()))
    }

    /// Pid of the running control daemon per its pid file, if that process is alive and is
    /// the daemon that wrote the file (see [`MpsControl::daemon_identity`]).
    pub fn daemon_pid(&self) -> Option<u32> {
        self.daemon_identity().map(|d| d.pid)
    }

    /// The pid the pid file holds, whatever process (if any) has it now.
    pub fn pid_file_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.pipe_dir.join(PID_FILE))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The control daemon of this pipe directory, as pid + start time: the one the pid file
    /// names ([`MpsControl::pid_file_daemon`]), else, the file missing or not naming it (the pipe
    /// directory is in offline containers' mounts, so a tenant can remove it; a clock stepped
    /// forward makes it look older than its daemon), the one that holds the listening control
    /// socket ([`MpsControl::socket_daemon`]).
    pub fn daemon_identity(&self) -> Option<DaemonId> {
        self.pid_file_daemon().or_else(|| self.socket_daemon())
    }

    /// Process `pid` as this pipe directory's control daemon (pid + start time, `/proc/<pid>/stat`
    /// field 22), if it is alive (not a zombie), is an MPS process by name ([`DAEMON_COMM`]),
    /// lives in the manager's pid namespace (the daemon the manager starts does; a container's
    /// process never is it), was started for this pipe directory
    /// ([`MpsControl::serves_pipe_dir`]) and is not one of its servers. These checks matter
    /// because the pipe directory is mounted into offline containers: one running as root could
    /// write any host pid into the pid file (another GPU's control daemon, an MPS server, a
    /// process of its own named and started as the daemon is), and the manager, root, SIGKILLs
    /// the daemon it recorded when a reset finds it not answering.
    fn daemon_of_this_pipe_dir(&self, pid: u32) -> Option<DaemonId> {
        if !is_mps_process(pid)
            || pid_ns(pid) != Some(node_ledger::procinfo::own_pid_ns())
            || !self.serves_pipe_dir(pid)
            || self.is_server_of_this_pipe_dir(pid)
        {
            return None;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let zombie = stat
            .rfind(')')
            .is_some_and(|i| stat[i + 1..].trim_start().starts_with(['Z', 'X']));
        if zombie {
            return None;
        }
        let start_time = node_ledger::procinfo::parse_start_time(&stat)?;
        Some(DaemonId { pid, start_time })
    }

    /// The control daemon named by the pid file (`MpsControl::daemon_of_this_pipe_dir`), if
    /// it started before the file was written: a process that started later holds a recycled
    /// pid and is not the daemon.
    pub fn pid_file_daemon(&self) -> Option<DaemonId> {
        let file = self.pipe_dir.join(PID_FILE);
        let s = std::fs::read_to_string(&file).ok()?;
        let pid: u32 = s.trim().parse().ok()?;
        let id = self.daemon_of_this_pipe_dir(pid)?;
        let written = std::fs::metadata(&file).and_then(|m| m.modified()).ok();
        if let (Some(written), Some(started)) = (written, started_unix(id.start_time)) {
            let written = written
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            if started > written + PID_FILE_SLACK_S {
                return None;
            }
        }
        Some(id)
    }

    /// The control daemon found without the pid file: the one process that holds a
    /// listening socket bound at `pipe_dir/control` (a socket file is there; `/proc/net/unix`
    /// lists the listeners by the path they were bound at) and is this pipe directory's daemon
    /// by name, pid namespace (a container's process, a tenant's socket put in the daemon's
    /// place, is never taken), environment and parent (`MpsControl::daemon_of_this_pipe_dir`). `None` when no process, or more than one,
    /// qualifies: a daemon is never guessed.
    pub fn socket_daemon(&self) -> Option<DaemonId> {
        let inodes = listening_socket_inodes(self.control_socket_id()?);
        if inodes.is_empty() {
            return None;
        }
        let own_ns = node_ledger::procinfo::own_pid_ns();
        let mut found = None;
        for pid in std::fs::read_dir("/proc").ok()?.flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()) {
            if !is_mps_process(pid) || pid_ns(pid) != Some(own_ns) || !holds_socket(pid, &inodes) {
                continue;
            }
            let Some(id) = self.daemon_of_this_pipe_dir(pid) else { continue };
            if found.replace(id).is_some() {
                return None;
            }
        }
        // Still the process looked at (its pid not reused meanwhile).
        found.filter(|d| node_ledger::procinfo::is_alive(d.pid, d.start_time))
    }

    /// The live MPS processes of this pipe directory (control daemon or server, orphaned ones
    /// included): named as MPS processes are ([`DAEMON_COMM`]), in the manager's pid namespace,
    /// started for this pipe directory ([`MpsControl::serves_pipe_dir`]), not zombies. Read
    /// from `/proc` now, not from an earlier listing: a server started since is found too.
    pub fn live_mps_processes(&self) -> Vec<u32> {
        let own_ns = node_ledger::procinfo::own_pid_ns();
        let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| is_mps_process(pid) && pid_ns(pid) == Some(own_ns) && self.serves_pipe_dir(pid))
            .filter(|&pid| node_ledger::procinfo::start_time(pid).is_some_and(|st| node_ledger::procinfo::is_alive(pid, st)))
            .collect()
    }

    /// Whether something accepts connections on the control socket (`pipe_dir/control`), as
    /// a control daemon running there does.
    pub fn control_socket_answers(&self) -> bool {
        std::os::unix::net::UnixStream::connect(self.pipe_dir.join("control")).is_ok()
    }

    /// Whether process `pid` is one of this pipe directory's MPS servers rather than its
    /// control daemon: its parent is an MPS process of this pipe directory (the daemon starts
    /// its servers; a daemon started with `-d` has left its starter). Servers carry the
    /// daemon's name and environment, so a server's pid written into the pid file (the pipe
    /// directory is in offline containers' mounts) would otherwise be taken for the daemon,
    /// and a later reset would kill it as such.
    fn is_server_of_this_pipe_dir(&self, pid: u32) -> bool {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            return false;
        };
        let ppid = status.lines().find_map(|l| l.strip_prefix("PPid:")).and_then(|v| v.trim().parse::<u32>().ok());
        ppid.is_some_and(|pp| pp > 1 && is_mps_process(pp) && self.serves_pipe_dir(pp))
    }

    /// Whether process `pid` was started for this pipe directory: its start environment's
    /// `CUDA_MPS_PIPE_DIRECTORY` (unset: NVIDIA's default [`DEFAULT_PIPE_DIR`]; relative: from
    /// its working directory) is [`MpsControl::pipe_dir`], judged by device and inode numbers
    /// when both paths can be looked at, else by the paths themselves. Each GPU's daemon has
    /// its own pipe directory, so another GPU's daemon is never taken for this one's.
    pub fn serves_pipe_dir(&self, pid: u32) -> bool {
        let theirs = daemon_env(pid, "CUDA_MPS_PIPE_DIRECTORY").map_or_else(|| PathBuf::from(DEFAULT_PIPE_DIR), PathBuf::from);
        let theirs = if theirs.is_absolute() {
            theirs
        } else {
            match std::fs::read_link(format!("/proc/{pid}/cwd")) {
                Ok(cwd) => cwd.join(theirs),
                Err(_) => return false,
            }
        };
        match (file_id(&theirs), file_id(&self.pipe_dir)) {
            (Some(a), Some(b)) => a == b,
            _ => theirs == self.pipe_dir,
        }
    }

    /// Sends one command line; returns the reply text (trimmed).
    pub fn command(&self, line: &str) -> Result<String, MpsError> {
        let mut child = self
            .cmd()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| MpsError::Spawn(format!("{}: {e}", self.bin.display())))?;
        if let Some(mut i) = child.stdin.take() {
            let _ = i.write_all(line.as_bytes());
            let _ = i.write_all(b"\n");
        }
        let mut out = child.stdout.take().expect("stdout piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            let _ = tx.send(s);
        });
        let reply = match rx.recv_timeout(self.timeout) {
            Ok(s) => s,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(MpsError::Timeout {
                    command: line.to_string(),
                    after_ms: self.timeout.as_millis() as u64,
                });
            }
        };
        let _ = child.wait();
        let reply = reply.trim().to_string();
        if reply.contains("Cannot find MPS control daemon") {
            return Err(MpsError::NoDaemon);
        }
        if reply.starts_with("Invalid") || reply.starts_with("Error") || reply.contains("not found")
        {
            return Err(MpsError::Rejected {
                command: line.to_string(),
                reply,
            });
        }
        Ok(reply)
    }

    /// `get_server_list`: pids of running MPS servers.
    pub fn server_list(&self) -> Result<Vec<u32>, MpsError> {
        Ok(parse_pids(&self.command("get_server_list")?))
    }

    /// `get_client_list <server>`.
    pub fn client_list(&self, server: u32) -> Result<Vec<u32>, MpsError> {
        Ok(parse_pids(
            &self.command(&format!("get_client_list {server}"))?,
        ))
    }

    /// `set_active_thread_percentage <pid> <pct>`.
    pub fn set_percentage(&self, pid: u32, pct: f64) -> Result<(), MpsError> {
        self.command(&format!("set_active_thread_percentage {pid} {pct:.1}"))
            .map(|_| ())
    }

    /// `set_default_active_thread_percentage <pct>`.
    pub fn set_default_percentage(&self, pct: f64) -> Result<(), MpsError> {
        self.command(&format!("set_default_active_thread_percentage {pct:.1}"))
            .map(|_| ())
    }

    /// `shutdown_server <server> -f`: ends the server at once, and its clients' work with it
    /// (NVIDIA's MPS docs: what a server that a faulty kernel keeps busy for ever needs); the
    /// control daemon stays and starts a new server for the next client.
    pub fn force_shutdown_server(&self, server: u32) -> Result<(), MpsError> {
        self.command(&format!("shutdown_server {server} -f")).map(|_| ())
    }

    /// `quit`: stops servers and the daemon (MPS reset).
    pub fn quit(&self) -> Result<(), MpsError> {
        self.command("quit").map(|_| ())
    }

    /// Pipe directory of this daemon.
    pub fn pipe_dir(&self) -> &Path {
        &self.pipe_dir
    }
}

/// `/proc/<pid>/comm` of NVIDIA's MPS processes: the control daemon (`nvidia-cuda-mps-control`)
/// and its servers (`nvidia-cuda-mps-server`), cut to the kernel's 15 bytes.
pub const DAEMON_COMM: &str = "nvidia-cuda-mps";

/// The sockfs inodes of the listening unix sockets bound at a path that now names the socket
/// file with device and inode numbers `sock` (`/proc/net/unix`: `Num RefCount Protocol Flags Type St Inode Path`; a
/// listening socket has flag `__SO_ACCEPTCON`, 0x10000). Only absolute paths are looked at.
fn listening_socket_inodes(sock: (u64, u64)) -> Vec<u64> {
    use std::os::unix::fs::MetadataExt;
    const ACCEPTCON: u32 = 0x10000;
    let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut rest = line;
            let mut fields = [""; 7];
            for f in &mut fields {
                rest = rest.trim_start();
                let end = rest.find(' ').unwrap_or(rest.len());
                (*f, rest) = rest.split_at(end);
            }
            let path = rest.strip_prefix(' ').filter(|p| p.starts_with('/'))?;
            let listening = u32::from_str_radix(fields[3], 16).is_ok_and(|f| f & ACCEPTCON != 0);
            let m = std::fs::symlink_metadata(path).ok()?;
            (listening && (m.dev(), m.ino()) == sock).then(|| fields[6].parse().ok())?
        })
        .collect()
}

/// Whether process `pid` has one of the sockets `inodes` open (`/proc/<pid>/fd`).
fn holds_socket(pid: u32, inodes: &[u64]) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).ok().and_then(|l| {
            l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse::<u64>().ok()
        }).is_some_and(|i| inodes.contains(&i))
    })
}

/// The pid namespace of process `pid` (inode of `/proc/<pid>/ns/pid`).
fn pid_ns(pid: u32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok().map(|m| m.ino())
}

/// Whether `pid` is an MPS process by name ([`DAEMON_COMM`]).
pub fn is_mps_process(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end_matches('\n') == DAEMON_COMM)
}

/// Parses one pid per line, ignoring anything else.
pub fn parse_pids(text: &str) -> Vec<u32> {
    text.lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// A stand-in control daemon for tests: a script named `nvidia-cuda-mps-control` in `dir`, so
/// its process is named as the real daemon's ([`DAEMON_COMM`]), that sleeps `$1` seconds
/// (default 30). Returns its path.
#[cfg(test)]
pub(crate) fn mps_named_sleeper(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("nvidia-cuda-mps-control");
    std::fs::write(&p, "#!/bin/sh\nsleep \"${1:-30}\"\n").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// Starts [`mps_named_sleeper`] with `CUDA_MPS_PIPE_DIRECTORY` set to `pipe_dir` (unset when
/// `None`), as a daemon of that pipe directory is, and waits (at most 5 s) until the kernel
/// shows its name: a spawn can return before the child's exec has renamed it
/// (`/proc/<pid>/comm` is set after the vfork parent is released).
#[cfg(test)]
pub(crate) fn spawn_mps_named(dir: &Path, pipe_dir: Option<&Path>) -> std::process::Child {
    let mut cmd = std::process::Command::new(mps_named_sleeper(dir));
    match pipe_dir {
        Some(p) => cmd.env("CUDA_MPS_PIPE_DIRECTORY", p),
        None => cmd.env_remove("CUDA_MPS_PIPE_DIRECTORY"),
    };
    let child = cmd.spawn().unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while !is_mps_process(child.id()) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
    }
    child
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A stand-in control program (shell) with a scripted reply, to test timeouts and parsing;
    /// the real protocol is exercised against the emulator in the e2e tests.
    fn script(dir: &Path, body: &str) -> MpsControl {
        let p = dir.join("ctl.sh");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        MpsControl {
            bin: p,
            pipe_dir: dir.join("pipe"),
            log_dir: dir.join("log"),
            visible_devices: "0".into(),
            timeout: Duration::from_millis(300),
            shm_dir: None,
        }
    }

    /// With `shm_dir` the daemon runs in a mount namespace of its own with the directory over
    /// `/dev/shm` (and the host's `/dev/shm` untouched); `check_daemon_shm` tells it from a
    /// daemon that sees another. Root only (a mount namespace); said and skipped otherwise.
    #[test]
    fn the_daemon_gets_shm_dir_as_its_dev_shm_and_the_check_sees_it() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root for a mount namespace");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        // The stand-in daemon: says which /dev/shm it sees, then stays (as `-d` leaves one).
        let daemon = mps_named_sleeper(d.path());
        let mut c = script(
            d.path(),
            &format!(
                "stat -c '%d %i %a' /dev/shm > \"$CUDA_MPS_PIPE_DIRECTORY/seen\"\n\
                 '{}' </dev/null >/dev/null 2>&1 &\n\
                 echo $! > \"$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid\"",
                daemon.display()
            ),
        );
        let shm = d.path().join("shm");
        c.shm_dir = Some(shm.clone());
        let pid = c.start_daemon().expect("daemon started");
        let seen = std::fs::read_to_string(c.pipe_dir.join("seen")).unwrap();
        let want = file_id(&shm).unwrap();
        assert_eq!(seen.trim(), format!("{} {} 1777", want.0, want.1), "the directory, mode 1777, as its /dev/shm");
        assert_eq!(c.check_daemon_shm(pid), Ok(()));
        assert_ne!(file_id(Path::new("/dev/shm")), Some(want), "the host's /dev/shm untouched");
        // A manager configured for the host's /dev/shm judges this daemon wrong, naming it.
        let host = MpsControl { shm_dir: None, ..c.clone() };
        let e = host.check_daemon_shm(pid).unwrap_err();
        assert!(e.contains("does not see /dev/shm as its /dev/shm") && e.contains("restart MPS"), "{e}");
        // SAFETY: kill(2) of the stand-in daemon this test started.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }

    #[test]
    fn a_pid_file_older_than_its_process_names_no_daemon() {
        let d = tempfile::tempdir().unwrap();
        let c = script(d.path(), "true");
        std::fs::create_dir_all(&c.pipe_dir).unwrap();
        let mut child = spawn_mps_named(d.path(), Some(&c.pipe_dir));
        let file = c.pipe_dir.join(PID_FILE);
        std::fs::write(&file, format!("{}\n", child.id())).unwrap();
        let id = c.daemon_identity().expect("written after its process started");
        assert_eq!(id.pid, child.id());
        assert_eq!(
            Some(id.start_time),
            node_ledger::procinfo::start_time(child.id())
        );
        // The file is a minute older than the process now holding its pid: a recycled pid.
        let old = std::time::SystemTime::now() - Duration::from_secs(60);
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert_eq!(c.daemon_identity(), None);
        assert_eq!(c.daemon_pid(), None);
        assert_eq!(c.pid_file_pid(), Some(child.id()));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// The pid file names a live process, written after it started, that is no MPS process by
    /// name (a root process in an offline container can write any host pid there): no daemon.
    #[test]
    fn a_pid_file_naming_a_process_not_named_as_mps_names_no_daemon() {
        let d = tempfile::tempdir().unwrap();
        let c = script(d.path(), "true");
        std::fs::create_dir_all(&c.pipe_dir).unwrap();
        let mut other = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        std::fs::write(c.pipe_dir.join(PID_FILE), format!("{}\n", other.id())).unwrap();
        assert_eq!(c.daemon_identity(), None);
        assert!(!is_mps_process(other.id()));
        other.kill().unwrap();
        other.wait().unwrap();
        let mut mps = spawn_mps_named(d.path(), Some(&c.pipe_dir));
        std::fs::write(c.pipe_dir.join(PID_FILE), format!("{}\n", mps.id())).unwrap();
        assert_eq!(c.daemon_identity().map(|i| i.pid), Some(mps.id()));
        mps.kill().unwrap();
        mps.wait().unwrap();
    }

    /// The pid file names a live MPS process started for another pipe directory (another
    /// GPU's control daemon, one started with NVIDIA's default, a tenant's pick): not this
    /// pipe directory's daemon. The same directory reached by another path is.
    #[test]
    fn a_pid_file_naming_an_mps_process_of_another_pipe_dir_names_no_daemon() {
        let d = tempfile::tempdir().unwrap();
        let c = script(d.path(), "true");
        std::fs::create_dir_all(&c.pipe_dir).unwrap();
        let other = d.path().join("gpu1-pipe");
        std::fs::create_dir_all(&other).unwrap();
        for env in [Some(other.as_path()), None] {
            let mut mps = spawn_mps_named(d.path(), env);
            std::fs::write(c.pipe_dir.join(PID_FILE), format!("{}\n", mps.id())).unwrap();
            assert!(is_mps_process(mps.id()));
            assert_eq!(c.daemon_identity(), None, "a daemon of {env:?} taken for this pipe dir's");
            mps.kill().unwrap();
            mps.wait().unwrap();
        }
        let alias = d.path().join("alias");
        std::os::unix::fs::symlink(&c.pipe_dir, &alias).unwrap();
        let mut mps = spawn_mps_named(d.path(), Some(&alias));
        std::fs::write(c.pipe_dir.join(PID_FILE), format!("{}\n", mps.id())).unwrap();
        assert_eq!(c.daemon_identity().map(|i| i.pid), Some(mps.id()), "the same directory by another path");
        mps.kill().unwrap();
        mps.wait().unwrap();
    }

    /// A process of another pid namespace (a container's), named and started as this pipe
    /// directory's daemon is and written into the pid file after it started, is no daemon: the
    /// socket path already refused it, the pid file adopted it. Runs the decoy under
    /// `unshare --pid --fork` (root, else a user namespace: `-Urpf`); says so and passes
    /// vacuously where neither works.
    #[test]
    fn a_pid_file_naming_a_process_of_another_pid_namespace_names_no_daemon() {
        let d = tempfile::tempdir().unwrap();
        let c = script(d.path(), "true");
        std::fs::create_dir_all(&c.pipe_dir).unwrap();
        let sleeper = mps_named_sleeper(d.path());
        let own = node_ledger::procinfo::own_pid_ns();
        let decoy = [&["--pid", "--fork"][..], &["-Urpf"][..]].into_iter().find_map(|flags| {
            let mut unshare = Command::new("unshare")
                .args(flags)
                .arg(&sleeper)
                .env("CUDA_MPS_PIPE_DIRECTORY", &c.pipe_dir)
                .stderr(Stdio::null())
                .spawn()
                .ok()?;
            let end = Instant::now() + Duration::from_secs(5);
            while Instant::now() < end && unshare.try_wait().ok()?.is_none() {
                let kids = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", unshare.id())).unwrap_or_default();
                if let Some(k) = kids.split_whitespace().filter_map(|k| k.parse::<u32>().ok()).find(|&k| is_mps_process(k)) {
                    return Some((unshare, k));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = unshare.kill();
            let _ = unshare.wait();
            None
        });
        let Some((mut unshare, pid)) = decoy else {
            eprintln!("skipped: `unshare --pid --fork` and `unshare -Urpf` cannot make a pid namespace here");
            return;
        };
        std::fs::write(c.pipe_dir.join(PID_FILE), format!("{pid}\n")).unwrap();
        // All the daemon's marks but its namespace.
        let marks = (is_mps_process(pid), c.serves_pipe_dir(pid), c.is_server_of_this_pipe_dir(pid), pid_ns(pid) == Some(own));
        let found = c.daemon_identity();
        // SAFETY: kill(2) of the decoy this test started (its namespace's init: the
        // namespace goes with it).
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        let _ = unshare.kill();
        let _ = unshare.wait();
        assert_eq!(marks, (true, true, false, false), "the decoy is not what this test needs");
        assert_eq!(found, None, "a process of another pid namespace taken for the daemon");
    }

    /// A server of this pipe directory (named and started as the daemon is, its child) in the
    /// pid file is no daemon: adopted, a reset would kill it as the daemon.
    #[test]
    fn a_pid_file_naming_one_of_this_pipe_dirs_servers_names_no_daemon() {
        let d = tempfile::tempdir().unwrap();
        let c = script(d.path(), "true");
        std::fs::create_dir_all(&c.pipe_dir).unwrap();
        let srv_dir = d.path().join("srv");
        std::fs::create_dir_all(&srv_dir).unwrap();
        let server = mps_named_sleeper(&srv_dir);
        let dmn_dir = d.path().join("dmn");
        std::fs::create_dir_all(&dmn_dir).unwrap();
        let daemon = dmn_dir.join("nvidia-cuda-mps-control");
        std::fs::write(&daemon, format!("#!/bin/sh
\"{}\" 30 &\nsleep 30\n", server.display())).unwrap();
        std::fs::set_permissions(&daemon, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut dmn = std::process::Command::new(&daemon).env("CUDA_MPS_PIPE_DIRECTORY", &c.pipe_dir).spawn().unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        let srv = loop {
            let kids = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", dmn.id())).unwrap_or_default();
            let found = kids.split_whitespace().filter_map(|k| k.parse::<u32>().ok()).find(|&k| is_mps_process(k));
            if let Some(k) = found {
                break k;
            }
            assert!(Instant::now() < end, "the stand-in server never started");
            std::thread::sleep(Duration::from_millis(5));
        };
        std::fs::write(c.pipe_dir.join(PID_FILE), format!("{srv}\n")).unwrap();
        assert_eq!(c.daemon_identity(), None, "a server taken for the daemon");
        std::fs::write(c.pipe_dir.join(PID_FILE), format!("{}\n", dmn.id())).unwrap();
        assert_eq!(c.daemon_identity().map(|i| i.pid), Some(dmn.id()));
        let _ = std::process::Command::new("kill").arg(srv.to_string()).status();
        dmn.kill().unwrap();
        dmn.wait().unwrap();
    }

    /// Without a pid file the daemon is the one MPS process of this pipe directory that holds
    /// the listening control socket: one that does not hold it (a server, a tenant's process
    /// named as MPS) is never found, nor anything once the socket file is gone.
    #[test]
    fn without_a_pid_file_the_daemon_is_the_holder_of_the_control_socket() {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let d = tempfile::tempdir().unwrap();
        let c = script(d.path(), "true");
        std::fs::create_dir_all(&c.pipe_dir).unwrap();
        let listener = std::os::unix::net::UnixListener::bind(c.pipe_dir.join("control")).unwrap();
        assert!(c.control_socket_answers());
        let mut bystander = spawn_mps_named(d.path(), Some(&c.pipe_dir));
        assert_eq!(c.socket_daemon(), None, "an MPS process of this pipe dir not holding the socket");
        let fd = listener.as_raw_fd();
        let mut cmd = Command::new(mps_named_sleeper(d.path()));
        cmd.env("CUDA_MPS_PIPE_DIRECTORY", &c.pipe_dir);
        // SAFETY: fcntl(2) on a descriptor the child inherits, between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                libc::fcntl(fd, libc::F_SETFD, 0);
                Ok(())
            })
        };
        let mut holder = cmd.spawn().unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        while c.socket_daemon().is_none() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(c.socket_daemon().map(|i| i.pid), Some(holder.id()));
        assert_eq!(c.daemon_identity().map(|i| i.pid), Some(holder.id()), "no pid file: found by the socket");
        // No socket file: nothing to find.
        std::fs::remove_file(c.pipe_dir.join("control")).unwrap();
        assert_eq!(c.socket_daemon(), None);
        for p in [&mut bystander, &mut holder] {
            p.kill().unwrap();
            p.wait().unwrap();
        }
    }

    /// A missing shm_dir is created root-owned with mode 1777; an existing one is taken only
    /// as such, and never chmodded: a directory of another mode or owner, a file and a link
    /// are refused, and left as they were.
    #[test]
    fn shm_dir_is_created_1777_and_an_existing_directory_is_never_changed() {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root (a root-owned directory)");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
        let new = d.path().join("a/b/shm");
        prepare_shm_dir(&new).unwrap();
        assert_eq!((mode(&new), std::fs::metadata(&new).unwrap().uid()), (0o1777, 0));
        prepare_shm_dir(&new).expect("a root-owned 1777 directory is taken as it is");
        let sys = d.path().join("var-lib");
        std::fs::create_dir(&sys).unwrap();
        std::fs::set_permissions(&sys, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = prepare_shm_dir(&sys).unwrap_err().to_string();
        assert!(e.contains("mode 755") && e.contains("never changed"), "{e}");
        assert_eq!(mode(&sys), 0o755, "left as it was");
        let theirs = d.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o1777)).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
        let e = prepare_shm_dir(&theirs).unwrap_err().to_string();
        assert!(e.contains("uid 65534"), "{e}");
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&sys, &link).unwrap();
        let e = prepare_shm_dir(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(mode(&sys), 0o755, "not through the link either");
        let file = d.path().join("file");
        std::fs::write(&file, "").unwrap();
        let e = prepare_shm_dir(&file).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
    }

    #[test]
    fn parses_pid_lists() {
        assert_eq!(parse_pids("123\n456\n\n"), vec![123, 456]);
        assert_eq!(parse_pids("0 789\n"), vec![0]);
        assert!(parse_pids("").is_empty());
    }

    #[test]
    fn reply_and_env_reach_the_program() {
        let d = tempfile::tempdir().unwrap();
        let c = script(
            d.path(),
            "read line; echo \"$line|$CUDA_MPS_PIPE_DIRECTORY|$CUDA_VISIBLE_DEVICES\"",
        );
        let r = c.command("get_server_list").unwrap();
        assert_eq!(
            r,
            format!("get_server_list|{}|0", d.path().join("pipe").display())
        );
    }

    #[test]
    fn a_hung_daemon_is_a_timeout_not_a_hang() {
        let d = tempfile::tempdir().unwrap();
        let c = script(d.path(), "exec sleep 5");
        let t = Instant::now();
        assert!(matches!(
            c.command("get_server_list"),
            Err(MpsError::Timeout { .. })
        ));
        assert!(t.elapsed() < Duration::from_secs(4));
    }

    #[test]
    fn no_daemon_and_rejections_are_errors() {
        let d = tempfile::tempdir().unwrap();
        let c = script(
            d.path(),
            "echo 'Cannot find MPS control daemon process'; exit 1",
        );
        assert_eq!(c.command("get_server_list"), Err(MpsError::NoDaemon));
        let c = script(d.path(), "echo 'Invalid command: x'");
        assert!(matches!(c.command("x"), Err(MpsError::Rejected { .. })));
    }

    #[test]
    fn daemon_env_reads_the_environment_a_process_started_with() {
        let mut child = Command::new("sleep")
            .arg("5")
            .env("CUDA_MPS_LOG_DIRECTORY", "/var/log/old mps")
            .env("CUDA_MPS_LOG_DIRECTORY_X", "not this")
            .spawn()
            .unwrap();
        let pid = child.id();
        // `spawn` may return before the exec has replaced the environment /proc shows.
        let end = Instant::now() + Duration::from_secs(5);
        while daemon_env(pid, "CUDA_MPS_LOG_DIRECTORY").is_none() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(daemon_env(pid, "CUDA_MPS_LOG_DIRECTORY"), Some("/var/log/old mps".into()));
        assert_eq!(daemon_env(pid, "CUDA_MPS_LOG_DIR"), None, "a prefix is not a name");
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(daemon_env(u32::MAX, "PATH"), None, "no such process");
    }
}
