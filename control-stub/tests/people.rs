//! The people's web app over its own HTTPS, in process, with an HTTPS
//! client of the tests' own and a software authenticator (talos-certs'
//! `webauthn::soft`): what it answers and with which headers, enrolment
//! links used once and within their time, the session cookie's flags,
//! life and rotation, CSRF and Origin checks on every change, bounded
//! sign-in attempts, decisions signed by the named person's own passkey
//! over the card and the verdict, the live card stream (across replicas),
//! Revoke All signed and recorded verified, who sees which session, a
//! hostile card's text, people removed, and Web Push subscriptions taken
//! and sent to. The browser tests (`tests/tests/people.rs`) drive the same
//! app in Chromium.
//!
//! Time moves with a clock the test holds (the app's `Deps::clock`), never
//! by sleeping.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use common::people::{enrolled, Client, Passkey, TestClock, Web, RP_ID};
use common::{request, Env, ACCEPT};
use talos_certs::webauthn::soft::Ceremony;
use talos_certs::webauthn::{Expected, Flags};
use talos_certs::{proposal_msg_of as msg, sentence, Proposal, ProposalKind};
use talos_control_stub::lock::NewRule;
use talos_control_stub::model::Role;
use talos_control_stub::people::accounts;
use talos_control_stub::{relay, FakeLink, Lifecycle, LockMode, LockRule, Mode, Store};

/// A store with the usual policy, a fake gateway pair the web app and the
/// lifecycle share, a running session under a rule naming alice and bob,
/// and the web app on a clock the test moves.
struct Rig {
    /// The runtime the web app runs on (the test's thread is outside it,
    /// so the store's synchronous calls run there, on either database).
    rt: tokio::runtime::Handle,
    env: Env,
    link: Arc<FakeLink>,
    clock: TestClock,
    web: Web,
    session: String,
    rule: LockRule,
    /// The passkeys of alice and bob, whom the rule names.
    alice: Passkey,
    bob: Passkey,
}

impl Rig {
    fn new(rt: &tokio::runtime::Runtime) -> Rig {
        let mut env = Env::new().with_policy();
        let link = Arc::new(FakeLink::default());
        let clock = TestClock::new();
        let web = rt.block_on(Web::start(
            env.dir.path(),
            &env.db(),
            link.clone(),
            clock.clock(),
        ));
        let alice = enrolled(&mut env.store, "alice", Role::Approver);
        let bob = enrolled(&mut env.store, "bob", Role::Approver);
        let (session, rule) = {
            let rule = env
                .store
                .lock_add(
                    &NewRule::check(
                        "api.github.com",
                        Some("GH"),
                        Some("post"),
                        Some("/repos/"),
                        LockMode::EveryRequest,
                        &["alice".to_owned(), "bob".to_owned()],
                    )
                    .unwrap(),
                )
                .unwrap();
            let session = Lifecycle::new(&mut env.store, link.as_ref(), &ACCEPT)
                .with_relay_key(Some([7; 32]))
                .start(&request(Mode::Commands))
                .unwrap()
                .session_id;
            (session, rule)
        };
        Rig {
            rt: rt.handle().clone(),
            env,
            link,
            clock,
            web,
            session,
            rule,
            alice,
            bob,
        }
    }

    /// A person enrolled through the web app (the CLI's link opened by a
    /// client) and signed in: the client and their passkey.
    fn person(&mut self, name: &str, role: Role) -> (Client, Passkey) {
        let link = accounts::enroll(
            &mut self.env.store,
            name,
            role,
            self.web.rp.origin(),
            self.clock.now(),
        )
        .unwrap();
        let mut c = self.web.client();
        let passkey = self.rt.block_on(c.enrol(&self.web.rp, &link.link));
        let signed = self.rt.block_on(c.sign_in(&self.web.rp, &passkey));
        assert_eq!(signed.status, 200, "{}", signed.text);
        (c, passkey)
    }

    /// Sign in to the web app with a passkey enrolled at the store level
    /// (alice and bob).
    fn signed_in(&self, passkey: &Passkey) -> Client {
        let mut c = self.web.client();
        let signed = self.rt.block_on(c.sign_in(&self.web.rp, passkey));
        assert_eq!(signed.status, 200, "{}", signed.text);
        c
    }

    /// Card `n` proposed by gw-a under the rule (a request), stored by the
    /// relay as a gateway's proposal is.
    fn propose(&mut self, n: u32) -> Proposal {
        let p = proposal(&self.session, &self.rule, n);
        relay::receive(&mut self.env.store, &msg(&p)).unwrap();
        p
    }
}

/// The runtime the web app and the clients run on; the test's own thread
/// stays outside it (the store is synchronous, and on PostgreSQL its
/// client runs a runtime of its own).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn at(offset: Duration) -> String {
    humantime::format_rfc3339_millis(SystemTime::now() + offset).to_string()
}

fn proposal(session: &str, rule: &LockRule, n: u32) -> Proposal {
    Proposal {
        proposal_id: format!("gw-a-{n}-7f3a"),
        gateway_id: "gw-a".into(),
        session_id: session.into(),
        attempt: 1,
        tenant: "acme".into(),
        kind: ProposalKind::Request,
        destination: "api.github.com".into(),
        method: "POST".into(),
        path: format!("/repos/acme/widgets/merges/{n}"),
        attachments: vec!["GH".into()],
        rule: rule.id.clone(),
        tool: String::new(),
        call_digest: String::new(),
        approvers: rule.approvers.clone(),
        created_at: at(Duration::ZERO),
        expires_at: at(Duration::from_secs(300)),
    }
}

fn b64d(v: &serde_json::Value) -> Vec<u8> {
    URL_SAFE_NO_PAD.decode(v.as_str().unwrap()).unwrap()
}

// ---- what every answer carries ----------------------------------------

