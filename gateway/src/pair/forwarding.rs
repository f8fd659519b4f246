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
//! Beside the control plane's word, each peer's own word on its own
//! authorities ([`Forwarding::replace_from_peer`], asked over the member
//! link): an entry learnt that way lapses when the peer said its lease
//! does, so a member cut off from the control plane but not from its peer
//! still forwards, and stops once the peer's authority would have lapsed.
//! The control plane's entry for a source wins over a peer's.
//!
//! A successor of this process (an upgrade) takes the table over with
//! the authorities ([`Forwarding::standing`], [`Forwarding::take_over`]):
//! every entry as it stands, with what is left of it, so that from its
//! first connection and its first DNS query it forwards what this
//! process forwarded, and nothing longer than the word it was given.
//!
//! Each session's connections forwarded at once are bounded
//! (`[pair] max_forwarded_per_session`): what one session's forwarded
//! connections may hold of the link is bounded by it (the link's own
//! flow control keeps them from holding back another session's:
//! [`crate::member_link::stream`]). The bound's count follows the session across
//! replacements of the table, and across a moment with no entry for it,
//! for as long as any of its forwarded connections is open.
//!
//! The table names every live session a peer holds, this member's own
//! included (a peer says all it holds); the member forwards a session's
//! connection only when it holds no live authority for its source
//! itself. `gateway_forwarding_sessions` counts those sessions only
//! ([`Forwarding::publish`]): the sessions it forwards for.

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Given {
    pub session_id: String,
    pub attempt: u32,
    pub tenant: String,
    pub sources: Vec<String>,
    pub holders: Vec<String>,
}

/// One authority a peer holds, as it says over the member link.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Holding {
    pub session_id: String,
    pub attempt: u32,
    pub tenant: String,
    pub sources: Vec<String>,
    /// What is left of its lease, in milliseconds.
    pub lease_ms_left: u64,
}

/// One entry of the table as it stands, for a successor: who gave it (a
/// peer, on its own authority; none: the control plane), what it says,
/// and how much longer it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    pub from: Option<Arc<str>>,
    pub given: Given,
    pub left: Duration,
}

/// The longest a peer's word stands: the longest lease a member gives
/// (`control.lease_ms` at most 3600000).
const LONGEST_WORD: Duration = Duration::from_secs(3600);

type Table = HashMap<IpAddr, Arc<Entry>>;

/// The table.
#[derive(Debug)]
pub struct Forwarding {
    /// The control plane's word.
    by_source: std::sync::RwLock<Table>,
    /// Each peer's own word on its authorities.
    by_peer: std::sync::RwLock<HashMap<Arc<str>, Table>>,
    /// The peers this member may forward to (its `[pair] peers`).
    peers: Vec<Arc<str>>,
    max_per_session: usize,
    /// Each session's count of forwarded connections, by session id, for
    /// as long as an entry or a forwarded connection holds it: a session
    /// gone from both tables for a moment finds its count again.
    counts: std::sync::Mutex<HashMap<Arc<str>, std::sync::Weak<AtomicUsize>>>,
}

impl Forwarding {
    pub fn new(peers: Vec<Arc<str>>, max_per_session: usize) -> Forwarding {
        Forwarding {
            by_source: Default::default(),
            by_peer: Default::default(),
            peers,
            max_per_session,
            counts: Default::default(),
        }
    }

    /// Replace the table with `given`, each entry standing for `lease`
    /// from `now`. Returns how many entries were taken; each one not taken
    /// is logged with its session and why.
    pub fn replace(&self, given: &[Given], lease: Duration, now: Instant) -> usize {
        let given: Vec<(&Given, Instant)> = given.iter().map(|g| (g, now + lease)).collect();
        let old = self.by_source.read_locked().clone();
        let (table, taken) = self.table(&given, "control plane");
        let changed = table.len() != old.len()
            || table
                .iter()
                .any(|(s, e)| old.get(s).is_none_or(|o| o.session_id != e.session_id));
        *self.by_source.write_locked() = table;
        let sessions = self.sessions();
        if changed {
            tracing::info!(sessions, "forwarding table changed");
        }
        taken
    }

