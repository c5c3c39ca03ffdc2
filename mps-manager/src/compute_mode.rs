//! The GPU's compute mode while the manager owns MPS: EXCLUSIVE_PROCESS by default, as NVIDIA's
//! MPS docs recommend, so that the MPS server is the one process holding a context of its own
//! on the GPU. A process that reaches no MPS control daemon (started before it, or with another
//! `CUDA_MPS_PIPE_DIRECTORY`) is then refused a context (`CUDA_ERROR_DEVICE_UNAVAILABLE`)
//! instead of running beside MPS time-sliced against the online service, out of reach of the SM
//! budget; and an MPS server cannot start while such a process holds the GPU.

use nvml_wrapper::enum_wrappers::device::ComputeMode;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use serde::{Deserialize, Serialize};

/// What the manager does with the GPU's compute mode (config `compute_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeModePolicy {
    /// Set EXCLUSIVE_PROCESS before the control daemon starts and keep it (a change while the
    /// manager runs, `nvidia-smi -c 0`, is put back with an error line); the mode found is put
    /// back when the manager quits MPS (`quit_on_exit`).
    #[default]
    ExclusiveProcess,
    /// Never read or change it.
    Leave,
}

/// The lower-case name the state file and logs give a mode (`nvidia-smi -c` spells them in
/// capitals).
pub fn name(mode: ComputeMode) -> &'static str {
    match mode {
        ComputeMode::Default => "default",
        ComputeMode::ExclusiveThread => "exclusive_thread",
        ComputeMode::Prohibited => "prohibited",
        ComputeMode::ExclusiveProcess => "exclusive_process",
    }
}

/// The mode [`name`] names.
pub fn from_name(n: &str) -> Option<ComputeMode> {
    [ComputeMode::Default, ComputeMode::ExclusiveThread, ComputeMode::Prohibited, ComputeMode::ExclusiveProcess]
        .into_iter()
        .find(|&m| name(m) == n)
}

/// Reads and sets one GPU's compute mode (NVML on a host; a fake in unit tests).
pub trait GpuModes {
    /// The mode now.
    fn get(&mut self) -> Result<ComputeMode, NvmlError>;
    /// Sets it (root only on a real GPU).
    fn set(&mut self, mode: ComputeMode) -> Result<(), NvmlError>;
    /// Pids of the processes holding a context on the GPU (`nvidia-smi`'s compute processes:
    /// MPS servers and clients included).
    fn compute_pids(&mut self) -> Result<Vec<u32>, NvmlError>;
}

/// [`GpuModes`] through NVML, for the GPU at an NVML index.
pub struct NvmlModes {
    nvml: Nvml,
    index: u32,
}

impl NvmlModes {
    /// Loads NVML (`libnvidia-ml.so.1`).
    pub fn open(index: u32) -> Result<NvmlModes, NvmlError> {
        Ok(NvmlModes { nvml: Nvml::init()?, index })
    }
}

impl GpuModes for NvmlModes {
    fn get(&mut self) -> Result<ComputeMode, NvmlError> {
        self.nvml.device_by_index(self.index)?.compute_mode()
    }

    fn set(&mut self, mode: ComputeMode) -> Result<(), NvmlError> {
        self.nvml.device_by_index(self.index)?.set_compute_mode(mode)
    }

    fn compute_pids(&mut self) -> Result<Vec<u32>, NvmlError> {
        let d = self.nvml.device_by_index(self.index)?;
        Ok(d.running_compute_processes()?.into_iter().map(|p| p.pid).collect())
    }
}

/// Holds one GPU's compute mode to the policy: the only writer of the mode on this node.
pub struct Keeper {
    index: u32,
    /// Opened at the first need (a manager that leaves the mode never loads NVML).
    gpu: Option<Box<dyn GpuModes + Send>>,
    /// The mode found before this manager first changed it: put back when it quits MPS.
    found: Option<ComputeMode>,
    /// The mode at the last look.
    last: Option<ComputeMode>,
}

impl Keeper {
    /// A keeper of the GPU at NVML index `index`; loads nothing yet.
    pub fn new(index: u32) -> Keeper {
        Keeper { index, gpu: None, found: None, last: None }
    }

    /// A keeper over `gpu` (tests).
    pub fn over(gpu: Box<dyn GpuModes + Send>) -> Keeper {
        Keeper { index: 0, gpu: Some(gpu), found: None, last: None }
    }

    /// The mode at the last look, if looked at.
    pub fn last(&self) -> Option<ComputeMode> {
        self.last
    }

    /// The mode this manager found before it first changed it, if it did.
    pub fn found(&self) -> Option<ComputeMode> {
        self.found
    }

