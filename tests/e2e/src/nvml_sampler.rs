//! The stress tools' view of NVML from outside the shim: an `nvml-sampler` process (see its
//! source, `src/bin/nvml-sampler.rs`) reading the host's fake NVML every ~2 ms, as a
//! monitoring tool would, while the tool runs.

use crate::{artifact, field, EmuChild, EmuHost, T};

/// A running `nvml-sampler` on one emulated host.
pub struct NvmlSampler {
    child: EmuChild,
}

/// What an [`NvmlSampler`] saw (bytes, each less one context per process).
#[derive(Clone, Copy, Debug)]
pub struct NvmlFigures {
    /// Samples taken.
    pub samples: u64,
    /// Most the watched processes held at once by NVML's process list.
    pub procs_max: u64,
    /// Most device memory used at once above the sampler's starting point.
    pub used_max: u64,
    /// Most the watched processes still alive held at once by NVML's process list (a killed
    /// process is listed until the emulator reaps it).
    pub live_max: u64,
    /// Samples with `procs_max` or `used_max` over the quota.
    pub over: u64,
}

impl NvmlSampler {
    /// Starts the sampler on `host`, counting samples over `quota` bytes and taking one
    /// context of the host's GPU off each process (NVML counts it, the quota does not); returns
    /// once it has read the device's starting point.
    pub fn start(host: &EmuHost, quota: u64) -> NvmlSampler {
        let bin = artifact("nvml-sampler");
        let mut c = host.command(bin.to_str().expect("utf-8 path"));
        c.arg(host.require_nvml())
            .arg(quota.to_string())
            .arg(host.context_bytes().to_string());
        let mut child = host.spawn(&mut c);
        assert!(
            child.wait_for_line("nvml-sampler ready", T).is_some(),
            "NVML sampler did not start: {}\n{}",
            child.stdout(),
            child.stderr()
        );
        NvmlSampler { child }
    }

    /// Counts process `pid` among the watched ones from now on.
    pub fn watch(&mut self, pid: u32) {
        self.child.send_line(&format!("pid {pid}"));
    }

    /// Stops the sampler and returns its figures.
    pub fn stop(mut self) -> NvmlFigures {
        self.child.send_line("stop");
        let line = self.child.wait_for_line("nvml-sampler done", T);
        let line = line.unwrap_or_else(|| {
            panic!(
                "NVML sampler gave no figures: {}\n{}",
                self.child.stdout(),
                self.child.stderr()
            )
        });
        self.child.finish(T);
        let n = |k: &str| -> u64 {
            field(&line, k)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {k}= in {line:?}"))
        };
        NvmlFigures {
            samples: n("samples"),
            procs_max: n("procs_max"),
            used_max: n("used_max"),
            live_max: n("live_max"),
            over: n("over"),
        }
    }
}
