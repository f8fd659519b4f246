//! `control-stub serve`: the `ControlPlane` service, where the gateways
//! ship their signed batches of connection records.
//!
//! Mutual TLS 1.3 only: a client must present a certificate that chains to
//! the control CA, or the handshake fails before any gRPC. Each batch is
//! verified ([`batches::accept`]: signature under the gateway's
//! registered key, sequence, chain) and recorded in one store transaction,
//! so an `ACCEPTED` answer means the batch is on disk.
//!
//! The relay's `Propose` is served here too ([`crate::relay::receive`]):
//! `INVALID_ARGUMENT` for a proposal that does not hold together (a
//! sentence or digest that is not its fields', approvers that are not the
//! rule's), `FAILED_PRECONDITION` for one whose session is not running at
//! that attempt or whose rule is gone, `ALREADY_EXISTS` for a known id with
//! another digest, `PERMISSION_DENIED` when the client certificate does not
//! name the proposing gateway. Each status message starts with the stable
//! code (`proposal_invalid`, …).
//!
//! A gateway may submit only its own batches: the client certificate must
//! name, as a DNS name, the gateway id the batch claims (`init` puts each
//! gateway's id in its certificate). A batch another member's certificate
//! brings is refused `certificate_mismatch` and recorded, before its
//! signature is even checked.
//!
//! # Limits
//!
//! - At most [`MAX_CONNECTIONS`] connections at once; more wait in the
//!   listen queue.
//! - A TLS handshake gets [`HANDSHAKE_TIMEOUT`].
//! - A message is at most [`MAX_MESSAGE`] bytes.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tonic::{Request, Response, Status};

use crate::batches::{self, BatchVerdict};
use crate::error::Error;
use crate::pb;
use crate::pb::control_plane_server::{ControlPlane, ControlPlaneServer};
use crate::store::Store;
use talos_contract::sync::Locked;

/// Connections served at once: a pair of gateways needs two; the rest is
/// room for reconnects while old connections drain.
pub const MAX_CONNECTIONS: usize = 64;

/// How long a client has to finish its TLS handshake: a peer that stalls
/// must not hold a connection slot.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest gRPC message accepted: a batch payload may be up to
/// talos-certs' `MAX_PAYLOAD_LEN` (32 MiB), plus the envelope.
pub const MAX_MESSAGE: usize = talos_certs::MAX_PAYLOAD_LEN + 64 * 1024;

/// The rejection reason of a batch whose gateway id the client's
/// certificate does not name.
pub use talos_contract::role::CERTIFICATE_MISMATCH;

/// What the relay calls when it stores a new card, with the store it is
/// in: the people's web app (Web Push, the live card streams).
pub type CardHook = Arc<dyn Fn(&Store, &crate::store::ProposalRecord) + Send + Sync>;

/// The batch consumer: the store behind a lock (one writer at a time, as
/// SQLite has anyway).
#[derive(Clone)]
pub struct Consumer {
    store: Arc<Mutex<Store>>,
    /// The control channel identity, to fetch the key of a member that was
    /// added (`gateway add`) but never reached, when its first batch comes.
    control_dir: Option<std::path::PathBuf>,
    /// Called for each new card the relay stores.
    on_card: Option<CardHook>,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("control_dir", &self.control_dir)
            .field("on_card", &self.on_card.is_some())
            .finish_non_exhaustive()
    }
}

impl Consumer {
    pub fn new(store: Store) -> Consumer {
        Consumer::shared(Arc::new(Mutex::new(store)))
    }

    /// A consumer on a store shared with other parts of `serve`.
    pub fn shared(store: Arc<Mutex<Store>>) -> Consumer {
        Consumer {
            store,
            control_dir: None,
            on_card: None,
        }
    }

    /// Call `hook` for each new card the relay stores (after it is
    /// stored; the gateway's call waits for nothing it does).
    pub fn on_card(mut self, hook: CardHook) -> Consumer {
        self.on_card = Some(hook);
        self
    }

