//! The listeners people reach — approvers and operators, as opposed to
//! gateways: today the approvers' JSON API over HTTPS
//! (`--approvals-listen`, [`crate::approvals_api`]: TLS 1.3 with the
//! stub's certificate, no client certificate, HTTP/1.1).
//!
//! This component is the slot for every listener that serves people: one
//! more (the people's web app) is built in [`People::prepare`], started,
//! closed and stopped beside the approvals API's, in the same steps of the
//! drain, so the order stays one documented order.
//!
//! At the drain each connection closes once the request in flight is
//! answered (at once when idle); a decision under way holds the store
//! while the gateway answers, and is waited for ([`crate::approvals_api::Api::finish`]).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};

use super::listener::{bind, until_drained, Finished, Listener, HANDSHAKE_TIMEOUT};
use super::settings::Settings;
use crate::approvals_api::Api;
use crate::error::Error;
use crate::identity::Identity;
use crate::store::Store;

/// The approvers' API, bound: its listener, TLS and what it works with.
#[derive(Debug)]
struct Approvals {
    listener: Listener,
    tls: rustls::ServerConfig,
    api: Api,
}

/// The people's listeners (none when `serve` serves no people).
#[derive(Debug)]
pub struct People {
    approvals: Option<Approvals>,
}

/// What became of the people's connections and calls at the drain.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct PeopleStopped {
    /// The approvals API's connections.
    pub approvals: Finished,
    /// Decisions (store calls) still under way after the connections
    /// ended, waited for.
    pub calls_waited: usize,
}

impl People {
    /// Everything that can fail, done: for `--approvals-listen`, the
    /// relay's key read, the link that delivers decisions made (to
    /// `targets`), the TLS config, the socket bound. Needs the serving
    /// runtime's context; nothing is accepted yet.
    pub fn prepare(
        settings: &Settings,
        identity: &Identity,
        store: &Arc<Mutex<Store>>,
        targets: &[String],
    ) -> Result<People, Error> {
        let approvals = match settings.approvals {
            Some(addr) => {
                let link =
                    crate::grpc_link::GrpcLink::new(targets, Some(settings.control_dir.clone()))
                        .map_err(Error::Link)?;
                let api = Api::new(
                    Arc::clone(store),
                    Arc::new(crate::identity::relay_key(&settings.control_dir)?),
                    Arc::new(link),
                );
                let tls = crate::approvals_api::server_config(identity)?;
                Some(Approvals {
                    listener: Listener::new(bind(addr)?)?,
                    tls,
                    api,
                })
            }
            None => None,
        };
        Ok(People { approvals })
    }

    /// What the ready line says of them: `"approvals": ADDR`.
    pub fn ready(&self, line: &mut serde_json::Value) {
        if let Some(a) = &self.approvals {
            line["approvals"] = serde_json::Value::String(a.listener.addr().to_string());
        }
    }

    /// Which listeners there are, for the drain's log lines.
    pub fn names(&self) -> Vec<&'static str> {
        self.approvals.iter().map(|_| "approvals").collect()
    }

    /// Accept and serve (on the serving runtime).
    pub fn start(&self) {
        if let Some(a) = &self.approvals {
            let api = a.api.clone();
            a.listener.start_tls(
                a.tls.clone(),
                "approvals_connection_refused",
                move |tls, drain| {
                    let api = api.clone();
                    async move {
                        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                            let api = api.clone();
                            async move {
                                Ok::<_, Infallible>(crate::approvals_api::handle(&api, req).await)
                            }
                        });
                        let conn = hyper::server::conn::http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(HANDSHAKE_TIMEOUT)
                            .serve_connection(TokioIo::new(tls), service);
                        until_drained(conn, &drain, |c| c.graceful_shutdown()).await;
                    }
                },
            );
        }
    }

    /// Stop accepting, close the sockets, tell every connection to finish;
    /// the connections open then.
    pub async fn close(&self) -> usize {
        match &self.approvals {
            Some(a) => a.listener.close().await,
            None => 0,
        }
    }

    /// Wait until `deadline` for the connections, then cut the rest; wait
    /// for the store calls still under way; then let go of the link that
    /// delivers decisions (it runs a runtime of its own, which may not end
    /// on the serving runtime's threads: it ends on a blocking thread).
    pub async fn stop(self, deadline: tokio::time::Instant) -> PeopleStopped {
        let mut stopped = PeopleStopped::default();
        if let Some(a) = self.approvals {
            stopped.approvals = a.listener.finish(deadline).await;
            stopped.calls_waited = a.api.finish().await;
            let _ = tokio::task::spawn_blocking(move || drop(a)).await;
        }
        stopped
    }
}