#[test]
fn every_answer_carries_the_security_headers_and_personal_ones_are_never_stored() {
    let rig_rt = runtime();
    let mut rig = Rig::new(&rig_rt);
    let mut c = rig.web.client();
    for (path, status, store) in [
        ("/", 200, "no-store"),
        ("/cards", 200, "no-store"),
        ("/sessions/sbx-000000000001", 200, "no-store"),
        ("/app.js", 200, "no-cache"),
        ("/app.css", 200, "no-cache"),
        ("/sw.js", 200, "no-cache"),
        ("/manifest.webmanifest", 200, "no-cache"),
        ("/icon.svg", 200, "no-cache"),
        ("/api/me", 200, "no-store"),
        ("/api/cards", 401, "no-store"),
        ("/nowhere", 404, "no-store"),
        ("/api/nowhere", 404, "no-store"),
    ] {
        let a = rig_rt.block_on(c.get(path));
        assert_eq!(a.status, status, "{path}: {}", a.text);
        let csp = a.header("content-security-policy").unwrap();
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "img-src 'self'",
            "connect-src 'self'",
            "manifest-src 'self'",
            "worker-src 'self'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
            "require-trusted-types-for 'script'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert!(!csp.contains("unsafe"), "{path}: {csp}");
        assert_eq!(
            a.header("strict-transport-security"),
            Some("max-age=31536000")
        );
        assert_eq!(a.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(a.header("referrer-policy"), Some("no-referrer"));
        assert_eq!(a.header("x-frame-options"), Some("DENY"));
        assert_eq!(a.header("cross-origin-opener-policy"), Some("same-origin"));
        assert!(a
            .header("permissions-policy")
            .unwrap()
            .contains("camera=()"));
        assert_eq!(a.header("cache-control"), Some(store), "{path}");
    }
    // Not signed in is not an error for the page: it shows the sign-in.
    let me = rig_rt.block_on(c.get("/api/me"));
    assert_eq!(me.body, serde_json::json!({"signed_in": false}));
    // An asset is asked again and answered 304 while it is the same.
    let js = rig_rt.block_on(c.get("/app.js"));
    let etag = js.header("etag").unwrap().to_owned();
    let again = rig_rt.block_on(c.raw(
        "GET",
        "/app.js",
        &[("if-none-match".into(), etag)],
        Vec::new(),
    ));
    assert_eq!(again.status, 304);
    rig_rt.block_on(rig.web.stop());
}

#[test]
fn the_listener_speaks_tls_1_3_only() {
    let rig_rt = runtime();
    let mut rig = Rig::new(&rig_rt);
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut rig.web.ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let tls12 = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = rig_rt
        .block_on(tokio::net::TcpStream::connect(rig.web.addr))
        .unwrap();
    let refused = rig_rt.block_on(
        tokio_rustls::TlsConnector::from(Arc::new(tls12))
            .connect(rustls::pki_types::ServerName::try_from(RP_ID).unwrap(), tcp),
    );
    assert!(refused.is_err(), "a TLS 1.2 handshake was taken");
    rig_rt.block_on(rig.web.stop());
}

// ---- enrolment ----------------------------------------------------------

#[test]
fn an_enrolment_link_works_once_and_for_fifteen_minutes() {
    let rig_rt = runtime();
    let mut rig = Rig::new(&rig_rt);
    let origin = rig.web.rp.origin().to_owned();
    let link = accounts::enroll(
        &mut rig.env.store,
        "carol",
        Role::Approver,
        &origin,
        rig.clock.now(),
    )
    .unwrap();
    let token = common::people::token_of(&link.link);
    // Only its hash is stored; its Debug form does not show it.
    assert!(!rig.env.dump().contains(&token));
    assert!(!format!("{link:?}").contains(&token));
    let mut c = rig.web.client();
    let passkey = rig_rt.block_on(c.enrol(&rig.web.rp, &link.link));
    // Used: refused, start and finish alike.
    let again = rig_rt.block_on(c.post("/api/enrol/begin", serde_json::json!({"token": token})));
    assert_eq!(
        (again.status, again.code()),
        (410, "enrolment_used"),
        "{}",
        again.text
    );
    // The passkey signs in; nothing of it but its public half is stored.
    let signed = rig_rt.block_on(c.sign_in(&rig.web.rp, &passkey));
    assert_eq!(signed.body["person"], "carol");

    // Another link, opened a moment after its fifteen minutes: refused.
    let link = accounts::enroll(
        &mut rig.env.store,
        "carol",
        Role::Approver,
        &origin,
        rig.clock.now(),
    )
    .unwrap();
    let token = common::people::token_of(&link.link);
    rig.clock
        .advance(accounts::ENROLMENT_LIFE + Duration::from_millis(1));
    let mut c = rig.web.client();
    let late = rig_rt.block_on(c.post("/api/enrol/begin", serde_json::json!({"token": token})));
    assert_eq!(
        (late.status, late.code()),
        (410, "enrolment_expired"),
        "{}",
        late.text
    );
    // A token no link has, and a role other than the person's.
    let unknown = rig_rt.block_on(c.post(
        "/api/enrol/begin",
        serde_json::json!({"token": "A".repeat(43)}),
    ));
    assert_eq!((unknown.status, unknown.code()), (404, "enrolment_unknown"));
    let e = accounts::enroll(
        &mut rig.env.store,
        "carol",
        Role::Operator,
        &origin,
        rig.clock.now(),
    )
    .unwrap_err();
    assert_eq!(e.code(), "person_role_conflict");

    // A link whose ceremony is answered with another challenge, or
    // without user verification, stores nothing and stays usable.
    let link = accounts::enroll(
        &mut rig.env.store,
        "dave",
        Role::Approver,
        &origin,
        rig.clock.now(),
    )
    .unwrap();
    let token = common::people::token_of(&link.link);
    let mut c = rig.web.client();
    for (flags, challenge_from_options, reason) in [
        (
            Flags::UP | Flags::UV | Flags::AT,
            false,
            "challenge_mismatch",
        ),
        (Flags::UP | Flags::AT, true, "user_not_verified"),
    ] {
        let options =
            rig_rt.block_on(c.post("/api/enrol/begin", serde_json::json!({"token": token})));
        let challenge = if challenge_from_options {
            b64d(&options.body["publicKey"]["challenge"])
        } else {
            vec![9; 32]
        };
        let p = Passkey::new();
        let expected = Expected {
            challenge: &challenge,
            rp_id: RP_ID,
            origin: &origin,
        };
        let made = p.auth.register(&Ceremony::create(&expected).flags(flags));
        let done = rig_rt.block_on(c.post(
            "/api/enrol/finish",
            serde_json::json!({
                "token": token,
                "challenge_id": options.body["challenge_id"],
                "credential": common::people::registration_json(&p.auth, &made),
            }),
        ));
        assert_eq!(
            (done.status, done.code()),
            (403, "passkey_refused"),
            "{}",
            done.text
        );
        assert_eq!(done.body["reason"], reason);
    }
    assert!(rig
        .env
        .store
        .read(|tx| tx.passkeys_of("dave"))
        .unwrap()
        .is_empty());
    rig_rt.block_on(c.enrol(&rig.web.rp, &link.link));
    rig_rt.block_on(rig.web.stop());
}

// ---- the session cookie ---------------------------------------------------

#[test]
fn the_session_cookie_is_a_host_cookie_rotated_and_short_lived() {
    let rig_rt = runtime();
    let mut rig = Rig::new(&rig_rt);
    let (mut c, _) = rig.person("carol", Role::Approver);
    let cookie = c.set_cookies.last().unwrap().clone();
    let token = c.cookie.clone().unwrap();
    assert!(cookie.starts_with("__Host-talos_session="), "{cookie}");
    for flag in [
        "Path=/",
        "Secure",
        "HttpOnly",
        "SameSite=Strict",
        "Max-Age=28800",
    ] {
        assert!(cookie.split("; ").any(|f| f == flag), "{flag} in {cookie}");
    }
    assert!(!cookie.contains("Domain"), "{cookie}");
    // Only its hash is stored.
    assert!(!rig.env.dump().contains(&token));
    let me = rig_rt.block_on(c.get("/api/me"));
    assert_eq!(
        (me.body["person"].as_str(), me.body["role"].as_str()),
        (Some("carol"), Some("approver"))
    );
    assert!(c.set_cookies.len() == 1, "no rotation before five minutes");

    // Five minutes on: the next request rotates the token; the old one
    // no longer works.
    rig.clock.advance(Duration::from_secs(5 * 60));
    let me = rig_rt.block_on(c.get("/api/me"));
    assert_eq!(me.body["signed_in"], true);
    assert_eq!(c.set_cookies.len(), 2);
    let rotated = c.cookie.clone().unwrap();
    assert_ne!(rotated, token);
    let mut stale = c.clone();
    stale.cookie = Some(token.clone());
    assert_eq!(rig_rt.block_on(stale.get("/api/cards")).status, 401);
    assert_eq!(rig_rt.block_on(c.get("/api/cards")).status, 200);

    // Fifteen minutes without a request: over.
    rig.clock.advance(Duration::from_secs(15 * 60));
    assert_eq!(rig_rt.block_on(c.get("/api/cards")).code(), "not_signed_in");

    // Eight hours at most, however busy (a request every 12 minutes).
    let (mut busy, _) = rig.person("dave", Role::Approver);
    for _ in 0..39 {
        rig.clock.advance(Duration::from_secs(12 * 60));
        assert_eq!(rig_rt.block_on(busy.get("/api/cards")).status, 200);
    }
    rig.clock.advance(Duration::from_secs(12 * 60));
    assert_eq!(
        rig_rt.block_on(busy.get("/api/cards")).code(),
        "not_signed_in"
    );

    // Signing out ends it at once and removes the cookie.
    let (mut erin, _) = rig.person("erin", Role::Approver);
    let out = rig_rt.block_on(erin.post("/api/sign-out", serde_json::json!({})));
    assert_eq!(out.status, 200);
    assert!(erin.set_cookies.last().unwrap().contains("Max-Age=0"));
    let mut again = erin.clone();
    again.cookie = erin.set_cookies[erin.set_cookies.len() - 2]
        .split(';')
        .next()
        .and_then(|kv| kv.split_once('='))
        .map(|(_, v)| v.to_owned());
    assert_eq!(rig_rt.block_on(again.get("/api/cards")).status, 401);
    rig_rt.block_on(rig.web.stop());
}

// ---- CSRF and Origin -------------------------------------------------------

#[test]
fn every_change_needs_the_apps_origin_json_and_the_csrf_token() {
    let rig_rt = runtime();
    let mut rig = Rig::new(&rig_rt);
    let (mut c, _) = rig.person("carol", Role::Approver);
    let origin = c.origin.clone();
    let csrf = c.csrf.clone().unwrap();
    let h = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let json = ("content-type", "application/json");
    for (headers, status, code) in [
        // No CSRF token, or another.
        (h(&[("origin", &origin), json]), 403, "csrf_refused"),
        (
            h(&[
                ("origin", &origin),
                json,
                ("x-csrf-token", "A".repeat(43).as_str()),
            ]),
            403,
            "csrf_refused",
        ),
        // Another origin, none, or a browser saying the request is
        // another site's.
        (
            h(&[
                ("origin", "https://evil.example"),
                json,
                ("x-csrf-token", &csrf),
            ]),
            403,
            "origin_refused",
        ),
        (
            h(&[
                ("origin", &format!("{origin}.evil.example")),
                json,
                ("x-csrf-token", &csrf),
            ]),
            403,
            "origin_refused",
        ),
        (h(&[json, ("x-csrf-token", &csrf)]), 403, "origin_refused"),
        (
            h(&[
                ("origin", &origin),
                json,
                ("x-csrf-token", &csrf),
                ("sec-fetch-site", "cross-site"),
            ]),
            403,
            "origin_refused",
        ),
        // Not JSON: a form post is what another site could send.
        (
            h(&[
                ("origin", &origin),
                ("content-type", "application/x-www-form-urlencoded"),
                ("x-csrf-token", &csrf),
            ]),
            415,
            "json_only",
        ),
        (
            h(&[
                ("origin", &origin),
                ("content-type", "text/plain"),
                ("x-csrf-token", &csrf),
            ]),
            415,
            "json_only",
        ),
    ] {
        let a = rig_rt.block_on(c.raw("POST", "/api/sign-out", &headers, b"{}".to_vec()));
        assert_eq!(
            (a.status, a.code()),
            (status, code),
            "{headers:?}: {}",
            a.text
        );
    }
    // Still signed in: none of them did anything.
    assert_eq!(rig_rt.block_on(c.get("/api/me")).body["signed_in"], true);
    // Sign-in itself (no session yet) needs the origin and JSON too.
    let mut fresh = rig.web.client();
    let a = rig_rt.block_on(fresh.raw(
        "POST",
        "/api/sign-in/begin",
        &h(&[("origin", "https://evil.example"), json]),
        b"{}".to_vec(),
    ));
    assert_eq!(a.code(), "origin_refused");
    // Bodies: bounded, JSON, no field the route does not take.
    let big = rig_rt.block_on(c.raw(
        "POST",
        "/api/sign-out",
        &h(&[("origin", &origin), json, ("x-csrf-token", &csrf)]),
        vec![b' '; 70 * 1024],
    ));
    assert_eq!((big.status, big.code()), (413, "body_too_large"));
    let odd = rig_rt.block_on(c.post(
        "/api/push/unsubscribe",
        serde_json::json!({"endpoint": "x", "more": 1}),
    ));
    assert_eq!(
        (odd.status, odd.code()),
        (400, "body_invalid"),
        "{}",
        odd.text
    );
    let wrong = rig_rt.block_on(c.call("GET", "/api/sign-out", None));
    assert_eq!(wrong.status, 405);
    rig_rt.block_on(rig.web.stop());
}

// ---- bounded sign-in -------------------------------------------------------

#[test]
fn sign_in_attempts_are_bounded_per_address_and_in_all() {
    let rig_rt = runtime();
    let mut rig = Rig::new(&rig_rt);
    let begin =
        |c: &mut Client| rig_rt.block_on(c.post("/api/sign-in/begin", serde_json::json!({})));
    let mut one = rig.web.client();
    one.source = "127.0.0.2".parse().unwrap();
    for _ in 0..ceremony_limit() {
        assert_eq!(begin(&mut one).status, 200);
    }
    let limited = begin(&mut one);
    assert_eq!(
        (limited.status, limited.code()),
        (429, "sign_in_limited"),
        "{}",
        limited.text
    );
    let retry: u64 = limited.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=15 * 60).contains(&retry), "{retry}");
    assert!(limited.body["message"]
        .as_str()
        .unwrap()
        .contains("from this address"));
    // Another address is not held up by it.
    let mut other = rig.web.client();
    other.source = "127.0.0.3".parse().unwrap();
    assert_eq!(begin(&mut other).status, 200);
    // Bad enrolment tokens count as failed attempts too.
    let mut guesser = rig.web.client();
    guesser.source = "127.0.0.4".parse().unwrap();
    for _ in 0..ceremony_limit() {
        let a =
            rig_rt.block_on(guesser.post("/api/enrol/begin", serde_json::json!({"token": "nope"})));
        assert_eq!(a.code(), "enrolment_unknown");
    }
    assert_eq!(
        rig_rt
            .block_on(guesser.post("/api/enrol/begin", serde_json::json!({"token": "nope"})))
            .code(),
        "sign_in_limited"
    );
    // In all: spread over many addresses, the overall bound holds.
    let mut spent = 2 * ceremony_limit() + 1;
    let mut n = 10;
    while spent < talos_control_stub::people::ceremony::SIGN_IN_OVERALL {
        let mut c = rig.web.client();
        c.source = format!("127.0.1.{n}").parse().unwrap();
        for _ in
            0..ceremony_limit().min(talos_control_stub::people::ceremony::SIGN_IN_OVERALL - spent)
        {
            assert_eq!(begin(&mut c).status, 200);
            spent += 1;
        }
        n += 1;
    }
    let mut late = rig.web.client();
    late.source = "127.0.2.1".parse().unwrap();
    let all = begin(&mut late);
    assert_eq!(all.code(), "sign_in_limited");
    assert!(all.body["message"].as_str().unwrap().contains("in all"));
    // The window passes: attempts are taken again.
    rig.clock
        .advance(talos_control_stub::people::ceremony::SIGN_IN_WINDOW);
    assert_eq!(begin(&mut one).status, 200);
    rig_rt.block_on(rig.web.stop());
}

