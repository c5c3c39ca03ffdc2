//! Test support (feature `test-support`): the kubelet's side of device-plugin registration and
//! of its PodResources API, for this crate's tests and the end-to-end tests that run node-agent
//! against a fake kubelet; the agent's reading of a real mps-manager's state file.

use std::path::Path;

use tokio_stream::wrappers::UnixListenerStream;

use crate::pb;
use crate::pb::registration_server::{Registration, RegistrationServer};

/// The kubelet's `Registration` service: accepts v1beta1 (as the kubelet does) and hands each
/// request to its callback.
struct FakeKubelet<F>(F);

#[tonic::async_trait]
impl<F: Fn(pb::RegisterRequest) + Send + Sync + 'static> Registration for FakeKubelet<F> {
    async fn register(
        &self,
        req: tonic::Request<pb::RegisterRequest>,
    ) -> Result<tonic::Response<pb::Empty>, tonic::Status> {
        let r = req.into_inner();
        if r.version != "v1beta1" {
            return Err(tonic::Status::invalid_argument(format!(
                "unsupported version {}",
                r.version
            )));
        }
        (self.0)(r);
        Ok(tonic::Response::new(pb::Empty {}))
    }
}

/// Serves the kubelet's registration socket `<dir>/kubelet.sock` on the current tokio runtime
/// (call it inside one), handing every accepted registration to `on_register`.
pub fn serve_kubelet(dir: &Path, on_register: impl Fn(pb::RegisterRequest) + Send + Sync + 'static) {
    let l = tokio::net::UnixListener::bind(dir.join("kubelet.sock")).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(FakeKubelet(on_register)))
            .serve_with_incoming(UnixListenerStream::new(l)),
    );
}

/// The kubelet's PodResources `List`, answering what `pods` holds at each call.
struct FakePodResources(std::sync::Arc<std::sync::Mutex<Vec<crate::podresources_pb::PodResources>>>);

#[tonic::async_trait]
impl crate::podresources_pb::pod_resources_lister_server::PodResourcesLister for FakePodResources {
    async fn list(
        &self,
        _: tonic::Request<crate::podresources_pb::ListPodResourcesRequest>,
    ) -> Result<tonic::Response<crate::podresources_pb::ListPodResourcesResponse>, tonic::Status> {
        let pod_resources = self.0.lock().map_err(|_| tonic::Status::internal("poisoned"))?.clone();
        Ok(tonic::Response::new(crate::podresources_pb::ListPodResourcesResponse { pod_resources }))
    }
}

/// Serves the kubelet's PodResources socket at `socket` on the current tokio runtime (call it
/// inside one), answering `List` with what `pods` holds at the time of the call.
pub fn serve_pod_resources(
    socket: &Path,
    pods: std::sync::Arc<std::sync::Mutex<Vec<crate::podresources_pb::PodResources>>>,
) {
    let l = tokio::net::UnixListener::bind(socket).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(crate::podresources_pb::pod_resources_lister_server::PodResourcesListerServer::new(FakePodResources(pods)))
            .serve_with_incoming(UnixListenerStream::new(l)),
    );
}

/// Whether the agent would take offline work on GPU 0 as far as MPS goes
/// ([`crate::mps::offline_ready`], 5 s staleness), reading the mps-manager state file
/// `state_file`, its containers given the host's `/dev/shm` (the tests' managers run with
/// `shm_dir: "host"`).
pub fn mps_ready_gpu0(ledger_dir: &Path, state_file: &Path) -> Result<(), String> {
    let cfg = crate::config::AgentConfig {
        ledger_dir: ledger_dir.to_path_buf(),
        mps_manager_state_file: state_file.display().to_string(),
        inject: crate::config::InjectConfig { mps_shm_dir: "host".into(), ..Default::default() },
        ..Default::default()
    };
    crate::mps::offline_ready(&cfg, 0, node_daemon::clock::unix_ms(), 5000)
}
