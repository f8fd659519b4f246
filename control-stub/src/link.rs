//! The control stub's side of the control channel: what it asks of the
//! gateways of a pair, and what they answer.
//!
//! [`GatewayLink`] is the seam between the session state machine and the
//! network: every call reaches each member of the pair at once and answers
//! per member, so one member down or hung holds up nothing. One
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

/// Reaches each gateway of the pair: every call goes to every member (or
/// the members named) at once, and answers per member.
///
/// # Contract
///
/// - Each member answers, or fails, within a deadline the implementation
///   sets: one member that is down or hung never holds up the others or
///   the caller for longer than that.
/// - A member is named by its gateway id when known (given as `ID=ADDR`,
///   or stated by the member), else by its address as given.
/// - Nothing here decides what an answer means: the state machine checks
///   reports (through a [`ReportVerifier`]) and keeps the closes it still
///   owes.
pub trait GatewayLink {
    /// Who each member is: its id, the public key that signs its reports
    /// and batches, its process instance and the lease it gives.
    fn describe(&self) -> Vec<Reply<Described>>;

    /// Open (launch/resume/recovery) a session's authority on every
    /// member.
    fn open(&self, req: &OpenSession) -> Vec<Reply<Opened>>;

    /// Drop a session's authority on the members `only` names (every
    /// member when `None`).
    fn close(&self, req: &CloseSession, only: Option<&[String]>) -> Vec<Reply<CloseAnswer>>;

    /// Renew leases: for each member named, the (session, attempt) pairs
    /// the control plane holds live there, and the member's whole
    /// forwarding table (which replaces the one it has).
    fn renew(&self, renewals: &[MemberRenewal]) -> Vec<Reply<Renewed>>;

    /// Deliver the relay's signed decision (kind `decision`) to the gateway
    /// `gateway_id`, which holds the proposal; returns the gateway's
    /// outcome (`released` or `refused`).
    fn decide(&self, gateway_id: &str, decision: &talos_certs::Signed)
        -> Result<String, LinkError>;

    /// From now on open no authority on member `gateway_id`: it signs with
    /// a key other than the one registered for its id, so nothing it says
    /// (its drop reports, its batches) can be trusted, and an authority
    /// opened there could never be confirmed ended. Closes still reach it.
    fn distrust(&self, _gateway_id: &str) {}
}

/// The member a link given no gateway answers as (its one reply says so):
/// no gateway, so nothing is owed to it.
pub const NO_GATEWAY: &str = "(none)";

/// What one member is told at a renewal: the (session, attempt) pairs
/// whose leases it is asked to renew, and its whole forwarding table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberRenewal {
    /// The member, by gateway id.
    pub gateway: String,
    pub leases: Vec<(String, u32)>,
    /// Every live session other members hold and this one does not: the
    /// member forwards its connections, untouched, to a holder. The list
    /// replaces the member's table (empty: every entry withdrawn).
    pub forwarding: Vec<Forwarding>,
    /// When the store was read for this renewal (the wall clock, ms since
    /// the Unix epoch): the member's leases run from then, not from when
    /// the call arrives, so a renewal held up on its way grants no more
    /// than one lease past the read.
    pub read_at_unix_ms: u64,
}

/// One entry of a member's forwarding table: a running session's latest
/// attempt, held live by other members of the pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forwarding {
    pub session_id: String,
    pub attempt: u32,
    pub tenant: String,
    /// The session's source addresses.
    pub sources: Vec<IpAddr>,
    /// The members holding the attempt live, by gateway id, sorted.
    pub holders: Vec<String>,
}

/// One member's answer.
#[derive(Clone, Debug)]
pub struct Reply<T> {
    /// The member: its gateway id when known, else its address as given.
    pub member: String,
    pub result: Result<T, LinkError>,
}

