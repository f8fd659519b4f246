//! Fuzzes the request-path canonicaliser the Lock judges with
//! (`talos_contract::path`): any text as a path.
//!
//! Checks: the canonical form equals the independent reference
//! normaliser's, is a fixed point, starts with `/` (for a path that does),
//! and holds no dot segment and no empty segment but the last; the routing
//! key equals its reference, reads the canonical path as it reads the path
//! sent, and has its segments settled and its letters in lower case; a path hyper would accept still forms a
//! request once canonical (what the gateway forwards); and a Lock rule
//! whose prefix is the path holds a request for the path.

#![no_main]

use libfuzzer_sys::fuzz_target;
use talos_contract::lock::{LockRule, RuleDraft};
use talos_contract::name;
use talos_contract::path::{
    canonical, reference_canonical, reference_routing_key, routing_key, RoutedPath,
};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let c = canonical(text);
    assert_eq!(*c, reference_canonical(text), "canonical({text:?})");
    assert_eq!(canonical(&c), c, "a fixed point");
    let key = routing_key(text);
    assert_eq!(key, reference_routing_key(text), "routing_key({text:?})");
    assert_eq!(key, routing_key(&c));
    // Decoded once: segments settled, letters lower case (not a fixed
    // point: `%252e` reads as `%2e`, which another reading would decode).
    let inner = key.strip_suffix('/').unwrap_or(&key);
    if key.starts_with('/') {
        for segment in inner.split('/').skip(1) {
            assert!(!matches!(segment, "" | "." | ".."), "{key:?}");
        }
    }
    assert!(!key.bytes().any(|b| b.is_ascii_uppercase()));
    if !text.starts_with('/') {
        assert_eq!(*c, *text, "only paths are rewritten");
        return;
    }
    assert!(c.starts_with('/'));
    let inner = c.strip_suffix('/').unwrap_or(&c);
    for segment in inner.split('/').skip(1) {
        assert!(!matches!(segment, "" | "." | ".."), "{c:?}");
    }
    // What the gateway forwards: a path hyper accepts stays one.
    if let Ok(uri) = text.parse::<hyper::Uri>() {
        if uri.path() == text {
            assert!(
                hyper::http::uri::PathAndQuery::try_from(&*c).is_ok(),
                "{text:?} -> {c:?}"
            );
        }
    }
    // A rule for exactly this path holds it, in any of its spellings.
    let approvers = ["a".to_owned()];
    let rule = LockRule::check(&RuleDraft {
        id: "r",
        destination: "*",
        attachment: "",
        method: "POST",
        path_prefix: text,
        mode: "every_request",
        approvers: &approvers,
    });
    if let Ok(rule) = rule {
        let dest = name::canonicalize("x.example").expect("name");
        assert!(rule.matches(&dest, "post", &RoutedPath::new(text), &[]));
        assert!(rule.matches(&dest, "POST", &RoutedPath::new(&c), &[]));
    }
});
