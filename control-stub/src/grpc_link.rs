//! The real control channel client: [`GrpcLink`], a [`GatewayLink`] that
//! speaks the `Gateway` gRPC service to each gateway of the pair over
//! mutual TLS 1.3, and [`SignatureVerifier`], the [`ReportVerifier`] that
//! checks drop reports under the gateways' registered keys.
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
//! single-threaded tokio runtime and blocks on each call, bounded by
//! [`CONNECT_TIMEOUT`] and [`RPC_TIMEOUT`].

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
    CloseSession, Described, DropReportView, GatewayLink, OpenSession, Opened, ReportVerifier,
};
use crate::pb;
use crate::pb::gateway_client::GatewayClient;
use crate::store::ed25519_key;

/// How long a connection (TCP and TLS) to a gateway may take: a gateway on
/// the same network answers in milliseconds; more means it is down.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long one call may take. A transition holds the store's write lock
/// while it waits (see [`crate::store::BUSY_TIMEOUT`], 10 s), and an open
/// makes a CA (milliseconds) on each gateway in turn.
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

    fn label(&self) -> String {
        self.id.clone().unwrap_or_else(|| self.addr.clone())
    }
}

/// The control channel client (see the module docs).
pub struct GrpcLink {
    gateways: Vec<GatewayAddr>,
    control_dir: Option<std::path::PathBuf>,
    runtime: tokio::runtime::Runtime,
    /// Connected clients, made at first use, with the id each gateway
    /// stated (checked against `ID=` when given).
    clients: Mutex<Option<Vec<Conn>>>,
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
            clients: Mutex::new(None),
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

