//! The names and wire types both sides of xshare's Kubernetes integration share.
//!
//! The cluster side (`cluster-matcher`: scheduler extender, planner, pod/node watches) and
//! the node side (device plugin, heartbeat publisher, eviction) meet only through Kubernetes
//! objects. Every key, label, resource name and JSON shape they both read or write is defined
//! here, once, so neither side can drift from the other:
//!
//! - [`pod`]: the labels and annotations that mark a pod online or offline and describe what
//!   it needs, and the annotations the extender writes onto an offline pod when it binds it
//!   (the plan's GPU, SM percentage and memory quota, read back by the device plugin).
//! - [`OFFLINE_GPU_RESOURCE`]: the extended resource the device plugin advertises.
//! - [`heartbeat`]: the per-node GPU heartbeat, a Node annotation ([`heartbeat::ANNOTATION`])
//!   holding [`heartbeat::GpuHeartbeat`] as JSON, with parse/validate and freshness checks.
//! - [`bind_lock`]: the Node annotation that lets one offline pod at a time through from the
//!   extender's bind to the device plugin's Allocate, so Allocate never has to guess which
//!   Pending pod a container belongs to.
//! - [`kubelet_eviction`]: a node-pressure eviction the kubelet began, read off its Event by
//!   the cluster side and carried to the node agent as a pod annotation.
//! - [`watch`]: how either side watches the API server and goes on after an error (relist on
//!   `410 Gone`, the server's Retry-After, exponential backoff), in one loop.
//!
//! # Why a Node annotation and not a CRD
//!
//! The heartbeat is published as the annotation `xshare.io/gpu-heartbeat` on the node's own
//! `Node` object, not as a custom resource:
//!
//! - **Nothing to install.** A CRD must be applied (cluster-admin) before either side starts,
//!   versioned with conversion webhooks when its schema changes, and removed on roll-back; an
//!   annotation needs none of that.
//! - **Least privilege that scopes to the node.** The node agent needs only `patch` on
//!   `nodes`; with the `NodeRestriction` admission plugin and node credentials a kubelet-identity
//!   can patch only its own Node. A CRD would need a namespaced or cluster-wide write right
//!   over every node's heartbeat object.
//! - **One watch.** The cluster side already watches Nodes (capacity, readiness, the
//!   `xshare.io/offline-gpu` allocatable); the heartbeat arrives on the same stream, so GPU
//!   health and node existence can never disagree about which nodes exist.
//!
//! Its costs, accepted knowingly:
//!
//! - **Size limits.** All annotations of one object together are limited to 256 KiB by the
//!   API server, and the whole object (in etcd) to about 1.5 MiB. A heartbeat is ~250 bytes per
//!   GPU (8 GPUs ≈ 2 KiB); [`heartbeat::MAX_ANNOTATION_BYTES`] caps it at 64 KiB so it can
//!   never crowd out other annotations.
//! - **Write amplification.** Every heartbeat rewrites the whole Node object in etcd and is
//!   sent to every Node watcher (kube-scheduler, kubelet-independent controllers, monitoring),
//!   not only to xshare. Publish at most every [`heartbeat::MIN_PUBLISH_INTERVAL_MS`] (10 s)
//!   unless a GPU's `state` changes; the cluster side treats a heartbeat older than its
//!   staleness limit (default 30 s) as not Healthy, so the period must stay well below it.
//!   The kubelet's own `NodeStatus` heartbeat moved to `Lease` objects for this very reason;
//!   at tens of thousands of nodes a CRD (or a Lease-like object per node) would be the next
//!   step, with the same JSON inside.
//! - **No schema validation by the API server.** The JSON is checked by
//!   [`heartbeat::parse`] on the reading side: unknown `version` is an error, not a guess.

pub mod bind_lock;
pub mod heartbeat;
pub mod kubelet_eviction;
pub mod node;
pub mod pod;
pub mod retry;
pub mod watch;

/// The extended resource the node agent's device plugin advertises: one unit per offline slot
/// of a GPU (up to `max_offline_per_gpu` per GPU); slots of a GPU that is not Healthy are
/// reported unhealthy to the kubelet. An offline pod requests one (`limits:
/// {xshare.io/offline-gpu: 1}`).
pub const OFFLINE_GPU_RESOURCE: &str = "xshare.io/offline-gpu";

/// Field manager of the extender's server-side writes (pod annotations).
pub const EXTENDER_FIELD_MANAGER: &str = "xshare-extender";

/// Field manager of the node agent's writes (the Node heartbeat annotation).
pub const NODE_AGENT_FIELD_MANAGER: &str = "xshare-node-agent";

/// `reason` of the Event the node agent records when it evicts an offline pod.
pub const EVICTION_EVENT_REASON: &str = "XshareOfflineEvicted";
