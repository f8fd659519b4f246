//! The browser driver (`talos_e2e::browser`) proved on pages of its own:
//! Debian's Chromium, headless, over the DevTools protocol.
//!
//! - it starts and stops leaving no process (zygotes, renderers, GPU and
//!   network processes included);
//! - it trusts the test's CA for real (an NSS database in its HOME: the
//!   connection is TLS 1.3 with the CA's leaf and a secure state, as
//!   Chromium reports it) and refuses an origin whose certificate chains to
//!   another CA; it reaches only the names mapped to 127.0.0.1;
//! - its virtual authenticator registers a passkey (ES256, attestation
//!   `none`, user verification required) and signs an assertion the test
//!   verifies, and refuses when user verification fails;
//! - a phone's viewport is 390 CSS pixels wide, and a screenshot of it is
//!   a whole PNG 1170 pixels wide;
//! - axe-core, run in the page under a strict CSP, finds a planted serious
//!   violation and none on a good page;
//! - console errors, uncaught exceptions and CSP violations are caught;
//! - a wait that runs out, a script that throws, a missing element and a
//!   refused command each fail saying what;
//! - cookies are read with their flags, their values never printed.
//!
//! The tests of this file share one browser while they run
//! ([`Browser::shared`]; each test has its own pages and browser context),
//! except the one that checks a browser's start and stop.
//!
//! `TALOS_WEBAUTHN_SAMPLE=PATH` (absolute: tests run in `tests/`) makes the
//! WebAuthn test also write the registration and assertion it made to
//! PATH: that is how `certs/tests/data/chromium-webauthn.json` was made.

use std::sync::{Arc, OnceLock};

use aws_lc_rs::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_ASN1};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64U;
use base64::Engine as _;
use serde_json::{json, Value};
use sha2::{Digest, Sha256, Sha384};
use talos_e2e::browser::authenticator::{Authenticator, Options, Used};
use talos_e2e::browser::site::{Asset, Site};
use talos_e2e::browser::{Browser, Error, Launch, ProblemKind, Viewport};
use talos_e2e::origin::TestCa;
use talos_e2e::wait::{check, until_async};

/// The relying party's name, as the people pages will use it.
const RP_ID: &str = "people.talos.test";
/// A name the browser may reach whose certificate it must refuse.
const UNTRUSTED: &str = "untrusted.talos.test";

/// The CA the shared browser trusts.
fn ca() -> &'static TestCa {
    static CA: OnceLock<TestCa> = OnceLock::new();
    CA.get_or_init(|| TestCa::new("browser test CA"))
}

fn launch() -> Launch {
    Launch::new()
        .map(RP_ID)
        .map(UNTRUSTED)
        .trust(&ca().cert_pem)
}

async fn browser() -> Arc<Browser> {
    Browser::shared(&launch()).await.expect("start chromium")
}

async fn demo_site() -> Site {
    Site::start(ca(), RP_ID).await.with_demo_pages()
}

