//! Approval proposals and the relay's signed decisions (the Lock).
//!
//! When a request matches a Lock rule, or an agent proposes an action of
//! its own at `approvals.hangar.internal`, the gateway holds it and sends a
//! [`Proposal`] to the approval relay. The card an approver sees says the
//! [`sentence`] written from the proposal's fields by this one
//! deterministic function, and [`proposal_digest`] binds that sentence to
//! the fields: SHA-384 of the canonical JSON
//! `{"fields":{…},"sentence":"…"}` (fields in the struct's order, no
//! whitespace). The gateway and the relay each compute both; a relay that
//! shows another sentence, or fields that were changed on the way, give
//! another digest.
//!
//! The relay answers with a [`Decision`] signed by its own Ed25519 key as
//! [`Kind::Decision`]: the proposal id, the proposal digest, the approver,
//! `approved` or `declined`, and when; and, when a person decided with
//! their passkey, the card they saw (its [`Proposal`] fields) and their
//! device's WebAuthn assertion over it ([`PasskeyAssertion`], signed over
//! `talos_certs::webauthn::decision_challenge(card digest, verdict)`). The
//! gateway releases or refuses the request only after [`verify_decision`]
//! under the relay key it was given with the session, only if the digest
//! is the one it computed, and only after it verified the person's
//! assertion itself against the keys the session's open listed (the
//! gateway's `session::person`): the relay's signature says the relay
//! delivered it, the person's says the person decided.
//!
//! # The decision payload
//!
//! ```text
//! {"proposal_id":"gw-a-17","proposal_digest":"<96 hex>","approver":"alice","decision":"approved","decided_at":"2026-11-29T10:00:00.000Z"}
//! ```
//!
//! A decision a person signed has two members more, after those five:
//!
//! ```text
//! ..."decided_at":"…","card":{<the card's sixteen Proposal fields>},"assertion":{"credential_id":"…","authenticator_data":"…","client_data_json":"…","signature":"…","user_handle":"…"}}
//! ```
//!
//! `card` is the card the person signed: the proposal itself (the same
//! id and digest as the first two members), or, when a `first_use` rule's
//! one card answers another member's identical first use, that other
//! member's card (the gateway then checks it is the same session,
//! attempt and rule as its own held first use). The assertion's fields are
//! base64url without padding, as WebAuthn's JSON forms carry them;
//! `user_handle` is left out when the authenticator gave none. A decision
//! without a person's assertion (`control-stub approvals approve --as`,
//! behind the account's lab setting) has neither member, and its bytes are
//! exactly the five-member payload above.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::batch::{json_error, SameBytes};
use crate::digest::{is_sha384_hex, sha384_hex};
use crate::signing::{verify, GatewayKey, Kind, Signed, VerifyError};

/// The largest decision payload parsed: 96 KiB. A decision carries its
/// card (the relay takes proposals of up to 64 KiB) and a person's
/// assertion (at most about 14 KiB of base64url, WebAuthn's own bounds:
/// `talos_certs::webauthn`'s `MAX_*_LEN`).
pub const MAX_DECISION_LEN: usize = 96 * 1024;

/// What is proposed: a request the Lock held, or an agent's own action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProposalKind {
    /// A request to a destination that matched a Lock rule.
    Request,
    /// `POST https://approvals.hangar.internal/v1/proposals` from the agent.
    Agent,
}

impl ProposalKind {
    /// `request` or `agent`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProposalKind::Request => "request",
            ProposalKind::Agent => "agent",
        }
    }

    /// Parse `request` or `agent`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "request" => Some(ProposalKind::Request),
            "agent" => Some(ProposalKind::Agent),
            _ => None,
        }
    }
}

/// The fields of a proposal, in their canonical order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Proposal {
    /// Unique per gateway (the gateway id, a dash, a counter and a random
    /// part).
    pub proposal_id: String,
    pub gateway_id: String,
    pub session_id: String,
    pub attempt: u32,
    pub tenant: String,
    pub kind: ProposalKind,
    /// The destination name (canonical); `approvals.hangar.internal` for an
    /// agent proposal.
    pub destination: String,
    /// The request's method and path, without the query.
    pub method: String,
    pub path: String,
    /// The names of the attachments the request carries, sorted.
    pub attachments: Vec<String>,
    /// The id of the Lock rule that held it.
    pub rule: String,
    /// Agent proposals: the tool's name and the SHA-384 (hex) of the exact
    /// call; empty for requests.
    pub tool: String,
    pub call_digest: String,
    /// Who may decide (from the rule), sorted.
    pub approvers: Vec<String>,
    /// RFC 3339 UTC: made, and the last moment a decision counts.
    pub created_at: String,
    pub expires_at: String,
}

