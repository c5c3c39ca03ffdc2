//! [`DeviceLink`] on the shared emulated device (`emu-device`).

use crate::daemon::DeviceLink;

/// The emulated device named by the emulator's environment.
pub struct EmuLink;

impl EmuLink {
    /// Opens the device state the environment names.
    pub fn open() -> Result<Self, String> {
        Err("the emulated device is not wired in yet (waiting for emu-device)".into())
    }
}

impl DeviceLink for EmuLink {
    fn set_mps(&mut self, _on: bool) -> Result<(), String> {
        Err("not wired".into())
    }
    fn client_pids(&mut self) -> Result<Vec<u32>, String> {
        Err("not wired".into())
    }
    fn set_client_percentage(&mut self, _pid: u32, _pct: f64) -> Result<(), String> {
        Err("not wired".into())
    }
    fn terminate_client(&mut self, _pid: u32) -> Result<(), String> {
        Err("not wired".into())
    }
}