#[tokio::test]
async fn launch_and_stop_leave_no_process() {
    let site = demo_site().await;
    let mut browser = Browser::launch(&launch()).await.expect("start chromium");
    assert!(
        browser.version.starts_with("Chrome/") || browser.version.starts_with("HeadlessChrome/"),
        "Browser.getVersion: {}",
        browser.version
    );
    let page = browser.new_page().await.expect("a page");
    if let Err(e) = page.goto(&site.url("/")).await {
        panic!("load: {e}\n{}", browser.log());
    }
    page.wait_until(
        "document.getElementById('status').textContent === 'Ready'",
        "the page's script",
    )
    .await
    .expect("ready");
    // A browser with a page open is several processes: the browser, its
    // zygotes, a renderer, the network service…
    let running = browser.processes();
    assert!(
        running
            .iter()
            .any(|p| p.command.contains("--type=renderer")),
        "a renderer among {running:#?}"
    );
    assert!(running.len() >= 3, "the browser's processes: {running:#?}");
    // Its crash handlers run in sessions of their own, out of the group:
    // they are found by the folder their command line names.
    assert!(
        running
            .iter()
            .any(|p| p.command.contains("chrome_crashpad_handler")),
        "the crash handlers among {running:#?}"
    );
    let (pid, dir) = (browser.pid(), browser.dir().to_owned());
    // The leftover check test.sh runs after the tests counts every one of
    // them as this checkout's.
    let listed = leftover_check_lists();
    for p in &running {
        assert!(
            listed.contains(&p.pid),
            "check-leftovers.sh lists {p:?}: {listed:?}"
        );
    }
    drop(page);
    let left = browser.stop();
    assert!(left.is_empty(), "outlived the stop: {left:#?}");
    let after = talos_e2e::browser::processes_of(pid, &dir);
    assert!(after.is_empty(), "still running after the stop: {after:#?}");
    let listed = leftover_check_lists();
    assert!(
        running.iter().all(|p| !listed.contains(&p.pid)),
        "none left for check-leftovers.sh: {listed:?}"
    );
    drop(browser);
    assert!(
        !dir.exists(),
        "the browser's folder is removed: {}",
        dir.display()
    );
}

