//! GPU sampling through NVML (`nvml-wrapper`), choosing the best SM-activity source available.

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{Clock, Sampling, TemperatureSensor};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;

use crate::config::NvmlPaceConfig;
use crate::health::Metrics;

pub use node_ledger::sample::{GpuSample, SmSource};

/// The health machine's view of a sample (a trait: [`GpuSample`] lives in `node-ledger`).
pub trait SampleMetrics {
    /// The values the health machine judges.
    fn metrics(&self) -> Metrics;
}

impl SampleMetrics for GpuSample {
    fn metrics(&self) -> Metrics {
        let pct = |a: f64, b: f64| if b > 0.0 { a * 100.0 / b } else { 0.0 };
        Metrics {
            gpu_util: self.gpu_util,
            sm_activity: self.sm_activity,
            sm_clock_pct: if self.sm_clock_max_mhz == 0 {
                100.0
            } else {
                pct(self.load_clock_mhz() as f64, self.sm_clock_max_mhz as f64)
            },
            mem_used_pct: pct(self.mem_used as f64, self.mem_total as f64),
            sm_spatial: self.sm_source == Some(SmSource::Gpm),
            // Who is on the GPU is the monitor's to find out (see `Monitor::tick`).
            ..Metrics::default()
        }
    }
}

/// A process's GPU memory as the driver sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcMem {
    /// Process id (as NVML reports it).
    pub pid: u32,
    /// Device memory used, bytes.
    pub used_bytes: u64,
}

/// A source of GPU samples; NVML in production, scripted in unit tests.
pub trait GpuSource {
    /// Takes a sample at monotonic time `now_ms`; an error means the device could not be read.
    fn sample(&mut self, now_ms: u64) -> Result<GpuSample, String>;
    /// Device memory per process, as the driver sees it.
    fn processes(&mut self) -> Result<Vec<ProcMem>, String>;
    /// Critical XID codes seen since the last call (non-blocking).
    fn xids(&mut self) -> Vec<u64>;
    /// Takes the paces of the queries not made at every sample (`nvml` in the config, on
    /// start and reload); a source with no such queries ignores it.
    fn set_pace(&mut self, _pace: &NvmlPaceConfig) {}
}

/// Two GPM sample buffers, swapped each reading.
struct Gpm {
    lib: sys::NvmlLib,
    prev: sys::nvmlGpmSample_t,
    cur: sys::nvmlGpmSample_t,
    primed: bool,
    /// When `prev` was taken (monotonic ms).
    prev_ms: u64,
    /// No GPM reading before this (monotonic ms): see [`NvmlPaceConfig::gpm_every_ms`].
    next_ms: u64,
    /// Whether a GPM reading has given SM utilization yet.
    has_value: bool,
    /// The metrics request (8 KiB: room for every metric NVML knows), zeroed once and reused
    /// at every sample rather than zeroed again each time.
    req: Box<sys::nvmlGpmMetricsGet_t>,
}

// SAFETY: the GPM buffers are plain NVML allocations owned by this struct and only used from
// the thread that owns the sampler.
unsafe impl Send for Gpm {}

impl Drop for Gpm {
    fn drop(&mut self) {
        // SAFETY: both handles came from nvmlGpmSampleAlloc and are freed exactly once here.
        unsafe {
            self.lib.nvmlGpmSampleFree(self.prev);
            self.lib.nvmlGpmSampleFree(self.cur);
        }
    }
}

