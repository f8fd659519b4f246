//! The Lock and the approval relay: rules on the command line and with
//! every open, proposals checked and stored, decisions signed and
//! delivered (or refused with nothing changed), withdrawal and expiry, the
//! certificate's proposals, and — over real mutual TLS with a stand-in
//! gateway — `Propose`, `approvals approve` and the people's web app.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead as _, Read as _};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::{bin, request, Env};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use talos_certs::{
    proposal_msg_of as msg, sentence, verify_decision, Proposal, ProposalKind, Verdict,
};
use talos_control_stub::identity::{self, Identity};
use talos_control_stub::lock::NewRule;
use talos_control_stub::pb;
use talos_control_stub::pb::control_plane_client::ControlPlaneClient;
use talos_control_stub::pb::gateway_server::Gateway;
use talos_control_stub::relay::{self, Received};
use talos_control_stub::{LinkError, LockMode, LockRule, Mode, ProposalState, State, Store};
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

/// A value no output may hold: tenant acme's secret GH in the end-to-end
/// test.
const SECRET: &str = "gh-Zq9-UNMISTAKABLE-4471";

fn at(offset: Duration, later: bool) -> String {
    let t = if later {
        SystemTime::now() + offset
    } else {
        SystemTime::now() - offset
    };
    humantime::format_rfc3339_millis(t).to_string()
}

fn rule(store: &mut Store, approvers: &[&str]) -> LockRule {
    rule_of(store, approvers, LockMode::FirstUse)
}

fn rule_of(store: &mut Store, approvers: &[&str], mode: LockMode) -> LockRule {
    common::people::enrol_all(store, approvers);
    let approvers: Vec<String> = approvers.iter().map(|a| (*a).to_owned()).collect();
    store
        .lock_add(
            &NewRule::check(
                "api.github.com",
                Some("GH"),
                Some("post"),
                Some("/repos/"),
                mode,
                &approvers,
            )
            .unwrap(),
        )
        .unwrap()
}

/// A request proposal from `gateway` under `rule`, deciding within five
/// minutes.
fn proposal(session: &str, attempt: u32, rule: &LockRule, gateway: &str, n: u32) -> Proposal {
    Proposal {
        proposal_id: format!("{gateway}-{n}-7f3a"),
        gateway_id: gateway.into(),
        session_id: session.into(),
        attempt,
        tenant: "acme".into(),
        kind: ProposalKind::Request,
        destination: "api.github.com".into(),
        method: "POST".into(),
        path: "/repos/acme/widgets/merges".into(),
        attachments: vec!["GH".into()],
        rule: rule.id.clone(),
        tool: String::new(),
        call_digest: String::new(),
        approvers: rule.approvers.clone(),
        created_at: at(Duration::ZERO, true),
        expires_at: at(Duration::from_secs(300), true),
    }
}

fn state_of(store: &Store, id: &str) -> ProposalState {
    store
        .read(|tx| tx.proposal(id))
        .unwrap()
        .expect("the proposal is stored")
        .state
}

// ---- the Lock on the command line ----

#[test]
fn lock_rules_are_added_listed_and_removed_and_bad_ones_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("stub.db");
    let add = |extra: &[&str]| {
        let mut args = vec!["policy", "lock", "add"];
        args.extend_from_slice(extra);
        bin(&db, &args, b"")
    };
    // A rule may name only people who hold a passkey: one naming anyone
    // else is refused, naming them, and nothing is stored.
    let out = add(&[
        "--destination",
        "api.github.com",
        "--mode",
        "first_use",
        "--approver",
        "alice",
    ]);
    assert_eq!(out.code(), Some("approver_not_enrolled"), "{out:?}");
    assert!(
        out.stderr.contains("approver alice has no passkey"),
        "{out:?}"
    );
    common::people::enrol_all(&mut Store::open(&db).unwrap(), &["alice"]);
    let out = add(&[
        "--destination",
        "api.github.com",
        "--mode",
        "first_use",
        "--approver",
        "alice",
        "--approver",
        "bob",
    ]);
    assert_eq!(out.code(), Some("approver_not_enrolled"), "{out:?}");
    assert!(
        out.stderr.contains("approver bob has no passkey"),
        "{out:?}"
    );
    common::people::enrol_all(&mut Store::open(&db).unwrap(), &["bob", "a"]);
    let out = add(&[
        "--destination",
        "API.GitHub.com",
        "--attachment",
        "GH",
        "--method",
        "post",
        "--path-prefix",
        "/repos/",
        "--mode",
        "first_use",
        "--approver",
        "bob",
        "--approver",
        "alice",
    ]);
    assert_eq!(out.status, 0, "{out:?}");
    let printed: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(printed["id"], "lock-1");
    assert_eq!(printed["destination"], "api.github.com");
    assert_eq!(printed["method"], "POST");
    assert_eq!(printed["mode"], "first_use");
    assert_eq!(printed["approvers"], serde_json::json!(["alice", "bob"]));

    let before = common::dump(&db);
    for (bad, code) in [
        (
            vec![
                "--destination",
                "bad name",
                "--mode",
                "first_use",
                "--approver",
                "a",
            ],
            "lock_rule_invalid",
        ),
        (
            vec![
                "--destination",
                "*",
                "--method",
                "GE T",
                "--mode",
                "first_use",
                "--approver",
                "a",
            ],
            "lock_rule_invalid",
        ),
        (
            vec![
                "--destination",
                "*",
                "--path-prefix",
                "repos",
                "--mode",
                "first_use",
                "--approver",
                "a",
            ],
            "lock_rule_invalid",
        ),
        (
            vec![
                "--destination",
                "*",
                "--path-prefix",
                "/a?b=1",
                "--mode",
                "first_use",
                "--approver",
                "a",
            ],
            "lock_rule_invalid",
        ),
        (
            vec!["--destination", "*", "--mode", "first_use"],
            "lock_rule_invalid",
        ),
        (
            vec![
                "--destination",
                "*",
                "--mode",
                "first_use",
                "--approver",
                "al ice",
            ],
            "lock_rule_invalid",
        ),
        (
            vec![
                "--destination",
                "*",
                "--mode",
                "first_use",
                "--approver",
                &"a".repeat(65),
            ],
            "lock_rule_invalid",
        ),
        (
            vec![
                "--destination",
                "*",
                "--attachment",
                "no way",
                "--mode",
                "every_request",
                "--approver",
                "a",
            ],
            "lock_rule_invalid",
        ),
    ] {
        let out = add(&bad);
        assert_eq!(out.status, 2, "{bad:?}: {out:?}");
        assert_eq!(out.code(), Some(code), "{bad:?}: {out:?}");
        assert!(out.stdout.is_empty());
    }
    // A mode that is neither is refused by the parser, as usage.
    let out = add(&[
        "--destination",
        "*",
        "--mode",
        "sometimes",
        "--approver",
        "a",
    ]);
    assert_eq!(out.status, 2);
    assert!(out.stderr.contains("first_use or every_request"), "{out:?}");
    let out = bin(&db, &["policy", "lock", "remove", "lock-9"], b"");
    assert_eq!(out.code(), Some("lock_rule_not_found"), "{out:?}");
    assert_eq!(common::dump(&db), before);

    let out = bin(&db, &["policy", "lock", "list"], b"");
    let list: Vec<serde_json::Value> = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(list.len(), 1);
    let out = bin(&db, &["policy", "lock", "remove", "lock-1"], b"");
    assert_eq!(out.status, 0, "{out:?}");
    // Ids are never reused: proposals and certificates name rules by id.
    let out = add(&[
        "--destination",
        "*",
        "--mode",
        "every_request",
        "--approver",
        "a",
    ]);
    let printed: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(printed["id"], "lock-2");
    assert_eq!(printed["method"], "");
}