/// The PIDs `scripts/check-leftovers.sh --record` notes as this
/// checkout's now.
fn leftover_check_lists() -> Vec<u32> {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/check-leftovers.sh");
    let file = tempfile::NamedTempFile::new().expect("tempfile");
    let status = std::process::Command::new("bash")
        .arg(&script)
        .arg("--record")
        .arg(file.path())
        .status()
        .expect("run check-leftovers.sh");
    assert!(status.success(), "check-leftovers.sh --record");
    std::fs::read_to_string(file.path())
        .expect("its record")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[tokio::test]
async fn a_wait_that_runs_out_or_a_page_that_throws_says_what() {
    let browser = browser().await;
    let site = demo_site().await;
    let page = browser.new_page().await.expect("a page");
    page.goto(&site.url("/")).await.expect("load");
    // A condition that can never hold, and one that throws every time.
    let limit = std::time::Duration::from_millis(200);
    match page
        .wait_until_within("false", "the impossible", limit)
        .await
    {
        Err(Error::Timeout { awaited, after }) => {
            assert!(awaited.starts_with("the impossible: `false`"), "{awaited}");
            assert_eq!(after, limit);
        }
        other => panic!("a timeout: {other:?}"),
    }
    match page
        .wait_until_within(
            "document.querySelector('#nothing').value",
            "a missing element",
            limit,
        )
        .await
    {
        Err(e @ Error::Timeout { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("a missing element") && text.contains("TypeError"),
                "{text}"
            );
        }
        other => panic!("a timeout: {other:?}"),
    }
    match page
        .evaluate("(async () => { throw new Error('planted failure'); })()")
        .await
    {
        Err(Error::Script { exception, .. }) => {
            assert!(exception.contains("planted failure"), "{exception}")
        }
        other => panic!("a script error: {other:?}"),
    }
    match page.click("#nothing").await {
        Err(Error::Page(m)) => assert_eq!(m, "no element matches #nothing"),
        other => panic!("no element: {other:?}"),
    }
    match page.call("Page.noSuchCommand", json!({})).await {
        Err(Error::Protocol { method, .. }) => assert_eq!(method, "Page.noSuchCommand"),
        other => panic!("a protocol error: {other:?}"),
    }
    // Errors thrown at the test's request are not the page's problems.
    page.assert_no_problems();
}

#[tokio::test]
async fn the_test_ca_is_trusted_and_another_is_refused() {
    let browser = browser().await;
    let site = demo_site().await;
    let page = browser.new_page().await.expect("a page");
    // What Chromium says of the connection: TLS 1.3, the test CA's leaf.
    page.call("Network.enable", json!({}))
        .await
        .expect("Network.enable");
    let mut events = page.events();
    page.goto(&site.url("/"))
        .await
        .expect("the trusted origin loads");
    let url = site.url("/");
    let response = events
        .wait_for(
            Some(page.session()),
            "Network.responseReceived",
            "the document's response",
            talos_e2e::browser::LIMIT,
            |p| p["response"]["url"] == url.as_str(),
        )
        .await
        .expect("the response");
    let security = &response.params["response"]["securityDetails"];
    assert_eq!(security["protocol"], "TLS 1.3", "{security}");
    assert_eq!(security["issuer"], "browser test CA", "{security}");
    assert_eq!(response.params["response"]["securityState"], "secure");
    let v = page
        .evaluate(
            "(async () => ({ secure: window.isSecureContext, origin: location.origin, \
             credentials: typeof navigator.credentials?.create, \
             publicKey: typeof PublicKeyCredential }))()",
        )
        .await
        .expect("evaluate");
    assert_eq!(
        v,
        json!({"secure": true, "origin": site.origin(), "credentials": "function", "publicKey": "function"}),
        "a secure context with WebAuthn"
    );

    // The same kind of site, its leaf from a CA the browser does not trust.
    let other_ca = TestCa::new("a CA the browser does not trust");
    let untrusted = Site::start(&other_ca, UNTRUSTED).await.with_demo_pages();
    match page.goto(&untrusted.url("/")).await {
        Err(Error::Navigation { error, .. }) => {
            assert_eq!(
                error, "net::ERR_CERT_AUTHORITY_INVALID",
                "refused for its issuer"
            )
        }
        other => panic!("an untrusted origin must be refused: {other:?}"),
    }

    // Only the mapped names resolve, and only to 127.0.0.1: another name,
    // and an address given as such, are not reached.
    for url in [
        format!("https://elsewhere.test:{}/", site.addr.port()),
        format!("https://127.0.0.1:{}/", site.addr.port()),
    ] {
        match page.goto(&url).await {
            Err(Error::Navigation { error, .. }) => {
                assert_eq!(error, "net::ERR_NAME_NOT_RESOLVED", "{url}")
            }
            other => panic!("{url} must not be reached: {other:?}"),
        }
    }
    page.assert_no_problems();
}

#[tokio::test]
async fn virtual_authenticator_registers_a_passkey_and_signs() {
    let browser = browser().await;
    let site = demo_site().await;
    let page = browser.new_page().await.expect("a page");
    let authenticator = Authenticator::add(&page, &Options::PLATFORM)
        .await
        .expect("a virtual authenticator");
    page.goto(&site.url("/webauthn.html")).await.expect("load");
    page.wait_until(
        "document.getElementById('status').textContent === 'Ready'",
        "the page's script",
    )
    .await
    .expect("ready");

    // Registration: a server-issued random challenge, as for enrolment.
    let mut reg_challenge = [0u8; 32];
    aws_lc_rs::rand::fill(&mut reg_challenge).expect("random");
    let mut user_id = [0u8; 16];
    aws_lc_rs::rand::fill(&mut user_id).expect("random");
    // The assertion's challenge as a decision's (PEOPLE.md): it binds a
    // card's digest and the verdict.
    let card_digest = hex::encode(Sha384::digest(
        b"a sample card for the chromium webauthn test data",
    ));
    let verdict = "approved";
    let decision_challenge = Sha256::digest(
        [
            b"talos-webauthn-v1\0decision\0".as_slice(),
            card_digest.as_bytes(),
            b"\0",
            verdict.as_bytes(),
        ]
        .concat(),
    );
    let options = |allow: Vec<String>| {
        json!({
            "rpId": RP_ID,
            "rpName": "TALOS (browser driver test)",
            "userId": B64U.encode(user_id),
            "userName": "ada",
            "userDisplayName": "Ada",
            "registrationChallenge": B64U.encode(reg_challenge),
            "assertionChallenge": B64U.encode(decision_challenge),
            "allowCredentials": allow,
            "timeoutMs": 20_000,
        })
        .to_string()
    };
    site.put("/options.json", "application/json", options(Vec::new()));

    let mut events = page.events();
    page.click("#register").await.expect("click register");
    let added = authenticator
        .wait_credential(&page, &mut events, Used::Added)
        .await
        .expect("a credential made");
    let registration = site.wait_post("registration", 1).await.json();
    page.wait_until(
        "document.getElementById('status').textContent === 'Registered'",
        "registered",
    )
    .await
    .expect("registered");
    assert_eq!(
        registration["id"],
        added.id.as_str(),
        "the page's credential is the authenticator's"
    );
    assert!(added.resident, "a passkey (discoverable): {added:?}");
    assert_eq!(added.rp_id.as_deref(), Some(RP_ID));
    assert_eq!(
        added.user_handle.as_deref(),
        Some(B64U.encode(user_id).as_str())
    );

    // Sign in with it (allowCredentials names it), as a decision would.
    site.put(
        "/options.json",
        "application/json",
        options(vec![added.id.clone()]),
    );
    let mut events = page.events();
    page.click("#sign-in").await.expect("click sign in");
    let asserted = authenticator
        .wait_credential(&page, &mut events, Used::Asserted)
        .await
        .expect("a credential used");
    let assertion = site.wait_post("assertion", 1).await.json();
    page.wait_until(
        "document.getElementById('status').textContent === 'Signed in'",
        "signed in",
    )
    .await
    .expect("signed in");
    let held = authenticator
        .credentials(&page)
        .await
        .expect("getCredentials");
    assert_eq!(held.len(), 1, "one credential: {held:?}");
    assert_eq!(
        held[0].sign_count, asserted.sign_count,
        "the event and getCredentials agree"
    );
    // Chromium sends each credential's private key; the driver hands on
    // none, even to a test that asks for the raw reply.
    let raw = page
        .call(
            "WebAuthn.getCredentials",
            json!({"authenticatorId": authenticator.id()}),
        )
        .await
        .expect("getCredentials");
    assert_eq!(raw["credentials"][0]["signCount"], asserted.sign_count);
    // The message names the field only: the reply would show the key.
    assert!(
        !raw.to_string().contains("privateKey"),
        "the raw reply holds a credential's privateKey"
    );

    let sample = json!({
        "what": "One WebAuthn registration and one assertion made by Chromium's virtual authenticator \
                 (DevTools WebAuthn domain) on a page of the browser driver's tests, as the page posted \
                 them; every binary field is base64url without padding.",
        "made_by": "tests/tests/browser.rs virtual_authenticator_registers_a_passkey_and_signs, \
                    run from the checkout with TALOS_WEBAUTHN_SAMPLE=$PWD/certs/tests/data/chromium-webauthn.json",
        "browser": browser.version,
        "authenticator": {
            "protocol": "ctap2", "ctap2Version": "ctap2_1", "transport": "internal",
            "hasResidentKey": true, "hasUserVerification": true, "isUserVerified": true,
            "automaticPresenceSimulation": true
        },
        "rp_id": RP_ID,
        "origin": site.origin(),
        "user": {"id": B64U.encode(user_id), "name": "ada", "display_name": "Ada"},
        "registration": {
            "options": "attestation none; pubKeyCredParams ES256 (-7) only; residentKey required; \
                        userVerification required; authenticatorAttachment platform",
            "challenge": B64U.encode(reg_challenge),
            "credential_id": registration["rawId"],
            "client_data_json": registration["clientDataJSON"],
            "attestation_object": registration["attestationObject"],
            "authenticator_data": registration["authenticatorData"],
            "public_key_spki": registration["publicKey"],
            "public_key_algorithm": registration["publicKeyAlgorithm"],
            "transports": registration["transports"],
        },
        "assertion": {
            "options": "userVerification required; allowCredentials the registered credential",
            "challenge": B64U.encode(decision_challenge),
            "challenge_is": "SHA-256(\"talos-webauthn-v1\\0decision\\0\" || card_digest || \"\\0\" || verdict)",
            "card_digest": card_digest,
            "verdict": verdict,
            "credential_id": assertion["rawId"],
            "client_data_json": assertion["clientDataJSON"],
            "authenticator_data": assertion["authenticatorData"],
            "signature": assertion["signature"],
            "user_handle": assertion["userHandle"],
            "sign_count": asserted.sign_count,
        },
    });
    verify_sample(&sample);
    if let Some(path) = std::env::var_os("TALOS_WEBAUTHN_SAMPLE") {
        let text = serde_json::to_string_pretty(&sample).expect("json") + "\n";
        std::fs::write(&path, text).expect("write the sample");
    }

    // A person who fails to unlock the device: user verification fails,
    // the page (which requires it) is refused.
    authenticator
        .set_user_verified(&page, false)
        .await
        .expect("setUserVerified");
    page.click("#sign-in").await.expect("click sign in");
    let refused = site.wait_post("assertion_error", 1).await.json();
    assert_eq!(
        refused["name"], "NotAllowedError",
        "refused without verification: {refused}"
    );
    let held = authenticator
        .credentials(&page)
        .await
        .expect("getCredentials");
    assert_eq!(held[0].sign_count, asserted.sign_count, "nothing signed");
    authenticator
        .remove(&page)
        .await
        .expect("removeVirtualAuthenticator");
    page.assert_no_problems();
}

/// The committed sample (made as the test above says) still verifies.
#[test]
fn the_saved_webauthn_sample_verifies() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../certs/tests/data/chromium-webauthn.json");
    let text = std::fs::read_to_string(&path).expect("the saved sample");
    verify_sample(&serde_json::from_str(&text).expect("json"));
}

