//! The gateway checks the person's assertion inside a decision itself
//! (issue 42), whatever the relay signs: the gateway binary, a real client,
//! and the tests' own control plane (`talos_e2e::relay`) whose key signs
//! every decision here, as a relay that lies would. The session is opened
//! with Alice's and Bob's passkeys (software authenticators), the web app's
//! rp id and origin, and no lab setting.
//!
//! Each refusal is checked three ways ([`Forged::refused`]): the
//! gateway's answer to the Decide call names it,
//! `gateway_person_refusals_total{reason}` counts it once, and the
//! gateway's log has a "decision refused" line naming it; and the request
//! stays held, so that a good decision after it still releases it. The
//! families: the relay's word without the named person's (no assertion,
//! another person, another card, the other verdict); a replayed sign count
//! (a cloned authenticator, or a count the store had already seen), and
//! one decision delivered twice; the wrong relying party (rp id, origin,
//! crossOrigin) and an unverified or absent user.

use std::path::PathBuf;

use talos_certs::webauthn::soft::{Authenticator, Ceremony, SignedAssertion};
use talos_certs::webauthn::{decision_challenge, CoseAlgorithm, Expected, Flags};
use talos_certs::{Decision, Proposal, ProposalKind, Verdict};
use talos_e2e::clients::{http, SESSION_SOURCE};
use talos_e2e::rig::Single;
use talos_e2e::wait;
use talos_gateway::pb;
use tokio::task::JoinHandle;

const API: &str = "api.test";
const SECRET: &str = "person-f0rged-S3cret-v4lue";
const RP_ID: &str = "people.talos.test";
const ORIGIN: &str = "https://people.talos.test:8443";
/// The highest sign count the control plane's store saw for Bob's phone,
/// as the session's open carries it (Alice's: none yet).
const BOB_SEEN: u32 = 5;

fn rule(id: &str, approver: &str) -> pb::LockRule {
    pb::LockRule {
        id: id.into(),
        destination: API.into(),
        attachment: "API_TOKEN".into(),
        method: "POST".into(),
        path_prefix: if id == "lock-merge" {
            "/merge"
        } else {
            "/deploy"
        }
        .into(),
        mode: "every_request".into(),
        approvers: vec![approver.into()],
    }
}

fn key(owner: &str, a: &Authenticator, sign_count: u32) -> pb::ApproverKey {
    pb::ApproverKey {
        owner: owner.into(),
        credential_id: a.credential_id().to_vec(),
        public_key_cose: a.public_key_cose().to_vec(),
        sign_count,
    }
}

/// The gateway with the tests' relay, and the session opened with Alice's
/// (ES256) and Bob's (EdDSA) passkeys.
struct Forged {
    rig: Single,
    alice: Authenticator,
    bob: Authenticator,
    /// The session's CA.
    ca: PathBuf,
}

async fn start() -> Forged {
    let rig: Single = Single::builder().relay().start_loopback(&[API]).await;
    let alice = Authenticator::new(CoseAlgorithm::Es256);
    let bob = Authenticator::new(CoseAlgorithm::EdDsa);
    let ca = open(&rig, &alice, &bob).await;
    Forged {
        rig,
        alice,
        bob,
        ca,
    }
}

async fn open(rig: &Single, alice: &Authenticator, bob: &Authenticator) -> PathBuf {
    let request = pb::OpenSessionRequest {
        session_id: "sess-p".into(),
        attempt: 1,
        tenant: "acme".into(),
        sources: vec![SESSION_SOURCE.into()],
        allowlist: vec![API.into()],
        attachments: vec![pb::Attachment {
            secret: "API_TOKEN".into(),
            destination: API.into(),
            header: "authorization".into(),
            scheme: "Bearer".into(),
            value: SECRET.as_bytes().to_vec(),
        }],
        cause: "launch".into(),
        // Alice decides merges; Bob, deploys.
        lock: vec![rule("lock-merge", "alice"), rule("lock-deploy", "bob")],
        relay_public_key: rig.relay().key.public_key().to_vec(),
        approver_keys: vec![key("alice", alice, 0), key("bob", bob, BOB_SEEN)],
        rp_id: RP_ID.into(),
        origin: ORIGIN.into(),
        lab_approvals: false,
        ..Default::default()
    };
    rig.open(request, "sess-p.pem").await
}

