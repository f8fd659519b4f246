//! The session certificate: what a session was allowed, what it reached,
//! what was refused, which secrets it used, and how it was reset.
//!
//! The certificate is built from the store alone: attempts and their CAs
//! from the state machine, connection records from the signed batches, the
//! reset steps. It is issued (`issued: true`) only for a session that has
//! ended with all five reset steps confirmed; otherwise it is shown with
//! `issued: false` and the reason.
//!
//! The control stub does not sign the certificate.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::error::Error;
use crate::lifecycle::load;
use crate::model::{AttemptEnd, EndReason, Mode, OpenCause, ProposalState, State};
use crate::store::{BatchInfo, BatchRejection, ResetStep, Store};

/// The kind of this certificate (spec: "The session certificate follows,
/// with the kind sandbox session").
pub const KIND: &str = "sandbox session";

/// The isolation statement, word for word from the spec page "The sandbox
/// and its gateway", section "The isolation statement": "Every session
/// certificate contains this statement, word for word".
pub const ISOLATION_STATEMENT: &str = "One fresh instance served this session alone and was terminated at its end. AWS Nitro is the isolation boundary. The gateway, operated by TALOS Defence, was the session's only way out: it connected only to the destinations named on this certificate and attached credentials by name, so no credential entered the session. Companion containers ran inside the session's own instance and budget, with no inbound access. The sandbox reset is recorded step by step with each AWS response.";

/// Says what the statement's instance and AWS claims rest on here: the
/// control stub runs no instance, so reset steps 1–3 are stub responses.
pub const STUB_NOTICE: &str = "Made by the TALOS control stub, which runs no instances: reset steps 1-3 carry stub responses, not AWS responses. The gateway columns (CAs, drop reports, connection records) are real.";

/// A session certificate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Certificate {
    pub kind: &'static str,
    pub session_id: String,
    pub tenant: String,
    pub mode: Mode,
    pub state: State,
    pub created_at: String,
    pub ended_at: Option<String>,
    pub end_reason: Option<EndReason>,
    pub outcome: Option<String>,
    pub isolation_statement: &'static str,
    pub stub_notice: &'static str,
    pub sources: Vec<String>,
    /// The destinations the session asked for.
    pub allow: Vec<String>,
    pub attempts: Vec<CertAttempt>,
    /// Every connection record of the session, as the gateways signed it.
    pub connections: Vec<Value>,
    /// Every refused connection and refused request, with its reason.
    pub refusals: Vec<Refusal>,
    /// Each secret by name: where it was attached, how often it was used
    /// and masked.
    pub secrets: Vec<SecretUse>,
    /// The signed batches the records came in.
    pub batches: Vec<BatchInfo>,
    /// Batches from the session's gateways that the batch consumer refused.
    pub batch_rejections: Vec<BatchRejection>,
    /// Every proposal the gateways sent the approval relay for the
    /// session, and what became of it.
    pub proposals: Vec<CertProposal>,
    pub reset: Vec<ResetStep>,
    pub issued: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_issued_because: Option<String>,
}

/// An attempt on the certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CertAttempt {
    pub attempt: u32,
    pub cause: OpenCause,
    pub started_at: String,
    pub ended_at: Option<String>,
    pub end_cause: Option<AttemptEnd>,
    /// The destinations this attempt's gateway authority named.
    pub allowlist: Vec<String>,
    /// The Lock rules this attempt opened with.
    pub lock: Vec<crate::lock::LockRule>,
    pub ca: Vec<CertCa>,
}

/// A CA made for an attempt, and its destruction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CertCa {
    pub gateway_id: String,
    pub digest: String,
    pub made_at: String,
    pub destroyed_at: Option<String>,
    pub destroy_reason: Option<String>,
}

/// A proposal on the certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CertProposal {
    pub id: String,
    pub gateway_id: String,
    pub attempt: u32,
    pub kind: talos_certs::ProposalKind,
    pub sentence: String,
    /// SHA-384 binding the sentence to the fields (talos-certs
    /// `proposal_digest`).
    pub digest: String,
    pub rule: String,
    pub approvers: Vec<String>,
    /// `approved`, `declined`, `withdrawn`, `expired` or `pending`.
    pub decision: ProposalState,
    pub approver: Option<String>,
    pub created_at: String,
    pub expires_at: String,
    /// When it was decided, withdrawn or found expired.
    pub decided_at: Option<String>,
    /// What the gateway answered the decision: `released` or `refused`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

/// A refusal, from a connection record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// `connection` (the connection was refused) or `request` (one request
    /// inside an allowed connection was).
    pub kind: &'static str,
    pub reason: String,
    pub gateway_id: Option<String>,
    pub sni: Option<String>,
    pub opened_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u64>,
    /// The proposal, when a Lock rule held the request
    /// (`approval_declined`, `approval_withdrawn`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proposal_id: Option<String>,
}

/// A secret on the certificate: by name, never by value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SecretUse {
    pub name: String,
    pub attachments: Vec<SecretAttachment>,
    /// Connections whose requests carried the secret.
    pub connections_used: u64,
    /// Occurrences masked in replies, summed over the records.
    pub masked: u64,
}

/// Where a secret was attached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SecretAttachment {
    pub destination: String,
    pub header: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// The attempts that opened with this attachment.
    pub attempts: Vec<u32>,
}