/// Check a registration and assertion as a relying party would (but for
/// reading the COSE key out of the attestation object, which is the
/// WebAuthn core's job: the SPKI form the page gave is used here).
fn verify_sample(s: &Value) {
    let b = |v: &Value| -> Vec<u8> {
        B64U.decode(v.as_str().unwrap_or_else(|| panic!("base64url text: {v}")))
            .unwrap_or_else(|e| panic!("base64url {v}: {e}"))
    };
    let rp_id = s["rp_id"].as_str().expect("rp_id");
    let origin = s["origin"].as_str().expect("origin");
    let rp_hash = Sha256::digest(rp_id.as_bytes());
    let reg = &s["registration"];
    let asr = &s["assertion"];

    let client: Value =
        serde_json::from_slice(&b(&reg["client_data_json"])).expect("clientDataJSON");
    assert_eq!(client["type"], "webauthn.create");
    assert_eq!(client["challenge"], reg["challenge"]);
    assert_eq!(client["origin"], origin);
    assert_ne!(client["crossOrigin"], true);
    let auth = b(&reg["authenticator_data"]);
    assert_eq!(
        &auth[..32],
        rp_hash.as_slice(),
        "registration: the rp id hash"
    );
    let flags = auth[32];
    assert_eq!(
        flags & 0x45,
        0x45,
        "registration: UP, UV and AT set ({flags:#04x})"
    );
    let cred_id = b(&reg["credential_id"]);
    let id_len = u16::from_be_bytes([auth[53], auth[54]]) as usize;
    assert_eq!(
        &auth[55..55 + id_len],
        cred_id.as_slice(),
        "the attested credential id"
    );
    let attestation = b(&reg["attestation_object"]);
    assert!(
        attestation.windows(9).any(|w| w == b"\x63fmt\x64none"),
        "attestation format none"
    );
    assert!(
        attestation
            .windows(auth.len())
            .any(|w| w == auth.as_slice()),
        "the attestation object carries the same authenticator data"
    );
    assert_eq!(reg["public_key_algorithm"], -7, "ES256");

    let client_json = b(&asr["client_data_json"]);
    let client: Value = serde_json::from_slice(&client_json).expect("clientDataJSON");
    assert_eq!(client["type"], "webauthn.get");
    assert_eq!(client["challenge"], asr["challenge"]);
    assert_eq!(client["origin"], origin);
    let card_digest = asr["card_digest"].as_str().expect("card_digest");
    let verdict = asr["verdict"].as_str().expect("verdict");
    let challenge = Sha256::digest(
        [
            b"talos-webauthn-v1\0decision\0".as_slice(),
            card_digest.as_bytes(),
            b"\0",
            verdict.as_bytes(),
        ]
        .concat(),
    );
    assert_eq!(
        b(&asr["challenge"]),
        challenge.as_slice(),
        "the decision challenge"
    );
    assert_eq!(asr["credential_id"], reg["credential_id"]);
    let auth = b(&asr["authenticator_data"]);
    assert_eq!(&auth[..32], rp_hash.as_slice(), "assertion: the rp id hash");
    assert_eq!(
        auth[32] & 0x05,
        0x05,
        "assertion: UP and UV set ({:#04x})",
        auth[32]
    );
    let count = u32::from_be_bytes(auth[33..37].try_into().expect("4 bytes"));
    assert_eq!(Value::from(count), asr["sign_count"], "the sign count");
    let signed = [auth.as_slice(), Sha256::digest(&client_json).as_slice()].concat();
    UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, b(&reg["public_key_spki"]))
        .verify(&signed, &b(&asr["signature"]))
        .expect("the assertion's signature verifies under the registered key");
}

