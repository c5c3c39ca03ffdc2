//! Test support (feature `test-support`): the kubelet's side of device-plugin registration,
//! for this crate's tests and the end-to-end tests that run node-agent against a fake kubelet.

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
