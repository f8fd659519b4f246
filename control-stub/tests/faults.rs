//! A session's authority ends everywhere, whatever fails: the state
//! machine and `serve`'s upkeep loop against a fake pair whose members go
//! down, restart or let leases lapse, on a clock the tests move (no test
//! here sleeps).

mod common;

use std::time::{Duration, SystemTime};
use talos_control_stub::store::Value;

use common::{request, Env, ACCEPT};
use talos_control_stub::fake::Call;
use talos_control_stub::link::{CloseAnswer, Described, Renewed, Reply};
use talos_control_stub::model::AttemptEnd;
use talos_control_stub::upkeep::Upkeep;
use talos_control_stub::{
    confirm, CloseSession, EndReason, Error, GatewayLink, Lifecycle, Mode, OpenSession, Opened,
    StartRequest, State, Transition,
};

/// One tick of the upkeep loop at `now` (renewing too when `renew`).
fn tick(env: &mut Env, now: SystemTime, renew: bool) -> talos_control_stub::upkeep::TickReport {
    let key = talos_certs::GatewayKey::generate().unwrap();
    Upkeep {
        store: &mut env.store,
        link: &env.link,
        verifier: &ACCEPT,
        plane_key: Some(&key),
        relay_key: None,
    }
    .tick(now, renew)
    .unwrap()
}

fn owed(env: &mut Env, id: &str) -> Vec<String> {
    env.life()
        .status(id)
        .unwrap()
        .closes
        .into_iter()
        .filter(|c| c.confirmed_at.is_none())
        .map(|c| c.gateway_id)
        .collect()
}

fn state(env: &mut Env, id: &str) -> State {
    env.life().status(id).unwrap().session.state
}

#[test]
fn stop_with_a_member_down_ends_the_session_and_its_close_is_asked_until_confirmed() {
    for revoke in [false, true] {
        let mut env = Env::new().with_policy();
        let id = env.start(Mode::Commands).session_id;
        env.link.set_down("gw-b", true);
        let t = if revoke {
            env.life().revoke_all(&id).unwrap()
        } else {
            env.life().stop(&id).unwrap()
        };
        // The end is committed and gw-a confirmed at once; gw-b's close is
        // owed, with the error, and the reset incomplete.
        assert_eq!(t.state, State::ResetIncomplete);
        assert!(!env.link.member_holds("gw-a", &id));
        assert_eq!(owed(&mut env, &id), ["gw-b"]);
        let close = &t.closes_owed[0];
        assert!(
            close.last_error.as_deref().unwrap().contains("down"),
            "{close:?}"
        );
        assert_eq!(close.tries, 1);
        // Not due yet: a tick now asks nothing.
        let now = SystemTime::now();
        assert_eq!(tick(&mut env, now, false).closes_asked, 0);
        // Still down at the next ask: owed again, later (the delay doubles).
        let first_next = env.life().status(&id).unwrap().closes[1].next_at.clone();
        let r = tick(&mut env, now + Duration::from_secs(2), false);
        assert_eq!((r.closes_asked, r.closes_confirmed), (1, 0));
        let second_next = env.life().status(&id).unwrap().closes[1].next_at.clone();
        assert!(second_next > first_next);
        // Back up: the next ask confirms, and the session is ended.
        env.link.set_down("gw-b", false);
        let r = tick(&mut env, now + Duration::from_secs(60), false);
        assert_eq!(r.closes_confirmed, 1);
        assert!(!env.link.holds(&id));
        assert_eq!(state(&mut env, &id), State::Ended);
        assert!(owed(&mut env, &id).is_empty());
        // Steps 4 and 5 keep every earlier outcome (one per failed ask of
        // gw-b's close: 1 try, then 2), unconfirmed and naming gw-b, beside
        // the confirmation that came later.
        let status = env.life().status(&id).unwrap();
        for step in &status.reset[3..] {
            assert!(step.confirmed, "{step:?}");
            assert_eq!(step.earlier.len(), 2, "{step:?}");
            for (tries, outcome) in step.earlier.iter().enumerate() {
                assert!(!outcome.confirmed, "{step:?}");
                let error = outcome.error.as_deref().unwrap();
                assert!(error.contains("gw-b"), "{step:?}");
                assert!(error.contains(&format!("({} tries", tries + 1)), "{error}");
                assert!(outcome.at <= step.at, "{step:?}");
            }
        }
        for step in &status.reset[..3] {
            assert!(step.earlier.is_empty(), "recorded once: {step:?}");
        }
        // Who asked: the start and the end, by the operator running this.
        let who = talos_control_stub::lifecycle::local_operator();
        let asked: Vec<(&str, &str, &str)> = status
            .commands
            .iter()
            .map(|c| {
                (
                    c.event.as_str(),
                    c.by.requester.as_str(),
                    c.by.requested_by.as_str(),
                )
            })
            .collect();
        let end = if revoke { "revoke_all" } else { "stop" };
        assert_eq!(
            asked,
            [
                ("start", "operator", who.as_str()),
                (end, "operator", who.as_str())
            ]
        );
        // And the certificate, once the chains are in, shows both outcomes
        // and who asked.
        let cert = env.issue(&id);
        assert_eq!(cert["issued"], true);
        assert_eq!(cert["reset"][3]["confirmed"], true, "{cert}");
        assert_eq!(cert["reset"][3]["earlier"][0]["confirmed"], false, "{cert}");
        assert_eq!(cert["commands"][1]["event"], end, "{cert}");
        assert_eq!(cert["commands"][1]["requested_by"], who.as_str(), "{cert}");
    }
}

