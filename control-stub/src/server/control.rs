//! The control listener: where the gateways reach the control plane, over
//! mutual TLS 1.3 and HTTP/2, to ship batches and propose (the batch
//! intake, [`super::intake`]).
//!
//! Mutual TLS 1.3 only: a client must present a certificate that chains
//! to the control CA, or the handshake fails before any gRPC (logged as
//! `connection_refused`). The certificates it presented go with each of
//! its calls, so the intake can check that they name the gateway a batch
//! or a proposal claims.
//!
//! At the drain the socket closes and each gateway's connection gets
//! GOAWAY: the calls already under way are answered, and the gateway
//! sends its next batch on a new connection (to another replica, or to
//! this one once it is back).

use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use super::intake::{Intake, PeerCerts, MAX_MESSAGE};
use super::listener::{until_drained, Finished, Listener};
use crate::error::Error;
use crate::pb::control_plane_server::ControlPlaneServer;

/// The control listener, bound, and the intake it serves.
#[derive(Debug)]
pub struct ControlListener {
    listener: Listener,
    tls: rustls::ServerConfig,
    intake: Intake,
}

impl ControlListener {
    /// Over `socket` (bound), with `tls` (the stub's identity, client
    /// certificates required), serving `intake`; nothing is accepted yet.
    pub fn new(
        socket: TcpListener,
        tls: rustls::ServerConfig,
        intake: Intake,
    ) -> Result<ControlListener, Error> {
        Ok(ControlListener {
            listener: Listener::new(socket)?,
            tls,
            intake,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.listener.addr()
    }

    /// Have the intake call `hook` for each new card the relay stores
    /// (before [`ControlListener::start`]).
    pub fn on_card(&mut self, hook: super::intake::CardHook) {
        self.intake = self.intake.clone().on_card(hook);
    }

    /// The intake it serves.
    pub fn intake(&self) -> &Intake {
        &self.intake
    }

    /// Accept and serve (on the serving runtime).
    pub fn start(&self) {
        let routes = tonic::service::Routes::new(
            ControlPlaneServer::new(self.intake.clone())
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(64 * 1024),
        );
        self.listener
            .start_tls(self.tls.clone(), "connection_refused", move |tls, drain| {
                let routes = routes.clone();
                async move {
                    let peer = PeerCerts(Arc::new(
                        tls.get_ref()
                            .1
                            .peer_certificates()
                            .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                            .unwrap_or_default(),
                    ));
                    let service = hyper::service::service_fn(
                        move |mut req: hyper::Request<hyper::body::Incoming>| {
                            req.extensions_mut().insert(peer.clone());
                            tower::ServiceExt::oneshot(routes.clone(), req)
                        },
                    );
                    let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service);
                    until_drained(conn, &drain, |c| c.graceful_shutdown()).await;
                }
            });
    }

    /// Stop accepting, close the socket, send every connection GOAWAY;
    /// the connections open then.
    pub async fn close(&self) -> usize {
        self.listener.close().await
    }

    /// Wait until `deadline` for the calls under way, then cut the
    /// connections still open.
    pub async fn finish(&self, deadline: tokio::time::Instant) -> Finished {
        self.listener.finish(deadline).await
    }
}
