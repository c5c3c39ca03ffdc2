//! The online (inference-like) client: open-loop requests at a fixed or Poisson rate, each a
//! few short `spin` kernels and a synchronize; latency runs from the request's scheduled
//! arrival to its completion, so queueing behind a slow GPU counts.

use std::time::{Duration, Instant};

use crate::cli::{in_range, Args};
use crate::gpu::Session;
use crate::signals;
use crate::stats::{summarize, LatencySummary};

/// `online` arguments of the latency probe the node demo and the node-runtime test measure
/// with: 100 requests/s at fixed intervals, each two 500 us kernels, for `duration_s` seconds.
pub fn probe_args(duration_s: &str) -> [&str; 10] {
    [
        "--rate",
        "100",
        "--duration",
        duration_s,
        "--kernels",
        "2",
        "--kernel-us",
        "500",
        "--arrivals",
        "fixed",
    ]
}

/// `online` arguments of a burst on every SM of an H100 (132 blocks): `rate` requests/s of
/// four 2 ms kernels for `duration_s` seconds, what drives the GPU past Overlimit in the node
/// demo and the node-runtime test.
pub fn burst_args<'a>(rate: &'a str, duration_s: &'a str) -> [&'a str; 10] {
    [
        "--rate",
        rate,
        "--duration",
        duration_s,
        "--kernels",
        "4",
        "--kernel-us",
        "2000",
        "--blocks",
        "132",
    ]
}

/// `online --help`.
pub const HELP: &str = "\
online: an inference-like CUDA client. Sends requests at a given rate (open loop), each
request = a few short spin kernels + cuCtxSynchronize, and reports per-request latency.
The driver is loaded like real clients do (dlopen libcuda.so.1 + cuGetProcAddress_v2), so the
same binary runs on the emulator and on a GPU.

USAGE: online [OPTIONS]

OPTIONS:
  --rate <req/s>        request arrival rate                          [default: 50]
  --arrivals <kind>     poisson | fixed                               [default: poisson]
  --duration <s>        stop scheduling arrivals after this long      [default: 5]
  --requests <n>        stop after n requests (whichever comes first)  [default: unlimited]
  --kernels <n>         kernels per request                           [default: 4]
  --kernel-us <us>      duration of one kernel at the rated SM clock  [default: 500]
  --blocks <n>          grid size (SM demand) per kernel
  --sm-fraction <f>     grid size as a fraction of the SMs, when --blocks is not given
                                                                      [default: 0.25]
  --threads <n>         threads per block                             [default: 128]
  --device <n>          CUDA device ordinal                           [default: 0]
  --seed <n>            seed of the Poisson arrivals                  [default: 1]
  --json                print the summary as one JSON object on stdout
  --help                this text

SIGINT/SIGTERM stop early and still print the summary.
Environment: WORKLOADS_LIBCUDA=<path> loads that driver file instead of libcuda.so.1.
Example: online --rate 100 --duration 10 --kernels 4 --kernel-us 300 --json";

/// Arrival process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrivals {
    /// Exponential inter-arrival times.
    Poisson,
    /// Constant inter-arrival time `1/rate`.
    Fixed,
}

/// Online client settings.
#[derive(Debug, Clone)]
pub struct OnlineConfig {
    /// Requests per second.
    pub rate: f64,
    /// Arrival process.
    pub arrivals: Arrivals,
    /// How long arrivals are scheduled.
    pub duration: Duration,
    /// Request cap.
    pub requests: Option<u64>,
    /// Kernels per request.
    pub kernels: u32,
    /// Per-kernel duration at the rated clock, microseconds.
    pub kernel_us: f64,
    /// Grid size; `None` = `sm_fraction` of the SMs.
    pub blocks: Option<u32>,
    /// Grid size as a fraction of the SMs (0..=1] when `blocks` is not given.
    pub sm_fraction: f64,
    /// Threads per block.
    pub threads: u32,
    /// Device ordinal.
    pub device: i32,
    /// Seed of the arrival process.
    pub seed: u64,
    /// JSON output.
    pub json: bool,
}

impl OnlineConfig {
    /// Reads the settings from command-line arguments.
    pub fn from_args(mut a: Args) -> Result<Self, String> {
        let arrivals = match a.get("arrivals", "poisson".to_string())?.as_str() {
            "poisson" => Arrivals::Poisson,
            "fixed" => Arrivals::Fixed,
            other => return Err(format!("--arrivals '{other}': expected poisson or fixed")),
        };
        let c = OnlineConfig {
            rate: in_range("rate", a.get("rate", 50.0)?, 0.01, 1e6)?,
            arrivals,
            duration: Duration::from_secs_f64(in_range(
                "duration",
                a.get("duration", 5.0)?,
                0.0,
                1e7,
            )?),
            requests: a.opt("requests")?,
            kernels: in_range("kernels", a.get("kernels", 4)?, 1, 10_000)?,
            kernel_us: in_range("kernel-us", a.get("kernel-us", 500.0)?, 0.001, 1e9)?,
            blocks: a
                .opt("blocks")?
                .map(|b| in_range("blocks", b, 1, 1 << 30))
                .transpose()?,
            sm_fraction: in_range("sm-fraction", a.get("sm-fraction", 0.25)?, 0.001, 1.0)?,
            threads: in_range("threads", a.get("threads", 128)?, 1, 1024)?,
            device: a.get("device", 0)?,
            seed: a.get("seed", 1)?,
            json: a.flag("json"),
        };
        a.finish()?;
        Ok(c)
    }
}

