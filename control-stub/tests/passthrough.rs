//! Passthrough destinations in the account's policy: the model route
//! marked from the start, the names each open carries to the gateways, and
//! the refusals that keep an attachment or a Lock rule off a destination
//! the gateway never terminates.

mod common;

use common::{request, Env};
use talos_control_stub::lock::NewRule;
use talos_control_stub::model::LockMode;
use talos_control_stub::{Mode, StartRequest, State};

const MODEL: [&str; 3] = ["api.anthropic.com", "claude.ai", "console.anthropic.com"];

fn rule(destination: &str) -> NewRule {
    NewRule::check(
        destination,
        None,
        Some("POST"),
        None,
        LockMode::EveryRequest,
        &["alice".into()],
    )
    .unwrap()
}

fn start_allowing(allow: &[&str], attach: &[&str]) -> StartRequest {
    StartRequest::new(
        "acme",
        vec!["10.1.0.9".into()],
        allow.iter().map(|s| (*s).to_owned()).collect(),
        attach.iter().map(|s| (*s).to_owned()).collect(),
        Mode::Commands,
    )
}

#[test]
fn the_model_route_is_passthrough_from_the_start_and_each_open_carries_its_listed_names() {
    let mut env = Env::new().with_policy();
    assert_eq!(env.store.passthrough_list().unwrap(), MODEL);
    for name in MODEL {
        env.store.egress_add(name).unwrap();
    }
    // The operator adds one; a name given in another case is the same.
    assert_eq!(env.store.passthrough_add("PyPI.org.").unwrap(), "pypi.org");
    let req = start_allowing(
        &["api.github.com", "claude.ai", "pypi.org"],
        &["GH=api.github.com:authorization:Bearer"],
    );
    let t = env.life().start(&req).unwrap();
    assert_eq!(t.state, State::Running);
    let open = env.link.last_open().unwrap();
    assert_eq!(open.allowlist, ["api.github.com", "claude.ai", "pypi.org"]);
    assert_eq!(
        open.passthrough,
        ["claude.ai", "pypi.org"],
        "the listed names marked passthrough, no other"
    );
    let status = env.life().status(&t.session_id).unwrap();
    assert_eq!(
        status.attempts[0].attempt.passthrough,
        ["claude.ai", "pypi.org"]
    );

    // Removed, a name is terminated again from the next open.
    assert_eq!(
        env.store.passthrough_remove("pypi.org").unwrap(),
        "pypi.org"
    );
    let e = env.store.passthrough_remove("pypi.org").unwrap_err();
    assert_eq!(e.code(), "passthrough_not_found");
    env.life().pause(&t.session_id).unwrap();
    env.life().resume(&t.session_id).unwrap();
    assert_eq!(env.link.last_open().unwrap().passthrough, ["claude.ai"]);
}

#[test]
fn a_lock_rule_naming_a_passthrough_destination_is_refused_naming_it() {
    let mut env = Env::new().with_policy();
    common::people::enrol_all(&mut env.store, &["alice"]);
    let e = env.store.lock_add(&rule("api.anthropic.com")).unwrap_err();
    assert_eq!(e.code(), "passthrough_conflict");
    let text = e.to_string();
    assert!(
        text.starts_with("api.anthropic.com is passthrough"),
        "{text}"
    );
    assert!(text.contains("no Lock rule"), "{text}");
    assert!(env.store.lock_list().unwrap().is_empty());
    // A rule for any destination reaches the terminated ones only: taken,
    // and a session listing a passthrough name still starts.
    env.store.lock_add(&rule("*")).unwrap();
    env.store.egress_add("claude.ai").unwrap();
    let req = start_allowing(&["api.github.com", "claude.ai"], &[]);
    assert_eq!(env.life().start(&req).unwrap().state, State::Running);
}

#[test]
fn marking_a_destination_a_rule_names_or_a_live_session_attaches_to_is_refused() {
    let mut env = Env::new().with_policy();
    common::people::enrol_all(&mut env.store, &["alice"]);
    let added = env.store.lock_add(&rule("pypi.org")).unwrap();
    let e = env.store.passthrough_add("pypi.org").unwrap_err();
    assert_eq!(e.code(), "passthrough_conflict");
    assert!(
        e.to_string().contains(&format!("Lock rule {}", added.id)),
        "{e}"
    );
    env.store.lock_remove(&added.id).unwrap();
    env.store.passthrough_add("pypi.org").unwrap();

    // A session (paused, not over) attaches GH to api.github.com.
    let id = env.start(Mode::Commands).session_id;
    env.life().pause(&id).unwrap();
    let e = env.store.passthrough_add("api.github.com").unwrap_err();
    assert_eq!(e.code(), "passthrough_conflict");
    let text = e.to_string();
    assert!(
        text.contains(&format!("session {id}")) && text.contains("secret GH"),
        "{text}"
    );
    assert!(!env
        .store
        .passthrough_list()
        .unwrap()
        .contains(&"api.github.com".to_owned()));
    // Once it has ended, the mark is taken.
    env.life().stop(&id).unwrap();
    env.store.passthrough_add("api.github.com").unwrap();
}

