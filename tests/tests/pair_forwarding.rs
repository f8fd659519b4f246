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
/// (none: no client certificate), offering ALPN `talos-link/1`.
fn link_client(control_dir: &std::path::Path, id: Option<&str>) -> tokio_rustls::TlsConnector {
    link_client_offering(control_dir, id, Some(b"talos-link/1"))
}

/// [`link_client`] offering `alpn` (none: no ALPN extension at all).
fn link_client_offering(
    control_dir: &std::path::Path,
    id: Option<&str>,
    alpn: Option<&[u8]>,
) -> tokio_rustls::TlsConnector {
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
    config.alpn_protocols = alpn.into_iter().map(<[u8]>::to_vec).collect();
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
    try_link_with(link_client(control_dir, id), link, header).await
}

/// [`try_link`] with the TLS client `client`.
async fn try_link_with(
    client: tokio_rustls::TlsConnector,
    link: SocketAddr,
    header: &[u8],
) -> Result<Vec<u8>, std::io::Error> {
    use http_body_util::BodyExt;
    let tcp = tokio::net::TcpStream::connect(link).await?;
    let name = rustls::pki_types::ServerName::try_from("gw-a").expect("name");
    let run = async {
        let tls = client.connect(name, tcp).await?;
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

/// The downloads of [`the_certificate_with_a_slowly_reading_client`]: far
/// more than every buffer between the origin and the client holds, so the
/// forwarder holds bytes of each when its client stops reading. Three
/// sizes, so that each download's record is told apart by its path.
const SLOW_DOWNLOADS: [u64; 3] = [1 << 30, (1 << 30) + 1, (1 << 30) + 2];

/// The certificate with a slowly reading client: a restarted member
/// forwards three downloads whose client reads their first bytes, then
/// nothing. A Stop cuts them on the holder, whose records (`via` the
/// forwarder) are in at once; the forwarder's hand-off records close
/// only once the client has read what the holder sent before the cut. The
/// certificate waits for them, and says what it waits for (so does
/// `sandbox status`); once the client has read, it is issued with each
/// download once, the holder's record counted and the hand-off beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_certificate_with_a_slowly_reading_client() {
    use talos_e2e::clients::http;
    let mut rig = linked_pair().await;
    let id = rig.start_session(&session(SOURCE).mode("agent"));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    rig.members[0].kill();
    rig.restart(0);
    wait_forwarding(&rig, 0, 1.0);
    let a = rig.members[0].data;
    let mut downloads = Vec::new();
    for size in SLOW_DOWNLOADS {
        let mut tls = http::tls(SOURCE, a, API, &bundle, false).await;
        tls.write_all(format!("GET /download/{size} HTTP/1.1\r\nhost: {API}\r\n\r\n").as_bytes())
            .await
            .expect("request");
        let mut head = vec![0u8; 64 * 1024];
        let mut n = 0;
        while n < head.len() {
            let got = tokio::time::timeout(wait::DEADLINE, tls.read(&mut head[n..]))
                .await
                .expect("the download's first bytes in time")
                .expect("read");
            assert!(got > 0, "the download ended early");
            n += got;
        }
        assert!(head.starts_with(b"HTTP/1.1 200"), "{:?}", &head[..64]);
        downloads.push(tls);
    }
    assert_eq!(
        rig.members[0].metric("gateway_forwarded_total{result=\"forwarded\"}"),
        Some(3.0)
    );
    let ran = rig.cli(&["sandbox", "stop", &id]).json();
    assert_eq!(ran["state"], "ended", "{ran}");

    // The holder's records of the three downloads are in; the forwarder
    // still holds each connection (its client reads nothing), so none of
    // its hand-off records is written.
    let paths: Vec<String> = SLOW_DOWNLOADS
        .iter()
        .map(|s| format!("/download/{s}"))
        .collect();
    let holders_in = |c: &Value| {
        c["connections"].as_array().is_some_and(|all| {
            paths.iter().all(|p| {
                all.iter()
                    .any(|r| first_path(r) == Some(p) && r["via"] == "gw-a")
            })
        })
    };
    let cert = blocking_certificate(&rig, &id, |c| c["issued"] == true || holders_in(c));
    let handed_on_a = rig.members[0]
        .session_records(&id)
        .into_iter()
        .filter(|r| r["forwarded_to"] == "gw-b")
        .count();
    assert_eq!(handed_on_a, 0, "the forwarder holds the three connections");
    assert_eq!(
        cert["issued"], false,
        "issued while the forwarder's hand-off records were still to come: {cert}"
    );
    let because = cert["not_issued_because"].as_str().unwrap_or_default();
    assert!(
        because.contains("gw-a") && because.contains("hand-off records of 3 connections"),
        "{cert}"
    );
    let status = rig.status(&id);
    assert_eq!(status["state"], "ended");
    assert!(
        status["certificate_waits_for"]
            .as_str()
            .is_some_and(|w| w.contains("hand-off records of 3 connections")),
        "{status}"
    );

    // The client reads what the forwarder holds, to the end of each
    // connection: the hand-offs close, and the certificate is issued.
    for mut tls in downloads {
        let mut buf = vec![0u8; 256 * 1024];
        let ended = tokio::time::timeout(wait::DEADLINE, async {
            while let Ok(n) = tls.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
        assert!(ended.is_ok(), "the forwarded connection ends once read");
    }
    let cert = rig.wait_issued(&id);
    for path in &paths {
        let of: Vec<&Value> = cert["connections"]
            .as_array()
            .expect("connections")
            .iter()
            .filter(|c| first_path(c) == Some(path.as_str()))
            .collect();
        assert_eq!(of.len(), 1, "{path} once: {cert}");
        assert_eq!(of[0]["gateway_id"], "gw-b", "{}", of[0]);
        assert_eq!(of[0]["via"], "gw-a", "{}", of[0]);
        let handed: Vec<&Value> = cert["forwarded"]
            .as_array()
            .expect("forwarded")
            .iter()
            .filter(|h| h["source"] == of[0]["source"])
            .collect();
        assert_eq!(handed.len(), 1, "{path}'s hand-off beside it: {cert}");
        assert_eq!(handed[0]["gateway_id"], "gw-a");
        assert_eq!(handed[0]["forwarded_to"], "gw-b");
        assert_eq!(handed[0]["verdict"], "allowed");
    }
}

/// The session's certificate as `certificate` prints it (issued or not),
/// once `done` holds of it (at most [`wait::DEADLINE`]).
fn blocking_certificate(rig: &Pair, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let cert = talos_e2e::rig::blocking(|| {
        rig.stub
            .wait_certificate(id, wait::DEADLINE.as_secs(), &done)
    });
    assert!(done(&cert), "waited for the certificate: {cert}");
    cert
}

/// Wait until member `asker` has asked its peer what it holds, and taken
/// the answer, at least once since now: the peer has told it three more
/// times (the first may have been under way already, and `asker` sets
/// its gauge from an answer before it asks again). The peer logs each
/// answer at debug level, the rig's.
fn wait_peer_told(rig: &Pair, asker: usize) {
    let teller = &rig.members[1 - asker];
    let told = || {
        teller
            .log()
            .matches("told a peer what this member holds")
            .count()
    };
    let before = told();
    wait::until(
        &format!("member {asker} to hear its peer's word again"),
        || wait::check(told(), |n| *n >= before + 3),
    );
}

/// `gateway_forwarding_sessions` counts the sessions a member forwards
/// for, never those it holds itself: 0 on both members of a healthy
/// linked pair with live sessions (each hears its peer name them), 2 on a
/// member restarted without a handover, and the runbook's remedy for
/// TalosMemberForwarding, done as docs/runbook.md says, clears it: a
/// session in mode commands paused and resumed with the CLI gets its own
/// authority on the member again, which forwards it no more; one in mode
/// agent cannot pause (`sandbox_pause_unavailable`) and is forwarded
/// until it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_forwarding_gauge_on_a_healthy_pair_and_the_runbooks_remedy() {
    let mut rig = linked_pair().await;
    let commands = rig.start_session(&session(SOURCE));
    let agent = rig.start_session(&session(SOURCE_2).mode("agent"));
    for i in 0..2 {
        wait_peer_told(&rig, i);
        assert_eq!(
            rig.members[i].metric("gateway_forwarding_sessions"),
            Some(0.0),
            "member {i} holds both sessions and forwards neither"
        );
    }
    rig.members[0].kill();
    rig.restart(0);
    wait_forwarding(&rig, 0, 2.0);
    wait_peer_told(&rig, 1);
    assert_eq!(
        rig.members[1].metric("gateway_forwarding_sessions"),
        Some(0.0),
        "the holder forwards nothing"
    );
    let (bundle, _) = rig.trust(&commands, "trust-commands.pem");
    assert_eq!(
        curl_status(SOURCE, rig.members[0].data, &bundle, API, "/forwarded"),
        200
    );
    // The runbook's remedy: the session's next attempt.
    let started = std::time::Instant::now();
    let paused = rig.cli(&["sandbox", "pause", &commands]).json();
    assert_eq!(paused["state"], "paused", "{paused}");
    let resumed = rig.cli(&["sandbox", "resume", &commands]).json();
    assert_eq!(resumed["state"], "running", "{resumed}");
    wait_forwarding(&rig, 0, 1.0);
    matrix(
        "gw-a restarted, forwarding two sessions",
        "sandbox pause, sandbox resume (mode commands)",
        "gateway_forwarding_sessions 2 -> 1",
        started.elapsed(),
    );
    let (bundle, listed) = rig.trust(&commands, "trust-commands-2.pem");
    assert_eq!(
        listed.len(),
        2,
        "both members made a CA for the new attempt"
    );
    let before = rig.members[0].metric("gateway_forwarded_total{result=\"forwarded\"}");
    assert_eq!(
        curl_status(SOURCE, rig.members[0].data, &bundle, API, "/own-again"),
        200
    );
    assert_eq!(
        rig.members[0].metric("gateway_forwarded_total{result=\"forwarded\"}"),
        before,
        "served by gw-a's own authority"
    );
    // Mode agent: no pause; forwarded until it ends.
    let ran = rig.cli(&["sandbox", "pause", &agent]);
    assert_eq!(ran.code(), "sandbox_pause_unavailable", "{}", ran.stderr);
    let stopped = rig.cli(&["sandbox", "stop", &agent]).json();
    assert_eq!(stopped["state"], "ended", "{stopped}");
    wait_forwarding(&rig, 0, 0.0);
}

/// The member link speaks ALPN `talos-link/1` (and `talos-holdings/1`),
/// as the docs say: a client with a peer's own certificate that offers
/// no ALPN (which rustls lets through) is refused `no_alpn` before a
/// session's byte, logged and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_link_refuses_a_client_that_offers_no_alpn() {
    let rig = linked_pair().await;
    let id = rig.start_session(&session(SOURCE));
    let link = rig.pair_links[0];
    let dir = rig.stub.control_dir.clone();
    let metric = |cause: &str| {
        rig.members[0].metric(&format!("gateway_link_refused_total{{cause=\"{cause}\"}}"))
    };
    let header = proxy_header(
        format!("{SOURCE}:40000").parse().unwrap(),
        "127.0.0.1:443".parse().unwrap(),
        &id,
        1,
    );
    let none = try_link_with(
        link_client_offering(&dir, Some("gw-b"), None),
        link,
        &header,
    )
    .await;
    assert!(
        none.is_err() || none.as_ref().is_ok_and(Vec::is_empty),
        "{none:?}"
    );
    wait::until("the refusal without ALPN counted", || {
        wait::check(metric("no_alpn"), |n| *n == Some(1.0))
    });
    let log = rig.members[0].log();
    assert!(
        log.contains("member link connection refused") && log.contains("no_alpn"),
        "{log}"
    );
    assert!(
        rig.members[0].records().iter().all(|r| r["via"] != "gw-b"),
        "nothing served from it"
    );
}

/// The attempt the link's header carries is compared, as the docs say: a
/// stream whose header names another attempt of the session its source
/// belongs to here, or another session, is refused `unknown_source`
/// (causes `link_attempt_mismatch`, `link_session_mismatch`), recorded,
/// logged and counted in `gateway_link_refused_total`, and a DNS stream
/// for another attempt goes unanswered and is counted the same; the
/// attempt held passes that check.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_link_refuses_a_stream_for_another_attempt() {
    let rig = linked_pair().await;
    let id = rig.start_session(&session(SOURCE));
    let link = rig.pair_links[0];
    let dir = rig.stub.control_dir.clone();
    let metric = |cause: &str| {
        rig.members[0].metric(&format!("gateway_link_refused_total{{cause=\"{cause}\"}}"))
    };
    let to: SocketAddr = "127.0.0.1:443".parse().unwrap();
    let from = |port: u16| -> SocketAddr { format!("{SOURCE}:{port}").parse().unwrap() };
    // gw-a holds attempt 1: a stream for attempt 2, one for another
    // session, one for attempt 1.
    for (port, session, attempt) in [(40001, id.as_str(), 2), (40002, "sbx-another", 1)] {
        let header = proxy_header(from(port), to, session, attempt);
        let refused = try_link(&dir, Some("gw-b"), link, &header).await;
        assert!(refused.as_ref().is_ok_and(Vec::is_empty), "{refused:?}");
    }
    // A DNS stream (the link's service TLV) for attempt 2: refused too.
    let mut dns = proxy_header(from(40004), "127.0.0.1:53".parse().unwrap(), &id, 2);
    dns.extend_from_slice(&[0xE2, 0, 1, 1]);
    let len = u16::try_from(dns.len() - 16).unwrap();
    dns[14..16].copy_from_slice(&len.to_be_bytes());
    // Unanswered: the holder drops the stream (a reset) or ends it empty.
    let refused = try_link(&dir, Some("gw-b"), link, &dns).await;
    assert!(
        refused.is_err() || refused.as_ref().is_ok_and(Vec::is_empty),
        "{refused:?}"
    );
    let held = try_link(
        &dir,
        Some("gw-b"),
        link,
        &proxy_header(from(40003), to, &id, 1),
    )
    .await;
    assert!(held.is_ok(), "{held:?}");
    let records = wait::until("gw-a's records of the three streams", || {
        let records: Vec<Value> = rig.members[0]
            .records()
            .into_iter()
            .filter(|r| r["via"] == "gw-b" && r["verdict"].is_string())
            .collect();
        wait::check(records, |r| r.len() >= 3)
    });
    let of = |port: u16| {
        records
            .iter()
            .find(|r| r["source"] == from(port).to_string())
            .unwrap_or_else(|| panic!("a record from port {port}: {records:?}"))
    };
    assert_eq!(of(40001)["verdict"], "unknown_source");
    assert_eq!(of(40001)["cause"], "link_attempt_mismatch", "{}", of(40001));
    assert_eq!(of(40002)["verdict"], "unknown_source");
    assert_eq!(of(40002)["cause"], "link_session_mismatch", "{}", of(40002));
    assert_ne!(of(40003)["verdict"], "unknown_source", "{}", of(40003));
    wait::until("the three mismatches counted", || {
        let seen = (
            metric("link_attempt_mismatch"),
            metric("link_session_mismatch"),
        );
        wait::check(seen, |s| *s == (Some(2.0), Some(1.0)))
    });
    let log = rig.members[0].log();
    assert!(
        log.contains("member link stream refused") && log.contains("link_attempt_mismatch"),
        "{log}"
    );
}

