//! The real control channel client: [`GrpcLink`], a [`GatewayLink`] that
//! speaks the `Gateway` gRPC service to each gateway of the pair over
//! mutual TLS 1.3.
//!
//! Each gateway is given as `ID=HOST:PORT` (its certificate must name `ID`
//! as a DNS name) or `HOST:PORT` (its certificate must name `localhost`, as
//! every certificate `init` makes does; the id is then the one the gateway
//! states). The client presents the control stub's certificate and trusts
//! only the control CA. TLS is rustls through a connector of our own
//! (tokio-rustls over a `TcpStream`), so there is one TLS stack in the
//! process.
//!
//! The link is synchronous, as [`GatewayLink`] is: it owns a
//! single-threaded tokio runtime and blocks on each call, which reaches
//! every member at once; each member's part is bounded by
//! [`CONNECT_TIMEOUT`] and [`RPC_TIMEOUT`], so a member that is down or
//! hung costs the call at most that, and the others answer regardless.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

use crate::error::LinkError;
use crate::identity::Identity;
use crate::link::{
    CloseAnswer, CloseSession, Described, DropReportView, GatewayLink, OpenSession, Opened,
    Renewed, Reply,
};
use crate::pb;
use crate::pb::gateway_client::GatewayClient;
use crate::store::Member;
use talos_contract::sync::Locked;

/// How long a connection (TCP and TLS) to a gateway may take: a gateway on
/// the same network answers in milliseconds; more means it is down.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long one call may take: an open makes a CA (milliseconds) on each
/// gateway; more means it is hung. No store transaction is held while a
/// call waits; an open in flight for far longer than this is given up
/// ([`crate::model::limits::OPEN_DEADLINE`]).
pub const RPC_TIMEOUT: Duration = Duration::from_secs(4);

/// The largest reply accepted: a drop report is at most talos-certs'
/// `MAX_REPORT_LEN` (1 MiB) plus its envelope.
pub const MAX_REPLY: usize = talos_certs::MAX_REPORT_LEN + 64 * 1024;

/// One gateway as given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayAddr {
    /// The id its certificate must name, if given (`ID=ADDR`).
    pub id: Option<String>,
    /// `HOST:PORT`.
    pub addr: String,
}

impl GatewayAddr {
    /// Parse `ID=HOST:PORT` or `HOST:PORT`.
    pub fn parse(text: &str) -> GatewayAddr {
        match text.split_once('=') {
            Some((id, addr)) => GatewayAddr {
                id: Some(id.to_owned()),
                addr: addr.to_owned(),
            },
            None => GatewayAddr {
                id: None,
                addr: text.to_owned(),
            },
        }
    }

    /// The member's name in replies, logs and metric labels: its id when
    /// given, else its address.
    pub fn label(&self) -> String {
        self.id.clone().unwrap_or_else(|| self.addr.clone())
    }
}

/// The control channel client (see the module docs).
pub struct GrpcLink {
    gateways: Vec<GatewayAddr>,
    control_dir: Option<std::path::PathBuf>,
    runtime: tokio::runtime::Runtime,
    /// Connected clients, one slot per member, made at first use with the
    /// id each gateway stated (checked against `ID=` when given). A
    /// channel reconnects by itself after a member restarts.
    clients: Mutex<Vec<Option<Conn>>>,
    /// Members no authority is opened on ([`GatewayLink::distrust`]).
    distrusted: Mutex<Vec<String>>,
}

#[derive(Clone)]
struct Conn {
    id: String,
    public_key_hex: String,
    client: GatewayClient<Channel>,
}

impl std::fmt::Debug for GrpcLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcLink")
            .field("gateways", &self.gateways)
            .field("control_dir", &self.control_dir)
            .finish_non_exhaustive()
    }
}