#[test]
fn every_open_carries_the_rules_and_the_relay_key_and_records_them() {
    let mut env = Env::new().with_policy();
    let relay = talos_certs::GatewayKey::generate().unwrap();
    let r = rule(&mut env.store, &["alice"]);
    let key = Some(relay.public_key());
    let id = env
        .life()
        .with_relay_key(key)
        .start(&request(Mode::Commands))
        .unwrap()
        .session_id;
    let open = env.link.last_open().unwrap();
    assert_eq!(open.lock, vec![r.clone()]);
    assert_eq!(open.relay_public_key, key);

    // A rule added while paused travels with the resume.
    env.life().pause(&id).unwrap();
    common::people::enrol_all(&mut env.store, &["bob"]);
    let r2 = env
        .store
        .lock_add(
            &NewRule::check(
                "*",
                None,
                None,
                None,
                LockMode::EveryRequest,
                &["bob".into()],
            )
            .unwrap(),
        )
        .unwrap();
    env.life().with_relay_key(key).resume(&id).unwrap();
    let open = env.link.last_open().unwrap();
    assert_eq!(open.lock, vec![r.clone(), r2.clone()]);

    let status = env.life().status(&id).unwrap();
    assert_eq!(status.attempts[0].attempt.lock, vec![r.clone()]);
    assert_eq!(status.attempts[1].attempt.lock, vec![r, r2]);
    assert_eq!(
        status.attempts[1].attempt.relay_public_key,
        Some(hex::encode(relay.public_key()))
    );

    // Without a relay key, the gateways are told there is none.
    let mut other = request(Mode::Agent);
    other.sources = vec!["10.1.0.9".into()];
    env.life().start(&other).unwrap();
    assert_eq!(env.link.last_open().unwrap().relay_public_key, None);
}

// ---- proposals in ----

#[test]
fn proposals_are_checked_against_their_fields_session_and_rule() {
    let mut env = Env::new().with_policy();
    let r = rule(&mut env.store, &["alice", "bob"]);
    let id = env.start(Mode::Commands).session_id;
    let p = proposal(&id, 1, &r, "gw-a", 1);

    let got = relay::receive(&mut env.store, &msg(&p)).unwrap();
    assert!(matches!(got, Received::New(_)));
    assert_eq!(state_of(&env.store, &p.proposal_id), ProposalState::Pending);
    // The same proposal again is acknowledged and changes nothing.
    let before = env.dump();
    let got = relay::receive(&mut env.store, &msg(&p)).unwrap();
    assert!(matches!(got, Received::Again { .. }));
    assert_eq!(env.dump(), before);

    let refused = |env: &mut Env, m: pb::ProposalMsg, code: &str| {
        let before = env.dump();
        let err = relay::receive(&mut env.store, &m).unwrap_err();
        assert_eq!(err.code(), code, "{err}");
        assert_eq!(env.dump(), before, "a refused proposal changed the store");
    };
    // The same id with other fields: another digest.
    let mut q = p.clone();
    q.path = "/repos/acme/other".into();
    refused(&mut env, msg(&q), "proposal_conflict");

    // A sentence or a digest that is not the fields'.
    let mut q = p.clone();
    q.proposal_id = "gw-a-2-aaaa".into();
    let mut m = msg(&q);
    m.sentence = m.sentence.replace("POST", "GET");
    refused(&mut env, m, "proposal_invalid");
    let mut m = msg(&q);
    m.digest = "ab".repeat(48);
    refused(&mut env, m, "proposal_invalid");
    // Fields changed under a sentence and digest made for others.
    let mut m = msg(&q);
    m.path = "/repos/acme/widgets/delete".into();
    refused(&mut env, m, "proposal_invalid");
    // Approvers that are not the rule's.
    let mut q2 = q.clone();
    q2.approvers = vec!["alice".into(), "mallory".into()];
    refused(&mut env, msg(&q2), "proposal_invalid");
    // A request the rule does not match.
    let mut q2 = q.clone();
    q2.method = "GET".into();
    refused(&mut env, msg(&q2), "proposal_invalid");
    // Another tenant.
    let mut q2 = q.clone();
    q2.tenant = "other".into();
    refused(&mut env, msg(&q2), "proposal_invalid");
    // An unknown kind.
    let mut m = msg(&q);
    m.kind = "wish".into();
    refused(&mut env, m, "proposal_invalid");
    // No such rule.
    let mut q2 = q.clone();
    q2.rule = "lock-99".into();
    refused(&mut env, msg(&q2), "proposal_stale");
    // Another attempt, another gateway, no session.
    let mut q2 = q.clone();
    q2.attempt = 2;
    refused(&mut env, msg(&q2), "proposal_stale");
    let mut q2 = q.clone();
    q2.gateway_id = "gw-z".into();
    refused(&mut env, msg(&q2), "proposal_stale");
    let mut q2 = q.clone();
    q2.session_id = "sbx-000000000000".into();
    refused(&mut env, msg(&q2), "proposal_stale");

    // An agent's own proposal names the rule too.
    let mut agent = q.clone();
    agent.kind = ProposalKind::Agent;
    agent.destination = talos_certs::APPROVALS_NAME.into();
    agent.tool = "deploy".into();
    agent.call_digest = "cd".repeat(48);
    assert!(matches!(
        relay::receive(&mut env.store, &msg(&agent)).unwrap(),
        Received::New(_)
    ));

    // A paused session takes no proposal.
    env.life().pause(&id).unwrap();
    let mut q3 = q.clone();
    q3.proposal_id = "gw-a-3-bbbb".into();
    refused(&mut env, msg(&q3), "proposal_stale");
}

