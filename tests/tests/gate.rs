//! The connection gate end to end: the `gateway` binary started from a
//! config file, real clients (curl, openssl, raw sockets) from session and
//! non-session source addresses on loopback, a real DNS server and a real
//! TLS origin. Every refusal must appear in the records with its reason.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;

use serde_json::Value;
use talos_e2e::clients::{self, admin_get, run_bounded, SESSION_SOURCE, UNKNOWN_SOURCE};
use talos_e2e::dns::Answer;
use talos_e2e::gateway::workspace_bin;
use talos_e2e::origin::LoopbackOrigin;
use talos_e2e::rig::Single;

/// Names the test DNS server knows, and what it answers.
fn dns_table() -> HashMap<String, Answer> {
    let addrs =
        |list: &[&str]| Answer::Addrs(list.iter().map(|a| a.parse::<IpAddr>().unwrap()).collect());
    let mut t = HashMap::new();
    t.insert("allowed.test".into(), addrs(&["127.0.0.1"]));
    t.insert("internal-v4.test".into(), addrs(&["10.0.0.1"]));
    t.insert("internal-v6.test".into(), addrs(&["::1"]));
    t.insert(
        "metadata-mapped.test".into(),
        addrs(&["::ffff:169.254.169.254"]),
    );
    t.insert("nat64.test".into(), addrs(&["64:ff9b::a00:1"]));
    t.insert("cgnat.test".into(), addrs(&["100.64.1.1"]));
    // One public-looking answer beside an internal one: refused all the same.
    t.insert("mixed.test".into(), addrs(&["127.0.0.1", "fd00:ec2::254"]));
    t.insert("silent.test".into(), Answer::Silent);
    t
}

const ALLOWLIST: &[&str] = &[
    "allowed.test",
    "internal-v4.test",
    "internal-v6.test",
    "metadata-mapped.test",
    "nat64.test",
    "cgnat.test",
    "mixed.test",
    "silent.test",
    "nxdomain.test",
];

/// The origin for `allowed.test` and the DNS server of [`dns_table`]
/// behind a gateway with one session from the session source, allowed
/// [`ALLOWLIST`].
async fn rig() -> Single {
    let tmp = tempfile::tempdir().expect("tempdir");
    let peers = LoopbackOrigin::serving_with(tmp.path(), &["allowed.test"], dns_table()).await;
    let base = peers.config();
    Single::builder()
        .session(ALLOWLIST)
        .start(tmp, peers, base)
        .await
}

/// The path every curl below asks for: its query must reach no record.
const PATH: &str = "/some/path?q=secret-query";

/// curl through the gateway to `name`, from `source`, trusting only the
/// session CA, at most 10 s; (exit code, body, stderr).
fn curl(rig: &Single, source: &str, name: &str, extra: &[&str]) -> (i32, String, String) {
    let got = rig
        .curl_to(name)
        .from(source)
        .max_time(10)
        .args(extra)
        .run(PATH);
    (got.exit, got.text(), got.stderr)
}

/// The one record `pick` picks among the first `n`.
fn record_for(rig: &Single, n: usize, pick: impl Fn(&Value) -> bool) -> Value {
    let records = rig.gateway.wait_records(n);
    let found: Vec<&Value> = records.iter().filter(|r| pick(r)).collect();
    assert_eq!(
        found.len(),
        1,
        "expected one matching record in {records:#?}"
    );
    found[0].clone()
}

fn sni_is(name: &'static str) -> impl Fn(&Value) -> bool {
    move |r: &Value| r["sni"] == name
}

