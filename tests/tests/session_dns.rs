//! The sessions' DNS, end to end: the gateway answers a session's queries
//! itself, by the session its source names. Real clients (dig, Python's
//! `socket.getaddrinfo`, curl, Node) find a listed name through the C
//! library's resolver, pointed at the gateway alone, with no `/etc/hosts`
//! entry, and connect; an unlisted name fails `NXDOMAIN` and is never
//! asked of any resolver; a source that is no session's is refused; one
//! session cannot learn another's names; one session's flood leaves
//! another's answers coming; each session's counts are on the record, and
//! no refused name is.

use std::net::IpAddr;
use std::process::{Child, Command, Stdio};

use serde_json::Value;
use talos_e2e::clients::{run_bounded, SESSION_SOURCE, UNKNOWN_SOURCE};
use talos_e2e::gateway::Gateway;
use talos_e2e::resolving::{
    answerer_address, dig, short_addresses, status, Resolving, LOOPBACK_SOURCE,
};
use talos_e2e::rig::Single;
use talos_e2e::wait;

const API: &str = "api.test";
const OTHER: &str = "other.test";
/// A name no session lists: the one an exfiltrating program would make up.
const UNLISTED: &str = "c2VjcmV0LWRhdGE.exfil.test";

/// The sessions' DNS counts on the record so far, summed by field.
fn dns_counts(gateway: &Gateway, session: &str) -> Value {
    let mut sum = serde_json::Map::new();
    for r in gateway.records() {
        if r["kind"] != "dns" || r["session_id"] != session {
            continue;
        }
        for (k, v) in r["queries"].as_object().into_iter().flatten() {
            let n = sum.get(k).and_then(Value::as_u64).unwrap_or(0) + v.as_u64().unwrap_or(0);
            sum.insert(k.clone(), n.into());
        }
        // A record counts the distinct names refused in its own interval:
        // names refused across a record's boundary are in two records, so
        // the intervals' counts are summed (at least the distinct names
        // refused in all), and the longest is the longest of any.
        let had = |k: &str| sum.get(k).and_then(Value::as_u64).unwrap_or(0);
        let refused = had("refused_names") + r["refused_names"].as_u64().unwrap_or(0);
        let longest =
            had("longest_refused_name").max(r["longest_refused_name"].as_u64().unwrap_or(0));
        sum.insert("refused_names".into(), refused.into());
        sum.insert("longest_refused_name".into(), longest.into());
    }
    Value::Object(sum)
}

/// A test name's count in `counts`.
fn n(counts: &Value, k: &str) -> u64 {
    counts[k].as_u64().unwrap_or(0)
}

