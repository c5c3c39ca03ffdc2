//! The host demo: runs the online client through a list of phases (alone, beside an
//! unrestrained offline client, and later beside offline work under the node runtime) and
//! reports the online latency and offline throughput of each phase.
//!
//! A [`Phase`] is data: which services to start first (e.g. the MPS daemon, the monitor),
//! whether an offline client runs, and extra environment for it (e.g. `LD_PRELOAD` of the
//! shim). Adding the node-runtime phase means adding one value to the list.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::host::Host;

/// A process started for a phase and stopped (SIGTERM, then SIGKILL) when it ends.
#[derive(Clone, Debug)]
pub struct Service {
    /// Shown in errors.
    pub name: String,
    /// Program name in the binary directory (`bin`) or on the host `PATH` (`tool`).
    pub program: String,
    /// Found in the binary directory (true) or on the host's PATH (false).
    pub from_bin_dir: bool,
    /// Arguments.
    pub args: Vec<String>,
    /// Run to completion before the phase (a setup command like `nvidia-cuda-mps-control -d`)
    /// rather than kept running.
    pub oneshot: bool,
    /// A long-running service is ready once this file exists and contains this text (e.g. the
    /// monitor's state file saying `"healthy"`; "" = exists); the phase waits up to 30 s.
    pub ready: Option<(PathBuf, String)>,
}

/// One measured configuration.
#[derive(Clone, Debug)]
pub struct Phase {
    /// Row label.
    pub name: String,
    /// Started in order before the clients.
    pub services: Vec<Service>,
    /// Run after the phase (e.g. `echo quit | nvidia-cuda-mps-control`): program, args, stdin.
    pub teardown: Vec<(String, Vec<String>, String)>,
    /// Run the online client (a phase without it measures the offline client alone for the
    /// online client's duration).
    pub online: bool,
    /// Run an offline client beside the online one.
    pub offline: bool,
    /// Extra environment for the offline client.
    pub offline_env: Vec<(String, String)>,
}

/// Client settings shared by all phases.
#[derive(Clone, Debug)]
pub struct DemoConfig {
    /// Seconds the online client schedules requests.
    pub duration_s: f64,
    /// Online request rate.
    pub rate: f64,
    /// Online kernels per request.
    pub online_kernels: u32,
    /// Online kernel length, µs.
    pub online_kernel_us: f64,
    /// Online grid size as a fraction of the SMs.
    pub online_sm_fraction: f64,
    /// Offline kernel length, µs.
    pub offline_kernel_us: f64,
    /// Time the offline client runs (after its first progress report) before the online one
    /// starts, seconds.
    pub offline_warmup_s: f64,
}

/// What one phase measured.
#[derive(Clone, Debug, Default)]
pub struct PhaseResult {
    /// Row label.
    pub name: String,
    /// Online p50, ms (None when the online client did not run).
    pub p50_ms: Option<f64>,
    /// Online p99, ms.
    pub p99_ms: Option<f64>,
    /// Online throughput, req/s.
    pub online_rps: Option<f64>,
    /// Online requests completed.
    pub requests: Option<u64>,
    /// Offline iterations/s (None when no offline client ran).
    pub offline_iters_per_s: Option<f64>,
    /// Offline processes the node's monitor evicted during the phase, every reason counted
    /// (None when the phase runs no `sysmonitor`, or its state file could not be read).
    pub offline_evictions: Option<u64>,
}

/// The two phases of the problem statement.
pub fn baseline_phases() -> Vec<Phase> {
    vec![
        Phase {
            name: "online alone".into(),
            services: vec![],
            teardown: vec![],
            online: true,
            offline: false,
            offline_env: vec![],
        },
        Phase {
            name: "offline alone".into(),
            services: vec![],
            teardown: vec![],
            online: false,
            offline: true,
            offline_env: vec![],
        },
        Phase {
            name: "online + offline (no control)".into(),
            services: vec![],
            teardown: vec![],
            online: true,
            offline: true,
            offline_env: vec![],
        },
    ]
}

/// A static MPS split, built only from the emulated host's own tools: the MPS control daemon
/// runs and the offline client starts with `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (the real
/// per-client MPS variable) so it can use at most `offline_pct` percent of the SMs.
pub fn mps_static_phase(offline_pct: u32) -> Phase {
    Phase {
        name: format!("online + offline (MPS, {offline_pct}% SMs)"),
        services: vec![Service {
            name: "MPS control daemon".into(),
            program: "nvidia-cuda-mps-control".into(),
            from_bin_dir: false,
            args: vec!["-d".into()],
            oneshot: true,
            ready: None,
        }],
        teardown: vec![("nvidia-cuda-mps-control".into(), vec![], "quit\n".into())],
        online: true,
        offline: true,
        offline_env: vec![(
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(),
            offline_pct.to_string(),
        )],
    }
}

