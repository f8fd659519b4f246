//! The batch consumer's store side and the session certificate.

mod common;

use common::Env;
use serde_json::json;
use talos_control_stub::certificate::{issue, signed, ISOLATION_STATEMENT, KIND};
use talos_control_stub::{certificate, BatchOutcome, Mode, State};

fn records(session: &str) -> Vec<serde_json::Value> {
    vec![
        json!({
            "gateway_id": "gw-a", "session_id": session, "attempt": 1, "tenant": "acme",
            "source": "10.1.0.2:40000", "sni": "api.github.com", "verdict": "allowed",
            "request_count": 2,
            "requests": [
                {"method": "GET", "path": "/user", "status": 200},
                {"method": "GET", "path": "/x", "status": 421, "refusal": "host_mismatch"}
            ],
            "attachments_used": ["GH"], "masked": {"GH": 2},
            "opened_at": "2026-11-29T10:00:00.000Z", "closed_at": "2026-11-29T10:00:01.000Z",
            "bytes_from_session": 10, "bytes_to_session": 20
        }),
        json!({
            "gateway_id": "gw-a", "session_id": session, "attempt": 1, "tenant": "acme",
            "source": "10.1.0.2:40001", "sni": "evil.example.net", "verdict": "not_on_allowlist",
            "cause": "not_on_allowlist", "request_count": 0,
            "opened_at": "2026-11-29T10:00:02.000Z", "closed_at": "2026-11-29T10:00:02.001Z",
            "bytes_from_session": 300, "bytes_to_session": 7
        }),
        json!({
            "gateway_id": "gw-a", "session_id": null, "source": "10.9.9.9:1",
            "sni": null, "verdict": "unknown_source", "request_count": 0,
            "opened_at": "2026-11-29T10:00:03.000Z", "closed_at": "2026-11-29T10:00:03.000Z",
            "bytes_from_session": 0, "bytes_to_session": 0
        }),
    ]
}

#[test]
fn record_batch_is_idempotent_per_gateway_and_sequence() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Agent).session_id;
    let recs = records(&id);
    assert_eq!(
        env.store.record_batch("gw-a", 1, "d1", &recs).unwrap(),
        BatchOutcome::Recorded
    );
    let after_first = env.dump();
    assert_eq!(
        env.store.record_batch("gw-a", 1, "d1", &recs).unwrap(),
        BatchOutcome::AlreadyRecorded
    );
    assert_eq!(env.dump(), after_first);
    let err = env.store.record_batch("gw-a", 1, "d2", &recs).unwrap_err();
    assert_eq!(err.code(), "batch_conflict");
    assert_eq!(env.dump(), after_first);
    // The same sequence number from the other gateway is another batch.
    assert_eq!(
        env.store.record_batch("gw-b", 1, "d1", &[]).unwrap(),
        BatchOutcome::Recorded
    );
}

/// The control plane's key for these tests.
fn plane_key() -> talos_certs::GatewayKey {
    talos_certs::GatewayKey::generate().unwrap()
}

