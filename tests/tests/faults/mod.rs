//! What the fault tests (`faults_*.rs`) share: the pair they break — two
//! `gateway` members (`gw-a`, `gw-b`), `control-stub serve` given both (it
//! renews leases, asks owed closes again, issues certificates), the
//! `control-stub` CLI, a real TLS origin and DNS server on loopback — and
//! the session they start on it. Each test breaks something an operator
//! meets and checks the product's promise: when a session ends its
//! authority is gone everywhere, and its certificate says exactly what
//! happened, once.
//!
//! Leases are short here (`lease_ms` 3000, renewed every 500 ms) so a
//! lapse takes seconds. Every wait is bounded (`talos_e2e::wait`); the one wait on
//! time itself — letting a lease run out — waits for a span measured from
//! the fault, which is not a race. Every process is stopped by its PID.

// Each fault test file is a crate of its own and uses a part of this.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use talos_e2e::clients::curl_status;
use talos_e2e::rig::{Pair, SessionSpec};
use talos_e2e::wait;

pub const API: &str = "api.test";
pub const SECRET: &str = "faults-S3CRET-v4lue-0123456789";
/// The session sources the tests use (one live session each).
pub const SOURCE: &str = "127.0.0.2";
pub const SOURCE_2: &str = "127.0.0.3";

/// Every authority's lease on the members (`[control] lease_ms`).
pub const LEASE: Duration = Duration::from_millis(3000);

/// The pair, `serve` given both members; the egress list holds
/// `api.test`; tenant `acme` has secret `API_TOKEN`.
pub async fn pair() -> Pair {
    pair_with_lease(LEASE).await
}

/// [`pair`] with another lease on the members.
pub async fn pair_with_lease(lease: Duration) -> Pair {
    Pair::builder()
        .lease(lease)
        .renewing()
        .egress(&[API])
        .secret("API_TOKEN", SECRET)
        .start_loopback(&[API])
        .await
}

/// A session from `source` allowed `api.test`, `API_TOKEN` attached.
pub fn session(source: &str) -> SessionSpec {
    SessionSpec::from(source)
        .allow(API)
        .attach("API_TOKEN=api.test:authorization:Bearer")
}

/// `n` GETs `/{tag}/{i}` alternating between the members, one connection
/// each; all must be answered 200.
pub fn traffic(rig: &Pair, source: &str, bundle: &Path, tag: &str, n: usize) {
    for i in 0..n {
        let g = &rig.members[i % rig.members.len()];
        assert_eq!(
            curl_status(source, g.data, bundle, API, &format!("/{tag}/{i}")),
            200,
            "{tag} {i}"
        );
    }
}

/// Wait until member `g`'s least lease left goes up: a renewal came (it
/// only falls between renewals).
pub fn wait_renewal(g: &talos_e2e::gateway::Gateway, what: &str) {
    let mut last: Option<f64> = None;
    wait::until(what, || {
        let now = g.metric("gateway_lease_seconds_left_min");
        let renewed = matches!((last, now), (Some(a), Some(b)) if b > a);
        last = now.or(last);
        if renewed {
            Ok(())
        } else {
            Err(now)
        }
    });
}
