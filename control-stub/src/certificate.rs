//! The session certificate: what a session was allowed, what it reached,
//! what was refused, which secrets it used, and how it was reset.
//!
//! The certificate is built from the store alone: attempts and their CAs
//! from the state machine, connection records from the signed batches, the
//! reset steps.
//!
//! # Complete when issued, and final
//!
//! It is issued ([`issue`]) only when all of these hold:
//!
//! - the session has ended with all five reset steps confirmed;
//! - for every CA made for the session, the batch chain of the gateway that
//!   made it has been accepted up to the end of that authority: the drop
//!   report the gateway put in its chain after the records of the
//!   authority's connections, or the start report of its next process
//!   (which comes after the records of the connections its crash cut).
//!   Batches are accepted in order, so every record of the session from
//!   every member that held it is then in;
//! - for every connection a holder's record says a peer forwarded (`via`),
//!   that forwarder's own record of the hand-off is in too, or the start
//!   report of a process of it begun since the connection opened (the one
//!   that forwarded is gone, with whatever it had not synced).
//!
//! The rule is [`crate::confirm::certificate_waits_for`], which `sandbox
//! status` shows as well (`certificate_waits_for`).
//!
//! Issuing signs the certificate's JSON (the payload: every field but
//! `signature`, compact, in the order below) with the control plane's
//! Ed25519 key (`<control-dir>/plane.key`) as talos-certs kind
//! `certificate`, and stores payload and signature once. From then on the
//! certificate is read from the store as issued, byte for byte: records
//! that arrive later (a batch sealed again after a crash, say) never change
//! it. Until then it is built live and shown with `issued: false` and the
//! reason.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::error::Error;
use crate::lifecycle::load;
use crate::machine::Event;
use crate::model::{AttemptEnd, EndReason, Mode, OpenCause, ProposalState, State};
use crate::store::{
    Attempt, BatchInfo, BatchRejection, CaEvent, ConnectionRecord, IssuedCertificate, ResetStep,
    Session, Store, Tx,
};

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
    /// The hard stop the session was started with, in seconds of compute
    /// (spec: `stop_after_seconds`); null: none. A session that reached it
    /// ended with `end_reason` `stop_after`.
    pub stop_after_seconds: Option<u32>,
    /// The compute the session used, in whole seconds: the running time of
    /// every attempt (each attempt's `running_at` to its `ended_at`); a
    /// pause, an interruption and an open in flight use none.
    pub compute_seconds: u64,
    pub isolation_statement: &'static str,
    pub stub_notice: &'static str,
    pub sources: Vec<String>,
    /// The destinations the session asked for.
    pub allow: Vec<String>,
    pub attempts: Vec<CertAttempt>,
    /// Each interruption, an entry of its own (spec: "The certificate
    /// records each attempt and each interruption with its outcome"): the
    /// attempt it ended, when, its cause, and what followed.
    pub interruptions: Vec<CertInterruption>,
    /// Every connection of the session once: each record as the gateways
    /// signed it, except a member's hand-off of a connection to the peer
    /// that served it (see `forwarded`). A connection that came through a
    /// peer is the holder's record, which names the peer in `via`; a
    /// hand-off that failed (verdict `upstream_failed`, cause
    /// `holder_unreachable`: no holder has a record) is here, and in
    /// `refusals`.
    pub connections: Vec<Value>,
    /// The records of connections a member handed, untouched, to a peer
    /// that holds the session (verdict `allowed`, `forwarded_to` naming
    /// the holder), as signed: the connection itself is the holder's
    /// record in `connections`, so these are shown beside it and counted
    /// nowhere else.
    pub forwarded: Vec<Value>,
    /// The session's DNS, as the members that answered it counted it
    /// (`kind` `dns`): per interval, the queries by outcome and, of the
    /// names refused, only how many distinct ones and the longest's
    /// length; never a name. Not connections: counted nowhere else.
    pub dns: Vec<Value>,
    /// DNS queries of the session over every interval above, summed by
    /// outcome (`answered`, `unlisted`, `limited`, …).
    pub dns_totals: std::collections::BTreeMap<String, u64>,
    /// Every refused connection and refused request, with its reason, from
    /// the records in `connections`.
    pub refusals: Vec<Refusal>,
    /// Each secret by name: where it was attached, how often it was used
    /// and masked.
    pub secrets: Vec<SecretUse>,
    /// The signed batches the records came in.
    pub batches: Vec<BatchInfo>,
    /// Batches refused by the batch consumer that named the session.
    pub batch_rejections: Vec<BatchRejection>,
    /// Batches a gateway's operator set aside as signed gaps whose window
    /// this session was live in on that gateway: records of the session
    /// may be missing there.
    pub gaps: Vec<crate::store::ChainGap>,
    /// Every proposal the gateways sent the approval relay for the
    /// session, and what became of it.
    pub proposals: Vec<CertProposal>,
    pub reset: Vec<ResetStep>,
    /// Every command and time-driven event that moved the session, with
    /// who asked.
    pub commands: Vec<crate::store::CommandRecord>,
    pub issued: bool,
    /// When the control plane signed it (spec: `certificate_signed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificate_signed: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_issued_because: Option<String>,
    /// The control plane's signature over the payload (see the module
    /// docs); not part of the payload itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<CertSignature>,
}