impl Gpm {
    /// Opens GPM on `dev` if NVML and the device support it.
    fn open(dev: &Device<'static>) -> Option<Gpm> {
        // SAFETY: loading NVML again only bumps the loader's refcount; the symbols are the
        // published NVML ABI described by nvml-wrapper-sys.
        let lib = unsafe { sys::NvmlLib::new("libnvidia-ml.so.1") }.ok()?;
        // SAFETY: `handle()` is a live device handle for the leaked `Nvml`, valid for 'static.
        let handle = unsafe { dev.handle() };
        let mut sup = sys::nvmlGpmSupport_t {
            version: sys::NVML_GPM_SUPPORT_VERSION,
            isSupportedDevice: 0,
        };
        // SAFETY: `sup` is a properly versioned out-struct; missing symbols are caught by libloading.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
            lib.nvmlGpmQueryDeviceSupport(handle, &mut sup)
        }));
        if r.ok()? != sys::nvmlReturn_enum_NVML_SUCCESS || sup.isSupportedDevice == 0 {
            return None;
        }
        let mut prev = std::ptr::null_mut();
        let mut cur = std::ptr::null_mut();
        // SAFETY: out-pointers to local handles; freed in Drop.
        unsafe {
            if lib.nvmlGpmSampleAlloc(&mut prev) != sys::nvmlReturn_enum_NVML_SUCCESS {
                return None;
            }
            if lib.nvmlGpmSampleAlloc(&mut cur) != sys::nvmlReturn_enum_NVML_SUCCESS {
                lib.nvmlGpmSampleFree(prev);
                return None;
            }
        }
        Some(Gpm {
            lib,
            prev,
            cur,
            primed: false,
            prev_ms: 0,
            next_ms: 0,
            has_value: false,
            // SAFETY: zeroed is a valid bit pattern for this plain C struct (null pointers, zeros).
            req: Box::new(unsafe { std::mem::zeroed() }),
        })
    }

    /// SM utilization in % since the last snapshot that brought new counters, when this
    /// reading brings some: [`GpmRead::New`]. The driver refreshes the counters a GPM sample
    /// copies only every second or so (seen on an H200, driver 580: at 10 ms sampling, 1 read
    /// in about 100 gave 99.8 % under full load, the rest 0), so a reading whose metrics are
    /// all zero within [`GPM_SAME_SNAPSHOT_MS`] of the last new one is taken as the same
    /// snapshot again ([`GpmRead::Same`]): the older sample is kept, and the next change is
    /// measured over the whole span since it. Zeros that last longer are an idle GPU.
    fn read(&mut self, handle: sys::nvmlDevice_t, now_ms: u64) -> Result<GpmRead, String> {
        // SAFETY: `cur` is an allocated GPM sample and `handle` a live device.
        let r = unsafe { self.lib.nvmlGpmSampleGet(handle, self.cur) };
        if r != sys::nvmlReturn_enum_NVML_SUCCESS {
            return Err(format!("nvmlGpmSampleGet returned {r}"));
        }
        if !self.primed {
            self.primed = true;
            std::mem::swap(&mut self.prev, &mut self.cur);
            self.prev_ms = now_ms;
            return Ok(GpmRead::Priming);
        }
        let (sm, gfx) = self.metrics()?;
        if same_snapshot(sm, gfx, now_ms.saturating_sub(self.prev_ms)) {
            return Ok(GpmRead::Same);
        }
        std::mem::swap(&mut self.prev, &mut self.cur);
        self.prev_ms = now_ms;
        Ok(GpmRead::New(sm))
    }

    /// (SM, graphics) utilization in % between the samples `prev` (older) and `cur`.
    fn metrics(&mut self) -> Result<(f64, f64), String> {
        // Every field NVML reads is set here; it writes only `metrics[..numMetrics]`.
        let g = &mut *self.req;
        g.version = sys::NVML_GPM_METRICS_GET_VERSION;
        g.numMetrics = 2;
        g.sample1 = self.prev; // older
        g.sample2 = self.cur; // newer
        g.metrics[0].metricId = sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL;
        g.metrics[1].metricId = sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL;
        for m in &mut g.metrics[..2] {
            m.nvmlReturn = sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN;
            m.value = 0.0;
        }
        // SAFETY: `g` is versioned and points at two samples taken from this device.
        let r = unsafe { self.lib.nvmlGpmMetricsGet(g) };
        let ok = |m: &sys::nvmlGpmMetric_t| m.nvmlReturn == sys::nvmlReturn_enum_NVML_SUCCESS;
        if r != sys::nvmlReturn_enum_NVML_SUCCESS || !ok(&g.metrics[0]) || !ok(&g.metrics[1]) {
            return Err(format!(
                "nvmlGpmMetricsGet returned {r}/{}/{}",
                g.metrics[0].nvmlReturn, g.metrics[1].nvmlReturn
            ));
        }
        Ok((g.metrics[0].value, g.metrics[1].value))
    }
}

