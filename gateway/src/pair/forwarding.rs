//! The forwarding table: which live sessions other members hold and this
//! one does not, by source address, as the control plane last said
//! (`RenewLeasesRequest.forwarding`).
//!
//! Each renewal replaces the table whole. An entry lapses `lease` after it
//! was given unless given again, so a member cut off from the control
//! plane forwards for an ended session no longer than a lease. An entry
//! only ever sends a connection to a holder, which judges it exactly as a
//! direct one: a stale entry can cause a refusal there, never a
//! connection served under an authority that ended.
//!
//! Each session's connections forwarded at once are bounded
//! (`[pair] max_forwarded_per_session`), so one session cannot fill the
//! link; the bound's count follows the session across replacements of the
//! table.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::refusal::causes;
use talos_contract::sync::RwLocked;

causes! {
    /// What became of a connection this member tried to forward: the
    /// `result` label of `gateway_forwarded_total`.
    pub enum ForwardResult {
        /// Handed to a holder over the member link.
        Forwarded => "forwarded",
        /// No holder could be reached (`upstream_failed`, cause
        /// `holder_unreachable`).
        HolderUnreachable => "holder_unreachable",
        /// The session had `max_forwarded_per_session` forwarded already
        /// (`session_limit`, cause `forwarded_connections`).
        SessionLimit => "session_limit",
    }
}

impl ForwardResult {
    /// Count one.
    pub fn count(self) {
        metrics::counter!("gateway_forwarded_total", "result" => self.as_str()).increment(1);
    }
}

/// One session another member holds.
#[derive(Debug)]
pub struct Entry {
    pub session_id: Arc<str>,
    pub attempt: u32,
    pub tenant: Arc<str>,
    /// The members that hold it, in the order to try them.
    pub holders: Vec<Arc<str>>,
    /// When the entry lapses unless given again.
    until: Instant,
    /// The session's connections forwarded now.
    open: Arc<AtomicUsize>,
}

impl Entry {
    /// Whether the entry still stands at `now`.
    pub fn live_at(&self, now: Instant) -> bool {
        now < self.until
    }
}

/// A forwarded connection's place in its session's bound; given back on
/// drop.
#[derive(Debug)]
pub struct Forwarded(Arc<AtomicUsize>);

impl Drop for Forwarded {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why an entry the control plane gave was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum EntryError {
    /// A session id or tenant that is no id, or an attempt of 0.
    BadSession,
    /// A source that is no IP address.
    BadSource,
    /// No holder this member is configured to reach.
    NoKnownHolder,
}

impl std::fmt::Display for EntryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EntryError::BadSession => "bad_session",
            EntryError::BadSource => "bad_source",
            EntryError::NoKnownHolder => "no_known_holder",
        })
    }
}

/// An entry as the control plane gives it.
#[derive(Debug, Clone)]
pub struct Given {
    pub session_id: String,
    pub attempt: u32,
    pub tenant: String,
    pub sources: Vec<String>,
    pub holders: Vec<String>,
}

/// The table.
#[derive(Debug)]
pub struct Forwarding {
    by_source: std::sync::RwLock<HashMap<IpAddr, Arc<Entry>>>,
    /// The peers this member may forward to (its `[pair] peers`).
    peers: Vec<Arc<str>>,
    max_per_session: usize,
}

impl Forwarding {
    pub fn new(peers: Vec<Arc<str>>, max_per_session: usize) -> Forwarding {
        Forwarding {
            by_source: Default::default(),
            peers,
            max_per_session,
        }
    }

    /// Replace the table with `given`, each entry standing for `lease`
    /// from `now`. Returns how many entries were taken; each one not taken
    /// is logged with its session and why.
    pub fn replace(&self, given: &[Given], lease: Duration, now: Instant) -> usize {
        let until = now + lease;
        let mut table = HashMap::new();
        let old = self.by_source.read_locked().clone();
        let mut taken = 0;
        let mut sessions = 0;
        for g in given {
            match self.entry(g, until, &old) {
                Ok((entry, sources)) => {
                    taken += 1;
                    sessions += 1;
                    for s in sources {
                        table.insert(s, Arc::clone(&entry));
                    }
                }
                Err(e) => {
                    tracing::warn!(session = %g.session_id, attempt = g.attempt, cause = %e, "forwarding entry not taken");
                }
            }
        }
        let changed = table.len() != old.len()
            || table
                .iter()
                .any(|(s, e)| old.get(s).is_none_or(|o| o.session_id != e.session_id));
        *self.by_source.write_locked() = table;
        metrics::gauge!("gateway_forwarding_sessions").set(sessions as f64);
        if changed {
            tracing::info!(sessions, "forwarding table changed");
        }
        taken
    }

