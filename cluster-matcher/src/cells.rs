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
//!
//! Config (JSON; examples in `cluster-matcher/examples/cells/`):
//!
//! ```json
//! { "chains": [ { "name": "v100", "gpu_type": "V100", "node_level": "node",
//!                 "levels": [ { "name": "gpu" }, { "name": "pcie", "children": 2 },
//!                             { "name": "socket", "children": 2 }, { "name": "node", "children": 2 },
//!                             { "name": "rack", "children": 4 } ] } ],
//!   "physical_cells": [ { "chain": "v100", "nodes": ["n0", "n1", "n2", "n3"] } ],
//!   "virtual_clusters": [ { "name": "tenant-a",
//!                           "cells": [ { "chain": "v100", "level": "socket", "count": 1 } ] } ] }
//! ```
//!
//! Levels are listed bottom-up; `children` is how many cells of the level below one cell holds.
//! A physical cell is at the chain's top level unless `level` says otherwise, and names one
//! host per node-level cell inside it (GPU indices run 0.. per host in topology order); a cell
//! below the node level names the one host that lends those GPUs. A host may appear in
//! several chains (several GPU types, as in HiveD), once per chain: its GPU indices continue
//! from one chain to the next in config order. The optional top-level
//! `colocated_per_gpu` (default 1) is how many colocated offline jobs one GPU may hold.
//!
//! Typical use by the placement plan:
//!
//! ```
//! use cluster_matcher::cells::{Cluster, Sharing};
//! let text = include_str!("../examples/cells/hived-fig3.json");
//! let mut cells = Cluster::from_json(text, "hived-fig3.json").unwrap();
//! let chain = cells.chain_id("v100-rack").unwrap();
//! let tenant = cells.vc_id("tenant-a").unwrap();
//! // An online workload takes one GPU of its tenant's guaranteed cells...
//! let online = cells.allocate_guaranteed(tenant, chain, 1).unwrap();
//! let gpu = online.gpus.iter().next().unwrap();
//! assert_eq!(cells.gpu_address(gpu).unwrap().to_string(), "v100-n0/0");
//! // ...and an offline job is placed on the low-priority view of the same GPU.
//! assert!(cells.free_gpus_for_opportunistic(Sharing::Colocate).contains(&gpu));
//! let offline = cells.allocate_opportunistic_on(&[gpu], Sharing::Colocate).unwrap();
//! cells.release_opportunistic(offline).unwrap();
//! cells.release_guaranteed(online.id).unwrap();
//! cells.check_safety().unwrap();
//! ```

mod cluster;
mod config;
mod error;
mod freelist;
mod safety;
mod topology;

pub use cluster::{
    CellsReport, ChainId, ChainReport, Cluster, Doomed, DoomedReport, Downgraded, GpuAddress,
    GpuId, GpuRange, GpuReport, GuaranteedAllocation, GuaranteedId, GuaranteedReport,
    HealthChange, LevelReport, NodeReport, OpportunisticId, OpportunisticReport,
    PhysicalReport, Reconfigured, Sharing, VcId, VcReport,
};
pub use config::{
    CellsConfig, ChainConfig, LevelConfig, PhysicalCellConfig, VcCellsConfig, VirtualClusterConfig,
};
pub use error::{AllocError, ConfigError, Infeasible};
pub use topology::{Chain, MAX_LEVELS};