    /// Replace what `peer` said it holds with `holdings`, each standing
    /// until its lease ends as the peer said, from `now`. Returns how many
    /// were taken.
    pub fn replace_from_peer(&self, peer: &Arc<str>, holdings: &[Holding], now: Instant) -> usize {
        let given: Vec<(Given, Instant)> = holdings
            .iter()
            .map(|h| {
                let left = Duration::from_millis(h.lease_ms_left).min(LONGEST_WORD);
                (
                    Given {
                        session_id: h.session_id.clone(),
                        attempt: h.attempt,
                        tenant: h.tenant.clone(),
                        sources: h.sources.clone(),
                        holders: vec![peer.to_string()],
                    },
                    now + left,
                )
            })
            .collect();
        let given: Vec<(&Given, Instant)> = given.iter().map(|(g, u)| (g, *u)).collect();
        let (table, taken) = self.table(&given, peer);
        self.by_peer.write_locked().insert(Arc::clone(peer), table);
        taken
    }

    /// A table of `given`, each entry standing until its instant; each
    /// one not taken is logged with its session, why, and who gave it.
    fn table(&self, given: &[(&Given, Instant)], from: &str) -> (Table, usize) {
        let mut table = HashMap::new();
        let mut taken = 0;
        for (g, until) in given {
            match self.entry(g, *until) {
                Ok((entry, sources)) => {
                    taken += 1;
                    for s in sources {
                        table.insert(s, Arc::clone(&entry));
                    }
                }
                Err(e) => {
                    tracing::warn!(session = %g.session_id, attempt = g.attempt, cause = %e, from, "forwarding entry not taken");
                }
            }
        }
        (table, taken)
    }

    /// Set `gateway_forwarding_sessions` to the sessions this member
    /// forwards for at `now` ([`Forwarding::forwarded_sessions`]);
    /// returns it.
    pub fn publish(&self, now: Instant, held_here: impl Fn(IpAddr) -> bool) -> usize {
        let n = self.forwarded_sessions(now, held_here);
        metrics::gauge!("gateway_forwarding_sessions").set(n as f64);
        n
    }

    /// The sessions this member forwards for at `now`: those with an
    /// entry standing for a source that this member holds no live
    /// authority for (`held_here` says it does), so that a connection
    /// from there would be forwarded. A session both members hold is in
    /// the peer's word, and is not counted.
    pub fn forwarded_sessions(&self, now: Instant, held_here: impl Fn(IpAddr) -> bool) -> usize {
        let plane = self.by_source.read_locked();
        let peers = self.by_peer.read_locked();
        let mut ids: Vec<&str> = plane
            .iter()
            .chain(peers.values().flat_map(HashMap::iter))
            .filter(|(source, e)| e.live_at(now) && !held_here(**source))
            .map(|(_, e)| &*e.session_id)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }

