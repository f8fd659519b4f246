//! The admin listener: Prometheus metrics and health, plain HTTP/1.1.
//!
//! Bind it to an address only operators reach (the default is loopback).
//! `/metrics` is the Prometheus text format; `/healthz` answers 200 while the
//! process runs; `/readyz` answers 200 while it accepts connections and 503
//! while it drains.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Install the process-wide metrics recorder and return its render handle.
/// Later calls (tests that start several gateways in one process) reuse the
/// first recorder.
pub fn install_metrics() -> PrometheusHandle {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics may be empty");
            }
            describe();
            handle
        })
        .clone()
}

fn describe() {
    metrics::describe_counter!(
        "gateway_connections_total",
        "Connections closed, by verdict (allowed or the refusal reason)."
    );
    metrics::describe_gauge!("gateway_connections_open", "Client connections open now.");
    metrics::describe_histogram!(
        "gateway_hello_bytes",
        "Bytes read to obtain a complete ClientHello."
    );
    metrics::describe_histogram!(
        "gateway_resolve_seconds",
        "Time to resolve and check a destination name."
    );
}

/// Serve the admin listener until `shutdown` fires.
pub async fn serve(
    listener: Arc<TcpListener>,
    handle: PrometheusHandle,
    ready: Arc<AtomicBool>,
    shutdown: CancellationToken,
) {
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    continue;
                }
            },
        };
        let handle = handle.clone();
        let ready = Arc::clone(&ready);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let body = answer(&req, &handle, &ready);
                async move { Ok::<_, Infallible>(body) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn answer(
    req: &Request<Incoming>,
    handle: &PrometheusHandle,
    ready: &AtomicBool,
) -> Response<Full<Bytes>> {
    let (status, body) = match req.uri().path() {
        "/metrics" => (StatusCode::OK, handle.render()),
        "/healthz" => (StatusCode::OK, "ok\n".to_owned()),
        "/readyz" => {
            let config = crate::reload::config_digest().unwrap_or_default();
            if ready.load(Ordering::Relaxed) {
                (StatusCode::OK, format!("ready\nconfig {config}\n"))
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready\nconfig {config}\n"),
                )
            }
        }
        _ => (StatusCode::NOT_FOUND, "not found\n".to_owned()),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp
}
