//! The control stub's side of the control channel: what it asks of the
//! gateways of a pair, and what they answer.
//!
//! [`GatewayLink`] is the seam between the session state machine and the
//! network: the state machine calls it inside the store transaction of each
//! transition, so a link that fails leaves the store as it was. Two
//! implementations live here, and the real one in [`crate::grpc_link`]:
//!
//! - [`FakeLink`], for tests: it records every call, answers with made-up CA
//!   certificates whose digests are right, and reports drops that match what
//!   it opened — unless told to fail or to tamper with a report.
//! - [`UnavailableLink`]: every call fails `gateway_unreachable`.
//! - [`GrpcLink`](crate::grpc_link::GrpcLink), what the `control-stub`
//!   command uses: the `Gateway` gRPC service over mutual TLS.
//!
//! Drop reports are signed by the gateway that made them. Checking that
//! signature is a [`ReportVerifier`]'s job, kept apart from the link so that
//! a link cannot vouch for its own answers.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};

use base64::Engine as _;
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

/// A verifier for tests: accepts every report, or refuses every one.
#[derive(Clone, Copy, Debug)]
pub struct FakeVerifier {
    accept: bool,
}

impl FakeVerifier {
    /// Accepts every report without checking anything.
    pub const fn accepting() -> FakeVerifier {
        FakeVerifier { accept: true }
    }

    /// Refuses every report, as if every signature were bad.
    pub const fn refusing() -> FakeVerifier {
        FakeVerifier { accept: false }
    }
}

impl ReportVerifier for FakeVerifier {
    fn verify(&self, _report: &DropReportView, _gateway_key: Option<&str>) -> Result<(), String> {
        if self.accept {
            Ok(())
        } else {
            Err("the signature does not verify (test verifier refuses every report)".into())
        }
    }

    fn describe(&self) -> &'static str {
        if self.accept {
            "test verifier: accepts every report unchecked"
        } else {
            "test verifier: refuses every report"
        }
    }
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

/// One call [`FakeLink`] received.
#[derive(Clone, Debug)]
pub enum Call {
    Open(OpenSession),
    Close(CloseSession),
    /// A decision delivered to a gateway: its id and the signed envelope.
    Decide {
        gateway_id: String,
        decision: talos_certs::Signed,
    },
}

/// How [`FakeLink`] spoils the first report of its next close.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tamper {
    /// The report names another CA digest.
    WrongDigest,
    /// The report leaves this secret name out.
    OmitSecret(String),
    /// The report names another attempt.
    WrongAttempt,
}

/// A stand-in for a gateway pair, for tests.
///
/// Each gateway "makes" a CA per open: the certificate is made-up bytes in a
/// PEM wrapper, and its digest is the true SHA-384 of those bytes, so the
/// control stub's digest check runs for real. A close reports, per gateway,
/// the digest and secret names it opened — a gateway that holds no
/// authority for the session refuses, as a real one would.
#[derive(Debug)]
pub struct FakeLink {
    state: Mutex<FakeState>,
}

#[derive(Debug, Default)]
struct FakeState {
    gateways: Vec<String>,
    calls: Vec<Call>,
    failure: Option<LinkError>,
    tamper: Option<Tamper>,
    /// (session, gateway) → what that gateway holds for the session.
    live: BTreeMap<(String, String), Live>,
    serial: u64,
}

#[derive(Debug)]
struct Live {
    attempt: u32,
    digest: String,
    secrets: Vec<String>,
}

impl Default for FakeLink {
    fn default() -> FakeLink {
        FakeLink::new(&["gw-a", "gw-b"])
    }
}

