//! The extender's HTTP server: hyper on a small tokio runtime. Each connection is a task (an
//! idle keep-alive connection holds no thread); headers and bodies must arrive within a read
//! deadline (408 otherwise); bodies over the cap get 413 without being read; the verbs run on
//! blocking threads, so one slow request (a bind waiting on the API server) delays no other.
//! Over TLS ([`Transport::Tls`]) a client must present a certificate the client CA signed
//! (the handshake, too, within the read deadline); a metrics-only listener ([`Scope::Metrics`])
//! answers `GET /metrics` and `GET /healthz` (the kubelet's probes present no client
//! certificate) and 404 to everything else.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};

use super::{error_body, handle, Extender, MAX_BODY};

/// Listen backlog asked of the kernel.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Limits on what one client may make the server wait for or hold.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Largest request body (413 above it).
    pub max_body: usize,
    /// Deadline for a request's headers, and separately for its whole body (408 after it).
    pub read_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self { max_body: MAX_BODY, read_timeout: Duration::from_secs(10) }
    }
}

/// How clients reach the server.
#[derive(Clone)]
pub enum Transport {
    /// Plain HTTP: for a loopback address, a metrics-only listener, or an operator's explicit
    /// `--insecure-http`.
    Plain,
    /// TLS; every client presents a certificate the configured client CA signed.
    Tls(Arc<rustls::ServerConfig>),
}

/// What a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every endpoint: the scheduler verbs, `/plan`, `/inspect`, `/metrics`.
    All,
    /// `GET /metrics` and `GET /healthz` only (for Prometheus and the kubelet's probes, on a
    /// port of their own).
    Metrics,
}

/// A running server; stops when dropped.
pub struct HttpServer {
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    rt: Option<tokio::runtime::Runtime>,
}

impl HttpServer {
    /// Listens on `addr` and starts serving every endpoint of `ext` over plain HTTP.
    pub fn start(addr: &str, ext: Arc<Extender>, limits: ServerLimits) -> Result<Self, String> {
        Self::start_with(addr, ext, limits, Transport::Plain, Scope::All)
    }

    /// Listens on `addr` and starts serving `scope` of `ext` over `transport`.
    pub fn start_with(
        addr: &str, ext: Arc<Extender>, limits: ServerLimits, transport: Transport, scope: Scope,
    ) -> Result<Self, String> {
        let cannot = |e: std::io::Error| format!("cannot listen on {addr}: {e}");
        let sock_addr = std::net::ToSocketAddrs::to_socket_addrs(addr)
            .map_err(cannot)?
            .next()
            .ok_or_else(|| format!("cannot listen on {addr}: no address"))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(64)
            .thread_name("extender-http")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the HTTP runtime: {e}"))?;
        let listener = {
            let _guard = rt.enter();
            let socket =
                if sock_addr.is_ipv4() { tokio::net::TcpSocket::new_v4() } else { tokio::net::TcpSocket::new_v6() }
                    .map_err(cannot)?;
            socket.set_reuseaddr(true).map_err(cannot)?;
            socket.bind(sock_addr).map_err(cannot)?;
            // std's backlog (128) resets connections when a burst of kube-scheduler calls
            // arrives at once; the kernel caps this at net.core.somaxconn.
            socket.listen(LISTEN_BACKLOG).map_err(cannot)?
        };
        let local = listener.local_addr().map_err(cannot)?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        rt.spawn(accept_loop(listener, ext, limits, transport, scope, rx));
        Ok(Self { addr: local, shutdown: Some(tx), rt: Some(rt) })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until the process ends.
    pub fn wait(mut self) {
        if let Some(rt) = self.rt.take() {
            rt.block_on(std::future::pending::<()>());
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    ext: Arc<Extender>,
    limits: ServerLimits,
    transport: Transport,
    scope: Scope,
    mut shutdown: tokio::sync::oneshot::Receiver<()>,
) {
    let tls = match transport {
        Transport::Plain => None,
        Transport::Tls(config) => Some(tokio_rustls::TlsAcceptor::from(config)),
    };
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => return,
        };
        let ext = ext.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let Some(tls) = tls else { return serve(stream, ext, limits, scope).await };
            let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
            match tokio::time::timeout(limits.read_timeout, tls.accept(stream)).await {
                Ok(Ok(stream)) => serve(stream, ext, limits, scope).await,
                // A client without a certificate the client CA signed, or no TLS at all.
                Ok(Err(e)) => tracing::warn!(%peer, error = %e, "TLS handshake refused"),
                Err(_) => tracing::warn!(%peer, "TLS handshake not done within the read deadline"),
            }
        });
    }
}

/// Serves one connection's requests.
async fn serve<IO>(io: IO, ext: Arc<Extender>, limits: ServerLimits, scope: Scope)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        let ext = ext.clone();
        async move { Ok::<_, Infallible>(respond(ext, req, limits, scope).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.read_timeout)
        .serve_connection(TokioIo::new(io), svc);
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "connection ended");
    }
}

fn json(status: u16, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}

async fn respond(ext: Arc<Extender>, req: Request<Incoming>, limits: ServerLimits, scope: Scope) -> Response<Full<Bytes>> {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    if scope == Scope::Metrics && !(method == "GET" && ["/metrics", "/healthz"].contains(&path.trim_end_matches('/'))) {
        return json(404, error_body("this listener serves GET /metrics and GET /healthz only"));
    }
    if method == "GET" && path.contains("/inspect/") {
        // HiveD's inspect API over the latest round's cells status (cells mode).
        let (status, body) = crate::plan::with_cells::inspect(ext.snapshot().plan.cells_status.as_deref(), &path);
        return json(status, body);
    }
    let too_big = || json(413, error_body(&format!("body larger than {} bytes", limits.max_body)));
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body as u64) {
        return too_big();
    }
    let read =
        tokio::time::timeout(limits.read_timeout, Limited::new(req.into_body(), limits.max_body).collect()).await;
    let body = match read {
        Err(_) => {
            tracing::warn!(%path, "request body not received within the read deadline");
            return json(408, error_body(&format!("body not received within {:?}", limits.read_timeout)));
        }
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => return too_big(),
        Ok(Err(e)) => return json(400, error_body(&format!("cannot read body: {e}"))),
        Ok(Ok(c)) => c.to_bytes(),
    };
    let p = path.clone();
    let answer = tokio::task::spawn_blocking(move || {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handle(&ext, &method, &p, &body)))
    })
    .await;
    match answer {
        Ok(Ok((200, text))) if path.trim_end_matches('/').ends_with("/metrics") => {
            let mut r = json(200, text);
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(super::metrics::CONTENT_TYPE),
            );
            r
        }
        Ok(Ok((status, text))) => json(status, text),
        _ => json(500, error_body("internal error")),
    }
}
