//! Sessions, named by the source address of their connections.
//!
//! The session's subnet routes all of its traffic to the gateway, so the
//! source address of a connection says which session it belongs to. An
//! address that is no session's is refused `unknown_source`.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use talos_certs::{CaParams, LeafCache, SessionCa};

use talos_contract::source::canonical_ip;

use crate::gate::name::Name;
use crate::secrets::mask::MaskSet;
use crate::secrets::secret::Attachment;
use crate::session::approvals::{Approvals, LockRule, Proposer};
use crate::session::lease::{Lease, Millis};
use crate::session::share::{self, Share};
use crate::session::upstream::{Dialing, Pool};
use crate::tls;
use talos_contract::sync::RwLocked;
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::{TaskTracker, TaskTrackerToken};

/// What the gateway knows of one session's current authority: its names,
/// its CA and leaves, its TLS configs and its upstream connections. All of
/// it is dropped together when the session's authority ends.
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
    /// The allowlist's names the account marks passthrough: their
    /// connections are checked as any other before the handshake, then
    /// passed on to the checked address as they are, never terminated.
    pub passthrough: HashSet<Name>,
    /// The session CA (certificate, digest) and the leaves it signed.
    pub leaves: Arc<LeafCache>,
    /// TLS toward the session: leaves of this session's CA only.
    pub tls: Arc<rustls::ServerConfig>,
    /// Connections to destinations, this session's alone.
    pub pool: Pool,
    /// Credentials attached by name, values included.
    pub attachments: Vec<Attachment>,
    /// Every attached value and its encodings, for masking replies; none
    /// when the session has no attachments.
    pub mask: Option<Arc<MaskSet>>,
    /// The Lock: rules, held requests, decisions.
    pub approvals: Approvals,
    /// Fires when the session's authority ends (a close, a lapse, or a
    /// newer authority for its sources): every open connection of the
    /// session is cut `session_ended`.
    pub ended: CancellationToken,
    /// Until when the authority may be used ([`crate::session::lease`]).
    pub lease: Lease,
    /// Connections of this session open now (see [`Session::track`]):
    /// one token each, held until the connection's record is on disk.
    live: TaskTracker,
    /// The session's share of the gateway: its bounds, counted.
    pub share: Arc<Share>,
    /// The session's DNS queries, counted until they go on the record
    /// (at each interval, and before the drop report of its end).
    pub dns: Arc<crate::session::dns::DnsCounts>,
}

/// Counts one open connection of a session until dropped; holds the
/// session.
#[derive(Debug)]
pub struct Live {
    _token: TaskTrackerToken,
    session: Arc<Session>,
}

impl Live {
    /// The session counted.
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }
}

/// Why a session's authority could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Ca(#[from] talos_certs::CertError),
    #[error(transparent)]
    Mask(#[from] crate::secrets::mask::MaskSetError),
}

/// Why [`Sessions::remove`] found nothing to remove.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RemoveError {
    #[error("no session with this id is open")]
    NotOpen,
    #[error("the session's open attempt is {open}")]
    OtherAttempt { open: u32 },
}

/// What every session is opened with: how its upstream connections are
/// made, and the bounds of its share. A reload changes both for every
/// session ([`Session::retune`]).
#[derive(Debug, Clone)]
pub struct UpstreamSettings {
    /// TLS toward destinations (public roots plus the configured extra
    /// anchors), the port, the connect timeout.
    pub dialing: Arc<Dialing>,
    /// Every session's bounds ([`Share`]).
    pub share: share::Limits,
}

impl UpstreamSettings {
    pub fn new(
        tls: Arc<rustls::ClientConfig>,
        port: u16,
        connect_timeout: Duration,
        share: share::Limits,
    ) -> UpstreamSettings {
        UpstreamSettings {
            dialing: Arc::new(Dialing::new(tls, port, connect_timeout)),
            share,
        }
    }
}

