//! The gateway checks the person's assertion inside a decision itself
//! (issue 42), whatever the relay signs: the gateway binary, a real client,
//! and the tests' own control plane (`talos_e2e::relay`) whose key signs
//! every decision here, as a relay that lies would. The session is opened
//! with Alice's and Bob's passkeys (software authenticators), the web app's
//! rp id and origin, and no lab setting.

use std::path::PathBuf;

use talos_certs::webauthn::soft::{Authenticator, Ceremony, SignedAssertion};
use talos_certs::webauthn::{decision_challenge, CoseAlgorithm, Expected};
use talos_certs::{Decision, Proposal, ProposalKind, Verdict};
use talos_e2e::clients::{http, SESSION_SOURCE};
use talos_e2e::rig::Single;
use talos_gateway::pb;

const API: &str = "api.test";
const SECRET: &str = "person-f0rged-S3cret-v4lue";
const RP_ID: &str = "people.talos.test";
const ORIGIN: &str = "https://people.talos.test:8443";

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

fn key(owner: &str, a: &Authenticator) -> pb::ApproverKey {
    pb::ApproverKey {
        owner: owner.into(),
        credential_id: a.credential_id().to_vec(),
        public_key_cose: a.public_key_cose().to_vec(),
        sign_count: 0,
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
        approver_keys: vec![key("alice", alice), key("bob", bob)],
        rp_id: RP_ID.into(),
        origin: ORIGIN.into(),
        lab_approvals: false,
        ..Default::default()
    };
    rig.open(request, "sess-p.pem").await
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

/// `by`'s assertion over `digest` and `verdict`, its count `count`.
fn assert_by(by: &Authenticator, digest: &str, verdict: Verdict, count: u32) -> SignedAssertion {
    let challenge = decision_challenge(digest, verdict);
    by.assert(
        &Ceremony::get(&Expected {
            challenge: &challenge,
            rp_id: RP_ID,
            origin: ORIGIN,
        })
        .sign_count(count),
    )
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

async fn decide(rig: &Single, signed: pb::Signed) -> Result<String, tonic::Status> {
    rig.client()
        .decide(signed)
        .await
        .map(|r| r.into_inner().outcome)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_relays_signature_without_the_named_persons_own_releases_nothing() {
    let rig: Single = Single::builder().relay().start_loopback(&[API]).await;
    let alice = Authenticator::new(CoseAlgorithm::Es256);
    let bob = Authenticator::new(CoseAlgorithm::EdDsa);
    let ca = open(&rig, &alice, &bob).await;
    let mut conn = http::connect(SESSION_SOURCE, rig.gateway.data, API, &ca, false).await;
    let held = tokio::spawn(async move {
        use http_body_util::BodyExt;
        let req = hyper::Request::builder()
            .method("POST")
            .uri(format!("https://{API}/merge/1"))
            .body(http::empty())
            .unwrap();
        let resp = conn.send(req).await.expect("answer");
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    });
    let p = rig.relay().wait_proposals(1, 30).await.remove(0);
    assert_eq!(p.approvers, ["alice"]);
    let card = fields(&p);
    let mut other = card.clone();
    other.path = "/merge/2".into();
    let other_digest = talos_certs::proposal_digest(&other, &talos_certs::sentence(&other));

    let cases = [
        (
            relay_signed(&rig, &p, "alice", Verdict::Approved, None, None),
            "no_assertion",
        ),
        (
            // Alice declined; the relay says she approved.
            relay_signed(
                &rig,
                &p,
                "alice",
                Verdict::Approved,
                Some(card.clone()),
                Some(&assert_by(&alice, &p.digest, Verdict::Declined, 1)),
            ),
            "challenge_mismatch",
        ),
        (
            // Alice approved another card; the relay puts it on this one.
            relay_signed(
                &rig,
                &p,
                "alice",
                Verdict::Approved,
                Some(other.clone()),
                Some(&assert_by(&alice, &other_digest, Verdict::Approved, 2)),
            ),
            "challenge_mismatch",
        ),
        (
            // Bob's key (listed: he decides deploys) signed this card; the
            // relay names Alice.
            relay_signed(
                &rig,
                &p,
                "alice",
                Verdict::Approved,
                Some(card.clone()),
                Some(&assert_by(&bob, &p.digest, Verdict::Approved, 1)),
            ),
            "unknown_credential",
        ),
    ];
    for (signed, reason) in cases {
        let e = decide(&rig, signed).await.expect_err(reason);
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{reason}: {e:?}");
        assert!(e.message().contains(reason), "{reason}: {}", e.message());
        assert!(!held.is_finished(), "{reason}: the request stays held");
    }
    for (reason, n) in [
        ("no_assertion", 1.0),
        ("challenge_mismatch", 2.0),
        ("unknown_credential", 1.0),
    ] {
        assert_eq!(
            rig.gateway.metric(&format!(
                "gateway_person_refusals_total{{reason=\"{reason}\"}}"
            )),
            Some(n),
            "{reason}"
        );
    }

    // Alice's own approval of this card: released, in her name.
    let good = relay_signed(
        &rig,
        &p,
        "alice",
        Verdict::Approved,
        Some(card),
        Some(&assert_by(&alice, &p.digest, Verdict::Approved, 3)),
    );
    assert_eq!(decide(&rig, good).await.unwrap(), "released");
    let (status, body) = held.await.unwrap();
    assert_eq!(status, 200, "{body}");
    let records = rig.gateway.wait_records(1);
    let approval = records
        .iter()
        .flat_map(|r| r["requests"].as_array().cloned().unwrap_or_default())
        .find(|q| q["path"] == "/merge/1")
        .expect("the held request is recorded")["approval"]
        .clone();
    assert_eq!(approval["decision"], "approved");
    assert_eq!(approval["approver"], "alice");
    // The decision's log line names the person whose passkey verified.
    talos_e2e::wait::until("the decision's log line naming alice", || {
        talos_e2e::wait::check(rig.gateway.log(), |log| {
            log.lines().any(|l| {
                l.contains("decision signed by the person's passkey, verified")
                    && l.contains("person=alice")
            })
        })
    });
}
