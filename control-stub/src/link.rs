//! The control stub's side of the control channel: what it asks of the
//! gateways of a pair, and what they answer.
//!
//! [`GatewayLink`] is the seam between the session state machine and the
//! network: the state machine calls it inside the store transaction of each
//! transition, so a link that fails leaves the store as it was. One
//! implementation lives here, the real one in [`crate::grpc_link`], and the
//! tests' in `fake` (feature `test-util`):
//!
//! - [`UnavailableLink`]: every call fails `gateway_unreachable`.
//! - [`GrpcLink`](crate::grpc_link::GrpcLink), what the `control-stub`
//!   command uses: the `Gateway` gRPC service over mutual TLS.
//! - `FakeLink`, for tests: it records every call, answers with made-up CA
//!   certificates whose digests are right, and reports drops that match what
//!   it opened — unless told to fail or to tamper with a report.
//!
//! Drop reports are signed by the gateway that made them. Checking that
//! signature is a [`ReportVerifier`]'s job, kept apart from the link so that
//! a link cannot vouch for its own answers.

use std::fmt;
use std::net::IpAddr;

use zeroize::Zeroizing;

use crate::error::LinkError;
use crate::lock::LockRule;
use crate::model::{CloseReason, OpenCause};
use crate::names::AttachSpec;

/// Opens and drops a session's authority on every gateway of the pair.
///
/// # Contract
///
/// - `open` succeeds only when every gateway of the pair opened; on an
///   error no gateway keeps the authority (an implementation undoes a
///   partial open itself).
/// - `close` returns one report per gateway that held the authority. The
///   state machine checks the reports; it does not trust the link for them.
/// - Calls are bounded in time by the implementation: the state machine
///   holds the store's write lock while it waits (see
///   [`crate::store::BUSY_TIMEOUT`]).
pub trait GatewayLink {
    /// Open (launch/resume/recovery) a session's authority on every gateway
    /// of the pair; returns, per gateway, its id and the new CA certificate
    /// PEM with its SHA-384 digest.
    fn open(&self, req: &OpenSession) -> Result<Vec<Opened>, LinkError>;

    /// Drop a session's authority (pause/interruption/end/Revoke All);
    /// returns, per gateway, its signed drop report (the signed bytes and
    /// the fields parsed from them).
    fn close(&self, req: &CloseSession) -> Result<Vec<DropReportView>, LinkError>;

    /// Who each gateway is: its id and the public key that signs its
    /// reports and batches, for registration at first contact. A link
    /// without that knowledge (a fake) answers none.
    fn describe(&self) -> Result<Vec<Described>, LinkError> {
        Ok(Vec::new())
    }

    /// Deliver the relay's signed decision (kind `decision`) to the gateway
    /// `gateway_id`, which holds the proposal; returns the gateway's
    /// outcome (`released` or `refused`).
    fn decide(&self, gateway_id: &str, decision: &talos_certs::Signed)
        -> Result<String, LinkError>;
}

/// One gateway's answer to [`GatewayLink::describe`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described {
    pub gateway_id: String,
    /// Its Ed25519 public key, lowercase hex (64 digits).
    pub public_key_hex: String,
}

/// What a gateway needs to serve a session's attempt.
#[derive(Clone, Debug)]
pub struct OpenSession {
    pub session_id: String,
    /// The attempt, numbered from 1.
    pub attempt: u32,
    pub tenant: String,
    /// The addresses the session's connections come from.
    pub sources: Vec<IpAddr>,
    /// Canonical destination names the session may reach.
    pub allowlist: Vec<String>,
    /// Each attachment with its value, read from the secret store for this
    /// attempt.
    pub attachments: Vec<Attachment>,
    pub cause: OpenCause,
    /// The account's Lock rules as they stand at this open.
    pub lock: Vec<LockRule>,
    /// The approval relay's Ed25519 public key; `None`: no relay (the
    /// gateway then refuses a held request `approval_declined` at once).
    pub relay_public_key: Option<[u8; 32]>,
}

/// An attachment with its value: the only type here that holds one.
///
/// `Debug` prints the value's length only; the value is zeroed on drop.
#[derive(Clone)]
pub struct Attachment {
    pub secret: String,
    pub destination: String,
    pub header: String,
    pub scheme: Option<String>,
    pub value: Zeroizing<Vec<u8>>,
}