#[tokio::test]
async fn a_phone_viewport_and_its_screenshot() {
    let browser = browser().await;
    let site = demo_site().await;
    let mut page = browser.new_page().await.expect("a page");
    page.set_viewport(Viewport::PHONE).await.expect("phone");
    page.goto(&site.url("/")).await.expect("load");
    let v = page
        .evaluate(
            "({ width: window.innerWidth, ratio: window.devicePixelRatio, \
             coarse: matchMedia('(pointer: coarse)').matches, touch: navigator.maxTouchPoints > 0 })",
        )
        .await
        .expect("evaluate");
    assert_eq!(
        v,
        json!({"width": 390, "ratio": 3, "coarse": true, "touch": true})
    );

    page.type_text("#name", "Ada").await.expect("type");
    page.click("#greet").await.expect("tap");
    page.wait_until(
        "document.getElementById('greeting').textContent !== ''",
        "the greeting",
    )
    .await
    .expect("greeted");
    assert_eq!(page.text("#greeting").await.expect("text"), "Hello, Ada");
    assert_eq!(
        page.evaluate("document.body.dataset.pointer")
            .await
            .expect("evaluate"),
        "touch",
        "a phone's button is tapped with a finger"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("phone.png");
    let info = page.screenshot(&path).await.expect("screenshot");
    assert_eq!((info.width, info.height), (390 * 3, 844 * 3), "{info:?}");
    let written = std::fs::read(&path).expect("the PNG");
    assert_eq!(
        talos_e2e::browser::png::check(&written).expect("a PNG"),
        info
    );
    page.assert_no_problems();
}

#[tokio::test]
async fn axe_finds_a_planted_violation_and_passes_a_good_page() {
    let browser = browser().await;
    let site = demo_site().await;
    let page = browser.new_page().await.expect("a page");

    page.goto(&site.url("/bad.html")).await.expect("load");
    let report = page.axe().await.expect("axe");
    assert_eq!(report.axe_version, talos_e2e::browser::axe::VERSION);
    let serious = report.serious();
    let contrast = serious
        .iter()
        .find(|v| v.id == "color-contrast")
        .unwrap_or_else(|| panic!("the planted low contrast: {:#?}", report.violations));
    assert_eq!(contrast.nodes.len(), 1, "{contrast}");
    assert_eq!(contrast.nodes[0].target, vec!["#faint".to_owned()]);
    let failed =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| report.assert_no_serious()))
            .expect_err("the check fails on it");
    let message = failed.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("color-contrast (serious)") && message.contains("#faint"),
        "the failure names the rule and the node: {message}"
    );

    page.goto(&site.url("/")).await.expect("load");
    let report = page.axe().await.expect("axe");
    assert!(report.passes > 10, "axe checked the page: {report:?}");
    report.assert_no_serious();
    // axe ran in a page whose CSP allows only the site's own scripts, and
    // the CSP refused nothing of it.
    page.assert_no_problems();
}

