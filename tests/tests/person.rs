//! A held request is released only by the named person's own passkey
//! (issue 42), end to end: the real gateways and `control-stub serve` on
//! the shared rig, the approver enrolled with a software passkey through
//! the web app's own endpoints, decisions made on the web app's cards.
//! The relay's signature alone (a decision with no person's assertion)
//! releases nothing outside the lab setting.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde_json::Value;
use talos_e2e::clients::{curl_via, SESSION_SOURCE};
use talos_e2e::rig::{Pair, SessionSpec};
use talos_e2e::wait;

const API: &str = "api.test";
const SECRET: &str = "person-S3CRET-v4lue-0123456789";

async fn pair() -> Pair {
    Pair::builder()
        .egress(&[API])
        .secret("API_TOKEN", SECRET)
        .start_loopback(&[API])
        .await
}

fn session() -> SessionSpec {
    SessionSpec::from(SESSION_SOURCE)
        .allow(API)
        .attach("API_TOKEN=api.test:authorization:Bearer")
        .mode("commands")
}

/// Waits (at most [`wait::DEADLINE`]) for `n` pending cards.
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

#[tokio::test(flavor = "multi_thread")]
async fn only_the_named_persons_own_passkey_releases_a_held_request() {
    let mut rig = pair().await;
    // No lab setting: only a person's passkey decides.
    rig.lock_for_people(API, "POST", "/merge", "alice");
    let id = rig.start_session(&session());
    // `serve`'s web app reaches the members it knew when it started (its
    // link is made once): started again now that both are registered.
    // (The web app's link not following members added later is noted in
    // the report of this branch.)
    assert!(rig.stub.stop_serve());
    rig.stub.start_serve();
    let (bundle, _) = rig.trust(&id, "trust.pem");
    let data = rig.members[0].data;
    let post = |path: &'static str| {
        let bundle = bundle.clone();
        std::thread::spawn(move || curl_via(data, &bundle, API, path, &["-X", "POST"]))
    };
    let alice = rig.stub.approver("alice");
    let mut web = rig.stub.web_client();
    let signed_in = talos_e2e::rig::blocking(|| web.sign_in(&alice));
    assert_eq!(signed_in.status, 200, "{:?}", signed_in.body);

    let first = post("/merge/1");
    let cards = wait_cards(&rig, 1);
    assert_eq!(cards.len(), 1, "{cards:?}");
    let card_id = cards[0]["id"].as_str().unwrap().to_owned();

    // The relay's word alone: the lab setting turned on after the session
    // opened does not reach its gateways, which refuse the decision.
    let lab = rig.cli(&["policy", "lab-approvals", "on"]);
    assert_eq!(lab.status, 0, "{}", lab.stderr);
    let relay_only = rig.cli(&["approvals", "approve", &card_id, "--as", "alice"]);
    assert_ne!(relay_only.status, 0, "{}", relay_only.stdout);
    assert!(
        relay_only.stderr.contains("no_assertion"),
        "{}",
        relay_only.stderr
    );
    assert!(!first.is_finished(), "the relay's word released nothing");
    let off = rig.cli(&["policy", "lab-approvals", "off"]);
    assert_eq!(off.status, 0, "{}", off.stderr);

    // Alice approves on the web app with her passkey: released, in her
    // name.
    let origin = rig.stub.web_origin.clone();
    let decide = |web: &mut talos_e2e::people::WebClient, verdict: &str| {
        let cards = web.get("/api/cards");
        let card = cards.body["cards"][0].clone();
        let challenge = URL_SAFE_NO_PAD
            .decode(card["challenges"][verdict].as_str().expect("challenge"))
            .unwrap();
        web.post(
            &format!("/api/cards/{}/decision", card["id"].as_str().unwrap()),
            serde_json::json!({"verdict": verdict, "credential": alice.sign(&origin, &challenge)}),
        )
    };
    let approved = talos_e2e::rig::blocking(|| decide(&mut web, "approved"));
    assert_eq!(approved.status, 200, "{:?}", approved.body);
    assert_eq!(approved.body["outcome"], "released", "{:?}", approved.body);
    let (code, _, body) = first.join().unwrap().into_text();
    assert_eq!(code, 200, "{body}");

    // Declined with her passkey: refused.
    let second = post("/merge/2");
    assert_eq!(wait_cards(&rig, 1).len(), 1);
    let declined = talos_e2e::rig::blocking(|| decide(&mut web, "declined"));
    assert_eq!(declined.status, 200, "{:?}", declined.body);
    assert_eq!(declined.body["outcome"], "refused", "{:?}", declined.body);
    let (code, head, _) = second.join().unwrap().into_text();
    assert_eq!(code, 403);
    assert!(head.contains("hangar-refusal: approval_declined"), "{head}");

    // The gateway counted the refusal by its name.
    let g = &rig.members[0];
    wait::until("the no_assertion refusal counted", || {
        wait::check(
            g.metric("gateway_person_refusals_total{reason=\"no_assertion\"}"),
            |m| *m == Some(1.0),
        )
    });
    rig.cli(&["sandbox", "stop", &id]).json();
}

