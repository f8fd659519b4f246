//! Credentials by name, end to end: the gateway injects an attached secret
//! into requests for its destination, replacing whatever the session sent,
//! and masks every echo of it in replies — headers, bodies, trailers,
//! compressed bodies, base64 forms, one-byte chunks — while a destination
//! without attachments is passed byte for byte. Afterwards nothing the
//! gateway logged or recorded holds the value or its encodings.

use std::collections::HashMap;
use std::net::IpAddr;

use base64::Engine;
use http_body_util::BodyExt;
use serde_json::Value;
use sha2::Digest;
use talos_e2e::clients::http;
use talos_e2e::clients::{Curled, SESSION_SOURCE};
use talos_e2e::dns::{Answer, DnsServer};
use talos_e2e::gateway::{Gateway, TestConfig};
use talos_e2e::grpc::echo::EchoRequest;
use talos_e2e::grpc::{client_via_gateway, Flavour, GrpcOrigin};
use talos_e2e::origin::{compress, Origin, TestCa};
use talos_e2e::rig::Single;
use tokio::net::TcpListener;

const SECRET: &str = "s3cr3t-T0ken/+=-abcdefghij0123456789";
const API: &str = "api.test";
const PLAIN: &str = "plain.test";
const GRPC: &str = "grpc.test";

/// The origins for `api.test` and `plain.test`, the gRPC origin for
/// `grpc.test`, and the DNS server naming them.
type Rig = Single<Gateway, ((Vec<Origin>, GrpcOrigin), DnsServer)>;

/// The three destinations at one port on three loopback addresses, behind
/// a gateway with one session allowed all three, `API_TOKEN` (read from
/// a file) attached to `api.test` and `grpc.test`.
async fn rig() -> Rig {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().to_owned();
    let ca = TestCa::new("origin test CA");
    ca.write_pem(&path.join("origin-ca.pem"));
    std::fs::write(path.join("api-token"), format!("{SECRET}\n")).unwrap();
    // Three destinations at one port on three loopback addresses.
    let (origins, port) = loop {
        let a = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = a.local_addr().unwrap().port();
        let (Ok(b), Ok(c)) = (
            TcpListener::bind(("127.0.0.3", port)).await,
            TcpListener::bind(("127.0.0.4", port)).await,
        ) else {
            continue;
        };
        let http = vec![
            Origin::serve(a, &ca, &[API]),
            Origin::serve(b, &ca, &[PLAIN]),
        ];
        break (
            (http, GrpcOrigin::serve(c, &ca, &[GRPC], Flavour::H2)),
            port,
        );
    };
    let addr = |a: &str| Answer::Addrs(vec![a.parse::<IpAddr>().unwrap()]);
    let dns = DnsServer::start(HashMap::from([
        (API.to_owned(), addr("127.0.0.1")),
        (PLAIN.to_owned(), addr("127.0.0.3")),
        (GRPC.to_owned(), addr("127.0.0.4")),
    ]))
    .await;
    let base = TestConfig {
        dns: dns.addr,
        upstream_port: port,
        anchors: vec![path.join("origin-ca.pem")],
        permit_internal: vec![
            "127.0.0.1/32".into(),
            "127.0.0.3/32".into(),
            "127.0.0.4/32".into(),
        ],
        ..Default::default()
    };
    Single::builder()
        .session(&[API, PLAIN, GRPC])
        .attach(&[
            &format!("API_TOKEN={API}:authorization:Bearer"),
            &format!("API_TOKEN={GRPC}:authorization:Bearer"),
        ])
        .secret("API_TOKEN", "api-token")
        .start(tmp, (origins, dns), base)
        .await
}

fn stars(n: usize) -> String {
    "*".repeat(n)
}

/// Every form of the secret the gateway promises to mask.
fn forms() -> Vec<String> {
    let b = SECRET.as_bytes();
    vec![
        SECRET.to_owned(),
        base64::engine::general_purpose::STANDARD.encode(b),
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b),
        hex::encode(b),
    ]
}

