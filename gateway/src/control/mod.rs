//! The control channel: the `Gateway` gRPC service (`contract/proto/control.proto`)
//! over mutually authenticated TLS 1.3.
//!
//! The control plane opens a session's authority here (a fresh CA, the
//! allowlist, the attachments with their values) and closes it again; each
//! close answers a drop report signed with the gateway's own key. Every
//! client must present a certificate chaining to the control CA: the TLS
//! handshake fails before any RPC otherwise.
//!
//! Every authority opened here carries a lease ([`crate::session::lease`])
//! that the control plane renews with `RenewLeases`; every end of an
//! authority — a close, a lapse, a newer open displacing it — goes through
//! [`crate::authority`], which signs its drop report and puts it in the
//! batch chain. A session opened for sources that another session holds,
//! or under an id that is already open, replaces that authority (reason
//! `replaced`); an open of an attempt this process already ended, or older
//! than the one it holds, is refused `FAILED_PRECONDITION`: no open brings
//! an ended authority back.
//!
//! # Roles
//!
//! Every certificate of the control CA carries its role
//! (talos-contract `role`): this service answers only a client whose
//! certificate carries the control plane's. The other member of the pair
//! (same CA, gateway role) is refused `PERMISSION_DENIED` at every call, so
//! it can neither open, close, renew nor decide here.
//!
//! Requests are checked by the contract's rules ([`talos_contract::SessionSpec`],
//! the same a static session in the config is checked by); invalid ones are
//! answered `INVALID_ARGUMENT` with a message naming the field; never a
//! value, so secret values cannot reach a log.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use talos_certs::{DropReason, GatewayKey};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::authority::Authority;
use crate::serving::InForce;
use talos_contract::lock::RuleDraft;
use talos_contract::spec::{AttachDraft, ScopeDraft, SessionDraft};

use crate::secrets::secret::{Attachment, SecretBytes};
use crate::session::sessions::{RemoveError, Session, SessionSpec};

/// Code generated from `contract/proto/control.proto`: the `Gateway` and
/// `ControlPlane` services, servers and clients.
use crate::pb;
use pb::gateway_server::{Gateway, GatewayServer};
use talos_contract::sync::Locked;

/// How long a control client has for its TLS handshake: longer than any
/// honest handshake on a data-centre network, short enough that stalled
/// clients do not pile up.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshaken connections waiting for the gRPC server to take them; the
/// accept loop waits when it is full.
const ACCEPTED_QUEUE: usize = 64;

/// Most control handshakes in progress at once: the control plane needs a
/// handful of connections; anyone past this waits in the kernel backlog, so
/// unauthenticated peers cannot make the gateway hold unbounded tasks.
const MAX_HANDSHAKES: usize = 64;

/// The `Gateway` service.
#[derive(Debug, Clone)]
pub struct ControlService {
    /// The settings in force (a reload changes how sessions opened next
    /// reach destinations).
    current: Arc<InForce>,
    key: Arc<GatewayKey>,
    /// `key` bound to this gateway's role and id (talos-certs
    /// `KeyBinding`, JSON), as `Describe` gives it; empty when none.
    key_binding: Arc<[u8]>,
    authority: Arc<Authority>,
}

impl ControlService {
    pub fn new(
        current: Arc<InForce>,
        key: Arc<GatewayKey>,
        key_binding: Vec<u8>,
        authority: Arc<Authority>,
    ) -> Self {
        ControlService {
            current,
            key,
            key_binding: key_binding.into(),
            authority,
        }
    }

    fn lease_ms(&self) -> u64 {
        u64::try_from(self.authority.lease_length().as_millis()).unwrap_or(u64::MAX)
    }
}

fn invalid(field: &str, message: &str) -> Status {
    Status::invalid_argument(format!("{field}: {message}"))
}

/// The contract's draft of an `OpenSessionRequest`.
fn draft_of(req: &pb::OpenSessionRequest) -> SessionDraft<'_> {
    SessionDraft {
        id: &req.session_id,
        tenant: &req.tenant,
        attempt: req.attempt,
        scope: ScopeDraft {
            sources: req.sources.clone(),
            allowlist: req.allowlist.iter().map(String::as_str).collect(),
            attachments: req
                .attachments
                .iter()
                .map(|a| AttachDraft::Parts {
                    secret: &a.secret,
                    destination: &a.destination,
                    header: &a.header,
                    scheme: &a.scheme,
                })
                .collect(),
        },
        lock: req
            .lock
            .iter()
            .map(|r| RuleDraft {
                id: &r.id,
                destination: &r.destination,
                attachment: &r.attachment,
                method: &r.method,
                path_prefix: &r.path_prefix,
                mode: &r.mode,
                approvers: &r.approvers,
            })
            .collect(),
        relay_key: &req.relay_public_key,
        passthrough: req.passthrough.iter().map(String::as_str).collect(),
    }
}