impl GrpcLink {
    /// A link to `gateways` (as given with `--gateway`), with the identity
    /// in `control_dir`. Nothing is read or connected until the first
    /// call; a missing directory then fails `gateway_unreachable`.
    pub fn new(
        gateways: &[String],
        control_dir: Option<std::path::PathBuf>,
    ) -> Result<GrpcLink, LinkError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| LinkError::Unreachable(format!("runtime: {e}")))?;
        Ok(GrpcLink {
            gateways: gateways.iter().map(|g| GatewayAddr::parse(g)).collect(),
            control_dir,
            runtime,
            clients: Mutex::new(vec![None; gateways.len()]),
            distrusted: Mutex::new(Vec::new()),
        })
    }

    /// The client side of the control channel identity.
    fn tls(&self) -> Result<Arc<rustls::ClientConfig>, LinkError> {
        let names = || {
            self.gateways
                .iter()
                .map(|g| g.addr.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let dir = self.control_dir.as_deref().ok_or_else(|| {
            LinkError::Unreachable(format!(
                "cannot reach {} without the control channel identity: give --control-dir DIR (the directory init wrote)",
                names()
            ))
        })?;
        let tls = Identity::load(dir, "stub")
            .and_then(|i| i.client_config())
            .map_err(|e| {
                LinkError::Unreachable(format!(
                    "cannot reach {}: control channel identity: {e}",
                    names()
                ))
            })?;
        Ok(Arc::new(tls))
    }

    /// Run `op` on every member at once (those `only` names, when given),
    /// connecting first where there is no client yet; one reply per member.
    fn each<T, F, Fut>(&self, only: Option<&[String]>, op: F) -> Vec<Reply<T>>
    where
        T: Send + 'static,
        F: Fn(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<T, LinkError>> + Send + 'static,
    {
        if self.gateways.is_empty() {
            return vec![Reply {
                member: crate::link::NO_GATEWAY.into(),
                result: Err(LinkError::Unreachable(
                    "no gateway given (--gateway [ID=]ADDR)".into(),
                )),
            }];
        }
        let tls = self.tls();
        let cached: Vec<Option<Conn>> = self.clients.locked().clone();
        let results = self.runtime.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for (i, g) in self.gateways.iter().enumerate() {
                let known = cached[i].as_ref().map(|c| c.id.clone()).or(g.id.clone());
                if let (Some(only), Some(id)) = (only, &known) {
                    if !only.contains(id) {
                        continue;
                    }
                }
                let conn = cached[i].clone();
                let g = g.clone();
                let tls = tls.clone();
                // The connection first, if there is none: bounded by
                // CONNECT_TIMEOUT and RPC_TIMEOUT (for Describe).
                set.spawn(async move {
                    let made = match conn {
                        Some(c) => Ok(c),
                        None => match tls {
                            Ok(tls) => connect(&g, tls).await,
                            Err(e) => Err(e),
                        },
                    };
                    (i, made)
                });
            }
            // Each member's call starts as soon as its own connection is
            // made: one that is slow to connect (hung, far away) delays
            // only its own call, never another member's.
            let mut calls = tokio::task::JoinSet::new();
            let mut out: Vec<(usize, Option<Conn>, Result<T, LinkError>)> = Vec::new();
            loop {
                tokio::select! {
                    Some(joined) = set.join_next(), if !set.is_empty() => match joined {
                        Ok((i, Ok(c))) => {
                            let fut = op(c.clone());
                            calls.spawn(async move { (i, Some(c), fut.await) });
                        }
                        Ok((i, Err(e))) => out.push((i, None, Err(e))),
                        Err(_) => {}
                    },
                    Some(joined) = calls.join_next(), if !calls.is_empty() => {
                        if let Ok(r) = joined {
                            out.push(r);
                        }
                    }
                    else => break,
                }
            }
            out.sort_by_key(|(i, _, _)| *i);
            out
        });
        let mut cache = self.clients.locked();
        let mut replies = Vec::new();
        for (i, conn, result) in results {
            if let Some(c) = conn {
                cache[i] = Some(c);
            }
            // A member unreachable now may come back as another process:
            // connect afresh next time (its id and key are checked again).
            if matches!(result, Err(LinkError::Unreachable(_))) {
                cache[i] = None;
            }
            let member = match &cache[i] {
                Some(c) => c.id.clone(),
                None => self.gateways[i].label(),
            };
            replies.push(Reply { member, result });
        }
        replies
    }
}