/// The identity of a session's authority.
#[derive(Debug, Clone)]
pub struct SessionSpec {
    pub id: String,
    pub tenant: String,
    pub attempt: u32,
    pub allowlist: Vec<Name>,
    /// Attachments, values read from the secret store when the authority
    /// was opened.
    pub attachments: Vec<Attachment>,
    /// The Lock rules as they stood at the open, and the approval relay's
    /// public key (none: held requests are declined at once).
    pub lock: Vec<LockRule>,
    pub relay_key: Option<[u8; 32]>,
    /// The allowlist's passthrough names (none of them carries an
    /// attachment or a Lock rule: the contract's spec refuses that).
    pub passthrough: Vec<Name>,
    /// The approvers' passkeys, the web app's rp id and origin, and the
    /// lab setting, as the open sent them (a config file's session: lab).
    pub people: crate::session::person::People,
}

impl SessionSpec {
    /// The spec of a session from the config file, with secret values
    /// looked up by name in `values`.
    pub fn from_static(
        s: &crate::config::StaticSession,
        values: &HashMap<String, crate::secrets::secret::SecretBytes>,
    ) -> Result<SessionSpec, crate::secrets::secret::SecretError> {
        use crate::secrets::secret::SecretError;
        // The config was checked when it loaded; this is the same check.
        let spec = s.spec().map_err(|e| SecretError::BadAttachment {
            spec: s.id.get_ref().clone(),
            reason: e.to_string(),
        })?;
        let mut attachments = Vec::new();
        for a in spec.scope().attachments() {
            let value =
                values
                    .get(a.secret())
                    .cloned()
                    .ok_or_else(|| SecretError::BadAttachment {
                        spec: a.secret().to_owned(),
                        reason: "no such secret".into(),
                    })?;
            attachments.push(Attachment::new(a, value)?);
        }
        Ok(SessionSpec {
            id: spec.id().to_owned(),
            tenant: spec.tenant().to_owned(),
            attempt: spec.attempt(),
            allowlist: spec.scope().allowlist().to_vec(),
            attachments,
            // Static sessions have no control plane, so no Lock.
            lock: Vec::new(),
            relay_key: None,
            passthrough: spec.passthrough().to_vec(),
            people: Default::default(),
        })
    }
}

impl Session {
    /// Whether `name` (canonical) is exactly on the allowlist.
    pub fn allows(&self, name: &Name) -> bool {
        self.allowlist.contains(name)
    }

    /// Whether `name` (canonical, allowed) is passed on without
    /// termination.
    pub fn passes_through(&self, name: &Name) -> bool {
        self.passthrough.contains(name)
    }
}

impl Session {
    /// Open a session's authority: a fresh CA made in this process for
    /// exactly the session's names, its server TLS config and an empty
    /// upstream pool.
    pub fn open(
        spec: SessionSpec,
        gateway_id: &str,
        upstream: &UpstreamSettings,
        proposer: Option<&Proposer>,
        lease: Lease,
    ) -> Result<Session, OpenError> {
        // A passthrough name is never terminated, so the session's CA is
        // not made to vouch for it: no certificate for it signed by this
        // CA can verify.
        let names: Vec<String> = spec
            .allowlist
            .iter()
            .filter(|n| !spec.passthrough.contains(n))
            .map(|n| n.as_str().to_owned())
            .collect();
        let ca = SessionCa::new(&CaParams::new(&spec.id, spec.attempt, gateway_id, names))?;
        Session::with_ca(
            spec,
            Arc::new(LeafCache::new(ca)),
            upstream,
            proposer,
            lease,
        )
    }

    /// A session's authority around a CA made already: by
    /// [`Session::open`], or in the process that handed it over.
    pub fn with_ca(
        spec: SessionSpec,
        leaves: Arc<LeafCache>,
        upstream: &UpstreamSettings,
        proposer: Option<&Proposer>,
        lease: Lease,
    ) -> Result<Session, OpenError> {
        let resolver = tls::LeafResolver::new(Arc::clone(&leaves));
        let mask = if spec.attachments.is_empty() {
            None
        } else {
            let values: Vec<(&str, &[u8])> = spec
                .attachments
                .iter()
                .map(|a| (a.secret.as_str(), a.value.expose()))
                .collect();
            Some(Arc::new(MaskSet::new(&values)?))
        };
        Ok(Session {
            id: Arc::from(spec.id.as_str()),
            tenant: Arc::from(spec.tenant.as_str()),
            attempt: spec.attempt,
            allowlist: spec.allowlist.into_iter().collect(),
            passthrough: spec.passthrough.into_iter().collect(),
            tls: tls::server_config(Arc::new(resolver)),
            pool: Pool::new(&upstream.dialing),
            attachments: spec.attachments,
            approvals: Approvals::new(spec.lock, spec.relay_key, proposer.cloned())
                .with_people(spec.people),
            mask,
            leaves,
            ended: CancellationToken::new(),
            lease,
            live: TaskTracker::new(),
            share: Arc::new(Share::new(upstream.share)),
            dns: Arc::default(),
        })
    }