#[test]
fn owed_closes_survive_a_restart_of_the_control_plane() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Agent).session_id;
    env.link.set_down("gw-a", true);
    env.life().stop(&id).unwrap();
    // A new store connection, as a restarted `serve` opens.
    let db = env.db();
    env.store = talos_control_stub::Store::open(&db).unwrap();
    env.link.set_down("gw-a", false);
    let r = tick(&mut env, SystemTime::now() + Duration::from_secs(5), false);
    assert_eq!(r.closes_confirmed, 1);
    assert_eq!(state(&mut env, &id), State::Ended);
}

#[test]
fn a_lease_that_lapsed_on_a_member_nobody_reached_is_confirmed_from_its_chain() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    // gw-b is cut off (hung, partitioned): the stop cannot reach it.
    env.link.set_down("gw-b", true);
    env.life().revoke_all(&id).unwrap();
    assert_eq!(owed(&mut env, &id), ["gw-b"]);
    // Nobody renews it, so its lease lapses: it ends the authority itself
    // and puts the report in its chain, which the consumer receives.
    let report = env.link.lapse("gw-b", &id).expect("gw-b held it");
    assert_eq!(report.reason, "lease_expired");
    env.store
        .write(|tx| confirm::chain_drop_report(tx, &ACCEPT, &report, 9))
        .unwrap();
    assert!(owed(&mut env, &id).is_empty());
    assert_eq!(state(&mut env, &id), State::Ended);
    let status = env.life().status(&id).unwrap();
    let gw_b = status.attempts[0]
        .ca
        .iter()
        .find(|c| c.gateway_id == "gw-b")
        .unwrap();
    assert_eq!(
        gw_b.destroy_reason.map(|r| r.as_str()),
        Some("lease_expired")
    );
    let closes = status.closes;
    assert_eq!(
        closes
            .iter()
            .find(|c| c.gateway_id == "gw-b")
            .unwrap()
            .confirmed_by
            .as_deref(),
        Some("chain")
    );
    // When gw-b wakes, the retry gets the same report: nothing changes.
    env.link.set_down("gw-b", false);
    tick(
        &mut env,
        SystemTime::now() + Duration::from_secs(120),
        false,
    );
    assert_eq!(state(&mut env, &id), State::Ended);
}

#[test]
fn a_restarted_member_is_confirmed_by_its_start_report_and_serves_the_next_attempt() {
    let mut env = Env::new().with_policy();
    let t = env.start(Mode::Commands);
    let id = t.session_id.clone();
    let old_instance = env.link.instance("gw-b");
    let new_instance = env.link.restart("gw-b");
    assert_ne!(old_instance, new_instance);
    // A pause after the restart works: gw-b's new process never held the
    // attempt (not held), which is no confirmation by itself.
    let p = env.life().pause(&id).unwrap();
    assert_eq!(p.state, State::Paused);
    assert_eq!(owed(&mut env, &id), ["gw-b"]);
    let close = &p.closes_owed[0];
    assert!(
        close.last_error.as_deref().unwrap().contains("restarted"),
        "{close:?}"
    );
    // Its start report (in its chain) says the old process is gone, with
    // everything it held.
    env.store
        .write(|tx| {
            let r = talos_control_stub::store::StartRecord {
                gateway_id: "gw-b".into(),
                instance: old_instance.clone(),
                started_at: "2026-12-01T00:00:00.000Z".into(),
                previous_instance: String::new(),
                cut_by_crash: 0,
                key_id: "k".into(),
                batch_seq: 1,
                received_at: "2026-12-01T00:00:00.000Z".into(),
                report_digest: "d1".into(),
            };
            tx.insert_start_report(&r, b"old")?;
            let r = talos_control_stub::store::StartRecord {
                instance: new_instance.clone(),
                previous_instance: old_instance.clone(),
                batch_seq: 5,
                report_digest: "d5".into(),
                ..r
            };
            tx.insert_start_report(&r, b"new")?;
            confirm::start_report(tx, "gw-b", &new_instance, "d5")?;
            Ok(())
        })
        .unwrap();
    assert!(owed(&mut env, &id).is_empty());
    // Resume opens on both, gw-b from its new process; the trust bundle
    // holds only live CAs.
    let r = env.life().resume(&id).unwrap();
    assert_eq!(r.ca.len(), 2);
    let status = env.life().status(&id).unwrap();
    let live: Vec<&str> = status
        .attempts
        .iter()
        .flat_map(|a| a.ca.iter())
        .filter(|c| c.destroyed_at.is_none())
        .map(|c| c.digest.as_str())
        .collect();
    assert_eq!(live, [r.ca[0].digest.as_str(), r.ca[1].digest.as_str()]);
    let gw_b_first = status.attempts[0]
        .ca
        .iter()
        .find(|c| c.gateway_id == "gw-b")
        .unwrap();
    assert_eq!(
        gw_b_first.destroy_reason.map(|r| r.as_str()),
        Some("gateway_restarted")
    );
    // A start report of a process older than the one that made a CA does
    // not touch it.
    env.store
        .write(|tx| {
            confirm::start_report(tx, "gw-b", &old_instance, "d1")?;
            Ok(())
        })
        .unwrap();
    let still: usize = env.life().status(&id).unwrap().attempts[1]
        .ca
        .iter()
        .filter(|c| c.destroyed_at.is_none())
        .count();
    assert_eq!(still, 2);
    let s = env.life().stop(&id).unwrap();
    assert_eq!(s.state, State::Ended);
}