/// Every request of the contract's shared table, proposed as the gateway
/// proposes it (the canonical path): the relay holds what the gateway
/// holds — the spellings only the routing key puts under the rule too —
/// and refuses the rest, and a path not canonical, as `proposal_invalid`.
#[test]
fn the_relay_judges_the_shared_lock_cases_as_the_gateway_does() {
    use talos_contract::cases::{self, LOCK_CASES};
    let mut env = Env::new().with_policy();
    common::people::enrol_all(&mut env.store, &[cases::LOCK_APPROVER]);
    let r = env
        .store
        .lock_add(
            &NewRule::check(
                cases::LOCK_DESTINATION,
                None,
                Some(cases::LOCK_METHOD),
                Some(cases::LOCK_PREFIX),
                LockMode::EveryRequest,
                &[cases::LOCK_APPROVER.to_owned()],
            )
            .unwrap(),
        )
        .unwrap();
    assert_eq!(
        r.judged().unwrap().path_prefix,
        cases::lock_rule().path_prefix
    );
    let id = env.start(Mode::Commands).session_id;
    for (n, c) in (1..).zip(LOCK_CASES) {
        let mut p = proposal(&id, 1, &r, "gw-a", n);
        p.destination = cases::LOCK_DESTINATION.into();
        p.attachments = Vec::new();
        p.method = c.method.into();
        p.path = c.canonical.into();
        let got = relay::receive(&mut env.store, &msg(&p));
        if c.held {
            let Ok(Received::New(record)) = got else {
                panic!("{c:?}: {got:?}");
            };
            assert!(
                record
                    .sentence
                    .contains(&format!("{} {} to", c.method, c.canonical)),
                "{c:?}: the card shows the canonical path: {}",
                record.sentence
            );
        } else {
            assert_eq!(got.unwrap_err().code(), "proposal_invalid", "{c:?}");
        }
        if c.path != c.canonical {
            p.proposal_id.push_str("-sent");
            p.path = c.path.into();
            let err = relay::receive(&mut env.store, &msg(&p)).unwrap_err();
            assert_eq!(err.code(), "proposal_invalid", "{c:?}");
            if c.held {
                assert!(err.to_string().contains("not canonical"), "{c:?}: {err}");
            }
        }
    }
}

// ---- decisions out ----

struct Relay {
    env: Env,
    key: talos_certs::GatewayKey,
    session: String,
    rule: LockRule,
}

/// A running session whose one rule holds every request (each proposal a
/// card of its own; [`first_use_env`] for the other mode).
fn relay_env() -> Relay {
    relay_env_of(LockMode::EveryRequest)
}

fn first_use_env() -> Relay {
    relay_env_of(LockMode::FirstUse)
}

fn relay_env_of(mode: LockMode) -> Relay {
    let mut env = Env::new().with_policy();
    let key = talos_certs::GatewayKey::generate().unwrap();
    let rule = rule_of(&mut env.store, &["alice", "bob"], mode);
    let session = env
        .life()
        .with_relay_key(Some(key.public_key()))
        .start(&request(Mode::Commands))
        .unwrap()
        .session_id;
    Relay {
        env,
        key,
        session,
        rule,
    }
}

impl Relay {
    fn propose(&mut self, n: u32) -> Proposal {
        self.propose_on("gw-a", n).0
    }

    /// A proposal from member `gateway`, and what the relay made of it.
    fn propose_on(&mut self, gateway: &str, n: u32) -> (Proposal, relay::Received) {
        let p = proposal(&self.session, 1, &self.rule, gateway, n);
        let got = relay::receive(&mut self.env.store, &msg(&p)).unwrap();
        (p, got)
    }

    fn decide(&mut self, id: &str, who: &str, v: Verdict) -> Result<relay::Decided, String> {
        relay::decide(&mut self.env.store, &self.env.link, &self.key, id, who, v)
            .map_err(|e| e.code().to_owned())
    }
}

#[test]
fn a_listed_approver_decides_and_the_gateway_gets_a_decision_it_can_verify() {
    let mut r = relay_env();
    let p = r.propose(1);
    let digest = msg(&p).digest;
    let d = r
        .decide(&p.proposal_id, "alice", Verdict::Approved)
        .unwrap();
    assert_eq!(d.outcome, "released");
    let delivered = r.env.link.decisions();
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].0, "gw-a");
    let decision = verify_decision(&r.key.public_key(), &delivered[0].1).unwrap();
    assert_eq!(decision.proposal_id, p.proposal_id);
    assert_eq!(decision.proposal_digest, digest);
    assert_eq!(decision.approver, "alice");
    assert_eq!(decision.decision, Verdict::Approved);

    let stored = r
        .env
        .store
        .read(|tx| tx.proposal(&p.proposal_id))
        .unwrap()
        .unwrap();
    assert_eq!(stored.state, ProposalState::Approved);
    assert_eq!(stored.approver.as_deref(), Some("alice"));
    assert_eq!(stored.outcome.as_deref(), Some("released"));
    assert!(stored.decision.is_some());

    // Decided once: never again, by anyone.
    let before = r.env.dump();
    for (who, v) in [("alice", Verdict::Approved), ("bob", Verdict::Declined)] {
        assert_eq!(
            r.decide(&p.proposal_id, who, v).unwrap_err(),
            "approval_not_pending"
        );
    }
    assert_eq!(r.env.dump(), before);
    assert_eq!(r.env.link.decisions().len(), 1);

    // A decline is signed and delivered the same way.
    let q = r.propose(2);
    let d = r.decide(&q.proposal_id, "bob", Verdict::Declined).unwrap();
    assert_eq!(d.outcome, "refused");
    assert_eq!(
        state_of(&r.env.store, &q.proposal_id),
        ProposalState::Declined
    );
    assert_eq!(
        r.decide("gw-a-404-none", "bob", Verdict::Declined)
            .unwrap_err(),
        "approval_not_found"
    );
}

