//! Who decided: the person's own passkey signature on a decision, checked
//! here, not taken on the relay's word (issue 42).
//!
//! A session's open carries, for each approver its Lock rules name, that
//! person's enrolled passkeys (credential id, COSE public key, the highest
//! sign count the control plane saw), the people's web app's rp id and
//! origin, and the account's lab setting ([`People`]). A decision the relay
//! signed (checked under the relay key by [`super::approvals`]) releases or
//! refuses a held request only if [`People::check`] finds in it the
//! person's WebAuthn assertion over `decision_challenge(card digest,
//! verdict)`, made with one of the listed keys of an approver the card's
//! rule names, who is the decision's approver: rp id hash, origin byte for
//! byte, type `webauthn.get`, UP and UV, the challenge, the signature and
//! the sign count (talos-certs `webauthn::verify_person`, one
//! implementation with the control plane's).
//!
//! A refusal is one of the stable names of talos-certs `AssertionError`
//! (`no_assertion`, `unknown_credential`, `rp_id_mismatch`,
//! `origin_mismatch`, `wrong_type`, `challenge_mismatch`,
//! `user_not_present`, `user_not_verified`, `bad_signature`,
//! `sign_count_replayed`, `malformed`), counted in
//! `gateway_person_refusals_total{reason}` and logged; the request stays
//! held until a good decision, its time, or the authority's end.
//!
//! Lab setting: a decision without an assertion (`control-stub approvals
//! approve --as`) counts on the relay's signature alone only when the
//! open said the account is in lab mode; one with an assertion is checked
//! all the same.
//!
//! Nothing here is secret (public keys, signatures over public challenges).

use std::fmt;
use std::sync::Mutex;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use talos_certs::webauthn::{
    check_public_key, verify_person, ApproverKey, AssertionError, RelyingParty,
    MAX_CREDENTIAL_ID_LEN,
};
use talos_certs::Decision;
use talos_contract::sync::Locked;

/// The most keys one open may list (every approver of every rule, each
/// with several passkeys).
pub const MAX_KEYS: usize = 1024;

/// The longest rp id or origin taken.
const MAX_RP_LEN: usize = 255;

/// One listed passkey.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    pub owner: String,
    /// Base64 in a hand-over's state.
    #[serde(with = "b64")]
    pub credential_id: Vec<u8>,
    #[serde(with = "b64")]
    pub public_key_cose: Vec<u8>,
    /// The highest sign count seen: the open's, then this gateway's own.
    pub sign_count: u32,
    /// The sign count the open listed: an assertion made for this
    /// authority's attempt counts above it. Another member's card (a
    /// `first_use` answered across the pair) is checked against this one,
    /// not against the highest this gateway has seen since (see
    /// [`Card`]). Absent in a hand-over's state from an older process: 0.
    #[serde(default)]
    pub opened_count: u32,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Key")
            .field("owner", &self.owner)
            .field("credential_id", &self.credential_id.len())
            .field("public_key_cose", &self.public_key_cose.len())
            .field("sign_count", &self.sign_count)
            .field("opened_count", &self.opened_count)
            .finish()
    }
}

/// Whose card a person's assertion signs, which decides the sign count it
/// must exceed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Card {
    /// This gateway's own held proposal: the count must exceed the highest
    /// this gateway has seen for the key (a replay, or a cloned
    /// authenticator, is `sign_count_replayed`).
    Own,
    /// Another member's card for the same `first_use` of the same session
    /// attempt (one card across the pair): the same assertion the other
    /// member verified, so its count need only exceed the one the open
    /// listed (it was made for this attempt, after the open). The card
    /// binding (same session, attempt, tenant and rule, checked by the
    /// caller) keeps it from answering anything else.
    OtherMembers,
}

/// What a session's open said of its approvers' passkeys (see the module
/// docs). The default lists none and is not in lab mode: every decision is
/// refused `no_assertion` or `unknown_credential`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct People {
    pub rp_id: String,
    pub origin: String,
    pub lab: bool,
    keys: Mutex<Vec<Key>>,
}

impl Clone for People {
    fn clone(&self) -> Self {
        People {
            rp_id: self.rp_id.clone(),
            origin: self.origin.clone(),
            lab: self.lab,
            keys: Mutex::new(self.keys()),
        }
    }
}

impl PartialEq for People {
    fn eq(&self, other: &Self) -> bool {
        self.rp_id == other.rp_id
            && self.origin == other.origin
            && self.lab == other.lab
            && self.keys() == other.keys()
    }
}

/// The person who decided, or the relay alone in lab mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decider {
    /// The person's assertion verified: their name.
    Person(String),
    /// No assertion, accepted because the account is in lab mode: the
    /// relay's approver.
    Lab(String),
}