    fn gpu(&mut self) -> Result<&mut (dyn GpuModes + Send), String> {
        if self.gpu.is_none() {
            let g = NvmlModes::open(self.index).map_err(|e| {
                format!("compute_mode = \"exclusive_process\" needs NVML to set GPU {}'s compute mode, and NVML did not load: {e}", self.index)
            })?;
            self.gpu = Some(Box::new(g));
        }
        Ok(self.gpu.as_deref_mut().expect("opened above"))
    }

    /// Makes the GPU's mode what `policy` asks: `Ok(Some(previous))` when it had to change it,
    /// `Ok(None)` when it already was (or the policy leaves it). `Err` says what failed and
    /// how an operator fixes it; the mode is then what it was.
    pub fn hold(&mut self, policy: ComputeModePolicy) -> Result<Option<ComputeMode>, String> {
        if policy == ComputeModePolicy::Leave {
            return Ok(None);
        }
        let index = self.index;
        let gpu = self.gpu()?;
        let now = gpu.get().map_err(|e| format!("reading GPU {index}'s compute mode: {e}"))?;
        if now == ComputeMode::ExclusiveProcess {
            self.last = Some(now);
            return Ok(None);
        }
        gpu.set(ComputeMode::ExclusiveProcess).map_err(|e| {
            let hint = match e {
                NvmlError::NoPermission => format!(
                    " (root only: run mps-manager as root, or set it beforehand with \
                     `nvidia-smi -i {index} -c EXCLUSIVE_PROCESS`)"
                ),
                // nvml.h: "On MIG-enabled GPUs, compute mode would be set to DEFAULT and
                // changing it is not supported."
                NvmlError::NotSupported => " (a MIG-enabled GPU keeps the DEFAULT mode)".to_string(),
                _ => String::new(),
            };
            format!(
                "setting GPU {index}'s compute mode from {} to exclusive_process: {e}{hint}; \
                 compute_mode = \"leave\" runs MPS without it",
                name(now)
            )
        })?;
        self.found.get_or_insert(now);
        self.last = Some(ComputeMode::ExclusiveProcess);
        Ok(Some(now))
    }

    /// Reads the mode and, when `policy` calls for a change (it is not EXCLUSIVE_PROCESS),
    /// records it as the mode found unless one is already: changes nothing. Returns whether a
    /// mode found was recorded now, so that the caller can make it durable before
    /// [`Keeper::hold`] changes the mode (a manager killed in between, or one whose control
    /// daemon then fails to start, must not leave its successor finding only
    /// EXCLUSIVE_PROCESS: the mode to put back would be lost).
    pub fn note_found(&mut self, policy: ComputeModePolicy) -> Result<bool, String> {
        if policy == ComputeModePolicy::Leave || self.found.is_some() {
            return Ok(false);
        }
        let index = self.index;
        let now = self.gpu()?.get().map_err(|e| format!("reading GPU {index}'s compute mode: {e}"))?;
        if now == ComputeMode::ExclusiveProcess {
            return Ok(false);
        }
        self.found = Some(now);
        Ok(true)
    }

    /// Forgets the mode [`Keeper::note_found`] recorded (the change it was for failed).
    pub fn forget_found(&mut self) {
        self.found = None;
    }

    /// Takes over the mode a previous manager of this GPU found before it changed it (its state
    /// file's `compute_mode_found`): that is the one to put back, not the EXCLUSIVE_PROCESS
    /// this manager finds.
    pub fn adopt_found(&mut self, found: ComputeMode) {
        self.found = Some(found);
    }

    /// Pids of the processes holding a context on the GPU, when the keeper holds the mode
    /// (NVML loaded); `None` otherwise or when NVML fails.
    pub fn compute_pids(&mut self) -> Option<Vec<u32>> {
        self.gpu.as_deref_mut()?.compute_pids().ok()
    }

    /// Puts back the mode found before this manager first changed it (when it quits MPS):
    /// `Ok(Some(mode))` when it did, `Ok(None)` when it never changed the mode.
    pub fn restore(&mut self) -> Result<Option<ComputeMode>, String> {
        let Some(found) = self.found else {
            return Ok(None);
        };
        let index = self.index;
        self.gpu()?
            .set(found)
            .map_err(|e| format!("putting GPU {index}'s compute mode back to {}: {e}", name(found)))?;
        self.found = None;
        self.last = Some(found);
        Ok(Some(found))
    }
}

/// A fake GPU for the manager's unit tests.
#[cfg(test)]
pub mod testing {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A GPU whose mode lives in a shared cell; `deny` makes `set` fail as NVML does for a
    /// non-root caller.
    #[derive(Clone)]
    pub struct Fake {
        /// The mode now.
        pub mode: Arc<Mutex<ComputeMode>>,
        /// `set` fails with NO_PERMISSION.
        pub deny: bool,
        /// Successful `set` calls.
        pub sets: Arc<Mutex<u32>>,
        /// What `compute_pids` answers.
        pub pids: Arc<Mutex<Vec<u32>>>,
    }

