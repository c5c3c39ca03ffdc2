//! Cost of the NVML calls sysmonitor makes at every sample (`sysmonitor/src/sampler.rs`), on
//! the fake `libnvidia-ml.so.1`: nanoseconds and system calls per call, for the t4 and a10
//! profiles (utilization rates + utilization samples) and h100 (GPM), each call made 1 ms
//! after the previous one (longer than any reading the library reuses), and whole monitor
//! samples 10 ms apart (sysmonitor's default interval). With `--baseline OTHER.so` the same calls on another build of the library,
//! side by side in the same run, with the ratio.
//!
//! Run: `cargo build --release -p emu-nvml && cargo bench -p emu-nvml --bench calls` (add
//! `-- --baseline /path/to/old/libnvidia_ml.so`, `--lib PATH` for another library than
//! `target/release/libnvidia_ml.so`, `--n 500` calls per row). System calls are counted with
//! a `raw_syscalls:sys_enter` tracepoint counter where the kernel allows one ("n/a" else).

use std::ffi::c_uint;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use emu_device::syscalls::SyscallCounter;
use nvml_wrapper_sys::bindings::*;

/// Pause between two calls: longer than any reuse of a reading inside the library.
const GAP: Duration = Duration::from_millis(1);
/// Pause between two whole monitor samples: sysmonitor's default interval.
const SAMPLE_GAP: Duration = Duration::from_millis(10);

fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

struct Lib {
    nvml: NvmlLib,
    dev: nvmlDevice_t,
    /// Two GPM samples (h100), swapped at every reading as sysmonitor does.
    gpm: (nvmlGpmSample_t, nvmlGpmSample_t),
    req: Box<nvmlGpmMetricsGet_t>,
    last_seen_us: u64,
    buf: Vec<nvmlSample_t>,
    procs: Vec<nvmlProcessInfo_t>,
}

fn ok(what: &str, r: nvmlReturn_t) {
    assert!(
        r == nvmlReturn_enum_NVML_SUCCESS,
        "{what} returned {r}"
    );
}