/// The signature on an issued certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CertSignature {
    /// talos-certs key id of the control plane's key.
    pub key_id: String,
    /// Ed25519, standard base64.
    pub signature: String,
}

/// An attempt on the certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CertAttempt {
    pub attempt: u32,
    pub cause: OpenCause,
    pub started_at: String,
    /// When it began to run (its open's answers came); null: it never ran.
    pub running_at: Option<String>,
    pub ended_at: Option<String>,
    pub end_cause: Option<AttemptEnd>,
    /// The destinations this attempt's gateway authority named.
    pub allowlist: Vec<String>,
    /// The Lock rules this attempt opened with.
    pub lock: Vec<crate::lock::LockRule>,
    /// The allowlist's names passed on without termination: their
    /// connections are on the certificate, nothing inside them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub passthrough: Vec<String>,
    /// Present (true) when the attempt opened with the account's lab
    /// setting on: its gateways took decisions with no person's passkey
    /// assertion on the relay's signature alone.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub lab_approvals: bool,
    pub ca: Vec<CertCa>,
}

/// An interruption on the certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CertInterruption {
    /// The attempt it ended.
    pub attempt: Option<u32>,
    /// When it was recorded.
    pub at: String,
    /// Its cause: who asked (`operator` and their identity for `sandbox
    /// interrupt`; `time` and the cause, `lease_expired` say, when nothing
    /// served the session any more).
    pub cause: crate::store::Requester,
    /// What followed: `recovered` (a recovery opened a new attempt),
    /// `recovery_failed` (its open failed: the session was interrupted
    /// again), `lost` (it ended `interruption_lost`, outcome
    /// `outcome_unknown`: at once in mode agent, or no recovery in time),
    /// `ended` (a stop or Revoke All while interrupted), or `pending`.
    pub outcome: &'static str,
    /// The command or time-driven event that followed it, as `commands`
    /// has it; none when the interruption itself ended the session (mode
    /// agent) or nothing has followed yet.
    pub followed_by: Option<crate::store::CommandRecord>,
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
    /// The decision as it was made, for an auditor to verify from the
    /// certificate alone (docs/records.md, "Verifying a decision by
    /// hand"); none while undecided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided: Option<CertDecision>,
    /// One card per first use: this proposal was the same first use as
    /// card `answered_by` (another member's, or held again meanwhile), and
    /// was answered with that card's decision, which the person signed
    /// over that card.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<String>,
}

