//! The per-GPU-host Kubernetes agent.
//!
//! - [`plugin`]: kubelet device plugin advertising offline GPU slots (`xshare.io/offline-gpu`),
//!   Unhealthy while the GPU's monitor says it is not Healthy or its MPS could not serve an
//!   offline container ([`mps`]); Allocate injects the shim, the
//!   ledger and MPS pipe directories, the GPU and the plan's quota / SM share ([`allocate`]).
//! - [`evict`]: offline processes the monitor asked to leave (ledger eviction requests) are
//!   mapped to their pods and evicted through the Eviction API, with an Event.
//! - [`heartbeat`]: each GPU's state, load and offline budget on the Node annotation
//!   `xshare.io/gpu-heartbeat` (format: `kube-contract`).
//! - [`health`]: each GPU's health from the monitor block of its status file.
//! - [`gpus`]: each GPU's UUID and name from NVML.
//! - [`online_gpus`]: the GPU each online pod on this node holds, from the kubelet's
//!   PodResources API, written on the pod (`xshare.io/gpu`) for the extender's plan.
//! - [`plans`]: each offline pod's plan, frozen per pod UID at first sight (what Allocate gives
//!   and the monitors enforce); later annotation changes are counted, not followed.

pub mod allocate;
pub mod config;
pub mod evict;
pub mod gpus;
pub mod health;
pub mod heartbeat;
pub mod kube;
pub mod metrics;
pub mod mps;
pub mod offline_pods;
pub mod online_gpus;
pub mod plans;
pub mod plugin;
#[cfg(feature = "test-support")]
pub mod test_support;

/// The kubelet device-plugin API (v1beta1), generated from `proto/` at build time.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("v1beta1");
}

/// The part of the kubelet's PodResources API (v1) the agent calls, generated from `proto/`.
#[allow(clippy::all, missing_docs)]
pub mod podresources_pb {
    tonic::include_proto!("v1");
}