/// One card per first use across the pair (issue 42): a `first_use`
/// request held on both members makes one card; the person's one decision
/// releases both, each member verifying her assertion over that card
/// itself. A first use reaching the other member after she approved is
/// answered with the same decision, and no card is made.
#[tokio::test(flavor = "multi_thread")]
async fn a_first_use_on_both_members_asks_once_and_one_decision_releases_both() {
    let mut rig = pair().await;
    for prefix in ["/merge", "/deploy"] {
        let rule = rig.lock_mode(API, "POST", prefix, "alice", "first_use");
        assert_eq!(rule["mode"], "first_use", "{rule}");
    }
    let id = rig.start_session(&session());
    assert!(rig.stub.stop_serve());
    rig.stub.start_serve();
    let (bundle, _) = rig.trust(&id, "trust.pem");
    let post = |member: usize, path: &'static str| {
        let bundle = bundle.clone();
        let data = rig.members[member].data;
        std::thread::spawn(move || curl_via(data, &bundle, API, path, &["-X", "POST"]))
    };
    let every = |rig: &Pair| {
        rig.cli(&["approvals", "list", "--all"])
            .json()
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let alice = rig.stub.approver("alice");
    let mut web = rig.stub.web_client();
    let signed_in = talos_e2e::rig::blocking(|| web.sign_in(&alice));
    assert_eq!(signed_in.status, 200, "{:?}", signed_in.body);

    // Held on member 0, then on member 1: both proposals at the relay, one
    // card.
    let on_0 = post(0, "/merge/0");
    let card = wait_cards(&rig, 1)[0]["id"].as_str().unwrap().to_owned();
    let on_1 = post(1, "/merge/1");
    wait::until("member 1's first use joined to member 0's card", || {
        let all = every(&rig);
        wait::check(all.clone(), |all| {
            all.len() == 2 && all[1]["answered_by"].as_str() == Some(card.as_str())
        })
    });
    let all = every(&rig);
    assert_ne!(all[0]["gateway_id"], all[1]["gateway_id"], "{all:?}");
    assert_eq!(wait_cards(&rig, 1).len(), 1, "one card");
    let shown = talos_e2e::rig::blocking(|| web.get("/api/cards"));
    assert_eq!(
        shown.body["cards"].as_array().map(Vec::len),
        Some(1),
        "{:?}",
        shown.body
    );

    // Alice approves the card once: both members release.
    let origin = rig.stub.web_origin.clone();
    let approve = |web: &mut talos_e2e::people::WebClient| {
        let cards = web.get("/api/cards");
        let card = cards.body["cards"][0].clone();
        let challenge = URL_SAFE_NO_PAD
            .decode(card["challenges"]["approved"].as_str().expect("challenge"))
            .unwrap();
        web.post(
            &format!("/api/cards/{}/decision", card["id"].as_str().unwrap()),
            serde_json::json!({"verdict": "approved", "credential": alice.sign(&origin, &challenge)}),
        )
    };
    let approved = talos_e2e::rig::blocking(|| approve(&mut web));
    assert_eq!(approved.status, 200, "{:?}", approved.body);
    assert_eq!(approved.body["outcome"], "released", "{:?}", approved.body);
    assert_eq!(
        approved.body["also_answered"][0]["outcome"], "released",
        "{:?}",
        approved.body
    );
    for (member, held) in [(0, on_0), (1, on_1)] {
        let (code, _, body) = held.join().unwrap().into_text();
        assert_eq!(code, 200, "member {member}: {body}");
    }
    // Each member verified Alice's assertion itself: member 1 over member
    // 0's card.
    let g1 = &rig.members[1];
    wait::until("member 1 logged the answer by member 0's card", || {
        wait::check(g1.log(), |log| {
            log.contains("first use answered by the decision on another member's card")
                && log.contains("decision signed by the person's passkey, verified")
        })
    });
    // The first use is done on both: no card for the next ones.
    for member in [0, 1] {
        let (code, _, body) = post(member, "/merge/again").join().unwrap().into_text();
        assert_eq!(code, 200, "member {member}: {body}");
    }

    // The second rule: approved on member 0 before member 1 ever saw it.
    let on_0 = post(0, "/deploy/0");
    assert_eq!(wait_cards(&rig, 1).len(), 1);
    let approved = talos_e2e::rig::blocking(|| approve(&mut web));
    assert_eq!(approved.body["outcome"], "released", "{:?}", approved.body);
    let (code, _, _) = on_0.join().unwrap().into_text();
    assert_eq!(code, 200);
    // Member 1's first use comes later: joined to the approved card and
    // answered with its decision by `serve`'s next round; no card.
    let (code, _, body) = post(1, "/deploy/1").join().unwrap().into_text();
    assert_eq!(code, 200, "{body}");
    let all = every(&rig);
    assert_eq!(all.len(), 4, "{all:?}");
    assert!(
        all[3]["answered_by"].as_str().is_some() && all[3]["state"] == "approved",
        "{all:?}"
    );
    assert!(rig
        .cli(&["approvals", "list"])
        .json()
        .as_array()
        .unwrap()
        .is_empty());
    assert_eq!(rig.cli(&["sandbox", "stop", &id]).json()["state"], "ended");

    // The certificate's bundle: the independent verifier checks each
    // joined proposal's decision as its gateway did, over its card.
    rig.wait_issued(&id);
    let (code, out) = talos_e2e::stub::verify_bundle(&rig.bundle(&id, "first-use.bundle"));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("VERIFIED"), "{out}");
    assert_eq!(
        out.matches("as the gateway took it").count(),
        2,
        "two decisions answered by another member's card: {out}"
    );
}
