//! The approval relay: the gateways' proposals in, the approvers' signed
//! decisions out.
//!
//! - **Receiving** ([`receive`], behind `ControlPlane.Propose`): the relay
//!   rebuilds the talos-certs [`Proposal`] from the message, writes the
//!   sentence and the digest itself and refuses the proposal if either is
//!   not what the gateway sent; the session must be running at that
//!   attempt, the gateway must hold its authority, the rule must exist and
//!   name exactly the proposal's approvers, and a request's path must be
//!   canonical (what the destination gets, and what the card shows) and
//!   one the rule holds, judged by the contract's rule
//!   ([`talos_contract::lock::LockRule::matches`], canonical path and
//!   routing key alike), as the gateway judged it. A proposal is stored
//!   `pending` once; the same id with the same digest again is
//!   acknowledged and changes nothing, another digest is refused. Every
//!   refusal is the answer to the gateway's call, at once: the gateway
//!   ends the held request then, rather than at the end of its time.
//! - **Deciding** ([`decide_signed`], behind the web app's Approve and
//!   Decline, which pass the person's verified passkey assertion; and
//!   [`decide`], behind `approvals approve|decline --as`, for tests and
//!   labs): a pending proposal not past its `expires_at`, an approver named
//!   both by the proposal and, still, by its rule; the decision is signed
//!   with the relay's key ([`crate::identity::RELAY_KEY`]) and delivered to
//!   the gateway that proposed, inside the store transaction that records
//!   it (with the assertion, when a person signed), so a delivery that
//!   fails records nothing. When a person signed, the signed decision
//!   carries the card and their assertion (talos-certs `Decision::card`,
//!   `Decision::assertion`): the gateway verifies the person's signature
//!   itself, and the relay's alone releases nothing.
//! - **Withdrawal** happens in the session state machine: a pause, an
//!   interruption or an end withdraws the session's pending proposals in
//!   the transition's own transaction.
//!
//! Proposals carry no secret (attachments by name only), so the relay logs
//! one JSON line per proposal received.

use std::time::SystemTime;

use serde::Serialize;
use talos_certs::{
    proposal_digest, sentence, Decision, GatewayKey, PasskeyAssertion, Proposal, ProposalKind,
    Verdict,
};
use talos_contract::path;

use crate::error::Error;
use crate::lifecycle::load;
use crate::link::GatewayLink;
use crate::lock::{self, LockRule};
use crate::model::{LockMode, ProposalState, State};
use crate::names;
use crate::pb;
use crate::store::{now, ProposalRecord, SignedByPasskey, Store, Tx};

/// The largest proposal message accepted, encoded: proposals are a few
/// hundred bytes; the bound keeps a confused gateway from filling the store.
pub const MAX_PROPOSAL_LEN: usize = 64 * 1024;

/// The longest proposal id, in bytes.
pub const MAX_PROPOSAL_ID_LEN: usize = 200;

/// What [`receive`] made of a proposal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Received {
    /// New, checked and stored pending.
    New(Box<ProposalRecord>),
    /// New, checked and stored pending, joined to the card of the same
    /// first use (`card`, a proposal id; see [`first_use_card`]): no card
    /// of its own. When that card is decided already, [`answer_joined`]
    /// answers it.
    Joined {
        record: Box<ProposalRecord>,
        card: String,
    },
    /// Received before with the same digest: nothing changed.
    Again { proposal_id: String },
}

fn invalid(reason: impl Into<String>) -> Error {
    Error::ProposalInvalid {
        reason: reason.into(),
    }
}

fn stale(reason: impl Into<String>) -> Error {
    Error::ProposalStale {
        reason: reason.into(),
    }
}

fn bounded(text: &str) -> String {
    text.chars().take(100).collect()
}

/// An RFC 3339 time as the proposal states it.
fn time(what: &str, text: &str) -> Result<SystemTime, Error> {
    humantime::parse_rfc3339_weak(text)
        .map_err(|e| invalid(format!("{what} {:?}: {e}", bounded(text))))
}