/// What one GPM reading brought.
enum GpmRead {
    /// The first sample: nothing to compare it with yet.
    Priming,
    /// The driver's counters have not changed since the last new snapshot.
    Same,
    /// SM utilization, %, over the span since the last new snapshot.
    New(f64),
}

/// Whether GPM metrics `(sm, gfx)` over a span of `since_new_ms` since the last new snapshot
/// are that snapshot read again (all zero, sooner than [`GPM_SAME_SNAPSHOT_MS`]).
fn same_snapshot(sm: f64, gfx: f64, since_new_ms: u64) -> bool {
    sm == 0.0 && gfx == 0.0 && since_new_ms < GPM_SAME_SNAPSHOT_MS
}

/// SM activity on a GPU with GPM: the held GPM reading once one has come (`has_value`), else
/// the utilization rate `util_rate` (the busy fraction, never below the spatial figure),
/// reported as what it is, a busy-time reading. Reported as GPM it would be judged as spatial:
/// beside offline work, as the online workload's share of the SMs the offline cap leaves, and
/// a busy fraction of 100 % there reads as an online workload on every SM. A monitor
/// (re)started on a GPU where offline work runs beside an online service would then evict the
/// offline work in its first second, before GPM's first snapshot.
fn gpm_or_busy(has_value: bool, last_gpm: f64, util_rate: f64) -> (f64, SmSource) {
    if has_value {
        (last_gpm, SmSource::Gpm)
    } else {
        (util_rate, SmSource::UtilRates)
    }
}

/// A reading refreshed at most every `every_ms`, the last one served in between: the queries
/// a sample carries that change slowly or cost much (spaced 10 ms apart, as the monitor makes
/// them, an NVML query finds cold caches: 30-40 us for memory info on an H200).
/// With a key `K`, the reading holds only for the key it was taken at (a reading asked again
/// at once when the key moves: see [`Paced::get_for`]).
#[derive(Debug, Default)]
struct Paced<T, K = ()> {
    last: Option<T>,
    /// No new reading before this (monotonic ms).
    next_ms: u64,
    /// What the last reading was taken at.
    key: K,
}

impl<T: Copy, K: PartialEq> Paced<T, K> {
    /// As [`Paced::get`], and read at once when `key` differs from the last reading's.
    fn get_for(
        &mut self,
        key: K,
        now_ms: u64,
        every_ms: u64,
        read: impl FnOnce() -> Result<T, String>,
    ) -> Result<T, String> {
        if self.key != key {
            self.last = None;
            self.key = key;
        }
        self.get(now_ms, every_ms, read)
    }

    /// The reading at `now_ms`: `read()` when none is held or the last is `every_ms` old, else
    /// the last. A failed read is returned and arms nothing: the next call reads again.
    fn get(
        &mut self,
        now_ms: u64,
        every_ms: u64,
        read: impl FnOnce() -> Result<T, String>,
    ) -> Result<T, String> {
        match self.last {
            Some(v) if now_ms < self.next_ms => Ok(v),
            _ => {
                let v = read()?;
                self.last = Some(v);
                self.next_ms = now_ms.saturating_add(every_ms);
                Ok(v)
            }
        }
    }
}

/// All-zero GPM metrics within this long of the last new snapshot are the same snapshot read
/// again, not an idle GPU (longer than the driver's refresh period seen, about 1-1.5 s).
pub const GPM_SAME_SNAPSHOT_MS: u64 = 3000;

/// NVML-backed source for one device.
pub struct NvmlSource {
    dev: Device<'static>,
    gpm: Option<Gpm>,
    last_sample_ts: u64,
    last_sm: f64,
    samples_ok: bool,
    events: Option<nvml_wrapper::EventSet<'static>>,
    /// Max SM clock never changes: read once.
    max_clock: Option<u32>,
    /// Device memory (used, total), read every [`NvmlPaceConfig::memory_every_ms`].
    mem: Paced<(u64, u64)>,
    /// Whether the low SM clock is an idle GPU's, for the clock it was asked at: asked again
    /// when the clock moves, else every [`NvmlPaceConfig::clock_reasons_every_ms`].
    clock_idle: Paced<bool, u32>,
    /// Power and temperature are shown, not judged: refreshed every
    /// [`NvmlPaceConfig::power_temp_every_ms`].
    aux: Paced<(Option<u32>, Option<u32>)>,
    /// Paces of the queries not made at every sample.
    pace: NvmlPaceConfig,
}

