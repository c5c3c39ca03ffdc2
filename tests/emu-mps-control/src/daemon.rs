//! The control daemon's state and command semantics: the MPS server (one at a time, for one
//! user, spawned on demand as a real process running as that user), its clients, active-thread percentages and pinned-memory
//! limits, and the effects on the emulated device through [`DeviceLink`].
//!
//! Behaviour, with its source in NVIDIA's MPS documentation:
//! - a client connecting makes the daemon start a server for the client's user if none runs
//!   (log lines `NEW CLIENT ... Server is not ready, push client to pending list`,
//!   `Starting new server ...`, `NEW SERVER ...: Ready`, as in real `control.log`s);
//! - one user at a time (nvidia-cuda-mps-control(1): "If there's an MPS server already
//!   running, but with a different user id than that of the client process, the control
//!   daemon requests the existing server to shutdown as soon as all its clients are done.
//!   Once the existing server has terminated, the control daemon launches a new server with
//!   the user id same as that of the queued client process"): the device queues such a
//!   client (its context creation blocks, see `emu_device::Device::context_created`), and
//!   the daemon stops the old server before it starts the queued user's;
//! - `set_default_active_thread_percentage` affects servers spawned afterwards and is lost on
//!   `quit`; `set_active_thread_percentage <server pid>` affects clients that connect to that
//!   server afterwards, existing ones keep their limit; a client's limit is fixed when it
//!   connects, for its life (its server's, further constrained by its own
//!   `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`; the device fixes it, from the new-client percentage
//!   this daemon keeps equal to the server's), and nothing changes it afterwards. A client pid
//!   is not a server: `set_/get_active_thread_percentage <client pid>` answer
//!   `Server <pid> not found` and change nothing, as the real control daemon does;
//! - `shutdown_server <pid>`: the server takes no new client and exits once its clients are
//!   done (a client of its user waits for the next server); `-f`: it exits at once and its
//!   clients' work is ended (`terminate_client` of each on the device, as the clients of a
//!   server that dies fail), which ends a hang a dead client left. The daemon stays and starts
//!   a new server for the next client;
//! - `quit` stops the servers and the daemon; MPS state (percentages, a hang left by a client
//!   that died holding a context) is reset on the device.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::process::{Child, Command as Proc};

use crate::log::ControlLog;
use crate::protocol::{format_pct, format_size, Command};

/// What the daemon needs from the emulated device.
pub trait DeviceLink {
    /// Turns MPS mode on (daemon start) or off and resets MPS error state (quit).
    fn set_mps(&mut self, on: bool) -> Result<(), String>;
    /// MPS clients on the device now, as `(pid, uid)`: processes holding a context on the
    /// running server, and clients that died holding one (still connected: their work hangs
    /// the server until `terminate_client`). The uid is the one the client connected with,
    /// recorded by the device when its context was created, so a client is attributed to its
    /// server even when its process is already gone.
    fn clients(&mut self) -> Result<Vec<(u32, u32)>, String>;
    /// Clients waiting to be handed to their user's server, as `(pid, uid)`: real MPS clients
    /// ask the daemon for a server when CUDA initialises and connect only once it is ready.
    fn requests(&mut self) -> Result<Vec<(u32, u32)>, String>;
    /// Hands the waiting client to server `server`: `Ok(true)` when done, `Ok(false)` while
    /// that server has not yet created its context (still starting).
    fn hand_over(&mut self, client: u32, server: u32) -> Result<bool, String>;
    /// The waiting client cannot be served (its server failed to start): its connection fails.
    fn refuse(&mut self, client: u32);
    /// The percentage a client gets when it connects, fixed for its life (real MPS never
    /// changes a running client's limit): its server's.
    fn set_new_client_percentage(&mut self, pct: f64) -> Result<(), String>;
    /// Terminates a client's GPU work (`terminate_client`).
    fn terminate_client(&mut self, pid: u32) -> Result<(), String>;
    /// Clients the running server tore down after a fatal GPU error that have not exited yet
    /// (until they have, the server takes no new client).
    fn torn_down(&mut self) -> Vec<u32> {
        Vec::new()
    }
}

