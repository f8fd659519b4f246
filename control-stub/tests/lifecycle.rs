//! The behaviour table of "Sandbox sessions", the gateway's columns: one
//! test per row, against a fake gateway pair.

mod common;

use std::time::{Duration, SystemTime};

use common::{request, Env};
use talos_control_stub::error::LinkError;
use talos_control_stub::fake::{Call, FakeVerifier, Tamper};
use talos_control_stub::link::{CloseAnswer, Described, Renewed, Reply};
use talos_control_stub::model::AttemptEnd;
use talos_control_stub::{
    CloseReason, EndReason, GatewayLink, Mode, OpenCause, OpenSession, Opened, State,
};

fn closes(env: &Env) -> Vec<CloseReason> {
    env.link
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Close(c, _) => Some(c.reason),
            _ => None,
        })
        .collect()
}

#[test]
fn start_opens_attempt_1_on_every_gateway() {
    let mut env = Env::new().with_policy();
    let t = env.start(Mode::Commands);
    assert_eq!(t.state, State::Running);
    assert_eq!(t.attempt, 1);
    assert!(t.session_id.starts_with("sbx-") && t.session_id.len() == 16);
    assert_eq!(t.ca.len(), 2);
    assert_ne!(t.ca[0].digest, t.ca[1].digest);

    let open = env.link.last_open().unwrap();
    assert_eq!(open.session_id, t.session_id);
    assert_eq!((open.attempt, open.cause), (1, OpenCause::Launch));
    assert_eq!(open.tenant, "acme");
    assert_eq!(
        open.sources,
        vec!["10.1.0.2".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(open.allowlist, ["api.github.com", "api.example.com"]);
    let gh = open.attachments.iter().find(|a| a.secret == "GH").unwrap();
    assert_eq!(&gh.value[..], b"gh-value-1-QZX");
    assert_eq!(gh.header, "authorization");
    assert_eq!(gh.scheme.as_deref(), Some("Bearer"));

    let status = env.life().status(&t.session_id).unwrap();
    assert_eq!(status.session.state, State::Running);
    assert_eq!(status.attempts.len(), 1);
    let digests: Vec<&str> = status.attempts[0]
        .ca
        .iter()
        .map(|c| c.digest.as_str())
        .collect();
    assert_eq!(digests, [t.ca[0].digest.as_str(), t.ca[1].digest.as_str()]);
    assert!(status.attempts[0]
        .ca
        .iter()
        .all(|c| c.destroyed_at.is_none()));
}

#[test]
fn pause_destroys_the_ca_and_drops_the_attachments() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    let t = env.life().pause(&id).unwrap();
    assert_eq!(t.state, State::Paused);
    assert_eq!(t.reports.len(), 2);
    for r in &t.reports {
        assert_eq!(r.reason, CloseReason::Pause);
        assert_eq!(r.ca_error, None);
        assert_eq!(r.secrets_error, None);
        assert_eq!(r.secrets, ["EX", "GH"]);
    }
    assert!(!env.link.holds(&id), "the gateways hold no authority");

    let status = env.life().status(&id).unwrap();
    assert_eq!(status.session.state, State::Paused);
    let a = &status.attempts[0];
    assert_eq!(a.attempt.end_cause.map(|e| e.as_str()), Some("paused"));
    for ca in &a.ca {
        assert!(ca.destroyed_at.is_some());
        assert_eq!(ca.destroy_reason, Some(CloseReason::Pause));
    }
}

#[test]
fn pause_in_mode_agent_is_refused() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Agent).session_id;
    let before = env.dump();
    let calls = env.link.calls().len();
    let err = env.life().pause(&id).unwrap_err();
    assert_eq!(err.code(), "sandbox_pause_unavailable");
    assert_eq!(env.dump(), before);
    assert_eq!(env.link.calls().len(), calls, "the gateways were not asked");
    assert!(env.link.holds(&id));
}