fn e(what: &str, err: NvmlError) -> String {
    format!("{what}: {err}")
}

impl NvmlSource {
    /// Initializes NVML and opens GPU `index`, to be read at `pace`; NVML lives for the rest
    /// of the process once the device opens. When it does not, NVML is shut down again, so a
    /// caller retrying (the daemon, every second) holds nothing across tries and each try
    /// enumerates the GPUs afresh (`nvmlInit` is reference-counted: only the first of several
    /// live ones enumerates).
    pub fn open(index: u32, pace: &NvmlPaceConfig) -> Result<NvmlSource, String> {
        let nvml = Nvml::init().map_err(|x| e("nvmlInit", x))?;
        if let Err(x) = nvml.device_by_index(index) {
            let seen = match nvml.device_count() {
                Ok(0) => " (NVML sees no GPU)".to_string(),
                Ok(n) => format!(" (NVML sees {n} GPU{}: indices 0 to {})", if n == 1 { "" } else { "s" }, n - 1),
                Err(_) => String::new(),
            };
            return Err(format!("{}{seen}", e(&format!("device {index}"), x)));
        }
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let dev = nvml
            .device_by_index(index)
            .map_err(|x| e(&format!("device {index}"), x))?;
        let gpm = Gpm::open(&dev);
        let events = nvml.create_event_set().ok().and_then(|set| {
            dev.register_events(
                nvml_wrapper::bitmasks::event::EventTypes::CRITICAL_XID_ERROR,
                set,
            )
            .ok()
        });
        tracing::info!(
            gpu = index,
            gpm = gpm.is_some(),
            xid_events = events.is_some(),
            "NVML device opened"
        );
        Ok(NvmlSource {
            dev,
            gpm,
            last_sample_ts: 0,
            last_sm: 0.0,
            samples_ok: true,
            events,
            max_clock: None,
            mem: Paced::default(),
            clock_idle: Paced::default(),
            aux: Paced::default(),
            pace: pace.clone(),
        })
    }

    /// GPU utilization via `nvmlDeviceGetUtilizationRates`, %.
    pub fn util_rate(&self) -> Result<f64, String> {
        Ok(self
            .dev
            .utilization_rates()
            .map_err(|x| e("utilization", x))?
            .gpu as f64)
    }

    /// (GPU utilization, SM activity, its source). GPU utilization is NVML's utilization rate
    /// at every sample. With GPM, SM activity is its SM utilization, read at most every
    /// [`NvmlPaceConfig::gpm_every_ms`] and held between new snapshots (until the first one:
    /// the utilization rate, see [`gpm_or_busy`]); otherwise from utilization samples.
    fn util_and_sm(&mut self, now_ms: u64) -> Result<(f64, f64, SmSource), String> {
        let u = self.util_rate()?;
        if let Some(g) = &mut self.gpm {
            if now_ms >= g.next_ms {
                g.next_ms = now_ms.saturating_add(self.pace.gpm_every_ms);
                // SAFETY: live handle of the leaked Nvml.
                let h = unsafe { self.dev.handle() };
                match g.read(h, now_ms) {
                    Ok(GpmRead::New(sm)) => {
                        g.has_value = true;
                        self.last_sm = sm;
                    }
                    Ok(GpmRead::Same | GpmRead::Priming) => {}
                    Err(err) => {
                        tracing::warn!(error = %err, "GPM read failed; falling back to utilization samples");
                        self.gpm = None;
                    }
                }
            }
            if let Some(g) = &self.gpm {
                let (sm, src) = gpm_or_busy(g.has_value, self.last_sm, u);
                return Ok((u, sm, src));
            }
        }
        let (sm, src) = self.sampled_sm(u);
        Ok((u, sm, src))
    }