fn assert_no_secret(what: &str, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    for form in forms() {
        assert!(
            !text.contains(&form),
            "{what} holds the secret (form {form:?}): {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn injected_credential_replaces_the_sessions_own_and_is_masked_on_the_way_back() {
    let rig = rig().await;
    let Curled {
        status: code, body, ..
    } = rig.curl(
        API,
        "/echo",
        &[
            "--http2",
            "-H",
            "Authorization: Bearer from-the-session",
            "-H",
            "authorization: another",
        ],
    );
    assert_eq!(code, 200);
    assert_no_secret("echo body", &body);
    let echo: Value = serde_json::from_slice(&body).unwrap();
    let auth: Vec<&str> = echo["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h[0] == "authorization")
        .map(|h| h[1].as_str().unwrap())
        .collect();
    assert_eq!(
        auth,
        [format!("Bearer {}", stars(SECRET.len()))],
        "replaced, not appended"
    );
    let want = hex::encode(sha2::Sha256::digest(format!("Bearer {SECRET}")));
    assert_eq!(
        echo["sha256"]["authorization"], want,
        "the origin got exactly the secret"
    );
    assert_eq!(
        echo["headers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h[0] == "accept-encoding")
            .unwrap()[1],
        "identity"
    );

    // HTTP/1.1 too, with the header spelled in another case.
    let Curled {
        status: code, body, ..
    } = rig.curl(API, "/echo", &["--http1.1", "-H", "AUTHORIZATION: mine"]);
    assert_eq!(code, 200);
    let echo: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(echo["sha256"]["authorization"], want);

    let records = rig.gateway.wait_records(2);
    for r in &records {
        assert_eq!(
            r["attachments_used"],
            serde_json::json!(["API_TOKEN"]),
            "{r}"
        );
        assert!(r["masked"]["API_TOKEN"].as_u64().unwrap() >= 1, "{r}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_echo_of_the_secret_is_masked() {
    let rig = rig().await;
    let masked = format!("Bearer {}", stars(SECRET.len()));
    // In a response header.
    let Curled { head, .. } = rig.curl(API, "/reflect?how=header", &[]);
    assert!(
        head.contains(&format!("x-reflected: {}", masked.to_ascii_lowercase())),
        "{head}"
    );
    assert_no_secret("header", head.as_bytes());
    // In the body, whole and one byte per frame, over both protocols.
    for how in ["body", "chunks"] {
        for proto in ["--http1.1", "--http2"] {
            let Curled {
                status: code, body, ..
            } = rig.curl(API, &format!("/reflect?how={how}"), &[proto]);
            assert_eq!(code, 200);
            assert_eq!(
                String::from_utf8_lossy(&body),
                format!("your credential is {masked}\n"),
                "{how} {proto}"
            );
        }
    }
    // Base64 of the value inside JSON.
    let Curled { body, .. } = rig.curl(API, "/reflect?how=base64", &[]);
    assert_no_secret("base64 body", &body);
    assert!(
        String::from_utf8_lossy(&body).contains("****"),
        "{}",
        String::from_utf8_lossy(&body)
    );
    // Compressed with each coding, whatever was asked.
    for enc in ["gzip", "deflate", "br", "zstd"] {
        let Curled {
            status: code,
            head,
            body,
            ..
        } = rig.curl(API, &format!("/reflect?how=body&enc={enc}"), &["--http2"]);
        assert_eq!(code, 200, "{enc}");
        assert!(
            !head.contains("content-encoding"),
            "{enc}: decoded, so no coding: {head}"
        );
        assert_eq!(
            String::from_utf8_lossy(&body),
            format!("your credential is {masked}\n"),
            "{enc}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn trailers_are_masked_too() {
    let rig = rig().await;
    let mut sender = http::connect(SESSION_SOURCE, rig.gateway.data, API, &rig.trust, true).await;
    let req = hyper::Request::get("https://api.test/reflect?how=trailer")
        .header("te", "trailers")
        .body(http::empty())
        .unwrap();
    let resp = sender.send(req).await.unwrap();
    let collected = resp.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("trailers arrive");
    let v = trailers
        .get("x-reflected")
        .expect("the reflected trailer")
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(v, format!("Bearer {}", stars(SECRET.len())));
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_replies_and_error_messages_are_masked() {
    let rig = rig().await;
    let mut client = client_via_gateway(rig.gateway.data, SESSION_SOURCE, GRPC, &rig.trust)
        .await
        .expect("gRPC through the gateway");
    let masked = format!("you sent Bearer {}", stars(SECRET.len()));
    let reply = client
        .unary(EchoRequest {
            message: "reflect:authorization".into(),
            ..Default::default()
        })
        .await
        .expect("unary");
    assert_eq!(reply.into_inner().message, masked, "in a protobuf message");
    let status = client
        .unary(EchoRequest {
            message: "reflect:authorization".into(),
            fail_with: 7,
            ..Default::default()
        })
        .await
        .expect_err("the origin fails the call");
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    assert_eq!(status.message(), masked, "in grpc-message");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_destination_without_attachments_is_untouched() {
    let rig = rig().await;
    let Curled {
        status: code,
        head,
        body,
        ..
    } = rig.curl(
        PLAIN,
        "/reflect?how=body&enc=gzip",
        &["-H", "authorization: Bearer session-own"],
    );
    assert_eq!(code, 200);
    assert!(head.contains("content-encoding: gzip"), "{head}");
    assert_eq!(
        body,
        compress("gzip", b"your credential is Bearer session-own\n"),
        "byte for byte"
    );
    let records = rig.gateway.wait_records(1);
    assert!(
        records[0].get("attachments_used").is_none(),
        "{}",
        records[0]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_logged_or_recorded_holds_the_secret() {
    let mut rig = rig().await;
    for path in [
        "/echo",
        "/reflect?how=header",
        "/reflect?how=body&enc=br",
        "/reflect?how=base64",
    ] {
        let _ = rig.curl(API, path, &["-v"]);
    }
    let n = rig.gateway.wait_records(4).len();
    assert_eq!(n, 4);
    assert!(rig.gateway.stop());
    assert_no_secret("the gateway log", rig.gateway.log().as_bytes());
    assert_no_secret(
        "the records",
        &std::fs::read(&rig.gateway.records_path).unwrap(),
    );
    assert_no_secret("the session CA file", &std::fs::read(&rig.trust).unwrap());
}