/// The card's sentence, written from the proposal's fields alone.
pub fn sentence(p: &Proposal) -> String {
    match p.kind {
        ProposalKind::Request => {
            let carrying = if p.attachments.is_empty() {
                "with no attached credential".to_owned()
            } else {
                format!("carrying {}", p.attachments.join(", "))
            };
            format!(
                "Session {} (tenant {}, attempt {}) wants to send {} {} to {}, {}. Rule {} asks {} to decide by {}.",
                p.session_id,
                p.tenant,
                p.attempt,
                p.method,
                p.path,
                p.destination,
                carrying,
                p.rule,
                p.approvers.join(" or "),
                p.expires_at,
            )
        }
        ProposalKind::Agent => format!(
            "The agent in session {} (tenant {}, attempt {}) proposes to run the tool {} with the exact call whose SHA-384 is {}. Rule {} asks {} to decide by {}.",
            p.session_id,
            p.tenant,
            p.attempt,
            p.tool,
            p.call_digest,
            p.rule,
            p.approvers.join(" or "),
            p.expires_at,
        ),
    }
}

#[derive(Serialize)]
struct Bound<'a> {
    fields: &'a Proposal,
    sentence: &'a str,
}

/// SHA-384 (hex) binding `sentence` to the proposal's fields.
pub fn proposal_digest(p: &Proposal, sentence: &str) -> String {
    let bytes = serde_json::to_vec(&Bound {
        fields: p,
        sentence,
    })
    .expect("strings and numbers always serialise");
    sha384_hex(&bytes)
}

/// The control channel's message proposing `p` (`ControlPlane.Propose`),
/// with its `sentence` and `digest` ([`sentence`], [`proposal_digest`]).
pub fn proposal_msg(
    p: Proposal,
    sentence: String,
    digest: String,
) -> talos_contract::pb::ProposalMsg {
    talos_contract::pb::ProposalMsg {
        proposal_id: p.proposal_id,
        gateway_id: p.gateway_id,
        session_id: p.session_id,
        attempt: p.attempt,
        tenant: p.tenant,
        kind: p.kind.as_str().to_owned(),
        destination: p.destination,
        method: p.method,
        path: p.path,
        attachments: p.attachments,
        rule: p.rule,
        tool: p.tool,
        call_digest: p.call_digest,
        approvers: p.approvers,
        created_at: p.created_at,
        expires_at: p.expires_at,
        sentence,
        digest,
    }
}

/// [`proposal_msg`] with the sentence and digest computed here, as a
/// gateway computes them.
pub fn proposal_msg_of(p: &Proposal) -> talos_contract::pb::ProposalMsg {
    let sentence = sentence(p);
    let digest = proposal_digest(p, &sentence);
    proposal_msg(p.clone(), sentence, digest)
}

/// The decision an approver made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Approved,
    Declined,
}

impl Verdict {
    /// `approved` or `declined`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Approved => "approved",
            Verdict::Declined => "declined",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A relay's decision on one proposal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    pub proposal_id: String,
    pub proposal_digest: String,
    pub approver: String,
    pub decision: Verdict,
    pub decided_at: String,
    /// The card the person signed (see the module's "The decision
    /// payload"); with `assertion`, or neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub card: Option<Proposal>,
    /// The person's WebAuthn assertion over the card's digest and the
    /// verdict; none in a decision only the relay signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assertion: Option<PasskeyAssertion>,
}

/// What `navigator.credentials.get` returned when a person decided, as the
/// relay forwards it: each field base64url without padding. Nothing here
/// is secret (a signature over a public challenge); `Debug` shows the
/// credential id and the lengths.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PasskeyAssertion {
    /// `rawId`.
    pub credential_id: String,
    /// `response.authenticatorData`.
    pub authenticator_data: String,
    /// `response.clientDataJSON`.
    pub client_data_json: String,
    /// `response.signature`.
    pub signature: String,
    /// `response.userHandle`, when the authenticator gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_handle: Option<String>,
}