#[test]
fn resume_opens_a_new_authority_from_the_current_policy() {
    let mut env = Env::new().with_policy();
    env.store.secret_set("acme", "GONE", b"gone-value").unwrap();
    let mut req = request(Mode::Commands);
    req.attach.push("GONE=api.github.com:x-other".into());
    let started = env.life().start(&req).unwrap();
    let id = started.session_id.clone();
    env.life().pause(&id).unwrap();

    // While paused: a destination leaves the egress list, a secret is
    // deleted, another gets a new value.
    env.store.egress_remove("api.example.com").unwrap();
    env.store.secret_delete("acme", "GONE").unwrap();
    env.store
        .secret_set("acme", "GH", b"gh-value-2-QZX")
        .unwrap();

    let t = env.life().resume(&id).unwrap();
    assert_eq!(t.state, State::Running);
    assert_eq!(t.attempt, 2);
    assert_eq!(
        t.allowlist.as_deref(),
        Some(&["api.github.com".to_owned()][..])
    );
    let attached: Vec<&str> = t
        .attachments
        .as_ref()
        .unwrap()
        .iter()
        .map(|a| a.secret.as_str())
        .collect();
    assert_eq!(attached, ["GH"]);
    let left: Vec<(&str, &str)> = t
        .left_out
        .iter()
        .map(|l| (l.kind, l.name.as_str()))
        .collect();
    assert_eq!(
        left,
        [
            ("destination", "api.example.com"),
            ("attachment", "EX"),
            ("attachment", "GONE")
        ]
    );
    for new in &t.ca {
        assert!(started.ca.iter().all(|old| old.digest != new.digest));
    }

    let open = env.link.last_open().unwrap();
    assert_eq!((open.attempt, open.cause), (2, OpenCause::Resume));
    assert_eq!(open.allowlist, ["api.github.com"]);
    assert_eq!(open.attachments.len(), 1);
    assert_eq!(
        &open.attachments[0].value[..],
        b"gh-value-2-QZX",
        "read at resume"
    );

    let status = env.life().status(&id).unwrap();
    assert_eq!(status.attempts.len(), 2);
    assert_eq!(status.attempts[1].attempt.cause, OpenCause::Resume);
    // The session still shows what it asked for.
    assert_eq!(status.session.allow.len(), 2);
}

#[test]
fn interruption_recovered() {
    let mut env = Env::new().with_policy();
    let started = env.start(Mode::Commands);
    let id = started.session_id;
    let t = env.life().interrupt(&id).unwrap();
    assert_eq!(t.state, State::Interrupted);
    assert!(t
        .reports
        .iter()
        .all(|r| r.reason == CloseReason::Interruption
            && r.ca_error.is_none()
            && r.secrets_error.is_none()));
    assert!(!env.link.holds(&id));

    let t = env.life().recover(&id).unwrap();
    assert_eq!((t.state, t.attempt), (State::Running, 2));
    assert_eq!(env.link.last_open().unwrap().cause, OpenCause::Recovery);
    for new in &t.ca {
        assert!(started.ca.iter().all(|old| old.digest != new.digest));
    }
    let status = env.life().status(&id).unwrap();
    assert_eq!(
        status.attempts[0].attempt.end_cause.map(|e| e.as_str()),
        Some("interrupted")
    );
    assert_eq!(status.attempts[1].attempt.cause, OpenCause::Recovery);
}

#[test]
fn interruption_lost_ends_an_agent_session_with_outcome_unknown() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Agent).session_id;
    let t = env.life().interrupt(&id).unwrap();
    assert_eq!(t.state, State::Ended);
    assert_eq!(t.end_reason, Some(EndReason::InterruptionLost));
    assert_eq!(t.outcome.as_deref(), Some("outcome_unknown"));
    assert_eq!(t.reset.len(), 5);
    assert!(t.reset.iter().all(|s| s.confirmed), "{:#?}", t.reset);
    assert_eq!(closes(&env), [CloseReason::Interruption]);
    let cert = env.issue(&id);
    assert_eq!(cert["issued"], true, "{cert}");
    assert_eq!(cert["outcome"], "outcome_unknown");
    // An agent session never recovers.
    assert_eq!(env.life().recover(&id).unwrap_err().code(), "sandbox_ended");
}