    /// The count of forwarded connections of session `id`: the one its
    /// entries or forwarded connections hold, if any do (the bound follows
    /// the session across tables), else a new one.
    fn open_of(&self, id: &str) -> Arc<AtomicUsize> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(open) = counts.get(id).and_then(std::sync::Weak::upgrade) {
            return open;
        }
        counts.retain(|_, c| c.strong_count() > 0);
        let open = Arc::new(AtomicUsize::new(0));
        counts.insert(Arc::from(id), Arc::downgrade(&open));
        open
    }

    fn entry(&self, g: &Given, until: Instant) -> Result<(Arc<Entry>, Vec<IpAddr>), EntryError> {
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
        let open = self.open_of(&g.session_id);
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

    /// Every entry that stands at `now`, with what is left of it: what a
    /// successor takes over ([`Forwarding::take_over`]).
    pub fn standing(&self, now: Instant) -> Vec<Standing> {
        let mut out = standing_of(&self.by_source.read_locked(), None, now);
        for (peer, table) in self.by_peer.read_locked().iter() {
            out.extend(standing_of(table, Some(peer), now));
        }
        out
    }

    /// Take over the entries a predecessor had standing (`standing`, each
    /// standing for what was left of it, from `now`): the control plane's
    /// as its word, each peer's as that peer's. Replaces nothing the
    /// table holds for anyone who said nothing here. Returns how many
    /// were taken; each one not taken is logged, as a renewal's are.
    pub fn take_over(&self, standing: &[Standing], now: Instant) -> usize {
        let mut taken = 0;
        let mut by_whom: HashMap<Option<&Arc<str>>, Vec<(&Given, Instant)>> = HashMap::new();
        for s in standing {
            by_whom
                .entry(s.from.as_ref())
                .or_default()
                .push((&s.given, now + s.left.min(LONGEST_WORD)));
        }
        for (from, given) in by_whom {
            match from {
                None => {
                    let (table, n) = self.table(&given, "predecessor (control plane's word)");
                    *self.by_source.write_locked() = table;
                    taken += n;
                }
                Some(peer) => {
                    let Some(peer) = self.peers.iter().find(|p| ***p == **peer) else {
                        tracing::warn!(peer = %peer, "forwarding entries of a peer not configured here not taken");
                        continue;
                    };
                    let (table, n) = self.table(&given, peer);
                    self.by_peer.write_locked().insert(Arc::clone(peer), table);
                    taken += n;
                }
            }
        }
        taken
    }

    /// The entry for `source`, if one stands at `now`.
    pub fn lookup(&self, source: IpAddr, now: Instant) -> Option<Arc<Entry>> {
        let live = |t: &Table| t.get(&source).filter(|e| e.live_at(now)).map(Arc::clone);
        if let Some(e) = live(&self.by_source.read_locked()) {
            return Some(e);
        }
        self.by_peer.read_locked().values().find_map(live)
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

    /// How many sessions the tables hold now (lapsed entries included).
    pub fn sessions(&self) -> usize {
        let plane = self.by_source.read_locked();
        let peers = self.by_peer.read_locked();
        let mut ids: Vec<&str> = plane
            .values()
            .chain(peers.values().flat_map(HashMap::values))
            .map(|e| &*e.session_id)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }
}

/// The entries of `table` standing at `now`, each once with all its
/// sources, as given by `from`.
fn standing_of(table: &Table, from: Option<&Arc<str>>, now: Instant) -> Vec<Standing> {
    let mut out: Vec<(Arc<Entry>, Vec<IpAddr>)> = Vec::new();
    for (source, entry) in table {
        if !entry.live_at(now) {
            continue;
        }
        match out.iter_mut().find(|(e, _)| Arc::ptr_eq(e, entry)) {
            Some((_, sources)) => sources.push(*source),
            None => out.push((Arc::clone(entry), vec![*source])),
        }
    }
    out.into_iter()
        .map(|(e, mut sources)| {
            sources.sort_unstable();
            Standing {
                from: from.cloned(),
                given: Given {
                    session_id: e.session_id.to_string(),
                    attempt: e.attempt,
                    tenant: e.tenant.to_string(),
                    sources: sources.iter().map(ToString::to_string).collect(),
                    holders: e.holders.iter().map(ToString::to_string).collect(),
                },
                left: e.until.saturating_duration_since(now),
            }
        })
        .collect()
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
    fn a_peers_word_stands_for_the_lease_it_said_and_the_plane_wins() {
        let t = table();
        let now = Instant::now();
        let peer: Arc<str> = Arc::from("gw-b");
        let held = |id: &str, left| Holding {
            session_id: id.into(),
            attempt: 2,
            tenant: "t1".into(),
            sources: vec!["10.0.0.1".into()],
            lease_ms_left: left,
        };
        assert_eq!(t.replace_from_peer(&peer, &[held("s1", 3000)], now), 1);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let e = t.lookup(ip, now).unwrap();
        assert_eq!((&*e.session_id, e.attempt), ("s1", 2));
        assert_eq!(e.holders, vec![Arc::clone(&peer)]);
        assert!(t.lookup(ip, now + Duration::from_millis(3000)).is_none());
        // The control plane's entry for the source comes first.
        t.replace(
            &[given("s9", &["10.0.0.1"], &["gw-b"])],
            Duration::from_secs(60),
            now,
        );
        assert_eq!(&*t.lookup(ip, now).unwrap().session_id, "s9");
        assert_eq!(t.sessions(), 2);
        // The peer no longer holds it.
        t.replace_from_peer(&peer, &[], now);
        t.replace(&[], Duration::from_secs(60), now);
        assert!(t.lookup(ip, now).is_none());
        // A peer's word is taken only for a configured peer.
        let stranger: Arc<str> = Arc::from("gw-x");
        assert_eq!(t.replace_from_peer(&stranger, &[held("s1", 3000)], now), 0);
    }

    /// A healthy pair: the peer says it holds the session, and so does
    /// this member: it forwards nothing for it, and the gauge says 0.
    /// Once this member no longer holds it (a restart), 1; its own
    /// authority again (a resume), 0.
    #[test]
    fn only_sessions_forwarded_for_are_counted() {
        let t = table();
        let now = Instant::now();
        let peer: Arc<str> = Arc::from("gw-b");
        let held = |id: &str, source: &str| Holding {
            session_id: id.into(),
            attempt: 1,
            tenant: "t1".into(),
            sources: vec![source.into()],
            lease_ms_left: 60_000,
        };
        t.replace_from_peer(
            &peer,
            &[held("s1", "10.0.0.1"), held("s2", "10.0.0.2")],
            now,
        );
        let here: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(t.forwarded_sessions(now, |ip| ip == here), 1);
        assert_eq!(t.forwarded_sessions(now, |_| true), 0, "both held here");
        assert_eq!(t.forwarded_sessions(now, |_| false), 2);
        assert_eq!(
            t.forwarded_sessions(now + Duration::from_secs(61), |_| false),
            0,
            "lapsed entries forward nothing"
        );
        // The control plane's word, for a session held here too (a
        // renewal read before an open): not counted either.
        t.replace(
            &[given("s3", &["10.0.0.3"], &["gw-b"])],
            Duration::from_secs(60),
            now,
        );
        assert_eq!(t.forwarded_sessions(now, |_| true), 0);
        assert_eq!(t.publish(now, |ip| ip == here), 2, "s2 and s3");
    }

    /// A session's count of forwarded connections is found again after a
    /// moment with no entry for it, while its connections are open.
    #[test]
    fn a_sessions_bound_outlives_a_gap_in_the_tables() {
        let t = table();
        let now = Instant::now();
        let lease = Duration::from_secs(60);
        let g = [given("s1", &["10.0.0.1"], &["gw-b"])];
        t.replace(&g, lease, now);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let a = t.admit(&t.lookup(ip, now).unwrap()).unwrap();
        let b = t.admit(&t.lookup(ip, now).unwrap()).unwrap();
        t.replace(&[], lease, now);
        assert!(t.lookup(ip, now).is_none());
        t.replace(&g, lease, now);
        let e = t.lookup(ip, now).unwrap();
        assert!(t.admit(&e).is_none(), "still at its bound");
        drop((a, b));
        assert!(t.admit(&e).is_some());
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

    #[test]
    fn a_successor_takes_over_every_entry_as_it_stands_and_no_longer() {
        let old = table();
        let now = Instant::now();
        let peer: Arc<str> = Arc::from("gw-b");
        old.replace(
            &[given("s1", &["10.0.0.1", "10.0.0.2"], &["gw-b"])],
            Duration::from_secs(60),
            now,
        );
        let held = |id: &str, source: &str, left| Holding {
            session_id: id.into(),
            attempt: 3,
            tenant: "t1".into(),
            sources: vec![source.into()],
            lease_ms_left: left,
        };
        // s3's word has lapsed by the handover: not handed over.
        old.replace_from_peer(
            &peer,
            &[held("s2", "10.0.0.3", 3000), held("s3", "10.0.0.4", 500)],
            now,
        );
        let later = now + Duration::from_secs(1);
        let mut standing = old.standing(later);
        standing.sort_by(|a, b| a.given.session_id.cmp(&b.given.session_id));
        assert_eq!(standing.len(), 2);
        assert_eq!(standing[0].from, None);
        assert_eq!(standing[0].given.sources, ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(standing[0].left, Duration::from_secs(59));
        assert_eq!(standing[1].from, Some(Arc::clone(&peer)));
        assert_eq!(standing[1].left, Duration::from_secs(2));

        // The successor's clock: its own instants, the same time left.
        let new = table();
        let start = Instant::now() + Duration::from_secs(100);
        assert_eq!(new.take_over(&standing, start), 2);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for source in ["10.0.0.1", "10.0.0.2"] {
            let e = new.lookup(ip(source), start).unwrap();
            assert_eq!((&*e.session_id, e.attempt), ("s1", 1));
        }
        let e = new.lookup(ip("10.0.0.3"), start).unwrap();
        assert_eq!(
            (&*e.session_id, e.attempt, &e.holders[..]),
            ("s2", 3, &[Arc::clone(&peer)][..])
        );
        assert!(
            new.lookup(ip("10.0.0.3"), start + Duration::from_secs(2))
                .is_none(),
            "the peer's word lapses when it would have"
        );
        assert!(
            new.lookup(ip("10.0.0.1"), start + Duration::from_secs(59))
                .is_none(),
            "the control plane's too"
        );
        // The peer's word is the peer's: its next answer replaces it.
        new.replace_from_peer(&peer, &[], start);
        assert!(new.lookup(ip("10.0.0.3"), start).is_none());
        assert!(new.lookup(ip("10.0.0.1"), start).is_some());

        // Entries of a peer not configured here are not taken.
        let stranger = Standing {
            from: Some(Arc::from("gw-x")),
            ..standing[1].clone()
        };
        assert_eq!(table().take_over(&[stranger], start), 0);
    }
}