/// The product: the MPS control daemon, `sysmonitor` (10 ms sampling) and `mps-manager` on the
/// host, the offline client under the `libxcuda.so` shim (quota, throttle, graceful exit) with
/// the shipped defaults. Config files are written under the emulated host's scratch directory;
/// the node services' binaries come from the host's binary directory, and mps-manager's daemon
/// listens in the host's MPS pipe directory, the one its clients connect through.
pub fn node_runtime_phase(host: &Host) -> Result<Phase, String> {
    let (dir, bin_dir) = (host.root(), host.programs_dir());
    let run = dir.join("xshare-run");
    let mon_state = node_ledger::config::daemon_dir(&run, 0).join("state.json");
    let mps_state = node_ledger::config::daemon_dir(&run, 0).join("mps-manager.json");
    std::fs::create_dir_all(run.join("gpu0"))
        .map_err(|e| format!("creating {}: {e}", run.display()))?;
    let write = |name: &str, text: String| -> Result<String, String> {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| format!("writing {}: {e}", p.display()))?;
        Ok(p.to_string_lossy().into_owned())
    };
    let mon_cfg = write(
        "sysmonitor.json",
        format!(
            r#"{{ "interval_ms": 10, "ledger_dir": "{run}", "state_file": "{state}", "metrics_listen": null }}"#,
            run = run.display(),
            state = mon_state.display()
        ),
    )?;
    let mps_cfg = write(
        "mps-manager.json",
        format!(
            r#"{{ "ledger_dir": "{run}", "pipe_dir": "{pipe}", "log_dir": "{log}",
  "monitor_state_file": "{state}", "state_file": "{mps_state}",
  "compute_mode": "{mode}", "shm_dir": "host" }}"#,
            mode = crate::host::manager_compute_mode(),
            run = run.display(),
            pipe = host.pipe_dir().display(),
            log = host.log_dir().display(),
            state = mon_state.display(),
            mps_state = mps_state.display()
        ),
    )?;
    let xcuda_cfg = write("xcuda.json", "{}".into())?;
    let service = |name: &str, program: &str, cfg: String, ready| Service {
        name: name.into(),
        program: program.into(),
        from_bin_dir: true,
        args: vec!["run".into(), "--config".into(), cfg],
        oneshot: false,
        ready,
    };
    Ok(Phase {
        name: "online + offline (xshare node)".into(),
        services: vec![
            service(
                "sysmonitor",
                "sysmonitor",
                mon_cfg,
                Some((mon_state, "\"healthy\"".into())),
            ),
            // Ready when it has published its first offline SM budget (its state file is first
            // written after that), not merely when its MPS daemon listens: an offline client
            // starting before takes MPS's default percentage for its whole life.
            service(
                "mps-manager",
                "mps-manager",
                mps_cfg,
                Some((mps_state, "offline_budget_pct".into())),
            ),
        ],
        teardown: vec![("nvidia-cuda-mps-control".into(), vec![], "quit\n".into())],
        online: true,
        offline: true,
        offline_env: vec![
            (
                "LD_PRELOAD".into(),
                bin_dir.join("libxcuda.so").to_string_lossy().into_owned(),
            ),
            ("XCUDA_CONFIG".into(), xcuda_cfg),
            ("XCUDA_GROUP".into(), "host-demo-offline".into()),
            (
                "XSHARE_LEDGER_DIR".into(),
                run.to_string_lossy().into_owned(),
            ),
        ],
    })
}

/// The sum of the monitor state file's `"evictions": { reason: count, ... }` counts.
pub fn eviction_count(state: &str) -> Option<u64> {
    let rest = &state[state.find("\"evictions\"")? + "\"evictions\"".len()..];
    let body = &rest[rest.find('{')? + 1..];
    let body = &body[..body.find('}')?];
    body.split(',')
        .filter(|kv| !kv.trim().is_empty())
        .map(|kv| kv.rsplit(':').next()?.trim().parse::<u64>().ok())
        .sum()
}