#[test]
fn cancellation_from_running() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Agent).session_id;
    let t = env.life().stop(&id).unwrap();
    assert_eq!(t.state, State::Ended);
    assert_eq!(t.end_reason, Some(EndReason::Stop));
    assert_eq!(closes(&env), [CloseReason::End]);
    let names: Vec<&str> = t.reset.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "instance_terminated",
            "egress_group_checked",
            "credentials_revoked",
            "gateway_ca_destroyed",
            "secrets_detached"
        ]
    );
    for step in &t.reset[..3] {
        assert!(step.confirmed);
        assert_eq!(step.response["stub"], true);
        assert_eq!(
            step.response["note"],
            "stub response: this control stub runs no instances"
        );
    }
    assert!(
        t.reset[3].confirmed && t.reset[4].confirmed,
        "{:#?}",
        t.reset
    );
    let status = env.life().status(&id).unwrap();
    assert_eq!(
        status.attempts[0].attempt.end_cause.map(|e| e.as_str()),
        Some("session_ended")
    );
    assert!(status.attempts[0]
        .ca
        .iter()
        .all(|c| c.destroy_reason == Some(CloseReason::End)));
    assert_eq!(env.issue(&id)["issued"], true);
}

#[test]
fn cancellation_from_paused_confirms_steps_4_and_5_from_the_pause_report() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    env.life().pause(&id).unwrap();
    let t = env.life().stop(&id).unwrap();
    assert_eq!(
        closes(&env),
        [CloseReason::Pause],
        "no second close at the stop"
    );
    assert_eq!(t.state, State::Ended);
    assert!(t.reports.is_empty());
    let step4 = &t.reset[3];
    assert!(step4.confirmed, "{step4:#?}");
    let cas = step4.response["cas"].as_array().unwrap();
    assert_eq!(cas.len(), 2);
    assert!(cas.iter().all(|c| c["reason"] == "pause"));
    let step5 = &t.reset[4];
    assert!(step5.confirmed, "{step5:#?}");
    assert_eq!(
        step5.response["detached"][0]["reported"],
        serde_json::json!(["EX", "GH"])
    );
    assert_eq!(env.issue(&id)["issued"], true);
}

#[test]
fn cancellation_after_a_resume_checks_every_attempt() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    env.life().pause(&id).unwrap();
    env.life().resume(&id).unwrap();
    let t = env.life().stop(&id).unwrap();
    assert_eq!(t.state, State::Ended);
    assert_eq!(t.reset[3].response["cas"].as_array().unwrap().len(), 4);
    assert_eq!(t.reset[4].response["detached"].as_array().unwrap().len(), 4);
}

#[test]
fn revoke_all_from_running_and_from_paused() {
    let mut env = Env::new().with_policy();
    let running = env.start(Mode::Agent).session_id;
    let t = env.life().revoke_all(&running).unwrap();
    assert_eq!(
        (t.state, t.end_reason),
        (State::Ended, Some(EndReason::RevokeAll))
    );
    assert_eq!(closes(&env), [CloseReason::RevokeAll]);

    let mut req = request(Mode::Commands);
    req.sources = vec!["10.1.0.3".into()];
    let paused = env.life().start(&req).unwrap().session_id;
    env.life().pause(&paused).unwrap();
    let t = env.life().revoke_all(&paused).unwrap();
    assert_eq!(
        (t.state, t.end_reason),
        (State::Ended, Some(EndReason::RevokeAll))
    );
    assert!(t.reset.iter().all(|s| s.confirmed));
}

