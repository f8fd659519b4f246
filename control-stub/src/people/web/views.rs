//! What the pages are given: a card, a session, a line of history. Every
//! field a session or a gateway could have written passes through
//! [`super::super::text::show`], so the page gets pieces and marks, never
//! text it could take for markup; the page renders them with
//! `textContent` and elements of its own.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde_json::{json, Value};
use talos_certs::webauthn::decision_challenge;
use talos_certs::{ProposalKind, Verdict};

use super::super::rp::{b64, parse_at};
use super::super::text::show;
use crate::error::Error;
use crate::model::{ProposalState, Role, State};
use crate::store::{ProposalRecord, Tx};

/// The most cards one page is given (oldest first): more than a person
/// can read before the first expires.
pub const MAX_CARDS: usize = 100;

/// The most lines of history a page is given (newest first).
pub const MAX_HISTORY: usize = 200;

/// The most sessions a list shows (newest first).
pub const MAX_SESSIONS: usize = 200;

/// A field shown, with the field's name on each of its warnings.
fn shown(field: &str, text: &str, warnings: &mut Vec<String>) -> Value {
    let s = show(text);
    for w in &s.warnings {
        warnings.push(format!("{field}: {}", w.describe()));
    }
    serde_json::to_value(&s).unwrap_or(Value::Null)
}