/// The talos-certs proposal a message carries, with the sentence and the
/// digest written here from its fields (not the ones it states).
pub fn proposal_from_msg(msg: &pb::ProposalMsg) -> Result<(Proposal, String, String), Error> {
    if prost::Message::encoded_len(msg) > MAX_PROPOSAL_LEN {
        return Err(invalid(format!(
            "the proposal is over {MAX_PROPOSAL_LEN} bytes"
        )));
    }
    if msg.proposal_id.is_empty()
        || msg.proposal_id.len() > MAX_PROPOSAL_ID_LEN
        || !msg.proposal_id.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(invalid(format!(
            "proposal_id {:?}: 1 to {MAX_PROPOSAL_ID_LEN} printable characters",
            bounded(&msg.proposal_id)
        )));
    }
    names::gateway_id(&msg.gateway_id).map_err(|e| invalid(e.to_string()))?;
    let kind = ProposalKind::parse(&msg.kind).ok_or_else(|| {
        invalid(format!(
            "kind {:?} is not request or agent",
            bounded(&msg.kind)
        ))
    })?;
    time("created_at", &msg.created_at)?;
    time("expires_at", &msg.expires_at)?;
    let p = Proposal {
        proposal_id: msg.proposal_id.clone(),
        gateway_id: msg.gateway_id.clone(),
        session_id: msg.session_id.clone(),
        attempt: msg.attempt,
        tenant: msg.tenant.clone(),
        kind,
        destination: msg.destination.clone(),
        method: msg.method.clone(),
        path: msg.path.clone(),
        attachments: msg.attachments.clone(),
        rule: msg.rule.clone(),
        tool: msg.tool.clone(),
        call_digest: msg.call_digest.clone(),
        approvers: msg.approvers.clone(),
        created_at: msg.created_at.clone(),
        expires_at: msg.expires_at.clone(),
    };
    let s = sentence(&p);
    let d = proposal_digest(&p, &s);
    Ok((p, s, d))
}

/// Check a gateway's proposal and store it pending (see the module docs).
/// `gateway_id` is checked against the client certificate by the caller.
pub fn receive(store: &mut Store, msg: &pb::ProposalMsg) -> Result<Received, Error> {
    let (p, s, d) = proposal_from_msg(msg)?;
    if msg.sentence != s {
        return Err(invalid(
            "the sentence is not the one the proposal's fields give",
        ));
    }
    if msg.digest != d {
        return Err(invalid(
            "the digest is not the one the proposal's fields and sentence give",
        ));
    }
    store.write(|tx| {
        if let Some(known) = tx.proposal(&p.proposal_id)? {
            return if known.digest == d {
                Ok(Received::Again {
                    proposal_id: known.proposal_id,
                })
            } else {
                Err(Error::ProposalConflict {
                    id: bounded(&p.proposal_id),
                })
            };
        }
        let session = tx
            .session(&p.session_id)?
            .ok_or_else(|| stale(format!("no session {}", bounded(&p.session_id))))?;
        if session.tenant != p.tenant {
            return Err(invalid(format!(
                "session {} is tenant {}'s, not {}",
                session.id,
                session.tenant,
                bounded(&p.tenant)
            )));
        }
        if session.state != State::Running {
            return Err(stale(format!(
                "session {} is {}, not running",
                session.id, session.state
            )));
        }
        let current = tx.attempts(&session.id)?.last().map_or(0, |a| a.n);
        if current != p.attempt {
            return Err(stale(format!(
                "session {} is at attempt {current}, not {}",
                session.id, p.attempt
            )));
        }
        let holds = tx.cas(&session.id)?.iter().any(|c| {
            c.attempt == p.attempt && c.gateway_id == p.gateway_id && c.destroyed_at.is_none()
        });
        if !holds {
            return Err(stale(format!(
                "gateway {} holds no authority for session {} attempt {}",
                p.gateway_id, session.id, p.attempt
            )));
        }
        let rule = tx
            .lock_rule(&p.rule)?
            .ok_or_else(|| stale(format!("no Lock rule {}", bounded(&p.rule))))?;
        if rule.approvers != p.approvers {
            return Err(invalid(format!(
                "the approvers {:?} are not rule {}'s {:?}",
                p.approvers.iter().map(|a| bounded(a)).collect::<Vec<_>>(),
                rule.id,
                rule.approvers
            )));
        }
        if p.kind == ProposalKind::Request && path::canonical(&p.path) != p.path {
            return Err(invalid(format!(
                "the path {:?} is not canonical (the card shows the path the destination gets)",
                bounded(&p.path)
            )));
        }
        if p.kind == ProposalKind::Request
            && !rule.matches_request(&p.destination, &p.method, &p.path, &p.attachments)
        {
            return Err(invalid(format!(
                "rule {} does not match {} {} to {}",
                rule.id,
                bounded(&p.method),
                bounded(&p.path),
                bounded(&p.destination)
            )));
        }
        let answered_by = if rule.mode == LockMode::FirstUse && p.kind == ProposalKind::Request {
            first_use_card(tx, &p)?.map(|c| c.proposal_id)
        } else {
            None
        };
        let record = ProposalRecord {
            proposal_id: p.proposal_id.clone(),
            gateway_id: p.gateway_id.clone(),
            session_id: p.session_id.clone(),
            attempt: p.attempt,
            rule: p.rule.clone(),
            sentence: s.clone(),
            digest: d.clone(),
            state: ProposalState::Pending,
            approver: None,
            decided_at: None,
            created_at: p.created_at.clone(),
            expires_at: p.expires_at.clone(),
            received_at: now(),
            decision: None,
            outcome: None,
            assertion: None,
            fields: p.clone(),
            answered_by: answered_by.clone(),
        };
        tx.insert_proposal(&record)?;
        Ok(match answered_by {
            Some(card) => Received::Joined {
                record: Box::new(record),
                card,
            },
            None => Received::New(Box::new(record)),
        })
    })
}

