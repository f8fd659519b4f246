//! Web Push when a card waits, against the tests' own push endpoint
//! (`tests/peers/push_endpoint.py`, Python, sharing no code with the
//! control plane): it checks each message's VAPID token and decrypts it
//! with the device's private key, as a browser would.
//!
//! One encrypted message per subscribed device, holding the card id and
//! nothing else; a subscription the push service says is gone removed; a
//! busy push service tried again; one that never answers holding up no
//! card; the VAPID key made once, private, and kept; subscriptions checked
//! and bounded.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use common::push_endpoint::PushEndpoint;
use common::Env;
use talos_certs::{Proposal, ProposalKind};
use talos_control_stub::identity;
use talos_control_stub::lock::NewRule;
use talos_control_stub::people::push::{self, Contact, Hosts, Push, PushConfig};
use talos_control_stub::relay;
use talos_control_stub::store::ProposalRecord;
use talos_control_stub::{LockMode, Mode, Store};

/// A VAPID contact of the tests'.
const CONTACT: &str = "mailto:ops@talos.test";

/// Long enough for every delivery a test starts to end on its own.
const GRACE: Duration = Duration::from_secs(120);

/// Push towards `endpoint` (its CA trusted, 127.0.0.1 allowed), trying
/// again after 10 ms rather than a second, and giving each try a minute
/// (a try cut short on a busy machine would be sent twice).
fn config(endpoint: &PushEndpoint) -> PushConfig {
    let mut c = PushConfig::new(Contact::parse(CONTACT).unwrap())
        .with_ca_file(&endpoint.ca_file())
        .unwrap();
    c.hosts = Hosts::parse(&["127.0.0.1"]).unwrap();
    c.backoff = Duration::from_millis(10);
    c.timeout = Duration::from_secs(60);
    c
}

/// A card waiting for alice or bob: a real proposal, as the relay stores
/// it, with its sentence, in a running session whose tenant has secrets.
fn card(env: &mut Env) -> ProposalRecord {
    common::people::enrol_all(&mut env.store, &["alice", "bob"]);
    let rule = env
        .store
        .lock_add(
            &NewRule::check(
                "api.github.com",
                Some("GH"),
                Some("post"),
                Some("/repos/"),
                LockMode::FirstUse,
                &["alice".to_owned(), "bob".to_owned()],
            )
            .unwrap(),
        )
        .unwrap();
    let session = env.start(Mode::Commands).session_id;
    let at = |d: Duration| humantime::format_rfc3339_millis(SystemTime::now() + d).to_string();
    let p = Proposal {
        proposal_id: "gw-a-1-7f3a".into(),
        gateway_id: "gw-a".into(),
        session_id: session,
        attempt: 1,
        tenant: "acme".into(),
        kind: ProposalKind::Request,
        destination: "api.github.com".into(),
        method: "POST".into(),
        path: "/repos/acme/widgets/merges".into(),
        attachments: vec!["GH".into()],
        rule: rule.id.clone(),
        tool: String::new(),
        call_digest: String::new(),
        approvers: rule.approvers.clone(),
        created_at: at(Duration::ZERO),
        expires_at: at(Duration::from_secs(300)),
    };
    let msg = talos_certs::proposal_msg_of(&p);
    relay::receive(&mut env.store, &msg).unwrap();
    env.store
        .read(|tx| tx.proposal("gw-a-1-7f3a"))
        .unwrap()
        .unwrap()
}

/// A current-thread runtime: its tasks run on the test's thread, so they
/// count into the test's local metrics recorder (which holds on its own
/// thread only). The store is called outside `block_on`, as `serve` calls
/// it off its runtime's threads (PostgreSQL's client runs a runtime of its
/// own).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The value of `series` in a scrape.
fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
        .parse()
        .unwrap()
}

fn shared(env: &Env) -> Arc<Mutex<Store>> {
    Arc::new(Mutex::new(Store::open(env.db()).unwrap()))
}