impl fmt::Debug for PasskeyAssertion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PasskeyAssertion")
            .field("credential_id", &self.credential_id)
            .field("authenticator_data", &self.authenticator_data.len())
            .field("client_data_json", &self.client_data_json.len())
            .field("signature", &self.signature.len())
            .finish_non_exhaustive()
    }
}

impl Decision {
    /// The canonical payload.
    pub fn payload(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("strings always serialise")
    }

    /// Sign as [`Kind::Decision`] with the relay's key.
    pub fn sign(&self, key: &GatewayKey) -> Signed {
        key.sign(Kind::Decision, self.payload())
    }
}

/// Why a decision was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecisionError {
    #[error("envelope kind is {0}, not decision")]
    WrongKind(Kind),
    #[error("signature: {0}")]
    Signature(VerifyError),
    #[error("payload is {0} bytes, over the limit")]
    TooLarge(usize),
    #[error("malformed decision: {0}")]
    Malformed(String),
}

impl DecisionError {
    /// A stable snake_case name.
    pub fn as_str(&self) -> &'static str {
        match self {
            DecisionError::WrongKind(_) => "wrong_kind",
            DecisionError::Signature(_) => "bad_signature",
            DecisionError::TooLarge(_) | DecisionError::Malformed(_) => "malformed",
        }
    }
}