#[test]
fn a_first_use_asks_once_across_the_pair_and_every_member_gets_the_cards_decision() {
    let mut r = first_use_env();
    // gw-a proposes first: the card. gw-b's first use of the same session
    // attempt and rule, and gw-a's second one held meanwhile, join it.
    let (card, got) = r.propose_on("gw-a", 1);
    assert!(matches!(got, relay::Received::New(_)), "{got:?}");
    let mut joined = Vec::new();
    for (gw, n) in [("gw-b", 1), ("gw-a", 2)] {
        let (p, got) = r.propose_on(gw, n);
        let relay::Received::Joined { card: of, .. } = got else {
            panic!("{gw}'s first use is no card of its own: {got:?}");
        };
        assert_eq!(of, card.proposal_id);
        joined.push(p);
    }
    let cards = relay::cards(&mut r.env.store, None, false).unwrap();
    assert_eq!(
        cards.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        [card.proposal_id.as_str()],
        "one card"
    );
    let all = relay::cards(&mut r.env.store, None, true).unwrap();
    assert_eq!(all.len(), 3);
    assert_eq!(
        all[1].answered_by.as_deref(),
        Some(card.proposal_id.as_str())
    );
    // A joined proposal is decided with its card, not alone.
    assert_eq!(
        r.decide(&joined[0].proposal_id, "alice", Verdict::Approved)
            .unwrap_err(),
        "approval_joined"
    );

    let d = r
        .decide(&card.proposal_id, "alice", Verdict::Approved)
        .unwrap();
    assert_eq!(d.outcome, "released");
    assert_eq!(
        d.also_answered
            .iter()
            .map(|a| (
                a.proposal_id.as_str(),
                a.gateway_id.as_str(),
                a.outcome.as_str()
            ))
            .collect::<Vec<_>>(),
        [
            (joined[0].proposal_id.as_str(), "gw-b", "released"),
            (joined[1].proposal_id.as_str(), "gw-a", "released"),
        ]
    );
    // Each member got a decision for its own proposal (its id, its
    // digest), all from the one card's verdict and approver.
    let delivered = r.env.link.decisions();
    assert_eq!(delivered.len(), 3);
    for (i, p) in std::iter::once(&card).chain(&joined).enumerate() {
        assert_eq!(delivered[i].0, p.gateway_id);
        let decision = verify_decision(&r.key.public_key(), &delivered[i].1).unwrap();
        assert_eq!(decision.proposal_id, p.proposal_id);
        assert_eq!(decision.proposal_digest, msg(p).digest);
        assert_eq!(decision.approver, "alice");
        assert_eq!(decision.decision, Verdict::Approved);
        assert_eq!(
            state_of(&r.env.store, &p.proposal_id),
            ProposalState::Approved
        );
    }

    // A first use proposed after the card was approved (a member that
    // came to it later) joins the approved card; `serve`'s round answers
    // it with the card's decision.
    let (late, got) = r.propose_on("gw-b", 2);
    assert!(matches!(got, relay::Received::Joined { .. }), "{got:?}");
    let answered = relay::answer_joined(&mut r.env.store, &r.env.link, &r.key, None).unwrap();
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0].proposal_id, late.proposal_id);
    let last = r.env.link.decisions().pop().unwrap();
    assert_eq!(last.0, "gw-b");
    assert_eq!(
        verify_decision(&r.key.public_key(), &last.1)
            .unwrap()
            .proposal_id,
        late.proposal_id
    );
    // Nothing left to answer.
    assert!(
        relay::answer_joined(&mut r.env.store, &r.env.link, &r.key, None)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_declined_first_use_asks_again_and_a_member_out_of_reach_is_answered_later() {
    let mut r = first_use_env();
    let (card, _) = r.propose_on("gw-a", 1);
    let (joined, _) = r.propose_on("gw-b", 1);
    // gw-b cannot be reached when the card is declined: the card's
    // decision stands, gw-b's proposal waits for the next round.
    r.env.link.set_down("gw-b", true);
    let d = r
        .decide(&card.proposal_id, "bob", Verdict::Declined)
        .unwrap();
    assert_eq!(d.outcome, "refused");
    assert!(d.also_answered.is_empty(), "{:?}", d.also_answered);
    assert_eq!(
        state_of(&r.env.store, &card.proposal_id),
        ProposalState::Declined
    );
    assert_eq!(
        state_of(&r.env.store, &joined.proposal_id),
        ProposalState::Pending
    );
    assert!(
        relay::answer_joined(&mut r.env.store, &r.env.link, &r.key, None)
            .unwrap()
            .is_empty()
    );
    r.env.link.set_down("gw-b", false);
    let answered = relay::answer_joined(&mut r.env.store, &r.env.link, &r.key, None).unwrap();
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0].outcome, "refused");
    assert_eq!(
        state_of(&r.env.store, &joined.proposal_id),
        ProposalState::Declined
    );
    // A declined first use was not approved: the next one is a card again.
    let (again, got) = r.propose_on("gw-b", 2);
    assert!(matches!(got, relay::Received::New(_)), "{got:?}");
    assert_eq!(
        relay::cards(&mut r.env.store, None, false).unwrap()[0].id,
        again.proposal_id
    );
}

#[test]
fn a_joined_first_use_whose_cards_decision_no_longer_verifies_becomes_a_card() {
    let mut r = first_use_env();
    let (card, _) = r.propose_on("gw-a", 1);
    r.decide(&card.proposal_id, "alice", Verdict::Approved)
        .unwrap();
    let (late, got) = r.propose_on("gw-b", 1);
    assert!(matches!(got, relay::Received::Joined { .. }), "{got:?}");
    // The relay's key was replaced since the card was decided: its
    // decision cannot answer anything now, and nothing is delivered.
    let other = talos_certs::GatewayKey::generate().unwrap();
    let before = r.env.link.decisions().len();
    let answered = relay::answer_joined(&mut r.env.store, &r.env.link, &other, None).unwrap();
    assert!(answered.is_empty());
    assert_eq!(r.env.link.decisions().len(), before);
    let cards = relay::cards(&mut r.env.store, None, false).unwrap();
    assert_eq!(
        cards.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        [late.proposal_id.as_str()],
        "a card of its own"
    );
    let d = r
        .decide(&late.proposal_id, "bob", Verdict::Declined)
        .unwrap();
    assert_eq!(d.outcome, "refused");
}

#[test]
fn an_approver_not_listed_is_refused_and_nothing_changes() {
    let mut r = relay_env();
    let p = r.propose(1);
    let before = r.env.dump();
    assert_eq!(
        r.decide(&p.proposal_id, "mallory", Verdict::Approved)
            .unwrap_err(),
        "approver_not_listed"
    );
    assert_eq!(
        r.decide(&p.proposal_id, "bad name", Verdict::Approved)
            .unwrap_err(),
        "name_invalid"
    );
    assert_eq!(r.env.dump(), before);
    assert!(r.env.link.decisions().is_empty());

    // The rule goes: nobody is listed any more, on cards already shown.
    r.env.store.lock_remove(&r.rule.id).unwrap();
    let before = r.env.dump();
    assert_eq!(
        r.decide(&p.proposal_id, "alice", Verdict::Approved)
            .unwrap_err(),
        "approver_not_listed"
    );
    assert_eq!(r.env.dump(), before);
    assert!(r.env.link.decisions().is_empty());
}

#[test]
fn a_decision_the_gateway_does_not_take_changes_nothing() {
    let mut r = relay_env();
    let p = r.propose(1);
    let before = r.env.dump();
    r.env
        .link
        .fail_with(Some(LinkError::Unreachable("down".into())));
    assert_eq!(
        r.decide(&p.proposal_id, "alice", Verdict::Approved)
            .unwrap_err(),
        "gateway_unreachable"
    );
    r.env.link.fail_with(Some(LinkError::Refused {
        gateway_id: "gw-a".into(),
        reason: "no pending proposal".into(),
    }));
    assert_eq!(
        r.decide(&p.proposal_id, "alice", Verdict::Approved)
            .unwrap_err(),
        "gateway_refused"
    );
    assert_eq!(r.env.dump(), before);
    r.env.link.fail_with(None);
    r.decide(&p.proposal_id, "alice", Verdict::Approved)
        .unwrap();
}