#[test]
fn leases_are_renewed_for_live_attempts_only_and_a_renewal_never_revives() {
    let mut env = Env::new().with_policy();
    let running = env.start(Mode::Commands).session_id;
    let mut req = request(Mode::Commands);
    req.sources = vec!["10.1.0.3".into()];
    let paused = env.life().start(&req).unwrap().session_id;
    env.life().pause(&paused).unwrap();
    let r = tick(&mut env, SystemTime::now(), true);
    assert_eq!(r.members_up, ["gw-a", "gw-b"]);
    assert_eq!(r.renewed, 2, "one running session on two members");
    let renewals: Vec<_> = env
        .link
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Renew(l) => Some(l),
            _ => None,
        })
        .collect();
    let last = renewals.last().unwrap();
    assert_eq!(last.len(), 2, "one call per member");
    for r in last {
        assert_eq!(r.leases, vec![(running.clone(), 1)]);
        assert!(r.forwarding.is_empty(), "both members hold it: {r:?}");
    }
    // A member whose authority lapsed says so, and is not made to hold it
    // again.
    env.link.lapse("gw-a", &running).unwrap();
    let r = tick(&mut env, SystemTime::now(), true);
    assert_eq!(r.renewed, 1);
    assert_eq!(r.not_held, [("gw-a".to_owned(), running.clone(), 1)]);
    assert!(!env.link.member_holds("gw-a", &running));
    // A member down is reported, and the renewal of the other goes on.
    env.link.set_down("gw-b", true);
    let r = tick(&mut env, SystemTime::now(), true);
    assert_eq!(r.members_down.len(), 1);
}

/// The forwarding table the last renewal gave member `id`: (session,
/// attempt, holders) per entry.
fn forwarding_told(env: &Env, id: &str) -> Vec<(String, u32, Vec<String>)> {
    env.link
        .last_renewal(id)
        .expect("a renewal named the member")
        .forwarding
        .into_iter()
        .map(|f| (f.session_id, f.attempt, f.holders))
        .collect()
}

#[test]
fn a_member_unreachable_at_the_open_forwards_the_session_to_its_peer_while_it_runs() {
    let mut env = Env::new().with_policy();
    // Both members known, then gw-b misses the open.
    tick(&mut env, SystemTime::now(), true);
    env.link.set_down("gw-b", true);
    let id = env.start(Mode::Commands).session_id;
    env.link.set_down("gw-b", false);
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let r = metrics::with_local_recorder(&recorder, || tick(&mut env, SystemTime::now(), true));
    let text = metrics.render();
    for line in [
        "stub_forwarding_entries{gateway=\"gw-a\"} 0",
        "stub_forwarding_entries{gateway=\"gw-b\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line} in:\n{text}");
    }
    // gw-b holds no lease and is told that gw-a holds the session, with
    // what it needs to recognise its connections; gw-a forwards nothing.
    let told = env.link.last_renewal("gw-b").unwrap();
    assert!(told.leases.is_empty(), "{told:?}");
    assert_eq!(told.forwarding.len(), 1, "{told:?}");
    let entry = &told.forwarding[0];
    assert_eq!(
        (
            entry.session_id.as_str(),
            entry.attempt,
            entry.tenant.as_str()
        ),
        (id.as_str(), 1, "acme")
    );
    assert_eq!(
        entry.sources,
        ["10.1.0.2".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(entry.holders, ["gw-a"]);
    assert_eq!(env.link.forwarding_table("gw-b"), told.forwarding);
    assert!(forwarding_told(&env, "gw-a").is_empty());
    let mut forwarding = r.forwarding.clone();
    forwarding.sort();
    assert_eq!(
        forwarding,
        [("gw-a".to_owned(), 0, 0), ("gw-b".to_owned(), 1, 1)]
    );
    // Paused: the next renewal withdraws the entry.
    env.life().pause(&id).unwrap();
    tick(&mut env, SystemTime::now(), true);
    assert!(forwarding_told(&env, "gw-b").is_empty());
    assert!(env.link.forwarding_table("gw-b").is_empty());
    // Resumed on both: each holds a lease, neither forwards.
    env.life().resume(&id).unwrap();
    tick(&mut env, SystemTime::now(), true);
    for m in ["gw-a", "gw-b"] {
        assert_eq!(env.link.last_renewal(m).unwrap().leases, [(id.clone(), 2)]);
        assert!(forwarding_told(&env, m).is_empty());
    }
}

#[test]
fn a_member_restarted_without_a_handover_forwards_until_the_session_ends() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    let old_instance = env.link.instance("gw-b");
    let new_instance = env.link.restart("gw-b");
    // Before its start report is in, the store still has gw-b's CA live:
    // its lease is asked (and not held), nothing is forwarded.
    let r = tick(&mut env, SystemTime::now(), true);
    assert_eq!(r.not_held, [("gw-b".to_owned(), id.clone(), 1)]);
    assert!(forwarding_told(&env, "gw-b").is_empty());
    // Its start report says the old process is gone with its CA.
    env.store
        .write(|tx| {
            let r = talos_control_stub::store::StartRecord {
                gateway_id: "gw-b".into(),
                instance: old_instance.clone(),
                started_at: "2026-12-01T00:00:00.000Z".into(),
                previous_instance: String::new(),
                cut_by_crash: 0,
                key_id: "k".into(),
                batch_seq: 1,
                received_at: "2026-12-01T00:00:00.000Z".into(),
                report_digest: "d1".into(),
            };
            tx.insert_start_report(&r, b"old")?;
            let r = talos_control_stub::store::StartRecord {
                instance: new_instance.clone(),
                previous_instance: old_instance.clone(),
                batch_seq: 2,
                report_digest: "d2".into(),
                ..r
            };
            tx.insert_start_report(&r, b"new")?;
            confirm::start_report(tx, "gw-b", &new_instance, "d2")?;
            Ok(())
        })
        .unwrap();
    tick(&mut env, SystemTime::now(), true);
    assert_eq!(
        forwarding_told(&env, "gw-b"),
        [(id.clone(), 1, vec!["gw-a".to_owned()])]
    );
    assert!(env.link.last_renewal("gw-b").unwrap().leases.is_empty());
    assert_eq!(env.link.forwarding_table("gw-b").len(), 1);
    // Stopped (the close reached gw-a): withdrawn at the next renewal.
    env.life().stop(&id).unwrap();
    tick(&mut env, SystemTime::now(), true);
    assert!(forwarding_told(&env, "gw-b").is_empty());
    assert!(env.link.forwarding_table("gw-b").is_empty());
}

