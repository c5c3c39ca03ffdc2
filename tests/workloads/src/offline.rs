//! The offline (training-like) client: back-to-back large `spin` kernels, iterations/s reported
//! periodically; on SIGTERM/SIGINT it finishes the iteration, copies its state buffer to the
//! host (the checkpoint), releases its context and prints the summary.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::cli::{in_range, Args};
use crate::gpu::Session;
use crate::signals;

/// `offline --help`.
pub const HELP: &str = "\
offline: a training-like CUDA client. Runs back-to-back large spin kernels (one iteration =
--kernels launches + cuCtxSynchronize) and reports iterations/s every --report-interval
seconds and at exit. The driver is loaded like real clients do (dlopen libcuda.so.1 +
cuGetProcAddress_v2), so the same binary runs on the emulator and on a GPU.

USAGE: offline [OPTIONS]

OPTIONS:
  --duration <s>          run this long; 0 = until SIGTERM/SIGINT      [default: 0]
  --iterations <n>        stop after n iterations                      [default: unlimited]
  --kernels <n>           kernels per iteration                        [default: 1]
  --kernel-us <us>        duration of one kernel at the rated SM clock [default: 20000]
  --blocks <n>            grid size (SM demand) per kernel             [default: 2 x SMs]
  --threads <n>           threads per block                            [default: 256]
  --state-mb <MiB>        device memory holding the 'model state'     [default: 64]
  --checkpoint <path>     write the state copied back at exit here
  --report-interval <s>   progress line period, 0 = none               [default: 1]
  --device <n>            CUDA device ordinal                          [default: 0]
  --json                  progress lines and summary as JSON objects (one per line)
  --ignore-sigterm        ignore SIGTERM (SIG_IGN, set before the driver is loaded): the
                          kernels go on until SIGINT, a limit or SIGKILL
  --help                  this text

