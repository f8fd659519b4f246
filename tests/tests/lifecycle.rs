//! Sessions driven by the control stub, end to end: a gateway pair (two
//! `gateway` processes, ids `gw-a` and `gw-b`), the `control-stub` CLI and
//! its `serve` batch consumer, all as operators run them, and real TLS
//! clients as the session.
//!
//! One test per row of the spec's behaviour table ("Sandbox sessions"),
//! for the gateway's columns (credentials and policy): what the session can
//! reach, with which CA and which attachments, after each event; plus the
//! record path: signed batches delivered across a control-plane outage and
//! a gateway restart with no record lost or doubled, tampering detected,
//! and the spool's bound failing closed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use talos_e2e::clients::{admin_get, curl_via, Curl, Kept, SESSION_SOURCE};
use talos_e2e::gateway::Gateway;
use talos_e2e::rig::pair::IDS;
use talos_e2e::rig::{Pair, SessionSpec};
use talos_e2e::wait;

const API: &str = "api.test";
const OTHER: &str = "other.test";
const OFF_LIST: &str = "off-list.test";
const SECRET: &str = "lifecycle-S3CRET-v4lue-0123456789";
const SECRET_2: &str = "second-S3CRET-after-rotation-987";

/// Two members shipping batches to a running `serve`; the account's
/// egress list holds `api.test` and `other.test`; tenant `acme` has
/// secret `API_TOKEN`.
async fn pair() -> Pair {
    pair_with_control("").await
}

/// [`pair`] with more lines in every member's `[control]` table.
async fn pair_with_control(extra: &str) -> Pair {
    Pair::builder()
        .control(extra)
        .egress(&[API, OTHER])
        .secret("API_TOKEN", SECRET)
        .start_loopback(&[API, OTHER, OFF_LIST])
        .await
}

/// A session from 127.0.0.2 in `mode` allowed `api.test` and
/// `other.test`, `API_TOKEN` attached to `api.test`.
fn session(mode: &str) -> SessionSpec {
    SessionSpec::from(SESSION_SOURCE)
        .allow(API)
        .allow(OTHER)
        .attach("API_TOKEN=api.test:authorization:Bearer")
        .mode(mode)
}

/// Write the session's current trust bundle (both members' CAs).
fn trust(rig: &Pair, id: &str, file: &str) -> PathBuf {
    let (path, digests) = rig.trust(id, file);
    assert_eq!(digests.len(), 2);
    path
}

/// SHA-384 of each certificate's DER in a PEM bundle, as the session
/// (which holds only the bundle) computes it.
fn bundle_digests(path: &Path) -> Vec<String> {
    let pem = std::fs::read(path).expect("bundle");
    rustls_pemfile::certs(&mut pem.as_slice())
        .map(|c| talos_certs::sha384_hex(c.expect("PEM").as_ref()))
        .collect()
}

/// The authorization header the origin received, from its `/echo` body.
fn echoed_authorization(body: &str) -> Option<String> {
    let v: Value = serde_json::from_str(body).ok()?;
    v["headers"].as_array()?.iter().find_map(|h| {
        (h[0].as_str()? == "authorization").then(|| h[1].as_str().unwrap_or("").to_owned())
    })
}

/// Assert each gateway recorded the session's kept connection
/// `session_ended` (waiting for the record: the cut is seen by the client
/// before the gateway has written it).
fn assert_cut_recorded(rig: &Pair, id: &str) {
    for g in &rig.members {
        wait::until("a session_ended record on each gateway", || {
            wait::check(g.records(), |records| {
                records
                    .iter()
                    .any(|r| r["session_id"] == id && r["verdict"] == "session_ended")
            })
        });
    }
}

/// After a drop: the source is no session's; the gateway refuses.
fn assert_refused_unknown(rig: &Pair, bundle: &Path) {
    for g in &rig.members {
        let code = curl_via(g.data, bundle, API, "/hello", &[]).status;
        assert_eq!(code, 0, "no TLS for a source whose authority was dropped");
    }
    wait::until("unknown_source recorded on each gateway", || {
        let refused = rig
            .records()
            .iter()
            .filter(|r| r["verdict"] == "unknown_source")
            .count();
        wait::check(refused, |n| *n >= rig.members.len())
    });
}