/// One MPS server process.
struct Server {
    uid: u32,
    child: Child,
    pct: f64,
    pinned: BTreeMap<u32, u64>,
    clients: Vec<u32>,
    /// Clients waiting for this server to be ready (the daemon's "pending list").
    pending: Vec<u32>,
    /// The server has created its context (a client was handed to it).
    ready: bool,
    /// `shutdown_server` without `-f`: no new client; stopped once its clients are done.
    draining: bool,
}

/// The daemon's state.
pub struct Daemon<D: DeviceLink> {
    device: D,
    log: ControlLog,
    server_cmd: Vec<OsString>,
    default_pct: f64,
    default_pinned: BTreeMap<u32, u64>,
    servers: Vec<Server>,
    /// Clients of a server that failed to start (exited with an error status, e.g. no room
    /// for its context): never served again while they hold that connection (a real client's
    /// connection fails; the daemon does not start a server for it over and over).
    failed_clients: Vec<u32>,
    /// `server.log`: each client a fatal GPU error tore down, once ([`Daemon::poll`]).
    server_log: Option<ControlLog>,
    /// The torn-down clients already reported there.
    reported_torn_down: Vec<u32>,
}

/// The answer to one command.
#[derive(Debug, Default, PartialEq)]
pub struct Reply {
    /// Text to send back (may be empty).
    pub text: String,
    /// The daemon should exit after sending it.
    pub quit: bool,
}

impl Reply {
    fn text(s: impl Into<String>) -> Self {
        Reply {
            text: s.into(),
            quit: false,
        }
    }
}

impl<D: DeviceLink> Daemon<D> {
    /// A daemon that starts servers by running `server_cmd <uid>`.
    pub fn new(device: D, log: ControlLog, server_cmd: Vec<OsString>) -> Self {
        Daemon {
            device,
            log,
            server_cmd,
            default_pct: 100.0,
            default_pinned: BTreeMap::new(),
            servers: Vec::new(),
            failed_clients: Vec::new(),
            server_log: None,
            reported_torn_down: Vec::new(),
        }
    }

    /// Re-reads the pid its logs write (after daemonising, the writer is a new process).
    pub fn refresh_log_pids(&mut self) {
        self.log.refresh_pid();
        if let Some(l) = &mut self.server_log {
            l.refresh_pid();
        }
    }

    /// Writes the servers' reports to `log` (`server.log`).
    pub fn with_server_log(mut self, log: ControlLog) -> Self {
        self.server_log = Some(log);
        self
    }

    /// The log, for the socket loop's own lines.
    pub fn log(&mut self) -> &mut ControlLog {
        &mut self.log
    }

    /// Turns MPS on in the device.
    pub fn start(&mut self) -> Result<(), String> {
        self.device.set_mps(true)?;
        self.sync_new_client_pct();
        Ok(())
    }

    /// Keeps the device's percentage for not-yet-seen clients equal to what they will get:
    /// the first server's percentage, or the default when no server runs.
    fn sync_new_client_pct(&mut self) {
        let pct = self.servers.first().map_or(self.default_pct, |s| s.pct);
        if let Err(e) = self.device.set_new_client_percentage(pct) {
            self.log.line(&format!(
                "Cannot set the default active thread percentage on the device: {e}"
            ));
        }
    }

    fn server_index(&self, pid: u32) -> Option<usize> {
        self.servers.iter().position(|s| s.child.id() == pid)
    }