/// Build session `id`'s certificate.
pub fn certificate(store: &Store, id: &str) -> Result<Certificate, Error> {
    store.read(|tx| {
        let session = load(tx, id)?;
        let cas = tx.cas(id)?;
        let attempts = tx.attempts(id)?;
        let records = tx.connection_records(id)?;
        let reset = tx.reset_steps(id)?;
        let mut gateways: Vec<String> = cas.iter().map(|c| c.gateway_id.clone()).collect();
        gateways.sort();
        gateways.dedup();

        let cert_attempts = attempts
            .iter()
            .map(|a| CertAttempt {
                attempt: a.n,
                cause: a.cause,
                started_at: a.started_at.clone(),
                ended_at: a.ended_at.clone(),
                end_cause: a.end_cause,
                allowlist: a.allowlist.clone(),
                lock: a.lock.clone(),
                ca: cas
                    .iter()
                    .filter(|c| c.attempt == a.n)
                    .map(|c| CertCa {
                        gateway_id: c.gateway_id.clone(),
                        digest: c.digest.clone(),
                        made_at: c.made_at.clone(),
                        destroyed_at: c.destroyed_at.clone(),
                        destroy_reason: c.destroy_reason.map(|r| r.as_str().to_owned()),
                    })
                    .collect(),
            })
            .collect();

        let mut secrets: BTreeMap<String, SecretUse> = BTreeMap::new();
        for a in &attempts {
            for spec in &a.attachments {
                let entry = secret_entry(&mut secrets, &spec.secret);
                match entry.attachments.iter_mut().find(|x| {
                    x.destination == spec.destination
                        && x.header == spec.header
                        && x.scheme == spec.scheme
                }) {
                    Some(x) => x.attempts.push(a.n),
                    None => entry.attachments.push(SecretAttachment {
                        destination: spec.destination.clone(),
                        header: spec.header.clone(),
                        scheme: spec.scheme.clone(),
                        attempts: vec![a.n],
                    }),
                }
            }
        }
        let mut refusals = Vec::new();
        for r in &records {
            let rec = &r.record;
            for name in rec
                .get("attachments_used")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                secret_entry(&mut secrets, name).connections_used += 1;
            }
            for (name, n) in rec
                .get("masked")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                let entry = secret_entry(&mut secrets, name);
                entry.masked = entry.masked.saturating_add(n.as_u64().unwrap_or(0));
            }
            refusals.extend(refusals_of(rec));
        }

        let not_issued_because = if !session.state.is_over() {
            Some(format!(
                "the session is {} and has not ended",
                session.state
            ))
        } else {
            let unconfirmed: Vec<&str> = reset
                .iter()
                .filter(|s| !s.confirmed)
                .map(|s| s.name.as_str())
                .collect();
            if reset.len() != 5 {
                Some("the reset has not recorded all five steps".into())
            } else if !unconfirmed.is_empty() {
                Some(format!(
                    "reset steps not confirmed: {}",
                    unconfirmed.join(", ")
                ))
            } else {
                None
            }
        };

        Ok(Certificate {
            kind: KIND,
            session_id: session.id.clone(),
            tenant: session.tenant.clone(),
            mode: session.mode,
            state: session.state,
            created_at: session.created_at.clone(),
            ended_at: session.ended_at.clone(),
            end_reason: session.end_reason,
            outcome: session.outcome.clone(),
            isolation_statement: ISOLATION_STATEMENT,
            stub_notice: STUB_NOTICE,
            sources: session.sources.iter().map(|s| s.to_string()).collect(),
            allow: session.allow.clone(),
            attempts: cert_attempts,
            connections: records.into_iter().map(|r| r.record).collect(),
            refusals,
            secrets: secrets.into_values().collect(),
            batches: tx.batches_of(id)?,
            batch_rejections: tx.batch_rejections(&gateways)?,
            proposals: tx
                .proposals(Some(id), None)?
                .into_iter()
                .map(|p| CertProposal {
                    id: p.proposal_id,
                    gateway_id: p.gateway_id,
                    attempt: p.attempt,
                    kind: p.fields.kind,
                    sentence: p.sentence,
                    digest: p.digest,
                    rule: p.rule,
                    approvers: p.fields.approvers,
                    decision: p.state,
                    approver: p.approver,
                    created_at: p.created_at,
                    expires_at: p.expires_at,
                    decided_at: p.decided_at,
                    outcome: p.outcome,
                })
                .collect(),
            reset,
            issued: not_issued_because.is_none(),
            not_issued_because,
        })
    })
}

fn secret_entry<'m>(map: &'m mut BTreeMap<String, SecretUse>, name: &str) -> &'m mut SecretUse {
    map.entry(name.to_owned()).or_insert_with(|| SecretUse {
        name: name.to_owned(),
        attachments: Vec::new(),
        connections_used: 0,
        masked: 0,
    })
}

/// The refusals one connection record holds: the connection's own verdict,
/// and each listed request the gateway refused.
fn refusals_of(rec: &Value) -> Vec<Refusal> {
    let text = |key: &str| rec.get(key).and_then(Value::as_str).map(str::to_owned);
    let mut out = Vec::new();
    let verdict = text("verdict").unwrap_or_else(|| "(no verdict)".into());
    if verdict != "allowed" {
        out.push(Refusal {
            kind: "connection",
            reason: verdict,
            gateway_id: text("gateway_id"),
            sni: text("sni"),
            opened_at: text("opened_at"),
            cause: text("cause"),
            method: None,
            path: None,
            status: None,
            proposal_id: None,
        });
    }
    for req in rec
        .get("requests")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(reason) = req.get("refusal").and_then(Value::as_str) {
            out.push(Refusal {
                kind: "request",
                reason: reason.to_owned(),
                gateway_id: text("gateway_id"),
                sni: text("sni"),
                opened_at: text("opened_at"),
                cause: None,
                method: req.get("method").and_then(Value::as_str).map(str::to_owned),
                path: req.get("path").and_then(Value::as_str).map(str::to_owned),
                status: req.get("status").and_then(Value::as_u64),
                proposal_id: req
                    .get("approval")
                    .and_then(|a| a.get("proposal_id"))
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            });
        }
    }
    out
}