    /// SM activity from utilization samples, else the utilization rate itself.
    fn sampled_sm(&mut self, util_rate: f64) -> (f64, SmSource) {
        if self.samples_ok {
            match self
                .dev
                .samples(Sampling::GpuUtilization, self.last_sample_ts)
            {
                Ok(v) if !v.is_empty() => {
                    let mut sum = 0.0;
                    for s in &v {
                        self.last_sample_ts = self.last_sample_ts.max(s.timestamp);
                        sum += match s.value {
                            SampleValue::F64(x) => x,
                            SampleValue::U32(x) => x as f64,
                            SampleValue::U64(x) => x as f64,
                            SampleValue::I64(x) => x as f64,
                        };
                    }
                    self.last_sm = sum / v.len() as f64;
                    return (self.last_sm, SmSource::UtilSamples);
                }
                // No new samples since the last read: the last average still holds.
                Ok(_) => return (self.last_sm, SmSource::UtilSamples),
                Err(NvmlError::NotFound) => return (self.last_sm, SmSource::UtilSamples),
                Err(err) => {
                    tracing::warn!(error = %err, "utilization samples unavailable; using utilization rates");
                    self.samples_ok = false;
                }
            }
        }
        (util_rate, SmSource::UtilRates)
    }
}

/// The NVML queries a sample is made of, one each: what [`GpuSource::sample`] calls, and what
/// `sysmonitor nvml-cost` times ([`crate::nvmlcost`]), so both measure the same calls.
impl NvmlSource {
    /// Whether the critical-XID event set could be registered on this GPU.
    pub fn has_xid_events(&self) -> bool {
        self.events.is_some()
    }

    /// Whether SM activity comes from GPM on this GPU.
    pub fn has_gpm(&self) -> bool {
        self.gpm.is_some()
    }

    /// `nvmlGpmSampleGet` into the sampler's newer buffer.
    pub fn probe_gpm_sample(&mut self) -> Result<(), String> {
        // SAFETY: live handle of the leaked Nvml.
        let h = unsafe { self.dev.handle() };
        let g = self.gpm.as_mut().ok_or("no GPM on this GPU")?;
        // SAFETY: `cur` is an allocated GPM sample and `h` a live device.
        match unsafe { g.lib.nvmlGpmSampleGet(h, g.cur) } {
            sys::nvmlReturn_enum_NVML_SUCCESS => Ok(()),
            r => Err(format!("nvmlGpmSampleGet returned {r}")),
        }
    }

    /// `nvmlGpmMetricsGet` of SM and graphics utilization between the two buffers (both filled
    /// first).
    pub fn probe_gpm_metrics(&mut self) -> Result<(), String> {
        if !self.gpm.as_ref().ok_or("no GPM on this GPU")?.primed {
            self.probe_gpm_sample()?;
            let g = self.gpm.as_mut().ok_or("no GPM on this GPU")?;
            std::mem::swap(&mut g.prev, &mut g.cur);
            g.primed = true;
            self.probe_gpm_sample()?;
        }
        self.gpm
            .as_mut()
            .ok_or("no GPM on this GPU")?
            .metrics()
            .map(drop)
    }

    /// `nvmlDeviceGetSamples(GPU_UTILIZATION)` since the last read, as the sampler reads them
    /// before Hopper.
    pub fn probe_util_samples(&mut self) -> Result<(), String> {
        self.sampled_sm(0.0);
        Ok(())
    }

    /// `nvmlDeviceGetMemoryInfo`: (used, total) bytes.
    pub fn memory(&self) -> Result<(u64, u64), String> {
        memory_of(&self.dev)
    }

    /// `nvmlDeviceGetClockInfo(SM)`, MHz.
    pub fn sm_clock(&self) -> Result<u32, String> {
        self.dev.clock_info(Clock::SM).map_err(|x| e("SM clock", x))
    }

    /// `nvmlDeviceGetCurrentClocksThrottleReasons`.
    pub fn clock_reasons(&self) -> Result<ThrottleReasons, String> {
        clock_reasons_of(&self.dev)
    }

    /// `nvmlDeviceGetPowerUsage`, milliwatts.
    pub fn power(&self) -> Result<u32, String> {
        power_of(&self.dev)
    }