    /// Count a connection as open on this session until the guard drops.
    pub fn track(self: &Arc<Session>) -> Live {
        Live {
            _token: self.live.token(),
            session: Arc::clone(self),
        }
    }

    /// How many connections of this session are open now.
    pub fn live_connections(&self) -> u32 {
        u32::try_from(self.live.len()).unwrap_or(u32::MAX)
    }

    /// Apply a reload's settings: new upstream connections are made as
    /// `upstream` says, and the share's bounds are its bounds.
    pub fn retune(&self, upstream: &UpstreamSettings) {
        self.pool.redial(&upstream.dialing);
        self.share.set_limits(&upstream.share);
    }

    /// Whether the authority may be used now: not ended, lease not lapsed.
    pub fn usable(&self) -> bool {
        !self.ended.is_cancelled() && self.lease.live()
    }

    /// End the session's authority for its open connections: each is cut
    /// `session_ended`. Returns how many were open. The CA, leaves and
    /// values go when the last `Arc<Session>` does: the table's is removed
    /// before this is called, and each connection's goes as it closes.
    pub fn end(&self) -> u32 {
        let open = self.live_connections();
        self.live.close();
        self.ended.cancel();
        open
    }

    /// Wait, at most `bound`, until every connection counted by
    /// [`Session::track`] is gone (after [`Session::end`]: their records
    /// are then on disk). Returns whether they all went in time.
    pub async fn connections_done(&self, bound: Duration) -> bool {
        tokio::time::timeout(bound, self.live.wait()).await.is_ok()
    }

    /// End the authority as [`end`](Session::end) does, and withdraw every
    /// pending approval. Returns (connections cut, approvals withdrawn under
    /// the authority, those a drain withdrew before included).
    pub fn end_and_withdraw(&self) -> (u32, u32) {
        let withdrawn = self.approvals.withdraw_all();
        (self.end(), withdrawn)
    }

    /// The names of the attached secrets, sorted, without repeats.
    pub fn secret_names(&self) -> Vec<String> {
        let names: std::collections::BTreeSet<&str> =
            self.attachments.iter().map(|a| a.secret.as_str()).collect();
        names.into_iter().map(str::to_owned).collect()
    }

    /// The attachments for requests to `destination`.
    pub fn attachments_for<'a>(
        &'a self,
        destination: &'a Name,
    ) -> impl Iterator<Item = &'a Attachment> + 'a {
        self.attachments
            .iter()
            .filter(move |a| &a.destination == destination)
    }

    /// Whether requests to `destination` carry an attachment.
    pub fn has_attachments(&self, destination: &Name) -> bool {
        self.attachments_for(destination).next().is_some()
    }

    /// The session CA's SHA-384 digest (lowercase hex).
    pub fn ca_digest(&self) -> &str {
        self.leaves.ca().digest()
    }

    /// The session CA certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.leaves.ca().cert_pem()
    }
}

/// Every open session, by source address and by id.
///
/// Reads (one per connection) far outnumber writes (one per session event),
/// so a read-write lock over two maps is enough; the lock is never held
/// across an await.
#[derive(Debug, Default)]
pub struct Sessions {
    table: RwLock<Table>,
}

/// What one look at every lease found ([`Sessions::sweep`]).
#[derive(Debug)]
pub struct Sweep {
    /// Sessions whose lease had lapsed, now removed.
    pub lapsed: Vec<Arc<Session>>,
    /// Sessions open after their removal.
    pub open: usize,
    /// The least time left on a live lease; none when no open session
    /// has a lease.
    pub least: Option<Duration>,
}

