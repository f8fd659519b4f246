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