#[test]
fn a_report_with_a_wrong_digest_leaves_step_4_unconfirmed() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Agent).session_id;
    env.link.tamper_next_close(Tamper::WrongDigest);
    let t = env.life().stop(&id).unwrap();
    assert_eq!(t.state, State::ResetIncomplete);
    assert!(t.reports[0]
        .ca_error
        .as_deref()
        .unwrap()
        .contains("recorded at open"));
    let step4 = &t.reset[3];
    assert!(!step4.confirmed);
    assert!(
        step4.error.as_deref().unwrap().contains("gateway gw-a"),
        "{step4:#?}"
    );
    assert!(t.reset[4].confirmed, "the secret names were right");

    let status = env.life().status(&id).unwrap();
    let gw_a = &status.attempts[0].ca[0];
    assert_eq!(gw_a.gateway_id, "gw-a");
    assert_eq!(gw_a.destroyed_at, None, "not recorded destroyed");

    // The close stays owed (the report did not confirm it), and the
    // certificate waits.
    let status = env.life().status(&id).unwrap();
    assert!(status
        .closes
        .iter()
        .any(|c| c.gateway_id == "gw-a" && c.confirmed_at.is_none()));
    let cert = env.issue(&id);
    assert_eq!(cert["issued"], false);
    assert!(cert["not_issued_because"]
        .as_str()
        .unwrap()
        .contains("reset_incomplete"));
    // Over, all the same: it never comes back.
    assert_eq!(env.life().stop(&id).unwrap_err().code(), "sandbox_ended");
}

#[test]
fn a_pause_report_missing_a_secret_name_leaves_step_5_unconfirmed() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    env.link.tamper_next_close(Tamper::OmitSecret("GH".into()));
    let p = env.life().pause(&id).unwrap();
    assert_eq!(p.state, State::Paused, "the authority is gone all the same");
    assert!(p.reports[0].secrets_error.is_some());
    let t = env.life().stop(&id).unwrap();
    assert_eq!(t.state, State::ResetIncomplete);
    assert!(t.reset[3].confirmed);
    assert!(!t.reset[4].confirmed);
    assert!(t.reset[4].error.as_deref().unwrap().contains("GH"));
    assert_eq!(env.issue(&id)["issued"], false);
}

#[test]
fn a_report_for_another_attempt_confirms_nothing() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Agent).session_id;
    env.link.tamper_next_close(Tamper::WrongAttempt);
    let t = env.life().stop(&id).unwrap();
    assert!(!t.reset[3].confirmed && !t.reset[4].confirmed);
}

#[test]
fn a_report_whose_signature_fails_confirms_nothing() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Agent).session_id;
    let refuse = FakeVerifier::refusing();
    let t = env.life_with(&refuse).stop(&id).unwrap();
    assert_eq!(t.state, State::ResetIncomplete);
    assert!(!t.reset[3].confirmed && !t.reset[4].confirmed);
    assert!(t.reset[3].error.as_deref().unwrap().contains("signature"));
    assert!(t.reset[..3].iter().all(|s| s.confirmed));
}

/// The one session a failed start left, as `sandbox status` shows it.
fn failed_start(env: &Env) -> talos_control_stub::Status {
    let ids: Vec<String> = env
        .store
        .read(|tx| tx.sessions_in(State::ALL))
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    talos_control_stub::lifecycle::status(&env.store, &ids[0]).unwrap()
}

