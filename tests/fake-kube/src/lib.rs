//! Test support: a loopback stand-in for the Kubernetes API server.
//!
//! - [`fake_api`]: answers each request with what the test's closure returns (scripted:
//!   lists, watch streams, errors with headers), recording every request.
//! - [`cluster::FakeCluster`]: a stateful API server on top of it: pods and nodes with
//!   resourceVersions, list and watch (label/field selectors, replay from a resourceVersion,
//!   ADDED/MODIFIED/DELETED as objects enter and leave a selector), JSON merge patches (a
//!   `metadata.resourceVersion` in one is a precondition: `409 Conflict` when stale; a
//!   `metadata.uid` other than the object's is refused by validation, `422 Invalid`), the
//!   `binding` and `eviction` subresources with their UID preconditions, Events, and a Job
//!   controller that re-creates an evicted Job pod.
//! - [`objects`]: real-shaped objects (lists, events, Status failures, Nodes, Job pods).
//! - [`http`]: the other direction, a one-request-per-connection HTTP client for tests that
//!   call a server under test.
//!
//! No API server can run on the test machines: every shape here follows the API reference
//! (paths, verbs, bodies, status codes); the clients parse answers with k8s-openapi types.

pub mod cluster;
pub mod http;
pub mod objects;
mod server;

pub use server::{fake_api, Answer, FakeApi, Req};