/// A decision on the certificate: who decided, how that was verified, the
/// person's assertion with the public key it verifies under, and the
/// relay's signed decision that carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CertDecision {
    /// The approver who decided.
    pub approver: String,
    /// Whether the approver's own passkey signed the decision: false for a
    /// decision taken in lab mode (`approvals approve|decline --as`), which
    /// rests on the relay's signature alone.
    pub verified: bool,
    /// `passkey`, or `relay_only` (lab mode).
    pub verified_by: &'static str,
    /// What a decision not verified rests on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<&'static str>,
    /// The passkey that signed: its credential id (base64url, as in the
    /// assertion), its COSE public key (standard base64, as registration
    /// stored it) and algorithm, and the relying party it was checked
    /// against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_key_cose: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alg: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rp_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// The person's WebAuthn assertion as the relay's decision carries it
    /// (each field base64url without padding).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub assertion: Option<talos_certs::PasskeyAssertion>,
    /// The relay's signed decision exactly as the gateway received it
    /// (talos-certs `Signed`, kind `decision`: `key_id`, the payload and
    /// the Ed25519 signature, standard base64).
    pub relay_signed: Value,
    /// The relay's public key the card's attempt opened with (64 hex):
    /// what the gateways checked the signature with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relay_public_key: Option<String>,
}

/// What a decision taken in lab mode rests on.
pub const LAB_DECISION_NOTE: &str = "decided with approvals approve|decline --as in lab mode: no person's passkey signed it; that the approver decided rests on the relay's signature alone";