#[test]
fn a_pause_withdraws_pending_proposals_and_they_cannot_be_decided() {
    let mut r = relay_env();
    let p = r.propose(1);
    let decided = r.propose(2);
    r.decide(&decided.proposal_id, "alice", Verdict::Approved)
        .unwrap();
    let session = r.session.clone();
    r.env.life().pause(&session).unwrap();
    assert_eq!(
        state_of(&r.env.store, &p.proposal_id),
        ProposalState::Withdrawn
    );
    // A decision made before stays what it was.
    assert_eq!(
        state_of(&r.env.store, &decided.proposal_id),
        ProposalState::Approved
    );
    let before = r.env.dump();
    assert_eq!(
        r.decide(&p.proposal_id, "alice", Verdict::Approved)
            .unwrap_err(),
        "approval_not_pending"
    );
    assert_eq!(r.env.dump(), before);
    assert_eq!(r.env.link.decisions().len(), 1);
    assert!(relay::cards(&mut r.env.store, None, false)
        .unwrap()
        .is_empty());

    // Resumed, a proposal of the new attempt; the stop withdraws it, and
    // the certificate shows each proposal and what became of it.
    r.env
        .life()
        .with_relay_key(Some(r.key.public_key()))
        .resume(&session)
        .unwrap();
    let q = proposal(&session, 2, &r.rule, "gw-b", 3);
    relay::receive(&mut r.env.store, &msg(&q)).unwrap();
    let stopped = r.env.life().stop(&session).unwrap();
    assert_eq!(stopped.state, State::Ended);
    assert_eq!(
        state_of(&r.env.store, &q.proposal_id),
        ProposalState::Withdrawn
    );
    let cert = talos_control_stub::certificate::live(&r.env.store, &session).unwrap();
    let shown: BTreeMap<&str, (ProposalState, Option<&str>)> = cert
        .proposals
        .iter()
        .map(|c| (c.id.as_str(), (c.decision, c.approver.as_deref())))
        .collect();
    assert_eq!(
        shown[p.proposal_id.as_str()],
        (ProposalState::Withdrawn, None)
    );
    assert_eq!(
        shown[decided.proposal_id.as_str()],
        (ProposalState::Approved, Some("alice"))
    );
    assert_eq!(
        shown[q.proposal_id.as_str()],
        (ProposalState::Withdrawn, None)
    );
    let c = cert
        .proposals
        .iter()
        .find(|c| c.id == decided.proposal_id)
        .unwrap();
    assert_eq!(c.digest, msg(&decided).digest);
    assert_eq!(c.sentence, sentence(&decided));
    assert_eq!(c.rule, r.rule.id);
    assert!(c.decided_at.is_some());
}

#[test]
fn an_expired_proposal_is_marked_so_and_cannot_be_decided() {
    let mut r = relay_env();
    let mut p = proposal(&r.session, 1, &r.rule, "gw-a", 1);
    p.created_at = at(Duration::from_secs(600), false);
    p.expires_at = at(Duration::from_secs(300), false);
    relay::receive(&mut r.env.store, &msg(&p)).unwrap();
    assert_eq!(
        r.decide(&p.proposal_id, "alice", Verdict::Approved)
            .unwrap_err(),
        "approval_not_pending"
    );
    assert_eq!(
        state_of(&r.env.store, &p.proposal_id),
        ProposalState::Expired
    );
    assert!(r.env.link.decisions().is_empty());

    // Listing marks the overdue expired too, and shows only what is left.
    let mut late = proposal(&r.session, 1, &r.rule, "gw-a", 2);
    late.expires_at = at(Duration::from_millis(200), true);
    relay::receive(&mut r.env.store, &msg(&late)).unwrap();
    let fresh = r.propose(3);
    std::thread::sleep(Duration::from_millis(400));
    let cards = relay::cards(&mut r.env.store, Some("alice"), false).unwrap();
    assert_eq!(
        cards.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        [fresh.proposal_id.as_str()]
    );
    assert_eq!(
        state_of(&r.env.store, &late.proposal_id),
        ProposalState::Expired
    );
    assert!(relay::cards(&mut r.env.store, Some("carol"), false)
        .unwrap()
        .is_empty());
    assert_eq!(relay::cards(&mut r.env.store, None, true).unwrap().len(), 3);
}

// ---- the approvals commands ----