    /// Register a stored member's key at its first batch, by asking it
    /// (`Describe` over the control channel, with the identity in `dir`).
    pub fn registering(mut self, dir: std::path::PathBuf) -> Consumer {
        self.control_dir = Some(dir);
        self
    }
}

/// Why a batch waits: the member is in the store (`gateway add`) with no
/// key yet, and could not be asked for it. The gateway keeps the batch and
/// sends it again (gRPC `UNAVAILABLE`), so a member's first start, with
/// its start report, is never refused `unknown_gateway`.
struct NotRegisteredYet(String);

/// If `gateway_id` is a stored member whose key is not registered, ask it
/// for its key over the control channel and register it. `Ok` when there
/// was nothing to do or it is registered now.
fn register_member(
    store: &Mutex<Store>,
    control_dir: Option<&std::path::Path>,
    gateway_id: &str,
) -> Result<(), NotRegisteredYet> {
    let member = store.locked().read(|tx| {
        Ok(match tx.gateway_key(gateway_id)? {
            Some(_) => None,
            None => tx.member(gateway_id)?,
        })
    });
    let member = match member {
        Ok(Some(m)) => m,
        // Registered, or no member of that id (refused unknown_gateway as
        // before), or the store failed (the accept below says so).
        _ => return Ok(()),
    };
    let Some(dir) = control_dir else {
        return Ok(());
    };
    let wait = |why: String| {
        Err(NotRegisteredYet(format!(
            "member {gateway_id} is added but its key is not registered yet: {why}; send the batch again"
        )))
    };
    let target = format!("{}={}", member.id, member.control);
    let link = match crate::grpc_link::GrpcLink::new(&[target], Some(dir.to_owned())) {
        Ok(l) => l,
        Err(e) => return wait(e.to_string()),
    };
    let reply = crate::link::GatewayLink::describe(&link).into_iter().next();
    let described = match reply.map(|r| r.result) {
        Some(Ok(d)) => d,
        Some(Err(e)) => return wait(format!("its Describe failed: {e}")),
        None => return wait("no Describe answer".into()),
    };
    if described.gateway_id != gateway_id || described.public_key_hex.is_empty() {
        return wait(format!(
            "its Describe answered as {:?} with no usable key",
            described.gateway_id
        ));
    }
    let mut store = store.locked();
    if let Err(e) = store.register_gateway(gateway_id, &described.public_key_hex) {
        return wait(e.to_string());
    }
    let _ = store.keep_key_binding(
        gateway_id,
        &described.public_key_hex,
        &described.key_binding,
    );
    let at = crate::store::now();
    let _ =
        store.write(|tx| tx.gateway_seen(gateway_id, &described.instance, described.lease_ms, &at));
    eprintln!(
        "{}",
        serde_json::json!({"registered": gateway_id, "via": "first batch", "control": member.control})
    );
    Ok(())
}