impl Decider {
    /// The name recorded as the decision's approver.
    pub fn name(&self) -> &str {
        match self {
            Decider::Person(n) | Decider::Lab(n) => n,
        }
    }
}

impl People {
    /// Check what an open sent: each key's id and COSE key usable, rp id
    /// and origin bounded. The error names the field, never key bytes.
    pub fn new(rp_id: &str, origin: &str, lab: bool, keys: Vec<Key>) -> Result<People, String> {
        if rp_id.len() > MAX_RP_LEN || origin.len() > MAX_RP_LEN {
            return Err("rp_id and origin: at most 255 bytes each".into());
        }
        if rp_id.is_empty() != origin.is_empty() {
            return Err("rp_id and origin: both, or neither".into());
        }
        if keys.len() > MAX_KEYS {
            return Err(format!("approver_keys: at most {MAX_KEYS}"));
        }
        for (i, k) in keys.iter().enumerate() {
            if k.owner.is_empty() {
                return Err(format!("approver_keys[{i}].owner: empty"));
            }
            if k.credential_id.is_empty() || k.credential_id.len() > MAX_CREDENTIAL_ID_LEN {
                return Err(format!(
                    "approver_keys[{i}].credential_id: 1 to 1,023 bytes"
                ));
            }
            check_public_key(&k.public_key_cose)
                .map_err(|e| format!("approver_keys[{i}].public_key_cose: {e}"))?;
        }
        Ok(People {
            rp_id: rp_id.to_owned(),
            origin: origin.to_owned(),
            lab,
            keys: Mutex::new(keys),
        })
    }

    /// No keys, lab mode: decisions count on the relay's signature (a
    /// session from the config file, and tests of the relay's path).
    pub fn lab() -> People {
        People {
            lab: true,
            ..People::default()
        }
    }

    /// The listed keys, their sign counts as now.
    pub fn keys(&self) -> Vec<Key> {
        self.keys.locked().clone()
    }

    /// Who decided `decision` on the card whose digest this gateway
    /// computed (`card_digest`), under a rule naming `named`; or the
    /// refusal. A verified assertion's sign count is kept as the highest
    /// seen for its key, so the same assertion twice is
    /// `sign_count_replayed` (when the authenticator counts).
    pub fn check(
        &self,
        decision: &Decision,
        card_digest: &str,
        named: &[String],
    ) -> Result<Decider, AssertionError> {
        self.check_card(decision, card_digest, named, Card::Own)
    }

    /// [`check`](Self::check) of an assertion over `card` (whose digest
    /// is `card_digest`): the sign count it must exceed is [`Card`]'s.
    pub fn check_card(
        &self,
        decision: &Decision,
        card_digest: &str,
        named: &[String],
        card: Card,
    ) -> Result<Decider, AssertionError> {
        if decision.assertion.is_none() && self.lab {
            return Ok(Decider::Lab(decision.approver.clone()));
        }
        let mut keys = self.keys.locked();
        let listed: Vec<ApproverKey<'_>> = keys
            .iter()
            .map(|k| ApproverKey {
                owner: &k.owner,
                credential_id: &k.credential_id,
                public_key_cose: &k.public_key_cose,
                sign_count: match card {
                    Card::Own => k.sign_count,
                    Card::OtherMembers => k.opened_count,
                },
            })
            .collect();
        let rp = RelyingParty {
            rp_id: &self.rp_id,
            origin: &self.origin,
        };
        if self.rp_id.is_empty() && decision.assertion.is_some() {
            return Err(AssertionError::OriginMismatch(
                "the session was opened with no web app's origin",
            ));
        }
        let verified = verify_person(decision, card_digest, &listed, named, &rp)?;
        drop(listed);
        if let Some(k) = keys
            .iter_mut()
            .find(|k| k.credential_id == verified.credential_id)
        {
            k.sign_count = k.sign_count.max(verified.sign_count);
        }
        Ok(Decider::Person(verified.person))
    }
}

/// The people of an `OpenSessionRequest`, checked; the error is the
/// open's `invalid_argument`, naming the field.
#[allow(clippy::result_large_err)]
pub fn from_open(req: &crate::pb::OpenSessionRequest) -> Result<People, tonic::Status> {
    let keys = req
        .approver_keys
        .iter()
        .map(|k| Key {
            owner: k.owner.clone(),
            credential_id: k.credential_id.clone(),
            public_key_cose: k.public_key_cose.clone(),
            sign_count: k.sign_count,
            opened_count: k.sign_count,
        })
        .collect();
    People::new(&req.rp_id, &req.origin, req.lab_approvals, keys)
        .map_err(tonic::Status::invalid_argument)
}

mod b64 {
    use super::*;

    pub fn serialize<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use talos_certs::webauthn::soft::{Authenticator, Ceremony};
    use talos_certs::webauthn::{decision_challenge, CoseAlgorithm, Expected};
    use talos_certs::{proposal_digest, sentence, Proposal, ProposalKind, Verdict};