#[test]
fn a_member_whose_lease_lapsed_forwards_to_the_peer_that_kept_the_session() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    let report = env.link.lapse("gw-a", &id).expect("gw-a held it");
    env.store
        .write(|tx| confirm::chain_drop_report(tx, &ACCEPT, &report, 1))
        .unwrap();
    let r = tick(&mut env, SystemTime::now(), true);
    assert!(r.not_held.is_empty(), "{r:?}");
    assert_eq!(
        forwarding_told(&env, "gw-a"),
        [(id.clone(), 1, vec!["gw-b".to_owned()])]
    );
    assert!(forwarding_told(&env, "gw-b").is_empty());
    // Revoke All closes gw-b's authority; the entry goes at the next
    // renewal.
    env.life().revoke_all(&id).unwrap();
    tick(&mut env, SystemTime::now(), true);
    assert!(forwarding_told(&env, "gw-a").is_empty());
}

#[test]
fn an_open_with_a_member_down_goes_on_through_the_other() {
    let mut env = Env::new().with_policy();
    env.link.set_down("gw-b", true);
    let t = env.start(Mode::Commands);
    assert_eq!(t.ca.len(), 1);
    assert_eq!(t.unreached.len(), 1);
    assert_eq!(t.unreached[0].gateway, "gw-b");
    // A close is owed to gw-b, in case the open reached it unseen; when it
    // answers that it holds nothing, that is settled.
    let id = t.session_id;
    env.link.set_down("gw-b", false);
    let r = tick(&mut env, SystemTime::now() + Duration::from_secs(5), false);
    assert_eq!(r.closes_confirmed, 1);
    let closes = env.life().status(&id).unwrap().closes;
    assert_eq!(closes[0].confirmed_by.as_deref(), Some("not_held"));
    assert_eq!(state(&mut env, &id), State::Running);
    // With no member up, a resume fails and its attempt ends start_failed.
    env.life().pause(&id).unwrap();
    env.link.set_down("gw-a", true);
    env.link.set_down("gw-b", true);
    assert_eq!(
        env.life().resume(&id).unwrap_err().code(),
        "gateway_unreachable"
    );
    let status = env.life().status(&id).unwrap();
    assert_eq!(status.session.state, State::Paused);
    let last = status.attempts.last().unwrap();
    assert_eq!(last.attempt.end_cause, Some(AttemptEnd::StartFailed));
    // The next resume, with the members back, is a new attempt.
    env.link.set_down("gw-a", false);
    env.link.set_down("gw-b", false);
    let r = env.life().resume(&id).unwrap();
    assert_eq!(r.attempt, 3);
    assert_eq!(r.ca.len(), 2);
}

#[test]
fn an_interrupted_session_that_does_not_recover_in_30_minutes_ends() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    env.life().interrupt(&id).unwrap();
    let now = SystemTime::now();
    assert!(tick(&mut env, now + Duration::from_secs(29 * 60), false)
        .events
        .is_empty());
    assert_eq!(state(&mut env, &id), State::Interrupted);
    let r = tick(&mut env, now + Duration::from_secs(31 * 60), false);
    assert_eq!(r.events.len(), 1);
    let s = env.life().status(&id).unwrap().session;
    assert_eq!(s.state, State::Ended);
    assert_eq!(s.end_reason, Some(EndReason::InterruptionLost));
    assert_eq!(s.outcome.as_deref(), Some("outcome_unknown"));
}

#[test]
fn a_session_paused_for_7_days_ends() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    env.life().pause(&id).unwrap();
    let now = SystemTime::now();
    tick(&mut env, now + Duration::from_secs(6 * 86_400), false);
    assert_eq!(state(&mut env, &id), State::Paused);
    tick(&mut env, now + Duration::from_secs(7 * 86_400 + 60), false);
    let s = env.life().status(&id).unwrap().session;
    assert_eq!(s.state, State::Ended);
    assert_eq!(s.end_reason, Some(EndReason::PausedTooLong));
}

/// Set attempt `n` of session `id` to have run from `ran` to `ended` on
/// the store's clock (`None`: it runs still): what a session that ran
/// long ago looks like, for a test whose upkeep clock moves.
fn ran(env: &mut Env, id: &str, n: i64, ran: SystemTime, ended: Option<SystemTime>) {
    let stamp = |t: SystemTime| Value::Text(humantime::format_rfc3339_millis(t).to_string());
    env.store
        .test_execute(
            "UPDATE attempts SET running_at = ?3, ended_at = coalesce(?4, ended_at)
             WHERE session_id = ?1 AND n = ?2",
            &[
                Value::Text(id.to_owned()),
                Value::Int(n),
                stamp(ran),
                ended.map_or(Value::Null, stamp),
            ],
        )
        .unwrap();
}