#[test]
fn a_start_no_member_opens_ends_start_failed_and_holds_nothing() {
    // Unreachable: the start is recorded before the members are asked, so
    // it ends `start_failed` with its attempt, a close owed to each member
    // in case the open reached it unseen, and no CA.
    let mut env = Env::new().with_policy();
    env.link
        .fail_with(Some(LinkError::Unreachable("test: no route".into())));
    let err = env.life().start(&request(Mode::Commands)).unwrap_err();
    assert_eq!(err.code(), "gateway_unreachable");
    assert!(err.to_string().contains("no route"), "{err}");
    let status = failed_start(&env);
    // It never ran: `failed` (spec: "the session ended before its
    // instance existed, and the reset is complete").
    assert_eq!(status.session.state, State::Failed);
    assert_eq!(status.session.end_reason, Some(EndReason::StartFailed));
    assert_eq!(status.attempts.len(), 1);
    assert_eq!(status.attempts[0].attempt.running_at, None);
    let attempt = &status.attempts[0];
    assert_eq!(attempt.attempt.end_cause, Some(AttemptEnd::StartFailed));
    assert!(attempt.ca.is_empty());
    let owed: Vec<&str> = status
        .closes
        .iter()
        .map(|c| c.gateway_id.as_str())
        .collect();
    assert_eq!(owed, ["gw-a", "gw-b"]);
    assert!(status.closes.iter().all(|c| c.confirmed_at.is_none()));
    // When they answer, they hold nothing: settled.
    env.link.fail_with(None);
    let r = talos_control_stub::upkeep::Upkeep {
        store: &mut env.store,
        link: &env.link,
        verifier: &common::ACCEPT,
        plane_key: None,
        relay_key: None,
    }
    .tick(SystemTime::now() + Duration::from_secs(5), false)
    .unwrap();
    assert_eq!(r.closes_confirmed, 2, "{r:?}");
    // Its certificate is issued as an ended session's, and says `failed`.
    let cert = env.issue(&status.session.id);
    assert_eq!(cert["issued"], true, "{cert}");
    assert_eq!(cert["state"], "failed");
    assert_eq!(cert["end_reason"], "start_failed");
    assert_eq!(cert["compute_seconds"], 0);
    assert_eq!(cert["attempts"][0]["running_at"], serde_json::Value::Null);
    // It is over: its source is free for the next start.
    let t = env.start(Mode::Commands);
    assert_eq!(t.state, State::Running);

    // Refused: a refusal is an answer, and holds nothing; no close is owed.
    let mut env = Env::new().with_policy();
    env.link.fail_with(Some(LinkError::Refused {
        gateway_id: "gw-b".into(),
        reason: "busy".into(),
    }));
    assert_eq!(
        env.life()
            .start(&request(Mode::Commands))
            .unwrap_err()
            .code(),
        "gateway_refused"
    );
    let status = failed_start(&env);
    assert_eq!(status.session.state, State::Failed);
    assert_eq!(status.session.end_reason, Some(EndReason::StartFailed));
    assert!(status.closes.is_empty());
    assert!(status.attempts[0].ca.is_empty());
}

#[test]
fn ends_are_committed_whatever_the_members_answer() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    env.link
        .fail_with(Some(LinkError::Unreachable("test: no route".into())));
    // The pause is committed; the closes stay owed, with the error.
    let t = env.life().pause(&id).unwrap();
    assert_eq!(t.state, State::Paused);
    assert!(t.reports.is_empty());
    assert_eq!(t.closes_owed.len(), 2);
    assert!(t
        .closes_owed
        .iter()
        .all(|c| c.tries == 1 && c.last_error.as_deref().unwrap().contains("no route")));
    // So is the stop: the session is over and never comes back, its reset
    // incomplete while the closes are owed.
    let t = env.life().stop(&id).unwrap();
    assert_eq!(t.state, State::ResetIncomplete);
    assert!(!t.reset[3].confirmed && !t.reset[4].confirmed);
    assert!(
        t.reset[3]
            .error
            .as_deref()
            .unwrap()
            .contains("close owed since"),
        "{:#?}",
        t.reset[3]
    );
    assert_eq!(env.life().resume(&id).unwrap_err().code(), "sandbox_ended");
}

/// A link that opens on the fake pair, then misstates one digest.
struct LyingLink<'a>(&'a talos_control_stub::FakeLink);

impl GatewayLink for LyingLink<'_> {
    fn describe(&self) -> Vec<Reply<Described>> {
        self.0.describe()
    }

    fn open(&self, req: &OpenSession) -> Vec<Reply<Opened>> {
        let mut opened = self.0.open(req);
        if let Ok(o) = &mut opened[1].result {
            o.ca_digest = "00".repeat(48);
        }
        opened
    }

    fn close(
        &self,
        req: &talos_control_stub::CloseSession,
        only: Option<&[String]>,
    ) -> Vec<Reply<CloseAnswer>> {
        self.0.close(req, only)
    }

    fn renew(&self, renewals: &[talos_control_stub::link::MemberRenewal]) -> Vec<Reply<Renewed>> {
        self.0.renew(renewals)
    }

    fn decide(
        &self,
        gateway_id: &str,
        decision: &talos_certs::Signed,
    ) -> Result<String, LinkError> {
        self.0.decide(gateway_id, decision)
    }
}