/// The decision on proposal `p`, as the certificate shows it (see
/// [`CertDecision`]); none while it has no signed decision.
fn cert_decision(
    tx: &Tx<'_>,
    p: &crate::store::ProposalRecord,
    attempts: &[Attempt],
) -> Result<Option<CertDecision>, Error> {
    use base64::Engine as _;
    let (Some(envelope), Some(approver)) = (&p.decision, &p.approver) else {
        return Ok(None);
    };
    // The assertion inside what the relay signed; the record's copy if
    // the payload cannot be read here (it is shown whole either way).
    let inside = serde_json::from_value::<talos_certs::Signed>(envelope.clone())
        .ok()
        .and_then(|s| serde_json::from_slice::<talos_certs::Decision>(&s.payload).ok())
        .and_then(|d| d.assertion);
    let recorded = p.assertion.as_ref().map(|a| talos_certs::PasskeyAssertion {
        credential_id: a.credential_id.clone(),
        authenticator_data: a.authenticator_data.clone(),
        client_data_json: a.client_data_json.clone(),
        signature: a.signature.clone(),
        user_handle: a.user_handle.clone(),
    });
    let relay_public_key = attempts
        .iter()
        .find(|a| a.n == p.attempt)
        .and_then(|a| a.relay_public_key.clone())
        .map(|k| k.to_ascii_lowercase());
    let Some(assertion) = inside.or(recorded) else {
        return Ok(Some(CertDecision {
            approver: approver.clone(),
            verified: false,
            verified_by: "relay_only",
            note: Some(LAB_DECISION_NOTE),
            credential_id: None,
            public_key_cose: None,
            alg: None,
            rp_id: None,
            origin: None,
            assertion: None,
            relay_signed: envelope.clone(),
            relay_public_key,
        }));
    };
    let url = &base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let std = &base64::engine::general_purpose::STANDARD;
    // The key it was verified under: kept with the record, or (a record
    // from before it was) the passkey as the store holds it now.
    let kept = p.assertion.as_ref();
    let (cose, alg) = match kept.and_then(|a| a.public_key_cose.as_deref().zip(a.alg.as_deref())) {
        Some((cose, alg)) => (url.decode(cose).ok(), Some(alg.to_owned())),
        None => match url.decode(&assertion.credential_id) {
            Ok(id) => tx
                .passkey(&id)?
                .map_or((None, None), |k| (Some(k.public_key_cose), Some(k.alg))),
            Err(_) => (None, None),
        },
    };
    Ok(Some(CertDecision {
        approver: approver.clone(),
        verified: true,
        verified_by: "passkey",
        note: None,
        credential_id: Some(assertion.credential_id.clone()),
        public_key_cose: cose.map(|c| std.encode(c)),
        alg,
        rp_id: kept.map(|a| a.rp_id.clone()),
        origin: kept.map(|a| a.origin.clone()),
        assertion: Some(assertion),
        relay_signed: envelope.clone(),
        relay_public_key,
    }))
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

/// Session `id`'s certificate: as issued (from the store, byte for byte)
/// once it is, else built live with `issued: false` and the reason.
pub fn certificate(store: &Store, id: &str) -> Result<serde_json::Value, Error> {
    store.read(|tx| match tx.issued_certificate(id)? {
        Some(issued) => issued_json(&issued),
        None => {
            let mut cert = build(tx, id)?;
            if cert.issued {
                // Complete, but nothing is issued until it is signed.
                cert.issued = false;
                cert.not_issued_because = Some(
                    "complete, but not signed yet: `control-stub serve` signs it, or `certificate` with --control-dir".into(),
                );
            }
            Ok(serde_json::to_value(cert)?)
        }
    })
}

/// Session `id`'s issued certificate as a signed envelope (talos-certs
/// `Signed`, kind `certificate`): what `openssl` verifies.
pub fn signed(store: &Store, id: &str) -> Result<Option<talos_certs::Signed>, Error> {
    store.read(|tx| {
        Ok(tx.issued_certificate(id)?.map(|c| talos_certs::Signed {
            kind: talos_certs::Kind::Certificate,
            key_id: c.key_id,
            payload: c.payload,
            signature: c.signature,
        }))
    })
}

/// Session `id`'s certificate built live from the store, typed, whether
/// or not it is issued (what an issued one said is [`certificate`]'s).
pub fn live(store: &Store, id: &str) -> Result<Certificate, Error> {
    store.read(|tx| build(tx, id))
}

fn issued_json(issued: &IssuedCertificate) -> Result<serde_json::Value, Error> {
    use base64::Engine as _;
    let mut value: serde_json::Value = serde_json::from_slice(&issued.payload)?;
    value["signature"] = serde_json::to_value(CertSignature {
        key_id: issued.key_id.clone(),
        signature: base64::engine::general_purpose::STANDARD.encode(&issued.signature),
    })?;
    Ok(value)
}

/// Issue session `id`'s certificate, signed with `key`, if it can be
/// issued now (see the module docs). Returns whether it is issued (now or
/// before).
pub fn issue(store: &mut Store, id: &str, key: &talos_certs::GatewayKey) -> Result<bool, Error> {
    store.write(|tx| {
        if tx.issued_certificate(id)?.is_some() {
            return Ok(true);
        }
        let mut cert = build(tx, id)?;
        if !cert.issued {
            return Ok(false);
        }
        let at = crate::store::now();
        cert.certificate_signed = Some(at.clone());
        cert.signature = None;
        let payload = serde_json::to_vec(&cert)?;
        let signed = key.sign(talos_certs::Kind::Certificate, payload);
        tx.insert_certificate(
            id,
            &IssuedCertificate {
                issued_at: at,
                payload: signed.payload,
                signature: signed.signature,
                key_id: signed.key_id,
            },
        )?;
        metrics::counter!("stub_certificates_issued_total").increment(1);
        Ok(true)
    })
}

/// Build session `id`'s certificate from the store as it stands.
fn build(tx: &Tx<'_>, id: &str) -> Result<Certificate, Error> {
    let session = load(tx, id)?;
    let cas = tx.cas(id)?;
    let attempts = tx.attempts(id)?;
    let (records, forwarded, dns) = split_forwarded(tx.connection_records(id)?);
    let dns_totals = dns_totals(&dns);
    let reset = tx.reset_steps(id)?;
    let commands = tx.commands(id)?;
    let interruptions = interruptions(&commands, &attempts, &session);
    let cert_attempts = cert_attempts(&attempts, &cas);
    let (secrets, refusals) = secrets_and_refusals(&attempts, &records);
    let not_issued_because = crate::confirm::certificate_waits_for(tx, &session)?;
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
        stop_after_seconds: session.stop_after_seconds,
        compute_seconds: crate::machine::compute_used(
            attempts.iter().filter_map(Attempt::running_span),
            std::time::SystemTime::now(),
        )
        .as_secs(),
        isolation_statement: ISOLATION_STATEMENT,
        stub_notice: STUB_NOTICE,
        sources: session.sources.iter().map(|s| s.to_string()).collect(),
        allow: session.allow.clone(),
        attempts: cert_attempts,
        interruptions,
        connections: records.into_iter().map(|r| r.record).collect(),
        forwarded,
        dns,
        dns_totals,
        refusals,
        secrets: secrets.into_values().collect(),
        batches: tx.batches_of(id)?,
        batch_rejections: tx.batch_rejections(id)?,
        gaps: tx.gaps_touching(id)?,
        proposals: tx
            .proposals(Some(id), None)?
            .into_iter()
            .map(|p| {
                let decided = cert_decision(tx, &p, &attempts)?;
                Ok(CertProposal {
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
                    decided,
                    answered_by: p.answered_by,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?,
        reset,
        commands,
        issued: not_issued_because.is_none(),
        certificate_signed: None,
        not_issued_because,
        signature: None,
    })
}

/// A session's records split so that each connection counts once: the
/// records of its connections, and apart, the records of hand-offs (a
/// member passed the connection, untouched, to the peer named in
/// `forwarded_to`, verdict `allowed`), whose connection is the holder's
/// record. A hand-off that was refused stays with the connections: no
/// holder recorded it. The session's DNS counts (`kind` `dns`) are no
/// connection's, and go apart too.
fn split_forwarded(
    records: Vec<ConnectionRecord>,
) -> (Vec<ConnectionRecord>, Vec<Value>, Vec<Value>) {
    let mut connections = Vec::with_capacity(records.len());
    let mut forwarded = Vec::new();
    let mut dns = Vec::new();
    for r in records {
        if r.record.get("kind").and_then(Value::as_str) == Some("dns") {
            dns.push(r.record);
            continue;
        }
        let handed = r
            .record
            .get("forwarded_to")
            .and_then(Value::as_str)
            .is_some()
            && r.record.get("verdict").and_then(Value::as_str) == Some("allowed");
        if handed {
            forwarded.push(r.record);
        } else {
            connections.push(r);
        }
    }
    (connections, forwarded, dns)
}

/// The DNS counts summed by outcome.
fn dns_totals(dns: &[Value]) -> std::collections::BTreeMap<String, u64> {
    let mut totals = std::collections::BTreeMap::new();
    for r in dns {
        for (outcome, n) in r
            .get("queries")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            *totals.entry(outcome.clone()).or_insert(0) += n.as_u64().unwrap_or(0);
        }
    }
    totals
}

/// Each `interrupt` of `commands` as an entry of its own: its attempt,
/// time and cause, and what followed — the first later command that moved
/// the session on from `interrupted` (a recovery, `interruption_lost`, a
/// stop or Revoke All), or the session's end when the interruption itself
/// ended it (mode agent).
fn interruptions(
    commands: &[crate::store::CommandRecord],
    attempts: &[Attempt],
    session: &Session,
) -> Vec<CertInterruption> {
    let mut out = Vec::new();
    for (i, c) in commands.iter().enumerate() {
        if c.event != Event::Interrupt.as_str() {
            continue;
        }
        let next = commands[i + 1..].iter().find(|n| {
            [
                Event::Recover,
                Event::InterruptionLost,
                Event::Stop,
                Event::RevokeAll,
            ]
            .iter()
            .any(|e| e.as_str() == n.event)
        });
        let outcome = match next {
            Some(n) if n.event == Event::Recover.as_str() => {
                let failed = attempts.iter().any(|a| {
                    Some(a.n) == n.attempt && a.end_cause == Some(AttemptEnd::StartFailed)
                });
                if failed {
                    "recovery_failed"
                } else {
                    "recovered"
                }
            }
            Some(n) if n.event == Event::InterruptionLost.as_str() => "lost",
            Some(_) => "ended",
            // In mode agent the interruption ends the session itself.
            None if session.end_reason == Some(EndReason::InterruptionLost) => "lost",
            None => "pending",
        };
        out.push(CertInterruption {
            attempt: c.attempt,
            at: c.at.clone(),
            cause: c.by.clone(),
            outcome,
            followed_by: next.cloned(),
        });
    }
    out
}

/// Each attempt as the certificate shows it, with the CAs made for it.
fn cert_attempts(attempts: &[Attempt], cas: &[CaEvent]) -> Vec<CertAttempt> {
    attempts
        .iter()
        .map(|a| CertAttempt {
            attempt: a.n,
            cause: a.cause,
            started_at: a.started_at.clone(),
            running_at: a.running_at.clone(),
            ended_at: a.ended_at.clone(),
            end_cause: a.end_cause,
            allowlist: a.allowlist.clone(),
            lock: a.lock.clone(),
            passthrough: a.passthrough.clone(),
            lab_approvals: a.lab_approvals,
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
        .collect()
}

/// Every secret's use (attached at which attempts, used by how many
/// connections, masked how often), and every refusal the records hold:
/// `records` are the connections' (hand-offs left out, see
/// [`split_forwarded`]), so a forwarded connection counts once.
fn secrets_and_refusals(
    attempts: &[Attempt],
    records: &[ConnectionRecord],
) -> (BTreeMap<String, SecretUse>, Vec<Refusal>) {
    let mut secrets: BTreeMap<String, SecretUse> = BTreeMap::new();
    for a in attempts {
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
    for r in records {
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
    (secrets, refusals)
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(gateway: &str, idx: u32, record: Value) -> ConnectionRecord {
        ConnectionRecord {
            gateway_id: gateway.into(),
            seq: 1,
            idx,
            record,
        }
    }

    #[test]
    fn a_hand_off_is_set_apart_and_everything_else_is_a_connection() {
        let direct =
            json!({"gateway_id": "gw-b", "verdict": "allowed", "attachments_used": ["GH"]});
        let handed = json!({"gateway_id": "gw-a", "verdict": "allowed", "forwarded_to": "gw-b"});
        let served = json!({"gateway_id": "gw-b", "verdict": "allowed", "via": "gw-a", "attachments_used": ["GH"]});
        let lost = json!({
            "gateway_id": "gw-a", "verdict": "upstream_failed", "cause": "holder_unreachable",
            "forwarded_to": "gw-b"
        });
        let refused = json!({"gateway_id": "gw-a", "verdict": "not_on_allowlist"});
        let dns = json!({"kind": "dns", "gateway_id": "gw-b", "queries": {"answered": 2}});
        let (connections, forwarded, counted) = split_forwarded(vec![
            record("gw-a", 0, handed.clone()),
            record("gw-a", 1, lost.clone()),
            record("gw-a", 2, refused.clone()),
            record("gw-b", 0, direct.clone()),
            record("gw-b", 1, served.clone()),
            record("gw-b", 2, dns.clone()),
        ]);
        let kept: Vec<&Value> = connections.iter().map(|r| &r.record).collect();
        assert_eq!(kept, [&lost, &refused, &direct, &served]);
        assert_eq!(forwarded, [handed]);
        assert_eq!(counted, [dns]);
        // Counted from the connections: GH used by two connections (one
        // direct, one forwarded, each once); two connection refusals.
        let (secrets, refusals) = secrets_and_refusals(&[], &connections);
        assert_eq!(secrets["GH"].connections_used, 2);
        let reasons: Vec<(&str, Option<&str>)> = refusals
            .iter()
            .map(|r| (r.reason.as_str(), r.cause.as_deref()))
            .collect();
        assert_eq!(
            reasons,
            [
                ("upstream_failed", Some("holder_unreachable")),
                ("not_on_allowlist", None)
            ]
        );
    }
}