impl FakeLink {
    /// A pair (or any number) of fake gateways with these ids.
    pub fn new(gateways: &[&str]) -> FakeLink {
        FakeLink {
            state: Mutex::new(FakeState {
                gateways: gateways.iter().map(|g| (*g).to_owned()).collect(),
                ..FakeState::default()
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// The last open call, if any.
    pub fn last_open(&self) -> Option<OpenSession> {
        self.state().calls.iter().rev().find_map(|c| match c {
            Call::Open(o) => Some(o.clone()),
            Call::Close(_) | Call::Decide { .. } => None,
        })
    }

    /// Every decision delivered so far: (gateway id, signed envelope).
    pub fn decisions(&self) -> Vec<(String, talos_certs::Signed)> {
        self.state()
            .calls
            .iter()
            .filter_map(|c| match c {
                Call::Decide {
                    gateway_id,
                    decision,
                } => Some((gateway_id.clone(), decision.clone())),
                Call::Open(_) | Call::Close(_) => None,
            })
            .collect()
    }

    /// Fail every call with `error` from now on (`None`: answer again).
    /// A failing call changes nothing on the fake gateways.
    pub fn fail_with(&self, error: Option<LinkError>) {
        self.state().failure = error;
    }

    /// Spoil the first report of the next close.
    pub fn tamper_next_close(&self, tamper: Tamper) {
        self.state().tamper = Some(tamper);
    }

    /// Whether some fake gateway holds an authority for `session_id`.
    pub fn holds(&self, session_id: &str) -> bool {
        self.state().live.keys().any(|(s, _)| s == session_id)
    }
}

impl GatewayLink for FakeLink {
    fn open(&self, req: &OpenSession) -> Result<Vec<Opened>, LinkError> {
        let mut st = self.state();
        st.calls.push(Call::Open(req.clone()));
        if let Some(e) = &st.failure {
            return Err(e.clone());
        }
        let mut secrets: Vec<String> = req.attachments.iter().map(|a| a.secret.clone()).collect();
        secrets.sort();
        secrets.dedup();
        let mut out = Vec::new();
        for gateway_id in st.gateways.clone() {
            st.serial += 1;
            let der = format!(
                "fake session CA: gateway {gateway_id}, session {}, attempt {}, serial {}",
                req.session_id, req.attempt, st.serial
            )
            .into_bytes();
            let digest = talos_certs::sha384_hex(&der);
            st.live.insert(
                (req.session_id.clone(), gateway_id.clone()),
                Live {
                    attempt: req.attempt,
                    digest: digest.clone(),
                    secrets: secrets.clone(),
                },
            );
            out.push(Opened {
                gateway_id,
                ca_cert_pem: pem(&der),
                ca_digest: digest,
            });
        }
        Ok(out)
    }

    fn decide(
        &self,
        gateway_id: &str,
        decision: &talos_certs::Signed,
    ) -> Result<String, LinkError> {
        self.take_decision(gateway_id, decision)
    }

    fn close(&self, req: &CloseSession) -> Result<Vec<DropReportView>, LinkError> {
        let mut st = self.state();
        st.calls.push(Call::Close(req.clone()));
        if let Some(e) = &st.failure {
            return Err(e.clone());
        }
        let gateways = st.gateways.clone();
        if let Some(g) = gateways.iter().find(|g| {
            !st.live
                .contains_key(&(req.session_id.clone(), (*g).clone()))
        }) {
            return Err(LinkError::Refused {
                gateway_id: g.clone(),
                reason: format!("no authority for session {}", req.session_id),
            });
        }
        let mut tamper = st.tamper.take();
        let mut out = Vec::new();
        for gateway_id in gateways {
            let Some(live) = st
                .live
                .remove(&(req.session_id.clone(), gateway_id.clone()))
            else {
                continue;
            };
            let mut report = DropReportView {
                gateway_id,
                session_id: req.session_id.clone(),
                attempt: live.attempt,
                ca_digest: live.digest,
                secrets: live.secrets,
                signed: Vec::new(),
            };
            match tamper.take() {
                None => {}
                Some(Tamper::WrongDigest) => report.ca_digest = talos_certs::sha384_hex(b"other"),
                Some(Tamper::OmitSecret(name)) => report.secrets.retain(|s| *s != name),
                Some(Tamper::WrongAttempt) => report.attempt += 1,
            }
            report.signed = format!(
                "fake drop report: gateway {} session {} attempt {} reason {} ca {} secrets {}",
                report.gateway_id,
                report.session_id,
                report.attempt,
                req.reason,
                report.ca_digest,
                report.secrets.join(",")
            )
            .into_bytes();
            out.push(report);
        }
        Ok(out)
    }
}

impl FakeLink {
    /// A fake gateway takes a decision when it is one of the pair: it
    /// answers `released` for an approval and `refused` for a decline,
    /// reading the payload without checking the signature (the tests check
    /// it under the relay key).
    fn take_decision(
        &self,
        gateway_id: &str,
        decision: &talos_certs::Signed,
    ) -> Result<String, LinkError> {
        let mut st = self.state();
        st.calls.push(Call::Decide {
            gateway_id: gateway_id.to_owned(),
            decision: decision.clone(),
        });
        if let Some(e) = &st.failure {
            return Err(e.clone());
        }
        if !st.gateways.iter().any(|g| g == gateway_id) {
            return Err(LinkError::Unreachable(format!(
                "gateway {gateway_id} is not one of the pair"
            )));
        }
        let parsed: talos_certs::Decision =
            serde_json::from_slice(&decision.payload).map_err(|e| LinkError::Refused {
                gateway_id: gateway_id.to_owned(),
                reason: format!("the decision does not parse: {e}"),
            })?;
        Ok(match parsed.decision {
            talos_certs::Verdict::Approved => "released".into(),
            talos_certs::Verdict::Declined => "refused".into(),
        })
    }
}

/// `der` as a PEM certificate (64-character base64 lines).
fn pem(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attachment_debug_hides_the_value() {
        let a = Attachment {
            secret: "K".into(),
            destination: "a.example".into(),
            header: "x-key".into(),
            scheme: None,
            value: Zeroizing::new(b"hunter2-distinctive".to_vec()),
        };
        let open = OpenSession {
            session_id: "s".into(),
            attempt: 1,
            tenant: "t".into(),
            sources: vec![],
            allowlist: vec![],
            attachments: vec![a],
            cause: OpenCause::Launch,
            lock: vec![],
            relay_public_key: None,
        };
        let link = FakeLink::default();
        link.open(&open).unwrap();
        let shown = format!("{open:?} {link:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted, 19 bytes>"));
    }
}