/// Milliseconds from `now` to `when` (0 when past).
fn left_ms(when: &str, now: SystemTime) -> u64 {
    parse_at(when)
        .duration_since(now)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A card as the cards page shows it: every field shown safely, the
/// warnings, the time left, and the two challenges Approve and Decline
/// sign (the server computes them again when the answer comes).
pub fn card(p: &ProposalRecord, now: SystemTime) -> Value {
    let f = &p.fields;
    let mut warnings = Vec::new();
    let mut v = json!({
        "id": p.proposal_id,
        "session_id": p.session_id,
        "kind": f.kind,
        "sentence": shown("sentence", &p.sentence, &mut warnings),
        "digest": p.digest,
        "session": shown("session", &p.session_id, &mut warnings),
        "tenant": shown("tenant", &f.tenant, &mut warnings),
        "rule": shown("rule", &p.rule, &mut warnings),
        "gateway": shown("gateway", &p.gateway_id, &mut warnings),
        "attempt": p.attempt,
        "approvers": f.approvers.iter().map(|a| shown("approvers", a, &mut warnings)).collect::<Vec<_>>(),
        "created_at": p.created_at,
        "expires_at": p.expires_at,
        "expires_in_ms": left_ms(&p.expires_at, now),
        "state": p.state,
        "challenges": {
            "approved": b64(&decision_challenge(&p.digest, Verdict::Approved)),
            "declined": b64(&decision_challenge(&p.digest, Verdict::Declined)),
        },
    });
    match f.kind {
        ProposalKind::Request => {
            v["destination"] = shown("destination", &f.destination, &mut warnings);
            v["method"] = shown("method", &f.method, &mut warnings);
            v["path"] = shown("path", &f.path, &mut warnings);
            v["attachments"] = f
                .attachments
                .iter()
                .map(|a| shown("attachments", a, &mut warnings))
                .collect();
        }
        ProposalKind::Agent => {
            v["tool"] = shown("tool", &f.tool, &mut warnings);
            v["call_digest"] = shown("call digest", &f.call_digest, &mut warnings);
        }
    }
    warnings.dedup();
    v["warnings"] = json!(warnings);
    v
}

/// Whether `person` is named by card `p`.
pub fn names(p: &ProposalRecord, person: &str) -> bool {
    p.fields.approvers.iter().any(|a| a == person)
}

/// The cards waiting for `person` at `now`, oldest first (at most
/// [`MAX_CARDS`]): pending, in time, naming them, and cards themselves (a
/// proposal joined to another's card, the same first use, is decided with
/// it). Read only (an overdue card is left for the relay to mark).
pub fn waiting(tx: &Tx<'_>, person: &str, now: SystemTime) -> Result<Vec<ProposalRecord>, Error> {
    Ok(tx
        .proposals(None, Some(ProposalState::Pending))?
        .into_iter()
        .filter(|p| p.answered_by.is_none() && names(p, person) && parse_at(&p.expires_at) > now)
        .take(MAX_CARDS)
        .collect())
}

/// A past decision of the person's, as History shows it.
pub fn decided(p: &ProposalRecord) -> Value {
    let mut warnings = Vec::new();
    let mut v = json!({
        "id": p.proposal_id,
        "session_id": p.session_id,
        "state": p.state,
        "sentence": shown("sentence", &p.sentence, &mut warnings),
        "digest": p.digest,
        "decided_at": p.decided_at,
        "outcome": p.outcome,
        "signed_with_passkey": p.assertion.is_some(),
    });
    warnings.dedup();
    v["warnings"] = json!(warnings);
    v
}

/// Whether `person` (with `role`) may see session `id`'s page: an operator
/// every session; an approver those of the cards they were named on.
pub fn may_see(tx: &Tx<'_>, person: &str, role: Role, id: &str) -> Result<bool, Error> {
    if role == Role::Operator {
        return Ok(true);
    }
    Ok(tx
        .proposals(Some(id), None)?
        .iter()
        .any(|p| names(p, person)))
}

/// The sessions `person` may see, newest first (at most
/// [`MAX_SESSIONS`]): id, tenant, state, mode, times, and the cards
/// waiting on each.
pub fn sessions(tx: &Tx<'_>, person: &str, role: Role) -> Result<Value, Error> {
    let all = tx.sessions_in(State::ALL)?;
    let proposals = tx.proposals(None, None)?;
    let mut out: Vec<_> = all
        .into_iter()
        .filter(|s| {
            role == Role::Operator
                || proposals
                    .iter()
                    .any(|p| p.session_id == s.id && names(p, person))
        })
        .collect();
    out.sort_by(|a, b| b.created_at.cmp(&a.created_at));
    out.truncate(MAX_SESSIONS);
    let mut warnings = Vec::new();
    let list: Vec<Value> = out
        .iter()
        .map(|s| {
            let waiting = proposals
                .iter()
                .filter(|p| {
                    p.session_id == s.id
                        && p.state == ProposalState::Pending
                        && p.answered_by.is_none()
                })
                .count();
            json!({
                "id": s.id,
                "shown_id": shown("session", &s.id, &mut warnings),
                "tenant": shown("tenant", &s.tenant, &mut warnings),
                "state": s.state,
                "mode": s.mode,
                "created_at": s.created_at,
                "ended_at": s.ended_at,
                "cards_waiting": waiting,
            })
        })
        .collect();
    Ok(json!({"sessions": list}))
}

/// A session's page: its state, its attempts with the CAs each made and
/// destroyed, the reset steps with every outcome, the connections and
/// refusals of its accepted batches counted by reason, the requests held
/// (pending cards), and who asked for each change.
pub fn session(
    tx: &Tx<'_>,
    id: &str,
    person: &str,
    role: Role,
    now: SystemTime,
) -> Result<Value, Error> {
    let s = tx.session(id)?.ok_or_else(|| Error::SandboxNotFound {
        id: id.chars().take(100).collect(),
    })?;
    let mut warnings = Vec::new();
    let cas = tx.cas(id)?;
    let attempts: Vec<Value> = tx
        .attempts(id)?
        .iter()
        .map(|a| {
            json!({
                "n": a.n,
                "cause": a.cause,
                "started_at": a.started_at,
                "ended_at": a.ended_at,
                "end_cause": a.end_cause,
                "allowlist": a.allowlist.iter().map(|n| shown("allowlist", n, &mut warnings)).collect::<Vec<_>>(),
                "cas": cas.iter().filter(|c| c.attempt == a.n).map(|c| json!({
                    "gateway_id": c.gateway_id,
                    "digest": c.digest,
                    "made_at": c.made_at,
                    "destroyed_at": c.destroyed_at,
                    "destroy_reason": c.destroy_reason,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let reset: Vec<Value> = tx
        .reset_steps(id)?
        .iter()
        .map(|r| {
            let mut outcomes: Vec<Value> = r
                .earlier
                .iter()
                .map(|o| json!({"confirmed": o.confirmed, "error": o.error, "at": o.at}))
                .collect();
            outcomes.push(json!({"confirmed": r.confirmed, "error": r.error, "at": r.at}));
            json!({"step": r.step, "name": r.name, "confirmed": r.confirmed, "outcomes": outcomes})
        })
        .collect();
    let mut counts = Counts::default();
    for rec in tx.connection_records(id)? {
        counts.add(&rec.record);
    }
    let held: Vec<Value> = tx
        .proposals(Some(id), Some(ProposalState::Pending))?
        .iter()
        .filter(|p| parse_at(&p.expires_at) > now)
        .map(|p| {
            let mut c = card(p, now);
            c["yours"] = json!(names(p, person));
            c
        })
        .collect();
    let commands: Vec<Value> = tx
        .commands(id)?
        .iter()
        .map(|c| {
            json!({
                "event": c.event,
                "requester": c.by.requester,
                "requested_by": shown("requested by", &c.by.requested_by, &mut warnings),
                "verified": c.by.is_verified(),
                "verified_by": c.by.proof.as_ref().map(crate::store::Proof::method),
                "credential_id": c.by.assertion().map(|a| a.credential_id.clone()),
                "attempt": c.attempt,
                "at": c.at,
            })
        })
        .collect();
    let over = s.state.is_over() || s.state == State::Stopping;
    warnings.dedup();
    Ok(json!({
        "session": {
            "id": s.id,
            "shown_id": shown("session", &s.id, &mut warnings),
            "tenant": shown("tenant", &s.tenant, &mut warnings),
            "mode": s.mode,
            "state": s.state,
            "created_at": s.created_at,
            "ended_at": s.ended_at,
            "end_reason": s.end_reason,
            "outcome": s.outcome,
        },
        "attempts": attempts,
        "reset": reset,
        "connections": counts.view(),
        "held": held,
        "commands": commands,
        "can_revoke": role == Role::Operator && !over,
        "warnings": warnings,
    }))
}

/// The connections of a session's accepted batches, and its refusals, by
/// reason. A hand-off to the peer that holds the session is that peer's
/// connection (counted there); the session's DNS counts are no connection.
#[derive(Default)]
struct Counts {
    connections: u64,
    allowed: u64,
    refused: BTreeMap<String, u64>,
    requests: u64,
    requests_refused: BTreeMap<String, u64>,
}

impl Counts {
    fn add(&mut self, rec: &Value) {
        let text = |k: &str| rec.get(k).and_then(Value::as_str);
        if text("kind") == Some("dns") {
            return;
        }
        let verdict = text("verdict").unwrap_or("(no verdict)");
        if verdict == "allowed" && text("forwarded_to").is_some() {
            return;
        }
        self.connections += 1;
        if verdict == "allowed" {
            self.allowed += 1;
        } else {
            *self.refused.entry(bounded(verdict)).or_default() += 1;
        }
        for req in rec
            .get("requests")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            self.requests += 1;
            if let Some(reason) = req.get("refusal").and_then(Value::as_str) {
                *self.requests_refused.entry(bounded(reason)).or_default() += 1;
            }
        }
    }

    fn view(&self) -> Value {
        json!({
            "total": self.connections,
            "allowed": self.allowed,
            "refused": self.refused,
            "requests": self.requests,
            "requests_refused": self.requests_refused,
        })
    }
}

/// A reason from a record, as a key: a stable word, bounded (a record
/// comes from a gateway's signed batch, but is still not ours).
fn bounded(reason: &str) -> String {
    reason
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(64)
        .collect()
}