/// Connect to one gateway and ask who it is.
async fn connect(g: &GatewayAddr, tls: Arc<rustls::ClientConfig>) -> Result<Conn, LinkError> {
    let label = g.label();
    let name = g.id.clone().unwrap_or_else(|| "localhost".into());
    let server_name = ServerName::try_from(name.clone()).map_err(|_| {
        LinkError::Unreachable(format!("{name:?} is not a name a certificate can hold"))
    })?;
    let addr = g.addr.clone();
    let connector = TlsConnector::from(tls);
    let service = tower::service_fn(move |_uri: hyper::Uri| {
        let connector = connector.clone();
        let server_name = server_name.clone();
        let addr = addr.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(addr.as_str()).await?;
            tcp.set_nodelay(true)?;
            let tls = connector.connect(server_name, tcp).await?;
            Ok::<_, std::io::Error>(TokioIo::new(tls))
        }
    });
    // The URI only names the authority for HTTP/2; the connector above
    // decides where the connection goes and which name TLS checks.
    let channel = Endpoint::from_shared(format!("https://{name}"))
        .map_err(|e| LinkError::Unreachable(format!("{label}: {e}")))?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(RPC_TIMEOUT)
        .connect_with_connector(service)
        .await
        .map_err(|e| LinkError::Unreachable(format!("{label} ({}): {}", g.addr, chain(&e))))?;
    let mut client = GatewayClient::new(channel)
        .max_decoding_message_size(MAX_REPLY)
        .max_encoding_message_size(MAX_REPLY);
    let reply = client
        .describe(pb::DescribeRequest {})
        .await
        .map_err(|s| status_error(&label, s))?
        .into_inner();
    let invalid = |reason: String| LinkError::Invalid {
        gateway_id: label.clone(),
        reason,
    };
    crate::names::gateway_id(&reply.gateway_id).map_err(|e| invalid(e.to_string()))?;
    if let Some(id) = &g.id {
        if *id != reply.gateway_id {
            return Err(invalid(format!(
                "it says it is {:?}, but was given as {id:?}",
                reply.gateway_id
            )));
        }
    }
    let key: [u8; 32] = reply.public_key.as_slice().try_into().map_err(|_| {
        invalid(format!(
            "a {}-byte public key, not 32",
            reply.public_key.len()
        ))
    })?;
    if !reply.key_id.is_empty() && reply.key_id != talos_certs::key_id_for(&key) {
        return Err(invalid("the key id is not its public key's".into()));
    }
    Ok(Conn {
        id: reply.gateway_id,
        public_key_hex: hex::encode(key),
        client,
    })
}

/// An error and its sources, for people.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// A member's `RenewLeasesRequest`: its leases and its whole forwarding
/// table.
fn renew_request(r: &crate::link::MemberRenewal) -> pb::RenewLeasesRequest {
    pb::RenewLeasesRequest {
        read_at_unix_ms: r.read_at_unix_ms,
        leases: r
            .leases
            .iter()
            .map(|(session_id, attempt)| pb::SessionAttempt {
                session_id: session_id.clone(),
                attempt: *attempt,
            })
            .collect(),
        forwarding: r
            .forwarding
            .iter()
            .map(|f| pb::Forwarding {
                session_id: f.session_id.clone(),
                attempt: f.attempt,
                tenant: f.tenant.clone(),
                sources: f.sources.iter().map(|s| s.to_string()).collect(),
                holders: f.holders.clone(),
            })
            .collect(),
    }
}

