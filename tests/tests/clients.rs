//! Real clients other than curl through the gateway: Python's `urllib`
//! (HTTP/1.1, trusting only the session CA) and `h2load` (HTTP/2, many
//! streams on a few connections), each to the hyper test origin.

use std::collections::HashMap;

use serde_json::Value;
use talos_e2e::clients::{run_bounded, SESSION_SOURCE};
use talos_e2e::rig::Single;

/// The listed name the origin serves.
const NAME: &str = "allowed.test";

/// The hyper origin for `allowed.test` behind a gateway with one session
/// whose source addresses are `sources`.
async fn rig(sources: &[&str]) -> Single {
    Single::builder()
        .session(&[NAME])
        .sources(sources)
        .start_loopback(&[NAME])
        .await
}

/// A Python client on `urllib`: its connections leave from a session source
/// address for the gateway's listener while SNI and Host name the listed
/// destination, and its TLS context trusts only the session CA. Prints one
/// JSON object describing every exchange.
const PYTHON_CLIENT: &str = r#"
import hashlib, http.client, json, socket, ssl, sys, urllib.error, urllib.request

gateway_host, gateway_port, cafile, source, name = sys.argv[1:6]
gateway_port = int(gateway_port)

# cafile given: the default roots are not loaded, only the session CA.
ctx = ssl.create_default_context(cafile=cafile)
ctx.minimum_version = ssl.TLSVersion.TLSv1_3
ctx.set_alpn_protocols(["http/1.1"])

class ViaGateway(http.client.HTTPSConnection):
    """Connects to the gateway from the session's address; SNI and Host
    stay the URL's host."""
    def __init__(self, host, **kw):
        super().__init__(host, **kw)
        self._create_connection = lambda _addr, timeout, _src: socket.create_connection(
            (gateway_host, gateway_port), timeout, (source, 0))

class Handler(urllib.request.HTTPSHandler):
    def https_open(self, req):
        return self.do_open(ViaGateway, req, context=ctx)

opener = urllib.request.build_opener(Handler(context=ctx))

def exchange(req):
    try:
        with opener.open(req, timeout=10) as r:
            return {"status": r.status, "refusal": r.headers.get("hangar-refusal"),
                    "body": r.read().decode()}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "refusal": e.headers.get("hangar-refusal"),
                "body": e.read().decode()}

out = {}
out["get"] = exchange(urllib.request.Request(f"https://{name}/hello"))
body = b"posted by python " * 1200
out["post"] = exchange(urllib.request.Request(
    f"https://{name}/upload", data=body, method="POST",
    headers={"Content-Type": "application/octet-stream"}))
out["post_sent"] = {"len": len(body), "sha256": hashlib.sha256(body).hexdigest()}
out["mismatch"] = exchange(urllib.request.Request(
    f"https://{name}/hello", headers={"Host": "other.test"}))
print(json.dumps(out))
"#;

/// Runs a Python client `script` (saved as `file`) with the gateway's
/// address, the session CA, the session source and the listed name as its
/// arguments; it prints one JSON object.
fn run_python(rig: &Single, file: &str, script: &str) -> Value {
    let path = rig.dir.join(file);
    std::fs::write(&path, script).expect("write the python client");
    let port = rig.gateway.data.port().to_string();
    let out = run_bounded(
        "python3",
        &[
            path.to_str().unwrap(),
            "127.0.0.1",
            &port,
            rig.trust.to_str().unwrap(),
            SESSION_SOURCE,
            NAME,
        ],
        None,
        60,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "python client failed: {}\nstdout: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr),
            rig.gateway.log()
        )
    })
}

