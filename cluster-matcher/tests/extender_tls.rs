//! The extender's server over TLS with client certificates: kube-scheduler's certificate (the
//! client CA's) gets answers; a client without a certificate, with one of another CA, or
//! speaking plain HTTP gets none. A metrics-only listener answers `GET /metrics` and
//! `GET /healthz`, nothing else. `cluster-matcher serve` refuses a non-loopback address without TLS. Fixtures:
//! `tests/tls/gen.sh`.

mod plan_support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cluster_matcher::extender::{self, tls, Extender, Scope, ServerLimits, Transport};
use cluster_matcher::plan::{ClusterSpec, Workloads};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn tls_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tls").join(name)
}

fn extender() -> Arc<Extender> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/extender");
    let cluster = ClusterSpec::load(&dir.join("cluster.json")).unwrap();
    let workloads = Workloads::load(&dir.join("workloads.json"), &cluster).unwrap();
    Arc::new(Extender::new(cluster, workloads, plan_support::similarity_predictor(), None))
}

fn tls_server(scope: Scope) -> extender::HttpServer {
    tls_server_for(scope, &[])
}

/// [`tls_server`] answering only client certificates that name one of `names`.
fn tls_server_for(scope: Scope, names: &[String]) -> extender::HttpServer {
    let (cert, key, ca) = (tls_file("server.crt"), tls_file("server.key"), tls_file("client-ca.crt"));
    let config = tls::server_config(&tls::TlsFiles { cert: &cert, key: &key, client_ca: &ca, client_names: names }).unwrap();
    extender::HttpServer::start_with("127.0.0.1:0", extender(), ServerLimits::default(), Transport::Tls(config), scope)
        .unwrap()
}

/// A client trusting the test server CA, presenting `client` (`scheduler`, `stranger`) or no
/// certificate.
fn client_config(client: Option<&str>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(tls_file("server-ca.crt")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    Arc::new(match client {
        None => b.with_no_client_auth(),
        Some(name) => {
            let chain: Vec<_> = CertificateDer::pem_file_iter(tls_file(&format!("{name}.crt")))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let key = PrivateKeyDer::from_pem_file(tls_file(&format!("{name}.key"))).unwrap();
            b.with_client_auth_cert(chain, key).unwrap()
        }
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// One request over TLS: the reply's text, or why there was none.
fn https(addr: SocketAddr, client: Option<&str>, request: &str) -> Result<String, String> {
    let config = client_config(client);
    let request = request.to_string();
    runtime().block_on(async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
        let name = ServerName::try_from("xshare-extender.kube-system.svc").unwrap();
        let connect = tokio_rustls::TlsConnector::from(config).connect(name, tcp);
        let mut s = tokio::time::timeout(std::time::Duration::from_secs(20), connect)
            .await
            .map_err(|_| "handshake timed out".to_string())?
            .map_err(|e| format!("handshake: {e}"))?;
        s.write_all(request.as_bytes()).await.map_err(|e| format!("write: {e}"))?;
        let mut reply = Vec::new();
        let read = tokio::time::timeout(std::time::Duration::from_secs(20), s.read_to_end(&mut reply)).await;
        match read {
            Err(_) => Err("no reply in 20 s".into()),
            // TLS 1.3: the server refuses the client's certificate after the client's side of
            // the handshake completed; the refusal arrives as the first read's error.
            Ok(Err(e)) if reply.is_empty() => Err(format!("read: {e}")),
            _ if reply.is_empty() => Err("closed without a reply".into()),
            _ => Ok(String::from_utf8_lossy(&reply).into_owned()),
        }
    })
}

const METRICS: &str = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

fn bind_request() -> String {
    let body = r#"{"PodName":"p","PodNamespace":"default","PodUID":"u","Node":"n1"}"#;
    format!(
        "POST /xshare/bind HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn the_schedulers_certificate_is_answered_and_no_other_client() {
    let server = tls_server(Scope::All);
    let addr = server.local_addr();
    let ok = https(addr, Some("scheduler"), METRICS).unwrap();
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    // The bind verb is reached (this extender has no API: it answers why, not 404).
    let bind = https(addr, Some("scheduler"), &bind_request()).unwrap();
    assert!(bind.starts_with("HTTP/1.1 "), "{bind}");
    assert!(!bind.starts_with("HTTP/1.1 404"), "{bind}");

    for client in [None, Some("stranger")] {
        let r = https(addr, client, &bind_request());
        assert!(r.is_err(), "client {client:?} was answered: {r:?}");
    }
    // Plain HTTP to the TLS port: no HTTP answer.
    let plain = std::panic::catch_unwind(|| fake_kube::http::request(addr, "GET", "/metrics", b"").status_json());
    assert!(plain.is_err() || plain.as_ref().is_ok_and(|(code, _)| *code != 200), "plain HTTP answered: {plain:?}");
}

/// With `--client-name`, a certificate the client CA signed is answered only when it names the
/// scheduler: `other-client` (same CA, another name, as a shared issuer would sign for a
/// tenant) gets no answer.
#[test]
fn a_client_name_keeps_other_certificates_of_the_same_ca_out() {
    let server = tls_server_for(Scope::All, &["xshare-scheduler".to_string()]);
    let addr = server.local_addr();
    let ok = https(addr, Some("scheduler"), METRICS).unwrap();
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    let r = https(addr, Some("other-client"), &bind_request());
    assert!(r.is_err(), "a certificate of the client CA naming someone else was answered: {r:?}");
    // Without the name check, the same certificate is answered (the CA signed it).
    let open = tls_server(Scope::All);
    let ok = https(open.local_addr(), Some("other-client"), METRICS).unwrap();
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
}

#[test]
fn the_metrics_listener_serves_metrics_alone() {
    let server = extender::HttpServer::start_with(
        "127.0.0.1:0",
        extender(),
        ServerLimits::default(),
        Transport::Plain,
        Scope::Metrics,
    )
    .unwrap();
    let addr = server.local_addr();
    for path in ["/metrics", "/healthz"] {
        assert_eq!(fake_kube::http::request(addr, "GET", path, b"").status, 200, "{path}");
    }
    let body = br#"{"PodName":"p","PodNamespace":"default","PodUID":"u","Node":"n1"}"#;
    for (method, path) in [("POST", "/xshare/bind"), ("POST", "/xshare/filter"), ("GET", "/plan"), ("POST", "/metrics")] {
        let (code, _) = fake_kube::http::request(addr, method, path, body).status_json();
        assert_eq!(code, 404, "{method} {path}");
    }
}

#[test]
fn serve_refuses_a_public_address_without_tls() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cluster-matcher"))
        .args(["serve", "--cluster", "c.json", "--workloads", "w.json", "--model", "m.json", "--listen", "0.0.0.0:0"])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--listen 0.0.0.0:0") && err.contains("--tls-cert") && err.contains("--insecure-http"), "{err}");
    // Half a TLS configuration is refused by the flags themselves.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cluster-matcher"))
        .args(["serve", "--cluster", "c.json", "--workloads", "w.json", "--model", "m.json", "--listen", "0.0.0.0:0", "--tls-cert", "x.pem"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--tls-key") && err.contains("--client-ca"), "{err}");
}