#[test]
fn a_card_sends_one_encrypted_message_per_device_holding_the_card_id_only() {
    let mut env = Env::new().with_policy();
    let card = card(&mut env);
    let endpoint = PushEndpoint::start(&[
        ("alice-phone", &[201]),
        ("alice-laptop", &[201]),
        ("bob-phone", &[201]),
        ("carol-phone", &[201]),
    ]);
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let key = identity::VapidKey::generate().unwrap();
    let public_key = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key.public_key());
    let store = shared(&env);
    let rt = runtime();
    let notified = metrics::with_local_recorder(&recorder, || {
        let _in = rt.enter();
        let (push, task) = Push::start(config(&endpoint), key, store).unwrap();
        assert_eq!(push.public_key(), public_key);
        for (person, device) in [
            ("alice", "alice-phone"),
            ("alice", "alice-laptop"),
            ("bob", "bob-phone"),
            // Carol is no approver of this card.
            ("carol", "carol-phone"),
        ] {
            let d = endpoint.device(device);
            push.subscribe(&mut env.store, person, &d.endpoint, &d.p256dh, &d.auth)
                .unwrap();
        }
        let notified = push
            .notify_card_waiting(&env.store, &card.proposal_id, &card.fields.approvers)
            .unwrap();
        rt.block_on(task.stop(GRACE));
        notified
    });
    assert_eq!(
        (notified.queued, notified.dropped, notified.failed),
        (3, 0, 0)
    );

    let received = endpoint.received();
    assert_eq!(received.len(), 3, "{received:#?}");
    let mut names: Vec<&str> = received
        .iter()
        .map(|r| r["subscription"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["alice-laptop", "alice-phone", "bob-phone"]);
    let origin = format!("https://127.0.0.1:{}", endpoint.port);
    // What no message may hold: the card's sentence, its session and
    // tenant, where it goes, and the tenant's secret values.
    let forbidden = [
        card.sentence.as_str(),
        card.session_id.as_str(),
        "acme",
        "api.github.com",
        "/repos/",
        "gh-value-1-QZX",
        "ex-value-1-QZX",
        card.digest.as_str(),
    ];
    for r in &received {
        assert_eq!(r["problems"], serde_json::json!([]), "{r:#}");
        assert_eq!(r["status"], 201);
        let payload = r["payload"].as_str().unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(payload).unwrap(),
            serde_json::json!({"type": "card_waiting", "card": card.proposal_id}),
        );
        for f in forbidden {
            assert!(!payload.contains(f), "{payload} holds {f}");
        }
        assert_eq!(r["content_encoding"], "aes128gcm");
        assert_eq!(r["ttl"], "300");
        assert_eq!(r["urgency"], "high");
        assert_eq!(r["topic"], push::topic(&card.proposal_id));
        assert_eq!(r["record_size"], 4096);
        assert_eq!(r["claims"]["aud"], origin.as_str());
        assert_eq!(r["claims"]["sub"], CONTACT);
        assert_eq!(r["k"], public_key.as_str());
    }

    let text = handle.render();
    assert_eq!(
        metric(&text, "stub_push_messages_total{result=\"sent\"}"),
        3
    );
    for result in ["gone", "failed", "dropped"] {
        assert_eq!(
            metric(
                &text,
                &format!("stub_push_messages_total{{result=\"{result}\"}}")
            ),
            0
        );
    }
    assert_eq!(metric(&text, "stub_push_retries_total"), 0);
    for person in ["alice", "bob"] {
        for s in env.store.push_subscriptions(person).unwrap() {
            assert!(s.last_success_at.is_some(), "{s:?}");
            assert_eq!(s.last_failure, None);
        }
    }
    assert_eq!(
        env.store.push_subscriptions("carol").unwrap()[0].last_success_at,
        None
    );
}