const PYTHON: &str = r#"
import json, socket, ssl, sys
name, port, ca, unlisted = sys.argv[1:5]
addrs = sorted({a[4][0] for a in socket.getaddrinfo(name, 443, type=socket.SOCK_STREAM)})
ctx = ssl.create_default_context(cafile=ca)
with socket.create_connection((name, int(port)), timeout=10) as s:
    with ctx.wrap_socket(s, server_hostname=name) as t:
        t.sendall(("GET /python HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % name).encode())
        data = b""
        while True:
            chunk = t.recv(65536)
            if not chunk:
                break
            data += chunk
status = int(data.split(b" ")[1])
try:
    socket.getaddrinfo(unlisted, 443)
    unl = "resolved"
except socket.gaierror as e:
    unl = "EAI_NONAME" if e.errno == socket.EAI_NONAME else "errno %d" % e.errno
print(json.dumps({"addrs": addrs, "status": status, "unlisted": unl}))
"#;

const NODE: &str = r#"
const dns = require('dns'), https = require('https'), fs = require('fs');
const [name, port, ca, unlisted] = process.argv.slice(1);
dns.lookup(name, { all: true }, (err, addrs) => {
  if (err) { console.log(JSON.stringify({ lookup: err.code })); process.exit(1); }
  // The Host header as a client of port 443 sends it (the gateway's
  // listener here is not 443, where nftables would bring it).
  https.get({ host: name, port: +port, path: '/node', ca: fs.readFileSync(ca),
              headers: { host: name } }, (res) => {
    res.resume();
    res.on('end', () => dns.lookup(unlisted, (e) => {
      console.log(JSON.stringify({ addrs: addrs.map((a) => a.address), status: res.statusCode,
                                   unlisted: e ? e.code : 'resolved' }));
    }));
  }).on('error', (e) => { console.log(JSON.stringify({ https: e.message })); process.exit(1); });
});
"#;

fn json_out(out: &std::process::Output, what: &str) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|_| {
        panic!(
            "{what} printed {text:?}; stderr {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A listed name, found through the C library's resolver pointed at the
/// gateway alone: Python, curl and Node connect by it; the unlisted name
/// fails as a name that does not exist; dig sees the answers' form; the
/// upstream resolver is never asked the unlisted name; the session's
/// counts are on the record, and the name is in no record and no log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listed_names_resolve_and_connect_and_unlisted_ones_do_not_exist() {
    let answerer = answerer_address();
    let rig: Single = Single::builder()
        .session(&[API])
        .sources(&[LOOPBACK_SOURCE])
        .answerer(&format!(
            "listen = \"{answerer}\"\nrecord_interval_ms = 1000\n"
        ))
        .start_loopback(&[API])
        .await;
    let gw = &rig.gateway;
    assert_eq!(gw.answerer, Some(answerer), "the ready line names it");
    let resolving = Resolving::new(&rig.dir, answerer.ip());
    let port = gw.data.port().to_string();
    let trust = rig.trust.to_str().expect("utf-8").to_owned();

    // Python: getaddrinfo, then a TLS connection by name.
    let out = resolving.run("python3", &["-c", PYTHON, API, &port, &trust, UNLISTED], 30);
    let py = json_out(&out, "python3");
    assert_eq!(py["addrs"], serde_json::json!(["127.0.0.1"]), "{py}");
    assert_eq!(py["status"], 200, "{py}");
    assert_eq!(py["unlisted"], "EAI_NONAME", "{py}");

    // curl: the name resolved by curl itself (--connect-to keeps the
    // host and changes only the port: the gateway's listener is not 443).
    let connect_to = format!("{API}:443::{port}");
    let url = format!("https://{API}/curl");
    let out = resolving.run(
        "curl",
        &[
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "20",
            "--cacert",
            &trust,
            "--connect-to",
            &connect_to,
            &url,
        ],
        30,
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "200",
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let unlisted_url = format!("https://{UNLISTED}/");
    let out = resolving.run(
        "curl",
        &["-sS", "--max-time", "20", "--cacert", &trust, &unlisted_url],
        30,
    );
    assert_eq!(
        out.status.code(),
        Some(6),
        "curl: an unlisted name cannot be resolved: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Node: dns.lookup, then https by name.
    let out = resolving.run("node", &["-e", NODE, API, &port, &trust, UNLISTED], 30);
    let node = json_out(&out, "node");
    assert_eq!(node["addrs"], serde_json::json!(["127.0.0.1"]), "{node}");
    assert_eq!(node["status"], 200, "{node}");
    assert_eq!(node["unlisted"], "ENOTFOUND", "{node}");

    // dig: the answers' form, on UDP and TCP.
    let at = format!("@{}", answerer.ip());
    let a = dig(&[&at, "-b", LOOPBACK_SOURCE, API, "A"]);
    assert_eq!(status(&a), "NOERROR", "{a}");
    assert!(
        a.contains("\t30\tIN\tA\t127.0.0.1"),
        "TTL 30, the address: {a}"
    );
    let tcp = dig(&[&at, "+tcp", "+short", "-b", LOOPBACK_SOURCE, API, "A"]);
    assert_eq!(
        short_addresses(&tcp),
        ["127.0.0.1".parse::<IpAddr>().unwrap()],
        "{tcp}"
    );
    for kind in ["HTTPS", "SVCB", "TXT", "MX"] {
        let out = dig(&[&at, "-b", LOOPBACK_SOURCE, API, kind]);
        assert_eq!(status(&out), "NOERROR", "{kind}: {out}");
        assert!(out.contains("ANSWER: 0,"), "{kind} answered empty: {out}");
    }
    let out = dig(&[&at, "-b", LOOPBACK_SOURCE, "approvals.hangar.internal", "A"]);
    assert!(
        out.contains(&format!("IN\tA\t{}", answerer.ip())),
        "approvals.hangar.internal is the gateway: {out}"
    );
    for name in [UNLISTED, "api.test.evil.test", "sub.api.test"] {
        let out = dig(&[&at, "-b", LOOPBACK_SOURCE, name, "A"]);
        assert_eq!(status(&out), "NXDOMAIN", "{name}: {out}");
    }

    // Never asked of the resolver behind the gateway.
    let asked = rig.peers.dns.asked();
    assert!(
        asked.iter().any(|n| n == API),
        "the listed name was resolved: {asked:?}"
    );
    assert!(
        !asked
            .iter()
            .any(|n| n.contains("exfil") || n.starts_with("sub.")),
        "no unlisted name reached a resolver: {asked:?}"
    );

    // Counted on the record; no refused name in any record or log line.
    let counts = wait::until("the session's DNS counts on the record", || {
        wait::check(dns_counts(gw, "sess-1"), |c| {
            n(c, "unlisted") >= 6 && n(c, "answered") >= 8 && n(c, "refused_names") >= 3
        })
    });
    assert_eq!(
        n(&counts, "longest_refused_name"),
        UNLISTED.len() as u64,
        "{counts}"
    );
    let records = std::fs::read_to_string(&gw.records_path).expect("records");
    let log = gw.log();
    for text in [&records, &log] {
        assert!(!text.contains("exfil"), "a refused name was kept");
        assert!(!text.contains("c2VjcmV0"), "a refused name was kept");
    }
}

/// A source that is no session's is refused; each session learns its own
/// names only; a session's flood spends its own share, and the other's
/// queries are answered meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_learn_only_their_names_and_one_floods_alone() {
    const OTHER_SOURCE: &str = "127.0.0.3";
    let rig: Single = Single::builder()
        .session(&[API])
        .also_session("sess-2", OTHER_SOURCE, &[OTHER])
        .answerer("listen = \"127.0.0.1:0\"\nqueries_per_second = 20\nrecord_interval_ms = 1000\n")
        .start_loopback(&[API, OTHER])
        .await;
    let gw = &rig.gateway;
    let answerer = gw.answerer.expect("the answerer's address");
    let (at, port) = (format!("@{}", answerer.ip()), answerer.port().to_string());
    let ask = |source: &str, name: &str, more: &[&str]| {
        let mut args = vec![at.as_str(), "-p", &port, "-b", source, name, "A"];
        args.extend_from_slice(more);
        dig(&args)
    };

    let out = ask(UNKNOWN_SOURCE, API, &[]);
    assert_eq!(status(&out), "REFUSED", "no session's source: {out}");
    let out = ask(UNKNOWN_SOURCE, API, &["+tcp"]);
    assert_eq!(status(&out), "REFUSED", "no session's source, TCP: {out}");
    assert_eq!(status(&ask(SESSION_SOURCE, API, &[])), "NOERROR");
    assert_eq!(
        status(&ask(SESSION_SOURCE, OTHER, &[])),
        "NXDOMAIN",
        "the other's name"
    );
    assert_eq!(status(&ask(OTHER_SOURCE, OTHER, &[])), "NOERROR");
    assert_eq!(
        status(&ask(OTHER_SOURCE, API, &[])),
        "NXDOMAIN",
        "the other's name"
    );

    // The flood: sess-1 sends 20000 queries as fast as it can (at most
    // 20 s); its share is 20 a second.
    let flood = Flood::start(SESSION_SOURCE, answerer, 20_000);
    wait::until("the flood to meet its share", || {
        wait::check(
            gw.metric("gateway_dns_queries_total{outcome=\"limited\"}"),
            |n| n.unwrap_or(0.0) >= 100.0,
        )
    });
    // Meanwhile sess-2 asks 20 times; each is answered.
    for i in 0..20 {
        let out = ask(OTHER_SOURCE, OTHER, &["+tries=3", "+time=2"]);
        assert_eq!(
            status(&out),
            "NOERROR",
            "sess-2's query {i} during the flood: {out}"
        );
        assert!(out.contains("IN\tA\t127.0.0.1"), "{out}");
    }
    let sent = flood.finish();
    assert!(sent > 0, "the flood sent");
    let counts = wait::until("sess-1's counts with the limited ones", || {
        wait::check(dns_counts(gw, "sess-1"), |c| n(c, "limited") >= 100)
    });
    let other = dns_counts(gw, "sess-2");
    assert_eq!(n(&other, "limited"), 0, "sess-2 was never limited: {other}");
    assert!(
        n(&counts, "answered") <= 20 * 40 + 40,
        "sess-1 got its share only: {counts}"
    );
}

/// A bounded flood of queries from a Python process.
struct Flood(Child);

impl Flood {
    fn start(source: &str, to: std::net::SocketAddr, count: u32) -> Flood {
        const SCRIPT: &str = r#"
import socket, struct, sys, time
src, host, port, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((src, 0))
s.setblocking(False)
q = lambda i: struct.pack(">HHHHHH", i & 0xFFFF, 0x0100, 1, 0, 0, 0) + b"\x03api\x04test\x00\x00\x01\x00\x01"
end = time.monotonic() + 20
sent = 0
for i in range(count):
    if time.monotonic() > end:
        break
    try:
        s.sendto(q(i), (host, port))
        sent += 1
    except BlockingIOError:
        time.sleep(0.001)
    try:
        while True:
            s.recv(4096)
    except BlockingIOError:
        pass
print(sent)
"#;
        let child = Command::new("timeout")
            .args(["-k", "2", "30", "python3", "-c", SCRIPT, source])
            .arg(to.ip().to_string())
            .arg(to.port().to_string())
            .arg(count.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3");
        Flood(child)
    }

    /// Wait for it (bounded by its own time); how many it sent.
    fn finish(self) -> u64 {
        let out = self.0.wait_with_output().expect("flood");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(0)
    }
}

/// Bad bytes get `FORMERR` or nothing, never a crash: the answerer still
/// answers after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_queries_are_refused_or_dropped_and_the_answerer_goes_on() {
    let rig: Single = Single::builder()
        .session(&[API])
        .answerer("listen = \"127.0.0.1:0\"\n")
        .start_loopback(&[API])
        .await;
    let gw = &rig.gateway;
    let answerer = gw.answerer.expect("answerer");
    const SCRIPT: &str = r#"
import socket, sys
src, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((src, 0))
s.settimeout(1.0)
cases = [
    b"",                                   # nothing
    b"\x12\x34",                           # shorter than a header
    b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\xc0\x0c\x00\x01\x00\x01",  # a pointer to itself
    b"\x12\x34\x01\x00\x00\x02\x00\x00\x00\x00\x00\x00\x03api\x04test\x00\x00\x01\x00\x01",  # two questions announced, one sent
    b"\x12\x34\x81\x80\x00\x01\x00\x00\x00\x00\x00\x00\x03api\x04test\x00\x00\x01\x00\x01",  # a response
    b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x3fxxxx",  # a label past the end
    bytes(range(256)) * 8,
]
got = []
for c in cases:
    s.sendto(c, (host, port))
    try:
        data = s.recv(4096)
        got.append(data[3] & 0x0F)
    except socket.timeout:
        got.append(None)
print(got)
"#;
    let out = run_bounded(
        "python3",
        &[
            "-c",
            SCRIPT,
            SESSION_SOURCE,
            &answerer.ip().to_string(),
            &answerer.port().to_string(),
        ],
        None,
        30,
    );
    let got = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    // Only FORMERR (1) or NOTIMP (4) comes back, or nothing.
    let codes: Vec<&str> = got.trim_matches(['[', ']']).split(", ").collect();
    assert_eq!(
        codes.len(),
        7,
        "{got} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for c in &codes {
        assert!(matches!(*c, "None" | "1" | "4"), "{got}");
    }
    assert_eq!(codes[0], "None", "nothing gets nothing");
    assert_eq!(codes[4], "None", "a response is not answered");
    let out = dig(&[
        &format!("@{}", answerer.ip()),
        "-p",
        &answerer.port().to_string(),
        "-b",
        SESSION_SOURCE,
        API,
    ]);
    assert_eq!(status(&out), "NOERROR", "still answering: {out}");
    assert!(
        gw.metric("gateway_dns_queries_total{outcome=\"malformed\"}")
            .unwrap_or(0.0)
            >= 4.0
    );
}

/// An upgrade hands the DNS sockets over with the others: the successor
/// answers on the same address, UDP and TCP, for the sessions it took
/// over; a query sent while the processes change hands waits in the
/// socket and is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_hands_the_dns_sockets_over() {
    use talos_e2e::member::Member;
    let mut rig: Single<Member> = Single::builder()
        .session(&[API])
        .answerer("listen = \"127.0.0.1:0\"\n")
        .start_loopback(&[API])
        .await;
    let answerer = talos_e2e::rig::Process::answerer(&rig.gateway).expect("answerer");
    let (at, port) = (format!("@{}", answerer.ip()), answerer.port().to_string());
    let ask = |more: &[&str]| {
        let mut args = vec![at.as_str(), "-p", &port, "-b", SESSION_SOURCE, API, "A"];
        args.extend_from_slice(more);
        dig(&args)
    };
    assert_eq!(status(&ask(&[])), "NOERROR");
    let old = rig.gateway.pid();
    // Queries all through the handover, each given up to 3 tries.
    let asking = {
        let (at, port) = (at.clone(), port.clone());
        std::thread::spawn(move || {
            (0..30)
                .map(|_| {
                    let out = dig(&[
                        &at,
                        "-p",
                        &port,
                        "-b",
                        SESSION_SOURCE,
                        API,
                        "A",
                        "+tries=3",
                        "+time=2",
                    ]);
                    status(&out).to_owned()
                })
                .collect::<Vec<String>>()
        })
    };
    let (ok, out, err) = rig.gateway.command("upgrade");
    assert!(ok, "upgrade: {out} {err}");
    let line = rig.gateway.wait_ready(2);
    assert_eq!(
        line["dns"],
        answerer.to_string(),
        "the successor answers where the old one did"
    );
    assert_ne!(line["pid"].as_u64(), Some(u64::from(old)));
    let statuses = asking.join().expect("asking");
    assert!(statuses.iter().all(|s| s == "NOERROR"), "{statuses:?}");
    for more in [&[][..], &["+tcp"][..]] {
        let out = ask(more);
        assert_eq!(status(&out), "NOERROR", "after the upgrade {more:?}: {out}");
    }
    wait::until("the old process to exit", || {
        wait::check(talos_e2e::member::alive(old), |alive| !alive)
    });
}