fn assert_no_query_or_secret(records: &[Value]) {
    for r in records {
        let text = r.to_string();
        assert!(
            !text.contains("secret-query"),
            "a query string reached a record: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn allowed_name_reaches_the_origin_at_the_checked_address() {
    let rig = rig().await;
    for (i, (version, upstream)) in [("--http1.1", "HTTP/1.1"), ("--http2", "HTTP/2.0")]
        .into_iter()
        .enumerate()
    {
        let (code, body, err) = curl(&rig, SESSION_SOURCE, "allowed.test", &[version]);
        assert_eq!(
            code,
            0,
            "curl {version} failed: {err}\n{}",
            rig.gateway.log()
        );
        assert!(body.starts_with("origin says hello"), "{body}");
        // The request went on in the session's protocol (the destination
        // speaks both).
        assert!(
            body.contains(&format!("{upstream} GET /some/path")),
            "{body}"
        );
        rig.gateway.wait_records(i + 1);
    }
    let records = rig.gateway.wait_records(2);
    assert_eq!(records.len(), 2);
    for r in &records {
        assert_eq!(r["verdict"], "allowed", "{r}");
        assert_eq!(r["session_id"], "sess-1");
        assert_eq!(r["tenant"], "acme");
        assert_eq!(r["attempt"], 1);
        assert_eq!(r["sni"], "allowed.test");
        assert_eq!(
            r["resolved"],
            format!("127.0.0.1:{}", rig.peers.origin.addr.port())
        );
        assert!(r["source"].as_str().unwrap().starts_with("127.0.0.2:"));
        assert!(r["bytes_from_session"].as_u64().unwrap() > 200, "{r}");
        assert!(r["bytes_to_session"].as_u64().unwrap() > 200, "{r}");
        assert!(r["opened_at"].as_str().unwrap().ends_with('Z'));
        assert!(r["closed_at"].as_str().unwrap() >= r["opened_at"].as_str().unwrap());
    }
    assert_eq!(
        records[1]["alpn_offered"],
        serde_json::json!(["h2", "http/1.1"])
    );
    assert_no_query_or_secret(&records);
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_source_is_refused() {
    let rig = rig().await;
    let (code, _, _) = curl(&rig, UNKNOWN_SOURCE, "allowed.test", &[]);
    assert_ne!(code, 0);
    let r = record_for(&rig, 1, |_| true);
    assert_eq!(r["verdict"], "unknown_source");
    assert!(r["session_id"].is_null());
    assert!(r["source"].as_str().unwrap().starts_with("127.0.0.9:"));
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_http_is_not_tls() {
    let rig = rig().await;
    let url = format!("http://allowed.test:{}/", rig.gateway.data.port());
    let resolve = format!("allowed.test:{}:127.0.0.1", rig.gateway.data.port());
    let out = run_bounded(
        "curl",
        &[
            "-sS",
            "--max-time",
            "10",
            "--interface",
            SESSION_SOURCE,
            "--resolve",
            &resolve,
            &url,
        ],
        None,
        20,
    );
    assert!(!out.status.success());
    let r = record_for(&rig, 1, |_| true);
    assert_eq!(r["verdict"], "not_tls", "{r}");
    assert_eq!(r["session_id"], "sess-1");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hello_without_server_name_is_refused_with_an_alert() {
    let rig = rig().await;
    let out = clients::s_client(rig.gateway.data, SESSION_SOURCE, &["-noservername"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unrecognized name"),
        "openssl saw: {stderr}"
    );
    let r = record_for(&rig, 1, |_| true);
    assert_eq!(r["verdict"], "no_server_name", "{r}");
    assert!(r["sni"].is_null());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hello_with_ech_is_refused() {
    let rig = rig().await;
    let hello = std::fs::read(testdata("crafted-curl-http2-ech.bin")).expect("ech capture");
    let got = clients::send_and_read(SESSION_SOURCE, rig.gateway.data, &hello).await;
    assert_eq!(
        got,
        [21, 3, 3, 0, 2, 2, 40],
        "expected a handshake_failure alert"
    );
    let r = record_for(&rig, 1, |_| true);
    assert_eq!(r["verdict"], "encrypted_client_hello", "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_name_off_the_allowlist_is_refused() {
    let rig = rig().await;
    let (code, _, err) = curl(&rig, SESSION_SOURCE, "Other.Example.", &[]);
    assert_ne!(code, 0);
    assert!(
        err.contains("unrecognized name") || err.contains("alert"),
        "{err}"
    );
    let r = record_for(&rig, 1, |_| true);
    assert_eq!(r["verdict"], "not_on_allowlist", "{r}");
    assert_eq!(
        r["sni"], "other.example",
        "the record holds the canonical name"
    );
    assert!(r["resolved"].is_null());
}

#[tokio::test(flavor = "multi_thread")]
async fn names_that_resolve_inside_are_refused() {
    let rig = rig().await;
    let cases = [
        ("internal-v4.test", "10.0.0.1", "internal:private"),
        ("internal-v6.test", "::1", "internal:loopback"),
        (
            "metadata-mapped.test",
            "::ffff:169.254.169.254",
            "internal:cloud_metadata",
        ),
        ("nat64.test", "64:ff9b::a00:1", "internal:private"),
        ("cgnat.test", "100.64.1.1", "internal:"),
        ("mixed.test", "fd00:ec2::254", "internal:cloud_metadata"),
    ];
    for (name, _, _) in cases {
        let (code, _, _) = curl(&rig, SESSION_SOURCE, name, &[]);
        assert_ne!(code, 0, "{name} must be refused");
    }
    for (i, (name, addr, cause)) in cases.into_iter().enumerate() {
        let records = rig.gateway.wait_records(i + 1);
        let r = records
            .iter()
            .find(|r| r["sni"] == name)
            .unwrap_or_else(|| panic!("no record for {name}: {records:#?}"));
        assert_eq!(r["verdict"], "resolves_internal", "{r}");
        let answer: IpAddr = r["internal_answer"].as_str().unwrap().parse().unwrap();
        assert_eq!(answer, addr.parse::<IpAddr>().unwrap(), "{r}");
        assert!(r["cause"].as_str().unwrap().starts_with(cause), "{r}");
        assert!(r["resolved"].is_null(), "nothing was connected: {r}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn unresolvable_names_fail_cleanly() {
    let rig = rig().await;
    for name in ["nxdomain.test", "silent.test"] {
        let (code, _, _) = curl(&rig, SESSION_SOURCE, name, &[]);
        assert_ne!(code, 0);
    }
    let nx = record_for(&rig, 2, sni_is("nxdomain.test"));
    assert_eq!(nx["verdict"], "upstream_failed");
    assert_eq!(nx["cause"], "nxdomain");
    let silent = record_for(&rig, 2, sni_is("silent.test"));
    assert_eq!(silent["verdict"], "upstream_failed");
    assert_eq!(silent["cause"], "resolver_timeout");
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_and_endless_senders_are_cut_off() {
    let rig = rig().await;
    // Half a record header, then silence: cut at the hello deadline.
    let started = std::time::Instant::now();
    let got = clients::send_and_read(SESSION_SOURCE, rig.gateway.data, &[22, 3, 1]).await;
    assert!(got.is_empty());
    assert!(started.elapsed() < std::time::Duration::from_secs(8));
    // A record header announcing a hello bigger than the limit.
    let mut huge = vec![22, 3, 1, 0x40, 0x00, 1, 0, 0x3f, 0xfc];
    huge.resize(9 + 100, 0);
    clients::send_and_read(SESSION_SOURCE, rig.gateway.data, &huge).await;
    let records = rig.gateway.wait_records(2);
    assert_eq!(records.len(), 2);
    for r in &records {
        assert_eq!(r["verdict"], "not_tls", "{r}");
    }
    assert_eq!(records[0]["cause"], "hello_timeout", "{:#?}", records);
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_and_exits_cleanly() {
    let mut rig = rig().await;
    let (code, _, err) = curl(&rig, SESSION_SOURCE, "allowed.test", &[]);
    assert_eq!(code, 0, "{err}");
    assert!(rig.gateway.stop(), "gateway must exit 0 on SIGTERM");
    assert_eq!(rig.gateway.records().len(), 1);
    let log = rig.gateway.log();
    assert!(log.contains("draining") && log.contains("stopped"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_listener_serves_metrics_and_health() {
    let rig = rig().await;
    let _ = curl(&rig, SESSION_SOURCE, "not-listed.test", &[]);
    rig.gateway.wait_records(1);
    let (_, text) = admin_get(rig.gateway.admin, "/metrics");
    assert!(
        text.contains("gateway_connections_total{verdict=\"not_on_allowlist\"} 1"),
        "{text}"
    );
    let (status, body) = admin_get(rig.gateway.admin, "/readyz");
    assert_eq!(status, 200, "{body}");
}

fn testdata(file: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../gateway/testdata/hellos")
        .join(file)
}

#[test]
fn check_config_accepts_the_example_and_names_the_line_at_fault() {
    let gw = workspace_bin("gateway");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops/gateway.example.toml");
    let ok = run_bounded(
        gw.to_str().unwrap(),
        &["check-config", example.to_str().unwrap()],
        None,
        10,
    );
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("sbx-0001"));

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    let example_text = std::fs::read_to_string(&example).unwrap();
    // The line the error must name: where the example lists the address.
    let line = 1 + example_text
        .lines()
        .position(|l| l.contains("\"10.20.0.5\""))
        .expect("the example's session source");
    let text = example_text.replace("10.20.0.5", "10.20.0.500");
    std::fs::write(&bad, text).unwrap();
    let out = run_bounded(
        gw.to_str().unwrap(),
        &["check-config", bad.to_str().unwrap()],
        None,
        10,
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let at = format!("bad.toml:{line}: session[0].sources: ");
    assert!(err.contains(&at), "{err}");

    // `run` refuses it the same way, before binding anything.
    let out = run_bounded(
        gw.to_str().unwrap(),
        &["run", "--config", bad.to_str().unwrap()],
        None,
        10,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&at));
}

#[test]
fn classify_and_inspect_hello_use_the_data_path_code() {
    let gw = workspace_bin("gateway");
    let out = run_bounded(
        gw.to_str().unwrap(),
        &[
            "classify",
            "8.8.8.8",
            "127.1",
            "::ffff:169.254.169.254",
            "2002:a00:1::1",
        ],
        None,
        10,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "8.8.8.8 public",
            "127.1 internal loopback",
            "::ffff:169.254.169.254 internal cloud_metadata",
            "2002:a00:1::1 internal private"
        ]
    );
    let out = run_bounded(gw.to_str().unwrap(), &["classify", "300.1.1.1"], None, 10);
    assert_eq!(out.status.code(), Some(2));

    let ech = testdata("crafted-curl-http2-ech.bin");
    let out = run_bounded(
        gw.to_str().unwrap(),
        &["inspect-hello", ech.to_str().unwrap()],
        None,
        10,
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["verdict"], "encrypted_client_hello");
    assert_eq!(v["ech"], true);
    assert!(v["file"]
        .as_str()
        .unwrap()
        .ends_with("crafted-curl-http2-ech.bin"));
}

/// The gateway, not the client, chooses the TLS 1.3 suite: AES-128-GCM
/// with SHA-256 whenever the client offers it, even listed last (OpenSSL's
/// clients list AES-256-GCM first); a client that offers only another
/// suite gets that one.
#[tokio::test(flavor = "multi_thread")]
async fn the_gateway_chooses_the_suite() {
    let rig = rig().await;
    let trust = rig.trust.to_string_lossy().into_owned();
    let suite = |offer: &str| {
        let out = clients::s_client(
            rig.gateway.data,
            SESSION_SOURCE,
            &[
                "-servername",
                "allowed.test",
                "-CAfile",
                &trust,
                "-verify_return_error",
                "-ciphersuites",
                offer,
            ],
        );
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            stdout.contains("Verify return code: 0 (ok)"),
            "openssl saw: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
            .lines()
            .find_map(|l| l.split_once("Cipher is ").map(|(_, c)| c.trim().to_owned()))
            .unwrap_or_else(|| panic!("no cipher line: {stdout}"))
    };
    assert_eq!(
        suite("TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256"),
        "TLS_AES_128_GCM_SHA256"
    );
    assert_eq!(suite("TLS_AES_256_GCM_SHA384"), "TLS_AES_256_GCM_SHA384");
    assert_eq!(
        suite("TLS_CHACHA20_POLY1305_SHA256"),
        "TLS_CHACHA20_POLY1305_SHA256"
    );
}