/// A gRPC status as a link error: a refusal when the gateway answered one,
/// unreachable when no answer came.
fn status_error(gateway: &str, s: tonic::Status) -> LinkError {
    match s.code() {
        Code::InvalidArgument | Code::FailedPrecondition => LinkError::Refused {
            gateway_id: gateway.to_owned(),
            reason: s.message().to_owned(),
        },
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
            LinkError::Unreachable(format!("{gateway}: {:?}: {}", s.code(), s.message()))
        }
        other => LinkError::Refused {
            gateway_id: gateway.to_owned(),
            reason: format!("{other:?}: {}", s.message()),
        },
    }
}

impl GatewayLink for GrpcLink {
    fn distrust(&self, gateway_id: &str) {
        let mut distrusted = self.distrusted.locked();
        if !distrusted.iter().any(|d| d == gateway_id) {
            distrusted.push(gateway_id.to_owned());
        }
    }

    fn describe(&self) -> Vec<Reply<Described>> {
        self.each(None, |c| async move {
            let reply = c
                .client
                .clone()
                .describe(pb::DescribeRequest {})
                .await
                .map_err(|s| status_error(&c.id, s))?
                .into_inner();
            if reply.gateway_id != c.id {
                return Err(LinkError::Invalid {
                    gateway_id: c.id.clone(),
                    reason: format!(
                        "it now says it is {:?}",
                        reply.gateway_id.chars().take(128).collect::<String>()
                    ),
                });
            }
            let key = hex::encode(&reply.public_key);
            if key != c.public_key_hex {
                return Err(LinkError::Invalid {
                    gateway_id: c.id.clone(),
                    reason: "it now signs with another key".into(),
                });
            }
            Ok(Described {
                gateway_id: reply.gateway_id,
                public_key_hex: key,
                instance: reply.instance,
                lease_ms: reply.lease_ms,
                key_binding: reply.key_binding,
            })
        })
    }

    fn open(&self, req: &OpenSession) -> Vec<Reply<Opened>> {
        let mut msg = pb::OpenSessionRequest {
            session_id: req.session_id.clone(),
            attempt: req.attempt,
            tenant: req.tenant.clone(),
            sources: req.sources.iter().map(|s| s.to_string()).collect(),
            allowlist: req.allowlist.clone(),
            attachments: req
                .attachments
                .iter()
                .map(|a| pb::Attachment {
                    secret: a.secret.clone(),
                    destination: a.destination.clone(),
                    header: a.header.clone(),
                    scheme: a.scheme.clone().unwrap_or_default(),
                    value: a.value.to_vec(),
                })
                .collect(),
            cause: req.cause.as_str().to_owned(),
            lock: req
                .lock
                .iter()
                .map(|r| pb::LockRule {
                    id: r.id.clone(),
                    destination: r.destination.clone(),
                    attachment: r.attachment.clone(),
                    method: r.method.clone(),
                    path_prefix: r.path_prefix.clone(),
                    mode: r.mode.as_str().to_owned(),
                    approvers: r.approvers.clone(),
                })
                .collect(),
            relay_public_key: req.relay_public_key.map(|k| k.to_vec()).unwrap_or_default(),
            passthrough: req.passthrough.clone(),
            approver_keys: req
                .people
                .keys
                .iter()
                .map(|k| pb::ApproverKey {
                    owner: k.owner.clone(),
                    credential_id: k.credential_id.clone(),
                    public_key_cose: k.public_key_cose.clone(),
                    sign_count: k.sign_count,
                })
                .collect(),
            rp_id: req.people.rp_id.clone(),
            origin: req.people.origin.clone(),
            lab_approvals: req.people.lab_approvals,
        };
        let shared = Arc::new(msg.clone());
        // Every member but those distrusted (known by the id each stated
        // when it was described).
        let only: Option<Vec<String>> = {
            let distrusted = self.distrusted.locked();
            (!distrusted.is_empty()).then(|| {
                self.clients
                    .locked()
                    .iter()
                    .flatten()
                    .map(|c| c.id.clone())
                    .filter(|id| !distrusted.contains(id))
                    .collect()
            })
        };
        let replies = self.each(only.as_deref(), move |c| {
            let msg = Arc::clone(&shared);
            async move {
                let reply = c
                    .client
                    .clone()
                    .open_session((*msg).clone())
                    .await
                    .map_err(|s| status_error(&c.id, s))?
                    .into_inner();
                let invalid = |reason: String| LinkError::Invalid {
                    gateway_id: c.id.clone(),
                    reason,
                };
                if reply.gateway_id != c.id {
                    return Err(invalid(format!(
                        "the reply names gateway {:?}",
                        reply.gateway_id.chars().take(128).collect::<String>()
                    )));
                }
                if reply.ca_pem.is_empty() || reply.ca_digest.is_empty() {
                    return Err(invalid("the reply has no CA certificate or digest".into()));
                }
                Ok(Opened {
                    gateway_id: c.id.clone(),
                    ca_cert_pem: reply.ca_pem,
                    ca_digest: reply.ca_digest,
                    instance: reply.instance,
                    lease_ms: reply.lease_ms,
                })
            }
        });
        // Wipe the request's copy of the values. (The copies tonic encodes
        // from are freed without wiping: prost's buffers are not ours.)
        for a in &mut msg.attachments {
            zeroize::Zeroize::zeroize(&mut a.value);
        }
        replies
    }