impl Forged {
    /// `POST https://api.test{path}` on a connection of its own through
    /// the gateway (held by the Lock); the task ends with the answer's
    /// status and body. Returns it with the card the relay received for
    /// it, the `n`th proposal, naming Alice for a merge, Bob for a deploy.
    async fn hold(&self, path: &str, n: usize) -> (JoinHandle<(u16, String)>, pb::ProposalMsg) {
        let mut conn =
            http::connect(SESSION_SOURCE, self.rig.gateway.data, API, &self.ca, false).await;
        let uri = format!("https://{API}{path}");
        let held = tokio::spawn(async move {
            use http_body_util::BodyExt;
            let req = hyper::Request::builder()
                .method("POST")
                .uri(uri)
                .body(http::empty())
                .unwrap();
            let resp = conn.send(req).await.expect("answer");
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.expect("body").to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        });
        let proposals = self.rig.relay().wait_proposals(n, 30).await;
        assert_eq!(proposals.len(), n, "the card for {path}");
        let p = proposals[n - 1].clone();
        let approver = if path.starts_with("/merge") {
            "alice"
        } else {
            "bob"
        };
        assert_eq!(
            (p.path.as_str(), &p.approvers[..]),
            (path, &[approver.to_owned()][..])
        );
        (held, p)
    }

    /// The approval of `p` as `by`'s phone makes it (count `count`), in
    /// the relay's signed decision naming the card's approver and carrying
    /// the card.
    fn approves(&self, by: &Authenticator, p: &pb::ProposalMsg, count: u32) -> pb::Signed {
        let assertion = assert_by(by, &p.digest, Verdict::Approved, count);
        approved(&self.rig, p, &assertion)
    }

    /// The gateway refuses `signed` with `reason`: its answer to Decide is
    /// PermissionDenied naming it, the refusal is counted once under it and
    /// logged naming it, and the request `held` is still waiting.
    async fn refused(&self, signed: pb::Signed, reason: &str, held: &JoinHandle<(u16, String)>) {
        let rig = &self.rig;
        let (counted, lines) = (refusals(rig, reason), logged(rig, reason));
        let e = decide(rig, signed).await.expect_err(reason);
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{reason}: {e:?}");
        assert!(
            e.message().contains(&format!("({reason})")),
            "{reason}: {}",
            e.message()
        );
        assert_eq!(
            refusals(rig, reason),
            counted + 1.0,
            "{reason}: counted once"
        );
        wait::until_async(&format!("the gateway's log line refusing {reason}"), || {
            wait::check(logged(rig, reason), |n| *n > lines)
        })
        .await;
        assert!(!held.is_finished(), "{reason}: the request stays held");
    }

    /// `signed` releases the request held for card `p`, which then
    /// completes 200 at the origin, recorded as approved by the card's
    /// approver.
    async fn released(
        &self,
        signed: pb::Signed,
        held: JoinHandle<(u16, String)>,
        p: &pb::ProposalMsg,
    ) {
        let path = p.path.as_str();
        assert_eq!(decide(&self.rig, signed).await.unwrap(), "released");
        let (status, body) = held.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(self.rig.peers.origin.paths_starting(path), [path]);
        let approval = approval_of(&self.rig, path).await;
        assert_eq!(approval["decision"], "approved", "{approval}");
        assert_eq!(approval["approver"], p.approvers[0], "{approval}");
    }
}

fn fields(p: &pb::ProposalMsg) -> Proposal {
    Proposal {
        proposal_id: p.proposal_id.clone(),
        gateway_id: p.gateway_id.clone(),
        session_id: p.session_id.clone(),
        attempt: p.attempt,
        tenant: p.tenant.clone(),
        kind: ProposalKind::Request,
        destination: p.destination.clone(),
        method: p.method.clone(),
        path: p.path.clone(),
        attachments: p.attachments.clone(),
        rule: p.rule.clone(),
        tool: p.tool.clone(),
        call_digest: p.call_digest.clone(),
        approvers: p.approvers.clone(),
        created_at: p.created_at.clone(),
        expires_at: p.expires_at.clone(),
    }
}

/// The right `get` ceremony for a decision of `verdict` on the card whose
/// digest is `digest`: the web app's rp id and origin, UP and UV, count 0.
/// A test changes the one field it is about.
fn ceremony(digest: &str, verdict: Verdict) -> Ceremony {
    Ceremony::get(&Expected {
        challenge: &decision_challenge(digest, verdict),
        rp_id: RP_ID,
        origin: ORIGIN,
    })
}

