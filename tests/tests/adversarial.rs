//! The gateway tried as an attacker would, end to end: the `gateway`
//! binary, sessions opened over the control channel, real clients on
//! loopback, and a hostile origin ([`talos_e2e::hostile`]) that echoes the
//! credential wherever a reply can carry it, codes replies unasked, forges
//! the gateway's refusal header, and routes paths as leniently as real
//! origins do. Every loop is bounded; everything started is stopped.
//!
//! - the Lock judges the path the destination routes, over every
//!   session/destination protocol pair, and every spelling of a method;
//! - with `control-stub serve` as the relay, every spelling the Lock holds
//!   gets a card showing the canonical path, and goes on with it when
//!   approved; a proposal the relay refuses, or cannot take, ends its
//!   request without waiting out the decision time;
//! - no piece of a secret is chosen by the session (`Range`);
//! - every byte of a reply passed the masker, or the reply is refused;
//! - `hangar-refusal` always means the gateway spoke;
//! - one session at every bound of its share leaves the gateway to another;
//! - idle HTTP/2 connections are closed; names past DNS's limits are not names.

use std::path::PathBuf;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::{HeaderMap, Method};
use serde_json::Value;
use talos_certs::Verdict;
use talos_e2e::clients::{self, connect_from, curl_via, http, run_bounded, SESSION_SOURCE};
use talos_e2e::dns::{Answer, DnsServer};
use talos_e2e::gateway::{Gateway, TestConfig};
use talos_e2e::hostile::Hostile;
use talos_e2e::origin::TestCa;
use talos_e2e::rig::{Pair, SessionSpec, Single};
use talos_e2e::wait;
use talos_gateway::pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Destinations that speak HTTP/1.1 only and HTTP/2 only.
const H1: &str = "h1.adv.test";
const H2: &str = "h2.adv.test";
const APPROVALS: &str = "approvals.hangar.internal";
/// Mixed case and long enough to mask: the value the destinations echo.
const SECRET: &str = "Adv3rs4ry-S3cret-T0ken-Of-2026";
/// A second session's source.
const OTHER_SOURCE: &str = "127.0.0.3";

/// What the rigs put behind the gateway: the hostile origin for `H1` and
/// `H2`, and a DNS server that puts both on loopback.
#[derive(Debug)]
struct Behind {
    hostile: Hostile,
    _dns: DnsServer,
}

/// [`Behind`], in `dir`, and a gateway config that trusts the origin and
/// reaches it, no control channel yet.
async fn hostile_parts(dir: &std::path::Path) -> (Behind, TestConfig) {
    let ca = TestCa::new("hostile test CA");
    let ca_file = dir.join("hostile-ca.pem");
    ca.write_pem(&ca_file);
    let hostile = Hostile::start(&ca, &[H1, H2]).await;
    let loopback = "127.0.0.1".parse().expect("ip");
    let dns = DnsServer::start(
        [H1, H2]
            .iter()
            .map(|n| (n.to_string(), Answer::Addrs(vec![loopback])))
            .collect(),
    )
    .await;
    let config = TestConfig {
        dns: dns.addr,
        upstream_port: hostile.addr.port(),
        anchors: vec![ca_file],
        permit_internal: vec!["127.0.0.1/32".into()],
        // Half-sent hellos must stay half-sent while a test looks.
        hello_timeout_ms: Some(60_000),
        ..TestConfig::default()
    };
    (Behind { hostile, _dns: dns }, config)
}

type Rig = Single<Gateway, Behind>;

/// A gateway with a control channel (and, with `relay`, a control plane
/// taking proposals) in front of the hostile origin; `limits` goes into
/// `[limits]`.
async fn rig(limits: &str, relay: bool) -> Rig {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (behind, base) = hostile_parts(tmp.path()).await;
    let builder = Single::builder().limits(limits);
    let builder = if relay {
        builder.relay()
    } else {
        builder.control()
    };
    builder.start(tmp, behind, base).await
}

/// Open session `id` from `source` with the credential attached to both
/// destinations and `rules`; returns the path of its CA.
async fn open(rig: &Rig, id: &str, source: &str, rules: Vec<pb::LockRule>) -> PathBuf {
    let attach = |d: &str| pb::Attachment {
        secret: "API_TOKEN".into(),
        destination: d.into(),
        header: "authorization".into(),
        scheme: "Bearer".into(),
        value: SECRET.as_bytes().to_vec(),
    };
    let request = pb::OpenSessionRequest {
        session_id: id.into(),
        attempt: 1,
        tenant: "acme".into(),
        sources: vec![source.into()],
        allowlist: vec![H1.into(), H2.into()],
        attachments: vec![attach(H1), attach(H2)],
        cause: "launch".into(),
        lock: rules,
        relay_public_key: rig
            .relay_if_any()
            .map_or(Vec::new(), |r| r.key.public_key().to_vec()),
        passthrough: Vec::new(),
        // The test relay signs decisions of its own, without a person's
        // assertion: the account is in lab mode.
        lab_approvals: true,
        ..Default::default()
    };
    rig.open(request, &format!("{id}.pem")).await
}

