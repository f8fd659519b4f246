//! The leaf cache mints each name once, however many ask at once, refuses
//! names outside the allowlist without storing them, and lets go of every
//! leaf when dropped.

use std::sync::{Arc, Barrier};
use std::thread;

use talos_certs::{CaParams, CertError, LeafCache, SessionCa, APPROVALS_NAME};

fn cache(names: &[&str]) -> LeafCache {
    LeafCache::new(
        SessionCa::new(&CaParams::new("sess-1", 1, "gw-a", names.iter().copied())).unwrap(),
    )
}

#[test]
fn concurrent_first_uses_mint_once() {
    const THREADS: usize = 16;
    let cache = cache(&["api.example.com", "github.com"]);
    let start = Barrier::new(THREADS);
    let leaves: Vec<_> = thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                scope.spawn(|| {
                    start.wait();
                    cache.get_or_mint("api.example.com").unwrap()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    assert_eq!(cache.minted(), 1);
    assert_eq!(cache.cached(), 1);
    assert!(leaves.iter().all(|leaf| Arc::ptr_eq(leaf, &leaves[0])));

    // Later uses are hits; another name is its own mint.
    assert!(Arc::ptr_eq(
        &cache.get_or_mint("api.example.com").unwrap(),
        &leaves[0]
    ));
    let other = cache.get_or_mint("github.com").unwrap();
    assert!(!Arc::ptr_eq(&other, &leaves[0]));
    assert_eq!(cache.minted(), 2);
}

#[test]
fn names_outside_the_allowlist_are_refused_and_not_cached() {
    let cache = cache(&["api.example.com"]);
    for name in ["evil.com", "sub.api.example.com", "example.com"] {
        let error = cache.get_or_mint(name).unwrap_err();
        assert!(
            matches!(&error, CertError::NotPermitted { name: got } if got == name),
            "{error:?}"
        );
    }
    for name in ["*.api.example.com", "API.EXAMPLE.COM", "10.0.0.1", ""] {
        assert!(matches!(
            cache.get_or_mint(name),
            Err(CertError::NotAHostName { .. })
        ));
    }
    assert_eq!(cache.minted(), 0);
    assert_eq!(cache.cached(), 0);

    // Every permitted name fills its one slot; asking again adds nothing.
    for _ in 0..2 {
        cache.get_or_mint("api.example.com").unwrap();
        cache.get_or_mint(APPROVALS_NAME).unwrap();
    }
    assert_eq!(cache.minted(), cache.ca().names().len());
    assert_eq!(cache.cached(), 2);
}

#[test]
fn nested_names_are_cached_with_their_own_intermediate() {
    let cache = cache(&["crates.io", "static.crates.io"]);
    let outer = cache.get_or_mint("crates.io").unwrap();
    let inner = cache.get_or_mint("static.crates.io").unwrap();
    assert_eq!(outer.cert[1], *cache.ca().intermediate_der(0).unwrap());
    assert_eq!(inner.cert[1], *cache.ca().intermediate_der(1).unwrap());
    assert!(Arc::ptr_eq(
        &inner,
        &cache.get_or_mint("static.crates.io").unwrap()
    ));
    assert!(matches!(
        cache.get_or_mint("x.crates.io"),
        Err(CertError::NotPermitted { .. })
    ));
    assert_eq!(cache.minted(), 2);
}

#[test]
fn dropping_the_cache_drops_every_leaf() {
    let cache = cache(&["api.example.com", "github.com"]);
    let leaves: Vec<_> = ["api.example.com", "github.com", APPROVALS_NAME]
        .iter()
        .map(|name| Arc::downgrade(&cache.get_or_mint(name).unwrap()))
        .collect();
    assert!(leaves.iter().all(|leaf| leaf.upgrade().is_some()));
    drop(cache);
    assert!(leaves.iter().all(|leaf| leaf.upgrade().is_none()));
}

#[test]
fn usable_from_async_tasks_across_threads() {
    // The cache is shared by reference between connection tasks.
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<LeafCache>();
    assert_send_sync::<SessionCa>();
    assert_send_sync::<talos_certs::Leaf>();
}
