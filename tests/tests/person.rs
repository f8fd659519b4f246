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
