//! `people-screenshots OUT_DIR`: screenshots of the web pages people use,
//! at a phone's viewport (390 × 844 CSS pixels at 3 device pixels each),
//! made by the browser driver the tests use (`talos_e2e::browser`):
//! Debian's Chromium, headless, trusting a CA of this run's own, reaching
//! only `people.talos.test` on 127.0.0.1, with a virtual authenticator.
//! Each picture is checked first (axe-core: nothing serious; no console
//! error, exception or CSP violation), so the docs show pages that work.
//!
//! `scripts/people-screenshots.sh OUT_DIR` builds and runs it. The
//! scenarios below are the driver's own check pages for now; each people
//! page adds its steps to `scenarios` (start what serves it, drive the
//! page to the state worth showing, `shots.take(&page, "name")`).

use std::path::{Path, PathBuf};

use talos_e2e::browser::authenticator::{Authenticator, Options};
use talos_e2e::browser::png::PngInfo;
use talos_e2e::browser::shots::Shots;
use talos_e2e::browser::site::Site;
use talos_e2e::browser::{Browser, Error, Launch, Page, Viewport};
use talos_e2e::origin::TestCa;

/// The relying party's name the pages are served under.
const RP_ID: &str = "people.talos.test";

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args_os().skip(1);
    let (Some(out), None) = (args.next(), args.next()) else {
        eprintln!("usage: people-screenshots OUT_DIR");
        std::process::exit(2);
    };
    // `run` owns the browser: it is stopped (its whole process tree) when
    // `run` returns, whatever happened, before this process exits.
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
    let ca = TestCa::new("people screenshots CA");
    let browser = Browser::launch(&Launch::new().map(RP_ID).trust(&ca.cert_pem)).await?;
    let mut shots = Shots::new(out)?;
    scenarios(&browser, &ca, &mut shots).await?;
    Ok(shots.taken().to_vec())
}

/// Every scenario, in the order of the pictures.
async fn scenarios(browser: &Browser, ca: &TestCa, shots: &mut Shots) -> Result<(), Error> {
    let site = Site::start(ca, RP_ID).await.with_demo_pages();

    // The driver's check page, a name typed and greeted.
    let page = phone_page(browser).await?;
    page.goto(&site.url("/")).await?;
    page.type_text("#name", "Ada").await?;
    page.click("#greet").await?;
    page.wait_until(
        "document.getElementById('greeting').textContent !== ''",
        "the greeting",
    )
    .await?;
    shots.take(&page, "driver-check").await?;
    drop(page);

    // A passkey registered with the virtual authenticator.
    let page = phone_page(browser).await?;
    let _authenticator = Authenticator::add(&page, &Options::PLATFORM).await?;
    site.put(
        "/options.json",
        "application/json",
        serde_json::json!({
            "rpId": RP_ID,
            "rpName": "TALOS",
            "userId": "AAECAwQFBgcICQoLDA0ODw",
            "userName": "ada",
            "userDisplayName": "Ada",
            "registrationChallenge": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8",
            "timeoutMs": 20_000,
        })
        .to_string(),
    );
    page.goto(&site.url("/webauthn.html")).await?;
    page.click("#register").await?;
    page.wait_until(
        "document.getElementById('status').textContent === 'Registered'",
        "the passkey registered",
    )
    .await?;
    shots.take(&page, "driver-passkey-registered").await?;
    Ok(())
}

/// A new tab showing pages as a phone does.
async fn phone_page(browser: &Browser) -> Result<Page, Error> {
    let mut page = browser.new_page().await?;
    page.set_viewport(Viewport::PHONE).await?;
    Ok(page)
}
