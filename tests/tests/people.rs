//! The people's web app in a real browser: Debian's Chromium, headless,
//! over the DevTools protocol (`talos_e2e::browser`), at a phone's
//! viewport, with a virtual platform authenticator that verifies its
//! user; the real binaries behind it (a gateway pair, `control-stub serve
//! --web-listen`, an origin) and curl as the session's client.
//!
//! - An approver enrols with the link `people enroll` printed, signs in
//!   with the passkey, sees a card appear while a session's request is
//!   held, approves it (the request completes 200 at the origin with the
//!   canonical path) and declines a second (the session gets 403
//!   `approval_declined`); History shows both. An operator reads the
//!   session's page (state, attempts with each member's CA digest, counts)
//!   and revokes the session from it: the session's open connection is
//!   cut, a new one refused, and the command's record names the operator
//!   as verified requester, with the passkey that signed.
//! - The session cookie's flags as the browser holds them; a request
//!   without the CSRF token refused; an enrolment link used twice refused;
//!   a person not named on a card cannot decide it; an assertion made for
//!   Approve posted as Decline refused; a hostile card's text shown as
//!   text, its invisible and direction-changing characters as badges, no
//!   element made from it.
//! - Every page passes axe-core with no serious or critical violation, at
//!   390 px, with no console error, exception or CSP violation, and is no
//!   wider than the phone (a page wider than the viewport is zoomed out by
//!   a phone, and taps land off their buttons).
//!
//! The in-process tests of the same app (`control-stub/tests/people.rs`)
//! check what needs a clock the test moves (links expiring, sessions
//! idle, rotation) and bounds a browser cannot reach (sign-in attempts,
//! streams per person).

use serde_json::{json, Value};
use talos_certs::proposal_msg_of;
use talos_e2e::browser::authenticator::{Authenticator, Options};
use talos_e2e::browser::{Browser, Launch, Page, ProblemKind, Viewport};
use talos_e2e::clients::{Curl, Kept, SESSION_SOURCE};
use talos_e2e::people::{control_plane_client, steps, RP_ID};
use talos_e2e::rig::{Pair, SessionSpec};
use talos_e2e::wait;

const API: &str = "api.test";
const SECRET: &str = "people-S3CRET-v4lue-8812";

async fn rig() -> Pair {
    Pair::builder()
        .egress(&[API])
        .secret("API_TOKEN", SECRET)
        .start_loopback(&[API])
        .await
}

/// Chromium reaching the web app's name only, trusting the rig's web CA.
async fn browser(rig: &Pair) -> Browser {
    Browser::launch(&Launch::new().map(RP_ID).trust(&rig.stub.web_cert.ca_pem))
        .await
        .expect("start chromium")
}

/// A phone: a tab at 390 px with a platform authenticator of its own.
async fn phone(browser: &Browser) -> (Page, Authenticator) {
    let mut page = browser.new_page().await.expect("a page");
    page.set_viewport(Viewport::PHONE).await.expect("viewport");
    let auth = Authenticator::add(&page, &Options::PLATFORM)
        .await
        .expect("an authenticator");
    (page, auth)
}

/// The page passes axe (nothing serious or critical) and reported no
/// problem.
async fn checked(page: &Page, what: &str) {
    let report = page.axe().await.expect("axe runs");
    eprintln!(
        "axe on {what}: {} serious or critical",
        report.serious().len()
    );
    report.assert_no_serious();
    page.assert_no_problems();
    // Nothing wider than the phone: no sideways scrolling.
    let widths = page
        .evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        .await
        .expect("evaluate");
    assert!(
        widths[0].as_f64() <= widths[1].as_f64(),
        "{what} is wider than the phone: {widths}"
    );
}

/// The session this file's tests hold requests of.
fn session() -> SessionSpec {
    SessionSpec::from(SESSION_SOURCE)
        .allow(API)
        .attach("API_TOKEN=api.test:authorization:Bearer")
        .mode("commands")
}