/// `[pair] max_forwarded_per_session` in the bound tests: above the 16
/// unread streams that stalled the link before issue 40's fix.
const BOUND: usize = 20;

/// What an unread download or upload claims: more than every buffer on
/// its path holds, so that it never ends while the test runs.
const ENDLESS: u64 = 1 << 30;

/// What a connection that must go through downloads or uploads in full.
const WHOLE: usize = 8 << 20;

/// A linked pair (`max_forwarded_per_session` = [`BOUND`]) whose gw-a
/// was restarted without a handover and forwards two sessions, from
/// [`SOURCE`] and [`SOURCE_2`], to gw-b; their trust bundles.
async fn forwarding_two_sessions_at_a_bound() -> (Pair, std::path::PathBuf, std::path::PathBuf) {
    let mut rig: Pair = Pair::builder()
        .lease(LEASE)
        .renewing()
        .linked_with(&format!("max_forwarded_per_session = {BOUND}\n"))
        .egress(&[API])
        .secret("API_TOKEN", SECRET)
        .start_loopback(&[API])
        .await;
    let one = rig.start_session(&session(SOURCE));
    let two = rig.start_session(&session(SOURCE_2));
    let (bundle_1, _) = rig.trust(&one, "trust-1.pem");
    let (bundle_2, _) = rig.trust(&two, "trust-2.pem");
    rig.members[0].kill();
    rig.restart(0);
    wait_forwarding(&rig, 0, 2.0);
    (rig, bundle_1, bundle_2)
}

