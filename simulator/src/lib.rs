//! Trace-driven GPU cluster simulator that runs xshare's own control code: the planner
//! (`cluster-matcher`: matching, cells, predictor), the health machine (`sysmonitor::health`)
//! and the throttle controller, on a simulated clock, with an explicit per-GPU interference
//! model ([`model`]). See `simulate --help` and the README section "Simulator".

pub mod engine;
pub mod metrics;
pub mod model;
pub mod online;
pub mod plots;
pub mod rng;
pub mod throttle;
pub mod trace;

/// The planner's offline allocation policies (the simulator uses them, it has no copy).
pub use cluster_matcher::policy;
pub use cluster_matcher::policy::Policy;
pub use engine::{Mode, Sim, SimConfig};
pub use metrics::{table, Report};
pub use trace::{JobTypes, Trace, TraceOptions};

use std::path::PathBuf;

/// The shared data directory (`$XSHARE_DATA_DIR`, else `../shared/data` beside the workspace,
/// else `/work/shared/data`): the same rule as the planner's.
pub fn data_dir() -> PathBuf {
    cluster_matcher::predictor::gavel::data_dir()
}

/// The speed predictor model shipped with the planner's examples.
pub fn default_predictor() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../cluster-matcher/examples/speed-predictor.json")
}
