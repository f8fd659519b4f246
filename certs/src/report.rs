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
//! {"gateway_id":"gw-a","instance":"<16 hex>","session_id":"sess-1","attempt":2,"ca_digest":"<96 hex>","secrets":["github","openai"],"reason":"pause","at":"2026-11-29T10:00:00Z"}
//! ```
//!
//! `instance` names the gateway process that held the authority (see
//! [`StartReport`]); `secrets` is sorted (by bytes) and without repeats,
//! whatever order the gateway dropped them in, so one set of names has one
//! encoding; `reason` is one of [`DropReason`]'s names; `at` is when the
//! drop happened, as the gateway wrote it (RFC 3339 by convention). The
//! payload is signed as [`Kind::DropReport`] (see `crate::signing`): a
//! report can never pass for a batch, nor a batch for a report.
//!
//! # Start reports
//!
//! A gateway process that starts without taking over from a running one
//! signs a [`StartReport`]: its gateway id, a fresh `instance` id, when it
//! started, and its key id. Every session authority lives in the memory of
//! the process that made it, so the report says that every authority any
//! earlier instance of that gateway held is gone. Payload, keys in this
//! order, no whitespace, signed as [`Kind::StartReport`]:
//!
//! ```text
//! {"gateway_id":"gw-a","instance":"<16 hex>","started_at":"2026-11-29T10:00:00Z","key_id":"<16 hex>","previous_instance":"<16 hex or empty>","cut_by_crash":3}
//! ```
//!
//! `previous_instance` is the instance this one follows on the same
//! records directory (empty when none is known); `cut_by_crash` counts the
//! connections that instance left open when it died, recorded at this
//! start as cut by the crash.
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
    /// Nobody renewed the authority's lease in time: the gateway dropped it
    /// by its own clock.
    LeaseExpired,
    /// A newer open for the same session or sources displaced it.
    Replaced,
    /// The gateway process was shut down (SIGTERM) without a successor.
    Shutdown,
}

impl DropReason {
    /// The stable snake_case name, as in the payload.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Pause => "pause",
            DropReason::Interruption => "interruption",
            DropReason::End => "end",
            DropReason::RevokeAll => "revoke_all",
            DropReason::LeaseExpired => "lease_expired",
            DropReason::Replaced => "replaced",
            DropReason::Shutdown => "shutdown",
        }
    }

    /// Every reason, in a fixed order.
    pub const ALL: [DropReason; 7] = [
        DropReason::Pause,
        DropReason::Interruption,
        DropReason::End,
        DropReason::RevokeAll,
        DropReason::LeaseExpired,
        DropReason::Replaced,
        DropReason::Shutdown,
    ];

    /// The reason named `name`, if any.
    pub fn from_name(name: &str) -> Option<DropReason> {
        DropReason::ALL.into_iter().find(|r| r.as_str() == name)
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
    /// The gateway process that held the authority.
    pub instance: String,
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
    instance: &'a str,
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
            instance: &report.instance,
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

/// A gateway process's word that it started afresh: every authority an
/// earlier process of that gateway held is gone (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartReport {
    /// The gateway (pair member).
    pub gateway_id: String,
    /// The new process's instance id.
    pub instance: String,
    /// When it started (RFC 3339 by convention).
    pub started_at: String,
    /// The key id it signs with.
    pub key_id: String,
    /// The instance it follows on the same records directory; empty when
    /// none is known.
    pub previous_instance: String,
    /// Connections the previous instance left open when it died, recorded
    /// at this start as cut by the crash.
    pub cut_by_crash: u64,
}

impl StartReport {
    /// The report's payload: the fields in declaration order, no
    /// whitespace.
    pub fn payload(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("strings and numbers always serialise into a Vec")
    }

    /// The report, signed by the gateway as [`Kind::StartReport`].
    pub fn sign(&self, key: &GatewayKey) -> Signed {
        key.sign(Kind::StartReport, self.payload())
    }
}

/// Checks that `signed` is a start report signed by `public_key`, in the
/// canonical encoding, and returns it.
pub fn verify_start_report(
    public_key: &[u8; 32],
    signed: &Signed,
) -> Result<StartReport, VerifyError> {
    if signed.kind != Kind::StartReport {
        return Err(VerifyError::WrongKind {
            expected: Kind::StartReport,
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
    let report: StartReport =
        serde_json::from_slice(&signed.payload).map_err(|e| malformed(json_error(&e)))?;
    if report.payload() != signed.payload {
        return Err(malformed("not in the canonical report encoding".into()));
    }
    Ok(report)
}

/// A fresh process instance id: 16 lowercase hex digits (64 random bits
/// from aws-lc's generator). It names a gateway process in its reports, so
/// the control plane can tell which authorities a restart ended.
pub fn new_instance_id() -> String {
    let mut bytes = [0u8; 8];
    aws_lc_rs::rand::fill(&mut bytes).expect("aws-lc's generator does not fail");
    crate::digest::lower_hex(&bytes)
}