/// The hard stop on paused time: a session started with
/// `stop_after_seconds` 3600 ends `stop_after` once its attempts have run
/// an hour in all, on the clock the upkeep loop is given; the time it
/// spent paused and interrupted counts nothing. It ends as a stop does
/// (its attempt `session_ended`, every member's close, the reset), the
/// clock named as who asked, and its status and certificate show the
/// limit. Two replicas finding it due at once stop it once.
#[test]
fn the_hard_stop_on_paused_time() {
    let mut env = Env::new().with_policy();
    // Idle for no more than a day: the idle timeout stays out of it.
    let req = StartRequest {
        stop_after_seconds: Some(3_600),
        idle_timeout_seconds: Some(86_400),
        ..request(Mode::Commands)
    };
    let id = env.life().start(&req).unwrap().session_id;
    // Attempt 1 ran 20 minutes and paused; attempt 2 ran 20 minutes and
    // was interrupted; an hour later attempt 3, a recovery, runs since
    // `now`. Paused for 2 hours, interrupted for 1: 40 minutes used.
    env.life().pause(&id).unwrap();
    env.life().resume(&id).unwrap();
    env.life().interrupt(&id).unwrap();
    env.life().recover(&id).unwrap();
    let now = SystemTime::now();
    let before = |mins: u64| now - Duration::from_secs(mins * 60);
    ran(&mut env, &id, 1, before(240), Some(before(220)));
    ran(&mut env, &id, 2, before(100), Some(before(80)));
    ran(&mut env, &id, 3, now, None);
    let status = env.life().status(&id).unwrap();
    assert_eq!(status.session.stop_after_seconds, Some(3_600));
    assert_eq!(status.attempts.len(), 3);
    // At 19 minutes into attempt 3, 59 minutes are used: it runs on (had
    // the pause or the interruption counted, it would be long past).
    let r = tick(&mut env, now + Duration::from_secs(19 * 60), false);
    assert!(r.events.is_empty(), "{r:?}");
    assert_eq!(state(&mut env, &id), State::Running);
    assert!(env.link.holds(&id));
    // At 21 minutes, 61 are used: two replicas find it due at once, and
    // one of them stops it.
    let at = now + Duration::from_secs(21 * 60);
    let db = env.db();
    let link = &env.link;
    let reports: Vec<_> = std::thread::scope(|scope| {
        let replicas: Vec<_> = (0..2)
            .map(|_| {
                let db = db.clone();
                scope.spawn(move || {
                    let mut store = talos_control_stub::Store::open(&db).unwrap();
                    let key = talos_certs::GatewayKey::generate().unwrap();
                    Upkeep {
                        store: &mut store,
                        link,
                        verifier: &ACCEPT,
                        plane_key: Some(&key),
                        relay_key: None,
                    }
                    .tick(at, false)
                    .unwrap()
                })
            })
            .collect();
        replicas.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let events: Vec<&(String, String)> = reports.iter().flat_map(|r| &r.events).collect();
    assert_eq!(events.len(), 1, "stopped once: {reports:?}");
    assert_eq!(events[0].0, id);
    assert!(
        events[0]
            .1
            .starts_with("stop_after: 3660 s of compute used"),
        "{events:?}"
    );
    let status = env.life().status(&id).unwrap();
    assert_eq!(status.session.state, State::Ended);
    assert_eq!(status.session.end_reason, Some(EndReason::StopAfter));
    assert_eq!(
        status.attempts[2].attempt.end_cause,
        Some(AttemptEnd::SessionEnded)
    );
    assert!(!env.link.holds(&id), "every member closed it");
    assert!(
        status.reset.iter().all(|s| s.confirmed),
        "{:?}",
        status.reset
    );
    let stops: Vec<_> = status
        .commands
        .iter()
        .filter(|c| c.event == "stop_after")
        .collect();
    assert_eq!(stops.len(), 1, "{:?}", status.commands);
    assert_eq!(
        (
            stops[0].by.requester.as_str(),
            stops[0].by.requested_by.as_str()
        ),
        ("time", "stop_after")
    );
    // Its status (as JSON) and its certificate show the limit.
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["stop_after_seconds"], 3_600);
    let cert = env.issue(&id);
    assert_eq!(cert["issued"], true, "{cert}");
    assert_eq!(cert["stop_after_seconds"], 3_600);
    assert_eq!(cert["end_reason"], "stop_after");
    assert_eq!(cert["state"], "ended");
    // The compute on the certificate is the attempts' running time: 40
    // minutes before attempt 3, and attempt 3 from `now` to the stop's
    // commit (on the store's clock, moments later).
    let compute = cert["compute_seconds"].as_u64().unwrap();
    assert!((2_400..2_460).contains(&compute), "{compute}");
    assert!(cert["attempts"][2]["running_at"].is_string(), "{cert}");
    // A later tick finds nothing more to do.
    assert!(tick(&mut env, at + Duration::from_secs(3600), false)
        .events
        .is_empty());

    // A session without a hard stop runs on whatever its compute, and a
    // paused one uses none.
    let mut env = Env::new().with_policy();
    let endless = env.start(Mode::Agent).session_id;
    let mut req = StartRequest {
        stop_after_seconds: Some(3_600),
        ..request(Mode::Commands)
    };
    req.sources = vec!["10.1.0.9".into()];
    let paused = env.life().start(&req).unwrap().session_id;
    env.life().pause(&paused).unwrap();
    let r = tick(
        &mut env,
        SystemTime::now() + Duration::from_secs(6 * 86_400),
        false,
    );
    assert!(r.events.is_empty(), "{r:?}");
    assert_eq!(state(&mut env, &endless), State::Running);
    assert_eq!(state(&mut env, &paused), State::Paused);
    let cert = talos_control_stub::certificate(&env.store, &endless).unwrap();
    assert_eq!(cert["stop_after_seconds"], serde_json::Value::Null);
}

#[test]
fn a_hard_stop_outside_one_hour_to_seven_days_is_refused_at_start() {
    let mut env = Env::new().with_policy();
    let before = env.dump();
    for (mode, secs) in [
        (Mode::Commands, 0),
        (Mode::Commands, 3_599),
        (Mode::Agent, 604_801),
        (Mode::Agent, u64::MAX),
    ] {
        let req = StartRequest {
            stop_after_seconds: Some(secs),
            ..request(mode)
        };
        let err = env.life().start(&req).unwrap_err();
        assert_eq!(err.code(), "sandbox_request_invalid", "{secs}: {err}");
        assert!(
            err.to_string().contains("outside 3600-604800"),
            "{secs}: {err}"
        );
    }
    assert_eq!(env.dump(), before, "nothing recorded");
    assert!(env.link.calls().is_empty(), "no gateway asked");
    // Both ends of the range are taken, in either mode.
    for (mode, secs, source) in [
        (Mode::Agent, 3_600, "10.1.0.3"),
        (Mode::Commands, 604_800, "10.1.0.4"),
    ] {
        let mut req = StartRequest {
            stop_after_seconds: Some(secs),
            ..request(mode)
        };
        req.sources = vec![source.into()];
        let t = env.life().start(&req).unwrap();
        let s = env.life().status(&t.session_id).unwrap().session;
        assert_eq!(s.stop_after_seconds, Some(secs as u32));
    }
}

#[test]
fn the_idle_timeout_pauses_or_ends_and_an_attach_counts_as_activity() {
    for (action, want) in [("pause", State::Paused), ("end", State::Ended)] {
        let mut env = Env::new().with_policy();
        let mut req = request(Mode::Commands);
        req.idle_timeout_seconds = Some(60);
        req.idle_action = Some(action.into());
        let id = env.life().start(&req).unwrap().session_id;
        // The session's last activity was long ago...
        let long_ago =
            humantime::format_rfc3339_millis(SystemTime::now() - Duration::from_secs(3600))
                .to_string();
        env.store
            .test_execute(
                "UPDATE sessions SET last_activity_at = ?2 WHERE id = ?1",
                &[Value::Text(id.clone()), Value::Text(long_ago)],
            )
            .unwrap();
        // ...but a client attaches now: idle time counts from now.
        env.life().attach(&id).unwrap();
        let since = env
            .life()
            .status(&id)
            .unwrap()
            .session
            .last_activity_at
            .unwrap();
        let since = humantime::parse_rfc3339(&since).unwrap();
        assert!(tick(&mut env, since + Duration::from_secs(59), false)
            .events
            .is_empty());
        assert_eq!(state(&mut env, &id), State::Running);
        let r = tick(&mut env, since + Duration::from_secs(61), false);
        assert_eq!(r.events.len(), 1, "{r:?}");
        assert_eq!(state(&mut env, &id), want, "{action}");
        // The record says the clock asked, not an operator.
        let commands = env.life().status(&id).unwrap().commands;
        let last = commands.last().expect("commands");
        let cause = if action == "pause" {
            "idle_timeout_pause"
        } else {
            "idle_timeout_end"
        };
        assert_eq!(
            (
                last.event.as_str(),
                last.by.requester.as_str(),
                last.by.requested_by.as_str()
            ),
            (cause, "time", cause),
            "{commands:?}"
        );
    }
    // The default: 900 s, end.
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    let s = env.life().status(&id).unwrap().session;
    assert_eq!(s.idle_timeout_seconds, Some(900));
    assert_eq!(s.idle_action.map(|a| a.as_str()), Some("end"));
    // An agent session is never idle.
    let mut req = request(Mode::Agent);
    req.sources = vec!["10.1.0.7".into()];
    let agent = env.life().start(&req).unwrap().session_id;
    tick(
        &mut env,
        SystemTime::now() + Duration::from_secs(86_400),
        false,
    );
    assert_eq!(state(&mut env, &agent), State::Running);
}

#[test]
fn idle_settings_are_checked_at_start() {
    let mut env = Env::new().with_policy();
    let before = env.dump();
    let cases: Vec<(Mode, Option<u32>, Option<&str>, &str)> = vec![
        (
            Mode::Agent,
            None,
            Some("pause"),
            "sandbox_pause_unavailable",
        ),
        (Mode::Agent, None, Some("end"), "sandbox_request_invalid"),
        (Mode::Agent, Some(900), None, "sandbox_request_invalid"),
        (Mode::Commands, Some(59), None, "sandbox_request_invalid"),
        (
            Mode::Commands,
            Some(86_401),
            None,
            "sandbox_request_invalid",
        ),
        (
            Mode::Commands,
            Some(600),
            Some("sleep"),
            "sandbox_request_invalid",
        ),
    ];
    for (mode, secs, action, code) in cases {
        let req = StartRequest {
            idle_timeout_seconds: secs,
            idle_action: action.map(str::to_owned),
            ..request(mode)
        };
        let err = env.life().start(&req).unwrap_err();
        assert_eq!(err.code(), code, "{mode:?} {secs:?} {action:?}: {err}");
    }
    assert_eq!(env.dump(), before);
    assert!(env.link.calls().is_empty());
}

/// The fake pair, with something done while an open is in flight: after
/// the members opened, before their answers are back.
struct Meanwhile<'a> {
    pair: &'a talos_control_stub::FakeLink,
    during_open: std::cell::RefCell<Option<Box<dyn FnOnce() + 'a>>>,
}

