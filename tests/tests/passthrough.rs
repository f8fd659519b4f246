//! Passthrough destinations, end to end: the control stub's CLI and
//! `serve`, a gateway, a real TLS origin with its own test CA, and curl as
//! the session.
//!
//! A name the account marks passthrough (the model route's, by default)
//! is checked before the handshake like any other, then passed on to the
//! checked address without termination: the session's client sees the
//! origin's own certificate, and the gateway's record has the connection
//! (address, times, bytes each way, verdict, `passthrough`) and nothing
//! inside it. Policy that the gateway could not honour on such a name (an
//! attachment, a Lock rule) is refused before any session runs.

use std::collections::HashMap;
use std::net::IpAddr;

use serde_json::Value;
use talos_e2e::clients::{Curl, SESSION_SOURCE};
use talos_e2e::dns::Answer;
use talos_e2e::origin::LoopbackOrigin;
use talos_e2e::rig::{Pair, SessionSpec};
use talos_e2e::wait;

/// A name of the model route: passthrough from the store's start.
const MODEL: &str = "api.anthropic.com";
/// A name the gateway terminates.
const API: &str = "api.test";
/// A name the operator marks passthrough, whose DNS answer is internal.
const INTERNAL: &str = "model-internal.test";

/// One member and `serve`, behind one origin for [`MODEL`] and [`API`]
/// (on 127.0.0.1, let through by the test config) and a DNS server that
/// answers [`INTERNAL`] with a private address; all three on the egress
/// list. Also the origin CA's file.
async fn rig() -> (Pair, std::path::PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let private: IpAddr = "10.9.8.7".parse().unwrap();
    let peers = LoopbackOrigin::serving_with(
        tmp.path(),
        &[MODEL, API],
        HashMap::from([(INTERNAL.to_owned(), Answer::Addrs(vec![private]))]),
    )
    .await;
    let origin_ca = tmp.path().join("origin-ca.pem");
    let base = peers.config();
    let rig = Pair::builder()
        .ids(&["gw-a"])
        .egress(&[MODEL, API, INTERNAL])
        .start(tmp, peers, base);
    (rig, origin_ca)
}