fn ceremony_limit() -> u32 {
    talos_control_stub::people::ceremony::SIGN_IN_PER_SOURCE
}

// ---- decisions -------------------------------------------------------------

#[test]
fn a_decision_needs_the_named_persons_own_passkey_over_the_card_and_the_verdict() {
    let rig_rt = runtime();
    let mut rig = Rig::new(&rig_rt);
    // Alice and Bob are named; Carol is not.
    let (mut carol, carol_key) = rig.person("carol", Role::Approver);
    let mut alice = rig.signed_in(&rig.alice);
    let p = rig.propose(1);
    let (alice_key, bob_key) = (&rig.alice, &rig.bob);
    let cards = rig_rt.block_on(alice.get("/api/cards"));
    let card = cards.body["cards"][0].clone();
    assert_eq!(card["id"], p.proposal_id.as_str());
    assert_eq!(card["digest"], msg(&p).digest.as_str());
    assert_eq!(card["sentence"]["escaped"], sentence(&p).as_str());
    assert_eq!(
        b64d(&card["challenges"]["approved"]),
        common::people::decision_challenge(&msg(&p).digest, talos_certs::Verdict::Approved)
    );
    // Alice's own passkeys, for allowCredentials.
    let allow = cards.body["allow_credentials"].as_array().unwrap();
    assert_eq!(allow.len(), 1, "{allow:?}");
    assert_eq!(
        allow[0]["id"],
        URL_SAFE_NO_PAD.encode(alice_key.auth.credential_id())
    );
    assert_eq!(
        rig_rt.block_on(carol.get("/api/cards")).body["cards"]
            .as_array()
            .unwrap()
            .len(),
        0
    );

    let refused = |a: &common::people::Answer| {
        (
            a.status,
            a.code().to_owned(),
            a.body["reason"].as_str().map(str::to_owned),
        )
    };
    // Carol is not named on the card.
    let a = rig_rt.block_on(carol.decide(&rig.web.rp, &carol_key, &card, "approved", "approved"));
    assert_eq!(
        refused(&a),
        (403, "approver_not_listed".into(), None),
        "{}",
        a.text
    );
    // An assertion made for Approve, posted as Decline (and the reverse).
    let a = rig_rt.block_on(alice.decide(&rig.web.rp, alice_key, &card, "declined", "approved"));
    assert_eq!(
        refused(&a),
        (
            403,
            "passkey_refused".into(),
            Some("challenge_mismatch".into())
        ),
        "{}",
        a.text
    );
    let a = rig_rt.block_on(alice.decide(&rig.web.rp, alice_key, &card, "approved", "declined"));
    assert_eq!(refused(&a).2.as_deref(), Some("challenge_mismatch"));
    // Bob's passkey, in Alice's session: not hers.
    let a = rig_rt.block_on(alice.decide(&rig.web.rp, bob_key, &card, "approved", "approved"));
    assert_eq!(
        refused(&a).2.as_deref(),
        Some("unknown_credential"),
        "{}",
        a.text
    );
    // Without user verification; from another origin; a count that did
    // not go up.
    let challenge = b64d(&card["challenges"]["approved"]);
    let expected = Expected {
        challenge: &challenge,
        rp_id: RP_ID,
        origin: rig.web.rp.origin(),
    };
    let id = card["id"].as_str().unwrap();
    for (ceremony, reason) in [
        (
            Ceremony::get(&expected).sign_count(50).flags(Flags::UP),
            "user_not_verified",
        ),
        (
            Ceremony::get(&expected)
                .sign_count(51)
                .origin("https://evil.example"),
            "origin_mismatch",
        ),
        (
            Ceremony::get(&expected)
                .sign_count(52)
                .rp_id("evil.example"),
            "rp_id_mismatch",
        ),
        (
            Ceremony::get(&expected).sign_count(1),
            "sign_count_replayed",
        ),
    ] {
        let a = rig_rt.block_on(alice
            .post(
                &format!("/api/cards/{id}/decision"),
                serde_json::json!({"verdict": "approved", "credential": alice_key.sign_with(&ceremony)}),
            ));
        assert_eq!(refused(&a).2.as_deref(), Some(reason), "{}", a.text);
    }
    assert!(
        rig.link.decisions().is_empty(),
        "a refused decision reached the gateway"
    );
    assert_eq!(
        rig.env
            .store
            .read(|tx| tx.proposal(id))
            .unwrap()
            .unwrap()
            .state,
        talos_control_stub::ProposalState::Pending
    );

    // Alice's own passkey over the card and "approved": decided,
    // delivered, the assertion kept with it.
    let a = rig_rt.block_on(alice.decide(&rig.web.rp, alice_key, &card, "approved", "approved"));
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(
        (a.body["decision"].as_str(), a.body["outcome"].as_str()),
        (Some("approved"), Some("released"))
    );
    assert_eq!(rig.link.decisions().len(), 1);
    // The relay's signed decision carries the card and Alice's assertion,
    // which verify as hers on their own (as the gateway checks them).
    let (_, delivered) = &rig.link.decisions()[0];
    let decision: talos_certs::Decision = serde_json::from_slice(&delivered.payload).unwrap();
    assert_eq!(decision.card.as_ref(), Some(&p));
    let person = talos_certs::webauthn::verify_person(
        &decision,
        &msg(&p).digest,
        &[talos_certs::webauthn::ApproverKey {
            owner: "alice",
            credential_id: alice_key.auth.credential_id(),
            public_key_cose: alice_key.auth.public_key_cose(),
            sign_count: 0,
        }],
        &p.approvers,
        &talos_certs::webauthn::RelyingParty {
            rp_id: RP_ID,
            origin: rig.web.rp.origin(),
        },
    )
    .unwrap();
    assert_eq!(person.person, "alice");
    let stored = rig.env.store.read(|tx| tx.proposal(id)).unwrap().unwrap();
    let kept = stored.assertion.unwrap();
    assert_eq!(kept.person, "alice");
    assert_eq!(
        kept.credential_id,
        URL_SAFE_NO_PAD.encode(alice_key.auth.credential_id())
    );
    assert_eq!(URL_SAFE_NO_PAD.decode(&kept.challenge).unwrap(), challenge);
    assert!(
        !kept.authenticator_data.is_empty()
            && !kept.signature.is_empty()
            && !kept.client_data_json.is_empty()
    );
    // The same assertion again: the card is decided.
    let a = rig_rt.block_on(alice.decide(&rig.web.rp, alice_key, &card, "approved", "approved"));
    assert_eq!(refused(&a).1, "approval_not_pending");
    assert_eq!(
        rig_rt.block_on(alice.get("/api/cards")).body["cards"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    // History shows it, signed.
    let h = rig_rt.block_on(alice.get("/api/history"));
    assert_eq!(h.body["decisions"][0]["id"], id);
    assert_eq!(h.body["decisions"][0]["signed_with_passkey"], true);
    rig_rt.block_on(rig.web.stop());
}

#[test]
fn an_open_carries_the_named_approvers_passkeys_the_relying_party_and_the_lab_setting() {
    let rig_rt = runtime();
    let mut rig = Rig::new(&rig_rt);
    // The session opened after the web app started: its rp is in the open.
    let open = rig.link.last_open().expect("an open");
    let mut keys: Vec<(String, Vec<u8>, Vec<u8>)> = open
        .people
        .keys
        .iter()
        .map(|k| {
            (
                k.owner.clone(),
                k.credential_id.clone(),
                k.public_key_cose.clone(),
            )
        })
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            (
                "alice".to_owned(),
                rig.alice.auth.credential_id().to_vec(),
                rig.alice.auth.public_key_cose().to_vec()
            ),
            (
                "bob".to_owned(),
                rig.bob.auth.credential_id().to_vec(),
                rig.bob.auth.public_key_cose().to_vec()
            ),
        ]
    );
    assert_eq!(open.people.rp_id, RP_ID);
    assert_eq!(open.people.origin, rig.web.rp.origin());
    assert!(!open.people.lab_approvals);
    // Carol holds a passkey but no rule names her: not listed. The lab
    // setting reaches the next open.
    let _carol = rig.person("carol", Role::Approver);
    rig.env.store.set_lab_approvals(true, "test").unwrap();
    let next = rig
        .env
        .store
        .read(talos_control_stub::people::open::people)
        .unwrap();
    assert!(next.lab_approvals);
    assert!(next.keys.iter().all(|k| k.owner != "carol"), "{next:?}");
    assert_eq!(next.keys.len(), 2);
    // An attempt records whether it opened in lab mode (its certificate
    // shows it): the first did not, one opened now does.
    let first = rig.env.store.read(|tx| tx.attempts(&rig.session)).unwrap();
    assert!(!first[0].lab_approvals);
    let mut life = Lifecycle::new(&mut rig.env.store, rig.link.as_ref(), &ACCEPT);
    life.stop(&rig.session).unwrap();
    let second = life.start(&request(Mode::Commands)).unwrap().session_id;
    assert!(rig.link.last_open().unwrap().people.lab_approvals);
    let attempts = rig.env.store.read(|tx| tx.attempts(&second)).unwrap();
    assert!(attempts[0].lab_approvals);
    rig_rt.block_on(rig.web.stop());
}