/// A member's answer to a close.
#[derive(Clone, Debug)]
pub enum CloseAnswer {
    /// The signed drop report (also for an authority the member ended
    /// earlier: a lapse, a replacement, a close whose answer was lost).
    Report(DropReportView),
    /// The member's running process never held the attempt (`NOT_FOUND`):
    /// not a confirmation by itself; `instance` is the process that said
    /// so, when known.
    NotHeld {
        instance: Option<String>,
        message: String,
    },
}

/// One member's answer to [`GatewayLink::renew`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Renewed {
    pub renewed: Vec<(String, u32)>,
    /// Not held live by the member (never opened there, ended, lapsed):
    /// not renewed, and never will be.
    pub not_held: Vec<(String, u32)>,
    pub instance: String,
    pub lease_ms: u64,
    /// Forwarding entries the member took (the rest it found invalid or
    /// naming no peer it is configured with, and logged).
    pub forwarding_taken: u32,
}

/// One gateway's answer to [`GatewayLink::describe`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described {
    pub gateway_id: String,
    /// Its Ed25519 public key, lowercase hex (64 digits).
    pub public_key_hex: String,
    /// Its running process.
    pub instance: String,
    pub lease_ms: u64,
    /// Its signing key bound to its role and id under the control CA
    /// (talos-certs `KeyBinding`, JSON), as it gave it; empty when none.
    pub key_binding: Vec<u8>,
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
    /// The names of `allowlist` the account marks passthrough: passed on
    /// without termination (none carries an attachment or a Lock rule).
    pub passthrough: Vec<String>,
    /// The passkeys of the approvers the Lock rules name, the web app's
    /// relying party and the lab setting (`crate::people::open`).
    pub people: OpenPeople,
}

/// What an open tells the gateways of the people who decide (issue 42).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenPeople {
    /// Every passkey of every approver a Lock rule names.
    pub keys: Vec<ApproverKey>,
    /// The web app's rp id and origin; empty when `serve` never ran it.
    pub rp_id: String,
    pub origin: String,
    /// The account's lab setting for approvals.
    pub lab_approvals: bool,
}

/// One passkey of an approver: public material only.
#[derive(Clone, PartialEq, Eq)]
pub struct ApproverKey {
    pub owner: String,
    pub credential_id: Vec<u8>,
    pub public_key_cose: Vec<u8>,
    pub sign_count: u32,
}

impl std::fmt::Debug for ApproverKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApproverKey")
            .field("owner", &self.owner)
            .field("credential_id", &self.credential_id.len())
            .field("public_key_cose", &self.public_key_cose.len())
            .field("sign_count", &self.sign_count)
            .finish()
    }
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
    /// The gateway process that made it.
    pub instance: String,
    /// The lease the authority has from now, in milliseconds.
    pub lease_ms: u64,
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
    /// The gateway process that held the authority.
    pub instance: String,
    pub session_id: String,
    pub attempt: u32,
    /// Why the gateway dropped it, as it reports (`pause`, …,
    /// `lease_expired`, `replaced`, `shutdown`).
    pub reason: String,
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
            .field("instance", &self.instance)
            .field("session_id", &self.session_id)
            .field("attempt", &self.attempt)
            .field("reason", &self.reason)
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
    fn describe(&self) -> Vec<Reply<Described>> {
        self.each()
    }

    fn open(&self, _req: &OpenSession) -> Vec<Reply<Opened>> {
        self.each()
    }

    fn close(&self, _req: &CloseSession, _only: Option<&[String]>) -> Vec<Reply<CloseAnswer>> {
        self.each()
    }

    fn renew(&self, _renewals: &[MemberRenewal]) -> Vec<Reply<Renewed>> {
        self.each()
    }

    fn decide(
        &self,
        _gateway_id: &str,
        _decision: &talos_certs::Signed,
    ) -> Result<String, LinkError> {
        Err(self.error())
    }
}

impl UnavailableLink {
    fn each<T>(&self) -> Vec<Reply<T>> {
        self.gateways
            .iter()
            .map(|g| Reply {
                member: g.clone(),
                result: Err(self.error()),
            })
            .collect()
    }
}
