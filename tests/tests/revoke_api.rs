//! Revoke All for an API caller (issue 42, item 6), end to end: the real
//! gateways, `control-stub serve --web-listen`, and real `curl` as the API
//! client.
//!
//! - `control-stub init --operator opal` on the rig's existing control
//!   directory adds only opal's certificate and key (0600), under the
//!   operator CA the first `init` made.
//! - `curl --cert operator-opal.pem --key operator-opal.key -X POST
//!   https://…/v1/sandboxes/ID/revoke-all` revokes the session: its open
//!   connection is cut, a new one refused; `sandbox status` and the
//!   certificate record the requester as operator opal, verified by
//!   `client_certificate`, with the certificate's SHA-256 fingerprint as
//!   openssl computes it. Asked again: 409 `sandbox_ended`; an unknown
//!   session: 404.
//! - Refused, by name: no identity (401 `no_identity`), a gateway's
//!   certificate (403 `certificate_refused`, `not_operator_ca`), an
//!   approver's signed-in session (403 `not_permitted`), a certificate
//!   naming a person the store holds as an approver (403
//!   `not_permitted`), a certificate request from another site's page
//!   (403 `origin_refused`), a body asking for anything (400
//!   `body_invalid`). And the other way: the control channel refuses
//!   opal's certificate.
//! - Each session's bundle verifies alone with the verifier checking who
//!   asked: opal's certificate, olga's passkey over the command.
//! - A signed-in operator's session with a passkey assertion over the
//!   command's challenge (the nonce from `/v1/…/revoke-all/begin`) revokes
//!   too, recorded `verified_by: passkey`, with the public key it verified
//!   under; a command-line Revoke All stays unverified.
//! - `serve` logs one JSON line per call, with how the caller was
//!   identified and the certificate's fingerprint, and never the
//!   certificate's key, the session cookie or the assertion.

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde_json::{json, Value};
use talos_certs::proposal_msg_of;
use talos_e2e::clients::{curl_status, Kept, SESSION_SOURCE};
use talos_e2e::people::{control_plane_client, RP_ID};
use talos_e2e::rig::{Pair, SessionSpec};
use talos_e2e::stub::verify_bundle;

const API: &str = "api.test";
const SECRET: &str = "revoke-api-S3CRET-v4lue-5521";

async fn pair() -> Pair {
    Pair::builder()
        .egress(&[API])
        .secret("API_TOKEN", SECRET)
        .start_loopback(&[API])
        .await
}

fn session() -> SessionSpec {
    SessionSpec::from(SESSION_SOURCE)
        .allow(API)
        .attach("API_TOKEN=api.test:authorization:Bearer")
        .mode("commands")
}

/// `curl -X POST` to the web app's `path` with `args` (a client
/// certificate, headers), trusting the web app's CA: the status and the
/// JSON body (null when there is none).
fn curl_web(rig: &Pair, path: &str, args: &[&str]) -> (u16, Value) {
    let port = rig.stub.web_addr.port();
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30", "--cacert"])
        .arg(rig.dir.join("web-ca.pem"))
        .args(["--resolve", &format!("{RP_ID}:{port}:127.0.0.1")])
        .args(["-o", "-", "-w", "\n%{http_code}", "-X", "POST"])
        .args(args)
        .arg(format!("https://{RP_ID}:{port}{path}"))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    let status = code.trim().parse().unwrap_or(0);
    let body = serde_json::from_str(body).unwrap_or(Value::Null);
    (status, body)
}