#[test]
fn the_certificate_holds_records_refusals_secrets_and_the_reset() {
    let mut env = Env::new().with_policy();
    let key = plane_key();
    let id = env.start(Mode::Agent).session_id;
    env.store
        .record_batch("gw-a", 1, "d1", &records(&id))
        .unwrap();
    env.store
        .record_batch(
            "gw-b",
            7,
            "d7",
            &[json!({
                "gateway_id": "gw-b", "session_id": id, "sni": "api.github.com",
                "verdict": "allowed", "attachments_used": ["GH"], "masked": {"GH": 1},
                "opened_at": "2026-11-29T10:00:04.000Z"
            })],
        )
        .unwrap();
    env.store
        .record_rejection(
            "gw-a",
            2,
            "the batch's previous digest is not batch 1's",
            std::slice::from_ref(&id),
        )
        .unwrap();
    // A rejection of a batch that named only another session is not this
    // session's.
    env.store
        .record_rejection("gw-a", 3, "bad_signature", &["sbx-other".into()])
        .unwrap();

    let open = certificate(&env.store, &id).unwrap();
    assert_eq!(open["issued"], false);
    assert!(open["not_issued_because"]
        .as_str()
        .unwrap()
        .contains("has not ended"));
    assert!(!issue(&mut env.store, &id, &key).unwrap());

    let stopped = env.life().stop(&id).unwrap();
    assert_eq!(stopped.state, State::Ended);
    // Ended, but the gateways' batches through the end of the authority
    // (their drop reports, in their chains) are not in yet.
    let waiting = certificate(&env.store, &id).unwrap();
    assert_eq!(waiting["issued"], false);
    assert!(
        waiting["not_issued_because"]
            .as_str()
            .unwrap()
            .contains("batches through the end of attempt 1"),
        "{waiting}"
    );
    assert!(!issue(&mut env.store, &id, &key).unwrap());

    env.deliver_chain();
    assert!(issue(&mut env.store, &id, &key).unwrap());
    let cert = certificate(&env.store, &id).unwrap();
    assert_eq!(cert["issued"], true, "{cert}");
    assert!(cert["certificate_signed"].as_str().is_some());
    assert_eq!(cert["kind"], KIND);
    assert_eq!(cert["kind"], "sandbox session");
    assert_eq!(cert["isolation_statement"], ISOLATION_STATEMENT);
    assert!(ISOLATION_STATEMENT.starts_with("One fresh instance served this session alone"));
    assert_eq!(cert["tenant"], "acme");

    let attempts = cert["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1);
    let cas = attempts[0]["ca"].as_array().unwrap();
    assert_eq!(cas.len(), 2);
    assert!(cas.iter().all(|c| c["destroyed_at"].is_string()));
    assert_eq!(attempts[0]["end_cause"], "session_ended");

    // The unknown_source record is no session's.
    assert_eq!(cert["connections"].as_array().unwrap().len(), 3);
    let reasons: Vec<(String, String)> = cert["refusals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["kind"].as_str().unwrap().to_owned(),
                r["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        reasons,
        [
            ("request".to_owned(), "host_mismatch".to_owned()),
            ("connection".to_owned(), "not_on_allowlist".to_owned())
        ]
    );
    assert_eq!(cert["refusals"][0]["path"], "/x");

    let secret = |name: &str| {
        cert["secrets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap()
            .clone()
    };
    let gh = secret("GH");
    assert_eq!(
        (gh["connections_used"].clone(), gh["masked"].clone()),
        (json!(2), json!(3))
    );
    assert_eq!(gh["attachments"][0]["destination"], "api.github.com");
    assert_eq!(gh["attachments"][0]["attempts"], json!([1]));
    let ex = secret("EX");
    assert_eq!(
        (ex["connections_used"].clone(), ex["masked"].clone()),
        (json!(0), json!(0))
    );

    assert_eq!(cert["batches"].as_array().unwrap().len(), 2);
    let rejections = cert["batch_rejections"].as_array().unwrap();
    assert_eq!(
        rejections.len(),
        1,
        "only the rejection naming this session"
    );
    assert_eq!(rejections[0]["seq"], 2);
    assert_eq!(rejections[0]["resolved"], false);
    let reset = cert["reset"].as_array().unwrap();
    assert_eq!(reset.len(), 5);
    assert!(reset.iter().all(|s| s["confirmed"] == true));
    assert_eq!(reset[0]["response"]["stub"], true);
}

#[test]
fn an_issued_certificate_is_signed_and_never_changes() {
    let mut env = Env::new().with_policy();
    let key = plane_key();
    let id = env.start(Mode::Agent).session_id;
    env.store
        .record_batch("gw-a", 1, "d1", &records(&id))
        .unwrap();
    env.life().stop(&id).unwrap();
    env.deliver_chain();
    assert!(issue(&mut env.store, &id, &key).unwrap());
    let first = certificate(&env.store, &id).unwrap();
    let envelope = signed(&env.store, &id).unwrap().expect("issued");

    // The signature covers the payload, as kind certificate, under the
    // control plane's key; the payload is the certificate without its
    // signature.
    assert_eq!(envelope.kind, talos_certs::Kind::Certificate);
    talos_certs::verify(&key.public_key(), &envelope).expect("verifies");
    let mut without: serde_json::Value = first.clone();
    without.as_object_mut().unwrap().remove("signature");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&envelope.payload).unwrap(),
        without
    );
    // Signed as another kind, or altered, it does not verify.
    let as_batch = talos_certs::Signed {
        kind: talos_certs::Kind::Batch,
        ..envelope.clone()
    };
    assert!(talos_certs::verify(&key.public_key(), &as_batch).is_err());

    // More records for the session, a record sealed twice, a batch
    // refused, another issue attempt with another key: nothing changes.
    env.store
        .record_batch(
            "gw-b",
            9,
            "d9",
            &[json!({
                "gateway_id": "gw-b", "session_id": id, "verdict": "allowed",
                "opened_at": "2026-11-29T11:00:00.000Z"
            })],
        )
        .unwrap();
    env.store
        .record_rejection("gw-a", 5, "gap", std::slice::from_ref(&id))
        .unwrap();
    assert!(issue(&mut env.store, &id, &plane_key()).unwrap());
    assert_eq!(certificate(&env.store, &id).unwrap(), first);
    assert_eq!(signed(&env.store, &id).unwrap(), Some(envelope));
}

#[test]
fn a_record_sealed_twice_or_cut_then_whole_is_on_the_certificate_once() {
    let mut env = Env::new().with_policy();
    let key = plane_key();
    let id = env.start(Mode::Agent).session_id;
    let record = |conn: u64, cut: bool| {
        let mut r = json!({
            "gateway_id": "gw-a", "instance": "00000000000000aa", "conn": conn,
            "session_id": id, "attempt": 1, "verdict": "allowed",
            "opened_at": "2026-11-29T10:00:00.000Z", "request_count": if cut { 0 } else { 3 }
        });
        if cut {
            r["cause"] = json!("cut_by_crash");
        }
        r
    };
    // Connection 1 whole, then again (a segment sealed twice); connection
    // 2 cut by a crash, then whole (its record reached the journal before
    // the crash but its close mark did not); connection 3 whole, then cut.
    env.store
        .record_batch(
            "gw-a",
            1,
            "d1",
            &[record(1, false), record(2, true), record(3, false)],
        )
        .unwrap();
    env.store
        .record_batch(
            "gw-a",
            2,
            "d2",
            &[record(1, false), record(2, false), record(3, true)],
        )
        .unwrap();
    env.life().stop(&id).unwrap();
    env.deliver_chain();
    assert!(issue(&mut env.store, &id, &key).unwrap());
    let cert = certificate(&env.store, &id).unwrap();
    let mut seen: Vec<(u64, u64)> = cert["connections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["conn"].as_u64().unwrap(),
                c["request_count"].as_u64().unwrap(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(seen, [(1, 3), (2, 3), (3, 3)]);
}

#[test]
fn the_certificate_shows_each_attempt_with_its_cause_and_end() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    env.life().interrupt(&id).unwrap();
    env.life().recover(&id).unwrap();
    env.life().pause(&id).unwrap();
    env.life().resume(&id).unwrap();
    env.life().revoke_all(&id).unwrap();
    env.deliver_chain();
    assert!(issue(&mut env.store, &id, &plane_key()).unwrap());
    let cert = certificate(&env.store, &id).unwrap();
    let attempts: Vec<(u64, String, String)> = cert["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["attempt"].as_u64().unwrap(),
                a["cause"].as_str().unwrap().to_owned(),
                a["end_cause"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        [
            (1, "launch".into(), "interrupted".into()),
            (2, "recovery".into(), "paused".into()),
            (3, "resume".into(), "session_ended".into()),
        ]
    );
    let reasons: Vec<String> = cert["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|a| {
            a["ca"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["destroy_reason"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        reasons,
        [
            "interruption",
            "interruption",
            "pause",
            "pause",
            "revoke_all",
            "revoke_all"
        ]
    );
    assert_eq!(cert["issued"], true);
}

/// Each interruption is an entry of its own: the attempt it ended, when,
/// its cause (who asked), what followed and its outcome.
#[test]
fn each_interruption_is_an_entry_with_its_cause_time_and_what_followed() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    env.life().interrupt(&id).unwrap();
    env.life().recover(&id).unwrap();
    env.life().interrupt(&id).unwrap();
    env.life().stop(&id).unwrap();
    let cert = env.issue(&id);
    let entries = cert["interruptions"].as_array().expect("interruptions");
    assert_eq!(entries.len(), 2, "{cert}");
    let interrupts: Vec<&serde_json::Value> = cert["commands"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["event"] == "interrupt")
        .collect();
    let (first, second) = (&entries[0], &entries[1]);
    assert_eq!(first["attempt"], 1);
    assert_eq!(first["at"], interrupts[0]["at"]);
    assert_eq!(first["cause"]["requester"], "operator");
    assert!(first["cause"]["requested_by"].is_string());
    assert_eq!(first["outcome"], "recovered");
    assert_eq!(first["followed_by"]["event"], "recover");
    assert_eq!(first["followed_by"]["attempt"], 2);
    assert_eq!(second["attempt"], 2);
    assert_eq!(second["at"], interrupts[1]["at"]);
    assert_eq!(second["outcome"], "ended");
    assert_eq!(second["followed_by"]["event"], "stop");

    // In mode agent the interruption ends the session itself.
    let id = env.start(Mode::Agent).session_id;
    env.life().interrupt(&id).unwrap();
    let cert = env.issue(&id);
    let entries = cert["interruptions"].as_array().expect("interruptions");
    assert_eq!(entries.len(), 1, "{cert}");
    assert_eq!(entries[0]["attempt"], 1);
    assert_eq!(entries[0]["outcome"], "lost");
    assert!(entries[0]["followed_by"].is_null());
    assert_eq!(cert["end_reason"], "interruption_lost");

    // A session never interrupted has none.
    let id = env.start(Mode::Commands).session_id;
    env.life().stop(&id).unwrap();
    assert_eq!(env.issue(&id)["interruptions"], serde_json::json!([]));
}

#[test]
fn a_gap_a_gateway_set_aside_shows_on_the_certificates_it_touches() {
    let mut env = Env::new().with_policy();
    let key = std::sync::Arc::new(talos_certs::GatewayKey::generate().unwrap());
    env.store
        .register_gateway("gw-a", &hex::encode(key.public_key()))
        .unwrap();
    let live = env.start(Mode::Agent).session_id;
    let live_made = env.life().status(&live).unwrap().attempts[0].ca[0]
        .made_at
        .clone();
    let gap = json!({"gap": {
        "seq": 1, "found": "bad_signature", "reason": "disk fault",
        "expected_digest": null, "window_after": null,
        "window_before": live_made, "set_aside_file": "00000000000000000001.batch.x",
        "set_aside_at": "2026-12-02T00:00:00.000Z"
    }});
    let signed = talos_certs::BatchWriter::new(key, "gw-a")
        .seal(
            "2026-12-02T00:00:00.000Z",
            &[serde_json::to_vec(&gap).unwrap()],
        )
        .unwrap();
    let verdict = talos_control_stub::batches::accept(&mut env.store, &signed).unwrap();
    assert!(matches!(
        verdict,
        talos_control_stub::batches::BatchVerdict::Accepted { .. }
    ));
    let shown = certificate(&env.store, &live).unwrap();
    let gaps = shown["gaps"].as_array().unwrap();
    assert_eq!(gaps.len(), 1, "{shown}");
    assert_eq!(gaps[0]["gateway_id"], "gw-a");
    assert_eq!(gaps[0]["found"], "bad_signature");
    assert_eq!(gaps[0]["reason"], "disk fault");
    // A gap is no connection.
    assert!(shown["connections"].as_array().unwrap().is_empty());
    // A session that ended before the gap's window is not touched.
    let mut other = common::request(Mode::Agent);
    other.sources = vec!["10.1.0.9".into()];
    let early = env.life().start(&other).unwrap().session_id;
    env.life().stop(&early).unwrap();
    let late = json!({"gap": {
        "seq": 2, "found": "missing", "reason": "lost",
        "expected_digest": null, "window_after": "2999-01-01T00:00:00.000Z",
        "window_before": "2999-01-02T00:00:00.000Z", "set_aside_file": null,
        "set_aside_at": "2999-01-02T00:00:00.000Z"
    }});
    env.store
        .write(|tx| {
            let mut g: talos_control_stub::store::ChainGap =
                serde_json::from_value(late["gap"].clone()).unwrap();
            g.gateway_id = "gw-a".into();
            tx.insert_gap(&g)
        })
        .unwrap();
    let early_cert = certificate(&env.store, &early).unwrap();
    assert!(
        early_cert["gaps"].as_array().unwrap().is_empty(),
        "{early_cert}"
    );
}

#[test]
fn a_forwarded_connection_counts_once_and_its_hand_off_is_shown_beside_it() {
    let mut env = Env::new().with_policy();
    let key = plane_key();
    let id = env.start(Mode::Agent).session_id;
    // gw-a holds no authority and hands two connections to gw-b: the first
    // reaches it, the second finds it unreachable.
    let handed = json!({
        "gateway_id": "gw-a", "instance": "00000000000000a1", "conn": 1,
        "session_id": id, "attempt": 1, "tenant": "acme",
        "source": "10.1.0.2:40000", "sni": "api.github.com", "verdict": "allowed",
        "forwarded_to": "gw-b", "request_count": 0,
        "opened_at": "2026-11-29T10:00:00.000Z", "closed_at": "2026-11-29T10:00:05.000Z",
        "bytes_from_session": 900, "bytes_to_session": 4000
    });
    let lost = json!({
        "gateway_id": "gw-a", "instance": "00000000000000a1", "conn": 2,
        "session_id": id, "attempt": 1, "tenant": "acme",
        "source": "10.1.0.2:40001", "sni": "api.github.com",
        "verdict": "upstream_failed", "cause": "holder_unreachable",
        "forwarded_to": "gw-b", "request_count": 0,
        "opened_at": "2026-11-29T10:00:06.000Z", "closed_at": "2026-11-29T10:00:06.100Z",
        "bytes_from_session": 300, "bytes_to_session": 0
    });
    env.store
        .record_batch("gw-a", 1, "d1", &[handed.clone(), lost.clone()])
        .unwrap();
    // gw-b's record of the first: the connection, with its requests.
    let served = json!({
        "gateway_id": "gw-b", "instance": "00000000000000b1", "conn": 1,
        "session_id": id, "attempt": 1, "tenant": "acme",
        "source": "10.1.0.2:40000", "sni": "api.github.com", "verdict": "allowed",
        "via": "gw-a", "request_count": 2,
        "requests": [
            {"method": "GET", "path": "/user", "status": 200},
            {"method": "GET", "path": "/x", "status": 421, "refusal": "host_mismatch"}
        ],
        "attachments_used": ["GH"], "masked": {"GH": 1},
        "opened_at": "2026-11-29T10:00:00.010Z", "closed_at": "2026-11-29T10:00:05.000Z",
        "bytes_from_session": 900, "bytes_to_session": 4000
    });
    env.store
        .record_batch("gw-b", 1, "d1", std::slice::from_ref(&served))
        .unwrap();
    env.life().stop(&id).unwrap();
    env.deliver_chain();
    assert!(issue(&mut env.store, &id, &key).unwrap());
    let cert = certificate(&env.store, &id).unwrap();
    assert_eq!(cert["issued"], true, "{cert}");

    // Two connections: the one gw-b served (through gw-a) and the one no
    // holder got; the hand-off is shown apart, as signed.
    assert_eq!(cert["connections"], json!([lost, served]));
    assert_eq!(cert["forwarded"], json!([handed]));
    let refusals: Vec<(&str, &str, &str)> = cert["refusals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["kind"].as_str().unwrap(),
                r["reason"].as_str().unwrap(),
                r["gateway_id"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        refusals,
        [
            ("connection", "upstream_failed", "gw-a"),
            ("request", "host_mismatch", "gw-b")
        ]
    );
    assert_eq!(cert["refusals"][0]["cause"], "holder_unreachable");
    let gh = cert["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "GH")
        .unwrap();
    assert_eq!(
        (gh["connections_used"].clone(), gh["masked"].clone()),
        (json!(1), json!(1))
    );
    // Both members' batches carried records of the session.
    assert_eq!(cert["batches"].as_array().unwrap().len(), 2);
}

/// The holder's record of a connection gw-a forwarded to gw-b, from
/// `port`, opened at `opened` (seconds past 10:00).
fn served_via(id: &str, conn: u64, port: u16, opened: u32) -> serde_json::Value {
    json!({
        "gateway_id": "gw-b", "instance": "00000000000000b1", "conn": conn,
        "session_id": id, "attempt": 1, "tenant": "acme",
        "source": format!("10.1.0.2:{port}"), "sni": "api.github.com",
        "verdict": "session_ended", "cause": "session_closed", "via": "gw-a",
        "request_count": 1,
        "requests": [{"method": "GET", "path": format!("/download/{conn}"), "status": 200, "cut": true}],
        "opened_at": format!("2026-11-29T10:00:{opened:02}.000Z"),
        "closed_at": "2026-11-29T10:01:00.000Z",
        "bytes_from_session": 400, "bytes_to_session": 5_000_000
    })
}

/// gw-a's hand-off record of the connection from `port` to gw-b.
fn handed_from(id: &str, conn: u64, port: u16) -> serde_json::Value {
    json!({
        "gateway_id": "gw-a", "instance": "00000000000000a2", "conn": conn,
        "session_id": id, "attempt": 1, "tenant": "acme",
        "source": format!("10.1.0.2:{port}"), "sni": "api.github.com", "verdict": "allowed",
        "forwarded_to": "gw-b", "request_count": 0,
        "opened_at": "2026-11-29T10:00:00.000Z", "closed_at": "2026-11-29T10:01:03.000Z",
        "bytes_from_session": 400, "bytes_to_session": 5_000_000
    })
}

/// A start report of gw-a, in batch `seq` of its chain, of a process that
/// started at `started_at`.
fn gw_a_started(env: &mut Env, seq: u64, instance: &str, started_at: &str) {
    use talos_control_stub::store::StartRecord;
    env.store
        .write(|tx| {
            tx.insert_start_report(
                &StartRecord {
                    gateway_id: "gw-a".into(),
                    instance: instance.into(),
                    started_at: started_at.into(),
                    previous_instance: "00000000000000a2".into(),
                    cut_by_crash: 0,
                    key_id: "0000000000000000".into(),
                    batch_seq: seq,
                    received_at: "2026-11-29T10:02:00.000Z".into(),
                    report_digest: String::new(),
                },
                instance.as_bytes(),
            )?;
            Ok(())
        })
        .unwrap();
}

/// The certificate waits for every member that forwarded for the
/// session, not only those that held it: each connection a holder's
/// record says came `via` a forwarder waits for the forwarder's hand-off
/// record (a Stop cuts the holder's side at once; the forwarder's closes
/// once its client has read what it holds). Its signed word that the
/// process that forwarded is gone — a start report of a process begun
/// since — ends the wait: what that process had not synced never comes.
/// A start report of a process begun before does not. Until then
/// `certificate` and `sandbox status` say what it waits for; issued, each
/// connection counts once, the hand-offs listed beside.
#[test]
fn the_certificate_waits_for_the_forwarders_hand_off_records() {
    let mut env = Env::new().with_policy();
    let key = plane_key();
    let id = env.start(Mode::Agent).session_id;
    let served: Vec<serde_json::Value> = [(1, 41_000, 10), (2, 41_001, 11), (3, 41_002, 12)]
        .iter()
        .map(|&(conn, port, opened)| served_via(&id, conn, port, opened))
        .collect();
    env.store.record_batch("gw-b", 1, "b1", &served).unwrap();
    env.life().stop(&id).unwrap();
    env.deliver_chain();
    // Every holder's chain is in; the three hand-offs are not.
    assert!(!issue(&mut env.store, &id, &key).unwrap());
    let waiting = certificate(&env.store, &id).unwrap();
    assert_eq!(waiting["issued"], false);
    let because = waiting["not_issued_because"].as_str().unwrap();
    assert!(
        because.contains("gateway gw-a's hand-off records of 3 connections it forwarded to gw-b"),
        "{because}"
    );
    let status = env.life().status(&id).unwrap();
    assert_eq!(status.session.state, State::Ended);
    assert_eq!(status.certificate_waits_for.as_deref(), Some(because));

    // Two come; one is still owed.
    env.store
        .record_batch(
            "gw-a",
            1,
            "a1",
            &[handed_from(&id, 7, 41_000), handed_from(&id, 8, 41_001)],
        )
        .unwrap();
    assert!(!issue(&mut env.store, &id, &key).unwrap());
    let because = certificate(&env.store, &id).unwrap()["not_issued_because"].clone();
    assert!(
        because
            .as_str()
            .unwrap()
            .contains("hand-off records of 1 connection it forwarded"),
        "{because}"
    );
    // A start report of a process of gw-a that began before the last of
    // them opened is no word on it (that process may still hold it)...
    gw_a_started(&mut env, 2, "00000000000000a3", "2026-11-29T10:00:11.500Z");
    assert!(!issue(&mut env.store, &id, &key).unwrap());
    // ...one begun after it is: the process that forwarded it is gone,
    // and whatever it had not synced with it.
    gw_a_started(&mut env, 3, "00000000000000a4", "2026-11-29T10:00:30.000Z");
    assert!(issue(&mut env.store, &id, &key).unwrap());
    let cert = certificate(&env.store, &id).unwrap();
    assert_eq!(cert["issued"], true, "{cert}");
    assert_eq!(cert["connections"], json!(served), "each connection once");
    assert_eq!(
        cert["forwarded"],
        json!([handed_from(&id, 7, 41_000), handed_from(&id, 8, 41_001)])
    );
    assert_eq!(cert["refusals"].as_array().unwrap().len(), 3);
}

/// A hand-off record is matched to the holder's record by the source it
/// names, one each: a source port used again by a later connection is
/// owed a second hand-off.
#[test]
fn a_source_port_used_twice_is_owed_two_hand_offs() {
    let mut env = Env::new().with_policy();
    let key = plane_key();
    let id = env.start(Mode::Agent).session_id;
    env.store
        .record_batch(
            "gw-b",
            1,
            "b1",
            &[
                served_via(&id, 1, 41_000, 10),
                served_via(&id, 2, 41_000, 40),
            ],
        )
        .unwrap();
    env.life().stop(&id).unwrap();
    env.deliver_chain();
    env.store
        .record_batch("gw-a", 1, "a1", &[handed_from(&id, 7, 41_000)])
        .unwrap();
    assert!(!issue(&mut env.store, &id, &key).unwrap());
    let because = certificate(&env.store, &id).unwrap()["not_issued_because"].clone();
    assert!(
        because
            .as_str()
            .unwrap()
            .contains("hand-off records of 1 connection"),
        "{because}"
    );
    env.store
        .record_batch("gw-a", 2, "a2", &[handed_from(&id, 9, 41_000)])
        .unwrap();
    assert!(issue(&mut env.store, &id, &key).unwrap());
}

#[test]
fn a_sessions_dns_counts_are_listed_apart_and_summed_never_as_connections() {
    let mut env = Env::new().with_policy();
    let key = plane_key();
    let id = env.start(Mode::Agent).session_id;
    let tally = |gw: &str, answered: u64, unlisted: u64| {
        json!({
            "kind": "dns", "gateway_id": gw, "instance": "00000000000000a1",
            "session_id": id, "attempt": 1, "tenant": "acme", "source": "10.1.0.2",
            "opened_at": "2026-11-29T10:00:00.000Z", "closed_at": "2026-11-29T10:01:00.000Z",
            "queries": {"answered": answered, "unlisted": unlisted},
            "answered": answered, "refused": unlisted,
            "refused_names": unlisted, "refused_names_at_least": false,
            "longest_refused_name": 40
        })
    };
    let (a, b) = (tally("gw-a", 10, 3), tally("gw-b", 5, 1));
    env.store
        .record_batch("gw-a", 1, "d1", std::slice::from_ref(&a))
        .unwrap();
    env.store
        .record_batch("gw-b", 1, "d1", std::slice::from_ref(&b))
        .unwrap();
    env.life().stop(&id).unwrap();
    env.deliver_chain();
    assert!(issue(&mut env.store, &id, &key).unwrap());
    let cert = certificate(&env.store, &id).unwrap();
    assert_eq!(cert["connections"], json!([]), "no connection: {cert}");
    assert_eq!(cert["refusals"], json!([]), "{cert}");
    assert_eq!(cert["dns"], json!([a, b]));
    assert_eq!(cert["dns_totals"], json!({"answered": 15, "unlisted": 4}));
}
