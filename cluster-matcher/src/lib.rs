//! Cluster placement of offline work beside online services: speed predictor, Kuhn-Munkres
//! matching, HiveD cells, and the plan that combines them.

pub mod cells;
pub mod extender;
pub mod kube_api;
pub mod matching;
pub mod plan;
pub mod policy;
pub mod predictor;
pub mod watch;
