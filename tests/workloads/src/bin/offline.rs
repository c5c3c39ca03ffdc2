//! `offline`: the training-like client (see `offline --help`).

use workloads::gpu::Session;
use workloads::offline::{run, OfflineConfig, HELP};

fn main() -> std::process::ExitCode {
    workloads::client_main(HELP, &["json"], OfflineConfig::from_args, |cfg| {
        let mut s = Session::open(cfg.device).map_err(|e| e.to_string())?;
        let report = if cfg.json {
            run(&cfg, &mut s, &mut std::io::stdout())?
        } else {
            run(&cfg, &mut s, &mut std::io::stderr())?
        };
        s.close().map_err(|e| e.to_string())?;
        println!("{}", if cfg.json { report.to_json() } else { report.to_table() });
        Ok(())
    })
}
