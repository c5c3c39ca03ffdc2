//! The process's shim state, built once on the first driver call: config, quota (ledger-backed
//! when possible), throttle, context registry; plus the controller thread that feeds the
//! throttle from the ledger, heartbeats and reclaims dead neighbours.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use node_ledger::{ledger::group_id_for, Ledger};

use crate::config::Config;
use crate::exit::Contexts;
use crate::quota::Quota;
use crate::throttle::{Pid, Sample, Throttle};

/// Everything the hooks use.
pub struct State {
    pub quota: Quota,
    pub throttle: Throttle,
    pub contexts: Contexts,
    /// Device memory of ordinal 0 as the driver reports it (0 if unknown).
    pub device_total: u64,
}

static CONFIG: OnceLock<Config> = OnceLock::new();
static STATE: OnceLock<State> = OnceLock::new();
static CONTROLLER_ALIVE: AtomicBool = AtomicBool::new(false);

static DISPATCH: OnceLock<tracing::Dispatch> = OnceLock::new();

/// The config, loaded (file + env) and logged once.
pub fn config() -> &'static Config {
    CONFIG.get_or_init(|| {
        let (cfg, errs) = Config::load(&|k| std::env::var(k).ok());
        let _ = DISPATCH.set(our_dispatch(&cfg.log));
        if let Some(d) = DISPATCH.get() {
            tracing::dispatcher::with_default(d, || {
                for e in errs {
                    tracing::error!("xcuda: config error: {e} (keeping safe defaults)");
                }
            });
        }
        cfg
    })
}

/// Our own subscriber (stderr, level from config). It is never installed as the process's
/// global default: the host application keeps its own logging.
fn our_dispatch(level: &str) -> tracing::Dispatch {
    use tracing_subscriber::filter::LevelFilter;
    let lvl = level.parse::<LevelFilter>().unwrap_or(LevelFilter::WARN);
    tracing::Dispatch::new(
        tracing_subscriber::fmt().with_writer(std::io::stderr).with_max_level(lvl).with_target(false).finish(),
    )
}

fn dispatch() -> &'static tracing::Dispatch {
    if let Some(d) = DISPATCH.get() {
        return d;
    }
    config();
    DISPATCH.get_or_init(|| our_dispatch("warn"))
}

/// Runs `f` with the shim's logger (on application threads; never on a hot path).
pub fn logged<R>(f: impl FnOnce() -> R) -> R {
    tracing::dispatcher::with_default(dispatch(), f)
}

/// Makes the shim's logger the default of the calling (shim-owned) thread.
pub fn log_on_this_thread() -> tracing::dispatcher::DefaultGuard {
    tracing::dispatcher::set_default(dispatch())
}

/// The state, if already built (async-signal-safe: one atomic load).
#[inline]
pub fn get() -> Option<&'static State> {
    STATE.get()
}

/// The state, built on first use.
#[inline]
pub fn state() -> &'static State {
    STATE.get_or_init(|| logged(build))
}

macro_rules! call_real {
    ($sym:ident : $pfn:ty, $($arg:expr),*) => {{
        let p = $crate::real::driver($crate::interpose::Sym::$sym);
        if p.is_null() {
            cuda_abi::CUresult::CUDA_ERROR_NOT_FOUND
        } else {
            // SAFETY: p is the real driver's implementation of this symbol, whose C type is
            // $pfn per cuda-abi's table; the arguments are valid for it.
            unsafe { std::mem::transmute::<*mut std::ffi::c_void, $pfn>(p)($($arg),*) }
        }
    }};
}
pub(crate) use call_real;

fn device_facts() -> (u64, u32) {
    use cuda_abi::*;
    let _ = call_real!(cuInit: PFN_cuInit_v2000, 0);
    let mut dev: CUdevice = 0;
    if call_real!(cuDeviceGet: PFN_cuDeviceGet_v2000, &mut dev, 0) != CUresult::CUDA_SUCCESS {
        return (0, 1);
    }
    let mut total: usize = 0;
    let total = match call_real!(cuDeviceTotalMem_v2: PFN_cuDeviceTotalMem_v3020, &mut total, dev) {
        CUresult::CUDA_SUCCESS => total as u64,
        _ => 0,
    };
    let mut sms: c_int = 0;
    let attr = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
    let sms = match call_real!(cuDeviceGetAttribute: PFN_cuDeviceGetAttribute_v2000, &mut sms, attr, dev) {
        CUresult::CUDA_SUCCESS if sms > 0 => sms as u32,
        _ => 1,
    };
    (total, sms)
}

fn build() -> State {
    let cfg = config();
    let (total, sms) = device_facts();
    let limit = match cfg.memory.quota_bytes {
        Some(b) => b,
        None => (total as f64 * cfg.memory.quota_fraction) as u64,
    };
    if total == 0 && cfg.memory.quota_bytes.is_none() {
        tracing::error!("xcuda: device memory unknown and no quota_bytes configured: quota is 0");
    }
    let quota = match open_ledger(cfg, limit) {
        Ok(q) => q,
        // Fail closed: without the shared ledger this process cannot see its group's usage, so
        // it gets no device memory at all (never a per-process copy of the group quota).
        Err(e) => {
            tracing::error!("xcuda: cannot use the ledger ({e}); refusing every device allocation (fail closed)");
            Quota::local(0)
        }
    };
    tracing::info!(quota_bytes = quota.limit(), device_bytes = total, sms, group = %cfg.group, "xcuda active");
    let st = State {
        quota,
        throttle: Throttle::new(&cfg.throttle, sms),
        contexts: Contexts::new(),
        device_total: total,
    };
    crate::exit::install_process_hooks(cfg);
    start_controller_when_ready();
    st
}

