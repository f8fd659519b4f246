//! A person's decision as the gateway checks it
//! (`talos_certs::webauthn::verify_person`): a decision right in every
//! field is the person's, and each refusal name is reached by exactly the
//! fault it names, one test each.

use talos_certs::webauthn::soft::{Authenticator, Ceremony, SignedAssertion};
use talos_certs::webauthn::{
    decision_challenge, verify_person, ApproverKey, AssertionError, CoseAlgorithm, Expected, Flags,
    PersonVerified, RelyingParty,
};
use talos_certs::{
    proposal_digest, sentence, Decision, PasskeyAssertion, Proposal, ProposalKind, Verdict,
};

const RP_ID: &str = "people.talos.test";
const ORIGIN: &str = "https://people.talos.test:8443";
const RP: RelyingParty<'static> = RelyingParty {
    rp_id: RP_ID,
    origin: ORIGIN,
};

fn proposal(path: &str) -> Proposal {
    Proposal {
        proposal_id: "gw-a-1-7f3a".into(),
        gateway_id: "gw-a".into(),
        session_id: "sbx-1".into(),
        attempt: 1,
        tenant: "acme".into(),
        kind: ProposalKind::Request,
        destination: "api.github.com".into(),
        method: "POST".into(),
        path: path.into(),
        attachments: vec!["GITHUB_TOKEN".into()],
        rule: "lock-1".into(),
        tool: String::new(),
        call_digest: String::new(),
        approvers: vec!["alice".into(), "bob".into()],
        created_at: "2026-11-29T10:00:00.000Z".into(),
        expires_at: "2026-11-29T10:05:00.000Z".into(),
    }
}

fn digest_of(p: &Proposal) -> String {
    proposal_digest(p, &sentence(p))
}

/// Alice's and Bob's passkeys (both named by the rule), Carol's (listed
/// for another rule), and one card.
struct World {
    alice: Authenticator,
    bob: Authenticator,
    carol: Authenticator,
    card: Proposal,
    digest: String,
}

impl World {
    fn new() -> World {
        let card = proposal("/repos/acme/widgets/merges");
        World {
            alice: Authenticator::new(CoseAlgorithm::Es256),
            bob: Authenticator::new(CoseAlgorithm::EdDsa),
            carol: Authenticator::new(CoseAlgorithm::Es256),
            digest: digest_of(&card),
            card,
        }
    }

    fn keys(&self) -> Vec<ApproverKey<'_>> {
        [
            ("alice", &self.alice),
            ("bob", &self.bob),
            ("carol", &self.carol),
        ]
        .into_iter()
        .map(|(owner, a)| ApproverKey {
            owner,
            credential_id: a.credential_id(),
            public_key_cose: a.public_key_cose(),
            sign_count: 0,
        })
        .collect()
    }

    /// A ceremony right in every field for `verdict` on this card.
    fn ceremony(&self, verdict: Verdict) -> Ceremony {
        let challenge = decision_challenge(&self.digest, verdict);
        Ceremony::get(&Expected {
            challenge: &challenge,
            rp_id: RP_ID,
            origin: ORIGIN,
        })
        .sign_count(1)
    }

    /// The relay's decision naming `approver`, `verdict`, carrying `signed`.
    fn decision(&self, approver: &str, verdict: Verdict, signed: &SignedAssertion) -> Decision {
        Decision {
            proposal_id: self.card.proposal_id.clone(),
            proposal_digest: self.digest.clone(),
            approver: approver.into(),
            decision: verdict,
            decided_at: "2026-11-29T10:01:00.000Z".into(),
            card: Some(self.card.clone()),
            assertion: Some(signed.to_passkey_assertion()),
        }
    }

    fn check(&self, d: &Decision) -> Result<PersonVerified, AssertionError> {
        verify_person(d, &self.digest, &self.keys(), &self.card.approvers, &RP)
    }

    /// Alice approving, with one change to the ceremony.
    fn alice_with(&self, change: impl FnOnce(Ceremony) -> Ceremony) -> Decision {
        let signed = self.alice.assert(&change(self.ceremony(Verdict::Approved)));
        self.decision("alice", Verdict::Approved, &signed)
    }
}

fn refusal(r: Result<PersonVerified, AssertionError>) -> &'static str {
    match r {
        Ok(v) => panic!("accepted: {v:?}"),
        Err(e) => e.as_str(),
    }
}

#[test]
fn a_right_approval_and_a_right_decline_are_the_persons() {
    let w = World::new();
    for (who, by) in [("alice", &w.alice), ("bob", &w.bob)] {
        for verdict in [Verdict::Approved, Verdict::Declined] {
            let d = w.decision(who, verdict, &by.assert(&w.ceremony(verdict)));
            let v = w.check(&d).unwrap();
            assert_eq!(v.person, who);
            assert_eq!(v.credential_id, by.credential_id());
            assert_eq!(v.sign_count, 1);
        }
    }
    // A decision without its card is checked against the digest alone.
    let d = Decision {
        card: None,
        ..w.alice_with(|c| c)
    };
    assert_eq!(w.check(&d).unwrap().person, "alice");
}

#[test]
fn no_assertion() {
    let w = World::new();
    let d = Decision {
        card: None,
        assertion: None,
        ..w.alice_with(|c| c)
    };
    assert_eq!(refusal(w.check(&d)), "no_assertion");
}