/// The one record whose single request is `method path`.
fn record_of<'a>(records: &'a [Value], method: &str, path: &str, status: u64) -> &'a Value {
    let found: Vec<&Value> = records
        .iter()
        .filter(|r| {
            r["requests"].as_array().is_some_and(|q| {
                q.len() == 1
                    && q[0]["method"] == method
                    && q[0]["path"] == path
                    && q[0]["status"] == status
            })
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one record for {method} {path} {status} in {records:#?}"
    );
    found[0]
}

#[tokio::test(flavor = "multi_thread")]
async fn python_urllib_gets_and_posts_through_the_gateway() {
    let rig = rig(&[SESSION_SOURCE]).await;
    let out = run_python(&rig, "client.py", PYTHON_CLIENT);

    let get = &out["get"];
    assert_eq!(get["status"], 200, "{out:#}\n{}", rig.gateway.log());
    assert!(get["refusal"].is_null(), "{out:#}");
    let body = get["body"].as_str().unwrap();
    assert!(body.starts_with("origin says hello:"), "{body}");
    assert!(body.ends_with(" GET /hello\n"), "{body}");

    let post = &out["post"];
    assert_eq!(post["status"], 200, "{out:#}\n{}", rig.gateway.log());
    // The origin answers `/upload` with the length and SHA-256 of what it
    // received: the body arrived whole and unchanged.
    let received: Value =
        serde_json::from_str(post["body"].as_str().unwrap()).expect("upload answer is JSON");
    assert_eq!(received, out["post_sent"], "{out:#}");

    // A Host naming another destination than the SNI: refused per request.
    let mismatch = &out["mismatch"];
    assert_eq!(mismatch["status"], 421, "{out:#}");
    assert_eq!(mismatch["refusal"], "host_mismatch", "{out:#}");
    let refusal: Value =
        serde_json::from_str(mismatch["body"].as_str().unwrap()).expect("refusal body is JSON");
    assert_eq!(refusal["refusal"], "host_mismatch", "{refusal}");
    assert!(refusal["message"].is_string(), "{refusal}");

    // urllib closes each connection: three connections, three records.
    let records = rig.gateway.wait_records(3);
    assert_eq!(records.len(), 3, "{records:#?}");
    for r in &records {
        assert_eq!(r["verdict"], "allowed", "{r}");
        assert_eq!(r["sni"], NAME, "{r}");
        assert!(
            r["source"].as_str().unwrap().starts_with("127.0.0.2:"),
            "{r}"
        );
        assert_eq!(r["alpn_session"], "http/1.1", "{r}");
        assert!(
            r["tls_version"]
                .as_str()
                .unwrap_or_default()
                .contains("1.3"),
            "{r}"
        );
        assert_eq!(r["request_count"], 1, "{r}");
    }
    let get = record_of(&records, "GET", "/hello", 200);
    assert!(get["requests"][0]["refusal"].is_null(), "{get}");
    let post = record_of(&records, "POST", "/upload", 200);
    let sent = out["post_sent"]["len"].as_u64().unwrap();
    assert!(
        post["bytes_from_session"].as_u64().unwrap_or_default() > sent,
        "the body went through the session side: {post}"
    );
    let refused = record_of(&records, "GET", "/hello", 421);
    assert_eq!(
        refused["requests"][0]["refusal"], "host_mismatch",
        "{refused}"
    );
}

/// A Python client on `ssl`'s memory BIOs, so it controls what each send
/// carries: its handshake's last flight (Finished) and its first request
/// in one send, or a pause between the two. The gateway waits for a first
/// request byte on the socket, holding no receive buffer, only when nothing
/// came with the handshake; both must be answered.
const PYTHON_FLIGHTS: &str = r#"
import json, socket, ssl, sys, time

gateway_host, gateway_port, cafile, source, name = sys.argv[1:6]
ctx = ssl.create_default_context(cafile=cafile)
ctx.minimum_version = ssl.TLSVersion.TLSv1_3
ctx.set_alpn_protocols(["http/1.1"])

def exchange(pause):
    sock = socket.create_connection((gateway_host, int(gateway_port)), 10, (source, 0))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=name)
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            sock.sendall(outgoing.read())
            chunk = sock.recv(65536)
            if not chunk:
                return "closed during the handshake"
            incoming.write(chunk)
    # The client's Finished waits in `outgoing`, not yet sent.
    request = f"GET /hello HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode()
    if pause is None:
        tls.write(request)
        sock.sendall(outgoing.read())
    else:
        sock.sendall(outgoing.read())
        time.sleep(pause)
        tls.write(request)
        sock.sendall(outgoing.read())
    reply = b""
    while True:
        try:
            data = tls.read(65536)
            if not data:
                break
            reply += data
            continue
        except ssl.SSLWantReadError:
            pass
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            break
        chunk = sock.recv(65536)
        if not chunk:
            break
        incoming.write(chunk)
    sock.close()
    return reply.decode(errors="replace")

print(json.dumps({"together": exchange(None), "paused": exchange(1.0)}))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_first_request_is_answered_with_or_after_the_handshake() {
    let rig = rig(&[SESSION_SOURCE]).await;
    let replies = run_python(&rig, "flights.py", PYTHON_FLIGHTS);
    for case in ["together", "paused"] {
        let reply = replies[case].as_str().unwrap_or_default();
        assert!(
            reply.starts_with("HTTP/1.1 200"),
            "{case}: {reply}\n{}",
            rig.gateway.log()
        );
        assert!(reply.contains("origin says hello:"), "{case}: {reply}");
    }
    let records = rig.gateway.wait_records(2);
    for r in &records {
        assert_eq!(r["request_count"], 1, "{r}");
    }
}