/// Check an `OpenSessionRequest` by the contract's rules and turn it into
/// a session spec and its sources. Takes the attachment values out of the
/// request, so the only copy the gateway keeps is the one wiped on drop.
fn spec_of(req: &mut pb::OpenSessionRequest) -> Result<(SessionSpec, Vec<IpAddr>), Status> {
    // The error names the field and the rule, never a value.
    let spec = talos_contract::SessionSpec::new(&draft_of(req))
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    let mut attachments = Vec::with_capacity(req.attachments.len());
    for (j, (a, sent)) in spec
        .scope()
        .attachments()
        .iter()
        .zip(req.attachments.iter_mut())
        .enumerate()
    {
        let value = SecretBytes::new(std::mem::take(&mut sent.value));
        // The error names the secret and the fault, never the value.
        let attachment = Attachment::new(a, value)
            .map_err(|e| invalid(&format!("attachments[{j}].value"), &e.to_string()))?;
        attachments.push(attachment);
    }
    Ok((
        SessionSpec {
            id: spec.id().to_owned(),
            tenant: spec.tenant().to_owned(),
            attempt: spec.attempt(),
            allowlist: spec.scope().allowlist().to_vec(),
            attachments,
            lock: spec.lock().to_vec(),
            relay_key: spec.relay_key(),
            passthrough: spec.passthrough().to_vec(),
            people: crate::session::person::from_open(req)?,
        },
        spec.scope().sources().to_vec(),
    ))
}

fn drop_reason(reason: &str) -> Option<DropReason> {
    Some(match reason {
        "pause" => DropReason::Pause,
        "interruption" => DropReason::Interruption,
        "end" => DropReason::End,
        "revoke_all" => DropReason::RevokeAll,
        _ => return None,
    })
}

