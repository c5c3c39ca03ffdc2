//! HiveD-style buddy cells: hierarchy, virtual clusters, binding, preemption, safety check.
//!
//! A cluster is several homogeneous *chains* (one per GPU type/topology), each a hierarchy of
//! cell levels (GPU → PCIe switch → socket → node → rack). Tenants own *virtual clusters*:
//! counts of cells per level. A VC allocates inside its own view with buddy allocation; its
//! virtual cells are bound to physical cells lazily, from global buddy free lists, and unbound
//! when no longer used. The free cells per level must always cover the cells still owed to
//! VCs (HiveD Theorem 1): [`Cluster::check_safety`] checks it and every binding is gated by it.
//! Opportunistic (low-priority) work uses GPUs outside guaranteed use (`Exclusive`, preempted
//! when guaranteed work needs the GPU) or beside it (`Colocate`, MuxFlow's offline jobs).

mod cluster;
mod config;
mod error;
mod freelist;
mod safety;
mod topology;

pub use cluster::{
    CellsReport, ChainId, ChainReport, Cluster, Doomed, DoomedReport, GpuAddress, GpuId, GpuRange,
    GuaranteedAllocation, GuaranteedId, GuaranteedReport, HealthChange, LevelReport,
    OpportunisticId, OpportunisticReport, Reconfigured, Sharing, VcId, VcReport,
};
pub use config::{
    CellsConfig, ChainConfig, LevelConfig, PhysicalCellConfig, VcCellsConfig, VirtualClusterConfig,
};
pub use error::{AllocError, ConfigError, Infeasible};
pub use topology::{Chain, MAX_LEVELS};
