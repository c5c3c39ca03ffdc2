//! Node labels the cluster side reads (the heartbeat itself is in [`crate::heartbeat`]).

/// Node label: the GPU type as `cluster.json` and offline pods' `xshare.io/gpu-types` name
/// it (`V100M32`, `T4`). Absent: GPU feature discovery's `nvidia.com/gpu.product`, else the
/// heartbeat's `model`.
pub const LABEL_GPU_TYPE: &str = "xshare.io/gpu-type";
/// Node label: the speed predictor's model for the node's GPUs (`v100`); absent: the GPU type
/// lower-cased.
pub const LABEL_PREDICTOR_GPU_TYPE: &str = "xshare.io/predictor-gpu-type";