/// A session's TCP connection to `gateway` from `source` with a small
/// receive buffer (so that what it does not read backs up to the
/// gateway at once), TLS for [`API`] trusting `bundle`.
async fn session_tls(
    source: &str,
    gateway: SocketAddr,
    bundle: &std::path::Path,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    socket
        .bind(format!("{source}:0").parse().unwrap())
        .expect("bind the session's source");
    let tcp = socket.connect(gateway).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from(API).expect("name");
    tokio::time::timeout(
        Duration::from_secs(20),
        tokio_rustls::TlsConnector::from(talos_e2e::clients::client_tls(bundle)).connect(name, tcp),
    )
    .await
    .expect("the handshake in time")
    .expect("TLS through the gateway")
}

/// A download the session asks for and never reads: the answer's head
/// read (the download is under way through the link), then nothing.
async fn unread_download(
    source: &str,
    gateway: SocketAddr,
    bundle: &std::path::Path,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let mut tls = session_tls(source, gateway, bundle).await;
    let request = format!("GET /download/{ENDLESS} HTTP/1.1\r\nhost: {API}\r\n\r\n");
    tls.write_all(request.as_bytes()).await.expect("request");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(20), async {
        while !head.ends_with(b"\r\n\r\n") {
            assert!(head.len() < 4096, "no end of head: {head:?}");
            tls.read_exact(&mut byte).await.expect("the answer's head");
            head.push(byte[0]);
        }
    })
    .await
    .expect("the answer's head in time");
    assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
    tls
}

