//! [`DeviceLink`] on the shared emulated device (`emu-device`, state file named by
//! `GPUEMU_STATE`).

use emu_device::Device;

use crate::daemon::DeviceLink;

/// The emulated device named by the emulator's environment.
pub struct EmuLink {
    dev: Device,
    /// The daemon's control socket: clients reach MPS only through it.
    sock: std::path::PathBuf,
}

impl EmuLink {
    /// Opens the device state the environment names, for a daemon listening on `sock`.
    pub fn open(sock: &std::path::Path) -> Result<Self, String> {
        Device::open_from_env()
            .map(|dev| EmuLink { dev, sock: sock.to_path_buf() })
            .map_err(|e| format!("emulated GPU: {e}"))
    }
}

impl DeviceLink for EmuLink {
    fn set_mps(&mut self, on: bool) -> Result<(), String> {
        if on {
            self.dev.mps_start(std::process::id(), &self.sock);
        } else {
            self.dev.mps_quit();
        }
        Ok(())
    }

    fn clients(&mut self) -> Result<Vec<(u32, u32)>, String> {
        let snap = self.dev.snapshot();
        let mut out: Vec<(u32, u32)> = snap
            .processes
            .iter()
            .filter(|p| (p.mps_client && p.contexts > 0) || p.mps_handed)
            .map(|p| (p.pid, p.uid))
            .collect();
        // A client that died holding a context stays connected to its server (its work is
        // still there, hanging the server) until `terminate_client` or `quit`.
        out.extend(snap.mps.dead_clients.iter().copied());
        Ok(out)
    }

    fn requests(&mut self) -> Result<Vec<(u32, u32)>, String> {
        Ok(self.dev.mps_requests())
    }

    fn torn_down(&mut self) -> Vec<u32> {
        self.dev.snapshot().processes.iter().filter(|p| p.mps_torn_down).map(|p| p.pid).collect()
    }

    fn hand_over(&mut self, client: u32, server: u32) -> Result<bool, String> {
        self.dev.mps_hand_over(client, server).map_err(|e| e.to_string())
    }

    fn refuse(&mut self, client: u32) {
        self.dev.mps_refuse(client);
    }

    fn set_new_client_percentage(&mut self, pct: f64) -> Result<(), String> {
        self.dev
            .set_default_active_thread_pct(emu_device::whole_pct(pct))
            .map_err(|e| e.to_string())
    }

    fn terminate_client(&mut self, pid: u32) -> Result<(), String> {
        self.dev
            .mps_terminate_client(pid)
            .map_err(|e| e.to_string())
    }
}