impl Lib {
    /// Loads `path` and opens GPU 0 of a fresh emulated `profile` host in `dir`.
    fn open(path: &std::path::Path, profile: &str, dir: &std::path::Path) -> Lib {
        std::env::set_var("GPUEMU_STATE", dir.join("gpu.state"));
        std::env::set_var("GPUEMU_PROFILE", profile);
        // SAFETY: loading the fake NVML; its initialisers only set up statics.
        let nvml = unsafe { NvmlLib::new(path) }
            .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()));
        let mut dev = std::ptr::null_mut();
        let mut gpm = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: out-pointers to locals; the library was just loaded.
        unsafe {
            ok("nvmlInit_v2", nvml.nvmlInit_v2());
            ok("handle", nvml.nvmlDeviceGetHandleByIndex_v2(0, &mut dev));
            if profile == "h100" {
                ok("gpm alloc", nvml.nvmlGpmSampleAlloc(&mut gpm.0));
                ok("gpm alloc", nvml.nvmlGpmSampleAlloc(&mut gpm.1));
                ok("gpm get", nvml.nvmlGpmSampleGet(dev, gpm.0));
            }
        }
        Lib {
            nvml,
            dev,
            gpm,
            // SAFETY: all-zero is a valid nvmlGpmMetricsGet_t (null pointers, zeros).
            req: Box::new(unsafe { std::mem::zeroed() }),
            last_seen_us: 0,
            // SAFETY: as above, plain C structs.
            buf: vec![unsafe { std::mem::zeroed() }; 512],
            procs: vec![unsafe { std::mem::zeroed() }; 64],
        }
    }

    // Each call as `nvml-wrapper` makes it for sysmonitor. SAFETY (all below): out-pointers
    // to live locals or owned buffers of the stated length; `dev` and the GPM samples are live.

    fn gpm_sample(&mut self) {
        unsafe { ok("gpm get", self.nvml.nvmlGpmSampleGet(self.dev, self.gpm.1)) };
        std::mem::swap(&mut self.gpm.0, &mut self.gpm.1);
    }

    fn gpm_metrics(&mut self) {
        let g = &mut *self.req;
        g.version = NVML_GPM_METRICS_GET_VERSION;
        g.numMetrics = 2;
        g.sample1 = self.gpm.1;
        g.sample2 = self.gpm.0;
        g.metrics[0].metricId = nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL;
        g.metrics[1].metricId = nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL;
        unsafe { ok("gpm metrics", self.nvml.nvmlGpmMetricsGet(g)) };
    }

    fn util_rates(&mut self) {
        let mut u = nvmlUtilization_t { gpu: 0, memory: 0 };
        unsafe { ok("utilization", self.nvml.nvmlDeviceGetUtilizationRates(self.dev, &mut u)) };
        std::hint::black_box(u);
    }

    fn samples(&mut self) {
        let (mut vt, mut n): (nvmlValueType_t, c_uint) = (0, 0);
        let ty = nvmlSamplingType_enum_NVML_GPU_UTILIZATION_SAMPLES;
        let size = |l: &Lib, n: &mut c_uint, vt: &mut nvmlValueType_t| unsafe {
            l.nvml.nvmlDeviceGetSamples(l.dev, ty, l.last_seen_us, vt, n, std::ptr::null_mut())
        };
        ok("samples (size)", size(self, &mut n, &mut vt));
        // nvml-wrapper allocates the buffer the size query asked for, at every call.
        let mut v: Vec<nvmlSample_t> = vec![unsafe { std::mem::zeroed() }; n as usize];
        let r = unsafe {
            self.nvml
                .nvmlDeviceGetSamples(self.dev, ty, self.last_seen_us, &mut vt, &mut n, v.as_mut_ptr())
        };
        if r == nvmlReturn_enum_NVML_SUCCESS {
            for s in &v[..n as usize] {
                self.last_seen_us = self.last_seen_us.max(s.timeStamp);
            }
        } else {
            assert_eq!(r, nvmlReturn_enum_NVML_ERROR_NOT_FOUND, "samples");
        }
    }

    fn samples_size_query(&mut self) {
        let (mut vt, mut n): (nvmlValueType_t, c_uint) = (0, 0);
        let ty = nvmlSamplingType_enum_NVML_GPU_UTILIZATION_SAMPLES;
        unsafe {
            ok(
                "samples (size)",
                self.nvml.nvmlDeviceGetSamples(self.dev, ty, self.last_seen_us, &mut vt, &mut n, std::ptr::null_mut()),
            )
        };
    }

    fn samples_fill(&mut self) {
        let (mut vt, mut n): (nvmlValueType_t, c_uint) = (0, self.buf.len() as c_uint);
        let ty = nvmlSamplingType_enum_NVML_GPU_UTILIZATION_SAMPLES;
        let r = unsafe {
            self.nvml
                .nvmlDeviceGetSamples(self.dev, ty, self.last_seen_us, &mut vt, &mut n, self.buf.as_mut_ptr())
        };
        if r == nvmlReturn_enum_NVML_SUCCESS {
            for s in &self.buf[..n as usize] {
                self.last_seen_us = self.last_seen_us.max(s.timeStamp);
            }
        }
    }

    fn memory(&mut self) {
        let mut m = nvmlMemory_t { total: 0, free: 0, used: 0 };
        unsafe { ok("memory", self.nvml.nvmlDeviceGetMemoryInfo(self.dev, &mut m)) };
        std::hint::black_box(m);
    }

    fn clock(&mut self) {
        let mut c = 0;
        unsafe { ok("clock", self.nvml.nvmlDeviceGetClockInfo(self.dev, nvmlClockType_enum_NVML_CLOCK_SM, &mut c)) };
        std::hint::black_box(c);
    }

    fn power_temp(&mut self) {
        let (mut p, mut t) = (0, 0);
        unsafe {
            ok("power", self.nvml.nvmlDeviceGetPowerUsage(self.dev, &mut p));
            ok(
                "temperature",
                self.nvml.nvmlDeviceGetTemperature(self.dev, nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU, &mut t),
            );
        }
    }

    fn processes(&mut self) {
        let mut n = 0;
        let r = unsafe {
            self.nvml.nvmlDeviceGetComputeRunningProcesses_v3(self.dev, &mut n, std::ptr::null_mut())
        };
        assert!(r == nvmlReturn_enum_NVML_SUCCESS || r == nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE);
        n = self.procs.len() as c_uint;
        unsafe {
            ok(
                "processes",
                self.nvml.nvmlDeviceGetComputeRunningProcesses_v3(self.dev, &mut n, self.procs.as_mut_ptr()),
            )
        };
    }

    /// One `NvmlSource::sample` (power and temperature are read every tenth: left out).
    fn monitor_sample(&mut self, gpm: bool) {
        if gpm {
            self.gpm_sample();
            self.gpm_metrics();
        } else {
            self.util_rates();
            self.samples();
        }
        self.memory();
        self.clock();
    }
}

type Call = fn(&mut Lib);