#[tokio::test]
async fn console_errors_exceptions_and_csp_violations_are_caught() {
    let browser = browser().await;
    let site = demo_site().await;
    let page = browser.new_page().await.expect("a page");
    page.goto(&site.url("/problems.html")).await.expect("load");
    let problems = until_async("the three planted problems", || {
        check(page.problems(), |p| {
            [
                ProblemKind::ConsoleError,
                ProblemKind::Exception,
                ProblemKind::CspViolation,
            ]
            .iter()
            .all(|k| p.iter().any(|p| p.kind == *k))
        })
    })
    .await;
    let text = |kind| {
        problems
            .iter()
            .find(|p| p.kind == kind)
            .map(|p| p.text.clone())
            .unwrap_or_default()
    };
    assert_eq!(text(ProblemKind::ConsoleError), "planted console error");
    assert!(
        text(ProblemKind::Exception).contains("planted uncaught exception"),
        "{problems:#?}"
    );
    assert!(
        text(ProblemKind::CspViolation).contains("script-src 'self'"),
        "{problems:#?}"
    );
    assert_eq!(
        page.evaluate("document.title").await.expect("title"),
        "Browser driver check: planted problems",
        "the inline script never ran"
    );
    let failed =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| page.assert_no_problems()));
    assert!(failed.is_err(), "assert_no_problems fails on them");
    assert!(page.take_problems().starts_with(&problems), "taken");
    page.assert_no_problems();

    // A good page reports none.
    page.goto(&site.url("/")).await.expect("load");
    page.wait_until(
        "document.getElementById('status').textContent === 'Ready'",
        "the page's script",
    )
    .await
    .expect("ready");
    page.assert_no_problems();
}