#[test]
fn the_approvals_commands_list_decide_and_refuse_bad_inputs_with_their_codes() {
    let Relay {
        env,
        key: _,
        session,
        rule,
    } = relay_env();
    let Env {
        dir,
        db,
        store,
        link,
    } = env;
    let mut store = store;
    let p = proposal(&session, 1, &rule, "gw-a", 1);
    relay::receive(&mut store, &msg(&p)).unwrap();
    drop(store);
    let control = dir.path().join("control");
    std::fs::create_dir(&control).unwrap();
    let verifier = talos_control_stub::FakeVerifier::accepting();
    let run = |args: &[&str]| {
        let db_arg = db.as_arg();
        let mut argv = vec!["control-stub", "--db", db_arg.to_str().unwrap()];
        argv.extend_from_slice(args);
        let mut out = Vec::new();
        let mut err = Vec::new();
        let status = talos_control_stub::cli::main_with(
            argv,
            &link,
            &verifier,
            &mut std::io::empty(),
            &mut out,
            &mut err,
        );
        (
            status,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    };
    let dir_arg = control.to_str().unwrap();

    let (status, out, _) = run(&["approvals", "list", "--approver", "alice"]);
    assert_eq!(status, 0);
    let cards: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(cards.len(), 1);
    assert_eq!(cards[0]["id"], p.proposal_id.as_str());
    assert_eq!(cards[0]["sentence"], sentence(&p).as_str());
    assert_eq!(cards[0]["digest"], msg(&p).digest.as_str());
    assert_eq!(cards[0]["approvers"], serde_json::json!(["alice", "bob"]));
    assert_eq!(cards[0]["session_id"], session.as_str());
    assert!(cards[0]["expires_at"].is_string());

    // Without the account's lab setting the command line decides nothing,
    // and says which setting it would take.
    let (status, out, err) = run(&[
        "--control-dir",
        dir_arg,
        "approvals",
        "approve",
        &p.proposal_id,
        "--as",
        "alice",
    ]);
    assert_eq!((status, out.as_str()), (2, ""));
    assert!(
        err.starts_with("error: lab_approvals_off: ") && err.contains("policy lab-approvals on"),
        "{err}"
    );
    assert!(link.decisions().is_empty());
    let (status, out, _) = run(&["policy", "lab-approvals", "show"]);
    assert_eq!(status, 0);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["lab_approvals"],
        "off"
    );
    let (status, out, err) = run(&["policy", "lab-approvals", "on"]);
    assert_eq!(status, 0, "{err}");
    let shown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["lab_approvals"], "on");
    assert!(shown["changed_by"].is_string() && shown["changed_at"].is_string());
    assert!(err.contains("\"lab_approvals\":\"on\""), "logged: {err}");

    let before = common::dump(&db);
    for (args, code) in [
        (
            vec!["approvals", "approve", &p.proposal_id, "--as", "alice"],
            "relay_key_invalid",
        ),
        (
            vec![
                "--control-dir",
                dir_arg,
                "approvals",
                "approve",
                "nope",
                "--as",
                "alice",
            ],
            "approval_not_found",
        ),
        (
            vec![
                "--control-dir",
                dir_arg,
                "approvals",
                "approve",
                &p.proposal_id,
                "--as",
                "carol",
            ],
            "approver_not_listed",
        ),
        (
            vec![
                "--control-dir",
                dir_arg,
                "approvals",
                "decline",
                &p.proposal_id,
                "--as",
                "a b",
            ],
            "name_invalid",
        ),
        (vec!["people", "remove", "nobody"], "person_not_found"),
    ] {
        let (status, out, err) = run(&args);
        assert_eq!(status, 2, "{args:?}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert!(
            err.starts_with(&format!("error: {code}: ")),
            "{args:?}: {err}"
        );
    }
    // `--as` is required.
    let (status, _, err) = run(&["approvals", "approve", &p.proposal_id]);
    assert_eq!(status, 2);
    assert!(err.contains("--as"), "{err}");
    assert_eq!(common::dump(&db), before);
    assert!(link.decisions().is_empty());

    let (status, out, err) = run(&[
        "--control-dir",
        dir_arg,
        "approvals",
        "approve",
        &p.proposal_id,
        "--as",
        "bob",
    ]);
    assert_eq!(status, 0, "{err}");
    let printed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(printed["decision"], "approved");
    assert_eq!(printed["approver"], "bob");
    assert_eq!(printed["outcome"], "released");
    let relay_key = identity::relay_key(&control).unwrap();
    let delivered = link.decisions();
    assert_eq!(delivered.len(), 1);
    verify_decision(&relay_key.public_key(), &delivered[0].1).unwrap();
    let (status, _, err) = run(&[
        "--control-dir",
        dir_arg,
        "approvals",
        "decline",
        &p.proposal_id,
        "--as",
        "alice",
    ]);
    assert_eq!(status, 2);
    assert!(err.starts_with("error: approval_not_pending: "), "{err}");

    // The bearer-token approvals API is gone, with its command.
    let (status, _, err) = run(&["approvers", "add", "alice"]);
    assert_eq!(status, 2);
    assert!(err.contains("unrecognized subcommand 'approvers'"), "{err}");
}

// ---- over the wire: a stand-in gateway, `serve`, the CLI and the API ----

/// A stand-in gateway that opens sessions (remembering the relay key and
/// rules each came with) and takes decisions it can verify.
#[derive(Clone)]
struct StandIn {
    id: String,
    key: Arc<talos_certs::GatewayKey>,
    opens: Arc<Mutex<Vec<pb::OpenSessionRequest>>>,
    decisions: Arc<Mutex<Vec<talos_certs::Decision>>>,
}

#[tonic::async_trait]
impl Gateway for StandIn {
    async fn open_session(
        &self,
        request: Request<pb::OpenSessionRequest>,
    ) -> Result<Response<pb::OpenSessionReply>, Status> {
        let mut req = request.into_inner();
        let ca = rcgen::generate_simple_self_signed(req.allowlist.clone()).unwrap();
        let digest = talos_certs::sha384_hex(ca.cert.der());
        for a in &mut req.attachments {
            a.value.clear();
        }
        self.opens.lock().unwrap().push(req);
        Ok(Response::new(pb::OpenSessionReply {
            gateway_id: self.id.clone(),
            ca_pem: ca.cert.pem(),
            ca_digest: digest,
            instance: "00000000000000aa".into(),
            lease_ms: 60_000,
        }))
    }

    async fn close_session(
        &self,
        _request: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionReply>, Status> {
        Err(Status::failed_precondition("not in this test"))
    }

    async fn decide(
        &self,
        request: Request<pb::Signed>,
    ) -> Result<Response<pb::DecideReply>, Status> {
        let env = request.into_inner();
        let relay: [u8; 32] = self
            .opens
            .lock()
            .unwrap()
            .last()
            .and_then(|o| o.relay_public_key.as_slice().try_into().ok())
            .ok_or_else(|| Status::failed_precondition("no relay key"))?;
        if env.kind != "decision" {
            return Err(Status::invalid_argument("not a decision"));
        }
        let signed = talos_certs::Signed {
            kind: talos_certs::Kind::Decision,
            key_id: env.key_id,
            payload: env.payload,
            signature: env.signature,
        };
        let d = verify_decision(&relay, &signed)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let outcome = match d.decision {
            Verdict::Approved => "released",
            Verdict::Declined => "refused",
        };
        self.decisions.lock().unwrap().push(d);
        Ok(Response::new(pb::DecideReply {
            outcome: outcome.into(),
        }))
    }

    async fn describe(
        &self,
        _request: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeReply>, Status> {
        Ok(Response::new(pb::DescribeReply {
            gateway_id: self.id.clone(),
            public_key: self.key.public_key().to_vec(),
            key_id: self.key.key_id(),
            instance: "00000000000000aa".into(),
            lease_ms: 60_000,
            key_binding: Vec::new(),
        }))
    }

    async fn renew_leases(
        &self,
        request: Request<pb::RenewLeasesRequest>,
    ) -> Result<Response<pb::RenewLeasesReply>, Status> {
        Ok(Response::new(pb::RenewLeasesReply {
            renewed: request.into_inner().leases,
            not_held: Vec::new(),
            lease_ms: 60_000,
            instance: "00000000000000aa".into(),
            forwarding_taken: 0,
        }))
    }
}

impl StandIn {
    fn new(id: &str) -> StandIn {
        StandIn {
            id: id.into(),
            key: Arc::new(talos_certs::GatewayKey::generate().unwrap()),
            opens: Arc::default(),
            decisions: Arc::default(),
        }
    }

    /// Serve on 127.0.0.1:0 with the identity `id` from `dir`, on a thread
    /// of its own.
    fn serve(&self, dir: &std::path::Path) -> SocketAddr {
        common::serve_stand_in(dir, &self.id, self.clone())
    }
}

/// A ControlPlane client presenting `who`'s identity from `dir`.
async fn control_client(
    dir: &std::path::Path,
    who: &str,
    addr: SocketAddr,
) -> ControlPlaneClient<Channel> {
    let tls = Identity::load(dir, who).unwrap().client_config().unwrap();
    let connector = TlsConnector::from(Arc::new(tls));
    let name = ServerName::try_from(identity::STUB_NAME).unwrap();
    let service = tower::service_fn(move |_uri: hyper::Uri| {
        let connector = connector.clone();
        let name = name.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            let tls = connector.connect(name, tcp).await?;
            Ok::<_, std::io::Error>(TokioIo::new(tls))
        }
    });
    let channel = Endpoint::from_static("https://control-stub")
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect_with_connector(service)
        .await
        .unwrap();
    ControlPlaneClient::new(channel)
}

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_relay_end_to_end_over_mutual_tls_the_cli_and_the_web_app() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("control");
    identity::init(&dir, &["gw-a".into(), "gw-b".into()]).unwrap();
    let relay_public = identity::relay_key(&dir).unwrap().public_key();
    let db = tmp.path().join("stub.db");
    let gw = StandIn::new("gw-a");
    let gw_addr = gw.serve(&dir);
    let gateway = format!("gw-a={gw_addr}");
    let dir_s = dir.to_str().unwrap().to_owned();
    let web_ca = common::people::WebCa::new(tmp.path());
    // The origin people's browsers use; this test's client connects to
    // wherever serve listens and says this origin, as a browser behind a
    // name and port of the operator's would.
    let origin = "https://people.talos.test:8443";
    let rp =
        talos_control_stub::people::rp::RelyingParty::new(origin, common::people::RP_ID).unwrap();
    let mut outputs = String::new();
    let mut run = |args: &[&str], stdin: &[u8]| {
        let mut all = vec![
            "--control-dir",
            dir_s.as_str(),
            "--gateway",
            gateway.as_str(),
        ];
        all.extend_from_slice(args);
        let out = bin(&db, &all, stdin);
        outputs.push_str(&out.stdout);
        outputs.push_str(&out.stderr);
        out
    };

