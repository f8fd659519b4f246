//! `people-screenshots OUT_DIR`: screenshots of the web pages people use,
//! at a phone's viewport (390 × 844 CSS pixels at 3 device pixels each),
//! made by the browser driver the tests use (`talos_e2e::browser`):
//! Debian's Chromium, headless, trusting the web app's CA of this run's
//! own, reaching only `people.talos.test` on 127.0.0.1, with a virtual
//! authenticator.
//! Each picture is checked first (axe-core: nothing serious; no console
//! error, exception or CSP violation), so the docs show pages that work.
//!
//! The pages are the real ones: the rig the end-to-end tests use (a
//! gateway pair, `control-stub serve --web-listen`, an origin), an
//! approver enrolled from the link `people enroll` prints, a request the
//! Lock holds, an operator who revokes the session, as in
//! `tests/tests/people.rs`. The binaries are `TALOS_GATEWAY_BIN` and
//! `TALOS_CONTROL_STUB_BIN` (`scripts/people-screenshots.sh` builds and
//! names them).

use std::path::{Path, PathBuf};

use talos_certs::proposal_msg_of;
use talos_e2e::browser::authenticator::{Authenticator, Options};
use talos_e2e::browser::png::PngInfo;
use talos_e2e::browser::shots::Shots;
use talos_e2e::browser::{Browser, Error, Launch, Page, Viewport};
use talos_e2e::clients::{Curl, SESSION_SOURCE};
use talos_e2e::people::{control_plane_client, steps, RP_ID};
use talos_e2e::rig::{Pair, SessionSpec};

const API: &str = "api.test";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args_os().skip(1);
    let (Some(out), None) = (args.next(), args.next()) else {
        eprintln!("usage: people-screenshots OUT_DIR");
        std::process::exit(2);
    };
    // `run` owns the rig and the browser: both are stopped (every process
    // by its id) when `run` returns, whatever happened, before this
    // process exits.
    match run(&PathBuf::from(out)).await {
        Ok(taken) => {
            for (path, info) in taken {
                println!("{} ({}x{})", path.display(), info.width, info.height);
            }
        }
        Err(e) => {
            eprintln!("people-screenshots: {e}");
            std::process::exit(1);
        }
    }
}

async fn run(out: &Path) -> Result<Vec<(PathBuf, PngInfo)>, Error> {
    let rig = Pair::builder()
        .egress(&[API])
        .secret("API_TOKEN", "screenshots-secret")
        .start_loopback(&[API])
        .await;
    let browser =
        Browser::launch(&Launch::new().map(RP_ID).trust(&rig.stub.web_cert.ca_pem)).await?;
    let mut shots = Shots::new(out)?;
    scenarios(&rig, &browser, &mut shots).await?;
    Ok(shots.taken().to_vec())
}