    fn close(&self, req: &CloseSession, only: Option<&[String]>) -> Vec<Reply<CloseAnswer>> {
        let msg = pb::CloseSessionRequest {
            session_id: req.session_id.clone(),
            attempt: req.attempt,
            reason: req.reason.as_str().to_owned(),
        };
        self.each(only, move |c| {
            let msg = msg.clone();
            async move {
                match c.client.clone().close_session(msg).await {
                    Ok(reply) => Ok(CloseAnswer::Report(report_view(&c.id, reply.into_inner())?)),
                    Err(s) if s.code() == Code::NotFound => Ok(CloseAnswer::NotHeld {
                        instance: instance_in(s.message()),
                        message: s.message().chars().take(300).collect(),
                    }),
                    Err(s) => Err(status_error(&c.id, s)),
                }
            }
        })
    }

    fn renew(&self, renewals: &[crate::link::MemberRenewal]) -> Vec<Reply<Renewed>> {
        let only: Vec<String> = renewals.iter().map(|r| r.gateway.clone()).collect();
        let renewals: Arc<Vec<crate::link::MemberRenewal>> = Arc::new(renewals.to_vec());
        self.each(Some(&only), move |c| {
            let renewals = Arc::clone(&renewals);
            async move {
                let request = renewals
                    .iter()
                    .find(|r| r.gateway == c.id)
                    .map(renew_request)
                    .unwrap_or_default();
                let reply = c
                    .client
                    .clone()
                    .renew_leases(request)
                    .await
                    .map_err(|s| status_error(&c.id, s))?
                    .into_inner();
                let pairs = |v: Vec<pb::SessionAttempt>| {
                    v.into_iter().map(|l| (l.session_id, l.attempt)).collect()
                };
                Ok(Renewed {
                    renewed: pairs(reply.renewed),
                    not_held: pairs(reply.not_held),
                    instance: reply.instance,
                    lease_ms: reply.lease_ms,
                    forwarding_taken: reply.forwarding_taken,
                })
            }
        })
    }