    // `serve` with the web app, reaching gw-a for decisions.
    let mut child = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_control-stub"))
            .arg("--db")
            .arg(&db)
            .args(["--control-dir", &dir_s, "--gateway", &gateway])
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(["--web-listen", "127.0.0.1:0", "--web-origin", origin])
            .arg("--web-cert")
            .arg(&web_ca.cert)
            .arg("--web-key")
            .arg(&web_ca.key)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    std::io::BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ready: serde_json::Value = serde_json::from_str(&line).unwrap();
    let grpc_addr: SocketAddr = ready["listening"].as_str().unwrap().parse().unwrap();
    let web_addr: SocketAddr = ready["web"].as_str().unwrap().parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    // Alice, Bob and Carol enrol, each with the link `people enroll`
    // printed, on the web app.
    let mut links = Vec::new();
    let mut people = BTreeMap::new();
    for name in ["alice", "bob", "carol"] {
        let out = run(
            &[
                "people",
                "enroll",
                name,
                "--role",
                "approver",
                "--web-origin",
                origin,
            ],
            b"",
        );
        assert_eq!(out.status, 0, "{out:?}");
        let printed: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        let link = printed["link"].as_str().unwrap().to_owned();
        assert!(link.starts_with(&format!("{origin}/enrol#")), "{link}");
        let mut browser = common::people::Client::new(web_addr, &web_ca.ca_pem, origin);
        let passkey = rt.block_on(browser.enrol(&rp, &link));
        rt.block_on(async {
            let signed = browser.sign_in(&rp, &passkey).await;
            assert_eq!(signed.status, 200, "{}", signed.text);
        });
        links.push(link);
        people.insert(name, (browser, passkey));
    }

    assert_eq!(
        run(&["policy", "egress", "add", "api.github.com"], b"").status,
        0
    );
    assert_eq!(
        run(
            &["secret", "set", "GH", "--tenant", "acme"],
            SECRET.as_bytes()
        )
        .status,
        0
    );
    let out = run(
        &[
            "policy",
            "lock",
            "add",
            "--destination",
            "api.github.com",
            "--method",
            "POST",
            "--path-prefix",
            "/repos/",
            "--mode",
            "every_request",
            "--approver",
            "alice",
            "--approver",
            "bob",
        ],
        b"",
    );
    let rule: LockRule = serde_json::from_str(&out.stdout).unwrap();
    let out = run(
        &[
            "sandbox",
            "start",
            "--tenant",
            "acme",
            "--source",
            "10.1.0.2",
            "--allow",
            "api.github.com",
            "--attach",
            "GH=api.github.com:authorization:Bearer",
            "--mode",
            "commands",
        ],
        b"",
    );
    assert_eq!(out.status, 0, "{out:?}");
    let session = serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    {
        let opens = gw.opens.lock().unwrap();
        assert_eq!(opens[0].relay_public_key, relay_public.to_vec());
        assert_eq!(opens[0].lock.len(), 1);
        assert_eq!(opens[0].lock[0].id, rule.id);
        assert_eq!(opens[0].lock[0].mode, "every_request");
        assert_eq!(opens[0].lock[0].approvers, ["alice", "bob"]);
    }