// ---- the live stream ---------------------------------------------------------

#[test]
fn a_new_card_reaches_an_open_stream_from_any_replica_and_streams_are_bounded() {
    let rig_rt = runtime();
    let mut rig = Rig::new(&rig_rt);
    let (mut carol, _) = rig.person("carol", Role::Approver);
    let mut alice = rig.signed_in(&rig.alice);
    let (status, stream) = rig_rt.block_on(alice.events());
    assert_eq!(status, 200);
    let mut stream = stream.unwrap();
    let (name, first) = rig_rt
        .block_on(stream.next(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(name, "cards");
    assert_eq!(first["cards"].as_array().unwrap().len(), 0);
    // A card stored by another process (another replica: its own store
    // connection, no hook into this app) appears by the store's poll.
    let mut other_replica = Store::open(rig.env.db()).unwrap();
    let p = proposal(&rig.session, &rig.rule, 1);
    relay::receive(&mut other_replica, &msg(&p)).unwrap();
    let (name, next) = rig_rt
        .block_on(stream.next(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(name, "cards");
    assert_eq!(next["cards"][0]["id"], p.proposal_id.as_str());
    // Carol's stream never got it (she is not named).
    let (_, mut carol_stream) = rig_rt.block_on(carol.events());
    let (_, hers) = rig_rt
        .block_on(carol_stream.as_mut().unwrap().next(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(hers["cards"].as_array().unwrap().len(), 0);

    // At most four streams per person.
    let mut held = Vec::new();
    for _ in 0..3 {
        let (status, s) = rig_rt.block_on(alice.events());
        assert_eq!(status, 200);
        held.push(s.unwrap());
    }
    let (status, _) = rig_rt.block_on(alice.events());
    assert_eq!(status, 429);
    // Signed out, the streams end with signed_out.
    let mut last = held.pop().unwrap();
    let _ = rig_rt.block_on(last.next(Duration::from_secs(5)));
    assert_eq!(
        rig_rt
            .block_on(alice.post("/api/sign-out", serde_json::json!({})))
            .status,
        200
    );
    relay::receive(
        &mut other_replica,
        &msg(&proposal(&rig.session, &rig.rule, 2)),
    )
    .unwrap();
    let mut ended = false;
    while let Some((name, _)) = rig_rt.block_on(last.next(Duration::from_secs(10))) {
        if name == "signed_out" {
            ended = true;
            break;
        }
    }
    assert!(ended, "the stream did not say the session ended");
    rig_rt.block_on(rig.web.stop());
}

// ---- sessions and Revoke All --------------------------------------------------

/// The API route (`POST /v1/sandboxes/{id}/revoke-all`) with a browser
/// session: no identity 401, an approver 403, no CSRF token 403; an
/// operator's passkey over the nonce from `/v1/…/begin` revokes, recorded
/// `verified_by: passkey`; asked again, 409. (Client certificates: the
/// end-to-end `tests/tests/revoke_api.rs`, with curl.)
#[test]
fn the_api_route_takes_an_operators_passkey_session_and_refuses_the_rest() {
    let rig_rt = runtime();
    let mut rig = Rig::new(&rig_rt);
    let (mut op, op_key) = rig.person("olga", Role::Operator);
    let (mut carol, _) = rig.person("carol", Role::Approver);
    let id = rig.session.clone();
    let begin = format!("/v1/sandboxes/{id}/revoke-all/begin");
    let revoke = format!("/v1/sandboxes/{id}/revoke-all");

    let mut nobody = rig.web.client();
    let a = rig_rt.block_on(nobody.post(&revoke, serde_json::json!({})));
    assert_eq!((a.status, a.code()), (401, "no_identity"), "{}", a.text);
    let a = rig_rt.block_on(carol.post(&revoke, serde_json::json!({})));
    assert_eq!((a.status, a.code()), (403, "not_permitted"), "{}", a.text);
    let mut no_csrf = op.clone();
    no_csrf.csrf = None;
    let a = rig_rt.block_on(no_csrf.post(&revoke, serde_json::json!({})));
    assert_eq!((a.status, a.code()), (403, "csrf_refused"), "{}", a.text);

    let n = rig_rt.block_on(op.post(&begin, serde_json::json!({})));
    assert_eq!(n.status, 200, "{}", n.text);
    let challenge = b64d(&n.body["publicKey"]["challenge"]);
    let a = rig_rt.block_on(op.post(
        &revoke,
        serde_json::json!({"nonce": n.body["nonce"], "credential": op_key.sign(&rig.web.rp, &challenge)}),
    ));
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.body["verified_by"], "passkey");
    assert_eq!(a.body["requested_by"], "olga");
    let status = talos_control_stub::lifecycle::status(&rig.env.store, &id).unwrap();
    let last = status.commands.last().unwrap();
    assert_eq!(last.event, "revoke_all");
    let signed = last.by.assertion().expect("her assertion");
    assert_eq!(signed.nonce.as_deref(), n.body["nonce"].as_str());
    assert_eq!(signed.alg.as_deref(), Some("ES256"));
    assert!(signed.public_key_cose.is_some());

    let n = rig_rt.block_on(op.post(&begin, serde_json::json!({})));
    let challenge = b64d(&n.body["publicKey"]["challenge"]);
    let a = rig_rt.block_on(op.post(
        &revoke,
        serde_json::json!({"nonce": n.body["nonce"], "credential": op_key.sign(&rig.web.rp, &challenge)}),
    ));
    assert_eq!((a.status, a.code()), (409, "sandbox_ended"), "{}", a.text);
    rig_rt.block_on(rig.web.stop());
}

#[test]
fn revoke_all_is_an_operators_signed_over_the_session_and_recorded_verified() {
    let rig_rt = runtime();
    let mut rig = Rig::new(&rig_rt);
    let (mut op, op_key) = rig.person("olga", Role::Operator);
    let (mut carol, carol_key) = rig.person("carol", Role::Approver);
    let id = rig.session.clone();
    let begin = format!("/api/sessions/{id}/revoke-all/begin");
    let revoke = format!("/api/sessions/{id}/revoke-all");

    // An approver may not.
    let a = rig_rt.block_on(carol.post(&begin, serde_json::json!({})));
    assert_eq!((a.status, a.code()), (403, "not_permitted"), "{}", a.text);
    // A nonce for another session does not revoke this one; a nonce is
    // good once.
    let other = Lifecycle::new(&mut rig.env.store, rig.link.as_ref(), &ACCEPT)
        .start(&talos_control_stub::StartRequest::new(
            "acme",
            vec!["10.1.0.9".into()],
            vec!["api.github.com".into()],
            vec![],
            Mode::Commands,
        ))
        .unwrap()
        .session_id;
    let n = rig_rt.block_on(op.post(
        &format!("/api/sessions/{other}/revoke-all/begin"),
        serde_json::json!({}),
    ));
    let challenge = b64d(&n.body["publicKey"]["challenge"]);
    let a = rig_rt.block_on(op
        .post(&revoke, serde_json::json!({"nonce": n.body["nonce"], "credential": op_key.sign(&rig.web.rp, &challenge)})));
    assert_eq!(
        (a.status, a.code()),
        (400, "challenge_invalid"),
        "{}",
        a.text
    );
    let n = rig_rt.block_on(op.post(&begin, serde_json::json!({})));
    assert_eq!(n.status, 200, "{}", n.text);
    assert_eq!(n.body["publicKey"]["userVerification"], "required");
    let nonce = n.body["nonce"].as_str().unwrap().to_owned();
    assert_eq!(nonce.len(), 32);
    let challenge = b64d(&n.body["publicKey"]["challenge"]);
    assert_eq!(
        challenge,
        talos_certs::webauthn::command_challenge("revoke_all", &id, &nonce)
    );
    // Carol's passkey in Olga's session: not hers.
    let a = rig_rt.block_on(op.post(
        &revoke,
        serde_json::json!({"nonce": nonce, "credential": carol_key.sign(&rig.web.rp, &challenge)}),
    ));
    assert_eq!(a.body["reason"], "unknown_credential", "{}", a.text);
    let a = rig_rt.block_on(op.post(
        &revoke,
        serde_json::json!({"nonce": nonce, "credential": op_key.sign(&rig.web.rp, &challenge)}),
    ));
    assert_eq!(
        a.code(),
        "challenge_invalid",
        "the nonce was used up: {}",
        a.text
    );
    let n = rig_rt.block_on(op.post(&begin, serde_json::json!({})));
    let challenge = b64d(&n.body["publicKey"]["challenge"]);
    let a = rig_rt.block_on(op
        .post(&revoke, serde_json::json!({"nonce": n.body["nonce"], "credential": op_key.sign(&rig.web.rp, &challenge)})));
    assert_eq!(a.status, 200, "{}", a.text);
    assert_ne!(a.body["state"], "running");
    assert!(!rig.link.holds(&id), "the gateways still hold the session");
    let status = talos_control_stub::lifecycle::status(&rig.env.store, &id).unwrap();
    let last = status.commands.last().unwrap();
    assert_eq!(last.event, "revoke_all");
    assert_eq!(last.by.requested_by, "olga");
    assert!(last.by.is_verified());
    let signed = last.by.assertion().unwrap();
    assert_eq!(
        signed.credential_id,
        URL_SAFE_NO_PAD.encode(op_key.auth.credential_id())
    );
    assert_eq!(signed.nonce.as_deref(), n.body["nonce"].as_str());
    // The session's page says so.
    let page = rig_rt.block_on(op.get(&format!("/api/sessions/{id}")));
    let commands = page.body["commands"].as_array().unwrap();
    let shown = commands.last().unwrap();
    assert_eq!(
        (shown["event"].as_str(), shown["verified"].as_bool()),
        (Some("revoke_all"), Some(true))
    );
    assert_eq!(page.body["can_revoke"], false);
    rig_rt.block_on(rig.web.stop());
}

#[test]
fn operators_see_every_session_and_approvers_those_of_their_cards() {
    let rig_rt = runtime();
    let mut rig = Rig::new(&rig_rt);
    let (mut op, _) = rig.person("olga", Role::Operator);
    let (mut carol, _) = rig.person("carol", Role::Approver);
    let mut alice = rig.signed_in(&rig.alice);
    let id = rig.session.clone();
    let path = format!("/api/sessions/{id}");
    // Before any card, Alice sees nothing of the session.
    assert_eq!(
        rig_rt.block_on(alice.get(&path)).code(),
        "sandbox_not_found"
    );
    rig.propose(1);
    let page = rig_rt.block_on(alice.get(&path));
    assert_eq!(page.status, 200, "{}", page.text);
    assert_eq!(page.body["session"]["state"], "running");
    assert_eq!(page.body["held"].as_array().unwrap().len(), 1);
    assert_eq!(page.body["held"][0]["yours"], true);
    assert_eq!(page.body["can_revoke"], false);
    assert_eq!(page.body["attempts"][0]["cas"].as_array().unwrap().len(), 2);
    // Carol, never named, does not see it, nor in her list.
    assert_eq!(rig_rt.block_on(carol.get(&path)).status, 404);
    assert!(rig_rt.block_on(carol.get("/api/sessions")).body["sessions"]
        .as_array()
        .unwrap()
        .is_empty());
    // The operator sees it, and may revoke it.
    let page = rig_rt.block_on(op.get(&path));
    assert_eq!(page.body["can_revoke"], true);
    assert_eq!(
        rig_rt.block_on(op.get("/api/sessions")).body["sessions"][0]["id"],
        id.as_str()
    );
    rig_rt.block_on(rig.web.stop());
}

// ---- a card is an attacker's text -------------------------------------------------

#[test]
fn a_hostile_cards_fields_come_as_marked_pieces() {
    let rig_rt = runtime();
    let mut rig = Rig::new(&rig_rt);
    let mut alice = rig.signed_in(&rig.alice);
    // An agent's proposal as a compromised gateway could relay it: the
    // tool name is whatever it says.
    let mut p = proposal(&rig.session, &rig.rule, 1);
    p.kind = ProposalKind::Agent;
    p.destination = String::new();
    p.method = String::new();
    p.path = String::new();
    p.attachments = Vec::new();
    p.tool = "<img src=x onerror=alert(1)>deploy\u{202E}exe.\u{200B}sh p\u{0430}ypal".into();
    p.call_digest = "ab".repeat(48);
    relay::receive(&mut rig.env.store, &msg(&p)).unwrap();
    let cards = rig_rt.block_on(alice.get("/api/cards"));
    let card = &cards.body["cards"][0];
    assert_eq!(
        card["tool"]["escaped"],
        "<img src=x onerror=alert(1)>deploy[U+202E]exe.[U+200B]sh p\u{0430}[U+0430]ypal"
    );
    let pieces = card["tool"]["pieces"].as_array().unwrap();
    assert_eq!(
        pieces[0],
        serde_json::json!({"t": "text", "s": "<img src=x onerror=alert(1)>deploy"})
    );
    assert_eq!(
        pieces[1],
        serde_json::json!({"t": "mark", "cp": "U+202E", "class": "bidi"})
    );
    assert_eq!(pieces[5]["ch"], "\u{0430}");
    let warnings: Vec<&str> = card["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with("tool: a direction-changing character (U+202E)")),
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("invisible character (U+200B)")),
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("several scripts (Latin, Cyrillic)")),
        "{warnings:?}"
    );
    // The sentence carries the same marks.
    assert!(card["sentence"]["escaped"]
        .as_str()
        .unwrap()
        .contains("deploy[U+202E]exe"));
    rig_rt.block_on(rig.web.stop());
}

// ---- people removed ----------------------------------------------------------------

#[test]
fn a_removed_person_is_signed_out_at_once_and_rules_naming_them_are_named() {
    let rig_rt = runtime();
    let mut rig = Rig::new(&rig_rt);
    let link = accounts::enroll(
        &mut rig.env.store,
        "alice",
        Role::Approver,
        rig.web.rp.origin(),
        rig.clock.now(),
    )
    .unwrap();
    let mut alice = rig.web.client();
    // A second device, enrolled with its own link.
    let key = rig_rt.block_on(alice.enrol(&rig.web.rp, &link.link));
    rig_rt.block_on(alice.sign_in(&rig.web.rp, &key));
    assert_eq!(rig_rt.block_on(alice.get("/api/cards")).status, 200);
    let removed = accounts::remove(&mut rig.env.store, "alice").unwrap();
    assert_eq!(removed.what.passkeys, 2);
    assert_eq!(removed.what.web_sessions, 1);
    assert_eq!(removed.rules_naming, [rig.rule.id.clone()]);
    assert!(removed
        .warning
        .unwrap()
        .contains("declined at the end of its time"));
    assert_eq!(
        rig_rt.block_on(alice.get("/api/cards")).code(),
        "not_signed_in"
    );
    // Her passkey signs nobody in.
    let mut again = rig.web.client();
    let a = rig_rt.block_on(again.sign_in(&rig.web.rp, &key));
    assert_eq!(a.body["reason"], "unknown_credential", "{}", a.text);
    // The rule stays, and Bob still decides its cards; a new rule cannot
    // name her.
    assert_eq!(rig.env.store.lock_list().unwrap().len(), 1);
    let e = rig
        .env
        .store
        .lock_add(
            &NewRule::check(
                "*",
                None,
                None,
                None,
                LockMode::EveryRequest,
                &["alice".into()],
            )
            .unwrap(),
        )
        .unwrap_err();
    assert_eq!(e.code(), "approver_not_enrolled");
    assert_eq!(
        accounts::remove(&mut rig.env.store, "alice")
            .unwrap_err()
            .code(),
        "person_not_found"
    );
    rig_rt.block_on(rig.web.stop());
}

// ---- Web Push ------------------------------------------------------------------------

#[test]
fn a_device_subscribes_through_the_app_and_a_new_card_is_pushed_to_it() {
    let rig_rt = runtime();
    let mut env = Env::new().with_policy();
    let endpoint = common::push_endpoint::PushEndpoint::start(&[("alice-phone", &[201])]);
    let mut config = talos_control_stub::people::push::PushConfig::new(
        talos_control_stub::people::push::Contact::parse("mailto:ops@example.com").unwrap(),
    )
    .with_ca_file(&endpoint.ca_file())
    .unwrap();
    config.hosts = talos_control_stub::people::push::Hosts::parse(&["127.0.0.1"]).unwrap();
    let vapid = talos_control_stub::identity::VapidKey::generate().unwrap();
    let public = URL_SAFE_NO_PAD.encode(vapid.public_key());
    let link = Arc::new(FakeLink::default());
    let clock = TestClock::new();
    let mut web = rig_rt.block_on(Web::start_with(
        env.dir.path(),
        &env.db(),
        link.clone(),
        clock.clock(),
        Some((config, vapid)),
    ));
    let enrolment = accounts::enroll(
        &mut env.store,
        "alice",
        Role::Approver,
        web.rp.origin(),
        clock.now(),
    )
    .unwrap();
    let mut alice = web.client();
    let key = rig_rt.block_on(alice.enrol(&web.rp, &enrolment.link));
    rig_rt.block_on(alice.sign_in(&web.rp, &key));
    assert_eq!(
        rig_rt.block_on(alice.get("/api/push")).body["public_key"],
        public.as_str()
    );
    // A subscription as a browser's pushManager gives it (made by the
    // tests' endpoint, which plays the browser's push service).
    let d = endpoint.device("alice-phone");
    let body =
        serde_json::json!({"endpoint": d.endpoint, "keys": {"p256dh": d.p256dh, "auth": d.auth}});
    let mut no_csrf = alice.clone();
    no_csrf.csrf = None;
    assert_eq!(
        rig_rt
            .block_on(no_csrf.post("/api/push/subscribe", body.clone()))
            .code(),
        "csrf_refused"
    );
    let a = rig_rt.block_on(alice.post("/api/push/subscribe", body));
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(
        a.body["origin"],
        format!("https://127.0.0.1:{}", endpoint.port)
    );
    // One outside the hosts push may reach is refused.
    let a = rig_rt.block_on(alice
        .post(
            "/api/push/subscribe",
            serde_json::json!({"endpoint": "https://push.evil.example/x", "keys": {"p256dh": d.p256dh, "auth": d.auth}}),
        ));
    assert_eq!(a.code(), "push_subscription_invalid");

    // A card for alice, stored as the relay stores it, then the hook
    // `serve` gives the relay: one message, holding the card id only.
    common::people::enrol_all(&mut env.store, &["bob"]);
    let rule = env
        .store
        .lock_add(
            &NewRule::check(
                "api.github.com",
                None,
                Some("POST"),
                Some("/repos/"),
                LockMode::EveryRequest,
                &["alice".into(), "bob".into()],
            )
            .unwrap(),
        )
        .unwrap();
    let session = Lifecycle::new(&mut env.store, link.as_ref(), &ACCEPT)
        .start(&request(Mode::Commands))
        .unwrap()
        .session_id;
    let p = proposal(&session, &rule, 1);
    let relay::Received::New(card) = relay::receive(&mut env.store, &msg(&p)).unwrap() else {
        panic!("a new card")
    };
    let hook = web.running.as_ref().unwrap().card_hook();
    hook(&env.store, &card);
    let mut got = Vec::new();
    for _ in 0..300 {
        got = endpoint.received_by("alice-phone");
        if !got.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(got.len(), 1, "{got:?}");
    let payload: serde_json::Value =
        serde_json::from_str(got[0]["payload"].as_str().unwrap()).unwrap();
    assert_eq!(
        payload,
        serde_json::json!({"type": "card_waiting", "card": p.proposal_id})
    );
    rig_rt.block_on(web.stop());
}

// ---- the command line -------------------------------------------------------------

#[test]
fn people_on_the_command_line_and_a_cli_revoke_all_recorded_unverified() {
    let mut env = Env::new().with_policy();
    let verifier = talos_control_stub::FakeVerifier::accepting();
    let link = FakeLink::default();
    let db = env.db();
    let run = |args: &[&str]| {
        let db_arg = db.as_arg();
        let mut argv = vec![
            "control-stub",
            "--db",
            db_arg.to_str().unwrap(),
            "--operator",
            "ops-cli",
        ];
        argv.extend_from_slice(args);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let status = talos_control_stub::cli::main_with(
            argv,
            &link,
            &verifier,
            &mut std::io::empty(),
            &mut out,
            &mut err,
        );
        (
            status,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    };
    let origin = "https://people.talos.test:8443";
    let (status, out, err) = run(&[
        "people",
        "enroll",
        "olga",
        "--role",
        "operator",
        "--web-origin",
        origin,
    ]);
    assert_eq!(status, 0, "{err}");
    let printed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (printed["person"].as_str(), printed["role"].as_str()),
        (Some("olga"), Some("operator"))
    );
    let link_text = printed["link"].as_str().unwrap();
    assert!(link_text.starts_with(&format!("{origin}/enrol#")));
    let token = common::people::token_of(link_text);
    assert_eq!(token.len(), 43);
    let (_, listed, _) = run(&["people", "list"]);
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed[0]["name"], "olga");
    assert_eq!(listed[0]["passkeys"], serde_json::json!([]));
    assert_eq!(listed[0]["enrolments_open"].as_array().unwrap().len(), 1);
    assert!(!listed.to_string().contains(&token));
    for (args, code) in [
        (
            vec![
                "people",
                "enroll",
                "olga",
                "--role",
                "approver",
                "--web-origin",
                origin,
            ],
            "person_role_conflict",
        ),
        (
            vec![
                "people",
                "enroll",
                "olga",
                "--role",
                "operator",
                "--web-origin",
                "http://people.talos.test",
            ],
            "web_config_invalid",
        ),
        (
            vec![
                "people",
                "enroll",
                "ol ga",
                "--role",
                "operator",
                "--web-origin",
                origin,
            ],
            "name_invalid",
        ),
        (vec!["people", "remove", "nobody"], "person_not_found"),
    ] {
        let (status, _, err) = run(&args);
        assert_eq!(status, 2, "{args:?}");
        assert!(
            err.starts_with(&format!("error: {code}: ")),
            "{args:?}: {err}"
        );
    }
    let (status, _, err) = run(&[
        "people",
        "enroll",
        "x",
        "--role",
        "root",
        "--web-origin",
        origin,
    ]);
    assert_eq!(status, 2);
    assert!(err.contains("approver or operator"), "{err}");

    // A Revoke All from the command line names its operator, unverified,
    // and says so.
    let id = Lifecycle::new(&mut env.store, &link, &ACCEPT)
        .start(&request(Mode::Commands))
        .unwrap()
        .session_id;
    drop(env.store);
    let (status, out, err) = run(&["sandbox", "revoke-all", &id]);
    assert_eq!(status, 0, "{err}");
    let printed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(printed["requester"]["requested_by"], "ops-cli");
    assert_eq!(printed["requester"]["verified"], false);
    assert!(printed["requester"]["note"]
        .as_str()
        .unwrap()
        .contains("not verified"));
    let store = Store::open(&db).unwrap();
    let status = talos_control_stub::lifecycle::status(&store, &id).unwrap();
    let last = status.commands.last().unwrap();
    assert_eq!(
        (last.event.as_str(), last.by.is_verified()),
        ("revoke_all", false)
    );
    assert!(last.by.assertion().is_none());

    let (status, out, _) = run(&["people", "remove", "olga"]);
    assert_eq!(status, 0);
    assert!(out.contains("\"removed\": \"olga\""), "{out}");
}