On SIGTERM or SIGINT the client completes the running iteration, copies its state to the host
(cuMemcpyDtoH, the checkpoint), frees its memory and releases its context before exiting 0,
so it never leaves MPS with a dead client holding a context. With --ignore-sigterm only SIGINT
does: the client stands for an application that ignores the kubelet's SIGTERM and is SIGKILLed
at the end of the grace period (the GPU check kit's GPU_CHECK_RECOVERY_SIGTERM_FIRST).
Environment: WORKLOADS_LIBCUDA=<path> loads that driver file instead of libcuda.so.1.
Example: offline --kernel-us 50000 --blocks 264 --checkpoint /tmp/ckpt.bin";

/// The options of `offline` that take no value.
pub const FLAGS: &[&str] = &["json", "ignore-sigterm"];

/// Offline client settings.
#[derive(Debug, Clone)]
pub struct OfflineConfig {
    /// Run time limit (`None` = until a signal).
    pub duration: Option<Duration>,
    /// Iteration cap.
    pub iterations: Option<u64>,
    /// Kernels per iteration.
    pub kernels: u32,
    /// Per-kernel duration at the rated clock, microseconds.
    pub kernel_us: f64,
    /// Grid size; `None` = twice the SM count.
    pub blocks: Option<u32>,
    /// Threads per block.
    pub threads: u32,
    /// State buffer size in MiB.
    pub state_mb: usize,
    /// Checkpoint destination.
    pub checkpoint: Option<std::path::PathBuf>,
    /// Progress period (`None` = no progress lines).
    pub report_interval: Option<Duration>,
    /// Device ordinal.
    pub device: i32,
    /// JSON output.
    pub json: bool,
    /// SIGTERM ignored (set before the driver is loaded); SIGINT still stops the run.
    pub ignore_sigterm: bool,
}

impl OfflineConfig {
    /// Reads the settings from command-line arguments.
    pub fn from_args(mut a: Args) -> Result<Self, String> {
        let duration = in_range("duration", a.get("duration", 0.0)?, 0.0, 1e7)?;
        let interval = in_range("report-interval", a.get("report-interval", 1.0)?, 0.0, 1e6)?;
        let c = OfflineConfig {
            duration: (duration > 0.0).then(|| Duration::from_secs_f64(duration)),
            iterations: a.opt("iterations")?,
            kernels: in_range("kernels", a.get("kernels", 1)?, 1, 10_000)?,
            kernel_us: in_range("kernel-us", a.get("kernel-us", 20_000.0)?, 0.001, 1e9)?,
            blocks: a
                .opt("blocks")?
                .map(|b| in_range("blocks", b, 1, 1 << 30))
                .transpose()?,
            threads: in_range("threads", a.get("threads", 256)?, 1, 1024)?,
            state_mb: in_range("state-mb", a.get("state-mb", 64)?, 0, 1 << 20)?,
            checkpoint: a.opt::<String>("checkpoint")?.map(Into::into),
            report_interval: (interval > 0.0).then(|| Duration::from_secs_f64(interval)),
            device: a.get("device", 0)?,
            json: a.flag("json"),
            ignore_sigterm: a.flag("ignore-sigterm"),
        };
        a.finish()?;
        Ok(c)
    }
}

/// Result of a run.
#[derive(Debug, Clone)]
pub struct OfflineReport {
    /// Device name.
    pub device: String,
    /// Completed iterations.
    pub iterations: u64,
    /// Wall time of the loop.
    pub elapsed_s: f64,
    /// Iterations per second over the whole run.
    pub iters_per_s: f64,
    /// Bytes copied back to the host at exit.
    pub checkpoint_bytes: usize,
    /// Signal that stopped the run, if any.
    pub signal: Option<i32>,
    /// Grid size used.
    pub blocks: u32,
    /// Cycles per kernel used.
    pub cycles: u64,
}

impl OfflineReport {
    /// One JSON object.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"client\":\"offline\",\"final\":true,\"device\":{:?},\"iterations\":{},\"elapsed_s\":{:.4},\"iters_per_s\":{:.4},\"checkpoint_bytes\":{},\"signal\":{},\"blocks\":{},\"cycles\":{}}}",
            self.device,
            self.iterations,
            self.elapsed_s,
            self.iters_per_s,
            self.checkpoint_bytes,
            self.signal.map_or("null".to_string(), |s| s.to_string()),
            self.blocks,
            self.cycles
        )
    }

    /// A human table.
    pub fn to_table(&self) -> String {
        format!(
            "offline client on {} ({} blocks x {} cycles per kernel)\n  iterations    {:>10}\n  iterations/s  {:>10.3}\n  elapsed       {:>10.2} s\n  checkpoint    {:>10} bytes copied to host\n  stopped by    {:>10}",
            self.device,
            self.blocks,
            self.cycles,
            self.iterations,
            self.iters_per_s,
            self.elapsed_s,
            self.checkpoint_bytes,
            match self.signal {
                Some(libc::SIGTERM) => "SIGTERM".to_string(),
                Some(libc::SIGINT) => "SIGINT".to_string(),
                Some(s) => format!("signal {s}"),
                None => "limit".to_string(),
            }
        )
    }
}

/// A recognisable pattern for the state buffer, so a checkpoint can be checked: a 4 KiB
/// block (repeated with memcpy, fast in any build) whose last 8 bytes hold the block index.
pub fn state_pattern(len: usize) -> Vec<u8> {
    let block: Vec<u8> = (0..4096usize)
        .map(|i| (i.wrapping_mul(31) ^ (i >> 8)) as u8)
        .collect();
    let mut out = Vec::with_capacity(len + block.len());
    let mut n = 0u64;
    while out.len() < len {
        out.extend_from_slice(&block[..block.len() - 8]);
        out.extend_from_slice(&n.to_le_bytes());
        n += 1;
    }
    out.truncate(len);
    out
}