#[tonic::async_trait]
impl Gateway for ControlService {
    async fn open_session(
        &self,
        request: Request<pb::OpenSessionRequest>,
    ) -> Result<Response<pb::OpenSessionReply>, Status> {
        let mut req = request.into_inner();
        let (spec, sources) = spec_of(&mut req)?;
        let cause = req.cause;
        if self.authority.was_ended(&spec.id, spec.attempt) {
            return Err(Status::failed_precondition(format!(
                "attempt: attempt {} of session {} was ended on this gateway; a new authority takes a new attempt",
                spec.attempt, spec.id
            )));
        }
        let cx = self.current.get();
        if let Some(held) = cx.sessions.find(&spec.id) {
            if held.attempt > spec.attempt {
                return Err(Status::failed_precondition(format!(
                    "attempt: this gateway holds attempt {} of session {}, newer than {}",
                    held.attempt, spec.id, spec.attempt
                )));
            }
        }
        let session = Session::open(
            spec,
            &cx.gateway_id,
            &cx.upstream,
            cx.proposer.as_ref(),
            self.authority.new_lease(),
        )
        .map_err(|e| {
            tracing::error!(session = %req.session_id, error = %e, "cannot open session");
            Status::internal("the gateway could not make the session's CA")
        })?;
        let session = Arc::new(session);
        let reply = pb::OpenSessionReply {
            gateway_id: cx.gateway_id.to_string(),
            ca_pem: session.ca_pem(),
            ca_digest: session.ca_digest().to_owned(),
            instance: self.authority.instance().to_string(),
            lease_ms: self.lease_ms(),
        };
        tracing::info!(
            session = %session.id,
            attempt = session.attempt,
            cause = %cause,
            ca_digest = session.ca_digest(),
            sources = sources.len(),
            attachments = session.attachments.len(),
            lease_ms = reply.lease_ms,
            "session opened"
        );
        for old in cx.sessions.replace(&sources, Arc::clone(&session)) {
            tracing::warn!(
                session = %old.id,
                attempt = old.attempt,
                ca_digest = old.ca_digest(),
                "authority replaced by a newer open"
            );
            self.authority.end_in_background(old, DropReason::Replaced);
        }
        Ok(Response::new(reply))
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionReply>, Status> {
        let req = request.into_inner();
        let reason = drop_reason(&req.reason)
            .ok_or_else(|| invalid("reason", "must be pause, interruption, end or revoke_all"))?;
        let removed = self
            .current
            .get()
            .sessions
            .remove(&req.session_id, req.attempt);
        let ended = match removed {
            Ok(session) => {
                // A lease that lapsed before the close came (a member that
                // was stopped, say) ended the authority first: say so.
                let reason = if session.lease.lapsed() {
                    DropReason::LeaseExpired
                } else {
                    reason
                };
                self.authority
                    .end_tracked(session, reason)
                    .await
                    .ok_or_else(|| Status::internal("the end of the authority failed"))?
            }
            Err(e) => {
                // Ended here before: the same report again.
                if let Some(report) = self.authority.report_of(&req.session_id, req.attempt).await {
                    return Ok(Response::new(pb::CloseSessionReply {
                        drop_report: Some(envelope(&report)),
                        connections_closed: 0,
                        approvals_withdrawn: 0,
                    }));
                }
                return Err(match e {
                    RemoveError::NotOpen => Status::not_found(format!(
                        "session_id: {e} (this gateway process, instance {}, never held attempt {})",
                        self.authority.instance(),
                        req.attempt
                    )),
                    RemoveError::OtherAttempt { .. } => {
                        Status::failed_precondition(format!("attempt: {e}"))
                    }
                });
            }
        };
        Ok(Response::new(pb::CloseSessionReply {
            drop_report: Some(envelope(&ended.report)),
            connections_closed: ended.connections_closed,
            approvals_withdrawn: ended.approvals_withdrawn,
        }))
    }

    async fn renew_leases(
        &self,
        request: Request<pb::RenewLeasesRequest>,
    ) -> Result<Response<pb::RenewLeasesReply>, Status> {
        let req = request.into_inner();
        let age = renewal_age(req.read_at_unix_ms, self.authority.lease_length())?;
        let mut reply = pb::RenewLeasesReply {
            lease_ms: self.lease_ms(),
            instance: self.authority.instance().to_string(),
            ..Default::default()
        };
        // The forwarding table first: it stands for a lease from now.
        if let Some(link) = &self.current.get().link {
            let given: Vec<crate::pair::forwarding::Given> = req
                .forwarding
                .into_iter()
                .map(|f| crate::pair::forwarding::Given {
                    session_id: f.session_id,
                    attempt: f.attempt,
                    tenant: f.tenant,
                    sources: f.sources,
                    holders: f.holders,
                })
                .collect();
            let now = std::time::Instant::now();
            let taken = link.forwarding.replace(
                &given,
                self.authority.lease_length(),
                now.checked_sub(age).unwrap_or(now),
            );
            reply.forwarding_taken = u32::try_from(taken).unwrap_or(u32::MAX);
            link.publish(&self.current.get().sessions);
        }
        for lease in req.leases {
            if self
                .authority
                .renew_from(&lease.session_id, lease.attempt, age)
            {
                reply.renewed.push(lease);
            } else {
                reply.not_held.push(lease);
            }
        }
        tracing::debug!(
            renewed = reply.renewed.len(),
            not_held = reply.not_held.len(),
            "leases renewed"
        );
        Ok(Response::new(reply))
    }

    async fn decide(
        &self,
        request: Request<pb::Signed>,
    ) -> Result<Response<pb::DecideReply>, Status> {
        let msg = request.into_inner();
        if msg.kind != "decision" {
            return Err(invalid("kind", "must be decision"));
        }
        let signed = talos_certs::Signed {
            kind: talos_certs::Kind::Decision,
            key_id: msg.key_id,
            payload: msg.payload,
            signature: msg.signature,
        };
        // The proposal id is in the signed payload; the session that holds
        // it checks everything else.
        let id = serde_json::from_slice::<serde_json::Value>(&signed.payload)
            .ok()
            .and_then(|v| v["proposal_id"].as_str().map(str::to_owned))
            .ok_or_else(|| invalid("payload", "not a decision"))?;
        let held = self
            .current
            .get()
            .sessions
            .all()
            .into_iter()
            .find(|s| s.approvals.holds(&id));
        let Some(session) = held else {
            // Held in the process this one took over from, maybe.
            let there = match self.authority.predecessor() {
                Some(p) => p.decide(&signed).await,
                None => None,
            };
            return match there {
                Some(Ok(verdict)) => {
                    tracing::info!(proposal = %id, decision = verdict.as_str(), "decision applied in the previous process");
                    Ok(Response::new(pb::DecideReply {
                        outcome: match verdict {
                            talos_certs::Verdict::Approved => "released",
                            talos_certs::Verdict::Declined => "refused",
                        }
                        .into(),
                    }))
                }
                Some(Err(e)) => Err(Status::permission_denied(e)),
                None => Err(Status::failed_precondition(
                    "no pending proposal has that id (decided, withdrawn, timed out or never made)",
                )),
            };
        };
        match session.approvals.decide(&signed) {
            Ok(verdict) => {
                tracing::info!(session = %session.id, proposal = %id, decision = verdict.as_str(), "decision applied");
                Ok(Response::new(pb::DecideReply {
                    outcome: match verdict {
                        talos_certs::Verdict::Approved => "released",
                        talos_certs::Verdict::Declined => "refused",
                    }
                    .into(),
                }))
            }
            Err(e) => {
                tracing::warn!(session = %session.id, proposal = %id, error = %e, "decision refused");
                Err(match e {
                    crate::session::approvals::DecideError::NotPending => {
                        Status::failed_precondition(e.to_string())
                    }
                    _ => Status::permission_denied(e.to_string()),
                })
            }
        }
    }

    async fn describe(
        &self,
        _request: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeReply>, Status> {
        Ok(Response::new(pb::DescribeReply {
            gateway_id: self.current.get().gateway_id.to_string(),
            public_key: self.key.public_key().to_vec(),
            key_id: self.key.key_id(),
            instance: self.authority.instance().to_string(),
            lease_ms: self.lease_ms(),
            key_binding: self.key_binding.to_vec(),
        }))
    }
}

/// A signed envelope for the wire.
fn envelope(signed: &talos_certs::Signed) -> pb::Signed {
    pb::Signed {
        kind: signed.kind.as_str().to_owned(),
        key_id: signed.key_id.clone(),
        payload: signed.payload.clone(),
        signature: signed.signature.clone(),
    }
}

/// Serve `service` on `listener` until `stop` fires: each connection is
/// handshaken (mutual TLS with `tls`, from
/// [`crate::tls::control_server_config`], bounded in time) before gRPC sees
/// a byte.
pub async fn serve(
    listener: Arc<TcpListener>,
    tls: Arc<rustls::ServerConfig>,
    service: ControlService,
    stop: CancellationToken,
) {
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<ControlIo>>(ACCEPTED_QUEUE);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let accept_stop = stop.clone();
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    let accepting = tokio::spawn(async move {
        loop {
            let permit = tokio::select! {
                _ = accept_stop.cancelled() => break,
                p = Arc::clone(&handshakes).acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let (tcp, peer) = tokio::select! {
                _ = accept_stop.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "control accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await;
                drop(permit);
                match handshake {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(ControlIo(tls))).await;
                    }
                    Ok(Err(e)) => {
                        tracing::info!(peer = %peer, error = %e, "control handshake failed");
                    }
                    Err(_) => tracing::info!(peer = %peer, "control handshake timed out"),
                }
            });
        }
    });
    let incoming = tokio_stream::wrappers::ReceiverStream::new(rx);
    let served = tonic::transport::Server::builder()
        .add_service(GatewayServer::with_interceptor(service, control_plane_only))
        .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
        .await;
    if let Err(e) = served {
        tracing::error!(error = %e, "control server failed");
    }
    accepting.abort();
}