/// The drop reports of the session in `status`, for `attempt`, as the
/// closes' replies brought them (each also comes again in its gateway's
/// batch chain, `via` `chain`).
fn reports(status: &Value, attempt: u64) -> Vec<Value> {
    status["drop_reports"]
        .as_array()
        .expect("drop reports")
        .iter()
        .filter(|r| r["attempt"] == attempt && r["via"] == "reply")
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn start_reaches_the_allowlist_with_the_secret_attached_and_masked() {
    let rig = pair().await;
    let id = rig.start_session(&session("commands"));
    let bundle = trust(&rig, &id, "trust.pem");
    let digests = rig.digests(&id);
    let mut from_bundle = bundle_digests(&bundle);
    from_bundle.sort();
    let mut stated: Vec<String> = digests.values().cloned().collect();
    stated.sort();
    assert_eq!(
        from_bundle, stated,
        "the bundle is the CAs the gateways stated"
    );

    for g in &rig.members {
        // The credential is injected, and its echo comes back masked.
        let (code, _, body) = curl_via(g.data, &bundle, API, "/echo", &[]).into_text();
        assert_eq!(code, 200);
        let auth = echoed_authorization(&body).expect("authorization reached the origin");
        assert_eq!(auth, format!("Bearer {}", "*".repeat(SECRET.len())));
        assert!(!body.contains(SECRET));
        // Other listed names work, without the attachment.
        let (code, _, body) = curl_via(g.data, &bundle, OTHER, "/echo", &[]).into_text();
        assert_eq!(code, 200);
        assert_eq!(echoed_authorization(&body), None);
        // A name the session was not allowed is refused.
        let code = curl_via(g.data, &bundle, OFF_LIST, "/echo", &[]).status;
        assert_eq!(code, 0);
    }
    let stop = rig.cli(&["sandbox", "stop", &id]).json();
    assert_eq!(stop["state"], "ended");
    let cert = rig.stub.wait_certificate(&id, 20, |c| {
        c["issued"] == true && c["connections"].as_array().map_or(0, Vec::len) >= 6
    });
    assert_eq!(cert["issued"], true, "{cert}");
    let allowed = cert["connections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["verdict"] == "allowed")
        .count();
    assert_eq!(allowed, 4);
    let refusals: Vec<&Value> = cert["refusals"].as_array().unwrap().iter().collect();
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    assert!(refusals.iter().all(|r| r["reason"] == "not_on_allowlist"));
    let secret = &cert["secrets"][0];
    assert_eq!(secret["name"], "API_TOKEN");
    assert_eq!(secret["masked"], 2);
    // Batches came from both gateways, each under its own key.
    let from: std::collections::BTreeSet<&str> = cert["batches"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["gateway_id"].as_str())
        .collect();
    assert_eq!(from.into_iter().collect::<Vec<_>>(), IDS);
    // Nothing anywhere holds the value.
    for g in &rig.members {
        assert!(!g.log().contains(SECRET));
        assert!(!std::fs::read_to_string(&g.records_path)
            .unwrap()
            .contains(SECRET));
    }
    assert!(!rig.stub.serve_log().contains(SECRET));
    assert!(!cert.to_string().contains(SECRET));
}

/// Rows `pause` and `idle_timeout_pause` (the same effects): the CA and
/// its leaves destroyed, attachments dropped, connections closed; a signed
/// drop report from each gateway names the CA and the secret.
#[tokio::test(flavor = "multi_thread")]
async fn pause_closes_connections_destroys_the_ca_and_drops_the_attachments() {
    let rig = pair().await;
    let id = rig.start_session(&session("commands"));
    let bundle = trust(&rig, &id, "trust.pem");
    let digests = rig.digests(&id);
    let mut kept = Vec::new();
    for g in &rig.members {
        kept.push(Kept::open(SESSION_SOURCE, g.data, API, &bundle, "/hello").await);
    }

    let t = rig.cli(&["sandbox", "pause", &id]).json();
    assert_eq!(t["state"], "paused");
    for s in &mut kept {
        assert!(
            s.get("/again").await.is_err(),
            "the open connection is closed at the pause"
        );
    }
    assert_cut_recorded(&rig, &id);
    assert_refused_unknown(&rig, &bundle);

    let status = rig.cli(&["sandbox", "status", &id]).json();
    let r = reports(&status, 1);
    assert_eq!(r.len(), 2);
    for report in &r {
        let gw = report["gateway_id"].as_str().unwrap();
        assert_eq!(report["reason"], "pause");
        assert_eq!(report["ca_digest"], digests[gw].as_str());
        assert_eq!(report["secrets"], serde_json::json!(["API_TOKEN"]));
    }
    for ca in status["attempts"][0]["ca"].as_array().unwrap() {
        assert!(ca["destroyed_at"].is_string(), "{ca}");
    }
    // A paused session has no trust bundle.
    assert_eq!(
        rig.cli(&["sandbox", "trust", &id]).code(),
        "sandbox_not_running"
    );
}

/// Row `resume`: a new authority (new digests) from the policy and the
/// secrets as they are now; a destination removed and a secret deleted
/// while paused are absent; the old CA no longer works.
#[tokio::test(flavor = "multi_thread")]
async fn resume_opens_a_new_authority_from_the_current_policy_and_secrets() {
    let rig = pair().await;
    let id = rig.start_session(&session("commands"));
    let old_bundle = trust(&rig, &id, "trust-1.pem");
    let old = rig.digests(&id);
    rig.cli(&["sandbox", "pause", &id]).json();

    rig.cli(&["policy", "egress", "remove", OTHER]).json();
    rig.stub
        .run(
            &[],
            &["secret", "delete", "API_TOKEN", "--tenant", "acme"],
            b"",
        )
        .json();
    let t = rig.cli(&["sandbox", "resume", &id]).json();
    assert_eq!(t["state"], "running");
    assert_eq!(t["attempt"], 2);
    let left: Vec<(String, String)> = t["left_out"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["kind"].as_str().unwrap().to_owned(),
                l["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        left.contains(&("destination".into(), OTHER.into())),
        "{left:?}"
    );
    assert!(
        left.contains(&("attachment".into(), "API_TOKEN".into())),
        "{left:?}"
    );

    let new = rig.digests(&id);
    for gw in IDS {
        assert_ne!(old[gw], new[gw], "a fresh CA on {gw}");
    }
    let bundle = trust(&rig, &id, "trust-2.pem");
    for g in &rig.members {
        let (code, _, body) = curl_via(g.data, &bundle, API, "/echo", &[]).into_text();
        assert_eq!(code, 200);
        assert_eq!(
            echoed_authorization(&body),
            None,
            "the deleted secret is absent"
        );
        let code = curl_via(g.data, &bundle, OTHER, "/echo", &[]).status;
        assert_eq!(code, 0, "the removed destination is absent");
        let code = curl_via(g.data, &old_bundle, API, "/echo", &[]).status;
        assert_eq!(code, 0, "the paused attempt's CA is gone");
    }
    // A secret set again before the next resume is attached again, with
    // its new value.
    rig.set_secret("API_TOKEN", SECRET_2);
    rig.cli(&["sandbox", "pause", &id]).json();
    rig.cli(&["sandbox", "resume", &id]).json();
    let bundle = trust(&rig, &id, "trust-3.pem");
    let (code, _, body) = curl_via(rig.members[0].data, &bundle, API, "/echo", &[]).into_text();
    assert_eq!(code, 200);
    // The session asked for the attachment at start; it comes back once
    // the secret exists again.
    assert_eq!(
        echoed_authorization(&body),
        Some(format!("Bearer {}", "*".repeat(SECRET_2.len())))
    );
}

/// Row `interruption_recovered`: the interruption drops the authority
/// as a pause does; the recovery is a resume (a new attempt, new CAs).
#[tokio::test(flavor = "multi_thread")]
async fn interruption_recovered() {
    let rig = pair().await;
    let id = rig.start_session(&session("commands"));
    let bundle = trust(&rig, &id, "trust-1.pem");
    let old = rig.digests(&id);
    let mut kept = Kept::open(SESSION_SOURCE, rig.members[0].data, API, &bundle, "/hello").await;
    let t = rig.cli(&["sandbox", "interrupt", &id]).json();
    assert_eq!(t["state"], "interrupted");
    assert!(kept.get("/again").await.is_err());
    assert_refused_unknown(&rig, &bundle);
    let status = rig.cli(&["sandbox", "status", &id]).json();
    assert!(reports(&status, 1)
        .iter()
        .all(|r| r["reason"] == "interruption"));

    let t = rig.cli(&["sandbox", "recover", &id]).json();
    assert_eq!(t["state"], "running");
    assert_eq!(t["attempt"], 2);
    let new = rig.digests(&id);
    assert!(IDS.iter().all(|gw| old[*gw] != new[*gw]));
    let bundle = trust(&rig, &id, "trust-2.pem");
    for g in &rig.members {
        let (code, _, body) = curl_via(g.data, &bundle, API, "/echo", &[]).into_text();
        assert_eq!(code, 200);
        assert!(
            echoed_authorization(&body).is_some(),
            "attachments opened again"
        );
    }
    let status = rig.cli(&["sandbox", "status", &id]).json();
    assert_eq!(status["attempts"][1]["cause"], "recovery");
}

/// Row `interruption_lost`: a session in mode agent does not recover; it
/// ends (outcome_unknown) and its reset is confirmed from the report the
/// gateways signed at the interruption.
#[tokio::test(flavor = "multi_thread")]
async fn interruption_lost_ends_an_agent_session() {
    let rig = pair().await;
    let id = rig.start_session(&session("agent"));
    let bundle = trust(&rig, &id, "trust.pem");
    let code = curl_via(rig.members[1].data, &bundle, API, "/hello", &[]).status;
    assert_eq!(code, 200);
    let t = rig.cli(&["sandbox", "interrupt", &id]).json();
    assert_eq!(t["state"], "ended", "{t}");
    assert_eq!(t["outcome"], "outcome_unknown");
    assert_refused_unknown(&rig, &bundle);
    assert_eq!(
        rig.cli(&["sandbox", "recover", &id]).code(),
        "sandbox_ended"
    );
    let cert = rig.stub.wait_certificate(&id, 20, |c| {
        c["issued"] == true && c["connections"].as_array().map_or(0, Vec::len) >= 1
    });
    assert_eq!(cert["issued"], true, "{cert}");
}

/// Rows `cancellation` and `idle_timeout_end` (the same effects), from
/// running and from paused: the session ends, every reset step is
/// confirmed, and its sources are refused from then on.
#[tokio::test(flavor = "multi_thread")]
async fn cancellation_from_running_and_from_paused() {
    let rig = pair().await;
    for (i, paused_first) in [false, true].into_iter().enumerate() {
        let id = rig.start_session(&session("commands"));
        let bundle = trust(&rig, &id, &format!("trust-{i}.pem"));
        let mut kept =
            Kept::open(SESSION_SOURCE, rig.members[0].data, API, &bundle, "/hello").await;
        if paused_first {
            rig.cli(&["sandbox", "pause", &id]).json();
        }
        let t = rig.cli(&["sandbox", "stop", &id]).json();
        assert_eq!(t["state"], "ended");
        assert!(kept.get("/again").await.is_err());
        let steps = t["reset"].as_array().expect("reset steps");
        assert_eq!(steps.len(), 5);
        assert!(steps.iter().all(|s| s["confirmed"] == true), "{steps:?}");
        assert_refused_unknown(&rig, &bundle);
        assert_eq!(rig.cli(&["sandbox", "resume", &id]).code(), "sandbox_ended");
        let cert = rig.stub.wait_certificate(&id, 20, |c| {
            c["issued"] == true
                && c["connections"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|r| r["verdict"] == "session_ended"))
        });
        assert_eq!(cert["issued"], true, "{cert}");
        let reasons: Vec<&str> = cert["attempts"][0]["ca"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["destroy_reason"].as_str())
            .collect();
        let want = if paused_first { "pause" } else { "end" };
        assert_eq!(reasons, [want, want]);
    }
}

/// Revoke All: as a cancellation, with the reason revoke_all on every
/// gateway's report.
#[tokio::test(flavor = "multi_thread")]
async fn revoke_all_ends_the_session_on_every_gateway() {
    let rig = pair().await;
    let id = rig.start_session(&session("commands"));
    let bundle = trust(&rig, &id, "trust.pem");
    let t = rig.cli(&["sandbox", "revoke-all", &id]).json();
    assert_eq!(t["state"], "ended");
    assert_eq!(t["end_reason"], "revoke_all");
    let reasons: Vec<&str> = t["reports"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["reason"].as_str())
        .collect();
    assert_eq!(reasons, ["revoke_all", "revoke_all"]);
    assert_refused_unknown(&rig, &bundle);
}

/// Row `disconnection`: a client that drops changes nothing; the same CA
/// and attachments serve the next connection.
#[tokio::test(flavor = "multi_thread")]
async fn disconnection_changes_nothing() {
    let rig = pair().await;
    let id = rig.start_session(&session("commands"));
    let bundle = trust(&rig, &id, "trust.pem");
    let before = rig.digests(&id);
    let kept = Kept::open(SESSION_SOURCE, rig.members[0].data, API, &bundle, "/hello").await;
    drop(kept);
    // Half a hello, then gone.
    let mut raw = talos_e2e::clients::connect_from(SESSION_SOURCE, rig.members[0].data).await;
    tokio::io::AsyncWriteExt::write_all(&mut raw, &[0x16, 0x03, 0x01, 0x02])
        .await
        .unwrap();
    drop(raw);
    let (code, _, body) = curl_via(rig.members[0].data, &bundle, API, "/echo", &[]).into_text();
    assert_eq!(code, 200);
    assert!(echoed_authorization(&body).is_some());
    assert_eq!(rig.digests(&id), before);
    let status = rig.cli(&["sandbox", "status", &id]).json();
    assert_eq!(status["state"], "running");
    assert!(status["drop_reports"].as_array().unwrap().is_empty());
}

/// Requests `/n/<first>..` through the gateways in turn, one connection
/// each; returns the paths that were answered 200.
fn traffic(rig: &Pair, bundle: &Path, first: usize, count: usize) -> Vec<String> {
    let mut ok = Vec::new();
    for i in first..first + count {
        let g = &rig.members[i % rig.members.len()];
        let path = format!("/n/{i}");
        let code = curl_via(g.data, bundle, API, &path, &[]).status;
        if code == 200 {
            ok.push(path);
        }
    }
    ok
}

/// Steady traffic while the control stub's consumer is down, and across a
/// restart of a gateway: every connection the client made appears exactly
/// once in the certificate.
#[tokio::test(flavor = "multi_thread")]
async fn no_record_is_lost_or_doubled_across_an_outage_and_a_gateway_restart() {
    let mut rig = pair().await;
    let id = rig.start_session(&session("commands"));
    let bundle = trust(&rig, &id, "trust-1.pem");
    let mut made = traffic(&rig, &bundle, 0, 10);

    // The consumer goes away; traffic goes on, batches wait in the spools.
    rig.stub.kill_serve();
    made.extend(traffic(&rig, &bundle, 10, 10));
    // The sealers spool what they hold: batches wait while the consumer
    // is down.
    wait_spooled(&rig, |n| n > 0);

    // Pause, restart gateway gw-a (its spool still full), resume.
    rig.cli(&["sandbox", "pause", &id]).json();
    assert!(rig.members[0].stop(), "gw-a drains and exits 0");
    rig.restart(0);
    assert!(
        spooled(&rig.members[0]) > 0,
        "the spool survived the restart"
    );
    rig.cli(&["sandbox", "resume", &id]).json();
    let bundle = trust(&rig, &id, "trust-2.pem");
    made.extend(traffic(&rig, &bundle, 20, 10));

    // The consumer comes back; the spools drain.
    rig.stub.start_serve();
    made.extend(traffic(&rig, &bundle, 30, 10));
    assert_eq!(made.len(), 40, "every request was answered");
    rig.cli(&["sandbox", "stop", &id]).json();

    let paths_of = |cert: &Value| -> Vec<String> {
        cert["connections"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|c| c["verdict"] == "allowed")
                    .flat_map(|c| c["requests"].as_array().cloned().unwrap_or_default())
                    .filter_map(|r| r["path"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let cert = rig.stub.wait_certificate(&id, 30, |c| {
        c["issued"] == true && paths_of(c).len() >= made.len()
    });
    let mut got = paths_of(&cert);
    got.sort();
    made.sort();
    assert_eq!(got, made, "each connection exactly once");
    assert_eq!(cert["issued"], true);
    assert!(
        cert["batch_rejections"].as_array().unwrap().is_empty(),
        "{cert}"
    );
    // Acknowledged batches are deleted.
    wait_spooled(&rig, |n| n == 0);
}

/// The batches in `g`'s spool.
fn spooled(g: &Gateway) -> usize {
    std::fs::read_dir(g.records_path.parent().unwrap().join("spool"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".batch"))
        })
        .count()
}

/// Wait until every gateway's spool holds a number of batches for which
/// `done` holds.
fn wait_spooled(rig: &Pair, done: impl Fn(usize) -> bool) {
    wait::until("the spooled batches of every gateway", || {
        let counts: Vec<usize> = rig.members.iter().map(spooled).collect();
        wait::check(counts, |c| c.iter().all(|n| done(*n)))
    });
}

/// A batch altered on the gateway's disk is refused by the consumer
/// (bad_signature), recorded, and never deleted by the gateway: it does
/// not vanish, and nothing after it is accepted out of order.
#[tokio::test(flavor = "multi_thread")]
async fn a_tampered_spooled_batch_is_rejected_and_recorded() {
    let mut rig = pair().await;
    let id = rig.start_session(&session("commands"));
    let bundle = trust(&rig, &id, "trust.pem");
    rig.stub.kill_serve();
    traffic(&rig, &bundle, 0, 2);
    wait_spooled(&rig, |n| n > 0);
    rig.cli(&["sandbox", "pause", &id]).json();
    assert!(rig.members[0].stop());
    // Flip one byte inside a record of the oldest spooled batch.
    let spool = rig.dir.join("gw-a").join("spool");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&spool)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "batch"))
        .collect();
    files.sort();
    // The oldest batch holding a connection record (the first batch of
    // all holds the gateway's start report).
    let oldest = files
        .iter()
        .find(|f| {
            let signed: talos_certs::Signed =
                serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap();
            String::from_utf8_lossy(&signed.payload).contains("\"allowed\"")
        })
        .expect("a spooled batch with a connection record")
        .clone();
    let mut signed: talos_certs::Signed =
        serde_json::from_slice(&std::fs::read(&oldest).unwrap()).unwrap();
    let text = String::from_utf8(signed.payload.clone()).unwrap();
    let flipped = text.replacen("\"allowed\"", "\"alloweD\"", 1);
    assert_ne!(flipped, text);
    signed.payload = flipped.into_bytes();
    std::fs::write(&oldest, serde_json::to_vec(&signed).unwrap()).unwrap();

    rig.restart(0);
    rig.stub.start_serve();
    // The consumer records the refusal; the gateway keeps the batch.
    let rejected = wait::until("the consumer to log bad_signature", || {
        wait::check(rig.stub.serve_log(), |log| log.contains("bad_signature"))
    });
    assert!(rejected.contains("\"gateway_id\":\"gw-a\""), "{rejected}");
    assert!(oldest.exists(), "a refused batch stays in the spool");
    // The gateway logs the refusal once the answer reaches it, which may be
    // a moment after the consumer logged it.
    wait::until("the gateway to log the refusal", || {
        wait::check(rig.members[0].log(), |log| {
            log.contains("control plane refused a batch")
        })
    });
    let cert = rig.stub.wait_certificate(&id, 30, |c| {
        c["batch_rejections"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
    });
    let r = &cert["batch_rejections"][0];
    assert_eq!(r["gateway_id"], "gw-a");
    assert_eq!(r["reason"], "bad_signature");
    let rejected =
        rig.members[0].metric("gateway_batches_rejected_total{reason=\"bad_signature\"}");
    assert!(rejected.is_some_and(|n| n >= 1.0), "{rejected:?}");
}

/// At the spool's bound the gateway fails closed: it stops accepting
/// connections, says so in its log, metrics and readiness, and opens again
/// once the control plane acknowledges the batches.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_spool_fails_closed_until_batches_are_acknowledged() {
    let mut rig = pair_with_control("spool_max_batches = 2").await;
    let id = rig.start_session(&session("commands"));
    let bundle = trust(&rig, &id, "trust.pem");
    rig.stub.kill_serve();
    let g = &rig.members[0];
    // One connection, one record, one batch (50 ms interval): two fill it.
    for i in 0..2 {
        let code = curl_via(g.data, &bundle, API, &format!("/fill/{i}"), &[]).status;
        assert_eq!(code, 200);
        wait::until(&format!("batch {} in the spool", i + 1), || {
            wait::check(spooled(g), |n| *n > i)
        });
    }
    // The spool is full once its second batch is written; the gateway
    // says so when it next tries to seal.
    wait::until("the spool_full metric at 1", || {
        wait::check(g.metric("gateway_spool_full"), |m| *m == Some(1.0))
    });
    assert_eq!(admin_get(g.admin, "/readyz").0, 503);
    // Logged just after the metric is set.
    wait::until("the gateway to log that its spool is full", || {
        wait::check(g.log(), |log| log.contains("record spool full"))
    });
    // A new connection is not served: the TLS handshake never completes.
    let code = Curl::via(g.data, &bundle, API)
        .max_time(2)
        .run("/blocked")
        .status;
    assert_eq!(code, 0, "no connection is served while the spool is full");

    rig.stub.start_serve();
    wait::until("the spool_full metric back at 0", || {
        wait::check(g.metric("gateway_spool_full"), |m| *m == Some(0.0))
    });
    let code = curl_via(rig.members[0].data, &bundle, API, "/after", &[]).status;
    assert_eq!(code, 200, "accepting again");
    rig.cli(&["sandbox", "stop", &id]).json();
}