/// Wait for a record with this verdict and cause.
async fn wait_record(rig: &Rig, verdict: &str, cause: &str) -> Value {
    wait::until_async(&format!("a record {verdict}/{cause}"), || {
        let records = rig.gateway.records();
        records
            .into_iter()
            .find(|r| r["verdict"] == verdict && r["cause"] == cause)
            .ok_or(())
    })
    .await
}

fn rule(id: &str, destination: &str, method: &str, prefix: &str) -> pb::LockRule {
    pb::LockRule {
        id: id.into(),
        destination: destination.into(),
        attachment: String::new(),
        method: method.into(),
        path_prefix: prefix.into(),
        mode: "every_request".into(),
        approvers: vec!["alice".into()],
    }
}

/// What the session got for one request.
#[derive(Debug)]
struct Got {
    status: u16,
    headers: HeaderMap,
    /// The HTTP/1.1 reason phrase, when not the standard one.
    reason: Option<Vec<u8>>,
    /// The body, or why reading it failed (with what came before).
    body: Result<Vec<u8>, (String, usize)>,
    trailers: Option<HeaderMap>,
}

impl Got {
    fn text(&self) -> String {
        match &self.body {
            Ok(b) => String::from_utf8_lossy(b).into_owned(),
            Err((e, _)) => format!("<body failed: {e}>"),
        }
    }