#[derive(Debug, Default)]
struct Table {
    // invariant: keys are canonical (IPv4-mapped IPv6 stored as IPv4), and
    // a session is in `by_source` under some source exactly when it is in
    // `by_id` under its id, and `sources_of` has an entry for each id in
    // `by_id`: every change below keeps them so.
    by_source: HashMap<IpAddr, Arc<Session>>,
    by_id: HashMap<Arc<str>, Arc<Session>>,
    // The sources each session in `by_id` was given (canonical), so that
    // removing one session touches its own sources only: with every
    // session's removal a walk over all sources, ending all of a member's
    // sessions was quadratic (benches/capacity). A source listed here may
    // since have gone to a newer session; `remove` checks which it holds.
    sources_of: HashMap<Arc<str>, Vec<IpAddr>>,
}

impl Table {
    /// Map each of `sources` to `session`, and its id to it.
    fn put(&mut self, sources: &[IpAddr], session: Arc<Session>) {
        let canonical: Vec<IpAddr> = sources.iter().map(|ip| canonical_ip(*ip)).collect();
        for ip in &canonical {
            self.by_source.insert(*ip, Arc::clone(&session));
        }
        self.sources_of.insert(Arc::clone(&session.id), canonical);
        self.by_id.insert(Arc::clone(&session.id), session);
    }

    /// Take `gone` out of both maps.
    fn remove(&mut self, gone: &[Arc<Session>]) {
        for g in gone {
            if !self.by_id.get(&g.id).is_some_and(|s| Arc::ptr_eq(s, g)) {
                continue;
            }
            self.by_id.remove(&g.id);
            for ip in self.sources_of.remove(&g.id).unwrap_or_default() {
                if self.by_source.get(&ip).is_some_and(|s| Arc::ptr_eq(s, g)) {
                    self.by_source.remove(&ip);
                }
            }
        }
    }
}

impl Sessions {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        self.table.read_locked()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Table> {
        self.table.write_locked()
    }

    /// Map each of `sources` to `session`, replacing whatever was there.
    pub fn insert(&self, sources: &[IpAddr], session: Arc<Session>) {
        self.write().put(sources, session);
    }

    /// Map each of `sources` to `session`, first removing every authority
    /// it displaces: any session holding one of `sources`, and any session
    /// with the same id (a resume or recovery that was not preceded by a
    /// close). A displaced session loses all of its sources, not only the
    /// ones taken over. Returns the displaced sessions, once each.
    pub fn replace(&self, sources: &[IpAddr], session: Arc<Session>) -> Vec<Arc<Session>> {
        let mut t = self.write();
        let by_source = sources
            .iter()
            .filter_map(|ip| t.by_source.get(&canonical_ip(*ip)));
        let displaced = distinct(by_source.chain(t.by_id.get(&session.id)));
        t.remove(&displaced);
        t.put(sources, session);
        displaced
    }

    /// Remove session `id`, attempt `attempt`, from every source it holds.
    pub fn remove(&self, id: &str, attempt: u32) -> Result<Arc<Session>, RemoveError> {
        let mut t = self.write();
        let found = t.by_id.get(id).cloned().ok_or(RemoveError::NotOpen)?;
        if found.attempt != attempt {
            return Err(RemoveError::OtherAttempt {
                open: found.attempt,
            });
        }
        t.remove(std::slice::from_ref(&found));
        Ok(found)
    }

    /// The open session with id `id`, if any.
    pub fn find(&self, id: &str) -> Option<Arc<Session>> {
        self.read().by_id.get(id).cloned()
    }

