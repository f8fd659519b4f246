//! gRPC through the gateway: a tonic client from a session's source
//! address, trusting only the session CA, reaches a tonic origin over the
//! gateway's TLS termination and re-origination. Every gRPC shape must work
//! unchanged (unary, both streaming directions, bidirectional, statuses in
//! trailers, large messages), and a destination that answers over HTTP/1.1
//! must produce a `grpc_needs_http2` refusal the client can read.

use std::collections::HashMap;
use std::net::IpAddr;

use serde_json::Value;
use talos_e2e::clients::SESSION_SOURCE;
use talos_e2e::dns::{Answer, DnsServer};
use talos_e2e::gateway::{Gateway, TestConfig};
use talos_e2e::grpc::echo::echo_client::EchoClient;
use talos_e2e::grpc::echo::EchoRequest;
use talos_e2e::grpc::{self, Flavour, GrpcOrigin};
use talos_e2e::origin::TestCa;
use talos_e2e::rig::Single;
use tonic::transport::Channel;
use tonic::Code;

/// The listed name the gRPC origin serves.
const NAME: &str = "grpc.test";

/// A gRPC origin and the DNS server naming it.
type Rig = Single<Gateway, (GrpcOrigin, DnsServer)>;

/// A DNS server, a gRPC origin of `flavour` for `grpc.test`, and a gateway
/// with one session (source 127.0.0.2) allowed to reach it.
async fn rig(flavour: Flavour) -> Rig {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path();
    let mut table = HashMap::new();
    table.insert(
        NAME.to_string(),
        Answer::Addrs(vec!["127.0.0.1".parse::<IpAddr>().unwrap()]),
    );
    let dns = DnsServer::start(table).await;
    let ca = TestCa::new("grpc origin test CA");
    let origin_ca = path.join("origin-ca.pem");
    ca.write_pem(&origin_ca);
    let origin = GrpcOrigin::start(&ca, &[NAME], flavour).await;
    let base = TestConfig {
        dns: dns.addr,
        upstream_port: origin.addr.port(),
        anchors: vec![origin_ca],
        // The test origin lives on loopback; everything else internal stays refused.
        permit_internal: vec!["127.0.0.1/32".into()],
        ..Default::default()
    };
    Single::builder()
        .session(&[NAME])
        .start(tmp, (origin, dns), base)
        .await
}

/// A client through the gateway, as a session would make it.
async fn echo_client(rig: &Rig) -> EchoClient<Channel> {
    grpc::client_via_gateway(rig.gateway.data, SESSION_SOURCE, NAME, &rig.trust)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot connect through the gateway: {e:?}\n{}",
                rig.gateway.log()
            )
        })
}

/// The single record, once the client's connection has closed.
fn only_record(rig: &Rig) -> Value {
    let records = rig.gateway.wait_records(1);
    assert_eq!(records.len(), 1, "{records:#?}\n{}", rig.gateway.log());
    records[0].clone()
}

fn req(message: &str) -> EchoRequest {
    EchoRequest {
        message: message.to_string(),
        ..EchoRequest::default()
    }
}

/// Checks shared by every gRPC connection that reached the h2 origin.
fn assert_h2_both_sides(r: &Value, origin_port: u16) {
    assert_eq!(r["verdict"], "allowed", "{r}");
    assert_eq!(r["sni"], NAME, "{r}");
    assert_eq!(r["resolved"], format!("127.0.0.1:{origin_port}"), "{r}");
    assert_eq!(r["alpn_session"], "h2", "{r}");
    assert_eq!(r["alpn_upstream"], "h2", "{r}");
    assert!(
        r["tls_version"]
            .as_str()
            .unwrap_or_default()
            .contains("1.3"),
        "{r}"
    );
}