/// The control channel's server, which a handover stops and (if the
/// handover fails) starts again on the same listener.
#[derive(Debug)]
pub struct Runner {
    listener: Arc<TcpListener>,
    tls: Arc<rustls::ServerConfig>,
    service: ControlService,
    running: std::sync::Mutex<Option<(tokio::task::JoinHandle<()>, CancellationToken)>>,
}

impl Runner {
    pub fn new(
        listener: Arc<TcpListener>,
        tls: Arc<rustls::ServerConfig>,
        service: ControlService,
    ) -> Runner {
        Runner {
            listener,
            tls,
            service,
            running: std::sync::Mutex::new(None),
        }
    }

    /// The listener (a handover passes it on).
    pub fn listener(&self) -> &Arc<TcpListener> {
        &self.listener
    }

    /// Serve, unless serving already.
    pub fn start(&self) {
        let mut running = self.running.locked();
        if running.is_some() {
            return;
        }
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve(
            Arc::clone(&self.listener),
            Arc::clone(&self.tls),
            self.service.clone(),
            stop.clone(),
        ));
        *running = Some((task, stop));
    }

    /// Stop serving: calls in progress get `grace` to finish, then their
    /// connections are cut. The listener stays open (connections wait in
    /// its backlog).
    pub async fn stop(&self, grace: Duration) {
        let taken = self.running.locked().take();
        if let Some((mut task, stop)) = taken {
            stop.cancel();
            if tokio::time::timeout(grace, &mut task).await.is_err() {
                task.abort();
            }
        }
    }
}