    fn conns(&self) -> Result<Vec<Conn>, LinkError> {
        let mut cached = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cached.as_ref() {
            return Ok(c.clone());
        }
        if self.gateways.is_empty() {
            return Err(LinkError::Unreachable(
                "no gateway given (--gateway [ID=]ADDR)".into(),
            ));
        }
        let tls = self.tls()?;
        let conns = self.runtime.block_on(async {
            let mut out = Vec::new();
            for g in &self.gateways {
                out.push(connect(g, tls.clone()).await?);
            }
            Ok::<_, LinkError>(out)
        })?;
        for (i, c) in conns.iter().enumerate() {
            if conns[..i].iter().any(|o| o.id == c.id) {
                return Err(LinkError::Invalid {
                    gateway_id: c.id.clone(),
                    reason: "two addresses answer as the same gateway".into(),
                });
            }
        }
        *cached = Some(conns.clone());
        Ok(conns)
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
    fn open(&self, req: &OpenSession) -> Result<Vec<Opened>, LinkError> {
        let conns = self.conns()?;
        let msg = pb::OpenSessionRequest {
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
        };
        let result = self.runtime.block_on(async {
            let mut opened: Vec<Opened> = Vec::new();
            let mut failure = None;
            for c in &conns {
                let mut client = c.client.clone();
                match client.open_session(msg.clone()).await {
                    Ok(reply) => {
                        let reply = reply.into_inner();
                        if reply.gateway_id != c.id {
                            // It opened, whatever it calls itself: undo below.
                            opened.push(Opened {
                                gateway_id: c.id.clone(),
                                ca_cert_pem: String::new(),
                                ca_digest: String::new(),
                            });
                            failure = Some(LinkError::Invalid {
                                gateway_id: c.id.clone(),
                                reason: format!(
                                    "the reply names gateway {:?}",
                                    reply.gateway_id.chars().take(128).collect::<String>()
                                ),
                            });
                            break;
                        }
                        if reply.ca_pem.is_empty() || reply.ca_digest.is_empty() {
                            opened.push(Opened {
                                gateway_id: c.id.clone(),
                                ca_cert_pem: String::new(),
                                ca_digest: String::new(),
                            });
                            failure = Some(LinkError::Invalid {
                                gateway_id: c.id.clone(),
                                reason: "the reply has no CA certificate or digest".into(),
                            });
                            break;
                        }
                        opened.push(Opened {
                            gateway_id: c.id.clone(),
                            ca_cert_pem: reply.ca_pem,
                            ca_digest: reply.ca_digest,
                        });
                    }
                    Err(s) => {
                        failure = Some(status_error(&c.id, s));
                        break;
                    }
                }
            }
            if let Some(e) = failure {
                // Close what opened, so no gateway keeps an authority the
                // store will not know. Best effort: their answers change
                // nothing.
                for o in &opened {
                    if let Some(c) = conns.iter().find(|c| c.id == o.gateway_id) {
                        let _ = c
                            .client
                            .clone()
                            .close_session(pb::CloseSessionRequest {
                                session_id: req.session_id.clone(),
                                attempt: req.attempt,
                                reason: "end".into(),
                            })
                            .await;
                    }
                }
                return Err(e);
            }
            Ok(opened)
        });
        // Wipe the request's copy of the values. (The copies tonic encodes
        // from are freed without wiping: prost's buffers are not ours.)
        let mut msg = msg;
        for a in &mut msg.attachments {
            zeroize::Zeroize::zeroize(&mut a.value);
        }
        result
    }

    fn close(&self, req: &CloseSession) -> Result<Vec<DropReportView>, LinkError> {
        let conns = self.conns()?;
        let msg = pb::CloseSessionRequest {
            session_id: req.session_id.clone(),
            attempt: req.attempt,
            reason: req.reason.as_str().to_owned(),
        };
        self.runtime.block_on(async {
            let mut out = Vec::new();
            for c in &conns {
                let reply = c
                    .client
                    .clone()
                    .close_session(msg.clone())
                    .await
                    .map_err(|s| status_error(&c.id, s))?
                    .into_inner();
                out.push(report_view(&c.id, reply)?);
            }
            Ok(out)
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
        // A gateway given as `ID=ADDR` is reached alone; otherwise every
        // gateway is asked who it is, to find the one that proposed.
        let cached = self
            .clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let conn = match cached {
            Some(conns) => conns.into_iter().find(|c| c.id == gateway_id),
            None => match self
                .gateways
                .iter()
                .find(|g| g.id.as_deref() == Some(gateway_id))
            {
                Some(g) => {
                    let tls = self.tls()?;
                    Some(self.runtime.block_on(connect(g, tls))?)
                }
                None => self.conns()?.into_iter().find(|c| c.id == gateway_id),
            },
        };
        let conn = conn.ok_or_else(|| {
            LinkError::Unreachable(format!(
                "gateway {gateway_id} is not among the gateways given (--gateway {gateway_id}=ADDR)"
            ))
        })?;
        let reply = self
            .runtime
            .block_on(conn.client.clone().decide(msg))
            .map_err(|s| status_error(&conn.id, s))?
            .into_inner();
        match reply.outcome.as_str() {
            "released" | "refused" => Ok(reply.outcome),
            other => Err(LinkError::Invalid {
                gateway_id: conn.id,
                reason: format!(
                    "the outcome {:?} is neither released nor refused",
                    other.chars().take(40).collect::<String>()
                ),
            }),
        }
    }

    fn describe(&self) -> Result<Vec<Described>, LinkError> {
        Ok(self
            .conns()?
            .into_iter()
            .map(|c| Described {
                gateway_id: c.id,
                public_key_hex: c.public_key_hex,
            })
            .collect())
    }
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
        session_id: report.session_id,
        attempt: report.attempt,
        ca_digest: report.ca_digest,
        secrets: report.secrets,
        signed,
    })
}

/// Checks a drop report's Ed25519 signature under the gateway's registered
/// key (talos-certs `verify_drop_report`, which also insists on the
/// canonical encoding), and that the signed report says exactly what the
/// view's fields say.
///
/// `report.signed` is the signed envelope as JSON (talos-certs `Signed`),
/// as [`GrpcLink`] makes it.
#[derive(Clone, Copy, Debug, Default)]
pub struct SignatureVerifier;

impl ReportVerifier for SignatureVerifier {
    fn verify(&self, report: &DropReportView, gateway_key: Option<&str>) -> Result<(), String> {
        let key_hex = gateway_key
            .ok_or_else(|| format!("gateway {} is not registered", report.gateway_id))?;
        let key = ed25519_key(key_hex).ok_or_else(|| {
            format!(
                "the registered key of gateway {} is not an Ed25519 public key",
                report.gateway_id
            )
        })?;
        let signed: talos_certs::Signed = serde_json::from_slice(&report.signed)
            .map_err(|e| format!("the signed report does not parse: {e}"))?;
        let signed_report =
            talos_certs::verify_drop_report(&key, &signed).map_err(|e| e.to_string())?;
        let mut view_secrets = report.secrets.clone();
        view_secrets.sort();
        view_secrets.dedup();
        let same = signed_report.gateway_id == report.gateway_id
            && signed_report.session_id == report.session_id
            && signed_report.attempt == report.attempt
            && signed_report.ca_digest == report.ca_digest
            && signed_report.secrets == view_secrets;
        if same {
            Ok(())
        } else {
            Err("the signed report does not say what its fields say".into())
        }
    }

    fn describe(&self) -> &'static str {
        "Ed25519 signature under the gateway's registered key (talos-certs verify_drop_report); fields as signed"
    }
}
