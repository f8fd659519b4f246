//! A session's CA together with the leaves it has minted, one per name.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rustls::sign::CertifiedKey;
use talos_contract::sync::Locked;

use crate::ca::SessionCa;
use crate::error::CertError;
use crate::names::check_host_name;

/// A session's authority: its [`SessionCa`] and the leaves it signed, one
/// per name, minted on first use and then reused.
///
/// The cache owns the CA, so the gateway keeps one `LeafCache` per session
/// and drops it on pause, interruption or end: that drops the
/// intermediates' keys (the root's is gone already) and every cached leaf
/// key. (A leaf already handed to a connection lives
/// until that connection lets go of its `Arc`.)
///
/// Concurrent first uses of one name mint once: the first caller mints
/// while the others wait for it on that name's lock, then all get the same
/// `Arc`. Uses of other names, and every use after the first, do not wait.
/// The API is synchronous: minting takes tens of microseconds of CPU (see
/// `benches/benches/certs.rs`) and no lock is held across an `.await`, so
/// async code calls it directly.
///
/// # Limits
///
/// One slot per name the CA permits, made up front: a name outside the
/// allowlist is refused without touching the cache, so the cache holds at
/// most `ca.names().len()` leaves (about 1 KiB of certificate each, plus
/// the key inside aws-lc), whatever names a session tries.
pub struct LeafCache {
    ca: SessionCa,
    // invariant: exactly one slot per name in `ca.names()`, fixed at
    // construction; nothing is ever inserted or removed.
    slots: HashMap<String, Slot>,
    /// Leaves minted so far (successful mints only).
    minted: AtomicUsize,
}

/// One name's leaf, once minted.
#[derive(Default)]
struct Slot {
    leaf: OnceLock<Arc<CertifiedKey>>,
    /// Held by the caller minting this name, so that concurrent first uses
    /// mint once; a failed mint leaves the slot empty for the next caller.
    minting: Mutex<()>,
}

impl LeafCache {
    /// A cache for `ca`'s names, empty until the first use of each.
    pub fn new(ca: SessionCa) -> LeafCache {
        let slots = ca
            .names()
            .iter()
            .map(|name| (name.clone(), Slot::default()))
            .collect();
        LeafCache {
            ca,
            slots,
            minted: AtomicUsize::new(0),
        }
    }

    /// The session's CA.
    pub fn ca(&self) -> &SessionCa {
        &self.ca
    }

    /// The chain (`[leaf, intermediate of the name's level]`) and key for
    /// `name`: the cached leaf, or a fresh one minted now (once, however
    /// many callers ask at the same time).
    ///
    /// Refuses a name that is not a host name, or not one the CA permits,
    /// without storing anything.
    pub fn get_or_mint(&self, name: &str) -> Result<Arc<CertifiedKey>, CertError> {
        let Some(slot) = self.slots.get(name) else {
            check_host_name(name)?;
            return Err(CertError::NotPermitted {
                name: name.to_owned(),
            });
        };
        if let Some(leaf) = slot.leaf.get() {
            return Ok(Arc::clone(leaf));
        }

        // The guarded data is `()`: a panic while minting leaves nothing
        // half-written, so a poisoned lock is as good as a clean one.
        let _minting = slot.minting.locked();
        if let Some(leaf) = slot.leaf.get() {
            return Ok(Arc::clone(leaf));
        }
        let leaf = self.ca.mint_leaf(name)?.into_certified_key();
        self.minted.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::clone(slot.leaf.get_or_init(|| leaf)))
    }

    /// How many leaves this cache has minted. Each name is minted at most
    /// once, so this never exceeds `ca().names().len()`.
    pub fn minted(&self) -> usize {
        self.minted.load(Ordering::Relaxed)
    }

    /// How many leaves are cached now.
    pub fn cached(&self) -> usize {
        self.slots
            .values()
            .filter(|slot| slot.leaf.get().is_some())
            .count()
    }
}

impl fmt::Debug for LeafCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeafCache")
            .field("ca", &self.ca)
            .field("cached", &self.cached())
            .field("minted", &self.minted())
            .finish()
    }
}
