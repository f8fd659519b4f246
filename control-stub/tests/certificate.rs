//! The batch consumer's store side and the session certificate.

mod common;

use common::Env;
use serde_json::json;
use talos_control_stub::certificate::{ISOLATION_STATEMENT, KIND};
use talos_control_stub::{certificate, BatchOutcome, Mode};

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

#[test]
fn the_certificate_holds_records_refusals_secrets_and_the_reset() {
    let mut env = Env::new().with_policy();
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
        .record_rejection("gw-a", 2, "the batch's previous digest is not batch 1's")
        .unwrap();

    let open = certificate(&env.store, &id).unwrap();
    assert!(!open.issued);
    assert!(open.not_issued_because.unwrap().contains("has not ended"));

    env.life().stop(&id).unwrap();
    let cert = certificate(&env.store, &id).unwrap();
    assert!(cert.issued, "{:?}", cert.not_issued_because);
    assert_eq!(cert.kind, KIND);
    assert_eq!(cert.kind, "sandbox session");
    assert_eq!(cert.isolation_statement, ISOLATION_STATEMENT);
    assert!(cert
        .isolation_statement
        .starts_with("One fresh instance served this session alone"));
    assert_eq!(cert.tenant, "acme");

    assert_eq!(cert.attempts.len(), 1);
    assert_eq!(cert.attempts[0].ca.len(), 2);
    assert!(cert.attempts[0].ca.iter().all(|c| c.destroyed_at.is_some()));
    assert_eq!(
        cert.attempts[0].end_cause.map(|e| e.as_str()),
        Some("session_ended")
    );

    // The unknown_source record is no session's.
    assert_eq!(cert.connections.len(), 3);
    let reasons: Vec<(&str, &str)> = cert
        .refusals
        .iter()
        .map(|r| (r.kind, r.reason.as_str()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("request", "host_mismatch"),
            ("connection", "not_on_allowlist")
        ]
    );
    assert_eq!(cert.refusals[0].path.as_deref(), Some("/x"));

    let gh = cert.secrets.iter().find(|s| s.name == "GH").unwrap();
    assert_eq!((gh.connections_used, gh.masked), (2, 3));
    assert_eq!(gh.attachments[0].destination, "api.github.com");
    assert_eq!(gh.attachments[0].attempts, [1]);
    let ex = cert.secrets.iter().find(|s| s.name == "EX").unwrap();
    assert_eq!((ex.connections_used, ex.masked), (0, 0));

    assert_eq!(cert.batches.len(), 2);
    assert_eq!(cert.batch_rejections.len(), 1);
    assert_eq!(cert.batch_rejections[0].seq, 2);
    assert_eq!(cert.reset.len(), 5);
    assert!(cert.reset.iter().all(|s| s.confirmed));
    assert_eq!(cert.reset[0].response["stub"], true);
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
    let cert = certificate(&env.store, &id).unwrap();
    let attempts: Vec<(u32, &str, Option<&str>)> = cert
        .attempts
        .iter()
        .map(|a| (a.attempt, a.cause.as_str(), a.end_cause.map(|e| e.as_str())))
        .collect();
    assert_eq!(
        attempts,
        [
            (1, "launch", Some("interrupted")),
            (2, "recovery", Some("paused")),
            (3, "resume", Some("session_ended")),
        ]
    );
    let reasons: Vec<Option<&str>> = cert
        .attempts
        .iter()
        .flat_map(|a| a.ca.iter().map(|c| c.destroy_reason.as_deref()))
        .collect();
    assert_eq!(
        reasons,
        [
            Some("interruption"),
            Some("interruption"),
            Some("pause"),
            Some("pause"),
            Some("revoke_all"),
            Some("revoke_all")
        ]
    );
    assert!(cert.issued);
}