/// Runs the client on an open session; progress lines go to `progress`.
pub fn run(
    cfg: &OfflineConfig,
    s: &mut Session,
    progress: &mut dyn Write,
) -> Result<OfflineReport, String> {
    let blocks = cfg.blocks.unwrap_or(s.info.sm_count * 2);
    let cycles = s.info.cycles_for_us(cfg.kernel_us);
    let state_len = cfg.state_mb << 20;
    let state = if state_len > 0 {
        let p = s.alloc(state_len).map_err(|e| e.to_string())?;
        s.driver()
            .memcpy_htod(p, &state_pattern(state_len))
            .map_err(|e| e.to_string())?;
        Some(p)
    } else {
        None
    };
    let start = Instant::now();
    let mut iterations = 0u64;
    let (mut last_report, mut last_iters) = (start, 0u64);
    while !signals::stop_requested()
        && cfg.duration.is_none_or(|d| start.elapsed() < d)
        && cfg.iterations.is_none_or(|n| iterations < n)
    {
        for _ in 0..cfg.kernels {
            s.launch_spin(blocks, cfg.threads, cycles)
                .map_err(|e| e.to_string())?;
        }
        s.synchronize().map_err(|e| e.to_string())?;
        iterations += 1;
        if let Some(every) = cfg.report_interval {
            let now = Instant::now();
            let dt = now.duration_since(last_report);
            if dt >= every {
                let rate = (iterations - last_iters) as f64 / dt.as_secs_f64();
                let t = now.duration_since(start).as_secs_f64();
                let line = if cfg.json {
                    format!("{{\"client\":\"offline\",\"t_s\":{t:.3},\"iterations\":{iterations},\"iters_per_s\":{rate:.4}}}")
                } else {
                    format!("offline: t={t:8.2}s iterations={iterations:8} iterations/s={rate:9.3}")
                };
                let _ = writeln!(progress, "{line}");
                let _ = progress.flush();
                (last_report, last_iters) = (now, iterations);
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut checkpoint_bytes = 0;
    if let Some(p) = state {
        let mut host = vec![0u8; state_len];
        s.driver()
            .memcpy_dtoh(&mut host, p)
            .map_err(|e| e.to_string())?;
        checkpoint_bytes = host.len();
        if let Some(path) = &cfg.checkpoint {
            std::fs::write(path, &host)
                .map_err(|e| format!("writing checkpoint {}: {e}", path.display()))?;
        }
    }
    Ok(OfflineReport {
        device: s.info.name.clone(),
        iterations,
        elapsed_s: elapsed,
        iters_per_s: if elapsed > 0.0 {
            iterations as f64 / elapsed
        } else {
            0.0
        },
        checkpoint_bytes,
        signal: signals::received(),
        blocks,
        cycles,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_errors() {
        let c =
            OfflineConfig::from_args(Args::parse(Vec::<String>::new(), FLAGS).unwrap()).unwrap();
        assert_eq!((c.duration, c.kernels, c.state_mb), (None, 1, 64));
        assert_eq!(c.report_interval, Some(Duration::from_secs(1)));
        assert!(!c.ignore_sigterm);
        let bad = Args::parse(["--threads".to_string(), "4096".to_string()], FLAGS).unwrap();
        assert!(OfflineConfig::from_args(bad)
            .unwrap_err()
            .contains("--threads 4096"));
    }

    #[test]
    fn ignore_sigterm_is_a_flag_without_a_value() {
        let argv = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let c =
            OfflineConfig::from_args(Args::parse(argv("--ignore-sigterm --json"), FLAGS).unwrap())
                .unwrap();
        assert!(c.ignore_sigterm && c.json);
        assert!(Args::parse(argv("--ignore-sigterm=1"), FLAGS)
            .unwrap_err()
            .contains("takes no value"));
        assert!(HELP.contains("--ignore-sigterm"));
    }

    #[test]
    fn state_pattern_is_not_constant_and_blocks_differ() {
        let p = state_pattern(3 * 4096 + 5);
        assert_eq!(p.len(), 3 * 4096 + 5);
        assert!(p.iter().any(|&b| b != p[0]));
        assert_ne!(p[..4096], p[4096..8192]);
    }
}