/// Every scenario, in the order of the pictures.
async fn scenarios(rig: &Pair, browser: &Browser, shots: &mut Shots) -> Result<(), Error> {
    let origin = rig.stub.web_origin.clone();

    // Enrolment: the link opened, then the passkey saved.
    let link = rig.stub.enroll_link("alice", "approver");
    let (alice, _alice_auth) = phone(browser).await?;
    alice.goto(&link).await?;
    alice
        .wait_until(
            "document.body.dataset.ready === 'yes'",
            "the enrolment page",
        )
        .await?;
    shots.take(&alice, "enrol").await?;
    alice.click("#enrol").await?;
    alice
        .wait_until(
            "!document.getElementById('next').hidden",
            "the passkey saved",
        )
        .await?;
    shots.take(&alice, "enrol-saved").await?;

    // Sign-in, then the cards page with nothing waiting.
    steps::open(&alice, &origin, "/").await?;
    shots.take(&alice, "sign-in").await?;
    alice.click("#sign-in").await?;
    steps::across_navigation(
        &alice,
        "location.pathname === '/cards' && document.body.dataset.ready === 'yes'",
        "the cards page after signing in",
    )
    .await?;
    shots.take(&alice, "cards-empty").await?;

    // A request the Lock holds: its card, then approved.
    let rule = rig.lock_rule(API, "POST", "/merge", &["alice"], "every_request");
    let id = rig.start_session(
        &SessionSpec::from(SESSION_SOURCE)
            .allow(API)
            .attach("API_TOKEN=api.test:authorization:Bearer")
            .mode("commands"),
    );
    let (bundle, _) = rig.trust(&id, "trust.pem");
    let data = rig.members[0].data;
    let held = std::thread::spawn(move || {
        Curl::via(data, &bundle, API)
            .max_time(60)
            .args(&["-X", "POST"])
            .run("/merge/release-2026-12")
            .status
    });
    alice
        .wait_until(
            "document.querySelectorAll('article.card').length === 1",
            "the card",
        )
        .await?;
    shots.take(&alice, "card").await?;
    alice.click("article.card details.digest summary").await?;
    shots.take(&alice, "card-digest-shown").await?;
    alice.click("article.card button.approve").await?;
    alice
        .wait_until(
            "document.querySelector('article.card [role=status]').textContent.startsWith('Approved')",
            "the approval",
        )
        .await?;
    shots.take(&alice, "card-approved").await?;
    let status = held
        .join()
        .map_err(|_| Error::Page("the held request's thread panicked".into()))?;
    if status != 200 {
        return Err(Error::Page(format!(
            "the approved request got {status}, not 200"
        )));
    }

    // A card with an attacker's text: made visible, with the warning.
    let hostile = talos_e2e::people::agent_card(
        "gw-a-screenshot-hostile",
        &id,
        rule["id"].as_str().unwrap_or_default(),
        "deploy\u{202E}exe.\u{200B}sh p\u{0430}ypal",
    );
    let serve = rig
        .stub
        .serve_addr
        .ok_or_else(|| Error::Page("the rig has no serve".into()))?;
    control_plane_client(&rig.stub.control_dir, "gw-a", serve)
        .propose(proposal_msg_of(&hostile))
        .await
        .map_err(|e| Error::Page(format!("the relay refused the card: {e}")))?;
    alice
        .wait_until(
            "[...document.querySelectorAll('article.card')].some(a => !a.dataset.decided)",
            "the hostile card",
        )
        .await?;
    alice
        .evaluate("document.querySelector('article.card:not([data-decided])').scrollIntoView()")
        .await?;
    shots.take(&alice, "card-hostile").await?;

    // History.
    steps::open(&alice, &origin, "/history").await?;
    shots.take(&alice, "history").await?;

    // An operator: the sessions, the session's page, Revoke All.
    let link = rig.stub.enroll_link("olga", "operator");
    let (olga, _olga_auth) = phone(browser).await?;
    steps::enrol(&olga, &link).await?;
    steps::sign_in(&olga, &origin).await?;
    steps::open(&olga, &origin, "/sessions").await?;
    shots.take(&olga, "sessions").await?;
    steps::open(&olga, &origin, &format!("/sessions/{id}")).await?;
    shots.take(&olga, "session").await?;
    olga.click("#revoke-open").await?;
    shots.take(&olga, "session-revoke-confirm").await?;
    olga.click("#revoke-confirm").await?;
    if let Err(e) = olga
        .wait_until(
            "document.getElementById('status').textContent.startsWith('Revoked')",
            "Revoke All to be done",
        )
        .await
    {
        let said = olga
            .evaluate("[...document.querySelectorAll('#session [role=status]')].map(e => e.textContent).join(' / ')")
            .await?;
        return Err(Error::Page(format!("{e}; the page says {said:?}")));
    }
    olga.evaluate("window.scrollTo(0, 0)").await?;
    shots.take(&olga, "session-revoked").await?;
    Ok(())
}

/// A new tab showing pages as a phone does, with a platform
/// authenticator that verifies its user.
async fn phone(browser: &Browser) -> Result<(Page, Authenticator), Error> {
    let mut page = browser.new_page().await?;
    page.set_viewport(Viewport::PHONE).await?;
    let auth = Authenticator::add(&page, &Options::PLATFORM).await?;
    Ok((page, auth))
}