/// The certificates the client presented, put in each request's
/// extensions by the connection that carried it.
#[derive(Clone, Debug)]
struct PeerCerts(Arc<Vec<rustls::pki_types::CertificateDer<'static>>>);

/// Whether the client's certificate carries the gateway role and names
/// `gateway_id`, both as DNS names (talos-contract `role`).
fn certificate_names(peer: Option<&PeerCerts>, gateway_id: &str) -> bool {
    let Some(leaf) = peer.and_then(|p| p.0.first()) else {
        return false;
    };
    let names = |name: &str| {
        rustls::pki_types::ServerName::try_from(name).is_ok_and(|name| {
            webpki::EndEntityCert::try_from(leaf)
                .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
        })
    };
    names(talos_contract::role::GATEWAY) && names(gateway_id)
}

/// The envelope as talos-certs reads it, or why not.
fn signed_from(msg: pb::Signed) -> Result<talos_certs::Signed, String> {
    let kind = match msg.kind.as_str() {
        "batch" => talos_certs::Kind::Batch,
        "drop_report" => talos_certs::Kind::DropReport,
        "decision" => talos_certs::Kind::Decision,
        other => {
            return Err(format!(
                "kind {:?} is not batch, drop_report or decision",
                other.chars().take(40).collect::<String>()
            ))
        }
    };
    Ok(talos_certs::Signed {
        kind,
        key_id: msg.key_id,
        payload: msg.payload,
        signature: msg.signature,
    })
}

#[tonic::async_trait]
impl ControlPlane for Consumer {
    async fn submit_batch(
        &self,
        request: Request<pb::Signed>,
    ) -> Result<Response<pb::BatchAck>, Status> {
        let peer = request.extensions().get::<PeerCerts>().cloned();
        let signed = signed_from(request.into_inner()).map_err(Status::invalid_argument)?;
        let store = self.store.clone();
        let control_dir = self.control_dir.clone();
        let verdict = tokio::task::spawn_blocking(move || {
            let (claimed, seq) = talos_certs::claimed_header(&signed.payload);
            let named = !claimed.is_empty() && certificate_names(peer.as_ref(), &claimed);
            if named {
                register_member(&store, control_dir.as_deref(), &claimed)?;
            }
            let mut store = store.locked();
            // A payload that names no gateway is refused `malformed` below.
            if !claimed.is_empty() && !named {
                let sessions = crate::batches::claimed_sessions(&signed.payload);
                return Ok(store
                    .record_rejection(&claimed, seq, CERTIFICATE_MISMATCH, &sessions)
                    .map(|()| BatchVerdict::Rejected {
                        gateway_id: claimed,
                        seq,
                        reason: CERTIFICATE_MISMATCH,
                        detail: "the client certificate does not name the gateway the batch claims"
                            .into(),
                    }));
            }
            Ok(batches::accept(&mut store, &signed))
        })
        .await
        .map_err(|e| Status::internal(format!("batch consumer task: {e}")))?
        .map_err(|NotRegisteredYet(why)| Status::unavailable(why))?
        .map_err(|e| {
            log_store_error(&e);
            Status::internal(format!("{}: {e}", e.code()))
        })?;
        use pb::batch_ack::Status as S;
        let ack = match verdict {
            BatchVerdict::Accepted { seq, gateway_id } => {
                metrics::counter!("stub_batches_accepted_total", "gateway" => gateway_id)
                    .increment(1);
                pb::BatchAck {
                    status: S::Accepted as i32,
                    seq,
                    reason: String::new(),
                }
            }
            BatchVerdict::Duplicate { seq, .. } => pb::BatchAck {
                status: S::Duplicate as i32,
                seq,
                reason: String::new(),
            },
            BatchVerdict::Rejected {
                seq,
                reason,
                gateway_id,
                detail,
            } => {
                eprintln!(
                    "{}",
                    serde_json::json!({"batch_rejected": reason, "gateway_id": gateway_id, "seq": seq, "detail": detail})
                );
                metrics::counter!("stub_batches_rejected_total", "gateway" => gateway_id.chars().take(64).collect::<String>(), "reason" => reason)
                    .increment(1);
                pb::BatchAck {
                    status: S::Rejected as i32,
                    seq,
                    reason: reason.to_owned(),
                }
            }
        };
        Ok(Response::new(ack))
    }

    async fn propose(
        &self,
        request: Request<pb::ProposalMsg>,
    ) -> Result<Response<pb::ProposeAck>, Status> {
        let peer = request.extensions().get::<PeerCerts>().cloned();
        let msg = request.into_inner();
        // A gateway proposes only for itself, as it submits only its own
        // batches.
        if !certificate_names(peer.as_ref(), &msg.gateway_id) {
            log_proposal(&msg, "refused", Some(CERTIFICATE_MISMATCH));
            return Err(Status::permission_denied(format!(
                "{CERTIFICATE_MISMATCH}: the client certificate does not name the gateway the proposal claims"
            )));
        }
        let store = self.store.clone();
        let on_card = self.on_card.clone();
        let result = tokio::task::spawn_blocking(move || {
            let mut store = store.locked();
            let r = crate::relay::receive(&mut store, &msg);
            if let (Ok(crate::relay::Received::New(card)), Some(hook)) = (&r, &on_card) {
                hook(&store, card);
            }
            (msg, r)
        })
        .await
        .map_err(|e| Status::internal(format!("relay task: {e}")))?;
        match result {
            (msg, Ok(crate::relay::Received::New(_))) => {
                log_proposal(&msg, "pending", None);
                Ok(Response::new(pb::ProposeAck {}))
            }
            (msg, Ok(crate::relay::Received::Again { .. })) => {
                log_proposal(&msg, "again", None);
                Ok(Response::new(pb::ProposeAck {}))
            }
            (msg, Err(e)) => {
                log_proposal(&msg, "refused", Some(e.code()));
                let text = format!("{}: {e}", e.code());
                Err(match e {
                    Error::ProposalInvalid { .. } => Status::invalid_argument(text),
                    Error::ProposalStale { .. } => Status::failed_precondition(text),
                    Error::ProposalConflict { .. } => Status::already_exists(text),
                    other => {
                        log_store_error(&other);
                        Status::internal(text)
                    }
                })
            }
        }
    }
}

/// One JSON line per proposal on standard error: who proposed what, and
/// what became of it. Proposals hold no secret (attachments by name).
fn log_proposal(msg: &pb::ProposalMsg, status: &str, error: Option<&str>) {
    let short = |t: &str| t.chars().take(200).collect::<String>();
    eprintln!(
        "{}",
        serde_json::json!({
            "proposal": short(&msg.proposal_id),
            "status": status,
            "error": error,
            "gateway_id": short(&msg.gateway_id),
            "session_id": short(&msg.session_id),
            "attempt": msg.attempt,
            "kind": short(&msg.kind),
            "rule": short(&msg.rule),
            "digest": short(&msg.digest),
        })
    );
}

/// A store failure while serving, on standard error (the store's messages
/// name tables, never values).
fn log_store_error(e: &Error) {
    eprintln!(
        "{}",
        serde_json::json!({"error": e.code(), "message": e.to_string()})
    );
}

/// Serve `ControlPlane` on `listener` with `tls` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    tls: rustls::ServerConfig,
    consumer: Consumer,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let routes = tonic::service::Routes::new(
        ControlPlaneServer::new(consumer)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(64 * 1024),
    );
    accept_tls(listener, tls, "connection_refused", shutdown, move |tls| {
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
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await;
        }
    })
    .await;
}