impl Attachment {
    /// The attachment without its value.
    pub fn spec(&self) -> AttachSpec {
        AttachSpec {
            secret: self.secret.clone(),
            destination: self.destination.clone(),
            header: self.header.clone(),
            scheme: self.scheme.clone(),
        }
    }
}

impl fmt::Debug for Attachment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attachment")
            .field("secret", &self.secret)
            .field("destination", &self.destination)
            .field("header", &self.header)
            .field("scheme", &self.scheme)
            .field(
                "value",
                &format_args!("<redacted, {} bytes>", self.value.len()),
            )
            .finish()
    }
}

/// One gateway's answer to [`GatewayLink::open`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Opened {
    pub gateway_id: String,
    /// The session CA's certificate, PEM (the session trusts it).
    pub ca_cert_pem: String,
    /// SHA-384 of the certificate's DER, lowercase hex, as the gateway
    /// states it. The control stub recomputes it from the PEM.
    pub ca_digest: String,
}

/// Drop a session's authority.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloseSession {
    pub session_id: String,
    /// The attempt whose authority is dropped.
    pub attempt: u32,
    pub reason: CloseReason,
}

/// One gateway's signed drop report: the signed bytes and the fields the
/// link parsed from them. The fields count only once a [`ReportVerifier`]
/// has checked the signature over `signed`.
#[derive(Clone, PartialEq, Eq)]
pub struct DropReportView {
    pub gateway_id: String,
    pub session_id: String,
    pub attempt: u32,
    /// The digest of the CA the gateway dropped.
    pub ca_digest: String,
    /// The name of every secret value the gateway dropped.
    pub secrets: Vec<String>,
    /// The report as the gateway signed it (opaque to the control stub).
    pub signed: Vec<u8>,
}

impl fmt::Debug for DropReportView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DropReportView")
            .field("gateway_id", &self.gateway_id)
            .field("session_id", &self.session_id)
            .field("attempt", &self.attempt)
            .field("ca_digest", &self.ca_digest)
            .field("secrets", &self.secrets)
            .field("signed", &format_args!("<{} bytes>", self.signed.len()))
            .finish()
    }
}

/// Checks a drop report's signature.
pub trait ReportVerifier {
    /// Check that `report.signed` is signed by the gateway `report` names,
    /// whose registered public key (hex) is `gateway_key` (`None` when that
    /// gateway is not registered), and that it says what `report`'s fields
    /// say. The error says why not, for people.
    fn verify(&self, report: &DropReportView, gateway_key: Option<&str>) -> Result<(), String>;

    /// What this verifier checks, for the reset step's response.
    fn describe(&self) -> &'static str;
}

/// A verifier that refuses every report: what runs where no gateway key
/// check is available, so that no unchecked report ever confirms a step.
#[derive(Clone, Copy, Debug, Default)]
pub struct RefuseReports;

impl ReportVerifier for RefuseReports {
    fn verify(&self, _report: &DropReportView, _gateway_key: Option<&str>) -> Result<(), String> {
        Err("no drop report signature check is available".into())
    }

    fn describe(&self) -> &'static str {
        "none available: every report is refused"
    }
}

/// A link that reaches no gateway: every call fails `gateway_unreachable`,
/// naming the addresses it was given.
#[derive(Clone, Debug, Default)]
pub struct UnavailableLink {
    gateways: Vec<String>,
}

impl UnavailableLink {
    /// A link to `gateways` (addresses as given with `--gateway`).
    pub fn new(gateways: Vec<String>) -> UnavailableLink {
        UnavailableLink { gateways }
    }

    fn error(&self) -> LinkError {
        if self.gateways.is_empty() {
            LinkError::Unreachable("no gateway given (--gateway ADDR)".into())
        } else {
            LinkError::Unreachable(format!(
                "cannot reach {}: this control stub has no control channel client yet",
                self.gateways.join(", ")
            ))
        }
    }
}

impl GatewayLink for UnavailableLink {
    fn open(&self, _req: &OpenSession) -> Result<Vec<Opened>, LinkError> {
        Err(self.error())
    }

    fn close(&self, _req: &CloseSession) -> Result<Vec<DropReportView>, LinkError> {
        Err(self.error())
    }

    fn decide(
        &self,
        _gateway_id: &str,
        _decision: &talos_certs::Signed,
    ) -> Result<String, LinkError> {
        Err(self.error())
    }
}