#[test]
fn a_start_attaching_a_credential_to_a_passthrough_destination_is_refused_naming_it() {
    let mut env = Env::new().with_policy();
    env.store.egress_add("api.anthropic.com").unwrap();
    let req = start_allowing(
        &["api.github.com", "api.anthropic.com"],
        &["GH=api.anthropic.com:x-api-key"],
    );
    let e = env.life().start(&req).unwrap_err();
    assert_eq!(e.code(), "passthrough_conflict");
    let text = e.to_string();
    assert!(
        text.starts_with("api.anthropic.com is passthrough") && text.contains("attachment GH"),
        "{text}"
    );
    // Nothing was committed or asked of the gateways.
    assert!(env.link.last_open().is_none());
    let ok = request(Mode::Commands);
    assert_eq!(env.life().start(&ok).unwrap().state, State::Running);
}

/// A CA certificate standing in for a public root (tests reach no real
/// one): (PEM, DER).
fn stand_in_root(name: &str) -> (String, Vec<u8>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), cert.der().to_vec())
}

/// The DER of every certificate in a PEM bundle, in order.
fn ders(bundle: &str) -> Vec<Vec<u8>> {
    rustls_pemfile::certs(&mut bundle.as_bytes())
        .map(|c| c.unwrap().to_vec())
        .collect()
}

#[test]
fn the_trust_bundle_is_the_session_cas_and_the_public_roots_only_while_the_attempt_lists_a_passthrough_name(
) {
    let mut env = Env::new().with_policy();
    env.store.egress_add("claude.ai").unwrap();
    let (root_a, der_a) = stand_in_root("public root stand-in A");
    let (root_b, der_b) = stand_in_root("public root stand-in B");
    // A bundle file as distributions write them: comments between the
    // certificates, which the session's bundle does not carry on.
    let roots = env.dir.path().join("roots.pem");
    std::fs::write(&roots, format!("# A\n{root_a}\n# B\n{root_b}")).unwrap();
    let missing = env.dir.path().join("no-such-roots.pem");

    // No passthrough name: the session CAs alone, exactly as before, and
    // the roots file is not even read.
    let plain = env.life().start(&request(Mode::Commands)).unwrap();
    let trust = env.life().trust(&plain.session_id).unwrap();
    assert!(trust.passthrough.is_empty());
    assert_eq!(trust.cas.len(), 2, "one CA per member");
    let alone = trust.cas.concat().trim_end().to_owned();
    assert_eq!(trust.bundle(Some(&missing)).unwrap(), alone);
    assert_eq!(trust.bundle(Some(&roots)).unwrap(), alone);

    // A passthrough name: the CAs first, then every root, re-encoded.
    let req = start_allowing(&["api.github.com", "claude.ai"], &[]);
    let t = env.life().start(&req).unwrap();
    let trust = env.life().trust(&t.session_id).unwrap();
    assert_eq!(trust.passthrough, ["claude.ai"]);
    let bundle = trust.bundle(Some(&roots)).unwrap();
    let mut want = ders(&trust.cas.concat());
    want.extend([der_a.clone(), der_b.clone()]);
    assert_eq!(ders(&bundle), want);
    assert!(!bundle.contains('#'), "{bundle}");
    assert!(bundle.starts_with(trust.cas[0].trim_end()), "{bundle}");

    // Without --public-roots: the first system bundle there is.
    let none = env.dir.path().join("none.pem");
    let got = trust
        .bundle_from(None, &[none.as_path(), roots.as_path()])
        .unwrap();
    assert_eq!(got, bundle);
    let e = trust.bundle_from(None, &[none.as_path()]).unwrap_err();
    assert_eq!(e.code(), "io_failed");
    assert!(e.to_string().contains("--public-roots"), "{e}");

    // A roots file that is none is refused, saying why.
    let e = trust.bundle(Some(&missing)).unwrap_err();
    assert_eq!(e.code(), "io_failed");
    assert!(e.to_string().contains("no-such-roots.pem"), "{e}");
    let key = rcgen::KeyPair::generate().unwrap().serialize_pem();
    let garbage = "-----BEGIN CERTIFICATE-----\nAAECAwQFBgcICQ==\n-----END CERTIFICATE-----\n";
    for (text, says) in [
        (String::new(), "holds no PEM certificate"),
        ("just text\n".into(), "holds no PEM certificate"),
        (format!("{root_a}{key}"), "holds a private key"),
        (garbage.to_owned(), "certificate 1 does not parse"),
        (
            format!(
                "{root_a}-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n"
            ),
            "not PEM",
        ),
    ] {
        let bad = env.dir.path().join("bad.pem");
        std::fs::write(&bad, &text).unwrap();
        let e = trust.bundle(Some(&bad)).unwrap_err();
        assert_eq!(e.code(), "public_roots_invalid", "{text:?}: {e}");
        assert!(e.to_string().contains(says), "{text:?}: {e}");
        assert!(!e.to_string().contains("PRIVATE KEY"), "{e}");
    }

    // Unmarked, the name is terminated from the next attempt on: the
    // session CAs alone again.
    env.store.passthrough_remove("claude.ai").unwrap();
    env.life().pause(&t.session_id).unwrap();
    env.life().resume(&t.session_id).unwrap();
    let trust = env.life().trust(&t.session_id).unwrap();
    assert!(trust.passthrough.is_empty());
    assert_eq!(
        trust.bundle(Some(&roots)).unwrap(),
        trust.cas.concat().trim_end()
    );
}