fn rows(profile: &str) -> Vec<(&'static str, Call, Duration)> {
    let mut v: Vec<(&'static str, Call, Duration)> = Vec::new();
    if profile == "h100" {
        v.push(("nvmlGpmSampleGet", Lib::gpm_sample, GAP));
        v.push(("nvmlGpmMetricsGet (SM + graphics util)", Lib::gpm_metrics, GAP));
    } else {
        v.push(("nvmlDeviceGetUtilizationRates", Lib::util_rates, GAP));
        v.push(("nvmlDeviceGetSamples, size query", Lib::samples_size_query, GAP));
        v.push(("nvmlDeviceGetSamples, 512-entry buffer", Lib::samples_fill, GAP));
    }
    v.push(("nvmlDeviceGetMemoryInfo", Lib::memory, GAP));
    v.push(("nvmlDeviceGetClockInfo(SM)", Lib::clock, GAP));
    v.push(("power + temperature (every 10th sample)", Lib::power_temp, GAP));
    v.push(("running processes (size + list)", Lib::processes, GAP));
    if profile == "h100" {
        v.push(("= one monitor sample (GPM path), 10 ms apart", |l| l.monitor_sample(true), SAMPLE_GAP));
    } else {
        v.push(("= one monitor sample (samples path), 10 ms apart", |l| l.monitor_sample(false), SAMPLE_GAP));
    }
    v
}

/// (ns per call: min over 3 rounds of the mean, system calls per call).
fn measure(lib: &mut Lib, call: Call, gap: Duration, n: u32, counter: Option<&SyscallCounter>) -> (f64, Option<f64>) {
    let mut best = f64::INFINITY;
    let mut sys = None;
    for _ in 0..3 {
        let before = counter.map(|c| c.get());
        let mut total = Duration::ZERO;
        for _ in 0..n {
            spin(gap);
            let t = Instant::now();
            call(lib);
            total += t.elapsed();
        }
        if let (Some(c), Some(b)) = (counter, before) {
            let d = c.get().saturating_sub(b).saturating_sub(1) as f64 / f64::from(n);
            sys = Some(sys.map_or(d, |s: f64| s.min(d)));
        }
        best = best.min(total.as_nanos() as f64 / f64::from(n));
    }
    (best, sys)
}

fn run_profile(profile: &str, lib: &std::path::Path, baseline: Option<&PathBuf>, n: u32) {
    let tmp = std::env::temp_dir().join(format!("emu-nvml-calls-{}", std::process::id()));
    let (d_this, d_base) = (tmp.join("this"), tmp.join("base"));
    std::fs::create_dir_all(&d_this).unwrap();
    std::fs::create_dir_all(&d_base).unwrap();
    let mut this = Lib::open(lib, profile, &d_this);
    let mut base = baseline.map(|b| Lib::open(b, profile, &d_base));
    let counter = SyscallCounter::open();
    let sys = |s: Option<f64>| s.map_or("n/a".to_string(), |v| format!("{v:.2}"));
    println!("-- profile {profile}: {n} calls per row, {} ms apart (whole samples: {} per row, {} ms apart); ns: best of 3 rounds' means --", GAP.as_millis(), (n / 5).max(1), SAMPLE_GAP.as_millis());
    if base.is_some() {
        println!(
            "  {:<50} {:>10} {:>8}   {:>10} {:>8}   {:>6}",
            "call", "this ns", "sys/call", "base ns", "sys/call", "ratio"
        );
    } else {
        println!("  {:<50} {:>10} {:>8}", "call", "ns", "sys/call");
    }
    for (name, call, gap) in rows(profile) {
        // Whole samples 10 ms apart: fewer of them, as many seconds as the other rows.
        let n = if gap > GAP { (n / 5).max(1) } else { n };
        let (ns, s) = measure(&mut this, call, gap, n, counter.as_ref());
        match &mut base {
            Some(b) => {
                let (bns, bs) = measure(b, call, gap, n, counter.as_ref());
                println!(
                    "  {name:<50} {ns:>10.0} {:>8}   {bns:>10.0} {:>8}   {:>6.2}",
                    sys(s),
                    sys(bs),
                    ns / bns.max(1e-9)
                );
            }
            None => println!("  {name:<50} {ns:>10.0} {:>8}", sys(s)),
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let n: u32 = opt("--n").and_then(|v| v.parse().ok()).unwrap_or(300);
    let lib = opt("--lib").map(PathBuf::from).unwrap_or_else(|| {
        // target/release/deps/calls-HASH -> target/release/libnvidia_ml.so
        let exe = std::env::current_exe().unwrap();
        exe.parent().unwrap().parent().unwrap().join("libnvidia_ml.so")
    });
    assert!(lib.exists(), "{} not built (cargo build --release -p emu-nvml)", lib.display());
    let baseline = opt("--baseline").map(PathBuf::from);
    if let Some(p) = opt("--profile") {
        run_profile(&p, &lib, baseline.as_ref(), n);
        return;
    }
    println!("fake NVML: {}", lib.display());
    if let Some(b) = &baseline {
        println!("baseline:  {}", b.display());
    }
    // One process per profile: the library opens its devices once, at the first init.
    for p in ["t4", "a10", "h100"] {
        let mut a: Vec<String> = args[1..].iter().filter(|a| *a != "--bench").cloned().collect();
        a.extend(["--profile".into(), p.into(), "--lib".into(), lib.display().to_string()]);
        let st = std::process::Command::new(std::env::current_exe().unwrap())
            .args(&a)
            .status()
            .unwrap();
        assert!(st.success(), "profile {p}: {st}");
    }
}