    fn refusal(&self) -> &str {
        self.headers
            .get("hangar-refusal")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

/// Send a request and read its answer whole (bodies capped at 80 MiB).
async fn send(
    s: &mut http::Sender,
    method: &str,
    name: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Got {
    try_send(s, method, name, path, headers)
        .await
        .expect("an answer")
}

/// [`send`], or the error that came instead of the answer's head (a reply
/// cut before its head left the gateway ends the exchange so).
async fn try_send(
    s: &mut http::Sender,
    method: &str,
    name: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Got, String> {
    let mut req = hyper::Request::builder()
        .method(Method::from_bytes(method.as_bytes()).expect("method"))
        .uri(format!("https://{name}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = tokio::time::timeout(
        wait::DEADLINE,
        s.send(req.body(http::empty()).expect("request")),
    )
    .await
    .expect("an answer in time")
    .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let reason = resp
        .extensions()
        .get::<hyper::ext::ReasonPhrase>()
        .map(|r| r.as_bytes().to_vec());
    let (parts, mut body) = resp.into_parts();
    let mut data = Vec::new();
    let mut trailers = None;
    let body = loop {
        let frame = tokio::time::timeout(wait::DEADLINE, body.frame())
            .await
            .expect("the body in time");
        match frame {
            None => break Ok(data),
            Some(Err(e)) => break Err((e.to_string(), data.len())),
            Some(Ok(f)) => match f.into_data() {
                Ok(d) => {
                    data.extend_from_slice(&d);
                    if data.len() > 80 << 20 {
                        break Err(("more than 80 MiB".into(), data.len()));
                    }
                }
                Err(f) => trailers = f.into_trailers().ok(),
            },
        }
    };
    Ok(Got {
        status,
        headers: parts.headers,
        reason,
        body,
        trailers,
    })
}

/// The spellings of `/deploy` a lenient origin routes to its deploy
/// handler, a few of each class.
const DEPLOY_FORMS: &[(&str, &str)] = &[
    // (as sent, the canonical path the record must carry)
    ("/deploy", "/deploy"),
    ("/deploy/x", "/deploy/x"),
    // percent-encoded unreserved octets
    ("/%64eploy/x", "/deploy/x"),
    ("/%64%65%70%6c%6f%79", "/deploy"),
    ("/de%70loy", "/deploy"),
    ("/%44EPLOY", "/DEPLOY"),
    // dot segments
    ("/./deploy", "/deploy"),
    ("/x/../deploy", "/deploy"),
    ("/x/y/../../deploy", "/deploy"),
    ("/../deploy", "/deploy"),
    ("/./././deploy/./x", "/deploy/x"),
    // encoded dot segments
    ("/%2e/deploy", "/deploy"),
    ("/x/%2e%2e/deploy", "/deploy"),
    ("/x/%2E%2E/deploy", "/deploy"),
    ("/x/.%2e/deploy", "/deploy"),
    ("/%2e%2e/deploy", "/deploy"),
    // repeated slashes
    ("//deploy", "/deploy"),
    ("///deploy/x", "/deploy/x"),
    ("/x//..//deploy", "/deploy"),
    ("/.//deploy", "/deploy"),
    // what lenient origins read beyond RFC 3986
    ("/x%2F..%2Fdeploy", "/x%2F..%2Fdeploy"),
    ("/x%2f..%2fdeploy", "/x%2F..%2Fdeploy"),
    ("/x/..;/deploy", "/x/..;/deploy"),
    ("/x/..%3B/deploy", "/x/..%3B/deploy"),
    ("/deploy;v=1", "/deploy;v=1"),
    ("/DEPLOY", "/DEPLOY"),
    ("/Deploy/x", "/Deploy/x"),
    ("/x%5C..%5Cdeploy", "/x%5C..%5Cdeploy"),
];

/// Every spelling of a `/deploy` POST, over HTTP/1.1 and HTTP/2 sessions,
/// to HTTP/1.1 and HTTP/2 destinations: held (here declined at once: the
/// session has no relay), and the destination's deploy handler never runs.
/// A request the Lock does not hold still goes through, with its path
/// canonical and without method overrides.
#[tokio::test(flavor = "multi_thread")]
async fn the_lock_judges_the_path_the_destination_routes() {
    let rig = rig("", false).await;
    let ca = open(
        &rig,
        "sess-lock",
        SESSION_SOURCE,
        vec![
            rule("lock-deploy", "*", "POST", "/deploy"),
            rule("lock-delete", "*", "DELETE", "/resource"),
        ],
    )
    .await;
    for session_h2 in [false, true] {
        for name in [H1, H2] {
            let pair = format!(
                "{} session to {name}",
                if session_h2 { "HTTP/2" } else { "HTTP/1.1" }
            );
            let mut s =
                http::connect(SESSION_SOURCE, rig.gateway.data, name, &ca, session_h2).await;
            for (form, _) in DEPLOY_FORMS {
                let got = send(&mut s, "POST", name, form, &[]).await;
                assert_eq!(
                    (got.status, got.refusal()),
                    (403, "approval_declined"),
                    "{pair}: POST {form}: {}",
                    got.text()
                );
            }
            for method in ["post", "Post", "pOsT"] {
                let got = send(&mut s, method, name, "/deploy", &[]).await;
                assert_eq!(got.status, 403, "{pair}: {method} /deploy");
            }
            // Not held: another method, another path, and a POST that
            // asks the destination to act as a DELETE.
            let got = send(&mut s, "GET", name, "/./%64eploy", &[]).await;
            assert_eq!((got.status, got.text().as_str()), (200, "ran\n"), "{pair}");
            let got = send(&mut s, "POST", name, "/other", &[]).await;
            assert_eq!(got.status, 200, "{pair}");
            for header in [
                "x-http-method-override",
                "X-HTTP-Method",
                "x-method-override",
            ] {
                let got = send(&mut s, "POST", name, "/resource", &[(header, "DELETE")]).await;
                assert_eq!(
                    (got.status, got.text().as_str()),
                    (200, "ran\n"),
                    "{pair}: {header}"
                );
            }
            // The DELETE itself is held.
            let got = send(&mut s, "delete", name, "/x/../resource", &[]).await;
            assert_eq!(got.status, 403, "{pair}: DELETE");
        }
    }
    let runs = rig.peers.hostile.runs();
    let acted = |method: &str| runs.iter().filter(|(m, _)| m == method).count();
    assert_eq!(
        acted("POST"),
        4 * 3,
        "only the POSTs to /resource ran: {runs:?}"
    );
    assert!(
        runs.iter()
            .all(|(m, p)| m != "DELETE" && !(m == "POST" && p.starts_with("/deploy"))),
        "{runs:?}"
    );
    assert_eq!(acted("GET"), 4, "{runs:?}");
    // What ran got the path as judged: canonical.
    let sent = rig.peers.hostile.sent_paths();
    assert_eq!(
        sent.iter().filter(|p| *p == "/deploy").count(),
        4,
        "{sent:?}"
    );
    assert!(
        sent.iter().all(|p| p == "/deploy" || p == "/resource"),
        "{sent:?}"
    );

    // The records carry the path as judged, and the destination protocol
    // each pair used.
    let records = rig.gateway.wait_records(4);
    let mut alpn = Vec::new();
    for r in records
        .iter()
        .filter(|r| r["request_count"].as_u64() > Some(0))
    {
        alpn.push((r["alpn_session"].clone(), r["alpn_upstream"].clone()));
        let requests = r["requests"].as_array().expect("requests");
        for (i, (_, canonical)) in DEPLOY_FORMS.iter().enumerate() {
            assert_eq!(requests[i]["path"], *canonical, "{r}");
            assert_eq!(requests[i]["refusal"], "approval_declined");
            assert_eq!(requests[i]["approval"]["decision"], "no_relay");
        }
    }
    alpn.sort_by_key(|a| a.0.to_string() + &a.1.to_string());
    let want: Vec<(Value, Value)> = [
        ("h2", "h2"),
        ("h2", "http/1.1"),
        ("http/1.1", "h2"),
        ("http/1.1", "http/1.1"),
    ]
    .iter()
    .map(|(a, b)| (Value::from(*a), Value::from(*b)))
    .collect();
    assert_eq!(alpn, want, "every session/destination protocol pair");

    // A real client that sends the path as written agrees.
    let got = curl_via(
        rig.gateway.data,
        &ca,
        H1,
        "/x/%2e%2e/%64eploy",
        &["--path-as-is", "-X", "POST"],
    );
    assert_eq!(got.status, 403);
}

/// The gateway's id when the control stub runs the control plane.
const GW: &str = "gw-adv";

/// The hostile origin behind a gateway whose control plane is the real
/// one: `control-stub serve` takes its batches and proposals (its relay
/// makes the cards) and the `control-stub` CLI starts sessions and
/// decides, as operators run them. `serve` is running, the gateway
/// shipping to it; `H1` and `H2` are on the egress list; tenant `acme`
/// has `API_TOKEN`; a Lock rule holds every `POST` under `/deploy` at
/// `H1`, alice approving.
async fn stub_rig(limits: &str) -> Pair<Gateway, Behind> {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (behind, base) = hostile_parts(tmp.path()).await;
    let rig = Pair::builder()
        .ids(&[GW])
        .limits(limits)
        .egress(&[H1, H2])
        .secret("API_TOKEN", SECRET)
        .start(tmp, behind, base);
    rig.lock(H1, "POST", "/deploy", "alice");
    rig
}

/// Start a session from [`SESSION_SOURCE`] allowed `H1`, `API_TOKEN`
/// attached to it; its id and the path of its trust bundle.
fn start_session(rig: &Pair<Gateway, Behind>) -> (String, PathBuf) {
    let (id, _) = rig.start(
        &SessionSpec::from(SESSION_SOURCE)
            .allow(H1)
            .attach(&format!("API_TOKEN={H1}:authorization:Bearer")),
    );
    let (path, _) = rig.trust(&id, &format!("{id}.pem"));
    (id, path)
}

/// Wait for the pending card whose sentence shows `method path` to `H1`;
/// returns its id.
fn wait_card(rig: &Pair<Gateway, Behind>, method: &str, path: &str) -> String {
    let shows = format!(" {method} {path} to {H1},");
    tokio::task::block_in_place(|| {
        wait::until(&format!("a card for {method} {path}"), || {
            let cards = rig.cli(&["approvals", "list"]).json();
            cards
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["sentence"].as_str().is_some_and(|t| t.contains(&shows)))
                .and_then(|c| c["id"].as_str().map(str::to_owned))
                .ok_or(cards)
        })
    })
}

/// Wait for the records of the session's closed connections to hold `n`
/// requests; returns them.
async fn wait_requests(rig: &Pair<Gateway, Behind>, id: &str, n: usize) -> Vec<Value> {
    wait::until_async(&format!("{n} requests of {id} on the record"), || {
        let requests: Vec<Value> = rig.members[0]
            .records()
            .iter()
            .filter(|r| r["session_id"] == id)
            .flat_map(|r| r["requests"].as_array().cloned().unwrap_or_default())
            .collect();
        wait::check(requests, |r| r.len() >= n)
    })
    .await
}

/// Every spelling of the contract's shared table that the Lock holds —
/// those only the routing key puts under the rule (`/%2Fdeploy/x`,
/// `/Deploy`, `/DEPLOY`, `/%44eploy`, `/\deploy`, `/x%5C..%5Cdeploy`,
/// `/x%2F..%2Fdeploy`, `/x/..;/deploy`, `/x/..;jsessionid=1/deploy`)
/// and the rest — through the real relay: held, a card at once showing
/// the canonical path, approved from the CLI, and the destination gets
/// the canonical path.
#[tokio::test(flavor = "multi_thread")]
async fn every_spelling_the_lock_holds_gets_a_card_and_goes_on_canonical_when_approved() {
    // Every case proposes within the minute: past the default burst.
    let rig = stub_rig("session_proposal_burst = 64").await;
    let (id, ca) = start_session(&rig);
    let mut s = http::connect(SESSION_SOURCE, rig.members[0].data, H1, &ca, false).await;
    let held: Vec<_> = talos_contract::cases::LOCK_CASES
        .iter()
        .filter(|c| c.held)
        .collect();
    for c in &held {
        let (method, path) = (c.method, c.path);
        let answer = tokio::spawn(async move {
            let got = send(&mut s, method, H1, path, &[]).await;
            (s, got)
        });
        let card = wait_card(&rig, c.method, c.canonical);
        let decided = rig
            .cli(&["approvals", "approve", &card, "--as", "alice"])
            .json();
        assert_eq!(decided["outcome"], "released", "{c:?}: {decided}");
        let (back, got) = answer.await.expect("the request's task");
        s = back;
        assert_eq!(
            (got.status, got.text().as_str()),
            (200, "ran\n"),
            "{c:?}: {}",
            got.refusal()
        );
        let sent = rig.peers.hostile.sent_paths();
        assert_eq!(sent.last().map(String::as_str), Some(c.canonical), "{c:?}");
    }
    assert_eq!(rig.peers.hostile.runs().len(), held.len());
    drop(s);
    let requests = wait_requests(&rig, &id, held.len()).await;
    for (r, c) in requests.iter().zip(&held) {
        assert_eq!(r["path"], c.canonical, "{r}");
        assert_eq!(r["approval"]["decision"], "approved", "{r}");
    }
}

/// A proposal the relay refuses — its rule removed from the account's
/// Lock after the session opened with it — ends its request at once,
/// `approval_declined` with cause `relay_refused`, and gives its held
/// place back at once (the session holds one at a time). With `serve`
/// down, a held request ends after the delivery bound
/// (`relay_unreachable`), long before the decision time. No card is left
/// behind, and the destination never ran.
#[tokio::test(flavor = "multi_thread")]
async fn a_proposal_the_relay_refuses_or_cannot_take_ends_its_request_without_a_card() {
    use talos_gateway::session::approvals::{DECISION_TIMEOUT, DELIVERY_TIMEOUT};
    let mut rig = stub_rig("session_held_requests = 1").await;
    let (id, ca) = start_session(&rig);
    let rules = rig.cli(&["policy", "lock", "list"]).json();
    let rule = rules[0]["id"].as_str().expect("rule id").to_owned();
    rig.cli(&["policy", "lock", "remove", &rule]).json();
    let mut s = http::connect(SESSION_SOURCE, rig.members[0].data, H1, &ca, false).await;
    for path in ["/deploy", "/%2Fdeploy/x"] {
        let got = send(&mut s, "POST", H1, path, &[]).await;
        assert_eq!(
            (got.status, got.refusal()),
            (403, "approval_declined"),
            "POST {path}: {}",
            got.text()
        );
    }
    assert_eq!(
        rig.cli(&["approvals", "list", "--all"]).json(),
        Value::Array(vec![])
    );

    rig.stub.kill_serve();
    let start = std::time::Instant::now();
    let req = hyper::Request::builder()
        .method("POST")
        .uri(format!("https://{H1}/deploy/x"))
        .body(http::empty())
        .expect("request");
    let resp = tokio::time::timeout(DELIVERY_TIMEOUT + wait::DEADLINE, s.send(req))
        .await
        .expect("an answer within the delivery bound")
        .expect("an answer");
    let took = start.elapsed();
    assert_eq!(resp.status(), 403);
    assert!(
        took >= DELIVERY_TIMEOUT && took < DECISION_TIMEOUT,
        "{took:?}"
    );
    drop(s);

    let requests = wait_requests(&rig, &id, 3).await;
    let decisions: Vec<(&str, &str)> = requests
        .iter()
        .map(|r| {
            (
                r["refusal"].as_str().unwrap_or(""),
                r["approval"]["decision"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        decisions,
        [
            ("approval_declined", "relay_refused"),
            ("approval_declined", "relay_refused"),
            ("approval_declined", "relay_unreachable"),
        ]
    );
    assert!(rig.peers.hostile.runs().is_empty());
    let log = rig.members[0].log();
    assert!(log.contains("relay_refused"), "{log}");
    assert!(log.contains("relay_unreachable"), "{log}");
}

/// Every place a reply can carry the credential, over an HTTP/1.1 session
/// to an HTTP/1.1 destination and an HTTP/2 session to an HTTP/2 one.
#[tokio::test(flavor = "multi_thread")]
async fn every_byte_of_a_reply_passes_the_masker_or_the_reply_is_refused() {
    let rig = rig("", false).await;
    let ca = open(&rig, "sess-echo", SESSION_SOURCE, Vec::new()).await;
    let stars = "*".repeat(SECRET.len());
    let lower = SECRET.to_ascii_lowercase();
    for (session_h2, name) in [(false, H1), (true, H2)] {
        let mut s = http::connect(SESSION_SOURCE, rig.gateway.data, name, &ca, session_h2).await;
        let clean = |got: &Got, what: &str| {
            let all = format!(
                "{:?} {:?} {:?} {}",
                got.headers,
                got.reason,
                got.trailers,
                got.text()
            );
            assert!(
                !all.contains(SECRET) && !all.to_ascii_lowercase().contains(&lower),
                "{name} {what}: {all}"
            );
        };

        // Ranges: the whole reply, masked, however the session asks.
        for range in [
            None,
            Some("bytes=0-9"),
            Some("bytes=19-28"),
            Some("bytes=0-3,20-30,40-"),
        ] {
            let headers: Vec<(&str, &str)> = range.iter().map(|r| ("range", *r)).collect();
            let got = send(&mut s, "GET", name, "/echo-range", &headers).await;
            clean(&got, "range");
            assert_eq!(got.status, 200, "{name} {range:?}");
            assert_eq!(
                got.text(),
                format!("your credential is {stars}\n"),
                "{name} {range:?}"
            );
            assert_eq!(got.headers["accept-ranges"], "none");
        }
        for (header, value) in [("if-range", "\"x\""), ("request-range", "bytes=0-9")] {
            let got = send(
                &mut s,
                "GET",
                name,
                "/echo-range",
                &[(header, value), ("range", "bytes=0-9")],
            )
            .await;
            assert_eq!(got.status, 200, "{name} {header}");
            clean(&got, header);
        }

        // Header names, lower-cased on the way.
        let got = send(&mut s, "GET", name, "/echo-name", &[]).await;
        clean(&got, "name");
        assert!(
            got.headers.contains_key(format!("x-echo-{stars}").as_str()),
            "{:?}",
            got.headers
        );

        // A gzip bomb: cut at the reply's bound, long before its 64 MiB
        // (an HTTP/1.1 connection is closed with it: connect again).
        match try_send(&mut s, "GET", name, "/bomb", &[])
            .await
            .map(|g| g.body)
        {
            Err(_) => {}
            Ok(Err((_, read))) => assert!(read < 8 << 20, "{name}: read {read} bytes of the bomb"),
            Ok(Ok(b)) => panic!("{name}: the bomb was passed whole ({} bytes)", b.len()),
        }
        let mut s = http::connect(SESSION_SOURCE, rig.gateway.data, name, &ca, session_h2).await;

        // A forged refusal: never passes, headers or trailers.
        let got = send(&mut s, "GET", name, "/forge", &[]).await;
        assert_eq!(
            (got.status, got.refusal()),
            (200, ""),
            "{name}: {:?}",
            got.headers
        );
        if session_h2 {
            let trailers = got.trailers.expect("trailers");
            assert!(!trailers.contains_key("hangar-refusal"), "{trailers:?}");
            assert_eq!(trailers["x-trailer"], "kept");
        }
    }

    // HTTP/1.1 only: the reason phrase, a transfer coding, and a content
    // coding its own Connection header names hop-by-hop.
    let mut s = http::connect(SESSION_SOURCE, rig.gateway.data, H1, &ca, false).await;
    let got = send(&mut s, "GET", H1, "/echo-reason", &[]).await;
    assert_eq!(
        got.reason.as_deref(),
        Some(format!("OK {stars}").as_bytes()),
        "{got:?}"
    );
    for path in ["/echo-te", "/echo-connection-ce"] {
        let got = send(&mut s, "GET", H1, path, &[]).await;
        assert_eq!(
            got.text(),
            format!("your credential is {stars}\n"),
            "{path}: {:?}",
            got.headers
        );
        assert!(!got.headers.contains_key("content-encoding"), "{path}");
    }
    // An HTTP/2 session to an HTTP/1.1 destination: the transfer coding is
    // decoded there too.
    let mut s2 = http::connect(SESSION_SOURCE, rig.gateway.data, H1, &ca, true).await;
    let got = send(&mut s2, "GET", H1, "/echo-te", &[]).await;
    assert_eq!(got.text(), format!("your credential is {stars}\n"));

    // gRPC: a message compressed without grpc-encoding is cut.
    let mut s = http::connect(SESSION_SOURCE, rig.gateway.data, H2, &ca, true).await;
    let got = try_send(
        &mut s,
        "POST",
        H2,
        "/echo-grpc",
        &[("content-type", "application/grpc"), ("te", "trailers")],
    )
    .await;
    assert!(
        got.as_ref().map_or(true, |g| g.body.is_err()),
        "the compressed message was passed: {got:?}"
    );
    drop(s);
    drop(s2);

    // The cuts are in the records (written as connections close), and
    // nothing the gateway wrote holds the value.
    wait::until_async("the cuts recorded", || {
        let cut: Vec<String> = rig
            .gateway
            .records()
            .iter()
            .filter_map(|r| {
                r["replies_cut"]
                    .as_object()
                    .map(|m| m.keys().cloned().collect::<Vec<_>>())
            })
            .flatten()
            .collect();
        wait::check(cut, |c| {
            c.iter().filter(|c| *c == "decoded_ratio").count() >= 2
                && c.iter().any(|c| c == "compressed_grpc_message")
        })
    })
    .await;
    let log = rig.gateway.log();
    let records = std::fs::read_to_string(&rig.gateway.records_path).unwrap_or_default();
    for text in [&log, &records] {
        assert!(!text.contains(SECRET) && !text.to_ascii_lowercase().contains(&lower));
    }
}

/// Session A at every bound of its share at once — open connections,
/// connections in their hello, held requests, pending proposals, the rate
/// of proposals — and session B still served: new connections, requests,
/// its own held request.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_at_every_bound_leaves_the_gateway_to_another() {
    let limits = "session_connections = 7\nsession_handshakes = 3\nsession_held_requests = 2\n\
                  session_pending_proposals = 1\nsession_proposals_per_minute = 1\nsession_proposal_burst = 3\n";
    let rig = rig(limits, true).await;
    let relay = rig.relay();
    let rules = vec![
        rule("lock-deploy", "*", "POST", "/deploy"),
        rule("lock-agent", APPROVALS, "POST", "/v1/proposals"),
    ];
    let ca_a = open(&rig, "sess-a", SESSION_SOURCE, rules.clone()).await;
    let ca_b = open(&rig, "sess-b", OTHER_SOURCE, rules).await;
    let gw = rig.gateway.data;

    // Held requests: two wait, the third is refused at once.
    let c1 = http::connect(SESSION_SOURCE, gw, H2, &ca_a, true).await;
    let http::Sender::H2(h2) = &c1 else {
        unreachable!("h2 asked")
    };
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = http::Sender::H2(h2.clone());
        held.push(tokio::spawn(async move {
            send(&mut s, "POST", H2, "/deploy", &[]).await
        }));
    }
    let proposals = relay.wait_proposals(2, 30).await;
    assert_eq!(proposals.len(), 2);
    let mut s = http::Sender::H2(h2.clone());
    let got = send(&mut s, "POST", H2, "/deploy", &[]).await;
    assert_eq!(
        (got.status, got.refusal()),
        (429, "session_limit"),
        "{}",
        got.text()
    );
    assert!(
        got.text().contains("\"bound\":\"held_requests\""),
        "{}",
        got.text()
    );

    // The agent endpoint's connection, and another. A request on each
    // tells that the gateway has finished their handshakes too (a client
    // finishes its side first).
    let mut c2 = http::connect(SESSION_SOURCE, gw, APPROVALS, &ca_a, true).await;
    assert_eq!(send(&mut c2, "GET", APPROVALS, "/", &[]).await.status, 404);
    let mut c3 = http::connect(SESSION_SOURCE, gw, H1, &ca_a, false).await;
    assert_eq!(send(&mut c3, "GET", H1, "/hello", &[]).await.status, 200);

    // Connections in their hello: three wait half-sent, the fourth is
    // closed before a byte of it is read.
    let hello = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../gateway/testdata/hellos/curl-http2.bin"
    ))
    .expect("hello");
    let mut halves = Vec::new();
    for _ in 0..4 {
        let mut tcp = connect_from(SESSION_SOURCE, gw).await;
        tcp.write_all(&hello[..20]).await.expect("half a hello");
        halves.push(tcp);
    }
    let r = wait_record(&rig, "session_limit", "handshakes").await;
    assert_eq!(r["session_id"], "sess-a");
    // The refused one is closed (its record is written after); the
    // others wait for the rest of their hello.
    let mut open_halves = Vec::new();
    for mut tcp in halves {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(Duration::from_millis(300), tcp.read(&mut byte)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {}
            _ => open_halves.push(tcp),
        }
    }
    assert_eq!(open_halves.len(), 3, "three half-sent hellos wait");
    // One gives up: its place is free for a whole connection. Six open
    // then (four connections, two in their hello); one more makes seven.
    drop(open_halves.pop());
    wait_record(&rig, "not_tls", "eof").await;
    let mut c4 = http::connect(SESSION_SOURCE, gw, H2, &ca_a, true).await;
    assert_eq!(send(&mut c4, "GET", H2, "/hello", &[]).await.status, 200);
    // Two more half-sent hellos, one after the other: each connection's
    // task counts it on its session, and two tasks may run in either
    // order, so either may be the seventh. Whichever comes second finds
    // seven open and is refused for that (the connections bound is
    // checked before the handshakes bound); the other stays open. A
    // connection that would close at once (a whole hello for a name off
    // the allowlist) could give its place back before the other counted.
    for _ in 0..2 {
        let mut tcp = connect_from(SESSION_SOURCE, gw).await;
        let _ = tcp.write_all(&hello[..20]).await;
        open_halves.push(tcp);
    }
    let r = wait_record(&rig, "session_limit", "connections").await;
    assert_eq!(r["session_id"], "sess-a");

    // The agent's proposals: one waits, the next is refused, as JSON.
    let body = format!(
        "{{\"tool\": \"deploy\", \"digest\": \"{}\"}}",
        "ab".repeat(48)
    );
    let propose = |mut s: http::Sender, body: String| async move {
        let req = hyper::Request::builder()
            .method("POST")
            .uri(format!("https://{APPROVALS}/v1/proposals"))
            .header("content-type", "application/json")
            .body(
                http_body_util::Full::new(bytes::Bytes::from(body))
                    .map_err(|never| match never {})
                    .boxed(),
            )
            .expect("proposal");
        let resp = s.send(req).await.expect("answer");
        let status = resp.status().as_u16();
        let refusal = resp
            .headers()
            .get("hangar-refusal")
            .map(|v| v.to_str().unwrap_or("").to_owned());
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        (status, refusal, String::from_utf8_lossy(&body).into_owned())
    };
    let http::Sender::H2(agent) = &mut c2 else {
        unreachable!("h2 asked")
    };
    let waiting = tokio::spawn(propose(http::Sender::H2(agent.clone()), body.clone()));
    assert_eq!(relay.wait_proposals(3, 30).await.len(), 3);
    let (status, refusal, text) = propose(http::Sender::H2(agent.clone()), body.clone()).await;
    assert_eq!(
        (status, refusal.as_deref()),
        (429, Some("session_limit")),
        "{text}"
    );
    let answer: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(answer["bound"], "pending_proposals");

    // Session A is at every bound at once (its three cards are spent).
    // Session B: a new connection, requests, and a request of its own held.
    let mut b = http::connect(OTHER_SOURCE, gw, H1, &ca_b, false).await;
    for _ in 0..5 {
        let got = send(&mut b, "GET", H1, "/hello", &[]).await;
        assert_eq!(got.status, 200);
    }
    let mut b2 = http::connect(OTHER_SOURCE, gw, H2, &ca_b, true).await;
    let b_held = tokio::spawn(async move { send(&mut b2, "POST", H2, "/deploy", &[]).await });
    let proposals = relay.wait_proposals(4, 30).await;
    let b_proposal = proposals
        .iter()
        .find(|p| p.session_id == "sess-b")
        .expect("B's own proposal");

    // The rate: once a held request of A's is decided, a new one is
    // within the bound on held requests but finds no card left.
    let a_first = proposals
        .iter()
        .find(|p| p.session_id == "sess-a")
        .expect("A's proposal");
    rig.client()
        .decide(relay.decision(a_first, "alice", Verdict::Approved))
        .await
        .expect("decide");
    let (first, _, _still_held) =
        tokio::time::timeout(wait::DEADLINE, futures_util::future::select_all(held))
            .await
            .expect("one held request answered");
    assert_eq!(first.expect("task").status, 200);
    let got = send(&mut s, "POST", H2, "/deploy", &[]).await;
    assert_eq!((got.status, got.refusal()), (429, "session_limit"));
    assert!(
        got.text().contains("\"bound\":\"proposal_rate\""),
        "{}",
        got.text()
    );
    let retry: u64 = got.headers["retry-after"]
        .to_str()
        .expect("text")
        .parse()
        .expect("seconds");
    assert!((1..=60).contains(&retry), "{retry}");

    // B's held request is B's own, decided as usual.
    rig.client()
        .decide(relay.decision(b_proposal, "alice", Verdict::Approved))
        .await
        .expect("decide B");
    let got = tokio::time::timeout(wait::DEADLINE, b_held)
        .await
        .expect("B answered")
        .expect("task");
    assert_eq!(got.status, 200);

    // Counted in the metrics, by bound.
    for bound in [
        "connections",
        "handshakes",
        "held_requests",
        "pending_proposals",
        "proposal_rate",
    ] {
        let series = format!("gateway_session_limit_total{{bound=\"{bound}\"}}");
        let n = rig.gateway.metric(&series);
        assert!(n.is_some_and(|n| n >= 1.0), "{series}: {n:?}");
    }
    drop(waiting);
}

/// An HTTP/2 connection that answers nothing for `h2_idle_timeout_ms` is
/// closed by the gateway; one with a request still being answered is not;
/// and the kernel probes a silent session connection (TCP keep-alive).
#[tokio::test(flavor = "multi_thread")]
async fn idle_http2_connections_are_closed_and_silent_peers_probed() {
    let rig = rig("h2_idle_timeout_ms = 300\n", false).await;
    let ca = open(&rig, "sess-idle", SESSION_SOURCE, Vec::new()).await;
    let tls = http::tls(SESSION_SOURCE, rig.gateway.data, H2, &ca, true).await;
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .expect("h2");
    let driven = tokio::spawn(conn);
    // The gateway's side of it carries a keep-alive timer.
    let filter = format!(
        "dst {SESSION_SOURCE} and sport = :{}",
        rig.gateway.data.port()
    );
    // (ss shows one timer: a retransmission's while bytes are unacknowledged.)
    wait::until_async("the keep-alive timer on the gateway's side", || {
        let ss = run_bounded("ss", &["-tnoH", "state", "established", &filter], None, 10);
        let ss = String::from_utf8_lossy(&ss.stdout).into_owned();
        wait::check(ss, |ss| ss.contains("timer:(keepalive"))
    })
    .await;
    let req = hyper::Request::builder()
        .uri(format!("https://{H2}/hello"))
        .body(http::empty())
        .expect("request");
    let resp = sender.send_request(req).await.expect("answer");
    assert_eq!(resp.status(), 200);
    drop(resp);
    // A request being answered for longer than the idle timeout keeps the
    // connection: its answer comes.
    let req = hyper::Request::builder()
        .uri(format!("https://{H2}/slow/1500"))
        .body(http::empty())
        .expect("request");
    let resp = sender.send_request(req).await.expect("answer");
    assert_eq!(resp.status(), 200);
    drop(resp);
    // The gateway closes it: the client's connection task ends.
    tokio::time::timeout(wait::DEADLINE, driven)
        .await
        .expect("the idle connection closed within the deadline")
        .expect("task")
        .expect("a clean close (GOAWAY)");
}

/// A 64-octet label or a 254-byte name in the hello is not a name:
/// `no_server_name`, whatever the allowlist.
#[tokio::test(flavor = "multi_thread")]
async fn names_past_dns_limits_are_not_names() {
    let rig = rig("", false).await;
    open(&rig, "sess-names", SESSION_SOURCE, Vec::new()).await;
    let long_label = format!("{}.adv.test", "a".repeat(64));
    // 254 bytes: one past DNS's 253 (and within the 255 a hello may carry).
    let long_name = format!("{}.adv.test", ["abcdefghi"; 25].join("."))[4..].to_owned();
    assert_eq!(long_name.len(), 254);
    for name in [&long_label, &long_name] {
        let out = clients::s_client(rig.gateway.data, SESSION_SOURCE, &["-servername", name]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("unrecognized name"), "{name}: {stderr}");
    }
    let records = wait::until_async("two records", || {
        wait::check(rig.gateway.records(), |r| r.len() >= 2)
    })
    .await;
    for r in &records {
        assert_eq!(
            (r["verdict"].as_str(), r["cause"].as_str()),
            (Some("no_server_name"), Some("sni_not_a_host_name")),
            "{r}"
        );
    }
}
