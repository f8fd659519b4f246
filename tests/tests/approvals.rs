//! Approval holds end to end: the gateway binary, real clients, and a test
//! control plane that receives the gateway's proposals over mutual TLS and
//! answers with decisions signed by a relay key, delivered through
//! `Gateway.Decide` as the control stub's relay does. The test opens
//! sessions itself (`Gateway.OpenSession`) with Lock rules and the relay's
//! public key.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use talos_certs::{GatewayKey, Verdict};
use talos_e2e::clients::{http, Curl, SESSION_SOURCE};
use talos_e2e::relay::{sign, Relay};
use talos_e2e::rig::{Process, Single};
use talos_gateway::pb;
use tonic::Code;

const API: &str = "api.test";
const SECRET: &str = "appr0val-S3cret-v4lue-42";

/// A gateway in front of an origin for `api.test`, its control plane a
/// relay that receives its batches and proposals over mutual TLS.
async fn rig<G: Process>() -> Single<G> {
    Single::builder().relay().start_loopback(&[API]).await
}

/// OpenSession for session `id` (attempt `attempt`) from `source` with
/// `rules` and the relay's key; `API_TOKEN` attached to the API.
fn open_request(
    id: &str,
    attempt: u32,
    source: &str,
    rules: Vec<pb::LockRule>,
    relay: &Relay,
) -> pb::OpenSessionRequest {
    pb::OpenSessionRequest {
        session_id: id.into(),
        attempt,
        tenant: "acme".into(),
        sources: vec![source.into()],
        allowlist: vec![API.into()],
        attachments: vec![pb::Attachment {
            secret: "API_TOKEN".into(),
            destination: API.into(),
            header: "authorization".into(),
            scheme: "Bearer".into(),
            value: SECRET.as_bytes().to_vec(),
        }],
        cause: if attempt == 1 { "launch" } else { "resume" }.into(),
        lock: rules,
        relay_public_key: relay.key.public_key().to_vec(),
        passthrough: Vec::new(),
        // The relay's own path is tested here (its signature, the digest,
        // the listed approver): its decisions carry no person's assertion,
        // which the lab setting lets count (tests/tests/person.rs has the
        // person's).
        lab_approvals: true,
        ..Default::default()
    }
}

/// Open session `id` (attempt `attempt`) from `source` with `rules`;
/// returns the path of its CA.
async fn open<G: Process>(
    rig: &Single<G>,
    id: &str,
    attempt: u32,
    source: &str,
    rules: Vec<pb::LockRule>,
) -> PathBuf {
    let request = open_request(id, attempt, source, rules, rig.relay());
    rig.open(request, &format!("{id}-{attempt}.pem")).await
}

async fn close(rig: &Single, id: &str, attempt: u32) -> pb::CloseSessionReply {
    rig.client()
        .close_session(pb::CloseSessionRequest {
            session_id: id.into(),
            attempt,
            reason: "pause".into(),
        })
        .await
        .expect("close")
        .into_inner()
}

async fn decide<G: Process>(rig: &Single<G>, signed: pb::Signed) -> Result<String, tonic::Status> {
    rig.client()
        .decide(signed)
        .await
        .map(|r| r.into_inner().outcome)
}

fn rule(mode: &str) -> pb::LockRule {
    pb::LockRule {
        id: "lock-merge".into(),
        destination: API.into(),
        attachment: "API_TOKEN".into(),
        method: "POST".into(),
        path_prefix: "/merge".into(),
        mode: mode.into(),
        approvers: vec!["alice".into(), "bob".into()],
    }
}

fn request(method: &str, path: &str) -> hyper::Request<http::Body> {
    hyper::Request::builder()
        .method(method)
        .uri(format!("https://{API}{path}"))
        .body(http::empty())
        .unwrap()
}

