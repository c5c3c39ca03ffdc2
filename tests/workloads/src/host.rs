//! The host a demo runs on: the real one (system driver), or an emulated GPU host laid out in
//! a scratch directory (fake `libcuda.so.1`, `libnvidia-ml.so.1` and `nvidia-cuda-mps-control`
//! linked from the build directory, a device state file, MPS pipe and log directories), given to
//! child processes through their environment.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// State file variable of the emulator (`emu-device`).
pub const ENV_STATE: &str = "GPUEMU_STATE";
/// Profile variable of the emulator (`emu-device`): `t4`, `a10`, `h100`.
pub const ENV_PROFILE: &str = "GPUEMU_PROFILE";

/// Where client processes run.
pub struct Host {
    /// Directory holding the client binaries (`online`, `offline`, ...).
    pub bin_dir: PathBuf,
    /// Scratch directory of an emulated host (removed on drop), `None` on a real host.
    pub root: Option<PathBuf>,
    env: Vec<(String, OsString)>,
    /// What the host is, for the report (`emulated h100`, `real GPU`).
    pub label: String,
}

fn link(src: &Path, dst: &Path) -> Result<(), String> {
    if !src.exists() {
        return Err(format!(
            "{} is missing: build it first (scripts/demo.sh does)",
            src.display()
        ));
    }
    std::os::unix::fs::symlink(src, dst)
        .map_err(|e| format!("linking {} -> {}: {e}", dst.display(), src.display()))
}

impl Host {
    /// The machine's own driver and tools.
    pub fn real(bin_dir: PathBuf) -> Self {
        Host {
            bin_dir,
            root: None,
            env: Vec::new(),
            label: "real GPU".into(),
        }
    }

    /// An emulated host with one `profile` GPU, under a fresh directory in `scratch`.
    pub fn emulated(bin_dir: PathBuf, profile: &str, scratch: &Path) -> Result<Self, String> {
        let root = scratch.join(format!(
            "emu-host-{}-{}",
            std::process::id(),
            crate::now_tag()
        ));
        let (lib, bin) = (root.join("lib"), root.join("bin"));
        for d in [&lib, &bin, &root.join("mps-pipe"), &root.join("mps-log")] {
            std::fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
        }
        link(&bin_dir.join("libcuda.so"), &lib.join("libcuda.so.1"))?;
        link(
            &bin_dir.join("libnvidia_ml.so"),
            &lib.join("libnvidia-ml.so.1"),
        )?;
        link(
            &bin_dir.join("emu-mps-control"),
            &bin.join("nvidia-cuda-mps-control"),
        )?;
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut new_path = OsString::from(bin.as_os_str());
        new_path.push(":");
        new_path.push(path);
        let mut ld = OsString::from(lib.as_os_str());
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
            ld.push(":");
            ld.push(old);
        }
        let env = vec![
            (
                ENV_STATE.to_string(),
                root.join("gpu0.state").into_os_string(),
            ),
            (ENV_PROFILE.to_string(), OsString::from(profile)),
            ("LD_LIBRARY_PATH".to_string(), ld),
            ("PATH".to_string(), new_path),
            (
                "CUDA_MPS_PIPE_DIRECTORY".to_string(),
                root.join("mps-pipe").into_os_string(),
            ),
            (
                "CUDA_MPS_LOG_DIRECTORY".to_string(),
                root.join("mps-log").into_os_string(),
            ),
        ];
        Ok(Host {
            bin_dir,
            root: Some(root),
            env,
            label: format!("emulated {profile}"),
        })
    }

    /// A command for program `name` from the binary directory, with the host's environment.
    pub fn command(&self, name: &str) -> Command {
        let mut c = Command::new(self.bin_dir.join(name));
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// A command for a tool found on the host's `PATH` (e.g. `nvidia-cuda-mps-control`).
    pub fn tool(&self, name: &str) -> Command {
        let mut c = Command::new(name);
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// The environment children get (name, value).
    pub fn env(&self) -> &[(String, OsString)] {
        &self.env
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(r) = &self.root {
            let _ = std::fs::remove_dir_all(r);
        }
    }
}
