//! `sysmonitor nvml-cost`: what each NVML query the monitor makes costs on this GPU, and what
//! they add up to at the configured sampling pace. The monitor's own CPU on a real GPU is mostly
//! its NVML calls (an H200 with driver 580: 1.08 % of a core at 10 ms), and their cost differs
//! by driver and GPU, so the breakdown is measured where the monitor runs, not assumed.

use serde::Serialize;

use crate::config::Config;
use crate::sampler::{GpuSource, NvmlSource};

/// One NVML query as the monitor makes it.
#[derive(Debug, Clone, Serialize)]
pub struct CallCost {
    /// The NVML entry point(s) timed.
    pub query: &'static str,
    /// Calls timed.
    pub calls: u32,
    /// Thread CPU time per call, ns (user + system of the calling thread).
    pub cpu_ns: f64,
    /// Wall-clock time per call, ns.
    pub wall_ns: f64,
    /// How often the monitor makes it at the configured pace, per second.
    pub per_sec: f64,
    /// When the monitor makes it.
    pub when: String,
    /// The call failed (not offered by this GPU or driver): not counted in the total.
    pub error: Option<String>,
}

impl CallCost {
    /// Its share of one core at the monitor's pace, %.
    pub fn core_pct(&self) -> f64 {
        if self.error.is_some() {
            return 0.0;
        }
        self.cpu_ns * self.per_sec / 1e7
    }
}

/// The whole measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// GPU index.
    pub gpu: u32,
    /// Sampling interval the per-second figures assume, ms.
    pub interval_ms: u64,
    /// Every query, in the order of a sampling tick.
    pub calls: Vec<CallCost>,
    /// The NVML part of the monitor's CPU at `interval_ms`, % of one core.
    pub total_core_pct: f64,
    /// Sleep before each timed call, ms (0: back to back).
    pub gap_ms: u64,
    /// A whole sample as the monitor's tick makes it (`GpuSource::sample`, the XID poll and the
    /// process list, each query at its pace), timed over `calls` (at most 500) ticks
    /// `interval_ms` apart: CPU ns per tick.
    /// The monitor's NVML cost as it pays it; `None` when a tick failed.
    pub tick_cpu_ns: Option<f64>,
}

impl Report {
    /// The whole ticks' share of one core at `interval_ms`, %.
    pub fn tick_core_pct(&self) -> Option<f64> {
        self.tick_cpu_ns
            .map(|ns| ns * 1000.0 / self.interval_ms.max(1) as f64 / 1e7)
    }
}

/// This thread's CPU time so far, ns.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a live out-pointer; the call has no other preconditions.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Times `f` over `calls` calls: (cpu ns, wall ns) per call, or the first error. With a `gap`,
/// the thread sleeps that long before each call and only the calls are timed: a call made once
/// every few milliseconds, as the monitor makes it, finds cold caches and may cost several
/// times what it costs back to back.
pub fn time_calls(
    calls: u32,
    gap: std::time::Duration,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<(f64, f64), String> {
    let n = calls.max(1);
    f()?; // warm: the first call may load or allocate
    if gap.is_zero() {
        let (c0, w0) = (thread_cpu_ns(), std::time::Instant::now());
        for _ in 0..n {
            f()?;
        }
        let cpu = thread_cpu_ns().saturating_sub(c0) as f64 / f64::from(n);
        return Ok((cpu, w0.elapsed().as_nanos() as f64 / f64::from(n)));
    }
    let (mut cpu, mut wall) = (0u64, 0u128);
    for _ in 0..n {
        std::thread::sleep(gap);
        let (c0, w0) = (thread_cpu_ns(), std::time::Instant::now());
        f()?;
        cpu += thread_cpu_ns().saturating_sub(c0);
        wall += w0.elapsed().as_nanos();
    }
    Ok((cpu as f64 / f64::from(n), wall as f64 / f64::from(n)))
}

/// How often the monitor makes each query, from its settings.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// `interval_ms`.
    pub interval_ms: u64,
    /// `verify.every_ms` (the process list; 0 = verify off).
    pub verify_every_ms: u64,
    /// `nvml.gpm_every_ms`.
    pub gpm_every_ms: u64,
    /// `nvml.memory_every_ms`.
    pub memory_every_ms: u64,
    /// `nvml.clock_reasons_every_ms`.
    pub clock_reasons_every_ms: u64,
    /// `nvml.power_temp_every_ms`.
    pub power_temp_every_ms: u64,
    /// `nvml.xid_every_ms`.
    pub xid_every_ms: u64,
}

impl Pace {
    /// The paces a monitor running with `cfg` makes its queries at.
    pub fn of(cfg: &Config) -> Pace {
        Pace {
            interval_ms: cfg.interval_ms,
            verify_every_ms: if cfg.verify.enabled { cfg.verify.every_ms } else { 0 },
            gpm_every_ms: cfg.nvml.gpm_every_ms,
            memory_every_ms: cfg.nvml.memory_every_ms,
            clock_reasons_every_ms: cfg.nvml.clock_reasons_every_ms,
            power_temp_every_ms: cfg.nvml.power_temp_every_ms,
            xid_every_ms: cfg.nvml.xid_every_ms,
        }
    }