#[test]
fn unknown_credential_not_listed() {
    let w = World::new();
    let stranger = Authenticator::new(CoseAlgorithm::Es256);
    let signed = stranger.assert(&w.ceremony(Verdict::Approved));
    let d = w.decision("alice", Verdict::Approved, &signed);
    assert_eq!(refusal(w.check(&d)), "unknown_credential");
}

#[test]
fn unknown_credential_owner_not_named_by_the_rule() {
    let w = World::new();
    // Carol's key is listed (another rule names her) and her signature is
    // right in every field, but this card's rule does not name her.
    let signed = w.carol.assert(&w.ceremony(Verdict::Approved));
    let d = w.decision("carol", Verdict::Approved, &signed);
    assert_eq!(refusal(w.check(&d)), "unknown_credential");
}

#[test]
fn unknown_credential_another_persons_key_than_the_approver_named() {
    let w = World::new();
    // Bob signed, the relay says Alice decided.
    let signed = w.bob.assert(&w.ceremony(Verdict::Approved));
    let d = w.decision("alice", Verdict::Approved, &signed);
    assert_eq!(refusal(w.check(&d)), "unknown_credential");
}

#[test]
fn rp_id_mismatch() {
    let w = World::new();
    let d = w.alice_with(|c| c.rp_id("evil.test"));
    assert_eq!(refusal(w.check(&d)), "rp_id_mismatch");
}

#[test]
fn origin_mismatch() {
    let w = World::new();
    // One byte off: the port.
    let d = w.alice_with(|c| c.origin("https://people.talos.test:8444"));
    assert_eq!(refusal(w.check(&d)), "origin_mismatch");
}

#[test]
fn wrong_type() {
    let w = World::new();
    let d = w.alice_with(|c| c.client_type("webauthn.create"));
    assert_eq!(refusal(w.check(&d)), "wrong_type");
}

#[test]
fn challenge_mismatch_the_other_verdict() {
    let w = World::new();
    // Alice declined; the relay says she approved.
    let signed = w.alice.assert(&w.ceremony(Verdict::Declined));
    let d = w.decision("alice", Verdict::Approved, &signed);
    assert_eq!(refusal(w.check(&d)), "challenge_mismatch");
}

#[test]
fn challenge_mismatch_another_card() {
    let w = World::new();
    // Alice approved another card (its own digest in the decision, and
    // her signature right over it); the gateway holds this one.
    let other = proposal("/repos/acme/widgets/other");
    let other_digest = digest_of(&other);
    let challenge = decision_challenge(&other_digest, Verdict::Approved);
    let signed = w.alice.assert(
        &Ceremony::get(&Expected {
            challenge: &challenge,
            rp_id: RP_ID,
            origin: ORIGIN,
        })
        .sign_count(1),
    );
    let d = Decision {
        card: Some(other.clone()),
        ..w.decision("alice", Verdict::Approved, &signed)
    };
    assert_eq!(refusal(w.check(&d)), "challenge_mismatch");
    // The same without the card: the signature's challenge is still over
    // the other card.
    let d = Decision { card: None, ..d };
    assert_eq!(refusal(w.check(&d)), "challenge_mismatch");
}

#[test]
fn user_not_present() {
    let w = World::new();
    let d = w.alice_with(|c| c.flags(Flags::UV));
    assert_eq!(refusal(w.check(&d)), "user_not_present");
}

#[test]
fn user_not_verified() {
    let w = World::new();
    let d = w.alice_with(|c| c.flags(Flags::UP));
    assert_eq!(refusal(w.check(&d)), "user_not_verified");
}

#[test]
fn bad_signature() {
    let w = World::new();
    let mut signed = w.alice.assert(&w.ceremony(Verdict::Approved));
    let last = signed.signature.len() - 1;
    signed.signature[last] ^= 1;
    let d = w.decision("alice", Verdict::Approved, &signed);
    assert_eq!(refusal(w.check(&d)), "bad_signature");
}

#[test]
fn sign_count_replayed() {
    let w = World::new();
    let d = w.alice_with(|c| c);
    let mut keys = w.keys();
    keys[0].sign_count = 1;
    let r = verify_person(&d, &w.digest, &keys, &w.card.approvers, &RP);
    assert_eq!(refusal(r), "sign_count_replayed");
}

#[test]
fn malformed() {
    let w = World::new();
    let d = w.alice_with(|c| c);
    let mut a: PasskeyAssertion = d.assertion.clone().unwrap();
    a.signature.push('=');
    let bad = Decision {
        assertion: Some(a),
        ..d.clone()
    };
    assert_eq!(refusal(w.check(&bad)), "malformed");
    let mut a: PasskeyAssertion = d.assertion.clone().unwrap();
    a.client_data_json = "A".repeat(8 * 1024);
    let bad = Decision {
        assertion: Some(a),
        ..d
    };
    assert_eq!(refusal(w.check(&bad)), "malformed");
}

#[test]
fn challenge_mismatch_the_card_carried_is_not_the_one_held() {
    let w = World::new();
    // Alice's signature is right over the held card, but the decision
    // carries another card: what the person saw is not what is held.
    let d = Decision {
        card: Some(proposal("/repos/acme/widgets/other")),
        ..w.alice_with(|c| c)
    };
    assert_eq!(refusal(w.check(&d)), "challenge_mismatch");
}