#[tokio::test]
async fn cookies_are_read_with_their_flags_and_values_kept_out_of_output() {
    let browser = browser().await;
    let site = demo_site().await;
    site.put_asset(
        "/cookie",
        Asset {
            content_type: "text/plain; charset=utf-8".into(),
            body: "a cookie was set".into(),
            csp: None,
            headers: vec![(
                "set-cookie".into(),
                "talos_session=not-for-output; Path=/; Secure; HttpOnly; SameSite=Strict".into(),
            )],
        },
    );
    let page = browser.new_page().await.expect("a page");
    page.goto(&site.url("/cookie")).await.expect("load");
    let cookies = page.cookies(&site.url("/")).await.expect("cookies");
    assert_eq!(cookies.len(), 1, "{cookies:?}");
    let c = &cookies[0];
    assert_eq!(c.name, "talos_session");
    assert_eq!(
        (c.http_only, c.secure, c.same_site.as_deref()),
        (true, true, Some("Strict"))
    );
    assert_eq!(
        (c.domain.as_str(), c.path.as_str(), c.expires),
        (RP_ID, "/", None)
    );
    assert_eq!(c.value.expose(), "not-for-output");
    assert!(
        !format!("{cookies:?}").contains("not-for-output"),
        "Debug hides the value"
    );
    assert_eq!(
        page.evaluate("document.cookie").await.expect("evaluate"),
        "",
        "HttpOnly: the page's script cannot read it"
    );
}