#[test]
fn a_misstated_ca_digest_refuses_the_start_and_undoes_the_opening() {
    let env = Env::new().with_policy();
    let Env {
        dir: _dir,
        db: _,
        mut store,
        link,
    } = env;
    let lying = LyingLink(&link);
    let err = talos_control_stub::Lifecycle::new(&mut store, &lying, &common::ACCEPT)
        .start(&request(Mode::Agent))
        .unwrap_err();
    assert_eq!(err.code(), "gateway_reply_invalid");
    assert!(err.to_string().contains("gw-b"), "{err}");
    let opened = link.last_open().unwrap();
    assert!(!link.holds(&opened.session_id), "the opening was undone");
    // Both were asked to close: gw-a, whose CA is recorded, and gw-b,
    // whose answer did not hold together (it may hold the authority).
    match link.calls().last().unwrap() {
        Call::Close(c, Some(members)) => {
            assert_eq!(c.reason, CloseReason::End);
            assert_eq!(members, &["gw-a", "gw-b"]);
        }
        other => panic!("no undo: {other:?}"),
    }
    // The start ended: gw-a's CA recorded and confirmed destroyed, nothing
    // recorded of gw-b's, both closes settled.
    let status = talos_control_stub::lifecycle::status(&store, &opened.session_id).unwrap();
    assert_eq!(status.session.state, State::Failed);
    assert_eq!(status.session.end_reason, Some(EndReason::StartFailed));
    let ca = &status.attempts[0].ca;
    assert_eq!(ca.len(), 1);
    assert_eq!(ca[0].gateway_id, "gw-a");
    assert!(ca[0].destroyed_at.is_some());
    assert!(status.closes.iter().all(|c| c.confirmed_at.is_some()));
}

#[test]
fn a_session_that_ended_never_comes_back() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    env.life().stop(&id).unwrap();
    let before = env.dump();
    assert_eq!(env.life().resume(&id).unwrap_err().code(), "sandbox_ended");
    assert_eq!(env.life().recover(&id).unwrap_err().code(), "sandbox_ended");
    assert_eq!(
        env.life().interrupt(&id).unwrap_err().code(),
        "sandbox_ended"
    );
    assert_eq!(env.life().stop(&id).unwrap_err().code(), "sandbox_ended");
    assert_eq!(
        env.life().revoke_all(&id).unwrap_err().code(),
        "sandbox_ended"
    );
    // The spec's words for a pause of a session that is not running.
    assert_eq!(
        env.life().pause(&id).unwrap_err().code(),
        "sandbox_not_running"
    );
    assert_eq!(env.dump(), before);
}

#[test]
fn events_from_the_wrong_state_are_refused() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    assert_eq!(
        env.life().resume(&id).unwrap_err().code(),
        "sandbox_not_paused"
    );
    assert_eq!(
        env.life().recover(&id).unwrap_err().code(),
        "sandbox_not_interrupted"
    );
    env.life().pause(&id).unwrap();
    assert_eq!(
        env.life().pause(&id).unwrap_err().code(),
        "sandbox_not_running"
    );
    assert_eq!(
        env.life().interrupt(&id).unwrap_err().code(),
        "sandbox_not_running"
    );
    assert_eq!(
        env.life().recover(&id).unwrap_err().code(),
        "sandbox_not_interrupted"
    );
    assert_eq!(
        env.life().pause("sbx-000000000000").unwrap_err().code(),
        "sandbox_not_found"
    );
}