/// `--cert FILE --key FILE` of `who` in the control directory.
fn cert_args(dir: &Path, who: &str) -> Vec<String> {
    vec![
        "--cert".into(),
        dir.join(format!("{who}.pem")).display().to_string(),
        "--key".into(),
        dir.join(format!("{who}.key")).display().to_string(),
    ]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The SHA-256 fingerprint of a PEM certificate as openssl prints it,
/// written as the record writes it (lowercase hex, no colons).
fn openssl_fingerprint(pem: &Path) -> String {
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
        .arg(pem)
        .output()
        .expect("run openssl");
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .split_once('=')
        .expect("a fingerprint")
        .1
        .replace(':', "")
        .to_ascii_lowercase()
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn last_command(rig: &Pair, id: &str) -> Value {
    rig.status(id)["commands"]
        .as_array()
        .and_then(|c| c.last())
        .cloned()
        .expect("a command")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operators_certificate_or_passkey_revokes_a_session_on_the_api() {
    let rig = pair().await;
    let dir: PathBuf = rig.stub.control_dir.clone();

    // opal's certificate, added to the directory the rig's init wrote.
    let before = std::fs::read(dir.join("gw-a.pem")).unwrap();
    let added = rig.stub.run(
        &[],
        &["init", "--dir", dir.to_str().unwrap(), "--operator", "opal"],
        b"",
    );
    let added = added.json();
    assert_eq!(added["files"].as_array().unwrap().len(), 2, "{added}");
    assert_eq!(mode(&dir.join("operator-opal.key")), 0o600);
    assert_eq!(std::fs::read(dir.join("gw-a.pem")).unwrap(), before);
    let again = rig.stub.run(
        &[],
        &["init", "--dir", dir.to_str().unwrap(), "--operator", "opal"],
        b"",
    );
    assert_eq!(again.code(), "io_failed");
    let opal = cert_args(&dir, "operator-opal");
    let gateway = cert_args(&dir, "gw-a");

    let id = rig.start_session(&session());
    let (bundle, _) = rig.trust(&id, "trust.pem");
    let revoke = format!("/v1/sandboxes/{id}/revoke-all");

    // No identity: 401.
    let (status, body) = curl_web(&rig, &revoke, &[]);
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("no_identity")),
        "{body}"
    );
    // A gateway's certificate is no operator's: 403, by name.
    let (status, body) = curl_web(&rig, &revoke, &strs(&gateway));
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("certificate_refused")),
        "{body}"
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("not_operator_ca"),
        "{body}"
    );
    // opal's certificate, sent by another site's page: refused.
    let mut cross = strs(&opal);
    cross.extend([
        "-H",
        "Origin: https://evil.test",
        "-H",
        "Sec-Fetch-Site: cross-site",
    ]);
    let (status, body) = curl_web(&rig, &revoke, &cross);
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("origin_refused")),
        "{body}"
    );
    // An approver's signed-in session: 403.
    let alice = rig.stub.approver("alice");
    let mut web = rig.stub.web_client();
    let signed_in = talos_e2e::rig::blocking(|| web.sign_in(&alice));
    assert_eq!(signed_in.status, 200, "{:?}", signed_in.body);
    let refused = talos_e2e::rig::blocking(|| web.post(&revoke, json!({})));
    assert_eq!(
        (refused.status, refused.code()),
        (403, "not_permitted"),
        "{:?}",
        refused.body
    );
    assert_eq!(rig.status(&id)["state"], "running", "nothing was revoked");
    // A body that asks for anything: refused.
    let mut asking = strs(&opal);
    asking.extend([
        "-H",
        "Content-Type: application/json",
        "-d",
        r#"{"force":true}"#,
    ]);
    let (status, body) = curl_web(&rig, &revoke, &asking);
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("body_invalid")),
        "{body}"
    );
    // A certificate naming someone the store holds as an approver: 403.
    rig.stub
        .run(
            &[],
            &[
                "init",
                "--dir",
                dir.to_str().unwrap(),
                "--operator",
                "alice",
            ],
            b"",
        )
        .json();
    let (status, body) = curl_web(&rig, &revoke, &strs(&cert_args(&dir, "operator-alice")));
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("not_permitted")),
        "{body}"
    );
    // An unknown session: 404.
    let (status, body) = curl_web(&rig, "/v1/sandboxes/sbx-nope/revoke-all", &strs(&opal));
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("sandbox_not_found")),
        "{body}"
    );

    // The other way: the control channel refuses opal's certificate (it
    // trusts the control CA alone), where gw-a's reaches the relay.
    let serve = rig.stub.serve_addr.expect("serve");
    let probe = talos_certs::Proposal {
        proposal_id: "gw-a-probe-1".into(),
        gateway_id: "gw-a".into(),
        session_id: "sbx-none".into(),
        attempt: 1,
        tenant: "acme".into(),
        kind: talos_certs::ProposalKind::Request,
        destination: API.into(),
        method: "POST".into(),
        path: "/x".into(),
        attachments: Vec::new(),
        rule: "rule-none".into(),
        tool: String::new(),
        call_digest: String::new(),
        approvers: vec!["alice".into()],
        created_at: "2026-12-07T00:00:00.000Z".into(),
        expires_at: "2026-12-07T00:05:00.000Z".into(),
    };
    let as_operator = control_plane_client(&dir, "operator-opal", serve)
        .propose(proposal_msg_of(&probe))
        .await
        .expect_err("the control channel takes no operator");
    let as_gateway = control_plane_client(&dir, "gw-a", serve)
        .propose(proposal_msg_of(&probe))
        .await
        .expect_err("a proposal for no session");
    eprintln!("operator: {as_operator:?}\ngateway: {as_gateway:?}");
    // The handshake fails (TLS 1.3: the server refuses the certificate
    // after the client's Finished, and closes): no answer of the relay's.
    assert!(
        matches!(
            as_operator.code(),
            tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
        ) && !as_operator.message().contains("proposal"),
        "no TLS connection for an operator: {as_operator:?}"
    );
    assert_eq!(
        as_gateway.code(),
        tonic::Code::FailedPrecondition,
        "the gateway reached the relay: {as_gateway:?}"
    );

    // opal revokes the session with her certificate, while it holds a
    // connection open.
    let mut kept = Kept::open(SESSION_SOURCE, rig.members[0].data, API, &bundle, "/hello").await;
    let (status, body) = curl_web(&rig, &revoke, &strs(&opal));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["requested_by"], "opal");
    assert_eq!(body["verified_by"], "client_certificate");
    assert_ne!(body["state"], "running");
    assert!(kept.get("/again").await.is_err(), "the connection is cut");
    assert_eq!(
        curl_status(SESSION_SOURCE, rig.members[0].data, &bundle, API, "/after"),
        0,
        "a connection after Revoke All"
    );
    // Asked again: the session has ended.
    let (status, body) = curl_web(&rig, &revoke, &strs(&opal));
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("sandbox_ended")),
        "{body}"
    );

    // The record: operator opal, verified by her client certificate.
    let fingerprint = openssl_fingerprint(&dir.join("operator-opal.pem"));
    let last = last_command(&rig, &id);
    assert_eq!(last["event"], "revoke_all");
    assert_eq!(last["requester"], "operator");
    assert_eq!(last["requested_by"], "opal");
    assert_eq!(last["verified"], true);
    assert_eq!(last["verified_by"], "client_certificate");
    assert_eq!(last["client_certificate"]["sha256"], fingerprint.as_str());
    assert_eq!(last["client_certificate"]["operator"], "opal");
    assert!(last.get("assertion").is_none());
    let cert = rig.wait_issued(&id);
    let on_cert = cert["commands"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["event"] == "revoke_all")
        .expect("Revoke All on the certificate")
        .clone();
    assert_eq!(
        on_cert, last,
        "the certificate records it as the status does"
    );

    // An operator signed in with her passkey revokes another session on
    // the same route: the nonce from /v1/…/begin, her assertion over the
    // command's challenge.
    let second = rig.start_session(&session());
    let olga = rig.stub.person("olga", "operator");
    let mut op = rig.stub.web_client();
    let signed_in = talos_e2e::rig::blocking(|| op.sign_in(&olga));
    assert_eq!(signed_in.status, 200, "{:?}", signed_in.body);
    let begun = talos_e2e::rig::blocking(|| {
        op.post(
            &format!("/v1/sandboxes/{second}/revoke-all/begin"),
            json!({}),
        )
    });
    assert_eq!(begun.status, 200, "{:?}", begun.body);
    let challenge = URL_SAFE_NO_PAD
        .decode(begun.body["publicKey"]["challenge"].as_str().unwrap())
        .unwrap();
    let origin = rig.stub.web_origin.clone();
    let credential = olga.sign(&origin, &challenge);
    let done = talos_e2e::rig::blocking(|| {
        op.post(
            &format!("/v1/sandboxes/{second}/revoke-all"),
            json!({"nonce": begun.body["nonce"], "credential": credential}),
        )
    });
    assert_eq!(done.status, 200, "{:?}", done.body);
    assert_eq!(done.body["verified_by"], "passkey");
    let last = last_command(&rig, &second);
    assert_eq!(
        (
            &last["requested_by"],
            &last["verified"],
            &last["verified_by"]
        ),
        (&json!("olga"), &json!(true), &json!("passkey"))
    );
    assert_eq!(last["assertion"]["alg"], "ES256");
    assert!(last["assertion"]["public_key_cose"].is_string(), "{last}");

    // Each session's bundle verifies alone, the verifier checking who
    // asked: opal's certificate, olga's passkey over the command.
    rig.wait_issued(&second);
    for (session, line) in [
        (
            &id,
            "ok   command revoke_all 2: revoke_all by operator opal, with the client certificate",
        ),
        (
            &second,
            "ok   command revoke_all 2: revoke_all by olga, signed by a passkey",
        ),
    ] {
        let (code, text) = verify_bundle(&rig.bundle(session, &format!("{session}.bundle")));
        assert_eq!(code, 0, "{text}");
        assert!(text.contains(line), "{line}\n{text}");
    }

    // A command-line Revoke All names its operator, unverified.
    let third = rig.start_session(&session());
    let cli = rig.cli(&["sandbox", "revoke-all", &third]).json();
    assert_eq!(cli["requester"]["verified"], false, "{cli}");
    let last = last_command(&rig, &third);
    assert_eq!(last["verified"], false);
    assert!(last.get("verified_by").is_none(), "{last}");

    // One log line per call, saying how; nothing secret.
    let log = rig.stub.serve_log();
    let calls: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| {
            l["web"]
                .as_str()
                .is_some_and(|w| w.starts_with("POST /v1/"))
        })
        .collect();
    let ours = calls
        .iter()
        .find(|l| l["web"] == format!("POST {revoke}") && l["status"] == 200)
        .expect("the log line of opal's call");
    assert_eq!(ours["via"], "client_certificate");
    assert_eq!(ours["certificate_sha256"], fingerprint.as_str());
    assert_eq!(ours["person"], "opal");
    assert!(calls
        .iter()
        .any(|l| l["status"] == 401 && l["error"] == "no_identity"));
    let key = std::fs::read_to_string(dir.join("operator-opal.key")).unwrap();
    for line in key.lines().filter(|l| !l.starts_with("-----")) {
        assert!(!log.contains(line), "the certificate's key in serve's log");
    }
    for secret in [
        op.cookie.clone().unwrap_or_default(),
        credential["response"]["signature"]
            .as_str()
            .unwrap()
            .to_owned(),
        SECRET.to_owned(),
    ] {
        assert!(
            !secret.is_empty() && !log.contains(&secret),
            "a secret in serve's log"
        );
    }
}