impl<'a> Meanwhile<'a> {
    fn new(pair: &'a talos_control_stub::FakeLink, f: impl FnOnce() + 'a) -> Meanwhile<'a> {
        Meanwhile {
            pair,
            during_open: std::cell::RefCell::new(Some(Box::new(f))),
        }
    }
}

impl GatewayLink for Meanwhile<'_> {
    fn describe(&self) -> Vec<Reply<Described>> {
        self.pair.describe()
    }

    fn open(&self, req: &OpenSession) -> Vec<Reply<Opened>> {
        let replies = self.pair.open(req);
        let during = self.during_open.borrow_mut().take();
        if let Some(f) = during {
            f();
        }
        replies
    }

    fn close(&self, req: &CloseSession, only: Option<&[String]>) -> Vec<Reply<CloseAnswer>> {
        self.pair.close(req, only)
    }

    fn renew(&self, renewals: &[talos_control_stub::link::MemberRenewal]) -> Vec<Reply<Renewed>> {
        self.pair.renew(renewals)
    }

    fn decide(
        &self,
        gateway_id: &str,
        decision: &talos_certs::Signed,
    ) -> Result<String, talos_control_stub::LinkError> {
        self.pair.decide(gateway_id, decision)
    }
}

/// Register the fake pair's members, as first contact does.
fn register(env: &mut Env) {
    for id in ["gw-a", "gw-b"] {
        let key = talos_certs::sha384_hex(id.as_bytes())[..64].to_owned();
        env.store.register_gateway(id, &key).unwrap();
    }
}

