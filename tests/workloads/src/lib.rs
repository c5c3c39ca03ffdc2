//! Online (inference-like) and offline (training-like) CUDA client programs used by tests and demos.

pub mod cli;
pub mod driver;
pub mod gpu;
pub mod offline;
pub mod online;
pub mod ptx;
pub mod signals;
pub mod stats;

/// Shared `main` body of the client binaries: `--help`, argument errors (exit 2), driver
/// errors (exit 1, the message names the call and the `CUresult`).
pub fn client_main<C>(
    help: &str,
    flags: &[&str],
    parse: fn(cli::Args) -> Result<C, String>,
    body: fn(C) -> Result<(), String>,
) -> std::process::ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.iter().any(|a| a == "--help" || a == "-h") {
        println!("{help}");
        return std::process::ExitCode::SUCCESS;
    }
    let cfg = match cli::Args::parse(argv, flags).and_then(parse) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if let Err(e) = signals::install() {
        eprintln!("error: installing signal handlers: {e}");
        return std::process::ExitCode::FAILURE;
    }
    match body(cfg) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
