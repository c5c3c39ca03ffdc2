//! `node-demo`: the node-runtime phase of the demo. On an emulated GPU host it runs
//! sysmonitor + mps-manager, an online client, and an offline client under the shim, then
//! prints one table row per second (health state, online p99 vs alone, offline it/s, SM budget)
//! through an online burst that forces an eviction, and a summary at the end, and draws the
//! same windows as one SVG timeline (`--plot`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use serde_json::Value;
use workloads::host::Host;

const HELP: &str = "\
node-demo: the node runtime on one emulated GPU (h100). Starts sysmonitor and mps-manager,
measures the online client alone, then runs it beside an offline client (LD_PRELOAD=libxcuda.so)
in one-second windows and prints a live table. In the middle an online burst pushes the GPU
to Overlimit: the monitor evicts the offline client (SIGTERM, it checkpoints and exits), the
GPU goes back to Healthy only after the hold, and the demo (acting as the job controller)
restarts the offline client once the GPU admits offline work again.

USAGE: node-demo [--windows N] [--burst-at N] [--scratch DIR] [--plot FILE]
  --windows N    one-second measurement windows beside the offline client   [default: 16]
  --burst-at N   window of the online burst                                 [default: 5]
  --scratch DIR  where the emulated host is laid out                        [default: $TMPDIR]
  --plot FILE    the windows as an SVG timeline: online p99 against alone, offline it/s,
                 the SM budget over the GPU's health state, the eviction and re-admission
                                                            [default: target/demo/node-demo.svg]

Build first: cargo build -p sysmonitor -p mps-manager -p xcuda-shim -p workloads -p emu-cuda \\
             -p emu-nvml -p emu-mps-control && cargo build -p sysmonitor --example node-demo";

struct Opts {
    windows: usize,
    burst_at: usize,
    scratch: PathBuf,
    plot: PathBuf,
}

fn opts() -> Result<Opts, String> {
    let mut o = Opts {
        windows: 16,
        burst_at: 5,
        scratch: std::env::temp_dir(),
        plot: bin_dir().parent().map_or_else(|| PathBuf::from("demo"), |t| t.join("demo")).join("node-demo.svg"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = |n: &str| it.next().ok_or(format!("{n} needs a value"));
        match a.as_str() {
            "-h" | "--help" => {
                println!("{HELP}");
                std::process::exit(0);
            }
            "--windows" => {
                o.windows = val("--windows")?
                    .parse()
                    .map_err(|_| "--windows: not a number")?
            }
            "--burst-at" => {
                o.burst_at = val("--burst-at")?
                    .parse()
                    .map_err(|_| "--burst-at: not a number")?
            }
            "--scratch" => o.scratch = val("--scratch")?.into(),
            "--plot" => o.plot = val("--plot")?.into(),
            other => return Err(format!("unknown argument {other} (see --help)")),
        }
    }
    Ok(o)
}

/// `target/<profile>/`, two levels above this example's executable.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(|d| d.parent()).unwrap().to_path_buf()
}

