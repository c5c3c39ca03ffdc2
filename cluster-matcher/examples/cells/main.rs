//! Operator tool for cells configs: check one (feasibility, per-level capacity) or print the
//! JSON report of the state it builds.
//!
//! `cargo run -p cluster-matcher --example cells -- check cluster-matcher/examples/cells/hived-fig3.json`

use std::path::Path;
use std::process::ExitCode;

use cluster_matcher::cells::Cluster;

const HELP: &str = "\
cells — check a HiveD cells config (chains, physical cells, virtual clusters)

USAGE:
    cells check <config.json>    validate; print GPUs, free cells and guaranteed cells per level
    cells report <config.json>   print the JSON state report of the freshly built cluster
    cells --help                 this text

A config is refused, with file, line and field, when it is malformed, names an unknown chain
or level, gives a physical cell the wrong number of nodes, or guarantees the virtual clusters
more cells at some level than the physical cluster can give (the error names the first VC
that does not fit, the chain and the level). Exit status: 0 ok, 2 bad config, 64 bad usage.
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, path) = match args.as_slice() {
        [c, p] if c == "check" || c == "report" => (c.as_str(), p),
        [h] if h == "--help" || h == "-h" || h == "help" => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprint!("{HELP}");
            return ExitCode::from(64);
        }
    };
    let cluster = match Cluster::load(Path::new(path)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let report = cluster.report();
    if cmd == "report" {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(1);
            }
        }
        return ExitCode::SUCCESS;
    }
    println!("{path}: ok (safety: {})", report.physical_cluster.safety);
    for ch in &report.physical_cluster.chains {
        println!("chain {} ({}), {} GPUs", ch.name, ch.gpu_type, ch.gpus);
        println!("  {:<12} {:>6} {:>10}", "level", "free", "guaranteed");
        for l in &ch.levels {
            println!("  {:<12} {:>6} {:>10}", l.name, l.free, l.owed);
        }
    }
    for vc in &report.virtual_clusters {
        println!("virtual cluster {}: {} GPUs guaranteed", vc.name, vc.gpus_assigned);
    }
    ExitCode::SUCCESS
}