    /// `nvmlDeviceGetTemperature(GPU)`, degrees Celsius.
    pub fn temperature(&self) -> Result<u32, String> {
        temperature_of(&self.dev)
    }
}

// The paced queries as functions of the device alone, so that a sample can refresh a
// `Paced` field of the source while the query borrows only its device.

fn memory_of(dev: &Device<'static>) -> Result<(u64, u64), String> {
    let m = dev.memory_info().map_err(|x| e("memory info", x))?;
    Ok((m.used, m.total))
}

fn clock_reasons_of(dev: &Device<'static>) -> Result<ThrottleReasons, String> {
    dev.current_throttle_reasons()
        .map_err(|x| e("clock reasons", x))
}

fn power_of(dev: &Device<'static>) -> Result<u32, String> {
    dev.power_usage().map_err(|x| e("power", x))
}

fn temperature_of(dev: &Device<'static>) -> Result<u32, String> {
    dev.temperature(TemperatureSensor::Gpu)
        .map_err(|x| e("temperature", x))
}

/// Whether the driver's throttle reasons say the clock is low for idleness alone (no power cap
/// or thermal/hardware slowdown beside it).
fn idle_only(r: ThrottleReasons) -> bool {
    r.contains(ThrottleReasons::GPU_IDLE)
        && !r.intersects(
            ThrottleReasons::SW_POWER_CAP
                | ThrottleReasons::HW_SLOWDOWN
                | ThrottleReasons::SW_THERMAL_SLOWDOWN
                | ThrottleReasons::HW_THERMAL_SLOWDOWN
                | ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
        )
}

impl GpuSource for NvmlSource {
    fn sample(&mut self, now_ms: u64) -> Result<GpuSample, String> {
        let (util, sm, src) = self.util_and_sm(now_ms)?;
        let dev = &self.dev;
        let (mem_used, mem_total) =
            self.mem.get(now_ms, self.pace.memory_every_ms, || memory_of(dev))?;
        let clk = self.sm_clock()?;
        let max = match self.max_clock {
            Some(m) => m,
            None => {
                let m = self
                    .dev
                    .max_clock_info(Clock::SM)
                    .map_err(|x| e("max SM clock", x))?;
                self.max_clock = Some(m);
                m
            }
        };
        // Below the top clock, ask the driver why (one more query, only then): idleness alone
        // is no sign of load. Unanswered, the low clock counts (the stricter reading). The
        // answer holds while the clock stays where it was asked (a GPU leaving idleness moves
        // its clock), for at most `clock_reasons_every_ms`.
        let dev = &self.dev;
        let clock_idle = clk < max
            && self
                .clock_idle
                .get_for(clk, now_ms, self.pace.clock_reasons_every_ms, || {
                    Ok(clock_reasons_of(dev).is_ok_and(idle_only))
                })
                .unwrap_or(false);
        let (power_mw, temp_c) = self
            .aux
            .get(now_ms, self.pace.power_temp_every_ms, || {
                Ok((power_of(dev).ok(), temperature_of(dev).ok()))
            })
            .unwrap_or_default();
        Ok(GpuSample {
            t_ms: now_ms,
            gpu_util: util,
            sm_activity: sm,
            sm_source: Some(src),
            sm_clock_mhz: clk,
            sm_clock_max_mhz: max,
            clock_idle,
            mem_used,
            mem_total,
            power_mw,
            temp_c,
        })
    }