#[test]
fn start_refuses_what_the_policy_does_not_allow() {
    let mut env = Env::new().with_policy();
    let before = env.dump();
    type Change = fn(&mut talos_control_stub::StartRequest);
    let cases: Vec<(&str, Change)> = vec![
        ("sandbox_destination_not_allowed", |r| {
            r.allow.push("evil.example.net".into())
        }),
        ("secret_not_found", |r| {
            r.attach.push("NOPE=api.github.com:x-nope".into())
        }),
        ("sandbox_request_invalid", |r| {
            r.attach.push("GH=pypi.org:authorization".into())
        }),
        ("sandbox_request_invalid", |r| {
            r.attach.push("EX=api.github.com:authorization".into())
        }),
        ("sandbox_request_invalid", |r| r.tenant = "Acme".into()),
        ("sandbox_request_invalid", |r| {
            r.sources = vec!["nowhere".into()]
        }),
        ("sandbox_request_invalid", |r| r.sources.clear()),
        ("sandbox_request_invalid", |r| {
            r.allow.push("10.0.0.1".into())
        }),
        (
            "secret_not_found",
            // Another tenant's secrets are never found.
            |r| r.tenant = "globex".into(),
        ),
    ];
    for (code, change) in cases {
        let mut req = request(Mode::Agent);
        change(&mut req);
        let err = env.life().start(&req).unwrap_err();
        assert_eq!(err.code(), code, "{req:?}: {err}");
    }
    assert_eq!(env.dump(), before);
    assert!(env.link.calls().is_empty(), "no gateway was asked");
}

#[test]
fn a_source_belongs_to_one_live_session() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    let err = env.life().start(&request(Mode::Agent)).unwrap_err();
    assert_eq!(err.code(), "sandbox_source_in_use");
    env.life().pause(&id).unwrap();
    assert_eq!(
        env.life().start(&request(Mode::Agent)).unwrap_err().code(),
        "sandbox_source_in_use",
        "a paused session keeps its source"
    );
    env.life().stop(&id).unwrap();
    env.start(Mode::Agent);
}

#[test]
fn cancellation_from_interrupted_confirms_from_the_interruption_report() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    env.life().interrupt(&id).unwrap();
    let t = env.life().stop(&id).unwrap();
    assert_eq!(closes(&env), [CloseReason::Interruption]);
    assert_eq!(t.state, State::Ended);
    assert!(t.reset[3].response["cas"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["reason"] == "interruption"));
    assert!(t.reset.iter().all(|s| s.confirmed));
}

/// A Revoke All an operator's client certificate verified is kept as
/// such by the store (either one: `TALOS_TEST_STORE`), shown by `sandbox
/// status` and on the certificate: verified, by `client_certificate`,
/// with the certificate's record; a command-line one stays unverified.
#[test]
fn revoke_all_by_a_client_certificate_is_recorded_as_verified_by_it() {
    use talos_control_stub::store::{ClientCertificate, Requester};
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    let cert = ClientCertificate {
        operator: "opal".into(),
        sha256: "ab".repeat(32),
        serial: "7f01".into(),
        issuer_sha256: "cd".repeat(32),
        certificate: "MIIB".into(),
        verified_at: "2026-12-07T09:00:00.000Z".into(),
    };
    let by = Requester::by_certificate(cert.clone());
    env.life()
        .with_requester(by.clone())
        .revoke_all(&id)
        .unwrap();
    let status = env.life().status(&id).unwrap();
    let last = status.commands.last().unwrap();
    assert_eq!(last.event, "revoke_all");
    assert_eq!(last.by, by, "read back as written");
    let printed = env.issue(&id);
    let shown = printed["commands"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["event"] == "revoke_all")
        .unwrap()
        .clone();
    assert_eq!(shown["requester"], "operator");
    assert_eq!(shown["requested_by"], "opal");
    assert_eq!(shown["verified"], true);
    assert_eq!(shown["verified_by"], "client_certificate");
    assert_eq!(
        shown["client_certificate"],
        serde_json::to_value(&cert).unwrap()
    );
    let start = &printed["commands"][0];
    assert_eq!(start["verified"], false);
    assert!(start.get("verified_by").is_none(), "{start}");
}