/// Run `open` (a start, resume or recovery) with a process that stops
/// once the members opened, before it records their answers.
fn crashes(env: &mut Env, open: impl FnOnce(&mut Lifecycle<'_>) -> Result<Transition, Error>) {
    let crash = Meanwhile::new(&env.link, || {
        panic!("test: the process stops before it records the answers")
    });
    let mut life = Lifecycle::new(&mut env.store, &crash, &ACCEPT);
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| open(&mut life)));
    assert!(ran.is_err(), "{ran:?}");
}

/// The only session in the store.
fn only_session(env: &Env) -> String {
    let all = env.store.read(|tx| tx.sessions_in(State::ALL)).unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    all[0].id.clone()
}

#[test]
fn an_open_whose_process_stops_before_the_answers_is_given_up_and_closed() {
    let mut env = Env::new().with_policy();
    register(&mut env);
    // The members open; the process stops before it records their answers.
    crashes(&mut env, |life| life.start(&request(Mode::Commands)));
    // What it committed first is there: the session launching, attempt 1
    // in flight; the members hold an authority no CA of which is recorded
    // (and no lease of which anyone renews).
    let id = only_session(&env);
    let status = env.life().status(&id).unwrap();
    assert_eq!(status.session.state.as_str(), "launching");
    assert_eq!(status.attempts.len(), 1);
    assert!(status.attempts[0].attempt.ended_at.is_none());
    assert!(env.link.member_holds("gw-a", &id) && env.link.member_holds("gw-b", &id));
    // Within the deadline `serve` leaves it alone; past it, gives it up:
    // the start ends start_failed, and every registered member is asked to
    // close, their signed words settle it.
    let now = SystemTime::now();
    assert!(tick(&mut env, now + Duration::from_secs(30), false)
        .events
        .is_empty());
    let r = tick(&mut env, now + Duration::from_secs(61), false);
    assert_eq!(r.events.len(), 1, "{r:?}");
    assert!(r.events[0].1.starts_with("open_timed_out"), "{r:?}");
    assert!(!env.link.holds(&id));
    let status = env.life().status(&id).unwrap();
    // It never ran: `failed`, its reset complete.
    assert_eq!(status.session.state, State::Failed);
    assert_eq!(
        status.session.end_reason.map(|r| r.as_str()),
        Some("start_failed")
    );
    assert_eq!(
        status.attempts[0].attempt.end_cause,
        Some(AttemptEnd::StartFailed)
    );
    assert_eq!(status.closes.len(), 2);
    assert!(status.closes.iter().all(|c| c.confirmed_at.is_some()));

    // A resume the same way returns to paused, and the next resume opens.
    let id = env.start(Mode::Commands).session_id;
    env.life().pause(&id).unwrap();
    crashes(&mut env, |life| life.resume(&id));
    assert_eq!(state(&mut env, &id).as_str(), "resuming");
    assert_eq!(
        env.life().resume(&id).unwrap_err().code(),
        "sandbox_not_paused"
    );
    tick(&mut env, now + Duration::from_secs(61), false);
    assert_eq!(state(&mut env, &id), State::Paused);
    assert!(!env.link.holds(&id));
    let t = env.life().resume(&id).unwrap();
    assert_eq!((t.state, t.attempt, t.ca.len()), (State::Running, 3, 2));
}

#[test]
fn a_stop_while_an_open_is_in_flight_ends_the_session_and_closes_what_the_open_made() {
    let mut env = Env::new().with_policy();
    let db = env.db();
    let stopped = std::cell::RefCell::new(None);
    // While the members open, another process stops the session: the
    // start holds no store transaction while it calls them.
    let pair = &env.link;
    let meanwhile = Meanwhile::new(pair, || {
        let mut other = talos_control_stub::Store::open(&db).unwrap();
        let id = other
            .read(|tx| tx.sessions_in(State::ALL))
            .unwrap()
            .remove(0)
            .id;
        let t = Lifecycle::new(&mut other, pair, &ACCEPT).stop(&id).unwrap();
        *stopped.borrow_mut() = Some(t);
    });
    let err = Lifecycle::new(&mut env.store, &meanwhile, &ACCEPT)
        .start(&request(Mode::Commands))
        .unwrap_err();
    drop(meanwhile);
    // The stop was committed at once; its reset waited for the open.
    let t = stopped.take().unwrap();
    assert_eq!(t.state, State::ResetIncomplete);
    assert!(
        t.reset[3].error.as_deref().unwrap().contains("in flight"),
        "{:#?}",
        t.reset[3]
    );
    // The start's answers came to a session that had ended: recorded,
    // closed, and the start fails.
    assert_eq!(err.code(), "sandbox_ended", "{err}");
    let id = t.session_id;
    assert!(!env.link.holds(&id));
    let status = env.life().status(&id).unwrap();
    // Stopped before its first attempt ran (the answers came after the
    // end, and never make an attempt run): `failed`, its reset complete.
    assert_eq!(status.session.state, State::Failed);
    assert_eq!(status.session.end_reason, Some(EndReason::Stop));
    let attempt = &status.attempts[0];
    assert_eq!(attempt.attempt.end_cause, Some(AttemptEnd::SessionEnded));
    assert_eq!(attempt.attempt.running_at, None);
    assert_eq!(attempt.ca.len(), 2);
    assert!(attempt.ca.iter().all(|c| c.destroyed_at.is_some()));
}