    let p1 = proposal(&session, 1, &rule, "gw-a", 1);
    let p2 = proposal(&session, 1, &rule, "gw-a", 2);
    rt.block_on(async {
        let mut a = control_client(&dir, "gw-a", grpc_addr).await;
        a.propose(msg(&p1)).await.unwrap();
        a.propose(msg(&p1)).await.unwrap();
        a.propose(msg(&p2)).await.unwrap();
        let mut bad = msg(&proposal(&session, 1, &rule, "gw-a", 3));
        bad.sentence.push('!');
        let e = a.propose(bad).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().starts_with("proposal_invalid"), "{e:?}");
        let mut bad = msg(&proposal(&session, 1, &rule, "gw-a", 4));
        bad.digest = "00".repeat(48);
        let e = a.propose(bad).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        let mut other = p1.clone();
        other.path = "/repos/elsewhere".into();
        let e = a.propose(msg(&other)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
        let e = a
            .propose(msg(&proposal(&session, 2, &rule, "gw-a", 5)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        // gw-b's certificate cannot propose as gw-a.
        let mut b = control_client(&dir, "gw-b", grpc_addr).await;
        let e = b
            .propose(msg(&proposal(&session, 1, &rule, "gw-a", 6)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    });

    rt.block_on(async {
        // The web app: each person's waiting cards, and nothing without a
        // session.
        let mut stranger = common::people::Client::new(web_addr, &web_ca.ca_pem, origin);
        let a = stranger.get("/api/cards").await;
        assert_eq!((a.status, a.code()), (401, "not_signed_in"), "{}", a.text);
        let (alice, _) = people.get_mut("alice").unwrap();
        let cards = alice.get("/api/cards").await;
        assert_eq!(cards.status, 200, "{}", cards.text);
        let list = cards.body["cards"].as_array().unwrap().clone();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0]["digest"], msg(&p1).digest.as_str());
        assert_eq!(list[0]["sentence"]["escaped"], sentence(&p1).as_str());
        let (carol, carol_key) = people.get_mut("carol").unwrap();
        let mine = carol.get("/api/cards").await;
        assert_eq!(mine.body["cards"].as_array().unwrap().len(), 0);
        // Carol, not named on the card, cannot decide it with her own
        // passkey; no card, no decision; a GET is not a decision.
        let refused = carol
            .decide(&rp, carol_key, &list[0], "approved", "approved")
            .await;
        assert_eq!(
            (refused.status, refused.code()),
            (403, "approver_not_listed"),
            "{}",
            refused.text
        );
        let mut nope = list[0].clone();
        nope["id"] = "nope".into();
        let (alice, alice_key) = people.get_mut("alice").unwrap();
        let refused = alice
            .decide(&rp, alice_key, &nope, "approved", "approved")
            .await;
        assert_eq!(
            (refused.status, refused.code()),
            (404, "approval_not_found")
        );
        let refused = alice
            .get(&format!("/api/cards/{}/decision", p1.proposal_id))
            .await;
        assert_eq!(refused.status, 405);
        assert!(gw.decisions.lock().unwrap().is_empty());
    });

    // Approved on the command line (tests and labs), declined on the web
    // by Bob with his passkey: the gateway verified both under the relay
    // key it was opened with.
    let lab = run(&["policy", "lab-approvals", "on"], b"");
    assert_eq!(lab.status, 0, "{lab:?}");
    let out = run(
        &["approvals", "approve", &p1.proposal_id, "--as", "alice"],
        b"",
    );
    assert_eq!(out.status, 0, "{out:?}");
    rt.block_on(async {
        let (bob, bob_key) = people.get_mut("bob").unwrap();
        let cards = bob.get("/api/cards").await;
        let list = cards.body["cards"].as_array().unwrap().clone();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0]["id"], p2.proposal_id.as_str());
        let done = bob
            .decide(&rp, bob_key, &list[0], "declined", "declined")
            .await;
        assert_eq!(done.status, 200, "{}", done.text);
        assert_eq!(done.body["outcome"], "refused");
        let (alice, alice_key) = people.get_mut("alice").unwrap();
        let cards = alice.get("/api/cards").await;
        assert_eq!(cards.body["cards"].as_array().unwrap().len(), 0);
        let mut decided = list[0].clone();
        decided["id"] = p1.proposal_id.as_str().into();
        let again = alice
            .decide(&rp, alice_key, &decided, "approved", "approved")
            .await;
        assert_eq!(
            (again.status, again.code()),
            (409, "approval_not_pending"),
            "{}",
            again.text
        );
    });
    {
        let got = gw.decisions.lock().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].proposal_id, p1.proposal_id);
        assert_eq!(got[0].proposal_digest, msg(&p1).digest);
        assert_eq!(
            (got[0].approver.as_str(), got[0].decision),
            ("alice", Verdict::Approved)
        );
        assert_eq!(got[1].proposal_digest, msg(&p2).digest);
        assert_eq!(
            (got[1].approver.as_str(), got[1].decision),
            ("bob", Verdict::Declined)
        );
    }
    // The web's decision keeps Bob's assertion, whole, beside it; the
    // command line's has none.
    let store = Store::open(&db).unwrap();
    let (d1, d2) = store
        .read(|tx| {
            Ok((
                tx.proposal(&p1.proposal_id)?.unwrap(),
                tx.proposal(&p2.proposal_id)?.unwrap(),
            ))
        })
        .unwrap();
    assert!(d1.assertion.is_none());
    let a = d2.assertion.unwrap();
    assert_eq!(
        (a.person.as_str(), a.origin.as_str(), a.rp_id.as_str()),
        ("bob", origin, "people.talos.test")
    );
    assert_eq!(
        a.challenge,
        base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            talos_certs::webauthn::decision_challenge(&d2.digest, Verdict::Declined)
        )
    );

    let out = run(&["approvals", "list", "--all"], b"");
    let all: Vec<serde_json::Value> = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(all.len(), 2);

    let _ = child.0.kill();
    let mut log = String::new();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(log.contains("\"proposal\""), "{log}");
    for text in [&outputs, &log, &line] {
        assert!(!text.contains(SECRET), "a secret value was printed");
    }
    // No session cookie, and no enrolment token past the one output that
    // shows it, reach the log.
    for (browser, _) in people.values() {
        assert!(
            !log.contains(browser.cookie.as_deref().unwrap()),
            "a cookie in the log"
        );
    }
    for link in &links {
        let token = common::people::token_of(link);
        assert!(!log.contains(&token), "an enrolment token in the log");
    }
}

#[test]
fn approval_refusals_from_the_gateways_records_show_on_the_certificate() {
    let mut r = relay_env();
    let p = r.propose(1);
    r.decide(&p.proposal_id, "bob", Verdict::Declined).unwrap();
    let held = |refusal: &str, id: &str, decision: &str| {
        serde_json::json!({
            "method": "POST",
            "path": "/repos/acme/widgets/merges",
            "status": 403,
            "refusal": refusal,
            "approval": {"proposal_id": id, "digest": "ab".repeat(48), "rule": "lock-1",
                         "decision": decision, "requested_at": "t0", "decided_at": "t1"},
        })
    };
    let record = serde_json::json!({
        "session_id": r.session,
        "gateway_id": "gw-a",
        "sni": "api.github.com",
        "opened_at": "2026-11-29T12:00:00.000Z",
        "verdict": "allowed",
        "requests": [
            held("approval_declined", &p.proposal_id, "declined"),
            held("approval_withdrawn", "gw-a-2-7f3a", "withdrawn"),
        ],
    });
    r.env
        .store
        .record_batch("gw-a", 1, "d1", &[record])
        .unwrap();
    let cert = talos_control_stub::certificate::live(&r.env.store, &r.session).unwrap();
    let refusals: Vec<(&str, Option<&str>)> = cert
        .refusals
        .iter()
        .map(|f| (f.reason.as_str(), f.proposal_id.as_deref()))
        .collect();
    assert_eq!(
        refusals,
        [
            ("approval_declined", Some(p.proposal_id.as_str())),
            ("approval_withdrawn", Some("gw-a-2-7f3a")),
        ]
    );
    assert_eq!(cert.proposals.len(), 1);
    assert_eq!(cert.proposals[0].decision, ProposalState::Declined);
    assert_eq!(cert.proposals[0].approver.as_deref(), Some("bob"));
    assert_eq!(cert.proposals[0].outcome.as_deref(), Some("refused"));
    assert_eq!(cert.attempts[0].lock, vec![r.rule.clone()]);
}