/// The card that carries `p`'s first use, if one does: the first proposal
/// received of the same session attempt, tenant and `first_use` rule,
/// naming the same approvers, that is a card itself (joined to none) and
/// still waits or was approved. A declined card carries nothing (the first
/// use was refused, the next one asks again), nor one that expired or was
/// withdrawn.
fn first_use_card(tx: &Tx<'_>, p: &Proposal) -> Result<Option<ProposalRecord>, Error> {
    Ok(tx
        .proposals(Some(&p.session_id), None)?
        .into_iter()
        .find(|c| {
            c.answered_by.is_none()
                && matches!(c.state, ProposalState::Pending | ProposalState::Approved)
                && c.fields.kind == ProposalKind::Request
                && c.attempt == p.attempt
                && c.fields.tenant == p.tenant
                && c.rule == p.rule
                && c.fields.approvers == p.approvers
        }))
}

/// Whether a pending proposal's time is up (an `expires_at` that does not
/// parse counts as up: nothing can be decided against it).
fn overdue(p: &ProposalRecord, at: SystemTime) -> bool {
    humantime::parse_rfc3339_weak(&p.expires_at).map_or(true, |t| at > t)
}

/// Mark every pending proposal past its `expires_at` expired; returns how
/// many.
pub fn expire_overdue(store: &mut Store) -> Result<usize, Error> {
    let at = SystemTime::now();
    let stamp = now();
    store.write(|tx| {
        let mut n = 0;
        for p in tx.proposals(None, Some(ProposalState::Pending))? {
            if overdue(&p, at) {
                tx.close_proposal(&p.proposal_id, ProposalState::Expired, &stamp)?;
                n += 1;
            }
        }
        unjoin_orphans(tx)?;
        Ok(n)
    })
}

/// Every pending proposal joined to a card that ended with no decision
/// (expired, withdrawn) becomes a card of its own: its first use still
/// waits for a person.
fn unjoin_orphans(tx: &Tx<'_>) -> Result<(), Error> {
    for joined in tx.joined_pending()? {
        let card = match &joined.answered_by {
            Some(id) => tx.proposal(id)?,
            None => continue,
        };
        if card.is_none_or(|c| matches!(c.state, ProposalState::Expired | ProposalState::Withdrawn))
        {
            tx.unjoin_proposal(&joined.proposal_id)?;
        }
    }
    Ok(())
}

/// A card as `approvals list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Card {
    pub id: String,
    pub session_id: String,
    pub attempt: u32,
    pub tenant: String,
    pub gateway_id: String,
    pub kind: ProposalKind,
    pub rule: String,
    pub sentence: String,
    pub digest: String,
    pub approvers: Vec<String>,
    pub state: ProposalState,
    pub created_at: String,
    pub expires_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approver: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<String>,
    /// A proposal joined to another's card (one card per first use): that
    /// card's id. Listed only with `--all`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<String>,
}

