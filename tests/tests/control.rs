//! The control channel, end to end: the test plays the control plane. It
//! opens a session's authority on a gateway that has no static session,
//! reaches a destination through it with the CA it got back (the attached
//! credential injected), closes the authority while a connection is open
//! (the connection is cut `session_ended`, the source becomes unknown, the
//! signed drop report names the CA and the secret), and checks that
//! nothing on the channel answers a client without a certificate from the
//! control CA.

use std::time::Duration;

use serde_json::Value;
use sha2::Digest;
use talos_certs::{Kind, Signed};
use talos_e2e::clients::http;
use talos_e2e::clients::{curl_via, SESSION_SOURCE};
use talos_e2e::control::gateway_client;
use talos_e2e::origin::TestCa;
use talos_e2e::rig::Single;
use talos_gateway::pb;
use tonic::Code;

const SECRET: &str = "c0ntrol-s3cret-T0ken-0123456789";
const API: &str = "api.test";

/// A gateway with a control channel and no static session, in front of
/// an origin for `api.test`.
async fn rig() -> Single {
    Single::builder().control().start_loopback(&[API]).await
}

fn open_request(id: &str, attempt: u32, source: &str) -> pb::OpenSessionRequest {
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
        cause: "launch".into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn open_then_close_cuts_connections_and_signs_a_drop_report() {
    let rig = rig().await;
    let mut client = rig.client();
    let me = client
        .describe(pb::DescribeRequest {})
        .await
        .expect("describe")
        .into_inner();
    assert_eq!(me.gateway_id, "gw-test");
    let public_key: [u8; 32] = me.public_key.as_slice().try_into().expect("32-byte key");
    assert_eq!(me.key_id, talos_certs::key_id_for(&public_key));
    let mode = std::fs::metadata(&rig.pki().files.signing_key_file)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
        .expect("signing key made");
    assert_eq!(mode, 0o600);

    // Open, then reach the destination with the CA the gateway returned.
    let opened = client
        .open_session(open_request("sess-c", 1, SESSION_SOURCE))
        .await
        .expect("open")
        .into_inner();
    assert_eq!(opened.gateway_id, "gw-test");
    assert_eq!(opened.ca_digest.len(), 96);
    let ca_path = rig.dir.join("session-ca.pem");
    std::fs::write(&ca_path, &opened.ca_pem).unwrap();
    let got = curl_via(rig.gateway.data, &ca_path, API, "/echo", &["--http1.1"]);
    assert_eq!(got.status, 200, "{}", rig.gateway.log());
    let echo: Value = serde_json::from_slice(&got.body).unwrap();
    let want = hex::encode(sha2::Sha256::digest(format!("Bearer {SECRET}")));
    assert_eq!(echo["sha256"]["authorization"], want, "attachment injected");
    let records = rig.gateway.wait_records(1);
    assert_eq!(records[0]["verdict"], "allowed", "{}", records[0]);
    assert_eq!(records[0]["session_id"], "sess-c");

    // An HTTP/2 connection stays open across the close.
    let mut open = http::connect(SESSION_SOURCE, rig.gateway.data, API, &ca_path, true).await;
    let get = || {
        hyper::Request::get(format!("https://{API}/"))
            .body(http::empty())
            .unwrap()
    };
    let resp = open.send(get()).await.expect("request before close");
    assert_eq!(resp.status(), 200);

    let closed = client
        .close_session(pb::CloseSessionRequest {
            session_id: "sess-c".into(),
            attempt: 1,
            reason: "pause".into(),
        })
        .await
        .expect("close")
        .into_inner();
    assert_eq!(closed.connections_closed, 1);
    assert_eq!(closed.approvals_withdrawn, 0);

    // The open connection ends, and its record says why.
    let after = tokio::time::timeout(Duration::from_secs(10), open.send(get())).await;
    assert!(
        matches!(after, Ok(Err(_))),
        "the connection should be closed"
    );
    let records = rig.gateway.wait_records(2);
    assert_eq!(records.len(), 2, "{records:?}");
    assert_eq!(records[1]["verdict"], "session_ended", "{}", records[1]);
    assert_eq!(records[1]["session_id"], "sess-c");

    // The source is no session's any more.
    let code = curl_via(rig.gateway.data, &ca_path, API, "/echo", &[]).status;
    assert_eq!(code, 0);
    let records = rig.gateway.wait_records(3);
    assert_eq!(records[2]["verdict"], "unknown_source", "{}", records[2]);

    // The drop report verifies under the key Describe gave, and names
    // what was opened.
    let signed = closed.drop_report.expect("drop report");
    assert_eq!(signed.kind, "drop_report");
    let signed = Signed {
        kind: Kind::DropReport,
        key_id: signed.key_id,
        payload: signed.payload,
        signature: signed.signature,
    };
    let report = talos_certs::verify_drop_report(&public_key, &signed).expect("verifies");
    assert_eq!(report.gateway_id, "gw-test");
    assert_eq!(report.session_id, "sess-c");
    assert_eq!(report.attempt, 1);
    assert_eq!(report.reason, talos_certs::DropReason::Pause);
    assert!(talos_certs::confirms(
        &report,
        &opened.ca_digest,
        &["API_TOKEN"]
    ));

    // Closing again (a retry whose answer was lost) answers the same
    // signed report; an open of that attempt again is refused, and so is
    // a close of an attempt never held; a wrong attempt is refused.
    let again = client
        .close_session(pb::CloseSessionRequest {
            session_id: "sess-c".into(),
            attempt: 1,
            reason: "end".into(),
        })
        .await
        .expect("a repeated close answers the report again")
        .into_inner();
    let again = again.drop_report.expect("drop report");
    assert_eq!(again.payload, signed.payload);
    assert_eq!(again.signature, signed.signature);
    let reopen = client
        .open_session(open_request("sess-c", 1, SESSION_SOURCE))
        .await
        .expect_err("an ended attempt never comes back");
    assert_eq!(reopen.code(), Code::FailedPrecondition);
    assert!(reopen.message().starts_with("attempt:"), "{reopen:?}");
    let never = client
        .close_session(pb::CloseSessionRequest {
            session_id: "sess-c".into(),
            attempt: 7,
            reason: "end".into(),
        })
        .await
        .expect_err("never held");
    assert_eq!(never.code(), Code::NotFound);
    client
        .open_session(open_request("sess-d", 2, "127.0.0.5"))
        .await
        .expect("open");
    let wrong = client
        .close_session(pb::CloseSessionRequest {
            session_id: "sess-d".into(),
            attempt: 1,
            reason: "end".into(),
        })
        .await
        .expect_err("wrong attempt");
    assert_eq!(wrong.code(), Code::FailedPrecondition);
    assert!(wrong.message().starts_with("attempt:"), "{wrong:?}");
    let older = client
        .open_session(open_request("sess-d", 1, "127.0.0.5"))
        .await
        .expect_err("an older attempt does not displace a newer one");
    assert_eq!(older.code(), Code::FailedPrecondition);

    // No log line holds the value.
    assert!(!rig.gateway.log().contains(SECRET));

    // A control client still connected does not hold up a clean stop.
    let mut rig = rig;
    assert!(rig.gateway.stop(), "{}", rig.gateway.log());
    drop(client);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_newer_open_replaces_the_sources_authority() {
    let rig = rig().await;
    let mut client = rig.client();
    let first = client
        .open_session(open_request("sess-r", 1, SESSION_SOURCE))
        .await
        .expect("open")
        .into_inner();
    let second = client
        .open_session(open_request("sess-r", 2, SESSION_SOURCE))
        .await
        .expect("resume")
        .into_inner();
    assert_ne!(first.ca_digest, second.ca_digest, "a fresh CA");
    let ca_path = rig.dir.join("session-ca.pem");
    std::fs::write(&ca_path, &first.ca_pem).unwrap();
    let code = curl_via(rig.gateway.data, &ca_path, API, "/", &[]).status;
    assert_eq!(code, 0, "the old CA is no longer served");
    std::fs::write(&ca_path, &second.ca_pem).unwrap();
    let code = curl_via(rig.gateway.data, &ca_path, API, "/", &[]).status;
    assert_eq!(code, 200);
    // Attempt 1 was ended by the newer open: a close of it answers that
    // end's signed report, reason `replaced`.
    let old = client
        .close_session(pb::CloseSessionRequest {
            session_id: "sess-r".into(),
            attempt: 1,
            reason: "end".into(),
        })
        .await
        .expect("attempt 1's end has its report")
        .into_inner()
        .drop_report
        .expect("drop report");
    let old: talos_certs::DropReport = serde_json::from_slice(&old.payload).expect("a report");
    assert_eq!(old.reason, talos_certs::DropReason::Replaced);
    assert_eq!(old.ca_digest, first.ca_digest);
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_open_requests_name_the_field() {
    let rig = rig().await;
    let mut client = rig.client();
    type Edit = fn(&mut pb::OpenSessionRequest);
    let cases: &[(&str, Edit)] = &[
        ("session_id", |r| r.session_id = "has space".into()),
        ("attempt", |r| r.attempt = 0),
        ("tenant", |r| r.tenant.clear()),
        ("sources", |r| r.sources.clear()),
        ("sources[0]", |r| r.sources = vec!["not-an-ip".into()]),
        ("allowlist[0]", |r| r.allowlist = vec!["10.0.0.1".into()]),
        ("allowlist[1]", |r| r.allowlist.push(API.to_uppercase())),
        ("attachments[0].destination", |r| {
            r.attachments[0].destination = "other.test".into()
        }),
        ("attachments[0].header", |r| {
            r.attachments[0].header = "x:y".into()
        }),
        ("attachments[0]", |r| {
            r.attachments[0].header = "host".into()
        }),
        ("attachments[0].value", |r| {
            r.attachments[0].value = format!("{SECRET}\r\nInjected: yes").into_bytes()
        }),
        ("attachments[0].value", |r| r.attachments[0].value.clear()),
        ("attachments[1].header", |r| {
            let again = r.attachments[0].clone();
            r.attachments.push(again)
        }),
    ];
    for (field, edit) in cases {
        let mut req = open_request("sess-bad", 1, SESSION_SOURCE);
        edit(&mut req);
        let status = client
            .open_session(req)
            .await
            .expect_err("invalid request refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert!(
            status.message().starts_with(&format!("{field}:")),
            "{field}: {status:?}"
        );
        assert!(!status.message().contains(SECRET), "{status:?}");
    }
    // Nothing was opened.
    let code = curl_via(rig.gateway.data, &rig.pki().files.ca_file, API, "/", &[]).status;
    assert_eq!(code, 0);
    let records = rig.gateway.wait_records(1);
    assert_eq!(records[0]["verdict"], "unknown_source");
}

#[tokio::test(flavor = "multi_thread")]
async fn clients_without_a_control_certificate_cannot_call() {
    let rig = rig().await;
    let addr = rig.gateway.control.expect("control listener");
    let stranger = TestCa::new("another CA");
    let not_ours = stranger.leaf_pem(&["control-plane.control.test"]);
    for (what, identity) in [("no certificate", None), ("another CA", Some(not_ours))] {
        let mut client = gateway_client(addr, &rig.pki().ca.cert_pem, identity);
        let refused = client.describe(pb::DescribeRequest {}).await;
        assert!(refused.is_err(), "{what}: {refused:?}");
        let refused = client
            .open_session(open_request("sess-x", 1, SESSION_SOURCE))
            .await;
        assert!(refused.is_err(), "{what}: {refused:?}");
    }
    assert!(
        rig.gateway.log().contains("control handshake failed"),
        "{}",
        rig.gateway.log()
    );
    // The other member of the pair has a certificate from the same CA,
    // with the gateway role: every call is refused PERMISSION_DENIED, so it
    // can neither open, replace, close nor renew a session here.
    let mut peer = gateway_client(
        addr,
        &rig.pki().ca.cert_pem,
        Some(rig.pki().peer_gateway_identity()),
    );
    let opened = peer
        .open_session(open_request("sess-peer", 1, SESSION_SOURCE))
        .await
        .expect_err("a peer gateway cannot open");
    assert_eq!(opened.code(), Code::PermissionDenied, "{opened:?}");
    for status in [
        peer.describe(pb::DescribeRequest {}).await.map(|_| ()),
        peer.close_session(pb::CloseSessionRequest {
            session_id: "sess-peer".into(),
            attempt: 1,
            reason: "end".into(),
        })
        .await
        .map(|_| ()),
        peer.renew_leases(pb::RenewLeasesRequest::default())
            .await
            .map(|_| ()),
    ] {
        assert_eq!(status.unwrap_err().code(), Code::PermissionDenied);
    }
    assert!(
        rig.gateway.log().contains("not the control plane's"),
        "{}",
        rig.gateway.log()
    );
    let code = curl_via(rig.gateway.data, &rig.pki().files.ca_file, API, "/", &[]).status;
    assert_eq!(code, 0, "no session was opened");
    // The control plane's certificate is served.
    rig.client()
        .describe(pb::DescribeRequest {})
        .await
        .expect("describe");
}

/// A renewal's leases run from when the control plane read the store
/// (`read_at_unix_ms`), not from when it arrives: one held up on its way
/// grants only what is left of it, one a lease old or older is refused
/// `FAILED_PRECONDITION` (`stale_renewal`) and renews nothing, and one
/// with no time is refused `INVALID_ARGUMENT`.
#[tokio::test(flavor = "multi_thread")]
async fn a_renewal_runs_from_when_the_control_plane_read_the_store() {
    let rig = rig().await;
    let mut client = rig.client();
    client
        .open_session(open_request("sess-r", 1, SESSION_SOURCE))
        .await
        .expect("open");
    let now_ms = || {
        u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap()
    };
    let lease = |read_at_unix_ms| pb::RenewLeasesRequest {
        leases: vec![pb::SessionAttempt {
            session_id: "sess-r".into(),
            attempt: 1,
        }],
        read_at_unix_ms,
        ..Default::default()
    };
    // Fresh: renewed, and the reply says the lease's length.
    let fresh = client
        .renew_leases(lease(now_ms()))
        .await
        .expect("renew")
        .into_inner();
    assert_eq!(fresh.renewed.len(), 1, "{fresh:?}");
    let lease_ms = fresh.lease_ms;
    assert!(lease_ms >= 10_000, "{fresh:?}");

    let undated = client.renew_leases(lease(0)).await.unwrap_err();
    assert_eq!(undated.code(), Code::InvalidArgument, "{undated:?}");
    let stale = client
        .renew_leases(lease(now_ms() - lease_ms - 1_000))
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition, "{stale:?}");
    assert!(stale.message().contains("stale_renewal"), "{stale:?}");
    assert_eq!(
        rig.gateway
            .metric("gateway_renewals_refused_total{cause=\"stale\"}"),
        Some(1.0)
    );

    // Held up for all but 5 s of the lease: renewed, with about 5 s left
    // (the lease-left gauge is refreshed at least every second).
    let late = client
        .renew_leases(lease(now_ms() - (lease_ms - 5_000)))
        .await
        .expect("renew late")
        .into_inner();
    assert_eq!(late.renewed.len(), 1, "{late:?}");
    // The fresh renewal above still stands (a renewal never shortens a
    // lease); the next fresh one is what moves it on.
    let left = talos_e2e::wait::until("the lease-left gauge refreshed", || {
        match rig.gateway.metric("gateway_lease_seconds_left_min") {
            Some(l) if l >= 0.0 => Ok(l),
            other => Err(other),
        }
    });
    assert!(left > 5.0, "{left}");
}

/// A TLS client that keeps one context (and so its session tickets)
/// across connections, driven line by line: `trust PATH` adds a CA;
/// `connect SOURCE save|use|none` makes one connection from SOURCE (with
/// the saved ticket for `use`), one GET, and prints `reused STATUS` or
/// `failed ERROR`; `save` keeps the ticket it got.
const RESUMING_CLIENT: &str = r#"
import socket, ssl, sys
port, name = int(sys.argv[1]), sys.argv[2]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.minimum_version = ssl.TLSVersion.TLSv1_3
saved = None
for line in sys.stdin:
    words = line.split()
    if words[0] == "trust":
        ctx.load_verify_locations(cafile=words[1])
        print("ok", flush=True)
        continue
    _, source, how = words
    try:
        raw = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
        s = ctx.wrap_socket(raw, server_hostname=name, session=saved if how == "use" else None)
        s.sendall(("GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % name).encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        status = data.split(b" ")[1].decode() if data else "none"
        if how == "save":
            saved = s.session
        print("reused" if s.session_reused else "full", status, flush=True)
        s.close()
    except Exception as e:
        print("failed", type(e).__name__, flush=True)
"#;

/// TLS 1.3 resumption is offered to a session's clients, bound to its
/// authority: each authority's server config keeps its own resumption
/// state in memory, dropped with it. A ticket resumes within the
/// authority; in another session (from its source), or in the next
/// attempt of the same session, the same ticket gets a full handshake;
/// after the close, nothing is served at all.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_ticket_resumes_only_in_its_own_authority() {
    use std::io::{BufRead, BufReader, Write};
    const OTHER_SOURCE: &str = "127.0.0.3";
    let rig = rig().await;
    let mut client = rig.client();
    let ca1 = rig
        .open(open_request("sess-r", 1, SESSION_SOURCE), "r1.pem")
        .await;
    let other = rig
        .open(open_request("sess-o", 1, OTHER_SOURCE), "o1.pem")
        .await;

    let mut py = std::process::Command::new("python3")
        .args(["-c", RESUMING_CLIENT])
        .arg(rig.gateway.data.port().to_string())
        .arg(API)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut input = py.stdin.take().expect("stdin");
    let mut output = BufReader::new(py.stdout.take().expect("stdout"));
    let mut ask = |line: String| {
        writeln!(input, "{line}").expect("to the client");
        let mut answer = String::new();
        output.read_line(&mut answer).expect("from the client");
        answer.trim().to_owned()
    };
    for ca in [&ca1, &other] {
        assert_eq!(ask(format!("trust {}", ca.display())), "ok");
    }
    assert_eq!(ask(format!("connect {SESSION_SOURCE} save")), "full 200");
    assert_eq!(
        ask(format!("connect {SESSION_SOURCE} use")),
        "reused 200",
        "resumed in its authority"
    );
    assert_eq!(
        ask(format!("connect {OTHER_SOURCE} use")),
        "full 200",
        "another session's authority does not know the ticket"
    );
    // The next attempt: a new authority, a new CA.
    let ca2 = rig
        .open(open_request("sess-r", 2, SESSION_SOURCE), "r2.pem")
        .await;
    assert_eq!(ask(format!("trust {}", ca2.display())), "ok");
    assert_eq!(
        ask(format!("connect {SESSION_SOURCE} use")),
        "full 200",
        "attempt 2 does not resume attempt 1's ticket"
    );
    assert_eq!(ask(format!("connect {SESSION_SOURCE} save")), "full 200");
    assert_eq!(ask(format!("connect {SESSION_SOURCE} use")), "reused 200");
    // Closed: the source is no session's; the ticket opens nothing.
    client
        .close_session(pb::CloseSessionRequest {
            session_id: "sess-r".into(),
            attempt: 2,
            reason: "end".into(),
        })
        .await
        .expect("close");
    let after = ask(format!("connect {SESSION_SOURCE} use"));
    assert!(after.starts_with("failed"), "after the close: {after}");
    drop(input);
    let _ = py.wait();
    let records = rig.gateway.records();
    assert_eq!(
        records.last().map(|r| r["verdict"].clone()),
        Some(Value::from("unknown_source"))
    );
}
