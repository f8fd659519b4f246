//! Sessions, named by the source address of their connections.
//!
//! The session's subnet routes all of its traffic to the gateway, so the
//! source address of a connection says which session it belongs to. An
//! address that is no session's is refused `unknown_source`.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use crate::config::{canonical_ip, StaticSession};
use crate::name::Name;

/// What the gateway knows of one session's current authority.
#[derive(Debug)]
pub struct Session {
    /// The session id, as the control plane names it.
    pub id: Arc<str>,
    /// The tenant the session serves.
    pub tenant: Arc<str>,
    /// The attempt number: 1 at start, one more at each resume or recovery.
    pub attempt: u32,
    /// Canonical destination names the session may reach, exactly.
    pub allowlist: HashSet<Name>,
}

impl Session {
    /// Whether `name` (canonical) is exactly on the allowlist.
    pub fn allows(&self, name: &Name) -> bool {
        self.allowlist.contains(name)
    }
}

impl From<&StaticSession> for Session {
    fn from(s: &StaticSession) -> Self {
        Session {
            id: Arc::from(s.id.get_ref().as_str()),
            tenant: Arc::from(s.tenant.as_str()),
            attempt: s.attempt,
            allowlist: s.allowlist.iter().map(|n| n.get_ref().clone()).collect(),
        }
    }
}

/// Every open session, by source address.
///
/// Reads (one per connection) far outnumber writes (one per session event),
/// so a read-write lock over a map is enough; the lock is never held across
/// an await.
#[derive(Debug, Default)]
pub struct Sessions {
    // invariant: keys are canonical (IPv4-mapped IPv6 stored as IPv4).
    by_source: RwLock<HashMap<IpAddr, Arc<Session>>>,
}

impl Sessions {
    /// A table holding the config file's static sessions.
    pub fn from_static(sessions: &[StaticSession]) -> Sessions {
        let table = Sessions::default();
        for s in sessions {
            let sources: Vec<IpAddr> = s.sources.get_ref().iter().map(|a| *a.get_ref()).collect();
            table.insert(&sources, Arc::new(Session::from(s)));
        }
        table
    }

    /// Map each of `sources` to `session`, replacing whatever was there.
    pub fn insert(&self, sources: &[IpAddr], session: Arc<Session>) {
        let mut map = self.by_source.write().unwrap_or_else(|p| p.into_inner());
        for ip in sources {
            map.insert(canonical_ip(*ip), Arc::clone(&session));
        }
    }

    /// The session whose source address is `ip`.
    pub fn by_source(&self, ip: IpAddr) -> Option<Arc<Session>> {
        let map = self.by_source.read().unwrap_or_else(|p| p.into_inner());
        map.get(&canonical_ip(ip)).cloned()
    }

    /// How many source addresses are mapped.
    pub fn len(&self) -> usize {
        self.by_source
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Whether no session is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