/// Result of a run.
#[derive(Debug, Clone)]
pub struct OnlineReport {
    /// Device name.
    pub device: String,
    /// Latency summary.
    pub latency: LatencySummary,
    /// Completed requests per second of wall time.
    pub throughput_rps: f64,
    /// Wall time from the first arrival to the last completion.
    pub elapsed_s: f64,
    /// Grid size used.
    pub blocks: u32,
    /// Cycles per kernel used.
    pub cycles: u64,
}

impl OnlineReport {
    /// One JSON object (hand-written: flat numbers and one string).
    pub fn to_json(&self) -> String {
        let l = &self.latency;
        format!(
            "{{\"client\":\"online\",\"device\":{:?},\"requests\":{},\"p50_ms\":{:.4},\"p90_ms\":{:.4},\"p99_ms\":{:.4},\"mean_ms\":{:.4},\"max_ms\":{:.4},\"throughput_rps\":{:.4},\"elapsed_s\":{:.4},\"blocks\":{},\"cycles\":{}}}",
            self.device, l.count, l.p50_ms, l.p90_ms, l.p99_ms, l.mean_ms, l.max_ms, self.throughput_rps, self.elapsed_s, self.blocks, self.cycles
        )
    }

    /// A human table.
    pub fn to_table(&self) -> String {
        let l = &self.latency;
        format!(
            "online client on {} ({} blocks x {} cycles per kernel)\n  requests      {:>10}\n  p50 latency   {:>10.3} ms\n  p90 latency   {:>10.3} ms\n  p99 latency   {:>10.3} ms\n  mean latency  {:>10.3} ms\n  max latency   {:>10.3} ms\n  throughput    {:>10.2} req/s\n  elapsed       {:>10.2} s",
            self.device, self.blocks, self.cycles, l.count, l.p50_ms, l.p90_ms, l.p99_ms, l.mean_ms, l.max_ms, self.throughput_rps, self.elapsed_s
        )
    }
}

/// splitmix64: a tiny deterministic generator for arrival times.
struct SplitMix(u64);

impl SplitMix {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Inter-arrival gaps for `arrivals` at `rate`.
fn gaps(arrivals: Arrivals, rate: f64, seed: u64) -> impl FnMut() -> Duration {
    let mut rng = SplitMix(seed);
    move || match arrivals {
        Arrivals::Fixed => Duration::from_secs_f64(1.0 / rate),
        Arrivals::Poisson => Duration::from_secs_f64(-(1.0 - rng.next_f64()).ln() / rate),
    }
}

/// Runs the client on an open session.
pub fn run(cfg: &OnlineConfig, s: &Session) -> Result<OnlineReport, String> {
    let blocks = cfg
        .blocks
        .unwrap_or_else(|| ((f64::from(s.info.sm_count) * cfg.sm_fraction).ceil() as u32).max(1));
    let cycles = s.info.cycles_for_us(cfg.kernel_us);
    let request = || -> Result<(), String> {
        for _ in 0..cfg.kernels {
            s.launch_spin(blocks, cfg.threads, cycles)
                .map_err(|e| e.to_string())?;
        }
        s.synchronize().map_err(|e| e.to_string())
    };
    request()?; // warm-up: module JIT and first-launch costs stay out of the figures
    let mut next_gap = gaps(cfg.arrivals, cfg.rate, cfg.seed);
    let mut lat_ms = Vec::new();
    let start = Instant::now();
    let mut arrival = start;
    let mut last_done = start;
    while !signals::stop_requested()
        && arrival.duration_since(start) <= cfg.duration
        && cfg.requests.is_none_or(|n| (lat_ms.len() as u64) < n)
    {
        let now = Instant::now();
        if arrival > now {
            std::thread::sleep(arrival - now);
        }
        request()?;
        last_done = Instant::now();
        lat_ms.push(last_done.duration_since(arrival).as_secs_f64() * 1e3);
        arrival += next_gap();
    }
    let elapsed = last_done.duration_since(start).as_secs_f64();
    Ok(OnlineReport {
        device: s.info.name.clone(),
        latency: summarize(&lat_ms),
        throughput_rps: if elapsed > 0.0 {
            lat_ms.len() as f64 / elapsed
        } else {
            0.0
        },
        elapsed_s: elapsed,
        blocks,
        cycles,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_gaps_average_to_the_rate() {
        let mut g = gaps(Arrivals::Poisson, 100.0, 7);
        let n = 20_000;
        let mean: f64 = (0..n).map(|_| g().as_secs_f64()).sum::<f64>() / n as f64;
        assert!((mean - 0.01).abs() < 0.0005, "mean gap {mean}");
        let mut f = gaps(Arrivals::Fixed, 4.0, 7);
        assert_eq!(f(), Duration::from_millis(250));
    }

    #[test]
    fn config_defaults_and_errors() {
        let c =
            OnlineConfig::from_args(Args::parse(Vec::<String>::new(), &["json"]).unwrap()).unwrap();
        assert_eq!(
            (c.rate, c.kernels, c.arrivals),
            (50.0, 4, Arrivals::Poisson)
        );
        let bad = Args::parse(["--arrivals".to_string(), "bursty".to_string()], &["json"]).unwrap();
        assert!(OnlineConfig::from_args(bad).unwrap_err().contains("bursty"));
        let bad = Args::parse(["--rate".to_string(), "0".to_string()], &["json"]).unwrap();
        assert!(OnlineConfig::from_args(bad)
            .unwrap_err()
            .contains("out of range"));
    }
}