    fn per_sample(&self) -> f64 {
        1000.0 / self.interval_ms.max(1) as f64
    }
    fn every(ms: u64) -> f64 {
        if ms == 0 {
            0.0
        } else {
            1000.0 / ms as f64
        }
    }
}

/// Measures every query on GPU `gpu` (`calls` each; GPM metrics, about a millisecond each on
/// a real GPU, at most 100), each call after `gap` of sleep (zero: back to back), then
/// `calls` (at most 500) whole sample ticks `interval_ms` apart.
pub fn measure(
    src: &mut NvmlSource,
    gpu: u32,
    calls: u32,
    gap: std::time::Duration,
    pace: Pace,
) -> Report {
    let per_sample = pace.per_sample();
    let mut out = Vec::new();
    let mut add = |query: &'static str,
                   calls: u32,
                   per_sec: f64,
                   when: String,
                   r: Result<(f64, f64), String>| {
        let (cpu_ns, wall_ns, error) = match r {
            Ok((c, w)) => (c, w, None),
            Err(e) => (0.0, 0.0, Some(e)),
        };
        out.push(CallCost {
            query,
            calls,
            cpu_ns,
            wall_ns,
            per_sec,
            when,
            error,
        });
    };
    let each = format!("every sample ({} ms)", pace.interval_ms);
    add(
        "nvmlDeviceGetUtilizationRates",
        calls,
        per_sample,
        each.clone(),
        time_calls(calls, gap, || src.util_rate().map(drop)),
    );
    let gpm = src.has_gpm();
    if gpm {
        let n = calls.min(100);
        let when = format!("every {} ms", pace.gpm_every_ms);
        add(
            "nvmlGpmSampleGet",
            n,
            Pace::every(pace.gpm_every_ms),
            when.clone(),
            time_calls(n, gap, || src.probe_gpm_sample()),
        );
        add(
            "nvmlGpmMetricsGet (SM, graphics util)",
            n,
            Pace::every(pace.gpm_every_ms),
            when,
            time_calls(n, gap, || src.probe_gpm_metrics()),
        );
    } else {
        add(
            "nvmlDeviceGetSamples (GPU utilization)",
            calls,
            per_sample,
            each.clone(),
            time_calls(calls, gap, || src.probe_util_samples()),
        );
    }
    // At most once a sample, as the paced queries below.
    let mem_ms = pace.memory_every_ms.max(pace.interval_ms);
    add(
        "nvmlDeviceGetMemoryInfo",
        calls,
        Pace::every(mem_ms),
        format!("every {mem_ms} ms"),
        time_calls(calls, gap, || src.memory().map(drop)),
    );
    add(
        "nvmlDeviceGetClockInfo (SM)",
        calls,
        per_sample,
        each.clone(),
        time_calls(calls, gap, || src.sm_clock().map(drop)),
    );
    let reasons_ms = pace.clock_reasons_every_ms.max(pace.interval_ms);
    add(
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        calls,
        Pace::every(reasons_ms),
        format!("every {reasons_ms} ms while the SM clock is below its top and still (an idle GPU), at once when it moves"),
        time_calls(calls, gap, || src.clock_reasons().map(drop)),
    );
    // At most once a sample.
    let aux = Pace::every(pace.power_temp_every_ms.max(pace.interval_ms));
    let aux_when = format!("every {} ms", pace.power_temp_every_ms.max(pace.interval_ms));
    add(
        "nvmlDeviceGetPowerUsage",
        calls,
        aux,
        aux_when.clone(),
        time_calls(calls, gap, || src.power().map(drop)),
    );
    add(
        "nvmlDeviceGetTemperature",
        calls,
        aux,
        aux_when,
        time_calls(calls, gap, || src.temperature().map(drop)),
    );
    add(
        "nvmlEventSetWait (XID events, timeout 0)",
        calls,
        Pace::every(pace.xid_every_ms),
        format!("every {} ms", pace.xid_every_ms),
        if src.has_xid_events() {
            time_calls(calls, gap, || {
                src.xids();
                Ok(())
            })
        } else {
            Err("no XID event set on this GPU".into())
        },
    );
    add(
        "nvmlDeviceGetComputeRunningProcesses",
        calls,
        Pace::every(pace.verify_every_ms),
        format!(
            "every {} ms (verify), more while offline work is co-located",
            pace.verify_every_ms
        ),
        time_calls(calls, gap, || src.processes().map(drop)),
    );
    let total_core_pct = out.iter().map(CallCost::core_pct).sum();
    let t0 = std::time::Instant::now();
    let tick = std::time::Duration::from_millis(pace.interval_ms.max(1));
    let (mut next_xid, mut next_verify) = (0, 0);
    let tick_cpu_ns = time_calls(calls.min(500), tick, || {
        let now = t0.elapsed().as_millis() as u64;
        src.sample(now)?;
        if now >= next_xid {
            next_xid = now + pace.xid_every_ms;
            src.xids();
        }
        if pace.verify_every_ms > 0 && now >= next_verify {
            next_verify = now + pace.verify_every_ms;
            src.processes()?;
        }
        Ok(())
    })
    .ok()
    .map(|(cpu, _)| cpu);
    Report {
        gpu,
        interval_ms: pace.interval_ms,
        calls: out,
        total_core_pct,
        gap_ms: gap.as_millis() as u64,
        tick_cpu_ns,
    }
}