/// An upload the destination holds unread (`/hold/NAME/upload`: the
/// origin reads nothing until released): once the origin has the
/// request, the session's task writes its body until the path is full,
/// and waits there. The task, to abort.
async fn untaken_upload(
    source: &str,
    gateway: SocketAddr,
    bundle: &std::path::Path,
    name: &str,
    holds: &talos_e2e::origin::Holds,
) -> tokio::task::JoinHandle<()> {
    let mut tls = session_tls(source, gateway, bundle).await;
    let head = format!(
        "POST /hold/{name}/upload HTTP/1.1\r\nhost: {API}\r\ncontent-length: {ENDLESS}\r\n\r\n"
    );
    tls.write_all(head.as_bytes()).await.expect("request");
    let writing = tokio::spawn(async move {
        let chunk = vec![0x5a; 64 * 1024];
        for _ in 0..ENDLESS / chunk.len() as u64 {
            if tls.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    holds.wait_held(name).await;
    writing
}

/// One whole download of [`WHOLE`] bytes on a new connection from
/// `source` through `gateway`: its status and length, or what failed.
async fn whole_download(
    source: &str,
    gateway: SocketAddr,
    bundle: &std::path::Path,
) -> Result<(u16, usize), String> {
    whole_download_from(source, gateway, bundle).await.1
}

/// [`whole_download`], and the address it came from.
async fn whole_download_from(
    source: &str,
    gateway: SocketAddr,
    bundle: &std::path::Path,
) -> (SocketAddr, Result<(u16, usize), String>) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{source}:0").parse().unwrap())
        .expect("bind the session's source");
    let from = socket.local_addr().expect("bound");
    let got = talos_e2e::clients::get_once(
        socket,
        gateway,
        talos_e2e::clients::client_tls(bundle),
        API,
        &format!("/download/{WHOLE}"),
    )
    .await
    .map(|(status, body)| (status, body.len()));
    (from, got)
}

/// Session 1's own connection under its bound, a whole download; then
/// wait until gw-a has recorded it closed (its place under the bound is
/// given back before its record is written).
async fn own_next_connection_goes_through(rig: &Pair, bundle_1: &std::path::Path) {
    let (from, got) = whole_download_from(SOURCE, rig.members[0].data, bundle_1).await;
    assert_eq!(
        got,
        Ok((200, WHOLE)),
        "session 1's own next connection, under its bound, whole"
    );
    wait::until("gw-a's record of session 1's whole download", || {
        wait::check(
            rig.members[0]
                .records()
                .into_iter()
                .any(|r| r["source"] == from.to_string() && r["forwarded_to"] == "gw-b"),
            |seen| *seen,
        )
    });
}

/// One whole upload of [`WHOLE`] bytes on a new connection from `source`
/// through `gateway`: the length the origin read, or what failed.
async fn whole_upload(
    source: &str,
    gateway: SocketAddr,
    bundle: &std::path::Path,
) -> Result<u64, String> {
    use http_body_util::BodyExt;
    let run = async {
        let mut sender =
            talos_e2e::clients::http::connect(source, gateway, API, bundle, false).await;
        let body = http_body_util::Full::new(bytes::Bytes::from(vec![0x33u8; WHOLE]))
            .map_err(|never| match never {})
            .boxed();
        let request = hyper::Request::post("/upload")
            .header("host", API)
            .body(body)
            .map_err(|e| e.to_string())?;
        let response = sender.send(request).await.map_err(|e| e.to_string())?;
        let answer = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let answer: Value = serde_json::from_slice(&answer).map_err(|e| e.to_string())?;
        answer["len"].as_u64().ok_or_else(|| format!("{answer}"))
    };
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .unwrap_or_else(|_| Err("no answer within 30 s".into()))
}

/// What the bound tests check with session 1 at its bound: its next
/// connection refused `session_limit` (the bound holds), and session 2's
/// new connections, handshakes and whole transfers, through.
async fn at_the_bound_the_other_session_goes_on(
    rig: &Pair,
    bundle_1: &std::path::Path,
    bundle_2: &std::path::Path,
) {
    let a = rig.members[0].data;
    let refused = whole_download(SOURCE, a, bundle_1).await;
    assert!(refused.is_err(), "past the bound: {refused:?}");
    assert_eq!(
        rig.members[0].metric("gateway_forwarded_total{result=\"session_limit\"}"),
        Some(1.0)
    );
    for i in 0..3 {
        assert_eq!(
            curl_status(SOURCE_2, a, bundle_2, API, &format!("/two/{i}")),
            200,
            "session 2's connection {i}"
        );
    }
    assert_eq!(
        whole_download(SOURCE_2, a, bundle_2).await,
        Ok((200, WHOLE)),
        "session 2's download, whole"
    );
    assert_eq!(
        whole_upload(SOURCE_2, a, bundle_2).await,
        Ok(WHOLE as u64),
        "session 2's upload, whole"
    );
}

/// The link's window at every bound, downloads (holder to forwarder):
/// session 1 holds `max_forwarded_per_session` - 1 forwarded downloads
/// open and unread, each with its whole stream window and more waiting
/// behind it; its own next connection, under its bound, downloads in
/// full; with one more unread it is at its bound, and its next is
/// refused; session 2's new connections handshake and download and
/// upload in full all along. (Before issue 40's fix, 17 unread downloads
/// of one session stalled every forwarded connection to the peer.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_links_window_at_every_bound_unread_downloads() {
    let (rig, bundle_1, bundle_2) = forwarding_two_sessions_at_a_bound().await;
    let a = rig.members[0].data;
    let started = std::time::Instant::now();
    let mut unread = Vec::new();
    for _ in 0..BOUND - 1 {
        unread.push(unread_download(SOURCE, a, &bundle_1).await);
    }
    own_next_connection_goes_through(&rig, &bundle_1).await;
    unread.push(unread_download(SOURCE, a, &bundle_1).await);
    at_the_bound_the_other_session_goes_on(&rig, &bundle_1, &bundle_2).await;
    matrix(
        &format!("session 1: {BOUND} forwarded downloads unread (its bound)"),
        "session 2: new connections, 8 MiB down and up through gw-a",
        "all whole",
        started.elapsed(),
    );
    drop(unread);
}

/// The same with uploads (forwarder to holder): session 1's forwarded
/// uploads that the destination does not take, each filling its stream
/// window on the holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_links_window_at_every_bound_untaken_uploads() {
    let (rig, bundle_1, bundle_2) = forwarding_two_sessions_at_a_bound().await;
    let a = rig.members[0].data;
    let holds = rig.peers.origin.holds();
    let started = std::time::Instant::now();
    let mut writers = Vec::new();
    for i in 0..BOUND - 1 {
        writers.push(untaken_upload(SOURCE, a, &bundle_1, &format!("up-{i}"), &holds).await);
    }
    own_next_connection_goes_through(&rig, &bundle_1).await;
    writers.push(untaken_upload(SOURCE, a, &bundle_1, "up-last", &holds).await);
    at_the_bound_the_other_session_goes_on(&rig, &bundle_1, &bundle_2).await;
    matrix(
        &format!("session 1: {BOUND} forwarded uploads untaken (its bound)"),
        "session 2: new connections, 8 MiB down and up through gw-a",
        "all whole",
        started.elapsed(),
    );
    for w in writers {
        w.abort();
    }
}