    fn processes(&mut self) -> Result<Vec<ProcMem>, String> {
        let v = self
            .dev
            .running_compute_processes()
            .map_err(|x| e("running compute processes", x))?;
        Ok(v.into_iter()
            .map(|p| ProcMem {
                pid: p.pid,
                used_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => b,
                    UsedGpuMemory::Unavailable => 0,
                },
            })
            .collect())
    }

    fn set_pace(&mut self, pace: &NvmlPaceConfig) {
        self.pace = pace.clone();
    }

    fn xids(&mut self) -> Vec<u64> {
        let mut out = Vec::new();
        if let Some(set) = &self.events {
            while let Ok(ev) = set.wait(0) {
                if let Some(nvml_wrapper::enums::event::XidError::Value(v)) = ev.event_data {
                    out.push(v);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paced_reading_is_taken_once_per_period_and_a_failure_arms_nothing() {
        let mut p = Paced::<u64>::default();
        let reads = std::cell::Cell::new(0);
        let at = |p: &mut Paced<u64>, now: u64, ok: bool| {
            p.get(now, 50, || {
                reads.set(reads.get() + 1);
                if ok {
                    Ok(now)
                } else {
                    Err("gone".into())
                }
            })
        };
        assert_eq!(at(&mut p, 0, true), Ok(0), "the first sample reads");
        assert_eq!(at(&mut p, 10, true), Ok(0), "served from the last reading");
        assert_eq!(at(&mut p, 49, true), Ok(0));
        assert_eq!(at(&mut p, 50, false), Err("gone".to_string()), "due: read, and failed");
        assert_eq!(at(&mut p, 60, true), Ok(60), "a failure arms nothing: read again");
        assert_eq!(at(&mut p, 100, true), Ok(60));
        assert_eq!(reads.get(), 3);
    }

    /// The clock-throttle reasons: an idle GPU's low, still clock is asked about once per
    /// period; a clock that moves (a GPU leaving idleness) is asked about at once.
    #[test]
    fn a_keyed_reading_is_taken_again_at_once_when_its_key_moves() {
        let mut p = Paced::<bool, u32>::default();
        let reads = std::cell::Cell::new(0);
        let mut at = |clk: u32, now: u64, idle: bool| {
            p.get_for(clk, now, 100, || {
                reads.set(reads.get() + 1);
                Ok(idle)
            })
        };
        assert_eq!(at(345, 0, true), Ok(true));
        assert_eq!(at(345, 10, false), Ok(true), "same clock: the idle answer holds");
        assert_eq!(at(345, 90, false), Ok(true));
        assert_eq!(reads.get(), 1);
        assert_eq!(at(1200, 95, false), Ok(false), "the clock moved: asked at once");
        assert_eq!(at(345, 96, true), Ok(true), "and moved back: asked again");
        assert_eq!(at(345, 196, false), Ok(false), "a period later: asked again");
        assert_eq!(reads.get(), 4);
    }

    #[test]
    fn unchanged_gpm_counters_are_not_an_idle_gpu_until_they_stay_unchanged() {
        // H200, driver 580, 10 ms sampling under full load: 99.8 % about once a second, 0
        // in between. Those zeros are the same snapshot; zeros for longer are idleness.
        assert!(same_snapshot(0.0, 0.0, 10));
        assert!(same_snapshot(0.0, 0.0, GPM_SAME_SNAPSHOT_MS - 1));
        assert!(!same_snapshot(0.0, 0.0, GPM_SAME_SNAPSHOT_MS));
        assert!(!same_snapshot(99.8, 99.7, 10));
        assert!(!same_snapshot(0.0, 0.4, 10), "any change is a new snapshot");
    }

    /// Before GPM's first snapshot the utilization rate stands in, as a busy-time reading: a
    /// monitor restarted beside co-located offline work must not judge a full busy fraction
    /// as an online workload on every SM.
    #[test]
    fn before_the_first_gpm_snapshot_sm_activity_is_a_busy_time_reading() {
        let (sm, src) = gpm_or_busy(false, 0.0, 100.0);
        assert_eq!((sm, src), (100.0, SmSource::UtilRates));
        let s = GpuSample {
            sm_activity: sm,
            sm_source: Some(src),
            ..Default::default()
        };
        assert!(!s.metrics().sm_spatial, "judged as busy time, at most Unhealthy beside offline work");
        assert_eq!(gpm_or_busy(true, 42.0, 100.0), (42.0, SmSource::Gpm));
    }

    #[test]
    fn an_idle_lowered_clock_reads_as_full_clock_to_the_health_machine() {
        let s = GpuSample {
            sm_clock_mhz: 345,
            sm_clock_max_mhz: 1980,
            ..Default::default()
        };
        assert!(
            (s.metrics().sm_clock_pct - 17.42).abs() < 0.01,
            "a low clock under load counts"
        );
        let idle = GpuSample {
            clock_idle: true,
            ..s
        };
        assert_eq!(idle.metrics().sm_clock_pct, 100.0);
    }
}