    /// One look at every session's lease at `now` (a reading of their
    /// lease clock), for the lease watcher: the sessions whose lease has
    /// lapsed, removed and returned once each; how many stay open; the
    /// least time left among their leases. One pass under the read lock,
    /// with the clock read once by the caller (the write lock only when
    /// something lapsed): the watcher passes every second, and a pass that
    /// read the clock per session, twice over, was 6 % of a member's CPU
    /// with 10,000 sessions open (benches/capacity).
    pub fn sweep(&self, now: Millis) -> Sweep {
        let (mut open, least, lapsed_seen) = {
            let t = self.read();
            let mut least: Option<Duration> = None;
            let mut lapsed_seen = false;
            for s in t.by_id.values() {
                if !s.lease.live_at(now) {
                    lapsed_seen = true;
                } else if let Some(left) = s.lease.left_at(now) {
                    least = Some(least.map_or(left, |l| l.min(left)));
                }
            }
            (t.by_id.len(), least, lapsed_seen)
        };
        let mut lapsed = Vec::new();
        if lapsed_seen {
            let mut t = self.write();
            // A lapsed lease never comes back (`Lease::renew`), so what
            // the read pass saw lapsed is still lapsed, unless it went.
            lapsed = t
                .by_id
                .values()
                .filter(|s| !s.lease.live_at(now))
                .cloned()
                .collect();
            t.remove(&lapsed);
            open = t.by_id.len();
        }
        Sweep {
            lapsed,
            open,
            least,
        }
    }

    /// Remove every session; returns them, once each.
    pub fn remove_all(&self) -> Vec<Arc<Session>> {
        let mut t = self.write();
        t.by_source.clear();
        t.sources_of.clear();
        t.by_id.drain().map(|(_, s)| s).collect()
    }

    /// The session whose source address is `ip`, with the connection
    /// counted on it ([`Session::track`]). The count is taken under the
    /// table's lock, so a session found here has not been removed yet, and
    /// an end (which removes it first, then waits for its connections)
    /// waits for this one too: no connection of an ended authority can be
    /// recorded after its drop report.
    pub fn track_by_source(&self, ip: IpAddr) -> Option<Live> {
        self.read()
            .by_source
            .get(&canonical_ip(ip))
            .map(Session::track)
    }

    /// The session whose source address is `ip`.
    pub fn by_source(&self, ip: IpAddr) -> Option<Arc<Session>> {
        self.read().by_source.get(&canonical_ip(ip)).cloned()
    }

    /// Every open session with the sources it holds, once each.
    pub fn snapshot(&self) -> Vec<(Arc<Session>, Vec<IpAddr>)> {
        let t = self.read();
        let mut sources: HashMap<*const Session, Vec<IpAddr>> = HashMap::new();
        for (ip, s) in &t.by_source {
            sources.entry(Arc::as_ptr(s)).or_default().push(*ip);
        }
        t.by_id
            .values()
            .map(|s| {
                let mut ips = sources.remove(&Arc::as_ptr(s)).unwrap_or_default();
                ips.sort();
                (Arc::clone(s), ips)
            })
            .collect()
    }

    /// Every open session, once each.
    pub fn all(&self) -> Vec<Arc<Session>> {
        self.read().by_id.values().cloned().collect()
    }

    /// How many sessions are open.
    pub fn open(&self) -> usize {
        self.read().by_id.len()
    }

    /// How many source addresses are mapped.
    pub fn len(&self) -> usize {
        self.read().by_source.len()
    }