/// Requests h2load makes: `-n` in total over `-c` connections, `-m`
/// streams at once on each.
const H2LOAD_REQUESTS: u64 = 2000;
const H2LOAD_CLIENTS: u64 = 4;
const H2LOAD_STREAMS: u64 = 32;

#[tokio::test(flavor = "multi_thread")]
async fn h2load_multiplexes_many_streams_through_the_gateway() {
    // h2load cannot choose its source address: its connections leave from
    // 127.0.0.1, so this session owns that address too.
    let rig = rig(&[SESSION_SOURCE, "127.0.0.1"]).await;
    // `--connect-to` sends the TCP connection to the gateway while the URI's
    // host stays the SNI and `:authority`.
    let connect_to = format!("--connect-to=127.0.0.1:{}", rig.gateway.data.port());
    let url = format!("https://{NAME}/load");
    let (n, c, m) = (
        H2LOAD_REQUESTS.to_string(),
        H2LOAD_CLIENTS.to_string(),
        H2LOAD_STREAMS.to_string(),
    );
    let out = run_bounded(
        "h2load",
        &["-n", &n, "-c", &c, "-m", &m, &connect_to, &url],
        None,
        60,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = h2load_requests(&stdout).unwrap_or_else(|| {
        panic!(
            "no summary from h2load: {stdout}\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            rig.gateway.log()
        )
    });
    assert_eq!(summary["total"], H2LOAD_REQUESTS, "{stdout}");
    assert_eq!(summary["succeeded"], H2LOAD_REQUESTS, "{stdout}");
    assert_eq!(summary["failed"], 0, "{stdout}");
    assert_eq!(summary["errored"], 0, "{stdout}");
    assert!(
        stdout.contains(&format!("status codes: {H2LOAD_REQUESTS} 2xx")),
        "{stdout}"
    );
    assert!(
        stdout.contains("Application protocol: h2"),
        "h2load must speak HTTP/2 to the gateway: {stdout}"
    );

    let records = rig.gateway.wait_records(H2LOAD_CLIENTS as usize);
    assert_eq!(
        records.len() as u64,
        H2LOAD_CLIENTS,
        "one record per h2load client: {records:#?}"
    );
    let per_client = H2LOAD_REQUESTS / H2LOAD_CLIENTS;
    for r in &records {
        assert_eq!(r["verdict"], "allowed", "{r}");
        assert_eq!(r["sni"], NAME, "{r}");
        assert!(
            r["source"].as_str().unwrap().starts_with("127.0.0.1:"),
            "{r}"
        );
        assert_eq!(r["alpn_session"], "h2", "{r}");
        assert_eq!(r["alpn_upstream"], "h2", "{r}");
        assert_eq!(r["request_count"], per_client, "{r}");
        let listed = r["requests"].as_array().expect("requests");
        assert!(
            !listed.is_empty() && listed.len() as u64 <= per_client,
            "{r}"
        );
        for q in listed {
            assert_eq!(q["method"], "GET", "{q}");
            assert_eq!(q["path"], "/load", "{q}");
            assert_eq!(q["status"], 200, "{q}");
        }
    }
}

/// The counts on h2load's `requests:` line, by name:
/// `requests: 2000 total, 2000 started, 2000 done, 2000 succeeded, 0 failed, …`.
fn h2load_requests(stdout: &str) -> Option<HashMap<String, u64>> {
    let line = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("requests: "))?;
    let mut counts = HashMap::new();
    for part in line.split(',') {
        let mut words = part.split_whitespace();
        let n: u64 = words.next()?.parse().ok()?;
        counts.insert(words.next()?.to_string(), n);
    }
    Some(counts)
}

#[test]
fn h2load_summary_is_parsed() {
    let sample = "finished in 1.2s, 1600.00 req/s, 100KB/s\n\
        requests: 2000 total, 2000 started, 2000 done, 1998 succeeded, 2 failed, 0 errored, 0 timeout\n\
        status codes: 1998 2xx, 0 3xx, 2 4xx, 0 5xx\n";
    let got = h2load_requests(sample).expect("parsed");
    assert_eq!(got["total"], 2000);
    assert_eq!(got["succeeded"], 1998);
    assert_eq!(got["failed"], 2);
    assert_eq!(got["timeout"], 0);
    assert!(h2load_requests("no summary here").is_none());
}