impl Card {
    fn of(p: ProposalRecord) -> Card {
        Card {
            id: p.proposal_id,
            session_id: p.session_id,
            attempt: p.attempt,
            tenant: p.fields.tenant,
            gateway_id: p.gateway_id,
            kind: p.fields.kind,
            rule: p.rule,
            sentence: p.sentence,
            digest: p.digest,
            approvers: p.fields.approvers,
            state: p.state,
            created_at: p.created_at,
            expires_at: p.expires_at,
            approver: p.approver,
            decided_at: p.decided_at,
            answered_by: p.answered_by,
        }
    }
}

/// The cards: pending ones (after marking the overdue expired; a proposal
/// joined to another's card is no card), or every proposal with `all`;
/// only those `approver` may decide, when given.
pub fn cards(store: &mut Store, approver: Option<&str>, all: bool) -> Result<Vec<Card>, Error> {
    expire_overdue(store)?;
    let state = (!all).then_some(ProposalState::Pending);
    let list = store.read(|tx| tx.proposals(None, state))?;
    Ok(list
        .into_iter()
        .filter(|p| all || p.answered_by.is_none())
        .filter(|p| approver.is_none_or(|a| p.fields.approvers.iter().any(|x| x == a)))
        .map(Card::of)
        .collect())
}

/// A decision made and delivered: what `approvals approve|decline` print.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Decided {
    pub proposal_id: String,
    pub session_id: String,
    pub decision: Verdict,
    pub approver: String,
    pub decided_at: String,
    pub proposal_digest: String,
    /// The gateway's answer: `released` or `refused`.
    pub outcome: String,
    /// The signed decision as delivered (talos-certs `Signed`, JSON).
    pub signed: serde_json::Value,
    /// The person's passkey assertion that authorised it (the web app).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub assertion: Option<SignedByPasskey>,
    /// The proposals joined to this card (the same first use on another
    /// member, or held again meanwhile), answered with the same decision.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub also_answered: Vec<Answered>,
}

/// A proposal joined to a card, answered with the card's decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Answered {
    pub proposal_id: String,
    pub gateway_id: String,
    /// The gateway's answer: `released` or `refused`; or `not_taken: …`
    /// when it answered but did not take the decision (its request is no
    /// longer held there, say).
    pub outcome: String,
}

/// Decide proposal `id` as `approver` (see the module docs), with nothing
/// but the relay's word: `approvals approve|decline --as` (tests and
/// labs). On any error nothing changes, except that a pending proposal
/// found past its time is marked expired.
pub fn decide(
    store: &mut Store,
    link: &dyn GatewayLink,
    key: &GatewayKey,
    id: &str,
    approver: &str,
    verdict: Verdict,
) -> Result<Decided, Error> {
    decide_signed(store, link, key, id, approver, verdict, |_, _| Ok(None))
}

/// Proposal `id`, if `approver` may decide it now: a card (not joined to
/// another), pending and in time, `approver` named by it and still by its
/// rule, its session running. Read inside the decision's transaction.
fn decidable(tx: &Tx<'_>, id: &str, approver: &str) -> Result<ProposalRecord, Error> {
    let p = tx
        .proposal(id)?
        .ok_or_else(|| Error::ApprovalNotFound { id: bounded(id) })?;
    if p.state != ProposalState::Pending {
        return Err(Error::ApprovalNotPending {
            id: p.proposal_id,
            state: p.state.as_str(),
        });
    }
    if let Some(card) = p.answered_by {
        return Err(Error::ApprovalJoined {
            id: p.proposal_id,
            card,
        });
    }
    if overdue(&p, SystemTime::now()) {
        return Err(Error::ApprovalNotPending {
            id: p.proposal_id,
            state: ProposalState::Expired.as_str(),
        });
    }
    // Listed by the proposal, and still by its rule: removing a rule or
    // an approver from the Lock takes effect on cards already shown.
    let rule: Option<LockRule> = tx.lock_rule(&p.rule)?;
    let listed = p.fields.approvers.iter().any(|a| a == approver)
        && rule.is_some_and(|r| r.approvers.iter().any(|a| a == approver));
    if !listed {
        return Err(Error::ApproverNotListed {
            id: p.proposal_id,
            approver: approver.to_owned(),
        });
    }
    // A proposal of a session that is no longer running was withdrawn
    // with the transition; this holds the line should one slip by.
    let session = load(tx, &p.session_id)?;
    if session.state != State::Running {
        return Err(Error::ApprovalNotPending {
            id: p.proposal_id,
            state: ProposalState::Withdrawn.as_str(),
        });
    }
    Ok(p)
}