#[test]
fn answers_after_the_open_was_given_up_are_recorded_and_closed() {
    let mut env = Env::new().with_policy();
    register(&mut env);
    let id = env.start(Mode::Commands).session_id;
    env.life().pause(&id).unwrap();
    let db = env.db();
    let pair = &env.link;
    // The answers are so late that `serve` gives the open up first.
    let meanwhile = Meanwhile::new(pair, || {
        let mut other = talos_control_stub::Store::open(&db).unwrap();
        let r = Upkeep {
            store: &mut other,
            link: pair,
            verifier: &ACCEPT,
            plane_key: None,
            relay_key: None,
        }
        .tick(SystemTime::now() + Duration::from_secs(61), false)
        .unwrap();
        assert_eq!(r.events.len(), 1, "{r:?}");
    });
    let err = Lifecycle::new(&mut env.store, &meanwhile, &ACCEPT)
        .resume(&id)
        .unwrap_err();
    drop(meanwhile);
    assert_eq!(err.code(), "gateway_unreachable", "{err}");
    assert!(err.to_string().contains("given up"), "{err}");
    // Still paused; the late attempt's CAs are recorded and closed.
    assert!(!env.link.holds(&id));
    let status = env.life().status(&id).unwrap();
    assert_eq!(status.session.state, State::Paused);
    let attempt = &status.attempts[1];
    assert_eq!(attempt.attempt.end_cause, Some(AttemptEnd::StartFailed));
    assert_eq!(attempt.ca.len(), 2);
    assert!(attempt.ca.iter().all(|c| c.destroyed_at.is_some()));
    assert!(status.closes.iter().all(|c| c.confirmed_at.is_some()));
}

/// The control plane away past the lease: both members' authorities of a
/// running session lapse and their reports come in their chains. The next
/// tick sees nothing serves the session: mode commands is interrupted and
/// recovered at once as a new attempt on both members, mode agent ends
/// `interruption_lost`; each with the lease as who asked. One member's
/// lapse alone (the other still holds it) changes nothing.
#[test]
fn a_running_session_whose_every_authority_lapsed_is_interrupted_and_recovered() {
    for mode in [Mode::Commands, Mode::Agent] {
        let mut env = Env::new().with_policy();
        let id = env.start(mode).session_id;
        let report = env.link.lapse("gw-a", &id).expect("gw-a held it");
        env.store
            .write(|tx| confirm::chain_drop_report(tx, &ACCEPT, &report, 1))
            .unwrap();
        let r = tick(&mut env, SystemTime::now(), false);
        assert!(r.events.is_empty(), "gw-b still serves it: {r:?}");
        assert_eq!(state(&mut env, &id), State::Running);
        let report = env.link.lapse("gw-b", &id).expect("gw-b held it");
        env.store
            .write(|tx| confirm::chain_drop_report(tx, &ACCEPT, &report, 1))
            .unwrap();
        let r = tick(&mut env, SystemTime::now(), false);
        assert_eq!(r.events.len(), 1, "{r:?}");
        assert!(r.events[0].1.contains("lease_expired"), "{r:?}");
        let status = env.life().status(&id).unwrap();
        let asked: Vec<(&str, &str, &str)> = status
            .commands
            .iter()
            .skip(1)
            .map(|c| {
                (
                    c.event.as_str(),
                    c.by.requester.as_str(),
                    c.by.requested_by.as_str(),
                )
            })
            .collect();
        match mode {
            Mode::Commands => {
                assert_eq!(status.session.state, State::Running, "{status:?}");
                assert_eq!(status.attempts.len(), 2, "{status:?}");
                let second = &status.attempts[1];
                assert_eq!(second.attempt.cause.as_str(), "recovery");
                assert_eq!(second.ca.len(), 2, "opened on both: {second:?}");
                assert!(env.link.member_holds("gw-a", &id));
                assert!(env.link.member_holds("gw-b", &id));
                assert_eq!(
                    status.attempts[0].attempt.end_cause.map(|c| c.as_str()),
                    Some("interrupted")
                );
                assert_eq!(
                    asked,
                    [
                        ("interrupt", "time", "lease_expired"),
                        ("recover", "time", "lease_expired")
                    ]
                );
            }
            Mode::Agent => {
                assert_eq!(status.session.state, State::Ended, "{status:?}");
                assert_eq!(
                    status.session.end_reason.map(|r| r.as_str()),
                    Some("interruption_lost")
                );
                assert_eq!(asked, [("interrupt", "time", "lease_expired")]);
            }
        }
        // Nothing more at the next tick.
        let r = tick(&mut env, SystemTime::now(), false);
        assert!(r.events.is_empty(), "{r:?}");
    }
}