    impl Fake {
        /// A GPU in `mode`.
        pub fn new(mode: ComputeMode) -> Fake {
            Fake { mode: Arc::new(Mutex::new(mode)), deny: false, sets: Arc::new(Mutex::new(0)), pids: Arc::default() }
        }
        /// The mode now.
        pub fn mode(&self) -> ComputeMode {
            *self.mode.lock().unwrap()
        }
    }

    impl GpuModes for Fake {
        fn get(&mut self) -> Result<ComputeMode, NvmlError> {
            Ok(self.mode())
        }
        fn set(&mut self, mode: ComputeMode) -> Result<(), NvmlError> {
            if self.deny {
                return Err(NvmlError::NoPermission);
            }
            *self.sets.lock().unwrap() += 1;
            *self.mode.lock().unwrap() = mode;
            Ok(())
        }
        fn compute_pids(&mut self) -> Result<Vec<u32>, NvmlError> {
            Ok(self.pids.lock().unwrap().clone())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::Fake;
    use super::*;

    #[test]
    fn exclusive_process_is_set_kept_and_the_found_mode_put_back() {
        let gpu = Fake::new(ComputeMode::Default);
        let mut k = Keeper::over(Box::new(gpu.clone()));
        let p = ComputeModePolicy::ExclusiveProcess;
        assert_eq!(k.hold(p).unwrap(), Some(ComputeMode::Default));
        assert_eq!(gpu.mode(), ComputeMode::ExclusiveProcess);
        assert_eq!(k.hold(p).unwrap(), None, "already so: nothing set");
        assert_eq!(*gpu.sets.lock().unwrap(), 1);
        // An operator's change is put back; what is restored later is still the mode found
        // before the manager's first change.
        *gpu.mode.lock().unwrap() = ComputeMode::Prohibited;
        assert_eq!(k.hold(p).unwrap(), Some(ComputeMode::Prohibited));
        assert_eq!(gpu.mode(), ComputeMode::ExclusiveProcess);
        assert_eq!(k.found(), Some(ComputeMode::Default));
        assert_eq!(k.restore().unwrap(), Some(ComputeMode::Default));
        assert_eq!(gpu.mode(), ComputeMode::Default);
        assert_eq!(k.restore().unwrap(), None, "restored once");
    }

    #[test]
    fn a_gpu_already_exclusive_is_never_changed_or_restored() {
        let gpu = Fake::new(ComputeMode::ExclusiveProcess);
        let mut k = Keeper::over(Box::new(gpu.clone()));
        assert_eq!(k.hold(ComputeModePolicy::ExclusiveProcess).unwrap(), None);
        assert_eq!(k.restore().unwrap(), None);
        assert_eq!((gpu.mode(), *gpu.sets.lock().unwrap()), (ComputeMode::ExclusiveProcess, 0));
        assert_eq!(k.last(), Some(ComputeMode::ExclusiveProcess));
    }

    #[test]
    fn leave_touches_nothing() {
        let gpu = Fake::new(ComputeMode::Default);
        let mut k = Keeper::over(Box::new(gpu.clone()));
        assert_eq!(k.hold(ComputeModePolicy::Leave).unwrap(), None);
        assert_eq!((gpu.mode(), *gpu.sets.lock().unwrap()), (ComputeMode::Default, 0));
        assert_eq!(k.last(), None, "not even read");
    }

    #[test]
    fn a_refused_change_says_how_to_fix_it_and_changes_nothing() {
        let mut gpu = Fake::new(ComputeMode::Default);
        gpu.deny = true;
        let mut k = Keeper::over(Box::new(gpu.clone()));
        let e = k.hold(ComputeModePolicy::ExclusiveProcess).unwrap_err();
        for want in ["from default to exclusive_process", "nvidia-smi -i 0 -c EXCLUSIVE_PROCESS", "compute_mode = \"leave\""] {
            assert!(e.contains(want), "{want:?} missing: {e}");
        }
        assert_eq!(k.found(), None, "nothing to put back");
        assert_eq!(gpu.mode(), ComputeMode::Default);
    }

    #[test]
    fn names_read_back() {
        for m in [ComputeMode::Default, ComputeMode::ExclusiveThread, ComputeMode::Prohibited, ComputeMode::ExclusiveProcess] {
            assert_eq!(from_name(name(m)), Some(m));
        }
        assert_eq!(from_name("Default"), None);
    }

    #[test]
    fn the_policy_reads_from_config_names() {
        let p: ComputeModePolicy = serde_json::from_str("\"exclusive_process\"").unwrap();
        assert_eq!(p, ComputeModePolicy::ExclusiveProcess);
        let p: ComputeModePolicy = serde_json::from_str("\"leave\"").unwrap();
        assert_eq!(p, ComputeModePolicy::Leave);
        assert!(serde_json::from_str::<ComputeModePolicy>("\"default\"").is_err());
        assert_eq!(ComputeModePolicy::default(), ComputeModePolicy::ExclusiveProcess);
    }
}