    /// The server of `uid`, started if none runs. MPS serves one user at a time: a server of
    /// another user that still has clients is an error (the device queues such a client until
    /// they are done, so only `start_server` can ask for it); one without clients is stopped
    /// first, as the real daemon stops a server once its clients are done and another user's
    /// client is queued.
    fn start_server(&mut self, uid: u32) -> Result<usize, String> {
        if let Some(i) = self.servers.iter().position(|s| s.uid == uid) {
            return Ok(i);
        }
        if let Some(s) = self.servers.iter().find(|s| !s.clients.is_empty()) {
            return Err(format!(
                "Server {} of user {} has clients: MPS serves one user at a time, a server for \
                 user {uid} can start once they are done",
                s.child.id(),
                s.uid
            ));
        }
        while let Some(s) = self.servers.pop() {
            self.stop_server(s, &format!("no clients left, user {uid} is next"));
        }
        let (prog, args) = self
            .server_cmd
            .split_first()
            .ok_or("no server command configured")?;
        let mut cmd = Proc::new(prog);
        cmd.args(args).arg(uid.to_string());
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 && uid != 0 {
            // Like the real server, it runs as the user it serves (std drops the
            // supplementary groups when root switches uid).
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(uid);
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start MPS server {}: {e}", prog.to_string_lossy()))?;
        self.log.line(&format!(
            "Starting new server {} for user {uid}",
            child.id()
        ));
        self.servers.push(Server {
            uid,
            child,
            pct: self.default_pct,
            pinned: self.default_pinned.clone(),
            clients: Vec::new(),
            pending: Vec::new(),
            ready: false,
            draining: false,
        });
        self.sync_new_client_pct();
        Ok(self.servers.len() - 1)
    }

    /// Periodic work, and the first step of every command: reaps servers that died (their
    /// clients are terminated on the device, as clients of a crashed server fail), serves the
    /// clients waiting for a server, and lists on their servers the clients the device shows.
    ///
    /// Real MPS connects a client to its server before the client's context exists, so a
    /// client holding a context is always on its server's list: here a client connects only
    /// once this daemon has handed it to a ready server ([`Daemon::serve_request`]), the device
    /// is the record (with the uid the client asked with), and every command runs this first,
    /// so no answer ever misses a client that holds, or died holding, a context.
    pub fn poll(&mut self) {
        let mut i = 0;
        while i < self.servers.len() {
            if let Ok(Some(status)) = self.servers[i].child.try_wait() {
                let s = self.servers.remove(i);
                self.log.line(&format!(
                    "Server {} exited with status {status}",
                    s.child.id()
                ));
                // A server that could not start (an error exit, not a crash by a signal):
                // the clients waiting for it are refused below, not given another server.
                if status.code().is_some_and(|c| c != 0) {
                    self.failed_clients.extend(&s.clients);
                    self.failed_clients.extend(&s.pending);
                }
                for c in s.clients {
                    if let Err(e) = self.device.terminate_client(c) {
                        self.log
                            .line(&format!("Client {c} of the lost server: {e}"));
                    }
                }
                self.sync_new_client_pct();
            } else {
                i += 1;
            }
        }
        let (clients, requests) = match (self.device.clients(), self.device.requests()) {
            (Ok(c), Ok(r)) => (c, r),
            (Err(e), _) | (_, Err(e)) => {
                self.log.line(&format!("Cannot read device clients: {e}"));
                return;
            }
        };
        for s in &mut self.servers {
            let uid = s.uid;
            s.clients
                .retain(|c| clients.iter().any(|&(p, u)| p == *c && u == uid));
            s.pending
                .retain(|c| requests.iter().any(|&(p, u)| p == *c && u == uid));
        }
        self.failed_clients.retain(|c| {
            clients.iter().chain(&requests).any(|&(p, _)| p == *c)
        });
        while let Some(i) = self
            .servers
            .iter()
            .position(|s| s.draining && s.clients.is_empty() && s.pending.is_empty())
        {
            let s = self.servers.remove(i);
            self.stop_server(s, "shut down (shutdown_server), its clients done");
            self.sync_new_client_pct();
        }
        for (pid, uid) in requests {
            self.serve_request(pid, uid);
        }
        // A client the server tore down after a fatal GPU error, as an H200's server reported
        // it ("Client {PID: N} encountered a fatal GPU error ..."); once per client. Only one
        // still alive at this look is named (a real server names it at the teardown): the
        // lingering clients mps-manager must act on always are.
        let torn = self.device.torn_down();
        self.reported_torn_down.retain(|p| torn.contains(p));
        for pid in torn {
            if !self.reported_torn_down.contains(&pid) {
                self.reported_torn_down.push(pid);
                if let Some(l) = &mut self.server_log {
                    l.line(&format!("Client {{PID: {pid}}} encountered a fatal GPU error. The following client process have a sticky error set: {pid}"));
                }
            }
        }
        // Clients the device shows on a server this daemon has not listed them on (a client
        // that died holding a context is still its server's until terminated).
        for (pid, uid) in clients {
            if self.servers.iter().any(|s| s.clients.contains(&pid))
                || self.failed_clients.contains(&pid)
            {
                continue;
            }
            let Some(idx) = self.servers.iter().position(|s| s.uid == uid) else {
                continue;
            };
            let server = &mut self.servers[idx];
            server.clients.push(pid);
            let spid = server.child.id();
            self.log.line(&format!(
                "NEW CLIENT {pid} from user {uid}: Server {spid} already exists"
            ));
        }
    }

    /// One client waiting for its user's server (real MPS: the driver asks the daemon when
    /// CUDA initialises): starts that server if none runs, and hands the client over once the
    /// server holds its context; a client whose server failed to start is refused. The
    /// client's limit is fixed when it then connects (the device's new-client percentage,
    /// kept equal to its server's, further constrained by its own variable).
    fn serve_request(&mut self, pid: u32, uid: u32) {
        if self.failed_clients.contains(&pid) {
            self.device.refuse(pid);
            self.log.line(&format!(
                "Client {pid} from user {uid}: its server failed to start, connection refused"
            ));
            return;
        }
        let idx = match self.servers.iter().position(|s| s.uid == uid) {
            // Shutting down: the client waits for the next server of its user.
            Some(i) if self.servers[i].draining => return,
            Some(i) => i,
            None => {
                self.log.line(&format!(
                    "NEW CLIENT {pid} from user {uid}: Server is not ready, push client to pending list"
                ));
                match self.start_server(uid) {
                    Ok(i) => i,
                    Err(e) => {
                        self.log.line(&e);
                        return;
                    }
                }
            }
        };
        let spid = self.servers[idx].child.id();
        match self.device.hand_over(pid, spid) {
            Ok(true) => {
                if !self.servers[idx].ready {
                    self.servers[idx].ready = true;
                    self.log.line(&format!("NEW SERVER {spid}: Ready"));
                }
                let server = &mut self.servers[idx];
                server.pending.retain(|&c| c != pid);
                if !server.clients.contains(&pid) {
                    server.clients.push(pid);
                }
                self.log.line(&format!(
                    "NEW CLIENT {pid} from user {uid}: Server {spid} is ready, client connects"
                ));
            }
            Ok(false) => {
                let server = &mut self.servers[idx];
                if !server.pending.contains(&pid) {
                    server.pending.push(pid);
                }
            }
            Err(e) => {
                self.device.refuse(pid);
                self.log.line(&format!(
                    "Client {pid} from user {uid}: cannot hand it to server {spid}: {e}"
                ));
            }
        }
    }

    /// Serves one command as it arrives on the socket: looks at the device first ([`poll`]),
    /// so the answer reflects every client that holds (or died holding) a context now.
    ///
    /// [`poll`]: Daemon::poll
    pub fn command(&mut self, cmd: Command) -> Reply {
        self.poll();
        self.handle(cmd)
    }

    /// Executes one command on the state as it is.
    pub fn handle(&mut self, cmd: Command) -> Reply {
        self.log.line(&format!("Command: {cmd:?}"));
        use Command::*;
        match cmd {
            GetServerList => Reply::text(lines(self.servers.iter().map(|s| s.child.id()))),
            StartServer { uid } => match self.start_server(uid) {
                Ok(_) => Reply::default(),
                Err(e) => Reply::text(e),
            },
            GetClientList { server } => match self.server_index(server) {
                Some(i) => Reply::text(lines(self.servers[i].clients.iter())),
                None => Reply::text(format!("Server {server} not found")),
            },
            GetDeviceClientList { server } => {
                let mut out = Vec::new();
                for s in self
                    .servers
                    .iter()
                    .filter(|s| server.is_none_or(|p| p == s.child.id()))
                {
                    out.extend(s.clients.iter().map(|c| format!("0 {c}")));
                }
                Reply::text(out.join("\n"))
            }
            SetDefaultPercentage(p) => {
                self.default_pct = p;
                self.sync_new_client_pct();
                Reply::text(format_pct(p))
            }
            GetDefaultPercentage => Reply::text(format_pct(self.default_pct)),
            SetPercentage { pid, pct } => {
                if let Some(i) = self.server_index(pid) {
                    self.servers[i].pct = pct;
                    self.sync_new_client_pct();
                    Reply::text(format_pct(pct))
                } else {
                    // Real MPS takes server pids only; a running client's limit never changes.
                    Reply::text(format!("Server {pid} not found"))
                }
            }
            GetPercentage { pid } => {
                if let Some(i) = self.server_index(pid) {
                    Reply::text(format_pct(self.servers[i].pct))
                } else {
                    Reply::text(format!("Server {pid} not found"))
                }
            }
            SetDefaultPinnedMemLimit { device, bytes } => {
                self.default_pinned.insert(device, bytes);
                Reply::default()
            }
            GetDefaultPinnedMemLimit { device } => Reply::text(
                self.default_pinned
                    .get(&device)
                    .map_or("0".to_string(), |b| format_size(*b)),
            ),
            SetPinnedMemLimit { pid, device, bytes } => match self.server_index(pid) {
                Some(i) => {
                    self.servers[i].pinned.insert(device, bytes);
                    Reply::default()
                }
                None => Reply::text(format!("Server {pid} not found")),
            },
            TerminateClient { server, client } => match self.server_index(server) {
                Some(i) if self.servers[i].clients.contains(&client) => {
                    match self.device.terminate_client(client) {
                        Ok(()) => Reply::default(),
                        Err(e) => Reply::text(format!("Cannot terminate client {client}: {e}")),
                    }
                }
                Some(_) => Reply::text(format!("Client {client} not found on server {server}")),
                None => Reply::text(format!("Server {server} not found")),
            },
            ShutdownServer { server, force } => match self.server_index(server) {
                None => Reply::text(format!("Server {server} not found")),
                Some(i) if force => {
                    let s = self.servers.remove(i);
                    self.force_stop(s);
                    self.sync_new_client_pct();
                    Reply::default()
                }
                Some(i) => {
                    self.servers[i].draining = true;
                    self.log.line(&format!("Server {server}: shutting down once its clients are done"));
                    Reply::default()
                }
            },
            Quit { timeout_s } => {
                self.shutdown(timeout_s.unwrap_or(0));
                Reply {
                    text: String::new(),
                    quit: true,
                }
            }
        }
    }

    /// Stops one server that has no clients (SIGTERM, SIGKILL after 1 s) and reaps it.
    fn stop_server(&mut self, mut s: Server, why: &str) {
        // SAFETY: kill(2) on a pid we spawned and have not yet reaped.
        unsafe { libc::kill(s.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        while std::time::Instant::now() < deadline && matches!(s.child.try_wait(), Ok(None)) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let _ = s.child.kill();
        let _ = s.child.wait();
        self.log.line(&format!(
            "Server {} of user {} exited: {why}",
            s.child.id(),
            s.uid
        ));
    }

    /// `shutdown_server -f`: kills the server at once and ends its clients' work on the device
    /// (a client waiting for it waits for the next server).
    fn force_stop(&mut self, mut s: Server) {
        let _ = s.child.kill();
        let _ = s.child.wait();
        for &c in &s.clients {
            if let Err(e) = self.device.terminate_client(c) {
                self.log.line(&format!("Client {c} of the shut down server: {e}"));
            }
        }
        self.log.line(&format!(
            "Server {} of user {} shut down (forced), clients {:?} terminated",
            s.child.id(),
            s.uid,
            s.clients
        ));
    }

    /// Stops every server (SIGTERM, then SIGKILL after `timeout_s`) and resets MPS on the device.
    pub fn shutdown(&mut self, timeout_s: u64) {
        for s in &self.servers {
            // SAFETY: kill(2) on a pid we spawned and have not yet reaped.
            unsafe { libc::kill(s.child.id() as libc::pid_t, libc::SIGTERM) };
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(timeout_s);
        for mut s in self.servers.drain(..) {
            while std::time::Instant::now() < deadline && matches!(s.child.try_wait(), Ok(None)) {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let _ = s.child.kill();
            let _ = s.child.wait();
            self.log.line(&format!("Server {} exited", s.child.id()));
        }
        self.default_pct = 100.0;
        self.default_pinned.clear();
        if let Err(e) = self.device.set_mps(false) {
            self.log
                .line(&format!("Cannot reset MPS on the device: {e}"));
        }
        self.log.line("Exit");
    }
}

fn lines<T: ToString>(it: impl Iterator<Item = T>) -> String {
    it.map(|v| v.to_string()).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder {
        mps: Vec<bool>,
        clients: Vec<(u32, u32)>,
        new_pct: Vec<f64>,
        terminated: Vec<u32>,
        /// Clients waiting for a server, `(pid, uid)`.
        asking: Vec<(u32, u32)>,
        /// Servers have their contexts (else hand-over answers "not yet").
        server_ready: bool,
        handed: Vec<u32>,
        refused: Vec<u32>,
    }

    impl DeviceLink for &mut Recorder {
        fn set_mps(&mut self, on: bool) -> Result<(), String> {
            self.mps.push(on);
            Ok(())
        }
        fn clients(&mut self) -> Result<Vec<(u32, u32)>, String> {
            Ok(self.clients.clone())
        }
        fn terminate_client(&mut self, pid: u32) -> Result<(), String> {
            self.terminated.push(pid);
            self.clients.retain(|&(p, _)| p != pid);
            Ok(())
        }
        fn set_new_client_percentage(&mut self, pct: f64) -> Result<(), String> {
            self.new_pct.push(pct);
            Ok(())
        }
        fn requests(&mut self) -> Result<Vec<(u32, u32)>, String> {
            Ok(self.asking.clone())
        }
        fn hand_over(&mut self, client: u32, _server: u32) -> Result<bool, String> {
            if !self.server_ready {
                return Ok(false);
            }
            let Some(i) = self.asking.iter().position(|&(p, _)| p == client) else {
                return Err(format!("client {client} is not waiting"));
            };
            let c = self.asking.remove(i);
            self.clients.push(c);
            self.handed.push(client);
            Ok(true)
        }
        fn refuse(&mut self, client: u32) {
            self.asking.retain(|&(p, _)| p != client);
            self.refused.push(client);
        }
    }

    fn sleeper() -> Vec<OsString> {
        ["sh", "-c", "sleep 60", "server"]
            .map(OsString::from)
            .to_vec()
    }

    fn run(d: &mut Daemon<&mut Recorder>, line: &str) -> String {
        d.handle(Command::parse(line).unwrap().unwrap()).text
    }

    #[test]
    fn clients_get_a_server_and_its_percentage() {
        let me = std::process::id();
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        let mut rec = Recorder {
            asking: vec![(me, uid)],
            ..Default::default()
        };
        let mut d = Daemon::new(&mut rec, ControlLog::discard(), sleeper());
        d.start().unwrap();
        assert_eq!(
            run(&mut d, "set_default_active_thread_percentage 40"),
            "40.0"
        );
        // The client asks; its server starts but has no context yet: the client waits.
        d.device.server_ready = false;
        d.poll();
        let servers = run(&mut d, "get_server_list");
        let spid: u32 = servers.trim().parse().expect("one server pid");
        assert_eq!(run(&mut d, &format!("get_client_list {spid}")), "");
        assert!(d.device.handed.is_empty(), "handed over before its server was ready");
        d.device.server_ready = true;
        d.poll();
        assert_eq!(d.device.handed, vec![me]);
        let servers = run(&mut d, "get_server_list");
        let spid: u32 = servers.trim().parse().expect("one server pid");
        assert_eq!(
            run(&mut d, &format!("get_client_list {spid}")),
            me.to_string()
        );
        assert_eq!(
            run(&mut d, &format!("get_active_thread_percentage {spid}")),
            "40.0"
        );
        // Server percentage: affects later clients only.
        assert_eq!(
            run(&mut d, &format!("set_active_thread_percentage {spid} 30")),
            "30.0"
        );
        // A client pid is not a server: refused, the running client keeps its limit.
        assert_eq!(
            run(&mut d, &format!("set_active_thread_percentage {me} 20")),
            format!("Server {me} not found")
        );
        assert_eq!(
            run(&mut d, &format!("get_active_thread_percentage {me}")),
            format!("Server {me} not found")
        );
        assert_eq!(
            run(&mut d, "set_active_thread_percentage 1 20"),
            "Server 1 not found"
        );
        assert_eq!(run(&mut d, &format!("terminate_client {spid} {me}")), "");
        assert!(d.handle(Command::Quit { timeout_s: None }).quit);
        drop(d);
        assert_eq!(rec.mps, vec![true, false]);
        assert_eq!(rec.terminated, vec![me]);
        assert!(rec.refused.is_empty());
        // Not-yet-seen clients get: default 100, then 40, then the new server's 40, then 30.
        assert_eq!(rec.new_pct, vec![100.0, 40.0, 40.0, 30.0]);
    }

    /// `shutdown_server <pid>` drains (no new client: one of the same user waits; the server
    /// exits once its clients are done) and `-f` ends the server and its clients' work at
    /// once; the daemon stays and starts a new server for the next client. An unknown server
    /// is answered `not found`, a stray argument with the usage.
    #[test]
    fn shutdown_server_drains_or_forces_and_the_daemon_serves_the_next_client() {
        let (a, b, c) = (7001, 7002, 7003);
        let mut rec = Recorder {
            asking: vec![(a, 4242), (b, 4242)],
            server_ready: true,
            ..Default::default()
        };
        let mut d = Daemon::new(&mut rec, ControlLog::discard(), sleeper());
        d.start().unwrap();
        d.poll();
        let s1: u32 = run(&mut d, "get_server_list").parse().expect("one server");
        assert_eq!(run(&mut d, &format!("get_client_list {s1}")), format!("{a}\n{b}"));
        let e = Command::parse(&format!("shutdown_server {s1} -x")).unwrap_err();
        assert_eq!(e.to_string(), "Invalid arguments. Usage: shutdown_server <server PID> [-f]");
        assert_eq!(run(&mut d, "shutdown_server 1 -f"), "Server 1 not found");
        // Draining: a new client of its user waits; the server stays while it has clients.
        assert_eq!(run(&mut d, &format!("shutdown_server {s1}")), "");
        d.device.asking.push((c, 4242));
        d.poll();
        assert!(!d.device.handed.contains(&c), "a draining server took a new client");
        assert_eq!(run(&mut d, "get_server_list"), s1.to_string());
        // Its clients done: it exits, and the waiting client gets a new server.
        d.device.clients.clear();
        d.poll();
        d.poll();
        let s2: u32 = run(&mut d, "get_server_list").parse().expect("a new server");
        assert_ne!(s2, s1);
        assert!(d.device.handed.contains(&c));
        assert!(d.device.terminated.is_empty(), "a drain ends no client's work");
        // Forced: at once, its client's work ended; the daemon keeps running.
        assert_eq!(run(&mut d, &format!("shutdown_server {s2} -f")), "");
        assert_eq!(run(&mut d, "get_server_list"), "");
        assert_eq!(d.device.terminated, vec![c]);
        d.device.asking.push((a + 10, 4242));
        d.poll();
        let s3: u32 = run(&mut d, "get_server_list").parse().expect("a new server for the next client");
        assert!(s3 != s1 && s3 != s2);
        d.handle(Command::Quit { timeout_s: None });
        drop(d);
        assert_eq!(rec.mps, vec![true, false], "MPS stayed on through both shutdowns");
    }

    /// A client whose process is already gone (reaped, so nothing about it can be read from
    /// /proc) is served and listed on its user's server from the uid the device recorded when
    /// it asked, and can be terminated.
    #[test]
    fn a_client_known_only_from_the_device_is_listed_on_its_users_server() {
        let mut child = Proc::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        assert!(!std::path::Path::new(&format!("/proc/{gone}")).exists());
        let mut rec = Recorder {
            asking: vec![(gone, 4242)],
            server_ready: true,
            ..Default::default()
        };
        let mut d = Daemon::new(&mut rec, ControlLog::discard(), sleeper());
        d.start().unwrap();
        // No periodic poll in between: the command's own look at the device must find it.
        let cmd = |d: &mut Daemon<&mut Recorder>, l: &str| {
            d.command(Command::parse(l).unwrap().unwrap()).text
        };
        let spid: u32 = cmd(&mut d, "get_server_list").trim().parse().expect("one server");
        assert_eq!(cmd(&mut d, &format!("get_client_list {spid}")), gone.to_string());
        assert_eq!(cmd(&mut d, &format!("terminate_client {spid} {gone}")), "");
        assert_eq!(cmd(&mut d, &format!("get_client_list {spid}")), "");
        d.handle(Command::Quit { timeout_s: None });
        drop(d);
        assert_eq!(rec.terminated, vec![gone]);
    }

    /// A client waits for its server; a server that fails to start (an error exit) gets its
    /// waiting client refused, and no second server is started for it.
    #[test]
    fn a_client_whose_server_fails_to_start_is_refused_once() {
        let mut rec = Recorder {
            asking: vec![(std::process::id(), 4242)],
            ..Default::default()
        };
        let failing = ["sh", "-c", "exit 1", "server"].map(OsString::from).to_vec();
        let mut d = Daemon::new(&mut rec, ControlLog::discard(), failing);
        d.start().unwrap();
        d.poll();
        assert_eq!(d.servers.len(), 1, "a server starts for the waiting client");
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while d.device.refused.is_empty() {
            assert!(std::time::Instant::now() < end, "the client was never refused");
            std::thread::sleep(std::time::Duration::from_millis(20));
            d.poll();
        }
        d.poll();
        assert!(d.servers.is_empty(), "a second server for a refused client");
        drop(d);
        assert_eq!(rec.refused, vec![std::process::id()]);
        assert!(rec.handed.is_empty());
    }

    #[test]
    fn quit_resets_defaults_and_dead_servers_are_reaped() {
        let mut rec = Recorder::default();
        let mut d = Daemon::new(&mut rec, ControlLog::discard(), sleeper());
        run(&mut d, "set_default_active_thread_percentage 10");
        run(&mut d, "set_default_device_pinned_mem_limit 0 1G");
        assert_eq!(run(&mut d, "get_default_device_pinned_mem_limit 0"), "1G");
        assert_eq!(run(&mut d, "start_server -uid 4242"), "");
        let spid: u32 = run(&mut d, "get_server_list").parse().unwrap();
        // SAFETY: kill(2) on the child the daemon spawned.
        unsafe { libc::kill(spid as i32, libc::SIGKILL) };
        std::thread::sleep(std::time::Duration::from_millis(100));
        d.poll();
        assert_eq!(run(&mut d, "get_server_list"), "");
        d.handle(Command::Quit { timeout_s: None });
        assert_eq!(run(&mut d, "get_default_active_thread_percentage"), "100.0");
        assert_eq!(run(&mut d, "get_default_device_pinned_mem_limit 0"), "0");
    }
}
