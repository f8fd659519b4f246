//! Drop reports: what the gateway dropped when a session's authority ended,
//! signed, so the control plane can confirm reset steps 4
//! (`gateway_ca_destroyed`) and 5 (`secrets_detached`).
//!
//! At a pause, an interruption, an end or a Revoke All, the gateway drops
//! the session's CA with every leaf it signed, and every attached secret
//! value, then signs a [`DropReport`] naming the CA by its SHA-384 digest
//! and each secret by name. Each member of a gateway pair reports its own
//! CA under its own key.
//!
//! # The payload
//!
//! One JSON object, keys in this order, no whitespace:
//!
//! ```text
//! {"gateway_id":"gw-a","session_id":"sess-1","attempt":2,"ca_digest":"<96 hex>","secrets":["github","openai"],"reason":"pause","at":"2026-11-29T10:00:00Z"}
//! ```
//!
//! `secrets` is sorted (by bytes) and without repeats, whatever order the
//! gateway dropped them in, so one set of names has one encoding; `reason`
//! is one of `pause`, `interruption`, `end`, `revoke_all`; `at` is when
//! the drop happened, as the gateway wrote it (RFC 3339 by convention). The
//! payload is signed as [`Kind::DropReport`] (see `crate::signing`): a
//! report can never pass for a batch, nor a batch for a report.
//!
//! # What the control plane checks
//!
//! [`verify_drop_report`] checks the signature under the key the control
//! plane registered for the member it expects the report from, and the
//! encoding. The caller then checks that `gateway_id`, `session_id` and
//! `attempt` are the ones it asked about, and [`confirms`] that the digest
//! and names match what it recorded when it opened (or resumed) that
//! attempt on that member.
//!
//! # Limits
//!
//! A report payload is at most [`MAX_REPORT_LEN`] bytes.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::batch::{json_error, SameBytes};
use crate::signing::{verify, GatewayKey, Kind, Signed, VerifyError};

/// The largest report payload parsed: 1 MiB, room for thousands of secret
/// names, and a bound on what one report can make the control plane parse.
pub const MAX_REPORT_LEN: usize = 1 << 20;

/// Why a session's authority was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// The session was paused.
    Pause,
    /// The session was interrupted.
    Interruption,
    /// The session ended.
    End,
    /// An operator revoked every session's authority at once.
    RevokeAll,
}

impl DropReason {
    /// The stable snake_case name, as in the payload.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Pause => "pause",
            DropReason::Interruption => "interruption",
            DropReason::End => "end",
            DropReason::RevokeAll => "revoke_all",
        }
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one gateway dropped for one attempt of one session.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DropReport {
    /// The reporting gateway (pair member).
    pub gateway_id: String,
    /// The session.
    pub session_id: String,
    /// The session's attempt number.
    pub attempt: u32,
    /// SHA-384 hex of the dropped CA's certificate DER (`SessionCa::digest`).
    pub ca_digest: String,
    /// The names of the dropped secret values.
    pub secrets: Vec<String>,
    /// Why.
    pub reason: DropReason,
    /// When (RFC 3339 by convention).
    pub at: String,
}

/// The payload as written: fields in the documented order, names sorted.
#[derive(Serialize)]
struct ReportOut<'a> {
    gateway_id: &'a str,
    session_id: &'a str,
    attempt: u32,
    ca_digest: &'a str,
    secrets: Vec<&'a str>,
    reason: DropReason,
    at: &'a str,
}

impl<'a> ReportOut<'a> {
    fn new(report: &'a DropReport) -> Self {
        let secrets: BTreeSet<&str> = report.secrets.iter().map(String::as_str).collect();
        ReportOut {
            gateway_id: &report.gateway_id,
            session_id: &report.session_id,
            attempt: report.attempt,
            ca_digest: &report.ca_digest,
            secrets: secrets.into_iter().collect(),
            reason: report.reason,
            at: &report.at,
        }
    }
}

impl DropReport {
    /// The report's payload (see the module docs for the encoding).
    pub fn payload(&self) -> Vec<u8> {
        serde_json::to_vec(&ReportOut::new(self))
            .expect("strings and numbers always serialise into a Vec")
    }

    /// The report, signed by the gateway as [`Kind::DropReport`].
    pub fn sign(&self, key: &GatewayKey) -> Signed {
        key.sign(Kind::DropReport, self.payload())
    }
}

/// Checks that `signed` is a drop report signed by `public_key` and in the
/// canonical encoding, and returns it (its `secrets` sorted, without
/// repeats).
///
/// The caller must still check that the report is about the gateway,
/// session and attempt it expects (see the module docs).
pub fn verify_drop_report(
    public_key: &[u8; 32],
    signed: &Signed,
) -> Result<DropReport, VerifyError> {
    if signed.kind != Kind::DropReport {
        return Err(VerifyError::WrongKind {
            expected: Kind::DropReport,
            got: signed.kind,
        });
    }
    let malformed = |reason: String| VerifyError::Malformed { reason };
    if signed.payload.len() > MAX_REPORT_LEN {
        return Err(malformed(format!(
            "report is {} bytes, over the {MAX_REPORT_LEN}-byte limit",
            signed.payload.len()
        )));
    }
    verify(public_key, signed)?;
    let report: DropReport =
        serde_json::from_slice(&signed.payload).map_err(|e| malformed(json_error(&e)))?;
    let mut same = SameBytes {
        rest: &signed.payload,
    };
    let written = serde_json::to_writer(&mut same, &ReportOut::new(&report));
    if written.is_err() || !same.rest.is_empty() {
        return Err(malformed("not in the canonical report encoding".into()));
    }
    Ok(report)
}

/// Whether `report` confirms reset steps 4 and 5 for what the control
/// plane recorded: the CA digest is exactly `expected_ca_digest`, and the
/// dropped names are exactly `expected_secret_names`, compared as sets
/// (order and repeats do not matter; a missing or an extra name does).
pub fn confirms<S: AsRef<str>>(
    report: &DropReport,
    expected_ca_digest: &str,
    expected_secret_names: &[S],
) -> bool {
    let reported: BTreeSet<&str> = report.secrets.iter().map(String::as_str).collect();
    let expected: BTreeSet<&str> = expected_secret_names.iter().map(AsRef::as_ref).collect();
    report.ca_digest == expected_ca_digest && reported == expected
}