/// Waits (at most [`wait::DEADLINE`]) for `n` pending cards and returns
/// them.
fn wait_cards(rig: &Pair, n: usize) -> Vec<Value> {
    let deadline = std::time::Instant::now() + wait::DEADLINE;
    loop {
        let cards = rig.cli(&["approvals", "list"]).json();
        let cards = cards.as_array().cloned().unwrap_or_default();
        if cards.len() >= n || std::time::Instant::now() > deadline {
            return cards;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The Lock through the control stub: a rule added to the account policy
/// travels with the session; a matching request waits on a card; the CLI
/// approves one and declines another; an unlisted approver changes
/// nothing; the certificate lists each proposal and the refusal.
#[tokio::test(flavor = "multi_thread")]
async fn held_requests_are_approved_and_declined_from_the_control_stub() {
    let rig = pair().await;
    let rule = rig.lock(API, "POST", "/merge", "alice");
    let rule_id = rule["id"].as_str().expect("rule id").to_owned();
    let id = rig.start_session(&session("commands"));
    let bundle = trust(&rig, &id, "trust.pem");
    let data = rig.members[0].data;
    let post = |path: &'static str| {
        let bundle = bundle.clone();
        std::thread::spawn(move || curl_via(data, &bundle, API, path, &["-X", "POST"]))
    };

    let first = post("/merge/1");
    let cards = wait_cards(&rig, 1);
    assert_eq!(cards.len(), 1, "{cards:?}");
    let card = &cards[0];
    assert_eq!(card["rule"], rule_id.as_str());
    let sentence = card["sentence"].as_str().unwrap();
    assert!(
        sentence.contains("POST /merge/1") && sentence.contains(API),
        "{sentence}"
    );
    assert!(sentence.contains("API_TOKEN") && !sentence.contains(SECRET));
    let card_id = card["id"].as_str().unwrap();
    assert_eq!(
        rig.cli(&["approvals", "approve", card_id, "--as", "mallory"])
            .code(),
        "approver_not_listed"
    );
    assert!(!first.is_finished(), "an unlisted approver changes nothing");
    let decided = rig
        .cli(&["approvals", "approve", card_id, "--as", "alice"])
        .json();
    assert_eq!(decided["outcome"], "released");
    let (code, _, body) = first.join().unwrap().into_text();
    assert_eq!(code, 200, "{body}");

    let second = post("/merge/2");
    let cards = wait_cards(&rig, 1);
    let card_id = cards[0]["id"].as_str().unwrap().to_owned();
    let decided = rig
        .cli(&["approvals", "decline", &card_id, "--as", "alice"])
        .json();
    assert_eq!(decided["outcome"], "refused");
    let (code, head, _) = second.join().unwrap().into_text();
    assert_eq!(code, 403);
    assert!(head.contains("hangar-refusal: approval_declined"), "{head}");
    assert_eq!(
        rig.cli(&["approvals", "approve", &card_id, "--as", "alice"])
            .code(),
        "approval_not_pending"
    );

    rig.cli(&["sandbox", "stop", &id]).json();
    let cert = rig.stub.wait_certificate(&id, 20, |c| {
        c["issued"] == true
            && c["refusals"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r["reason"] == "approval_declined"))
    });
    let decisions: Vec<&str> = cert["proposals"]
        .as_array()
        .expect("proposals on the certificate")
        .iter()
        .filter_map(|p| p["decision"].as_str())
        .collect();
    assert_eq!(decisions, ["approved", "declined"], "{cert}");
    assert!(cert["proposals"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["approver"] == "alice" && p["digest"].as_str().is_some_and(|d| d.len() == 96)));
    assert_eq!(cert["issued"], true);
}