    /// Whether no session is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Each session of `sessions` once, in first-seen order.
fn distinct<'a>(sessions: impl Iterator<Item = &'a Arc<Session>>) -> Vec<Arc<Session>> {
    let mut seen: HashSet<*const Session> = HashSet::new();
    sessions
        .filter(|s| seen.insert(Arc::as_ptr(s)))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(id: &str, attempt: u32) -> Arc<Session> {
        leased(
            id,
            attempt,
            Lease::none(crate::session::lease::boot_clock()),
        )
    }

    fn leased(id: &str, attempt: u32, lease: Lease) -> Arc<Session> {
        let upstream = UpstreamSettings::new(
            tls::client_config(&[]),
            443,
            std::time::Duration::from_secs(1),
            Default::default(),
        );
        let spec = SessionSpec {
            id: id.into(),
            tenant: "acme".into(),
            attempt,
            allowlist: vec![crate::gate::name::canonicalize("api.example.com").unwrap()],
            attachments: Vec::new(),
            lock: Vec::new(),
            relay_key: None,
            passthrough: Vec::new(),
            people: Default::default(),
        };
        Arc::new(Session::open(spec, "gw-a", &upstream, None, lease).unwrap())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_newer_authority_displaces_by_source_and_by_id() {
        let table = Sessions::default();
        let a = session("a", 1);
        let b = session("b", 1);
        assert!(table
            .replace(&[ip("10.0.0.1"), ip("10.0.0.2")], Arc::clone(&a))
            .is_empty());
        assert!(table.replace(&[ip("10.0.0.3")], Arc::clone(&b)).is_empty());
        // Takes one of a's sources: a loses both.
        let c = session("c", 1);
        let displaced = table.replace(&[ip("::ffff:10.0.0.2")], Arc::clone(&c));
        assert_eq!(displaced.len(), 1);
        assert!(Arc::ptr_eq(&displaced[0], &a));
        assert!(table.by_source(ip("10.0.0.1")).is_none());
        // Same id, new attempt, other source: b goes.
        let b2 = session("b", 2);
        let displaced = table.replace(&[ip("10.0.0.4")], Arc::clone(&b2));
        assert!(Arc::ptr_eq(&displaced[0], &b));
        assert!(table.by_source(ip("10.0.0.3")).is_none());
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn a_removal_leaves_a_source_another_session_took() {
        let table = Sessions::default();
        let a = session("a", 1);
        let b = session("b", 1);
        table.insert(&[ip("10.0.0.1"), ip("10.0.0.2")], Arc::clone(&a));
        // `insert` moves 10.0.0.2 to b without displacing a.
        table.insert(&[ip("::ffff:10.0.0.2")], Arc::clone(&b));
        assert_eq!(table.open(), 2);
        table.remove("a", 1).unwrap();
        assert!(table.by_source(ip("10.0.0.1")).is_none());
        assert!(Arc::ptr_eq(&table.by_source(ip("10.0.0.2")).unwrap(), &b));
        let sweep = table.sweep(0);
        assert_eq!((sweep.open, sweep.least, sweep.lapsed.len()), (1, None, 0));
        table.remove("b", 1).unwrap();
        assert!(table.is_empty());
        assert_eq!(table.sweep(0).open, 0);
    }

    #[test]
    fn a_sweep_removes_the_lapsed_and_finds_the_least_lease_left() {
        use crate::session::lease::{Clock, ManualClock};
        let clock = ManualClock::new(1_000);
        let lease = |secs| Lease::new(clock.clone(), Duration::from_secs(secs), None);
        let table = Sessions::default();
        let short = leased("short", 1, lease(10));
        table.insert(&[ip("10.0.0.1")], Arc::clone(&short));
        table.insert(&[ip("10.0.0.2")], leased("long", 1, lease(60)));
        table.insert(&[ip("10.0.0.3")], session("static", 1));
        let sweep = table.sweep(clock.now());
        assert!(sweep.lapsed.is_empty());
        assert_eq!(
            (sweep.open, sweep.least),
            (3, Some(Duration::from_secs(10)))
        );
        clock.advance(Duration::from_secs(10));
        let sweep = table.sweep(clock.now());
        assert_eq!(sweep.lapsed.len(), 1);
        assert!(Arc::ptr_eq(&sweep.lapsed[0], &short));
        assert_eq!(
            (sweep.open, sweep.least),
            (2, Some(Duration::from_secs(50)))
        );
        assert!(table.by_source(ip("10.0.0.1")).is_none());
        assert!(table.find("short").is_none());
        // Once: the next look finds nothing more.
        assert!(table.sweep(clock.now()).lapsed.is_empty());
    }

    #[test]
    fn removal_checks_the_attempt_and_ends_connections() {
        let table = Sessions::default();
        let a = session("a", 2);
        table.replace(&[ip("10.0.0.1"), ip("10.0.0.2")], Arc::clone(&a));
        assert_eq!(table.remove("b", 2).unwrap_err(), RemoveError::NotOpen);
        assert_eq!(
            table.remove("a", 1).unwrap_err(),
            RemoveError::OtherAttempt { open: 2 }
        );
        let live = a.track();
        let removed = table.remove("a", 2).unwrap();
        assert!(table.is_empty());
        assert_eq!(removed.end(), 1);
        assert!(a.ended.is_cancelled());
        drop(live);
        assert_eq!(a.live_connections(), 0);
    }
}