/// Refuses every call whose connection's certificate does not carry the
/// control plane's role.
#[allow(clippy::result_large_err)]
fn control_plane_only(req: Request<()>) -> Result<Request<()>, Status> {
    match req.extensions().get::<ControlPeer>() {
        Some(peer) if peer.control_plane => Ok(req),
        peer => {
            tracing::warn!(
                peer = ?peer.and_then(|p| p.addr),
                "control call refused: the client certificate is not the control plane's"
            );
            Err(Status::permission_denied(
                "the client certificate does not carry the control plane's role",
            ))
        }
    }
}

/// Who is at the other end of a control connection, read once after its
/// handshake.
#[derive(Debug, Clone, Copy)]
pub struct ControlPeer {
    pub addr: Option<SocketAddr>,
    /// Whether its certificate carries the control plane's role.
    pub control_plane: bool,
}

/// A control connection after its mutual TLS handshake.
#[derive(Debug)]
pub struct ControlIo(tokio_rustls::server::TlsStream<TcpStream>);

impl tonic::transport::server::Connected for ControlIo {
    type ConnectInfo = ControlPeer;

    fn connect_info(&self) -> Self::ConnectInfo {
        let (tcp, tls) = self.0.get_ref();
        ControlPeer {
            addr: tcp.peer_addr().ok(),
            control_plane: tls
                .peer_certificates()
                .and_then(|c| c.first())
                .is_some_and(|leaf| {
                    crate::tls::carries_role(leaf, talos_contract::role::CONTROL_PLANE)
                }),
        }
    }
}

impl AsyncRead for ControlIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for ControlIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// Why a lease renewal is refused (`gateway_renewals_refused_total{cause}`).
pub const RENEWAL_REFUSALS: [&str; 1] = ["stale"];

/// How long ago the control plane read the store a renewal was made from
/// (`read_at_unix_ms`, its wall clock against this host's): what the
/// renewal's leases run from. A time ahead of this host's counts as now
/// (the clocks are kept in step); none is refused; one a whole lease ago
/// or more is refused as stale and renews nothing: whatever held it up (a
/// replica frozen between its read and its call), it may no longer speak
/// for the store.
fn renewal_age(read_at_unix_ms: u64, lease: Duration) -> Result<Duration, Status> {
    if read_at_unix_ms == 0 {
        return Err(invalid("read_at_unix_ms", "is required"));
    }
    let read_at = std::time::UNIX_EPOCH + Duration::from_millis(read_at_unix_ms);
    let age = std::time::SystemTime::now()
        .duration_since(read_at)
        .unwrap_or(Duration::ZERO);
    if age >= lease {
        metrics::counter!("gateway_renewals_refused_total", "cause" => "stale").increment(1);
        tracing::warn!(
            age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX),
            lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            "renewal refused: the control plane read the store a lease ago or more"
        );
        return Err(Status::failed_precondition(format!(
            "stale_renewal: read {} ms ago, the lease is {} ms",
            age.as_millis(),
            lease.as_millis()
        )));
    }
    Ok(age)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The contract's table of drafts, sent as `OpenSessionRequest`s: each
    /// valid one converts, each invalid one is `INVALID_ARGUMENT` naming its
    /// field and showing no value.
    #[test]
    fn the_shared_cases_hold_here() {
        const VALUE: &str = "v4lue-never-shown";
        for case in talos_contract::cases::CASES {
            let mut req = pb::OpenSessionRequest {
                session_id: case.id.into(),
                attempt: case.attempt,
                tenant: case.tenant.into(),
                sources: case.sources.iter().map(|s| (*s).into()).collect(),
                allowlist: case.allowlist.iter().map(|s| (*s).into()).collect(),
                attachments: case
                    .attachments
                    .iter()
                    .map(|&(secret, destination, header, scheme)| pb::Attachment {
                        secret: secret.into(),
                        destination: destination.into(),
                        header: header.into(),
                        scheme: scheme.into(),
                        value: VALUE.into(),
                    })
                    .collect(),
                ..Default::default()
            };
            match (spec_of(&mut req), case.want) {
                (Ok((spec, sources)), None) => {
                    assert_eq!(spec.attachments.len(), case.attachments.len());
                    assert_eq!(sources.len(), case.sources.len(), "{}", case.name);
                }
                (Err(status), Some(field)) => {
                    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{}", case.name);
                    assert!(
                        status.message().starts_with(&format!("{field}: ")),
                        "{}: {status:?}",
                        case.name
                    );
                    assert!(!status.message().contains(VALUE), "{status:?}");
                }
                (got, want) => panic!("{}: {:?}, want {want:?}", case.name, got.err()),
            }
        }
    }
}