/// Send and read the whole answer: (status, refusal header, body).
async fn send(s: &mut http::Sender, method: &str, path: &str) -> (u16, String, String) {
    use http_body_util::BodyExt;
    let resp = s.send(request(method, path)).await.expect("answer");
    let status = resp.status().as_u16();
    let refusal = resp
        .headers()
        .get("hangar-refusal")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, refusal, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_http2_request_blocks_no_other_stream_nor_session_and_goes_on_when_approved() {
    let rig: Single = rig().await;
    let ca = open(
        &rig,
        "sess-a",
        1,
        SESSION_SOURCE,
        vec![rule("every_request")],
    )
    .await;
    let other_ca = open(&rig, "sess-b", 1, "127.0.0.3", vec![rule("every_request")]).await;
    let conn = http::connect(SESSION_SOURCE, rig.gateway.data, API, &ca, true).await;
    let mut held_conn = match &conn {
        http::Sender::H2(s) => http::Sender::H2(s.clone()),
        http::Sender::H1(_) => unreachable!("h2 asked"),
    };
    let held = tokio::spawn(async move { send(&mut held_conn, "POST", "/merge/7").await });
    let proposals = rig.relay().wait_proposals(1, 30).await;
    assert_eq!(proposals.len(), 1);
    let p = &proposals[0];

    // The same connection, another stream: answered while the first waits.
    let mut same = conn;
    let (status, _, _) =
        tokio::time::timeout(Duration::from_secs(10), send(&mut same, "GET", "/hello"))
            .await
            .expect("another stream is not held");
    assert_eq!(status, 200);
    // Another session: not held either.
    let mut other = http::connect("127.0.0.3", rig.gateway.data, API, &other_ca, true).await;
    let (status, _, _) = send(&mut other, "GET", "/hello").await;
    assert_eq!(status, 200);
    assert!(!held.is_finished(), "the held request still waits");

    // The proposal says what the request is; its sentence and digest are
    // the ones anyone computes from its fields.
    assert_eq!(
        (
            p.kind.as_str(),
            p.method.as_str(),
            p.path.as_str(),
            p.destination.as_str()
        ),
        ("request", "POST", "/merge/7", API)
    );
    assert_eq!(p.attachments, ["API_TOKEN"]);
    assert_eq!(p.rule, "lock-merge");
    assert_eq!(p.approvers, ["alice", "bob"]);
    let fields = talos_certs::Proposal {
        proposal_id: p.proposal_id.clone(),
        gateway_id: p.gateway_id.clone(),
        session_id: p.session_id.clone(),
        attempt: p.attempt,
        tenant: p.tenant.clone(),
        kind: talos_certs::ProposalKind::Request,
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
    };
    assert_eq!(talos_certs::sentence(&fields), p.sentence);
    assert_eq!(talos_certs::proposal_digest(&fields, &p.sentence), p.digest);
    assert!(!p.sentence.contains(SECRET));

    assert_eq!(
        decide(&rig, rig.relay().decision(p, "bob", Verdict::Approved))
            .await
            .unwrap(),
        "released"
    );
    let (status, refusal, body) = held.await.unwrap();
    assert_eq!((status, refusal.as_str()), (200, ""), "{body}");
    assert!(body.contains("POST /merge/7"), "{body}");
    drop(same);
    drop(other);

    // The record shows the proposal, its digest, the decision and approver.
    let records = rig.gateway.wait_records(2);
    let request = records
        .iter()
        .flat_map(|r| r["requests"].as_array().cloned().unwrap_or_default())
        .find(|q| q["path"] == "/merge/7")
        .expect("the held request is recorded");
    let approval = &request["approval"];
    assert_eq!(approval["decision"], "approved");
    assert_eq!(approval["approver"], "bob");
    assert_eq!(approval["digest"], p.digest.as_str());
    assert_eq!(approval["proposal_id"], p.proposal_id.as_str());
}

#[tokio::test(flavor = "multi_thread")]
async fn forged_misdirected_or_unlisted_decisions_change_nothing_and_a_decline_refuses() {
    let rig: Single = rig().await;
    let ca = open(
        &rig,
        "sess-a",
        1,
        SESSION_SOURCE,
        vec![rule("every_request")],
    )
    .await;
    let mut conn = http::connect(SESSION_SOURCE, rig.gateway.data, API, &ca, false).await;
    let held = tokio::spawn(async move { send(&mut conn, "POST", "/merge/1").await });
    let p = rig.relay().wait_proposals(1, 30).await.remove(0);

    let forger = GatewayKey::generate().unwrap();
    for (signed, why) in [
        (
            sign(
                &rig.relay().key,
                &p.proposal_id,
                &"0".repeat(96),
                "alice",
                Verdict::Approved,
            ),
            "wrong digest",
        ),
        (
            sign(
                &forger,
                &p.proposal_id,
                &p.digest,
                "alice",
                Verdict::Approved,
            ),
            "forged signature",
        ),
        (
            rig.relay().decision(&p, "mallory", Verdict::Approved),
            "unlisted approver",
        ),
    ] {
        let err = decide(&rig, signed).await.unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{why}: {err:?}");
        assert!(!held.is_finished(), "{why}: the request still waits");
    }
    assert_eq!(
        decide(&rig, rig.relay().decision(&p, "alice", Verdict::Declined))
            .await
            .unwrap(),
        "refused"
    );
    let (status, refusal, body) = held.await.unwrap();
    assert_eq!(
        (status, refusal.as_str()),
        (403, "approval_declined"),
        "{body}"
    );
    // Decided once: nothing left to decide.
    let err = decide(&rig, rig.relay().decision(&p, "alice", Verdict::Approved))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let log = rig.gateway.log();
    assert!(log.contains("decision refused"));
    assert!(!log.contains(SECRET));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pause_withdraws_the_held_request_and_it_can_no_longer_be_decided() {
    let rig: Single = rig().await;
    let ca = open(
        &rig,
        "sess-a",
        1,
        SESSION_SOURCE,
        vec![rule("every_request")],
    )
    .await;
    let mut conn = http::connect(SESSION_SOURCE, rig.gateway.data, API, &ca, true).await;
    let held = tokio::spawn(async move { send(&mut conn, "POST", "/merge/2").await });
    let p = rig.relay().wait_proposals(1, 30).await.remove(0);
    let closed = close(&rig, "sess-a", 1).await;
    assert_eq!(closed.approvals_withdrawn, 1);
    let (status, refusal, _) = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("answered at once")
        .unwrap();
    assert_eq!((status, refusal.as_str()), (403, "approval_withdrawn"));
    let err = decide(&rig, rig.relay().decision(&p, "alice", Verdict::Approved))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let records = rig.gateway.wait_records(1);
    let q = records
        .iter()
        .flat_map(|r| r["requests"].as_array().cloned().unwrap_or_default())
        .find(|q| q["path"] == "/merge/2")
        .expect("recorded");
    assert_eq!(q["refusal"], "approval_withdrawn");
    assert_eq!(q["approval"]["decision"], "withdrawn");
}

#[tokio::test(flavor = "multi_thread")]
async fn first_use_asks_once_per_authority_and_again_after_a_resume() {
    let rig: Single = rig().await;
    let mut asked = 0;
    for attempt in 1..=2u32 {
        let ca = open(
            &rig,
            "sess-a",
            attempt,
            SESSION_SOURCE,
            vec![rule("first_use")],
        )
        .await;
        let mut conn = http::connect(SESSION_SOURCE, rig.gateway.data, API, &ca, true).await;
        let mut first = match &conn {
            http::Sender::H2(s) => http::Sender::H2(s.clone()),
            http::Sender::H1(_) => unreachable!(),
        };
        let held = tokio::spawn(async move { send(&mut first, "POST", "/merge/first").await });
        asked += 1;
        let p = rig
            .relay()
            .wait_proposals(asked, 30)
            .await
            .remove(asked - 1);
        assert_eq!(p.attempt, attempt);
        decide(&rig, rig.relay().decision(&p, "alice", Verdict::Approved))
            .await
            .unwrap();
        assert_eq!(held.await.unwrap().0, 200);
        // Approved once under this authority: the next uses pass.
        for i in 0..3 {
            let (status, _, _) = send(&mut conn, "POST", &format!("/merge/again/{i}")).await;
            assert_eq!(status, 200);
        }
        assert_eq!(rig.relay().proposals().len(), asked, "no new proposal");
        close(&rig, "sess-a", attempt).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_held_requests_across_ten_sessions_each_get_their_own_decision() {
    let rig: Single = rig().await;
    let mut tasks = Vec::new();
    for s in 0..10u32 {
        let source = format!("127.0.0.{}", 10 + s);
        let ca = open(
            &rig,
            &format!("sess-{s}"),
            1,
            &source,
            vec![rule("every_request")],
        )
        .await;
        let conn = http::connect(&source, rig.gateway.data, API, &ca, true).await;
        let http::Sender::H2(h2) = conn else {
            unreachable!()
        };
        for i in 0..10u32 {
            let mut sender = http::Sender::H2(h2.clone());
            let path = format!("/merge/{s}/{i}");
            tasks.push((
                path.clone(),
                tokio::spawn(async move { send(&mut sender, "POST", &path).await }),
            ));
        }
    }
    let mut proposals = rig.relay().wait_proposals(100, 30).await;
    assert_eq!(proposals.len(), 100);
    // A fixed shuffle (a linear congruential sequence), so a failure can
    // be replayed.
    let mut x: u64 = 0x5eed;
    for i in (1..proposals.len()).rev() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        proposals.swap(i, (x >> 33) as usize % (i + 1));
    }
    let mut want = HashMap::new();
    for p in &proposals {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let verdict = if (x >> 40) & 1 == 0 {
            Verdict::Approved
        } else {
            Verdict::Declined
        };
        want.insert(p.path.clone(), verdict);
        decide(&rig, rig.relay().decision(p, "alice", verdict))
            .await
            .unwrap();
    }
    for (path, task) in tasks {
        let (status, refusal, _) = task.await.unwrap();
        match want[&path] {
            Verdict::Approved => assert_eq!(status, 200, "{path}"),
            Verdict::Declined => {
                assert_eq!(
                    (status, refusal.as_str()),
                    (403, "approval_declined"),
                    "{path}"
                )
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_proposes_with_curl_and_gets_the_decision() {
    let rig: Single = rig().await;
    let agent_rule = pb::LockRule {
        id: "lock-agent".into(),
        destination: talos_certs::APPROVALS_NAME.into(),
        attachment: String::new(),
        method: String::new(),
        path_prefix: String::new(),
        mode: "every_request".into(),
        approvers: vec!["carol".into()],
    };
    let ca = open(&rig, "sess-a", 1, SESSION_SOURCE, vec![agent_rule]).await;
    let data = rig.gateway.data;
    let curl = move |body: &str| {
        Curl::via(data, &ca, talos_certs::APPROVALS_NAME)
            .max_time(30)
            .args(&["-H", "content-type: application/json", "-d", body])
            .run("/v1/proposals")
            .into_text()
    };
    // Malformed proposals get a 400 with a clear message, and no card.
    let (status, _, bad) = curl(r#"{"tool":"shell"}"#);
    assert_eq!(status, 400, "{bad}");
    assert!(bad.contains("malformed_proposal"), "{bad}");
    let (_, _, bad) = curl(r#"{"tool":"shell","digest":"abc"}"#);
    assert!(bad.contains("96 lowercase hex"), "{bad}");
    assert!(rig.relay().proposals().is_empty());

    let call_digest = "ab".repeat(48);
    let body = format!(r#"{{"tool":"deploy","digest":"{call_digest}"}}"#);
    let waiting = tokio::task::spawn_blocking(move || curl(&body));
    let p = rig.relay().wait_proposals(1, 30).await.remove(0);
    assert_eq!(p.kind, "agent");
    assert_eq!(
        (p.tool.as_str(), p.call_digest.as_str()),
        ("deploy", call_digest.as_str())
    );
    assert!(p.sentence.contains("deploy") && p.sentence.contains(&call_digest));
    decide(&rig, rig.relay().decision(&p, "carol", Verdict::Approved))
        .await
        .unwrap();
    let (code, _, json) = waiting.await.unwrap();
    assert_eq!(code, 200);
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["decision"], "approved");
    assert_eq!(v["approver"], "carol");
    assert_eq!(v["proposal_digest"], p.digest.as_str());
}

/// A member upgraded in place while a request is held: the decision comes
/// to the successor (which holds the authority now), reaches the old
/// process, which releases the request it holds; the first use approved
/// there counts in the successor, whose next matching request is not held.
/// A first use approved before the handover is carried over too.
#[tokio::test(flavor = "multi_thread")]
async fn held_requests_and_first_uses_survive_an_upgrade() {
    use talos_e2e::member::{alive, Member};
    let mut rig: Single<Member> = rig().await;
    // Two sessions, a first_use rule each: one approved before the
    // handover, one held across it.
    let mut cas = Vec::new();
    for (id, source) in [
        ("sess-before", SESSION_SOURCE),
        ("sess-across", "127.0.0.3"),
    ] {
        cas.push((
            source,
            open(&rig, id, 1, source, vec![rule("first_use")]).await,
        ));
    }

    // Before: approved, so the next use passes.
    let (source, ca) = &cas[0];
    let before = http::connect(source, rig.data(), API, ca, true).await;
    let mut first = match &before {
        http::Sender::H2(s) => http::Sender::H2(s.clone()),
        http::Sender::H1(_) => unreachable!("h2 asked"),
    };
    let held = tokio::spawn(async move { send(&mut first, "POST", "/merge/1").await });
    let p = rig.relay().wait_proposals(1, 30).await.remove(0);
    assert_eq!(
        decide(&rig, rig.relay().decision(&p, "alice", Verdict::Approved))
            .await
            .unwrap(),
        "released"
    );
    assert_eq!(held.await.unwrap().0, 200);

    // Across: held on the old process when the upgrade comes.
    let (source, ca) = &cas[1];
    let across = http::connect(source, rig.data(), API, ca, true).await;
    let mut first = match &across {
        http::Sender::H2(s) => http::Sender::H2(s.clone()),
        http::Sender::H1(_) => unreachable!("h2 asked"),
    };
    let held = tokio::spawn(async move { send(&mut first, "POST", "/merge/2").await });
    let p = rig.relay().wait_proposals(2, 30).await.remove(1);
    let old = rig.gateway.pid();
    let (ok, out, err) = tokio::task::block_in_place(|| rig.gateway.command("upgrade"));
    assert!(ok, "upgrade: {out} {err}\n{}", rig.gateway.log());
    rig.gateway.wait_ready(2);
    assert!(alive(old), "the old process drains the held request");
    // The successor answers the control channel and passes the decision on.
    assert_eq!(
        decide(&rig, rig.relay().decision(&p, "bob", Verdict::Approved))
            .await
            .unwrap(),
        "released"
    );
    let (status, refusal, body) = held.await.unwrap();
    assert_eq!((status, refusal.as_str()), (200, ""), "{body}");
    drop(across);
    drop(before);
    tokio::task::block_in_place(|| {
        talos_e2e::wait::until("the old process to exit", || {
            talos_e2e::wait::check(alive(old), |a| !a)
        })
    });

    // On the successor, both sessions' first uses are done: not held.
    for (i, (source, ca)) in cas.iter().enumerate() {
        let mut conn = http::connect(source, rig.data(), API, ca, true).await;
        let (status, refusal, body) = tokio::time::timeout(
            Duration::from_secs(20),
            send(&mut conn, "POST", &format!("/merge/after/{i}")),
        )
        .await
        .expect("not held");
        assert_eq!((status, refusal.as_str()), (200, ""), "{body}");
    }
    assert_eq!(
        rig.relay().proposals().len(),
        2,
        "no new proposal after the upgrade"
    );
}

/// A member going down (SIGTERM) answers its held requests at the drain's
/// start: `approval_withdrawn`, on the record, never a cut at the grace
/// with no answer.
#[tokio::test(flavor = "multi_thread")]
async fn a_member_going_down_answers_its_held_requests_withdrawn() {
    let mut rig: Single = rig().await;
    let ca = open(
        &rig,
        "sess-a",
        1,
        SESSION_SOURCE,
        vec![rule("every_request")],
    )
    .await;
    let mut conn = http::connect(SESSION_SOURCE, rig.gateway.data, API, &ca, true).await;
    let held = tokio::spawn(async move { send(&mut conn, "POST", "/merge/1").await });
    rig.relay().wait_proposals(1, 30).await;
    rig.gateway.signal(talos_e2e::signals::Signal::Term);
    let (status, refusal, body) = held.await.unwrap();
    assert_eq!(
        (status, refusal.as_str()),
        (403, "approval_withdrawn"),
        "{body}\n{}",
        rig.gateway.log()
    );
    assert!(rig.gateway.stop(), "a clean exit\n{}", rig.gateway.log());
    let records = rig.gateway.records();
    let q = records
        .iter()
        .flat_map(|r| r["requests"].as_array().cloned().unwrap_or_default())
        .find(|q| q["path"] == "/merge/1")
        .expect("recorded");
    assert_eq!(q["refusal"], "approval_withdrawn", "{q}");
    assert_eq!(q["approval"]["decision"], "withdrawn", "{q}");
    assert!(q.get("cut").is_none(), "answered, not cut: {q}");
    assert!(
        !rig.gateway.log().contains("grace over"),
        "nothing waited out the grace\n{}",
        rig.gateway.log()
    );
}