/// [`decide`], with `sign` run inside the decision's transaction after the
/// relay's own checks (pending, in time, `approver` named by the card and
/// still by its rule, the session running) and before the decision is
/// signed and delivered: it checks the person's passkey assertion over the
/// card (the web app's `people::ceremony`) and returns it, to be recorded
/// with the decision. Its error refuses the decision, and nothing changes
/// (the passkey's sign count included: it is written in the same
/// transaction).
pub fn decide_signed(
    store: &mut Store,
    link: &dyn GatewayLink,
    key: &GatewayKey,
    id: &str,
    approver: &str,
    verdict: Verdict,
    sign: impl FnOnce(&Tx<'_>, &ProposalRecord) -> Result<Option<SignedByPasskey>, Error>,
) -> Result<Decided, Error> {
    let approver = lock::approver(approver)?;
    let not_found = || Error::ApprovalNotFound { id: bounded(id) };
    // Expiry first, in its own transaction, so that it stays recorded
    // while the decision is refused.
    let at = SystemTime::now();
    let expired = store.write(|tx| {
        let p = tx.proposal(id)?.ok_or_else(not_found)?;
        if p.state == ProposalState::Pending && overdue(&p, at) {
            tx.close_proposal(id, ProposalState::Expired, &now())?;
            return Ok(true);
        }
        Ok(false)
    })?;
    if expired {
        return Err(Error::ApprovalNotPending {
            id: bounded(id),
            state: ProposalState::Expired.as_str(),
        });
    }
    let mut decided = store.write(|tx| {
        let p = decidable(tx, id, &approver)?;
        let assertion = sign(tx, &p)?;
        let decided_at = now();
        let decision = Decision {
            proposal_id: p.proposal_id.clone(),
            proposal_digest: p.digest.clone(),
            approver: approver.clone(),
            decision: verdict,
            decided_at: decided_at.clone(),
            // The person's assertion travels inside the relay's signed
            // decision, with the card it signs, for the gateway to verify
            // itself (talos-certs `webauthn::verify_person`).
            card: assertion.as_ref().map(|_| p.fields.clone()),
            assertion: assertion.as_ref().map(|a| PasskeyAssertion {
                credential_id: a.credential_id.clone(),
                authenticator_data: a.authenticator_data.clone(),
                client_data_json: a.client_data_json.clone(),
                signature: a.signature.clone(),
                user_handle: a.user_handle.clone(),
            }),
        };
        let signed = decision.sign(key);
        let outcome = link.decide(&p.gateway_id, &signed)?;
        let envelope = serde_json::to_value(&signed)?;
        let state = match verdict {
            Verdict::Approved => ProposalState::Approved,
            Verdict::Declined => ProposalState::Declined,
        };
        tx.decide_proposal(
            &p.proposal_id,
            state,
            &approver,
            &decided_at,
            &envelope,
            &outcome,
            assertion.as_ref(),
        )?;
        Ok(Decided {
            proposal_id: p.proposal_id,
            session_id: p.session_id,
            decision: verdict,
            approver: approver.clone(),
            decided_at,
            proposal_digest: p.digest,
            outcome,
            signed: envelope,
            assertion,
            also_answered: Vec::new(),
        })
    })?;
    // The card's decision is made and recorded: the proposals joined to
    // it are answered now, each on its own (a member out of reach leaves
    // its proposal waiting for `serve`'s next round, not the card undone).
    match answer_joined(store, link, key, Some(&decided.proposal_id)) {
        Ok(answered) => decided.also_answered = answered,
        // The card's decision stands; `serve`'s next round answers them.
        Err(e) => eprintln!(
            "{}",
            serde_json::json!({"card": decided.proposal_id, "status": "joined_unanswered", "error": e.code(), "message": e.to_string()})
        ),
    }
    Ok(decided)
}

/// Answer the pending proposals joined to a decided card (those of
/// `card_id`, or of every card) with the card's decision: for each, the
/// relay signs a decision for that proposal (its own id and digest) that
/// carries the card the person signed and their assertion, as the card's
/// own did, and delivers it to the member that proposed; the member checks
/// the card is its own first use and verifies the assertion itself. Each
/// in a transaction of its own, recorded with the gateway's answer; a
/// member that cannot be reached leaves its proposal pending for the next
/// call (`serve`'s upkeep calls this every round), as does one whose
/// transaction failed. Joined proposals whose card ended with no decision,
/// or whose card's decision no longer verifies under `key`, become cards
/// of their own. Fails only when the store cannot be read at all.
pub fn answer_joined(
    store: &mut Store,
    link: &dyn GatewayLink,
    key: &GatewayKey,
    card_id: Option<&str>,
) -> Result<Vec<Answered>, Error> {
    let joined = store.read(|tx| match card_id {
        Some(card) => tx.joined_to(card),
        None => tx.joined_pending(),
    })?;
    let mut answered = Vec::new();
    for j in joined {
        let result = store.write(|tx| {
            let Some(p) = tx.proposal(&j.proposal_id)? else {
                return Ok(None);
            };
            let (ProposalState::Pending, Some(card_id)) = (p.state, &p.answered_by) else {
                return Ok(None);
            };
            let Some(card) = tx.proposal(card_id)? else {
                tx.unjoin_proposal(&p.proposal_id)?;
                return Ok(None);
            };
            let verdict = match card.state {
                ProposalState::Approved => Verdict::Approved,
                ProposalState::Declined => Verdict::Declined,
                ProposalState::Pending => return Ok(None),
                ProposalState::Expired | ProposalState::Withdrawn => {
                    tx.unjoin_proposal(&p.proposal_id)?;
                    return Ok(None);
                }
            };
            let (Some(envelope), Some(approver)) = (&card.decision, &card.approver) else {
                return Ok(None);
            };
            // The card's decision as the relay signed it. One that no
            // longer verifies under the relay's key (the key was replaced
            // since) cannot answer anything: the proposal becomes a card of
            // its own, for a person to decide.
            let card_decision = serde_json::from_value::<talos_certs::Signed>(envelope.clone())
                .map_err(|e| e.to_string())
                .and_then(|signed| {
                    talos_certs::verify_decision(&key.public_key(), &signed)
                        .map_err(|e| e.to_string())
                });
            let card_decision = match card_decision {
                Ok(d) => d,
                Err(e) => {
                    eprintln!(
                        "{}",
                        serde_json::json!({"proposal": p.proposal_id, "status": "unjoined", "card": card.proposal_id, "why": format!("the card's decision does not verify under the relay's key: {e}")})
                    );
                    tx.unjoin_proposal(&p.proposal_id)?;
                    return Ok(None);
                }
            };
            let decided_at = now();
            let decision = Decision {
                proposal_id: p.proposal_id.clone(),
                proposal_digest: p.digest.clone(),
                approver: approver.clone(),
                decision: verdict,
                decided_at: decided_at.clone(),
                card: card_decision.card,
                assertion: card_decision.assertion,
            };
            let signed = decision.sign(key);
            let outcome = match link.decide(&p.gateway_id, &signed) {
                Ok(outcome) => outcome,
                Err(crate::error::LinkError::Refused { reason, .. }) => {
                    format!("not_taken: {}", bounded(&reason))
                }
                Err(e) => return Err(Error::from(e)),
            };
            let state = match verdict {
                Verdict::Approved => ProposalState::Approved,
                Verdict::Declined => ProposalState::Declined,
            };
            tx.decide_proposal(
                &p.proposal_id,
                state,
                approver,
                &decided_at,
                &serde_json::to_value(&signed)?,
                &outcome,
                card.assertion.as_ref(),
            )?;
            Ok(Some(Answered {
                proposal_id: p.proposal_id,
                gateway_id: p.gateway_id,
                outcome,
            }))
        });
        match result {
            Ok(Some(a)) => {
                eprintln!(
                    "{}",
                    serde_json::json!({"proposal": a.proposal_id, "status": "answered_by_card", "card": j.answered_by, "gateway_id": a.gateway_id, "outcome": a.outcome})
                );
                answered.push(a);
            }
            Ok(None) => {}
            // Left pending for the next round, the others answered
            // meanwhile: a member out of reach, or the store failing for
            // this one.
            Err(e) => {
                eprintln!(
                    "{}",
                    serde_json::json!({"proposal": j.proposal_id, "status": "answer_undelivered", "card": j.answered_by, "gateway_id": j.gateway_id, "error": e.code(), "message": e.to_string()})
                );
            }
        }
    }
    Ok(answered)
}