    fn entry(
        &self,
        g: &Given,
        until: Instant,
        old: &HashMap<IpAddr, Arc<Entry>>,
    ) -> Result<(Arc<Entry>, Vec<IpAddr>), EntryError> {
        if !talos_contract::id::is_id(&g.session_id)
            || g.session_id.len() > super::proxy::MAX_SESSION_ID
            || !talos_contract::id::is_id(&g.tenant)
            || g.attempt == 0
        {
            return Err(EntryError::BadSession);
        }
        let sources = g
            .sources
            .iter()
            .map(|s| s.parse::<IpAddr>().map_err(|_| EntryError::BadSource))
            .collect::<Result<Vec<_>, _>>()?;
        if sources.is_empty() {
            return Err(EntryError::BadSource);
        }
        let holders: Vec<Arc<str>> = g
            .holders
            .iter()
            .filter_map(|h| self.peers.iter().find(|p| ***p == **h).cloned())
            .collect();
        if holders.is_empty() {
            return Err(EntryError::NoKnownHolder);
        }
        // The session's count of forwarded connections carries over.
        let open = sources
            .iter()
            .find_map(|s| old.get(s).filter(|e| *e.session_id == *g.session_id))
            .map_or_else(Default::default, |e| Arc::clone(&e.open));
        Ok((
            Arc::new(Entry {
                session_id: Arc::from(g.session_id.as_str()),
                attempt: g.attempt,
                tenant: Arc::from(g.tenant.as_str()),
                holders,
                until,
                open,
            }),
            sources,
        ))
    }

    /// The entry for `source`, if one stands at `now`.
    pub fn lookup(&self, source: IpAddr, now: Instant) -> Option<Arc<Entry>> {
        let table = self.by_source.read_locked();
        let entry = table.get(&source)?;
        entry.live_at(now).then(|| Arc::clone(entry))
    }

    /// A place for one more of `entry`'s session's connections, unless
    /// the session is at its bound.
    pub fn admit(&self, entry: &Entry) -> Option<Forwarded> {
        let open = &entry.open;
        let mut n = open.load(Ordering::Relaxed);
        loop {
            if n >= self.max_per_session {
                return None;
            }
            match open.compare_exchange_weak(n, n + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(Forwarded(Arc::clone(open))),
                Err(now) => n = now,
            }
        }
    }

    /// How many sessions the table holds now (lapsed entries included).
    pub fn sessions(&self) -> usize {
        let table = self.by_source.read_locked();
        let mut ids: Vec<&str> = table.values().map(|e| &*e.session_id).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given(id: &str, sources: &[&str], holders: &[&str]) -> Given {
        Given {
            session_id: id.into(),
            attempt: 1,
            tenant: "t1".into(),
            sources: sources.iter().map(|s| (*s).into()).collect(),
            holders: holders.iter().map(|s| (*s).into()).collect(),
        }
    }

    fn table() -> Forwarding {
        Forwarding::new(vec![Arc::from("gw-b")], 2)
    }

    #[test]
    fn entries_stand_for_their_lease_and_are_replaced_whole() {
        let t = table();
        let now = Instant::now();
        let lease = Duration::from_secs(60);
        assert_eq!(
            t.replace(&[given("s1", &["10.0.0.1"], &["gw-b"])], lease, now),
            1
        );
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let e = t.lookup(ip, now).unwrap();
        assert_eq!((&*e.session_id, e.attempt), ("s1", 1));
        assert!(t.lookup(ip, now + lease).is_none(), "lapsed");
        // Given again later: stands a lease from then.
        t.replace(&[given("s1", &["10.0.0.1"], &["gw-b"])], lease, now + lease);
        assert!(t.lookup(ip, now + lease).is_some());
        // Withdrawn: an empty table.
        t.replace(&[], lease, now);
        assert!(t.lookup(ip, now).is_none());
        assert_eq!(t.sessions(), 0);
    }

    #[test]
    fn unknown_holders_and_bad_entries_are_not_taken() {
        let t = table();
        let now = Instant::now();
        let lease = Duration::from_secs(60);
        let entries = [
            given("s1", &["10.0.0.1"], &["gw-x"]),
            given("s2", &["not-an-ip"], &["gw-b"]),
            given("", &["10.0.0.3"], &["gw-b"]),
            given("s4", &[], &["gw-b"]),
            given("s5", &["10.0.0.5", "fd00::5"], &["gw-x", "gw-b"]),
        ];
        assert_eq!(t.replace(&entries, lease, now), 1);
        let e = t.lookup("fd00::5".parse().unwrap(), now).unwrap();
        assert_eq!(e.holders, vec![Arc::<str>::from("gw-b")]);
        assert!(t.lookup("10.0.0.1".parse().unwrap(), now).is_none());
        assert_eq!(t.sessions(), 1);
    }

    #[test]
    fn a_session_is_bounded_across_its_sources_and_replacements() {
        let t = table();
        let now = Instant::now();
        let lease = Duration::from_secs(60);
        let g = [given("s1", &["10.0.0.1", "10.0.0.2"], &["gw-b"])];
        t.replace(&g, lease, now);
        let a = t.admit(&t.lookup("10.0.0.1".parse().unwrap(), now).unwrap());
        let b = t.admit(&t.lookup("10.0.0.2".parse().unwrap(), now).unwrap());
        assert!(a.is_some() && b.is_some());
        t.replace(&g, lease, now);
        let e = t.lookup("10.0.0.1".parse().unwrap(), now).unwrap();
        assert!(t.admit(&e).is_none(), "the bound holds after a replacement");
        drop(a);
        assert!(t.admit(&e).is_some());
    }
}