/// `by`'s assertion over `digest` and `verdict`, its count `count`.
fn assert_by(by: &Authenticator, digest: &str, verdict: Verdict, count: u32) -> SignedAssertion {
    by.assert(&ceremony(digest, verdict).sign_count(count))
}

/// The relay's signed decision on `p` naming `approver` and `verdict`,
/// carrying `card` and `assertion`.
fn relay_signed(
    rig: &Single,
    p: &pb::ProposalMsg,
    approver: &str,
    verdict: Verdict,
    card: Option<Proposal>,
    assertion: Option<&SignedAssertion>,
) -> pb::Signed {
    let signed = Decision {
        proposal_id: p.proposal_id.clone(),
        proposal_digest: p.digest.clone(),
        approver: approver.into(),
        decision: verdict,
        decided_at: talos_gateway::records::record::now(),
        card,
        assertion: assertion.map(SignedAssertion::to_passkey_assertion),
    }
    .sign(&rig.relay().key);
    pb::Signed {
        kind: signed.kind.as_str().to_owned(),
        key_id: signed.key_id,
        payload: signed.payload,
        signature: signed.signature,
    }
}

/// The relay's approval of `p` in the name of its (one) approver,
/// carrying the card and `assertion`.
fn approved(rig: &Single, p: &pb::ProposalMsg, assertion: &SignedAssertion) -> pb::Signed {
    relay_signed(
        rig,
        p,
        &p.approvers[0],
        Verdict::Approved,
        Some(fields(p)),
        Some(assertion),
    )
}

async fn decide(rig: &Single, signed: pb::Signed) -> Result<String, tonic::Status> {
    rig.client()
        .decide(signed)
        .await
        .map(|r| r.into_inner().outcome)
}

/// How many of the gateway's "decision refused" log lines name `reason`.
fn logged(rig: &Single, reason: &str) -> usize {
    let named = format!("({reason})");
    rig.gateway
        .log()
        .lines()
        .filter(|l| l.contains("decision refused") && l.contains(&named))
        .count()
}

fn refusals(rig: &Single, reason: &str) -> f64 {
    rig.gateway
        .metric(&format!(
            "gateway_person_refusals_total{{reason=\"{reason}\"}}"
        ))
        .unwrap_or_else(|| panic!("the {reason} refusals series is exported"))
}

