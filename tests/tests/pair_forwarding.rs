//! The pair's member link, end to end: a member that holds no authority
//! for a live session (restarted without a handover, or down when the
//! session opened) hands that session's connections, untouched, to its
//! peer, which judges them as direct ones; the certificate counts each
//! connection once and shows the hand-offs. The link refuses whoever is
//! not a member of this pair, and a second hop.
//!
//! The rig and what the fault tests share: [`faults`].

mod faults;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use faults::*;
use serde_json::Value;
use talos_e2e::clients::{curl_status, Kept};
use talos_e2e::rig::pair::matrix;
use talos_e2e::rig::{Pair, Process};
use talos_e2e::wait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Connections after the restart (every other one reaches the restarted
/// member).
const CONNECTIONS: usize = 200;

/// A linked pair of `G` processes with a lease of `lease`:
/// [`faults::pair`] with the member link, and a spare identity `gw-c`.
async fn linked_pair_of<G: Process>(lease: Duration) -> Pair<G> {
    Pair::builder()
        .lease(lease)
        .renewing()
        .linked()
        .identities(&["gw-c"])
        .egress(&[API])
        .secret("API_TOKEN", SECRET)
        .start_loopback(&[API])
        .await
}

/// A linked pair of gateways with the tests' lease.
async fn linked_pair() -> Pair {
    linked_pair_of(LEASE).await
}

/// Wait until member `i` forwards `sessions` sessions.
fn wait_forwarding(rig: &Pair, i: usize, sessions: f64) {
    wait::until(
        &format!("member {i} to forward {sessions} sessions"),
        || {
            wait::check(rig.members[i].metric("gateway_forwarding_sessions"), |n| {
                *n == Some(sessions)
            })
        },
    );
}

/// How a member is restarted.
#[derive(Debug, Clone, Copy)]
enum Restart {
    Kill,
    Term,
}

/// A session on both members; gw-a restarted without a handover; then
/// [`CONNECTIONS`] new connections alternating between the members, with
/// the session's original trust bundle: every one succeeds; gw-a
/// forwarded the ones it received; the certificate lists every connection
/// exactly once, the forwarded ones as such, and the hand-offs beside.
async fn restarted_member_forwards(mode: &str, how: Restart) {
    let mut rig = linked_pair().await;
    let id = rig.start_session(&session(SOURCE).mode(mode));
    let (bundle, listed) = rig.trust(&id, "trust-1.pem");
    assert_eq!(listed.len(), 2);
    let fault = match how {
        Restart::Kill => {
            rig.members[0].kill();
            "SIGKILL gw-a, start again"
        }
        Restart::Term => {
            assert!(rig.members[0].stop(), "gw-a drains and exits 0");
            "SIGTERM gw-a, start again"
        }
    };
    rig.restart(0);
    wait_forwarding(&rig, 0, 1.0);
    let started = std::time::Instant::now();
    for i in 0..CONNECTIONS {
        let g = &rig.members[i % 2];
        assert_eq!(
            curl_status(SOURCE, g.data, &bundle, API, &format!("/fwd/{i}")),
            200,
            "connection {i} (to {})",
            ["gw-a", "gw-b"][i % 2]
        );
    }
    matrix(
        fault,
        &format!("{CONNECTIONS} connections ({mode})"),
        "all 200",
        started.elapsed(),
    );
    assert_eq!(
        rig.members[0].metric("gateway_forwarded_total{result=\"forwarded\"}"),
        Some((CONNECTIONS / 2) as f64)
    );
    let ran = rig.cli(&["sandbox", "stop", &id]).json();
    assert_eq!(ran["state"], "ended", "{ran}");
    let cert = rig.wait_issued(&id);
    let served: Vec<&Value> = cert["connections"]
        .as_array()
        .expect("connections")
        .iter()
        .filter(|c| first_path(c).is_some_and(|p| p.starts_with("/fwd/")))
        .collect();
    assert_eq!(served.len(), CONNECTIONS, "each connection once: {cert}");
    for i in 0..CONNECTIONS {
        let path = format!("/fwd/{i}");
        let of: Vec<&&Value> = served
            .iter()
            .filter(|c| first_path(c) == Some(path.as_str()))
            .collect();
        assert_eq!(of.len(), 1, "{path}: {of:?}");
        let c = of[0];
        assert_eq!(c["gateway_id"], "gw-b", "the holder served {path}");
        assert_eq!(c["verdict"], "allowed");
        assert_eq!(
            c["source"].as_str().map(|s| s.starts_with(SOURCE)),
            Some(true)
        );
        if i % 2 == 0 {
            assert_eq!(c["via"], "gw-a", "{path} came through gw-a: {c}");
        } else {
            assert!(c.get("via").is_none(), "{c}");
        }
    }
    let handed: Vec<&Value> = cert["forwarded"]
        .as_array()
        .expect("forwarded")
        .iter()
        .filter(|c| c["gateway_id"] == "gw-a")
        .collect();
    assert_eq!(handed.len(), CONNECTIONS / 2, "{cert}");
    for c in handed {
        assert_eq!(c["forwarded_to"], "gw-b");
        assert_eq!(c["session_id"], id.as_str());
        assert!(c.get("requests").is_none(), "no request lines: {c}");
    }
}

fn first_path(c: &Value) -> Option<&str> {
    c["requests"].as_array()?.first()?["path"].as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agent_session_survives_a_sigkill_restart_through_the_peer() {
    restarted_member_forwards("agent", Restart::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commands_session_survives_a_sigkill_restart_through_the_peer() {
    restarted_member_forwards("commands", Restart::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agent_session_survives_a_sigterm_restart_through_the_peer() {
    restarted_member_forwards("agent", Restart::Term).await;
}

/// A member down when the session opens, started afterwards: the
/// session's connections to it succeed through its peer; stopped, the
/// session's entry is withdrawn and nothing is forwarded for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_down_at_the_open_forwards_once_started() {
    let mut rig = linked_pair().await;
    rig.members[0].kill();
    let (id, t) = rig.start(&session(SOURCE).mode("agent"));
    assert_eq!(t["unreached"][0]["gateway"], "gw-a", "{t}");
    let (bundle, listed) = rig.trust(&id, "trust-1.pem");
    assert_eq!(listed.len(), 1, "only gw-b made a CA");
    rig.restart(0);
    wait_forwarding(&rig, 0, 1.0);
    let a = rig.members[0].data;
    for i in 0..4 {
        assert_eq!(
            curl_status(SOURCE, a, &bundle, API, &format!("/late/{i}")),
            200
        );
    }
    let ran = rig.cli(&["sandbox", "stop", &id]).json();
    assert_eq!(ran["state"], "ended", "{ran}");
    // The holder ended the session: nothing it was forwarded succeeds.
    assert_eq!(curl_status(SOURCE, a, &bundle, API, "/after-stop"), 0);
    wait_forwarding(&rig, 0, 0.0);
    let before = rig.members[0].metric("gateway_forwarded_total{result=\"forwarded\"}");
    assert_eq!(curl_status(SOURCE, a, &bundle, API, "/withdrawn"), 0);
    assert_eq!(
        rig.members[0].metric("gateway_forwarded_total{result=\"forwarded\"}"),
        before,
        "a withdrawn entry forwards nothing"
    );
}

/// A member restarted without a handover holds no authority for a live
/// session, and does not know its names: it passes the session's DNS
/// queries to the holder over the member link (a stream whose header says
/// DNS), and passes the holder's answers back. The holder judges them as
/// its own (a listed name answered, another NXDOMAIN) and counts them on
/// its record; a source no member holds is refused by both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_member_passes_a_sessions_dns_to_the_holder() {
    let mut rig: Pair = Pair::builder()
        .lease(LEASE)
        .renewing()
        .linked()
        .dns()
        .egress(&[API])
        .secret("API_TOKEN", SECRET)
        .start_loopback(&[API])
        .await;
    let id = rig.start_session(&session(SOURCE));
    let answerers = rig.answerers.clone();
    let dig_at = |i: usize, source: &str, name: &str, more: &[&str]| {
        let a = answerers[i];
        let (at, port) = (format!("@{}", a.ip()), a.port().to_string());
        let mut args = vec![at.as_str(), "-p", &port, "-b", source, name, "A"];
        args.extend_from_slice(more);
        talos_e2e::resolving::dig(&args)
    };
    use talos_e2e::resolving::status;
    // Both members hold it: each answers itself.
    for i in 0..2 {
        let out = dig_at(i, SOURCE, API, &[]);
        assert_eq!(status(&out), "NOERROR", "member {i}: {out}");
        assert!(out.contains("IN\tA\t127.0.0.1"), "{out}");
    }
    rig.members[0].kill();
    rig.restart(0);
    wait_forwarding(&rig, 0, 1.0);
    let started = std::time::Instant::now();
    for more in [&[][..], &["+tcp"][..]] {
        let out = dig_at(0, SOURCE, API, more);
        assert_eq!(status(&out), "NOERROR", "through gw-a {more:?}: {out}");
        assert!(out.contains("IN\tA\t127.0.0.1"), "{out}");
        let out = dig_at(0, SOURCE, "unlisted.test", more);
        assert_eq!(
            status(&out),
            "NXDOMAIN",
            "the holder's word {more:?}: {out}"
        );
    }
    matrix(
        "SIGKILL gw-a, start again",
        "dig A of a listed and an unlisted name at gw-a, UDP and TCP",
        "NOERROR and NXDOMAIN, from gw-b over the link",
        started.elapsed(),
    );
    assert_eq!(
        rig.members[0].metric("gateway_dns_queries_total{outcome=\"forwarded\"}"),
        Some(4.0)
    );
    let out = dig_at(0, talos_e2e::clients::UNKNOWN_SOURCE, API, &[]);
    assert_eq!(status(&out), "REFUSED", "{out}");
    // The holder's record counts the session's queries.
    wait::until("gw-b's record of the session's DNS", || {
        let counted: u64 = rig.members[1]
            .records()
            .iter()
            .filter(|r| r["kind"] == "dns" && r["session_id"] == id.as_str())
            .map(|r| r["queries"]["unlisted"].as_u64().unwrap_or(0))
            .sum();
        wait::check(counted, |n| *n >= 2)
    });
}

/// The PROXY v2 header a forwarder sends, made here by hand (not by the
/// gateway's own encoder): `source` to `destination`, IPv4, with the
/// link's session TLV.
fn proxy_header(
    source: SocketAddr,
    destination: SocketAddr,
    session: &str,
    attempt: u32,
) -> Vec<u8> {
    let (SocketAddr::V4(s), SocketAddr::V4(d)) = (source, destination) else {
        panic!("IPv4 only here");
    };
    let mut body = Vec::new();
    body.extend_from_slice(&s.ip().octets());
    body.extend_from_slice(&d.ip().octets());
    body.extend_from_slice(&s.port().to_be_bytes());
    body.extend_from_slice(&d.port().to_be_bytes());
    let mut tlv = attempt.to_be_bytes().to_vec();
    tlv.extend_from_slice(session.as_bytes());
    body.push(0xE1);
    body.extend_from_slice(&(tlv.len() as u16).to_be_bytes());
    body.extend_from_slice(&tlv);
    let mut out = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    out.push(0x21);
    out.push(0x11);
    out.extend_from_slice(&(body.len() as u16).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// A TLS client for the member link with identity `id` of `control_dir`
/// (none: no client certificate), expecting the server to be `server`.
fn link_client(control_dir: &std::path::Path, id: Option<&str>) -> tokio_rustls::TlsConnector {
    let pem = |name: &str| std::fs::read(control_dir.join(name)).expect("pem");
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut &pem("ca.pem")[..]) {
        roots.add(c.expect("ca")).expect("root");
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("tls13")
        .with_root_certificates(roots);
    let mut config = match id {
        Some(id) => {
            let chain = rustls_pemfile::certs(&mut &pem(&format!("{id}.pem"))[..])
                .collect::<Result<Vec<_>, _>>()
                .expect("chain");
            let key = rustls_pemfile::private_key(&mut &pem(&format!("{id}.key"))[..])
                .expect("key")
                .expect("a key");
            builder.with_client_auth_cert(chain, key).expect("identity")
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"talos-link/1".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Connect to `link` as `id` and, as a forwarder does, open one stream
/// of the link's HTTP/2 connection whose body is `header`; read until the
/// member ends it: the bytes it sent back (none for a refusal before a
/// session's byte) or the error.
async fn try_link(
    control_dir: &std::path::Path,
    id: Option<&str>,
    link: SocketAddr,
    header: &[u8],
) -> Result<Vec<u8>, std::io::Error> {
    use http_body_util::BodyExt;
    let tcp = tokio::net::TcpStream::connect(link).await?;
    let name = rustls::pki_types::ServerName::try_from("gw-a").expect("name");
    let run = async {
        let tls = link_client(control_dir, id).connect(name, tcp).await?;
        let (mut sender, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tls),
        )
        .await
        .map_err(std::io::Error::other)?;
        tokio::spawn(conn);
        let request = hyper::Request::post("https://link/")
            .body(http_body_util::Full::new(bytes::Bytes::copy_from_slice(
                header,
            )))
            .expect("request");
        let response = sender
            .send_request(request)
            .await
            .map_err(std::io::Error::other)?;
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(std::io::Error::other)?;
        Ok(body.to_bytes().to_vec())
    };
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .map_err(|_| std::io::Error::other("the member neither answered nor closed"))?
}

/// A claimed source on the member link is taken only from a member of
/// this pair: no certificate, the control plane's certificate, or a
/// gateway certificate of the same CA whose id is not a peer here is
/// refused and logged, before any session byte is read. A connection a
/// real peer forwards is never forwarded again: gw-a, which forwards the
/// session, refuses it `unknown_source` and records it as come through
/// the peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_link_refuses_strangers_and_second_hops() {
    let mut rig = linked_pair().await;
    let id = rig.start_session(&session(SOURCE));
    rig.members[0].kill();
    rig.restart(0);
    wait_forwarding(&rig, 0, 1.0);
    let link = rig.pair_links[0];
    let source: SocketAddr = format!("{SOURCE}:40000").parse().unwrap();
    let header = proxy_header(source, "127.0.0.1:443".parse().unwrap(), &id, 1);
    let dir = rig.stub.control_dir.clone();
    let metric = |cause: &str| {
        rig.members[0].metric(&format!("gateway_link_refused_total{{cause=\"{cause}\"}}"))
    };
    // No client certificate: the handshake fails.
    let none = try_link(&dir, None, link, &header).await;
    assert!(
        none.is_err() || none.as_ref().is_ok_and(Vec::is_empty),
        "{none:?}"
    );
    // The control plane's identity: of the CA, not a gateway.
    let plane = try_link(&dir, Some("stub"), link, &header).await;
    assert!(
        plane.is_err() || plane.as_ref().is_ok_and(Vec::is_empty),
        "{plane:?}"
    );
    // A gateway of the same CA that is no peer of gw-a.
    let stranger = try_link(&dir, Some("gw-c"), link, &header).await;
    assert!(
        stranger.is_err() || stranger.as_ref().is_ok_and(Vec::is_empty),
        "{stranger:?}"
    );
    wait::until("the three refusals counted", || {
        let seen = (
            metric("handshake_failed"),
            metric("not_a_gateway"),
            metric("not_a_peer"),
        );
        wait::check(seen, |s| *s == (Some(1.0), Some(1.0), Some(1.0)))
    });
    let log = rig.members[0].log();
    assert!(log.contains("member link connection refused"), "{log}");
    // gw-b's own identity, forwarding to gw-a a connection gw-a would
    // itself forward: refused, never sent on.
    let forwarded = rig.members[0].metric("gateway_forwarded_total{result=\"forwarded\"}");
    let hop = try_link(&dir, Some("gw-b"), link, &header).await;
    assert!(hop.as_ref().is_ok_and(Vec::is_empty), "{hop:?}");
    assert_eq!(
        rig.members[0].metric("gateway_forwarded_total{result=\"forwarded\"}"),
        forwarded,
        "no second hop"
    );
    let record = wait::until("gw-a's record of the second hop", || {
        let records = rig.members[0].records();
        wait::check(
            records.into_iter().find(|r| r["via"] == "gw-b"),
            Option::is_some,
        )
    })
    .expect("a record");
    assert_eq!(record["verdict"], "unknown_source", "{record}");
    assert_eq!(record["source"], source.to_string(), "{record}");
}

/// Stop and Revoke All while a restarted member forwards: the session
/// ends everywhere. A connection open through the forwarder is cut before
/// the command returns and recorded cut by the holder (`session_ended`);
/// no new forwarded connection succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stop_and_revoke_all_while_forwarding_end_the_session_everywhere() {
    let mut rig = linked_pair().await;
    let stopped = rig.start_session(&session(SOURCE).mode("agent"));
    let revoked = rig.start_session(&session(SOURCE_2).mode("agent"));
    let (bundle_1, _) = rig.trust(&stopped, "trust-1.pem");
    let (bundle_2, _) = rig.trust(&revoked, "trust-2.pem");
    rig.members[0].kill();
    rig.restart(0);
    wait_forwarding(&rig, 0, 2.0);
    let a = rig.members[0].data;
    for (id, source, bundle, command) in [
        (&stopped, SOURCE, &bundle_1, "stop"),
        (&revoked, SOURCE_2, &bundle_2, "revoke-all"),
    ] {
        let mut kept = Kept::open(source, a, API, bundle, &format!("/kept/{command}")).await;
        let (ran, took) = rig.timed(&["sandbox", command, id]);
        let t = ran.json();
        matrix(
            "gw-a restarted, forwarding",
            &format!("sandbox {command}"),
            t["state"].as_str().unwrap_or("?"),
            took,
        );
        assert_eq!(t["state"], "ended", "{t}");
        let cut = kept.get(&format!("/kept/{command}/after")).await;
        assert!(cut.is_err(), "the forwarded connection is cut: {cut:?}");
        assert_eq!(
            curl_status(source, a, bundle, API, &format!("/after-{command}")),
            0
        );
        let cert = rig.wait_issued(id);
        let of: Vec<&Value> = cert["connections"]
            .as_array()
            .expect("connections")
            .iter()
            .filter(|c| first_path(c) == Some(&format!("/kept/{command}")))
            .collect();
        assert_eq!(of.len(), 1, "{cert}");
        assert_eq!(of[0]["gateway_id"], "gw-b");
        assert_eq!(of[0]["via"], "gw-a");
        assert_eq!(of[0]["verdict"], "session_ended", "recorded cut: {}", of[0]);
    }
}

/// A member cut off from the control plane past its lease while its peer
/// keeps renewing: its authority lapses, and it forwards the session's
/// connections to the peer on the peer's own word. Healed, the session
/// stopped, it forwards nothing for it within the forwarding lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_cut_off_from_the_control_plane_forwards_on_its_peers_word() {
    let mut rig = linked_pair().await;
    let id = rig.start_session(&session(SOURCE).mode("agent"));
    let (bundle, _) = rig.trust(&id, "trust-1.pem");
    // The partition: serve reaches gw-b only (gw-a's address, overriding
    // the store's, is one where nothing listens).
    let links = rig.links();
    let nowhere = talos_e2e::ports::reserve();
    assert!(rig.stub.stop_serve(), "serve drains and exits 0");
    rig.stub.serve_gateways = vec![("gw-a".to_owned(), nowhere), links[1].clone()];
    rig.stub.start_serve();
    wait::until("gw-a's lease to lapse", || {
        wait::check(rig.members[0].metric("gateway_leases_lapsed_total"), |n| {
            *n == Some(1.0)
        })
    });
    wait_forwarding(&rig, 0, 1.0);
    let a = rig.members[0].data;
    for i in 0..20 {
        assert_eq!(
            curl_status(SOURCE, a, &bundle, API, &format!("/cut-off/{i}")),
            200,
            "connection {i} through gw-b"
        );
    }
    // Healed.
    assert!(rig.stub.stop_serve(), "serve drains and exits 0");
    rig.stub.serve_gateways = links;
    rig.stub.start_serve();
    let ran = rig.cli(&["sandbox", "stop", &id]).json();
    assert_eq!(ran["state"], "ended", "{ran}");
    assert_eq!(curl_status(SOURCE, a, &bundle, API, "/after-stop"), 0);
    wait_forwarding(&rig, 0, 0.0);
    let cert = rig.wait_issued(&id);
    let through_b = cert["connections"]
        .as_array()
        .expect("connections")
        .iter()
        .filter(|c| {
            first_path(c).is_some_and(|p| p.starts_with("/cut-off/"))
                && c["gateway_id"] == "gw-b"
                && c["via"] == "gw-a"
        })
        .count();
    assert_eq!(through_b, 20, "{cert}");
}

/// Upgrades in place while a restarted member forwards: the forwarder's
/// successor takes the link's listener with the others and forwards from
/// its first connection; the holder's successor takes the session's
/// authority and the link's listener, and the forwarder's connections go
/// on reaching it. Not one connection fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upgrades_of_either_member_keep_forwarding() {
    use talos_e2e::member::{alive, signal, Member};
    let mut rig: Pair<Member> = linked_pair_of(LEASE).await;
    let id = rig.start_session(&session(SOURCE).mode("agent"));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    let crashed = rig.members[0].pid();
    signal(crashed, "KILL");
    wait::until("gw-a to be gone", || wait::check(alive(crashed), |a| !a));
    rig.restart(0);
    wait::until("gw-a to forward the session", || {
        wait::check(rig.members[0].metric("gateway_forwarding_sessions"), |n| {
            *n == Some(1.0)
        })
    });
    let a = rig.members[0].data();
    for (i, upgraded) in [0, 1].into_iter().enumerate() {
        let member = &mut rig.members[upgraded];
        let old = member.pid();
        let (ok, out, err) = member.command("upgrade");
        assert!(ok, "upgrade: {out} {err}\n{}", member.log());
        member.wait_ready(2);
        for n in 0..20 {
            assert_eq!(
                curl_status(SOURCE, a, &bundle, API, &format!("/upgraded-{i}/{n}")),
                200,
                "after the upgrade of member {upgraded}: {n}"
            );
        }
        wait::until("the old process to exit", || {
            wait::check(alive(old), |a| !a)
        });
    }
    assert_eq!(
        rig.members[0].metric("gateway_forwarded_total{result=\"forwarded\"}"),
        Some(40.0),
        "gw-a's successor forwarded every connection after the upgrades"
    );
}

/// Queries each transport sends at most in [`dns_across_an_upgrade_of_a_forwarding_member_is_never_refused`].
const MAX_QUERIES: u64 = 50_000;

/// The longest one query waits for its answer before it counts as
/// unanswered.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// A DNS query for `name` A, numbered `id`.
fn dns_query(id: u16, name: &str) -> Vec<u8> {
    use hickory_proto::op::{Message, MessageType, OpCode, Query};
    use hickory_proto::rr::{Name, RecordType};
    let mut m = Message::new();
    m.set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true);
    m.add_query(Query::query(
        Name::from_ascii(name).expect("name"),
        RecordType::A,
    ));
    m.to_vec().expect("query")
}

/// The answer's code, if `bytes` answer query `id`.
fn answer_code(bytes: &[u8], id: u16) -> Option<hickory_proto::op::ResponseCode> {
    let m = hickory_proto::op::Message::from_vec(bytes).ok()?;
    (m.id() == id).then(|| m.response_code())
}

/// One query after another from `source` to `at` for `name`, over UDP (one
/// socket) or TCP (a connection each), until `stop`, [`MAX_QUERIES`] or
/// [`wait::DEADLINE`] four times over: each query's answer code (`None`:
/// no answer within [`QUERY_TIMEOUT`]). `answered` counts the NOERROR
/// answers as they come.
async fn ask_until_stopped(
    source: &'static str,
    at: SocketAddr,
    name: &'static str,
    tcp: bool,
    stop: Arc<std::sync::atomic::AtomicBool>,
    answered: Arc<std::sync::atomic::AtomicU64>,
) -> Vec<Option<hickory_proto::op::ResponseCode>> {
    use std::sync::atomic::Ordering;
    let udp = if tcp {
        None
    } else {
        let s = tokio::net::UdpSocket::bind((source, 0)).await.expect("udp");
        Some(s)
    };
    let began = std::time::Instant::now();
    let mut got = Vec::new();
    for n in 0..MAX_QUERIES {
        if stop.load(Ordering::Relaxed) || began.elapsed() > 4 * wait::DEADLINE {
            break;
        }
        let id = n as u16;
        let query = dns_query(id, name);
        let one = async {
            match &udp {
                Some(s) => {
                    s.send_to(&query, at).await.ok()?;
                    let mut buf = vec![0u8; 4096];
                    loop {
                        let len = s.recv(&mut buf).await.ok()?;
                        if let Some(code) = answer_code(&buf[..len], id) {
                            return Some(code);
                        }
                    }
                }
                None => {
                    let mut c = talos_e2e::clients::connect_from(source, at).await;
                    let mut framed = (query.len() as u16).to_be_bytes().to_vec();
                    framed.extend_from_slice(&query);
                    c.write_all(&framed).await.ok()?;
                    let mut len = [0u8; 2];
                    c.read_exact(&mut len).await.ok()?;
                    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
                    c.read_exact(&mut buf).await.ok()?;
                    answer_code(&buf, id)
                }
            }
        };
        let code = tokio::time::timeout(QUERY_TIMEOUT, one)
            .await
            .ok()
            .flatten();
        if code == Some(hickory_proto::op::ResponseCode::NoError) {
            answered.fetch_add(1, Ordering::Relaxed);
        }
        got.push(code);
    }
    got
}

/// The sessions' DNS across `gateway upgrade` of a member that forwards
/// the session: queries from the session's source, one after another
/// over UDP and over TCP (a connection each), sent all through the
/// upgrade, are every one answered by the holder's word (NOERROR), none
/// REFUSED. The successor answers nothing on the DNS sockets it took over
/// before it knows who holds the session (the forwarding table comes
/// with the authorities); what is sent meanwhile waits in the sockets.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dns_across_an_upgrade_of_a_forwarding_member_is_never_refused() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use talos_e2e::member::{alive, signal, Member};
    let mut rig: Pair<Member> = Pair::builder()
        .lease(LEASE)
        .renewing()
        .linked()
        // The queries come as fast as they are answered: the shares must
        // not drop any.
        .dns_with("queries_per_second = 10000\n")
        .egress(&[API])
        .secret("API_TOKEN", SECRET)
        .start_loopback(&[API])
        .await;
    rig.start_session(&session(SOURCE));
    let crashed = rig.members[0].pid();
    signal(crashed, "KILL");
    wait::until("gw-a to be gone", || wait::check(alive(crashed), |a| !a));
    rig.restart(0);
    wait::until("gw-a to forward the session", || {
        wait::check(rig.members[0].metric("gateway_forwarding_sessions"), |n| {
            *n == Some(1.0)
        })
    });
    let at = rig.answerers[0];
    let stop = Arc::new(AtomicBool::new(false));
    let counts = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    let askers: Vec<_> = [false, true]
        .into_iter()
        .zip(&counts)
        .map(|(tcp, answered)| {
            tokio::spawn(ask_until_stopped(
                SOURCE,
                at,
                API,
                tcp,
                Arc::clone(&stop),
                Arc::clone(answered),
            ))
        })
        .collect();
    let answered = || counts.each_ref().map(|c| c.load(Ordering::Relaxed));
    // Both transports answered through gw-a (forwarded to gw-b) first.
    wait::until_async("queries answered through gw-a before the upgrade", || {
        wait::check(answered(), |a| a.iter().all(|n| *n >= 20))
    })
    .await;
    let started = std::time::Instant::now();
    let member = &mut rig.members[0];
    let old = member.pid();
    let (ok, out, err) = tokio::task::block_in_place(|| member.command("upgrade"));
    assert!(ok, "upgrade: {out} {err}\n{}", member.log());
    tokio::task::block_in_place(|| member.wait_ready(2));
    // Until the old process has gone and the successor has answered both
    // transports for a while.
    let mark = answered();
    wait::until_async(
        "the old process to exit and the successor to answer",
        || {
            let now = answered();
            wait::check((alive(old), now), |(alive, now)| {
                !alive && now.iter().zip(mark).all(|(n, m)| *n >= m + 50)
            })
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut seen = Vec::new();
    for (asker, transport) in askers.into_iter().zip(["UDP", "TCP"]) {
        let got = asker.await.expect("asker");
        let mut by_code = std::collections::BTreeMap::new();
        for code in &got {
            *by_code
                .entry(code.map_or("no answer".to_owned(), |c| c.to_string()))
                .or_insert(0) += 1;
        }
        seen.push(format!("{transport} {by_code:?}"));
        let refused = got
            .iter()
            .filter(|c| **c == Some(hickory_proto::op::ResponseCode::Refused))
            .count();
        assert_eq!(
            refused,
            0,
            "{transport}: queries REFUSED across the upgrade: {by_code:?}\n{}",
            rig.members[0].log()
        );
        assert!(
            got.iter()
                .all(|c| *c == Some(hickory_proto::op::ResponseCode::NoError)),
            "{transport}: every query answered NOERROR: {by_code:?}"
        );
    }
    matrix(
        "gateway upgrade of gw-a, which forwards the session",
        "dig-like queries from the session's source at gw-a, UDP and TCP, all through",
        &seen.join("; "),
        started.elapsed(),
    );
    assert!(
        rig.members[0]
            .metric("gateway_dns_queries_total{outcome=\"forwarded\"}")
            .is_some_and(|n| n > 0.0),
        "the successor passed the session's queries to gw-b"
    );
}

/// No holder reachable: a forwarded connection is refused `upstream_failed`,
/// cause `holder_unreachable` (a TLS alert, the record and the metric say
/// so). A claimed source anywhere but the member link counts for nothing:
/// a PROXY header sent to the data listener naming the session's source
/// is judged by the connection's real source (no session's:
/// `unknown_source`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_holder_reachable_is_refused_and_a_claimed_source_off_the_link_is_not_taken() {
    // Entries stand for a long lease here: the member still forwards
    // when its holder has gone.
    let mut rig: Pair = linked_pair_of(Duration::from_secs(60)).await;
    let id = rig.start_session(&session(SOURCE).mode("agent"));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    rig.members[0].kill();
    rig.restart(0);
    wait_forwarding(&rig, 0, 1.0);
    let a = rig.members[0].data;
    assert_eq!(curl_status(SOURCE, a, &bundle, API, "/before"), 200);

    // A PROXY header naming the session's source, sent from elsewhere to
    // the data listener.
    let claimed: SocketAddr = format!("{SOURCE}:40000").parse().unwrap();
    let header = proxy_header(claimed, "127.0.0.1:443".parse().unwrap(), &id, 1);
    let mut tcp = tokio::net::TcpStream::connect(a).await.expect("connect");
    tcp.write_all(&header).await.expect("header");
    let mut back = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), tcp.read_to_end(&mut back)).await;
    let record = wait::until("gw-a's record of the claimed source", || {
        wait::check(
            rig.members[0].records().into_iter().find(|r| {
                r["source"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("127.0.0.1:"))
            }),
            Option::is_some,
        )
    })
    .expect("a record");
    assert_eq!(
        record["verdict"], "unknown_source",
        "judged by its real source, no session's: {record}"
    );

    rig.members[1].kill();
    assert_eq!(curl_status(SOURCE, a, &bundle, API, "/no-holder"), 0);
    assert_eq!(
        rig.members[0].metric("gateway_forwarded_total{result=\"holder_unreachable\"}"),
        Some(1.0)
    );
    let record = wait::until("gw-a's record of the refusal", || {
        wait::check(
            rig.members[0]
                .records()
                .into_iter()
                .find(|r| r["cause"] == "holder_unreachable"),
            Option::is_some,
        )
    })
    .expect("a record");
    assert_eq!(record["verdict"], "upstream_failed", "{record}");
    assert_eq!(record["session_id"], id.as_str(), "{record}");
    assert!(record.get("forwarded_to").is_none(), "{record}");
    let log = rig.members[0].log();
    assert!(
        log.contains("holder unreachable over the member link"),
        "{log}"
    );
}