/// The accept loop both of `serve`'s listeners share: at most
/// [`MAX_CONNECTIONS`] connections at once (more wait in the listen
/// queue), each TLS handshake bounded by [`HANDSHAKE_TIMEOUT`] and a failed
/// one logged as one JSON line under `log_key`; each handshaken stream is
/// served by `serve_conn` on its own task, until `shutdown` resolves.
pub(crate) async fn accept_tls<F, Fut>(
    listener: TcpListener,
    tls: rustls::ServerConfig,
    log_key: &'static str,
    shutdown: impl std::future::Future<Output = ()>,
    serve_conn: F,
) where
    F: Fn(tokio_rustls::server::TlsStream<tokio::net::TcpStream>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => return,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => return,
            a = listener.accept() => match a {
                Ok(a) => a,
                // A failed accept (e.g. out of descriptors) is the
                // connection's, not the listener's: go on.
                Err(_) => continue,
            },
        };
        let acceptor = acceptor.clone();
        let serve_conn = serve_conn.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    log_refused(log_key, peer, &e.to_string());
                    return;
                }
                Err(_) => {
                    log_refused(log_key, peer, "handshake timed out");
                    return;
                }
            };
            serve_conn(tls).await;
        });
    }
}

fn log_refused(log_key: &str, peer: SocketAddr, why: &str) {
    eprintln!(
        "{}",
        serde_json::json!({log_key: peer.to_string(), "reason": why})
    );
}