    fn decide(
        &self,
        gateway_id: &str,
        decision: &talos_certs::Signed,
    ) -> Result<String, LinkError> {
        let msg = pb::Signed {
            kind: decision.kind.as_str().to_owned(),
            key_id: decision.key_id.clone(),
            payload: decision.payload.clone(),
            signature: decision.signature.clone(),
        };
        let only = [gateway_id.to_owned()];
        let replies = self.each(Some(&only), move |c| {
            let msg = msg.clone();
            async move {
                let reply = c
                    .client
                    .clone()
                    .decide(msg)
                    .await
                    .map_err(|s| status_error(&c.id, s))?
                    .into_inner();
                match reply.outcome.as_str() {
                    "released" | "refused" => Ok(reply.outcome),
                    other => Err(LinkError::Invalid {
                        gateway_id: c.id.clone(),
                        reason: format!(
                            "the outcome {:?} is neither released nor refused",
                            other.chars().take(40).collect::<String>()
                        ),
                    }),
                }
            }
        });
        replies
            .into_iter()
            .find(|r| r.member == gateway_id)
            .map(|r| r.result)
            .unwrap_or_else(|| {
                Err(LinkError::Unreachable(format!(
                    "gateway {gateway_id} is not among the gateways given (--gateway {gateway_id}=ADDR)"
                )))
            })
    }
}

/// The instance a gateway's `NOT_FOUND` message names ("… instance X …").
fn instance_in(message: &str) -> Option<String> {
    let rest = message.split("instance ").nth(1)?;
    let id: String = rest.chars().take_while(char::is_ascii_hexdigit).collect();
    (id.len() == 16).then_some(id)
}

/// A close reply as a [`DropReportView`]: the fields read from the signed
/// payload (unverified here; the [`ReportVerifier`] checks them), and the
/// envelope as JSON in `signed`.
fn report_view(
    gateway_id: &str,
    reply: pb::CloseSessionReply,
) -> Result<DropReportView, LinkError> {
    let invalid = |reason: String| LinkError::Invalid {
        gateway_id: gateway_id.to_owned(),
        reason,
    };
    let env = reply
        .drop_report
        .ok_or_else(|| invalid("the reply has no drop report".into()))?;
    if env.kind != talos_certs::Kind::DropReport.as_str() {
        return Err(invalid(format!(
            "the report is a signed {:?}, not a drop_report",
            env.kind.chars().take(40).collect::<String>()
        )));
    }
    if env.payload.len() > talos_certs::MAX_REPORT_LEN {
        return Err(invalid("the report is over the size limit".into()));
    }
    let report: talos_certs::DropReport = serde_json::from_slice(&env.payload)
        .map_err(|e| invalid(format!("the report does not parse: {e}")))?;
    if report.gateway_id != gateway_id {
        return Err(invalid(format!(
            "the report names gateway {:?}",
            report.gateway_id.chars().take(128).collect::<String>()
        )));
    }
    let signed = talos_certs::Signed {
        kind: talos_certs::Kind::DropReport,
        key_id: env.key_id,
        payload: env.payload,
        signature: env.signature,
    };
    let signed = serde_json::to_vec(&signed).map_err(|e| invalid(e.to_string()))?;
    Ok(DropReportView {
        gateway_id: report.gateway_id,
        instance: report.instance,
        session_id: report.session_id,
        attempt: report.attempt,
        reason: report.reason.as_str().to_owned(),
        ca_digest: report.ca_digest,
        secrets: report.secrets,
        signed,
    })
}

/// The members a call reaches, as `GrpcLink` takes them: every stored
/// member (`gateway add`) as `ID=ADDR`, each replaced by a `--gateway`
/// that names the same id, then every other `--gateway` as given.
pub fn merge_targets(stored: &[Member], overrides: &[String]) -> Vec<String> {
    let ids = override_ids(overrides);
    let mut targets: Vec<String> = stored
        .iter()
        .filter(|m| !ids.contains(&m.id))
        .map(|m| format!("{}={}", m.id, m.control))
        .collect();
    targets.extend(overrides.iter().cloned());
    targets
}

/// The ids `--gateway ID=ADDR` names.
pub fn override_ids(overrides: &[String]) -> Vec<String> {
    overrides
        .iter()
        .filter_map(|g| g.split_once('=').map(|(id, _)| id.to_owned()))
        .collect()
}