/// The records of `sni` on the member once `n` of them are written.
fn records_of(rig: &Pair, sni: &str, n: usize) -> Vec<Value> {
    wait::until(&format!("{n} records of {sni}"), || {
        let records: Vec<Value> = rig.members[0]
            .records()
            .into_iter()
            .filter(|r| r["sni"] == sni)
            .collect();
        wait::check(records, |r| r.len() >= n)
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_passthrough_name_reaches_the_origin_with_its_own_certificate_and_is_recorded_unread() {
    let (rig, origin_ca) = rig().await;
    let marked = rig.cli(&["policy", "passthrough", "list"]).json();
    assert_eq!(
        marked,
        serde_json::json!(["api.anthropic.com", "claude.ai", "console.anthropic.com"]),
        "the model route is passthrough from the start"
    );
    rig.cli(&["policy", "passthrough", "add", INTERNAL]).json();
    let id = rig.start_session(
        &SessionSpec::from(SESSION_SOURCE)
            .allow(MODEL)
            .allow(API)
            .allow(INTERNAL),
    );
    let status = rig.status(&id);
    assert_eq!(
        status["attempts"][0]["passthrough"],
        serde_json::json!([MODEL, INTERNAL]),
        "{status}"
    );
    // The session's bundle: its CA, then the public roots, for which the
    // origin's CA stands in (tests reach no real destination).
    let trust = rig.cli(&[
        "sandbox",
        "trust",
        &id,
        "--public-roots",
        origin_ca.to_str().unwrap(),
    ]);
    assert_eq!(trust.status, 0, "{}", trust.stderr);
    let end = "-----END CERTIFICATE-----";
    assert_eq!(trust.stdout.matches(end).count(), 2, "{}", trust.stdout);
    let bundle = rig.dir.join("trust.pem");
    std::fs::write(&bundle, &trust.stdout).unwrap();
    let ca_end = trust.stdout.find(end).unwrap() + end.len();
    let session_ca = rig.dir.join("session-ca.pem");
    std::fs::write(&session_ca, format!("{}\n", &trust.stdout[..ca_end])).unwrap();
    let g = &rig.members[0];

    // The client trusts the origin's CA alone, and gets through: the TLS
    // is the origin's, end to end. A download and an upload.
    const DOWN: usize = 3_000_000;
    let down = Curl::via(g.data, &origin_ca, MODEL).run(&format!("/download/{DOWN}"));
    assert_eq!(down.status, 200, "{}", down.stderr);
    assert_eq!(down.body.len(), DOWN);
    const UP: usize = 1_000_000;
    let upload = rig.dir.join("upload.bin");
    std::fs::write(&upload, vec![b'u'; UP]).unwrap();
    let data = format!("@{}", upload.display());
    let up = Curl::via(g.data, &origin_ca, MODEL)
        .args(&["--data-binary", &data])
        .run("/upload");
    assert_eq!(up.status, 200, "{}", up.stderr);
    assert!(
        up.text().contains(&format!("\"len\":{UP}")),
        "{}",
        up.text()
    );
    // HTTP/2, as the client and the origin chose it between them.
    let h2 = Curl::via(g.data, &origin_ca, MODEL)
        .args(&["--http2", "-o", "/dev/null", "-w", "%{http_version}"])
        .run("/echo");
    assert_eq!(h2.exit, 0, "{}", h2.stderr);
    assert!(h2.text().ends_with('2'), "{}", h2.text());

    // A client trusting only the session's CA cannot verify the origin:
    // the gateway made no certificate for the name.
    let refused = Curl::via(g.data, &session_ca, MODEL).run("/echo");
    assert_eq!(refused.status, 0);
    assert_eq!(
        refused.exit, 60,
        "curl: peer certificate not verified: {}",
        refused.stderr
    );
    // The session's bundle verifies it; and a terminated name beside it
    // is the gateway's, with the session's CA, whichever the client holds.
    let through = Curl::via(g.data, &bundle, MODEL).run("/echo");
    assert_eq!(through.status, 200, "{}", through.stderr);
    for trusted in [&bundle, &session_ca] {
        let terminated = Curl::via(g.data, trusted, API).run("/echo");
        assert_eq!(terminated.status, 200, "{}", terminated.stderr);
    }

    let records = records_of(&rig, MODEL, 4);
    let origin_port = rig.peers.origin.addr.port();
    for r in &records {
        assert_eq!(r["verdict"], "allowed", "{r}");
        assert_eq!(r["passthrough"], true, "{r}");
        assert_eq!(r["session_id"], id.as_str(), "{r}");
        assert_eq!(r["resolved"], format!("127.0.0.1:{origin_port}"), "{r}");
        assert_eq!(r["request_count"], 0, "nothing inside was seen: {r}");
        for unseen in ["requests", "tls_version", "alpn_session", "alpn_upstream"] {
            assert!(r.get(unseen).is_none(), "{unseen} in {r}");
        }
        assert!(r["bytes_from_session"].as_u64().unwrap() > 0, "{r}");
        assert!(r["bytes_to_session"].as_u64().unwrap() > 0, "{r}");
    }
    let most = |field: &str| records.iter().map(|r| r[field].as_u64().unwrap()).max();
    assert!(
        most("bytes_to_session").unwrap() > DOWN as u64,
        "the download counted to the session, TLS and all"
    );
    assert!(
        most("bytes_from_session").unwrap() > UP as u64,
        "the upload counted from the session"
    );
    // The origin served what came through (the passed-on requests'
    // paths are its to see, not the gateway's).
    assert!(rig
        .peers
        .origin
        .paths()
        .contains(&format!("/download/{DOWN}")));
    let terminated_record = &records_of(&rig, API, 1)[0];
    assert!(terminated_record.get("passthrough").is_none());
    assert_eq!(terminated_record["request_count"], 1);

    // A passthrough name whose answer is internal is refused before a
    // byte is passed on, as any name is.
    let internal = Curl::via(g.data, &origin_ca, INTERNAL).run("/echo");
    assert_eq!(internal.status, 0);
    let r = &records_of(&rig, INTERNAL, 1)[0];
    assert_eq!(r["verdict"], "resolves_internal", "{r}");
    assert_eq!(r["internal_answer"], "10.9.8.7", "{r}");
    assert!(r.get("resolved").is_none_or(Value::is_null), "{r}");
}

/// A download through the gateway from `source` to `name`, trusting only
/// `ca`: the head is read (200), the body never, so the connection stays
/// open with the origin still sending. Returns what keeps it open.
async fn stalled_download(
    gateway: std::net::SocketAddr,
    ca: &std::path::Path,
    name: &str,
) -> (
    hyper::client::conn::http1::SendRequest<talos_e2e::clients::http::Body>,
    hyper::Response<hyper::body::Incoming>,
) {
    let tls = talos_e2e::clients::http::tls(SESSION_SOURCE, gateway, name, ca, false).await;
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .expect("HTTP/1.1 handshake");
    tokio::spawn(conn);
    send.ready().await.expect("ready");
    let req = hyper::Request::get("/download/1073741824")
        .header("host", name)
        .body(talos_e2e::clients::http::empty())
        .expect("request");
    let resp = send.send_request(req).await.expect("the download's head");
    assert_eq!(resp.status(), 200, "{name}");
    (send, resp)
}

/// A passthrough connection still open when the drain's grace runs out
/// (its TLS is the session's own with the origin: the drain's start cannot
/// close it gracefully) is cut then, and its record is marked as a
/// terminated connection's is, cut at the same grace: `cut: true`, cause
/// `cut_at_grace`, verdict `allowed` (the terminated one's request in
/// flight is `cut` too). The certificate shows both as the member signed
/// them, and neither as a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_passthrough_connection_open_at_the_grace_is_recorded_cut_as_a_terminated_one_is() {
    let (mut rig, origin_ca) = rig().await;
    let id = rig.start_session(&SessionSpec::from(SESSION_SOURCE).allow(MODEL).allow(API));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    let data = rig.members[0].data;
    let passed = stalled_download(data, &origin_ca, MODEL).await;
    let terminated = stalled_download(data, &bundle, API).await;
    assert!(rig.members[0].stop(), "gw-a drains and exits 0");
    assert!(
        rig.members[0]
            .log()
            .contains("grace over; cutting open connections"),
        "both downloads were still open at the grace: {}",
        rig.members[0].log()
    );
    drop((passed, terminated));
    let marked = |r: &Value| {
        assert_eq!(r["verdict"], "allowed", "{r}");
        assert_eq!(
            r["cut"], true,
            "the record says the connection was cut: {r}"
        );
        assert_eq!(r["cause"], "cut_at_grace", "and why: {r}");
    };
    let passthrough = &records_of(&rig, MODEL, 1)[0];
    marked(passthrough);
    assert_eq!(passthrough["passthrough"], true, "{passthrough}");
    assert!(passthrough["bytes_to_session"].as_u64().unwrap() > 0);
    let terminated = &records_of(&rig, API, 1)[0];
    marked(terminated);
    assert_eq!(terminated["requests"][0]["cut"], true, "{terminated}");

    // Started again, the session stopped: the certificate has both as
    // the member signed them, and neither among the refusals.
    rig.restart(0);
    let ran = rig.cli(&["sandbox", "stop", &id]).json();
    assert_eq!(ran["state"], "ended", "{ran}");
    let cert = rig.wait_issued(&id);
    for sni in [MODEL, API] {
        let on_cert: Vec<&Value> = cert["connections"]
            .as_array()
            .expect("connections")
            .iter()
            .filter(|c| c["sni"] == sni)
            .collect();
        assert_eq!(on_cert.len(), 1, "{sni}: {cert}");
        marked(on_cert[0]);
    }
    assert_eq!(cert["refusals"], serde_json::json!([]), "{cert}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_attachment_or_a_lock_rule_on_a_passthrough_name_is_refused_at_policy_time() {
    let (rig, _) = rig().await;
    rig.set_secret("API_TOKEN", "passthrough-S3CRET-never-sent");

    // A Lock rule naming a passthrough destination.
    let ran = rig.cli(&[
        "policy",
        "lock",
        "add",
        "--destination",
        MODEL,
        "--method",
        "POST",
        "--mode",
        "every_request",
        "--approver",
        "alice",
    ]);
    assert_eq!(ran.status, 2, "{}", ran.stderr);
    assert!(
        ran.stderr
            .starts_with("error: passthrough_conflict: api.anthropic.com is passthrough"),
        "{}",
        ran.stderr
    );
    assert_eq!(
        rig.cli(&["policy", "lock", "list"]).json(),
        serde_json::json!([])
    );

    // A session attaching a credential to one: refused before any gateway
    // is asked, the secret's value in no message.
    let ran = rig.cli(&[
        "sandbox",
        "start",
        "--tenant",
        "acme",
        "--source",
        SESSION_SOURCE,
        "--allow",
        MODEL,
        "--attach",
        "API_TOKEN=api.anthropic.com:x-api-key",
    ]);
    assert_eq!(ran.status, 2, "{}", ran.stderr);
    assert!(
        ran.stderr.contains("passthrough_conflict")
            && ran.stderr.contains("api.anthropic.com")
            && ran.stderr.contains("attachment API_TOKEN"),
        "{}",
        ran.stderr
    );
    assert!(!ran.stderr.contains("S3CRET"));

    // Marking passthrough a name a rule already names.
    let rule = rig.lock(API, "POST", "/", "alice");
    let ran = rig.cli(&["policy", "passthrough", "add", API]);
    assert_eq!(ran.status, 2, "{}", ran.stderr);
    let id = rule["id"].as_str().unwrap();
    assert!(
        ran.stderr.contains("passthrough_conflict")
            && ran.stderr.contains("api.test cannot be made passthrough")
            && ran.stderr.contains(&format!("Lock rule {id}")),
        "{}",
        ran.stderr
    );
    assert_eq!(
        rig.cli(&["policy", "passthrough", "list"]).json(),
        serde_json::json!(["api.anthropic.com", "claude.ai", "console.anthropic.com"])
    );
}