/// The signals `serve` acts on or logs, each with its handler installed
/// when [`Signals::listen`] returns: `serve` listens before it prints its
/// ready line, so a signal sent the moment the line is read finds its
/// handler rather than the default action (which ends the process without
/// a word).
#[derive(Debug)]
pub struct Signals {
    /// SIGTERM, SIGINT, SIGQUIT: shutting down.
    shutdown: Vec<(&'static str, tokio::signal::unix::Signal)>,
    /// [`LOGGED_SIGNALS`]: logged and ignored.
    logged: Vec<(&'static str, tokio::signal::unix::Signal)>,
}

/// The signals that end `serve`.
const SHUTDOWN_SIGNALS: [(i32, &str); 3] = [(15, "SIGTERM"), (2, "SIGINT"), (3, "SIGQUIT")];

/// Signals whose default action would end `serve` without a word: each is
/// logged and ignored (SIGHUP included: `serve` reads no config file to
/// reload).
const LOGGED_SIGNALS: [(i32, &str); 9] = [
    (1, "SIGHUP"),
    (10, "SIGUSR1"),
    (12, "SIGUSR2"),
    (14, "SIGALRM"),
    (16, "SIGSTKFLT"),
    (26, "SIGVTALRM"),
    (27, "SIGPROF"),
    (29, "SIGIO"),
    (30, "SIGPWR"),
];

impl Signals {
    /// Install the handlers now (inside the runtime). A signal that cannot
    /// be listened for keeps its default action, and says so.
    pub fn listen() -> Signals {
        use tokio::signal::unix::{signal, SignalKind};
        let install = |list: &[(i32, &'static str)]| {
            list.iter()
                .filter_map(|&(raw, name)| match signal(SignalKind::from_raw(raw)) {
                    Ok(s) => Some((name, s)),
                    Err(e) => {
                        eprintln!(
                            "{}",
                            serde_json::json!({"signal": name, "error": format!("cannot listen for it: {e}")})
                        );
                        None
                    }
                })
                .collect()
        };
        Signals {
            shutdown: install(&SHUTDOWN_SIGNALS),
            logged: install(&LOGGED_SIGNALS),
        }
    }

    /// Handle them from now on, for the process's life: each logged signal
    /// is logged and ignored; the first shutdown signal is logged and
    /// fires the [`Shutdown`] returned.
    pub fn handle(self) -> Shutdown {
        let (fire, fired) = tokio::sync::watch::channel(false);
        let fire = std::sync::Arc::new(fire);
        for (name, mut s) in self.shutdown {
            let fire = std::sync::Arc::clone(&fire);
            tokio::spawn(async move {
                // Every one of them is kept listening: a second signal while
                // shutting down is caught too, never the default action.
                while s.recv().await.is_some() {
                    if !fire.send_replace(true) {
                        eprintln!(
                            "{}",
                            serde_json::json!({"signal": name, "action": "shutting down"})
                        );
                    }
                }
            });
        }
        for (name, mut s) in self.logged {
            tokio::spawn(async move {
                while s.recv().await.is_some() {
                    eprintln!(
                        "{}",
                        serde_json::json!({"signal": name, "action": "ignored"})
                    );
                }
            });
        }
        Shutdown(fired)
    }
}

/// Fired by the first shutdown signal ([`Signals::handle`]).
#[derive(Clone, Debug)]
pub struct Shutdown(tokio::sync::watch::Receiver<bool>);

impl Shutdown {
    /// Resolves once a shutdown signal has come (at once if one came
    /// before); never, if none can.
    pub async fn wait(mut self) {
        if self.0.wait_for(|fired| *fired).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Serve Prometheus metrics (plain HTTP, any path answers the text
/// exposition; `/metrics` by convention) on `listener`, for the process's
/// life.
pub async fn serve_metrics(
    listener: TcpListener,
    handle: metrics_exporter_prometheus::PrometheusHandle,
) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let handle = handle.clone();
        tokio::spawn(async move {
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
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}