    const RP_ID: &str = "people.talos.test";
    const ORIGIN: &str = "https://people.talos.test:8443";

    fn card() -> Proposal {
        Proposal {
            proposal_id: "sbx-1-1-1-abcdef".into(),
            gateway_id: "gw-a".into(),
            session_id: "sbx-1".into(),
            attempt: 1,
            tenant: "acme".into(),
            kind: ProposalKind::Request,
            destination: "api.example.com".into(),
            method: "POST".into(),
            path: "/merge".into(),
            attachments: vec![],
            rule: "lock-1".into(),
            tool: String::new(),
            call_digest: String::new(),
            approvers: vec!["alice".into()],
            created_at: "2026-11-29T10:00:00.000Z".into(),
            expires_at: "2026-11-29T10:05:00.000Z".into(),
        }
    }

    fn people(alice: &Authenticator, lab: bool) -> People {
        People::new(
            RP_ID,
            ORIGIN,
            lab,
            vec![Key {
                owner: "alice".into(),
                credential_id: alice.credential_id().to_vec(),
                public_key_cose: alice.public_key_cose().to_vec(),
                sign_count: 0,
                opened_count: 0,
            }],
        )
        .unwrap()
    }

    fn decision(alice: &Authenticator, p: &Proposal, count: u32, assert: bool) -> Decision {
        let digest = proposal_digest(p, &sentence(p));
        let challenge = decision_challenge(&digest, Verdict::Approved);
        let signed = alice.assert(
            &Ceremony::get(&Expected {
                challenge: &challenge,
                rp_id: RP_ID,
                origin: ORIGIN,
            })
            .sign_count(count),
        );
        Decision {
            proposal_id: p.proposal_id.clone(),
            proposal_digest: digest,
            approver: "alice".into(),
            decision: Verdict::Approved,
            decided_at: "2026-11-29T10:01:00.000Z".into(),
            card: assert.then(|| p.clone()),
            assertion: assert.then(|| signed.to_passkey_assertion()),
        }
    }

    #[test]
    fn a_persons_decision_counts_once_and_only_with_an_assertion_outside_the_lab() {
        let alice = Authenticator::new(CoseAlgorithm::Es256);
        let p = card();
        let digest = proposal_digest(&p, &sentence(&p));
        let people = people(&alice, false);
        let d = decision(&alice, &p, 3, true);
        assert_eq!(
            people.check(&d, &digest, &p.approvers),
            Ok(Decider::Person("alice".into()))
        );
        assert_eq!(people.keys()[0].sign_count, 3);
        // The same assertion again: its count is not above the highest.
        assert_eq!(
            people
                .check(&d, &digest, &p.approvers)
                .unwrap_err()
                .as_str(),
            "sign_count_replayed"
        );
        let bare = decision(&alice, &p, 4, false);
        assert_eq!(
            people
                .check(&bare, &digest, &p.approvers)
                .unwrap_err()
                .as_str(),
            "no_assertion"
        );
        // A session opened with no web app's rp id and origin (a default
        // People): origin_mismatch, whatever the key.
        assert_eq!(
            People::default()
                .check(&decision(&alice, &p, 5, true), &digest, &p.approvers)
                .unwrap_err()
                .as_str(),
            "origin_mismatch"
        );
    }

    #[test]
    fn lab_mode_takes_the_relays_word_only_for_a_decision_without_an_assertion() {
        let alice = Authenticator::new(CoseAlgorithm::Es256);
        let p = card();
        let digest = proposal_digest(&p, &sentence(&p));
        let lab = people(&alice, true);
        assert_eq!(
            lab.check(&decision(&alice, &p, 1, false), &digest, &p.approvers),
            Ok(Decider::Lab("alice".into()))
        );
        // An assertion is checked all the same: another card's digest.
        let mut other = p.clone();
        other.path = "/other".into();
        let other_digest = proposal_digest(&other, &sentence(&other));
        assert_eq!(
            lab.check(&decision(&alice, &p, 2, true), &other_digest, &p.approvers)
                .unwrap_err()
                .as_str(),
            "challenge_mismatch"
        );
    }

    #[test]
    fn an_open_with_unusable_keys_is_refused_naming_the_field() {
        let e = People::new(
            RP_ID,
            ORIGIN,
            false,
            vec![Key {
                owner: "alice".into(),
                credential_id: vec![1],
                public_key_cose: vec![0xa0],
                sign_count: 0,
                opened_count: 0,
            }],
        )
        .unwrap_err();
        assert!(e.starts_with("approver_keys[0].public_key_cose"), "{e}");
        assert!(People::new(RP_ID, "", false, vec![]).is_err());
    }
}