/// Pulls a number field out of a flat JSON object line (the clients print such lines).
pub fn json_number(line: &str, key: &str) -> Option<f64> {
    let pat = format!("\"{key}\":");
    let rest = &line[line.find(&pat)? + pat.len()..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim().parse().ok()
}

struct Guard(Vec<(String, Child)>);

impl Guard {
    /// Stops the processes one by one, last started first: the offline client finishes its
    /// checkpoint before the MPS manager (started earlier) takes the MPS daemon down.
    fn stop_all(&mut self) {
        for (_, c) in self.0.iter_mut().rev() {
            // SAFETY: kill(2) on a child we spawned and have not reaped.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        self.0.clear();
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Runs the online client for the configured duration and records its figures in `r`.
fn run_online(host: &Host, cfg: &DemoConfig, r: &mut PhaseResult) -> Result<(), String> {
    let out = host
        .command("online")
        .args([
            "--json",
            "--duration",
            &cfg.duration_s.to_string(),
            "--rate",
            &cfg.rate.to_string(),
            "--kernels",
            &cfg.online_kernels.to_string(),
            "--kernel-us",
            &cfg.online_kernel_us.to_string(),
            "--sm-fraction",
            &cfg.online_sm_fraction.to_string(),
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run online client: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "online client failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let line = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    let num = |k: &str| {
        json_number(&line, k).ok_or_else(|| format!("online client output lacks {k}: {line}"))
    };
    r.p50_ms = Some(num("p50_ms")?);
    r.p99_ms = Some(num("p99_ms")?);
    r.online_rps = Some(num("throughput_rps")?);
    r.requests = Some(num("requests")? as u64);
    Ok(())
}

/// Runs one phase on `host`.
pub fn run_phase(host: &Host, cfg: &DemoConfig, phase: &Phase) -> Result<PhaseResult, String> {
    let mut guard = Guard(Vec::new());
    for s in &phase.services {
        let mut cmd = if s.from_bin_dir {
            host.command(&s.program)
        } else {
            host.tool(&s.program)
        };
        cmd.args(&s.args).stdin(Stdio::null());
        if s.oneshot {
            let out = cmd
                .output()
                .map_err(|e| format!("{}: cannot run {}: {e}", s.name, s.program))?;
            if !out.status.success() {
                return Err(format!(
                    "{}: {} exited with {}: {}",
                    s.name,
                    s.program,
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        } else {
            let child = cmd
                .stdout(Stdio::null())
                .spawn()
                .map_err(|e| format!("{}: cannot start {}: {e}", s.name, s.program))?;
            guard.0.push((s.name.clone(), child));
            if let Some((file, text)) = &s.ready {
                let deadline = Instant::now() + Duration::from_secs(30);
                let ready = || match text.as_str() {
                    "" => file.exists(),
                    t => std::fs::read_to_string(file).is_ok_and(|s| s.contains(t)),
                };
                while !ready() {
                    if Instant::now() > deadline {
                        return Err(format!(
                            "{}: not ready after 30 s ({} never contained {text})",
                            s.name,
                            file.display()
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
    let mut offline_out = None;
    if phase.offline {
        let mut cmd = host.command("offline");
        cmd.args([
            "--json",
            "--report-interval",
            "0.5",
            "--kernel-us",
            &cfg.offline_kernel_us.to_string(),
        ])
        .envs(phase.offline_env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start offline client: {e}"))?;
        let stdout = child.stdout.take().ok_or("offline client has no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        guard.0.push(("offline client".into(), child));
        let mut early = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !early.iter().any(|l: &String| l.contains("iters_per_s")) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) => early.push(l),
                Err(_) => {
                    return Err("the offline client did not report progress within 60 s".into())
                }
            }
        }
        std::thread::sleep(Duration::from_secs_f64(cfg.offline_warmup_s));
        offline_out = Some((rx, early));
    }
    let mut r = PhaseResult {
        name: phase.name.clone(),
        ..Default::default()
    };
    if phase.online {
        run_online(host, cfg, &mut r)?;
    } else {
        std::thread::sleep(Duration::from_secs_f64(cfg.duration_s));
    }
    if let Some(f) = phase
        .services
        .iter()
        .find(|s| s.program == "sysmonitor")
        .and_then(|s| s.ready.as_ref())
    {
        r.offline_evictions = std::fs::read_to_string(&f.0)
            .ok()
            .and_then(|t| eviction_count(&t));
    }
    guard.stop_all();
    if let Some((rx, mut lines)) = offline_out {
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Ok(l) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            lines.push(l);
        }
        let fin = lines.iter().rev().find(|l| l.contains("\"final\":true"));
        let fin = fin.ok_or_else(|| {
            format!(
                "offline client printed no summary (last lines: {:?})",
                lines.iter().rev().take(3).collect::<Vec<_>>()
            )
        })?;
        r.offline_iters_per_s = json_number(fin, "iters_per_s");
    }
    for (prog, args, stdin) in &phase.teardown {
        let mut c = host
            .tool(prog)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("teardown {prog}: {e}"))?;
        if let Some(mut i) = c.stdin.take() {
            use std::io::Write;
            let _ = i.write_all(stdin.as_bytes());
        }
        let _ = c.wait();
    }
    Ok(r)
}

/// The results as a table, with the online ratios against the first phase that ran it.
pub fn table(host: &str, rows: &[PhaseResult]) -> String {
    let base = rows.iter().find(|r| r.p50_ms.is_some());
    let (base50, base99) = (base.and_then(|r| r.p50_ms), base.and_then(|r| r.p99_ms));
    let mut s = format!("GPU sharing on {host}\n");
    s += &format!(
        "{:<32} {:>10} {:>7} {:>10} {:>7} {:>9} {:>15}\n",
        "phase", "p50 (ms)", "p50 x", "p99 (ms)", "p99 x", "online/s", "offline iter/s"
    );
    s += &format!("{}\n", "-".repeat(96));
    let num =
        |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    let x = |v: Option<f64>, b: Option<f64>| match (v, b) {
        (Some(v), Some(b)) if b > 0.0 => format!("{:.2}", v / b),
        _ => "-".into(),
    };
    for r in rows {
        s += &format!(
            "{:<32} {:>10} {:>7} {:>10} {:>7} {:>9} {:>15}\n",
            r.name,
            num(r.p50_ms, 3),
            x(r.p50_ms, base50),
            num(r.p99_ms, 3),
            x(r.p99_ms, base99),
            num(r.online_rps, 1),
            num(r.offline_iters_per_s, 2)
        );
    }
    for r in rows {
        if let Some(n) = r.offline_evictions {
            s += &format!("offline evictions: {n} in {}\n", r.name);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_evictions_in_the_monitor_state_file() {
        let st = r#"{"state":"healthy","evictions":{"overlimit":2,"under_report":1},"kills":0}"#;
        assert_eq!(eviction_count(st), Some(3));
        let pretty = "{\n  \"evictions\": {},\n  \"kills\": 0\n}";
        assert_eq!(eviction_count(pretty), Some(0));
        assert_eq!(eviction_count("{}"), None);
    }

    #[test]
    fn reads_numbers_from_client_json() {
        let l = r#"{"client":"online","requests":12,"p99_ms":3.5000,"throughput_rps":49.1}"#;
        assert_eq!(json_number(l, "p99_ms"), Some(3.5));
        assert_eq!(json_number(l, "throughput_rps"), Some(49.1));
        assert_eq!(json_number(l, "requests"), Some(12.0));
        assert_eq!(json_number(l, "p50_ms"), None);
    }

    #[test]
    fn table_shows_ratios_against_the_first_online_phase() {
        let rows = [
            PhaseResult {
                name: "o".into(),
                offline_iters_per_s: Some(4.0),
                ..Default::default()
            },
            PhaseResult {
                name: "a".into(),
                p50_ms: Some(1.0),
                p99_ms: Some(2.0),
                online_rps: Some(9.0),
                ..Default::default()
            },
            PhaseResult {
                name: "b".into(),
                p50_ms: Some(1.5),
                p99_ms: Some(5.0),
                online_rps: Some(9.0),
                offline_iters_per_s: Some(3.0),
                ..Default::default()
            },
        ];
        let t = table("x", &rows);
        let row = |n: char| -> Vec<String> {
            t.lines()
                .find(|l| l.starts_with(n))
                .unwrap()
                .split_whitespace()
                .map(String::from)
                .collect()
        };
        assert_eq!(row('o')[1..], ["-", "-", "-", "-", "-", "4.00"], "{t}");
        assert_eq!(
            row('a')[1..],
            ["1.000", "1.00", "2.000", "1.00", "9.0", "-"],
            "{t}"
        );
        assert_eq!(
            row('b')[1..],
            ["1.500", "1.50", "5.000", "2.50", "9.0", "3.00"],
            "{t}"
        );
    }
}
