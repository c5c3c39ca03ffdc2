//! Prometheus text on `/metrics`: offline slots per GPU and their health, and the Eviction API
//! counters (from [`crate::evict::Evictor::metrics`]). Labels carry the node and the GPU's
//! index and UUID, as DCGM's exporter does (`gpu`, `UUID`, `Hostname`), so per-GPU panels join.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::watch;

use crate::config::AgentConfig;
use crate::health::GpuHealth;

/// Per-GPU gauges.
pub fn gpu_metrics(cfg: &AgentConfig, health: &BTreeMap<u32, GpuHealth>) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "# HELP xshare_node_agent_offline_slots Offline slots advertised to the kubelet, by health\n# TYPE xshare_node_agent_offline_slots gauge");
    for g in &cfg.gpus {
        let ok = health.get(&g.index).is_some_and(|h| h.healthy());
        let n = cfg.device_plugin.max_offline_per_gpu;
        for (label, v) in [
            ("Healthy", if ok { n } else { 0 }),
            ("Unhealthy", if ok { 0 } else { n }),
        ] {
            let _ = writeln!(
                o,
                "xshare_node_agent_offline_slots{{Hostname=\"{}\",gpu=\"{}\",UUID=\"{}\",health=\"{label}\"}} {v}",
                cfg.node_name, g.index, g.uuid
            );
        }
    }
    o
}

/// Serves `render()` on `GET /metrics` from `listener` until `stop`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    render: Arc<dyn Fn() -> String + Send + Sync>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r { Ok(s) => s, Err(_) => continue },
            _ = stop.changed() => return,
        };
        let render = render.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let render = render.clone();
                async move {
                    let resp =
                        if req.method() == hyper::Method::GET && req.uri().path() == "/metrics" {
                            Response::builder()
                                .header("content-type", "text/plain; version=0.0.4")
                                .body(Full::new(Bytes::from(render())))
                        } else {
                            Response::builder()
                                .status(404)
                                .body(Full::new(Bytes::from_static(b"not found\n")))
                        };
                    Ok::<_, Infallible>(resp.unwrap_or_default())
                }
            });
            // A client that stalls in its headers is dropped, it holds nothing else.
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(5))
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn serves_metrics_and_404s_the_rest() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = watch::channel(false);
        tokio::spawn(serve(l, Arc::new(|| "x_total 1\n".to_string()), rx));
        let get = |path: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let r = get("/metrics").await;
        assert!(
            r.starts_with("HTTP/1.1 200") && r.ends_with("x_total 1\n"),
            "{r}"
        );
        assert!(get("/other").await.starts_with("HTTP/1.1 404"));
        tx.send(true).unwrap();
    }

    #[test]
    fn slots_by_health() {
        let t = r#"{"node_name": "n1", "gpus": [{"index": 0, "uuid": "GPU-a"}], "device_plugin": {"max_offline_per_gpu": 3}}"#;
        let cfg = AgentConfig::from_text(std::path::Path::new("c.json"), t, |_| None).unwrap();
        let m = gpu_metrics(&cfg, &BTreeMap::new());
        assert!(m.contains("xshare_node_agent_offline_slots{Hostname=\"n1\",gpu=\"0\",UUID=\"GPU-a\",health=\"Unhealthy\"} 3\n"), "{m}");
        assert!(m.contains("health=\"Healthy\"} 0\n"), "{m}");
    }
}