#[test]
fn a_gone_subscription_is_removed_and_a_busy_push_service_is_tried_again() {
    let mut env = Env::new().with_policy();
    let card = card(&mut env);
    let endpoint = PushEndpoint::start(&[
        ("gone", &[410]),
        ("busy", &[503, 429, 201]),
        ("refusing", &[403]),
        ("bob-phone", &[201]),
    ]);
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let store = shared(&env);
    let rt = runtime();
    let notified = metrics::with_local_recorder(&recorder, || {
        let _in = rt.enter();
        let key = identity::VapidKey::generate().unwrap();
        let (push, task) = Push::start(config(&endpoint), key, store).unwrap();
        for (person, device) in [
            ("alice", "gone"),
            ("alice", "busy"),
            ("alice", "refusing"),
            ("bob", "bob-phone"),
        ] {
            let d = endpoint.device(device);
            push.subscribe(&mut env.store, person, &d.endpoint, &d.p256dh, &d.auth)
                .unwrap();
        }
        let notified = push
            .notify_card_waiting(&env.store, &card.proposal_id, &card.fields.approvers)
            .unwrap();
        rt.block_on(task.stop(GRACE));
        notified
    });
    assert_eq!(notified.queued, 4);

    let statuses = |name: &str| -> Vec<u64> {
        endpoint
            .received_by(name)
            .iter()
            .map(|r| {
                assert_eq!(r["problems"], serde_json::json!([]), "{r:#}");
                r["status"].as_u64().unwrap()
            })
            .collect()
    };
    assert_eq!(statuses("gone"), [410]);
    assert_eq!(statuses("busy"), [503, 429, 201]);
    assert_eq!(statuses("refusing"), [403], "a 403 is not tried again");
    assert_eq!(statuses("bob-phone"), [201]);

    // 410: the subscription is removed; the others stay, with how their
    // last delivery went.
    let alice = env.store.push_subscriptions("alice").unwrap();
    let gone = endpoint.device("gone").endpoint;
    let busy = endpoint.device("busy").endpoint;
    assert!(alice.iter().all(|s| s.endpoint != gone), "{alice:?}");
    assert_eq!(alice.len(), 2);
    for s in &alice {
        if s.endpoint == busy {
            assert!(s.last_success_at.is_some(), "{s:?}");
        } else {
            assert_eq!(s.last_failure.as_deref(), Some("status 403"), "{s:?}");
            assert!(s.last_failure_at.is_some() && s.last_success_at.is_none());
        }
    }
    let text = handle.render();
    for (result, n) in [("sent", 2), ("gone", 1), ("failed", 1), ("dropped", 0)] {
        assert_eq!(
            metric(
                &text,
                &format!("stub_push_messages_total{{result=\"{result}\"}}")
            ),
            n,
            "{result}"
        );
    }
    assert_eq!(metric(&text, "stub_push_retries_total"), 2);
}

/// A device's keys made here (a browser's, for an endpoint that never
/// decrypts anything).
fn device_keys() -> (String, String) {
    let key = aws_lc_rs::agreement::PrivateKey::generate(&aws_lc_rs::agreement::ECDH_P256).unwrap();
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let mut auth = [0u8; 16];
    aws_lc_rs::rand::fill(&mut auth).unwrap();
    (b64(key.compute_public_key().unwrap().as_ref()), b64(&auth))
}

#[test]
fn a_push_service_that_never_answers_holds_up_no_card_and_a_full_queue_drops() {
    let mut env = Env::new();
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let store = shared(&env);
    let dir = tempfile::tempdir().unwrap();
    let ca = PushEndpoint::start(&[]);
    let rt = runtime();
    let totals = metrics::with_local_recorder(&recorder, || {
        let _in = rt.enter();
        // A push service that takes connections and never says a word.
        let silent = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let port = silent.local_addr().unwrap().port();
        let (accepted_tx, mut accepted) = tokio::sync::mpsc::unbounded_channel();
        let holder = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = silent.accept().await {
                held.push(conn);
                let _ = accepted_tx.send(());
            }
        });
        let mut c = config(&ca);
        c.queue = 2;
        c.concurrency = 1;
        c.timeout = Duration::from_secs(3600);
        let key = identity::vapid_key(dir.path()).unwrap();
        let (push, task) = Push::start(c, key, store).unwrap();
        let (p256dh, auth) = device_keys();
        push.subscribe(
            &mut env.store,
            "alice",
            &format!("https://127.0.0.1:{port}/push/silent-capability"),
            &p256dh,
            &auth,
        )
        .unwrap();
        let approvers = ["alice".to_owned()];
        let first = push
            .notify_card_waiting(&env.store, "card-1", &approvers)
            .unwrap();
        assert_eq!(first.queued, 1);
        // The one delivery slot is now held by a connection that will
        // never be answered.
        rt.block_on(accepted.recv()).unwrap();
        let mut totals = push::Notified::default();
        for n in 2..=6 {
            let got = push
                .notify_card_waiting(&env.store, &format!("card-{n}"), &approvers)
                .unwrap();
            totals.queued += got.queued;
            totals.dropped += got.dropped;
            // Let the sender run: with every delivery slot busy it must
            // leave the messages on the queue, where the bound is counted,
            // not take one to wait with.
            rt.block_on(async {
                for _ in 0..10 {
                    tokio::task::yield_now().await;
                }
            });
        }
        // Stopping cuts the delivery still waiting for its answer.
        rt.block_on(task.stop(Duration::from_millis(200)));
        holder.abort();
        totals
    });
    // Two wait on the queue; the other three are dropped, never waited for.
    assert_eq!((totals.queued, totals.dropped), (2, 3));
    let text = handle.render();
    assert_eq!(
        metric(&text, "stub_push_messages_total{result=\"dropped\"}"),
        3
    );
    assert_eq!(
        metric(&text, "stub_push_messages_total{result=\"sent\"}"),
        0
    );
    // Nothing was recorded of a delivery that never ended.
    let s = &env.store.push_subscriptions("alice").unwrap()[0];
    assert_eq!(
        (s.last_success_at.as_ref(), s.last_failure.as_ref()),
        (None, None)
    );
}