/// Called while the state is being built: the thread waits for it to be published.
fn start_controller_when_ready() {
    if CONTROLLER_ALIVE.swap(true, AcqRel) {
        return;
    }
    let spawned = std::thread::Builder::new().name("xcuda-ctl".into()).spawn(|| {
        let _log = log_on_this_thread();
        let st = loop {
            if let Some(st) = get() {
                break st;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        controller(st, config());
    });
    if let Err(e) = spawned {
        CONTROLLER_ALIVE.store(false, Release);
        tracing::error!("xcuda: cannot start controller thread: {e}; waiters refill at the fallback rate");
    }
}

fn open_ledger(cfg: &Config, limit: u64) -> Result<Quota, String> {
    let path = cfg.ledger().ledger_path();
    let ledger = Ledger::open_or_create(&path, cfg.gpu_index).map_err(|e| e.to_string())?;
    let group = ledger.group(group_id_for(&cfg.group), limit).map_err(|e| e.to_string())?;
    let have = ledger.group_quota(group);
    if have != limit {
        tracing::info!(group = %cfg.group, have, configured = limit, "group quota set by its first process kept");
    }
    let h = ledger.register(std::process::id(), group).map_err(|e| e.to_string())?;
    Ok(Quota::with_ledger(ledger, h))
}

/// Whether the controller thread is running (waiters refill themselves when it is not).
pub fn controller_alive() -> bool {
    CONTROLLER_ALIVE.load(Acquire)
}

/// Starts the controller thread if it is not running (first launch wait, after fork).
pub fn ensure_controller() {
    let Some(st) = get() else { return };
    if CONTROLLER_ALIVE.swap(true, AcqRel) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("xcuda-ctl".into())
        .spawn(move || {
            let _log = log_on_this_thread();
            controller(st, config())
        });
    if let Err(e) = spawned {
        CONTROLLER_ALIVE.store(false, Release);
        tracing::error!("xcuda: cannot start controller thread: {e}; waiters refill at the fallback rate");
    }
}

/// Marks the controller as gone (fork child: threads do not survive fork).
pub fn controller_lost() {
    CONTROLLER_ALIVE.store(false, Release);
}

fn controller(st: &'static State, cfg: &'static Config) {
    let tc = &cfg.throttle;
    let period = Duration::from_millis(tc.period_ms);
    let stale_ns = tc.stale_after_ms * 1_000_000;
    let mut pid = Pid::new(tc);
    let mut last = Instant::now();
    let mut last_house = Instant::now();
    let mut last_stale = None;
    let start_epoch = st.quota.ledger().map(|(l, _)| l.evict_all_epoch());
    let mut reported = (0u64, 0u64);
    while CONTROLLER_ALIVE.load(Acquire) {
        std::thread::sleep(period);
        let now = Instant::now();
        let dt = now.duration_since(last).as_secs_f64();
        last = now;
        let sample = st.quota.ledger().and_then(|(l, _)| {
            let s = l.read_monitor()?;
            s.is_fresh(node_ledger::clock::now_ns(), stale_ns).then(|| Sample {
                u_sm: f64::from(s.sample.sm_active_permille) / 1000.0,
                c_sm: f64::from(s.sample.sm_clock_mhz),
                c_h: f64::from(s.sample.sm_clock_max_mhz),
            })
        });
        let d = st.throttle.control(&mut pid, sample, dt);
        st.throttle.refill(dt);
        if last_stale != Some(d.stale) {
            tracing::info!(stale = d.stale, rate = d.rate, "xcuda throttle input changed");
            last_stale = Some(d.stale);
        }
        if now.duration_since(last_house) >= Duration::from_millis(250) {
            last_house = now;
            housekeeping(st, start_epoch, &mut reported);
        }
    }
}

fn housekeeping(st: &State, start_epoch: Option<u64>, reported: &mut (u64, u64)) {
    let Some((l, Some(h))) = st.quota.ledger() else { return };
    l.heartbeat(h);
    let (n, d) = (st.throttle.launches.load(Relaxed), st.throttle.delayed.load(Relaxed));
    l.count_launches(h, n - reported.0, d - reported.1);
    *reported = (n, d);
    if let Ok(v) = l.reclaim_dead() {
        for (pid, bytes) in v {
            tracing::info!(pid, bytes, "xcuda: reclaimed quota of a dead process");
        }
    }
    let sig = l.evict_signal(h);
    let evict_all = start_epoch.is_some_and(|e| l.evict_all_epoch() != e);
    if sig != 0 || evict_all {
        let sig = if sig != 0 { sig as c_int } else { libc::SIGTERM };
        tracing::warn!(sig, "xcuda: monitor asked this process to leave");
        // SAFETY: raising a signal at ourselves; the graceful-exit path handles it.
        unsafe { libc::kill(libc::getpid(), sig) };
        CONTROLLER_ALIVE.store(false, Release);
    }
}


#[cfg(test)]
mod tests {
    #[test]
    fn logging_never_installs_a_global_subscriber() {
        super::logged(|| tracing::warn!("xcuda test line"));
        drop(super::log_on_this_thread());
        // An application initialising its own logging afterwards must still be able to.
        assert!(
            tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::default()).is_ok(),
            "the host application's logging is left alone"
        );
    }
}