/// Children are stopped (SIGTERM, then SIGKILL) when dropped.
struct Guard(Vec<Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        for c in self.0.iter_mut().rev() {
            // SAFETY: signalling our own child before reaping it.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let end = Instant::now() + Duration::from_secs(3);
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn read_json(p: &Path) -> Value {
    std::fs::read_to_string(p)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null)
}

fn wait_for(what: &str, limit: Duration, f: impl Fn() -> bool) -> Result<(), String> {
    let end = Instant::now() + limit;
    while !f() {
        if Instant::now() > end {
            return Err(format!("timed out waiting for {what}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

struct Offline {
    child: Child,
    lines: Receiver<String>,
    last_rate: f64,
    iterations: u64,
}

impl Offline {
    fn poll(&mut self) -> Option<Value> {
        let mut fin = None;
        for l in self.lines.try_iter() {
            if let Ok(v) = serde_json::from_str::<Value>(&l) {
                if let Some(r) = v["iters_per_s"].as_f64() {
                    self.last_rate = r;
                }
                if v["final"] == true {
                    self.iterations += v["iterations"].as_u64().unwrap_or(0);
                    fin = Some(v);
                }
            }
        }
        fin
    }
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("node-demo: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let o = opts()?;
    let bins = bin_dir();
    for f in [
        "sysmonitor",
        "mps-manager",
        "libxcuda.so",
        "online",
        "offline",
    ] {
        if !bins.join(f).exists() {
            return Err(format!(
                "{} is missing: build it first (see --help)",
                bins.join(f).display()
            ));
        }
    }
    let host = Host::emulated(bins.clone(), "h100", &o.scratch)?;
    let root = host.root().to_path_buf();
    let run = root.join("run");
    let env: Vec<(String, std::ffi::OsString)> = host.env().to_vec();
    let mut guard = Guard(Vec::new());

    let mon_cfg = root.join("sysmonitor.json");
    std::fs::write(
        &mon_cfg,
        r#"{ "interval_ms": 10, "host_memory": { "enabled": false },
  "machine": {
    "gpu_util":    { "healthy": 97, "unhealthy": 98, "overlimit": 99, "enabled": false },
    "sm_activity": { "healthy": 60, "unhealthy": 75, "overlimit": 90 },
    "sm_clock":    { "healthy": 3, "unhealthy": 2, "overlimit": 1, "direction": "below", "enabled": false },
    "overlimit_sustain_ms": 300, "hold_base_ms": 2000, "hold_max_ms": 60000 },
  "evictor": { "grace_ms": 5000 },
  "verify": { "every_ms": 200 },
  "offline_throttle": { "max_target_load": 0.85 } }"#,
    )
    .map_err(|e| e.to_string())?;
    let mps_cfg = root.join("mps-manager.json");
    std::fs::write(
        &mps_cfg,
        format!(
            r#"{{ "control_bin": "{}", "pipe_dir": "{}", "log_dir": "{}", "period_ms": 100, "check_every_ms": 250, "quit_on_exit": true, "compute_mode": "{}", "shm_dir": "host",
  "budget": {{ "headroom_pct": 10, "min_pct": 10, "max_pct": 60, "min_step_pct": 5, "smoothing": 0.5 }},
  "detect": {{ "stuck_after_ms": 0 }} }}"#,
            root.join("bin/nvidia-cuda-mps-control").display(),
            host.pipe_dir().display(),
            host.log_dir().display(),
            workloads::host::manager_compute_mode()
        ),
    )
    .map_err(|e| e.to_string())?;
    let daemon = |name: &str, cfg: &Path| -> Result<Child, String> {
        let log =
            std::fs::File::create(root.join(format!("{name}.log"))).map_err(|e| e.to_string())?;
        Command::new(bins.join(name))
            .args(["run", "--config"])
            .arg(cfg)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("XSHARE_LEDGER_DIR", &run)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("{name}: {e}"))
    };
    let mon_state = node_ledger::config::daemon_dir(&run, 0).join("state.json");
    let mps_state = node_ledger::config::daemon_dir(&run, 0).join("mps-manager.json");
    guard.0.push(daemon("sysmonitor", &mon_cfg)?);
    wait_for("sysmonitor Healthy", Duration::from_secs(30), || {
        read_json(&mon_state)["state"] == "healthy"
    })?;
    guard.0.push(daemon("mps-manager", &mps_cfg)?);
    wait_for("MPS up", Duration::from_secs(30), || {
        read_json(&mps_state)["daemon_pid"].is_u64()
    })?;

    let online = |args: &[&str]| -> Result<Value, String> {
        let out = host
            .command("online")
            .arg("--json")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.lines().last().unwrap_or("")).map_err(|_| {
            format!(
                "online client failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
    };
    let steady = workloads::online::probe_args("1");
    let burst = workloads::online::burst_args("300", "1");

    println!("node-demo on {}: sysmonitor (10 ms sampling) + mps-manager + online + offline under libxcuda.so", host.label());
    let alone = online(&workloads::online::probe_args("3"))?;
    let p99_alone = alone["p99_ms"].as_f64().unwrap_or(f64::NAN);
    println!(
        "online alone: p50 {:.2} ms, p99 {:.2} ms\n",
        alone["p50_ms"].as_f64().unwrap_or(f64::NAN),
        p99_alone
    );

    // The shim's throttle (MuxFlow eq. 1-2 + PID) reads U_SM and the SM clock the monitor
    // publishes; the emulated H100 clock sags under load, so its clock threshold sits lower.
    // Its target above the shipped 0.8 is allowed by the monitor's `offline_throttle` above.
    let xcuda_cfg = root.join("xcuda.json");
    std::fs::write(
        &xcuda_cfg,
        r#"{ "throttle": { "target_load": 0.85, "t_sm_mhz": 900.0 } }"#,
    )
    .map_err(|e| e.to_string())?;
    let start_offline = || -> Result<Offline, String> {
        let mut c = host
            .command("offline")
            .args([
                "--json",
                "--blocks",
                "264",
                "--kernel-us",
                "20000",
                "--report-interval",
                "0.5",
                "--state-mb",
                "64",
            ])
            .env("LD_PRELOAD", bins.join("libxcuda.so"))
            .env("XSHARE_LEDGER_DIR", &run)
            .env("XCUDA_GROUP", "training-job-1")
            .env("XCUDA_CONFIG", &xcuda_cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("offline: {e}"))?;
        let out = c.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Ok(Offline {
            child: c,
            lines,
            last_rate: 0.0,
            iterations: 0,
        })
    };
    let mut off = Some(start_offline()?);
    // Wait for the offline client's first progress line (start-up takes a while on a busy host).
    let warm = Instant::now();
    while off.as_mut().is_some_and(|o| {
        o.poll();
        o.last_rate == 0.0
    }) && warm.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    // The node runtime shares the GPU through MPS: an offline client outside it (its
    // CUDA_MPS_PIPE_DIRECTORY not the daemon's) would make every figure below meaningless.
    if let Some(p) = host.device().snapshot().processes.iter().find(|p| p.mps_outside) {
        return Err(format!(
            "pid {} runs outside MPS: no control daemon in its CUDA_MPS_PIPE_DIRECTORY ({}); mps-manager's pipe_dir must be that directory",
            p.pid,
            host.pipe_dir().display()
        ));
    }
    let (mut restarts, mut evicted_at, mut healthy_again_at, mut total_iters) =
        (0u32, None, None, 0u64);
    let (mut steady_p99, mut burst_p99) = (Vec::new(), 0.0f64);
    let mut rows: Vec<Window> = Vec::new();
    let t0 = Instant::now();
    println!(
        "{:>5}  {:<7} {:<10} {:>12} {:>10} {:>13} {:>11} {:>9}",
        "t (s)",
        "window",
        "GPU state",
        "online p99",
        "x alone",
        "offline it/s",
        "SM budget",
        "evicted"
    );
    for w in 0..o.windows {
        let is_burst = w == o.burst_at;
        let began = t0.elapsed().as_secs_f64();
        let r = online(if is_burst { &burst } else { &steady })?;
        let p99 = r["p99_ms"].as_f64().unwrap_or(f64::NAN);
        if is_burst {
            burst_p99 = p99;
        } else if off.is_some() {
            steady_p99.push(p99);
        }
        let ms = read_json(&mon_state);
        let mm = read_json(&mps_state);
        let state = ms["state"].as_str().unwrap_or("?").to_string();
        let mut rate = String::from("-");
        if let Some(of) = off.as_mut() {
            if let Some(fin) = of.poll() {
                total_iters += of.iterations;
                evicted_at.get_or_insert(t0.elapsed().as_secs_f64());
                rate = format!("evicted (sig {})", fin["signal"]);
                let _ = of.child.wait();
                off = None;
            } else {
                rate = format!("{:.1}", of.last_rate);
            }
        } else if ms["admits_offline"] == true {
            healthy_again_at.get_or_insert(t0.elapsed().as_secs_f64());
            off = Some(start_offline()?);
            restarts += 1;
            rate = "restarted".into();
        }
        let ev: u64 = ms["evictions"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum());
        rows.push(Window {
            began,
            t: t0.elapsed().as_secs_f64(),
            burst: is_burst,
            state: state.clone(),
            p99,
            offline_rate: off
                .as_ref()
                .filter(|_| rate != "restarted")
                .map(|of| of.last_rate),
            budget_pct: mm["offline_budget_pct"].as_f64(),
        });
        println!(
            "{:>5.1}  {:<7} {:<10} {:>9.2} ms {:>9.1}x {:>13} {:>10} {:>9}",
            t0.elapsed().as_secs_f64(),
            if is_burst { "BURST" } else { "steady" },
            state,
            p99,
            p99 / p99_alone,
            rate,
            mm["offline_budget_pct"]
                .as_f64()
                .map_or("-".into(), |b| format!("{b:.0} %")),
            ev
        );
    }
    if let Some(mut of) = off.take() {
        // SAFETY: our own child.
        unsafe { libc::kill(of.child.id() as i32, libc::SIGTERM) };
        let _ = of.child.wait();
        std::thread::sleep(Duration::from_millis(100));
        of.poll();
        total_iters += of.iterations;
    }
    let ms = read_json(&mon_state);
    steady_p99.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let median = steady_p99
        .get(steady_p99.len() / 2)
        .copied()
        .unwrap_or(f64::NAN);
    println!("\nsummary");
    println!("  online p99 alone                    {p99_alone:.2} ms");
    println!(
        "  online p99 beside offline (median)  {median:.2} ms ({:.2}x alone)",
        median / p99_alone
    );
    println!("  online p99 in the burst window      {burst_p99:.2} ms");
    println!("  evictions by reason                 {}", ms["evictions"]);
    println!(
        "  SIGTERM after Overlimit decision    {} sampling interval(s)",
        ms["overlimit_eviction_lag_samples"]
    );
    match (evicted_at, healthy_again_at) {
        (Some(a), Some(b)) => println!(
            "  offline evicted at {a:.1} s, GPU admitted offline again at {b:.1} s (hold {} ms)",
            ms["hold_ms"]
        ),
        (Some(a), None) => println!(
            "  offline evicted at {a:.1} s; GPU not yet Healthy again (hold {} ms)",
            ms["hold_ms"]
        ),
        _ => println!("  no eviction happened"),
    }
    println!("  offline iterations completed        {total_iters} ({restarts} restart(s) after eviction)");
    drop(guard);
    match plot(&o.plot, &rows, p99_alone, evicted_at, healthy_again_at) {
        Ok(()) => println!("  timeline plot                       {}", o.plot.display()),
        Err(e) => eprintln!("node-demo: plot {}: {e}", o.plot.display()),
    }
    println!("\nsysmonitor log (transitions and evictions):");
    let log = std::fs::read_to_string(root.join("sysmonitor.log")).unwrap_or_default();
    for l in log
        .lines()
        .filter(|l| l.contains("health transition") || l.contains("evicting"))
        .take(8)
    {
        // Drop ANSI colour codes and the timestamp for a compact view.
        let mut clean = String::new();
        let mut esc = false;
        for ch in l.chars() {
            match (esc, ch) {
                (false, '\u{1b}') => esc = true,
                (true, 'm') => esc = false,
                (true, _) => {}
                (false, c) => clean.push(c),
            }
        }
        println!(
            "  {}",
            clean
                .split_once(' ')
                .map_or(clean.as_str(), |(_, r)| r.trim())
        );
    }
    Ok(())
}

/// One measurement window, as the table prints it.
struct Window {
    /// Seconds since the first window began, at its start.
    began: f64,
    /// Seconds since the first window began, at its end.
    t: f64,
    burst: bool,
    /// sysmonitor's health state at the window's end.
    state: String,
    /// Online p99 latency in the window, ms.
    p99: f64,
    /// The offline client's last reported iterations/s (`None`: none running).
    offline_rate: Option<f64>,
    /// mps-manager's offline SM budget, percent.
    budget_pct: Option<f64>,
}

/// The health state's band colour.
fn state_color(state: &str) -> plotters::style::RGBColor {
    use plotters::style::RGBColor;
    match state {
        "healthy" => RGBColor(200, 235, 200),
        "unhealthy" => RGBColor(250, 230, 170),
        "overlimit" => RGBColor(245, 180, 175),
        "disabled" => RGBColor(205, 205, 205),
        _ => RGBColor(235, 235, 250),
    }
}

/// Draws `rows` as three stacked panels sharing the time axis, one step per window: online p99
/// (log scale) against its alone value and 1.10x of it; the offline client's iterations/s; the
/// offline SM budget over bands of the GPU's health state. Red line: the window the eviction
/// was seen in; green: re-admission.
fn plot(
    path: &Path,
    rows: &[Window],
    p99_alone: f64,
    evicted_at: Option<f64>,
    admitted_at: Option<f64>,
) -> Result<(), String> {
    use plotters::prelude::*;
    let e = |e: &dyn std::fmt::Display| e.to_string();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|x| e(&x))?;
    }
    let t_end = rows.last().map_or(1.0, |r| r.t).max(1.0) + 0.5;
    let root = SVGBackend::new(path, (960, 720)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let root = root
        .titled(
            "node-demo: the node runtime sharing one emulated H100 (one step per measurement window)",
            ("sans-serif", 20),
        )
        .map_err(|x| e(&x))?;
    let panels = root.split_evenly((3, 1));
    let marks = |t: Option<f64>, color: RGBColor, lo: f64, hi: f64| {
        t.map(move |t| PathElement::new(vec![(t, lo), (t, hi)], color.stroke_width(2)))
    };
    let (red, green) = (RGBColor(214, 39, 40), RGBColor(44, 160, 44));

    // Online p99, log scale: the burst is three orders of magnitude above the rest.
    let finite = rows.iter().map(|r| r.p99).filter(|v| v.is_finite() && *v > 0.0);
    let (lo, hi) = finite.fold((p99_alone, p99_alone), |(a, b), v| (a.min(v), b.max(v)));
    let (lo, hi) = ((lo * 0.7).max(1e-3), (hi * 1.5).max(lo * 2.0));
    let mut c = ChartBuilder::on(&panels[0])
        .caption("online p99 latency (ms, log)", ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..t_end, (lo..hi).log_scale())
        .map_err(|x| e(&x))?;
    c.configure_mesh().x_desc("s").draw().map_err(|x| e(&x))?;
    for (f, label, color) in [(1.0, "alone", BLACK), (1.1, "1.10x alone", RGBColor(127, 127, 127))] {
        c.draw_series(std::iter::once(PathElement::new(
            vec![(0.0, p99_alone * f), (t_end, p99_alone * f)],
            color.stroke_width(1),
        )))
        .map_err(|x| e(&x))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    }
    let blue = RGBColor(31, 119, 180);
    // One step per window: the p99 of the requests of that window.
    let steps = |f: &dyn Fn(&Window) -> Option<f64>| -> Vec<Vec<(f64, f64)>> {
        let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for r in rows {
            match f(r).filter(|v| v.is_finite()) {
                Some(v) => runs.last_mut().unwrap().extend([(r.began, v), (r.t, v)]),
                None => runs.push(Vec::new()),
            }
        }
        runs.into_iter().filter(|r| !r.is_empty()).collect()
    };
    for (i, pts) in steps(&|r| Some(r.p99).filter(|v| *v > 0.0)).into_iter().enumerate() {
        let s = c.draw_series(LineSeries::new(pts, blue.stroke_width(2))).map_err(|x| e(&x))?;
        if i == 0 {
            s.label("online p99 per window beside offline work (red: the online burst's window)")
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], blue));
        }
    }
    c.draw_series(rows.iter().filter(|r| r.burst && r.p99.is_finite() && r.p99 > 0.0).map(|r| {
        PathElement::new(vec![(r.began, r.p99), (r.t, r.p99)], red.stroke_width(4))
    }))
    .map_err(|x| e(&x))?;
    c.draw_series(marks(evicted_at, red, lo, hi)).map_err(|x| e(&x))?;
    c.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.8)).draw().map_err(|x| e(&x))?;

    // Offline progress: a gap while it is evicted.
    let top = rows.iter().filter_map(|r| r.offline_rate).fold(1.0, f64::max) * 1.2;
    let mut c = ChartBuilder::on(&panels[1])
        .caption("offline client, iterations/s (red: seen evicted at the end of that window; green: admitted again)", ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..t_end, 0.0..top)
        .map_err(|x| e(&x))?;
    c.configure_mesh().x_desc("s").draw().map_err(|x| e(&x))?;
    for pts in steps(&|r| r.offline_rate) {
        c.draw_series(LineSeries::new(pts, blue.stroke_width(2))).map_err(|x| e(&x))?;
    }
    c.draw_series(marks(evicted_at, red, 0.0, top)).map_err(|x| e(&x))?;
    c.draw_series(marks(admitted_at, green, 0.0, top)).map_err(|x| e(&x))?;

    // The SM budget mps-manager gives offline work, over the monitor's health state.
    let mut c = ChartBuilder::on(&panels[2])
        .caption(
            "offline SM budget % and the GPU state at each window's end (green healthy, yellow unhealthy, red overlimit)",
            ("sans-serif", 16),
        )
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..t_end, 0.0..100.0)
        .map_err(|x| e(&x))?;
    c.configure_mesh().x_desc("s").draw().map_err(|x| e(&x))?;
    c.draw_series(rows.iter().map(|r| Rectangle::new([(r.began, 0.0), (r.t, 100.0)], state_color(&r.state).filled())))
        .map_err(|x| e(&x))?;
    for pts in steps(&|r| r.budget_pct) {
        c.draw_series(LineSeries::new(pts, BLACK.stroke_width(2))).map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