/// The approval record of the request to `path`, once it is written.
async fn approval_of(rig: &Single, path: &str) -> serde_json::Value {
    wait::until_async(&format!("the record of {path}"), || {
        rig.gateway
            .records()
            .iter()
            .flat_map(|r| r["requests"].as_array().cloned().unwrap_or_default())
            .find(|q| q["path"] == path)
            .map(|q| q["approval"].clone())
            .ok_or(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_relays_signature_without_the_named_persons_own_releases_nothing() {
    let f = start().await;
    let (held, p) = f.hold("/merge/1", 1).await;
    let card = fields(&p);
    let mut other = card.clone();
    other.path = "/merge/2".into();
    let other_digest = talos_certs::proposal_digest(&other, &talos_certs::sentence(&other));

    let rig = &f.rig;
    // The relay's decision on this card, `verdict` in Alice's name,
    // carrying `card` and `by`'s assertion over `digest` and `asserted`.
    let forged = |verdict, card: &Proposal, by, digest: &str, asserted, count| {
        let assertion = assert_by(by, digest, asserted, count);
        relay_signed(
            rig,
            &p,
            "alice",
            verdict,
            Some(card.clone()),
            Some(&assertion),
        )
    };
    let (approve, decline) = (Verdict::Approved, Verdict::Declined);
    let cases = [
        (
            relay_signed(rig, &p, "alice", approve, None, None),
            "no_assertion",
        ),
        // Alice declined; the relay says she approved.
        (
            forged(approve, &card, &f.alice, &p.digest, decline, 1),
            "challenge_mismatch",
        ),
        // Alice approved; the relay says she declined.
        (
            forged(decline, &card, &f.alice, &p.digest, approve, 2),
            "challenge_mismatch",
        ),
        // Alice approved another card; the relay puts it on this one.
        (
            forged(approve, &other, &f.alice, &other_digest, approve, 3),
            "challenge_mismatch",
        ),
        // Bob's key (listed: he decides deploys) signed this card; the
        // relay names Alice.
        (
            forged(approve, &card, &f.bob, &p.digest, approve, 1),
            "unknown_credential",
        ),
    ];
    for (signed, reason) in cases {
        f.refused(signed, reason, &held).await;
    }

    // Alice's own approval of this card: released, in her name.
    f.released(f.approves(&f.alice, &p, 4), held, &p).await;
    // The decision's log line names the person whose passkey verified.
    wait::until_async("the decision's log line naming alice", || {
        wait::check(rig.gateway.log(), |log| {
            log.lines().any(|l| {
                l.contains("decision signed by the person's passkey, verified")
                    && l.contains("person=alice")
            })
        })
    })
    .await;
}

/// A phone counts its signatures. A count not above the highest seen for
/// its key, by this gateway or by the control plane's store (the open
/// carries it), is what a cloned authenticator gives: refused, even over
/// the right card and verdict. And one decision delivered twice releases
/// once.
#[tokio::test(flavor = "multi_thread")]
async fn a_sign_count_not_above_the_highest_seen_releases_nothing() {
    const N: u32 = 7;
    let f = start().await;

    // Card 1, approved at count N, delivered twice at once (a relay that
    // retries, or replays): one release, the other finds nothing pending.
    let (held, p1) = f.hold("/merge/1", 1).await;
    let approval = f.approves(&f.alice, &p1, N);
    let (a, b) = tokio::join!(
        decide(&f.rig, approval.clone()),
        decide(&f.rig, approval.clone())
    );
    let (released, again) = match (a, b) {
        (Ok(outcome), Err(e)) | (Err(e), Ok(outcome)) => (outcome, e),
        other => panic!("one release and one refusal, not {other:?}"),
    };
    assert_eq!(released, "released");
    assert_eq!(again.code(), tonic::Code::FailedPrecondition, "{again:?}");
    let (status, body) = held.await.unwrap();
    assert_eq!(status, 200, "{body}");
    // And once more after the request completed: still nothing.
    let late = decide(&f.rig, approval).await.expect_err("a late delivery");
    assert_eq!(late.code(), tonic::Code::FailedPrecondition, "{late:?}");
    assert_eq!(f.rig.peers.origin.paths_starting("/merge/1"), ["/merge/1"]);

    // Card 2: Alice's key over this very card and verdict, at count N (a
    // clone of her authenticator) or below it. Card 3: Bob's phone, of
    // which this gateway has seen no assertion, but whose highest count
    // the open carried from the store (BOB_SEEN): an assertion at that
    // count or below (made before, elsewhere) is a replay too. Each
    // phone's next count releases its card.
    let cards = [
        ("/merge/2", 2, &f.alice, N),
        ("/deploy/1", 3, &f.bob, BOB_SEEN),
    ];
    for (path, n, phone, highest) in cards {
        let (held, p) = f.hold(path, n).await;
        for count in [highest, highest - 1] {
            f.refused(f.approves(phone, &p, count), "sign_count_replayed", &held)
                .await;
        }
        f.released(f.approves(phone, &p, highest + 1), held, &p)
            .await;
    }
    assert_eq!(
        f.rig
            .gateway
            .metric("gateway_approvals_total{outcome=\"approved\"}"),
        Some(3.0),
        "three cards, three releases"
    );
}

/// An assertion made for another relying party (its rp id hash), from
/// another origin or inside another site's frame, or with the user not
/// verified or not present is refused under its name, and none of them
/// moves Alice's sign count.
#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_relying_party_or_an_unverified_user_releases_nothing() {
    let f = start().await;
    let (held, p) = f.hold("/merge/1", 1).await;
    let right = || ceremony(&p.digest, Verdict::Approved);
    let cases = [
        (right().rp_id("people.evil.test"), "rp_id_mismatch"),
        (right().rp_id("talos.test"), "rp_id_mismatch"),
        (
            right().origin("https://people.talos.test:9443"),
            "origin_mismatch",
        ),
        (right().origin("https://evil.test"), "origin_mismatch"),
        (
            right().origin("http://people.talos.test:8443"),
            "origin_mismatch",
        ),
        // Signed inside another site's frame.
        (
            Ceremony {
                cross_origin: Some(true),
                ..right()
            },
            "origin_mismatch",
        ),
        (right().flags(Flags::UP), "user_not_verified"),
        (right().flags(Flags::UV), "user_not_present"),
    ];
    for (count, (ceremony, reason)) in (10..).zip(cases) {
        let assertion = f.alice.assert(&ceremony.sign_count(count));
        f.refused(approved(&f.rig, &p, &assertion), reason, &held)
            .await;
    }
    // Counts 10 and up were refused, so the highest seen is still the
    // open's: her phone's count 1 releases it.
    f.released(f.approves(&f.alice, &p, 1), held, &p).await;
}