/// The report as a table.
pub fn table(r: &Report) -> String {
    let how = if r.gap_ms == 0 {
        "calls back to back".to_string()
    } else {
        format!("each call after {} ms of sleep, as the monitor spaces them", r.gap_ms)
    };
    let mut s = format!(
        "NVML calls of the monitor on GPU {}: CPU per call (this thread; {how}), and at interval_ms = {} ms\n\n",
        r.gpu, r.interval_ms
    );
    s += &format!(
        "{:<44} {:>7} {:>12} {:>13} {:>9} {:>12}  {}\n",
        "query", "calls", "cpu us/call", "wall us/call", "calls/s", "% of a core", "when"
    );
    for c in &r.calls {
        match &c.error {
            Some(e) => {
                s += &format!(
                    "{:<44} {:>7} {:>12} {:>13} {:>9.1} {:>12}  unavailable: {e}\n",
                    c.query, c.calls, "-", "-", c.per_sec, "-"
                )
            }
            None => {
                s += &format!(
                    "{:<44} {:>7} {:>12.2} {:>13.2} {:>9.1} {:>12.3}  {}\n",
                    c.query,
                    c.calls,
                    c.cpu_ns / 1e3,
                    c.wall_ns / 1e3,
                    c.per_sec,
                    c.core_pct(),
                    c.when
                )
            }
        }
    }
    s += &format!(
        "\ntotal: {:.3} % of a core for NVML at {} ms (the monitor's own work and its wake-ups come on top)\n",
        r.total_core_pct, r.interval_ms
    );
    match (r.tick_cpu_ns, r.tick_core_pct()) {
        (Some(ns), Some(pct)) => {
            s += &format!(
                "whole ticks: {:.2} us of CPU per sample tick {} ms apart = {pct:.3} % of a core (the queries as the monitor's tick makes them, each at its pace)\n",
                ns / 1e3,
                r.interval_ms
            )
        }
        _ => s += "whole ticks: a sample failed\n",
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_s_share_is_its_cpu_times_its_rate() {
        let c = CallCost {
            query: "q",
            calls: 1,
            cpu_ns: 1_300_000.0,
            wall_ns: 0.0,
            per_sec: 2.0,
            when: String::new(),
            error: None,
        };
        // 1.3 ms twice a second: 0.26 % of a core (GPM metrics at 500 ms).
        assert!((c.core_pct() - 0.26).abs() < 1e-9);
        let failed = CallCost {
            error: Some("not supported".into()),
            ..c
        };
        assert_eq!(failed.core_pct(), 0.0);
    }

    #[test]
    fn a_gap_is_slept_before_each_call_and_not_timed() {
        let gap = std::time::Duration::from_millis(5);
        let t0 = std::time::Instant::now();
        let mut last: Option<std::time::Instant> = None;
        let (_, wall) = time_calls(4, gap, || {
            let now = std::time::Instant::now();
            if let Some(l) = last {
                assert!(now - l >= gap, "each call comes after the gap");
            }
            last = Some(now);
            Ok(())
        })
        .unwrap();
        // 5 calls (one warm-up), 4 timed after a sleep each: the sleeps are outside the figure.
        let total = t0.elapsed().as_nanos() as f64;
        assert!(4.0 * wall <= total - 4.0 * gap.as_nanos() as f64, "wall {wall} of {total}");
    }

    #[test]
    fn timing_counts_cpu_not_sleep_and_stops_at_an_error() {
        let (cpu, wall) = time_calls(3, std::time::Duration::ZERO, || {
            std::thread::sleep(std::time::Duration::from_millis(5));
            Ok(())
        })
        .unwrap();
        assert!(wall >= 5e6, "wall {wall}");
        assert!(cpu < wall, "sleeping is no CPU: {cpu} vs {wall}");
        let mut n = 0;
        let r = time_calls(10, std::time::Duration::ZERO, || {
            n += 1;
            if n > 2 {
                Err("gone".into())
            } else {
                Ok(())
            }
        });
        assert_eq!(r, Err("gone".to_string()));
    }
}