/// The per-request entries of a record, as (method, path, status).
fn requests_of(r: &Value) -> Vec<(String, String, u64)> {
    r["requests"]
        .as_array()
        .unwrap_or_else(|| panic!("no requests in {r}"))
        .iter()
        .map(|q| {
            (
                q["method"].as_str().unwrap_or_default().to_string(),
                q["path"].as_str().unwrap_or_default().to_string(),
                q["status"].as_u64().unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn unary_calls_share_one_connection() {
    let rig = rig(Flavour::H2).await;
    let mut client = echo_client(&rig).await;
    let reply = client
        .unary(req("hello"))
        .await
        .expect("unary")
        .into_inner();
    assert_eq!(reply.message, "hello");
    // Ten concurrent calls on the same connection: HTTP/2 streams, one TLS
    // connection through the gateway.
    let calls = (0..10).map(|i| {
        let mut c = client.clone();
        async move { c.unary(req(&format!("call {i}"))).await }
    });
    let replies = futures_join_all(calls).await;
    for (i, reply) in replies.into_iter().enumerate() {
        assert_eq!(
            reply.expect("unary").into_inner().message,
            format!("call {i}")
        );
    }
    drop(client);
    let r = only_record(&rig);
    assert_h2_both_sides(&r, rig.peers.0.addr.port());
    assert_eq!(r["request_count"], 11, "{r}");
    for (method, path, status) in requests_of(&r) {
        assert_eq!(method, "POST");
        assert_eq!(path, "/talos.test.echo.Echo/Unary");
        assert_eq!(status, 200);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn server_streaming_delivers_every_message_in_order() {
    let rig = rig(Flavour::H2).await;
    let mut client = echo_client(&rig).await;
    let mut request = req("tick");
    request.count = 100;
    let mut stream = client
        .server_stream(request)
        .await
        .expect("server stream")
        .into_inner();
    let mut got = Vec::new();
    while let Some(reply) = stream.message().await.expect("stream message") {
        got.push(reply);
    }
    assert_eq!(got.len(), 100);
    for (i, reply) in got.iter().enumerate() {
        assert_eq!(reply.index as usize, i);
        assert_eq!(reply.message, format!("tick #{i}"));
    }
    drop(stream);
    drop(client);
    let r = only_record(&rig);
    assert_h2_both_sides(&r, rig.peers.0.addr.port());
    assert_eq!(
        requests_of(&r),
        vec![(
            "POST".to_string(),
            "/talos.test.echo.Echo/ServerStream".to_string(),
            200
        )]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn client_streaming_delivers_every_message() {
    let rig = rig(Flavour::H2).await;
    let mut client = echo_client(&rig).await;
    let requests: Vec<EchoRequest> = (0..50)
        .map(|i| EchoRequest {
            message: format!("m{i}"),
            payload: vec![b'x'; 1000],
            ..EchoRequest::default()
        })
        .collect();
    let reply = client
        .client_stream(tokio_stream::iter(requests))
        .await
        .expect("client stream")
        .into_inner();
    let want: Vec<String> = (0..50).map(|i| format!("m{i}")).collect();
    assert_eq!(reply.message, want.join(","));
    assert_eq!(reply.index, 50);
    assert_eq!(reply.payload, b"50000");
    drop(client);
    let r = only_record(&rig);
    assert_h2_both_sides(&r, rig.peers.0.addr.port());
    assert_eq!(r["request_count"], 1, "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bidirectional_streaming_answers_each_message_before_the_next_is_sent() {
    let rig = rig(Flavour::H2).await;
    let mut client = echo_client(&rig).await;
    let (tx, rx) = tokio::sync::mpsc::channel::<EchoRequest>(1);
    tx.send(req("ping 0")).await.expect("first send");
    let mut replies = client
        .bidi_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("bidi stream")
        .into_inner();
    // Lock-step: each reply must arrive while the request stream is still
    // open, so nothing on the way may buffer a whole direction.
    for i in 0..20u32 {
        let reply = replies
            .message()
            .await
            .expect("bidi message")
            .expect("a reply before the request stream ends");
        assert_eq!(reply.index, i);
        assert_eq!(reply.message, format!("re: ping {i}"));
        if i + 1 < 20 {
            tx.send(req(&format!("ping {}", i + 1)))
                .await
                .expect("send");
        }
    }
    drop(tx);
    assert!(replies.message().await.expect("clean end").is_none());
    drop(replies);
    drop(client);
    let r = only_record(&rig);
    assert_h2_both_sides(&r, rig.peers.0.addr.port());
    assert_eq!(r["request_count"], 1, "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_error_status_in_trailers_reaches_the_client_whole() {
    let rig = rig(Flavour::H2).await;
    let mut client = echo_client(&rig).await;
    let mut request = req("nope");
    request.fail_with = Code::PermissionDenied as u32;
    let status = client
        .unary(request)
        .await
        .expect_err("the origin answers with an error status");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(status.message(), "nope");
    let md = status.metadata();
    assert_eq!(
        md.get(grpc::ERROR_DETAIL_KEY).and_then(|v| v.to_str().ok()),
        Some(grpc::ERROR_DETAIL),
        "{status:?}"
    );
    assert_eq!(
        md.get_bin(grpc::ERROR_BIN_KEY)
            .and_then(|v| v.to_bytes().ok())
            .as_deref(),
        Some(grpc::ERROR_BIN),
        "{status:?}"
    );
    assert!(
        md.get("hangar-refusal").is_none(),
        "an origin's status is no refusal"
    );
    // The connection stays usable after an error status.
    let reply = client
        .unary(req("after"))
        .await
        .expect("unary")
        .into_inner();
    assert_eq!(reply.message, "after");
    drop(client);
    let r = only_record(&rig);
    assert_h2_both_sides(&r, rig.peers.0.addr.port());
    for q in r["requests"].as_array().expect("requests") {
        assert!(q["refusal"].is_null(), "{r}");
        assert_eq!(q["status"], 200, "gRPC statuses ride on HTTP 200: {r}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_three_mebibyte_message_crosses_both_ways() {
    let rig = rig(Flavour::H2).await;
    let mut client = echo_client(&rig).await;
    let payload: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let reply = client
        .unary(EchoRequest {
            message: "big".into(),
            payload: payload.clone(),
            ..EchoRequest::default()
        })
        .await
        .expect("large unary")
        .into_inner();
    assert_eq!(reply.payload.len(), payload.len());
    assert!(reply.payload == payload, "payload changed on the way");
    drop(client);
    let r = only_record(&rig);
    assert_h2_both_sides(&r, rig.peers.0.addr.port());
    for key in ["bytes_from_session", "bytes_to_session"] {
        assert!(
            r[key].as_u64().unwrap_or_default() > 3 * 1024 * 1024,
            "{key}: {r}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_to_an_http1_destination_is_refused_with_a_readable_status() {
    let rig = rig(Flavour::Http1Only).await;
    let mut client = echo_client(&rig).await;
    let status = client
        .unary(req("hello"))
        .await
        .expect_err("gRPC cannot cross to an HTTP/1.1 destination");
    assert_ne!(status.code(), Code::Ok);
    assert_eq!(
        status
            .metadata()
            .get("hangar-refusal")
            .and_then(|v| v.to_str().ok()),
        Some("grpc_needs_http2"),
        "the refusal must reach the client as metadata: {status:?}\n{}",
        rig.gateway.log()
    );
    drop(client);
    let r = only_record(&rig);
    assert_eq!(
        r["verdict"], "allowed",
        "the connection passed the gate: {r}"
    );
    assert_eq!(r["alpn_session"], "h2", "{r}");
    assert_eq!(r["alpn_upstream"], "http/1.1", "{r}");
    let requests = r["requests"].as_array().expect("requests");
    assert_eq!(requests.len(), 1, "{r}");
    assert_eq!(requests[0]["refusal"], "grpc_needs_http2", "{r}");
    assert_eq!(requests[0]["path"], "/talos.test.echo.Echo/Unary", "{r}");
}

/// The rig without the gateway: the h2 origin answers a direct tonic
/// client, and the HTTP/1.1-only origin answers curl over HTTP/1.1. A
/// failure here is the rig's, not the gateway's.
#[tokio::test(flavor = "multi_thread")]
async fn the_test_origins_work_without_the_gateway() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("grpc origin test CA");
    let ca_pem = dir.path().join("origin-ca.pem");
    ca.write_pem(&ca_pem);

    let h2 = GrpcOrigin::start(&ca, &[NAME], Flavour::H2).await;
    let mut client = grpc::client_via_gateway(h2.addr, "127.0.0.1", NAME, &ca_pem)
        .await
        .expect("direct connect");
    let reply = client
        .unary(req("direct"))
        .await
        .expect("unary")
        .into_inner();
    assert_eq!(reply.message, "direct");

    let h1 = GrpcOrigin::start(&ca, &[NAME], Flavour::Http1Only).await;
    let resolve = format!("{NAME}:{}:127.0.0.1", h1.addr.port());
    let url = format!(
        "https://{NAME}:{}/talos.test.echo.Echo/Unary",
        h1.addr.port()
    );
    let out = talos_e2e::clients::run_bounded(
        "curl",
        &[
            "-sS",
            "--max-time",
            "10",
            "--cacert",
            ca_pem.to_str().unwrap(),
            "--resolve",
            &resolve,
            "-o",
            "/dev/null",
            "-w",
            "%{http_version}",
            &url,
        ],
        None,
        20,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout,
        "1.1",
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs every future to completion concurrently; results in input order.
async fn futures_join_all<F: std::future::Future + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}
