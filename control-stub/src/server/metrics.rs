//! The metrics endpoint (`--metrics-listen`): Prometheus text over plain
//! HTTP/1.1, any path (`/metrics` by convention). Its recorder is
//! installed, with every series known at start at its first value
//! ([`crate::series`]), before anything runs; it serves from the first
//! component started to the last stopped, so the whole drain can be
//! watched.

use std::sync::Mutex;

use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::PrometheusHandle;
use talos_contract::sync::Locked;

use super::listener::{bind, until_drained, Finished, Listener};
use super::settings::Settings;
use crate::error::Error;
use crate::store::Store;

/// The metrics endpoint: its recorder's handle and its listener.
#[derive(Debug)]
pub struct Metrics {
    handle: PrometheusHandle,
    listener: Listener,
}

impl Metrics {
    /// With `--metrics-listen`: the recorder installed, every series of
    /// every member `serve` knows of now (those given, those stored, those
    /// registered) at its starting value, the socket bound. Needs the
    /// serving runtime's context; nothing is served yet. Without it: none,
    /// and no recorder (every count is a no-op).
    pub fn prepare(settings: &Settings, store: &Mutex<Store>) -> Result<Option<Metrics>, Error> {
        let Some(addr) = settings.metrics else {
            return Ok(None);
        };
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .map_err(|e| Error::Io {
                what: "metrics".into(),
                reason: e.to_string(),
            })?;
        let mut members: Vec<String> = settings
            .gateways
            .iter()
            .map(|g| crate::grpc_link::GatewayAddr::parse(g).label())
            .collect();
        let registered = store.locked().gateways()?;
        members.extend(registered.into_iter().map(|g| g.id));
        members.extend(store.locked().members()?.into_iter().map(|m| m.id));
        members.sort();
        members.dedup();
        crate::series::preregister(members.iter().map(String::as_str));
        Ok(Some(Metrics {
            handle,
            listener: Listener::new(bind(addr)?)?,
        }))
    }

    /// What the ready line says of it: `"metrics": ADDR`.
    pub fn ready(&self, line: &mut serde_json::Value) {
        line["metrics"] = serde_json::Value::String(self.listener.addr().to_string());
    }

    /// Serve (on the serving runtime).
    pub fn start(&self) {
        let handle = self.handle.clone();
        self.listener.start_plain(move |tcp, drain| {
            let handle = handle.clone();
            async move {
                let service = hyper::service::service_fn(move |_req| {
                    let body = handle.render();
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            hyper::Response::builder()
                                .header("content-type", "text/plain; version=0.0.4")
                                .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                                .unwrap_or_default(),
                        )
                    }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service);
                until_drained(conn, &drain, |c| c.graceful_shutdown()).await;
            }
        });
    }

    /// Stop serving: the socket closed, a scrape under way answered until
    /// `deadline`, then cut.
    pub async fn stop(self, deadline: tokio::time::Instant) -> Finished {
        self.listener.close().await;
        self.listener.finish(deadline).await
    }
}