fn lock(rig: &Pair, approvers: &[&str]) -> Value {
    rig.lock_rule(API, "POST", "/merge", approvers, "every_request")
}

/// A POST the Lock holds, sent on a thread of its own (curl waits up to a
/// minute for the decision); `--path-as-is` keeps dot segments for the
/// gateway to canonicalise.
fn held_post(
    rig: &Pair,
    bundle: &std::path::Path,
    path: &'static str,
) -> std::thread::JoinHandle<(u16, String, String)> {
    let data = rig.members[0].data;
    let bundle = bundle.to_owned();
    std::thread::spawn(move || {
        Curl::via(data, &bundle, API)
            .max_time(60)
            .args(&["-X", "POST", "--path-as-is"])
            .run(path)
            .into_text()
    })
}

/// The textContent of the first element `selector` names.
async fn text_of(page: &Page, selector: &str) -> String {
    let sel = serde_json::to_string(selector).unwrap();
    page.evaluate(&format!(
        "(() => {{ const e = document.querySelector({sel}); return e ? e.textContent : null; }})()"
    ))
    .await
    .expect("evaluate")
    .as_str()
    .unwrap_or_else(|| panic!("no element {selector}"))
    .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_approver_decides_held_requests_and_an_operator_revokes_the_session() {
    let rig = rig().await;
    let browser = browser(&rig).await;
    let origin = rig.stub.web_origin.clone();

    // Alice enrols with the link the command line printed: the page opens
    // it, her phone verifies her and makes a passkey.
    let alice_link = rig.stub.enroll_link("alice", "approver");
    let (alice, alice_auth) = phone(&browser).await;
    steps::enrol(&alice, &alice_link).await.expect("enrolment");
    checked(&alice, "the enrolment page").await;
    // The token left the address bar at once.
    let url = alice.evaluate("location.href").await.unwrap();
    assert_eq!(url, json!(format!("{origin}/enrol")));
    let creds = alice_auth.credentials(&alice).await.unwrap();
    assert_eq!(creds.len(), 1);
    assert!(creds[0].resident, "a discoverable passkey");
    assert_eq!(creds[0].rp_id.as_deref(), Some(RP_ID));

    // She signs in with it: no name typed, no password.
    steps::open(&alice, &origin, "/").await.unwrap();
    checked(&alice, "the sign-in page").await;
    steps::sign_in(&alice, &origin).await.expect("sign-in");
    checked(&alice, "the cards page, empty").await;
    assert_eq!(text_of(&alice, "#status").await, "No card waits for you.");
    let cookies = alice.cookies(&format!("{origin}/")).await.unwrap();
    let c = cookies
        .iter()
        .find(|c| c.name == "__Host-talos_session")
        .expect("the session cookie");
    assert!(c.http_only && c.secure, "{c:?}");
    assert_eq!(c.same_site.as_deref(), Some("Strict"));
    assert_eq!(c.path, "/");
    let cookie_value = c.value.expose().to_owned();

    // A rule naming her (she holds a passkey now), a session.
    let rule = lock(&rig, &["alice"]);
    let id = rig.start_session(&session());
    let (bundle, _) = rig.trust(&id, "trust.pem");

    // A request the Lock holds: its card appears on her open page, no
    // reload (the document is the same one, marked before), on the live
    // stream the page holds open (the page did not ask for the list).
    alice.evaluate("window.sameDocument = true").await.unwrap();
    let fetched_cards = "performance.getEntriesByType('resource').filter(e => e.name.endsWith('/api/cards')).length";
    let polled = alice.evaluate(fetched_cards).await.unwrap();
    let first = held_post(&rig, &bundle, "/merge/./x/../1");
    alice
        .wait_until(
            "document.querySelectorAll('article.card').length === 1",
            "the card to appear",
        )
        .await
        .expect("a card");
    assert_eq!(
        alice
            .evaluate("window.sameDocument === true")
            .await
            .unwrap(),
        json!(true),
        "the card came without a reload"
    );
    assert_eq!(
        alice.evaluate(fetched_cards).await.unwrap(),
        polled,
        "the card came on the live stream, not by asking for the list again"
    );
    let listed = rig.cli(&["approvals", "list"]).json();
    let card = listed[0].clone();
    assert_eq!(card["rule"], rule["id"]);
    // The sentence exactly as the relay wrote it, the digest whole in its
    // expandable part.
    assert_eq!(
        json!(text_of(&alice, "article.card .sentence").await),
        card["sentence"]
    );
    assert_eq!(
        json!(text_of(&alice, "article.card details.digest code").await),
        card["digest"]
    );
    assert!(card["sentence"].as_str().unwrap().contains("POST /merge/1"));
    checked(&alice, "the cards page with a card").await;
    alice.click("article.card button.approve").await.unwrap();
    if let Err(e) = alice
        .wait_until(
            "document.querySelector('article.card [role=status]').textContent.startsWith('Approved')",
            "the approval to be signed and delivered",
        )
        .await
    {
        panic!(
            "{e}: the card says {:?}; problems {:?}",
            text_of(&alice, "article.card [role=status]").await,
            alice.problems()
        );
    }
    let (code, _, body) = first.join().unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(
        rig.peers.origin.paths().iter().any(|p| p == "/merge/1"),
        "the origin got the canonical path: {:?}",
        rig.peers.origin.paths()
    );
    // The signature count went up on her authenticator.
    let creds = alice_auth.credentials(&alice).await.unwrap();
    assert!(creds[0].sign_count >= 2, "{creds:?}");

    // A second, declined: the session gets 403 approval_declined.
    let second = held_post(&rig, &bundle, "/merge/2");
    alice
        .wait_until(
            "[...document.querySelectorAll('article.card')].some(a => !a.dataset.decided)",
            "the second card",
        )
        .await
        .expect("a second card");
    alice
        .click("article.card:not([data-decided]) button.decline")
        .await
        .unwrap();
    let (code, head, _) = second.join().unwrap();
    assert_eq!(code, 403);
    assert!(head.contains("hangar-refusal: approval_declined"), "{head}");
    checked(&alice, "the cards page after deciding").await;

    // History: both, each signed with her passkey.
    steps::open(&alice, &origin, "/history").await.unwrap();
    let n = alice
        .evaluate("document.querySelectorAll('#history > li').length")
        .await
        .unwrap();
    assert_eq!(n, json!(2));
    assert!(text_of(&alice, "#history")
        .await
        .contains("signed with your passkey"));
    checked(&alice, "History").await;
    // The session's page, as an approver named on its cards sees it.
    steps::open(&alice, &origin, &format!("/sessions/{id}"))
        .await
        .unwrap();
    assert!(text_of(&alice, "#session")
        .await
        .contains("Only an operator can revoke"));
    checked(&alice, "a session's page (approver)").await;
    steps::open(&alice, &origin, "/sessions").await.unwrap();
    checked(&alice, "Sessions").await;

    // An operator, on a phone of her own, revokes the session from its
    // page while it holds a connection open.
    let link = rig.stub.enroll_link("olga", "operator");
    let (olga, olga_auth) = phone(&browser).await;
    steps::enrol(&olga, &link)
        .await
        .expect("the operator enrols");
    steps::sign_in(&olga, &origin)
        .await
        .expect("the operator signs in");
    steps::open(&olga, &origin, &format!("/sessions/{id}"))
        .await
        .unwrap();
    checked(&olga, "a session's page (operator)").await;
    // What she sees of it: its state, its attempt with the CA digest each
    // member made, the counts, who asked what.
    let shown = text_of(&olga, "#session").await;
    for part in [
        "State",
        "running",
        "Attempt 1",
        "CA digest",
        "connection(s) in the accepted batches",
        "Held requests",
        "Who asked",
    ] {
        assert!(
            shown.contains(part),
            "the session's page lacks {part:?}: {shown}"
        );
    }
    let attempts = olga
        .evaluate("document.querySelectorAll('#session details.digest').length")
        .await
        .unwrap();
    assert_eq!(attempts, json!(2), "one CA digest per member");
    let mut kept = Kept::open(SESSION_SOURCE, rig.members[0].data, API, &bundle, "/hello").await;
    olga.click("#revoke-open").await.unwrap();
    checked(&olga, "Revoke All, to confirm").await;
    olga.click("#revoke-confirm").await.unwrap();
    if let Err(e) = olga
        .wait_until(
            "document.getElementById('status').textContent.startsWith('Revoked')",
            "Revoke All to be signed and done",
        )
        .await
    {
        let said = olga
            .evaluate(
                "JSON.stringify({status: document.getElementById('status').textContent,
                   result: [...document.querySelectorAll('#session [role=status]')].map(e => e.textContent),
                   confirm: document.getElementById('revoke-confirm') && document.getElementById('revoke-confirm').disabled,
                   active: document.activeElement && document.activeElement.id})",
            )
            .await;
        panic!(
            "{e}: the page says {said:?}; problems {:?}",
            olga.problems()
        );
    }
    checked(&olga, "a session's page after Revoke All").await;
    assert!(kept.get("/again").await.is_err(), "the connection is cut");
    // And a new one is refused: the gateway dropped the session's CA.
    assert_eq!(
        talos_e2e::clients::curl_status(
            SESSION_SOURCE,
            rig.members[0].data,
            &bundle,
            API,
            "/after"
        ),
        0,
        "a connection after Revoke All"
    );
    // The page shows the record: Revoke All, by her, verified.
    let who = text_of(&olga, "#session").await;
    assert!(
        who.contains("revoke_all") && who.contains("olga") && who.contains("verified by passkey"),
        "{who}"
    );
    let status = rig.status(&id);
    let last = status["commands"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["event"], "revoke_all");
    assert_eq!(last["requester"], "operator");
    assert_eq!(last["requested_by"], "olga");
    assert_eq!(last["verified"], true);
    let olga_cred = olga_auth.credentials(&olga).await.unwrap();
    assert_eq!(last["assertion"]["credential_id"], olga_cred[0].id.as_str());
    assert_eq!(last["assertion"]["rp_id"], RP_ID);
    assert_eq!(last["assertion"]["origin"], origin.as_str());

    // Nothing secret in what serve logged: no cookie, no enrolment token.
    let log = rig.stub.serve_log();
    assert!(
        !log.contains(&cookie_value),
        "a session cookie in serve's log"
    );
    for l in [&alice_link, &link] {
        let token = l.split_once('#').unwrap().1;
        assert!(!log.contains(token), "an enrolment token in serve's log");
    }
    assert!(!log.contains(SECRET));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pages_refuse_what_they_must_and_show_a_hostile_card_as_text() {
    let rig = rig().await;
    let browser = browser(&rig).await;
    let origin = rig.stub.web_origin.clone();
    let link = rig.stub.enroll_link("alice", "approver");
    let (alice, _) = phone(&browser).await;
    steps::enrol(&alice, &link).await.unwrap();

    // The link again: refused, and the page says so.
    let (again, _) = phone(&browser).await;
    again.goto(&link).await.unwrap();
    again
        .wait_until(
            "document.body.dataset.ready === 'yes'",
            "the page to check the link",
        )
        .await
        .unwrap();
    assert!(
        text_of(&again, "#status").await.contains("was used at"),
        "{}",
        text_of(&again, "#status").await
    );
    assert!(
        again
            .evaluate("document.getElementById('enrol').hidden")
            .await
            .unwrap()
            == json!(true)
    );
    // The 410 is the only thing the page reported.
    let problems = again.take_problems();
    assert!(
        problems
            .iter()
            .all(|p| p.kind == ProblemKind::LogError && p.text.contains("410")),
        "{problems:?}"
    );
    checked(&again, "an enrolment link used twice").await;

    steps::sign_in(&alice, &origin).await.unwrap();
    let link = rig.stub.enroll_link("carol", "approver");
    let (carol, _) = phone(&browser).await;
    steps::enrol(&carol, &link).await.unwrap();
    steps::sign_in(&carol, &origin).await.unwrap();
    let rule = lock(&rig, &["alice"]);
    let id = rig.start_session(&session());

    // A request without the page's CSRF token is refused, though the
    // browser sends the cookie.
    let refused = alice
        .evaluate(
            "fetch('/api/sign-out', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: '{}'})
               .then(async r => ({status: r.status, body: await r.json()}))",
        )
        .await
        .unwrap();
    assert_eq!(refused["status"], 403);
    assert_eq!(refused["body"]["error"], "csrf_refused");
    let problems = alice.take_problems();
    assert!(
        problems.iter().all(|p| p.text.contains("403")),
        "{problems:?}"
    );

    // A card as a compromised gateway could relay it: an agent's tool
    // name full of markup, a direction override, a zero-width space and a
    // Cyrillic look-alike.
    let hostile = "<img src=x onerror=alert(1)>deploy\u{202E}exe.\u{200B}sh p\u{0430}ypal";
    let p =
        talos_e2e::people::agent_card("gw-a-hostile-1", &id, rule["id"].as_str().unwrap(), hostile);
    let serve = rig.stub.serve_addr.expect("serve");
    control_plane_client(&rig.stub.control_dir, "gw-a", serve)
        .propose(proposal_msg_of(&p))
        .await
        .expect("the relay takes it");
    alice
        .wait_until(
            "document.querySelectorAll('article.card').length === 1",
            "the hostile card",
        )
        .await
        .unwrap();
    let escaped = "<img src=x onerror=alert(1)>deploy[U+202E]exe.[U+200B]sh p\u{0430}[U+0430]ypal";
    assert_eq!(
        text_of(&alice, "article.card h2").await,
        format!("Agent tool: {escaped}")
    );
    assert!(text_of(&alice, "article.card .sentence")
        .await
        .contains(escaped));
    // No element came from the card's text: only the page's own.
    let made = alice
        .evaluate(
            "(() => { const a = document.querySelector('article.card');
               const tags = new Set([...a.querySelectorAll('*')].map(e => e.tagName.toLowerCase()));
               return {tags: [...tags].sort(), imgs: document.querySelectorAll('img').length,
                       handlers: [...document.querySelectorAll('*')].filter(e => e.hasAttribute('onerror')).length}; })()",
        )
        .await
        .unwrap();
    assert_eq!(made["imgs"], 0, "{made}");
    assert_eq!(made["handlers"], 0, "{made}");
    for tag in made["tags"].as_array().unwrap() {
        assert!(
            [
                "a", "button", "code", "dd", "details", "div", "dl", "dt", "h2", "li", "p", "span",
                "strong", "summary", "ul"
            ]
            .contains(&tag.as_str().unwrap()),
            "{made}"
        );
    }
    let warn = text_of(&alice, "article.card .warn").await;
    assert!(
        warn.contains("direction-changing character (U+202E)"),
        "{warn}"
    );
    assert!(warn.contains("several scripts (Latin, Cyrillic)"), "{warn}");
    checked(&alice, "a hostile card").await;
    // The session's page lists it among its held requests: shown the same
    // way, and no wider than the phone.
    steps::open(&alice, &origin, &format!("/sessions/{id}"))
        .await
        .unwrap();
    assert!(text_of(&alice, "#session").await.contains(escaped));
    checked(&alice, "a session's page holding a hostile card").await;
    steps::open(&alice, &origin, "/cards").await.unwrap();

    // An assertion made for Approve, posted as Decline: refused, nothing
    // decided.
    let swapped = alice
        .evaluate(
            "(async () => {
               const b = s => { const t = s.replace(/-/g, '+').replace(/_/g, '/'); const r = atob(t + '==='.slice((t.length + 3) % 4));
                                return Uint8Array.from(r, c => c.charCodeAt(0)); };
               const u = a => btoa(String.fromCharCode(...new Uint8Array(a))).replace(/\\+/g, '-').replace(/\\//g, '_').replace(/=+$/, '');
               const me = await (await fetch('/api/me')).json();
               const cards = await (await fetch('/api/cards')).json();
               const c = cards.cards[0];
               const cred = await navigator.credentials.get({publicKey: {challenge: b(c.challenges.approved), rpId: cards.rp_id,
                 userVerification: 'required', allowCredentials: cards.allow_credentials.map(x => ({type: 'public-key', id: b(x.id)}))}});
               const r = await fetch('/api/cards/' + encodeURIComponent(c.id) + '/decision', {method: 'POST',
                 headers: {'Content-Type': 'application/json', 'X-CSRF-Token': me.csrf},
                 body: JSON.stringify({verdict: 'declined', credential: {id: u(cred.rawId), response: {
                   authenticatorData: u(cred.response.authenticatorData), clientDataJSON: u(cred.response.clientDataJSON),
                   signature: u(cred.response.signature), userHandle: null}}})});
               return {status: r.status, body: await r.json()};
             })()",
        )
        .await
        .unwrap();
    assert_eq!(swapped["status"], 403, "{swapped}");
    assert_eq!(swapped["body"]["reason"], "challenge_mismatch", "{swapped}");
    let problems = alice.take_problems();
    assert!(
        problems.iter().all(|p| p.text.contains("403")),
        "{problems:?}"
    );

    // Carol, not named on the card, cannot decide it with her passkey.
    let carol_try = carol
        .evaluate(&format!(
            "(async () => {{
               const u = a => btoa(String.fromCharCode(...new Uint8Array(a))).replace(/\\+/g, '-').replace(/\\//g, '_').replace(/=+$/, '');
               const me = await (await fetch('/api/me')).json();
               const cards = await (await fetch('/api/cards')).json();
               const cred = await navigator.credentials.get({{publicKey: {{challenge: new Uint8Array(32), rpId: cards.rp_id, userVerification: 'required'}}}});
               const r = await fetch('/api/cards/{}/decision', {{method: 'POST',
                 headers: {{'Content-Type': 'application/json', 'X-CSRF-Token': me.csrf}},
                 body: JSON.stringify({{verdict: 'approved', credential: {{id: u(cred.rawId), response: {{
                   authenticatorData: u(cred.response.authenticatorData), clientDataJSON: u(cred.response.clientDataJSON),
                   signature: u(cred.response.signature), userHandle: null}}}}}})}});
               return {{mine: cards.cards.length, status: r.status, body: await r.json()}};
             }})()",
            p.proposal_id
        ))
        .await
        .unwrap();
    assert_eq!(carol_try["mine"], 0, "{carol_try}");
    assert_eq!(carol_try["status"], 403, "{carol_try}");
    assert_eq!(
        carol_try["body"]["error"], "approver_not_listed",
        "{carol_try}"
    );
    carol.take_problems();
    let pending = rig.cli(&["approvals", "list"]).json();
    assert_eq!(pending.as_array().unwrap().len(), 1, "nothing was decided");
    rig.cli(&["sandbox", "stop", &id]).json();
    wait::until("the card withdrawn from the page", || {
        wait::check(rig.cli(&["approvals", "list"]).json(), |v| {
            v.as_array().is_some_and(|a| a.is_empty())
        })
    });
}
