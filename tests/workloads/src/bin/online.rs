//! `online`: the inference-like client (see `online --help`).

use workloads::gpu::Session;
use workloads::online::{run, OnlineConfig, HELP};

fn main() -> std::process::ExitCode {
    workloads::client_main(HELP, &["json"], OnlineConfig::from_args, |cfg| {
        let s = Session::open(cfg.device).map_err(|e| e.to_string())?;
        let report = run(&cfg, &s)?;
        s.close().map_err(|e| e.to_string())?;
        println!("{}", if cfg.json { report.to_json() } else { report.to_table() });
        Ok(())
    })
}