#[test]
fn subscriptions_are_checked_bounded_replaced_and_removed() {
    let mut env = Env::new();
    let ca = PushEndpoint::start(&[]);
    let store = shared(&env);
    let rt = runtime();
    let _in = rt.enter();
    let key = identity::VapidKey::generate().unwrap();
    let (push, _task) = Push::start(config(&ca), key, store).unwrap();
    let (p256dh, auth) = device_keys();
    let at = |n: usize| format!("https://127.0.0.1:8443/push/capability-{n}");

    // An endpoint on a host push may not reach is refused, and so is a
    // malformed one; neither is stored.
    for endpoint in [
        "https://169.254.169.254/latest/meta-data",
        "https://push.example/capability-0",
        "http://127.0.0.1:8443/push/capability-0",
    ] {
        let e = push
            .subscribe(&mut env.store, "alice", endpoint, &p256dh, &auth)
            .unwrap_err();
        assert_eq!(e.code(), "push_subscription_invalid", "{e}");
        assert!(!e.to_string().contains("capability"), "{e}");
    }
    let e = push
        .subscribe(&mut env.store, "not a name", &at(0), &p256dh, &auth)
        .unwrap_err();
    assert_eq!(e.code(), "name_invalid");
    assert!(env.store.push_subscriptions("alice").unwrap().is_empty());

    for n in 0..talos_control_stub::store::MAX_SUBSCRIPTIONS {
        push.subscribe(&mut env.store, "alice", &at(n), &p256dh, &auth)
            .unwrap();
    }
    let e = push
        .subscribe(&mut env.store, "alice", &at(99), &p256dh, &auth)
        .unwrap_err();
    assert_eq!(e.code(), "push_subscriptions_full");
    // The same endpoint again replaces its keys: no new row.
    let (p256dh2, auth2) = device_keys();
    let s = push
        .subscribe(&mut env.store, "alice", &at(3), &p256dh2, &auth2)
        .unwrap();
    assert_eq!(
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&s.p256dh),
        p256dh2
    );
    let all = env.store.push_subscriptions("alice").unwrap();
    assert_eq!(all.len(), talos_control_stub::store::MAX_SUBSCRIPTIONS);
    // Debug shows the origin, never the capability.
    let shown = format!("{all:?}");
    assert!(shown.contains("https://127.0.0.1:8443"), "{shown}");
    assert!(
        !shown.contains("capability") && !shown.contains(&auth),
        "{shown}"
    );

    assert!(push.unsubscribe(&mut env.store, "alice", &at(3)).unwrap());
    assert!(!push.unsubscribe(&mut env.store, "alice", &at(3)).unwrap());
    push.subscribe(&mut env.store, "alice", &at(99), &p256dh, &auth)
        .unwrap();
}

#[test]
fn the_vapid_key_is_made_once_private_and_kept() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(identity::VAPID_KEY);
    let key = identity::vapid_key(dir.path()).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let again = identity::vapid_key(dir.path()).unwrap();
    assert_eq!(key.public_key(), again.public_key());
    assert!(!format!("{key:?}").contains("PRIVATE"));

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let e = identity::vapid_key(dir.path()).unwrap_err();
    assert_eq!(e.code(), "io_failed");
    assert!(e.to_string().contains("mode 0640"), "{e}");

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(&path, b"not a key").unwrap();
    let e = identity::vapid_key(dir.path()).unwrap_err();
    assert!(e.to_string().contains("not a P-256 PKCS#8 key"), "{e}");
}

/// The tests' endpoint itself opens RFC 8291's Appendix A message to its
/// plaintext: the two implementations agree with the RFC, not only with
/// each other.
#[test]
fn the_tests_endpoint_opens_the_rfcs_own_message() {
    let out = std::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/peers/push_endpoint.py"
        ))
        .arg("--self-test")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        r#"{"self_test": "ok"}"#
    );
}
