//! `host-demo`: the main job's driver (see `host-demo --help`).

use std::path::PathBuf;
use std::process::ExitCode;

use workloads::cli::{in_range, Args};
use workloads::demo::{
    baseline_phases, mps_static_phase, node_runtime_phase, run_phase, table, DemoConfig,
};
use workloads::host::Host;

const HELP: &str = "\
host-demo: shows what this product is for. On one GPU host it runs the online
(inference-like) client alone, the offline (training-like) client alone, then both
together with the offline client unrestrained,
then (emulated host) beside an offline client held to a static MPS share of the SMs and
beside an offline client under the node runtime (MPS + sysmonitor + mps-manager + the
libxcuda.so shim, shipped defaults), and prints the online p50/p99 latency and the offline iterations/s of each phase.

By default the host is emulated: the fake libcuda.so.1 / libnvidia-ml.so.1 /
nvidia-cuda-mps-control built next to this binary are laid out in a scratch directory with a
fresh device state file, so nothing on the machine is touched. With --real the clients use
the machine's own driver and GPU.

USAGE: host-demo [OPTIONS]

OPTIONS:
  --profile <id>            emulated GPU: t4 | a10 | h100               [default: t4]
  --duration <s>            online measurement per phase                [default: 5]
  --rate <req/s>            online request rate                         [default: 50]
  --online-kernels <n>      kernels per online request                  [default: 4]
  --online-kernel-us <us>   online kernel length                        [default: 1000]
  --online-sm-fraction <f>  online grid size as a fraction of the SMs   [default: 1.0]
  --offline-kernel-us <us>  offline kernel length                       [default: 20000]
  --mps-offline-pct <p>     offline SM share in the MPS phase           [default: 25]
  --scratch <dir>           where the emulated host is laid out         [default: $TMPDIR]
  --no-node                 skip the node-runtime phase
  --bench                   only the phases scripts/bench-muxflow.sh reads: online alone,
                            offline alone, node runtime
  --real                    use the machine's driver and GPU instead
  --help                    this text

Run it through ./scripts/demo.sh, which builds everything first.";

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.iter().any(|a| a == "--help" || a == "-h") {
        println!("{HELP}");
        return ExitCode::SUCCESS;
    }
    match run(argv) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("host-demo: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(argv: Vec<String>) -> Result<(), String> {
    let mut a = Args::parse(argv, &["real", "no-node", "bench"])?;
    let profile: String = a.get("profile", "t4".to_string())?;
    if emu_device::Profile::by_id(&profile).is_none() {
        let known: Vec<&str> = emu_device::profile::ALL.iter().map(|p| p.id).collect();
        return Err(format!(
            "--profile '{profile}': unknown GPU profile (known: {})",
            known.join(", ")
        ));
    }
    let cfg = DemoConfig {
        duration_s: in_range("duration", a.get("duration", 5.0)?, 0.1, 3600.0)?,
        rate: in_range("rate", a.get("rate", 50.0)?, 0.1, 100_000.0)?,
        online_kernels: in_range("online-kernels", a.get("online-kernels", 4)?, 1, 1000)?,
        online_kernel_us: in_range(
            "online-kernel-us",
            a.get("online-kernel-us", 1000.0)?,
            1.0,
            1e7,
        )?,
        online_sm_fraction: in_range(
            "online-sm-fraction",
            a.get("online-sm-fraction", 1.0)?,
            0.001,
            1.0,
        )?,
        offline_kernel_us: in_range(
            "offline-kernel-us",
            a.get("offline-kernel-us", 20_000.0)?,
            1.0,
            1e8,
        )?,
        offline_warmup_s: 0.5,
    };
    let scratch: PathBuf = a
        .get(
            "scratch",
            std::env::temp_dir().to_string_lossy().into_owned(),
        )?
        .into();
    let real = a.flag("real");
    let a_no_node = a.flag("no-node");
    let bench = a.flag("bench");
    let mps_pct = in_range("mps-offline-pct", a.get("mps-offline-pct", 25)?, 1, 100)?;
    a.finish()?;
    let exe = std::env::current_exe().map_err(|e| format!("locating own executable: {e}"))?;
    let bin_dir = exe
        .parent()
        .ok_or("executable has no directory")?
        .to_path_buf();
    let host = if real {
        Host::real(bin_dir)
    } else {
        Host::emulated(bin_dir, &profile, &scratch)?
    };
    let mut rows = Vec::new();
    let mut phases = baseline_phases();
    if bench {
        phases.retain(|p| !(p.online && p.offline));
    }
    if !real {
        if !bench {
            phases.push(mps_static_phase(mps_pct));
        }
        if !a_no_node {
            phases.push(node_runtime_phase(&host)?);
        }
    }
    for phase in phases {
        eprintln!(
            "host-demo: phase '{}' ({} s of online requests at {}/s)...",
            phase.name, cfg.duration_s, cfg.rate
        );
        let r =
            run_phase(&host, &cfg, &phase).map_err(|e| format!("phase '{}': {e}", phase.name))?;
        rows.push(r);
    }
    println!("{}", table(host.label(), &rows));
    Ok(())
}
