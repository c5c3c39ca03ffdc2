//! `offline`: the training-like client (see `offline --help`).

use workloads::gpu::Session;
use workloads::offline::{run, OfflineConfig, FLAGS, HELP};

fn main() -> std::process::ExitCode {
    workloads::client_main(HELP, FLAGS, OfflineConfig::from_args, |cfg| {
        if cfg.ignore_sigterm {
            // Before Session::open loads the driver (and with it whatever a preloaded shim
            // sets up there), as an application that ignores SIGTERM does from its start.
            workloads::signals::ignore_sigterm().map_err(|e| format!("ignoring SIGTERM: {e}"))?;
        }
        let mut s = Session::open(cfg.device).map_err(|e| e.to_string())?;
        let report = if cfg.json {
            run(&cfg, &mut s, &mut std::io::stdout())?
        } else {
            run(&cfg, &mut s, &mut std::io::stderr())?
        };
        s.close().map_err(|e| e.to_string())?;
        println!(
            "{}",
            if cfg.json {
                report.to_json()
            } else {
                report.to_table()
            }
        );
        Ok(())
    })
}