/// Check a signed decision under the relay's `public_key` and parse it.
/// The caller then checks the proposal id and digest are the ones it
/// holds, and the approver is one it listed.
pub fn verify_decision(public_key: &[u8; 32], signed: &Signed) -> Result<Decision, DecisionError> {
    if signed.kind != Kind::Decision {
        return Err(DecisionError::WrongKind(signed.kind));
    }
    if signed.payload.len() > MAX_DECISION_LEN {
        return Err(DecisionError::TooLarge(signed.payload.len()));
    }
    verify(public_key, signed).map_err(DecisionError::Signature)?;
    let decision: Decision = serde_json::from_slice(&signed.payload)
        .map_err(|e| DecisionError::Malformed(json_error(&e)))?;
    let mut same = SameBytes {
        rest: &signed.payload,
    };
    if serde_json::to_writer(&mut same, &decision).is_err() || !same.rest.is_empty() {
        return Err(DecisionError::Malformed(
            "not in the canonical decision encoding".into(),
        ));
    }
    if !is_sha384_hex(&decision.proposal_digest) {
        return Err(DecisionError::Malformed(
            "proposal_digest is not 96 lowercase hex digits".into(),
        ));
    }
    if decision.card.is_some() != decision.assertion.is_some() {
        return Err(DecisionError::Malformed(
            "a decision carries a card and an assertion together, or neither".into(),
        ));
    }
    Ok(decision)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proposal(kind: ProposalKind) -> Proposal {
        Proposal {
            proposal_id: "gw-a-1-7f3a".into(),
            gateway_id: "gw-a".into(),
            session_id: "sbx-1".into(),
            attempt: 2,
            tenant: "acme".into(),
            kind,
            destination: "api.github.com".into(),
            method: "POST".into(),
            path: "/repos/acme/widgets/merges".into(),
            attachments: vec!["GITHUB_TOKEN".into()],
            rule: "lock-1".into(),
            tool: String::new(),
            call_digest: String::new(),
            approvers: vec!["alice".into(), "bob".into()],
            created_at: "2026-11-29T10:00:00.000Z".into(),
            expires_at: "2026-11-29T10:05:00.000Z".into(),
        }
    }

    #[test]
    fn the_sentence_says_what_the_fields_say() {
        let p = proposal(ProposalKind::Request);
        assert_eq!(
            sentence(&p),
            "Session sbx-1 (tenant acme, attempt 2) wants to send POST /repos/acme/widgets/merges to api.github.com, carrying GITHUB_TOKEN. Rule lock-1 asks alice or bob to decide by 2026-11-29T10:05:00.000Z."
        );
    }

    #[test]
    fn the_digest_binds_every_field_and_the_sentence() {
        let p = proposal(ProposalKind::Request);
        let s = sentence(&p);
        let d = proposal_digest(&p, &s);
        assert_eq!(d.len(), 96);
        assert_ne!(d, proposal_digest(&p, &format!("{s} ")));
        let mut q = p.clone();
        q.path.push('x');
        assert_ne!(d, proposal_digest(&q, &s));
        let mut q = p.clone();
        q.approvers.pop();
        assert_ne!(d, proposal_digest(&q, &s));
    }

    #[test]
    fn decisions_verify_only_under_the_relay_key_and_as_decisions() {
        let relay = GatewayKey::generate().unwrap();
        let other = GatewayKey::generate().unwrap();
        let d = Decision {
            proposal_id: "gw-a-1-7f3a".into(),
            proposal_digest: "ab".repeat(48),
            approver: "alice".into(),
            decision: Verdict::Approved,
            decided_at: "2026-11-29T10:01:00.000Z".into(),
            card: None,
            assertion: None,
        };
        let signed = d.sign(&relay);
        assert_eq!(verify_decision(&relay.public_key(), &signed), Ok(d.clone()));
        assert_eq!(
            verify_decision(&other.public_key(), &signed)
                .unwrap_err()
                .as_str(),
            "bad_signature"
        );
        let as_batch = relay.sign(Kind::Batch, d.payload());
        assert_eq!(
            verify_decision(&relay.public_key(), &as_batch)
                .unwrap_err()
                .as_str(),
            "wrong_kind"
        );
        let mut flipped = signed.clone();
        flipped.payload[20] ^= 1;
        assert!(verify_decision(&relay.public_key(), &flipped).is_err());
    }

    #[test]
    fn a_decision_without_a_person_is_the_five_member_payload() {
        let d = Decision {
            proposal_id: "gw-a-1".into(),
            proposal_digest: "ab".repeat(48),
            approver: "alice".into(),
            decision: Verdict::Declined,
            decided_at: "2026-11-29T10:01:00.000Z".into(),
            card: None,
            assertion: None,
        };
        assert_eq!(
            String::from_utf8(d.payload()).unwrap(),
            format!(
                "{{\"proposal_id\":\"gw-a-1\",\"proposal_digest\":\"{}\",\"approver\":\"alice\",\"decision\":\"declined\",\"decided_at\":\"2026-11-29T10:01:00.000Z\"}}",
                "ab".repeat(48)
            )
        );
    }

    #[test]
    fn a_person_signed_decision_carries_card_and_assertion_together() {
        let relay = GatewayKey::generate().unwrap();
        let card = proposal(ProposalKind::Request);
        let digest = proposal_digest(&card, &sentence(&card));
        let assertion = PasskeyAssertion {
            credential_id: "Y3JlZA".into(),
            authenticator_data: "YXV0aA".into(),
            client_data_json: "e30".into(),
            signature: "c2ln".into(),
            user_handle: None,
        };
        let d = Decision {
            proposal_id: card.proposal_id.clone(),
            proposal_digest: digest,
            approver: "alice".into(),
            decision: Verdict::Approved,
            decided_at: "2026-11-29T10:01:00.000Z".into(),
            card: Some(card),
            assertion: Some(assertion),
        };
        let signed = d.sign(&relay);
        assert_eq!(verify_decision(&relay.public_key(), &signed), Ok(d.clone()));
        let text = String::from_utf8(signed.payload.clone()).unwrap();
        assert!(text.contains(",\"card\":{\"proposal_id\":"), "{text}");
        assert!(!text.contains("user_handle"), "{text}");
        for half in [
            Decision {
                card: None,
                ..d.clone()
            },
            Decision {
                assertion: None,
                ..d.clone()
            },
        ] {
            let e = verify_decision(&relay.public_key(), &half.sign(&relay)).unwrap_err();
            assert_eq!(e.as_str(), "malformed", "{e}");
        }
        // An unknown member inside the assertion is refused, not ignored.
        let forged = text.replace("\"signature\":\"c2ln\"", "\"signature\":\"c2ln\",\"x\":1");
        let e = verify_decision(
            &relay.public_key(),
            &relay.sign(Kind::Decision, forged.into_bytes()),
        )
        .unwrap_err();
        assert_eq!(e.as_str(), "malformed");
    }
}
